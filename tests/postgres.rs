//! The conformance suite, the fault harness and PostgreSQL-specific tests against a real
//! PostgreSQL in a container (see `baton::testing::PgNode`). One server is shared by the tests
//! of this binary; each test uses its own lock names. Tests that stop or pause the server
//! start one of their own.

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use baton::testing::{PgNode, Proxy};
use baton::{Backend, Error, Mutex, PgBackend, PgOptions, Session, SessionOptions};
use support::{Rig, within};

async fn backend() -> PgBackend {
    PgNode::shared()
        .backend()
        .await
        .expect("connect to the shared PostgreSQL")
}

async fn rig(test: &str) -> Rig {
    Rig {
        backend: Arc::new(backend().await),
        // A second backend: "someone else" really is another client.
        outside: Arc::new(backend().await),
        prefix: format!("pg-{}/{test}", std::process::id()),
    }
}

conformance!(super::rig; flavor = "multi_thread", worker_threads = 2);

fn test_name(test: &str) -> String {
    format!("pg-{}/{test}", std::process::id())
}

/// The fault-injection harness on PostgreSQL, sampled as on etcd and Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_harness_sample() {
    support::harness::run_sample("postgres", |case: String| async move {
        Rig {
            backend: Arc::new(backend().await),
            outside: Arc::new(backend().await),
            prefix: format!("pg-{}/harness/{case}", std::process::id()),
        }
    })
    .await;
}

/// Bad URLs, dead ports, unknown databases, wrong passwords and missing permissions are
/// refused at connect with typed errors, the cause kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_errors_are_typed() {
    // Nothing is sent: the caller's to fix (issue #38: it was Connect, "cannot reach").
    let err = PgBackend::connect("postgres://a b c:xx/", PgOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
    assert!(std::error::Error::source(&err).is_some(), "{err:?}");

    let port = support::refused_port();
    let started = std::time::Instant::now();
    let err = PgBackend::connect(
        &format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        PgOptions::new().with_connect_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the cause is kept"
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    let node = PgNode::shared();
    let err = PgBackend::connect(
        &format!("postgres://postgres@127.0.0.1:{}/nosuchdb", node.port()),
        PgOptions::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Misconfigured { .. }), "{err:?}");

    let err = PgBackend::connect(&node.url(), PgOptions::new().with_schema("Bad-Name"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");

    // TLS asked of a server without it (ssl = off): said at once, not retried.
    let err = PgBackend::connect(&format!("{}?sslmode=require", node.url()), PgOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Misconfigured { .. }), "{err:?}");
    assert!(
        std::error::Error::source(&err)
            .is_some_and(|s| s.to_string().contains("does not offer TLS")),
        "{err:?}"
    );
    // TLS options without TLS: nothing is sent.
    let err = PgBackend::connect(&node.url(), PgOptions::new().with_ca_cert("pem"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument(m) if m.contains("needs TLS")),
        "{err:?}"
    );
}

/// Wrong and missing passwords are `Auth`; a role that may not create baton's schema is
/// `Permission`. On a server of its own, whose pg_hba.conf asks the role `app` for a password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_and_permission_errors_are_typed() {
    let node = PgNode::start().await.unwrap();
    let admin = node.client().await.unwrap();
    let hba: String = admin.query_one("SHOW hba_file", &[]).await.unwrap().get(0);
    admin
        .batch_execute(&format!(
            "CREATE ROLE app LOGIN PASSWORD 'secret';
             REVOKE CREATE ON DATABASE postgres FROM PUBLIC;
             COPY (SELECT unnest(ARRAY['local all all trust',
                                       'host all app 127.0.0.1/32 scram-sha-256',
                                       'host all all 127.0.0.1/32 trust']))
                 TO '{hba}';
             SELECT pg_reload_conf();"
        ))
        .await
        .unwrap();
    // A schema the fixture did not create (it marks `baton` as baton's on every new server).
    let url = |user: &str| {
        format!(
            "postgres://{user}@127.0.0.1:{}/postgres?baton_schema=app_locks",
            node.port()
        )
    };
    let err = PgBackend::connect(&url("app:wrong"), PgOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    let err = PgBackend::connect(&url("app"), PgOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    let err = PgBackend::connect(&url("app:secret"), PgOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Permission { .. }), "{err:?}");
    // Once an owner created the schema (and marked it new) and granted its use, the role
    // locks.
    PgBackend::connect(&node.url(), PgOptions::new().with_schema("app_locks"))
        .await
        .unwrap()
        .init_store()
        .await
        .unwrap();
    admin
        .batch_execute(
            "GRANT USAGE ON SCHEMA app_locks TO app;
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA app_locks TO app;
             GRANT USAGE, UPDATE ON ALL SEQUENCES IN SCHEMA app_locks TO app;",
        )
        .await
        .unwrap();
    let backend = PgBackend::connect(&url("app:secret"), PgOptions::new())
        .await
        .unwrap();
    let s = Session::new(backend).await.unwrap();
    let guard = Mutex::new(&s, "as-app").unwrap().lock().await.unwrap();
    guard.release().await.unwrap();
}

/// A release wakes exactly the next waiter: with a queue of waiters, one release hands the
/// lock to the next in line and no other waiter runs a request because of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_is_woken_not_polled() {
    a_release_wakes_its_waiter(&backend().await, &backend().await, &test_name("woken")).await;
}

/// A holder on `holder` and a waiter on `waiter` (60 s leases each): once the holder releases,
/// the waiter is granted within 5 s, well before it would look again at the holder's lease
/// deadline (60 s): the release's NOTIFY woke it.
async fn a_release_wakes_its_waiter(holder: &PgBackend, waiter: &PgBackend, name: &str) {
    let holding = session(holder, Duration::from_secs(60)).await;
    let guard = Mutex::new(&holding, name).unwrap().lock().await.unwrap();
    let waiting_session = session(waiter, Duration::from_secs(60)).await;
    let waiting = support::spawn_queued(holder, &waiting_session, name, 2).await;
    let released = std::time::Instant::now();
    guard.release().await.unwrap();
    let next = within("the waiter", Duration::from_secs(30), waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "woken by the release's NOTIFY, not by a look at the holder's lease deadline (60 s)"
    );
    next.release().await.unwrap();
    holding.close().await.unwrap();
    waiting_session.close().await.unwrap();
}

/// A new lease's sweep of expired leases reads only expired ones (schema version 6): with
/// 2,000 live leases, granting one more reads a handful of rows of `leases` (the
/// transaction's own counts, `pg_stat_xact_user_tables`). Seen failing on version 5, which
/// compared deadlines with the volatile `clock_timestamp()` (the scan of the deadline index
/// could not stop), and with the time read once but no `min(deadline)` check first (without
/// statistics the planner sorted the table): 2,000 rows read each time.
#[tokio::test]
async fn a_new_lease_reads_only_expired_leases() {
    let node = PgNode::shared();
    let schema = "baton_many_leases";
    drop(
        PgBackend::connect(&node.url(), PgOptions::new().with_schema(schema))
            .await
            .unwrap(),
    );
    let mut raw = node.client().await.unwrap();
    raw.batch_execute(&format!(
        "INSERT INTO {schema}.leases (id, ttl_ms, deadline) \
             SELECT -g, 600000, clock_timestamp() + interval '10 minutes' \
             FROM generate_series(1, 2000) AS g"
    ))
    .await
    .unwrap();
    let tx = raw.transaction().await.unwrap();
    let lease: i64 = tx
        .query_one(&format!("SELECT {schema}.grant_lease(60000)"), &[])
        .await
        .unwrap()
        .get(0);
    assert!(lease > 0, "{lease}");
    let read: i64 = tx
        .query_one(
            "SELECT (seq_tup_read + coalesce(idx_tup_fetch, 0))::bigint \
             FROM pg_stat_xact_user_tables WHERE schemaname = $1 AND relname = 'leases'",
            &[&schema],
        )
        .await
        .unwrap()
        .get(0);
    assert!(read < 100, "granting a lease read {read} rows of leases");
    tx.rollback().await.unwrap();
}

/// The rows of `schema.table` read so far in `tx` (its own counts,
/// `pg_stat_xact_user_tables`).
async fn rows_read(tx: &baton::tokio_postgres::Transaction<'_>, schema: &str, table: &str) -> i64 {
    tx.query_one(
        "SELECT (seq_tup_read + coalesce(idx_tup_fetch, 0))::bigint \
         FROM pg_stat_xact_user_tables WHERE schemaname = $1 AND relname = $2",
        &[&schema, &table],
    )
    .await
    .unwrap()
    .get(0)
}

