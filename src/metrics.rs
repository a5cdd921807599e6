//! Metrics, emitted through the [`metrics`] facade: how long contenders wait and
//! holders hold, how often a lock passes from one holder to a waiting one, how sessions end,
//! and how long their keep-alives take. `docs/metrics.md` lists every metric with its labels,
//! what to alert on, and how to export them to Prometheus.
//!
//! baton only emits; the application chooses the exporter by installing a recorder
//! (`metrics-exporter-prometheus`, an OpenTelemetry bridge, ...). Without one, each emission
//! is one thread-local read and one atomic load: the facade's own check. The keys of a lock's
//! series (its name and labels) are built once per [`Mutex`](crate::Mutex),
//! [`Election`](crate::Election), [`Semaphore`](crate::Semaphore) or [`RwLock`](crate::RwLock)
//! handle, at its first emission, so that an emission allocates nothing.
//!
//! Lock metrics carry the lock's name as the `lock` label. Names made of ids (one lock per
//! order, per user) make one series per id: turn the label off, or map names to a bounded
//! set, with [`set_lock_label`].
//!
//! ```
//! use baton::metrics::{self, LockLabel};
//! // `orders/1234/lock` and `orders/5678/lock` are reported as `lock="orders"`.
//! metrics::set_lock_label(LockLabel::Map(|name| {
//!     name.split('/').next().unwrap_or_default().to_owned()
//! }));
//! # metrics::set_lock_label(LockLabel::Name);
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, OnceLock, PoisonError, RwLock as StdRwLock, Weak};
use std::time::Duration;

use ::metrics::{Key, Label, Level, Metadata, SharedString, Unit};
use tokio::time::Instant;

use crate::error::{Error, LostReason, Result};

/// Histogram, seconds: from the call to `lock()` (`campaign()`, `acquire()`, `read()`,
/// `write()` and their `try_*` forms) to its end. Labels `recipe`, `lock`, `outcome`
/// (`acquired`, `locked`, `cancelled`, `lost`, `error`).
pub const LOCK_WAIT_SECONDS: &str = "baton_lock_wait_seconds";
/// Histogram, seconds: from the grant to the release (`release()`) or
/// the drop of the guard. Labels `recipe`, `lock`.
pub const LOCK_HOLD_SECONDS: &str = "baton_lock_hold_seconds";
/// Counter: grants that followed a wait for another holder (the lock was handed over, not
/// found free). Labels `recipe`, `lock`.
pub const LOCK_HANDOFFS_TOTAL: &str = "baton_lock_handoffs_total";
/// Gauge: sessions of this process that are neither lost nor closed.
pub const SESSIONS_ACTIVE: &str = "baton_sessions_active";
/// Counter: sessions that ended, by `reason` (`expired`, `revoked`, `closed`).
pub const SESSIONS_LOST_TOTAL: &str = "baton_sessions_lost_total";
/// Histogram, seconds: how long each lease renewal took to be answered (whatever the answer).
pub const KEEPALIVE_SECONDS: &str = "baton_keepalive_seconds";
/// Counter: lease renewals that failed (they are retried until the session's deadline).
pub const KEEPALIVE_FAILURES_TOTAL: &str = "baton_keepalive_failures_total";

/// The name of every metric baton emits.
pub const NAMES: [&str; 7] = [
    LOCK_WAIT_SECONDS,
    LOCK_HOLD_SECONDS,
    LOCK_HANDOFFS_TOTAL,
    SESSIONS_ACTIVE,
    SESSIONS_LOST_TOTAL,
    KEEPALIVE_SECONDS,
    KEEPALIVE_FAILURES_TOTAL,
];

/// What the `lock` label of the lock metrics holds: see [`set_lock_label`].
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub enum LockLabel {
    /// The lock's name as given (`lock="orders/lock"`). The default.
    #[default]
    Name,
    /// No `lock` label: one series per recipe and outcome, whatever the names.
    Omit,
    /// The function's answer for the name: map names that embed ids to a bounded set of
    /// values (`orders/1234/lock` to `orders`). Called once per lock handle, not per
    /// emission.
    Map(fn(&str) -> String),
}

