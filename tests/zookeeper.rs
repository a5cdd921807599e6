//! The conformance suite and ZooKeeper-specific tests against a real ZooKeeper server,
//! started through testcontainers (see `baton::testing`). One server is shared by the tests of
//! this binary; each test uses its own path prefix.

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;

use baton::testing::ZkNode;
use baton::{ZkBackend, ZkOptions};
use support::Rig;

async fn backend() -> ZkBackend {
    ZkBackend::connect(&ZkNode::shared().url(), ZkOptions::new())
        .await
        .expect("connect to the shared ZooKeeper")
}

async fn rig(test: &str) -> Rig {
    Rig {
        backend: Arc::new(backend().await),
        // A second connection: "someone else" really is another client.
        outside: Arc::new(backend().await),
        prefix: format!("zk-{}/{test}", std::process::id()),
    }
}

conformance!(super::rig; flavor = "multi_thread", worker_threads = 2);

use std::time::Duration;

use baton::{Backend, Error, LostReason, Mutex, Session, SessionOptions, ZkLayout};
use support::{eventually, within};
use zookeeper_client::{Acls, Client, CreateMode};

fn test_name(test: &str) -> String {
    format!("zk-{}/{test}", std::process::id())
}

/// A client of its own on `connect` (another session), for what a peer or an operator does.
async fn raw(connect: &str) -> Client {
    Client::connect(connect)
        .await
        .expect("a raw ZooKeeper client")
}

async fn session_on(backend: &ZkBackend, ttl: Duration) -> Session {
    Session::with_options(
        Arc::new(backend.clone()),
        SessionOptions::new().with_ttl(ttl),
    )
    .await
    .expect("session")
}

/// The last path segment of an entry's key.
fn node_name(key: &str) -> &str {
    key.rsplit('/').next().unwrap()
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `^_c_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-lock-\d{10}$`: Curator's
/// `InterProcessMutex` node (protected mode, `lock-` marker, ten-digit sequence).
fn is_curator_lock_node(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("_c_") else {
        return false;
    };
    let Some((uuid, seq)) = rest.split_once("-lock-") else {
        return false;
    };
    let groups: Vec<&str> = uuid.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| is_hex(g, n))
        && seq.len() == 10
        && seq.bytes().all(|b| b.is_ascii_digit())
}

/// `^[0-9a-f]{32}__lock__\d{10}$`: kazoo's `Lock` node (`uuid4().hex`, `__lock__`, sequence).
fn is_kazoo_lock_node(name: &str) -> bool {
    let Some((id, seq)) = name.split_once("__lock__") else {
        return false;
    };
    is_hex(id, 32) && seq.len() == 10 && seq.bytes().all(|b| b.is_ascii_digit())
}

/// Entries are named as Curator's and kazoo's mutexes name theirs, and sort by sequence
/// number as they do: the token (czxid) order is the suffix order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layouts_name_nodes_as_curator_and_kazoo_do() {
    for (layout, check) in [
        (ZkLayout::Curator, is_curator_lock_node as fn(&str) -> bool),
        (ZkLayout::Kazoo, is_kazoo_lock_node),
    ] {
        let name = test_name(&format!("layout-{}", layout.name()));
        let backend = ZkBackend::connect(
            &ZkNode::shared().url(),
            ZkOptions::new().with_layout(layout),
        )
        .await
        .unwrap();
        assert_eq!(backend.layout(), layout);
        let a = Session::new(backend.clone()).await.unwrap();
        let b = Session::new(backend.clone()).await.unwrap();
        let first = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
        let waiter = support::spawn_queued(&backend, &b, &name, 2).await;
        let entries = backend.entries(&name).await.unwrap();
        let names: Vec<&str> = entries.iter().map(|e| node_name(e.key())).collect();
        assert!(names.iter().all(|n| check(n)), "{layout:?}: {names:?}");
        let suffixes: Vec<&str> = names.iter().map(|n| &n[n.len() - 10..]).collect();
        let mut sorted = suffixes.clone();
        sorted.sort();
        assert_eq!(suffixes, sorted, "queue order is suffix order");
        assert_eq!(entries[0].key(), first.key());
        first.release().await.unwrap();
        let second = within("the waiter", Duration::from_secs(10), waiter)
            .await
            .unwrap()
            .unwrap();
        second.release().await.unwrap();
    }
}

