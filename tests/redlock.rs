//! Redlock on five independent redis-server containers (`RedisNodes::start(5)`), each test on
//! a cluster of its own so that it can stop and pause nodes. Every assertion is tied to a
//! promise of `baton::redlock`'s documentation; the keys are read from the servers directly.
//!
//! Tests synchronise on events (a key appearing on a node, a command counted by the server).
//! The only sleeps are the scenario of three tests: a holder that pauses past its validity.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use baton::Error;
use baton::redlock::{Redlock, RedlockGuard, RedlockOptions};
use baton::testing::{RedisNode, RedisNodes};
use redis::aio::MultiplexedConnection;

const PREFIX: &str = "test:";

async fn five_nodes() -> RedisNodes {
    RedisNodes::start(5).await.expect("five redis servers")
}

/// The options of most tests: the defaults, with our prefix.
fn options() -> RedlockOptions {
    RedlockOptions::new().with_prefix(PREFIX)
}

async fn client(nodes: &RedisNodes, options: RedlockOptions) -> Redlock {
    Redlock::connect(&nodes.urls(), options)
        .await
        .expect("connect to the five nodes")
}

fn key(resource: &str) -> String {
    format!("{PREFIX}{resource}")
}

async fn admin(nodes: &RedisNodes, i: usize) -> MultiplexedConnection {
    redis::Client::open(nodes.node(i).url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The value of `key` on node `i`.
async fn value_on(nodes: &RedisNodes, i: usize, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut admin(nodes, i).await)
        .await
        .unwrap()
}

/// The values of `key` on the nodes `on`.
async fn values(nodes: &RedisNodes, on: &[usize], key: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for &i in on {
        out.push(value_on(nodes, i, key).await);
    }
    out
}

/// The time to live of `key` on node `i`, in milliseconds (negative: no key, or no TTL).
async fn pttl(nodes: &RedisNodes, i: usize, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut admin(nodes, i).await)
        .await
        .unwrap()
}

/// How many `SET` commands node `i` has executed (its own count, `INFO commandstats`).
async fn sets_executed(nodes: &RedisNodes, i: usize) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut admin(nodes, i).await)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_set:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

const ALL: [usize; 5] = [0, 1, 2, 3, 4];

fn none(n: usize) -> Vec<Option<String>> {
    vec![None; n]
}

/// The one value held on every node of `on`, asserting that they agree.
async fn held_everywhere(nodes: &RedisNodes, on: &[usize], key: &str) -> String {
    let found = values(nodes, on, key).await;
    let first = found[0].clone().expect("the key is on the first node");
    assert!(
        found.iter().all(|v| v.as_ref() == Some(&first)),
        "every node holds the same owner value: {found:?}"
    );
    first
}

/// Waits until `cond` holds, re-checking after each short pause; fails the test after
/// `limit`. This waits for a condition to become true, it does not hope time made it so.
async fn eventually<F, Fut>(what: &str, limit: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Bounds a future that the test expects to finish.
async fn within<T>(what: &str, limit: Duration, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {limit:?}"))
}

fn assert_not_owner<T: std::fmt::Debug>(result: baton::Result<T>, resource: &str) {
    assert!(
        matches!(&result, Err(Error::NotOwner { key: k }) if *k == key(resource)),
        "expected NotOwner for {resource}, got {result:?}"
    );
}

/// Promise: a lock is `SET` with one owner value on every node, with the TTL; `try_lock` by
/// another client is `Locked` and leaves the holder's keys as they were; `lock` retries
/// `retry_count` times before `Locked`; `unlock` deletes the keys everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_every_node_and_unlocks_everywhere() {
    let nodes = five_nodes().await;
    let a = client(&nodes, options()).await;
    let b = client(
        &nodes,
        options()
            .with_retry_count(2)
            .with_retry_delay(Duration::from_millis(100))
            .with_retry_jitter(Duration::ZERO),
    )
    .await;
    assert_eq!(a.quorum(), 3);
    assert_eq!(a.endpoints().len(), 5);
    let k = key("basics");

    let guard = a.lock("basics").await.unwrap();
    assert_eq!(guard.resource(), "basics");
    assert_eq!(guard.key(), k);
    let validity = guard.validity();
    // TTL 10 s less the drift allowance (10 s * 0.01 + 2 ms) less the round.
    assert!(
        validity > Duration::from_secs(9) && validity <= Duration::from_millis(9_898),
        "{validity:?}"
    );
    let held = held_everywhere(&nodes, &ALL, &k).await;
    assert_eq!(held.len(), 40, "20 random bytes in hex: {held}");
    for i in ALL {
        let ttl = pttl(&nodes, i, &k).await;
        assert!(ttl > 9_000 && ttl <= 10_000, "node {i}: PTTL {ttl}");
    }

    let err = b.try_lock("basics").await.unwrap_err();
    assert!(
        matches!(&err, Error::Locked { name } if name == "basics"),
        "{err:?}"
    );
    // The failed round released its own value everywhere: the holder's keys are untouched.
    assert_eq!(held_everywhere(&nodes, &ALL, &k).await, held);

    let started = Instant::now();
    let err = b.lock("basics").await.unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "two retries, 100 ms apart: {:?}",
        started.elapsed()
    );
    assert_eq!(held_everywhere(&nodes, &ALL, &k).await, held);

    guard.release().await.unwrap();
    assert_eq!(values(&nodes, &ALL, &k).await, none(5));
    let again = b.try_lock("basics").await.unwrap();
    assert_ne!(
        held_everywhere(&nodes, &ALL, &k).await,
        held,
        "a new owner value"
    );
    again.release().await.unwrap();
}

