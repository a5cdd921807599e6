//! The Redis part of the benchmark harness (`just bench`; `--only redis` runs it alone): baton's
//! Mutex on one Redis beside the hand-written `SET NX PX` pattern and the rslock crate
//! (Redlock, on one node), then a queue of many waiters; it writes the `## Redis` section.
//!
//! A child module of examples/bench.rs: it measures with the harness's own samples,
//! percentiles and heap counter.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use async_trait::async_trait;
use baton::testing::{RedisNode, RedisSentinel};
use baton::{Backend, Mutex, MutexGuard, RedisBackend, RedisOptions, Session};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use super::{
    Res, Run, Samples, drain, held, live_bytes, ms, open_sessions, pct, queue_in_order, summarise,
};

/// Every contended configuration releases as soon as it is granted.
const HOLD: Duration = Duration::ZERO;

/// The hand-written pattern's sleep after a refused `SET NX`.
const RETRY_SLEEP: Duration = Duration::from_millis(10);

/// The TTL the hand-written pattern and rslock put on their key.
const KEY_TTL: Duration = Duration::from_secs(10);

/// The seeds' release: delete the key only if it still holds our owner.
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// The commands the polling implementations send (their scripts' own `GET` and `DEL` are
/// counted by the server too, and left out here).
const POLLING_REQUESTS: &[&str] = &["set", "incr", "eval", "evalsha", "script|load"];

/// The label of baton's rows through Sentinel.
const SENTINEL_ROW: &str = "baton (Sentinel, 1 replica)";

/// The sorted set of the scale run's queue (docs/redis.md, "How it works").
const SCALE_LOCK: &str = "bench/scale";
const SCALE_QUEUE_KEY: &str = "baton:q:bench/scale";

/// The bench's own connection to the server, for its counters; no contender uses it.
struct Admin(MultiplexedConnection);

/// What the server counted: calls per command since the last `CONFIG RESETSTAT`, and its CPU.
struct ServerCounters {
    calls: HashMap<String, u64>,
    cpu_seconds: f64,
}

impl ServerCounters {
    fn calls(&self, command: &str) -> u64 {
        self.calls.get(command).copied().unwrap_or(0)
    }
}

impl Admin {
    async fn connect(url: &str) -> Res<Admin> {
        let client = redis::Client::open(url)?;
        Ok(Admin(client.get_multiplexed_async_connection().await?))
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Res<T> {
        Ok(cmd.query_async(&mut self.0.clone()).await?)
    }

    /// Connections open on the server, this one included.
    async fn clients(&self) -> Res<usize> {
        let list: String = self.query(redis::cmd("CLIENT").arg("LIST")).await?;
        Ok(list.lines().count())
    }

    /// The connections open once those of earlier runs have closed (waits up to 3 s).
    async fn settled(&self) -> Res<usize> {
        let until = Instant::now() + Duration::from_secs(3);
        loop {
            let open = self.clients().await?;
            if open <= 1 || Instant::now() > until {
                return Ok(open);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Zeroes the command counters (`CONFIG RESETSTAT`) and reads them.
    async fn reset(&self) -> Res<ServerCounters> {
        let () = self.query(redis::cmd("CONFIG").arg("RESETSTAT")).await?;
        self.counters().await
    }

    async fn counters(&self) -> Res<ServerCounters> {
        let info: String = self.query(redis::cmd("INFO").arg("all")).await?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        // `cmdstat_set:calls=12,usec=...`
        let calls = info
            .lines()
            .filter_map(|l| {
                let (name, stats) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = stats
                    .strip_prefix("calls=")?
                    .split(',')
                    .next()?
                    .parse()
                    .ok()?;
                Some((name.to_owned(), calls))
            })
            .collect();
        Ok(ServerCounters {
            calls,
            cpu_seconds: field("used_cpu_sys") + field("used_cpu_user"),
        })
    }

    async fn server_version(&self) -> Res<String> {
        let info: String = self.query(redis::cmd("INFO").arg("server")).await?;
        Ok(info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim()
            .to_owned())
    }
}

/// This process's CPU time (user + system, all threads), in seconds.
fn process_cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            // Fields after the command name: state is the first, utime the 12th, stime the
            // 13th, in ticks of 1/100 s (USER_HZ).
            let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            let ticks =
                fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
            Some(ticks / 100.0)
        })
        .unwrap_or(0.0)
}

/// One contender of a contended run: waits until it holds the lock, then gives it back.
#[async_trait]
trait Contender: Send + 'static {
    async fn acquire(&mut self) -> Res<()>;
    async fn release(&mut self) -> Res<()>;
}

