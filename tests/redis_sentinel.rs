//! Redis under Sentinel, on real processes (issue #40): a primary, a replica and three
//! Sentinels (`baton::testing::RedisSentinel`), failed over while a lock is held and while
//! waiters wait, three ways in turn on one fixture: a manual `SENTINEL FAILOVER`, the primary
//! paused (`docker pause`) past `down-after-milliseconds`, the primary killed.
//!
//! In each: the holder and the waiters from before are told (their sessions end with the
//! epoch the failover starts), nobody is granted before the restart grace has passed since
//! the failover began, the waiters queued after it are granted in their order with tokens
//! above every earlier one, and a fenced resource sees no overlap. Then a client stalled
//! across a manual failover; and, on a second fixture that speaks TLS only,
//! `rediss+sentinel://`.

#[path = "support/mod.rs"]
mod support;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use baton::testing::{RedisSentinel, RedisTls, TestCa};
use baton::{
    Backend, ConnectOptions, Error, Mutex, RedisBackend, RedisOptions, Session, SessionOptions,
};
use support::{FencedRegister, assert_lost, within};
use tokio::time::Instant;

/// Session TTL of every session here.
const TTL: Duration = Duration::from_secs(3);
/// The restart grace: at least the TTL, and well above how long a failover takes here (a few
/// seconds), so that a grant that did not wait it would be seen.
const GRACE: Duration = Duration::from_secs(8);

fn options() -> RedisOptions {
    RedisOptions::new()
        .with_restart_grace(GRACE)
        .with_connect_timeout(Duration::from_secs(1))
        .with_request_timeout(Duration::from_millis(500))
        .with_retry_for(Duration::from_secs(10))
        .with_prefix(format!("sentinel-{}:", std::process::id()))
}

async fn backend(redis: &RedisSentinel) -> RedisBackend {
    redis.backend(options()).await.unwrap()
}

async fn session(backend: &RedisBackend) -> Session {
    Session::with_options(backend.clone(), SessionOptions::new().with_ttl(TTL))
        .await
        .unwrap()
}

#[derive(Debug, Clone, Copy)]
enum Failover {
    /// `SENTINEL FAILOVER`: the primary stays up and is demoted.
    Manual,
    /// `docker pause` until the Sentinels have promoted the replica, then unpaused.
    Paused,
    /// SIGKILL.
    Killed,
}

/// One thing that happened: when, to whom, and the token of a grant (`None`: told it lost).
type Happened = (Instant, String, Option<u64>);

/// What happened after the failover began, on one clock.
#[derive(Default, Clone)]
struct Timeline(Arc<StdMutex<Vec<Happened>>>);

impl Timeline {
    fn told(&self, who: &str) {
        self.0
            .lock()
            .unwrap()
            .push((Instant::now(), who.to_owned(), None));
    }

    fn granted(&self, who: &str, token: u64) {
        self.0
            .lock()
            .unwrap()
            .push((Instant::now(), who.to_owned(), Some(token)));
    }
}

