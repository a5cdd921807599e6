//! The fault-injection harness: each public operation, stepped through every backend call it
//! makes (its own and its background cleanup's), with each fault at that step; after every
//! case, the invariants.
//!
//! A case is (operation, step, fault). The steps of an operation are the calls it made in a
//! run without faults, numbered per call kind ("the 2nd `wait_gone`"); the case injects the
//! fault into that call ([`FaultyBackend::inject`]) in a fresh world, runs the operation, and
//! if the fault hangs, drops the operation's future at the hung call and then releases it.
//! The session under test (S) alone goes through the decorator; the holder it competes with
//! (H), the observer and the contenders that check liveness use the backend directly.
//!
//! Invariants checked after each case:
//! - nothing left behind: once S's cleanups are done (`Session::settled`), S has no entry in
//!   the queue, unless it holds (checked while S lives, so no lease can hide a leak);
//! - every grant of the case (S's, H's, the liveness contenders') has a token higher than
//!   every earlier grant: no two grants with one token, tokens rise in grant order;
//! - a grant to S finds S's entry at the head, and S's session not lost;
//! - every waiter wakes or gets an error (every future is bounded), and nothing is wedged:
//!   afterwards a new contender and S itself each get the lock;
//! - an operation that waits (lock, campaign) succeeds when the fault only hit a read or a
//!   wait: those say nothing, and are retried;
//! - no request loop without backoff ([`FaultyBackend::set_spin_guard`]);
//! - for elections, an observer's events end in a vacancy, with leaders' tokens rising.
//!
//! [`lost_by_the_deadline`] adds the session cases: renewals that fail, hang or answer late
//! from the `k`th on, while holding and while waiting: `lost()` fires no later than the server
//! can expire the lease, nothing is granted to the lost session, the successor's token is
//! higher and the lost holder's guarded write is refused.

use std::collections::HashMap;
use std::sync::Mutex as StdMutex;

use futures::future::BoxFuture;
use tokio::sync::Notify;

use super::*;

/// The public operations the harness drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Lock,
    LockBehindHolder,
    TryLock,
    TryLockHeld,
    Unlock,
    DropGuard,
    Campaign,
    CampaignBehindLeader,
    Resign,
    Proclaim,
    RunWhileLeader,
    /// A semaphore of one permit, free.
    Acquire,
    /// A semaphore of one permit that H holds.
    AcquireBehindHolder,
    TryAcquireHeld,
    /// A read lock behind H's write lock.
    ReadBehindWriter,
    /// A write lock behind H's read lock.
    WriteBehindReader,
}

impl Op {
    pub const ALL: [Op; 16] = [
        Op::Lock,
        Op::LockBehindHolder,
        Op::TryLock,
        Op::TryLockHeld,
        Op::Unlock,
        Op::DropGuard,
        Op::Campaign,
        Op::CampaignBehindLeader,
        Op::Resign,
        Op::Proclaim,
        Op::RunWhileLeader,
        Op::Acquire,
        Op::AcquireBehindHolder,
        Op::TryAcquireHeld,
        Op::ReadBehindWriter,
        Op::WriteBehindReader,
    ];

    fn is_election(self) -> bool {
        matches!(
            self,
            Op::Campaign
                | Op::CampaignBehindLeader
                | Op::Resign
                | Op::Proclaim
                | Op::RunWhileLeader
        )
    }

    /// Operations that wait for their turn: a fault in a read or a wait must not end them.
    fn waits(self) -> bool {
        matches!(
            self,
            Op::Lock
                | Op::LockBehindHolder
                | Op::Campaign
                | Op::CampaignBehindLeader
                | Op::Acquire
                | Op::AcquireBehindHolder
                | Op::ReadBehindWriter
                | Op::WriteBehindReader
        )
    }

    /// Recipes on `Turn::Fewer`: H and S hold through a `Recipe` guard.
    fn is_recipe(self) -> bool {
        matches!(
            self,
            Op::Acquire
                | Op::AcquireBehindHolder
                | Op::TryAcquireHeld
                | Op::ReadBehindWriter
                | Op::WriteBehindReader
        )
    }