/// baton: a Mutex on a session of its own.
struct Baton {
    mutex: Mutex,
    guard: Option<MutexGuard>,
}

#[async_trait]
impl Contender for Baton {
    async fn acquire(&mut self) -> Res<()> {
        self.guard = Some(self.mutex.lock().await?);
        Ok(())
    }

    async fn release(&mut self) -> Res<()> {
        if let Some(guard) = self.guard.take() {
            guard.release().await?;
        }
        Ok(())
    }
}

/// The seeds' hand-written pattern: `SET <lock> <owner> NX PX 10000`, a 10 ms sleep after a
/// refusal, `INCR <lock>:token` once granted, the compare-and-delete script to release.
struct SetNx {
    conn: MultiplexedConnection,
    lock: String,
    /// This contender's part of the owner; each acquisition adds its own count.
    me: String,
    cycle: u64,
    owner: String,
    release: redis::Script,
}

#[async_trait]
impl Contender for SetNx {
    async fn acquire(&mut self) -> Res<()> {
        self.cycle += 1;
        self.owner = format!("{}-{}", self.me, self.cycle);
        loop {
            let set: Option<String> = redis::cmd("SET")
                .arg(&self.lock)
                .arg(&self.owner)
                .arg("NX")
                .arg("PX")
                .arg(KEY_TTL.as_millis() as u64)
                .query_async(&mut self.conn)
                .await?;
            if set.is_some() {
                let _token: u64 = redis::cmd("INCR")
                    .arg(format!("{}:token", self.lock))
                    .query_async(&mut self.conn)
                    .await?;
                return Ok(());
            }
            tokio::time::sleep(RETRY_SLEEP).await;
        }
    }

    async fn release(&mut self) -> Res<()> {
        let _deleted: i64 = self
            .release
            .key(&self.lock)
            .arg(&self.owner)
            .invoke_async(&mut self.conn)
            .await?;
        Ok(())
    }
}

/// rslock's Redlock on one node, as its docs use it: `acquire` (which retries until it holds)
/// and `release`.
struct Redlock {
    manager: rslock::LockManager,
    resource: String,
    guard: Option<rslock::LockGuard>,
}

#[async_trait]
impl Contender for Redlock {
    async fn acquire(&mut self) -> Res<()> {
        let guard = self
            .manager
            .acquire(self.resource.as_str(), KEY_TTL)
            .await?;
        self.guard = Some(guard);
        Ok(())
    }

    async fn release(&mut self) -> Res<()> {
        if let Some(guard) = self.guard.take() {
            guard.release().await;
        }
        Ok(())
    }
}

/// How a release reaches the next holder: woken (baton), or found by polling.
#[derive(Clone, Copy)]
enum Wake {
    /// Wake-ups the backend's mailbox delivered, and the `RPUSH`es the server ran.
    Woken { wakeups: u64, rpush: u64 },
    /// `SET NX` attempts the server ran.
    Polled { attempts: u64 },
}

struct RedisRun {
    run: Run,
    grants: u64,
    handoffs: usize,
    handoffs_over_20ms: usize,
    longest_handoff: Duration,
    /// Handoffs to another contender than the one that released, sorted.
    to_another: Vec<Duration>,
    wake: Wake,
    connections: usize,
    grants_min: u64,
    grants_max: u64,
    redis_cpu_ms_per_cycle: f64,
    client_cpu_ms_per_cycle: f64,
}

/// What [`contend`] measured, before the implementation's own counters are added.
struct Measured {
    n: usize,
    samples: Samples,
    to_another: Vec<Duration>,
    per_contender: Vec<u64>,
    secs: f64,
    connections: usize,
    server: ServerCounters,
    server_cpu: f64,
    client_cpu: f64,
}

impl Measured {
    /// [`finish`](Self::finish) for a polling implementation: its requests and `SET NX`
    /// tries, as the server counted them.
    fn finish_polled(self, label: &'static str) -> RedisRun {
        let requests = POLLING_REQUESTS.iter().map(|c| self.server.calls(c)).sum();
        let attempts = self.server.calls("set");
        self.finish(label, requests, Wake::Polled { attempts })
    }

