//! The deterministic simulation of baton (issue #37): many clients of every recipe on one
//! in-memory store, through a simulated network that delays, loses, duplicates and delivers
//! late, with cancellations, pauses, frozen clients, a starved keep-alive driver, session
//! expiries, wall-clock steps and a store that loses or rolls back its state; one history on
//! one (simulated) clock, and a checker.
//!
//! One seed is one schedule. It runs on a current-thread tokio runtime with paused time:
//! tasks run one at a time in an order that depends only on the seed, time advances only
//! when every task waits, and every random choice comes from generators seeded from the
//! seed. Nothing reads the wall clock or the network (the in-memory store's stand-in for the
//! wall clock is tokio's clock, which `baton::testing::step_wall_clock` steps), so a seed
//! replays bit for bit (the runner checks it: [`run`] twice gives the same history).

#![allow(dead_code, unreachable_pub)]

pub mod check;
pub mod net;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use baton::{
    Backend, Barrier, DoubleBarrier, Election, Error, Fence, FencingToken, LeaderEvent, LostReason,
    MemoryBackend, MemoryFence, MultiLock, Mutex, RwLock, Semaphore, Session, SessionOptions,
    Ticket,
};
use futures::{FutureExt, StreamExt};
use tokio::time::Instant;

use net::{Faults, SimNet};

/// A small, fast, seedable generator (SplitMix64): the same seed, the same numbers.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// `true` with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    /// A generator of its own, for one task.
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next())
    }
}

/// The kinds of recipe a name is used with in one schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipe {
    Mutex,
    Semaphore,
    RwLock,
    Election,
}

/// What a schedule does: drawn from its seed.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    pub ttl: Duration,
    pub grace: Duration,
    /// The names and what each is used with; a MultiLock client takes the first two mutexes.
    pub names: Vec<(String, Recipe)>,
    pub clients_per_name: usize,
    pub multilock_clients: usize,
    /// Acquisitions each client attempts (the shrinker lowers it).
    pub steps: usize,
    pub faults: Faults,
    /// Store faults: how many times the store loses its state, and is restored.
    pub losses: usize,
    pub restores: usize,
    /// Whether clients pause (cut off, work stopped) while holding.
    pub pauses: bool,
    /// A semaphore's first limit.
    pub first_limit: u32,
    /// Barriers in this schedule: a Barrier raised and lowered by a gate client, waited on
    /// by others; a DoubleBarrier of this many members (0: none), a name per round; and
    /// leaders that work through `run_while_leader`. Drawn from a generator of their own,
    /// so that a schedule drawn without them is the one its seed drew before they existed.
    pub barriers: bool,
    pub double_members: u32,
    /// Process faults, drawn from a generator of their own (so that a schedule drawn without
    /// them is the one its seed drew before they existed): whether clients freeze (their
    /// network holds what they send and are sent, their work stops, and the keep-alive
    /// driver, which the simulated clients share as the tasks of one runtime, is starved as
    /// long); how many times the driver alone is starved; how many times the wall clock is
    /// stepped at a random moment (and whether it is stepped at each store loss).
    pub freezes: bool,
    pub starvations: usize,
    pub clock_steps: usize,
    pub steps_at_losses: bool,
}

impl Plan {
    pub fn from_seed(seed: u64, steps: Option<usize>) -> Plan {
        let mut rng = Rng::new(seed);
        let ttl = Duration::from_secs(2 + rng.below(4));
        let grace = ttl + Duration::from_secs(rng.below(3));
        let recipes = [
            Recipe::Mutex,
            Recipe::Semaphore,
            Recipe::RwLock,
            Recipe::Election,
        ];
        // Every schedule has a mutex pair (for MultiLock) and one name of another kind; some
        // share a name between kinds through the nested RwLock layout.
        let mut names = vec![
            ("m/a".to_owned(), Recipe::Mutex),
            ("m/b".to_owned(), Recipe::Mutex),
        ];
        let extra = 1 + rng.below(2) as usize;
        for i in 0..extra {
            let recipe = recipes[1 + rng.below(3) as usize];
            names.push((format!("r{i}"), recipe));
        }
        let faulty = rng.chance(850);
        let f = |rng: &mut Rng, max: u64| if faulty { rng.below(max) as u32 } else { 0 };
        let faults = Faults {
            delay: f(&mut rng, 120),
            fail_before: f(&mut rng, 40),
            lose_answer: f(&mut rng, 40),
            duplicate: f(&mut rng, 30),
            late: f(&mut rng, 30),
        };
        Plan {
            seed,
            ttl,
            grace,
            names,
            clients_per_name: 3 + rng.below(3) as usize,
            multilock_clients: 1 + rng.below(2) as usize,
            steps: steps.unwrap_or(3 + rng.below(5) as usize),
            faults,
            losses: if rng.chance(350) { 1 } else { 0 },
            restores: if rng.chance(250) { 1 } else { 0 },
            pauses: rng.chance(600),
            first_limit: 1 + rng.below(3) as u32,
            barriers: false,
            double_members: 0,
            freezes: false,
            starvations: 0,
            clock_steps: 0,
            steps_at_losses: false,
        }
        .with_barriers(seed)
        .with_process_faults(seed)
    }

    /// The constant is chosen so that the regression seeds draw none of these: each stays the
    /// schedule that found its bug.
    const PROCESS_FAULTS: u64 = 0x5157_0000_f2ee_2e1c;

    fn with_process_faults(mut self, seed: u64) -> Plan {
        let mut rng = Rng::new(seed ^ Self::PROCESS_FAULTS);
        self.freezes = rng.chance(500);
        self.starvations = if rng.chance(400) {
            1 + rng.below(2) as usize
        } else {
            0
        };
        self.clock_steps = if rng.chance(500) {
            1 + rng.below(3) as usize
        } else {
            0
        };
        self.steps_at_losses = rng.chance(500);
        self
    }

    fn with_barriers(mut self, seed: u64) -> Plan {
        // The constant is chosen so that the regression seeds, found before barriers existed,
        // draw none: each stays the schedule that found its bug.
        let mut rng = Rng::new(seed ^ 0xba22_1e25_d0b1_e006);
        if rng.chance(600) {
            self.barriers = true;
            self.double_members = 2 + rng.below(2) as u32;
        }
        self
    }
}