/// `inspect` and `list` (what `baton status` and `baton ls` print) label ZooKeeper's nodes by
/// the recipes' rules in both layouts: the oldest holds, the others wait in queue order. Both
/// layouts put `_` in node names (`_c_<uuid>-lock-<seq>`, `<uuid>__lock__<seq>`); such names
/// were once taken for a barrier's entries, and every waiter showed as a holder (#38). The
/// rules live in the library's `inspect`; the CLI re-derives no key layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_labels_the_holder_and_the_waiters_in_both_layouts() {
    use baton::inspect::{self, EntryKind, Role};
    for layout in [ZkLayout::Curator, ZkLayout::Kazoo] {
        let name = test_name(&format!("inspect-{}", layout.name()));
        let backend = ZkBackend::connect(
            &ZkNode::shared().url(),
            ZkOptions::new().with_layout(layout),
        )
        .await
        .unwrap();
        let a = Session::new(backend.clone()).await.unwrap();
        let b = Session::new(backend.clone()).await.unwrap();
        let c = Session::new(backend.clone()).await.unwrap();
        let first = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
        let second = support::spawn_queued(&backend, &b, &name, 2).await;
        let third = support::spawn_queued(&backend, &c, &name, 3).await;

        let view = inspect::inspect(&backend, &name).await.unwrap();
        let roles: Vec<(Role, usize, EntryKind)> = view
            .members()
            .iter()
            .map(|m| (m.role(), m.place(), m.kind()))
            .collect();
        assert_eq!(
            roles,
            [
                (Role::Holder, 0, EntryKind::Exclusive),
                (Role::Waiter, 1, EntryKind::Exclusive),
                (Role::Waiter, 2, EntryKind::Exclusive),
            ],
            "{layout:?}"
        );
        assert_eq!(view.members()[0].entry().key(), first.key(), "{layout:?}");
        let listed = inspect::list(&backend, &name).await.unwrap();
        let mine: Vec<_> = listed.iter().filter(|v| v.name() == name).collect();
        assert_eq!(mine.len(), 1, "{layout:?}: {listed:?}");
        assert_eq!(mine[0].holders().count(), 1, "{layout:?}");
        assert_eq!(mine[0].waiters(), 2, "{layout:?}");

        first.release().await.unwrap();
        let second = within("the first waiter", Duration::from_secs(10), second)
            .await
            .unwrap()
            .unwrap();
        second.release().await.unwrap();
        let third = within("the second waiter", Duration::from_secs(10), third)
            .await
            .unwrap()
            .unwrap();
        third.release().await.unwrap();
    }
}

/// A queue holding nodes of the other layout is refused with a typed error, and the refused
/// contender leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_layout_in_a_queue_is_refused() {
    let name = test_name("foreign-layout");
    let kazoo = ZkBackend::connect(
        &ZkNode::shared().url(),
        ZkOptions::new().with_layout(ZkLayout::Kazoo),
    )
    .await
    .unwrap();
    let k = Session::new(kazoo.clone()).await.unwrap();
    let held = Mutex::new(&k, &name).unwrap().lock().await.unwrap();

    let curator = backend().await;
    let c = Session::new(curator.clone()).await.unwrap();
    let refused = Mutex::new(&c, &name).unwrap().lock().await;
    assert!(
        matches!(&refused, Err(Error::ForeignLayout { layout: "kazoo", node, .. }) if node == held.key()),
        "{refused:?}"
    );
    let listed = curator.entries(&name).await;
    assert!(
        matches!(listed, Err(Error::ForeignLayout { .. })),
        "{listed:?}"
    );
    c.settled().await;
    let children = raw(&ZkNode::shared().connect_string())
        .await
        .list_children(&format!("/{name}"))
        .await
        .unwrap();
    assert_eq!(children, [node_name(held.key())], "only the kazoo node");
    held.release().await.unwrap();
}