/// Promise: `lock` keeps trying while the lock is held, and takes it once the holder
/// unlocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_retries_until_the_holder_unlocks() {
    let nodes = five_nodes().await;
    let a = client(&nodes, options()).await;
    let b = client(
        &nodes,
        options()
            .with_retry_count(1_000)
            .with_retry_delay(Duration::from_millis(20))
            .with_retry_jitter(Duration::from_millis(10)),
    )
    .await;
    let guard = a.lock("retries").await.unwrap();
    let sets_before = sets_executed(&nodes, 0).await;
    let waiter = tokio::spawn(async move { b.lock("retries").await });
    // Event: node 0 has refused two of the waiter's rounds.
    eventually(
        "the waiter has tried twice",
        Duration::from_secs(10),
        || async { sets_executed(&nodes, 0).await >= sets_before + 2 },
    )
    .await;
    assert!(
        !waiter.is_finished(),
        "the waiter waits while the lock is held"
    );
    guard.release().await.unwrap();
    let taken = within("the waiter takes the lock", Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(taken.validity() > Duration::ZERO);
    taken.release().await.unwrap();
}

/// Promise: at most one client holds the lock at a time, while nodes are all up (mutual
/// exclusion by quorum).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_never_hold_at_once() {
    const CLIENTS: usize = 3;
    const ROUNDS: usize = 10;
    let nodes = five_nodes().await;
    let inside = Arc::new(AtomicBool::new(false));
    let entered = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let redlock = client(
            &nodes,
            options()
                .with_retry_count(10_000)
                .with_retry_delay(Duration::from_millis(3))
                .with_retry_jitter(Duration::from_millis(3)),
        )
        .await;
        let (inside, entered) = (Arc::clone(&inside), Arc::clone(&entered));
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = redlock.lock("mutex").await.unwrap();
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                entered.fetch_add(1, Ordering::SeqCst);
                // The protected work: long enough for the others to try while it runs.
                tokio::time::sleep(Duration::from_millis(5)).await;
                assert!(guard.validity() > Duration::ZERO);
                inside.store(false, Ordering::SeqCst);
                guard.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        within("the clients finish", Duration::from_secs(60), task)
            .await
            .unwrap();
    }
    assert_eq!(entered.load(Ordering::SeqCst), CLIENTS * ROUNDS);
    assert_eq!(values(&nodes, &ALL, &key("mutex")).await, none(5));
}

/// Promise: with one node of five down, a quorum (3) remains: connecting, locking and
/// unlocking work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_down_still_acquires() {
    let nodes = five_nodes().await;
    let before = client(&nodes, options()).await;
    nodes.stop_node(4).await.unwrap();
    let after = client(&nodes, options()).await;
    let k = key("one-down");
    for redlock in [before, after] {
        let guard = redlock.lock("one-down").await.unwrap();
        assert!(guard.validity() > Duration::from_secs(9));
        held_everywhere(&nodes, &[0, 1, 2, 3], &k).await;
        guard.release().await.unwrap();
        assert_eq!(values(&nodes, &[0, 1, 2, 3], &k).await, none(4));
    }
}