    fn finish(mut self, label: &'static str, requests: u64, wake: Wake) -> RedisRun {
        self.to_another.sort();
        let s = self.samples;
        let grants = s.grants;
        let over = Duration::from_millis(20);
        let handoffs = s.handoff.len();
        let handoffs_over_20ms = s.handoff.iter().filter(|d| **d > over).count();
        let longest_handoff = s.handoff.iter().max().copied().unwrap_or_default();
        let per_cycle = grants.max(1) as f64;
        let mut run = summarise(label, self.n, HOLD.as_millis() as u64, self.secs, s);
        run.requests_per_cycle = requests as f64 / per_cycle;
        RedisRun {
            run,
            grants,
            handoffs,
            handoffs_over_20ms,
            longest_handoff,
            to_another: self.to_another,
            wake,
            connections: self.connections,
            grants_min: self.per_contender.iter().min().copied().unwrap_or(0),
            grants_max: self.per_contender.iter().max().copied().unwrap_or(0),
            redis_cpu_ms_per_cycle: self.server_cpu * 1000.0 / per_cycle,
            client_cpu_ms_per_cycle: self.client_cpu * 1000.0 / per_cycle,
        }
    }
}

/// The contenders take the lock, hold it for [`HOLD`] and release it, for `secs`; the
/// connections are counted half-way, as those open beyond `baseline`.
async fn contend<C: Contender>(
    admin: &Admin,
    baseline: usize,
    contenders: Vec<C>,
    secs: Duration,
) -> Res<Measured> {
    let n = contenders.len();
    let samples = Arc::new(StdMutex::new(Samples::default()));
    // The last holder, and the handoffs that went to another contender than it.
    let passed = Arc::new(StdMutex::new((None::<usize>, Vec::new())));
    let server0 = admin.reset().await?;
    let client0 = process_cpu_seconds();
    let start = Instant::now();
    let deadline = start + secs;
    let tasks: Vec<_> = contenders
        .into_iter()
        .enumerate()
        .map(|(me, mut c)| {
            let (samples, passed) = (Arc::clone(&samples), Arc::clone(&passed));
            tokio::spawn(async move {
                let mut grants = 0u64;
                while Instant::now() < deadline {
                    let asked = Instant::now();
                    c.acquire().await?;
                    let released = {
                        let mut samples = samples.lock().unwrap();
                        let released = samples.released_at;
                        samples.granted(asked);
                        released
                    };
                    {
                        let mut passed = passed.lock().unwrap();
                        if let (Some(at), Some(last)) = (released, passed.0)
                            && last != me
                        {
                            passed.1.push(at.elapsed());
                        }
                        passed.0 = Some(me);
                    }
                    grants += 1;
                    held(&samples, HOLD).await;
                    c.release().await?;
                }
                Res::Ok(grants)
            })
        })
        .collect();
    tokio::time::sleep(secs / 2).await;
    let connections = admin.clients().await?.saturating_sub(baseline);
    let mut per_contender = Vec::with_capacity(n);
    for t in tasks {
        per_contender.push(t.await??);
    }
    let secs = start.elapsed().as_secs_f64();
    let client_cpu = process_cpu_seconds() - client0;
    let server = admin.counters().await?;
    let samples = std::mem::take(&mut *samples.lock().unwrap());
    let to_another = std::mem::take(&mut passed.lock().unwrap().1);
    Ok(Measured {
        n,
        samples,
        to_another,
        per_contender,
        secs,
        connections,
        server_cpu: server.cpu_seconds - server0.cpu_seconds,
        server,
        client_cpu,
    })
}

/// baton: N contenders, each with its own session on one backend (one process) that
/// `connect` makes once the server's connections are counted, labelled `label`; `admin`
/// counts on the server that backend reaches.
async fn baton_contended(
    connect: impl std::future::Future<Output = baton::Result<RedisBackend>>,
    label: &'static str,
    admin: &Admin,
    n: usize,
    secs: Duration,
) -> Res<RedisRun> {
    let baseline = admin.settled().await?;
    let backend = connect.await?;
    let name = format!("bench/n{n}/baton");
    let mut sessions = Vec::with_capacity(n);
    for _ in 0..n {
        sessions.push(Session::new(backend.clone()).await?);
    }
    let contenders = sessions
        .iter()
        .map(|s| {
            Ok(Baton {
                mutex: Mutex::new(s, &name)?,
                guard: None,
            })
        })
        .collect::<Res<Vec<_>>>()?;
    let (requests0, wakeups0) = (backend.requests_sent(), backend.wakeups());
    let m = contend(admin, baseline, contenders, secs).await?;
    let (requests, wakeups) = (
        backend.requests_sent() - requests0,
        backend.wakeups() - wakeups0,
    );
    futures::future::join_all(sessions.iter().map(Session::close)).await;
    let rpush = m.server.calls("rpush");
    Ok(m.finish(label, requests, Wake::Woken { wakeups, rpush }))
}

