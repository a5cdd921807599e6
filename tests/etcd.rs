//! The conformance suite and etcd-specific tests against a real etcd, started through
//! testcontainers (see `baton::testing`). One node is shared by the tests of this binary;
//! each test uses its own key prefix.

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use baton::testing::{Call, EtcdNode, Fault, FaultyBackend};
use baton::{Backend, Error, EtcdBackend, EtcdLayout, EtcdOptions, Mutex, Session, SessionOptions};
use futures::StreamExt;
use support::{Rig, eventually, within};

async fn backend() -> EtcdBackend {
    EtcdNode::shared()
        .backend()
        .await
        .expect("connect to the shared etcd")
}

async fn rig(test: &str) -> Rig {
    Rig {
        backend: Arc::new(backend().await),
        // A second connection: "someone else" really is another client.
        outside: Arc::new(backend().await),
        prefix: format!("etcd-{}/{test}", std::process::id()),
    }
}

conformance!(super::rig; flavor = "multi_thread", worker_threads = 2);

/// The suite again with every wake taking the linearizable read (as when a replica lags):
/// `was_head` fails, which the engine takes for "not known".
async fn rig_without_shortcut(test: &str) -> Rig {
    let faulty = FaultyBackend::wrap(Arc::new(backend().await));
    faulty.inject_every(Call::WasHead, Fault::FailBefore);
    Rig {
        backend: faulty,
        outside: Arc::new(self::backend().await),
        prefix: format!("etcd-{}/slow-{test}", std::process::id()),
    }
}

conformance!(mod without_shortcut; super::rig_without_shortcut; flavor = "multi_thread", worker_threads = 2);

/// `was_head` (a serializable read) answers `true` only for an entry that is present with
/// nothing older: never for a waiter behind another entry, a foreign key, or a gone entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn was_head_is_true_only_for_a_present_head() {
    let backend = backend().await;
    let queue = test_name("was-head");
    let (a, b) = (
        Session::new(backend.clone()).await.unwrap(),
        Session::new(backend.clone()).await.unwrap(),
    );
    let first = backend
        .enqueue(&queue, &a.lease_id().to_hex(), a.lease_id(), b"")
        .await
        .unwrap()
        .into_parts()
        .0;
    let second = backend
        .enqueue(&queue, &b.lease_id().to_hex(), b.lease_id(), b"")
        .await
        .unwrap()
        .into_parts()
        .0;
    assert!(backend.was_head(&first).await.unwrap());
    assert!(
        !backend.was_head(&second).await.unwrap(),
        "an older entry exists"
    );
    assert!(backend.delete_entry(&first).await.unwrap());
    assert!(backend.was_head(&second).await.unwrap());
    assert!(
        !backend.was_head(&first).await.unwrap(),
        "a gone entry is never head"
    );

    // A key written by another client under the prefix, older than ours, counts.
    let mut raw = backend.client().clone();
    raw.put(format!("{queue}/zz-foreign"), "x", None)
        .await
        .unwrap();
    let third = backend
        .enqueue(&queue, &a.lease_id().to_hex(), a.lease_id(), b"")
        .await
        .unwrap()
        .into_parts()
        .0;
    assert!(backend.delete_entry(&second).await.unwrap());
    assert!(
        !backend.was_head(&third).await.unwrap(),
        "the foreign key is older"
    );
    raw.delete(format!("{queue}/zz-foreign"), None)
        .await
        .unwrap();
    assert!(backend.was_head(&third).await.unwrap());
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// The shared watch tells incarnations of one key apart by the revision of each deletion
/// (it asks for no previous values): a wait on the next incarnation of a key, served by the
/// watch kept from the last one, ends when that incarnation is deleted, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_watch_tells_incarnations_apart() {
    let backend = backend().await;
    let queue = test_name("incarnations");
    let s = Session::new(backend.clone()).await.unwrap();
    let tag = s.lease_id().to_hex();
    let enqueue = || backend.enqueue(&queue, &tag, s.lease_id(), b"");
    let first = enqueue().await.unwrap().into_parts().0;
    let gone = backend.wait_gone(&first);
    let mut gone = std::pin::pin!(gone);
    assert!(futures::poll!(&mut gone).is_pending());
    assert!(backend.delete_entry(&first).await.unwrap());
    within("first deleted", Duration::from_secs(10), gone)
        .await
        .unwrap();

    let second = enqueue().await.unwrap().into_parts().0;
    let waiting = backend.wait_gone(&second);
    let mut waiting = std::pin::pin!(waiting);
    assert!(futures::poll!(&mut waiting).is_pending());
    // The watch task serves registrations in order: once a later wait (on the incarnation
    // it saw deleted) has ended, the wait on the second one has been registered.
    within(
        "a deleted incarnation",
        Duration::from_secs(10),
        backend.wait_gone(&first),
    )
    .await
    .unwrap();
    assert!(
        futures::poll!(&mut waiting).is_pending(),
        "woken by the deletion of an earlier incarnation"
    );
    assert!(backend.delete_entry(&second).await.unwrap());
    within("second deleted", Duration::from_secs(10), waiting)
        .await
        .unwrap();
    s.close().await.unwrap();
}

fn test_name(test: &str) -> String {
    format!("etcd-{}/{test}", std::process::id())
}

