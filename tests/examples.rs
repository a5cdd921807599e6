//! The fencing scenarios of the `inventory`, `payment` and `bank_transfer` examples, with the
//! first holder paused at every point (after its grant; after reading, before writing; in the
//! middle of its writes; after writing), on the memory backend and on etcd: each checks its
//! own invariant (stock sold + left = stocked; exactly one charge; balances conserved, each
//! transfer applied once).

#[path = "../examples/common/scenarios.rs"]
#[allow(dead_code, unreachable_pub)]
mod scenarios;

use std::sync::Arc;

use baton::testing::EtcdNode;
use baton::{EtcdFence, MemoryBackend, MemoryFence};
use scenarios::{Pause, World};

async fn run_all(make: impl Fn(String) -> World) {
    for (i, pause) in Pause::ALL.into_iter().enumerate() {
        if Pause::INVENTORY.contains(&pause) {
            let report = scenarios::inventory(&make(format!("inventory-{i}")), pause).await;
            println!("inventory: {}", report.unwrap());
        }
        let report = scenarios::payment(&make(format!("payment-{i}")), pause).await;
        println!("payment: {}", report.unwrap());
        let report = scenarios::bank_transfer(&make(format!("bank-{i}")), pause).await;
        println!("bank_transfer: {}", report.unwrap());
    }
}

#[tokio::test]
async fn scenarios_on_memory_at_every_pause_point() {
    run_all(|prefix| World {
        backend: Arc::new(MemoryBackend::new()),
        fence: Arc::new(MemoryFence::new()),
        prefix,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenarios_on_etcd_at_every_pause_point() {
    let backend = EtcdNode::shared().backend().await.unwrap();
    let run = format!("examples-{}", std::process::id());
    run_all(|name| World {
        backend: Arc::new(backend.clone()),
        fence: Arc::new(EtcdFence::new(backend.clone(), format!("{run}/{name}/fence")).unwrap()),
        prefix: format!("{run}/{name}"),
    })
    .await;
}