    /// Waits behind H: H lets go once S waits.
    fn behind(self) -> bool {
        matches!(
            self,
            Op::LockBehindHolder
                | Op::CampaignBehindLeader
                | Op::AcquireBehindHolder
                | Op::ReadBehindWriter
                | Op::WriteBehindReader
        )
    }

    /// H holds (or leads) before the operation.
    fn has_holder(self) -> bool {
        matches!(
            self,
            Op::LockBehindHolder | Op::TryLockHeld | Op::CampaignBehindLeader
        ) || self.behind()
            || self == Op::TryAcquireHeld
    }
}

/// A held entry of a recipe (permit, read or write lock): its token and its release.
struct Recipe {
    token: baton::FencingToken,
    release: BoxFuture<'static, baton::Result<()>>,
}

macro_rules! recipe {
    ($guard:expr) => {{
        let g = $guard;
        Recipe {
            token: g.fencing_token(),
            release: Box::pin(g.release()),
        }
    }};
}

/// How the harness builds a fresh world for a case, and how long its delays are.
pub struct Harness<F> {
    pub make_rig: F,
    /// The delay of `DelayBefore` / `DelayAfter` faults.
    pub delay: Duration,
    /// Runs only the first-level cases whose index `i` has `i % sample == 0`...
    pub sample: usize,
    /// ... and, after each, only the follow-up cases whose index `j` has
    /// `j % follow_sample == 0`.
    pub follow_sample: usize,
    pub backend: &'static str,
    /// How many operations' cases run at once. Each case builds its world under names of its
    /// own, so cases of different operations never meet; against a real server they mostly
    /// wait (hangs until a timeout, delays), so a sample runs several operations at once
    /// rather than leaving the server idle (CI's budget, #37).
    pub parallel: usize,
}