/// Names are relative to the chroot, and the leading `/` ZooKeeper users write is dropped,
/// once: `/name` and `name` are one lock, in process too (a `MultiLock` given both takes it
/// once instead of waiting on itself). (Before: `/name` was `InvalidArgument`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leading_slash_names_the_same_lock() {
    let name = test_name("slash");
    let backend = backend().await;
    let s = Session::new(backend.clone()).await.unwrap();
    let held = Mutex::new(&s, format!("/{name}"))
        .unwrap()
        .lock()
        .await
        .unwrap();
    assert!(
        held.key().starts_with(&format!("{name}/")),
        "{}",
        held.key()
    );
    let other = Session::new(backend.clone()).await.unwrap();
    let busy = Mutex::new(&other, &name).unwrap().try_lock().await;
    assert!(matches!(busy, Err(Error::Locked { .. })), "{busy:?}");
    held.release().await.unwrap();
    let both = baton::MultiLock::new(&s, [format!("/{name}"), name.clone()]).unwrap();
    assert_eq!(both.names().count(), 1);
    let guard = within("the lock, taken once", Duration::from_secs(10), both.lock())
        .await
        .unwrap();
    guard.release().await.unwrap();
}

/// Bad names are refused with `InvalidArgument` before anything is created: no node, not
/// even a parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_paths_are_refused_before_anything_is_created() {
    let base = test_name("bad-paths");
    let backend = backend().await;
    let s = Session::new(backend.clone()).await.unwrap();
    for name in [
        format!("{base}/a//b"),
        format!("{base}/a/"),
        // One leading `/` is dropped (see below); two leave an empty segment.
        format!("//{base}"),
        format!("{base}/./a"),
        format!("{base}/../a"),
        format!("{base}/a\u{1}"),
        "zookeeper/quota".to_owned(),
    ] {
        let lock = match Mutex::new(&s, &name) {
            Ok(mutex) => mutex.lock().await.map(drop),
            Err(e) => Err(e),
        };
        assert!(
            matches!(lock, Err(Error::InvalidArgument(_))),
            "{name:?}: {lock:?}"
        );
        let read = backend.entries(&name).await;
        assert!(
            matches!(read, Err(Error::InvalidArgument(_))),
            "{name:?}: {read:?}"
        );
    }
    s.settled().await;
    let client = raw(&ZkNode::shared().connect_string()).await;
    assert_eq!(client.check_stat(&format!("/{base}")).await.unwrap(), None);
}

/// After a create whose answer was lost, the entry is found by its protected prefix, and a
/// node of another session under that prefix is deleted, never adopted (CURATOR-604).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_prefix_never_adopts_another_sessions_node() {
    let queue = test_name("protected");
    let backend = backend().await;
    let s = Session::new(backend.clone()).await.unwrap();
    let lease = s.lease_id();
    let tag = lease.to_hex();
    let prefix = backend.tag_prefix(&queue, &tag);
    let other = raw(&ZkNode::shared().connect_string()).await;
    other
        .mkdir(
            &format!("/{queue}"),
            &CreateMode::Container.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let impostor = || async {
        let (_, seq) = other
            .create(
                &format!("/{queue}/{prefix}0000-000000000000-lock-"),
                b"impostor",
                &CreateMode::EphemeralSequential.with_acls(Acls::anyone_all()),
            )
            .await
            .unwrap();
        format!("/{queue}/{prefix}0000-000000000000-lock-{seq}")
    };

    // Looking for the entry after a lost answer: the other session's node is not ours.
    let path = impostor().await;
    assert_eq!(backend.find_entry(&queue, &tag).await.unwrap(), None);
    assert_eq!(other.check_stat(&path).await.unwrap(), None, "deleted");

    // Enqueueing: the same, and our own entry is the head.
    let path = impostor().await;
    let mine = backend.enqueue(&queue, &tag, lease, b"mine").await.unwrap();
    assert_eq!(mine.entry().lease(), Some(lease));
    assert!(node_name(mine.entry().key()).starts_with(&prefix));
    assert_eq!(other.check_stat(&path).await.unwrap(), None, "deleted");
    assert!(mine.is_head(), "the impostor was ahead, and is gone");

    // Our own node is found, and a second enqueue with the tag returns it (idempotent).
    assert_eq!(
        backend.find_entry(&queue, &tag).await.unwrap().as_ref(),
        Some(mine.entry())
    );
    let again = backend
        .enqueue(&queue, &tag, lease, b"again")
        .await
        .unwrap();
    assert_eq!(again.entry(), mine.entry());
    assert_eq!(
        backend.entries(&queue).await.unwrap(),
        [mine.entry().clone()]
    );
    assert!(backend.delete_entry(mine.entry()).await.unwrap());
}