/// The reads of a queue cost the same at any depth, whatever the planner's statistics
/// (schema version 9, issue #39): `baton.entries` analyzed while it held 3 rows, then 2,000
/// entries queued behind them; each connection's PL/pgSQL caches a generic plan after five
/// calls. The eighth enqueue into that queue, a waiter's look (`ahead_v9`), the head
/// (`head_token`) and a deletion (its notice names the new head) each read a handful of rows of `entries` (the
/// transaction's own counts, `pg_stat_xact_user_tables`). Seen failing on version 8, whose
/// key-range reads, planned on the stale statistics, read the whole queue each time.
#[tokio::test]
async fn reading_a_queue_costs_the_same_at_any_depth() {
    let node = PgNode::shared();
    let schema = "baton_deep_queue";
    drop(
        PgBackend::connect(&node.url(), PgOptions::new().with_schema(schema))
            .await
            .unwrap(),
    );
    let mut raw = node.client().await.unwrap();
    raw.batch_execute(&format!(
        "INSERT INTO {schema}.leases (id, ttl_ms, deadline) \
             VALUES (-1, 600000, clock_timestamp() + interval '10 minutes'); \
         INSERT INTO {schema}.entries (key, token, lease, value) \
             SELECT 'deep/' || g, g, -1, '' FROM generate_series(1, 3) AS g; \
         ANALYZE {schema}.entries; \
         INSERT INTO {schema}.entries (key, token, lease, value) \
             SELECT 'deep/' || g, g, -1, '' FROM generate_series(4, 2000) AS g"
    ))
    .await
    .unwrap();
    let tx = raw.transaction().await.unwrap();
    let enqueue = tx
        .prepare(&format!(
            "SELECT status, e_token, p_token FROM {schema}.enqueue_v8('deep', $1, -1, '', $2)"
        ))
        .await
        .unwrap();
    let mut last = 0;
    for i in 0..8_i64 {
        let before = rows_read(&tx, schema, "entries").await;
        let row = tx
            .query_one(&enqueue, &[&format!("w{i}"), &(i + 1)])
            .await
            .unwrap();
        assert_eq!(row.get::<_, &str>(0), "ok");
        let (token, predecessor): (i64, Option<i64>) = (row.get(1), row.get(2));
        assert!(predecessor.is_some_and(|p| p < token), "{predecessor:?}");
        last = token;
        let rows = rows_read(&tx, schema, "entries").await - before;
        assert!(rows < 50, "enqueue {i} read {rows} rows of entries");
    }
    let before = rows_read(&tx, schema, "entries").await;
    let ahead = tx
        .query(
            &format!("SELECT ok, token FROM {schema}.ahead_v9('deep', 'deep/w7', $1, 3)"),
            &[&last],
        )
        .await
        .unwrap();
    assert_eq!(ahead.len(), 3);
    assert!(ahead.iter().all(|r| r.get::<_, bool>(0)));
    let rows = rows_read(&tx, schema, "entries").await - before;
    assert!(rows < 50, "a waiter's look read {rows} rows of entries");
    let before = rows_read(&tx, schema, "entries").await;
    let head: i64 = tx
        .query_one(&format!("SELECT {schema}.head_token('deep')"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(head, 1);
    let rows = rows_read(&tx, schema, "entries").await - before;
    assert!(rows < 50, "reading the head read {rows} rows of entries");
    let before = rows_read(&tx, schema, "entries").await;
    tx.execute(
        &format!("DELETE FROM {schema}.entries WHERE key = 'deep/1'"),
        &[],
    )
    .await
    .unwrap();
    let rows = rows_read(&tx, schema, "entries").await - before;
    assert!(
        rows < 50,
        "a deletion and its notice read {rows} rows of entries"
    );
    tx.rollback().await.unwrap();
}

/// An older schema is migrated on connect: a schema put back to version 1's shape (no
/// `observed` table, the insert trigger back, no `timeline` function or column, no
/// `timelines` table, the rows of versions 2 to 7 gone) is brought to version 7 by the next
/// backend that connects (its enqueue sweeping expired leases only as the head, its new leases
/// sweeping through the deadline index), and locks
/// (with the timeline in their tokens, granted at once on timeline 1) and observers work on
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_schema_is_migrated_on_connect() {
    let node = PgNode::shared();
    let schema = "baton_from_v1";
    let options = PgOptions::new().with_schema(schema);
    drop(
        PgBackend::connect(&node.url(), options.clone())
            .await
            .unwrap(),
    );
    let raw = node.client().await.unwrap();
    raw.batch_execute(&format!(
        "DROP TABLE {schema}.observed; \
         CREATE TRIGGER entries_inserted AFTER INSERT ON {schema}.entries \
             REFERENCING NEW TABLE AS fresh FOR EACH STATEMENT \
             EXECUTE FUNCTION {schema}.entries_changed(); \
         ALTER TABLE {schema}.leases DROP COLUMN timeline; \
         DROP FUNCTION {schema}.timeline_age(); \
         DROP TABLE {schema}.timelines; \
         DROP FUNCTION {schema}.timeline(); \
         DROP TABLE {schema}.store; \
         DROP FUNCTION {schema}.clock_us(), {schema}.flush_lsn(), {schema}.new_marker(), \
             {schema}.floor_sequences(bigint), {schema}.floor_once(), {schema}.next_token(), \
             {schema}.next_lease_id(), {schema}.epoch_state(), \
             {schema}.begin_epoch(text, boolean, bigint), {schema}.grant_lease_v8(bigint), \
             {schema}.renew_v8(bigint), {schema}.started_us(), \
             {schema}.enqueue_v8(text, text, bigint, bytea, bigint), \
             {schema}.head_token(text), {schema}.ahead_v9(text, text, bigint, bigint), \
             {schema}.enqueue_burst_v10(text[], text[], bigint[], bytea[], bigint[]); \
         ALTER TABLE {schema}.entries DROP COLUMN parent; \
         DELETE FROM {schema}.schema_version WHERE version >= 2"
    ))
    .await
    .unwrap();
    let b = PgBackend::connect(&node.url(), options).await.unwrap();
    let version: i32 = raw
        .query_one(
            &format!("SELECT max(version) FROM {schema}.schema_version"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, 10);
    // The functions as the migrations left them, each with a line only its newest body has.
    for (function, line) in [
        ("enqueue_v4", "Whatever is before the head"),
        ("enqueue_v4", "e.parent = q"),
        ("enqueue_v8", "enable_seqscan"),
        ("enqueue_v4", "next_token()"),
        ("grant_lease", "deadline <= now_ts"),
        ("grant_lease", "next_lease_id()"),
        ("enqueue_burst_v10", "enqueue_v8(qs[n]"),
    ] {
        let body: String = raw
            .query_one(
                &format!("SELECT pg_get_functiondef('{schema}.{function}'::regproc)"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(body.contains(line), "{function}: {body}");
    }
    let session = Session::new(b.clone()).await.unwrap();
    // Version 7 moved the lease ids to the clock's microseconds (above 2001-09-09's).
    assert!(session.lease_id().get() > 1_000_000_000_000_000);
    let name = test_name("migrated");
    let mut heads = b.observe_head(&name);
    // Timeline 1 (never promoted nor recovered) has no restart grace: granted at once.
    let guard = within(
        "the lock on the migrated schema",
        Duration::from_secs(10),
        async { Mutex::new(&session, &name).unwrap().lock().await.unwrap() },
    )
    .await;
    // Version 8: tokens start at the clock's microseconds, the timeline above them.
    assert!(
        guard.fencing_token().get() > (1 << 40) + 1_000_000_000_000_000,
        "{}",
        guard.fencing_token()
    );
    loop {
        let event = within(
            "the observer",
            Duration::from_secs(10),
            futures::StreamExt::next(&mut heads),
        )
        .await
        .unwrap()
        .unwrap();
        if let baton::HeadEvent::Head(Some(head)) = event {
            assert_eq!(head.token(), guard.fencing_token());
            break;
        }
    }
    guard.release().await.unwrap();
    session.close().await.unwrap();
}

/// A backend connected on one runtime keeps working on another after the first is shut down
/// (a runtime per test, a runtime per request handler): its connections' tasks end with the
/// first runtime, and the backend connects again, and LISTENs again, on the runtime that uses
/// it: a wait on a key is woken by the write, a waiter for a lock by the release.
#[test]
fn a_backend_outlives_the_runtime_that_connected_it() {
    let url = PgNode::shared().url();
    let first = tokio::runtime::Runtime::new().unwrap();
    let b = first.block_on(async {
        let b = PgBackend::connect(&url, PgOptions::new()).await.unwrap();
        // Its LISTEN task runs on this runtime: used once here.
        let s = session(&b, Duration::from_secs(60)).await;
        Mutex::new(&s, test_name("first-runtime"))
            .unwrap()
            .lock()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        s.close().await.unwrap();
        b
    });
    drop(first);
    let second = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    second.block_on(async {
        // A wait on a key: it fails at once (Unavailable) if the LISTEN task cannot be had.
        let key = test_name("second-runtime-key");
        let waiting = tokio::spawn({
            let b = b.clone();
            let key = key.clone();
            async move { b.wait_value(&key, None).await }
        });
        assert!(b.swap(&key, None, b"set").await.unwrap());
        let seen = within("the wait on the key", Duration::from_secs(10), waiting)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seen.as_deref(), Some(&b"set"[..]));
        // And a lock handoff.
        a_release_wakes_its_waiter(&b, &b, &test_name("second-runtime")).await;
    });
}

// ---------------------------------------------------------------------------------------
// Faults on a real server: each test runs a server of its own.

use baton::{FencingToken, LostReason, WriteOp};

/// A server of its own for a fault test. `synchronous_commit=on`: the image's default is off
/// (a throwaway cluster); baton's promises across a crash need every acknowledged commit in
/// the WAL before the answer (docs/postgres.md).
async fn own_node() -> PgNode {
    PgNode::start_with(&["-c", "synchronous_commit=on"])
        .await
        .expect("a PostgreSQL of its own")
}

/// A backend on `url` whose connections carry `application_name` (for `terminate`).
async fn backend_named(node_url: &str, application: &str) -> PgBackend {
    PgBackend::connect(
        &format!("{node_url}?application_name={application}"),
        PgOptions::new(),
    )
    .await
    .expect("connect")
}

async fn session(backend: &PgBackend, ttl: Duration) -> Session {
    Session::with_options(
        Arc::new(backend.clone()),
        SessionOptions::new().with_ttl(ttl),
    )
    .await
    .expect("session")
}

/// A holder and a waiter across a restart of the server with a fast shutdown (clients are
/// disconnected; the data stays): the holder keeps its lock (its lease outlives the outage),
/// the waiter is woken by the release after the restart, and its token is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_a_fast_shutdown_keeps_the_queue() {
    let node = own_node().await;
    let ttl = Duration::from_secs(20);
    let (hb, wb, ob) = (
        node.backend().await.unwrap(),
        node.backend().await.unwrap(),
        node.backend().await.unwrap(),
    );
    let (holder, waiter) = (session(&hb, ttl).await, session(&wb, ttl).await);
    let guard = Mutex::new(&holder, "restart")
        .unwrap()
        .lock()
        .await
        .unwrap();
    let first = guard.fencing_token();
    let queued = support::spawn_queued(&ob, &waiter, "restart", 2).await;
    node.stop_fast().await.unwrap();
    node.start_again().await.unwrap();
    // The holder's session renews through the restart; its entry is still the head.
    support::eventually("the holder renewed after the restart", || async {
        hb.lease_ttl(holder.lease_id())
            .await
            .ok()
            .flatten()
            .is_some()
            && guard.is_owner().await.unwrap_or(false)
    })
    .await;
    assert!(!holder.is_lost());
    guard.release().await.unwrap();
    let next = within(
        "the waiter after the restart",
        Duration::from_secs(10),
        queued,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(next.fencing_token() > first);
    next.release().await.unwrap();
}

/// Tokens never go backwards across a crash of the server (immediate shutdown: no
/// checkpoint, the WAL replayed at start): the sequence is WAL-logged ahead of use, so the
/// first token after the restart is above every token handed out before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_never_go_back_across_an_immediate_shutdown() {
    let node = own_node().await;
    let backend = node.backend().await.unwrap();
    let s = session(&backend, Duration::from_secs(30)).await;
    let mut highest = FencingToken::new(0);
    for round in 0..3 {
        let mut held = Vec::new();
        for i in 0..5 {
            let g = Mutex::new(&s, format!("crash/{round}/{i}"))
                .unwrap()
                .lock()
                .await
                .unwrap();
            assert!(
                g.fencing_token() > highest,
                "round {round}: token {} after {highest}",
                g.fencing_token()
            );
            highest = g.fencing_token();
            held.push(g);
        }
        node.stop_immediate().await.unwrap();
        node.start_again().await.unwrap();
        // Acknowledged commits survive the crash: the locks are still held.
        for g in held {
            assert!(g.is_owner().await.unwrap(), "round {round}: {}", g.key());
            g.release().await.unwrap();
        }
    }
    assert!(!s.is_lost());
}

/// Drops baton's schema and everything in it, as a server re-created without its data has
/// none.
async fn drop_baton_schema(node: &PgNode) {
    node.client()
        .await
        .unwrap()
        .batch_execute("DROP SCHEMA baton CASCADE")
        .await
        .unwrap();
}

/// baton's schema dropped under a holder, and nobody connects to create it again: the
/// holder's next renewal meets no schema, which means no lease, and it is told then (within a
/// third of its TTL and a round trip), not at its own deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_schema_is_dropped_is_told_at_its_next_renewal() {
    let node = own_node().await;
    let ttl = Duration::from_secs(6);
    let backend = node.backend().await.unwrap();
    let holder = session(&backend, ttl).await;
    let guard = Mutex::new(&holder, "dropped")
        .unwrap()
        .lock()
        .await
        .unwrap();
    let lost = holder.lost();
    drop_baton_schema(&node).await;
    within(
        "the holder told lost",
        ttl / 3 + Duration::from_secs(1),
        lost,
    )
    .await;
    drop(guard);
}

/// baton's state lost under a holder (`DROP SCHEMA baton CASCADE`): a schema created again
/// has no epoch marker, so its first use begins a new store epoch. Before issue #36 it was
/// not detected: a client that connected re-created the schema and was granted at once, with
/// a token below the holder's (the sequence started again). Now the newcomer waits the grace,
/// its token is above the holder's (the sequences start at the clock), and the holder is told
/// at its next renewal, before the newcomer is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baton_state_lost_under_a_holder_is_a_new_epoch() {
    let node = own_node().await;
    let ttl = Duration::from_secs(2);
    let grace = Duration::from_secs(3);
    let options = || PgOptions::new().with_restart_grace(grace);
    let old = PgBackend::connect(&node.url(), options()).await.unwrap();
    let out = support::epochs::a_holder_from_before_never_overlaps(
        Arc::new(old),
        "wiped",
        ttl,
        grace,
        || drop_baton_schema(&node),
        || async {
            Arc::new(PgBackend::connect(&node.url(), options()).await.unwrap()) as Arc<dyn Backend>
        },
    )
    .await;
    eprintln!("{out:?}");
}

/// A failover to a standby that missed commits (issue #36): the old primary granted a lock
/// and leases the standby never received; the new primary's sequences were behind them.
/// Before, lease ids repeated on the new primary, and a stale client ending its session
/// deleted a newcomer's lease: the newcomer lost a correctly granted lock. Now the sequences
/// jump to the clock on the new primary, the holder from before (which reaches the new
/// primary through an address that moved) is told at once when its client sees the flush
/// position behind what it saw (or the new timeline's epoch), the newcomer waits the grace,
/// and a stale client's revoke finds no lease of anyone else's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_standby_that_missed_commits_lets_no_holder_from_before_overlap() {
    let f = Failover::start().await;
    let ttl = Duration::from_secs(2);
    let grace = Duration::from_secs(3);
    let holder = f.front_backend("missed_commits", grace).await;
    f.caught_up().await;
    f.link.refuse().unwrap();
    // Leases and a lock the standby never receives.
    let stale = Session::with_options(
        Arc::new(holder.clone()),
        SessionOptions::new().with_ttl(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    let name = test_name("missed-commits");
    // The holder's address is cut during the failover, and leads to the new primary half a
    // second after the newcomer's first contact: the holder's client would otherwise reach
    // the new timeline first (its renewals run every TTL/3) and begin its epoch there, and the
    // newcomer would wait less than a grace after its own first contact (what the scenario
    // measures; safe either way).
    let contacted = tokio::sync::Notify::new();
    let scenario = support::epochs::a_holder_from_before_never_overlaps(
        Arc::new(holder.clone()),
        &name,
        ttl,
        grace,
        || async {
            f.front.refuse().unwrap();
            f.primary.stop_immediate().await.unwrap();
            f.standby.promote().await.unwrap();
        },
        || async {
            contacted.notify_one();
            Arc::new(f.standby_backend(grace).await) as Arc<dyn Backend>
        },
    );
    let heal = async {
        contacted.notified().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        f.front
            .redirect(&format!("127.0.0.1:{}", f.standby.port()))
            .unwrap();
        f.front.heal();
    };
    let (out, ()) = tokio::join!(scenario, heal);
    eprintln!("{out:?}");
    // A newcomer's lease on the new primary, and a lock under it; then the stale client
    // ends its session (a revoke of its lease id, which the new primary must not know).
    let newcomer = f.standby_backend(grace).await;
    let fresh = session(&newcomer, Duration::from_secs(30)).await;
    assert_ne!(fresh.lease_id(), stale.lease_id(), "lease ids repeat");
    let guard = Mutex::new(&fresh, format!("{name}-2"))
        .unwrap()
        .lock()
        .await
        .unwrap();
    holder.revoke_lease(stale.lease_id()).await.unwrap();
    assert!(
        !fresh.is_lost(),
        "the stale client's close ended the newcomer's session"
    );
    assert!(
        guard.is_owner().await.unwrap(),
        "the newcomer lost its lock"
    );
    guard.release().await.unwrap();
}

/// A failover to an asynchronous standby that missed the primary's last commits (replication
/// cut, then the primary crashes, the standby is promoted): the new primary's sequence is
/// behind tokens the old one handed out, yet its grants carry higher tokens than every grant
/// of the old primary, because a token starts with the timeline, which a promotion raises
/// (so a fence that saw the old grants admits the new ones).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_to_a_standby_that_missed_grants_tokens_still_go_up() {
    let f = Failover::start().await;
    let backend = f.primary.backend().await.unwrap();
    let ttl = Duration::from_secs(5);
    let s = session(&backend, ttl).await;
    let first = Mutex::new(&s, "failover/0").unwrap().lock().await.unwrap();
    first.release().await.unwrap();
    // The standby has everything so far (the schema, the lease, the first grant).
    f.caught_up().await;
    // Cut off, the standby misses what follows: the primary does not wait for it. More
    // grants than the sequence logs ahead (32), so that the standby's sequence is behind.
    f.link.refuse().unwrap();
    let mut highest = FencingToken::new(0);
    for i in 0..100 {
        let g = Mutex::new(&s, format!("failover/{}", i % 4))
            .unwrap()
            .lock()
            .await
            .unwrap();
        highest = highest.max(g.fencing_token());
        g.release().await.unwrap();
    }
    f.fail_over().await;
    // The application fails over to the promoted standby, which grants nothing for the
    // restart grace (the old session's TTL).
    let after = f.standby_backend(ttl).await;
    let s2 = session(&after, Duration::from_secs(30)).await;
    for i in 0..4 {
        let g = Mutex::new(&s2, format!("failover/{i}"))
            .unwrap()
            .lock()
            .await
            .unwrap();
        assert!(
            g.fencing_token() > highest,
            "after the failover failover/{i} was granted with token {}, not above {highest} \
             which the old primary handed out",
            g.fencing_token()
        );
        g.release().await.unwrap();
    }
}

/// A primary of the test's own with baton's schema, an asynchronous standby of it that
/// replicates through `link` (refused to cut replication: the primary does not wait for it),
/// and `front`: a fixed address that leads to the primary until
/// [`fail_over`](Failover::fail_over) moves it to the promoted standby.
struct Failover {
    primary: PgNode,
    standby: PgNode,
    link: Proxy,
    front: Proxy,
}

impl Failover {
    async fn start() -> Failover {
        let primary = own_node().await;
        // The schema first, so that the standby has it.
        drop(primary.backend().await.unwrap());
        let to_primary = format!("127.0.0.1:{}", primary.port());
        let link = Proxy::start(&to_primary).await.unwrap();
        let standby = PgNode::start_standby_of(link.addr().port()).await.unwrap();
        let front = Proxy::start(&to_primary).await.unwrap();
        Failover {
            primary,
            standby,
            link,
            front,
        }
    }

    /// A backend through `front`, named `application`, with restart grace `grace`. A request
    /// sent as the primary dies waits for no answer: it is retried soon, on the promoted
    /// standby once the address moves, so that its sessions outlive the failover.
    async fn front_backend(&self, application: &str, grace: Duration) -> PgBackend {
        let url = format!(
            "postgres://postgres@{}/postgres?application_name={application}",
            self.front.addr()
        );
        let options = PgOptions::new()
            .with_request_timeout(Duration::from_secs(1))
            .with_restart_grace(grace);
        PgBackend::connect(&url, options).await.unwrap()
    }

    /// A backend on the (promoted) standby with restart grace `grace`.
    async fn standby_backend(&self, grace: Duration) -> PgBackend {
        let options = PgOptions::new().with_restart_grace(grace);
        PgBackend::connect(&self.standby.url(), options)
            .await
            .unwrap()
    }

    /// Waits until the standby has replayed everything the primary wrote so far.
    async fn caught_up(&self) {
        self.standby.wait_replayed(&self.primary).await.unwrap();
    }

    /// The primary crashes (an immediate shutdown, for good), the standby is promoted (a new
    /// timeline), and `front` leads to it.
    async fn fail_over(&self) {
        self.primary.stop_immediate().await.unwrap();
        self.standby.promote().await.unwrap();
        self.front
            .redirect(&format!("127.0.0.1:{}", self.standby.port()))
            .unwrap();
        self.front.heal();
    }
}

/// A URL naming every server, with `target_session_attrs=read-write`, reaches the primary
/// whichever server it names first, and follows a failover without an address that moves:
/// the holder from before is told its session is lost (its lease is of the old timeline),
/// and a new session of the same backend, reconnected to the promoted standby, gets the lock
/// after the restart grace, with a higher token. Without the attribute, a URL that names the
/// standby first is refused at connect, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_naming_every_server_follows_a_failover() {
    let f = Failover::start().await;
    f.caught_up().await;
    let hosts = format!(
        "127.0.0.1:{},127.0.0.1:{}",
        f.standby.port(),
        f.primary.port()
    );
    let Err(err) = PgBackend::connect(
        &format!("postgres://postgres@{hosts}/postgres"),
        PgOptions::new(),
    )
    .await
    else {
        panic!("connected to a read-only standby");
    };
    assert!(matches!(err, Error::Misconfigured { .. }), "{err:?}");
    assert!(
        std::error::Error::source(&err)
            .is_some_and(|s| s.to_string().contains("target_session_attrs=read-write")),
        "{err:?}"
    );

    let ttl = Duration::from_secs(3);
    let url = format!("postgres://postgres@{hosts}/postgres?target_session_attrs=read-write");
    let backend = PgBackend::connect(
        &url,
        PgOptions::new()
            .with_request_timeout(Duration::from_secs(1))
            .with_restart_grace(ttl),
    )
    .await
    .expect("the primary, named second");
    let s = session(&backend, ttl).await;
    let name = test_name("every-server");
    let held = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    let first = held.fencing_token();
    f.caught_up().await;
    f.fail_over().await;
    within(
        "the holder told its session is lost",
        Duration::from_secs(15),
        s.lost(),
    )
    .await;
    let s2 = session(&backend, ttl).await;
    let next = within(
        "the lock on the promoted standby, through the same URL",
        Duration::from_secs(30),
        async { Mutex::new(&s2, &name).unwrap().lock().await.unwrap() },
    )
    .await;
    assert!(
        next.fencing_token() > first,
        "{} after {first}",
        next.fencing_token()
    );
    next.release().await.unwrap();
}