#[tokio::test]
async fn connect_rejects_bad_input_and_dead_endpoints() {
    let empty: [&str; 0] = [];
    let err = EtcdBackend::connect(&empty, EtcdOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");

    // A port nobody listens on (bound and closed again), on loopback only.
    let port = support::refused_port();
    let started = std::time::Instant::now();
    let err = EtcdBackend::connect(
        &[format!("http://127.0.0.1:{port}")],
        EtcdOptions::new().with_connect_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the cause is kept"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "gave up within the connect timeout"
    );
}

/// `endpoints` and, last, a member that never answers: a listener that never accepts (its
/// kernel completes the TCP handshake, as a frozen process's does). It answers nothing for as
/// long as the listener lives.
fn beside_a_frozen_member(endpoints: &[String]) -> (std::net::TcpListener, Vec<String>) {
    let frozen = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut endpoints = endpoints.to_vec();
    endpoints.push(format!("http://{}", frozen.local_addr().unwrap()));
    (frozen, endpoints)
}

/// A member that accepts connections but never answers (a frozen process: its kernel still
/// completes the TCP handshake) costs one request timeout, not one in every few requests:
/// after a request to it timed out, requests go to the other members. Here the frozen
/// member is a listener that never accepts, beside the real etcd: five connects succeed
/// within a connect timeout shorter than the wait for it, and of 20 renewals one after the
/// other, at most one waits for it, and every one succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_never_answers_is_avoided_after_one_timeout() {
    support::capture_logs();
    let (frozen, endpoints) = beside_a_frozen_member(EtcdNode::shared().endpoints());
    let options = EtcdOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_millis(500))
        .with_retry_for(Duration::from_secs(5));
    // The connect asks a member for an answer twice (a probe, the version): were either sent
    // to the frozen member alone, it would wait for it past the connect timeout.
    let mut connected = Vec::new();
    for _ in 0..5 {
        connected.push(EtcdBackend::connect(&endpoints, options.clone()).await);
    }
    let backend = match connected.into_iter().collect::<Result<Vec<_>, _>>() {
        Ok(mut backends) => backends.pop().unwrap(),
        Err(e) => panic!("a connect waited for the member that never answers: {e:?}"),
    };
    let lease = backend.grant_lease(Duration::from_secs(30)).await.unwrap();
    let before = backend.requests_sent();
    let mut failed = Vec::new();
    for i in 0..20 {
        if let Err(e) = backend.keep_alive(lease.id()).await {
            failed.push((i, e));
        }
    }
    let sent = backend.requests_sent() - before;
    assert!(failed.is_empty(), "renewals failed: {failed:?}");
    // What a renewal costs with the real member alone; one timeout adds one request.
    let per_renewal = {
        let alone = self::backend().await;
        let before = alone.requests_sent();
        alone.keep_alive(lease.id()).await.unwrap();
        alone.requests_sent() - before
    };
    assert!(
        sent <= 20 * per_renewal + 1,
        "{sent} requests for 20 renewals of {per_renewal} request(s) each: \
         the member that never answers was tried again and again"
    );
    backend.revoke_lease(lease.id()).await.unwrap();

    // A lock handed over: the waiter's watch is opened on a member that answers.
    let name = test_name("frozen-member");
    let (a, b) = (
        Session::new(backend.clone()).await.unwrap(),
        Session::new(backend.clone()).await.unwrap(),
    );
    let held = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let waiter = tokio::spawn(async move {
        let guard = Mutex::new(&b, &name).unwrap().lock().await.unwrap();
        let token = guard.fencing_token();
        guard.release().await.unwrap();
        token
    });
    let first = held.fencing_token();
    eventually("the waiter is queued", || async {
        backend
            .entries(&test_name("frozen-member"))
            .await
            .unwrap()
            .len()
            == 2
    })
    .await;
    held.release().await.unwrap();
    let second = within("the hand-over", Duration::from_secs(30), waiter)
        .await
        .unwrap();
    assert!(second > first);
    drop(frozen);
}

/// Value waits (barriers, semaphores' limits) and queue observers read and watch through a
/// member that answers: with one that never answers among the endpoints, every wait and
/// observer still sees its change within a few request timeouts, never waiting for that
/// member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_waits_and_observers_do_not_wait_for_a_member_that_never_answers() {
    let (frozen, endpoints) = beside_a_frozen_member(EtcdNode::shared().endpoints());
    let options = EtcdOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_millis(500))
        .with_retry_for(Duration::from_secs(5));
    let backend = EtcdBackend::connect(&endpoints, options).await.unwrap();
    // Each wait starts a watch of its own key (a read and a watch, on the member whose turn
    // it is).
    for i in 0..8 {
        let key = test_name(&format!("frozen-value-{i}"));
        assert!(backend.swap(&key, None, b"1").await.unwrap());
        let waiter = {
            let backend = backend.clone();
            let key = key.clone();
            tokio::spawn(async move { backend.wait_value(&key, Some(b"1")).await })
        };
        assert!(backend.swap(&key, Some(b"1"), b"2").await.unwrap());
        let seen = within(&format!("value wait {i}"), Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seen.as_deref(), Some(&b"2"[..]));
    }
    // So do queue observers (`Election::observe`), whose watch opens after a snapshot.
    let lease = backend.grant_lease(Duration::from_secs(30)).await.unwrap();
    for i in 0..8 {
        let queue = test_name(&format!("frozen-observe-{i}"));
        let mut heads = backend.observe_head(&queue);
        let first = within("the snapshot", Duration::from_secs(5), heads.next()).await;
        assert_eq!(first.unwrap().unwrap(), baton::HeadEvent::Head(None));
        let entry = backend.enqueue(&queue, "a", lease.id(), b"").await.unwrap();
        let next = within(
            &format!("observer {i}"),
            Duration::from_secs(5),
            heads.next(),
        )
        .await;
        assert_eq!(
            next.unwrap().unwrap(),
            baton::HeadEvent::Head(Some(entry.entry().clone()))
        );
    }
    backend.revoke_lease(lease.id()).await.unwrap();
    drop(frozen);
}

#[tokio::test]
async fn granted_ttl_is_used_as_granted() {
    let backend = backend().await;
    // etcd counts whole seconds and has a minimum: the session runs on what it was given.
    let s = Session::with_options(
        backend.clone(),
        SessionOptions::new().with_ttl(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    assert!(s.ttl() >= Duration::from_secs(1), "{:?}", s.ttl());
    let mut client = backend.client().clone();
    let ttl = client
        .lease_time_to_live(s.lease_id().get(), None)
        .await
        .unwrap();
    assert_eq!(Duration::from_secs(ttl.granted_ttl() as u64), s.ttl());
    s.close().await.unwrap();
}

/// A compaction of everything the waiter has seen does not disturb its wait. (Waits never
/// start a watch from a past revision, so a compaction cannot cancel theirs; the path where
/// etcd cancels a watch anyway is tested against scripted streams in the watch driver.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_survives_compaction() {
    let backend = backend().await;
    let name = test_name("compaction");
    let a = Session::new(backend.clone()).await.unwrap();
    let b = Session::new(backend.clone()).await.unwrap();
    let guard = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let waiter = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move { Mutex::new(&b, &name).unwrap().lock().await }
    });
    eventually("the waiter is queued", || async {
        backend.entries(&name).await.unwrap().len() == 2
    })
    .await;
    // Move the store on and compact away every revision the waiter has seen.
    support::compact_history(backend.client(), &format!("{name}-filler")).await;
    guard.release().await.unwrap();
    let next = within("waiter after compaction", Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    next.release().await.unwrap();
}

