//! The conformance suite for the recipes beyond Mutex and Election: Semaphore, RwLock,
//! Barrier, DoubleBarrier, MultiLock. Every backend runs it unchanged.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use baton::testing::{Call, Fault, FaultyBackend};
use baton::{
    Barrier, DoubleBarrier, Election, Error, LostReason, MultiLock, Mutex, RwLock, Semaphore,
    SemaphorePermit, Session,
};
use tokio::task::JoinHandle;

use super::{Rig, eventually, faulty_session, settle, within};

const BOUND: Duration = Duration::from_secs(30);

/// Spawns `fut` and returns once `name`'s queue holds `queued` entries (the spawned call's
/// among them), asserting that the call still waits.
async fn spawn_waiting<T: Send + 'static>(
    rig: &Rig,
    name: &str,
    queued: usize,
    fut: impl Future<Output = T> + Send + 'static,
) -> JoinHandle<T> {
    let task = tokio::spawn(fut);
    eventually("the contender is queued", || async {
        rig.outside.entries(name).await.unwrap().len() == queued
    })
    .await;
    assert!(!task.is_finished(), "the contender must wait");
    task
}

fn acquire_task(sem: &Semaphore) -> impl Future<Output = baton::Result<SemaphorePermit>> + use<> {
    let sem = sem.clone();
    async move { sem.acquire().await }
}

/// Asserts that `task` went back to waiting: the `calls`th call of kind `call` (a wait) was
/// made on `faulty`, which a granted task never makes.
async fn waits_again<T>(
    faulty: &baton::testing::FaultyBackend,
    call: Call,
    calls: u64,
    task: &JoinHandle<T>,
) {
    within(
        "the waiter waits again",
        BOUND,
        faulty.until_count(call, calls),
    )
    .await;
    assert!(!task.is_finished(), "granted while it must wait");
}

/// A session on a fault-injecting decorator, with its own TTL: `crash` it to stop its
/// renewals (and its releases), as a process that died would.
async fn crashable(rig: &Rig, ttl: Duration) -> (Arc<FaultyBackend>, Session) {
    let faulty = FaultyBackend::wrap(Arc::clone(&rig.backend));
    let session = super::session_on(faulty.clone(), ttl).await;
    (faulty, session)
}

fn crash(faulty: &FaultyBackend) {
    for call in [Call::KeepAlive, Call::RevokeLease, Call::DeleteEntry] {
        faulty.inject_every(call, Fault::FailBefore);
    }
}

/// Holders of a semaphore never exceed its limit; every permit gets a distinct token; nothing
/// is left behind.
pub async fn semaphore_bounds_holders(rig: Rig) {
    let name = rig.name("sem-bound");
    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let session = rig.session().await;
        let sem = Semaphore::new(&session, &name, 3).unwrap();
        let (holding, most, tokens) = (holding.clone(), most.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let permit = sem.acquire().await.unwrap();
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokens.lock().unwrap().push(permit.fencing_token().get());
                assert!(permit.is_owner().await.unwrap());
                tokio::task::yield_now().await;
                holding.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.unwrap();
            }
            drop(session);
        }));
    }
    for t in tasks {
        within("the contenders", Duration::from_secs(120), t)
            .await
            .unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 3, "{most} holders at once with 3 permits");
    let mut tokens = tokens.lock().unwrap().clone();
    let n = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), n, "a token was granted twice");
    assert!(rig.keys(&name).await.is_empty(), "entries left behind");
}

