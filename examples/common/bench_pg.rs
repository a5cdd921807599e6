//! The PostgreSQL part of the benchmark harness (`just bench`; `--only postgres` runs it
//! alone): baton's Mutex on one PostgreSQL beside a `pg_advisory_lock` loop (blocking, on a
//! connection per contender) and a `pg_try_advisory_lock` polling loop (10 ms between tries),
//! at N = 1, 8, 64, and three floors under baton's design (a bare queue, leased rows, leased
//! rows safe across processes: what the design costs before baton's other guarantees); it
//! writes the `## PostgreSQL` section.
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

/// A grant released at once (no hold): the handoff clock starts at the release.
fn held(grants: &StdMutex<Grants>, who: usize, asked: Instant) {
    let mut g = grants.lock().unwrap();
    g.granted(who, asked);
    g.released();
}

/// Each contender's cycles, once every contender's task has ended.
async fn counts(tasks: Vec<tokio::task::JoinHandle<Res<u64>>>) -> Res<Vec<u64>> {
    let mut per_contender = Vec::with_capacity(tasks.len());
    for t in tasks {
        per_contender.push(t.await??);
    }
    Ok(per_contender)
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
    /// The server's connections of the run (baton's counted in `pg_stat_activity` by their
    /// `application_name` halfway through the run), and how many processes they stand for.
    connections: usize,
    processes: usize,
}

/// Waiters queued on one lock through one backend, then drained, each releasing once granted.
struct PgScale {
    waiters: usize,
    /// Opening the waiters' sessions (a lease each), before any of them queued.
    sessions_time: Duration,
    queue_time: Duration,
    /// Server CPU per waiter while they queued, in ms.
    queue_cpu_ms_per_waiter: Option<f64>,
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

/// The server's CPU time so far (its container's cgroup), in seconds.
fn server_cpu_seconds(node: &PgNode) -> Option<f64> {
    crate::container_cpu_seconds(node.container_id())
}

/// The benchmark's connection string for `node` (the server itself runs with
/// `synchronous_commit = on`, see `run`).
fn conninfo(node: &PgNode) -> String {
    format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres",
        node.port()
    )
}

async fn client(node: &PgNode) -> Res<Client> {
    let (client, connection) = tokio_postgres::connect(&conninfo(node), NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// baton's connections on the server, `after` from now (halfway through a run): counted in
/// `pg_stat_activity` by the `application_name` `PgBackend` sets (`baton`).
fn count_baton_connections(node: &PgNode, after: Duration) -> tokio::task::JoinHandle<Res<usize>> {
    let conninfo = conninfo(node);
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let (c, connection) = tokio_postgres::connect(&conninfo, NoTls).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let row = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'baton'",
                &[],
            )
            .await?;
        Ok(usize::try_from(row.get::<_, i64>(0))?)
    })
}

/// What a run counted besides its grants.
struct Measured {
    per_contender: Vec<u64>,
    /// The server's CPU seconds over the run.
    cpu: Option<f64>,
    wakeups: Option<u64>,
    connections: usize,
    processes: usize,
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
        processes,
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
        processes,
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
    let connections = count_baton_connections(node, secs / 2);
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
                        guard.release().await?;
                        return Res::Ok(cycles);
                    }
                    held(&grants, who, asked);
                    cycles += 1;
                    guard.release().await?;
                }
            })
        })
        .collect();
    let per_contender = counts(tasks).await?;
    let cpu = server_cpu_seconds(node).zip(cpu_before).map(|(a, b)| a - b);
    let woken = wakeups() - woken_before;
    futures::future::join_all(sessions.iter().map(Session::close)).await;
    let measured = Measured {
        per_contender,
        cpu,
        wakeups: Some(woken),
        connections: connections.await??,
        processes: backends.len(),
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
                    held(&grants, who, asked);
                    cycles += 1;
                    c.query_one(&unlock, &[&key]).await?;
                }
            })
        })
        .collect();
    let per_contender = counts(tasks).await?;
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
        processes: n,
    };
    Ok(finish(name, n, secs, &grants, measured))
}

/// A floor: its name in the table, its tables and functions, the enqueue (`$1`: the
/// contender; answers the new token and whether an older live row exists) and the release
/// (`$1`: the token; notifies the next live row's contender in the same statement).
struct FloorSql {
    name: &'static str,
    tables: &'static str,
    functions: &'static str,
    enqueue: &'static str,
    release: &'static str,
}