/// Waits on a plain key's value (a semaphore's waiters on its limit) share one etcd watch
/// per backend, and miss no change, across a compaction too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_waits_share_one_watch_and_survive_compaction() {
    let backend = backend().await;
    let key = test_name("value");
    assert!(backend.swap(&key, None, b"1").await.unwrap());
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let backend = backend.clone();
            let key = key.clone();
            tokio::spawn(async move { backend.wait_value(&key, Some(b"1")).await })
        })
        .collect();
    // Let every waiter subscribe: the first starts the watch (a read and a watch), the others
    // join it without a request of their own.
    let before = backend.requests_sent();
    let one_more = {
        let backend = backend.clone();
        let key = key.clone();
        tokio::spawn(async move { backend.wait_value(&key, Some(b"1")).await })
    };
    tokio::task::yield_now().await;
    support::compact_history(backend.client(), &format!("{key}-filler")).await;
    assert!(backend.swap(&key, Some(b"1"), b"2").await.unwrap());
    for w in waiters.into_iter().chain([one_more]) {
        let seen = within("the change", Duration::from_secs(10), w)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seen.as_deref(), Some(&b"2"[..]));
    }
    // The compaction filler's put and compaction are not ours; the swap is one request, and
    // each woken waiter confirms with one read: no watch per waiter.
    let spent = backend.requests_sent() - before;
    assert!(
        spent <= 1 + 9 + 2,
        "{spent} requests for 9 waiters on one key"
    );
}

/// A waiter that arrives while the shared watch of its key is ending (its last waiter just
/// left) is served: it joins a watch that goes on, or starts a new one, never one that is
/// about to stop feeding it. The hook holds the ending watch at its last step until the new
/// waiter has subscribed, or for at most a second if subscribing has to wait for the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_waiter_arriving_as_the_watch_ends_is_woken() {
    let backend = backend().await;
    let key = test_name("value-ending");
    assert!(backend.swap(&key, None, b"1").await.unwrap());
    let (ending_tx, ending_rx) = std::sync::mpsc::channel::<()>();
    let (joined_tx, joined_rx) = std::sync::mpsc::channel::<()>();
    let (ending_tx, joined_rx) = (
        std::sync::Mutex::new(ending_tx),
        std::sync::Mutex::new(joined_rx),
    );
    let watched = key.clone();
    baton::testing::on_value_watch_end(Some(Box::new(move |k| {
        if k == watched {
            let _ = ending_tx.lock().unwrap().send(());
            let _ = joined_rx
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(1));
        }
    })));
    // The first waiter starts the key's watch, is answered from the watch's read, and
    // leaves: the watch ends.
    let first = within(
        "the first answer",
        Duration::from_secs(10),
        backend.wait_value(&key, Some(b"0")),
    )
    .await
    .unwrap();
    assert_eq!(first.as_deref(), Some(&b"1"[..]));
    ending_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the watch ends once its only waiter left");
    // The second arrives while it ends (subscribing is the first poll's first step).
    let mut second = Box::pin(backend.wait_value(&key, Some(b"1")));
    assert!(futures::poll!(&mut second).is_pending());
    let _ = joined_tx.send(());
    assert!(backend.swap(&key, Some(b"1"), b"2").await.unwrap());
    let seen = within(
        "the waiter that came as the watch ended",
        Duration::from_secs(10),
        second,
    )
    .await
    .unwrap();
    baton::testing::on_value_watch_end(None);
    assert_eq!(seen.as_deref(), Some(&b"2"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_raw_key_is_respected() {
    let backend = backend().await;
    let name = test_name("foreign-raw");
    // A contender written with raw etcd operations, in the Go recipe's layout.
    let mut client = backend.client().clone();
    let lease = client.lease_grant(30, None).await.unwrap().id();
    let key = format!("{name}/{lease:x}");
    client
        .put(
            key.as_str(),
            "",
            Some(baton::etcd_client::PutOptions::new().with_lease(lease)),
        )
        .await
        .unwrap();

    let s = Session::new(backend.clone()).await.unwrap();
    let mutex = Mutex::new(&s, &name).unwrap();
    assert!(matches!(mutex.try_lock().await, Err(Error::Locked { .. })));
    let waiter = support::spawn_queued(&backend, &s, &name, 2).await;
    client.delete(key.as_str(), None).await.unwrap();
    let guard = within(
        "lock after the foreign key left",
        Duration::from_secs(10),
        waiter,
    )
    .await
    .unwrap()
    .unwrap();
    guard.release().await.unwrap();
    client.lease_revoke(lease).await.unwrap();
}

/// `etcdctl lock` and baton share one lock, both ways round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interoperates_with_etcdctl_lock() {
    if !have_etcdctl() {
        return;
    }
    let node = EtcdNode::shared();
    let backend = backend().await;
    let name = test_name("etcdctl");
    let endpoints = node.endpoints().join(",");

    // etcdctl holds; baton waits behind it.
    let mut etcdctl = etcdctl_holds(&endpoints, &name).await;
    let s = Session::new(backend.clone()).await.unwrap();
    let mutex = Mutex::new(&s, &name).unwrap();
    assert!(matches!(mutex.try_lock().await, Err(Error::Locked { .. })));
    let waiter = support::spawn_queued(&backend, &s, &name, 2).await;
    stop(&mut etcdctl).await;
    let guard = within(
        "baton after etcdctl released",
        Duration::from_secs(10),
        waiter,
    )
    .await
    .unwrap()
    .unwrap();

    // baton holds; etcdctl waits behind it.
    let mut etcdctl = etcdctl_lock(&endpoints, &name);
    eventually("etcdctl queued behind baton", || async {
        backend.entries(&name).await.unwrap().len() == 2
    })
    .await;
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    let line = within(
        "etcdctl acquires",
        Duration::from_secs(10),
        read_line(&mut etcdctl),
    )
    .await;
    assert!(line.starts_with(&format!("{name}/")), "{line}");
    let entries = backend.entries(&name).await.unwrap();
    assert_eq!(entries.len(), 1);
    assert!(entries[0].token() > token);
    stop(&mut etcdctl).await;
    eventually("etcdctl released", || async {
        backend.entries(&name).await.unwrap().is_empty()
    })
    .await;
}

/// Issue #25 (2): an `etcdctl lock` holder excludes baton's semaphore permits and read
/// locks on the same name (its entry is not taken for a permit), and they are granted once
/// it releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcdctl_lock_holder_excludes_permits_and_readers() {
    if !have_etcdctl() {
        return;
    }
    let node = EtcdNode::shared();
    let backend = backend().await;
    let name = test_name("etcdctl-kinds");
    let endpoints = node.endpoints().join(",");
    let mut etcdctl = etcdctl_holds(&endpoints, &name).await;
    let s = Session::new(backend.clone()).await.unwrap();
    let sem = baton::Semaphore::new(&s, &name, 3).unwrap();
    let rw = baton::RwLock::new(&s, &name).unwrap();
    let permit = sem.try_acquire().await;
    assert!(matches!(permit, Err(Error::Locked { .. })), "{permit:?}");
    let read = rw.try_read().await;
    assert!(matches!(read, Err(Error::Locked { .. })), "{read:?}");
    let waiting = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    eventually("the permit queued behind etcdctl", || async {
        backend.entries(&name).await.unwrap().len() == 2
    })
    .await;
    assert!(!waiting.is_finished());
    stop(&mut etcdctl).await;
    let permit = within("the permit", Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();
    permit.release().await.unwrap();
}

/// Whether `etcdctl` is installed; outside CI a test without it is skipped (said on stderr).
fn have_etcdctl() -> bool {
    if which("etcdctl").is_some() {
        return true;
    }
    eprintln!("etcdctl not installed; skipping (CI installs it)");
    assert!(std::env::var("CI").is_err(), "CI must have etcdctl");
    false
}

/// `etcdctl lock name`, once it holds (it printed its key).
async fn etcdctl_holds(endpoints: &str, name: &str) -> tokio::process::Child {
    let mut etcdctl = etcdctl_lock(endpoints, name);
    let first_line = read_line(&mut etcdctl).await;
    assert!(first_line.starts_with(&format!("{name}/")), "{first_line}");
    etcdctl
}

fn which(bin: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(bin))
            .find(|p| p.is_file())
    })
}

