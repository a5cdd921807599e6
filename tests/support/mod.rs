//! The conformance suite: behaviour every backend must show, run by `tests/memory.rs` and
//! `tests/etcd.rs`. Each function takes a [`Rig`] and uses its own lock name.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use baton::testing::{Call, Fault, FaultyBackend};
use baton::{
    Backend, Election, Error, LeaderEvent, LostReason, Mutex, MutexGuard, Session, SessionOptions,
    WriteOp,
};
use futures::StreamExt;
use tokio::time::Instant;

/// What a suite function needs: the backend under test, a second handle to it that acts as
/// "someone else" (another client), and a unique prefix for names.
pub struct Rig {
    pub backend: Arc<dyn Backend>,
    pub outside: Arc<dyn Backend>,
    pub prefix: String,
}

impl Rig {
    pub fn name(&self, test: &str) -> String {
        format!("{}/{test}", self.prefix)
    }

    pub async fn session(&self) -> Session {
        self.session_ttl(SessionOptions::DEFAULT_TTL).await
    }

    pub async fn session_ttl(&self, ttl: Duration) -> Session {
        Session::with_options(
            Arc::clone(&self.backend),
            SessionOptions::new().with_ttl(ttl),
        )
        .await
        .expect("session")
    }

    pub async fn keys(&self, name: &str) -> Vec<String> {
        self.outside
            .entries(name)
            .await
            .expect("entries")
            .into_iter()
            .map(|e| e.key().to_owned())
            .collect()
    }
}

