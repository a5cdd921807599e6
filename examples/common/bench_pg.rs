//! The PostgreSQL part of the benchmark harness (`just bench`; `--only postgres` runs it
//! alone): baton's Mutex on one PostgreSQL beside a `pg_advisory_lock` loop (blocking, on a
//! connection per contender) and a `pg_try_advisory_lock` polling loop (10 ms between tries),
//! at N = 1, 8, 64; it writes the `## PostgreSQL` section.
//!
//! A child module of examples/bench.rs: it measures with the harness's own percentiles.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use baton::testing::PgNode;
use baton::tokio_postgres::{self, Client, NoTls};
use baton::{Mutex, PgBackend, PgOptions, Session};
use tokio::time::Instant;

use super::{Res, ms, pct};

/// The polling loop's sleep after a refused `pg_try_advisory_lock`.
const RETRY_SLEEP: Duration = Duration::from_millis(10);

#[derive(Default)]
struct Grants {
    acquire: Vec<Duration>,
    handoff: Vec<Duration>,
    released_at: Option<Instant>,
    last_holder: Option<usize>,
    same_holder: u64,
    grants: u64,
}

impl Grants {
    fn granted(&mut self, who: usize, asked: Instant) {
        let now = Instant::now();
        self.acquire.push(now - asked);
        if let Some(at) = self.released_at.take() {
            self.handoff.push(now - at);
        }
        if self.last_holder == Some(who) {
            self.same_holder += 1;
        }
        self.last_holder = Some(who);
        self.grants += 1;
    }

    fn released(&mut self) {
        self.released_at = Some(Instant::now());
    }
}

struct PgRun {
    impl_name: &'static str,
    n: usize,
    cycles_per_s: f64,
    handoff_p50: Duration,
    handoff_p99: Duration,
    same_holder: f64,
    per_contender_min: u64,
    per_contender_max: u64,
    server_cpu_ms_per_cycle: Option<f64>,
    /// Waiters woken per release: NOTIFYs heard on the entries' channels (baton), refused
    /// tries (polling); `None` where the server wakes waiters itself (`pg_advisory_lock`).
    wakeups_per_release: Option<f64>,
    connections: usize,
}

/// Waiters queued on one lock through one backend, then drained, each releasing once granted.
struct PgScale {
    waiters: usize,
    queue_time: Duration,
    drain_time: Duration,
    /// Deletion waits a notification woke, per grant, over the drain.
    wakeups_per_release: f64,
    /// Server CPU per grant over the drain, in ms.
    cpu_ms_per_grant: Option<f64>,
    fifo: bool,
}

/// The PostgreSQL section.
pub(super) struct Report {
    version: String,
    secs: Duration,
    runs: Vec<PgRun>,
    scale: Option<PgScale>,
}

/// The server's CPU time so far (its container's cgroup, cgroup v1 or v2), in seconds.
fn server_cpu_seconds(node: &PgNode) -> Option<f64> {
    let id = node.container_id();
    let v1 = format!("/sys/fs/cgroup/cpuacct/docker/{id}/cpuacct.usage");
    if let Ok(ns) = std::fs::read_to_string(v1) {
        return ns.trim().parse::<f64>().ok().map(|ns| ns / 1e9);
    }
    let v2 = format!("/sys/fs/cgroup/system.slice/docker-{id}.scope/cpu.stat");
    let stat = std::fs::read_to_string(v2).ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|us| us / 1e6)
}

async fn client(node: &PgNode) -> Res<Client> {
    let (client, connection) = tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            node.port()
        ),
        NoTls,
    )
    .await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// What a run counted besides its grants.
struct Measured {
    per_contender: Vec<u64>,
    /// The server's CPU seconds over the run.
    cpu: Option<f64>,
    wakeups: Option<u64>,
    connections: usize,
}