/// A queue's parent is a container ZooKeeper may delete once it is empty: the next lock
/// creates it again (as a container), and guarded writes still land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reaped_parent_is_created_again() {
    let name = test_name("reaped/lock");
    let backend = backend().await;
    let s = Session::new(backend.clone()).await.unwrap();
    let client = raw(&ZkNode::shared().connect_string()).await;
    let first = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    let first_token = first.fencing_token();
    first.release().await.unwrap();
    // The container reaper's work, done at once: the queue node and its parent go.
    client.delete(&format!("/{name}"), None).await.unwrap();
    client
        .delete(&format!("/{}", test_name("reaped")), None)
        .await
        .unwrap();
    let second = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    assert!(second.fencing_token() > first_token);
    let stat = client
        .check_stat(&format!("/{name}"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stat.ephemeral_owner, 0, "a container, not an ephemeral");
    let data = test_name("reaped-data");
    second
        .write(&[baton::WriteOp::put(&data, "v")])
        .await
        .unwrap();
    assert_eq!(
        backend.read(&data).await.unwrap().as_deref(),
        Some(&b"v"[..])
    );
    second.release().await.unwrap();
}

/// `baton::connect("zk://...")` gives a ZooKeeper backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_takes_zk_urls() {
    let backend = baton::connect(&ZkNode::shared().url()).await.unwrap();
    let s = Session::with_options(backend, SessionOptions::default())
        .await
        .unwrap();
    let guard = Mutex::new(&s, test_name("connect"))
        .unwrap()
        .lock()
        .await
        .unwrap();
    guard.release().await.unwrap();
    let refused = baton::connect("zk://127.0.0.1:1").await;
    assert!(
        matches!(refused, Err(Error::Connect { .. })),
        "{:?}",
        refused.err()
    );
}

/// Cut off from the server, a holder's `lost()` fires before the server expires its session:
/// when it fires, the server still has the entry; the entry goes only later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_before_the_server_expires_the_session() {
    let name = test_name("lost-before-expiry");
    let node = ZkNode::shared();
    let proxy = support::proxy::Proxy::start(&node.connect_string()).await;
    let cut = ZkBackend::connect(
        &proxy.endpoint().replace("http://", "zk://"),
        ZkOptions::new(),
    )
    .await
    .unwrap();
    let outside = backend().await;
    let ttl = Duration::from_secs(2);
    let s = session_on(&cut, ttl).await;
    let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    let entry = guard.entry().clone();
    let expired = tokio::spawn({
        let outside = outside.clone();
        let entry = entry.clone();
        async move { outside.wait_gone(&entry).await }
    });
    proxy.black_hole();
    let reason = within("lost()", ttl * 3, guard.lost()).await;
    assert_eq!(reason, LostReason::Expired);
    assert!(
        !expired.is_finished(),
        "the server expired the session before the holder was told"
    );
    assert_eq!(outside.entries(&name).await.unwrap(), [entry]);
    within("the server's expiry", ttl * 5, expired)
        .await
        .unwrap()
        .unwrap();
    proxy.heal();
}

/// A waiter whose session expires while it waits gets an error, never the lock, and its node
/// is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_waiter_gets_an_error_and_its_node_goes() {
    let name = test_name("expired-waiter");
    let node = ZkNode::shared();
    let holder_backend = backend().await;
    let holder = Session::new(holder_backend.clone()).await.unwrap();
    let guard = Mutex::new(&holder, &name).unwrap().lock().await.unwrap();
    let proxy = support::proxy::Proxy::start(&node.connect_string()).await;
    let cut = ZkBackend::connect(
        &proxy.endpoint().replace("http://", "zk://"),
        ZkOptions::new(),
    )
    .await
    .unwrap();
    let s = session_on(&cut, Duration::from_secs(2)).await;
    let waiter = support::spawn_queued(&holder_backend, &s, &name, 2).await;
    proxy.black_hole();
    let result = within("the waiter's error", Duration::from_secs(10), waiter)
        .await
        .unwrap();
    assert!(
        matches!(result, Err(Error::SessionLost(_))),
        "{:?}",
        result.map(|g| g.key().to_owned())
    );
    eventually("the expired waiter's node is gone", || async {
        holder_backend.entries(&name).await.unwrap().len() == 1
    })
    .await;
    assert_eq!(
        holder_backend.entries(&name).await.unwrap()[0].key(),
        guard.key()
    );
    proxy.heal();
    guard.release().await.unwrap();
}

