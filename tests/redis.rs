//! The conformance suite and Redis-specific tests against a real redis-server, started through
//! testcontainers (see `baton::testing`). One server is shared by the tests of this binary;
//! each test uses its own key prefix.

#[path = "support/mod.rs"]
mod support;

#[path = "../examples/common/scenarios.rs"]
#[allow(dead_code, unreachable_pub)]
mod scenarios;

use std::sync::Arc;
use std::time::Duration;

use baton::testing::RedisNode;
use baton::{
    Backend, Error, MemoryFence, Mutex, RedisBackend, RedisOptions, Session, SessionOptions,
};
use support::{Rig, eventually, within};

async fn backend() -> RedisBackend {
    RedisNode::shared()
        .backend()
        .await
        .expect("connect to the shared redis")
}

async fn rig(test: &str) -> Rig {
    Rig {
        backend: Arc::new(backend().await),
        // A second connection: "someone else" really is another client.
        outside: Arc::new(backend().await),
        prefix: format!("redis-{}/{test}", std::process::id()),
    }
}

conformance!(super::rig; flavor = "multi_thread", worker_threads = 2);

fn test_name(test: &str) -> String {
    format!("redis-{}/{test}", std::process::id())
}

/// A fresh backend on `node`, with a short lease so that loss is quick to see.
async fn session_on(node: &RedisNode, ttl: Duration) -> (RedisBackend, Session) {
    let backend = node.backend().await.unwrap();
    let session = Session::with_options(
        Arc::new(backend.clone()),
        SessionOptions::new().with_ttl(ttl),
    )
    .await
    .unwrap();
    (backend, session)
}

/// Bad URLs, dead ports and servers that could break the promises are refused at connect,
/// with the cause kept; a `volatile-*` eviction policy (never evicts keys without a TTL) is
/// accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_checks_the_url_the_port_and_the_eviction_policy() {
    let err = RedisBackend::connect("not a url", RedisOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");

    let port = support::refused_port();
    let started = std::time::Instant::now();
    let err = RedisBackend::connect(
        &format!("redis://127.0.0.1:{port}"),
        RedisOptions::new().with_connect_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the cause is kept"
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    let evicting = RedisNode::start_with(&["--maxmemory-policy", "allkeys-lru"])
        .await
        .unwrap();
    let err = RedisBackend::connect(&evicting.url(), RedisOptions::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::ServerSetting { setting: "maxmemory-policy", value, .. } if value == "allkeys-lru"),
        "{err:?}"
    );
    let mut admin = redis::Client::open(evicting.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("volatile-lru")
        .query_async(&mut admin)
        .await
        .unwrap();
    RedisBackend::connect(&evicting.url(), RedisOptions::new())
        .await
        .expect("volatile-lru never evicts keys without a TTL");
}

/// One release wakes exactly one waiter, whatever the queue's length: the server pushes one
/// wake-up, to the successor's mailbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_one_waiter() {
    const WAITERS: usize = 20;
    let name = test_name("one-wake");
    let holder_backend = backend().await;
    let holder = Session::new(holder_backend.clone()).await.unwrap();
    let guard = Mutex::new(&holder, &name).unwrap().lock().await.unwrap();
    let waiters_backend = backend().await;
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        // A session's own tasks take turns locally; each waiter is another session.
        let waiting = Session::new(waiters_backend.clone()).await.unwrap();
        let mutex = Mutex::new(&waiting, &name).unwrap();
        tasks.push(tokio::spawn(async move { mutex.lock().await }));
        eventually("the waiter is queued", || async {
            holder_backend.entries(&name).await.unwrap().len() == i + 2
        })
        .await;
    }
    let before = waiters_backend.wakeups();
    guard.release().await.unwrap();
    let first = tasks.remove(0);
    let next = within("the next holder", Duration::from_secs(10), first)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        waiters_backend.wakeups() - before,
        1,
        "one wake-up for one release"
    );
    assert!(tasks.iter().all(|t| !t.is_finished()));
    next.release().await.unwrap();
    for task in tasks {
        within("each waiter in turn", Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    assert_eq!(
        waiters_backend.wakeups() - before,
        WAITERS as u64,
        "one wake-up per release, no more"
    );
}

/// A thousand waiters of one process share its connections: one for requests, one for the
/// mailbox that wakes them all (not one blocked connection per waiter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiters_share_two_connections() {
    const WAITERS: usize = 1_000;
    let node = RedisNode::start().await.unwrap();
    let mut admin = redis::Client::open(node.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let clients = |admin: &mut redis::aio::MultiplexedConnection| {
        let mut admin = admin.clone();
        async move {
            let list: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query_async(&mut admin)
                .await
                .unwrap();
            list.lines().count()
        }
    };
    let alone = clients(&mut admin).await;
    let (backend, session) = session_on(&node, Duration::from_secs(10)).await;
    let name = test_name("many-waiters");
    let guard = Mutex::new(&session, &name).unwrap().lock().await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        // Sessions on one backend (a session's own tasks would take turns locally).
        let waiting = Session::with_options(
            Arc::new(backend.clone()),
            SessionOptions::new().with_ttl(Duration::from_secs(10)),
        )
        .await
        .unwrap();
        let mutex = Mutex::new(&waiting, &name).unwrap();
        tasks.push(tokio::spawn(async move { mutex.lock().await }));
    }
    eventually("every waiter is queued", || async {
        backend.entries(&name).await.unwrap().len() == WAITERS + 1
    })
    .await;
    let used = clients(&mut admin).await - alone;
    println!("{WAITERS} waiters: {used} connections");
    assert!(used <= 2, "{used} connections for {WAITERS} waiters");
    drop(tasks);
    guard.release().await.unwrap();
}