/// The harness against a real server, sampled (a part of the cases the memory suite runs in
/// full): `rig` builds each case's world under names of its own. Prints the total and checks
/// that enough cases ran.
pub async fn run_sample<F, Fut>(backend: &'static str, rig: F)
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Rig>,
{
    let harness = Harness {
        make_rig: rig,
        delay: Duration::from_millis(300),
        sample: 2,
        follow_sample: 5,
        backend,
        parallel: 4,
    };
    let started = std::time::Instant::now();
    let tally = within("the harness", Duration::from_secs(900), harness.run_all()).await;
    println!(
        "HARNESS-TOTAL|{backend}|{} cases in {:?}",
        tally.cases,
        started.elapsed()
    );
    assert!(tally.cases >= 50, "{tally:?}");
}

/// The faults every step is tried with.
pub fn faults(delay: Duration) -> [Fault; 6] {
    [
        Fault::FailBefore,
        Fault::FailAfter,
        Fault::HangBefore,
        Fault::HangAfter,
        Fault::DelayBefore(delay),
        Fault::DelayAfter(delay),
    ]
}

/// Every grant of a case, in grant order.
#[derive(Default)]
struct Grants(StdMutex<Vec<(&'static str, u64)>>);

impl Grants {
    fn granted(&self, who: &'static str, token: baton::FencingToken) {
        let mut grants = self.0.lock().unwrap();
        if let Some((last_who, last)) = grants.last() {
            assert!(
                token.get() > *last,
                "{who} granted token {token} after {last_who} was granted {last}"
            );
        }
        grants.push((who, token.get()));
    }
}

/// What S holds between the phases of a case.
#[derive(Default)]
struct Holding {
    guard: Option<MutexGuard>,
    leadership: Option<baton::Leadership>,
    recipe: Option<Recipe>,
}

/// One case's world.
struct World {
    rig: Rig,
    name: String,
    faulty: Arc<FaultyBackend>,
    s: Session,
    h: Session,
    grants: Grants,
    held: StdMutex<Holding>,
    h_held: StdMutex<Holding>,
    op_done: Notify,
}

impl World {
    async fn new(rig: Rig, spin_guard: bool) -> World {
        let name = rig.name("harness");
        let faulty = FaultyBackend::wrap(Arc::clone(&rig.backend));
        if spin_guard {
            faulty.set_spin_guard(50, Duration::from_secs(1));
        }
        let s = session_on(faulty.clone(), SessionOptions::DEFAULT_TTL).await;
        let h = session_on(Arc::clone(&rig.outside), SessionOptions::DEFAULT_TTL).await;
        World {
            rig,
            name,
            faulty,
            s,
            h,
            grants: Grants::default(),
            held: StdMutex::default(),
            h_held: StdMutex::default(),
            op_done: Notify::new(),
        }
    }

    fn mutex(&self) -> Mutex {
        Mutex::new(&self.s, &self.name).unwrap()
    }

    fn semaphore(&self, s: &Session) -> baton::Semaphore {
        baton::Semaphore::new(s, &self.name, 1).unwrap()
    }

    fn rwlock(&self, s: &Session) -> baton::RwLock {
        baton::RwLock::new(s, &self.name).unwrap()
    }

    fn election(&self) -> Election {
        Election::new(&self.s, &self.name).unwrap()
    }

    /// S was granted: its entry is the head, its session lives.
    async fn s_granted(&self, token: baton::FencingToken) {
        assert!(!self.s.is_lost(), "granted to a lost session");
        self.grants.granted("S", token);
        let head = self.rig.outside.head(&self.name).await.unwrap();
        assert_eq!(
            head.map(|h| h.token()),
            Some(token),
            "S granted, but its entry is not the head"
        );
    }

    /// Everything before the operation (no faults yet).
    async fn prepare(&self, op: Op) {
        if op.has_holder() && op.is_recipe() {
            let h = match op {
                Op::ReadBehindWriter => recipe!(self.rwlock(&self.h).write().await.unwrap()),
                Op::WriteBehindReader => recipe!(self.rwlock(&self.h).read().await.unwrap()),
                _ => recipe!(self.semaphore(&self.h).acquire().await.unwrap()),
            };
            self.grants.granted("H", h.token);
            self.h_held.lock().unwrap().recipe = Some(h);
        } else if op.has_holder() {
            if op.is_election() {
                let l = Election::new(&self.h, &self.name)
                    .unwrap()
                    .campaign("h")
                    .await
                    .unwrap();
                self.grants.granted("H", l.fencing_token());
                self.h_held.lock().unwrap().leadership = Some(l);
            } else {
                let g = Mutex::new(&self.h, &self.name)
                    .unwrap()
                    .lock()
                    .await
                    .unwrap();
                self.grants.granted("H", g.fencing_token());
                self.h_held.lock().unwrap().guard = Some(g);
            }
        }
        match op {
            Op::Unlock | Op::DropGuard => {
                let g = self.mutex().lock().await.unwrap();
                self.s_granted(g.fencing_token()).await;
                self.held.lock().unwrap().guard = Some(g);
            }
            Op::Resign | Op::Proclaim => {
                let l = self.election().campaign("s").await.unwrap();
                self.s_granted(l.fencing_token()).await;
                self.held.lock().unwrap().leadership = Some(l);
            }
            _ => {}
        }
    }

    /// The operation under test. Its result only matters for `Op::waits`.
    fn op(&self, op: Op) -> BoxFuture<'_, baton::Result<()>> {
        Box::pin(async move {
            match op {
                Op::Lock | Op::LockBehindHolder | Op::TryLock | Op::TryLockHeld => {
                    let mutex = self.mutex();
                    let g = if matches!(op, Op::TryLock | Op::TryLockHeld) {
                        mutex.try_lock().await?
                    } else {
                        mutex.lock().await?
                    };
                    self.s_granted(g.fencing_token()).await;
                    self.held.lock().unwrap().guard = Some(g);
                }
                Op::Unlock => {
                    let g = self.held.lock().unwrap().guard.take().unwrap();
                    g.release().await?;
                }
                Op::DropGuard => {
                    drop(self.held.lock().unwrap().guard.take());
                }
                Op::Campaign | Op::CampaignBehindLeader => {
                    let l = self.election().campaign("s").await?;
                    self.s_granted(l.fencing_token()).await;
                    self.held.lock().unwrap().leadership = Some(l);
                }
                Op::Resign => {
                    let l = self.held.lock().unwrap().leadership.take().unwrap();
                    l.release().await?;
                }
                Op::Proclaim => {
                    let mut l = self.held.lock().unwrap().leadership.take().unwrap();
                    let proclaimed = l.proclaim("s2").await;
                    self.held.lock().unwrap().leadership = Some(l);
                    proclaimed?;
                }
                Op::Acquire | Op::AcquireBehindHolder | Op::TryAcquireHeld => {
                    let sem = self.semaphore(&self.s);
                    let r = if op == Op::TryAcquireHeld {
                        recipe!(sem.try_acquire().await?)
                    } else {
                        recipe!(sem.acquire().await?)
                    };
                    self.s_granted(r.token).await;
                    self.held.lock().unwrap().recipe = Some(r);
                }
                Op::ReadBehindWriter | Op::WriteBehindReader => {
                    let lock = self.rwlock(&self.s);
                    let r = if op == Op::ReadBehindWriter {
                        recipe!(lock.read().await?)
                    } else {
                        recipe!(lock.write().await?)
                    };
                    self.s_granted(r.token).await;
                    self.held.lock().unwrap().recipe = Some(r);
                }
                Op::RunWhileLeader => {
                    let grants = &self.grants;
                    let s = &self.s;
                    self.election()
                        .run_while_leader("s", |token| async move {
                            assert!(!s.is_lost(), "granted to a lost session");
                            grants.granted("S", token);
                        })
                        .await?;
                }
            }
            Ok(())
        })
    }

    /// What happens beside the operation: H lets go once S waits behind it (or once the
    /// operation ended without waiting).
    async fn world(&self, op: Op, waits_before: u64) {
        if !op.behind() {
            return;
        }
        let done = self.op_done.notified();
        tokio::select! {
            () = self.faulty.until_count(Call::WaitGone, waits_before + 1) => {}
            () = done => {}
        }
        self.release_h().await;
    }

    async fn release_h(&self) {
        let (g, l, r) = {
            let mut held = self.h_held.lock().unwrap();
            (
                held.guard.take(),
                held.leadership.take(),
                held.recipe.take(),
            )
        };
        if let Some(r) = r {
            r.release.await.unwrap();
        }
        if let Some(g) = g {
            g.release().await.unwrap();
        }
        if let Some(l) = l {
            l.release().await.unwrap();
        }
    }

    /// S lets go of whatever it holds (faults cleared by now).
    async fn release_s(&self) {
        let (g, l, r) = {
            let mut held = self.held.lock().unwrap();
            (
                held.guard.take(),
                held.leadership.take(),
                held.recipe.take(),
            )
        };
        if let Some(r) = r {
            let head = self.rig.outside.head(&self.name).await.unwrap();
            assert_eq!(head.map(|h| h.token()), Some(r.token));
            r.release.await.unwrap();
        }
        if let Some(g) = g {
            let head = self.rig.outside.head(&self.name).await.unwrap();
            assert_eq!(head.map(|h| h.token()), Some(g.fencing_token()));
            g.release().await.unwrap();
        }
        if let Some(l) = l {
            l.release().await.unwrap();
        }
    }

    /// S's entries still in the queue.
    async fn s_entries(&self) -> Vec<baton::Entry> {
        let lease = self.s.lease_id();
        self.rig
            .outside
            .entries(&self.name)
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.lease() == Some(lease))
            .collect()
    }
}

/// The outcome of one case, for the report.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub cases: usize,
    pub dropped: usize,
    pub failed: usize,
    pub succeeded: usize,
}

