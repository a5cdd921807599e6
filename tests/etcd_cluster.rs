//! Tests on a three-member etcd cluster (three containers, host networking): the client
//! keeps working when the leader stops, and reports a clear error when no member answers.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use baton::testing::EtcdCluster;
use baton::{Error, EtcdBackend, EtcdFence, EtcdOptions, Fence, Mutex, Session, SessionOptions};
use support::{FencedRegister, assert_strictly_increasing, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_survive_a_leader_stop_and_fail_clearly_without_quorum() {
    let cluster = EtcdCluster::start().await.expect("three-member cluster");
    let options = EtcdOptions::new()
        .with_request_timeout(Duration::from_secs(2))
        .with_retry_for(Duration::from_secs(15));
    let backend = EtcdBackend::connect(&cluster.endpoints(), options)
        .await
        .unwrap();
    let session = Session::with_options(
        backend.clone(),
        SessionOptions::new().with_ttl(Duration::from_secs(20)),
    )
    .await
    .unwrap();
    let mutex = Mutex::new(&session, "cluster/lock").unwrap();
    let register = FencedRegister::default();
    // Tokens keep increasing across the leader change, also as seen by a fence in etcd.
    let fence = EtcdFence::new(backend.clone(), "cluster/fence").unwrap();
    let cycle = || async {
        let guard = mutex.lock().await.unwrap();
        let token = guard.fencing_token();
        assert!(register.enter(token.get()));
        fence.write("resource", token.into(), b"x").await.unwrap();
        register.exit(token.get());
        guard.release().await.unwrap();
    };
    cycle().await;

    let leader = within("a leader", Duration::from_secs(10), async {
        loop {
            if let Some(l) = cluster.leader().await.unwrap() {
                break l;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    // A member that does not exist is an error, not a panic.
    let err = cluster.stop_member(3).await.unwrap_err();
    assert!(
        matches!(
            err,
            baton::testing::FixtureError::NoSuchMember {
                index: 3,
                members: 3
            }
        ),
        "{err:?}"
    );
    cluster.stop_member(leader).await.unwrap();
    // Requests that hit the stopped member are retried on the others.
    for _ in 0..20 {
        within(
            "a lock cycle without the old leader",
            Duration::from_secs(20),
            cycle(),
        )
        .await;
    }
    cluster.start_member(leader).await.unwrap();
    for _ in 0..5 {
        within(
            "a lock cycle after the restart",
            Duration::from_secs(20),
            cycle(),
        )
        .await;
    }
    let s = register.snapshot();
    assert_eq!((s.overlaps, s.rejected, s.accepted.len()), (0, 0, 26));
    assert_strictly_increasing(&s.accepted);

    // No member answers: a clear error once the retry budget is spent, not a hang.
    let impatient = EtcdBackend::connect(
        &cluster.endpoints(),
        EtcdOptions::new()
            .with_request_timeout(Duration::from_millis(500))
            .with_retry_for(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    for i in 0..3 {
        cluster.stop_member(i).await.unwrap();
    }
    let started = std::time::Instant::now();
    let err = Session::new(impatient).await.unwrap_err();
    // Refused connections prove nothing was sent: a definite failure. (An attempt that timed
    // out while the members went down would make it `OutcomeUnknown`, also clear.)
    assert!(
        matches!(
            err,
            Error::Backend {
                op: "grant_lease",
                ..
            } | Error::OutcomeUnknown {
                op: "grant_lease",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));

    // Two members started again: start_member returns once each is healthy, so the quorum
    // is back (a leader elected) and a member alone serves a linearizable read at once: one
    // attempt, no retries. (Returning as soon as the container runs, the read would come
    // before the election, which takes at least the 500 ms election timeout.)
    futures::future::try_join(cluster.start_member(0), cluster.start_member(1))
        .await
        .unwrap();
    let restarted = EtcdBackend::connect(
        &[cluster.endpoint(0)],
        EtcdOptions::new()
            .with_connect_timeout(Duration::from_millis(300))
            .with_request_timeout(Duration::from_millis(300))
            .with_retry_for(Duration::ZERO),
    )
    .await
    .expect("a member started again accepts a connection");
    baton::Backend::read(&restarted, "cluster/health")
        .await
        .expect("a member started again serves a linearizable read");
}