/// The hand-written pattern: N contenders on one multiplexed connection (one process).
async fn set_nx_contended(
    node: &RedisNode,
    admin: &Admin,
    n: usize,
    secs: Duration,
) -> Res<RedisRun> {
    let baseline = admin.settled().await?;
    let conn = redis::Client::open(node.url())?
        .get_multiplexed_async_connection()
        .await?;
    let contenders = (0..n)
        .map(|i| SetNx {
            conn: conn.clone(),
            lock: format!("bench/n{n}/set-nx"),
            me: format!("{}-{i}", std::process::id()),
            cycle: 0,
            owner: String::new(),
            release: redis::Script::new(RELEASE),
        })
        .collect();
    let m = contend(admin, baseline, contenders, secs).await?;
    Ok(m.finish_polled("SET NX PX + 10 ms retry"))
}

/// rslock on one node: N contenders sharing one lock manager (one process).
async fn rslock_contended(
    node: &RedisNode,
    admin: &Admin,
    n: usize,
    secs: Duration,
) -> Res<RedisRun> {
    let baseline = admin.settled().await?;
    let manager = rslock::LockManager::new(vec![node.url()]);
    let contenders = (0..n)
        .map(|_| Redlock {
            manager: manager.clone(),
            resource: format!("bench/n{n}/rslock"),
            guard: None,
        })
        .collect();
    let m = contend(admin, baseline, contenders, secs).await?;
    Ok(m.finish_polled("rslock (Redlock, 1 node)"))
}

#[derive(Default)]
struct Scale {
    waiters: usize,
    /// Live heap per waiter, all included (session, lock task, queue entry, wait).
    heap_per_waiter: f64,
    /// Of which the session (lease, keep-alive).
    heap_per_session: f64,
    connections: usize,
    queue_time: Duration,
    drain_time: Duration,
    /// Wake-ups delivered during the drain, and the `RPUSH`es the server ran meanwhile.
    wakeups: u64,
    rpush: u64,
    fifo: bool,
}

/// `waiters` waiters, each with its own session on one backend, queued behind a holder, then
/// drained: each releases as soon as it is granted.
async fn scale(node: &RedisNode, admin: &Admin, waiters: usize) -> Res<Scale> {
    let baseline = admin.settled().await?;
    let backend = node.backend().await?;
    let holder = Session::new(backend.clone()).await?;
    let guard = Mutex::new(&holder, SCALE_LOCK)?.lock().await?;
    let heap0 = live_bytes();
    let started = Instant::now();
    let sessions = open_sessions(&backend, waiters).await?;
    let heap_sessions = live_bytes();
    let mut rx = queue_in_order(&sessions, SCALE_LOCK, || async {
        admin.query(redis::cmd("ZCARD").arg(SCALE_QUEUE_KEY)).await
    })
    .await?;
    let queue_time = started.elapsed();
    let heap1 = live_bytes();
    let connections = admin.clients().await?.saturating_sub(baseline);
    let wakeups0 = backend.wakeups();
    admin.reset().await?;
    let drain_start = Instant::now();
    guard.release().await?;
    let tokens = drain(&mut rx, waiters).await?;
    let drain_time = drain_start.elapsed();
    let wakeups = backend.wakeups() - wakeups0;
    let rpush = admin.counters().await?.calls("rpush");
    futures::future::join_all(sessions.iter().map(Session::close)).await;
    holder.close().await?;
    Ok(Scale {
        waiters,
        heap_per_waiter: (heap1 - heap0) as f64 / waiters as f64,
        heap_per_session: (heap_sessions - heap0) as f64 / waiters as f64,
        connections,
        queue_time,
        drain_time,
        wakeups,
        rpush,
        fifo: tokens.windows(2).all(|w| w[0] < w[1]),
    })
}