impl<F, Fut> Harness<F>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Rig>,
{
    /// The steps of `op`: the calls S made, in a run without faults, from the operation's
    /// start until its cleanups were done, as (call, its index among calls of that kind).
    async fn steps(&self, op: Op) -> Vec<(Call, u64)> {
        let world = World::new((self.make_rig)(format!("steps-{op:?}")).await, false).await;
        world.prepare(op).await;
        let start = world.faulty.log().len();
        let waits = world.faulty.count(Call::WaitGone);
        let (result, ()) = tokio::join!(
            async {
                let r = world.op(op).await;
                world.op_done.notify_one();
                r
            },
            world.world(op, waits)
        );
        if !matches!(op, Op::TryLockHeld | Op::TryAcquireHeld) {
            result.unwrap_or_else(|e| panic!("{op:?} without faults: {e}"));
        }
        world.s.settled().await;
        // The operation's calls and its cleanup's; not those of letting go afterwards.
        let log = world.faulty.log().split_off(start);
        world.release_s().await;
        world.release_h().await;
        let mut seen: HashMap<Call, u64> = HashMap::new();
        log.iter()
            // Renewals run on their own clock; `lost_by_the_deadline` covers them.
            .filter(|r| r.call != Call::KeepAlive)
            .map(|r| {
                let n = seen.entry(r.call).or_insert(0);
                *n += 1;
                (r.call, *n)
            })
            .collect()
    }