fn etcdctl_lock(endpoints: &str, name: &str) -> tokio::process::Child {
    tokio::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoints, "lock", name])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn etcdctl")
}

async fn read_line(child: &mut tokio::process::Child) -> String {
    use tokio::io::AsyncReadExt;
    let stdout = child.stdout.as_mut().expect("stdout piped");
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while stdout.read(&mut byte).await.unwrap() == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    String::from_utf8(line).unwrap()
}

/// Stops etcdctl the way a user would (SIGTERM), so that it releases its lock.
async fn stop(child: &mut tokio::process::Child) {
    let pid = child.id().expect("running");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    within("etcdctl exits", Duration::from_secs(10), child.wait())
        .await
        .unwrap();
}

/// A node of its own with authentication on, user `root` (role root) with `password`; `None`
/// (the test skips) against an external etcd, which enabling authentication would lock out.
async fn node_with_root(password: &str) -> Option<EtcdNode> {
    if std::env::var("BATON_ETCD_ENDPOINTS").is_ok() {
        eprintln!("external etcd: not enabling authentication on it; skipping");
        return None;
    }
    let node = EtcdNode::start().await.expect("a node of its own");
    let mut client = node.backend().await.unwrap().client().clone();
    client.user_add("root", password, None).await.unwrap();
    client.user_grant_role("root", "root").await.unwrap();
    client.auth_enable().await.unwrap();
    Some(node)
}

/// Wrong credentials are a distinct error; right ones connect. Uses a node of its own,
/// since enabling authentication would lock the other tests out of the shared one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_refused() {
    let Some(node) = node_with_root("right-password").await else {
        return;
    };

    let wrong = EtcdBackend::connect(
        node.endpoints(),
        EtcdOptions::new().with_user("root", "wrong-password"),
    )
    .await
    .unwrap_err();
    assert!(matches!(wrong, Error::Auth { .. }), "{wrong:?}");
    let anonymous = EtcdBackend::connect(node.endpoints(), EtcdOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(anonymous, Error::Auth { .. }), "{anonymous:?}");

    let right = EtcdBackend::connect(
        node.endpoints(),
        EtcdOptions::new().with_user("root", "right-password"),
    )
    .await
    .unwrap();
    let s = Session::new(right).await.unwrap();
    let guard = Mutex::new(&s, "auth/lock").unwrap().lock().await.unwrap();
    guard.release().await.unwrap();
}

/// With credentials and a member that never answers among the endpoints, `connect` still
/// succeeds within its timeout. etcd-client logs in at connect through one member it picks;
/// were the attempt that picked the frozen one waited for, the connect would end with its
/// timeout. Uses a node of its own, as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_at_connect_does_not_wait_for_a_member_that_never_answers() {
    let Some(node) = node_with_root("pw").await else {
        return;
    };
    let (frozen, endpoints) = beside_a_frozen_member(node.endpoints());
    let options = EtcdOptions::new()
        .with_user("root", "pw")
        .with_connect_timeout(Duration::from_secs(7))
        .with_request_timeout(Duration::from_secs(1));
    // A connect's attempts start every 500 ms while none has answered: all of them would
    // have to pick the frozen member. Without them, the first attempt to pick it waits until
    // the connect timeout (the HTTP/2 pings give up only after about 8 s).
    for i in 0..6 {
        let backend = EtcdBackend::connect(&endpoints, options.clone())
            .await
            .unwrap_or_else(|e| {
                panic!("connect {i} waited for the member that never answers: {e:?}")
            });
        assert!(
            backend
                .swap(&format!("login-{i}"), None, b"1")
                .await
                .unwrap()
        );
    }
    drop(frozen);
}