/// A request that reaches a standby before its promotion (the address moved ahead of it) is
/// refused as read-only, not applied: it is retried on a new connection, and succeeds once
/// the standby is promoted, instead of failing at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_reaches_a_standby_is_retried_until_its_promotion() {
    let f = Failover::start().await;
    let backend = f.front_backend("early_standby", Duration::ZERO).await;
    f.caught_up().await;
    f.primary.stop_immediate().await.unwrap();
    f.front
        .redirect(&format!("127.0.0.1:{}", f.standby.port()))
        .unwrap();
    f.front.heal();
    let starting = tokio::spawn({
        let backend = backend.clone();
        async move { session(&backend, Duration::from_secs(5)).await }
    });
    // Promoted once the backend has reached the standby and been refused there: a rolled
    // back transaction in the standby's statistics (the fixture's own queries roll nothing
    // back).
    let admin = f.standby.client().await.unwrap();
    let rollbacks = "SELECT xact_rollback FROM pg_stat_database WHERE datname = 'postgres'";
    let before: i64 = admin.query_one(rollbacks, &[]).await.unwrap().get(0);
    within(
        "the backend refused by the standby",
        Duration::from_secs(10),
        async {
            loop {
                let now: i64 = admin.query_one(rollbacks, &[]).await.unwrap().get(0);
                if now > before {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    f.standby.promote().await.unwrap();
    let s = within(
        "the session, once the standby is promoted",
        Duration::from_secs(15),
        starting,
    )
    .await
    .expect("the session task");
    let name = test_name("early-standby");
    Mutex::new(&s, &name)
        .unwrap()
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A release the standby missed, then a failover: the released entry is back on the new
/// primary, bound to the lease of a session that still renews (through an address that now
/// leads to the new primary). A lease is renewed only on the timeline it was granted on, so
/// the session is told lost, its lease runs out, and a waiter on the new primary gets the
/// lock. (Before, the session kept renewing and the entry held the lock for as long as the
/// session lived.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_a_release_the_standby_missed_does_not_hold_the_lock() {
    let f = Failover::start().await;
    // Longer than the failover takes: the lease would not run out by itself meanwhile.
    let ttl = Duration::from_secs(15);
    // The session outlives the failover: its address moves to the promoted standby.
    let backend = f.front_backend("failover_ghost", ttl).await;
    let s = session(&backend, ttl).await;
    let name = test_name("failover-ghost");
    let g = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    f.caught_up().await;
    f.link.refuse().unwrap();
    g.release().await.unwrap();
    f.fail_over().await;
    let after = f.standby_backend(ttl).await;
    let w = session(&after, Duration::from_secs(30)).await;
    let next = within(
        "the waiter on the new primary",
        Duration::from_secs(40),
        async { Mutex::new(&w, &name).unwrap().lock().await.unwrap() },
    )
    .await;
    assert!(
        s.is_lost(),
        "the session whose lease is of the old timeline was told lost"
    );
    next.release().await.unwrap();
}

/// A grant the standby missed, then a failover: on the new primary nothing says the lock is
/// held (its entry was never replicated), yet its holder believes it holds until its session
/// is told lost, up to its TTL after it last renewed on the old primary. A promotion starts a
/// new WAL timeline, on which nothing is granted for the restart grace (at least every
/// session's TTL): the holder is told lost before anyone else is granted; a try says
/// `RestartGrace`, and a read lock and a permit wait the grace out too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_a_grant_the_standby_missed_is_not_made_again_before_its_holder_is_told() {
    let f = Failover::start().await;
    let ttl = Duration::from_secs(6);
    let backend = f.primary.backend().await.unwrap();
    let s = session(&backend, ttl).await;
    f.caught_up().await;
    f.link.refuse().unwrap();
    let name = test_name("failover-missed-grant");
    let held = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    f.fail_over().await;
    let after = f.standby_backend(ttl).await;
    let w = session(&after, Duration::from_secs(30)).await;
    // A try says why it is refused: the lock may well be free.
    let mutex = Mutex::new(&w, &name).unwrap();
    match mutex.try_lock().await {
        Err(Error::RestartGrace { left, .. }) => {
            assert!(left > Duration::ZERO && left <= ttl, "{left:?}");
        }
        other => panic!("try_lock during the restart grace: {other:?}"),
    }
    // A lock, a read lock and a permit all wait the grace out.
    let rw = baton::RwLock::new(&w, format!("{name}-rw")).unwrap();
    let sem = baton::Semaphore::new(&w, format!("{name}-sem"), 3).unwrap();
    let (next, read, permit) = within(
        "the waiters on the new primary",
        Duration::from_secs(30),
        async { tokio::join!(mutex.lock(), rw.read(), sem.acquire()) },
    )
    .await;
    let next = next.unwrap();
    read.unwrap().release().await.unwrap();
    permit.unwrap().release().await.unwrap();
    assert!(
        s.is_lost(),
        "granted again (token {}) while the holder the standby missed (token {}) was not told \
         it lost its session",
        next.fencing_token(),
        held.fencing_token()
    );
    assert!(next.fencing_token() > held.fencing_token());
    next.release().await.unwrap();
    // A schema created on the new timeline and marked new by an operator: no grace there.
    let fresh = PgOptions::new()
        .with_schema("baton_after_failover")
        .with_restart_grace(Duration::from_secs(60));
    let fresh = PgBackend::connect(&f.standby.url(), fresh).await.unwrap();
    assert!(fresh.init_store().await.unwrap(), "marked new");
    let f = session(&fresh, Duration::from_secs(30)).await;
    within(
        "a lock in a schema created after the failover",
        Duration::from_secs(10),
        async { Mutex::new(&f, &name).unwrap().lock().await.unwrap() },
    )
    .await
    .release()
    .await
    .unwrap();
}

/// A waiter queued before a failover is woken on the new timeline by a deletion's notice that
/// names it the head (its holder's lease ended there, as an expiry of a lease whose renewals
/// the standby missed would). The notice comes from another timeline than the waiter saw, so
/// the waiter does not take it at its word: it reads again, and its read answers the new
/// timeline's store epoch, which ends every session from before (schema version 8: before,
/// it waited the grace out and was granted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_a_notice_naming_the_next_holder_is_not_taken_at_its_word() {
    let f = Failover::start().await;
    let grace = Duration::from_secs(6);
    // The waiter reaches the primary through an address the failover moves.
    let wb = f.front_backend("failover_waiter", grace).await;
    let hb = f.primary.backend().await.unwrap();
    let holder = session(&hb, Duration::from_secs(30)).await;
    // Not renewed during the test (every 40 s), so not told lost by the new primary.
    let waiter = session(&wb, Duration::from_secs(120)).await;
    let name = test_name("failover-notice");
    let _held = Mutex::new(&holder, &name).unwrap().lock().await.unwrap();
    let queued = support::spawn_queued(&hb, &waiter, &name, 2).await;
    f.caught_up().await;
    f.fail_over().await;
    let raw = f.standby.client().await.unwrap();
    // Its LISTEN connection is back on the new primary.
    support::eventually("the waiter listens on the new primary", || async {
        raw.query_one(
            "SELECT count(*) FILTER (WHERE query LIKE 'LISTEN%') \
             FROM pg_stat_activity WHERE application_name = 'failover_waiter'",
            &[],
        )
        .await
        .is_ok_and(|r| r.get::<_, i64>(0) >= 1)
    })
    .await;
    let n = raw
        .execute(
            "DELETE FROM baton.leases WHERE id = $1",
            &[&holder.lease_id().get()],
        )
        .await
        .unwrap();
    assert_eq!(n, 1, "the holder's lease is on the new primary");
    let next = within("the waiter", Duration::from_secs(30), queued)
        .await
        .unwrap();
    assert!(
        matches!(next, Err(Error::SessionLost(LostReason::StoreReset))),
        "{next:?}"
    );
    assert_eq!(waiter.lost().await, LostReason::StoreReset);
}

/// `pg_terminate_backend` on the holder's connections and then on the waiter's: each
/// reconnects by itself; the holder keeps its lock, the waiter is still woken by the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_reconnect_and_keep_their_place() {
    let node = own_node().await;
    let ttl = Duration::from_secs(20);
    let hb = backend_named(&node.url(), "holder").await;
    let wb = backend_named(&node.url(), "waiter").await;
    let ob = node.backend().await.unwrap();
    let (holder, waiter) = (session(&hb, ttl).await, session(&wb, ttl).await);
    let guard = Mutex::new(&holder, "killed").unwrap().lock().await.unwrap();
    let queued = support::spawn_queued(&ob, &waiter, "killed", 2).await;
    assert!(node.terminate("holder").await.unwrap() >= 1);
    assert!(node.terminate("waiter").await.unwrap() >= 1);
    // Both sessions renew on new connections; the holder still holds.
    let lease = holder.lease_id();
    support::eventually("the holder renewed on a new connection", || async {
        hb.keep_alive(lease).await.ok().flatten().is_some()
    })
    .await;
    assert!(guard.is_owner().await.unwrap());
    // Kill the waiter's connections again just before the release: its LISTEN connection
    // comes back and the wait is still woken by the release (not by the 20 s lease).
    node.terminate("waiter").await.unwrap();
    let released = std::time::Instant::now();
    guard.release().await.unwrap();
    let next = within("the waiter", Duration::from_secs(10), queued)
        .await
        .unwrap()
        .unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "woken after the release, not at the lease deadline"
    );
    assert!(!holder.is_lost() && !waiter.is_lost());
    next.release().await.unwrap();
}