/// One thing that happened, at a simulated instant (ms since the schedule began).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Event {
    /// A hold began: `name`'s lock (or permit, read lock, leadership) granted to `client`.
    Granted {
        at: u64,
        hold: u64,
        client: usize,
        name: String,
        kind: Kind,
        token: u64,
        /// When the session it was granted on began.
        session_at: u64,
        /// That session's deadline at the grant: nothing may be granted at or after it.
        deadline: u64,
    },
    /// A hold ended: released by its holder (the release began) or lost.
    Ended { at: u64, hold: u64, lost: bool },
    /// A write through the fence was acknowledged: an increment of `name`'s counter.
    Acked { at: u64, name: String, token: u64 },
    /// A semaphore's stored limit is now `limit`.
    Limit { at: u64, name: String, limit: u32 },
    /// A change of a semaphore's limit to `to` is in flight: from now on the stored limit may
    /// be `to`, or still what it was (which the administrator may not know, after a loss).
    LimitMayRise { at: u64, name: String, to: u32 },
    /// A snapshot of the store was taken (a restore later brings it back).
    Snapshot { at: u64 },
    /// The store lost its state (`restored`: went back to a snapshot).
    StoreLost { at: u64, restored: bool },
    /// An election observer saw a leader, or its proclamation (or a vacancy: `token` 0),
    /// with the leader's value.
    Observed {
        at: u64,
        observer: usize,
        name: String,
        token: u64,
        value: String,
    },
    /// A leader's proclamation of `value` was acknowledged.
    Proclaimed {
        at: u64,
        name: String,
        token: u64,
        value: String,
    },
    /// A Barrier hold was acknowledged (the barrier is up from here until `BarrierDown`).
    BarrierUp { at: u64, hold: u64, client: usize },
    /// A Barrier hold ended: its release began, or its holder was told it was lost.
    BarrierDown { at: u64, hold: u64 },
    /// A wait on the Barrier that began at `began` returned: the barrier was down.
    BarrierWaited { at: u64, began: u64, client: usize },
    /// A DoubleBarrier member began to enter `round`.
    EnterBegan {
        at: u64,
        round: usize,
        client: usize,
    },
    /// A DoubleBarrier member's enter returned: every member had entered.
    Entered {
        at: u64,
        round: usize,
        client: usize,
    },
    /// A DoubleBarrier member began to leave.
    LeaveBegan {
        at: u64,
        round: usize,
        client: usize,
    },
    /// A DoubleBarrier member's leave returned: every member had left.
    Left {
        at: u64,
        round: usize,
        client: usize,
    },
    /// A DoubleBarrier member is out of `round` without leaving: its enter or leave failed or
    /// was given up, or its session was lost (its entry goes with it).
    RoundGone {
        at: u64,
        round: usize,
        client: usize,
    },
    /// A `run_while_leader` work went on at `at`, after its session was lost at `lost`.
    WorkOutlived { at: u64, client: usize, lost: u64 },
    /// A client was paused (cut off, its work stopped) from `at` for `ms`.
    Paused { at: u64, client: usize, ms: u64 },
    /// A client was frozen from `at` for `ms` (what it sends and is sent held, its work
    /// stopped, the keep-alive driver starved as long); its session's deadline then was
    /// `deadline` (it had none: `None`).
    Frozen {
        at: u64,
        client: usize,
        ms: u64,
        deadline: Option<u64>,
    },
    /// The keep-alive driver alone was starved from `at` for `ms`.
    Starved { at: u64, ms: u64 },
    /// The wall clock baton reads was stepped by `by_ms` (negative: back).
    ClockStep { at: u64, by_ms: i64 },
    /// The schedule ended: the fence's counters as they stand, the entries left.
    Final {
        at: u64,
        counters: Vec<(String, u64)>,
        left: usize,
    },
    /// After the faults healed, a clean client took every name within the bound.
    Progress {
        at: u64,
        name: String,
        ok: bool,
        error: String,
    },
}

/// What a hold is, for the exclusion rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Exclusive,
    Read,
    Permit,
}

/// The history of one schedule.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub events: Vec<Event>,
    next_hold: u64,
}

#[derive(Clone)]
struct Ctx {
    history: Arc<StdMutex<History>>,
    start: Instant,
    fence: Arc<MemoryFence>,
    plan: Arc<Plan>,
    /// Process faults drawn: the driver starved on its own, the wall clock stepped.
    process_faults: Arc<StdMutex<[u64; 2]>>,
    /// When the last freeze or starvation drawn so far ends; set once the faults heal, after
    /// which nothing freezes any more.
    quiet_at: Arc<StdMutex<Instant>>,
    healed: Arc<std::sync::atomic::AtomicBool>,
}

impl Ctx {
    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn record(&self, event: Event) {
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .events
            .push(event);
    }

    /// A deadline as ms since the schedule began.
    fn ms(&self, at: std::time::Instant) -> u64 {
        let at = Instant::from_std(at).saturating_duration_since(self.start);
        u64::try_from(at.as_millis()).unwrap_or(u64::MAX)
    }

    /// Freezes `client` for `ms` (its network holds everything, the keep-alive driver is
    /// starved as long: the process is frozen) and records it. The caller stops its work.
    fn freeze(&self, net: &SimNet, session: Option<&Session>, client: usize, ms: u64) {
        if self.healed.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let d = Duration::from_millis(ms);
        self.quiet_after(d);
        self.record(Event::Frozen {
            at: self.now(),
            client,
            ms,
            deadline: session.map(|s| self.ms(s.deadline())),
        });
        net.freeze(d);
        let _ = baton::testing::starve_keep_alive(d);
    }

    /// Heals the process faults: nothing freezes or starves from now on; returns when those
    /// in progress have ended.
    async fn heal_process(&self) {
        self.healed.store(true, std::sync::atomic::Ordering::SeqCst);
        let quiet = *self.quiet_at.lock().unwrap_or_else(|p| p.into_inner());
        if quiet > Instant::now() {
            tokio::time::sleep_until(quiet).await;
        }
    }