/// Watch events etcd has sent so far, from its `/metrics` endpoint (plain HTTP on loopback).
async fn events_sent(endpoint: &str) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = endpoint.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).await.unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_events_total "))
        .map(|v| v.trim().parse::<f64>().unwrap() as u64)
        .expect("etcd_debugging_mvcc_events_total in /metrics")
}

/// One release sends one watch event, however many wait: every waiter watches only its
/// predecessor. Uses a node of its own so that no other test's watches are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_sends_one_watch_event() {
    if std::env::var("BATON_ETCD_ENDPOINTS").is_ok() {
        eprintln!("external etcd: its metrics count other clients too; skipping");
        return;
    }
    let node = EtcdNode::start().await.expect("a node of its own");
    let endpoint = node.endpoints()[0].clone();
    let backend = node.backend().await.unwrap();
    let name = "herd/lock";
    let holder = Session::new(backend.clone()).await.unwrap();
    let guard = Mutex::new(&holder, name).unwrap().lock().await.unwrap();

    let (granted_tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    let mut releases = Vec::new();
    for i in 0..8 {
        let s = Session::new(backend.clone()).await.unwrap();
        let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
        releases.push(release_tx);
        let granted_tx = granted_tx.clone();
        tokio::spawn(async move {
            let g = Mutex::new(&s, name).unwrap().lock().await.unwrap();
            granted_tx.send(i).unwrap();
            let _ = release_rx.await;
            g.release().await.unwrap();
        });
        eventually("queued", || async {
            backend.entries(name).await.unwrap().len() == i + 2
        })
        .await;
    }

    let mut before = events_sent(&endpoint).await;
    guard.release().await.unwrap();
    for (i, release) in releases.into_iter().enumerate() {
        let next = within("next grant", Duration::from_secs(10), granted.recv()).await;
        assert_eq!(next, Some(i));
        let after = events_sent(&endpoint).await;
        assert_eq!(
            after - before,
            1,
            "release {i} sent {} watch events",
            after - before
        );
        before = after;
        release.send(()).unwrap();
    }
}

/// The observer keeps reporting across a compaction of the history it watches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_continues_across_compaction() {
    use baton::{Election, LeaderEvent};
    let backend = backend().await;
    let name = test_name("observe-compaction");
    let s = Session::new(backend.clone()).await.unwrap();
    let election = Election::new(&s, &name).unwrap();
    let mut events = election.observe();
    assert_eq!(support::next_event(&mut events).await, LeaderEvent::Vacant);
    let a = election.campaign("a").await.unwrap();
    assert!(
        matches!(support::next_event(&mut events).await, LeaderEvent::Elected(l) if l.value() == b"a")
    );

    support::compact_history(backend.client(), &format!("{name}-filler")).await;

    a.release().await.unwrap();
    assert_eq!(support::next_event(&mut events).await, LeaderEvent::Vacant);
    let other = Session::new(backend.clone()).await.unwrap();
    let b = Election::new(&other, &name)
        .unwrap()
        .campaign("b")
        .await
        .unwrap();
    assert!(
        matches!(support::next_event(&mut events).await, LeaderEvent::Elected(l) if l.value() == b"b")
    );
    b.release().await.unwrap();
}

