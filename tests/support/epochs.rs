//! Store epochs: one scenario for every backend and every way a store forgets (restarted
//! without its data, restored from a snapshot or an older backup, failed over to a replica
//! that missed writes). Each backend's test file supplies how its store forgets and how a
//! client reaches it; the promise checked is the same (docs/guarantees.md, "A store that
//! forgets").

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use baton::{Backend, Error, LostReason, Mutex, Session, SessionOptions};
use tokio::time::Instant;

/// How one run of [`a_holder_from_before_never_overlaps`] went, for the test's own checks.
#[derive(Debug)]
pub struct Overlap {
    /// The holder's token from before, and the newcomer's.
    pub before: baton::FencingToken,
    pub after: baton::FencingToken,
    /// Why the holder from before was told.
    pub reason: LostReason,
    /// From the newcomer's first contact to its grant.
    pub waited: Duration,
}

/// A holder takes `name` through `holder`; then the store forgets (`forget`), and a client
/// (`newcomer`, called after `forget`: a fresh process or one that used the store before)
/// asks for the same lock. Checked:
/// - the newcomer is refused by `try_lock` with [`Error::RestartGrace`] and sees the grace in
///   [`Session::restart_grace`];
/// - the holder from before is told it lost the lock **before** the newcomer is granted;
/// - the newcomer is granted no sooner than `grace` after its first contact, and with a token
///   above the holder's.
pub async fn a_holder_from_before_never_overlaps<F, Ff, N, Nf>(
    holder: Arc<dyn Backend>,
    name: &str,
    ttl: Duration,
    grace: Duration,
    forget: F,
    newcomer: N,
) -> Overlap
where
    F: FnOnce() -> Ff,
    Ff: Future<Output = ()>,
    N: FnOnce() -> Nf,
    Nf: Future<Output = Arc<dyn Backend>>,
{
    super::capture_logs();
    let options = SessionOptions::new().with_ttl(ttl);
    let a = Session::with_options(holder, options.clone())
        .await
        .expect("the holder's session");
    let guard = Mutex::new(&a, name)
        .unwrap()
        .lock()
        .await
        .expect("the holder's lock");
    let before = guard.fencing_token();
    let lost = guard.lost();

    forget().await;
    let contact = Instant::now();
    let b = Session::with_options(newcomer().await, options)
        .await
        .expect("the newcomer's session");
    let mutex = Mutex::new(&b, name).unwrap();
    let left = b
        .restart_grace()
        .expect("the newcomer sees the restart grace after the store forgot");
    assert!(left <= grace, "a grace longer than configured: {left:?}");
    match mutex.try_lock().await {
        Err(Error::RestartGrace { .. }) => {}
        other => panic!("try_lock during the grace: {other:?}"),
    }
    // The grant's instant is taken where it happens, not where the test looks.
    let lock = tokio::spawn(async move {
        let guard = mutex.lock().await;
        (guard, Instant::now())
    });

    let reason = super::within("the holder from before is told", grace + ttl * 2, lost).await;
    let told = Instant::now();
    assert!(
        matches!(
            reason,
            LostReason::StoreReset | LostReason::Revoked | LostReason::Expired
        ),
        "{reason:?}"
    );
    let (granted, granted_at) = super::within("the newcomer is granted", grace * 3 + ttl * 2, lock)
        .await
        .expect("the newcomer's task");
    let granted = granted.expect("the newcomer's lock");
    assert!(
        told <= granted_at,
        "the newcomer was granted before the holder was told"
    );
    let waited = granted_at - contact;
    // etcd's and PostgreSQL's clocks count in whole milliseconds or seconds, ours does not.
    assert!(
        waited + Duration::from_millis(50) >= grace,
        "granted {waited:?} after the newcomer's first contact, within the grace {grace:?}"
    );
    let after = granted.fencing_token();
    assert!(
        after > before,
        "the new epoch's token {after} is not above the token {before} from before"
    );
    granted.release().await.expect("unlock");
    b.close().await.expect("close");
    Overlap {
        before,
        after,
        reason,
        waited,
    }
}