    /// Steps the wall clock baton reads, and records it.
    fn step_clock(&self, by_ms: i64) {
        self.record(Event::ClockStep {
            at: self.now(),
            by_ms,
        });
        self.count_process_fault(1);
        baton::testing::step_wall_clock(by_ms.saturating_mul(1000));
    }

    /// Starves the keep-alive driver for `d` (unless the faults healed).
    fn starve(&self, d: Duration) {
        if self.healed.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        self.quiet_after(d);
        let _ = baton::testing::starve_keep_alive(d);
    }

    fn quiet_after(&self, d: Duration) {
        let mut quiet = self.quiet_at.lock().unwrap_or_else(|p| p.into_inner());
        *quiet = (*quiet).max(Instant::now() + d);
    }

    fn count_process_fault(&self, i: usize) {
        self.process_faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())[i] += 1;
    }

    fn new_hold(&self) -> u64 {
        let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        h.next_hold += 1;
        h.next_hold
    }

    /// Records a grant, and watches its loss: `Ended { lost: true }` when `lost` resolves
    /// first. Returns the hold's id, and what tells the watcher the holder let go.
    /// A frozen holder hears of its loss only once it thaws.
    #[allow(clippy::too_many_arguments)]
    fn granted(
        &self,
        net: &SimNet,
        session: &Session,
        client: usize,
        name: &str,
        kind: Kind,
        token: FencingToken,
        session_at: u64,
        lost: impl std::future::Future<Output = LostReason> + Send + 'static,
    ) -> (u64, Arc<tokio::sync::Notify>) {
        let ended = Arc::new(tokio::sync::Notify::new());
        let watcher = Arc::clone(&ended);
        let hold = self.new_hold();
        self.record(Event::Granted {
            at: self.now(),
            hold,
            client,
            name: name.to_owned(),
            kind,
            token: token.get(),
            session_at,
            deadline: self.ms(session.deadline()),
        });
        let (ctx, net) = (self.clone(), net.clone());
        tokio::spawn(async move {
            tokio::select! {
                biased;
                () = watcher.notified() => {}
                _ = lost => {
                    net.thawed().await;
                    ctx.record(Event::Ended { at: ctx.now(), hold, lost: true });
                }
            }
        });
        (hold, ended)
    }

    /// The holder lets go (before its release is sent): the hold ends now.
    fn released(&self, hold: u64, watcher: &tokio::sync::Notify) {
        watcher.notify_one();
        self.record(Event::Ended {
            at: self.now(),
            hold,
            lost: false,
        });
    }

    /// The fenced work of a holder: claim, read the counter, maybe pause or freeze, write it
    /// + 1. (A frozen client touches the fence only once it thaws.)
    async fn work(
        &self,
        rng: &mut Rng,
        net: &SimNet,
        session: &Session,
        client: usize,
        name: &str,
        ticket: Ticket,
    ) {
        let token = ticket.token().get();
        net.thawed().await;
        let Ok(before) = self.fence.claim(name, ticket.clone()).await else {
            return;
        };
        let n: u64 = before
            .as_deref()
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if self.plan.pauses && rng.chance(150) {
            // Paused between its read and its write (a GC pause, SIGSTOP): shorter or longer
            // than its lease. Cut off meanwhile, so its renewals fail too.
            let ttl = u64::try_from(self.plan.ttl.as_millis()).unwrap_or(1000);
            let ms = if rng.chance(500) {
                rng.below(ttl / 2) + 1
            } else {
                ttl + rng.below(2 * ttl)
            };
            if self.plan.freezes && net.draw(500) {
                // Frozen instead (SIGSTOP): its renewals are not sent, rather than failing.
                self.freeze(net, Some(session), client, ms);
                net.thawed().await;
            } else {
                self.record(Event::Paused {
                    at: self.now(),
                    client,
                    ms,
                });
                net.cut_off(Duration::from_millis(ms));
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
        }
        net.thawed().await;
        if self
            .fence
            .write(name, ticket, (n + 1).to_string().as_bytes())
            .await
            .is_ok()
        {
            self.record(Event::Acked {
                at: self.now(),
                name: name.to_owned(),
                token,
            });
        }
    }
}

/// A client's session, started again whenever it is lost.
struct Client {
    id: usize,
    net: SimNet,
    session: Option<(Session, u64)>,
    /// Lost sessions an odd-numbered client keeps until it ends, as an application that
    /// holds on to its `Session` may: a lost session must stop renewing by itself, or its
    /// entries (brought back by a restore) would stay for as long as it is kept.
    kept: Vec<Session>,
    ttl: Duration,
    /// The session in use, for a freeze that comes later (its deadline is recorded).
    current: Arc<StdMutex<Option<Session>>>,
}