/// Promise: with three nodes of five down no quorum is possible: `lock` fails within its
/// retries with an error that names the failed nodes, and leaves no key on the live nodes;
/// `connect` refuses at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_down_fail_cleanly() {
    let nodes = five_nodes().await;
    let redlock = client(&nodes, options()).await;
    let mut held = redlock.lock("three-down-held").await.unwrap();
    for i in [0, 1, 2] {
        nodes.stop_node(i).await.unwrap();
    }

    // A holder cannot extend without a quorum: told to stop, its keys released.
    let err = held.extend(Duration::from_secs(10)).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Backend {
                op: "redlock extend",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(held.validity(), Duration::ZERO);
    assert_eq!(
        values(&nodes, &[3, 4], &key("three-down-held")).await,
        none(2)
    );
    drop(held);

    let k = key("three-down");
    let started = Instant::now();
    let err = within(
        "lock gives up",
        Duration::from_secs(5),
        redlock.lock("three-down"),
    )
    .await
    .unwrap_err();
    // Four rounds, three pauses of 200 ms ± 100 ms, no node waited on: about 0.6 s.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(
            err,
            Error::Backend {
                op: "redlock lock",
                ..
            }
        ),
        "{err:?}"
    );
    let cause = std::error::Error::source(&err).unwrap().to_string();
    assert!(cause.starts_with("3 of 5 nodes failed"), "{cause}");
    assert_eq!(values(&nodes, &[3, 4], &k).await, none(2));

    let err = redlock.try_lock("three-down").await.unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    assert_eq!(values(&nodes, &[3, 4], &k).await, none(2));

    let err = Redlock::connect(&nodes.urls(), options())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
}

/// Promise: a node that hangs (docker pause) costs a round no more than the per-node
/// timeout; the lock is taken on the others, and the release reaches the hung node too,
/// behind the late `SET`, once it wakes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_costs_at_most_the_node_timeout() {
    let nodes = five_nodes().await;
    let node_timeout = Duration::from_millis(100);
    let redlock = client(&nodes, options().with_node_timeout(node_timeout)).await;
    let k = key("paused-node");
    let sets_before = sets_executed(&nodes, 0).await;
    nodes.node(0).pause().await.unwrap();

    let started = Instant::now();
    let guard = within(
        "try_lock beside a paused node",
        Duration::from_secs(2),
        redlock.try_lock("paused-node"),
    )
    .await
    .unwrap();
    let elapsed = started.elapsed();
    assert!(
        elapsed >= node_timeout && elapsed < Duration::from_millis(450),
        "the round waits for the paused node exactly the node timeout: {elapsed:?}"
    );
    assert!(
        guard.validity() <= Duration::from_millis(9_898) - node_timeout,
        "the wait is spent from the validity: {:?}",
        guard.validity()
    );
    held_everywhere(&nodes, &[1, 2, 3, 4], &k).await;
    guard.release().await.unwrap();
    assert_eq!(values(&nodes, &[1, 2, 3, 4], &k).await, none(4));

    nodes.node(0).unpause().await.unwrap();
    eventually(
        "the paused node has run the late SET",
        Duration::from_secs(10),
        || async { sets_executed(&nodes, 0).await > sets_before },
    )
    .await;
    assert_eq!(
        value_on(&nodes, 0, &k).await,
        None,
        "the release queued behind the late SET deleted it"
    );
}

/// Promise: a failed acquisition releases on every node it may have touched, including
/// nodes whose answer was lost: three paused nodes apply the `SET` late, and the release
/// sent after it deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answers_are_released_on_every_node() {
    let nodes = five_nodes().await;
    let redlock = client(&nodes, options().with_ttl(Duration::from_secs(60))).await;
    let k = key("lost-answers");
    let mut sets_before = Vec::new();
    for i in [0, 1, 2] {
        sets_before.push(sets_executed(&nodes, i).await);
        nodes.node(i).pause().await.unwrap();
    }
    let err = within(
        "try_lock gives up",
        Duration::from_secs(2),
        redlock.try_lock("lost-answers"),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    assert_eq!(values(&nodes, &[3, 4], &k).await, none(2));

    for i in [0, 1, 2] {
        nodes.node(i).unpause().await.unwrap();
    }
    for i in [0, 1, 2] {
        eventually(
            "the paused node has run the late SET",
            Duration::from_secs(10),
            || async { sets_executed(&nodes, i).await > sets_before[i] },
        )
        .await;
    }
    // Not an expiry: the TTL is 60 s.
    assert_eq!(values(&nodes, &ALL, &k).await, none(5));
}