/// Contenders cycling on one lock re-create their keys every cycle; waits reuse the kept
/// watch on the predecessor's key name and skip the existence read, yet never miss a
/// release: no overlap, every grant in token order, fewer than four requests per cycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_watches_follow_recreated_keys() {
    let backend = backend().await;
    let name = test_name("kept-watches");
    let register = Arc::new(support::FencedRegister::default());
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(Session::new(backend.clone()).await.unwrap());
    }
    let before = backend.requests_sent();
    let tasks: Vec<_> = sessions
        .iter()
        .map(|s| {
            let (mutex, register) = (Mutex::new(s, &name).unwrap(), Arc::clone(&register));
            tokio::spawn(async move {
                for _ in 0..30 {
                    let guard = mutex.lock().await.unwrap();
                    let token = guard.fencing_token().get();
                    assert!(register.enter(token));
                    tokio::task::yield_now().await;
                    register.exit(token);
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        within("30 cycles each", Duration::from_secs(60), t)
            .await
            .unwrap();
    }
    let per_cycle = (backend.requests_sent() - before) as f64 / 90.0;
    let s = register.snapshot();
    assert_eq!((s.overlaps, s.accepted.len()), (0, 90));
    support::assert_strictly_increasing(&s.accepted);
    assert!(
        per_cycle < 4.0,
        "{per_cycle:.2} requests per cycle: kept watches not used"
    );
}

/// A foreign key under the lock's prefix whose name is not UTF-8 is waited on by its exact
/// bytes: the waiter watches it without polling (no request loop) and is granted once it is
/// deleted. (Before, the key was converted lossily; the wait named a key that did not exist,
/// returned at once, and the waiter sent about 1,500 requests a second.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_is_not_utf8_is_waited_on_not_polled() {
    let backend = backend().await;
    let name = test_name("not-utf8");
    let mut raw = backend.client().clone();
    let mut foreign = format!("{name}/").into_bytes();
    foreign.extend_from_slice(&[0xff, 0xfe, b'x']);
    raw.put(foreign.clone(), "foreign", None).await.unwrap();

    let faulty = FaultyBackend::wrap(Arc::new(backend.clone()));
    faulty.set_spin_guard(20, Duration::from_secs(1));
    let s = support::session_on(faulty.clone(), SessionOptions::DEFAULT_TTL).await;
    let waiter = tokio::spawn({
        let (s, name) = (s.clone(), name.clone());
        async move { Mutex::new(&s, &name).unwrap().lock().await }
    });
    faulty.until_count(Call::WaitGone, 1).await;
    let entries = backend.entries(&name).await.unwrap();
    assert_eq!(
        entries[0].key_bytes(),
        foreign.as_slice(),
        "exact, and first"
    );
    // A window in which a spinning waiter would send hundreds of requests.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(faulty.spins(), 0, "a request loop without backoff");
    assert!(
        faulty.count(Call::WaitGone) + faulty.count(Call::Predecessor) <= 3,
        "{:?}",
        faulty.log()
    );
    assert!(!waiter.is_finished(), "the foreign key is older: it waits");
    raw.delete(foreign, None).await.unwrap();
    let guard = within(
        "granted after the foreign key left",
        Duration::from_secs(10),
        waiter,
    )
    .await
    .unwrap()
    .unwrap();
    guard.release().await.unwrap();
    s.close().await.unwrap();
}

/// A session created on a runtime that then shut down (its keep-alive driver, and the etcd
/// connection made there, gone with it) is reported lost at its deadline on another runtime.
#[test]
fn lost_after_the_runtime_that_renewed_it_ended() {
    let helper = tokio::runtime::Runtime::new().unwrap();
    let session = helper.block_on(async {
        let backend = EtcdNode::shared().backend().await.unwrap();
        Session::with_options(
            backend,
            SessionOptions::new().with_ttl(Duration::from_secs(2)),
        )
        .await
        .unwrap()
    });
    let ttl = session.ttl();
    drop(helper);
    let elsewhere = tokio::runtime::Runtime::new().unwrap();
    let reason = elsewhere
        .block_on(async { within("lost() at the deadline", ttl * 3, session.lost()).await });
    assert_eq!(reason, baton::LostReason::Expired);
    assert!(session.is_lost());
}

/// The fault-injection harness on etcd, sampled: a part of the (operation, step, fault)
/// cases the memory suite runs in full, against a real server (see docs/reliability.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_harness_sample() {
    support::harness::run_sample("etcd", |case: String| async move {
        Rig {
            backend: Arc::new(backend().await),
            outside: Arc::new(backend().await),
            prefix: format!("etcd-{}/harness/{case}", std::process::id()),
        }
    })
    .await;
}

/// A backend built on the application's own etcd client locks like one baton connected
/// itself; a client whose endpoint answers nothing is refused with `Connect` within the
/// connect timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_on_the_applications_client() {
    let endpoints = EtcdNode::shared().endpoints().to_vec();
    let client = baton::etcd_client::Client::connect(&endpoints, None)
        .await
        .unwrap();
    let backend = EtcdBackend::from_client(client, EtcdOptions::new())
        .await
        .unwrap();
    let s = Session::new(backend.clone()).await.unwrap();
    let name = test_name("from-client");
    let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    assert_eq!(backend.entries(&name).await.unwrap().len(), 1);
    guard.release().await.unwrap();

    let port = support::refused_port();
    let dead = baton::etcd_client::Client::connect([format!("127.0.0.1:{port}")], None)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let err = EtcdBackend::from_client(
        dead,
        EtcdOptions::new().with_connect_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// With authentication on, a session and its lock outlive the auth token: an expired token is
/// refreshed, not reported as a failed renewal (which would end the session). etcd's simple
/// tokens live 1 s here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_auth_token_is_refreshed() {
    if std::env::var("BATON_ETCD_ENDPOINTS").is_ok() {
        eprintln!("external etcd: not enabling authentication on it; skipping");
        return;
    }
    let node = EtcdNode::start_with(&["--auth-token", "simple", "--auth-token-ttl", "1"])
        .await
        .expect("a node of its own");
    let mut client = node.backend().await.unwrap().client().clone();
    client.user_add("root", "pw", None).await.unwrap();
    client.user_grant_role("root", "root").await.unwrap();
    client.auth_enable().await.unwrap();
    let backend =
        EtcdBackend::connect(node.endpoints(), EtcdOptions::new().with_user("root", "pw"))
            .await
            .unwrap();
    let s = Session::with_options(
        backend.clone(),
        SessionOptions::new().with_ttl(Duration::from_secs(3)),
    )
    .await
    .unwrap();
    let guard = Mutex::new(&s, "auth/expiry").unwrap().lock().await.unwrap();
    // The scenario is time passing: the token expires (1 s) several times over, while the
    // session renews (every second).
    let lost = tokio::time::timeout(Duration::from_secs(5), s.lost()).await;
    assert!(lost.is_err(), "the session was lost: {lost:?}");
    assert!(guard.is_owner().await.unwrap());
    guard.release().await.unwrap();
    let again = Mutex::new(&s, "auth/expiry").unwrap().lock().await.unwrap();
    again.release().await.unwrap();
}

async fn indexed_backend() -> EtcdBackend {
    let node = EtcdNode::shared();
    EtcdBackend::connect(
        node.endpoints(),
        EtcdOptions::new().with_layout(EtcdLayout::Indexed),
    )
    .await
    .expect("connect to the shared etcd")
}

/// The indexed layout ([`EtcdLayout::Indexed`]): both clients use it.
async fn rig_indexed(test: &str) -> Rig {
    Rig {
        backend: Arc::new(indexed_backend().await),
        outside: Arc::new(indexed_backend().await),
        prefix: format!("etcd-{}/indexed-{test}", std::process::id()),
    }
}

// The core of the suite again on the indexed layout (not the whole suite: CI time). Left
// out: tests of paths the layout does not change (leases, sessions' ends, guarded writes'
// outcomes, observers, barriers).
conformance!(@tests indexed; super::rig_indexed; (flavor = "multi_thread", worker_threads = 2);
    mutual_exclusion, fifo_order, try_lock_leaves_nothing, dropped_lock_leaves_nothing,
    crashed_holder_is_followed, late_unlock_spares_successor, lost_waiter_gets_error,
    local_tasks_never_share_a_key, failed_lock_leaves_nothing,
    failed_release_never_hands_out_the_token_again, deleted_key_is_reported_to_the_holder,
    nested_names_share_a_queue, election_fifo_succession, election_dead_leader_is_followed,
    semaphore_bounds_holders, semaphore_fifo_whoever_releases, semaphore_cancel_leaves_nothing,
    rwlock_readers_share_writers_exclude, rwlock_no_writer_starvation,
    rwlock_waiter_between_writers_gives_up, multilock_all_or_nothing,
    one_name_several_kinds_exclude_each_other, a_waiter_behind_one_that_leaves_is_not_the_head);

/// The keys etcd loads for one waiter's enqueue, its look at its predecessor and its head
/// check do not grow with the queue in the indexed layout (#39): past the layout's window each
/// reads a constant number of keys (one or two windows' worth). In the Go layout each reads
/// the whole queue (run with `Go` to see it fail: about 500 per read at depth 500).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexed_layout_reads_do_not_grow_with_the_queue() {
    keys_read_per_op_at_depth(EtcdLayout::Indexed, "indexed-depth").await;
}