impl Client {
    async fn session(&mut self, ctx: &Ctx) -> Option<(Session, u64)> {
        if let Some((s, at)) = &self.session
            && !s.is_lost()
        {
            return Some((s.clone(), *at));
        }
        if let Some((lost, _)) = self.session.take()
            && self.id % 2 == 1
        {
            self.kept.push(lost);
        }
        // A grant may fail on the network: a few tries, then give this step up.
        for _ in 0..5 {
            let options = SessionOptions::new().with_ttl(self.ttl);
            match Session::with_options(self.net.clone(), options).await {
                Ok(s) => {
                    let at = ctx.now();
                    *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(s.clone());
                    self.session = Some((s.clone(), at));
                    return Some((s, at));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        None
    }
}

/// A hold in progress: what the client releases.
enum Guard {
    Mutex(baton::MutexGuard),
    Read(baton::RwLockReadGuard),
    Write(baton::RwLockWriteGuard),
    Permit(baton::SemaphorePermit),
    Lead(baton::Leadership),
}

impl Guard {
    fn token(&self) -> FencingToken {
        match self {
            Guard::Mutex(g) => g.fencing_token(),
            Guard::Read(g) => g.fencing_token(),
            Guard::Write(g) => g.fencing_token(),
            Guard::Permit(g) => g.fencing_token(),
            Guard::Lead(g) => g.fencing_token(),
        }
    }

    fn lost(&self) -> futures::future::BoxFuture<'static, LostReason> {
        match self {
            Guard::Mutex(g) => g.lost().boxed(),
            Guard::Read(g) => g.lost().boxed(),
            Guard::Write(g) => g.lost().boxed(),
            Guard::Permit(g) => g.lost().boxed(),
            Guard::Lead(g) => g.lost().boxed(),
        }
    }

    async fn release(self, rng: &mut Rng) {
        // Sometimes dropped instead: the release goes on in the background.
        if rng.chance(200) {
            return;
        }
        let _ = match self {
            Guard::Mutex(g) => g.release().await,
            Guard::Read(g) => g.release().await,
            Guard::Write(g) => g.release().await,
            Guard::Permit(g) => g.release().await,
            Guard::Lead(g) => g.release().await,
        };
    }
}

/// One acquisition by `client` on `name` (`recipe`), maybe cancelled part way.
async fn acquire(
    rng: &mut Rng,
    session: &Session,
    name: &str,
    recipe: Recipe,
    permits: u32,
    may_cancel: bool,
) -> Option<(Guard, Kind)> {
    let wait = Duration::from_millis(200 + rng.below(6_000));
    let cancel = may_cancel && rng.chance(250);
    let attempt = async {
        Some(match recipe {
            Recipe::Mutex => (
                Guard::Mutex(Mutex::new(session, name).ok()?.lock().await.ok()?),
                Kind::Exclusive,
            ),
            Recipe::Semaphore => {
                // Asked for with the limit stored now (a handle asks for one, and a stored
                // one that differs is refused); the first, if none is stored.
                let stored = Semaphore::new(session, name, permits)
                    .ok()?
                    .limit()
                    .await
                    .ok()?;
                let permits = stored.unwrap_or(permits);
                (
                    Guard::Permit(
                        Semaphore::new(session, name, permits)
                            .ok()?
                            .acquire()
                            .await
                            .ok()?,
                    ),
                    Kind::Permit,
                )
            }
            Recipe::RwLock => {
                let lock = RwLock::new(session, name).ok()?;
                if rng.chance(600) {
                    (Guard::Read(lock.read().await.ok()?), Kind::Read)
                } else {
                    (Guard::Write(lock.write().await.ok()?), Kind::Exclusive)
                }
            }
            Recipe::Election => (
                Guard::Lead(
                    Election::new(session, name)
                        .ok()?
                        .campaign(format!("c{}", rng.below(100)))
                        .await
                        .ok()?,
                ),
                Kind::Exclusive,
            ),
        })
    };
    if cancel {
        // Dropped at whatever await point it reached.
        tokio::time::timeout(wait, attempt).await.ok().flatten()
    } else {
        attempt.await
    }
}

/// A client of one name: `steps` acquisitions, each with fenced work.
async fn name_client(ctx: Ctx, mut client: Client, mut rng: Rng, name: String, recipe: Recipe) {
    for _ in 0..ctx.plan.steps {
        tokio::time::sleep(Duration::from_millis(rng.below(1_500))).await;
        let Some((session, session_at)) = client.session(&ctx).await else {
            continue;
        };
        if recipe == Recipe::Election && ctx.plan.barriers && rng.chance(400) {
            lead_while(&ctx, &client, &mut rng, &session, session_at, &name).await;
            continue;
        }
        if ctx.plan.freezes && client.net.draw(150) {
            // Frozen at some moment of this step: waiting, holding, or after.
            freeze_later(&ctx, &client);
        }
        let Some((guard, kind)) = acquire(
            &mut rng,
            &session,
            &name,
            recipe,
            ctx.plan.first_limit,
            true,
        )
        .await
        else {
            continue;
        };
        let (hold, ended) = ctx.granted(
            &client.net,
            &session,
            client.id,
            &name,
            kind,
            guard.token(),
            session_at,
            guard.lost(),
        );
        let ticket = Ticket::new(guard.token(), name.as_str());
        // Readers share: only exclusive holders and permits write the counter (a permit's
        // writes race with other permits', so they write their own resource).
        let resource = match kind {
            Kind::Exclusive => name.clone(),
            Kind::Permit | Kind::Read => format!("{name}/{}", client.id),
        };
        ctx.work(
            &mut rng,
            &client.net,
            &session,
            client.id,
            &resource,
            ticket,
        )
        .await;
        let mut guard = guard;
        if let Guard::Lead(leader) = &mut guard
            && rng.chance(300)
        {
            let value = format!("p{}", rng.below(100));
            if leader.proclaim(value.clone()).await.is_ok() {
                ctx.record(Event::Proclaimed {
                    at: ctx.now(),
                    name: name.clone(),
                    token: leader.fencing_token().get(),
                    value,
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.below(800))).await;
        client.net.thawed().await;
        ctx.released(hold, &ended);
        guard.release(&mut rng).await;
    }
}

/// Freezes `client` at a moment drawn from its process-fault generator, within the next few
/// seconds, for less than half its TTL, about its TTL, or up to three times it.
fn freeze_later(ctx: &Ctx, client: &Client) {
    let ttl = u64::try_from(ctx.plan.ttl.as_millis()).unwrap_or(1000);
    let after = client.net.draw_below(4_000);
    let ms = match client.net.draw_below(3) {
        0 => 1 + client.net.draw_below(ttl / 2),
        1 => ttl / 2 + client.net.draw_below(ttl),
        _ => ttl + client.net.draw_below(2 * ttl),
    };
    let (ctx, net, current, id) = (
        ctx.clone(),
        client.net.clone(),
        Arc::clone(&client.current),
        client.id,
    );
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(after)).await;
        let session = current.lock().unwrap_or_else(|p| p.into_inner()).clone();
        ctx.freeze(&net, session.as_ref(), id, ms);
    });
}

/// The Barrier's gate: raises it, holds it up a while, lowers it; records when it is up
/// (from the acknowledgement) and when it stops being up (the release begins, or the holder
/// is told it was lost: no later than the server can end its lease).
async fn barrier_gate(ctx: Ctx, mut client: Client, mut rng: Rng) {
    for _ in 0..ctx.plan.steps {
        tokio::time::sleep(Duration::from_millis(rng.below(1_500))).await;
        let Some((session, _)) = client.session(&ctx).await else {
            continue;
        };
        let Ok(barrier) = Barrier::new(&session, "gate") else {
            continue;
        };
        let Ok(guard) = barrier.hold().await else {
            continue;
        };
        let hold = ctx.new_hold();
        ctx.record(Event::BarrierUp {
            at: ctx.now(),
            hold,
            client: client.id,
        });
        let lost = tokio::select! {
            _ = guard.lost() => true,
            () = tokio::time::sleep(Duration::from_millis(rng.below(2_000))) => false,
        };
        ctx.record(Event::BarrierDown {
            at: ctx.now(),
            hold,
        });
        if !lost {
            let _ = guard.release().await;
        }
    }
}

/// Waits on the Barrier now and then; records each wait that returned (the barrier was
/// down at some moment since the wait began).
async fn barrier_waiter(ctx: Ctx, mut client: Client, mut rng: Rng) {
    for _ in 0..ctx.plan.steps {
        tokio::time::sleep(Duration::from_millis(rng.below(1_500))).await;
        let Some((session, _)) = client.session(&ctx).await else {
            continue;
        };
        let Ok(barrier) = Barrier::new(&session, "gate") else {
            continue;
        };
        let began = ctx.now();
        let bound = ctx.plan.grace + ctx.plan.ttl * 4;
        if let Ok(Ok(())) = tokio::time::timeout(bound, barrier.wait()).await {
            ctx.record(Event::BarrierWaited {
                at: ctx.now(),
                began,
                client: client.id,
            });
        }
    }
}

/// A DoubleBarrier member: round after round (a name per round, as the docs ask), enters,
/// works a while, leaves. A member that gives a round up (its enter or leave failed or took
/// too long, or its session was lost) says so, and goes on with the next round.
async fn double_member(ctx: Ctx, mut client: Client, mut rng: Rng) {
    let members = ctx.plan.double_members;
    let bound = ctx.plan.grace + ctx.plan.ttl * 4;
    for round in 0..ctx.plan.steps {
        tokio::time::sleep(Duration::from_millis(rng.below(500))).await;
        let gone = |ctx: &Ctx, id: usize| {
            ctx.record(Event::RoundGone {
                at: ctx.now(),
                round,
                client: id,
            });
        };
        let Some((session, _)) = client.session(&ctx).await else {
            continue;
        };
        let Ok(barrier) = DoubleBarrier::new(&session, format!("db/{round}"), members) else {
            continue;
        };
        ctx.record(Event::EnterBegan {
            at: ctx.now(),
            round,
            client: client.id,
        });
        let entered = match tokio::time::timeout(bound, barrier.enter()).await {
            Ok(Ok(entered)) => entered,
            _ => {
                gone(&ctx, client.id);
                continue;
            }
        };
        ctx.record(Event::Entered {
            at: ctx.now(),
            round,
            client: client.id,
        });
        let lost = tokio::select! {
            _ = entered.lost() => true,
            () = tokio::time::sleep(Duration::from_millis(rng.below(1_000))) => false,
        };
        if lost {
            gone(&ctx, client.id);
            continue;
        }
        ctx.record(Event::LeaveBegan {
            at: ctx.now(),
            round,
            client: client.id,
        });
        match tokio::time::timeout(bound, entered.leave()).await {
            Ok(Ok(())) => ctx.record(Event::Left {
                at: ctx.now(),
                round,
                client: client.id,
            }),
            _ => gone(&ctx, client.id),
        }
    }
}

/// Leads through `run_while_leader`: the work is the fenced work of any holder. The hold is
/// recorded from the work's start; it ends when the work ends (`Ok`: nobody else led
/// meanwhile, so the checker holds it to that), or when the work was dropped at a loss (told
/// no later than a successor's grant). A work that finished but whose leadership could not be
/// confirmed to its end (`LeadershipLost`) ended unnoticed at some unknown moment: its hold
/// is taken as ended at once (its fenced writes are still checked).
async fn lead_while(
    ctx: &Ctx,
    client: &Client,
    rng: &mut Rng,
    session: &Session,
    session_at: u64,
    name: &str,
) {
    /// How the work went: its hold, when it was granted, and when it finished.
    #[derive(Default)]
    struct Work {
        hold: u64,
        granted: u64,
        finished: Option<u64>,
    }
    /// Records the hold's end if the work is dropped before it finished (at a loss).
    struct OnDrop(Ctx, Arc<StdMutex<Option<Work>>>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            let work = self.1.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(work) = work.as_ref()
                && work.finished.is_none()
            {
                self.0.record(Event::Ended {
                    at: self.0.now(),
                    hold: work.hold,
                    lost: true,
                });
            }
        }
    }
    let Ok(election) = Election::new(session, name) else {
        return;
    };
    let state: Arc<StdMutex<Option<Work>>> = Arc::default();
    // When the session was lost (the leadership with it): the work must not go on after.
    let lost_at: Arc<StdMutex<Option<u64>>> = Arc::default();
    let watcher = tokio::spawn({
        let (ctx, lost_at, lost) = (ctx.clone(), Arc::clone(&lost_at), session.lost());
        async move {
            let _ = lost.await;
            *lost_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(ctx.now());
        }
    });
    let outlived = |ctx: &Ctx| {
        let lost = *lost_at.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(lost) = lost
            && lost < ctx.now()
        {
            ctx.record(Event::WorkOutlived {
                at: ctx.now(),
                client: client.id,
                lost,
            });
        }
    };
    let mut work_rng = rng.fork();
    let value = format!("w{}", rng.below(100));
    let (net, id) = (client.net.clone(), client.id);
    let out = election
        .run_while_leader(value, |token| {
            let state = Arc::clone(&state);
            async move {
                let hold = ctx.new_hold();
                let granted = ctx.now();
                ctx.record(Event::Granted {
                    at: granted,
                    hold,
                    client: id,
                    name: name.to_owned(),
                    kind: Kind::Exclusive,
                    token: token.get(),
                    session_at,
                    deadline: ctx.ms(session.deadline()),
                });
                *state.lock().unwrap_or_else(|p| p.into_inner()) = Some(Work {
                    hold,
                    granted,
                    finished: None,
                });
                let _on_drop = OnDrop(ctx.clone(), Arc::clone(&state));
                ctx.work(
                    &mut work_rng,
                    &net,
                    session,
                    id,
                    name,
                    Ticket::new(token, name),
                )
                .await;
                outlived(ctx);
                tokio::time::sleep(Duration::from_millis(work_rng.below(500))).await;
                outlived(ctx);
                if let Some(work) = state.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                    work.finished = Some(ctx.now());
                }
            }
        })
        .await;
    watcher.abort();
    let Some(work) = state.lock().unwrap_or_else(|p| p.into_inner()).take() else {
        return;
    };
    // Dropped at a loss: `OnDrop` recorded its end.
    let Some(finished) = work.finished else {
        return;
    };
    let (at, lost) = if out.is_ok() {
        (finished, false)
    } else {
        (work.granted, true)
    };
    ctx.record(Event::Ended {
        at,
        hold: work.hold,
        lost,
    });
}