    /// Runs every (operation, step, fault) case (or the sampled part), then, for each, every
    /// call made after the fault struck (the cleanup's calls among them) with each fault on
    /// top; prints a `HARNESS|...` line per operation and returns the totals.
    pub async fn run_all(&self) -> Tally {
        use futures::StreamExt;
        let tallies: Vec<Tally> = futures::stream::iter(Op::ALL)
            .map(|op| self.run_op(op))
            .buffered(self.parallel.max(1))
            .collect()
            .await;
        let mut total = Tally::default();
        for tally in tallies {
            total.cases += tally.cases;
            total.succeeded += tally.succeeded;
            total.failed += tally.failed;
            total.dropped += tally.dropped;
        }
        total
    }

    /// Every case of `op` the sample takes: the first-level ones whose index among `op`'s
    /// has `i % sample == 0`, and after each the follow-ups with `j % follow_sample == 0`.
    async fn run_op(&self, op: Op) -> Tally {
        let (mut index, mut follow_index) = (0usize, 0usize);
        let steps = self.steps(op).await;
        let mut tally = Tally::default();
        let mut second_steps = 0;
        for &(call, nth) in &steps {
            for fault in faults(self.delay) {
                index += 1;
                if index % self.sample != 0 {
                    continue;
                }
                let first = (call, nth, fault);
                let case = format!("{op:?}/{call:?}#{nth}/{fault:?}");
                let after = self.run_case(op, &[first], &case, &mut tally).await;
                second_steps += after.len();
                for (call2, nth2) in after {
                    for fault2 in faults(self.delay) {
                        follow_index += 1;
                        if follow_index % self.follow_sample != 0 {
                            continue;
                        }
                        let case = format!("{case}+{call2:?}#{nth2}/{fault2:?}");
                        self.run_case(op, &[first, (call2, nth2, fault2)], &case, &mut tally)
                            .await;
                    }
                }
            }
        }
        println!(
            "HARNESS|{}|{op:?}|{}|{}|{}|{}|{}|{}|{}",
            self.backend,
            steps.len(),
            second_steps,
            faults(self.delay).len(),
            tally.cases,
            tally.succeeded,
            tally.failed,
            tally.dropped
        );
        tally
    }

