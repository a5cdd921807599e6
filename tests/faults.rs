//! Fault injection against real etcd: members stopped, paused and restarted, a client cut
//! off by a proxy, a holder killed with SIGKILL, leases revoked from outside, compaction
//! under waiters, and foreign keys under the lock prefix; against Redis: restarted
//! without persistence mid-queue, a client cut off, a holder killed; and against ZooKeeper:
//! an ensemble's leader stopped mid-queue, a follower then the leader paused, a client cut
//! off, a holder killed, a session expired while waiting. Every scenario writes through the
//! safety checker and prints a `RELIABILITY|...` line; `just reliability` turns those lines
//! into docs/reliability.md.

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use baton::testing::{EtcdCluster, EtcdNode, RedisNode, ZkEnsemble, ZkNode};
use baton::{
    Backend, EtcdBackend, EtcdFence, EtcdOptions, Fence, MemoryFence, Mutex, MutexGuard,
    RedisBackend, RedisOptions, Session, SessionOptions, ZkBackend, ZkOptions,
};
use support::proxy::Proxy;
use support::{FencedRegister, eventually, within};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The cluster scenarios (etcd clusters, ZooKeeper ensembles) run one at a time: three
/// clusters (nine members) at once on a 2-core machine starve each other's elections and
/// measure the machine, not baton. The ZooKeeper scenarios on one server take it too: a JVM
/// starting beside an etcd pause scenario once starved it until the holder's lease expired.
static CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn name(test: &str) -> String {
    format!("faults-{}/{test}", std::process::id())
}

async fn connect(endpoints: &[String], retry_for: Duration) -> EtcdBackend {
    let options = EtcdOptions::new()
        .with_request_timeout(Duration::from_secs(2))
        .with_retry_for(retry_for);
    EtcdBackend::connect(endpoints, options).await.unwrap()
}

async fn session<B: Backend + Clone>(backend: &B, ttl: Duration) -> Session {
    Session::with_options(backend.clone(), SessionOptions::new().with_ttl(ttl))
        .await
        .unwrap()
}

/// Starts `n` contenders, each with its own session, queued one after another behind the
/// current holder; each, when granted, enters the register, reports its token and leaves.
async fn queue_contenders<B: Backend + Clone>(
    backend: &B,
    name: &str,
    n: usize,
    ttl: Duration,
    register: &Arc<FencedRegister>,
) -> (Vec<Session>, mpsc::UnboundedReceiver<baton::Result<u64>>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut sessions = Vec::new();
    let already = backend.entries(name).await.unwrap().len();
    for i in 0..n {
        let s = session(backend, ttl).await;
        sessions.push(s.clone());
        let (tx, lock_name, register) = (tx.clone(), name.to_owned(), Arc::clone(register));
        tokio::spawn(async move {
            let result = async {
                let guard = Mutex::new(&s, &lock_name)?.lock().await?;
                let token = guard.fencing_token().get();
                assert!(register.enter(token));
                register.exit(token);
                guard.release().await?;
                Ok(token)
            }
            .await;
            let _ = tx.send(result);
        });
        eventually("the contender is queued", || async {
            backend
                .entries(name)
                .await
                .is_ok_and(|e| e.len() == already + i + 1)
        })
        .await;
    }
    (sessions, rx)
}

async fn queued_tokens(backend: &dyn Backend, name: &str) -> Vec<u64> {
    backend
        .entries(name)
        .await
        .unwrap()
        .iter()
        .map(|e| e.token().get())
        .collect()
}

async fn drain(rx: &mut mpsc::UnboundedReceiver<baton::Result<u64>>, n: usize, limit: Duration) {
    for _ in 0..n {
        within("a grant", limit, rx.recv()).await.unwrap().unwrap();
    }
}