/// Promise: a holder that paused past its validity is told so when it extends (the lock
/// may already be someone else's, and here it is); its failed extension and its unlock
/// leave the new holder's keys as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_validity_is_refused_on_extend() {
    let nodes = five_nodes().await;
    let a = client(&nodes, options().with_ttl(Duration::from_millis(300))).await;
    let b = client(&nodes, options()).await;
    let k = key("pause");
    let mut guard = a.lock("pause").await.unwrap();
    assert!(guard.validity() > Duration::ZERO);

    // The scenario: the holder stops (a GC pause, SIGSTOP) for longer than its TTL. This
    // sleep is that pause, not a synchronisation.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(guard.validity(), Duration::ZERO);

    // Meanwhile another client takes the lock: the keys expired on the servers.
    let successor = b.try_lock("pause").await.unwrap();
    let theirs = held_everywhere(&nodes, &ALL, &k).await;

    assert_not_owner(guard.extend(Duration::from_secs(10)).await, "pause");
    assert_eq!(held_everywhere(&nodes, &ALL, &k).await, theirs);
    for i in ALL {
        let ttl = pttl(&nodes, i, &k).await;
        assert!(
            ttl <= 10_000,
            "node {i}: the successor's TTL, not ours: {ttl}"
        );
    }
    assert_eq!(guard.validity(), Duration::ZERO);
    assert_not_owner(guard.extend(Duration::from_secs(10)).await, "pause");
    assert_not_owner(guard.release().await, "pause");
    assert_eq!(held_everywhere(&nodes, &ALL, &k).await, theirs);
    successor.release().await.unwrap();
}

/// Promise: `unlock` after the lock lapsed and someone else took it reports `NotOwner` and
/// deletes none of the other holder's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_after_another_took_the_lock_is_not_owner() {
    let nodes = five_nodes().await;
    let a = client(&nodes, options().with_ttl(Duration::from_millis(300))).await;
    let b = client(&nodes, options()).await;
    let k = key("lapsed");
    let guard = a.lock("lapsed").await.unwrap();
    // The scenario: the holder pauses past its TTL (a pause, not a synchronisation).
    tokio::time::sleep(Duration::from_millis(400)).await;
    let successor = b.try_lock("lapsed").await.unwrap();
    let theirs = held_everywhere(&nodes, &ALL, &k).await;
    assert_not_owner(guard.release().await, "lapsed");
    assert_eq!(held_everywhere(&nodes, &ALL, &k).await, theirs);
    successor.release().await.unwrap();
}

/// Promise: extend and unlock compare the owner value on every node: when our keys vanished
/// within our validity (servers restarted without their data) and another client took the
/// lock, neither moves nor deletes its keys, and both report `NotOwner`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_and_unlock_never_touch_another_holders_keys() {
    let nodes = five_nodes().await;
    let a = client(&nodes, options()).await;
    let b = client(&nodes, options().with_ttl(Duration::from_secs(5))).await;
    for resource in ["vanished-extend", "vanished-unlock"] {
        let k = key(resource);
        let mut guard = a.lock(resource).await.unwrap();
        for i in ALL {
            let _: () = redis::cmd("DEL")
                .arg(&k)
                .query_async(&mut admin(&nodes, i).await)
                .await
                .unwrap();
        }
        let successor = b.try_lock(resource).await.unwrap();
        let theirs = held_everywhere(&nodes, &ALL, &k).await;
        assert!(
            guard.validity() > Duration::from_secs(5),
            "still within validity"
        );
        if resource == "vanished-extend" {
            assert_not_owner(guard.extend(Duration::from_secs(30)).await, resource);
            for i in ALL {
                let ttl = pttl(&nodes, i, &k).await;
                assert!(
                    ttl > 0 && ttl <= 5_000,
                    "node {i}: not moved to 30 s: {ttl}"
                );
            }
            assert_eq!(guard.validity(), Duration::ZERO, "the guard is spent");
        } else {
            assert_not_owner(guard.release().await, resource);
        }
        assert_eq!(held_everywhere(&nodes, &ALL, &k).await, theirs);
        successor.release().await.unwrap();
    }
}