    /// Runs one case with `rules` (call, index among calls of its kind from the operation's
    /// start, fault); returns the calls made after the first rule's call, numbered the same
    /// way (empty if that call was never made).
    async fn run_case(
        &self,
        op: Op,
        rules: &[(Call, u64, Fault)],
        case: &str,
        tally: &mut Tally,
    ) -> Vec<(Call, u64)> {
        let limit = Duration::from_secs(120);
        let rig = (self.make_rig)(case.replace(['/', '#'], "-")).await;
        let world = World::new(rig, true).await;
        // An observer beside every election case.
        let mut events = op
            .is_election()
            .then(|| Election::new(&world.h, &world.name).unwrap().observe());
        within(case, limit, world.prepare(op)).await;
        let waits = world.faulty.count(Call::WaitGone);
        let start = world.faulty.log().len();
        for &(call, nth, fault) in rules {
            world.faulty.inject(call, nth, fault);
        }
        let hangs = rules.iter().any(|(_, _, f)| f.hangs());

        let run = async {
            tokio::join!(
                async {
                    let r = world.op(op).await;
                    world.op_done.notify_one();
                    r
                },
                world.world(op, waits)
            )
            .0
        };
        let outcome = if hangs {
            within(case, limit, async {
                tokio::select! {
                    r = run => Some(r),
                    () = world.faulty.until_hung() => None,
                }
            })
            .await
        } else {
            Some(within(case, limit, run).await)
        };
        // Background work (cleanups) runs under the same script; hung calls are released as
        // they hang, until the session has settled.
        within(case, limit, async {
            loop {
                tokio::select! {
                    () = world.s.settled() => break,
                    () = world.faulty.until_hung() => {
                        world.faulty.release();
                        // Let the released calls run before looking again.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
        })
        .await;
        world.faulty.clear();
        world.faulty.release();
        // What the case's calls were, after the first rule's call.
        let log = world.faulty.log().split_off(start);
        let mut seen: HashMap<Call, u64> = HashMap::new();
        let numbered: Vec<(Call, u64, bool)> = log
            .iter()
            .filter(|r| r.call != Call::KeepAlive)
            .map(|r| {
                let n = seen.entry(r.call).or_insert(0);
                *n += 1;
                (r.call, *n, r.fault.is_some())
            })
            .collect();
        let after: Vec<(Call, u64)> = numbered
            .iter()
            .skip_while(|(c, n, _)| (*c, *n) != (rules[0].0, rules[0].1))
            .skip(1)
            .map(|&(c, n, _)| (c, n))
            .collect();
        tally.cases += 1;
        match &outcome {
            None => tally.dropped += 1,
            Some(Ok(())) => tally.succeeded += 1,
            Some(Err(_)) => tally.failed += 1,
        }
        if op.waits()
            && rules
                .iter()
                .all(|(c, _, f)| !c.changes_state() && !f.hangs())
        {
            assert!(
                matches!(outcome, Some(Ok(()))),
                "{case}: a fault in a read or a wait ended the operation: {outcome:?}"
            );
        }

        // H lets go if it still holds (the operation may have been dropped before).
        within(case, limit, world.release_h()).await;
        within(case, limit, world.s.settled()).await;
        let holds = {
            let held = world.held.lock().unwrap();
            held.guard.is_some() || held.leadership.is_some() || held.recipe.is_some()
        };
        if !holds {
            assert_eq!(
                world.s_entries().await,
                [],
                "{case}: S left an entry behind"
            );
        }
        within(case, limit, world.release_s()).await;
        within(case, limit, world.s.settled()).await;
        assert_eq!(world.s_entries().await, [], "{case}: after S let go");

        // Nothing wedged: a new contender, then S itself, get the lock.
        let w = session_on(Arc::clone(&world.rig.outside), SessionOptions::DEFAULT_TTL).await;
        let g = within(case, limit, Mutex::new(&w, &world.name).unwrap().lock())
            .await
            .unwrap();
        world.grants.granted("W", g.fencing_token());
        g.release().await.unwrap();
        let g = within(case, limit, world.mutex().lock()).await.unwrap();
        world.s_granted(g.fencing_token()).await;
        g.release().await.unwrap();
        w.close().await.unwrap();

        assert_eq!(
            world.faulty.spins(),
            0,
            "{case}: a request loop without backoff"
        );
        assert_eq!(world.faulty.in_flight(), 0, "{case}: calls still in flight");

        if let Some(events) = &mut events {
            let mut last_leader = 0;
            loop {
                match next_event(events).await {
                    LeaderEvent::Vacant
                        if world.rig.outside.head(&world.name).await.unwrap().is_none() =>
                    {
                        break;
                    }
                    LeaderEvent::Elected(l) => {
                        assert!(
                            l.fencing_token().get() > last_leader,
                            "{case}: the observer saw leader {} after {last_leader}",
                            l.fencing_token()
                        );
                        last_leader = l.fencing_token().get();
                    }
                    _ => {}
                }
            }
        }
        world.s.close().await.unwrap();
        world.h.close().await.unwrap();
        after
    }
}

/// How renewals misbehave in [`lost_by_the_deadline`].
pub fn renewal_faults(ttl: Duration) -> [Fault; 3] {
    [
        Fault::FailBefore,
        Fault::HangBefore,
        // Applied at once, answered after the deadline.
        Fault::DelayAfter(ttl * 2),
    ]
}

/// S holds the lock (or waits behind H) when its renewals start to fail, hang or answer late,
/// from the `after + 1`th renewal on. `lost()` fires no later than the server can have
/// expired the lease; S is never granted after that; the successor's token is higher; S's
/// late guarded write is refused.
pub async fn lost_by_the_deadline(
    rig: Rig,
    ttl: Duration,
    after: u64,
    fault: Fault,
    waiting: bool,
) {
    let case = format!("renewals from #{} {fault:?}, waiting: {waiting}", after + 1);
    let name = rig.name("lost-by-deadline");
    let faulty = FaultyBackend::wrap(Arc::clone(&rig.backend));
    let s = session_on(faulty.clone(), ttl).await;
    let h = session_on(Arc::clone(&rig.outside), SessionOptions::DEFAULT_TTL).await;
    let grants = Grants::default();
    let h_guard = if waiting {
        let g = Mutex::new(&h, &name).unwrap().lock().await.unwrap();
        grants.granted("H", g.fencing_token());
        Some(g)
    } else {
        None
    };
    let mutex = Mutex::new(&s, &name).unwrap();
    let mut waiter = Box::pin(mutex.lock());
    let s_guard = if waiting {
        drive_until(&mut waiter, faulty.until_count(Call::WaitGone, 1)).await;
        None
    } else {
        let g = (&mut waiter).await.unwrap();
        grants.granted("S", g.fencing_token());
        Some(g)
    };
    within(&case, ttl * 4, faulty.until_count(Call::KeepAlive, after)).await;
    faulty.inject_every(Call::KeepAlive, fault);
    let lost = s.lost();
    let reason = within(&case, ttl * 4, lost).await;
    let lost_at = tokio::time::Instant::now();
    assert_eq!(reason, LostReason::Expired, "{case}");
    // The server may expire the lease one TTL after the last renewal it applied (or after
    // the grant, if none was).
    let applied = faulty
        .log()
        .iter()
        .filter(|r| {
            matches!(r.call, Call::KeepAlive | Call::GrantLease)
                && !matches!(r.fault, Some(Fault::FailBefore | Fault::HangBefore))
        })
        .map(|r| r.at)
        .max()
        .unwrap();
    assert!(
        lost_at <= applied + ttl,
        "{case}: lost() fired {:?} after the server could expire the lease",
        lost_at - (applied + ttl)
    );
    if let Some(g) = h_guard {
        g.release().await.unwrap();
    }
    if waiting {
        let result = within(&case, ttl * 4, waiter).await;
        assert!(
            matches!(result, Err(Error::SessionLost(_))),
            "{case}: a lost session's wait must end in an error: {result:?}"
        );
    }
    // A successor once the server let the lease go; the lost holder's late write refused.
    let w = session_on(Arc::clone(&rig.outside), SessionOptions::DEFAULT_TTL).await;
    let next = within(&case, ttl * 4, Mutex::new(&w, &name).unwrap().lock())
        .await
        .unwrap();
    grants.granted("W", next.fencing_token());
    if let Some(g) = s_guard {
        let late = g.write(&[WriteOp::put(rig.name("late"), "x")]).await;
        assert!(
            matches!(late, Err(Error::NotOwner { .. })),
            "{case}: {late:?}"
        );
        assert_eq!(rig.outside.read(&rig.name("late")).await.unwrap(), None);
        drop(g);
    }
    let again = Mutex::new(&s, &name).unwrap().lock().await;
    assert!(
        matches!(again, Err(Error::SessionLost(_))),
        "{case}: nothing is granted to a lost session: {again:?}"
    );
    next.release().await.unwrap();
    faulty.clear();
    faulty.release();
    w.close().await.unwrap();
    h.close().await.unwrap();
    println!("HARNESS-SESSION|{case}|ok");
}