async fn leader(cluster: &EtcdCluster) -> usize {
    within("a leader", Duration::from_secs(20), async {
        loop {
            if let Ok(Some(l)) = cluster.leader().await {
                return l;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
}

/// Holds the lock: enters the register and returns the guard.
async fn hold(s: &Session, name: &str, register: &FencedRegister) -> MutexGuard {
    let guard = Mutex::new(s, name).unwrap().lock().await.unwrap();
    assert!(register.enter(guard.fencing_token().get()));
    guard
}

async fn release(guard: MutexGuard, register: &FencedRegister) {
    register.exit(guard.fencing_token().get());
    guard.release().await.unwrap();
}

/// A three-member cluster, a client on all its members (retrying for `retry_for`), the
/// safety checker, and a holder session with `ttl`.
async fn cluster_scenario(
    retry_for: Duration,
    ttl: Duration,
) -> (EtcdCluster, EtcdBackend, Arc<FencedRegister>, Session) {
    let cluster = EtcdCluster::start().await.unwrap();
    let backend = connect(&cluster.endpoints(), retry_for).await;
    let holder = session(&backend, ttl).await;
    (cluster, backend, Arc::default(), holder)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_stopped_mid_queue_then_restarted() {
    let _one_at_a_time = CLUSTER.lock().await;
    let ttl = Duration::from_secs(10);
    let (cluster, backend, register, holder) = cluster_scenario(Duration::from_secs(30), ttl).await;
    let name = "stop-leader";
    let guard = hold(&holder, name, &register).await;
    let (_sessions, mut granted) = queue_contenders(&backend, name, 8, ttl, &register).await;
    let queue = queued_tokens(&backend, name).await;

    let old_leader = leader(&cluster).await;
    cluster.stop_member(old_leader).await.unwrap();
    release(guard, &register).await;
    drain(&mut granted, 4, Duration::from_secs(30)).await;
    cluster.start_member(old_leader).await.unwrap();
    drain(&mut granted, 4, Duration::from_secs(30)).await;

    register.assert_safe(
        "leader stopped mid-queue, restarted",
        "queue drains in FIFO order, no overlap",
        Some(&queue),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_then_leader_paused() {
    support::capture_logs();
    let _one_at_a_time = CLUSTER.lock().await;
    let ttl = Duration::from_secs(15);
    let (cluster, backend, register, holder) = cluster_scenario(Duration::from_secs(30), ttl).await;
    let name = "pause";

    let first_leader = leader(&cluster).await;
    let follower = (first_leader + 1) % 3;
    let guard = hold(&holder, name, &register).await;
    let (_s1, mut granted) = queue_contenders(&backend, name, 3, ttl, &register).await;
    cluster.pause_member(follower).await.unwrap();
    release(guard, &register).await;
    drain(&mut granted, 3, Duration::from_secs(30)).await;
    cluster.unpause_member(follower).await.unwrap();

    let guard = hold(&holder, name, &register).await;
    let (_s2, mut granted) = queue_contenders(&backend, name, 3, ttl, &register).await;
    let paused_leader = leader(&cluster).await;
    cluster.pause_member(paused_leader).await.unwrap();
    release(guard, &register).await;
    drain(&mut granted, 3, Duration::from_secs(40)).await;
    cluster.unpause_member(paused_leader).await.unwrap();
    let guard = within(
        "a lock after unpausing",
        Duration::from_secs(30),
        hold(&holder, name, &register),
    )
    .await;
    release(guard, &register).await;

    register.assert_safe(
        "a follower, then the leader paused",
        "grants continue with a quorum, no overlap",
        None,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_restarted_while_held() {
    let _one_at_a_time = CLUSTER.lock().await;
    let ttl = Duration::from_secs(5);
    let (cluster, backend, register, holder) = cluster_scenario(Duration::from_secs(60), ttl).await;
    let name = "restart-all";
    let guard = hold(&holder, name, &register).await;
    let (_sessions, mut granted) =
        queue_contenders(&backend, name, 2, Duration::from_secs(60), &register).await;

    let lost_at: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    tokio::spawn({
        let (lost, lost_at, register) = (guard.lost(), Arc::clone(&lost_at), Arc::clone(&register));
        let token = guard.fencing_token().get();
        async move {
            lost.await;
            // Told: from here on the holder stops its critical section.
            register.exit(token);
            *lost_at.lock().unwrap() = Some(Instant::now());
        }
    });
    for i in 0..3 {
        cluster.stop_member(i).await.unwrap();
    }
    futures::future::join_all((0..3).map(|i| cluster.start_member(i)))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();

    // Either the holder kept its lease (then nobody else may hold), or it was told it lost
    // the lock before anyone else was granted it.
    let first_grant = tokio::select! {
        token = granted.recv() => Some((Instant::now(), token.unwrap())),
        () = tokio::time::sleep(Duration::from_secs(20)) => None,
    };
    let told = *lost_at.lock().unwrap();
    match first_grant {
        Some((granted_at, token)) => {
            let told = told.expect("someone was granted while the holder was never told it lost");
            assert!(
                told <= granted_at,
                "the holder was told after its successor was granted"
            );
            let token = token.unwrap();
            // The old holder's late write is fenced off.
            assert!(
                !register.late_write(guard.fencing_token().get()),
                "late write of {token}'s predecessor accepted"
            );
            register.exit(guard.fencing_token().get());
            drain(&mut granted, 1, Duration::from_secs(30)).await;
        }
        None => {
            assert!(
                told.is_none() && guard.is_owner().await.unwrap(),
                "holder kept its lease"
            );
            release(guard, &register).await;
            drain(&mut granted, 2, Duration::from_secs(30)).await;
        }
    }
    register.assert_safe(
        "whole cluster restarted while held",
        "holder keeps its lease or is told before anyone else is granted",
        None,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_cut_off_by_a_proxy() {
    let node = EtcdNode::shared();
    let proxy = Proxy::start(&node.endpoints()[0]).await;
    let name = name("proxy");
    let direct = connect(node.endpoints(), Duration::from_secs(10)).await;
    let behind = connect(&[proxy.endpoint()], Duration::from_secs(2)).await;
    let fence = EtcdFence::new(direct.clone(), format!("{name}-fence")).unwrap();
    cut_off_holder_is_told(
        &proxy,
        &behind,
        &direct,
        &fence,
        &name,
        "client cut off by a proxy",
        "lost() no later than the server's expiry; successor holds; late write fenced",
    )
    .await;
}

/// When things happened after a holder was cut off, measured from the cut.
#[derive(Debug, Clone, Copy)]
struct CutOff {
    /// The holder's `lost()` fired.
    lost: Duration,
    /// A client beside the holder saw its entry gone: the server expired its lease.
    expired: Duration,
    /// The successor was granted (timed where it happens).
    granted: Duration,
}

/// A holder on `behind` (a client going through `proxy`) holds `name`, a successor on
/// `direct` waits; the proxy cuts the holder off. It is told (`lost()`) no later than the
/// server expires its lease, before the successor's grant (timed where it happens), and its
/// late write is refused by `fence`. Returns when each of those happened.
async fn cut_off_holder_is_told<B: Backend + Clone>(
    proxy: &Proxy,
    behind: &B,
    direct: &B,
    fence: &dyn Fence,
    name: &str,
    scenario: &str,
    promise: &str,
) -> CutOff {
    let register = Arc::new(FencedRegister::default());
    let ttl = Duration::from_secs(3);
    let cut_off = session(behind, ttl).await;
    let guard = hold(&cut_off, name, &register).await;
    fence
        .write("data", guard.ticket(), b"before")
        .await
        .unwrap();
    let successor = session(direct, Duration::from_secs(30)).await;
    let waiting = tokio::spawn({
        let mutex = Mutex::new(&successor, name).unwrap();
        // The instant of the grant, taken where it happens.
        async move { mutex.lock().await.map(|g| (g, Instant::now())) }
    });
    eventually("the successor is queued", || async {
        direct.entries(name).await.unwrap().len() == 2
    })
    .await;

    // The server's expiry, as a client beside the holder sees it.
    let expired = tokio::spawn({
        let (direct, entry) = (direct.clone(), guard.entry().clone());
        async move { direct.wait_gone(&entry).await.map(|()| Instant::now()) }
    });
    proxy.black_hole();
    let cut_at = Instant::now();
    let lost = within("lost() behind the black hole", ttl * 2, guard.lost()).await;
    let lost_at = Instant::now();
    register.exit(guard.fencing_token().get());
    let (next, granted_at) = within("the successor", ttl * 3, waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        lost_at <= granted_at,
        "told {lost:?} only after the successor held"
    );
    assert!(
        lost_at - cut_at <= ttl,
        "lost() fired no later than the server's expiry"
    );
    assert!(register.enter(next.fencing_token().get()));
    fence.write("data", next.ticket(), b"after").await.unwrap();
    // The cut-off holder's late write (sent once it can reach the resource again).
    let late = fence.write("data", guard.ticket(), b"late").await;
    assert!(
        matches!(late, Err(baton::Error::StaleToken { .. })),
        "{late:?}"
    );
    assert!(!register.late_write(guard.fencing_token().get()));
    register.exit(next.fencing_token().get());
    next.release().await.unwrap();
    let expired_at = within("the server's expiry seen", ttl * 2, expired)
        .await
        .unwrap()
        .unwrap();
    register.assert_safe(scenario, promise, None);
    let times = CutOff {
        lost: lost_at - cut_at,
        expired: expired_at.saturating_duration_since(cut_at),
        granted: granted_at - cut_at,
    };
    println!(
        "{scenario}: after the cut, lost() {:?}, the server's expiry seen {:?}, the successor granted {:?}",
        times.lost, times.expired, times.granted
    );
    times
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_process_killed() {
    let node = EtcdNode::shared();
    let backend = connect(node.endpoints(), Duration::from_secs(10)).await;
    killed_holder_is_followed(
        &["--endpoints", &node.endpoints().join(",")],
        &backend,
        "holder killed with SIGKILL",
    )
    .await;
}

/// `baton lock --ttl 2` (with `endpoint_args`) holds, is killed with SIGKILL, and a contender
/// on `backend` holds within TTL + 3 s.
async fn killed_holder_is_followed<B: Backend + Clone>(
    endpoint_args: &[&str],
    backend: &B,
    scenario: &str,
) {
    let name = name(&format!("sigkill-{}", scenario.len()));
    let register = FencedRegister::default();
    let mut holder = tokio::process::Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(endpoint_args)
        .args(["lock", &name, "--ttl", "2"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(holder.stdout.take().unwrap()).lines();
    within(
        "the child holds",
        Duration::from_secs(20),
        lines.next_line(),
    )
    .await
    .unwrap();
    let token: u64 = lines.next_line().await.unwrap().unwrap().parse().unwrap();
    assert!(register.enter(token));
    holder.start_kill().unwrap(); // SIGKILL
    holder.wait().await.unwrap();
    let killed_at = Instant::now();
    let s = session(backend, Duration::from_secs(30)).await;
    let guard = within(
        "the successor",
        Duration::from_secs(10),
        Mutex::new(&s, &name).unwrap().lock(),
    )
    .await
    .unwrap();
    let followed = killed_at.elapsed();
    assert!(followed <= Duration::from_secs(2) + Duration::from_secs(3));
    println!("{scenario}: the successor held {followed:?} after the kill (TTL 2 s)");
    register.exit(token);
    assert!(register.enter(guard.fencing_token().get()));
    release(guard, &register).await;
    register.assert_safe(scenario, "successor holds within TTL + 3 s", None);
}

/// A semaphore holder (`baton lock -n 2`) killed with SIGKILL: its permit returns when its
/// lease ends, to the waiter first in line, and there are never more holders than permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_holder_killed() {
    let node = EtcdNode::shared();
    let name = name("sem-sigkill");
    let backend = connect(node.endpoints(), Duration::from_secs(10)).await;
    let ttl = Duration::from_secs(2);
    let mut children = Vec::new();
    let mut tokens = Vec::new();
    use tokio::io::AsyncBufReadExt;
    for _ in 0..2 {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_baton"))
            .args([
                "--endpoints",
                &node.endpoints().join(","),
                "lock",
                "-n",
                "2",
            ])
            .args([&name, "--ttl", "2"])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        within("a child holds", Duration::from_secs(20), lines.next_line())
            .await
            .unwrap();
        tokens.push(
            lines
                .next_line()
                .await
                .unwrap()
                .unwrap()
                .parse::<u64>()
                .unwrap(),
        );
        children.push((child, lines));
    }
    let s = session(&backend, Duration::from_secs(30)).await;
    let waiter = tokio::spawn({
        let semaphore = baton::Semaphore::new(&s, &name, 2).unwrap();
        async move { semaphore.acquire().await }
    });
    eventually("the waiter is queued", || async {
        backend.entries(&name).await.unwrap().len() == 3
    })
    .await;
    let (mut killed, _) = children.remove(0);
    killed.start_kill().unwrap(); // SIGKILL
    killed.wait().await.unwrap();
    let killed_at = Instant::now();
    let permit = within("the permit returns", ttl + Duration::from_secs(3), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(killed_at.elapsed() <= ttl + Duration::from_secs(3));
    let holders = backend.entries(&name).await.unwrap();
    assert_eq!(holders.len(), 2, "more holders than permits: {holders:?}");
    assert!(permit.fencing_token().get() > tokens[1]);
    tokens.push(permit.fencing_token().get());
    support::assert_strictly_increasing(&tokens);
    permit.release().await.unwrap();
    drop(children);
    println!(
        "RELIABILITY|semaphore holder killed with SIGKILL|permit returns within TTL + 3 s; never more holders than permits|1|{}|0|0",
        tokens.len()
    );
}

/// A read-write lock's writer cut off (paused) past its lease: it is told before a reader is
/// granted, the reader sees only what the writer wrote while it held, and the writer's late
/// write is refused by the fence once the next writer has written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwlock_writer_paused_past_its_lease() {
    let node = EtcdNode::shared();
    let proxy = Proxy::start(&node.endpoints()[0]).await;
    let name = name("rw-paused");
    let register = FencedRegister::default();
    let direct = connect(node.endpoints(), Duration::from_secs(10)).await;
    let behind = connect(&[proxy.endpoint()], Duration::from_secs(2)).await;
    let fence = EtcdFence::new(direct.clone(), format!("{name}-fence")).unwrap();

    let ttl = Duration::from_secs(3);
    let paused = session(&behind, ttl).await;
    let writer = baton::RwLock::new(&paused, &name)
        .unwrap()
        .write()
        .await
        .unwrap();
    assert!(register.enter(writer.fencing_token().get()));
    fence.write("data", writer.ticket(), b"v1").await.unwrap();

    let others = session(&direct, Duration::from_secs(30)).await;
    let reader = tokio::spawn({
        let lock = baton::RwLock::new(&others, &name).unwrap();
        async move { lock.read().await }
    });
    eventually("the reader waits", || async {
        direct.entries(&name).await.unwrap().len() == 2
    })
    .await;
    let next_writer = tokio::spawn({
        let lock = baton::RwLock::new(&others, &name).unwrap();
        async move { lock.write().await }
    });
    eventually("the next writer waits", || async {
        direct.entries(&name).await.unwrap().len() == 3
    })
    .await;

    proxy.black_hole();
    let cut_at = Instant::now();
    within("lost() behind the black hole", ttl * 2, writer.lost()).await;
    let lost_at = Instant::now();
    register.exit(writer.fencing_token().get());
    let read = within("the reader", ttl * 3, reader)
        .await
        .unwrap()
        .unwrap();
    assert!(
        lost_at - cut_at <= ttl,
        "lost() fired no later than the server's expiry"
    );
    assert!(read.fencing_token() > writer.fencing_token());
    let seen = fence.read("data").await.unwrap();
    assert_eq!(
        seen,
        Some((writer.fencing_token(), b"v1".to_vec())),
        "the reader sees what the writer wrote while it held"
    );
    read.release().await.unwrap();
    let next = within("the next writer", ttl * 3, next_writer)
        .await
        .unwrap()
        .unwrap();
    assert!(register.enter(next.fencing_token().get()));
    fence.write("data", next.ticket(), b"v2").await.unwrap();
    let late = fence.write("data", writer.ticket(), b"late").await;
    assert!(
        matches!(late, Err(baton::Error::StaleToken { .. })),
        "{late:?}"
    );
    assert!(!register.late_write(writer.fencing_token().get()));
    register.exit(next.fencing_token().get());
    next.release().await.unwrap();
    register.assert_safe(
        "rwlock writer paused past its lease",
        "told before a reader is granted; late write fenced; readers never beside a writer",
        None,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_revoked_from_outside() {
    let node = EtcdNode::shared();
    let name = name("revoke");
    let backend = connect(node.endpoints(), Duration::from_secs(10)).await;
    let register = FencedRegister::default();
    let ttl = Duration::from_secs(6);
    let s = session(&backend, ttl).await;
    let guard = hold(&s, &name, &register).await;
    let mut client = backend.client().clone();
    client.lease_revoke(s.lease_id().get()).await.unwrap();
    let revoked_at = Instant::now();
    within("lost()", ttl / 3 + Duration::from_secs(1), guard.lost()).await;
    assert!(revoked_at.elapsed() <= ttl / 3 + Duration::from_secs(1));
    register.exit(guard.fencing_token().get());
    register.assert_safe(
        "lease revoked from outside",
        "lost() within one keep-alive period",
        None,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_while_waiters_watch() {
    let node = EtcdNode::shared();
    let name = name("compaction");
    let backend = connect(node.endpoints(), Duration::from_secs(10)).await;
    let register = Arc::new(FencedRegister::default());
    let holder = session(&backend, Duration::from_secs(30)).await;
    let guard = hold(&holder, &name, &register).await;
    let (_sessions, mut granted) =
        queue_contenders(&backend, &name, 4, Duration::from_secs(30), &register).await;
    let queue = queued_tokens(&backend, &name).await;
    let filler = format!("{name}-filler");
    support::compact_history(backend.client(), &filler).await;
    release(guard, &register).await;
    for _ in 0..4 {
        support::compact_history(backend.client(), &filler).await;
        drain(&mut granted, 1, Duration::from_secs(20)).await;
    }
    register.assert_safe(
        "compaction while waiters watch",
        "waits survive compaction; FIFO, no overlap",
        Some(&queue),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_keys_under_the_prefix() {
    let node = EtcdNode::shared();
    let name = name("foreign");
    let backend = connect(node.endpoints(), Duration::from_secs(10)).await;
    let mut client = backend.client().clone();
    let lease = client.lease_grant(60, None).await.unwrap().id();
    // Keys baton did not create: a garbage suffix with no lease, bytes that are not UTF-8,
    // a nested key, and a key in the recipe's layout with a lease.
    let mut bad_utf8 = format!("{name}/").into_bytes();
    bad_utf8.extend_from_slice(&[0xff, 0xfe, 0x00, 0x80]);
    let foreign: Vec<Vec<u8>> = vec![
        format!("{name}/zz-garbage").into_bytes(),
        bad_utf8,
        format!("{name}/nested/key").into_bytes(),
        format!("{name}/{lease:x}").into_bytes(),
    ];
    for (i, key) in foreign.iter().enumerate() {
        let options = (i == 3).then(|| baton::etcd_client::PutOptions::new().with_lease(lease));
        client.put(key.clone(), "", options).await.unwrap();
    }
    let register = Arc::new(FencedRegister::default());
    // Each contender, once granted, reads the queue: its own key must be the oldest. (No key
    // older than a contender's can be created after it, so an older key seen after the grant
    // was there at the grant: the grant was early.)
    let (tx, mut granted) = mpsc::unbounded_channel();
    let mut sessions = Vec::new();
    for i in 0..2 {
        let s = session(&backend, Duration::from_secs(30)).await;
        sessions.push(s.clone());
        let (tx, lock_name, register, reader) = (
            tx.clone(),
            name.clone(),
            Arc::clone(&register),
            backend.clone(),
        );
        tokio::spawn(async move {
            let guard = Mutex::new(&s, &lock_name).unwrap().lock().await.unwrap();
            let head = reader.entries(&lock_name).await.unwrap().remove(0);
            let token = guard.fencing_token().get();
            assert!(register.enter(token));
            register.exit(token);
            guard.release().await.unwrap();
            let _ = tx.send((token, head.token().get()));
        });
        eventually("the contender is queued", || async {
            backend
                .entries(&name)
                .await
                .is_ok_and(|e| e.len() == 4 + i + 1)
        })
        .await;
    }
    let entries = backend.entries(&name).await.unwrap();
    assert_eq!(entries.len(), 6);
    let tokens: Vec<u64> = entries.iter().map(|e| e.token().get()).collect();
    support::assert_strictly_increasing(&tokens);
    // Remove the foreign keys newest first: nobody may be granted until the oldest is gone.
    for key in foreign.iter().rev() {
        client.delete(key.clone(), None).await.unwrap();
    }
    for _ in 0..2 {
        let (token, head) = within("a grant", Duration::from_secs(20), granted.recv())
            .await
            .unwrap();
        assert_eq!(
            head, token,
            "granted {token} while an older key ({head}) existed"
        );
    }
    register.assert_safe(
        "foreign keys under the lock prefix",
        "ordering by create revision, no panic",
        Some(&tokens[4..]),
    );
}

/// Fuzz-style: many arbitrary byte strings as keys under a lock prefix, with and without
/// leases. Reading the queue, observing it and contending for the lock never panic, and the
/// queue stays in creation order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbitrary_keys_under_the_prefix_never_panic() {
    let node = EtcdNode::shared();
    let name = name("arbitrary");
    let backend = connect(node.endpoints(), Duration::from_secs(10)).await;
    let mut client = backend.client().clone();
    let lease = client.lease_grant(60, None).await.unwrap().id();
    // A small deterministic generator: the same keys every run, all byte values reachable.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut keys = Vec::new();
    for i in 0..64 {
        let mut key = format!("{name}/").into_bytes();
        for _ in 0..(i % 13) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            key.push((x & 0xff) as u8);
        }
        let options = (i % 2 == 0).then(|| baton::etcd_client::PutOptions::new().with_lease(lease));
        client
            .put(key.clone(), vec![(x >> 8) as u8; i % 5], options)
            .await
            .unwrap();
        keys.push(key);
    }
    let entries = backend.entries(&name).await.unwrap();
    let tokens: Vec<u64> = entries.iter().map(|e| e.token().get()).collect();
    let mut sorted = tokens.clone();
    sorted.sort_unstable();
    assert_eq!(tokens, sorted, "queue order is creation order");
    assert!(backend.head(&name).await.unwrap().is_some());
    let s = session(&backend, Duration::from_secs(30)).await;
    let busy = Mutex::new(&s, &name).unwrap().try_lock().await;
    assert!(matches!(busy, Err(baton::Error::Locked { .. })), "{busy:?}");
    let election = baton::Election::new(&s, &name).unwrap();
    let mut events = election.observe();
    assert!(matches!(
        support::next_event(&mut events).await,
        baton::LeaderEvent::Elected(_)
    ));
    client
        .delete(
            format!("{name}/"),
            Some(baton::etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert_eq!(
        support::next_event(&mut events).await,
        baton::LeaderEvent::Vacant
    );
    let guard = Mutex::new(&s, &name).unwrap().try_lock().await.unwrap();
    guard.release().await.unwrap();
}

/// An observer cut off from etcd resumes from the last revision it saw once it can reach
/// etcd again, and reports every leader change it missed, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observer_resumes_after_a_broken_connection() {
    use baton::{Election, LeaderEvent};
    // No compaction of a test beside this one while the observer is cut off.
    let _history = support::HISTORY.read().await;
    let node = EtcdNode::shared();
    let proxy = Proxy::start(&node.endpoints()[0]).await;
    let name = name("observe-resume");
    let direct = connect(node.endpoints(), Duration::from_secs(10)).await;
    let behind = connect(&[proxy.endpoint()], Duration::from_secs(2)).await;
    let observer_session = session(&direct, Duration::from_secs(60)).await;
    // The observer's stream goes through the proxy; its session does not need to.
    let mut events = Election::new(&Session::new(behind.clone()).await.unwrap(), &name)
        .unwrap()
        .observe();
    drop(observer_session);
    assert_eq!(support::next_event(&mut events).await, LeaderEvent::Vacant);
    let a = session(&direct, Duration::from_secs(60)).await;
    let leader_a = Election::new(&a, &name)
        .unwrap()
        .campaign("a")
        .await
        .unwrap();
    assert!(
        matches!(support::next_event(&mut events).await, LeaderEvent::Elected(l) if l.value() == b"a")
    );

    proxy.black_hole();
    leader_a.release().await.unwrap();
    let b = session(&direct, Duration::from_secs(60)).await;
    let leader_b = Election::new(&b, &name)
        .unwrap()
        .campaign("b")
        .await
        .unwrap();
    proxy.heal();

    // HTTP/2 keep-alive notices the dead connection; the observer reconnects and resumes.
    let vacant = within(
        "the missed vacancy",
        Duration::from_secs(30),
        support::next_event(&mut events),
    )
    .await;
    assert_eq!(vacant, LeaderEvent::Vacant);
    let next = within(
        "the missed leader",
        Duration::from_secs(30),
        support::next_event(&mut events),
    )
    .await;
    assert!(
        matches!(&next, LeaderEvent::Elected(l) if l.value() == b"b"),
        "{next:?}"
    );
    leader_b.release().await.unwrap();
}

/// An observer cut off while leaders change and the history is compacted cannot be told what
/// it missed: it says so (`Skipped`), then reports the current leader. Before, it reported the
/// new leader as if nothing had been missed (a proclamation, a vacancy and a leader lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observer_cut_off_across_a_compaction_reports_the_gap() {
    use baton::{Election, LeaderEvent};
    let node = EtcdNode::shared();
    let proxy = Proxy::start(&node.endpoints()[0]).await;
    let name = name("observe-gap");
    let direct = connect(node.endpoints(), Duration::from_secs(10)).await;
    let behind = connect(&[proxy.endpoint()], Duration::from_secs(2)).await;
    let observer_session = session(&behind, Duration::from_secs(60)).await;
    // The observer's stream goes through the proxy.
    let mut events_behind = Election::new(&observer_session, &name).unwrap().observe();
    assert_eq!(
        support::next_event(&mut events_behind).await,
        LeaderEvent::Vacant
    );
    let a = session(&direct, Duration::from_secs(60)).await;
    let mut leader_a = Election::new(&a, &name)
        .unwrap()
        .campaign("a")
        .await
        .unwrap();
    assert!(
        matches!(support::next_event(&mut events_behind).await, LeaderEvent::Elected(l) if l.value() == b"a")
    );

    proxy.black_hole();
    leader_a.proclaim("a2").await.unwrap();
    leader_a.release().await.unwrap();
    let b = session(&direct, Duration::from_secs(60)).await;
    let mut leader_b = Election::new(&b, &name)
        .unwrap()
        .campaign("b")
        .await
        .unwrap();
    leader_b.proclaim("b2").await.unwrap();
    support::compact_history(direct.client(), &format!("{name}-filler")).await;
    proxy.heal();

    let gap = within(
        "the gap reported",
        Duration::from_secs(30),
        support::next_event(&mut events_behind),
    )
    .await;
    assert_eq!(gap, LeaderEvent::Skipped);
    let now = within(
        "the current leader",
        Duration::from_secs(30),
        support::next_event(&mut events_behind),
    )
    .await;
    assert!(
        matches!(&now, LeaderEvent::Elected(l) if l.value() == b"b2"),
        "{now:?}"
    );
    leader_b.release().await.unwrap();
}

/// A release etcd applied but whose answer was lost is not reported as "the lock had already
/// been lost": the retry finds the key gone, but cannot tell whether its own first attempt
/// deleted it, so the answer is `OutcomeUnknown`. (Before: `NotOwner`, a definite refusal.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_answer_is_lost_is_unknown_not_refused() {
    let node = EtcdNode::shared();
    let proxy = Proxy::start(&node.endpoints()[0]).await;
    let name = name("lost-answer-release");
    let direct = connect(node.endpoints(), Duration::from_secs(10)).await;
    let options = EtcdOptions::new()
        .with_request_timeout(Duration::from_secs(1))
        .with_retry_for(Duration::from_secs(10));
    let behind = EtcdBackend::connect(&[proxy.endpoint()], options)
        .await
        .unwrap();
    let s = session(&behind, Duration::from_secs(30)).await;
    let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    proxy.drop_answers();
    let unlock = tokio::spawn(guard.release());
    // The delete reaches etcd and is applied; its answer is dropped. Once it is applied, the
    // connection is closed (heal), and the client retries on a new one.
    eventually("the delete applied", || async {
        direct.entries(&name).await.unwrap().is_empty()
    })
    .await;
    proxy.heal();
    let unlocked = within("the unlock", Duration::from_secs(20), unlock)
        .await
        .unwrap();
    assert!(
        matches!(unlocked, Err(baton::Error::OutcomeUnknown { .. })),
        "{unlocked:?}"
    );
    s.close().await.unwrap();
}

// ---- Redis -------------------------------------------------------------------------------

/// A Redis backend on `node` with the given restart grace.
async fn redis_backend(url: &str, grace: Duration) -> RedisBackend {
    RedisBackend::connect(url, RedisOptions::new().with_restart_grace(grace))
        .await
        .unwrap()
}

/// Redis restarted without persistence while a lock is held and another client waits: the
/// queue is gone. A new contender that starts at once is held off by the restart grace until
/// the old holder has been told (at its next renewal), so the two never overlap; its token is
/// still larger than every token from before the restart, and the old holder's late write is
/// fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_without_persistence_mid_queue() {
    let node = RedisNode::start().await.unwrap();
    let ttl = Duration::from_secs(2);
    let name = name("redis-restart");
    let register = Arc::new(FencedRegister::default());
    let fence = MemoryFence::new();
    let backend = redis_backend(&node.url(), ttl).await;
    let holder = session(&backend, ttl).await;
    let guard = hold(&holder, &name, &register).await;
    fence
        .write("data", guard.ticket(), b"before")
        .await
        .unwrap();
    let waiting = session(&backend, ttl).await;
    let waiter = support::spawn_queued(&backend, &waiting, &name, 2).await;
    let told = tokio::spawn({
        let lost = guard.lost();
        let register = Arc::clone(&register);
        let token = guard.fencing_token().get();
        async move {
            let reason = lost.await;
            register.exit(token);
            (reason, Instant::now())
        }
    });

    node.restart().await.unwrap();
    let restarted = Instant::now();
    // A new client contends at once, as a restarted service would.
    let newcomer = tokio::spawn({
        let backend = backend.clone();
        let name = name.clone();
        async move {
            let s = Session::new(backend).await?;
            let guard = Mutex::new(&s, &name)?.lock().await?;
            Ok::<_, baton::Error>((s, guard, Instant::now()))
        }
    });
    let (reason, told_at) = within("the holder is told", ttl * 3, told).await.unwrap();
    support::assert_lost(&within("the waiter is told", ttl * 3, waiter).await.unwrap());
    let (_s, next, granted_at) = within("the newcomer", ttl * 5, newcomer)
        .await
        .unwrap()
        .unwrap();
    assert!(
        told_at <= granted_at,
        "told ({reason:?}) after the new grant"
    );
    assert!(register.enter(next.fencing_token().get()));
    assert!(
        next.fencing_token() > guard.fencing_token(),
        "tokens go on increasing: {} after {}",
        next.fencing_token(),
        guard.fencing_token()
    );
    fence.write("data", next.ticket(), b"after").await.unwrap();
    let late = fence.write("data", guard.ticket(), b"late").await;
    assert!(
        matches!(late, Err(baton::Error::StaleToken { .. })),
        "{late:?}"
    );
    assert!(!register.late_write(guard.fencing_token().get()));
    println!(
        "redis restart: holder told after {:?} ({reason:?}), newcomer granted after {:?}",
        told_at - restarted,
        granted_at - restarted
    );
    register.exit(next.fencing_token().get());
    next.release().await.unwrap();
    register.assert_safe(
        "Redis restarted without persistence mid-queue",
        "no overlap (restart grace); tokens still increase; late write fenced",
        None,
    );
}

/// A holder cut off from Redis by a proxy: it is told before the server expires its lease
/// (so before any successor is granted), and its late write is fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_client_cut_off_by_a_proxy() {
    let url = RedisNode::shared().url();
    let proxy = Proxy::start(url.trim_start_matches("redis://")).await;
    let behind = RedisBackend::connect(
        &proxy.endpoint().replace("http://", "redis://"),
        RedisOptions::new()
            .with_restart_grace(Duration::ZERO)
            .with_request_timeout(Duration::from_millis(500))
            .with_retry_for(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let direct = redis_backend(&url, Duration::ZERO).await;
    cut_off_holder_is_told(
        &proxy,
        &behind,
        &direct,
        &MemoryFence::new(),
        &name("redis-proxy"),
        "Redis: client cut off by a proxy",
        "lost() before the server's expiry; successor holds; late write fenced",
    )
    .await;
}

/// `baton lock` on Redis killed with SIGKILL: its entry goes with its lease, and the
/// successor holds within TTL + 3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_holder_process_killed() {
    let url = RedisNode::shared().url();
    let backend = redis_backend(&url, Duration::ZERO).await;
    killed_holder_is_followed(
        &["--endpoints", &url, "--restart-grace", "0"],
        &backend,
        "Redis: holder killed with SIGKILL",
    )
    .await;
}

/// The deadline `node` holds for `lease` (server clock, ms; 0 if it has none).
async fn lease_deadline(node: &RedisNode, lease: &str) -> f64 {
    let deadline: Option<f64> = node
        .command("ZSCORE", &["baton:leases", lease])
        .await
        .unwrap();
    deadline.unwrap_or(0.0)
}

/// A replica that missed the holder's last renewals is promoted: it sees the holder's lease
/// expire earlier than the holder does. The first script on it finds another server under
/// the state (its run_id) and starts a new epoch, so the newcomer waits out the restart grace
/// (the TTL) and is granted only after the old holder was told; its token is larger, and the
/// fence refuses the old holder's late write. (Before epochs, the two overlapped by up to a
/// TTL: 1.0 s and 2.9 s measured.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_replica_promoted_after_missing_writes() {
    let primary = RedisNode::start().await.unwrap();
    let replica = primary.start_replica().await.unwrap();
    let ttl = Duration::from_secs(3);
    let name = name("redis-failover");
    let register = Arc::new(FencedRegister::default());
    let fence = MemoryFence::new();
    let on_primary = redis_backend(&primary.url(), Duration::ZERO).await;
    let holder = session(&on_primary, ttl).await;
    let guard = hold(&holder, &name, &register).await;
    fence
        .write("data", guard.ticket(), b"before")
        .await
        .unwrap();
    let _: i64 = primary.command("WAIT", &["1", "2000"]).await.unwrap();
    let told = tokio::spawn({
        let lost = guard.lost();
        let register = Arc::clone(&register);
        let token = guard.fencing_token().get();
        async move {
            lost.await;
            register.exit(token);
            Instant::now()
        }
    });

    // The replica stops receiving writes (a partition between the two servers)...
    replica.detach().await.unwrap();
    // ...while the holder goes on renewing on the primary.
    let lease = holder.lease_id().get().to_string();
    eventually("a renewal the replica missed", || async {
        lease_deadline(&primary, &lease).await > lease_deadline(&replica, &lease).await
    })
    .await;
    // The primary dies; the replica is promoted; clients move to it.
    primary.stop().await.unwrap();
    replica.promote().await.unwrap();
    let promoted_at = Instant::now();
    let on_replica = redis_backend(&replica.url(), ttl).await;
    let newcomer = session(&on_replica, ttl).await;
    let next = within(
        "the new holder",
        ttl * 3,
        Mutex::new(&newcomer, &name).unwrap().lock(),
    )
    .await
    .unwrap();
    let granted_at = Instant::now();
    // The checker counts an overlap if the old holder still believes it holds.
    assert!(register.enter(next.fencing_token().get()));
    fence.write("data", next.ticket(), b"after").await.unwrap();
    let told_at = within("the old holder is told", ttl * 2, told)
        .await
        .unwrap();
    let late = fence.write("data", guard.ticket(), b"late").await;
    assert!(
        matches!(late, Err(baton::Error::StaleToken { .. })),
        "{late:?}"
    );
    assert!(!register.late_write(guard.fencing_token().get()));
    assert!(next.fencing_token() > guard.fencing_token());
    assert!(
        told_at <= granted_at,
        "the old holder was told {:?} after the new grant",
        told_at - granted_at
    );
    println!(
        "redis failover: new holder granted {:?} after the promotion, {:?} after the old holder was told",
        granted_at - promoted_at,
        granted_at - told_at
    );
    register.exit(next.fencing_token().get());
    next.release().await.unwrap();
    let s = register.snapshot();
    support::assert_strictly_increasing(&s.accepted);
    assert_eq!(s.overlaps, 0, "two holders at once");
    println!(
        "RELIABILITY|Redis replica promoted after missing writes|no overlap (new epoch, restart grace; old holder told {} ms before the grant); tokens still increase; late write fenced|1|{}|{}|{}",
        (granted_at - told_at).as_millis(),
        s.accepted.len(),
        s.rejected,
        s.overlaps
    );
}

// ---- ZooKeeper ---------------------------------------------------------------------------

/// A ZooKeeper backend on `connect` whose requests are retried for `retry_for`.
async fn zk_connect(connect: &str, retry_for: Duration) -> ZkBackend {
    let options = ZkOptions::new()
        .with_request_timeout(Duration::from_secs(2))
        .with_retry_for(retry_for);
    ZkBackend::connect(connect, options).await.unwrap()
}

/// A ZooKeeper backend through `proxy`, quick to give up (the proxy will cut it off).
async fn zk_behind(proxy: &Proxy) -> ZkBackend {
    let options = ZkOptions::new()
        .with_request_timeout(Duration::from_millis(500))
        .with_retry_for(Duration::from_secs(1));
    ZkBackend::connect(&proxy.endpoint().replace("http://", "zk://"), options)
        .await
        .unwrap()
}

/// Releases while a member is down or paused: the delete may time out on the member and be
/// retried elsewhere, and a retry that finds the entry gone cannot tell whether the first
/// attempt deleted it, so `OutcomeUnknown` is a truthful answer (baton then finishes the
/// release in the background). Anything else fails the test; so does a holder whose session
/// was lost meanwhile (its entry gone for that reason, not because of the release). Returns
/// whether the outcome was unknown.
async fn zk_release_during_fault(
    guard: MutexGuard,
    holder: &Session,
    register: &FencedRegister,
) -> bool {
    register.exit(guard.fencing_token().get());
    let released = guard.release().await;
    assert!(!holder.is_lost(), "the holder's session was lost");
    match released {
        Ok(()) => false,
        Err(baton::Error::OutcomeUnknown { .. }) => true,
        Err(e) => panic!("release during the fault: {e:?}"),
    }
}

/// How many client sessions `member` serves (`mntr`'s live connections, less the one asking).
async fn zk_clients(member: &ZkNode) -> usize {
    let mntr = member.four_letter("mntr").await.unwrap();
    mntr.lines()
        .find_map(|l| l.strip_prefix("zk_num_alive_connections\t"))
        .and_then(|n| n.trim().parse::<usize>().ok())
        .map_or(0, |n| n.saturating_sub(1))
}

/// A three-member ensemble, a client on all its members (retrying for 3/4 of `ttl`: an
/// election and the reconnection of clients whose member is gone take up to about 10 s),
/// the safety checker, and a holder session with `ttl`.
async fn zk_ensemble_scenario(
    ttl: Duration,
) -> (ZkEnsemble, ZkBackend, Arc<FencedRegister>, Session) {
    let zk = ZkEnsemble::start().await.expect("a three-member ensemble");
    let backend = zk_connect(&zk.connect_string(), ttl * 3 / 4).await;
    let holder = session(&backend, ttl).await;
    (zk, backend, Arc::default(), holder)
}

/// The leader of a three-member ensemble is killed while eight contenders queue behind a
/// holder; four are granted without it, then it comes back and the other four are. The
/// queue drains in FIFO order without overlap, no session is lost (each reconnects to
/// another member well within its timeout), and a lock taken afterwards, in the new epoch,
/// gets a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_leader_stopped_mid_queue_then_restarted() {
    let _one_at_a_time = CLUSTER.lock().await;
    let ttl = Duration::from_secs(20);
    let (zk, backend, register, holder) = zk_ensemble_scenario(ttl).await;
    let name = "zk-stop-leader";
    let guard = hold(&holder, name, &register).await;
    let (sessions, mut granted) = queue_contenders(&backend, name, 8, ttl, &register).await;
    let mut queue = queued_tokens(&backend, name).await;

    let old_leader = zk.wait_for_leader().await.unwrap();
    let on_leader = zk_clients(zk.member(old_leader)).await;
    zk.stop_member(old_leader).await.unwrap();
    let stopped_at = Instant::now();
    let unknown = zk_release_during_fault(guard, &holder, &register).await;
    drain(&mut granted, 4, Duration::from_secs(30)).await;
    let four_granted = stopped_at.elapsed();
    let new_leader = zk.wait_for_leader().await.unwrap();
    assert_ne!(new_leader, old_leader);
    zk.start_member(old_leader).await.unwrap();
    drain(&mut granted, 4, Duration::from_secs(30)).await;
    assert!(
        !holder.is_lost() && sessions.iter().all(|s| !s.is_lost()),
        "a session was lost to the leader change"
    );
    // A lock taken in the new epoch: its czxid, and so its token, is higher still.
    let after = hold(&holder, name, &register).await;
    queue.push(after.fencing_token().get());
    release(after, &register).await;
    println!(
        "zk leader stopped: {on_leader} of 10 client sessions were on it; four grants {four_granted:?} after it was killed (member {old_leader} -> {new_leader}); release outcome unknown: {unknown}"
    );
    register.assert_safe(
        "ZooKeeper: leader stopped mid-queue, restarted",
        "queue drains in FIFO order, no overlap, tokens increase across the new epoch",
        Some(&queue),
    );
}

/// A follower is paused (clients on it move to another member once their connection
/// times out) while three contenders drain a queue; then the leader is paused while three
/// more do (the other two elect a new leader). Grants go on with a quorum, without overlap,
/// and the holder takes the lock again once the old leader is back.
///
/// A client notices a frozen member after its connection's idle limit, and zookeeper-client,
/// which reshuffles its members after each connection, may try the frozen one again first.
/// With the client's default limit (2/5 of the session timeout) a lease's connection stalled
/// about 17 s of a 20 s TTL (measured); the backend sets the limit to 1/5 of the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_follower_then_leader_paused() {
    let _one_at_a_time = CLUSTER.lock().await;
    let ttl = Duration::from_secs(20);
    let (zk, backend, register, holder) = zk_ensemble_scenario(ttl).await;
    let name = "zk-pause";

    let first_leader = zk.wait_for_leader().await.unwrap();
    let follower = (first_leader + 1) % 3;
    let guard = hold(&holder, name, &register).await;
    let (_s1, mut granted) = queue_contenders(&backend, name, 3, ttl, &register).await;
    let on_follower = zk_clients(zk.member(follower)).await;
    zk.pause_member(follower).await.unwrap();
    let paused_at = Instant::now();
    let unknown_follower = zk_release_during_fault(guard, &holder, &register).await;
    drain(&mut granted, 3, Duration::from_secs(30)).await;
    let follower_drained = paused_at.elapsed();
    zk.unpause_member(follower).await.unwrap();

    let guard = hold(&holder, name, &register).await;
    let (_s2, mut granted) = queue_contenders(&backend, name, 3, ttl, &register).await;
    let paused_leader = zk.wait_for_leader().await.unwrap();
    let on_leader = zk_clients(zk.member(paused_leader)).await;
    zk.pause_member(paused_leader).await.unwrap();
    let paused_at = Instant::now();
    let unknown_leader = zk_release_during_fault(guard, &holder, &register).await;
    drain(&mut granted, 3, Duration::from_secs(40)).await;
    let leader_drained = paused_at.elapsed();
    zk.unpause_member(paused_leader).await.unwrap();
    let guard = within(
        "a lock after unpausing",
        Duration::from_secs(30),
        hold(&holder, name, &register),
    )
    .await;
    release(guard, &register).await;
    println!(
        "zk pauses: queue of 3 drained {follower_drained:?} after a follower was paused ({on_follower} client sessions on it), {leader_drained:?} after the leader was ({on_leader} on it); release outcome unknown: {unknown_follower}, {unknown_leader}"
    );
    register.assert_safe(
        "ZooKeeper: a follower, then the leader paused",
        "grants continue with a quorum, no overlap",
        None,
    );
}

/// Is the ZooKeeper session `lease` connected to `member`? (`cons` lists each connection's
/// `sid=0x...`.)
async fn zk_session_on(member: &ZkNode, lease: baton::LeaseId) -> bool {
    let cons = member.four_letter("cons").await.unwrap();
    cons.contains(&format!("sid=0x{:x},", lease.get()))
}

/// A create that reaches the ensemble after its client gave up on it and took the lock
/// through another member lands nowhere. A follower cut off from its client (here a proxy
/// holds back what the client sends; a frozen follower does the same) meets, once it
/// resumes, the create and then the client's attempt to reconnect to it: the stale
/// reconnection moves the session back to that follower while the create is on its way to
/// the leader, so the create passes the session-moved check (ZOOKEEPER-2886). A node left in
/// the queue would hold the lock for nobody while the session lives, and the session's next
/// `lock()` would adopt it with a token lower than grants made since. The client tries the
/// follower again on about half its reconnections, so the scenario runs until one did, a
/// bounded number of rounds. (Before: the node stayed, and the next waiter waited for it; the
/// nemesis found the lower token, with a paused follower.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_a_create_delivered_late_lands_nowhere() {
    const ROUNDS: usize = 16;
    let _one_at_a_time = CLUSTER.lock().await;
    let ttl = Duration::from_secs(5);
    let zk = ZkEnsemble::start().await.expect("a three-member ensemble");
    let leader = zk.wait_for_leader().await.unwrap();
    let follower = (leader + 1) % 3;
    let proxy = Proxy::start(&zk.member_connect_string(follower)).await;
    // The client knows the follower, behind the proxy, and the leader.
    let two = format!("{},{}", proxy.addr(), zk.member_connect_string(leader));
    let backend = zk_connect(&two, Duration::from_secs(10)).await;
    let direct = zk_connect(&zk.member_connect_string(follower), Duration::from_secs(10)).await;
    let other = session(&direct, ttl).await;
    let name = name("zk-late-create");
    let mut tokens = vec![];
    let mut exercised = 0;
    for _ in 0..ROUNDS {
        // A session whose connection is on the follower.
        let a = loop {
            let s = session(&backend, ttl).await;
            if zk_session_on(zk.member(follower), s.lease_id()).await {
                break s;
            }
        };
        proxy.hold_requests();
        let mutex = Mutex::new(&a, &name).unwrap();
        let first = within("a lock", Duration::from_secs(20), mutex.lock())
            .await
            .unwrap();
        tokens.push(first.fencing_token().get());
        first.release().await.unwrap();
        proxy.heal();
        // The create, then the attempt to reconnect through the proxy, if the client made one.
        let delivered = proxy.deliver_held_together().await.unwrap();
        // A lock through the follower: its requests reach the leader after the late ones.
        tokens.push(support::late_request_left_nothing(&direct, &name, &a, &other).await);
        let third = within(
            "the session's next lock",
            Duration::from_secs(20),
            mutex.lock(),
        )
        .await
        .unwrap();
        tokens.push(third.fencing_token().get());
        third.release().await.unwrap();
        if delivered >= 2 {
            exercised += 1;
            if exercised == 4 {
                break;
            }
        }
    }
    assert!(exercised > 0, "the client never tried the follower again");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens out of grant order: {tokens:?}"
    );
}

/// A holder cut off from ZooKeeper by a proxy is told (`lost()`) before the server expires
/// its session, so before its successor is granted; its late write is fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_client_cut_off_by_a_proxy() {
    let _one_at_a_time = CLUSTER.lock().await;
    let node = ZkNode::shared();
    let proxy = Proxy::start(&node.connect_string()).await;
    let behind = zk_behind(&proxy).await;
    let direct = zk_connect(&node.connect_string(), Duration::from_secs(10)).await;
    let times = cut_off_holder_is_told(
        &proxy,
        &behind,
        &direct,
        &MemoryFence::new(),
        &name("zk-proxy"),
        "ZooKeeper: client cut off by a proxy",
        "lost() before the server expires the session; successor holds; late write fenced",
    )
    .await;
    assert!(
        times.lost <= times.expired,
        "the server expired the session before the holder was told: {times:?}"
    );
    proxy.heal();
}

/// `baton lock` on ZooKeeper killed with SIGKILL: its node goes when the server expires its
/// session, and the successor holds within TTL + 3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_holder_process_killed() {
    let _one_at_a_time = CLUSTER.lock().await;
    let node = ZkNode::shared();
    let backend = zk_connect(&node.connect_string(), Duration::from_secs(10)).await;
    killed_holder_is_followed(
        &["--endpoints", &node.url()],
        &backend,
        "ZooKeeper: holder killed with SIGKILL",
    )
    .await;
}

/// A waiter cut off (by a proxy) past its session timeout: meanwhile the holder releases, so
/// that on the server the waiter's node, its session not yet expired, is at the head. The
/// waiter's `lock()` ends with an error, never the lock; the server expires the session and
/// its node goes; once the connection heals, the client is told the session is gone and the
/// session takes nothing more. The contender behind it is granted only after the waiter was
/// told, with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_session_expired_while_waiting() {
    let _one_at_a_time = CLUSTER.lock().await;
    let node = ZkNode::shared();
    let proxy = Proxy::start(&node.connect_string()).await;
    let name = name("zk-expired-waiter");
    let register = Arc::new(FencedRegister::default());
    let direct = zk_connect(&node.connect_string(), Duration::from_secs(10)).await;
    let behind = zk_behind(&proxy).await;
    let holder = session(&direct, Duration::from_secs(30)).await;
    let guard = hold(&holder, &name, &register).await;

    let ttl = Duration::from_secs(3);
    let cut_off = session(&behind, ttl).await;
    let waiter = support::spawn_queued(&direct, &cut_off, &name, 2).await;
    // The instant the waiter's lock() ends, taken where it happens.
    let waiter = tokio::spawn(async move { (waiter.await.unwrap(), Instant::now()) });
    let waiting_entry = direct.entries(&name).await.unwrap().remove(1);
    let next_session = session(&direct, Duration::from_secs(30)).await;
    let next = support::spawn_queued(&direct, &next_session, &name, 3).await;
    let next = tokio::spawn(async move { (next.await.unwrap(), Instant::now()) });
    let expired = tokio::spawn({
        let (direct, entry) = (direct.clone(), waiting_entry.clone());
        async move { direct.wait_gone(&entry).await.map(|()| Instant::now()) }
    });

    proxy.black_hole();
    let cut_at = Instant::now();
    // The waiter's node is now the head, on the server, while its session lives there.
    release(guard, &register).await;
    let expired_at = within("the server's expiry", ttl * 3, expired)
        .await
        .unwrap()
        .unwrap();
    proxy.heal();
    let (result, told_at) = within("the waiter's answer", ttl * 3, waiter)
        .await
        .unwrap();
    support::assert_lost(&result.map(|g| g.key().to_owned()));
    assert!(cut_off.is_lost(), "the waiter's session is lost");
    let (next, granted_at) = within("the next contender", ttl * 3, next).await.unwrap();
    let next = next.unwrap();
    assert!(
        told_at <= granted_at,
        "the waiter was told after its successor was granted"
    );
    assert!(register.enter(next.fencing_token().get()));
    assert!(
        next.fencing_token().get() > waiting_entry.token().get(),
        "tokens go on increasing"
    );
    let left: Vec<String> = direct
        .entries(&name)
        .await
        .unwrap()
        .iter()
        .map(|e| e.key().to_owned())
        .collect();
    assert_eq!(
        left,
        [next.key().to_owned()],
        "the expired waiter's node is gone"
    );
    // The dead session takes nothing more, even with the connection back.
    let again = Mutex::new(&cut_off, &name).unwrap().try_lock().await;
    assert!(again.is_err(), "a lost session took the lock again");
    println!(
        "zk expired waiter: after the cut, lock() failed {:?}, the server's expiry seen {:?}, the next contender granted {:?}",
        told_at.saturating_duration_since(cut_at),
        expired_at - cut_at,
        granted_at - cut_at
    );
    register.exit(next.fencing_token().get());
    next.release().await.unwrap();
    register.assert_safe(
        "ZooKeeper: session expired while waiting",
        "the waiter gets an error, never the lock; its node goes; the next contender is granted after it is told",
        None,
    );
}

/// An enqueue that reaches etcd after its client gave up on it, retried on a new connection
/// and released, lands nowhere: a key left in the queue would hold the lock for nobody while
/// the lease lives, and the session's next `lock()` would adopt it (the key is the same)
/// with a token lower than grants made since. The proxy holds back what the client sends,
/// closes the client's side (the client reconnects and retries), and delivers the held
/// request on its old connection after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_an_enqueue_delivered_late_lands_nowhere() {
    let node = EtcdNode::shared();
    let proxy = Proxy::start(&node.endpoints()[0]).await;
    let behind = connect(&[proxy.endpoint()], Duration::from_secs(10)).await;
    let direct = connect(node.endpoints(), Duration::from_secs(10)).await;
    let a = session(&behind, Duration::from_secs(10)).await;
    let b = session(&direct, Duration::from_secs(10)).await;
    let mut tokens = vec![];
    for round in 0..3 {
        // A name per round: what the proxy held in earlier rounds names the earlier ones.
        let name = name(&format!("etcd-late-enqueue-{round}"));
        let (t1, t2, delivered) =
            support::retried_enqueue_delivered_late(&proxy, &direct, &a, &b, &name).await;
        assert_eq!(delivered, 1);
        tokens.extend([t1, t2]);
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens out of grant order: {tokens:?}"
    );
}

/// An enqueue a `lock()` gave up on (etcd out of reach past `retry_for`) reaches etcd after
/// the lock was taken again and released, and lands nowhere: the cleanup of the failed
/// `lock()` moved the lease's fence before it looked for the entry. (Before: the late
/// enqueue put the key back, ahead of the next waiter.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_an_abandoned_enqueue_delivered_late_lands_nowhere() {
    let node = EtcdNode::shared();
    let proxy = Proxy::start(&node.endpoints()[0]).await;
    let options = EtcdOptions::new()
        .with_request_timeout(Duration::from_millis(300))
        .with_retry_for(Duration::from_secs(1));
    let behind = EtcdBackend::connect(&[proxy.endpoint()], options)
        .await
        .unwrap();
    let direct = connect(node.endpoints(), Duration::from_secs(10)).await;
    let name = name("etcd-abandoned-enqueue");
    let a = session(&behind, Duration::from_secs(20)).await;
    let b = session(&direct, Duration::from_secs(20)).await;
    support::abandoned_enqueue_delivered_late(&proxy, &direct, &a, &b, &name).await;
}