/// A wait that lasts longer than one blocking read of the mailbox (5 s) is still woken at
/// once: the blocking read is renewed, never cut by a client-side response timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_wait_is_woken_at_the_release() {
    let name = test_name("long-wait");
    let a = Session::new(backend().await).await.unwrap();
    let b = Session::new(backend().await).await.unwrap();
    let guard = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let backend = backend().await;
    let waiter = support::spawn_queued(&backend, &b, &name, 2).await;
    // The scenario is a long hold: the holder keeps the lock across two blocking reads.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(!waiter.is_finished());
    let released = std::time::Instant::now();
    guard.release().await.unwrap();
    let next = within("the waiter", Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    println!("handoff after a 7 s wait: {:?}", released.elapsed());
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "woken by the release, not by a re-check"
    );
    next.release().await.unwrap();
}

/// The fault-injection harness on Redis, sampled as on etcd (see docs/reliability.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_harness_sample() {
    support::harness::run_sample("redis", |case: String| async move {
        Rig {
            backend: Arc::new(backend().await),
            outside: Arc::new(backend().await),
            prefix: format!("redis-{}/harness/{case}", std::process::id()),
        }
    })
    .await;
}

/// The fencing scenarios of the `inventory`, `payment` and `bank_transfer` examples on Redis,
/// with the first holder paused at every point: each checks its own invariant, and the paused
/// holder's late write is refused by the fence (see tests/examples.rs for memory and etcd).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_scenarios_at_every_pause_point() {
    let backend = backend().await;
    let run = test_name("examples");
    for (i, pause) in scenarios::Pause::ALL.into_iter().enumerate() {
        let world = |what: &str| scenarios::World {
            backend: Arc::new(backend.clone()),
            fence: Arc::new(MemoryFence::new()),
            prefix: format!("{run}/{what}-{i}"),
        };
        if scenarios::Pause::INVENTORY.contains(&pause) {
            let report = scenarios::inventory(&world("inventory"), pause).await;
            println!("inventory: {}", report.unwrap());
        }
        let report = scenarios::payment(&world("payment"), pause).await;
        println!("payment: {}", report.unwrap());
        let report = scenarios::bank_transfer(&world("bank"), pause).await;
        println!("bank_transfer: {}", report.unwrap());
    }
}

