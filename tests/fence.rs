//! Fences end to end: the fence suite (`tests/support/fences.rs`) on the in-memory, etcd,
//! SQLite and PostgreSQL fences; holders paused past their leases, on memory and etcd; the
//! examples' scenarios with PostgreSQL as the fenced resource; corrupt stored tokens; and the
//! SQL that docs/fencing.md shows is the SQL tested here.

#[path = "support/mod.rs"]
mod support;

#[path = "support/postgres.rs"]
mod postgres;

#[path = "../examples/common/sql_fence.rs"]
#[allow(dead_code, unreachable_pub)]
mod sql_fence;

#[path = "../examples/common/scenarios.rs"]
#[allow(dead_code, unreachable_pub)]
mod scenarios;

use std::sync::Arc;

use baton::testing::EtcdNode;
use baton::{Backend, Error, EtcdFence, Fence, FencingToken, MemoryBackend, MemoryFence};
use sql_fence::SqliteFence;
use support::Rig;

async fn memory(_: &str) -> Arc<dyn Fence> {
    Arc::new(MemoryFence::new())
}

async fn etcd(test: &str) -> Arc<dyn Fence> {
    let backend = EtcdNode::shared().backend().await.unwrap();
    Arc::new(EtcdFence::new(backend, format!("fence-{}/{test}", std::process::id())).unwrap())
}