fn finish(
    impl_name: &'static str,
    n: usize,
    secs: Duration,
    grants: &StdMutex<Grants>,
    measured: Measured,
) -> PgRun {
    let Measured {
        per_contender,
        cpu,
        wakeups,
        connections,
    } = measured;
    let mut g = std::mem::take(&mut *grants.lock().unwrap());
    g.handoff.sort();
    PgRun {
        impl_name,
        n,
        cycles_per_s: g.grants as f64 / secs.as_secs_f64(),
        handoff_p50: pct(&g.handoff, 0.5),
        handoff_p99: pct(&g.handoff, 0.99),
        same_holder: if g.grants > 1 {
            g.same_holder as f64 * 100.0 / (g.grants - 1) as f64
        } else {
            0.0
        },
        per_contender_min: per_contender.iter().min().copied().unwrap_or(0),
        per_contender_max: per_contender.iter().max().copied().unwrap_or(0),
        server_cpu_ms_per_cycle: cpu.map(|s| s * 1000.0 / g.grants.max(1) as f64),
        wakeups_per_release: wakeups.map(|w| w as f64 / g.grants.max(1) as f64),
        connections,
    }
}

/// baton's Mutex: N sessions on one backend (one process: two connections, whatever N is),
/// or, `apart`, each on a backend of its own (N processes: two connections each).
async fn baton_contended(
    node: &PgNode,
    n: usize,
    secs: Duration,
    name: &str,
    apart: bool,
) -> Res<PgRun> {
    let url = node.url();
    let connect = || PgBackend::connect(&url, PgOptions::new());
    let backends = if apart {
        futures::future::join_all((0..n).map(|_| connect()))
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?
    } else {
        vec![connect().await?]
    };
    let sessions = futures::future::join_all(
        (0..n).map(|i| Session::new(backends[i % backends.len()].clone())),
    )
    .await
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    let wakeups = || backends.iter().map(PgBackend::wakeups).sum::<u64>();
    let grants = Arc::new(StdMutex::new(Grants::default()));
    let cpu_before = server_cpu_seconds(node);
    let woken_before = wakeups();
    let deadline = Instant::now() + secs;
    let tasks: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(who, s)| {
            let mutex = Mutex::new(s, name);
            let grants = Arc::clone(&grants);
            tokio::spawn(async move {
                let mutex = mutex?;
                let mut cycles = 0u64;
                loop {
                    let asked = Instant::now();
                    let guard = mutex.lock().await?;
                    if Instant::now() >= deadline {
                        guard.unlock().await?;
                        return Res::Ok(cycles);
                    }
                    grants.lock().unwrap().granted(who, asked);
                    cycles += 1;
                    grants.lock().unwrap().released();
                    guard.unlock().await?;
                }
            })
        })
        .collect();
    let mut per_contender = Vec::with_capacity(n);
    for t in tasks {
        per_contender.push(t.await??);
    }
    let cpu = server_cpu_seconds(node).zip(cpu_before).map(|(a, b)| a - b);
    let woken = wakeups() - woken_before;
    futures::future::join_all(sessions.iter().map(Session::close)).await;
    let measured = Measured {
        per_contender,
        cpu,
        wakeups: Some(woken),
        connections: 2 * backends.len(),
    };
    let impl_name = if apart {
        "baton, a backend per contender"
    } else {
        "baton"
    };
    Ok(finish(impl_name, n, secs, &grants, measured))
}