/// An observer reports only heads that existed (`support::observers_report_only_heads_that_existed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_report_only_heads_that_existed() {
    let backend = backend().await;
    support::observers_report_only_heads_that_existed(
        &backend,
        &test_name("observe-heads"),
        8,
        |_, _| async {},
    )
    .await;
}

/// The next head an observer reports, skipping the errors it reports while cut off.
async fn next_head(
    events: &mut futures::stream::BoxStream<'static, baton::Result<baton::HeadEvent>>,
) -> baton::HeadEvent {
    use futures::StreamExt;
    loop {
        match within("a head", Duration::from_secs(30), events.next()).await {
            Some(Ok(event)) => return event,
            Some(Err(e)) => println!("observer: {e}"),
            None => panic!("the stream ended"),
        }
    }
}

fn is_head_with(event: &baton::HeadEvent, value: &[u8]) -> bool {
    matches!(event, baton::HeadEvent::Head(Some(e)) if e.value() == value)
}

/// An observer cut off from Redis resumes from the last head it read once it can reach Redis
/// again, and reports every leader change it missed, in order (the heads' stream kept them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observer_resumes_after_a_broken_connection() {
    use baton::{Election, HeadEvent};
    let url = RedisNode::shared().url();
    let proxy = support::proxy::Proxy::start(url.trim_start_matches("redis://")).await;
    let name = test_name("observe-resume");
    let behind = RedisBackend::connect(
        &proxy.endpoint().replace("http://", "redis://"),
        RedisOptions::new()
            .with_restart_grace(Duration::ZERO)
            .with_request_timeout(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let direct = backend().await;
    let mut events = behind.observe_head(&name);
    assert_eq!(next_head(&mut events).await, HeadEvent::Head(None));
    let a = Session::new(direct.clone()).await.unwrap();
    let leader_a = Election::new(&a, &name)
        .unwrap()
        .campaign("a")
        .await
        .unwrap();
    assert!(is_head_with(&next_head(&mut events).await, b"a"));

    proxy.black_hole();
    leader_a.release().await.unwrap();
    let b = Session::new(direct.clone()).await.unwrap();
    let leader_b = Election::new(&b, &name)
        .unwrap()
        .campaign("b")
        .await
        .unwrap();
    proxy.heal();

    assert_eq!(
        next_head(&mut events).await,
        HeadEvent::Head(None),
        "the missed vacancy"
    );
    let next = next_head(&mut events).await;
    assert!(is_head_with(&next, b"b"), "{next:?}");
    leader_b.release().await.unwrap();
}

/// An observer of a Redis restarted without its data cannot be told what it missed: it says
/// so (`Skipped`), then reports the current head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observer_of_a_restarted_server_reports_the_gap() {
    use baton::{Election, HeadEvent};
    let node = RedisNode::start().await.unwrap();
    let backend = node.backend().await.unwrap();
    let name = test_name("observe-restart");
    let mut events = backend.observe_head(&name);
    assert_eq!(next_head(&mut events).await, HeadEvent::Head(None));
    let a = Session::new(backend.clone()).await.unwrap();
    let _leader_a = Election::new(&a, &name)
        .unwrap()
        .campaign("a")
        .await
        .unwrap();
    assert!(is_head_with(&next_head(&mut events).await, b"a"));

    node.restart().await.unwrap();
    let b = Session::new(backend.clone()).await.unwrap();
    let leader_b = within(
        "b leads on the restarted server",
        Duration::from_secs(20),
        Election::new(&b, &name).unwrap().campaign("b"),
    )
    .await
    .unwrap();
    assert_eq!(next_head(&mut events).await, HeadEvent::Skipped);
    let next = next_head(&mut events).await;
    assert!(is_head_with(&next, b"b"), "{next:?}");
    leader_b.release().await.unwrap();
}