/// A waiter cut off (a partition through a proxy) while the holder releases: the NOTIFY is
/// lost with its LISTEN connection. Once the partition heals, the waiter's new LISTEN
/// connection makes it look again, and it takes the lock at once, not at the lease deadline
/// of the holder it waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cut_off_during_the_release_looks_again_after_the_partition() {
    let node = own_node().await;
    let proxy = support::proxy::Proxy::start(&format!("127.0.0.1:{}", node.port())).await;
    let ttl = Duration::from_secs(30);
    let hb = node.backend().await.unwrap();
    let wb = PgBackend::connect(
        &format!("postgres://postgres@{}/postgres", proxy.addr()),
        PgOptions::new().with_connect_timeout(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let (holder, waiter) = (session(&hb, ttl).await, session(&wb, ttl).await);
    let guard = Mutex::new(&holder, "partition")
        .unwrap()
        .lock()
        .await
        .unwrap();
    let queued = support::spawn_queued(&hb, &waiter, "partition", 2).await;
    proxy.black_hole();
    guard.release().await.unwrap();
    proxy.heal();
    let healed = std::time::Instant::now();
    let next = within(
        "the waiter after the partition",
        Duration::from_secs(15),
        queued,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(
        healed.elapsed() < Duration::from_secs(10),
        "found the release after reconnecting, not at the holder's lease deadline (30 s)"
    );
    next.release().await.unwrap();
}

/// A holder paused past its lease (cut off by a proxy, as a paused process is): it is told
/// (`lost()`, no later than the server expires the lease); the waiter takes the lock once the
/// lease expired on the server's clock, ending it itself (no reaper), with a higher token; the
/// old holder's guarded write after it comes back is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_lease_is_followed_and_refused() {
    let node = own_node().await;
    let proxy = support::proxy::Proxy::start(&format!("127.0.0.1:{}", node.port())).await;
    let ttl = Duration::from_secs(2);
    let hb = PgBackend::connect(
        &format!("postgres://postgres@{}/postgres", proxy.addr()),
        PgOptions::new()
            .with_connect_timeout(Duration::from_millis(500))
            .with_request_timeout(Duration::from_millis(500))
            .with_retry_for(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let wb = node.backend().await.unwrap();
    let holder = session(&hb, ttl).await;
    let waiter = session(&wb, Duration::from_secs(30)).await;
    let guard = Mutex::new(&holder, "paused").unwrap().lock().await.unwrap();
    let first = guard.fencing_token();
    let queued = support::spawn_queued(&wb, &waiter, "paused", 2).await;
    proxy.black_hole();
    let reason = within("lost()", ttl * 3, guard.lost()).await;
    assert_eq!(reason, LostReason::Expired);
    let next = within("the waiter after the lease expired", ttl * 5, queued)
        .await
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > first);
    proxy.heal();
    let late = guard.write(&[WriteOp::put("paused-data", "late")]).await;
    assert!(
        matches!(
            late,
            Err(Error::NotOwner { .. }) | Err(Error::SessionLost(_))
        ),
        "{late:?}"
    );
    assert_eq!(wb.read("paused-data").await.unwrap(), None);
    next.release().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// PgFence: the fence suite, and the fence inside the application's own transaction.

use baton::{Fence, PgFence};

/// A fence in a schema of its own (resources of different tests never meet).
async fn pg_fence(_test: &str) -> Arc<dyn Fence> {
    static SCHEMAS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = SCHEMAS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let schema = format!("fence_{}_{n}", std::process::id());
    let backend = PgBackend::connect(
        &PgNode::shared().url(),
        PgOptions::new().with_schema(schema),
    )
    .await
    .unwrap();
    backend.init_store().await.unwrap();
    Arc::new(PgFence::new(&backend))
}

fence_suite!(mod pg_fence_suite; super::pg_fence; flavor = "multi_thread", worker_threads = 2);

/// The fence inside the application's transaction: a holder's claim and its own write commit
/// together; a successor's claim waits for that transaction and then sees the write; the old
/// holder's next claim (in a new transaction) is refused, and its transaction writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_check_is_part_of_the_applications_transaction() {
    let node = PgNode::shared();
    let backend = node.backend().await.unwrap();
    let fence = PgFence::new(&backend);
    let name = test_name("tx-fence");
    let mut app = node.client().await.unwrap();
    app.batch_execute(
        "CREATE TABLE IF NOT EXISTS stock (item text PRIMARY KEY, count int NOT NULL);
         INSERT INTO stock VALUES ('widget', 10) ON CONFLICT (item) DO UPDATE SET count = 10;",
    )
    .await
    .unwrap();
    let old = baton::Ticket::new(FencingToken::new(5), name.as_str());
    let new = baton::Ticket::new(FencingToken::new(6), name.as_str());

    // The old holder claims inside its transaction and writes, not yet committed.
    let tx = app.transaction().await.unwrap();
    fence.claim_in(&tx, "stock/widget", &old).await.unwrap();
    tx.execute(
        "UPDATE stock SET count = count - 1 WHERE item = 'widget'",
        &[],
    )
    .await
    .unwrap();
    // The successor's claim waits for the row the old transaction holds.
    let mut successor_app = node.client().await.unwrap();
    let successor_fence = fence.clone();
    let successor = tokio::spawn(async move {
        let tx = successor_app.transaction().await.unwrap();
        successor_fence
            .claim_in(&tx, "stock/widget", &new)
            .await
            .unwrap();
        let count: i32 = tx
            .query_one("SELECT count FROM stock WHERE item = 'widget'", &[])
            .await
            .unwrap()
            .get(0);
        tx.commit().await.unwrap();
        count
    });
    // It is blocked on the fence row until the old holder commits.
    let admin = node.client().await.unwrap();
    support::eventually("the successor waits on the fence row", || async {
        admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            >= 1
    })
    .await;
    tx.commit().await.unwrap();
    let seen = within("the successor's claim", Duration::from_secs(10), successor)
        .await
        .unwrap();
    assert_eq!(
        seen, 9,
        "the successor read the committed write after its claim"
    );

    // The old holder again, in a new transaction: refused, and its write goes nowhere.
    let tx = app.transaction().await.unwrap();
    let refused = fence.claim_in(&tx, "stock/widget", &old).await;
    assert!(
        matches!(refused, Err(Error::StaleToken { highest, .. }) if highest.get() == 6),
        "{refused:?}"
    );
    drop(tx);
    let count: i32 = app
        .query_one("SELECT count FROM stock WHERE item = 'widget'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 9);
    assert_eq!(
        fence.read("stock/widget").await.unwrap().map(|r| r.0.get()),
        Some(6)
    );
}

/// An observer reports only heads that existed: a lease revoke that removes several entries
/// is one change (the heads between them never existed), and an entry whose lease expired is
/// never reported as the head, whether it is still there (the observer ends expired leases
/// before it reports) or someone else ended it just before the observer read on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_report_only_heads_that_existed() {
    let backend = backend().await;
    support::observers_report_only_heads_that_existed(
        &backend,
        &test_name("observe-heads"),
        4,
        |round, short| async move {
            if round % 2 == 1 {
                // Someone else ends the expired lease after the revoke and before the
                // observer reads on (it works only when polled): the observer must not take
                // the entry it finds gone for a head that existed.
                let admin = PgNode::shared().client().await.unwrap();
                admin
                    .execute("DELETE FROM baton.leases WHERE id = $1", &[&short.get()])
                    .await
                    .unwrap();
            }
        },
    )
    .await;
}

/// One release notifies one waiter: with ten waiters queued, a raw client LISTENing on every
/// queued entry's channel hears exactly one notification for the release (the released
/// entry's, which only its successor waits on), counted up to a marker it sends itself
/// (notifications arrive in commit order, so everything the release sent is before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_notifies_one_waiter() {
    use baton::tokio_postgres::AsyncMessage;
    use futures::StreamExt;
    const WAITERS: usize = 10;
    let node = PgNode::shared();
    let name = test_name("one-notify");
    let b = backend().await;
    let holder = Session::new(b.clone()).await.unwrap();
    let guard = Mutex::new(&holder, &name).unwrap().lock().await.unwrap();
    let mut sessions = Vec::new();
    let mut waiting = Vec::new();
    for i in 0..WAITERS {
        let s = Session::new(b.clone()).await.unwrap();
        waiting.push(support::spawn_queued(&b, &s, &name, i + 2).await);
        sessions.push(s);
    }
    // A raw listener on every entry's channel.
    let (raw, mut connection) = baton::tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            node.port()
        ),
        baton::tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let AsyncMessage::Notification(n) = m {
                let _ = tx.send((n.channel().to_owned(), n.payload().to_owned()));
            }
        }
    });
    // LISTEN on the channel the schema names for `name` of `kind`.
    let listen = |kind: &'static str, name: String| {
        let raw = &raw;
        async move {
            let channel: String = raw
                .query_one("SELECT baton.chan($1, $2)", &[&kind, &name])
                .await
                .unwrap()
                .get(0);
            raw.batch_execute(&format!("LISTEN {channel}"))
                .await
                .unwrap();
        }
    };
    let queued = b.entries(&name).await.unwrap();
    for e in &queued {
        listen("e", e.key().to_owned()).await;
    }
    // The queue's channel too, without registering as an observer: nobody observes this
    // queue, so its changes are not announced at all.
    listen("q", name.clone()).await;
    raw.batch_execute("LISTEN marker_one_notify").await.unwrap();
    guard.release().await.unwrap();
    let next = within(
        "the first waiter",
        Duration::from_secs(10),
        waiting.remove(0),
    )
    .await
    .unwrap()
    .unwrap();
    raw.batch_execute("NOTIFY marker_one_notify").await.unwrap();
    let mut notified = Vec::new();
    loop {
        let (channel, payload) = within("the marker", Duration::from_secs(10), heard.recv())
            .await
            .unwrap();
        if channel == "marker_one_notify" {
            break;
        }
        notified.push(payload);
    }
    // The released entry's token, the head it left (the next waiter, which is granted from
    // this notice without reading the queue), the timeline (1: never promoted) and when the
    // postmaster started (schema version 8: a notice from a server the waiter had no
    // answer from is not taken at its word).
    assert_eq!(
        notified.len(),
        1,
        "one notification per release: {notified:?}"
    );
    let prefix = format!("{} {} 1 ", queued[0].token(), queued[1].token());
    assert!(
        notified[0].starts_with(&prefix)
            && notified[0][prefix.len()..]
                .parse::<u64>()
                .is_ok_and(|lsn| lsn > 0),
        "naming the new head: {notified:?}"
    );
    assert_eq!(next.fencing_token(), queued[1].token());
    next.release().await.unwrap();
    for s in sessions {
        s.close().await.unwrap();
    }
}