/// Permits are granted in queue order, and a release by *any* holder (not only the oldest)
/// grants the first waiter at once: the waiter watches every entry that can make it a holder.
pub async fn semaphore_fifo_whoever_releases(rig: Rig) {
    let name = rig.name("sem-fifo");
    let s = rig.session().await;
    let sem = Semaphore::new(&s, &name, 2).unwrap();
    let oldest = sem.acquire().await.unwrap();
    let newer = sem.acquire().await.unwrap();
    let mut waiters = Vec::new();
    for i in 0..3 {
        let session = rig.session().await;
        let sem = Semaphore::new(&session, &name, 2).unwrap();
        waiters.push((
            spawn_waiting(&rig, &name, 3 + i, acquire_task(&sem)).await,
            session,
        ));
    }
    // The newer holder leaves first: the first waiter (which the oldest holder still
    // precedes) must be granted.
    newer.release().await.unwrap();
    let (w0, _s0) = waiters.remove(0);
    let first = within("the first waiter's grant", BOUND, w0)
        .await
        .unwrap()
        .unwrap();
    assert!(first.fencing_token() > oldest.fencing_token());
    assert!(!waiters[0].0.is_finished() && !waiters[1].0.is_finished());
    oldest.release().await.unwrap();
    let (w1, _s1) = waiters.remove(0);
    let second = within("the second waiter's grant", BOUND, w1)
        .await
        .unwrap()
        .unwrap();
    assert!(second.fencing_token() > first.fencing_token());
    assert!(!waiters[0].0.is_finished());
    let second_token = second.fencing_token();
    second.release().await.unwrap();
    let (w2, _s2) = waiters.remove(0);
    let third = within("the third waiter's grant", BOUND, w2)
        .await
        .unwrap()
        .unwrap();
    assert!(third.fencing_token() > second_token);
    first.release().await.unwrap();
    third.release().await.unwrap();
    assert!(rig.keys(&name).await.is_empty());
}