/// A client that takes both mutexes of the pair as one MultiLock.
async fn multilock_client(ctx: Ctx, mut client: Client, mut rng: Rng, names: [String; 2]) {
    for _ in 0..ctx.plan.steps {
        tokio::time::sleep(Duration::from_millis(rng.below(2_000))).await;
        let Some((session, session_at)) = client.session(&ctx).await else {
            continue;
        };
        let Ok(multi) = MultiLock::new(&session, names.clone()) else {
            continue;
        };
        let taken = if rng.chance(250) {
            let wait = Duration::from_millis(200 + rng.below(5_000));
            tokio::time::timeout(wait, multi.lock()).await.ok()
        } else {
            Some(multi.lock().await)
        };
        let Some(Ok(guard)) = taken else { continue };
        let mut holds = Vec::new();
        for (name, mutex_guard) in names.iter().zip(guard.guards()) {
            let (hold, ended) = ctx.granted(
                &client.net,
                &session,
                client.id,
                name,
                Kind::Exclusive,
                mutex_guard.fencing_token(),
                session_at,
                mutex_guard.lost(),
            );
            holds.push((hold, ended, mutex_guard.ticket(), name.clone()));
        }
        for (_, _, ticket, name) in &holds {
            ctx.work(
                &mut rng,
                &client.net,
                &session,
                client.id,
                name,
                ticket.clone(),
            )
            .await;
        }
        tokio::time::sleep(Duration::from_millis(rng.below(500))).await;
        client.net.thawed().await;
        for (hold, ended, _, _) in &holds {
            ctx.released(*hold, ended);
        }
        let _ = guard.release().await;
    }
}