/// The next head an observer reports.
async fn next(
    heads: &mut futures::stream::BoxStream<'static, baton::Result<baton::HeadEvent>>,
) -> baton::HeadEvent {
    use futures::StreamExt;
    within("the next head", Duration::from_secs(30), heads.next())
        .await
        .expect("the stream never ends")
        .expect("no error")
}

/// An observer cut off while the head changes resumes by itself once the connection heals:
/// it says it may have missed heads (`Skipped`), then reports the current head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observer_resumes_after_a_reconnect() {
    use baton::HeadEvent;

    let name = test_name("observe-reconnect");
    let proxy = support::proxy::Proxy::start(&ZkNode::shared().connect_string()).await;
    let cut = ZkBackend::connect(
        &proxy.endpoint().replace("http://", "zk://"),
        ZkOptions::new(),
    )
    .await
    .unwrap();
    let direct = backend().await;
    let mut heads = cut.observe_head(&name);
    assert_eq!(next(&mut heads).await, HeadEvent::Head(None));
    let a = Session::new(direct.clone()).await.unwrap();
    let first = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    match next(&mut heads).await {
        HeadEvent::Head(Some(e)) => assert_eq!(e.key(), first.key()),
        other => panic!("expected the first holder, got {other:?}"),
    }

    proxy.black_hole();
    first.release().await.unwrap();
    let second = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    proxy.heal();

    let mut seen = Vec::new();
    loop {
        let event = next(&mut heads).await;
        if matches!(&event, HeadEvent::Head(Some(e)) if e.key() == second.key()) {
            break;
        }
        seen.push(event);
    }
    assert!(
        seen.contains(&HeadEvent::Skipped) || seen.contains(&HeadEvent::Head(None)),
        "the change while cut off is reported, as a gap or as the vacancy: {seen:?}"
    );
    second.release().await.unwrap();
    assert_eq!(next(&mut heads).await, HeadEvent::Head(None));
}