/// The floors, in the table's order.
const FLOORS: [&FloorSql; 3] = [&BARE, &LEASED, &SERIALIZED];

/// The tables of a queue whose rows are bound to leases (1,024 leases, live for an hour).
const LEASED_TABLES: &str = "CREATE TABLE baton_floor.leases (id integer PRIMARY KEY,
                 deadline timestamptz NOT NULL);
             INSERT INTO baton_floor.leases SELECT g, clock_timestamp() + interval '1 hour'
                 FROM generate_series(0, 1023) g;
             CREATE TABLE baton_floor.q (token bigint PRIMARY KEY
                 DEFAULT nextval('baton_floor.tokens'), who integer NOT NULL
                 REFERENCES baton_floor.leases ON DELETE CASCADE);";

/// A queue and nothing else: a row per waiter, its token from a sequence.
const BARE: FloorSql = FloorSql {
    name: "floor: a bare queue",
    functions: "",
    tables: "CREATE TABLE baton_floor.q (token bigint PRIMARY KEY
                 DEFAULT nextval('baton_floor.tokens'), who integer NOT NULL);",
    enqueue: "WITH i AS (INSERT INTO baton_floor.q (who) VALUES ($1) RETURNING token)
              SELECT i.token, EXISTS (SELECT 1 FROM baton_floor.q p WHERE p.token < i.token)
              FROM i",
    release: "WITH d AS (DELETE FROM baton_floor.q WHERE token = $1)
              SELECT pg_notify('floor' || n.who, '') FROM (SELECT who FROM baton_floor.q
                  WHERE token > $1 ORDER BY token LIMIT 1) n",
};

/// The same queue with each row bound to its contender's lease (a deadline on the server's
/// clock, deleted with its rows): the enqueue needs a live lease, the queue skips rows of
/// expired leases, and a release deletes only under a live lease.
const LEASED: FloorSql = FloorSql {
    name: "floor: a queue of leased rows",
    tables: LEASED_TABLES,
    functions: "",
    enqueue: "WITH l AS (SELECT id FROM baton_floor.leases
                         WHERE id = $1 AND deadline > clock_timestamp()),
                   i AS (INSERT INTO baton_floor.q (who) SELECT id FROM l RETURNING token)
              SELECT i.token, EXISTS (SELECT 1 FROM baton_floor.q p
                  JOIN baton_floor.leases ls ON ls.id = p.who
                  WHERE p.token < i.token AND ls.deadline > clock_timestamp())
              FROM i",
    release: "WITH d AS (DELETE FROM baton_floor.q USING baton_floor.leases ls
                         WHERE token = $1 AND ls.id = who AND ls.deadline > clock_timestamp())
              SELECT pg_notify('floor' || n.who, '') FROM (SELECT who FROM baton_floor.q
                  JOIN baton_floor.leases ls ON ls.id = who
                  WHERE token > $1 AND ls.deadline > clock_timestamp()
                  ORDER BY token LIMIT 1) n",
};

/// The leased queue, safe across processes: the enqueue and the release each one transaction
/// (a PL/pgSQL function) holding the queue's advisory lock, so that tokens commit in token
/// order and no release misses a waiter that enqueued meanwhile, whatever connection each
/// runs on.
const SERIALIZED: FloorSql = FloorSql {
    name: "floor: leased rows, safe across processes",
    tables: LEASED_TABLES,
    functions: "CREATE FUNCTION baton_floor.enqueue(w integer, OUT t bigint, OUT b boolean)
             LANGUAGE plpgsql AS $$
             BEGIN
                 PERFORM pg_advisory_xact_lock(42);
                 INSERT INTO baton_floor.q (who) SELECT id FROM baton_floor.leases
                     WHERE id = w AND deadline > clock_timestamp() RETURNING token INTO t;
                 IF t IS NULL THEN
                     RAISE EXCEPTION 'lease % lost', w;
                 END IF;
                 b := EXISTS (SELECT 1 FROM baton_floor.q p
                     JOIN baton_floor.leases ls ON ls.id = p.who
                     WHERE p.token < t AND ls.deadline > clock_timestamp());
             END $$;
             CREATE FUNCTION baton_floor.release(t bigint) RETURNS void LANGUAGE plpgsql AS $$
             BEGIN
                 PERFORM pg_advisory_xact_lock(42);
                 DELETE FROM baton_floor.q USING baton_floor.leases ls
                     WHERE token = t AND ls.id = who AND ls.deadline > clock_timestamp();
                 PERFORM pg_notify('floor' || n.who, '') FROM (SELECT who FROM baton_floor.q
                     JOIN baton_floor.leases ls ON ls.id = who
                     WHERE token > t AND ls.deadline > clock_timestamp()
                     ORDER BY token LIMIT 1) n;
             END $$;",
    enqueue: "SELECT t, b FROM baton_floor.enqueue($1)",
    release: "SELECT baton_floor.release($1)",
};