/// A semaphore's administrator: changes the stored limit now and then (lowering it below the
/// permits held, too), and records each change it knows was made.
async fn limit_admin(ctx: Ctx, mut client: Client, mut rng: Rng, name: String) {
    let mut limit = ctx.plan.first_limit;
    for _ in 0..ctx.plan.steps {
        tokio::time::sleep(Duration::from_millis(500 + rng.below(3_000))).await;
        let Some((session, _)) = client.session(&ctx).await else {
            continue;
        };
        let Ok(sem) = Semaphore::new(&session, &name, limit) else {
            continue;
        };
        let to = 1 + rng.below(3) as u32;
        // While the change is in flight (its answer may come late, or be lost) either limit
        // may be the stored one: the checker allows the higher.
        if to > limit {
            ctx.record(Event::LimitMayRise {
                at: ctx.now(),
                name: name.clone(),
                to,
            });
        }
        match sem.set_limit(limit, to).await {
            Ok(()) => {
                limit = to;
                ctx.record(Event::Limit {
                    at: ctx.now(),
                    name: name.clone(),
                    limit,
                });
            }
            Err(Error::LimitMismatch { stored, .. }) => {
                // Nothing stored (the store lost it): the next permit stores the first limit,
                // as every client asks for that when none is stored.
                limit = stored
                    .trim_matches('`')
                    .parse()
                    .unwrap_or(ctx.plan.first_limit);
                ctx.record(Event::Limit {
                    at: ctx.now(),
                    name: name.clone(),
                    limit,
                });
            }
            // Maybe applied: read what is stored. If that fails too, nothing is known (after a
            // loss, not even that the limit was `limit`): nothing is recorded, and the next
            // change learns it from its refusal. (The checker kept the higher of the two.)
            Err(_) => match sem.limit().await {
                Ok(Some(now)) => {
                    limit = now;
                    ctx.record(Event::Limit {
                        at: ctx.now(),
                        name: name.clone(),
                        limit,
                    });
                }
                _ => limit = limit.max(to),
            },
        }
    }
}

/// An election observer: records every leader and vacancy it is told of.
async fn observer(ctx: Ctx, id: usize, session: Session, name: String, until: Instant) {
    let Ok(election) = Election::new(&session, &name) else {
        return;
    };
    let mut events = election.observe();
    loop {
        let next = tokio::select! {
            next = events.next() => next,
            () = tokio::time::sleep_until(until) => return,
        };
        let (token, value) = match next {
            Some(Ok(LeaderEvent::Elected(leader) | LeaderEvent::Proclaimed(leader))) => (
                leader.fencing_token().get(),
                String::from_utf8_lossy(leader.value()).into_owned(),
            ),
            Some(Ok(LeaderEvent::Vacant | LeaderEvent::Skipped)) => (0, String::new()),
            Some(Ok(_) | Err(_)) => continue,
            None => return,
        };
        ctx.record(Event::Observed {
            at: ctx.now(),
            observer: id,
            name: name.clone(),
            token,
            value,
        });
    }
}