/// A request that fails for good names the server in its message (and keeps the cause).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_the_server() {
    let url = RedisNode::shared().url();
    let proxy = support::proxy::Proxy::start(url.trim_start_matches("redis://")).await;
    let through = proxy.endpoint().replace("http://", "redis://");
    let behind = RedisBackend::connect(
        &through,
        RedisOptions::new()
            .with_restart_grace(Duration::ZERO)
            .with_request_timeout(Duration::from_millis(200))
            .with_retry_for(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    proxy.black_hole();
    let err = behind.read("anything").await.unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, Error::Backend { op: "read", .. }), "{err:?}");
    assert!(
        message.contains(&format!("Redis at {through}")),
        "{message}"
    );
    assert!(
        std::error::Error::source(&err).is_some(),
        "the cause is kept"
    );
}

/// Promise (`RedisBackend::connect`'s errors): credentials refused or missing are
/// `Error::Auth`; a user whose password is right but who may not run a command baton's
/// scripts run (here `INFO`) is `Error::Permission`, which names the command; a user with
/// exactly the permissions docs/redis.md lists can lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_tells_refused_credentials_from_a_missing_permission() {
    let node = RedisNode::start().await.unwrap();
    let _: () = node
        .command(
            "ACL",
            &[
                "SETUSER", "noinfo", "on", ">pw", "~*", "&*", "+@all", "-info",
            ],
        )
        .await
        .unwrap();
    // As docs/redis.md ("What is checked at connect") lists them.
    let documented = "on >pw ~baton:* +@read +@write +@scripting +info +time +blpop +xread";
    let mut rules = vec!["SETUSER", "app"];
    rules.extend(documented.split(' '));
    let _: () = node.command("ACL", &rules).await.unwrap();
    let _: () = node
        .command("CONFIG", &["SET", "requirepass", "secret"])
        .await
        .unwrap();
    let at = |auth: &str| format!("redis://{auth}127.0.0.1:{}", node.port());
    let options = || RedisOptions::new().with_restart_grace(Duration::ZERO);
    for (auth, what) in [("", "no password"), (":wrong@", "a wrong password")] {
        let err = RedisBackend::connect(&at(auth), options())
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Auth { .. }), "{what}: {err:?}");
    }
    let err = RedisBackend::connect(&at("noinfo:pw@"), options())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Permission { .. }), "{err:?}");
    let cause = std::error::Error::source(&err).unwrap().to_string();
    assert!(
        cause.contains("info"),
        "the cause names the command: {cause}"
    );
    assert!(
        RedisBackend::connect(&at(":secret@"), options())
            .await
            .is_ok()
    );
    let app = RedisBackend::connect(&at("app:pw@"), options())
        .await
        .unwrap();
    let s = Session::new(app).await.unwrap();
    let guard = Mutex::new(&s, "acl").unwrap().lock().await.unwrap();
    guard.release().await.unwrap();
    s.close().await.unwrap();
}

/// `ConnectOptions` reaches the Redis backend's options: a key prefix set through
/// `connect_with` keeps two applications' locks of one name apart, and clients with the same
/// prefix share them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_options_carry_the_key_prefix() {
    let url = RedisNode::shared().url();
    let pid = std::process::id();
    support::namespaces_keep_locks_apart("prefix", |app| {
        baton::connect_with(
            &url,
            baton::ConnectOptions::new()
                .with_redis_prefix(format!("connect-{app}-{pid}:"))
                // New prefixes: no holder can predate them.
                .with_restart_grace(Duration::ZERO)
                .with_request_timeout(Duration::from_secs(2))
                .with_retry_for(Duration::from_secs(3)),
        )
    })
    .await;
}

/// `baton init` on a store baton has never used (here: a key prefix nobody used) marks it new:
/// the first lock is granted at once, not after the restart grace. Opening the backend's
/// mailbox (at connect) used to begin the store's first epoch, with its grace, so `init`
/// found the store marked and changed nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_marks_a_store_never_used_as_new() {
    let (prefix, url) = (
        format!("baton-init-{}:", std::process::id()),
        RedisNode::shared().url(),
    );
    let connect = || {
        let options = RedisOptions::new()
            .with_prefix(prefix.clone())
            .with_restart_grace(Duration::from_secs(60));
        RedisBackend::connect(&url, options)
    };
    support::init_marks_a_store_never_used_as_new(connect).await;
}
