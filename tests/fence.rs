//! Fences end to end: the in-memory, etcd and SQLite fences refuse stale writes, keep the
//! highest token under concurrent writers, and refuse bad input without writing.

#[path = "support/mod.rs"]
mod support;

#[path = "../examples/common/sql_fence.rs"]
#[allow(dead_code, unreachable_pub)]
mod sql_fence;

use std::sync::Arc;

use baton::testing::EtcdNode;
use baton::{Backend, Error, EtcdFence, Fence, FencingToken, MemoryBackend, MemoryFence};
use sql_fence::SqliteFence;
use support::Rig;

fn sqlite() -> Arc<SqliteFence> {
    Arc::new(SqliteFence::new(rusqlite::Connection::open_in_memory().unwrap()).unwrap())
}

async fn etcd_rig(test: &str) -> Rig {
    let node = EtcdNode::shared();
    Rig {
        backend: Arc::new(node.backend().await.unwrap()),
        outside: Arc::new(node.backend().await.unwrap()),
        prefix: format!("fence-{}/{test}", std::process::id()),
    }
}

async fn etcd_fence(test: &str) -> Arc<EtcdFence> {
    let backend = EtcdNode::shared().backend().await.unwrap();
    Arc::new(EtcdFence::new(backend, format!("fence-{}/{test}", std::process::id())).unwrap())
}

#[tokio::test(start_paused = true)]
async fn memory_stale_write_is_refused_every_time() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let rig = Rig {
        outside: Arc::clone(&backend),
        backend,
        prefix: "mem".into(),
    };
    support::stale_writes_are_fenced(rig, Arc::new(MemoryFence::new()), 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_stale_write_is_refused_after_keep_alive_stops() {
    let rig = etcd_rig("stale").await;
    let fence = etcd_fence("stale").await;
    support::stale_writes_are_fenced(rig, fence, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_writers_keep_the_highest_token() {
    support::fence_keeps_the_highest(Arc::new(MemoryFence::new()), "r").await;
    support::fence_keeps_the_highest(etcd_fence("sixteen").await, "r").await;
    support::fence_keeps_the_highest(sqlite(), "r").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_writes_nothing() {
    support::fence_refuses_bad_input(Arc::new(MemoryFence::new()), "r").await;
    support::fence_refuses_bad_input(etcd_fence("bad").await, "r").await;
    support::fence_refuses_bad_input(sqlite(), "r").await;
    let empty_prefix = EtcdFence::new(EtcdNode::shared().backend().await.unwrap(), "");
    assert!(matches!(empty_prefix, Err(Error::InvalidArgument(_))));
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
        let write = fence.write("r", FencingToken::new(5), b"data").await;
        assert!(
            matches!(write, Err(Error::CorruptFence { .. })),
            "{garbage:?}: {write:?}"
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
    let fence = sqlite();
    fence.write("r", FencingToken::new(3), b"ok").await.unwrap();
    fence.with_conn(|c| {
        c.execute(
            "UPDATE fenced SET fence_token = 'abc' WHERE resource = 'r'",
            [],
        )
        .unwrap()
    });
    let write = fence.write("r", FencingToken::new(5), b"new").await;
    assert!(
        matches!(write, Err(Error::CorruptFence { .. })),
        "{write:?}"
    );
    let data: Vec<u8> = fence.with_conn(|c| {
        c.query_row("SELECT data FROM fenced WHERE resource = 'r'", [], |r| {
            r.get(0)
        })
        .unwrap()
    });
    assert_eq!(data, b"ok", "nothing written");
}

#[cfg(feature = "serde")]
#[test]
fn fencing_token_serialises_as_a_plain_integer() {
    let json = serde_json::to_string(&FencingToken::new(42)).unwrap();
    assert_eq!(json, "42");
    let back: FencingToken = serde_json::from_str("42").unwrap();
    assert_eq!(back, FencingToken::new(42));
}