/// A write whose answer is lost on the wire (the request reached the server, the connection
/// stopped answering) is `OutcomeUnknown`, never a refusal, and was applied; a write that was
/// never sent (the read before it got no answer) is a plain error, and was not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answers_are_unknown_outcomes() {
    let name = test_name("lost-answers");
    let data = test_name("lost-answers-data");
    let proxy = support::proxy::Proxy::start(&ZkNode::shared().connect_string()).await;
    let cut = ZkBackend::connect(
        &proxy.endpoint().replace("http://", "zk://"),
        ZkOptions::new()
            .with_request_timeout(Duration::from_millis(500))
            .with_retry_for(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let direct = backend().await;
    let s = Session::new(direct.clone()).await.unwrap();
    let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    let entry = guard.entry().clone();
    // A client in use: it has read the store's epoch marker, which its first request does.
    cut.entries(&name).await.unwrap();

    proxy.drop_answers();
    // A delete is one request: sent at once (the connection still looks alive), applied, its
    // answer lost.
    let deleted = cut.delete_entry(&entry).await;
    assert!(
        matches!(deleted, Err(Error::OutcomeUnknown { .. })),
        "{deleted:?}"
    );
    assert!(direct.entries(&name).await.unwrap().is_empty(), "applied");
    // The write needs a read first (ZooKeeper has no "create or set"): that read's answer is
    // lost (or, once the client gives the silent connection up, it is never sent), so the
    // write is never sent, and the error says so.
    let write = cut
        .guarded(&entry, &[baton::WriteOp::put(&data, "v")])
        .await;
    assert!(matches!(write, Err(Error::Backend { .. })), "{write:?}");
    assert_eq!(direct.read(&data).await.unwrap(), None, "not applied");
    proxy.heal();
    // Once answers flow again, a definite answer: the entry is gone.
    assert!(!cut.delete_entry(&entry).await.unwrap());
    let unlocked = guard.release().await;
    assert!(
        matches!(unlocked, Err(Error::NotOwner { .. })),
        "{unlocked:?}"
    );
}

/// A delete whose answer is lost, retried once answers flow again, finds its entry gone while
/// the entry's session lives: on ZooKeeper only an explicit delete removes a live session's
/// node, so the delete is reported done, and a release is not "outcome unknown" (#38; before:
/// `OutcomeUnknown`, "the retry found the entry gone").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_whose_answer_was_lost_is_done_while_its_session_lives() {
    let name = test_name("lost-delete-answer");
    let proxy = support::proxy::Proxy::start(&ZkNode::shared().connect_string()).await;
    let cut = ZkBackend::connect(
        &proxy.endpoint().replace("http://", "zk://"),
        ZkOptions::new()
            .with_request_timeout(Duration::from_millis(500))
            .with_retry_for(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    let direct = backend().await;
    let s = Session::new(direct.clone()).await.unwrap();
    let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    let entry = guard.entry().clone();
    // A client in use: it has read the store's epoch marker, which its first request does.
    cut.entries(&name).await.unwrap();

    proxy.drop_answers();
    let deleting = tokio::spawn({
        let (cut, entry) = (cut.clone(), entry.clone());
        async move { cut.delete_entry(&entry).await }
    });
    // The delete reached the server and was applied; its answer is lost.
    within(
        "the delete applied",
        Duration::from_secs(10),
        direct.wait_gone(&entry),
    )
    .await
    .unwrap();
    proxy.heal();
    let deleted = within("the delete's retry", Duration::from_secs(40), deleting)
        .await
        .unwrap();
    assert!(matches!(deleted, Ok(true)), "{deleted:?}");
    drop(guard);
}

/// Locks share their session's connection: 20 locks held and 5 waiters, on two sessions,
/// take three ZooKeeper sessions in all (the backend's own and one per lease), as
/// docs/zookeeper.md says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_share_their_sessions_connection() {
    let node = ZkNode::start().await.expect("a ZooKeeper of its own");
    let backend = ZkBackend::connect(&node.url(), ZkOptions::new())
        .await
        .unwrap();
    let holder = Session::new(backend.clone()).await.unwrap();
    let waiters = Session::new(backend.clone()).await.unwrap();
    let mut guards = Vec::new();
    for i in 0..20 {
        let mutex = Mutex::new(&holder, format!("scale/{i}")).unwrap();
        guards.push(mutex.lock().await.unwrap());
    }
    let mut waiting = Vec::new();
    for i in 0..5 {
        waiting.push(support::spawn_queued(&backend, &waiters, &format!("scale/{i}"), 2).await);
    }
    let cons = node.four_letter("cons").await.unwrap();
    let sessions = cons.lines().filter(|l| l.contains("sid=0x")).count();
    assert_eq!(sessions, 3, "{cons}");
    for guard in guards {
        guard.release().await.unwrap();
    }
    for waiter in waiting {
        let guard = within("a waiter", Duration::from_secs(10), waiter)
            .await
            .unwrap()
            .unwrap();
        guard.release().await.unwrap();
    }
}

/// A leader change in a three-member ensemble: the holder's and the waiter's sessions move to
/// another member, the holder keeps the lock, the waiter gets it after the release, and its
/// token (czxid, whose high bits are the new epoch) is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_change_keeps_the_lock_and_the_token_order() {
    let zk = baton::testing::ZkEnsemble::start()
        .await
        .expect("a three-member ensemble");
    let leader = zk.wait_for_leader().await.unwrap();
    let backend = ZkBackend::connect(&zk.url(), ZkOptions::new())
        .await
        .unwrap();
    let ttl = Duration::from_secs(10);
    let a = session_on(&backend, ttl).await;
    let b = session_on(&backend, ttl).await;
    let name = "leader-change";
    let guard = Mutex::new(&a, name).unwrap().lock().await.unwrap();
    let first_token = guard.fencing_token();
    let waiter = support::spawn_queued(&backend, &b, name, 2).await;

    zk.stop_member(leader).await.unwrap();
    let next = zk.wait_for_leader().await.unwrap();
    assert_ne!(next, leader);
    assert!(
        !a.is_lost() && !waiter.is_finished(),
        "the lock is still held"
    );
    guard.release().await.unwrap();
    let second = within("the waiter's grant", Duration::from_secs(30), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(second.fencing_token() > first_token);
    second.release().await.unwrap();
}

/// A lock whose create answer is lost on the wire fails with `OutcomeUnknown`; once answers
/// flow again its cleanup finds the node by its protected prefix and deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_create_answer_is_found_and_cleaned_up() {
    let name = test_name("lost-create");
    let proxy = support::proxy::Proxy::start(&ZkNode::shared().connect_string()).await;
    let cut = ZkBackend::connect(
        &proxy.endpoint().replace("http://", "zk://"),
        ZkOptions::new()
            .with_request_timeout(Duration::from_millis(500))
            .with_retry_for(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let direct = backend().await;
    let s = session_on(&cut, Duration::from_secs(20)).await;
    // A holder, so that the queue node exists (a create under a missing parent is refused,
    // and nothing would be left to find).
    let other = Session::new(direct.clone()).await.unwrap();
    let holder = Mutex::new(&other, &name).unwrap().lock().await.unwrap();
    proxy.drop_answers();
    let failed = Mutex::new(&s, &name).unwrap().lock().await;
    assert!(
        matches!(failed, Err(Error::OutcomeUnknown { .. })),
        "{:?}",
        failed.map(|g| g.key().to_owned())
    );
    let created = direct.entries(&name).await.unwrap();
    assert_eq!(created.len(), 2, "the create was applied");
    assert_eq!(created[1].lease(), Some(s.lease_id()));
    proxy.heal();
    within("the cleanup", Duration::from_secs(30), s.settled()).await;
    assert_eq!(
        direct.entries(&name).await.unwrap(),
        [holder.entry().clone()]
    );
    assert!(!s.is_lost());
    holder.release().await.unwrap();
}

/// A session's fence node (`/_baton-sessions/<session>`, which every entry's create checks)
/// deleted from outside ends the session at its next renewal, and its nodes go with it:
/// without its fence, a create whose answer was lost could land after baton looked for it.
/// (Before the fence existed, a late create landed and blocked the queue.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_fence_is_deleted_ends_and_its_nodes_go() {
    let backend = backend().await;
    let name = test_name("fence-deleted");
    let s = session_on(&backend, Duration::from_secs(3)).await;
    let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    let operator = raw(&ZkNode::shared().connect_string()).await;
    let fence = format!("/_baton-sessions/{:016x}", s.lease_id().get());
    operator.delete(&fence, None).await.unwrap();
    within("the session ends", Duration::from_secs(5), s.lost()).await;
    let left = backend.entries(&name).await.unwrap();
    assert!(left.is_empty(), "the session's nodes outlived it: {left:?}");
    drop(guard);
}

/// A loopback proxy in front of the shared server that counts the requests clients send
/// through it, by ZooKeeper op code: every frame after a connection's first (the connect
/// request), pings (xid -2) left out. The same count as the server's `zk_packets_received`,
/// for this test's connections only (the server is shared by the tests of this binary).
struct CountingProxy {
    port: u16,
    counts: Arc<std::sync::Mutex<std::collections::BTreeMap<i32, u64>>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    async fn start(upstream: std::net::SocketAddr) -> CountingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let counts = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
        let accepting = tokio::spawn({
            let counts = Arc::clone(&counts);
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                        continue;
                    };
                    tokio::spawn(Self::forward(client, server, Arc::clone(&counts)));
                }
            }
        });
        CountingProxy {
            port,
            counts,
            accepting,
        }
    }

    async fn forward(
        client: tokio::net::TcpStream,
        server: tokio::net::TcpStream,
        counts: Arc<std::sync::Mutex<std::collections::BTreeMap<i32, u64>>>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client_rx, mut client_tx) = client.into_split();
        let (mut server_rx, mut server_tx) = server.into_split();
        let answers = tokio::spawn(async move {
            let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
        });
        let (mut pending, mut buf, mut first) = (Vec::new(), vec![0u8; 64 * 1024], true);
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            pending.extend_from_slice(&buf[..n]);
            while pending.len() >= 4 {
                let len = u32::from_be_bytes(pending[..4].try_into().unwrap()) as usize;
                if pending.len() < 4 + len {
                    break;
                }
                let frame: Vec<u8> = pending.drain(..4 + len).collect();
                if std::mem::take(&mut first) || len < 8 {
                    continue;
                }
                let xid = i32::from_be_bytes(frame[4..8].try_into().unwrap());
                let op = i32::from_be_bytes(frame[8..12].try_into().unwrap());
                if xid != -2 {
                    *counts.lock().unwrap().entry(op).or_default() += 1;
                }
            }
            if server_tx.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        answers.abort();
    }

    fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The requests counted since the last call, by op code, and in all.
    fn take(&self) -> (std::collections::BTreeMap<i32, u64>, u64) {
        let counts = std::mem::take(&mut *self.counts.lock().unwrap());
        let total = counts.values().sum();
        (counts, total)
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// docs/zookeeper.md: a contended lock cycle (enqueue behind the holder, wait, wake, release)
/// costs at most the 5 requests of Curator's `InterProcessMutex` (create, getChildren,
/// getData with a watch, getChildren after the wake, delete), and an uncontended one 3
/// (create, getChildren, delete). Counted on the wire, between the clients and the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contended_cycle_sends_no_more_requests_than_curators() {
    const CYCLES: u64 = 50;
    let name = test_name("requests-per-cycle");
    let upstream = ([127, 0, 0, 1], ZkNode::shared().port()).into();
    let proxy = CountingProxy::start(upstream).await;
    let counted = ZkBackend::connect(&proxy.connect_string(), ZkOptions::new())
        .await
        .unwrap();
    let observer = backend().await;
    // Long sessions: no renewal falls inside the counted cycles.
    let a = session_on(&counted, Duration::from_secs(120)).await;
    let b = session_on(&counted, Duration::from_secs(120)).await;
    // The first lock makes the queue's node and enters the store epoch: not counted.
    let first = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    first.release().await.unwrap();

    proxy.take();
    for _ in 0..CYCLES {
        let guard = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
        guard.release().await.unwrap();
    }
    let (by_op, total) = proxy.take();
    let uncontended = total as f64 / CYCLES as f64;

    let mut holder = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let sessions = [&b, &a];
    proxy.take();
    for i in 0..CYCLES {
        let next = sessions[(i % 2) as usize];
        let waiter = support::spawn_queued(&observer, next, &name, 2).await;
        // Released once the waiter watches the holder's node: a contended cycle, every time.
        let watched = format!("/{}\n", holder.key());
        eventually("the waiter watches the holder", || async {
            let watches = ZkNode::shared().four_letter("wchp").await.unwrap();
            watches.contains(&watched)
        })
        .await;
        holder.release().await.unwrap();
        holder = within("the waiter's grant", Duration::from_secs(10), waiter)
            .await
            .unwrap()
            .unwrap();
    }
    let (by_op_contended, total_contended) = proxy.take();
    holder.release().await.unwrap();
    let contended = total_contended as f64 / CYCLES as f64;
    println!(
        "requests per cycle: uncontended {uncontended} {by_op:?}, contended {contended} {by_op_contended:?}"
    );
    assert!(
        uncontended <= 3.0 && contended <= 5.0,
        "{uncontended} requests per uncontended cycle (by op code: {by_op:?}), \
         {contended} per contended cycle (by op code: {by_op_contended:?})"
    );
}