/// A floor under baton's lock: what a queue lock built as issue #27 asks costs before the
/// rest of baton's guarantees (`sql`: one of [`FLOORS`]). Tokens from a
/// sequence, a row per waiter, one NOTIFY waking exactly the next waiter, on one request
/// connection shared by the N contenders and one LISTEN connection with a channel per
/// contender. None of them recognises a retried request, carries the WAL timeline in its
/// tokens, waits out a restart grace, ends expired leases, or tells observers.
async fn floor(node: &PgNode, n: usize, secs: Duration, sql: &FloorSql) -> Res<PgRun> {
    let admin = client(node).await?;
    admin
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS baton_floor CASCADE; CREATE SCHEMA baton_floor;
             CREATE SEQUENCE baton_floor.tokens AS bigint; {} {}",
            sql.tables, sql.functions
        ))
        .await?;
    // The LISTEN connection: each notification goes to its contender.
    let (listen, mut connection) = tokio_postgres::connect(&conninfo(node), NoTls).await?;
    let mut inboxes = Vec::with_capacity(n);
    let mut senders = std::collections::HashMap::new();
    for who in 0..n {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        senders.insert(format!("floor{who}"), tx);
        inboxes.push(rx);
    }
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = futures::StreamExt::next(&mut messages).await {
            if let tokio_postgres::AsyncMessage::Notification(note) = message
                && let Some(tx) = senders.get(note.channel())
            {
                let _ = tx.send(());
            }
        }
    });
    let channels: String = (0..n).map(|who| format!("LISTEN floor{who};")).collect();
    listen.batch_execute(&channels).await?;
    let c = client(node).await?;
    let enqueue = c.prepare(sql.enqueue).await?;
    let release = c.prepare(sql.release).await?;
    let c = Arc::new(c);
    let grants = Arc::new(StdMutex::new(Grants::default()));
    let cpu_before = server_cpu_seconds(node);
    let deadline = Instant::now() + secs;
    let tasks: Vec<_> = inboxes
        .into_iter()
        .enumerate()
        .map(|(who, mut inbox)| {
            let (c, enqueue, release) = (Arc::clone(&c), enqueue.clone(), release.clone());
            let grants = Arc::clone(&grants);
            tokio::spawn(async move {
                let who_sql = i32::try_from(who)?;
                let mut cycles = 0u64;
                loop {
                    let asked = Instant::now();
                    let row = c.query_one(&enqueue, &[&who_sql]).await?;
                    let (token, behind): (i64, bool) = (row.get(0), row.get(1));
                    if behind {
                        // Only the release of the row just before this one notifies it.
                        inbox.recv().await.ok_or("the LISTEN connection ended")?;
                    }
                    if Instant::now() >= deadline {
                        c.query(&release, &[&token]).await?;
                        return Res::Ok(cycles);
                    }
                    held(&grants, who, asked);
                    cycles += 1;
                    c.query(&release, &[&token]).await?;
                }
            })
        })
        .collect();
    let per_contender = counts(tasks).await?;
    let cpu = server_cpu_seconds(node).zip(cpu_before).map(|(a, b)| a - b);
    drop(listen);
    admin
        .batch_execute("DROP SCHEMA baton_floor CASCADE")
        .await?;
    let measured = Measured {
        per_contender,
        cpu,
        wakeups: None,
        connections: 2,
        processes: 1,
    };
    Ok(finish(sql.name, n, secs, &grants, measured))
}

/// The doorbell floor's name in the table.
const DOORBELL: &str = "floor: leased rows, doorbells, a backend per contender";