static LOCK_LABEL: StdRwLock<LockLabel> = StdRwLock::new(LockLabel::Name);

/// Sets, for the whole process, what the `lock` label holds. It applies to the handles
/// created after the call ([`Mutex::new`](crate::Mutex::new), [`Election::new`](crate::Election::new),
/// ...): call it at startup, before creating any.
///
/// ## Warning
/// Every distinct label value is a series kept by the exporter and by Prometheus. With
/// [`LockLabel::Name`] (the default), lock names made of ids, or any unbounded set of names,
/// grow both without bound: use [`LockLabel::Omit`] or [`LockLabel::Map`] then.
pub fn set_lock_label(label: LockLabel) {
    *LOCK_LABEL.write().unwrap_or_else(PoisonError::into_inner) = label;
}

/// Gives the installed recorder each metric's unit and description (the exporter shows them,
/// as Prometheus's `# HELP` lines). Call it once, after installing the recorder; the metrics
/// are emitted whether it is called or not.
pub fn describe() {
    ::metrics::with_recorder(|recorder| {
        let seconds = Some(Unit::Seconds);
        recorder.describe_histogram(
            LOCK_WAIT_SECONDS.into(),
            seconds,
            "Time from a call to acquire a lock (mutex, election, semaphore, read-write lock) to its outcome".into(),
        );
        recorder.describe_histogram(
            LOCK_HOLD_SECONDS.into(),
            seconds,
            "Time from a grant to the release or drop of the guard".into(),
        );
        recorder.describe_counter(
            LOCK_HANDOFFS_TOTAL.into(),
            Some(Unit::Count),
            "Grants that followed a wait for another holder".into(),
        );
        recorder.describe_gauge(
            SESSIONS_ACTIVE.into(),
            Some(Unit::Count),
            "Sessions of this process neither lost nor closed".into(),
        );
        recorder.describe_counter(
            SESSIONS_LOST_TOTAL.into(),
            Some(Unit::Count),
            "Sessions ended, by reason (expired, revoked, store_reset: lost; closed: closed or dropped)".into(),
        );
        recorder.describe_histogram(
            KEEPALIVE_SECONDS.into(),
            seconds,
            "Time for a lease renewal to be answered".into(),
        );
        recorder.describe_counter(
            KEEPALIVE_FAILURES_TOTAL.into(),
            Some(Unit::Count),
            "Lease renewals that failed (retried until the session's deadline)".into(),
        );
    });
}

/// Where baton's emissions come from, for recorders that filter on it.
static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, None);

fn record(key: &Key, value: Duration) {
    ::metrics::with_recorder(|r| r.register_histogram(key, &METADATA).record(value));
}

fn increment(key: &Key) {
    ::metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
}

/// The recipe label of a lock's series.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Recipe {
    Mutex,
    Election,
    Semaphore,
    Read,
    Write,
}

impl Recipe {
    fn label(self) -> &'static str {
        match self {
            Recipe::Mutex => "mutex",
            Recipe::Election => "election",
            Recipe::Semaphore => "semaphore",
            Recipe::Read => "rwlock_read",
            Recipe::Write => "rwlock_write",
        }
    }
}

/// How an acquisition ended: the `outcome` label of [`LOCK_WAIT_SECONDS`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outcome {
    Acquired,
    /// A `try_*` call found the lock held or contended.
    Locked,
    /// The future was dropped (a timeout) before it ended.
    Cancelled,
    /// The session was lost first.
    Lost,
    /// Any other error.
    Error,
}

impl Outcome {
    const ALL: [Outcome; 5] = [
        Outcome::Acquired,
        Outcome::Locked,
        Outcome::Cancelled,
        Outcome::Lost,
        Outcome::Error,
    ];

    pub(crate) fn of<T>(result: &Result<T>) -> Outcome {
        match result {
            Ok(_) => Outcome::Acquired,
            Err(Error::Locked { .. }) => Outcome::Locked,
            Err(Error::SessionLost(_)) => Outcome::Lost,
            Err(_) => Outcome::Error,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Outcome::Acquired => "acquired",
            Outcome::Locked => "locked",
            Outcome::Cancelled => "cancelled",
            Outcome::Lost => "lost",
            Outcome::Error => "error",
        }
    }
}