/// One failover while H holds `name` (inside the fenced register) and W1, W2 wait; then N1,
/// N2, N3 queue (new sessions, as restarted clients would) and must be granted in order.
async fn fail_over_under_a_lock(redis: &RedisSentinel, how: Failover) {
    let scenario = format!("Redis Sentinel: {how:?} failover under a held lock");
    let name = format!("sentinel-{how:?}");
    // Three processes' worth of clients, each following the Sentinels on its own.
    let (holders, waiters, newcomers) = (
        backend(redis).await,
        backend(redis).await,
        backend(redis).await,
    );
    let register = Arc::new(FencedRegister::default());
    let timeline = Timeline::default();

    let h = session(&holders).await;
    let held = Mutex::new(&h, &name).unwrap().lock().await.unwrap();
    let held_token = held.fencing_token().get();
    assert!(register.enter(held_token));
    let told = tokio::spawn({
        let (lost, register, timeline) = (held.lost(), Arc::clone(&register), timeline.clone());
        async move {
            lost.await;
            timeline.told("H");
            register.exit(held_token);
        }
    });
    let (w1, w2) = (session(&waiters).await, session(&waiters).await);
    let q1 = support::spawn_queued(&waiters, &w1, &name, 2).await;
    let q2 = support::spawn_queued(&waiters, &w2, &name, 3).await;
    let highest_before = waiters
        .entries(&name)
        .await
        .unwrap()
        .iter()
        .map(|e| e.token().get())
        .max()
        .unwrap();

    let old = redis.primary().await.unwrap();
    let old_port = old.port();
    let began = Instant::now();
    match how {
        Failover::Manual => redis.failover().await.unwrap(),
        Failover::Paused => old.pause().await.unwrap(),
        Failover::Killed => old.stop().await.unwrap(),
    }
    let new = redis.await_new_primary(old_port).await.unwrap();
    println!(
        "{scenario}: 127.0.0.1:{} promoted {:?} after the failover began",
        new.port(),
        began.elapsed()
    );
    if let Failover::Paused = how {
        old.unpause().await.unwrap();
    }

    // Everyone from before is told: the holder, and the waiters (their sessions end too).
    within("H is told", GRACE, told).await.unwrap();
    for (who, queued) in [("W1", q1), ("W2", q2)] {
        let result = within(who, GRACE * 2, queued).await.unwrap();
        assert_lost(&result);
        timeline.told(who);
    }
    // The holder's fenced write is refused by the store.
    let late = held
        .write(&[baton::WriteOp::put(format!("{name}-data"), "late")])
        .await;
    assert!(
        late.is_err(),
        "H's guarded write after the failover: {late:?}"
    );
    assert!(register.late_write(held_token));

    // Newcomers queue in order, during the grace, and are granted in that order after it.
    let mut sessions = Vec::new();
    let mut grants = Vec::new();
    for (i, who) in ["N1", "N2", "N3"].into_iter().enumerate() {
        let s = session(&newcomers).await;
        let (register, timeline) = (Arc::clone(&register), timeline.clone());
        let mutex = Mutex::new(&s, &name).unwrap();
        let task = tokio::spawn(async move {
            let guard = mutex.lock().await?;
            let token = guard.fencing_token().get();
            timeline.granted(who, token);
            assert!(register.enter(token), "{who}'s token {token} was refused");
            register.exit(token);
            guard.release().await?;
            Ok::<u64, baton::Error>(token)
        });
        support::eventually(&format!("{who} is queued"), || async {
            newcomers.entries(&name).await.unwrap().len() == i + 1
        })
        .await;
        grants.push(task);
        sessions.push(s);
    }
    let mut tokens = Vec::new();
    for task in grants {
        tokens.push(
            within("a newcomer's grant", GRACE * 3, task)
                .await
                .unwrap()
                .unwrap(),
        );
    }

    let happened = timeline.0.lock().unwrap().clone();
    let last_told = happened
        .iter()
        .filter(|(_, _, t)| t.is_none())
        .map(|(at, _, _)| *at)
        .max()
        .unwrap();
    for (at, who, token) in &happened {
        let Some(token) = token else { continue };
        assert!(
            *token > highest_before,
            "{who}'s token {token} is not above {highest_before}: {happened:?}"
        );
        assert!(
            at.duration_since(began) >= GRACE,
            "{who} was granted {:?} after the failover began, within the grace {GRACE:?}",
            at.duration_since(began)
        );
        assert!(
            *at >= last_told,
            "{who} was granted before everyone from before was told: {happened:?}"
        );
    }
    register.assert_safe(
        &scenario,
        "no overlap at the fence; holders and waiters from before told; grants after the grace, in queue order, tokens above all before",
        Some(&[held_token].into_iter().chain(tokens.iter().copied()).collect::<Vec<_>>()),
    );
    drop((h, w1, w2, sessions));
}

/// The three failovers in turn, on one fixture (a Sentinel fails a primary over again only
/// after twice its failover timeout; the fixture's is small), and a manual one across a
/// client's stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failovers_never_grant_twice_and_keep_order() {
    let redis = RedisSentinel::start().await.unwrap();
    // A fixture started for this test: nothing predates its state.
    let first = backend(&redis).await;
    assert!(
        first.init_store().await.unwrap(),
        "a fresh fixture is marked new"
    );
    drop(first);

    fail_over_under_a_lock(&redis, Failover::Manual).await;
    redis.await_replica_in_sync().await.unwrap();
    fail_over_under_a_lock(&redis, Failover::Paused).await;
    redis.await_replica_in_sync().await.unwrap();
    stalled_across_a_failover(&redis).await;
    redis.await_replica_in_sync().await.unwrap();
    fail_over_under_a_lock(&redis, Failover::Killed).await;
}

/// A client process that stalls (SIGSTOP, a GC pause, a frozen VM) across a manual failover
/// wakes with the announcement unread; the old primary still answers as a primary until
/// Sentinel demotes it. Its first request after the stall must go to the new primary: its
/// session and lock are made there (and wait the new epoch's grace), not on the old one.
/// (Before: they were made on the old primary, as the nemesis saw, redis-sentinel seed 13.)
///
/// The client runs on a runtime of its own, on one thread, which the test blocks while the
/// Sentinels fail the primary over: nothing of the client runs meanwhile, its listener
/// included, as in a stopped process.
async fn stalled_across_a_failover(redis: &RedisSentinel) {
    let old = redis.primary().await.unwrap().port();
    let url = redis.url();
    let (connected_tx, connected) = tokio::sync::oneshot::channel();
    let (wake, woken) = std::sync::mpsc::channel::<()>();
    let (held_tx, held) = tokio::sync::oneshot::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let client = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            // A grace of one TTL: the new epoch's, which a lock made there waits.
            let backend = RedisBackend::connect(&url, options().with_restart_grace(TTL))
                .await
                .unwrap();
            connected_tx.send(()).unwrap();
            // The stall: this thread, the client's only one, blocks.
            woken.recv().unwrap();
            let s = session(&backend).await;
            let guard = Mutex::new(&s, "stalled").unwrap().lock().await.unwrap();
            held_tx.send(guard.key().to_owned()).unwrap();
            // Held until the test has looked where the entry is (this thread blocks again:
            // the session's TTL is well above the look).
            released.recv().unwrap();
            guard.release().await.unwrap();
        })
    });
    connected.await.unwrap();
    redis.failover().await.unwrap();
    let new = redis.await_new_primary(old).await.unwrap();
    // Every Sentinel names the new primary: the announcement is out.
    let pattern = format!("sentinel-{}:*stalled*", std::process::id());
    assert!(
        new.command::<Vec<String>>("KEYS", &[&pattern])
            .await
            .unwrap()
            .is_empty(),
        "nothing of the lock yet"
    );
    wake.send(()).unwrap();
    let Ok(key) = held.await else {
        // The client failed: its panic says why.
        std::panic::resume_unwind(client.join().unwrap_err());
    };
    let on_new: Vec<String> = new.command("KEYS", &[&pattern]).await.unwrap();
    release.send(()).unwrap();
    tokio::task::spawn_blocking(move || client.join().unwrap())
        .await
        .unwrap();
    assert!(
        !on_new.is_empty(),
        "the lock ({key}) was made on the old primary, not on the new one"
    );
}

