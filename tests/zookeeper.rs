//! The conformance suite and ZooKeeper-specific tests against a real ZooKeeper server,
//! started through testcontainers (see `baton::testing`). One server is shared by the tests of
//! this binary; each test uses its own path prefix.

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;

use baton::testing::ZkNode;
use baton::{ZkBackend, ZkOptions};
use support::Rig;

async fn backend() -> ZkBackend {
    ZkBackend::connect(&ZkNode::shared().url(), ZkOptions::new())
        .await
        .expect("connect to the shared ZooKeeper")
}

async fn rig(test: &str) -> Rig {
    Rig {
        backend: Arc::new(backend().await),
        // A second connection: "someone else" really is another client.
        outside: Arc::new(backend().await),
        prefix: format!("zk-{}/{test}", std::process::id()),
    }
}

conformance!(super::rig; flavor = "multi_thread", worker_threads = 2);