/// The first contender stores the limit; another limit is refused before anything is
/// created; changes are compare-and-set; raising grants a waiter at once; lowering revokes
/// nothing and delays new grants.
pub async fn semaphore_limit_is_stored_and_checked(rig: Rig) {
    let name = rig.name("sem-limit");
    let s = rig.session().await;
    let one = Semaphore::new(&s, &name, 1).unwrap();
    assert_eq!(one.limit().await.unwrap(), None);
    let holder = one.acquire().await.unwrap();
    assert_eq!(one.limit().await.unwrap(), Some(1));

    let other = rig.session().await;
    let wrong = Semaphore::new(&other, &name, 5).unwrap();
    let refused = wrong.acquire().await;
    assert!(
        matches!(&refused, Err(Error::LimitMismatch { stored, requested: 5, .. }) if stored == "1"),
        "{refused:?}"
    );
    assert!(matches!(
        wrong.try_acquire().await,
        Err(Error::LimitMismatch { .. })
    ));
    assert_eq!(rig.keys(&name).await, vec![holder.key().to_owned()]);

    let waiter_session = rig.session().await;
    let waiter = spawn_waiting(
        &rig,
        &name,
        2,
        acquire_task(&Semaphore::new(&waiter_session, &name, 1).unwrap()),
    )
    .await;
    // Compare-and-set: the wrong "from" changes nothing.
    let stale = one.set_limit(3, 2).await;
    assert!(
        matches!(stale, Err(Error::LimitMismatch { .. })),
        "{stale:?}"
    );
    assert!(matches!(
        one.set_limit(1, 0).await,
        Err(Error::InvalidArgument(_))
    ));
    // Raising grants the waiter while the holder still holds.
    one.set_limit(1, 2).await.unwrap();
    let granted = within("the grant after the raise", BOUND, waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(holder.is_owner().await.unwrap());

    // Lowering revokes nothing; a new contender waits until fewer than 1 are ahead.
    one.set_limit(2, 1).await.unwrap();
    assert!(holder.is_owner().await.unwrap() && granted.is_owner().await.unwrap());
    let late_session = rig.session().await;
    let late = spawn_waiting(
        &rig,
        &name,
        3,
        acquire_task(&Semaphore::new(&late_session, &name, 1).unwrap()),
    )
    .await;
    holder.release().await.unwrap();
    // One is still ahead of it: with a limit of 1 it must keep waiting.
    eventually("the holder's entry is gone", || async {
        rig.keys(&name).await.len() == 2
    })
    .await;
    let busy = Semaphore::new(&s, &name, 1).unwrap().try_acquire().await;
    assert!(matches!(busy, Err(Error::Locked { .. })), "{busy:?}");
    assert!(!late.is_finished());
    granted.release().await.unwrap();
    let last = within("the grant after the lowering", BOUND, late)
        .await
        .unwrap()
        .unwrap();
    last.release().await.unwrap();
    assert!(rig.keys(&name).await.is_empty());
}

/// A holder that crashes (its lease is never renewed) gives its permit back when its lease
/// ends, and the waiter gets it.
pub async fn semaphore_crashed_holder_permit_returns(rig: Rig) {
    let name = rig.name("sem-crash");
    let ttl = Duration::from_secs(2);
    let (faulty, crashed) = crashable(&rig, ttl).await;
    let permit = Semaphore::new(&crashed, &name, 1)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let b = rig.session().await;
    let waiter = spawn_waiting(
        &rig,
        &name,
        2,
        acquire_task(&Semaphore::new(&b, &name, 1).unwrap()),
    )
    .await;
    // The crash: nothing renews the lease any more, nothing releases; it ends by itself.
    crash(&faulty);
    drop(permit);
    let next = within(
        "the permit returned after the lease",
        ttl + Duration::from_secs(10),
        waiter,
    )
    .await
    .unwrap()
    .unwrap();
    next.release().await.unwrap();
    assert!(rig.keys(&name).await.is_empty());
}

/// A waiter whose session is lost gets an error, never a permit, and leaves nothing; a
/// holder whose session is lost is told.
pub async fn semaphore_session_loss(rig: Rig) {
    let name = rig.name("sem-loss");
    let a = rig.session_ttl(Duration::from_secs(3)).await;
    let b = rig.session_ttl(Duration::from_secs(3)).await;
    let permit = Semaphore::new(&a, &name, 1)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let waiter = spawn_waiting(
        &rig,
        &name,
        2,
        acquire_task(&Semaphore::new(&b, &name, 1).unwrap()),
    )
    .await;
    rig.outside.revoke_lease(b.lease_id()).await.unwrap();
    let result = within("the waiter's error", BOUND, waiter).await.unwrap();
    super::assert_lost(&result);
    rig.outside.revoke_lease(a.lease_id()).await.unwrap();
    assert_eq!(
        within("lost()", BOUND, permit.lost()).await,
        LostReason::Revoked
    );
    let late = permit.release().await;
    assert!(matches!(late, Err(Error::NotOwner { .. })), "{late:?}");
    assert!(rig.keys(&name).await.is_empty());
}

/// Dropping `acquire()` at each await point (create in flight, looking, watching the entries
/// ahead, watching the limit) and timeouts leave no entry; so does a busy `try_acquire()`.
pub async fn semaphore_cancel_leaves_nothing(rig: Rig) {
    let name = rig.name("sem-cancel");
    let a = rig.session().await;
    let holder = Semaphore::new(&a, &name, 1)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let only_holder = vec![holder.key().to_owned()];
    let (faulty, b) = faulty_session(&rig).await;
    let sem = Semaphore::new(&b, &name, 1).unwrap();
    // (A handle checks the stored limit at its first acquisition, before anything is created:
    // the first case. From then on, a call's first read is the look after its entry was
    // created.)
    for (call, nth, fault) in [
        (Call::Enqueue, 1, Fault::HangBefore),
        (Call::Enqueue, 1, Fault::HangAfter),
        (Call::Ahead, 1, Fault::HangBefore),
        (Call::Read, 1, Fault::HangBefore),
        (Call::Read, 1, Fault::HangAfter),
        (Call::WaitGone, 1, Fault::HangBefore),
        (Call::WaitValue, 1, Fault::HangBefore),
    ] {
        faulty.inject(call, nth, fault);
        let mut fut = Box::pin(sem.acquire());
        super::drive_until(&mut fut, faulty.until_hung()).await;
        drop(fut);
        faulty.release();
        faulty.clear();
        settle(&b).await;
        assert_eq!(
            rig.keys(&name).await,
            only_holder,
            "after {call:?} {fault:?}"
        );
    }
    let timed_out = tokio::time::timeout(Duration::from_millis(200), sem.acquire()).await;
    assert!(timed_out.is_err());
    settle(&b).await;
    assert_eq!(rig.keys(&name).await, only_holder, "timed out");
    let busy = sem.try_acquire().await;
    assert!(matches!(busy, Err(Error::Locked { .. })), "{busy:?}");
    settle(&b).await;
    assert_eq!(rig.keys(&name).await, only_holder, "try_acquire");
    holder.release().await.unwrap();
    let next = within("next acquire", BOUND, sem.acquire()).await.unwrap();
    next.release().await.unwrap();
    assert!(rig.keys(&name).await.is_empty());
}

/// Bad input to every recipe is a typed error, with nothing created.
pub async fn recipes_bad_input(rig: Rig) {
    let s = rig.session().await;
    let name = rig.name("bad");
    for permits in [0, Semaphore::MAX_PERMITS + 1, u32::MAX] {
        let r = Semaphore::new(&s, &name, permits);
        assert!(
            matches!(r, Err(Error::InvalidArgument(_))),
            "{permits}: {r:?}"
        );
    }
    // One name rule for every recipe.
    for bad in ["", "trailing/"] {
        assert!(matches!(
            Mutex::new(&s, bad),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            Election::new(&s, bad),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            MultiLock::new(&s, ["ok", bad]),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            Semaphore::new(&s, bad, 1),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            RwLock::new(&s, bad),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            Barrier::new(&s, bad),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            DoubleBarrier::new(&s, bad, 2),
            Err(Error::InvalidArgument(_))
        ));
    }
    assert!(matches!(
        DoubleBarrier::new(&s, &name, 0),
        Err(Error::InvalidArgument(_))
    ));
    let none: [&str; 0] = [];
    assert!(matches!(
        MultiLock::new(&s, none),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        MultiLock::new(&s, ["a", ""]),
        Err(Error::InvalidArgument(_))
    ));
    // A limit key that holds something else: refused, nothing created.
    assert!(rig.outside.swap(&name, None, b"lots").await.unwrap());
    let garbage = Semaphore::new(&s, &name, 2).unwrap().acquire().await;
    assert!(
        matches!(garbage, Err(Error::LimitMismatch { .. })),
        "{garbage:?}"
    );
    assert!(rig.keys(&name).await.is_empty());
}

/// Readers share, writers exclude, under contention, and nothing is left behind.
pub async fn rwlock_readers_share_writers_exclude(rig: Rig) {
    let name = rig.name("rw");
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let session = rig.session().await;
        let lock = RwLock::new(&session, &name).unwrap();
        let (readers, writers, most) = (readers.clone(), writers.clone(), most_readers.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..3 {
                if (i + round) % 3 == 0 {
                    let w = lock.write().await.unwrap();
                    assert_eq!(writers.fetch_add(1, Ordering::SeqCst), 0, "two writers");
                    assert_eq!(readers.load(Ordering::SeqCst), 0, "a writer beside readers");
                    assert!(w.is_owner().await.unwrap());
                    writers.fetch_sub(1, Ordering::SeqCst);
                    w.release().await.unwrap();
                } else {
                    let r = lock.read().await.unwrap();
                    let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    assert_eq!(
                        writers.load(Ordering::SeqCst),
                        0,
                        "a reader beside a writer"
                    );
                    assert!(r.is_owner().await.unwrap());
                    readers.fetch_sub(1, Ordering::SeqCst);
                    r.release().await.unwrap();
                }
            }
            drop(session);
        }));
    }
    for t in tasks {
        within("the contenders", Duration::from_secs(120), t)
            .await
            .unwrap();
    }
    assert!(rig.keys(&name).await.is_empty(), "entries left behind");
    // Readers of one session share too.
    let s = rig.session().await;
    let lock = RwLock::new(&s, &name).unwrap();
    let r1 = lock.read().await.unwrap();
    let r2 = within("a second read", BOUND, lock.clone().read())
        .await
        .unwrap();
    assert_ne!(r1.key(), r2.key());
    r1.release().await.unwrap();
    r2.release().await.unwrap();
}