/// A Sentinel URL with the Sentinels' password, and the refusals: a wrong Sentinel password is
/// an authentication error, a service the Sentinels do not know a connect error, both at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_passwords_and_unknown_services() {
    let redis = RedisSentinel::start_with_password(Some("s3cret"))
        .await
        .unwrap();
    let url = redis.url();
    let backend = baton::connect(&url).await.unwrap();
    let s = Session::new(backend).await.unwrap();
    drop(s);
    let wrong = url.replace("s3cret", "wrong");
    let started = Instant::now();
    let refused = baton::connect(&wrong).await.map(drop);
    assert!(
        matches!(refused, Err(baton::Error::Auth { .. })),
        "{refused:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    let unknown = url.replace("/baton?", "/nosuch?");
    let refused = baton::connect(&unknown).await.map(drop);
    assert!(
        matches!(refused, Err(baton::Error::Connect { .. })),
        "{refused:?}"
    );
}

/// `rediss+sentinel://` (#40): Sentinels and servers that speak TLS only. Through
/// `connect_with`, as a user gives it (the URL and the CA): the Sentinels are asked over TLS,
/// the primary reached over TLS, and a manual failover followed (the next lock is made on the
/// new primary, after the grace, with a higher token). Refused at once: the plain scheme
/// against TLS Sentinels, and Sentinels whose certificate the CA given did not sign.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_sentinels_and_the_primary_are_reached_and_followed() {
    support::capture_logs();
    let tls = RedisTls::generate().unwrap().with_client_cert_auth(false);
    let redis = RedisSentinel::start_tls(&tls).await.unwrap();
    assert!(
        redis.url().starts_with("rediss+sentinel://"),
        "{}",
        redis.url()
    );
    let options = || {
        ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_request_timeout(Duration::from_millis(500))
            .with_retry_for(Duration::from_secs(10))
            .with_restart_grace(TTL)
            .with_redis_prefix(format!("sentinel-tls-{}:", std::process::id()))
    };
    let backend = baton::connect_with(&redis.url(), options().with_ca_cert(tls.ca_pem()))
        .await
        .unwrap();
    let ttl = SessionOptions::new().with_ttl(TTL);
    let before = {
        let s = Session::with_options(backend.clone(), ttl.clone())
            .await
            .unwrap();
        let guard = Mutex::new(&s, "tls").unwrap().lock().await.unwrap();
        let token = guard.fencing_token().get();
        guard.release().await.unwrap();
        token
    };

    let old = redis.primary().await.unwrap().port();
    redis.failover().await.unwrap();
    let new = redis.await_new_primary(old).await.unwrap();
    let s = Session::with_options(backend.clone(), ttl).await.unwrap();
    let guard = Mutex::new(&s, "tls").unwrap().lock().await.unwrap();
    assert!(
        guard.fencing_token().get() > before,
        "{} after {before}",
        guard.fencing_token().get()
    );
    // The entry itself (the first lock's queue may have left keys that replicated).
    let entry = format!("sentinel-tls-{}:e:{}", std::process::id(), guard.key());
    let on_new: i64 = new.command("EXISTS", &[&entry]).await.unwrap();
    assert_eq!(
        on_new, 1,
        "the lock ({entry}) was not made on the new primary"
    );
    guard.release().await.unwrap();

    // The plain scheme against TLS Sentinels, and a CA that did not sign them.
    let plain = redis.url().replacen("rediss+sentinel", "redis+sentinel", 1);
    let started = Instant::now();
    let e = baton::connect_with(&plain, options()).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3), "{e:?}");
    assert!(
        matches!(e, Error::Connect { .. } | Error::Misconfigured { .. }),
        "{e:?}"
    );
    let stranger = TestCa::generate("stranger CA").unwrap();
    let started = Instant::now();
    let e = baton::connect_with(&redis.url(), options().with_ca_cert(stranger.cert_pem()))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3), "{e:?}");
    assert!(matches!(e, Error::Misconfigured { .. }), "{e:?}");
}