/// A server frozen (`docker pause`) for less than the TTL: requests wait (renewals are
/// retried within the backend), nothing is lost, and the queue moves on once it is back: the
/// holder still holds, the waiter is woken by the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_paused_shorter_than_the_ttl_costs_nothing() {
    let node = own_node().await;
    let ttl = Duration::from_secs(20);
    // The holder's requests time out after 1 s: the pause outlasts one attempt, and the
    // backend must retry (on a new connection) until the server answers again.
    let hb = PgBackend::connect(
        &node.url(),
        PgOptions::new().with_request_timeout(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let wb = node.backend().await.unwrap();
    let (holder, waiter) = (session(&hb, ttl).await, session(&wb, ttl).await);
    let guard = Mutex::new(&holder, "frozen").unwrap().lock().await.unwrap();
    let queued = support::spawn_queued(&hb, &waiter, "frozen", 2).await;
    node.pause().await.unwrap();
    // A renewal sent now times out at least once before the server answers.
    let lease = holder.lease_id();
    let renewal = tokio::spawn({
        let hb = hb.clone();
        async move { hb.keep_alive(lease).await }
    });
    tokio::time::sleep(Duration::from_secs(3)).await; // the length of the outage, not a sync point
    node.unpause().await.unwrap();
    let renewed = within("the renewal", Duration::from_secs(20), renewal)
        .await
        .unwrap()
        .unwrap();
    assert!(renewed.is_some(), "the lease outlived the pause");
    assert!(guard.is_owner().await.unwrap() && !holder.is_lost());
    guard.release().await.unwrap();
    within(
        "the waiter after the pause",
        Duration::from_secs(10),
        queued,
    )
    .await
    .unwrap()
    .unwrap()
    .release()
    .await
    .unwrap();
}

/// A server that defaults to `synchronous_commit = off` (as this fixture's image does, and as
/// some operators choose for speed) loses its last acknowledged commits in a crash; baton's
/// own connections commit synchronously all the same, so a release survives the crash: the
/// released entry does not come back and its token is never granted again. (Before baton set
/// it, this failed: the entry came back and the nemesis saw tokens granted twice.) The WAL
/// writer is slowed to 10 s so that, without it, the release would not reach the WAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_survives_a_crash_of_a_server_without_synchronous_commit() {
    release_survives_a_crash(false).await;
}