/// A port on 127.0.0.1 nobody listens on (bound and closed again): a connection to it is
/// refused at once.
pub fn refused_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Sends baton's log to the test's captured output (printed only if the test fails), at
/// `RUST_LOG`'s level or, unset, `baton=debug`: a failure seen once in CI then says what the
/// client saw. Installed once per test binary; later calls do nothing.
pub fn capture_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("baton=debug"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// `init_store` on a store baton has never used (`connect` reaches it, with a restart grace)
/// marks it new: a second `init_store` changes nothing, and a session of a fresh client is
/// granted at once, not after the grace.
pub async fn init_marks_a_store_never_used_as_new<B, F, Fut>(connect: F)
where
    B: Backend + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = baton::Result<B>>,
{
    let operator = connect().await.unwrap();
    assert!(
        operator.init_store().await.unwrap(),
        "a store never used is marked new"
    );
    assert!(
        !operator.init_store().await.unwrap(),
        "marked once: nothing changes"
    );
    let fresh: Arc<dyn Backend> = Arc::new(connect().await.unwrap());
    let session = Session::new(fresh).await.unwrap();
    assert_eq!(session.restart_grace(), None);
    let guard = Mutex::new(&session, "first")
        .unwrap()
        .try_lock()
        .await
        .expect("granted at once");
    guard.release().await.unwrap();
}

/// Waits until `cond` holds, re-checking after each short pause; fails the test after 30 s.
/// This waits for a condition to become true, it does not hope that time made it so.
pub async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Starts `session`'s `lock()` on `name` in a task and returns once its key is in the queue,
/// which then holds `queued` keys.
pub async fn spawn_queued(
    observer: &dyn Backend,
    session: &Session,
    name: &str,
    queued: usize,
) -> tokio::task::JoinHandle<baton::Result<MutexGuard>> {
    let waiter = tokio::spawn({
        let mutex = Mutex::new(session, name).unwrap();
        async move { mutex.lock().await }
    });
    eventually("the waiter is queued", || async {
        observer.entries(name).await.unwrap().len() == queued
    })
    .await;
    assert!(!waiter.is_finished(), "the waiter must wait");
    waiter
}

/// A test's hold on the shared etcd's whole history: a test that needs every revision it
/// saw to stay readable (an observer resuming after a broken connection) holds it to read,
/// and `compact_history` takes it to write, so a compaction of a test beside it waits
/// instead of turning that observer's resume into a reported gap (`Skipped`).
#[cfg(feature = "etcd")]
#[allow(dead_code)]
pub static HISTORY: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

#[cfg(feature = "etcd")]
/// Compacts etcd's history up to now (a put moves the store on first), physically, so that
/// every revision a watcher or reader has seen so far is gone.
pub async fn compact_history(client: &baton::etcd_client::Client, filler: &str) {
    let _whole = HISTORY.write().await;
    let mut client = client.clone();
    let rev = client
        .put(filler, "x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let physical = baton::etcd_client::CompactionOptions::new().with_physical();
    client.compact(rev, Some(physical)).await.unwrap();
}

/// A wait ended because its session was lost (or its key vanished with the lease).
pub fn assert_lost<T: std::fmt::Debug>(result: &baton::Result<T>) {
    assert!(
        matches!(
            result,
            Err(Error::SessionLost(_)) | Err(Error::EntryGone { .. })
        ),
        "expected a lost session, got {result:?}"
    );
}

/// Bounds a future that the test expects to finish.
pub async fn within<T>(what: &str, limit: Duration, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {limit:?}"))
}

/// After a request of `gave_up`'s session was delivered late (a proxy held it): `name`'s queue
/// holds nothing of that session, and another session, `next`, takes the lock within 10 s.
/// Returns `next`'s token.
pub async fn late_request_left_nothing<B: Backend>(
    direct: &B,
    name: &str,
    gave_up: &Session,
    next: &Session,
) -> u64 {
    let granted = tokio::time::timeout(
        Duration::from_secs(10),
        Mutex::new(next, name).unwrap().lock(),
    )
    .await;
    let strays: Vec<String> = direct
        .entries(name)
        .await
        .unwrap()
        .iter()
        .filter(|e| e.lease() == Some(gave_up.lease_id()))
        .map(|e| format!("{} (token {})", e.key(), e.token()))
        .collect();
    assert!(
        strays.is_empty(),
        "released, yet the session is in the queue ahead of the next waiter: {strays:?}"
    );
    let guard = granted
        .expect("the lock for another session within 10 s")
        .unwrap();
    let token = guard.fencing_token().get();
    guard.release().await.unwrap();
    token
}

/// An enqueue of `a`'s session on `name`, held up on a connection its client gives up on (the
/// proxy holds what the client sends, then closes the client's side: it reconnects and
/// retries), delivered on that old connection once the lock was granted and released. Then
/// [`late_request_left_nothing`]. Returns `a`'s token, `b`'s, and how many connections
/// delivered something.
pub async fn retried_enqueue_delivered_late<B: Backend>(
    proxy: &baton::testing::Proxy,
    direct: &B,
    a: &Session,
    b: &Session,
    name: &str,
) -> (u64, u64, usize) {
    let mutex = Mutex::new(a, name).unwrap();
    proxy.hold_requests();
    let (first, ()) = tokio::join!(
        within("a lock", Duration::from_secs(20), mutex.lock()),
        async {
            let held = proxy.held_contains(name.as_bytes());
            within("the enqueue held", Duration::from_secs(10), held).await;
            proxy.heal();
        }
    );
    let first = first.unwrap();
    let t1 = first.fencing_token().get();
    first.release().await.unwrap();
    let delivery = proxy.deliver_held_together();
    let delivered = within("delivery", Duration::from_secs(10), delivery)
        .await
        .unwrap();
    let t2 = late_request_left_nothing(direct, name, a, b).await;
    (t1, t2, delivered)
}

/// An enqueue of `a`'s session on `name` that its `lock()` gave up on (the proxy holds it,
/// then cuts the server off until the lock fails), delivered on its old connection once the
/// session locked and released again (its next lock waits for the failed one's cleanup, in
/// process). Then [`late_request_left_nothing`], and `b`'s token is above `a`'s.
pub async fn abandoned_enqueue_delivered_late<B: Backend>(
    proxy: &baton::testing::Proxy,
    direct: &B,
    a: &Session,
    b: &Session,
    name: &str,
) {
    let mutex = Mutex::new(a, name).unwrap();
    // What the client sends after the enqueue (the cancellation, the retries) is lost.
    proxy.hold_requests();
    let (failed, ()) = tokio::join!(mutex.lock(), async {
        let held = proxy.held_contains(name.as_bytes());
        within("the enqueue held", Duration::from_secs(10), held).await;
        proxy.black_hole();
    });
    assert!(failed.is_err(), "granted with the server out of reach");
    proxy.heal();
    let again = within(
        "the lock once the server is back",
        Duration::from_secs(20),
        mutex.lock(),
    )
    .await
    .unwrap();
    let t1 = again.fencing_token().get();
    again.release().await.unwrap();
    assert!(proxy.deliver_held_together().await.unwrap() >= 1);
    let t2 = late_request_left_nothing(direct, name, a, b).await;
    assert!(t2 > t1, "tokens out of grant order: {t1}, {t2}");
}

/// The safety checker every lock-holding test writes through: a register that accepts a
/// token no lower than the highest it has accepted (a fenced resource), records each
/// critical section (token, start, end), and counts overlaps and refused stale writes.
#[derive(Default)]
pub struct FencedRegister {
    state: StdMutex<RegisterState>,
}

/// What the checker saw.
#[derive(Default, Debug, Clone)]
pub struct RegisterState {
    pub highest: u64,
    pub inside: Option<u64>,
    /// Accepted grants, in the order they entered.
    pub accepted: Vec<u64>,
    /// Critical sections: (token, start, end).
    pub sections: Vec<(u64, Instant, Option<Instant>)>,
    pub rejected: usize,
    pub overlaps: usize,
}

impl FencedRegister {
    /// A holder enters its critical section with `token`; `false` if the register refuses it.
    pub fn enter(&self, token: u64) -> bool {
        let mut s = self.state.lock().unwrap();
        if token < s.highest {
            s.rejected += 1;
            return false;
        }
        if s.inside.is_some() {
            s.overlaps += 1;
        }
        s.highest = token;
        s.inside = Some(token);
        s.accepted.push(token);
        s.sections.push((token, Instant::now(), None));
        true
    }

    pub fn exit(&self, token: u64) {
        let mut s = self.state.lock().unwrap();
        if s.inside == Some(token) {
            s.inside = None;
        }
        if let Some(section) = s
            .sections
            .iter_mut()
            .rev()
            .find(|(t, _, end)| *t == token && end.is_none())
        {
            section.2 = Some(Instant::now());
        }
    }

    /// A late write by a holder that may have lost its lock: accepted only if no higher
    /// token was accepted; a refusal is counted.
    pub fn late_write(&self, token: u64) -> bool {
        let mut s = self.state.lock().unwrap();
        if token < s.highest {
            s.rejected += 1;
            false
        } else {
            s.highest = token;
            true
        }
    }

    pub fn snapshot(&self) -> RegisterState {
        self.state.lock().unwrap().clone()
    }

    /// Asserts the safety properties (no overlapping accepted sections, tokens strictly
    /// increasing in grant order, and, if given, grants in the expected FIFO order) and
    /// prints the line `docs/reliability.md` is generated from.
    pub fn assert_safe(&self, scenario: &str, promise: &str, fifo: Option<&[u64]>) {
        let s = self.snapshot();
        let mut sections = s.sections.clone();
        sections.sort_by_key(|(_, start, _)| *start);
        for w in sections.windows(2) {
            let (t0, _, end0) = w[0];
            let (t1, start1, _) = w[1];
            if let Some(end0) = end0 {
                assert!(
                    end0 <= start1,
                    "{scenario}: sections of tokens {t0} and {t1} overlap"
                );
            }
        }
        assert_eq!(s.overlaps, 0, "{scenario}: overlaps");
        assert_strictly_increasing(&s.accepted);
        if let Some(expected) = fifo {
            assert_eq!(
                s.accepted, expected,
                "{scenario}: grants out of queue order"
            );
        }
        println!(
            "RELIABILITY|{scenario}|{promise}|1|{}|{}|{}",
            s.accepted.len(),
            s.rejected,
            s.overlaps
        );
    }
}

pub fn assert_strictly_increasing(tokens: &[u64]) {
    for w in tokens.windows(2) {
        assert!(w[0] < w[1], "tokens not strictly increasing: {tokens:?}");
    }
}

/// 16 contenders, each with its own session, take the lock twice and write through a fenced
/// register: no overlap, no rejected write, tokens strictly increasing in grant order.
pub async fn mutual_exclusion(rig: Rig) {
    let name = rig.name("mutex16");
    let register = Arc::new(FencedRegister::default());
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let session = rig.session().await;
        let (name, register) = (name.clone(), Arc::clone(&register));
        tasks.push(tokio::spawn(async move {
            let mutex = Mutex::new(&session, &name).unwrap();
            for _ in 0..2 {
                let guard = mutex.lock().await.unwrap();
                let token = guard.fencing_token().get();
                assert!(register.enter(token));
                // Real work inside the critical section: a round trip and a yield.
                assert!(guard.is_owner().await.unwrap());
                tokio::task::yield_now().await;
                register.exit(token);
                guard.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let s = register.snapshot();
    assert_eq!(s.overlaps, 0);
    assert_eq!(s.rejected, 0);
    assert_eq!(s.accepted.len(), 32);
    assert_strictly_increasing(&s.accepted);
    assert!(rig.keys(&name).await.is_empty(), "keys left behind");
}

/// Contenders that enter the queue one after another are granted in that order, with
/// strictly increasing tokens.
pub async fn fifo_order(rig: Rig) {
    let name = rig.name("fifo");
    let holder_session = rig.session().await;
    let holder = Mutex::new(&holder_session, &name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut sessions = Vec::new();
    for i in 0..6 {
        let session = rig.session().await;
        sessions.push(session.clone());
        let (tx, lock_name) = (tx.clone(), name.clone());
        tokio::spawn(async move {
            let guard = Mutex::new(&session, &lock_name)
                .unwrap()
                .lock()
                .await
                .unwrap();
            tx.send((i, guard.fencing_token().get())).unwrap();
            guard.release().await.unwrap();
        });
        eventually("the contender is queued", || async {
            rig.keys(&name).await.len() == i + 2
        })
        .await;
    }
    let queued = rig.outside.entries(&name).await.unwrap();
    holder.release().await.unwrap();
    let mut granted = Vec::new();
    for _ in 0..6 {
        granted.push(
            within("a grant", Duration::from_secs(30), rx.recv())
                .await
                .unwrap(),
        );
    }
    let order: Vec<usize> = granted.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        order,
        (0..6).collect::<Vec<_>>(),
        "grant order is queue order"
    );
    let tokens: Vec<u64> = granted.iter().map(|(_, t)| *t).collect();
    assert_strictly_increasing(&tokens);
    let queue_tokens: Vec<u64> = queued[1..].iter().map(|e| e.token().get()).collect();
    assert_eq!(tokens, queue_tokens, "token order is queue order");
}

/// `try_lock` succeeds on a free lock, fails with `Locked` on a held one and leaves no key.
pub async fn try_lock_leaves_nothing(rig: Rig) {
    let name = rig.name("try");
    let a = rig.session().await;
    let b = rig.session().await;
    let guard = Mutex::new(&a, &name).unwrap().try_lock().await.unwrap();
    let holder_key = guard.key().to_owned();

    let busy = Mutex::new(&b, &name).unwrap().try_lock().await;
    assert!(matches!(busy, Err(Error::Locked { .. })), "{busy:?}");
    assert_eq!(rig.keys(&name).await, vec![holder_key.clone()]);

    // Another task of the same process on the same session: refused locally.
    let same = Mutex::new(&a, &name).unwrap().try_lock().await;
    assert!(matches!(same, Err(Error::Locked { .. })), "{same:?}");
    assert_eq!(rig.keys(&name).await, vec![holder_key]);

    guard.release().await.unwrap();
    let again = Mutex::new(&b, &name).unwrap().try_lock().await.unwrap();
    again.release().await.unwrap();
    assert!(rig.keys(&name).await.is_empty());
}

/// Waits until `session`'s cleanups are done; fails the test if they never are.
pub async fn settle(session: &Session) {
    within(
        "the cleanups to finish",
        Duration::from_secs(120),
        session.settled(),
    )
    .await;
}

/// A session on a fault-injecting decorator over the rig's backend.
pub async fn faulty_session(rig: &Rig) -> (Arc<FaultyBackend>, Session) {
    let faulty = FaultyBackend::wrap(Arc::clone(&rig.backend));
    let session = session_on(faulty.clone(), SessionOptions::DEFAULT_TTL).await;
    (faulty, session)
}

pub mod epochs;
pub mod fences;
pub mod harness;
pub mod proxy;
pub mod recipes;
#[allow(unused_imports)]
pub use recipes::*;

/// Polls `fut` until `event` happens; fails the test if `fut` finishes first.
pub async fn drive_until<F: Future + Unpin>(fut: &mut F, event: impl Future<Output = ()>)
where
    F::Output: std::fmt::Debug,
{
    tokio::select! {
        out = fut => panic!("finished before the awaited point: {out:?}"),
        () = within("the awaited point", Duration::from_secs(30), event) => {}
    }
}

/// Dropping `lock()` futures at each await point (the create in flight, before and after the
/// server applied it; queued and watching; in the in-process queue; a timeout) leaves no key.
/// Checked once the dropped call's cleanup has finished (`Session::settled`), while its
/// session still lives, so that neither a lease expiry nor a later acquisition can hide a
/// leaked key. Later locks by the same sessions get new keys with higher tokens.
pub async fn dropped_lock_leaves_nothing(rig: Rig) {
    let name = rig.name("cancel");
    let (faulty_a, a) = faulty_session(&rig).await;
    let (faulty_b, b) = faulty_session(&rig).await;
    let guard = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let only_holder = vec![guard.key().to_owned()];
    let mut last_token = guard.fencing_token();
    let mutex_b = Mutex::new(&b, &name).unwrap();

    // The create in flight, not yet applied, then applied with the answer not yet back.
    for fault in [Fault::HangBefore, Fault::HangAfter] {
        faulty_b.inject(Call::Enqueue, 1, fault);
        let mut fut = Box::pin(mutex_b.lock());
        drive_until(&mut fut, faulty_b.until_hung()).await;
        drop(fut);
        faulty_b.release();
        settle(&b).await;
        assert_eq!(rig.keys(&name).await, only_holder, "after {fault:?}");
    }

    // Queued, waiting for the holder's key to go.
    let waits = faulty_b.count(Call::WaitGone);
    let mut fut = Box::pin(mutex_b.lock());
    drive_until(&mut fut, faulty_b.until_count(Call::WaitGone, waits + 1)).await;
    drop(fut);
    settle(&b).await;
    assert_eq!(rig.keys(&name).await, only_holder, "dropped while queued");

    // Waiting in the in-process queue (same session as the holder): it never reached the
    // backend.
    let creates = faulty_a.count(Call::Enqueue);
    let mutex_a = Mutex::new(&a, &name).unwrap();
    let mut fut = Box::pin(mutex_a.lock());
    assert!(futures::poll!(&mut fut).is_pending());
    drop(fut);
    assert_eq!(faulty_a.count(Call::Enqueue), creates);

    // A timeout is a drop too.
    let timed_out = tokio::time::timeout(Duration::from_millis(200), mutex_b.lock()).await;
    assert!(timed_out.is_err());
    settle(&b).await;
    assert_eq!(rig.keys(&name).await, only_holder, "timed out");

    // Nothing is wedged, and no one adopts an old key: fresh keys, higher tokens.
    guard.release().await.unwrap();
    for mutex in [&mutex_b, &mutex_a] {
        let next = within("next lock", Duration::from_secs(10), mutex.lock())
            .await
            .unwrap();
        assert!(next.fencing_token() > last_token);
        last_token = next.fencing_token();
        next.release().await.unwrap();
    }
    assert!(rig.keys(&name).await.is_empty());
}

/// A `lock()` whose create was applied but whose answer was lost fails, and leaves no key:
/// its cleanup looks for the key and deletes it. Nobody waits behind a key no one holds.
pub async fn failed_lock_leaves_nothing(rig: Rig) {
    let name = rig.name("failed-lock");
    let (faulty, a) = faulty_session(&rig).await;
    faulty.inject(Call::Enqueue, 1, Fault::FailAfter);
    let failed = Mutex::new(&a, &name).unwrap().lock().await;
    assert!(failed.is_err(), "{failed:?}");
    settle(&a).await;
    assert!(
        rig.keys(&name).await.is_empty(),
        "the applied create was cleaned up"
    );
    // And the same for a campaign, whose key the same cleanup removes.
    faulty.inject(Call::Enqueue, 1, Fault::FailAfter);
    let failed = Election::new(&a, &name).unwrap().campaign("x").await;
    assert!(failed.is_err(), "{failed:?}");
    settle(&a).await;
    assert!(rig.keys(&name).await.is_empty());
    let other = rig.session().await;
    let guard = within(
        "another session's lock",
        Duration::from_secs(10),
        Mutex::new(&other, &name).unwrap().lock(),
    )
    .await
    .unwrap();
    guard.release().await.unwrap();
}

/// A release that fails, and whose background retries fail too for a while, keeps the
/// in-process slot: the next task of the same session waits (it never reaches the backend)
/// until the delete is confirmed, then gets a new key with a higher token. Never two grants
/// with one token.
pub async fn failed_release_never_hands_out_the_token_again(rig: Rig) {
    let name = rig.name("failed-release");
    let (faulty, a) = faulty_session(&rig).await;
    let mutex = Mutex::new(&a, &name).unwrap();
    let first = mutex.lock().await.unwrap();
    let first_token = first.fencing_token();
    faulty.inject_every(Call::DeleteEntry, Fault::FailBefore);
    let failed = first.release().await;
    assert!(failed.is_err(), "{failed:?}");
    let creates = faulty.count(Call::Enqueue);
    let deletes = faulty.count(Call::DeleteEntry);
    let mut second = Box::pin(mutex.lock());
    // The cleanup retries (with backoff) while the second task waits in process.
    drive_until(
        &mut second,
        faulty.until_count(Call::DeleteEntry, deletes + 3),
    )
    .await;
    assert_eq!(
        faulty.count(Call::Enqueue),
        creates,
        "the second task must wait"
    );
    faulty.clear();
    let second = within("the second grant", Duration::from_secs(10), second)
        .await
        .unwrap();
    assert!(
        second.fencing_token() > first_token,
        "token {} granted twice",
        first_token
    );
    assert_eq!(rig.keys(&name).await, [second.key().to_owned()]);
    second.release().await.unwrap();
}

/// A key deleted from outside (an operator) ends the hold as session loss does: `lost()`
/// resolves with `EntryDeleted`, and `unlock()` reports that the lock had been lost.
pub async fn deleted_key_is_reported_to_the_holder(rig: Rig) {
    let name = rig.name("deleted-key");
    let a = rig.session().await;
    let guard = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let lost = guard.lost();
    assert!(rig.outside.delete_entry(guard.entry()).await.unwrap());
    let reason = within(
        "lost() after the key was deleted",
        Duration::from_secs(10),
        lost,
    )
    .await;
    assert_eq!(reason, LostReason::EntryDeleted);
    assert!(!a.is_lost(), "the session lives on");
    let unlocked = guard.release().await;
    assert!(
        matches!(unlocked, Err(Error::NotOwner { .. })),
        "{unlocked:?}"
    );

    // The same for a leadership, whose resign says so too.
    let leadership = Election::new(&a, &name)
        .unwrap()
        .campaign("v")
        .await
        .unwrap();
    let entry = rig.outside.head(&name).await.unwrap().unwrap();
    assert!(rig.outside.delete_entry(&entry).await.unwrap());
    let reason = within("lost()", Duration::from_secs(10), leadership.lost()).await;
    assert_eq!(reason, LostReason::EntryDeleted);
    let resigned = leadership.release().await;
    assert!(
        matches!(resigned, Err(Error::NotOwner { .. })),
        "{resigned:?}"
    );
}

/// An observer reports only heads that existed: a lease revoke that removes several entries
/// is one change (the heads between them never existed), and an entry whose lease expired is
/// never reported as the head, even before anyone removed it. `meddle(round, lease)` runs
/// after the revoke, before the observer reads on: a backend's test may end the expired
/// `lease` there behind the observer's back.
pub async fn observers_report_only_heads_that_existed<F, Fut>(
    backend: &dyn Backend,
    name: &str,
    rounds: u32,
    meddle: F,
) where
    F: Fn(u32, baton::LeaseId) -> Fut,
    Fut: Future<Output = ()>,
{
    let long = Duration::from_secs(60);
    for round in 0..rounds {
        let queue = format!("{name}-{round}");
        let first = backend.grant_lease(long).await.unwrap().id();
        let short = backend
            .grant_lease(Duration::from_millis(300))
            .await
            .unwrap()
            .id();
        let last = backend.grant_lease(long).await.unwrap().id();
        // The first lease holds two entries (one under a nested name), the short one is
        // never renewed, the last one stays.
        let head = backend.enqueue(&queue, "a", first, b"").await.unwrap();
        backend
            .enqueue(&format!("{queue}/sub"), "b", first, b"")
            .await
            .unwrap();
        backend.enqueue(&queue, "dead", short, b"").await.unwrap();
        let stays = backend.enqueue(&queue, "z", last, b"").await.unwrap();
        let mut events = backend.observe_head(&queue);
        let event = within("the first head", Duration::from_secs(10), events.next()).await;
        assert_eq!(
            event.unwrap().unwrap(),
            baton::HeadEvent::Head(Some(head.entry().clone()))
        );
        eventually("the short lease expires", || async {
            backend.lease_ttl(short).await.unwrap().is_none()
        })
        .await;
        backend.revoke_lease(first).await.unwrap();
        meddle(round, short).await;
        let event = within("the next head", Duration::from_secs(10), events.next()).await;
        assert_eq!(
            event.unwrap().unwrap(),
            baton::HeadEvent::Head(Some(stays.entry().clone())),
            "round {round}: the next head that existed"
        );
        backend.revoke_lease(last).await.unwrap();
    }
}

/// A release is not a loss: a `lost()` future taken before `unlock()`, `resign()` or a
/// permit's `release()` does not resolve because our own release deleted the entry (on
/// ZooKeeper the watch on our own node fired during the delete, before it answered); it
/// resolves only when the session ends, with `Closed`.
pub async fn a_release_is_not_a_loss(rig: Rig) {
    let name = rig.name("release-not-loss");
    let a = rig.session().await;
    let guard = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let after_unlock = tokio::spawn(guard.lost());
    guard.release().await.unwrap();
    let leadership = Election::new(&a, format!("{name}-e"))
        .unwrap()
        .campaign("v")
        .await
        .unwrap();
    let after_resign = tokio::spawn(leadership.lost());
    leadership.release().await.unwrap();
    let permit = baton::Semaphore::new(&a, format!("{name}-s"), 2)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let after_release = tokio::spawn(permit.lost());
    permit.release().await.unwrap();
    // Each deletion has been seen from outside; the watches on them fired long ago.
    let last = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    assert_eq!(rig.outside.entries(&name).await.unwrap().len(), 1);
    last.release().await.unwrap();
    a.close().await.unwrap();
    for (what, lost) in [
        ("unlock", after_unlock),
        ("resign", after_resign),
        ("release", after_release),
    ] {
        let reason = within(what, Duration::from_secs(10), lost).await.unwrap();
        assert_eq!(reason, LostReason::Closed, "lost() after {what}");
    }
}

/// Revoking the holder's lease from outside fires its `lost()`, refuses its guarded writes,
/// and lets the next waiter acquire.
pub async fn revoked_holder_is_told(rig: Rig) {
    let name = rig.name("revoked");
    let ttl = Duration::from_secs(3);
    let a = rig.session_ttl(ttl).await;
    let b = rig.session().await;
    let guard = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let data_key = rig.name("revoked-data");
    guard
        .write(&[WriteOp::put(&data_key, "first")])
        .await
        .unwrap();

    let waiter = spawn_queued(&*rig.outside, &b, &name, 2).await;

    rig.outside.revoke_lease(a.lease_id()).await.unwrap();
    // The session learns it at its next renewal: within one keep-alive period (TTL/3).
    let reason = within("lost()", ttl, guard.lost()).await;
    assert_eq!(reason, LostReason::Revoked);
    let late = guard.write(&[WriteOp::put(&data_key, "late")]).await;
    assert!(matches!(late, Err(Error::NotOwner { .. })), "{late:?}");
    assert_eq!(
        rig.outside.read(&data_key).await.unwrap().as_deref(),
        Some(&b"first"[..])
    );

    let next = within("successor", Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > guard.fencing_token());
    next.release().await.unwrap();
    let late_unlock = guard.release().await;
    assert!(
        matches!(late_unlock, Err(Error::NotOwner { .. })),
        "an unlock after the loss must say so: {late_unlock:?}"
    );
}

/// A holder that stops renewing (a crash) is followed by its successor within TTL + margin.
pub async fn crashed_holder_is_followed(rig: Rig) {
    let name = rig.name("crash");
    let ttl = Duration::from_secs(2);
    // The "crashed" holder: a lease nobody renews and a key in the recipe's layout.
    let lease = rig.outside.grant_lease(ttl).await.unwrap();
    let crashed = rig
        .outside
        .enqueue(&name, &lease.id().to_hex(), lease.id(), b"crashed")
        .await
        .unwrap();
    assert!(crashed.is_head());

    let b = rig.session().await;
    let started = Instant::now();
    let guard = within(
        "successor of a crashed holder",
        lease.ttl() + Duration::from_secs(3),
        Mutex::new(&b, &name).unwrap().lock(),
    )
    .await
    .unwrap();
    assert!(started.elapsed() <= lease.ttl() + Duration::from_secs(3));
    assert!(guard.fencing_token() > crashed.entry().token());
    guard.release().await.unwrap();
}

/// An old guard's late unlock must not delete a newer incarnation of the same key.
pub async fn late_unlock_spares_successor(rig: Rig) {
    let name = rig.name("late-unlock");
    let a = rig.session().await;
    let guard = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    // The key vanishes and is created again (as by another process using the same lease).
    assert!(rig.outside.delete_entry(guard.entry()).await.unwrap());
    let newer = rig
        .outside
        .enqueue(&name, &a.lease_id().to_hex(), a.lease_id(), b"newer")
        .await
        .unwrap();
    assert!(newer.entry().token() > guard.fencing_token());

    // The old guard's key is gone: its unlock says so, and deletes nothing.
    let late = guard.release().await;
    assert!(matches!(late, Err(Error::NotOwner { .. })), "{late:?}");
    let left = rig.outside.entries(&name).await.unwrap();
    assert_eq!(
        left,
        vec![newer.entry().clone()],
        "the newer key must survive"
    );
    assert!(rig.outside.delete_entry(newer.entry()).await.unwrap());
}

/// A waiter whose session is lost gets an error, never the lock, and leaves no key.
pub async fn lost_waiter_gets_error(rig: Rig) {
    let name = rig.name("lost-waiter");
    let a = rig.session().await;
    let b = rig.session_ttl(Duration::from_secs(3)).await;
    let guard = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let waiter = spawn_queued(&*rig.outside, &b, &name, 2).await;
    rig.outside.revoke_lease(b.lease_id()).await.unwrap();
    let result = within("the waiter's error", Duration::from_secs(10), waiter)
        .await
        .unwrap();
    assert_lost(&result);
    assert_eq!(rig.keys(&name).await, vec![guard.key().to_owned()]);
    guard.release().await.unwrap();
}

/// Two tasks sharing one session and one name queue in process: the second never reaches
/// the backend while the first holds (it would map to the same key), and gets a newer token.
pub async fn local_tasks_never_share_a_key(rig: Rig) {
    let name = rig.name("local");
    let (faulty, s) = faulty_session(&rig).await;
    let mutex = Mutex::new(&s, &name).unwrap();
    let first = mutex.lock().await.unwrap();
    let first_token = first.fencing_token();
    let creates = faulty.count(Call::Enqueue);
    let mut second = Box::pin(mutex.lock());
    for _ in 0..3 {
        assert!(futures::poll!(&mut second).is_pending());
        tokio::task::yield_now().await;
    }
    assert_eq!(
        faulty.count(Call::Enqueue),
        creates,
        "the second task must wait in process"
    );
    assert_eq!(rig.keys(&name).await, [first.key().to_owned()]);
    first.release().await.unwrap();
    let second = within("second local task", Duration::from_secs(10), second)
        .await
        .unwrap();
    assert!(second.fencing_token() > first_token);
    second.release().await.unwrap();
}

/// Guarded writes apply while the lock is held and are refused once it is released.
pub async fn guarded_writes(rig: Rig) {
    let name = rig.name("guarded");
    let data = rig.name("guarded-data");
    let s = rig.session().await;
    let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    guard.write(&[WriteOp::put(&data, "v1")]).await.unwrap();
    assert_eq!(
        rig.outside.read(&data).await.unwrap().as_deref(),
        Some(&b"v1"[..])
    );
    let entry = guard.entry().clone();
    guard.release().await.unwrap();
    // The released entry no longer guards anything.
    assert!(
        !rig.outside
            .guarded(&entry, &[WriteOp::delete(&data)])
            .await
            .unwrap()
    );
    assert_eq!(
        rig.outside.read(&data).await.unwrap().as_deref(),
        Some(&b"v1"[..])
    );
}

/// Bad input is refused before anything is created.
pub async fn bad_input(rig: Rig) {
    let s = rig.session().await;
    assert!(matches!(Mutex::new(&s, ""), Err(Error::InvalidArgument(_))));
    let zero = Session::with_options(
        Arc::clone(&rig.backend),
        SessionOptions::new().with_ttl(Duration::ZERO),
    )
    .await;
    assert!(matches!(zero, Err(Error::InvalidArgument(_))), "{zero:?}");
}

/// `close()` revokes the lease: keys vanish and `lost()` reports `Closed`.
pub async fn close_releases_everything(rig: Rig) {
    let name = rig.name("close");
    let s = rig.session().await;
    let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    s.close().await.unwrap();
    assert_eq!(guard.lost().await, LostReason::Closed);
    assert!(rig.keys(&name).await.is_empty());
    let after = Mutex::new(&s, &name).unwrap().lock().await;
    assert!(
        matches!(after, Err(Error::SessionLost(LostReason::Closed))),
        "{after:?}"
    );
}

/// Dropping every handle of a session revokes its lease in the background.
pub async fn dropped_session_revokes(rig: Rig) {
    let name = rig.name("drop-session");
    let s = rig.session().await;
    let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    drop(s);
    // The guard still holds a handle: nothing happens yet.
    assert_eq!(rig.keys(&name).await.len(), 1);
    drop(guard);
    eventually("the dropped session's key vanishes", || async {
        rig.keys(&name).await.is_empty()
    })
    .await;
}

/// Dropping a guard releases the lock in the background: the next waiter acquires.
pub async fn dropped_guard_releases(rig: Rig) {
    let name = rig.name("drop-guard");
    let a = rig.session().await;
    let b = rig.session().await;
    let guard = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let waiter = spawn_queued(&*rig.outside, &b, &name, 2).await;
    drop(guard);
    let next = within(
        "the waiter after a dropped guard",
        Duration::from_secs(10),
        waiter,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(rig.keys(&name).await, vec![next.key().to_owned()]);
    next.release().await.unwrap();
}

/// A session on `backend` with `ttl`.
pub async fn session_on(backend: Arc<dyn Backend>, ttl: Duration) -> Session {
    Session::with_options(backend, SessionOptions::new().with_ttl(ttl))
        .await
        .expect("session")
}

/// Reads the next event of an observer, failing the test if none comes.
pub async fn next_event(
    events: &mut futures::stream::BoxStream<'static, baton::Result<LeaderEvent>>,
) -> LeaderEvent {
    within("a leader event", Duration::from_secs(20), events.next())
        .await
        .expect("the observer stream does not end")
        .expect("no backend error")
}

fn elected_value(event: &LeaderEvent) -> Vec<u8> {
    match event {
        LeaderEvent::Elected(l) => l.value().to_vec(),
        other => panic!("expected a new leader, got {other:?}"),
    }
}

/// Campaigners lead one at a time, in campaign order, with increasing tokens; the observer
/// reports every leader in turn and the final vacancy.
pub async fn election_fifo_succession(rig: Rig) {
    let name = rig.name("elect-fifo");
    let observer_session = rig.session().await;
    let election = Election::new(&observer_session, &name).unwrap();
    let mut events = election.observe();
    assert_eq!(next_event(&mut events).await, LeaderEvent::Vacant);

    let first = rig.session().await;
    let mut leader = Election::new(&first, &name)
        .unwrap()
        .campaign("c0")
        .await
        .unwrap();
    let mut waiting = Vec::new();
    for i in 1..4 {
        let s = rig.session().await;
        let e = Election::new(&s, &name).unwrap();
        waiting.push(tokio::spawn(async move {
            let l = e.campaign(format!("c{i}")).await.unwrap();
            (s, l)
        }));
        eventually("the campaigner is queued", || async {
            rig.keys(&name).await.len() == i + 1
        })
        .await;
    }
    assert_eq!(elected_value(&next_event(&mut events).await), b"c0");
    let mut tokens = vec![leader.fencing_token().get()];
    for (i, next) in waiting.into_iter().enumerate() {
        let current = election.leader().await.unwrap().expect("someone leads");
        assert_eq!(current.key(), leader.key(), "exactly the one leader");
        leader.release().await.unwrap();
        let (_s, next) = within("succession", Duration::from_secs(10), next)
            .await
            .unwrap();
        assert_eq!(next.value(), format!("c{}", i + 1).as_bytes());
        assert_eq!(
            elected_value(&next_event(&mut events).await),
            format!("c{}", i + 1).as_bytes()
        );
        tokens.push(next.fencing_token().get());
        leader = next;
    }
    assert_strictly_increasing(&tokens);
    leader.release().await.unwrap();
    assert_eq!(next_event(&mut events).await, LeaderEvent::Vacant);
    assert!(election.leader().await.unwrap().is_none());
}

/// A leader that dies (stops renewing) is followed by the next campaigner within its TTL.
pub async fn election_dead_leader_is_followed(rig: Rig) {
    let name = rig.name("elect-dead");
    let ttl = Duration::from_secs(2);
    let lease = rig.outside.grant_lease(ttl).await.unwrap();
    rig.outside
        .enqueue(&name, &lease.id().to_hex(), lease.id(), b"dead")
        .await
        .unwrap();
    let s = rig.session().await;
    let election = Election::new(&s, &name).unwrap();
    let mut events = election.observe();
    assert_eq!(elected_value(&next_event(&mut events).await), b"dead");
    let next = within(
        "the successor of a dead leader",
        lease.ttl() + Duration::from_secs(3),
        election.campaign("alive"),
    )
    .await
    .unwrap();
    assert_eq!(elected_value(&next_event(&mut events).await), b"alive");
    next.release().await.unwrap();
}

/// Proclaim updates the value while leading; after the session is lost it is refused.
pub async fn election_proclaim_and_loss(rig: Rig) {
    let name = rig.name("elect-proclaim");
    let s = rig.session_ttl(Duration::from_secs(3)).await;
    let election = Election::new(&s, &name).unwrap();
    let mut events = election.observe();
    assert_eq!(next_event(&mut events).await, LeaderEvent::Vacant);
    let mut leadership = election.campaign("v1").await.unwrap();
    assert_eq!(elected_value(&next_event(&mut events).await), b"v1");
    leadership.proclaim("v2").await.unwrap();
    match next_event(&mut events).await {
        LeaderEvent::Proclaimed(l) => assert_eq!(l.value(), b"v2"),
        other => panic!("expected a proclamation, got {other:?}"),
    }
    assert_eq!(election.leader().await.unwrap().unwrap().value(), b"v2");

    rig.outside.revoke_lease(s.lease_id()).await.unwrap();
    assert_eq!(next_event(&mut events).await, LeaderEvent::Vacant);
    within("lost()", Duration::from_secs(3), leadership.lost()).await;
    let refused = leadership.proclaim("v3").await;
    assert!(
        matches!(refused, Err(Error::NotOwner { .. })),
        "{refused:?}"
    );
    assert!(election.leader().await.unwrap().is_none());
}

/// A campaigner whose session is lost while waiting gets an error, never leadership.
pub async fn election_lost_campaigner_gets_error(rig: Rig) {
    let name = rig.name("elect-lost");
    let a = rig.session().await;
    let leader = Election::new(&a, &name)
        .unwrap()
        .campaign("a")
        .await
        .unwrap();
    let b = rig.session_ttl(Duration::from_secs(3)).await;
    let campaign = tokio::spawn({
        let e = Election::new(&b, &name).unwrap();
        async move { e.campaign("b").await }
    });
    eventually("the campaigner is queued", || async {
        rig.keys(&name).await.len() == 2
    })
    .await;
    rig.outside.revoke_lease(b.lease_id()).await.unwrap();
    let result = within("the campaigner's error", Duration::from_secs(10), campaign)
        .await
        .unwrap();
    assert_lost(&result);
    leader.release().await.unwrap();
    assert!(rig.keys(&name).await.is_empty());
}

/// `run_while_leader` resigns after the work; when leadership is lost it cancels the work
/// and returns `LeadershipLost`.
pub async fn election_run_while_leader(rig: Rig) {
    let name = rig.name("elect-run");
    let s = rig.session().await;
    let election = Election::new(&s, &name).unwrap();
    let out = election
        .run_while_leader("job", |token| async move { token.get() })
        .await
        .unwrap();
    assert!(out > 0);
    assert!(rig.keys(&name).await.is_empty(), "resigned after the work");

    // The work never finishes on its own; leadership is taken away from outside.
    struct DropFlag(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let run = tokio::spawn({
        let (election, flag) = (election.clone(), DropFlag(Arc::clone(&dropped)));
        async move {
            election
                .run_while_leader("job", |_| async move {
                    let _flag = flag;
                    std::future::pending::<()>().await
                })
                .await
        }
    });
    eventually("leading", || async { rig.keys(&name).await.len() == 1 }).await;
    let entry = rig.outside.entries(&name).await.unwrap().remove(0);
    assert!(rig.outside.delete_entry(&entry).await.unwrap());
    let result = within("the work is cancelled", Duration::from_secs(10), run)
        .await
        .unwrap();
    assert!(
        matches!(result, Err(Error::LeadershipLost { .. })),
        "{result:?}"
    );
    assert!(
        dropped.load(std::sync::atomic::Ordering::SeqCst),
        "the work future was dropped"
    );
}

/// A dropped `campaign()` leaves no key; a dropped leadership resigns in the background.
pub async fn election_drops_clean_up(rig: Rig) {
    let name = rig.name("elect-drop");
    let a = rig.session().await;
    let b = rig.session().await;
    let leadership = Election::new(&a, &name)
        .unwrap()
        .campaign("a")
        .await
        .unwrap();
    let leader_key = leadership.key().to_owned();
    let timed_out = tokio::time::timeout(
        Duration::from_millis(200),
        Election::new(&b, &name).unwrap().campaign("b"),
    )
    .await;
    assert!(timed_out.is_err());
    eventually("the abandoned candidacy is removed", || async {
        rig.keys(&name).await == vec![leader_key.clone()]
    })
    .await;
    drop(leadership);
    eventually("the dropped leadership is resigned", || async {
        rig.keys(&name).await.is_empty()
    })
    .await;
}

/// `run_while_leader` returns the work's result when the check after the work and the
/// resignation fail: the check is retried until it is answered, the resignation goes on in
/// the background. A resignation applied but unanswered is not taken for a loss either.
pub async fn election_run_while_leader_survives_a_failed_resign(rig: Rig) {
    let name = rig.name("elect-resign-fails");
    let (faulty, s) = faulty_session(&rig).await;
    let election = Election::new(&s, &name).unwrap();
    for fault in [Fault::FailBefore, Fault::FailAfter] {
        let out = election
            .run_while_leader("job", |_| {
                faulty.inject(Call::Guarded, 1, Fault::FailBefore);
                faulty.inject(Call::Guarded, 2, Fault::FailBefore);
                faulty.inject(Call::DeleteEntry, 1, fault);
                async { 42 }
            })
            .await;
        assert!(matches!(out, Ok(42)), "{fault:?}: {out:?}");
        settle(&s).await;
        assert!(rig.keys(&name).await.is_empty(), "resigned");
    }
}

/// `run_while_leader` does not report success for work that finished after another
/// campaigner had been elected: its resignation found its key gone.
pub async fn election_run_while_leader_reports_a_loss_during_the_work(rig: Rig) {
    let name = rig.name("elect-lost-during-work");
    let s = rig.session().await;
    let other = rig.session().await;
    let election = Election::new(&s, &name).unwrap();
    let outside = Arc::clone(&rig.outside);
    let (name2, other2) = (name.clone(), other.clone());
    let out = election
        .run_while_leader("job", |_| async move {
            // All before the work yields to the watch on our key: our key is deleted from
            // outside and another campaigner is elected.
            let mine = outside.head(&name2).await.unwrap().unwrap();
            assert!(outside.delete_entry(&mine).await.unwrap());
            let newer = Election::new(&other2, &name2)
                .unwrap()
                .campaign("other")
                .await
                .unwrap();
            std::mem::forget(newer);
            42
        })
        .await;
    assert!(matches!(out, Err(Error::LeadershipLost { .. })), "{out:?}");
    other.close().await.unwrap();
}

/// Errors while watching our own key are not a loss: the work runs to its end.
pub async fn election_run_while_leader_outlasts_watch_errors(rig: Rig) {
    let name = rig.name("elect-watch-errors");
    let (faulty, s) = faulty_session(&rig).await;
    let election = Election::new(&s, &name).unwrap();
    faulty.inject_every(Call::WaitGone, Fault::FailBefore);
    let faulty2 = Arc::clone(&faulty);
    let out = election
        .run_while_leader("job", |_| async move {
            // Let the watch on our key fail a few times (it retries with backoff).
            faulty2.until_count(Call::WaitGone, 3).await;
            42
        })
        .await;
    assert!(matches!(out, Ok(42)), "{out:?}");
    faulty.clear();
}

/// After a failed resignation, a new campaign on the same session waits for the cleanup and
/// then creates a new key: its own value, a higher token, never the old leadership.
pub async fn election_campaign_after_a_failed_resign_is_new(rig: Rig) {
    let name = rig.name("elect-fresh");
    let (faulty, s) = faulty_session(&rig).await;
    let election = Election::new(&s, &name).unwrap();
    let old = election.campaign("old").await.unwrap();
    let old_token = old.fencing_token();
    faulty.inject_every(Call::DeleteEntry, Fault::FailBefore);
    assert!(old.release().await.is_err());
    let creates = faulty.count(Call::Enqueue);
    let deletes = faulty.count(Call::DeleteEntry);
    let mut campaign = Box::pin(election.campaign("new"));
    drive_until(
        &mut campaign,
        faulty.until_count(Call::DeleteEntry, deletes + 2),
    )
    .await;
    assert_eq!(
        faulty.count(Call::Enqueue),
        creates,
        "waits for the cleanup"
    );
    faulty.clear();
    let new = within("the new campaign", Duration::from_secs(10), campaign)
        .await
        .unwrap();
    assert!(new.fencing_token() > old_token);
    assert_eq!(new.value(), b"new");
    let leader = election.leader().await.unwrap().unwrap();
    assert_eq!(
        (leader.value(), leader.fencing_token()),
        (&b"new"[..], new.fencing_token())
    );
    new.release().await.unwrap();
}

/// An observer that reads slowly still sees every leader change, in order: more changes than
/// any fixed buffer (the memory backend's first observer kept 1,024) are queued for it.
pub async fn election_observer_misses_nothing_when_slow(rig: Rig) {
    const PROCLAIMS: usize = 1_200;
    let name = rig.name("elect-slow-observer");
    let s = rig.session().await;
    let election = Election::new(&s, &name).unwrap();
    let mut events = election.observe();
    assert_eq!(next_event(&mut events).await, LeaderEvent::Vacant);
    let mut leadership = election.campaign("0").await.unwrap();
    for i in 1..=PROCLAIMS {
        leadership.proclaim(i.to_string()).await.unwrap();
    }
    leadership.release().await.unwrap();
    // Only now does the observer read.
    assert_eq!(elected_value(&next_event(&mut events).await), b"0");
    for i in 1..=PROCLAIMS {
        match next_event(&mut events).await {
            LeaderEvent::Proclaimed(l) => assert_eq!(l.value(), i.to_string().as_bytes()),
            other => panic!("proclamation {i}: got {other:?}"),
        }
    }
    assert_eq!(next_event(&mut events).await, LeaderEvent::Vacant);
}

/// `observe()` can be called where there is no runtime (it creates nothing until polled).
pub async fn election_observe_needs_no_runtime(rig: Rig) {
    let name = rig.name("elect-observe-outside");
    let s = rig.session().await;
    let election = Election::new(&s, &name).unwrap();
    let mut events = std::thread::spawn(move || election.observe())
        .join()
        .expect("observe() outside a runtime must not panic");
    assert_eq!(next_event(&mut events).await, LeaderEvent::Vacant);
}

/// Names that nest share a queue (as in etcd's Go recipes and `etcdctl`): documented, and
/// shown here: a lock named `n` waits behind the holder of `n/sub`.
pub async fn nested_names_share_a_queue(rig: Rig) {
    let name = rig.name("nested");
    let a = rig.session().await;
    let b = rig.session().await;
    let inner = Mutex::new(&a, format!("{name}/sub"))
        .unwrap()
        .lock()
        .await
        .unwrap();
    let outer = Mutex::new(&b, &name).unwrap().try_lock().await;
    assert!(matches!(outer, Err(Error::Locked { .. })), "{outer:?}");
    let leader = Election::new(&b, &name).unwrap().leader().await.unwrap();
    assert_eq!(
        leader.map(|l| l.key().to_owned()),
        Some(inner.key().to_owned())
    );
    inner.release().await.unwrap();
}

/// Every write path tells "not applied" from "may have been applied": a write whose answer
/// was lost after it was applied is `OutcomeUnknown` (and was applied), never `NotOwner` or
/// `Ok`-as-if-refused; `NotOwner` only when the entry was really gone.
pub async fn write_paths_report_unknown_outcomes(rig: Rig) {
    let name = rig.name("unknown-outcomes");
    let data = rig.name("unknown-outcomes-data");
    let (faulty, s) = faulty_session(&rig).await;
    let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();

    faulty.inject(Call::Guarded, 1, Fault::FailAfter);
    let write = guard.write(&[WriteOp::put(&data, "v1")]).await;
    assert!(
        matches!(write, Err(Error::OutcomeUnknown { .. })),
        "{write:?}"
    );
    assert_eq!(
        rig.outside.read(&data).await.unwrap().as_deref(),
        Some(&b"v1"[..]),
        "applied"
    );
    faulty.inject(Call::Guarded, 1, Fault::FailBefore);
    let write = guard.write(&[WriteOp::put(&data, "v2")]).await;
    assert!(matches!(write, Err(Error::Unavailable)), "{write:?}");
    assert_eq!(
        rig.outside.read(&data).await.unwrap().as_deref(),
        Some(&b"v1"[..]),
        "not applied"
    );

    faulty.inject(Call::DeleteEntry, 1, Fault::FailAfter);
    let unlocked = guard.release().await;
    assert!(
        matches!(unlocked, Err(Error::OutcomeUnknown { .. })),
        "{unlocked:?}"
    );
    settle(&s).await;
    assert!(rig.keys(&name).await.is_empty(), "released");

    let mut leadership = Election::new(&s, &name)
        .unwrap()
        .campaign("a")
        .await
        .unwrap();
    faulty.inject(Call::UpdateEntry, 1, Fault::FailAfter);
    let proclaimed = leadership.proclaim("b").await;
    assert!(
        matches!(proclaimed, Err(Error::OutcomeUnknown { .. })),
        "{proclaimed:?}"
    );
    let leader = Election::new(&s, &name)
        .unwrap()
        .leader()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(leader.value(), b"b", "applied");
    faulty.inject(Call::DeleteEntry, 1, Fault::FailAfter);
    let resigned = leadership.release().await;
    assert!(
        matches!(resigned, Err(Error::OutcomeUnknown { .. })),
        "{resigned:?}"
    );
    settle(&s).await;
    assert!(rig.keys(&name).await.is_empty());
}

/// A guarded write may not touch the lock's own queue: its own key (a put without a lease
/// would detach it from the session), any key under the lock's name (an entry no lease
/// ends) or the name itself (a recipe's setting). Refused before anything is sent; a key
/// beside the name is fine.
pub async fn guarded_writes_never_touch_the_queue(rig: Rig) {
    let name = rig.name("queue-writes");
    let (faulty, s) = faulty_session(&rig).await;
    let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    let sent = faulty.count(Call::Guarded);
    for key in [
        guard.key().to_owned(),
        format!("{name}/data"),
        format!("{name}/nested/key"),
        // The name itself: where a semaphore keeps its limit and a double barrier its count.
        name.clone(),
    ] {
        for op in [WriteOp::put(&key, "x"), WriteOp::delete(&key)] {
            let refused = guard
                .write(&[WriteOp::put(rig.name("beside"), "ok"), op])
                .await;
            assert!(
                matches!(&refused, Err(Error::WriteIntoQueue { key: k, .. }) if *k == key),
                "{key}: {refused:?}"
            );
        }
    }
    assert_eq!(faulty.count(Call::Guarded), sent, "nothing was sent");
    assert_eq!(rig.outside.read(&rig.name("beside")).await.unwrap(), None);
    assert_eq!(rig.keys(&name).await, [guard.key().to_owned()]);
    // Beside the name (not under it): allowed.
    guard
        .write(&[WriteOp::put(format!("{name}-data"), "ok")])
        .await
        .unwrap();
    assert_eq!(
        rig.keys(&name).await,
        [guard.key().to_owned()],
        "the queue is untouched"
    );
    guard.release().await.unwrap();
    // The next contender is granted at once: no leaseless entry blocks it.
    let other = rig.session().await;
    let next = within(
        "the next grant",
        Duration::from_secs(10),
        Mutex::new(&other, &name).unwrap().lock(),
    )
    .await
    .unwrap();
    next.release().await.unwrap();
}

/// A waiter whose predecessor goes while an older entry still holds is not the head:
/// [`Backend::wait_gone_then_head`] ends (the predecessor is gone) but answers `false`,
/// whatever the deletion's notice says, so the waiter reads again and waits for the holder.
/// Once the holder goes too, the authoritative read shows the waiter at the head.
pub async fn a_waiter_behind_one_that_leaves_is_not_the_head(rig: Rig) {
    let name = rig.name("leaver");
    let sessions = [
        rig.session().await,
        rig.session().await,
        rig.session().await,
    ];
    let mut entries = Vec::new();
    for s in &sessions {
        let tag = format!("{:x}", s.lease_id().get());
        let queued = rig
            .backend
            .enqueue(&name, &tag, s.lease_id(), b"")
            .await
            .unwrap();
        entries.push(queued.entry().clone());
    }
    let [holder, middle, last] = [0, 1, 2].map(|i| entries[i].clone());
    let wait = |predecessor: baton::Entry| {
        let (backend, last) = (Arc::clone(&rig.backend), last.clone());
        tokio::spawn(async move { backend.wait_gone_then_head(&predecessor, &last).await })
    };
    let waiting = wait(middle.clone());
    assert!(rig.outside.delete_entry(&middle).await.unwrap());
    let head = within(
        "the wait on the one that left",
        Duration::from_secs(10),
        waiting,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(!head, "the holder is still ahead");
    let ahead = rig.backend.predecessor(&last).await.unwrap();
    assert_eq!(ahead.as_ref().map(baton::Entry::key), Some(holder.key()));
    let waiting = wait(holder.clone());
    assert!(rig.outside.delete_entry(&holder).await.unwrap());
    // `true`, or `false` for "not known" (a check that may read a lagging replica).
    within("the wait on the holder", Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rig.backend.predecessor(&last).await.unwrap(), None);
    for s in sessions {
        s.close().await.unwrap();
    }
}

/// Generates one `#[tokio::test]` per suite function for a rig constructor.
#[macro_export]
macro_rules! conformance {
    (mod $module:ident; $rig:path; $($attr:tt)*) => {
        $crate::conformance!(@tests $module; $rig; ($($attr)*);
            mutual_exclusion, fifo_order, try_lock_leaves_nothing, dropped_lock_leaves_nothing,
            revoked_holder_is_told, crashed_holder_is_followed, late_unlock_spares_successor,
            lost_waiter_gets_error, local_tasks_never_share_a_key, guarded_writes, bad_input,
            close_releases_everything, dropped_session_revokes, dropped_guard_releases,
            failed_lock_leaves_nothing, failed_release_never_hands_out_the_token_again,
            deleted_key_is_reported_to_the_holder, a_release_is_not_a_loss, nested_names_share_a_queue,
            election_fifo_succession, election_dead_leader_is_followed, election_proclaim_and_loss,
            election_lost_campaigner_gets_error, election_run_while_leader, election_drops_clean_up,
            election_run_while_leader_survives_a_failed_resign,
            election_run_while_leader_reports_a_loss_during_the_work,
            election_run_while_leader_outlasts_watch_errors,
            election_campaign_after_a_failed_resign_is_new,
            election_observer_misses_nothing_when_slow, election_observe_needs_no_runtime,
            write_paths_report_unknown_outcomes, guarded_writes_never_touch_the_queue,
            semaphore_bounds_holders, semaphore_fifo_whoever_releases,
            semaphore_limit_is_stored_and_checked, semaphore_crashed_holder_permit_returns,
            semaphore_session_loss, semaphore_cancel_leaves_nothing, recipes_bad_input,
            rwlock_readers_share_writers_exclude, rwlock_no_writer_starvation,
            rwlock_waiter_between_writers_gives_up,
            rwlock_upgrade_refused_and_cancel_leaves_nothing,
            barrier_holds_and_falls_with_its_holder, double_barrier_enters_and_leaves_together,
            multilock_all_or_nothing, one_name_several_kinds_exclude_each_other,
            a_waiter_behind_one_that_leaves_is_not_the_head);
    };
    ($rig:path; $($attr:tt)*) => {
        $crate::conformance!(mod conformance; $rig; $($attr)*);
    };
    (@tests $module:ident; $rig:path; $attr:tt; $($test:ident),*) => {
        mod $module {
            $(
                $crate::conformance!(@one $rig; $attr; $test);
            )*
        }
    };
    (@one $rig:path; ($($attr:tt)*); $test:ident) => {
        #[tokio::test($($attr)*)]
        async fn $test() {
            // A test that waits forever fails instead (under paused time the clock would
            // otherwise run on through the keep-alive timers, for ever).
            $crate::support::within(
                stringify!($test),
                std::time::Duration::from_secs(600),
                async { $crate::support::$test($rig(stringify!($test)).await).await },
            )
            .await;
        }
    };
}

/// Clients connected through `connect(app)` share locks within one application and not
/// across two: a lock of one name held by `a` is free to `b` and busy to a second client of
/// `a`. For options that name a namespace (a Redis prefix, a PostgreSQL schema): `what`
/// names it in the messages.
#[allow(dead_code)]
pub async fn namespaces_keep_locks_apart<F, Fut>(what: &str, connect: F)
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = baton::Result<Arc<dyn baton::backend::Backend>>>,
{
    let a = Session::new(connect("a").await.unwrap()).await.unwrap();
    let b = Session::new(connect("b").await.unwrap()).await.unwrap();
    let a_again = Session::new(connect("a").await.unwrap()).await.unwrap();
    let held = Mutex::new(&a, "x").unwrap().lock().await.unwrap();
    let other = Mutex::new(&b, "x").unwrap().try_lock().await;
    assert!(other.is_ok(), "another {what}, another lock: {other:?}");
    let same = Mutex::new(&a_again, "x").unwrap().try_lock().await;
    assert!(
        matches!(same, Err(Error::Locked { .. })),
        "the same {what}, the same lock: {same:?}"
    );
    held.release().await.unwrap();
    other.unwrap().release().await.unwrap();
}