/// Promise: an extension within validity is applied on every node and moves the validity
/// forward to the new TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_within_validity_moves_validity_forward() {
    let nodes = five_nodes().await;
    let redlock = client(&nodes, options().with_ttl(Duration::from_secs(1))).await;
    let k = key("extend");
    let mut guard = redlock.lock("extend").await.unwrap();
    let ours = held_everywhere(&nodes, &ALL, &k).await;
    let before = guard.validity();
    assert!(before < Duration::from_secs(1));
    guard.extend(Duration::from_secs(20)).await.unwrap();
    let after = guard.validity();
    // 20 s less the drift allowance (202 ms) less the round.
    assert!(
        after > Duration::from_secs(19) && after <= Duration::from_millis(19_798),
        "{after:?}"
    );
    for i in ALL {
        let ttl = pttl(&nodes, i, &k).await;
        assert!(ttl > 19_000 && ttl <= 20_000, "node {i}: PTTL {ttl}");
    }
    assert_eq!(held_everywhere(&nodes, &ALL, &k).await, ours);
    guard.release().await.unwrap();
    assert_eq!(values(&nodes, &ALL, &k).await, none(5));
}

/// Promise: once the validity has passed, extend refuses even if the keys still exist on the
/// servers (the local clock is all the holder can trust), and releases them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_after_validity_is_refused_even_while_keys_remain() {
    let nodes = five_nodes().await;
    // A large drift allowance: the validity (about 1 s) ends long before the keys (2 s).
    let redlock = client(
        &nodes,
        options()
            .with_ttl(Duration::from_secs(2))
            .with_drift_factor(0.5),
    )
    .await;
    let k = key("late-extend");
    let mut guard = redlock.lock("late-extend").await.unwrap();
    // The scenario: the holder pauses just past its validity (a pause, not a
    // synchronisation).
    tokio::time::sleep(guard.validity() + Duration::from_millis(50)).await;
    assert_eq!(guard.validity(), Duration::ZERO);
    held_everywhere(&nodes, &ALL, &k).await;
    assert_not_owner(guard.extend(Duration::from_secs(2)).await, "late-extend");
    assert_eq!(values(&nodes, &ALL, &k).await, none(5), "released at once");
}

/// Promise: dropping `lock()` mid-round releases what it took, from a spawned task, long
/// before the TTL: on the nodes that answered and, once it wakes, on the one that hung.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_lock_releases_what_it_took() {
    let nodes = five_nodes().await;
    let redlock = client(
        &nodes,
        options()
            .with_ttl(Duration::from_secs(60))
            .with_node_timeout(Duration::from_secs(10)),
    )
    .await;
    let k = key("dropped");
    let sets_before = sets_executed(&nodes, 4).await;
    nodes.node(4).pause().await.unwrap();
    let task = tokio::spawn({
        let redlock = redlock.clone();
        async move { redlock.lock("dropped").await }
    });
    // Event: four nodes hold the key; the round still waits for the paused one.
    eventually(
        "four nodes hold the key",
        Duration::from_secs(5),
        || async {
            values(&nodes, &[0, 1, 2, 3], &k)
                .await
                .iter()
                .all(Option::is_some)
        },
    )
    .await;
    assert!(!task.is_finished(), "the round waits for the paused node");
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    eventually(
        "the drop released the key",
        Duration::from_secs(5),
        || async { values(&nodes, &[0, 1, 2, 3], &k).await == none(4) },
    )
    .await;

    nodes.node(4).unpause().await.unwrap();
    eventually(
        "the paused node has run the late SET",
        Duration::from_secs(10),
        || async { sets_executed(&nodes, 4).await > sets_before },
    )
    .await;
    assert_eq!(value_on(&nodes, 4, &k).await, None);
}

/// Promise: dropping a guard releases on every node in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_releases() {
    let nodes = five_nodes().await;
    let redlock = client(&nodes, options().with_ttl(Duration::from_secs(60))).await;
    let k = key("dropped-guard");
    let guard: RedlockGuard = redlock.lock("dropped-guard").await.unwrap();
    held_everywhere(&nodes, &ALL, &k).await;
    drop(guard);
    eventually(
        "the drop released the key",
        Duration::from_secs(5),
        || async { values(&nodes, &ALL, &k).await == none(5) },
    )
    .await;
}