/// What the Redis part measured, for its section of docs/performance.md.
pub(super) struct Report {
    debian_version: String,
    server_version: String,
    secs: Duration,
    runs: Vec<RedisRun>,
    scale: Scale,
}

/// Starts one Redis (a container on 127.0.0.1) and measures on it: the three implementations
/// at each of `ns` contenders for `secs` each, then `waiters` waiters on one lock.
pub(super) async fn run(secs: Duration, ns: &[usize], waiters: usize) -> Res<Report> {
    // Durable as Redis advises for data that matters: the append-only file, fsynced every
    // second (the fixture turns persistence off for tests).
    let node = RedisNode::start_with(&["--appendonly", "yes", "--appendfsync", "everysec"]).await?;
    let admin = Admin::connect(&node.url()).await?;
    let mut runs = Vec::new();
    for &n in ns {
        eprintln!("bench: Redis, N = {n}");
        runs.push(baton_contended(node.backend(), "baton", &admin, n, secs).await?);
        runs.push(set_nx_contended(&node, &admin, n, secs).await?);
        runs.push(rslock_contended(&node, &admin, n, secs).await?);
    }
    eprintln!("bench: Redis, {waiters} waiters");
    let scale = scale(&node, &admin, waiters).await?;
    // As a Sentinel deployment runs: the primary with its replica, found through three
    // Sentinels (`redis+sentinel://`); baton's rows only, beside the plain primary's above.
    let sentinel = RedisSentinel::start().await?;
    let primary = Admin::connect(&sentinel.primary().await?.url()).await?;
    // Marked new, as an operator does a store baton has not used (`baton init`): otherwise
    // the first grant waits the restart grace.
    sentinel
        .backend(RedisOptions::new())
        .await?
        .init_store()
        .await?;
    for &n in ns {
        eprintln!("bench: Redis Sentinel, N = {n}");
        let backend = sentinel.backend(RedisOptions::new());
        runs.push(baton_contended(backend, SENTINEL_ROW, &primary, n, secs).await?);
    }
    let debian_version = std::process::Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", "redis-server"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "?".to_owned());
    Ok(Report {
        debian_version,
        server_version: admin.server_version().await?,
        secs,
        runs,
        scale,
    })
}

fn wake(r: &RedisRun) -> String {
    let per = |count: u64| count as f64 / r.grants.max(1) as f64;
    match r.wake {
        Wake::Woken { wakeups, rpush } => {
            format!("{:.3} woken (RPUSH {:.3})", per(wakeups), per(rpush))
        }
        Wake::Polled { attempts } => format!("{:.1} SET tries", per(attempts)),
    }
}