/// FIFO without writer starvation: a reader that comes after a waiting writer waits behind
/// it, and readers ahead of a writer are granted together.
pub async fn rwlock_no_writer_starvation(rig: Rig) {
    let name = rig.name("rw-fifo");
    let s = rig.session().await;
    let first = RwLock::new(&s, &name).unwrap().read().await.unwrap();
    let ws = rig.session().await;
    let writer = spawn_waiting(&rig, &name, 2, {
        let lock = RwLock::new(&ws, &name).unwrap();
        async move { lock.write().await }
    })
    .await;
    let rs = rig.session().await;
    let late_reader = spawn_waiting(&rig, &name, 3, {
        let lock = RwLock::new(&rs, &name).unwrap();
        async move { lock.read().await }
    })
    .await;
    let busy = RwLock::new(&s, &name).unwrap().try_read().await;
    assert!(matches!(busy, Err(Error::Locked { .. })), "{busy:?}");
    first.release().await.unwrap();
    let w = within("the writer", BOUND, writer).await.unwrap().unwrap();
    assert!(
        !late_reader.is_finished(),
        "a reader overtook... or shared with a writer"
    );
    let token = w.fencing_token();
    w.release().await.unwrap();
    let r = within("the late reader", BOUND, late_reader)
        .await
        .unwrap()
        .unwrap();
    assert!(r.fencing_token() > token);
    r.release().await.unwrap();
    assert!(rig.keys(&name).await.is_empty());
}