/// The metrics of one lock handle (and of its guards): its name, its labels, and the keys of
/// its series, built at the first emission.
#[derive(Debug)]
pub(crate) struct Meter {
    /// The lock, election or recipe name (what its guards report as theirs).
    name: Arc<str>,
    /// `None`: not metered (barriers, whose waits are not lock waits).
    labels: Option<Labels>,
    keys: OnceLock<Keys>,
}

#[derive(Debug)]
struct Labels {
    recipe: &'static str,
    /// `None` when the lock label is off.
    lock: Option<SharedString>,
}

#[derive(Debug)]
struct Keys {
    /// By [`Outcome`], in the order of [`Outcome::ALL`].
    wait: [Key; 5],
    hold: Key,
    handoffs: Key,
}

impl Labels {
    fn key(&self, name: &'static str, outcome: Option<Outcome>) -> Key {
        let mut labels = Vec::with_capacity(3);
        labels.push(Label::from_static_parts("recipe", self.recipe));
        if let Some(lock) = &self.lock {
            labels.push(Label::new("lock", lock.clone()));
        }
        if let Some(outcome) = outcome {
            labels.push(Label::from_static_parts("outcome", outcome.label()));
        }
        Key::from_parts(name, labels)
    }
}

impl Meter {
    /// The meter of a `recipe` handle named `name`, labelled as [`set_lock_label`] says now.
    pub(crate) fn new(recipe: Recipe, name: &Arc<str>) -> Arc<Meter> {
        let setting = *LOCK_LABEL.read().unwrap_or_else(PoisonError::into_inner);
        let lock = match setting {
            LockLabel::Name => Some(SharedString::from_shared(Arc::clone(name))),
            LockLabel::Omit => None,
            LockLabel::Map(map) => Some(SharedString::from_owned(map(name))),
        };
        // One meter per recipe, name and label, shared by the handles that use them: 10,000
        // waiters on one lock, each with a handle of its own, hold one meter (and one set of
        // series keys), not 10,000. Entries whose handles are all gone are dropped as the map
        // grows.
        type Meters = HashMap<(&'static str, Arc<str>, Option<SharedString>), Weak<Meter>>;
        static METERS: OnceLock<StdMutex<Meters>> = OnceLock::new();
        let mut meters = METERS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let id = (recipe.label(), Arc::clone(name), lock.clone());
        if let Some(meter) = meters.get(&id).and_then(Weak::upgrade) {
            return meter;
        }
        let meter = Arc::new(Meter {
            name: Arc::clone(name),
            labels: Some(Labels {
                recipe: recipe.label(),
                lock,
            }),
            keys: OnceLock::new(),
        });
        if meters.len() >= 64 && meters.len().is_power_of_two() {
            meters.retain(|_, meter| meter.strong_count() > 0);
        }
        meters.insert(id, Arc::downgrade(&meter));
        meter
    }

    /// A meter that emits nothing, for the recipes that keep entries without being locks.
    pub(crate) fn unmetered(name: &Arc<str>) -> Arc<Meter> {
        Arc::new(Meter {
            name: Arc::clone(name),
            labels: None,
            keys: OnceLock::new(),
        })
    }

    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    fn keys(&self) -> Option<&Keys> {
        let labels = self.labels.as_ref()?;
        Some(self.keys.get_or_init(|| Keys {
            wait: Outcome::ALL.map(|o| labels.key(LOCK_WAIT_SECONDS, Some(o))),
            hold: labels.key(LOCK_HOLD_SECONDS, None),
            handoffs: labels.key(LOCK_HANDOFFS_TOTAL, None),
        }))
    }

    /// Starts timing an acquisition: reported with its outcome by [`Waiting::finish`], or as
    /// cancelled if it is dropped first.
    pub(crate) fn waiting(&self) -> Waiting<'_> {
        Waiting {
            meter: Some(self),
            started: since_epoch(),
        }
    }