/// The same through a session-mode PgBouncer, which refuses startup options (or drops them,
/// if told to ignore them): baton sets `synchronous_commit` in the session instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_session_pooler_a_release_survives_a_crash() {
    release_survives_a_crash(true).await;
}

async fn release_survives_a_crash(through_a_pooler: bool) {
    let node = PgNode::start_with(&["-c", "wal_writer_delay=10s"])
        .await
        .expect("a PostgreSQL of its own");
    let backend = if through_a_pooler {
        let port = node.start_pgbouncer("session").await.unwrap();
        PgBackend::connect(
            &format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            PgOptions::new(),
        )
        .await
        .unwrap()
    } else {
        node.backend().await.unwrap()
    };
    let s = session(&backend, Duration::from_secs(30)).await;
    let name = "async-commit/crash";
    let g = Mutex::new(&s, name).unwrap().lock().await.unwrap();
    let highest = g.fencing_token();
    // The lease and the entry reach the disk; the release after it is the last commit.
    node.client()
        .await
        .unwrap()
        .batch_execute("CHECKPOINT")
        .await
        .unwrap();
    g.release().await.unwrap();
    node.stop_immediate().await.unwrap();
    node.start_again().await.unwrap();
    let outside = node.backend().await.unwrap();
    let left = outside.entries(name).await.unwrap();
    assert!(left.is_empty(), "released entries came back: {left:?}");
    let again = Mutex::new(&s, name).unwrap().lock().await.unwrap();
    assert!(
        again.fencing_token() > highest,
        "token {} granted after {highest}",
        again.fencing_token()
    );
    again.release().await.unwrap();
}