/// etcd issue 16221: a writer holds, a second writer (or a reader) waits, a third writer
/// waits behind it; the one between gives up (its call is dropped) or its session ends. The
/// third must go on waiting for the first, not take the lock beside it.
pub async fn rwlock_waiter_between_writers_gives_up(rig: Rig) {
    // (is the waiter in between a reader; does it give up rather than expire)
    for (between_is_reader, gives_up) in [(false, false), (true, false), (false, true)] {
        let name = rig.name(&format!("rw-16221-{between_is_reader}-{gives_up}"));
        let a = rig.session().await;
        let first = RwLock::new(&a, &name).unwrap().write().await.unwrap();
        let mid = rig.session_ttl(Duration::from_secs(3)).await;
        let between = spawn_waiting(&rig, &name, 2, {
            let lock = RwLock::new(&mid, &name).unwrap();
            async move {
                if between_is_reader {
                    lock.read().await.map(drop)
                } else {
                    lock.write().await.map(drop)
                }
            }
        })
        .await;
        let (faulty, c) = faulty_session(&rig).await;
        let third = spawn_waiting(&rig, &name, 3, {
            let lock = RwLock::new(&c, &name).unwrap();
            async move { lock.write().await }
        })
        .await;
        // The third writer watches the one in between.
        within(
            "the third writer waits",
            BOUND,
            faulty.until_count(Call::WaitGone, 1),
        )
        .await;
        if gives_up {
            between.abort();
            assert!(between.await.unwrap_err().is_cancelled());
            settle(&mid).await;
        } else {
            rig.outside.revoke_lease(mid.lease_id()).await.unwrap();
            super::assert_lost(
                &within("the waiter in between", BOUND, between)
                    .await
                    .unwrap(),
            );
        }
        // Woken by the departure, the third writer looks again and must wait again (for the
        // first writer), not take the lock beside it.
        waits_again(&faulty, Call::WaitGone, 2, &third).await;
        assert!(first.is_owner().await.unwrap());
        let token = first.fencing_token();
        first.release().await.unwrap();
        let w = within("the third writer", BOUND, third)
            .await
            .unwrap()
            .unwrap();
        assert!(w.fencing_token() > token);
        w.release().await.unwrap();
        assert!(rig.keys(&name).await.is_empty());
    }
}