    /// A grant followed a wait for another holder.
    pub(crate) fn handoff(&self) {
        if let Some(keys) = self.keys() {
            increment(&keys.handoffs);
        }
    }

    /// A hold granted at `granted` ended now.
    pub(crate) fn held_since(&self, granted: Instant) {
        if let Some(keys) = self.keys() {
            record(&keys.hold, granted.elapsed());
        }
    }
}

/// An acquisition being timed; reports [`Outcome::Cancelled`] if dropped unfinished.
#[derive(Debug)]
pub(crate) struct Waiting<'a> {
    /// Taken when reported.
    meter: Option<&'a Meter>,
    /// When the acquisition started, in nanoseconds since [`epoch`]: 8 bytes where an
    /// `Instant` takes 16, in the state every waiter keeps while it waits.
    started: u64,
}

/// The instant the start times of acquisitions count from.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn since_epoch() -> u64 {
    u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Waiting<'_> {
    /// Reports the acquisition's outcome, and hands its result back; a backend error is given
    /// the lock's name.
    pub(crate) fn finish<T>(mut self, result: Result<T>) -> Result<T> {
        let result = match self.meter {
            Some(meter) => result.map_err(|e| e.in_lock(meter.name())),
            None => result,
        };
        self.report(Outcome::of(&result));
        result
    }

    fn report(&mut self, outcome: Outcome) {
        if let Some(keys) = self.meter.take().and_then(Meter::keys) {
            let waited = since_epoch().saturating_sub(self.started);
            record(&keys.wait[outcome as usize], Duration::from_nanos(waited));
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.report(Outcome::Cancelled);
    }
}

/// Sessions neither lost nor closed. Kept here and reported whole (not as increments), so
/// that the gauge is right even if the recorder was installed after sessions started; the
/// lock orders the reports.
static ACTIVE: StdMutex<u64> = StdMutex::new(0);

fn sessions_changed(change: impl FnOnce(&mut u64)) {
    static KEY: Key = Key::from_static_name(SESSIONS_ACTIVE);
    let mut active = ACTIVE.lock().unwrap_or_else(PoisonError::into_inner);
    change(&mut active);
    let value = *active as f64;
    ::metrics::with_recorder(|r| r.register_gauge(&KEY, &METADATA).set(value));
}

/// A session started.
pub(crate) fn session_started() {
    sessions_changed(|active| *active += 1);
}

/// A session ended, for `reason` (reported once per session).
pub(crate) fn session_ended(reason: LostReason) {
    static EXPIRED: [Label; 1] = [Label::from_static_parts("reason", "expired")];
    static REVOKED: [Label; 1] = [Label::from_static_parts("reason", "revoked")];
    static CLOSED: [Label; 1] = [Label::from_static_parts("reason", "closed")];
    static STORE_RESET: [Label; 1] = [Label::from_static_parts("reason", "store_reset")];
    static KEYS: [Key; 4] = [
        Key::from_static_parts(SESSIONS_LOST_TOTAL, &EXPIRED),
        Key::from_static_parts(SESSIONS_LOST_TOTAL, &REVOKED),
        Key::from_static_parts(SESSIONS_LOST_TOTAL, &CLOSED),
        Key::from_static_parts(SESSIONS_LOST_TOTAL, &STORE_RESET),
    ];
    sessions_changed(|active| *active = active.saturating_sub(1));
    increment(match reason {
        LostReason::Expired => &KEYS[0],
        LostReason::Revoked => &KEYS[1],
        LostReason::StoreReset => &KEYS[3],
        // (A session is never ended by one entry's deletion; that is a guard's loss.)
        LostReason::Closed | LostReason::EntryDeleted => &KEYS[2],
    });
}

/// A lease renewal sent at `sent` was answered now; `failed` if with an error.
pub(crate) fn keepalive_answered(sent: Instant, failed: bool) {
    static LATENCY: Key = Key::from_static_name(KEEPALIVE_SECONDS);
    static FAILURES: Key = Key::from_static_name(KEEPALIVE_FAILURES_TOTAL);
    record(&LATENCY, sent.elapsed());
    if failed {
        increment(&FAILURES);
    }
}