/// Behind a transaction-mode pooler the LISTEN connection hears nothing (its server
/// connection goes back to the pool after each transaction): the connect is refused with
/// `Misconfigured`, naming the likely cause, instead of waits that would hang until a lease
/// deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_the_connect_is_refused() {
    let node = PgNode::shared();
    let port = node.start_pgbouncer("transaction").await.unwrap();
    let refused = PgBackend::connect(
        &format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        PgOptions::new().with_connect_timeout(Duration::from_secs(2)),
    )
    .await;
    match refused {
        Err(Error::Misconfigured { source, .. }) => {
            assert!(
                source.to_string().contains("transaction-mode pooler"),
                "{source}"
            );
        }
        other => panic!("expected Misconfigured, got {other:?}"),
    }
}

/// Through a session-mode pooler everything works: a waiter is woken by the release (the
/// LISTEN connection keeps its server session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_session_pooler_a_waiter_is_woken_by_the_release() {
    let node = PgNode::shared();
    let port = node.start_pgbouncer("session").await.unwrap();
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let b = PgBackend::connect(&url, PgOptions::new()).await.unwrap();
    a_release_wakes_its_waiter(&b, &b, &test_name("session-pool")).await;
}

/// An enqueue that reaches PostgreSQL after its client gave up on it, retried on a new
/// connection and released, lands nowhere: an entry left in the queue would hold the lock for
/// nobody while the lease lives. The proxy holds back what the client sends, closes the
/// client's side (the client reconnects and retries), and delivers the held request on its old
/// connection after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_delivered_late_lands_nowhere() {
    let node = PgNode::shared();
    let proxy = support::proxy::Proxy::start(&format!("127.0.0.1:{}", node.port())).await;
    let behind = PgBackend::connect(
        &format!("postgres://postgres@{}/postgres", proxy.addr()),
        PgOptions::new().with_connect_timeout(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let direct = backend().await;
    let a = session(&behind, Duration::from_secs(20)).await;
    let b = session(&direct, Duration::from_secs(20)).await;
    for round in 0..3 {
        // A name per round: what the proxy held in earlier rounds names the earlier ones.
        let name = format!("pg-{}/late-enqueue-{round}", std::process::id());
        let mutex = Mutex::new(&a, &name).unwrap();
        // Once, so that the LISTEN connection already listens for this name.
        mutex.lock().await.unwrap().release().await.unwrap();
        let (t1, t2, delivered) =
            support::retried_enqueue_delivered_late(&proxy, &direct, &a, &b, &name).await;
        assert!(delivered >= 1);
        assert!(t2 > t1, "tokens out of grant order: {t1}, {t2}");
    }
}

/// An enqueue a `lock()` gave up on (the server out of reach past `retry_for`) reaches
/// PostgreSQL after the lock was taken again and released, and lands nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_enqueue_delivered_late_lands_nowhere() {
    let node = PgNode::shared();
    let proxy = support::proxy::Proxy::start(&format!("127.0.0.1:{}", node.port())).await;
    let behind = PgBackend::connect(
        &format!("postgres://postgres@{}/postgres", proxy.addr()),
        PgOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_request_timeout(Duration::from_millis(300))
            .with_retry_for(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let direct = backend().await;
    let name = format!("pg-{}/abandoned-enqueue", std::process::id());
    let a = session(&behind, Duration::from_secs(20)).await;
    let b = session(&direct, Duration::from_secs(20)).await;
    let mutex = Mutex::new(&a, &name).unwrap();
    // Once, so that the LISTEN connection already listens for this name.
    mutex.lock().await.unwrap().release().await.unwrap();
    support::abandoned_enqueue_delivered_late(&proxy, &direct, &a, &b, &name).await;
}

/// A role or database default isolation of REPEATABLE READ or SERIALIZABLE changes nothing
/// (issue #36): baton sets READ COMMITTED on every connection. Before, an enqueue that waited
/// behind another's queue lock read the queue in a snapshot taken before the wait: enqueues
/// that queued behind one another all saw no one ahead and were granted together (6 of 6
/// holders at once), and clients starting together on a fresh database failed with `relation
/// "tokens" already exists`. Per default, on a server of its own: 6 clients start at once on
/// a database without baton's schema (each migrating), then contend for one lock, each
/// holding it a moment; never more than one holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolation_defaults_of_the_role_or_database_change_nothing() {
    let node = own_node().await;
    let admin = node.client().await.unwrap();
    admin
        .batch_execute(
            "CREATE ROLE rr LOGIN SUPERUSER; \
             ALTER ROLE rr SET default_transaction_isolation = 'repeatable read';",
        )
        .await
        .unwrap();
    // One statement each: CREATE DATABASE runs outside a transaction.
    admin.batch_execute("CREATE DATABASE ser").await.unwrap();
    admin
        .batch_execute("ALTER DATABASE ser SET default_transaction_isolation = 'serializable'")
        .await
        .unwrap();
    for (who, url) in [
        (
            "role rr, repeatable read",
            format!(
                "postgres://rr@127.0.0.1:{}/postgres?baton_schema=iso_rr",
                node.port()
            ),
        ),
        (
            "database ser, serializable",
            format!("postgres://postgres@127.0.0.1:{}/ser", node.port()),
        ),
    ] {
        // First use, all at once.
        let connects = (0..6).map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PgBackend::connect(&url, PgOptions::new()).await })
        });
        let mut backends = Vec::new();
        for c in connects {
            backends.push(c.await.unwrap().unwrap_or_else(|e| {
                panic!(
                    "{who}: concurrent first use failed: {e:?} ({:?})",
                    std::error::Error::source(&e)
                )
            }));
        }
        backends[0].init_store().await.unwrap();
        let holding = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let barrier = Arc::new(tokio::sync::Barrier::new(backends.len()));
        let tasks: Vec<_> = backends
            .into_iter()
            .map(|b| {
                let (holding, most, barrier) = (holding.clone(), most.clone(), barrier.clone());
                tokio::spawn(async move {
                    let s = session(&b, Duration::from_secs(30)).await;
                    barrier.wait().await;
                    let g = Mutex::new(&s, "isolation").unwrap().lock().await.unwrap();
                    let now = holding.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    holding.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    g.release().await.unwrap();
                })
            })
            .collect();
        for t in tasks {
            within("the contenders", Duration::from_secs(30), t)
                .await
                .unwrap();
        }
        assert_eq!(
            most.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "{who}: holders at once"
        );
    }
}