/// A write asked for through a handle that holds a read is refused (it would deadlock), and
/// creates nothing; a dropped or failed read or write leaves nothing.
pub async fn rwlock_upgrade_refused_and_cancel_leaves_nothing(rig: Rig) {
    let name = rig.name("rw-upgrade");
    let s = rig.session().await;
    let lock = RwLock::new(&s, &name).unwrap();
    let r = lock.read().await.unwrap();
    let upgrade = lock.write().await;
    assert!(matches!(upgrade, Err(Error::Upgrade { .. })), "{upgrade:?}");
    assert_eq!(rig.keys(&name).await, vec![r.key().to_owned()]);

    let (faulty, b) = faulty_session(&rig).await;
    let other = RwLock::new(&b, &name).unwrap();
    let busy = other.try_write().await;
    assert!(matches!(busy, Err(Error::Locked { .. })), "{busy:?}");
    for fault in [Fault::HangBefore, Fault::HangAfter] {
        faulty.inject(Call::Enqueue, 1, fault);
        let mut fut = Box::pin(other.write());
        super::drive_until(&mut fut, faulty.until_hung()).await;
        drop(fut);
        faulty.release();
        settle(&b).await;
        assert_eq!(rig.keys(&name).await, vec![r.key().to_owned()], "{fault:?}");
    }
    let timed_out = tokio::time::timeout(Duration::from_millis(200), other.write()).await;
    assert!(timed_out.is_err());
    settle(&b).await;
    assert_eq!(rig.keys(&name).await, vec![r.key().to_owned()], "timed out");
    drop(r);
    settle(&s).await;
    // The read guard is gone: the same handle may write now.
    let w = within("the write", BOUND, lock.write()).await.unwrap();
    w.release().await.unwrap();
    assert!(rig.keys(&name).await.is_empty());
}

/// A barrier is up while held, `wait()` returns once it is down, and a crashed holder
/// does not keep it up.
pub async fn barrier_holds_and_falls_with_its_holder(rig: Rig) {
    let name = rig.name("barrier");
    let s = rig.session().await;
    let barrier = Barrier::new(&s, &name).unwrap();
    barrier.wait().await.unwrap();
    let hold = barrier.hold().await.unwrap();
    assert!(barrier.is_up().await.unwrap());
    let waiter = tokio::spawn({
        let barrier = barrier.clone();
        async move { barrier.wait().await }
    });
    let (faulty, w) = faulty_session(&rig).await;
    let watcher = Barrier::new(&w, &name).unwrap();
    let watching = tokio::spawn(async move { watcher.wait().await });
    within(
        "the watcher watches",
        BOUND,
        faulty.until_count(Call::WaitGone, 1),
    )
    .await;
    assert!(!waiter.is_finished() && !watching.is_finished());
    hold.release().await.unwrap();
    within("wait() after the release", BOUND, waiter)
        .await
        .unwrap()
        .unwrap();
    within("wait() after the release", BOUND, watching)
        .await
        .unwrap()
        .unwrap();

    // A hold dropped with its create in flight (before or after it was applied) raises
    // nothing.
    let (faulty_h, h) = faulty_session(&rig).await;
    let dropped = Barrier::new(&h, &name).unwrap();
    for fault in [Fault::HangBefore, Fault::HangAfter] {
        faulty_h.inject(Call::Enqueue, 1, fault);
        let mut fut = Box::pin(dropped.hold());
        super::drive_until(&mut fut, faulty_h.until_hung()).await;
        drop(fut);
        faulty_h.release();
        settle(&h).await;
        assert!(
            !barrier.is_up().await.unwrap(),
            "a dropped hold raised the barrier ({fault:?})"
        );
    }

    // Its holder crashes: the barrier comes down when the lease ends.
    let ttl = Duration::from_secs(2);
    let (faulty, crashed) = crashable(&rig, ttl).await;
    let raised = Barrier::new(&crashed, &name).unwrap().hold().await.unwrap();
    crash(&faulty);
    drop(raised);
    within(
        "wait() after the holder crashed",
        ttl + BOUND,
        barrier.wait(),
    )
    .await
    .unwrap();
    assert!(rig.keys(&name).await.is_empty());
}