/// A floor for issue #39's wake-up path, as N processes would run it: each contender has a
/// request connection and a wait connection of its own. Its enqueue is the last floor's (one
/// transaction under the queue's advisory lock, a leased row) and also takes a session-level
/// advisory lock keyed by the new token, the row's *doorbell*, held by the request
/// connection; the waiter blocks on its predecessor's doorbell (shared, on its wait
/// connection: the server's lock manager wakes exactly it) and reads that the row is gone
/// in the same statement; the release deletes the row (no NOTIFY), then, in the next
/// message, unlocks the doorbell: a waiter wakes only once the deletion committed. Durable
/// commits: two per cycle. What a waiter woken by its predecessor only costs, before the rest
/// of baton's guarantees.
async fn doorbell_floor(node: &PgNode, n: usize, secs: Duration) -> Res<PgRun> {
    let admin = client(node).await?;
    admin
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS baton_floor CASCADE; CREATE SCHEMA baton_floor;
             CREATE SEQUENCE baton_floor.tokens AS bigint; {LEASED_TABLES}
             CREATE FUNCTION baton_floor.enqueue(w integer, OUT t bigint, OUT p bigint)
             LANGUAGE plpgsql AS $$
             BEGIN
                 PERFORM pg_advisory_xact_lock(42);
                 INSERT INTO baton_floor.q (who) SELECT id FROM baton_floor.leases
                     WHERE id = w AND deadline > clock_timestamp() RETURNING token INTO t;
                 IF t IS NULL THEN
                     RAISE EXCEPTION 'lease % lost', w;
                 END IF;
                 PERFORM pg_advisory_lock(43, t::integer);
                 SELECT q.token INTO p FROM baton_floor.q q
                     JOIN baton_floor.leases ls ON ls.id = q.who
                     WHERE q.token < t AND ls.deadline > clock_timestamp()
                     ORDER BY q.token DESC LIMIT 1;
             END $$;
             CREATE FUNCTION baton_floor.release(t bigint) RETURNS void LANGUAGE plpgsql AS $$
             BEGIN
                 DELETE FROM baton_floor.q USING baton_floor.leases ls
                     WHERE token = t AND ls.id = who AND ls.deadline > clock_timestamp();
             END $$;
             CREATE FUNCTION baton_floor.wait(p bigint) RETURNS boolean LANGUAGE plpgsql AS $$
             BEGIN
                 PERFORM pg_advisory_xact_lock_shared(43, p::integer);
                 RETURN NOT EXISTS (SELECT 1 FROM baton_floor.q WHERE token = p);
             END $$;"
        ))
        .await?;
    let mut pairs = Vec::with_capacity(n);
    for _ in 0..n {
        pairs.push((client(node).await?, client(node).await?));
    }
    let grants = Arc::new(StdMutex::new(Grants::default()));
    let cpu_before = server_cpu_seconds(node);
    let deadline = Instant::now() + secs;
    let tasks: Vec<_> = pairs
        .into_iter()
        .enumerate()
        .map(|(who, (c, w))| {
            let grants = Arc::clone(&grants);
            tokio::spawn(async move {
                let enqueue = c
                    .prepare("SELECT t, p FROM baton_floor.enqueue($1)")
                    .await?;
                let release = c.prepare("SELECT baton_floor.release($1)").await?;
                let unlock = c
                    .prepare("SELECT pg_advisory_unlock(43, $1::bigint::integer)")
                    .await?;
                let wait = w.prepare("SELECT baton_floor.wait($1)").await?;
                let who_sql = i32::try_from(who)?;
                let mut cycles = 0u64;
                loop {
                    let asked = Instant::now();
                    let row = c.query_one(&enqueue, &[&who_sql]).await?;
                    let (token, predecessor): (i64, Option<i64>) = (row.get(0), row.get(1));
                    if let Some(p) = predecessor {
                        while !w.query_one(&wait, &[&p]).await?.get::<_, bool>(0) {}
                    }
                    let end = Instant::now() >= deadline;
                    if !end {
                        held(&grants, who, asked);
                        cycles += 1;
                    }
                    // Pipelined: the unlock runs once the deletion committed.
                    let (released, unlocked) = futures::future::join(
                        c.query(&release, &[&token]),
                        c.query(&unlock, &[&token]),
                    )
                    .await;
                    released?;
                    unlocked?;
                    if end {
                        return Res::Ok(cycles);
                    }
                }
            })
        })
        .collect();
    let per_contender = counts(tasks).await?;
    let cpu = server_cpu_seconds(node).zip(cpu_before).map(|(a, b)| a - b);
    admin
        .batch_execute("DROP SCHEMA baton_floor CASCADE")
        .await?;
    let measured = Measured {
        per_contender,
        cpu,
        wakeups: None,
        connections: 2 * n,
        processes: n,
    };
    Ok(finish(DOORBELL, n, secs, &grants, measured))
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
    let sessions_time = started.elapsed();
    let queue_cpu = server_cpu_seconds(node);
    let started = Instant::now();
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
    let queue_cpu_ms_per_waiter = queue_cpu
        .zip(cpu)
        .map(|(a, b)| (b - a) * 1000.0 / waiters as f64);
    let drain_start = Instant::now();
    guard.release().await?;
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
        sessions_time,
        queue_time,
        queue_cpu_ms_per_waiter,
        drain_time,
        wakeups_per_release: wakeups as f64 / waiters as f64,
        cpu_ms_per_grant,
        fifo: tokens.windows(2).all(|w| w[0] < w[1]),
    })
}