/// The token an enqueue answers with is the node's czxid (in the store epoch), as a later
/// read of the node finds it, and its lease the node's owner: also on servers that answer a
/// create inside a `multi` without its stat (ZOOKEEPER-4026, the fixture's 3.8), where the
/// enqueue takes them from the fence's setData in the same `multi` rather than reading the
/// node again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_enqueue_token_is_the_nodes_czxid() {
    let backend = backend().await;
    let name = test_name("token-is-czxid");
    let s = session_on(&backend, Duration::from_secs(20)).await;
    let operator = raw(&ZkNode::shared().connect_string()).await;
    for _ in 0..3 {
        let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
        let stat = operator
            .check_stat(&format!("/{}", guard.key()))
            .await
            .unwrap()
            .expect("the holder's node");
        let read = backend.entries(&name).await.unwrap();
        assert_eq!(read, [guard.entry().clone()], "as a read finds it");
        assert_eq!(guard.entry().position().get(), stat.czxid as u64);
        assert_eq!(guard.entry().lease(), Some(s.lease_id()));
        assert_eq!(stat.ephemeral_owner, s.lease_id().get());
        guard.release().await.unwrap();
    }
}

/// `baton init` on a store baton has never used (here: a chroot nobody used) marks it new,
/// through the `Backend` trait as the CLI calls it (its default, "nothing to mark", answered
/// before): the first lock is granted at once, not after the restart grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_marks_a_store_never_used_as_new() {
    let chroot = format!("/baton-init-{}", std::process::id());
    raw(&ZkNode::shared().connect_string())
        .await
        .create(
            &chroot,
            b"",
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let url = format!("{}{chroot}", ZkNode::shared().url());
    let connect = || {
        let options = ZkOptions::new().with_restart_grace(Duration::from_secs(60));
        ZkBackend::connect(&url, options)
    };
    support::init_marks_a_store_never_used_as_new(connect).await;
}