/// The store's faults: it loses its state, or goes back to a snapshot (seen first by a client
/// that saw it past the snapshot: what the library can detect, docs/guarantees.md).
///
/// With `steps_at_losses`, the wall clock is stepped just before or just after each loss (from
/// `clock`, a generator of its own): the client that begins the next epoch reads it.
async fn store_faults(
    ctx: Ctx,
    store: MemoryBackend,
    witness: MemoryBackend,
    mut rng: Rng,
    mut clock: Rng,
    clients: Vec<MemoryBackend>,
) {
    let plan = Arc::clone(&ctx.plan);
    // With the wall clock stepped back, a new epoch's tokens rise above the earlier ones only
    // through what the client that begins it has seen (docs/guarantees.md): a client that
    // never saw them, or not since the highest were handed out, may begin it below them.
    // Every client looks just before the store forgets, as the witness does, so that the
    // checker can hold the library to its promise.
    let look = plan.clock_steps > 0 || plan.steps_at_losses;
    let mut snapshot = None;
    for _ in 0..plan.losses + plan.restores {
        let step = plan
            .steps_at_losses
            .then(|| (clock.chance(500), clock_step(&mut clock)));
        tokio::time::sleep(Duration::from_millis(1_000 + rng.below(8_000))).await;
        if snapshot.is_none() && plan.restores > 0 {
            snapshot = Some(store.snapshot());
            ctx.record(Event::Snapshot { at: ctx.now() });
            continue;
        }
        if let Some((true, by_ms)) = step {
            ctx.step_clock(by_ms);
        }
        if look {
            for client in &clients {
                let _ = client.entries("w").now_or_never();
            }
        }
        match snapshot.take() {
            Some(saved) => {
                // The witness looks just before and just after (no other task runs between):
                // the first answer after the restore is behind one it saw. A restore that
                // loses nothing (nothing written since the snapshot) is no loss.
                let _ = witness.entries("w").now_or_never();
                let lost_writes = store.snapshot().revision() > saved.revision();
                store.restore(&saved);
                if lost_writes {
                    ctx.record(Event::StoreLost {
                        at: ctx.now(),
                        restored: true,
                    });
                }
                let _ = witness.entries("w").now_or_never();
            }
            None => {
                store.lose_state();
                ctx.record(Event::StoreLost {
                    at: ctx.now(),
                    restored: false,
                });
            }
        }
        if let Some((false, by_ms)) = step {
            ctx.step_clock(by_ms);
        }
    }
}

/// A step of the wall clock, in ms: back (two times in three) or forward, by seconds, minutes
/// or hours.
fn clock_step(rng: &mut Rng) -> i64 {
    let ms = match rng.below(3) {
        0 => 1_000 + rng.below(59_000),
        1 => 60_000 + rng.below(3_540_000),
        _ => 3_600_000 + rng.below(7_200_000),
    };
    let ms = i64::try_from(ms).unwrap_or(i64::MAX);
    if rng.below(3) < 2 { -ms } else { ms }
}

/// The process's own faults: the keep-alive driver starved (for less than half the TTL, about
/// the TTL, or up to three times it) and the wall clock stepped, at random moments.
async fn process_faults(ctx: Ctx, mut rng: Rng) {
    let plan = Arc::clone(&ctx.plan);
    let ttl = u64::try_from(plan.ttl.as_millis()).unwrap_or(1000);
    let mut starvations = plan.starvations;
    let mut steps = plan.clock_steps;
    while starvations + steps > 0 {
        tokio::time::sleep(Duration::from_millis(500 + rng.below(6_000))).await;
        if steps == 0 || (starvations > 0 && rng.chance(500)) {
            starvations -= 1;
            let ms = match rng.below(3) {
                0 => 1 + rng.below(ttl / 2),
                1 => ttl / 2 + rng.below(ttl),
                _ => ttl + rng.below(2 * ttl),
            };
            ctx.record(Event::Starved { at: ctx.now(), ms });
            ctx.count_process_fault(0);
            ctx.starve(Duration::from_millis(ms));
        } else {
            steps -= 1;
            let by_ms = clock_step(&mut rng);
            ctx.step_clock(by_ms);
        }
    }
}

/// The outcome of one schedule.
#[derive(Debug)]
pub struct Outcome {
    pub history: History,
    pub faults: [u64; net::FAULT_NAMES.len()],
}

/// Runs the schedule of `plan` to its end and returns its history.
pub fn run(plan: &Plan) -> Outcome {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time().start_paused(true);
    // `tokio::select!` picks among ready branches at random: from the seed, so that a
    // schedule replays (a tokio_unstable build, as `just simulate` makes).
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(
        &plan.seed.to_le_bytes(),
    ));
    let runtime = builder.build().expect("a current-thread runtime");
    runtime.block_on(schedule(plan.clone()))
}

/// Whether schedules replay bit for bit in this build: `tokio::select!` draws from the
/// runtime's generator, seedable only in a `--cfg tokio_unstable` build.
pub const REPLAYS: bool = cfg!(tokio_unstable);