/// `enter()` returns once all members entered, `leave()` once all left; a member whose
/// session ends stops counting; a timed-out `enter()` leaves nothing.
pub async fn double_barrier_enters_and_leaves_together(rig: Rig) {
    let name = rig.name("double");
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(rig.session().await);
    }
    let barrier = |s: &Session| DoubleBarrier::new(s, &name, 3).unwrap();

    // A member that times out stops counting.
    let timed_out =
        tokio::time::timeout(Duration::from_millis(200), barrier(&sessions[0]).enter()).await;
    assert!(timed_out.is_err());
    settle(&sessions[0]).await;
    assert!(
        rig.keys(&name).await.is_empty(),
        "a timed-out enter left its entry"
    );

    // A member whose session ends stops counting: the others do not proceed on it.
    let doomed = rig.session_ttl(Duration::from_secs(3)).await;
    let lost = spawn_waiting(&rig, &name, 1, {
        let b = barrier(&doomed);
        async move { b.enter().await.map(drop) }
    })
    .await;
    let first = spawn_waiting(&rig, &name, 2, {
        let b = barrier(&sessions[0]);
        async move { b.enter().await }
    })
    .await;
    rig.outside.revoke_lease(doomed.lease_id()).await.unwrap();
    super::assert_lost(&within("the lost member", BOUND, lost).await.unwrap());
    let second = spawn_waiting(&rig, &name, 2, {
        let b = barrier(&sessions[1]);
        async move { b.enter().await }
    })
    .await;
    assert!(!first.is_finished(), "proceeded with a phantom member");
    let third = barrier(&sessions[2]);
    let c = within("the last member", BOUND, third.enter())
        .await
        .unwrap();
    let a = within("the first member", BOUND, first)
        .await
        .unwrap()
        .unwrap();
    let b = within("the second member", BOUND, second)
        .await
        .unwrap()
        .unwrap();

    // Leaving: nobody returns before all have left.
    let leaving_a = tokio::spawn(a.leave());
    let leaving_b = tokio::spawn(b.leave());
    eventually("two have left", || async {
        rig.keys(&name).await.len() == 1
    })
    .await;
    assert!(!leaving_a.is_finished() && !leaving_b.is_finished());
    within("the last leave", BOUND, c.leave()).await.unwrap();
    within("leave", BOUND, leaving_a).await.unwrap().unwrap();
    within("leave", BOUND, leaving_b).await.unwrap().unwrap();
    assert!(rig.keys(&name).await.is_empty());
}

/// MultiLocks over overlapping sets listed in different orders never deadlock; a failure
/// part way releases what was taken; the guard reports any loss.
pub async fn multilock_all_or_nothing(rig: Rig) {
    let (a, b, c) = (rig.name("ml-a"), rig.name("ml-b"), rig.name("ml-c"));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let session = rig.session().await;
        let names = if i % 2 == 0 {
            vec![a.clone(), b.clone()]
        } else {
            vec![b.clone(), a.clone()]
        };
        let lock = MultiLock::new(&session, names).unwrap();
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let guard = lock.lock().await.unwrap();
                let tokens: Vec<_> = guard.fencing_tokens().map(|(n, _)| n.to_owned()).collect();
                assert!(tokens.windows(2).all(|w| w[0] < w[1]), "not in name order");
                guard.release().await.unwrap();
            }
            drop(session);
        }));
    }
    for t in tasks {
        within("no deadlock", Duration::from_secs(120), t)
            .await
            .unwrap();
    }

    // `c` is held elsewhere: a try over {a, c} fails and leaves `a` free.
    let other = rig.session().await;
    let c_guard = Mutex::new(&other, &c).unwrap().lock().await.unwrap();
    let s = rig.session().await;
    let both = MultiLock::new(&s, [c.clone(), a.clone()]).unwrap();
    let busy = both.try_lock().await;
    assert!(matches!(busy, Err(Error::Locked { .. })), "{busy:?}");
    assert!(
        rig.keys(&a).await.is_empty(),
        "a lock was kept after a failure"
    );
    // A dropped lock() (waiting for `c`) releases `a`.
    let timed_out = tokio::time::timeout(Duration::from_millis(200), both.lock()).await;
    assert!(timed_out.is_err());
    settle(&s).await;
    assert!(
        rig.keys(&a).await.is_empty(),
        "a lock was kept after a timeout"
    );
    assert_eq!(rig.keys(&c).await, vec![c_guard.key().to_owned()]);
    c_guard.release().await.unwrap();

    // Any loss is reported.
    let guard = both.lock().await.unwrap();
    let lost = guard.lost();
    assert!(
        rig.outside
            .delete_entry(guard.guards()[1].entry())
            .await
            .unwrap()
    );
    assert_eq!(
        within("lost()", BOUND, lost).await,
        LostReason::EntryDeleted
    );
    let late = guard.release().await;
    assert!(matches!(late, Err(Error::NotOwner { .. })), "{late:?}");
    assert!(rig.keys(&a).await.is_empty() && rig.keys(&c).await.is_empty());
}

