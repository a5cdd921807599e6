//! Property tests: random interleavings of lock, try_lock, unlock, cancel, lease expiry and
//! session loss never violate mutual exclusion, never grant out of token order, and leave no
//! keys (checked after every step, while the sessions live); the same for a semaphore and a
//! read-write lock. They run on the memory backend under paused time (64 cases each) and,
//! with the `redis` and `zookeeper` features, on a real Redis and ZooKeeper in real time
//! (fewer, shorter cases). Plus no-panic properties for everything that parses input from
//! outside.

use std::sync::Arc;
use std::time::Duration;

use baton::testing::{Call, Fault, FaultyBackend};
use baton::{
    Backend, Error, FencingToken, MemoryBackend, Mutex, MutexGuard, Session, SessionOptions,
    decode_token, encode_token,
};
use proptest::prelude::*;
use tokio::task::JoinHandle;

/// Where a case runs: a backend, and the clock it runs on.
#[derive(Clone)]
struct World {
    backend: Arc<dyn Backend>,
    /// The in-memory store, when that is the backend (it can count every key).
    memory: Option<MemoryBackend>,
    /// A prefix for the names of this case (cases on one server must not meet).
    prefix: String,
    ttl: Duration,
    /// Real time (a real server): waits are shortened, settling takes longer.
    real_time: bool,
}

impl World {
    fn memory() -> World {
        let backend = MemoryBackend::new();
        World {
            backend: Arc::new(backend.clone()),
            memory: Some(backend),
            prefix: "prop".to_owned(),
            ttl: Duration::from_secs(3),
            real_time: false,
        }
    }

    fn name(&self, what: &str) -> String {
        format!("{}/{what}", self.prefix)
    }

    /// A session whose renewals can be made to fail, so that its lease expires on the server
    /// after its TTL, as for a paused or cut-off owner.
    async fn session(&self) -> (Session, Arc<FaultyBackend>) {
        let faulty = FaultyBackend::wrap(Arc::clone(&self.backend));
        let session =
            Session::with_options(faulty.clone(), SessionOptions::new().with_ttl(self.ttl))
                .await
                .unwrap();
        (session, faulty)
    }