/// `pg_advisory_lock` (blocking) or `pg_try_advisory_lock` polling, on a connection per
/// contender (advisory locks belong to a session).
async fn advisory_contended(
    node: &PgNode,
    n: usize,
    secs: Duration,
    key: i64,
    polling: bool,
) -> Res<PgRun> {
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        clients.push(client(node).await?);
    }
    let grants = Arc::new(StdMutex::new(Grants::default()));
    // Polling: every refused try is a contender woken for nothing.
    let refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let cpu_before = server_cpu_seconds(node);
    let deadline = Instant::now() + secs;
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(who, c)| {
            let grants = Arc::clone(&grants);
            let refused = Arc::clone(&refused);
            tokio::spawn(async move {
                let lock = c.prepare("SELECT pg_advisory_lock($1)").await?;
                let try_lock = c.prepare("SELECT pg_try_advisory_lock($1)").await?;
                let unlock = c.prepare("SELECT pg_advisory_unlock($1)").await?;
                let mut cycles = 0u64;
                loop {
                    let asked = Instant::now();
                    if polling {
                        while !c.query_one(&try_lock, &[&key]).await?.get::<_, bool>(0) {
                            refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if Instant::now() >= deadline {
                                return Res::Ok(cycles);
                            }
                            tokio::time::sleep(RETRY_SLEEP).await;
                        }
                    } else {
                        c.query_one(&lock, &[&key]).await?;
                    }
                    if Instant::now() >= deadline {
                        c.query_one(&unlock, &[&key]).await?;
                        return Res::Ok(cycles);
                    }
                    grants.lock().unwrap().granted(who, asked);
                    cycles += 1;
                    grants.lock().unwrap().released();
                    c.query_one(&unlock, &[&key]).await?;
                }
            })
        })
        .collect();
    let mut per_contender = Vec::with_capacity(n);
    for t in tasks {
        per_contender.push(t.await??);
    }
    let cpu = server_cpu_seconds(node).zip(cpu_before).map(|(a, b)| a - b);
    let name = if polling {
        "pg_try_advisory_lock polling"
    } else {
        "pg_advisory_lock"
    };
    // pg_advisory_lock: the server's lock manager wakes the next waiter itself (one per
    // release of an exclusive lock); nothing to count from outside.
    let wakeups = polling.then(|| refused.load(std::sync::atomic::Ordering::Relaxed));
    let measured = Measured {
        per_contender,
        cpu,
        wakeups,
        connections: n,
    };
    Ok(finish(name, n, secs, &grants, measured))
}

/// `waiters` sessions of one backend queue on one lock behind a holder (in session order),
/// then the holder releases and each waiter releases once granted.
async fn scale(node: &PgNode, waiters: usize) -> Res<PgScale> {
    let backend = PgBackend::connect(&node.url(), PgOptions::new()).await?;
    let name = "bench/scale";
    let holder = Session::new(backend.clone()).await?;
    let guard = Mutex::new(&holder, name)?.lock().await?;
    let started = Instant::now();
    let sessions = super::open_sessions(&backend, waiters).await?;
    let admin = client(node).await?;
    let admin = &admin;
    let mut rx = super::queue_in_order(&sessions, name, || async move {
        let row = admin
            .query_one(
                r#"SELECT count(*) FROM baton.entries WHERE key >= 'bench/scale/' COLLATE "C"
                   AND key < 'bench/scale0' COLLATE "C""#,
                &[],
            )
            .await?;
        Ok(usize::try_from(row.get::<_, i64>(0))?)
    })
    .await?;
    let queue_time = started.elapsed();
    let (woken, cpu) = (backend.wakeups(), server_cpu_seconds(node));
    let drain_start = Instant::now();
    guard.unlock().await?;
    let tokens = super::drain(&mut rx, waiters).await?;
    let drain_time = drain_start.elapsed();
    let wakeups = backend.wakeups() - woken;
    let cpu_ms_per_grant = cpu
        .zip(server_cpu_seconds(node))
        .map(|(a, b)| (b - a) * 1000.0 / waiters as f64);
    futures::future::join_all(sessions.iter().map(Session::close)).await;
    holder.close().await?;
    Ok(PgScale {
        waiters,
        queue_time,
        drain_time,
        wakeups_per_release: wakeups as f64 / waiters as f64,
        cpu_ms_per_grant,
        fifo: tokens.windows(2).all(|w| w[0] < w[1]),
    })
}

pub(super) async fn run(secs: Duration, ns: &[usize], waiters: usize) -> Res<Report> {
    // The server's defaults for durability: synchronous_commit on (the image turns it off).
    let node = PgNode::start_with(&["-c", "synchronous_commit=on"]).await?;
    let version: String = client(&node)
        .await?
        .query_one("SHOW server_version", &[])
        .await?
        .get(0);
    let mut runs = Vec::new();
    for &n in ns {
        eprintln!("bench: PostgreSQL, N = {n}");
        runs.push(baton_contended(&node, n, secs, &format!("bench/n{n}"), false).await?);
        runs.push(baton_contended(&node, n, secs, &format!("bench/apart-n{n}"), true).await?);
        runs.push(advisory_contended(&node, n, secs, 7_000 + n as i64, false).await?);
        runs.push(advisory_contended(&node, n, secs, 8_000 + n as i64, true).await?);
    }
    let scale = if waiters > 0 {
        eprintln!("bench: PostgreSQL, {waiters} waiters");
        Some(scale(&node, waiters).await?)
    } else {
        None
    };
    Ok(Report {
        version,
        secs,
        runs,
        scale,
    })
}