/// Promise: `connect` refuses, before it locks anything, what cannot work: no node, a server
/// named twice, options that leave no validity, a malformed URL, fewer than a quorum of
/// reachable nodes (the cause kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_refuses_what_cannot_work() {
    let no_urls: [&str; 0] = [];
    let err = Redlock::connect(&no_urls, options()).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");

    let closed: Vec<String> = (0..3)
        .map(|_| {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            format!("redis://127.0.0.1:{port}")
        })
        .collect();
    let twice = [
        closed[0].clone(),
        format!("{}/1", closed[0]),
        closed[1].clone(),
    ];
    let err = Redlock::connect(&twice, options()).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");

    let short = options().with_ttl(Duration::from_millis(40));
    let err = Redlock::connect(&closed, short).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");

    let err = Redlock::connect(&["not a url"], options())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");

    let started = Instant::now();
    let err = Redlock::connect(&closed, options()).await.unwrap_err();
    assert!(
        matches!(&err, Error::Connect { endpoints, .. } if endpoints.len() == 3),
        "{err:?}"
    );
    let cause = std::error::Error::source(&err).unwrap().to_string();
    assert!(cause.starts_with("3 of 3 nodes failed"), "{cause}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// Promise: one server behind two names (here a proxy in front of it, as `localhost` and
/// `127.0.0.1` or a DNS alias would be) is refused, although the URLs differ: it would count
/// twice towards the quorum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_behind_two_names_is_refused() {
    let nodes = RedisNodes::start(2).await.unwrap();
    let alias = baton::testing::Proxy::start(&format!("127.0.0.1:{}", nodes.node(0).port()))
        .await
        .unwrap();
    let urls = [
        nodes.node(0).url(),
        format!("redis://{}", alias.addr()),
        nodes.node(1).url(),
    ];
    let err = Redlock::connect(&urls, options()).await.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(why) if why.contains("same Redis server")),
        "{err:?}"
    );
    // Three distinct servers are accepted.
    let third = RedisNode::start().await.unwrap();
    let urls = [nodes.node(0).url(), nodes.node(1).url(), third.url()];
    assert!(Redlock::connect(&urls, options()).await.is_ok());
}

/// Promise: Redlock takes `rediss://` URLs with a CA and a client certificate, as
/// `RedisBackend` does. Three nodes serving TLS only, each requiring a client certificate: a
/// lock is taken and its key is on every node; a CA that did not sign the nodes' certificates
/// is `Misconfigured`, a missing client certificate `Auth`, each saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_lock_is_taken_and_refusals_say_why() {
    use baton::testing::{RedisTls, TestCa};
    let tls = RedisTls::generate().expect("certificates");
    let nodes = futures::future::try_join_all((0..3).map(|_| RedisNode::start_tls(&tls)))
        .await
        .expect("three redis servers serving TLS");
    let urls: Vec<String> = nodes.iter().map(RedisNode::url).collect();
    assert!(urls.iter().all(|u| u.starts_with("rediss://")), "{urls:?}");
    let client = tls.client_cert().expect("the fixture's client certificate");
    let trusted = || {
        options()
            .with_ca_cert(tls.ca_pem())
            .with_client_cert(client.cert_pem(), client.key_pem())
    };
    let redlock = Redlock::connect(&urls, trusted())
        .await
        .expect("connect over TLS");
    let guard = redlock.lock("tls").await.expect("lock over TLS");
    for node in &nodes {
        let held: Option<String> = node
            .command("GET", &[&key("tls")])
            .await
            .expect("GET over TLS");
        assert!(held.is_some(), "the key is on {}", node.url());
    }
    guard.release().await.expect("unlock");

    let other = TestCa::generate("another CA").expect("a CA");
    let Err(err) = Redlock::connect(
        &urls,
        options()
            .with_ca_cert(other.cert_pem())
            .with_client_cert(client.cert_pem(), client.key_pem()),
    )
    .await
    else {
        panic!("connected trusting a CA that signed nothing here");
    };
    assert!(matches!(err, Error::Misconfigured { .. }), "{err:?}");
    assert!(
        format!("{err} {:?}", std::error::Error::source(&err))
            .contains("not signed by a trusted CA"),
        "{err:?}"
    );
    let Err(err) = Redlock::connect(&urls, options().with_ca_cert(tls.ca_pem())).await else {
        panic!("connected without the client certificate the nodes require");
    };
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
}