    /// Lets spawned tasks run.
    async fn settle(&self) {
        let pause = if self.real_time { 20 } else { 1 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }

    /// Time passes (a hundredth of it in real time).
    async fn wait(&self, ms: u64) {
        let ms = if self.real_time { ms / 100 } else { ms };
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    /// Waits until the server has ended `session`'s lease (the session says it is lost
    /// no later than that).
    async fn gone(&self, session: &Session) {
        let lease = session.lease_id();
        let deadline = tokio::time::Instant::now() + self.ttl * 2;
        while self.backend.lease_ttl(lease).await.unwrap().is_some() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the lease never ended"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Makes `faulty`'s renewals fail from now on: its lease expires after its TTL.
fn expire(faulty: &FaultyBackend) {
    faulty.inject_every(Call::KeepAlive, Fault::FailBefore);
}

/// How long after a session's deadline the answer of a grant decided before it may come, in
/// real time (the engine checks the deadline, then the answer travels back to the caller).
const GRANT_RETURN: Duration = Duration::from_millis(100);

#[derive(Debug, Clone)]
enum Op {
    Lock(usize),
    TryLock(usize),
    Unlock(usize),
    Cancel(usize),
    /// The session stops renewing (a pause or partition) and its lease expires.
    Expire(usize),
    /// The session's lease is revoked from outside.
    Revoke(usize),
    /// Time passes.
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let slot = 0..3usize;
    prop_oneof![
        3 => slot.clone().prop_map(Op::Lock),
        2 => slot.clone().prop_map(Op::TryLock),
        3 => slot.clone().prop_map(Op::Unlock),
        1 => slot.clone().prop_map(Op::Cancel),
        1 => slot.clone().prop_map(Op::Expire),
        1 => slot.prop_map(Op::Revoke),
        1 => (1..5000u64).prop_map(Op::Wait),
    ]
}

enum State {
    Idle,
    /// A `lock()` in flight; with its answer, the instant it came.
    Waiting(JoinHandle<(baton::Result<MutexGuard>, tokio::time::Instant)>),
    Holding(MutexGuard),
}

struct Slot {
    session: Session,
    faulty: Arc<FaultyBackend>,
    state: State,
}

struct Model {
    world: World,
    lock: String,
    slots: Vec<Slot>,
    /// Guards whose session was lost: they must no longer own anything.
    zombies: Vec<MutexGuard>,
    last_token: u64,
}

impl Model {
    fn granted(&mut self, guard: &MutexGuard) {
        let token = guard.fencing_token().get();
        assert!(
            token > self.last_token,
            "token {token} granted after {}",
            self.last_token
        );
        self.last_token = token;
    }

    /// Lets spawned tasks run, then collects finished waits.
    async fn settle(&mut self) {
        self.world.settle().await;
        for i in 0..self.slots.len() {
            let finished = matches!(&self.slots[i].state, State::Waiting(h) if h.is_finished());
            if !finished {
                continue;
            }
            let State::Waiting(handle) = std::mem::replace(&mut self.slots[i].state, State::Idle)
            else {
                unreachable!("checked just above")
            };
            match handle.await.unwrap().0 {
                Ok(guard) => {
                    assert!(
                        !self.slots[i].session.is_lost(),
                        "a lost session was granted the lock"
                    );
                    self.granted(&guard);
                    self.slots[i].state = State::Holding(guard);
                }
                Err(Error::SessionLost(_) | Error::EntryGone { .. }) => {}
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
    }

    /// Nothing left behind: a live session that holds and waits for nothing has no key, once
    /// its background cleanups are done (checked while it lives, so its lease cannot hide a
    /// leak).
    async fn check_nothing_left(&self) {
        for slot in &self.slots {
            if matches!(slot.state, State::Idle) && !slot.session.is_lost() {
                slot.session.settled().await;
                let key = format!("{}/{}", self.lock, slot.session.lease_id());
                let left = self.world.backend.entries(&self.lock).await.unwrap();
                assert!(
                    left.iter().all(|e| e.key() != key),
                    "an idle live session left its key behind"
                );
            }
        }
    }

    /// Mutual exclusion: live holders own their keys, at most one does, zombies own nothing.
    async fn check(&self) {
        let mut owners = 0;
        for slot in &self.slots {
            if let State::Holding(g) = &slot.state {
                if !slot.session.is_lost() {
                    assert!(g.is_owner().await.unwrap(), "a live holder lost its key");
                }
                owners += usize::from(g.is_owner().await.unwrap());
            }
        }
        for z in &self.zombies {
            assert!(
                !z.is_owner().await.unwrap(),
                "a lost holder still owns the lock"
            );
        }
        assert!(owners <= 1, "{owners} holders own the lock at once");
    }

    /// Replaces slot `i`'s session after it was lost; a waiter must end with an error.
    async fn lose(&mut self, i: usize) {
        let lost = self.slots[i].session.lost();
        tokio::time::timeout(self.world.ttl * 2, lost)
            .await
            .expect("the session notices");
        // It says so before the server ends its lease: from then on it owns nothing.
        self.world.gone(&self.slots[i].session).await;
        match std::mem::replace(&mut self.slots[i].state, State::Idle) {
            State::Holding(g) => self.zombies.push(g),
            State::Waiting(handle) => {
                // A grant that came before the session's deadline is a holder's, which the
                // loss then ends (it must own nothing); one after it is the bug. In real time
                // (a real server) a grant decided just before the deadline may return just
                // after it: GRANT_RETURN allows for that; paused time is exact.
                let (result, at) = handle.await.unwrap();
                if let Ok(g) = result {
                    let deadline = tokio::time::Instant::from_std(self.slots[i].session.deadline());
                    assert!(
                        at <= deadline + GRANT_RETURN,
                        "a waiter of a lost session got the lock {:?} after its deadline",
                        at - deadline
                    );
                    assert!(
                        !g.is_owner().await.unwrap(),
                        "a lost holder still owns the lock"
                    );
                    self.zombies.push(g);
                }
            }
            State::Idle => {}
        }
        (self.slots[i].session, self.slots[i].faulty) = self.world.session().await;
    }

    async fn apply(&mut self, op: Op) {
        match op {
            Op::Lock(i) => {
                if matches!(self.slots[i].state, State::Idle) {
                    let mutex = Mutex::new(&self.slots[i].session, &self.lock).unwrap();
                    self.slots[i].state = State::Waiting(tokio::spawn(async move {
                        let result = mutex.lock().await;
                        (result, tokio::time::Instant::now())
                    }));
                }
            }
            Op::TryLock(i) => {
                if matches!(self.slots[i].state, State::Idle) {
                    match Mutex::new(&self.slots[i].session, &self.lock)
                        .unwrap()
                        .try_lock()
                        .await
                    {
                        Ok(g) => {
                            self.granted(&g);
                            self.slots[i].state = State::Holding(g);
                        }
                        Err(Error::Locked { .. }) => {}
                        Err(e) => panic!("try_lock: {e}"),
                    }
                }
            }
            Op::Unlock(i) => {
                if matches!(self.slots[i].state, State::Holding(_))
                    && let State::Holding(g) =
                        std::mem::replace(&mut self.slots[i].state, State::Idle)
                {
                    g.release().await.unwrap();
                }
            }
            Op::Cancel(i) => {
                if matches!(self.slots[i].state, State::Waiting(_))
                    && let State::Waiting(h) =
                        std::mem::replace(&mut self.slots[i].state, State::Idle)
                {
                    h.abort();
                    let _ = h.await;
                }
            }
            Op::Expire(i) => {
                expire(&self.slots[i].faulty);
                self.lose(i).await;
            }
            Op::Revoke(i) => {
                self.world
                    .backend
                    .revoke_lease(self.slots[i].session.lease_id())
                    .await
                    .unwrap();
                self.lose(i).await;
            }
            Op::Wait(ms) => self.world.wait(ms).await,
        }
    }
}

/// A current-thread runtime on paused time: a case runs in milliseconds whatever its TTLs.
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

async fn run(world: World, ops: Vec<Op>) {
    let mut slots = Vec::new();
    for _ in 0..3 {
        let (session, faulty) = world.session().await;
        slots.push(Slot {
            session,
            faulty,
            state: State::Idle,
        });
    }
    let mut model = Model {
        lock: world.name("lock"),
        world,
        slots,
        zombies: Vec::new(),
        last_token: 0,
    };
    for op in ops {
        model.apply(op).await;
        model.settle().await;
        model.check().await;
        model.check_nothing_left().await;
    }
    // Everyone leaves: nothing may remain, checked while every session still lives.
    for slot in &mut model.slots {
        match std::mem::replace(&mut slot.state, State::Idle) {
            State::Holding(g) => g.release().await.unwrap(),
            State::Waiting(h) => {
                h.abort();
                let _ = h.await;
            }
            State::Idle => {}
        }
    }
    // Lost sessions' keys end with their leases, on the server's clock.
    model.zombies.clear();
    for slot in &model.slots {
        slot.session.settled().await;
        assert!(!slot.session.is_lost());
    }
    assert!(
        model
            .world
            .backend
            .entries(&model.lock)
            .await
            .unwrap()
            .is_empty(),
        "entries left behind"
    );
    if let Some(memory) = &model.world.memory {
        tokio::time::sleep(model.world.ttl).await;
        assert_eq!(memory.key_count(), 0, "keys left behind");
    }
    for slot in &model.slots {
        slot.session.close().await.unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_interleavings_keep_mutual_exclusion(ops in proptest::collection::vec(op(), 1..40)) {
        paused_runtime().block_on(run(World::memory(), ops));
    }

    #[test]
    fn tokens_round_trip_and_order(a: u64, b: u64) {
        let (ea, eb) = (encode_token(FencingToken::new(a)), encode_token(FencingToken::new(b)));
        prop_assert_eq!(decode_token(ea.as_bytes()), Some(FencingToken::new(a)));
        prop_assert_eq!(ea.cmp(&eb), a.cmp(&b));
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes: Vec<u8>) {
        let _ = decode_token(&bytes);
    }

    #[test]
    fn any_name_is_accepted_or_refused_cleanly(name in ".{0,40}") {
        let rt = paused_runtime();
        rt.block_on(async {
            let backend = MemoryBackend::new();
            let s = Session::new(backend.clone()).await.unwrap();
            match Mutex::new(&s, name.clone()) {
                // The rule of every recipe: not empty, not ending in `/`.
                Err(Error::InvalidArgument(_)) => {
                    assert!(name.is_empty() || name.ends_with('/'), "{name:?}");
                }
                Err(e) => panic!("{e}"),
                Ok(m) => {
                    let g = m.lock().await.unwrap();
                    assert_eq!(g.key(), format!("{name}/{}", s.lease_id()));
                    g.release().await.unwrap();
                }
            }
            s.close().await.unwrap();
            assert_eq!(backend.key_count(), 0);
        });
    }
}

/// The recipes on the same engine: a semaphore of 2 permits and a read-write lock, under
/// random acquisitions, releases, cancels and lease expiries.
mod recipes {
    use super::*;
    use baton::{Entry, RwLock, Semaphore};
    use std::future::Future;
    use std::pin::Pin;

    const PERMITS: u32 = 2;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(super) enum Kind {
        Permit,
        Read,
        Write,
    }

    #[derive(Debug, Clone)]
    pub(super) enum Op {
        Acquire(usize, Kind),
        Try(usize, Kind),
        Release(usize),
        Cancel(usize),
        Expire(usize),
        Wait(u64),
    }

    pub(super) fn op() -> impl Strategy<Value = Op> {
        let slot = 0..5usize;
        let kind = prop_oneof![Just(Kind::Permit), Just(Kind::Read), Just(Kind::Write)];
        prop_oneof![
            4 => (slot.clone(), kind.clone()).prop_map(|(i, k)| Op::Acquire(i, k)),
            2 => (slot.clone(), kind).prop_map(|(i, k)| Op::Try(i, k)),
            4 => slot.clone().prop_map(Op::Release),
            1 => slot.clone().prop_map(Op::Cancel),
            1 => slot.prop_map(Op::Expire),
            1 => (1..5000u64).prop_map(Op::Wait),
        ]
    }

    /// A granted entry of either recipe, released through its own guard.
    struct Grant {
        kind: Kind,
        entry: Entry,
        release: Pin<Box<dyn Future<Output = baton::Result<()>> + Send>>,
    }

    type Waiting = JoinHandle<baton::Result<Grant>>;

    enum State {
        Idle,
        Waiting(Waiting),
        Holding(Grant),
    }

    fn take(
        session: &Session,
        names: &(String, String),
        kind: Kind,
        try_only: bool,
    ) -> impl Future<Output = baton::Result<Grant>> + Send + 'static {
        let session = session.clone();
        let (sem, rw) = names.clone();
        async move {
            let (sem, rw) = (sem.as_str(), rw.as_str());
            macro_rules! grant {
                ($guard:expr) => {{
                    let g = $guard;
                    let entry = g.entry().clone();
                    Grant {
                        kind,
                        entry,
                        release: Box::pin(g.release()),
                    }
                }};
            }
            Ok(match (kind, try_only) {
                (Kind::Permit, false) => {
                    grant!(Semaphore::new(&session, sem, PERMITS)?.acquire().await?)
                }
                (Kind::Permit, true) => grant!(
                    Semaphore::new(&session, sem, PERMITS)?
                        .try_acquire()
                        .await?
                ),
                (Kind::Read, false) => grant!(RwLock::new(&session, rw)?.read().await?),
                (Kind::Read, true) => grant!(RwLock::new(&session, rw)?.try_read().await?),
                (Kind::Write, false) => grant!(RwLock::new(&session, rw)?.write().await?),
                (Kind::Write, true) => grant!(RwLock::new(&session, rw)?.try_write().await?),
            })
        }
    }

    struct Model {
        world: World,
        /// The semaphore's and the read-write lock's names.
        names: (String, String),
        sessions: Vec<Session>,
        faulties: Vec<Arc<FaultyBackend>>,
        states: Vec<State>,
        last_sem: u64,
        last_rw: u64,
    }

    impl Model {
        fn granted(&mut self, mut tokens: Vec<(Kind, u64)>) {
            // Within one step, in token order; across steps, grant order must be queue order.
            tokens.sort_by_key(|(_, t)| *t);
            for (kind, token) in tokens {
                let last = if kind == Kind::Permit {
                    &mut self.last_sem
                } else {
                    &mut self.last_rw
                };
                assert!(
                    token > *last,
                    "{kind:?} granted {token} after {last}: out of queue order"
                );
                *last = token;
            }
        }

        async fn settle(&mut self) {
            self.settle_with(Vec::new()).await;
        }

        /// Collects the waiters that finished, and checks their grants in queue order
        /// together with `tokens` (a `Try`'s grant of this step).
        async fn settle_with(&mut self, mut tokens: Vec<(Kind, u64)>) {
            self.world.settle().await;
            for i in 0..self.states.len() {
                if !matches!(&self.states[i], State::Waiting(h) if h.is_finished()) {
                    continue;
                }
                let State::Waiting(h) = std::mem::replace(&mut self.states[i], State::Idle) else {
                    unreachable!("checked just above")
                };
                match h.await.unwrap() {
                    Ok(g) => {
                        assert!(!self.sessions[i].is_lost(), "a lost session was granted");
                        tokens.push((g.kind, g.entry.token().get()));
                        self.states[i] = State::Holding(g);
                    }
                    Err(Error::SessionLost(_) | Error::EntryGone { .. }) => {}
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
            self.granted(tokens);
        }

        /// At most PERMITS live permits; a live writer owns alone; nothing left by idle
        /// live sessions.
        async fn check(&self) {
            let (mut permits, mut readers, mut writers) = (0, 0, 0);
            for (i, state) in self.states.iter().enumerate() {
                let State::Holding(g) = state else { continue };
                let owns = self.world.backend.guarded(&g.entry, &[]).await.unwrap();
                if !self.sessions[i].is_lost() {
                    assert!(owns, "a live holder lost its entry");
                }
                if owns {
                    match g.kind {
                        Kind::Permit => permits += 1,
                        Kind::Read => readers += 1,
                        Kind::Write => writers += 1,
                    }
                }
            }
            assert!(
                permits <= PERMITS,
                "{permits} permits held with a limit of {PERMITS}"
            );
            assert!(writers <= 1, "{writers} writers at once");
            assert!(
                writers == 0 || readers == 0,
                "a writer beside {readers} readers"
            );
            for (i, state) in self.states.iter().enumerate() {
                if matches!(state, State::Idle) && !self.sessions[i].is_lost() {
                    self.sessions[i].settled().await;
                    let tag = format!("{}_", self.sessions[i].lease_id());
                    for queue in [&self.names.0, &self.names.1] {
                        let left = self.world.backend.entries(queue).await.unwrap();
                        assert!(
                            left.iter().all(|e| !e
                                .key()
                                .rsplit('/')
                                .next()
                                .unwrap()
                                .starts_with(&tag)),
                            "an idle live session left an entry in {queue}"
                        );
                    }
                }
            }
        }

        async fn apply(&mut self, op: Op) {
            match op {
                Op::Acquire(i, kind) if matches!(self.states[i], State::Idle) => {
                    self.states[i] = State::Waiting(tokio::spawn(take(
                        &self.sessions[i],
                        &self.names,
                        kind,
                        false,
                    )));
                }
                Op::Try(i, kind) if matches!(self.states[i], State::Idle) => {
                    match take(&self.sessions[i], &self.names, kind, true).await {
                        Ok(g) => {
                            let token = (g.kind, g.entry.token().get());
                            self.states[i] = State::Holding(g);
                            // An earlier waiter admitted at the same moment (readers, or
                            // free permits) may still be returning from its spawned task:
                            // grants made together are checked together, in token order.
                            // One that was not admitted stays waiting and fails the check
                            // when it is granted later.
                            self.settle_with(vec![token]).await;
                        }
                        Err(Error::Locked { .. }) => {}
                        Err(e) => panic!("try: {e}"),
                    }
                }
                Op::Release(i) => match std::mem::replace(&mut self.states[i], State::Idle) {
                    State::Holding(g) => g.release.await.unwrap(),
                    other => self.states[i] = other,
                },
                Op::Cancel(i) => match std::mem::replace(&mut self.states[i], State::Idle) {
                    State::Waiting(h) => {
                        h.abort();
                        let _ = h.await;
                    }
                    other => self.states[i] = other,
                },
                Op::Expire(i) => {
                    expire(&self.faulties[i]);
                    tokio::time::timeout(self.world.ttl * 2, self.sessions[i].lost())
                        .await
                        .expect("the session notices");
                    // It says so before the server ends its lease: from then on it owns
                    // nothing.
                    self.world.gone(&self.sessions[i]).await;
                    // Let waiters see it, then forget this slot's session.
                    self.settle().await;
                    match std::mem::replace(&mut self.states[i], State::Idle) {
                        State::Waiting(h) => {
                            assert!(
                                h.await.unwrap().is_err(),
                                "a waiter of a lost session got in"
                            );
                        }
                        // Owns nothing any more (`check` saw to it): forgotten.
                        State::Holding(_) | State::Idle => {}
                    }
                    (self.sessions[i], self.faulties[i]) = self.world.session().await;
                }
                Op::Wait(ms) => self.world.wait(ms).await,
                Op::Acquire(..) | Op::Try(..) => {}
            }
        }
    }

    pub(super) async fn run(world: World, ops: Vec<Op>) {
        let (mut sessions, mut faulties) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            let (session, faulty) = world.session().await;
            sessions.push(session);
            faulties.push(faulty);
        }
        let states = (0..5).map(|_| State::Idle).collect();
        let mut model = Model {
            names: (world.name("sem"), world.name("rw")),
            world,
            sessions,
            faulties,
            states,
            last_sem: 0,
            last_rw: 0,
        };
        for op in ops {
            model.apply(op).await;
            model.settle().await;
            model.check().await;
        }
        for state in &mut model.states {
            match std::mem::replace(state, State::Idle) {
                State::Holding(g) => {
                    // A holder of a lost session owns nothing any more.
                    let _ = g.release.await;
                }
                State::Waiting(h) => {
                    h.abort();
                    let _ = h.await;
                }
                State::Idle => {}
            }
        }
        for s in &model.sessions {
            s.settled().await;
        }
        for queue in [&model.names.0, &model.names.1] {
            assert!(
                model.world.backend.entries(queue).await.unwrap().is_empty(),
                "entries left in {queue}"
            );
        }
        if let Some(memory) = &model.world.memory {
            tokio::time::sleep(model.world.ttl).await;
            // Only the semaphore's stored limit may remain.
            assert!(memory.key_count() <= 1, "keys left behind");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn recipes_keep_their_limits_and_queue_order(ops in proptest::collection::vec(recipes::op(), 1..40)) {
        paused_runtime().block_on(recipes::run(World::memory(), ops));
    }
}

/// The same properties on a real Redis, in real time: fewer and shorter cases (a lease expiry
/// takes its TTL, 1 s here), each under names of its own.
#[cfg(feature = "redis")]
mod on_redis {
    use super::*;
    use baton::testing::RedisNode;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn world() -> (tokio::runtime::Runtime, World) {
        static CASE: AtomicUsize = AtomicUsize::new(0);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let backend = rt.block_on(RedisNode::shared().backend()).unwrap();
        let case = CASE.fetch_add(1, Ordering::Relaxed);
        let world = World {
            backend: Arc::new(backend),
            memory: None,
            prefix: format!("prop-{}/{case}", std::process::id()),
            ttl: Duration::from_secs(1),
            real_time: true,
        };
        (rt, world)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

        #[test]
        fn random_interleavings_keep_mutual_exclusion(ops in proptest::collection::vec(op(), 1..20)) {
            let (rt, world) = world();
            rt.block_on(run(world, ops));
        }

        #[test]
        fn recipes_keep_their_limits_and_queue_order(ops in proptest::collection::vec(recipes::op(), 1..20)) {
            let (rt, world) = world();
            rt.block_on(recipes::run(world, ops));
        }
    }
}

/// The same properties on a real ZooKeeper, in real time: fewer and shorter cases (a lease
/// expiry takes its TTL, 1 s here, the fixture's shortest session), each under names of its own.
#[cfg(feature = "zookeeper")]
mod on_zookeeper {
    use super::*;
    use baton::testing::ZkNode;
    use baton::{ZkBackend, ZkOptions};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn world() -> (tokio::runtime::Runtime, World) {
        static CASE: AtomicUsize = AtomicUsize::new(0);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let backend = rt
            .block_on(ZkBackend::connect(
                &ZkNode::shared().url(),
                ZkOptions::new(),
            ))
            .unwrap();
        let case = CASE.fetch_add(1, Ordering::Relaxed);
        let world = World {
            backend: Arc::new(backend),
            memory: None,
            prefix: format!("prop-zk-{}/{case}", std::process::id()),
            ttl: Duration::from_secs(1),
            real_time: true,
        };
        (rt, world)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

        #[test]
        fn random_interleavings_keep_mutual_exclusion(ops in proptest::collection::vec(op(), 1..20)) {
            let (rt, world) = world();
            rt.block_on(run(world, ops));
        }

        #[test]
        fn recipes_keep_their_limits_and_queue_order(ops in proptest::collection::vec(recipes::op(), 1..20)) {
            let (rt, world) = world();
            rt.block_on(recipes::run(world, ops));
        }
    }
}