impl Report {
    pub(super) fn markdown(&self) -> String {
        let mut md = format!(
            "## PostgreSQL\n\nOne PostgreSQL {} server in a container (the image `scripts/build-postgres-image.sh` builds; `synchronous_commit = on`, `fsync = off`), on the same machine. N contenders lock -> unlock (no hold) for {:.0} s each. baton: one `PgBackend` (two connections) shared by N sessions, as in one process; \"a backend per contender\": N backends (two connections each), as N processes would have, each with a LISTEN connection, and PostgreSQL signals every listening connection of the database at each NOTIFY. `pg_advisory_lock`: a connection per contender, blocking in the server's lock queue. Polling: `pg_try_advisory_lock`, {} ms sleep after a refusal. \"Same holder\" is the share of grants that went to the contender that held just before (strict FIFO with N > 1 gives 0 %). Server CPU is the container's cgroup time over the run. Wake-ups per release: baton, the deletion waits a notification woke (`PgBackend::wakeups`) per grant; polling, the refused tries per grant; `pg_advisory_lock` wakes its next waiter inside the server (\"-\": not countable from outside).\n\n| impl | N | cycles/s | handoff p50 ms | handoff p99 ms | same holder | grants per contender (min-max) | wake-ups per release | server CPU ms/cycle | connections |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
            self.version,
            self.secs.as_secs_f64(),
            RETRY_SLEEP.as_millis()
        );
        for r in &self.runs {
            md.push_str(&format!(
                "| {} | {} | {:.0} | {} | {} | {:.1} % | {}-{} | {} | {} | {} |\n",
                r.impl_name,
                r.n,
                r.cycles_per_s,
                ms(r.handoff_p50),
                ms(r.handoff_p99),
                r.same_holder,
                r.per_contender_min,
                r.per_contender_max,
                r.wakeups_per_release
                    .map_or("-".to_owned(), |w| format!("{w:.2}")),
                r.server_cpu_ms_per_cycle
                    .map_or("?".to_owned(), |c| format!("{c:.2}")),
                r.connections
            ));
        }
        let n = 8;
        let of = |name: &str| {
            self.runs
                .iter()
                .find(|r| r.n == n && r.impl_name == name)
                .map(|r| r.cycles_per_s)
        };
        if let (Some(b), Some(a)) = (of("baton"), of("pg_advisory_lock")) {
            md.push_str(&format!(
                "\nAt N = {n}, baton runs {:.0} % of `pg_advisory_lock`'s cycles/s (target: at least 50 %)",
                b * 100.0 / a.max(1.0)
            ));
            if let Some(apart) = of("baton, a backend per contender") {
                md.push_str(&format!(
                    "; with a backend per contender, {:.0} %",
                    apart * 100.0 / a.max(1.0)
                ));
            }
            md.push_str(".\n");
        }
        if let Some(sc) = &self.scale {
            md.push_str(&format!(
                "\n### {} waiters on one lock\n\nOne backend, {} sessions queued in order behind a holder ({:.1} s to queue), then drained: each waiter releases once granted. {} grants in {:.1} s ({:.0} a second), **{:.2} wake-ups per release** (the deletion waits a notification woke), FIFO: {}, server CPU {} ms per grant. Every waiter listens on its predecessor's channel: {} channels on the backend's one LISTEN connection. The time to queue depends on the planner's statistics of `baton.entries`: while autovacuum's ANALYZE lags behind a queue that grows this fast, the read of an entry's predecessor scans and sorts the queue, and queueing 10,000 took 52-56 s in such runs (docs/design.md, 2026-11-26).\n",
                sc.waiters,
                sc.waiters,
                sc.queue_time.as_secs_f64(),
                sc.waiters,
                sc.drain_time.as_secs_f64(),
                sc.waiters as f64 / sc.drain_time.as_secs_f64().max(1e-9),
                sc.wakeups_per_release,
                if sc.fifo { "yes" } else { "**no**" },
                sc.cpu_ms_per_grant
                    .map_or("?".to_owned(), |c| format!("{c:.2}")),
                sc.waiters,
            ));
        }
        md
    }
}