/// One name, several kinds of lock (issue #25, 2): an exclusive holder (Mutex, Election, a
/// write lock) excludes every other kind, and the shared kinds (semaphore permits, read
/// locks) exclude each other, whichever came first. A waiter of one kind is granted when
/// the holder of the other leaves. Values that would pass an exclusive entry off as a shared
/// one are refused.
pub async fn one_name_several_kinds_exclude_each_other(rig: Rig) {
    let name = rig.name("kinds");
    let (one, two) = (rig.session().await, rig.session().await);
    let busy = |r: baton::Result<()>, what: &str| {
        assert!(matches!(r, Err(Error::Locked { .. })), "{what}: {r:?}");
    };
    let sem = Semaphore::new(&two, &name, 3).unwrap();
    let rw = RwLock::new(&two, &name).unwrap();

    // A Mutex holder: no permit, no read lock.
    let guard = Mutex::new(&one, &name).unwrap().lock().await.unwrap();
    busy(
        sem.try_acquire().await.map(drop),
        "a permit beside a Mutex holder",
    );
    busy(
        rw.try_read().await.map(drop),
        "a read lock beside a Mutex holder",
    );
    let waiting = spawn_waiting(&rig, &name, 2, acquire_task(&sem)).await;
    guard.release().await.unwrap();
    let permit = within("the permit after the Mutex", BOUND, waiting)
        .await
        .unwrap()
        .unwrap();

    // A permit holder: no Mutex, no read lock, and a Mutex waiter is granted after it.
    busy(
        Mutex::new(&one, &name).unwrap().try_lock().await.map(drop),
        "a Mutex beside a permit",
    );
    busy(rw.try_read().await.map(drop), "a read lock beside a permit");
    let mutex = Mutex::new(&one, &name).unwrap();
    let waiting = spawn_waiting(&rig, &name, 2, async move { mutex.lock().await }).await;
    permit.release().await.unwrap();
    let guard = within("the Mutex after the permit", BOUND, waiting)
        .await
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();

    // A leader: no permit, no read lock; a reader waits for it.
    let leader = baton::Election::new(&one, &name)
        .unwrap()
        .campaign("leader")
        .await
        .unwrap();
    busy(
        sem.try_acquire().await.map(drop),
        "a permit beside a leader",
    );
    busy(rw.try_read().await.map(drop), "a read lock beside a leader");
    let reader = rw.clone();
    let waiting = spawn_waiting(&rig, &name, 2, async move { reader.read().await }).await;
    leader.release().await.unwrap();
    let read = within("the read lock after the leader", BOUND, waiting)
        .await
        .unwrap()
        .unwrap();

    // A reader: no permit, no Mutex.
    let other_sem = Semaphore::new(&one, &name, 3).unwrap();
    busy(
        other_sem.try_acquire().await.map(drop),
        "a permit beside a reader",
    );
    busy(
        Mutex::new(&one, &name).unwrap().try_lock().await.map(drop),
        "a Mutex beside a reader",
    );
    read.release().await.unwrap();
    assert!(rig.outside.entries(&name).await.unwrap().is_empty());

    // An exclusive entry cannot pass for a shared one.
    let refused = Mutex::new(&one, &name)
        .unwrap()
        .with_owner_info("baton-permit:me")
        .try_lock()
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidArgument(_))),
        "{refused:?}"
    );
    let refused = baton::Election::new(&one, &name)
        .unwrap()
        .campaign("baton-read:me")
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidArgument(_))),
        "{refused:?}"
    );
    assert!(rig.outside.entries(&name).await.unwrap().is_empty());
}