/// Entries of the indexed layout created out of number order, as concurrent enqueues of
/// several processes create them (the layout lets an entry be numbered up to its window, 64,
/// below an older one; numbers may be shared), are read in creation order all the same: each
/// entry's predecessor, the entries ahead of it and the head check agree with the queue read
/// by create revision, and so does each enqueue's predecessor. Dense enough that a look reads
/// several pages. On the reads of the exact layout (key order taken for creation order) the
/// first entry created below an older one gets a wrong predecessor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexed_reads_follow_creation_when_entries_are_out_of_number_order() {
    const WINDOW: u64 = 64;
    let backends = [
        indexed_backend().await,
        indexed_backend().await,
        indexed_backend().await,
    ];
    let backend = &backends[0];
    let mut sessions = Vec::new();
    for b in &backends {
        sessions.push(Session::new(b.clone()).await.unwrap());
    }
    let queue = test_name("indexed-out-of-order");
    let mut client = backend.client().clone();
    // A fixed pseudo-random sequence (an LCG): the same state every run.
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % n
    };
    let number = |e: &baton::Entry| {
        let hex = &e.key()[queue.len() + 4..queue.len() + 20];
        u64::MAX - u64::from_str_radix(hex, 16).unwrap()
    };
    for i in 0..300 {
        let present = backend.entries(&queue).await.unwrap();
        let top = present.iter().map(number).max().unwrap_or(0);
        match next(20) {
            // Remove an entry anywhere in the queue.
            0..=2 if !present.is_empty() => {
                let gone = &present[next(present.len() as u64) as usize];
                client.delete(gone.key(), None).await.unwrap();
            }
            // An enqueue of one of the backends (each numbers on its own).
            3..=5 => {
                let k = next(3) as usize;
                let enqueued = backends[k]
                    .enqueue(&queue, &format!("t{i}"), sessions[k].lease_id(), b"")
                    .await
                    .unwrap();
                let (_, is_head, predecessor) = enqueued.into_parts();
                assert_eq!(is_head, present.is_empty(), "enqueue {i}");
                assert_eq!(
                    predecessor.map(|p| p.key().to_owned()),
                    present.last().map(|p| p.key().to_owned()),
                    "enqueue {i}: its predecessor"
                );
            }
            // An entry numbered anywhere the window allows (no entry numbered 64 above it),
            // or above the newest, so that the queue spans several windows.
            _ => {
                let seq = if next(2) == 0 {
                    top.saturating_sub(WINDOW - 1) + next(WINDOW + 3)
                } else {
                    top + 1 + next(8)
                };
                let key = format!("{queue}/_q/{:016x}.r{i}", u64::MAX - seq);
                client.put(key, "", None).await.unwrap();
            }
        }
    }
    let queue_now = backend.entries(&queue).await.unwrap();
    let numbers: Vec<u64> = queue_now.iter().map(number).collect();
    assert!(
        numbers.windows(2).any(|w| w[0] > w[1]),
        "some entry is numbered below an older one: {numbers:?}"
    );
    assert!(queue_now.len() > 150, "{} entries", queue_now.len());
    let keys = |v: Vec<baton::Entry>| v.iter().map(|e| e.key().to_owned()).collect::<Vec<_>>();
    assert!(
        numbers.iter().max().unwrap() - numbers.iter().min().unwrap() > 3 * WINDOW,
        "the queue spans several windows: {numbers:?}"
    );
    let mut fewest_read = u64::MAX;
    for (i, e) in queue_now.iter().enumerate() {
        let before = backend.keys_read();
        let predecessor = backend.predecessor(e).await.unwrap();
        fewest_read = fewest_read.min(backend.keys_read() - before);
        assert_eq!(
            predecessor.map(|p| p.key().to_owned()),
            i.checked_sub(1).map(|j| queue_now[j].key().to_owned()),
            "the predecessor of entry {i} of {}",
            queue_now.len()
        );
        let ahead = backend.ahead(&queue, e, 3).await.unwrap();
        let expected: Vec<_> = queue_now[i.saturating_sub(3)..i]
            .iter()
            .rev()
            .cloned()
            .collect();
        assert_eq!(
            keys(ahead),
            keys(expected),
            "the entries ahead of entry {i}"
        );
        // Every entry numbered more than 64 below the head's is newer, so the head's check
        // reads no more than its window and answers; no other entry is taken for the head.
        assert_eq!(
            backend.was_head(e).await.unwrap(),
            i == 0,
            "head check of entry {i}"
        );
    }
    // Some look decided before the end of the queue (by the window, not by reading it all).
    assert!(
        (fewest_read as usize) < queue_now.len() / 2,
        "every predecessor read read at least {fewest_read} of {} keys",
        queue_now.len()
    );
    for s in sessions {
        s.close().await.unwrap();
    }
    delete_queue(&mut client, &queue).await;
}

/// Deletes every key under `queue/` (entries written without a lease outlive the test).
async fn delete_queue(client: &mut baton::etcd_client::Client, queue: &str) {
    let prefix = baton::etcd_client::DeleteOptions::new().with_prefix();
    client
        .delete(format!("{queue}/"), Some(prefix))
        .await
        .unwrap();
}