/// Errors a DBA meets (issue #38), each typed and said at once, nothing sent that can be
/// refused before: an unknown URL option and a port out of range are the caller's to fix
/// (`InvalidInput`, the CLI's 64, not "cannot reach", 69); a lock name too long for the
/// entries' index is refused before it is sent, naming the limit and the name shortened
/// (not PostgreSQL's B-tree error echoing the whole name); a role whose transactions are
/// read-only by default is refused at connect (not retried 11.5 s as if a standby); a schema
/// of the application's is not taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dbas_errors_are_typed_and_said_at_once() {
    let node = PgNode::shared();
    for url in [
        format!("{}?no_such_option=1", node.url()),
        "postgres://postgres@127.0.0.1:70000/postgres".to_owned(),
    ] {
        let err = PgBackend::connect(&url, PgOptions::new())
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidInput { .. }), "{url}: {err:?}");
    }

    let backend = node.backend().await.unwrap();
    let s = session(&backend, Duration::from_secs(30)).await;
    // Pseudo-random digits: a name that compresses would fit the index (it takes the
    // compressed key).
    let digits: String = (0u64..1_500)
        .map(|i| format!("{:x}", i.wrapping_mul(2_654_435_761) % 65_521))
        .collect();
    let long = format!("{}{digits}", test_name("long"));
    let err = Mutex::new(&s, &long).unwrap().lock().await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
    assert!(text.contains("2000") && text.len() < 400, "{text}");

    let admin = node.client().await.unwrap();
    admin
        .batch_execute(
            "CREATE ROLE ro LOGIN SUPERUSER; \
             ALTER ROLE ro SET default_transaction_read_only = on; \
             CREATE SCHEMA IF NOT EXISTS appdata; \
             CREATE TABLE IF NOT EXISTS appdata.customers (id int); \
             CREATE SCHEMA IF NOT EXISTS appclash; \
             CREATE TABLE IF NOT EXISTS appclash.tokens (id int);",
        )
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let err = PgBackend::connect(
        &format!("postgres://ro@127.0.0.1:{}/postgres", node.port()),
        PgOptions::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Misconfigured { .. }), "{err:?}");
    assert!(
        std::error::Error::source(&err)
            .is_some_and(|s| s.to_string().contains("default_transaction_read_only")),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    for schema in ["appdata", "appclash"] {
        let err = PgBackend::connect(&node.url(), PgOptions::new().with_schema(schema))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::ForeignSchema { schema: s } if s == schema),
            "{schema}: {err:?}"
        );
        assert!(err.to_string().contains("with_schema"), "{err}");
    }
}

/// A server out of connections (issue #38): the request connection got the last one, the
/// LISTEN connection gets `too many clients`. Before, the connect waited 5 s and blamed a
/// transaction-mode pooler, naming no address (`baton:  does not match`). Now it says what
/// the server said, at once, with the address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_out_of_connections_is_named_as_such() {
    let node = PgNode::start_with(&[
        "-c",
        "max_connections=8",
        "-c",
        "superuser_reserved_connections=0",
    ])
    .await
    .unwrap();
    // Take every slot but one.
    let mut held = Vec::new();
    while let Ok(c) = node.client().await {
        held.push(c);
    }
    // Let one go: the request connection takes it, the LISTEN connection finds none.
    held.pop();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    let err = PgBackend::connect(&node.url(), PgOptions::new())
        .await
        .unwrap_err();
    let text = format!(
        "{err} / {:?}",
        std::error::Error::source(&err).map(|s| s.to_string())
    );
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(text.contains("too many clients"), "{text}");
    assert!(!text.contains("pooler"), "{text}");
    assert!(text.contains("127.0.0.1"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    drop(held);
}

/// `ConnectOptions` reaches the PostgreSQL backend's options: a schema set through
/// `connect_with` keeps two applications' locks of one name apart, and clients of the same
/// schema share them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_options_carry_the_schema() {
    let url = PgNode::shared().url();
    let pid = std::process::id();
    support::namespaces_keep_locks_apart("schema", |app| {
        baton::connect_with(
            &url,
            baton::ConnectOptions::new()
                .with_pg_schema(format!("connect_{app}_{pid}"))
                // New schemas: no holder can predate them.
                .with_restart_grace(Duration::ZERO)
                .with_request_timeout(Duration::from_secs(5))
                .with_retry_for(Duration::from_secs(10)),
        )
    })
    .await;
}

/// Enqueues that arrive while one is in flight go together, in one transaction (schema
/// version 10, issue #39): 200 waiters queued at once by one backend are created by a few
/// transactions (the entries' `xmin`), not 200, each waiting for its own WAL flush; and they
/// are still granted one at a time, in token order. Seen failing before bursts: 200
/// transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueues_that_arrive_together_commit_together() {
    const WAITERS: usize = 200;
    let backend = backend().await;
    let name = test_name("burst");
    let holder = Session::new(backend.clone()).await.unwrap();
    let guard = Mutex::new(&holder, &name).unwrap().lock().await.unwrap();
    let mut sessions = Vec::with_capacity(WAITERS);
    for _ in 0..WAITERS {
        sessions.push(Session::new(backend.clone()).await.unwrap());
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let waiters: Vec<_> = sessions
        .iter()
        .map(|s| {
            let (mutex, tx) = (Mutex::new(s, &name).unwrap(), tx.clone());
            tokio::spawn(async move {
                let guard = mutex.lock().await.unwrap();
                tx.send(guard.fencing_token()).unwrap();
                guard.release().await.unwrap();
            })
        })
        .collect();
    support::eventually("every waiter queued", || async {
        backend.entries(&name).await.unwrap().len() == WAITERS + 1
    })
    .await;
    let raw = PgNode::shared().client().await.unwrap();
    let transactions: i64 = raw
        .query_one(
            r#"SELECT count(DISTINCT xmin::text) FROM baton.entries
               WHERE key >= $1 COLLATE "C" AND key < $2 COLLATE "C""#,
            &[&format!("{name}/"), &format!("{name}0")],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        transactions <= (WAITERS / 4) as i64,
        "{WAITERS} waiters and a holder queued by {transactions} transactions"
    );
    guard.release().await.unwrap();
    let mut tokens = Vec::with_capacity(WAITERS);
    for _ in 0..WAITERS {
        tokens.push(
            within("the next grant", Duration::from_secs(30), rx.recv())
                .await
                .unwrap(),
        );
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "granted out of token order"
    );
    for w in waiters {
        w.await.unwrap();
    }
}

/// `baton init` on a store baton has never used (here: a schema nobody used) marks it new,
/// through the `Backend` trait as the CLI calls it (its default, "nothing to mark", answered
/// before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_marks_a_store_never_used_as_new() {
    let (schema, url) = (
        format!("baton_init_{}", std::process::id()),
        PgNode::shared().url(),
    );
    let connect = || {
        let options = PgOptions::new()
            .with_schema(schema.clone())
            .with_restart_grace(Duration::from_secs(60));
        PgBackend::connect(&url, options)
    };
    support::init_marks_a_store_never_used_as_new(connect).await;
}