impl Report {
    pub(super) fn markdown(&self) -> String {
        let mut md = format!(
            "## Redis\n\nOne Redis in a container on 127.0.0.1, built from Debian's redis-server {} (the server reports {}), with the append-only file fsynced every second (`appendonly yes`, `appendfsync everysec`, the durability Redis advises), started for this run, on the same machine as the client. Each configuration ran {:.0} s, hold 0 ms; each implementation had a fresh client. Beside baton (one `RedisBackend`, each contender with its own session): the hand-written pattern (`SET <lock> <owner> NX PX 10000`, on a refusal **a 10 ms sleep** and again; once granted `INCR <lock>:token`; released by the compare-and-delete script; all contenders on one multiplexed connection), and rslock {} on one node (Redlock; `acquire`, which retries with the crate's defaults: up to 3 tries, 0–200 ms apart at random, then again; one lock manager). The rows `{}` are baton through Sentinel, as a Sentinel deployment runs it: a primary with one replica (asynchronous replication, as Sentinel has it) and three Sentinels, each a container of the same image, the backend connected with `redis+sentinel://` (its Redis CPU is the primary's only; persistence off there, the fixture's settings).\n\n",
            self.debian_version,
            self.server_version,
            self.secs.as_secs_f64(),
            rslock_version(),
            SENTINEL_ROW,
        );
        md.push_str("| impl | N | cycles/s | acquire p50 / p99 ms | handoff p50 / p99 ms | handoffs > 20 ms | to another contender: share, p50 / p99 ms | requests/cycle | wake-ups/release | connections | grants per contender, min–max | Redis CPU ms/cycle | client CPU ms/cycle |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        for r in &self.runs {
            md.push_str(&format!(
                "| {} | {} | {:.0} | {} / {} | {} / {} | {} of {} | {:.0} %, {} / {} | {:.2} | {} | {} | {}–{} | {:.3} | {:.3} |\n",
                r.run.impl_name,
                r.run.n,
                r.run.cycles_per_s,
                ms(r.run.acquire_p50),
                ms(r.run.acquire_p99),
                ms(r.run.handoff_p50),
                ms(r.run.handoff_p99),
                r.handoffs_over_20ms,
                r.handoffs,
                r.to_another.len() as f64 * 100.0 / r.handoffs.max(1) as f64,
                ms(pct(&r.to_another, 0.5)),
                ms(pct(&r.to_another, 0.99)),
                r.run.requests_per_cycle,
                wake(r),
                r.connections,
                r.grants_min,
                r.grants_max,
                r.redis_cpu_ms_per_cycle,
                r.client_cpu_ms_per_cycle,
            ));
        }
        md.push_str("\nHandoff = from the holder starting its release to the next grant (its own, when it takes the lock again first); \"to another contender\": the handoffs whose grant went to another contender than the one that released, their share and latency. Requests/cycle: for baton its `requests_sent()`; for the others the `SET`, `INCR` and script calls the server counted (`INFO commandstats`). Wake-ups/release: for baton, the wake-ups its mailbox delivered per release, and the `RPUSH`es the server ran (only baton's wake-ups use it); for the others, nobody is woken: `SET NX` tries per grant, the cost of polling. Connections: those open on the server half-way through the run, less the bench's own. CPU: Redis's `used_cpu_sys + used_cpu_user`, and this whole process's.\n\n");
        let s = &self.scale;
        md.push_str(&format!(
            "### Redis: {} waiters on one lock, one process\n\n| what | value |\n| --- | ---: |\n| client memory per waiter: live heap (session, lock task, queue entry, wait) | {:.0} bytes |\n| of which the session (lease, keep-alive) | {:.0} bytes |\n| connections used | {} |\n| time to queue them all | {:.2} s |\n| time to drain the queue | {:.2} s ({} ms per handoff) |\n| wake-ups delivered during the drain (server `RPUSH`es) | {} ({}) for {} releases |\n| granted in FIFO (token) order | {} |\n\n",
            s.waiters,
            s.heap_per_waiter,
            s.heap_per_session,
            s.connections,
            s.queue_time.as_secs_f64(),
            s.drain_time.as_secs_f64(),
            ms(s.drain_time / u32::try_from(s.waiters.max(1)).unwrap_or(u32::MAX)),
            s.wakeups,
            s.rpush,
            s.waiters,
            if s.fifo { "yes" } else { "NO" },
        ));
        md.push_str(&self.targets());
        md
    }

    /// The targets at N = 8, against this run.
    fn targets(&self) -> String {
        let Some(b) = self
            .runs
            .iter()
            .find(|r| r.run.impl_name == "baton" && r.run.n == 8)
        else {
            return "Targets at N = 8: not measured (N = 8 was not run).\n".to_owned();
        };
        let yes = |ok: bool| if ok { "met" } else { "**not met**" };
        let (wakeups, rpush) = match b.wake {
            Wake::Woken { wakeups, rpush } => (wakeups, rpush),
            Wake::Polled { .. } => (0, 0),
        };
        // A contender's last release may find nobody waiting: at most N of them.
        let one_each =
            rpush == wakeups && wakeups <= b.grants && wakeups + b.run.n as u64 >= b.grants;
        format!(
            "Targets for baton at N = 8: at least 2,000 cycles/s: {:.0}, {}; no handoff over 20 ms: {} of {} (longest {} ms), {}; one wake-up per release: {} wake-ups, {} `RPUSH`es for {} releases, {}.\n",
            b.run.cycles_per_s,
            yes(b.run.cycles_per_s >= 2000.0),
            b.handoffs_over_20ms,
            b.handoffs,
            ms(b.longest_handoff),
            yes(b.handoffs_over_20ms == 0),
            wakeups,
            rpush,
            b.grants,
            yes(one_each),
        )
    }
}

/// The rslock release Cargo.lock resolved the dev-dependency to.
fn rslock_version() -> String {
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"));
    lock.ok()
        .and_then(|l| {
            let rest = l.split_once("name = \"rslock\"\nversion = \"")?.1;
            Some(rest.split('"').next()?.to_owned())
        })
        .unwrap_or_else(|| "?".to_owned())
}
