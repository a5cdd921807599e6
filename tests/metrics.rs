//! Every metric of `docs/metrics.md` is emitted by the operation that should emit it, with its
//! labels and plausible values: a recorder that keeps what it is given (`metrics-util`'s
//! `DebuggingRecorder`) is installed for the test's thread, and one scenario runs on the
//! memory backend (paused time) and on etcd (real time).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use baton::metrics::{self as baton_metrics, LockLabel};
use baton::testing::{Call, Fault, FaultyBackend};
use baton::{
    Backend, Election, Error, LostReason, MemoryBackend, Mutex, RwLock, Semaphore, Session,
    SessionOptions,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};

/// The lock-label switch and the active-session count are process-wide: one test at a time,
/// from before its runtime starts until after it is dropped (with every task of the test).
static SERIAL: StdMutex<()> = StdMutex::new(());

/// Runs `body` on a current-thread runtime (so that every emission of the test, its spawned
/// tasks and the keep-alive driver included, happens on this thread) with a recorder of its
/// own.
fn run<F: Future<Output = ()>>(paused: bool, body: impl FnOnce(Seen) -> F) {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let recorder = DebuggingRecorder::new();
    let seen = Seen {
        snapshotter: recorder.snapshotter(),
        got: Vec::new(),
    };
    let _local = metrics::set_default_local_recorder(&recorder);
    let mut runtime = tokio::runtime::Builder::new_current_thread();
    runtime.enable_all().start_paused(paused);
    runtime.build().unwrap().block_on(body(seen));
}

/// What the recorder was given, gathered from its snapshots (each snapshot resets what it
/// reports: counters to 0, histograms to empty, gauges to 0).
struct Seen {
    snapshotter: Snapshotter,
    got: Vec<(CompositeKey, Option<String>, DebugValue)>,
}

fn has_labels(key: &CompositeKey, name: &str, labels: &[(&str, &str)]) -> bool {
    key.key().name() == name
        && labels
            .iter()
            .all(|(k, v)| key.key().labels().any(|l| l.key() == *k && l.value() == *v))
}

impl Seen {
    fn collect(&mut self) {
        for (key, _unit, description, value) in self.snapshotter.snapshot().into_vec() {
            self.got
                .push((key, description.map(|d| d.to_string()), value));
        }
    }

    /// Every sample of histogram `name` whose labels include `labels`.
    fn histogram(&mut self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.collect();
        let mut samples = Vec::new();
        for (key, _, value) in &self.got {
            if let DebugValue::Histogram(values) = value
                && key.kind() == MetricKind::Histogram
                && has_labels(key, name, labels)
            {
                samples.extend(values.iter().map(|v| v.into_inner()));
            }
        }
        samples
    }

    /// The sum of counter `name` over the series whose labels include `labels`.
    fn counter(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.collect();
        self.got
            .iter()
            .filter(|(key, _, _)| has_labels(key, name, labels))
            .map(|(_, _, value)| match value {
                DebugValue::Counter(n) => *n,
                other => panic!("{name} is not a counter: {other:?}"),
            })
            .sum()
    }

    /// The value the active-sessions gauge was set to since the last snapshot (0 if it was
    /// not set: the snapshot resets it).
    fn sessions_active(&mut self) -> Option<f64> {
        let before = self.got.len();
        self.collect();
        self.got[before..]
            .iter()
            .filter(|(key, _, _)| key.key().name() == baton_metrics::SESSIONS_ACTIVE)
            .map(|(_, _, value)| match value {
                DebugValue::Gauge(v) => v.into_inner(),
                other => panic!("not a gauge: {other:?}"),
            })
            .next_back()
    }

    /// The label sets of `name` seen so far.
    fn label_sets(&mut self, name: &str) -> Vec<Vec<(String, String)>> {
        self.collect();
        self.got
            .iter()
            .filter(|(key, _, _)| key.key().name() == name)
            .map(|(key, _, _)| {
                key.key()
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect()
            })
            .collect()
    }

    fn names(&mut self) -> BTreeSet<String> {
        self.collect();
        self.got
            .iter()
            .map(|(key, _, _)| key.key().name().to_owned())
            .collect()
    }
}

/// Waits until `queue` has `n` entries (a waiter has queued).
async fn queued(backend: &dyn Backend, queue: &str, n: usize) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while backend.entries(queue).await.unwrap().len() < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{queue}: {n} entries never appeared"));
}

async fn session(backend: &Arc<dyn Backend>, ttl: Duration) -> Session {
    Session::with_options(Arc::clone(backend), SessionOptions::new().with_ttl(ttl))
        .await
        .unwrap()
}

