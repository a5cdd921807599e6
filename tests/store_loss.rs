//! Stores that forget, on real servers (issue #36): a server restarted without its data, a
//! store restored from a snapshot. Each test starts its own server (it is stopped, wiped or
//! restored), and runs the scenario every backend shares (`support/epochs.rs`).

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use baton::testing::EtcdNode;
use baton::{Backend, EtcdBackend, EtcdOptions, LostReason, Mutex, Session, SessionOptions};
use support::epochs::a_holder_from_before_never_overlaps;

/// The lease TTL and the restart grace of these tests: short, so that a test waits seconds.
const TTL: Duration = Duration::from_secs(2);
const GRACE: Duration = Duration::from_secs(3);

async fn etcd_client(node: &EtcdNode) -> EtcdBackend {
    let options = EtcdOptions::new().with_restart_grace(GRACE);
    EtcdBackend::connect(node.endpoints(), options)
        .await
        .expect("connect")
}

/// Moves the store's revision on, so that a fresh store's revisions are far below it (as in
/// the report: a holder at revision ~200, a newcomer granted at 2).
async fn write_some(backend: &EtcdBackend, n: usize) {
    let mut client = backend.client().clone();
    for i in 0..n {
        client.put(format!("filler/{i}"), "x", None).await.unwrap();
    }
}

/// etcd restarted without its data dir while a lock is held (same name and URLs, so the same
/// cluster id): before issue #36 the newcomer was granted as soon as etcd was back, with
/// token 2, while the holder (token ~200) went on for up to a renewal period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restarted_without_its_data_lets_no_holder_from_before_overlap() {
    let node = EtcdNode::start_with_host_data().await.expect("etcd");
    let holder = etcd_client(&node).await;
    write_some(&holder, 200).await;
    let out = a_holder_from_before_never_overlaps(
        Arc::new(holder),
        "store-loss/wiped",
        TTL,
        GRACE,
        || async {
            node.stop().await.unwrap();
            node.wipe_data().unwrap();
            node.start_again().await.unwrap();
        },
        || async { Arc::new(etcd_client(&node).await) as Arc<dyn Backend> },
    )
    .await;
    eprintln!("{out:?}");
}

/// etcd restored from a snapshot taken after the holder's session began and before its lock
/// (`etcdctl snapshot restore`, same name and URLs): the holder's lease comes back and its
/// renewals succeed; the revision goes back. A client that saw the store past the snapshot
/// notices, begins a new epoch, and waits its grace; the holder is told at its next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restored_from_a_snapshot_lets_no_holder_from_before_overlap() {
    let node = EtcdNode::start_with_host_data().await.expect("etcd");
    let holder = etcd_client(&node).await;
    let other = etcd_client(&node).await;
    let early = Session::with_options(holder.clone(), SessionOptions::new().with_ttl(TTL))
        .await
        .unwrap();
    write_some(&holder, 20).await;
    let snapshot = std::env::temp_dir().join(format!("baton-snap-{}.db", std::process::id()));
    node.save_snapshot(&snapshot).await.expect("snapshot");
    let out = a_holder_from_before_never_overlaps(
        Arc::new(holder.clone()),
        "store-loss/restored",
        TTL,
        GRACE,
        || async {
            write_some(&other, 50).await;
            other.entries("store-loss/restored").await.unwrap();
            node.stop().await.unwrap();
            node.restore_snapshot(&snapshot).await.expect("restore");
            node.start_again().await.unwrap();
        },
        || async { Arc::new(other.clone()) as Arc<dyn Backend> },
    )
    .await;
    // The holder's own lease was granted after the snapshot: gone with the restore.
    assert!(
        matches!(out.reason, LostReason::StoreReset | LostReason::Revoked),
        "{out:?}"
    );
    // This one came back with it, and renews: only the new epoch tells it.
    assert_eq!(
        support::within("the early session told", TTL, early.lost()).await,
        LostReason::StoreReset
    );
    let _ = std::fs::remove_file(&snapshot);
}

/// What stays undetectable, standing for its row in docs/etcd's failure table: a store
/// restored from a snapshot and reached only by clients that never saw it past the snapshot
/// (a fresh process) looks exactly like a store that never moved; they are granted at once,
/// with tokens that may repeat. The holder from before is told at its next renewal (it saw
/// the store past the snapshot). An operator who restores etcd runs `baton init --restored`,
/// which begins a new epoch every client then sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restored_and_reached_only_by_fresh_clients_is_not_detected() {
    let node = EtcdNode::start_with_host_data().await.expect("etcd");
    let holder = etcd_client(&node).await;
    let snapshot = std::env::temp_dir().join(format!("baton-snap2-{}.db", std::process::id()));
    node.save_snapshot(&snapshot).await.expect("snapshot");
    let a = Session::with_options(holder.clone(), SessionOptions::new().with_ttl(TTL))
        .await
        .unwrap();
    let guard = Mutex::new(&a, "store-loss/unseen")
        .unwrap()
        .lock()
        .await
        .unwrap();
    node.stop().await.unwrap();
    node.restore_snapshot(&snapshot).await.expect("restore");
    node.start_again().await.unwrap();
    let fresh = Session::with_options(
        etcd_client(&node).await,
        SessionOptions::new().with_ttl(TTL),
    )
    .await
    .unwrap();
    assert_eq!(fresh.restart_grace(), None);
    let granted = Mutex::new(&fresh, "store-loss/unseen")
        .unwrap()
        .try_lock()
        .await
        .expect("granted at once: nothing tells a fresh client the store went back");
    assert!(
        granted.fencing_token() <= guard.fencing_token(),
        "tokens repeat"
    );
    let reason = support::within("the holder told", TTL * 2, guard.lost()).await;
    assert!(
        matches!(reason, LostReason::StoreReset | LostReason::Revoked),
        "{reason:?}"
    );
    let _ = std::fs::remove_file(&snapshot);
}

/// etcd restored from a snapshot as a new cluster (a new `--initial-cluster-token`, so a new
/// cluster id), reached only by fresh clients: the marker names the cluster it was written
/// on, so even a client that never saw the store before knows the marker is from before, and
/// begins a new epoch with its grace and tokens above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restored_as_a_new_cluster_is_detected_by_fresh_clients() {
    let node = EtcdNode::start_with_host_data().await.expect("etcd");
    let holder = etcd_client(&node).await;
    let snapshot = std::env::temp_dir().join(format!("baton-snap3-{}.db", std::process::id()));
    node.save_snapshot(&snapshot).await.expect("snapshot");
    write_some(&holder, 30).await;
    a_holder_from_before_never_overlaps(
        Arc::new(holder),
        "store-loss/new-cluster",
        TTL,
        GRACE,
        || async {
            node.stop().await.unwrap();
            node.restore_snapshot_as_new_cluster(&snapshot)
                .await
                .expect("restore");
            node.start_again().await.unwrap();
        },
        || async { Arc::new(etcd_client(&node).await) as Arc<dyn Backend> },
    )
    .await;
    let _ = std::fs::remove_file(&snapshot);
}