async fn schedule(plan: Plan) -> Outcome {
    // The wall clock's steps are the process's: none left over from the schedule before.
    baton::testing::reset_wall_clock();
    let mut rng = Rng::new(plan.seed.rotate_left(17));
    // Process faults draw from generators of their own (see `Plan::with_process_faults`).
    let mut process = Rng::new(plan.seed.rotate_left(29) ^ Plan::PROCESS_FAULTS);
    let store = MemoryBackend::new().with_restart_grace(plan.grace);
    let ctx = Ctx {
        history: Arc::default(),
        start: Instant::now(),
        fence: Arc::new(MemoryFence::new()),
        plan: Arc::new(plan.clone()),
        process_faults: Arc::default(),
        quiet_at: Arc::new(StdMutex::new(Instant::now())),
        healed: Arc::default(),
    };
    let mut nets = Vec::new();
    let mut tasks = Vec::new();
    let mut next_id = 0;
    // Every client of the store, for the look before a loss (see `store_faults`).
    let mut clients = Vec::new();
    let mut new_client = |rng: &mut Rng, nets: &mut Vec<SimNet>| {
        let inner = store.client();
        clients.push(inner.clone());
        let net = SimNet::new(inner, rng.fork(), process.fork(), plan.faults);
        nets.push(net.clone());
        next_id += 1;
        Client {
            id: next_id,
            net,
            session: None,
            kept: Vec::new(),
            ttl: plan.ttl,
            current: Arc::default(),
        }
    };
    let mut observer_clients = Vec::new();
    // Observers first, on clean connections, so that they see every leader.
    let observe_until = Instant::now() + Duration::from_secs(600);
    for (name, recipe) in &plan.names {
        if *recipe == Recipe::Election {
            let inner = store.client();
            observer_clients.push(inner.clone());
            let session = Session::new(inner).await.expect("observer session");
            for id in 0..2 {
                tasks.push(tokio::spawn(observer(
                    ctx.clone(),
                    id,
                    session.clone(),
                    name.clone(),
                    observe_until,
                )));
            }
        }
    }
    let mut workers = Vec::new();
    for (name, recipe) in &plan.names {
        for _ in 0..plan.clients_per_name {
            let client = new_client(&mut rng, &mut nets);
            workers.push(tokio::spawn(name_client(
                ctx.clone(),
                client,
                rng.fork(),
                name.clone(),
                *recipe,
            )));
        }
        if *recipe == Recipe::Semaphore {
            let client = new_client(&mut rng, &mut nets);
            workers.push(tokio::spawn(limit_admin(
                ctx.clone(),
                client,
                rng.fork(),
                name.clone(),
            )));
        }
    }
    for _ in 0..plan.multilock_clients {
        let client = new_client(&mut rng, &mut nets);
        workers.push(tokio::spawn(multilock_client(
            ctx.clone(),
            client,
            rng.fork(),
            ["m/a".to_owned(), "m/b".to_owned()],
        )));
    }
    if plan.barriers {
        // Two gates: holds overlap, so a wait must look again after the oldest goes.
        for _ in 0..2 {
            let client = new_client(&mut rng, &mut nets);
            workers.push(tokio::spawn(barrier_gate(ctx.clone(), client, rng.fork())));
        }
        for _ in 0..2 {
            let client = new_client(&mut rng, &mut nets);
            workers.push(tokio::spawn(barrier_waiter(
                ctx.clone(),
                client,
                rng.fork(),
            )));
        }
        for _ in 0..plan.double_members {
            let client = new_client(&mut rng, &mut nets);
            workers.push(tokio::spawn(double_member(ctx.clone(), client, rng.fork())));
        }
    }
    let mut process = Rng::new(plan.seed.rotate_left(41) ^ Plan::PROCESS_FAULTS);
    let witness = store.client();
    clients.push(witness.clone());
    clients.extend(observer_clients);
    let faults = tokio::spawn(store_faults(
        ctx.clone(),
        store.clone(),
        witness,
        rng.fork(),
        process.fork(),
        clients,
    ));
    let process_faults = tokio::spawn(process_faults(ctx.clone(), process.fork()));
    // Everything ends: each client's steps are bounded, and a wait that outlives the
    // schedule's bound is itself a finding (reported by the progress check).
    let bound = Duration::from_secs(900);
    let _ = tokio::time::timeout(bound, futures::future::join_all(workers)).await;
    let _ = faults.await;
    let _ = process_faults.await;
    ctx.heal_process().await;

    // Healed: no more faults; a clean client takes every name, within a bound.
    for net in &nets {
        net.heal();
    }
    let clean_session =
        || Session::with_options(store.client(), SessionOptions::new().with_ttl(plan.ttl));
    let mut clean = clean_session().await.expect("a clean session");
    for (name, recipe) in &plan.names {
        let bound = plan.grace + plan.ttl * 4;
        let mut r = Rng::new(plan.seed);
        let taken = tokio::time::timeout(bound, async {
            let mut last = String::new();
            // Entries of lost sessions go with their leases: a few tries.
            for _ in 0..3 {
                // A fresh client that began an epoch which a client from before then refused
                // (the wall clock stepped back below what that client saw) lost its session.
                if clean.lost().now_or_never() == Some(LostReason::StoreReset)
                    && let Ok(session) = clean_session().await
                {
                    clean = session;
                }
                match acquire(&mut r, &clean, name, *recipe, plan.first_limit, false).await {
                    Some((guard, _)) => {
                        guard.release(&mut Rng::new(1)).await;
                        return Ok(());
                    }
                    None => last = "the acquisition failed".to_owned(),
                }
            }
            Err(last)
        })
        .await;
        let (ok, error) = match taken {
            Ok(Ok(())) => (true, String::new()),
            Ok(Err(e)) => (false, e),
            Err(_) => (false, format!("not granted within {bound:?}")),
        };
        ctx.record(Event::Progress {
            at: ctx.now(),
            name: name.clone(),
            ok,
            error,
        });
    }
    let _ = clean.close().await;
    // Let every lease from the run end, then count what is left.
    tokio::time::sleep(plan.ttl * 3 + plan.grace).await;
    let probe = store.client();
    let mut left = 0;
    for (name, _) in &plan.names {
        left += probe.entries(name).await.map_or(0, |e| e.len());
    }
    if plan.barriers {
        left += probe.entries("gate").await.map_or(0, |e| e.len());
        for round in 0..plan.steps {
            left += probe
                .entries(&format!("db/{round}"))
                .await
                .map_or(0, |e| e.len());
        }
    }
    let mut counters = Vec::new();
    for (name, _) in &plan.names {
        if let Ok(Some((_, data))) = ctx.fence.read(name).await {
            let n = std::str::from_utf8(&data)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            counters.push((name.clone(), n));
        }
    }
    ctx.record(Event::Final {
        at: ctx.now(),
        counters,
        left,
    });
    for task in tasks {
        task.abort();
    }
    let mut faults = [0u64; net::FAULT_NAMES.len()];
    for net in &nets {
        for (total, n) in faults.iter_mut().zip(net.counts()) {
            *total += n;
        }
    }
    let process = *ctx.process_faults.lock().unwrap_or_else(|p| p.into_inner());
    for (total, n) in faults[net::NET_FAULTS..].iter_mut().zip(process) {
        *total += n;
    }
    baton::testing::reset_wall_clock();
    let history = ctx
        .history
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    Outcome { history, faults }
}