fn at_least(samples: &[f64], bound: Duration) -> bool {
    // Under real time, a wait timed from its first poll may start a hair after the instant
    // the test measures from.
    samples.iter().any(|s| *s >= bound.as_secs_f64() - 0.005)
}

/// The scenario: each operation, then the metrics it must have emitted. `hold` is how long
/// holders hold while others wait; `ttl` is the TTL of the sessions whose keep-alives and
/// losses are observed.
async fn scenario(
    backend: Arc<dyn Backend>,
    prefix: &str,
    hold: Duration,
    ttl: Duration,
    mut seen: Seen,
) {
    baton_metrics::describe();
    let secs = |d: Duration| d.as_secs_f64();
    let s1 = session(&backend, SessionOptions::DEFAULT_TTL).await;
    let s2 = session(&backend, SessionOptions::DEFAULT_TTL).await;

    // --- Mutex: a grant at once, a handoff, a try that finds it held, a timeout, a waiter
    // whose session is lost, a backend error.
    let name = format!("{prefix}/mutex");
    let m1 = Mutex::new(&s1, &name).unwrap();
    let m2 = Mutex::new(&s2, &name).unwrap();
    let g1 = m1.lock().await.unwrap();
    let waiter = tokio::spawn(async move { m2.lock().await });
    queued(&*backend, &name, 2).await;
    tokio::time::sleep(hold).await;
    g1.release().await.unwrap();
    let g2 = waiter.await.unwrap().unwrap();
    assert!(matches!(m1.try_lock().await, Err(Error::Locked { .. })));
    assert!(tokio::time::timeout(hold, m1.lock()).await.is_err());
    // (Its entry, if created, is gone before the next waiter is counted.)
    s1.settled().await;
    let s3 = session(&backend, SessionOptions::DEFAULT_TTL).await;
    let m3 = Mutex::new(&s3, &name).unwrap();
    let doomed = tokio::spawn(async move { m3.lock().await });
    queued(&*backend, &name, 2).await;
    s3.close().await.unwrap();
    assert!(matches!(doomed.await.unwrap(), Err(Error::SessionLost(_))));
    let faulty = FaultyBackend::wrap(Arc::clone(&backend));
    let faulty_dyn: Arc<dyn Backend> = faulty.clone();
    let s4 = session(&faulty_dyn, SessionOptions::DEFAULT_TTL).await;
    faulty.inject(Call::Enqueue, 1, Fault::FailBefore);
    assert!(Mutex::new(&s4, &name).unwrap().lock().await.is_err());
    g2.release().await.unwrap();

    let mutex = [("recipe", "mutex"), ("lock", name.as_str())];
    let with = |outcome: &'static str| {
        let mut labels = mutex.to_vec();
        labels.push(("outcome", outcome));
        labels
    };
    let acquired = seen.histogram(baton_metrics::LOCK_WAIT_SECONDS, &with("acquired"));
    assert_eq!(acquired.len(), 2, "{acquired:?}");
    assert!(
        at_least(&acquired, hold),
        "the waiter waited the hold: {acquired:?}"
    );
    for (outcome, at_least_secs) in [
        ("locked", 0.0),
        ("cancelled", secs(hold) - 0.005),
        ("lost", 0.0),
        ("error", 0.0),
    ] {
        let samples = seen.histogram(baton_metrics::LOCK_WAIT_SECONDS, &with(outcome));
        assert_eq!(samples.len(), 1, "{outcome}: {samples:?}");
        assert!(samples[0] >= at_least_secs, "{outcome}: {samples:?}");
    }
    let held = seen.histogram(baton_metrics::LOCK_HOLD_SECONDS, &mutex);
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(
        at_least(&held, hold),
        "the first holder held the hold: {held:?}"
    );
    assert_eq!(seen.counter(baton_metrics::LOCK_HANDOFFS_TOTAL, &mutex), 1);

    // --- Election: the leader resigns to a waiting campaigner.
    let name = format!("{prefix}/election");
    let e2 = Election::new(&s2, &name).unwrap();
    let leader = Election::new(&s1, &name)
        .unwrap()
        .campaign("a")
        .await
        .unwrap();
    let next = tokio::spawn(async move { e2.campaign("b").await });
    queued(&*backend, &name, 2).await;
    tokio::time::sleep(hold).await;
    leader.release().await.unwrap();
    next.await.unwrap().unwrap().release().await.unwrap();
    let election = [("recipe", "election"), ("lock", name.as_str())];
    let mut acquired = election.to_vec();
    acquired.push(("outcome", "acquired"));
    let waits = seen.histogram(baton_metrics::LOCK_WAIT_SECONDS, &acquired);
    assert_eq!(waits.len(), 2, "{waits:?}");
    assert!(at_least(&waits, hold), "{waits:?}");
    let held = seen.histogram(baton_metrics::LOCK_HOLD_SECONDS, &election);
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(at_least(&held, hold), "{held:?}");
    assert_eq!(
        seen.counter(baton_metrics::LOCK_HANDOFFS_TOTAL, &election),
        1
    );

    // --- Semaphore of 2: two permits at once, a try refused, a waiter handed the first
    // permit released.
    let name = format!("{prefix}/semaphore");
    let sem1 = Semaphore::new(&s1, &name, 2).unwrap();
    let sem2 = Semaphore::new(&s2, &name, 2).unwrap();
    let p1 = sem1.acquire().await.unwrap();
    let p2 = sem2.acquire().await.unwrap();
    assert!(matches!(
        sem1.try_acquire().await,
        Err(Error::Locked { .. })
    ));
    let third = tokio::spawn(async move { sem2.acquire().await });
    queued(&*backend, &name, 3).await;
    tokio::time::sleep(hold).await;
    p1.release().await.unwrap();
    let p3 = third.await.unwrap().unwrap();
    p2.release().await.unwrap();
    p3.release().await.unwrap();
    let semaphore = [("recipe", "semaphore"), ("lock", name.as_str())];
    let mut acquired = semaphore.to_vec();
    acquired.push(("outcome", "acquired"));
    let waits = seen.histogram(baton_metrics::LOCK_WAIT_SECONDS, &acquired);
    assert_eq!(waits.len(), 3, "{waits:?}");
    assert!(at_least(&waits, hold), "{waits:?}");
    let mut locked = semaphore.to_vec();
    locked.push(("outcome", "locked"));
    assert_eq!(
        seen.histogram(baton_metrics::LOCK_WAIT_SECONDS, &locked)
            .len(),
        1
    );
    let held = seen.histogram(baton_metrics::LOCK_HOLD_SECONDS, &semaphore);
    assert_eq!(held.len(), 3, "{held:?}");
    assert!(at_least(&held, hold), "{held:?}");
    assert_eq!(
        seen.counter(baton_metrics::LOCK_HANDOFFS_TOTAL, &semaphore),
        1
    );

    // --- RwLock: a writer waits for a reader.
    let name = format!("{prefix}/rwlock");
    let reader = RwLock::new(&s1, &name).unwrap().read().await.unwrap();
    let writer = RwLock::new(&s2, &name).unwrap();
    let write = tokio::spawn(async move { writer.write().await });
    queued(&*backend, &format!("{name}/write"), 1).await;
    tokio::time::sleep(hold).await;
    reader.release().await.unwrap();
    write.await.unwrap().unwrap().release().await.unwrap();
    let read = [("recipe", "rwlock_read"), ("lock", name.as_str())];
    let write = [("recipe", "rwlock_write"), ("lock", name.as_str())];
    let held = seen.histogram(baton_metrics::LOCK_HOLD_SECONDS, &read);
    assert!(held.len() == 1 && at_least(&held, hold), "{held:?}");
    let mut acquired = write.to_vec();
    acquired.push(("outcome", "acquired"));
    let waits = seen.histogram(baton_metrics::LOCK_WAIT_SECONDS, &acquired);
    assert!(waits.len() == 1 && at_least(&waits, hold), "{waits:?}");
    assert_eq!(seen.counter(baton_metrics::LOCK_HANDOFFS_TOTAL, &read), 0);
    assert_eq!(seen.counter(baton_metrics::LOCK_HANDOFFS_TOTAL, &write), 1);

    // --- The lock label: off, then mapped.
    baton_metrics::set_lock_label(LockLabel::Omit);
    let unlabelled = Mutex::new(&s1, format!("{prefix}/unlabelled")).unwrap();
    baton_metrics::set_lock_label(LockLabel::Map(|name| {
        name.rsplit('/').next().unwrap_or_default().to_uppercase()
    }));
    let mapped = Mutex::new(&s1, format!("{prefix}/mapped")).unwrap();
    baton_metrics::set_lock_label(LockLabel::Name);
    unlabelled.lock().await.unwrap().release().await.unwrap();
    mapped.lock().await.unwrap().release().await.unwrap();
    let hold_series = seen.label_sets(baton_metrics::LOCK_HOLD_SECONDS);
    let recipe_only = vec![("recipe".to_owned(), "mutex".to_owned())];
    assert!(hold_series.contains(&recipe_only), "{hold_series:?}");
    let mapped_labels = vec![
        ("recipe".to_owned(), "mutex".to_owned()),
        ("lock".to_owned(), "MAPPED".to_owned()),
    ];
    assert!(hold_series.contains(&mapped_labels), "{hold_series:?}");
    assert!(
        !hold_series
            .iter()
            .flatten()
            .any(|(k, v)| k == "lock" && v.ends_with("mapped")),
        "{hold_series:?}"
    );

    // --- Sessions: the gauge follows starts and ends; each end is counted with its reason.
    s1.settled().await;
    s2.settled().await;
    seen.collect();
    let counted = session(&backend, ttl).await;
    let active = seen.sessions_active().expect("set at the start");
    let other = session(&backend, ttl).await;
    assert_eq!(seen.sessions_active(), Some(active + 1.0));
    let closed_before = seen.counter(baton_metrics::SESSIONS_LOST_TOTAL, &[("reason", "closed")]);
    other.close().await.unwrap();
    assert_eq!(seen.sessions_active(), Some(active));
    assert_eq!(
        seen.counter(baton_metrics::SESSIONS_LOST_TOTAL, &[("reason", "closed")]),
        closed_before + 1
    );
    // Revoked from outside: the next renewal hears it.
    backend.revoke_lease(counted.lease_id()).await.unwrap();
    let reason = tokio::time::timeout(ttl * 3, counted.lost()).await.unwrap();
    assert_eq!(reason, LostReason::Revoked);
    assert_eq!(seen.sessions_active(), Some(active - 1.0));
    assert_eq!(
        seen.counter(baton_metrics::SESSIONS_LOST_TOTAL, &[("reason", "revoked")]),
        1
    );
    // Renewals that fail until the deadline: counted, and the session expires.
    let failing = FaultyBackend::wrap(Arc::clone(&backend));
    let failing_dyn: Arc<dyn Backend> = failing.clone();
    let expiring = session(&failing_dyn, ttl).await;
    failing.inject_every(Call::KeepAlive, Fault::FailBefore);
    let reason = tokio::time::timeout(ttl * 3, expiring.lost())
        .await
        .unwrap();
    assert_eq!(reason, LostReason::Expired);
    assert!(seen.counter(baton_metrics::KEEPALIVE_FAILURES_TOTAL, &[]) >= 1);
    assert_eq!(
        seen.counter(baton_metrics::SESSIONS_LOST_TOTAL, &[("reason", "expired")]),
        1
    );
    // A renewal that takes a while is timed as such.
    let slow = FaultyBackend::wrap(Arc::clone(&backend));
    let slow_dyn: Arc<dyn Backend> = slow.clone();
    let delay = ttl / 10;
    slow.inject(Call::KeepAlive, 1, Fault::DelayAfter(delay));
    let renewed = session(&slow_dyn, ttl).await;
    tokio::time::timeout(ttl * 3, async {
        // The second renewal is scheduled only once the first was answered.
        while slow.count(Call::KeepAlive) < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    let latencies = seen.histogram(baton_metrics::KEEPALIVE_SECONDS, &[]);
    assert!(at_least(&latencies, delay), "{latencies:?}");
    assert!(
        latencies.iter().all(|l| *l >= 0.0 && *l < secs(ttl)),
        "{latencies:?}"
    );
    renewed.close().await.unwrap();

    // --- Every documented metric was emitted, and described.
    let names = seen.names();
    for name in baton_metrics::NAMES {
        assert!(names.contains(name), "{name} was never emitted: {names:?}");
    }
    for (key, description, _) in &seen.got {
        assert!(
            description.is_some(),
            "{} has no description",
            key.key().name()
        );
    }
    s1.close().await.unwrap();
    s2.close().await.unwrap();
    s4.close().await.unwrap();
}

#[test]
fn every_metric_is_emitted_on_memory() {
    run(true, |seen| async move {
        let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
        scenario(
            backend,
            "metrics",
            Duration::from_secs(5),
            Duration::from_secs(6),
            seen,
        )
        .await;
    });
}

#[cfg(feature = "etcd")]
#[test]
fn every_metric_is_emitted_on_etcd() {
    let node = baton::testing::EtcdNode::shared();
    run(false, |seen| async move {
        let backend: Arc<dyn Backend> = Arc::new(node.backend().await.unwrap());
        let prefix = format!("metrics-{}", std::process::id());
        // etcd grants at least its minimum TTL (about 2 s): the sessions observed use 3 s.
        scenario(
            backend,
            &prefix,
            Duration::from_millis(300),
            Duration::from_secs(3),
            seen,
        )
        .await;
    });
}

/// The table of `docs/metrics.md` lists exactly the metrics baton emits.
#[test]
fn the_documented_metrics_are_the_emitted_ones() {
    let documented: BTreeSet<&str> = include_str!("../docs/metrics.md")
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split('`').next())
        .filter(|name| name.starts_with("baton_"))
        .collect();
    let emitted: BTreeSet<&str> = baton_metrics::NAMES.into_iter().collect();
    assert_eq!(documented, emitted);
}