/// A database file of its own per test; every call opens its own connection.
async fn sqlite(test: &str) -> Arc<dyn Fence> {
    let dir = std::env::temp_dir().join(format!("baton-fence-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    Arc::new(SqliteFence::open(dir.join(format!("{test}.db"))).unwrap())
}

async fn pg(test: &str) -> Arc<dyn Fence> {
    Arc::new(postgres::PgFence::new(&format!(
        "{}/{test}",
        std::process::id()
    )))
}

fence_suite!(mod memory_fence; super::memory; start_paused = true);
fence_suite!(mod etcd_fence; super::etcd; flavor = "multi_thread", worker_threads = 2);
fence_suite!(mod sqlite_fence; super::sqlite; flavor = "multi_thread", worker_threads = 2);
fence_suite!(mod postgres_fence; super::pg; flavor = "multi_thread", worker_threads = 2);

fn memory_rig() -> Rig {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    Rig {
        outside: Arc::clone(&backend),
        backend,
        prefix: "mem".into(),
    }
}

async fn etcd_rig(test: &str) -> Rig {
    let node = EtcdNode::shared();
    Rig {
        backend: Arc::new(node.backend().await.unwrap()),
        outside: Arc::new(node.backend().await.unwrap()),
        prefix: format!("fence-{}/{test}", std::process::id()),
    }
}

#[tokio::test(start_paused = true)]
async fn memory_stale_write_is_refused_every_time() {
    support::fences::stale_writes_are_fenced(memory_rig(), memory("stale").await, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_stale_write_is_refused_after_keep_alive_stops() {
    let rig = etcd_rig("stale").await;
    support::fences::stale_writes_are_fenced(rig, etcd("stale").await, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stale_write_is_refused_after_keep_alive_stops() {
    support::fences::stale_writes_are_fenced(memory_rig(), pg("stale").await, 3).await;
}

/// The examples' scenarios (inventory, payment, bank transfer) with PostgreSQL as the fenced
/// resource and a holder paused at each point: the invariants hold (stock sold + left =
/// stocked, one charge, balances conserved).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_scenarios_with_a_paused_holder() {
    use scenarios::{Pause, World};
    for (i, pause) in Pause::ALL.into_iter().enumerate() {
        let world = World {
            backend: Arc::new(MemoryBackend::new()),
            fence: pg(&format!("scenarios-{i}")).await,
            prefix: format!("pg-{i}"),
        };
        if Pause::INVENTORY.contains(&pause) {
            scenarios::inventory(&world, pause).await.unwrap();
        }
        scenarios::payment(&world, pause).await.unwrap();
        scenarios::bank_transfer(&world, pause).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_corrupt_stored_token_is_reported_not_overwritten() {
    let prefix = format!("fence-{}/corrupt", std::process::id());
    let backend = EtcdNode::shared().backend().await.unwrap();
    let fence = EtcdFence::new(backend.clone(), prefix.clone()).unwrap();
    let mut client = backend.client().clone();
    // Written by something else: not a token, and bytewise *lower* than any encoded token.
    for garbage in ["", "12", "abc"] {
        client
            .put(format!("{prefix}/r/token"), garbage, None)
            .await
            .unwrap();
        let write = fence.write("r", FencingToken::new(5).into(), b"data").await;
        assert!(
            matches!(write, Err(Error::CorruptFence { .. })),
            "{garbage:?}: {write:?}"
        );
        let claim = fence.claim("r", FencingToken::new(5).into()).await;
        assert!(
            matches!(claim, Err(Error::CorruptFence { .. })),
            "{claim:?}"
        );
        let stored = client.get(format!("{prefix}/r/token"), None).await.unwrap();
        assert_eq!(
            stored.kvs()[0].value(),
            garbage.as_bytes(),
            "left as it was"
        );
        assert!(
            client
                .get(format!("{prefix}/r/data"), None)
                .await
                .unwrap()
                .kvs()
                .is_empty()
        );
        assert!(matches!(
            fence.read("r").await,
            Err(Error::CorruptFence { .. })
        ));
    }
}

#[tokio::test]
async fn sqlite_corrupt_stored_token_is_reported_not_overwritten() {
    let dir = std::env::temp_dir().join(format!("baton-fence-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fence = SqliteFence::open(dir.join("corrupt.db")).unwrap();
    // Values of every kind SQLite could hold, some of which compare lower than any token.
    for garbage in ["'abc'", "-5", "1.5", "x'00'"] {
        fence
            .write("r", FencingToken::new(3).into(), b"ok")
            .await
            .unwrap();
        fence
            .connect()
            .unwrap()
            .execute(
                &format!("UPDATE fenced SET fence_token = {garbage} WHERE resource = 'r'"),
                [],
            )
            .unwrap();
        let write = fence.write("r", FencingToken::new(5).into(), b"new").await;
        assert!(
            matches!(write, Err(Error::CorruptFence { .. })),
            "{garbage}: {write:?}"
        );
        let data: Vec<u8> = fence
            .connect()
            .unwrap()
            .query_row("SELECT data FROM fenced WHERE resource = 'r'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(data, b"ok", "{garbage}: nothing written");
        fence
            .connect()
            .unwrap()
            .execute("DELETE FROM fenced WHERE resource = 'r'", [])
            .unwrap();
    }
}

/// docs/fencing.md shows the statements that run here, word for word (whitespace aside).
#[test]
fn the_docs_show_the_tested_sql() {
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/fencing.md")).unwrap();
    let flat = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let docs = flat(&docs);
    for (what, sql) in [
        ("PostgreSQL table", postgres::SCHEMA),
        ("PostgreSQL write", postgres::FENCED_WRITE),
        ("PostgreSQL claim", postgres::FENCED_CLAIM),
        ("SQLite table", sql_fence::SCHEMA),
        ("SQLite write", sql_fence::FENCED_WRITE),
        ("SQLite claim", sql_fence::FENCED_CLAIM),
    ] {
        assert!(
            docs.contains(&flat(sql)),
            "docs/fencing.md does not show the {what} statement as tested:\n{sql}"
        );
    }
}

#[cfg(feature = "serde")]
#[test]
fn fencing_token_serialises_as_a_plain_integer() {
    let json = serde_json::to_string(&FencingToken::new(42)).unwrap();
    assert_eq!(json, "42");
    let back: FencingToken = serde_json::from_str("42").unwrap();
    assert_eq!(back, FencingToken::new(42));
}