/// The server's settings for the headline table: durable, as PostgreSQL ships (the image
/// turns all three off for the test suite's speed; its `"$@"` comes last, so these win).
const DURABLE: [&str; 6] = [
    "-c",
    "fsync=on",
    "-c",
    "full_page_writes=on",
    "-c",
    "synchronous_commit=on",
];

pub(super) async fn run(secs: Duration, ns: &[usize], waiters: usize) -> Res<Report> {
    let node = PgNode::start_with(&DURABLE).await?;
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
        for sql in FLOORS {
            runs.push(floor(&node, n, secs, sql).await?);
        }
        runs.push(doorbell_floor(&node, n, secs).await?);
        runs.push(advisory_contended(&node, n, secs, 7_000 + n as i64, false).await?);
        runs.push(advisory_contended(&node, n, secs, 8_000 + n as i64, true).await?);
    }
    drop(node);
    let scale = if waiters > 0 {
        // On a server started for it: no statistics of `baton.entries` yet, no ANALYZE.
        eprintln!("bench: PostgreSQL, {waiters} waiters");
        let fresh = PgNode::start_with(&DURABLE).await?;
        Some(scale(&fresh, waiters).await?)
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
            "## PostgreSQL\n\nOne PostgreSQL {} server in a container (the image `scripts/build-postgres-image.sh` builds), durable as PostgreSQL ships: `fsync = on`, `full_page_writes = on`, `synchronous_commit = on`, so that every commit waits for its WAL flush (about 0.2 ms on this machine's disk), on the same machine. N contenders lock -> unlock (no hold) for {:.0} s each. baton: one `PgBackend` shared by N sessions, as in one process; \"a backend per contender\": N backends, as N processes would have. \"Floor\" rows are not baton: they measure what a queue lock of this design costs before baton's other guarantees, on the same two connections (one request connection shared by the N contenders, one LISTEN connection; plain statements; a row per waiter, its token from a sequence; the release notifies the next waiter in its own statement): \"a bare queue\" has nothing else (a dead holder blocks it forever); \"a queue of leased rows\" binds each row to a lease with a deadline on the server's clock (the enqueue needs a live lease, the queue skips rows of expired leases, a release deletes only under a live lease), but is correct only because one connection runs its statements one at a time; \"leased rows, safe across processes\" also runs the enqueue and the release each as one transaction (a PL/pgSQL function) holding the queue's advisory lock, the least that keeps tokens committed in token order and loses no wake-up when processes share the queue. baton adds to that last floor: a retried request that may have been applied is recognised (the entry's key, the caller's stamp), the WAL timeline in every token and the restart grace after a failover, expired leases ended by whoever meets them, observers, and a wait that needs no lock in the release (the waiter listens on its predecessor's channel and checks once after subscribing). \"Leased rows, doorbells, a backend per contender\" is the wake-up issue #39 proposes, as N processes would run it (a request and a wait connection each): the last floor's enqueue also takes a session-level advisory lock keyed by the new token (the row's doorbell); the waiter blocks on its predecessor's doorbell and reads the row gone in the same statement; the release deletes the row without a NOTIFY, then unlocks the doorbell in the next message (two durable commits a cycle, one server process woken a release). `pg_advisory_lock`: a connection per contender, blocking in the server's lock queue. Polling: `pg_try_advisory_lock`, {} ms sleep after a refusal. \"Same holder\" is the share of grants that went to the contender that held just before (strict FIFO with N > 1 gives 0 %). Server CPU is the container's cgroup time over the run. Connections: baton's counted on the server (`pg_stat_activity`, `application_name = 'baton'`) halfway through the run, and per process (per backend). Wake-ups per release: baton, the deletion waits a notification woke (`PgBackend::wakeups`) per grant; polling, the refused tries per grant; `pg_advisory_lock` wakes its next waiter inside the server (\"-\": not countable from outside).\n\n| impl | N | cycles/s | handoff p50 ms | handoff p99 ms | same holder | grants per contender (min-max) | wake-ups per release | server CPU ms/cycle | connections (per process) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
            self.version,
            self.secs.as_secs_f64(),
            RETRY_SLEEP.as_millis()
        );
        for r in &self.runs {
            md.push_str(&format!(
                "| {} | {} | {:.0} | {} | {} | {:.1} % | {}-{} | {} | {} | {} ({:.1}) |\n",
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
                r.connections,
                r.connections as f64 / r.processes.max(1) as f64
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
            let floors: Vec<String> = FLOORS
                .iter()
                .map(|sql| sql.name)
                .chain([DOORBELL])
                .filter_map(|name| {
                    let short = name.trim_start_matches("floor: ");
                    of(name).map(|f| format!("{short} {:.0} %", f * 100.0 / a.max(1.0)))
                })
                .collect();
            if !floors.is_empty() {
                md.push_str(&format!(". The floors: {}", floors.join(", ")));
            }
            md.push_str(".\n");
        }
        // Issue #39's targets, for processes that each run a backend.
        let apart = |n: usize| {
            self.runs
                .iter()
                .find(|r| r.n == n && r.impl_name == "baton, a backend per contender")
        };
        let advisory = |n: usize| {
            self.runs
                .iter()
                .find(|r| r.n == n && r.impl_name == "pg_advisory_lock")
        };
        let met = |ok: bool| if ok { "met" } else { "**not met**" };
        if let (Some(b), Some(a)) = (apart(8), advisory(8)) {
            let ratio = b.cycles_per_s / a.cycles_per_s.max(1.0);
            md.push_str(&format!(
                "\nTarget (issue #39), a backend per contender at N = 8: at least 0.30x `pg_advisory_lock`'s cycles/s: {ratio:.2}x, {}.\n",
                met(ratio >= 0.3)
            ));
        }
        if let Some(cpu) = apart(64).and_then(|b| b.server_cpu_ms_per_cycle) {
            md.push_str(&format!(
                "\nTarget (issue #39), a backend per contender at N = 64: at most 0.30 ms of server CPU per cycle: {cpu:.2} ms, {}.\n",
                met(cpu <= 0.3)
            ));
        }
        if let Some(sc) = &self.scale {
            md.push_str(&format!(
                "\n### {} waiters on one lock\n\nOne backend on a server started for this run (no statistics of baton's tables yet, no ANALYZE): {} sessions opened ({:.1} s, a lease each), then queued in order behind a holder: **{:.1} s to queue** (target: at most 5 s), {} ms of server CPU per waiter (the enqueues that arrive while one is in flight commit together: schema version 10). Then drained, each waiter releasing once granted: {} grants in {:.1} s ({:.0} a second), **{:.2} wake-ups per release**, FIFO: {}, server CPU {} ms per grant.\n",
                sc.waiters,
                sc.waiters,
                sc.sessions_time.as_secs_f64(),
                sc.queue_time.as_secs_f64(),
                sc.queue_cpu_ms_per_waiter
                    .map_or("?".to_owned(), |c| format!("{c:.2}")),
                sc.waiters,
                sc.drain_time.as_secs_f64(),
                sc.waiters as f64 / sc.drain_time.as_secs_f64().max(1e-9),
                sc.wakeups_per_release,
                if sc.fifo { "yes" } else { "**no**" },
                sc.cpu_ms_per_grant
                    .map_or("?".to_owned(), |c| format!("{c:.2}")),
            ));
        }
        md
    }
}