/// A look at the entries ahead that takes several reads (entries sharing numbers, as
/// processes numbering alike make) reads the plain key beside them with its last read, not its
/// first: a semaphore grants on "fewer ahead than the limit", which holds only if the limit was
/// read no earlier than the entries. A limit lowered while the look reads on is the limit it
/// answers with. (The first version of the windowed reads took the key from the first read and
/// answered the old limit.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_indexed_look_reads_the_limit_with_its_last_page() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let backend = indexed_backend().await;
    let queue = test_name("indexed-limit-paging");
    let limit_key = format!("{queue}-limit");
    let mut client = backend.client().clone();
    client.put(limit_key.as_str(), "3", None).await.unwrap();
    // 300 entries numbered alike: no read of a look decides before the last.
    for i in 0..300 {
        let key = format!("{queue}/_q/{:016x}.r{i:03}", u64::MAX - 5);
        client.put(key, "", None).await.unwrap();
    }
    let mine = backend.entries(&queue).await.unwrap().pop().unwrap();
    let pages = Arc::new(AtomicUsize::new(0));
    {
        let (pages, key, q) = (Arc::clone(&pages), limit_key.clone(), queue.clone());
        let endpoints = EtcdNode::shared().endpoints().to_vec();
        baton::testing::on_indexed_page(Some(Box::new(move |queue| {
            if queue != q || pages.fetch_add(1, SeqCst) > 0 {
                return;
            }
            // The limit lowered from another client before the look reads on.
            let (endpoints, key) = (endpoints.clone(), key.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let mut c = baton::etcd_client::Client::connect(endpoints, None)
                        .await
                        .unwrap();
                    c.put(key, "1", None).await.unwrap();
                });
            })
            .join()
            .unwrap();
        })));
    }
    let looked = backend.ahead_and_read(&queue, &mine, 3, &limit_key).await;
    baton::testing::on_indexed_page(None);
    let (ahead, limit) = looked.unwrap();
    assert!(pages.load(SeqCst) >= 1, "the look read only once");
    assert_eq!(ahead.len(), 3);
    assert_eq!(
        limit.as_deref(),
        Some(&b"1"[..]),
        "the limit as of the look's last read"
    );
    delete_queue(&mut client, &queue).await;
}

/// A key inside an indexed queue's `<name>/_q/` that is not one of its entries and sorts below
/// them (here the Go-layout key of a lock named `<name>/_q/Alpha`) fails every enqueue's
/// compare. The enqueue says so at once, naming the key, and creates nothing; before, it
/// retried 4,096 times and then blamed other enqueues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_indexed_enqueue_names_a_key_that_blocks_the_queue() {
    let backend = indexed_backend().await;
    let queue = test_name("indexed-blocked");
    let session = Session::new(backend.clone()).await.unwrap();
    let mut client = backend.client().clone();
    let blocking = format!("{queue}/_q/Alpha/694d7a1c3b2e0f11");
    client.put(blocking.as_str(), "", None).await.unwrap();
    let requests = backend.requests_sent();
    let refused = backend
        .enqueue(&queue, "t1", session.lease_id(), b"")
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, Error::ForeignLayout { node, .. } if *node == blocking),
        "{refused:?}"
    );
    assert!(
        backend.requests_sent() - requests < 10,
        "{} requests before it gave up",
        backend.requests_sent() - requests
    );
    client.delete(blocking.as_str(), None).await.unwrap();
    // Gone, the queue works again; nothing was left behind.
    let enqueued = backend
        .enqueue(&queue, "t1", session.lease_id(), b"")
        .await
        .unwrap();
    assert!(enqueued.is_head());
    assert_eq!(backend.entries(&queue).await.unwrap().len(), 1);
    session.close().await.unwrap();
}

async fn keys_read_per_op_at_depth(layout: EtcdLayout, name: &str) {
    const DEPTH: usize = 500;
    let backend = EtcdBackend::connect(
        EtcdNode::shared().endpoints(),
        EtcdOptions::new().with_layout(layout),
    )
    .await
    .unwrap();
    let queue = test_name(name);
    let session = Session::new(backend.clone()).await.unwrap();
    let lease = session.lease_id();
    let mut cost = Vec::new();
    let mut last = None;
    for i in 0..DEPTH {
        let before = backend.keys_read();
        let enqueued = backend
            .enqueue(&queue, &format!("t{i}"), lease, b"")
            .await
            .unwrap();
        let (entry, is_head, predecessor) = enqueued.into_parts();
        assert_eq!(is_head, i == 0);
        // The predecessor the enqueue read is the entry just before.
        assert_eq!(
            predecessor.map(|p| p.key().to_owned()),
            last.as_ref().map(|l: &baton::Entry| l.key().to_owned())
        );
        let enqueue = backend.keys_read() - before;
        let before = backend.keys_read();
        let read = backend.predecessor(&entry).await.unwrap();
        assert_eq!(read.map(|p| p.token()), last.as_ref().map(|l| l.token()));
        assert_eq!(backend.was_head(&entry).await.unwrap(), i == 0);
        cost.push((enqueue, backend.keys_read() - before));
        last = Some(entry);
    }
    // The most keys an enqueue, and a predecessor read plus a head check, read.
    let worst = |at: std::ops::Range<usize>| {
        let costs = &cost[at];
        (
            costs.iter().map(|c| c.0).max().unwrap(),
            costs.iter().map(|c| c.1).max().unwrap(),
        )
    };
    let (shallow, middle, deep) = (
        worst(0..10),
        worst(DEPTH / 3 - 10..DEPTH / 3),
        worst(DEPTH - 10..DEPTH),
    );
    eprintln!(
        "{layout:?}: keys read (enqueue, predecessor + head check): first 10 entries {shallow:?}, entries {} to {} {middle:?}, last 10 of {DEPTH} {deep:?}",
        DEPTH / 3 - 10,
        DEPTH / 3
    );
    // Past the layout's window (64 numbers each way) a look reads no more keys at any depth:
    // the same at depth 500 as at depth 160, and about one window's worth for an enqueue, two
    // for a predecessor read and two for the head check of an entry that is not the head.
    assert!(
        deep.0 <= middle.0 && deep.1 <= middle.1,
        "{layout:?}: keys read grew from {middle:?} at depth {} to {deep:?} at depth {DEPTH}",
        DEPTH / 3
    );
    assert!(
        deep.0 <= 70 && deep.1 <= 270,
        "{layout:?}: an enqueue or a predecessor and head check at depth {DEPTH} read {deep:?} keys"
    );
    // The queue it built is in order, oldest first, as `entries` reads it.
    let entries = backend.entries(&queue).await.unwrap();
    assert_eq!(entries.len(), DEPTH);
    assert!(entries.windows(2).all(|w| w[0].token() < w[1].token()));
    session.close().await.unwrap();
}
