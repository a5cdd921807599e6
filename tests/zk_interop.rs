//! baton beside the ZooKeeper lock recipes users already run: Apache Curator (Java) and kazoo
//! (Python), driven as real processes (`tests/peers/`, built by `scripts/install-peers.sh`)
//! on the same server and the same paths. With the matching [`ZkLayout`], a lock is shared
//! both ways (each excludes the other) and waiters of both are granted in one FIFO order.

#[path = "support/mod.rs"]
mod support;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use baton::testing::ZkNode;
use baton::{Backend, Election, Mutex, Session, ZkBackend, ZkLayout, ZkOptions};
use support::{eventually, spawn_queued, within};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// How long a peer may take to answer a command that should not block.
const ANSWER: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy)]
enum Kind {
    Curator,
    Kazoo,
}

impl Kind {
    fn launcher(self) -> String {
        let name = match self {
            Kind::Curator => "curator-peer",
            Kind::Kazoo => "kazoo-peer",
        };
        format!("{}/target/peers/{name}", env!("CARGO_MANIFEST_DIR"))
    }

    fn layout(self) -> ZkLayout {
        match self {
            Kind::Curator => ZkLayout::Curator,
            Kind::Kazoo => ZkLayout::Kazoo,
        }
    }
}

/// A peer process: commands go to its stdin, its reply lines arrive on `replies`.
struct Peer {
    _child: Child,
    stdin: ChildStdin,
    replies: mpsc::UnboundedReceiver<String>,
}

impl Peer {
    async fn start(kind: Kind, path: &str, recipe: &str, id: &str) -> Peer {
        let launcher = kind.launcher();
        assert!(
            std::path::Path::new(&launcher).exists(),
            "{launcher} is missing: run scripts/install-peers.sh (scripts/setup.sh does)"
        );
        let mut child = Command::new(&launcher)
            .args(["--connect", &ZkNode::shared().connect_string()])
            .args(["--path", path, "--recipe", recipe, "--id", id])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (tx, replies) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut peer = Peer {
            _child: child,
            stdin,
            replies,
        };
        assert_eq!(peer.reply().await, "ready");
        peer
    }

    async fn send(&mut self, command: &str) {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn reply(&mut self) -> String {
        within("a peer's answer", ANSWER, self.replies.recv())
            .await
            .expect("the peer exited")
    }

    async fn ask(&mut self, command: &str) -> String {
        self.send(command).await;
        self.reply().await
    }
}

async fn backend(layout: ZkLayout) -> Arc<ZkBackend> {
    let options = ZkOptions::new().with_layout(layout);
    Arc::new(
        ZkBackend::connect(&ZkNode::shared().connect_string(), options)
            .await
            .unwrap(),
    )
}

fn name(kind: Kind, test: &str) -> String {
    format!("interop-{}/{kind:?}/{test}", std::process::id())
}

async fn entries(backend: &ZkBackend, name: &str) -> usize {
    backend.entries(name).await.unwrap().len()
}

/// A lock held by baton keeps the peer out; held by the peer, it keeps baton out; each gets
/// it once the other releases.
async fn shared_both_ways(kind: Kind) {
    let backend = backend(kind.layout()).await;
    let name = name(kind, "both-ways");
    let session = Session::with_options(backend.clone(), Default::default())
        .await
        .unwrap();
    let mutex = Mutex::new(&session, name.clone()).unwrap();
    let mut peer = Peer::start(kind, &format!("/{name}"), "mutex", "peer").await;

    // baton holds: the peer queues behind and times out.
    let guard = mutex.lock().await.unwrap();
    assert_eq!(peer.ask("acquire 1000").await, "timeout");
    // Released, the peer gets it (its node is the only one left).
    guard.release().await.unwrap();
    let acquired = peer.ask("acquire").await;
    assert!(acquired.starts_with("acquired /"), "{acquired}");

    // The peer holds: baton queues behind it (its entry is second) and is not granted...
    let mut waiter = spawn_queued(backend.as_ref(), &session, &name, 2).await;
    assert!(
        tokio::time::timeout(Duration::from_secs(1), &mut waiter)
            .await
            .is_err(),
        "baton was granted a lock {kind:?} held"
    );
    // ...until the peer releases.
    assert_eq!(peer.ask("release").await, "released");
    let guard = within("baton's grant after the peer's release", ANSWER, waiter)
        .await
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
    assert_eq!(peer.ask("quit").await, "bye");
}

/// baton, then a peer, then baton, then a peer again queue on one lock: they are granted in
/// that order, one at a time.
async fn fifo_across_languages(kind: Kind) {
    let backend = backend(kind.layout()).await;
    let name = name(kind, "fifo");
    let path = format!("/{name}");
    let session = Session::with_options(backend.clone(), Default::default())
        .await
        .unwrap();
    let first = Mutex::new(&session, name.clone())
        .unwrap()
        .lock()
        .await
        .unwrap();

    let mut p1 = Peer::start(kind, &path, "mutex", "p1").await;
    p1.send("acquire").await;
    eventually("p1 queued", || async {
        entries(&backend, &name).await == 2
    })
    .await;
    // Another session: a second lock of one session on one name would find its first entry.
    let other = Session::with_options(backend.clone(), Default::default())
        .await
        .unwrap();
    let b2 = spawn_queued(backend.as_ref(), &other, &name, 3).await;
    let mut p3 = Peer::start(kind, &path, "mutex", "p3").await;
    p3.send("acquire").await;
    eventually("p3 queued", || async {
        entries(&backend, &name).await == 4
    })
    .await;

    first.release().await.unwrap();
    let granted = p1.reply().await;
    assert!(granted.starts_with("acquired /"), "{granted}");
    let mut b2 = b2;
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut b2)
            .await
            .is_err(),
        "baton's waiter granted while p1 holds"
    );
    assert_eq!(p1.ask("release").await, "released");
    let b2 = within("baton's waiter granted after p1", ANSWER, b2)
        .await
        .unwrap()
        .unwrap();
    b2.release().await.unwrap();
    let granted = p3.reply().await;
    assert!(granted.starts_with("acquired /"), "{granted}");
    assert_eq!(p3.ask("release").await, "released");
}

/// A leader elected by baton keeps the peer's election (see tests/peers/README.md for the
/// classes) waiting; once baton resigns, the peer leads.
async fn election_shared(kind: Kind) {
    let backend = backend(kind.layout()).await;
    let name = name(kind, "election");
    let session = Session::with_options(backend.clone(), Default::default())
        .await
        .unwrap();
    let election = Election::new(&session, name.clone()).unwrap();
    let leader = election.campaign("baton").await.unwrap();
    let mut peer = Peer::start(kind, &format!("/{name}"), "election", "peer").await;
    assert_eq!(peer.ask("acquire 1000").await, "timeout");
    leader.release().await.unwrap();
    let acquired = peer.ask("acquire").await;
    assert!(acquired.starts_with("acquired"), "{acquired}");
    assert_eq!(peer.ask("release").await, "released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_shared_both_ways_with_curator() {
    shared_both_ways(Kind::Curator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_shared_both_ways_with_kazoo() {
    shared_both_ways(Kind::Kazoo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_baton_and_curator_are_granted_in_fifo_order() {
    fifo_across_languages(Kind::Curator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_baton_and_kazoo_are_granted_in_fifo_order() {
    fifo_across_languages(Kind::Kazoo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_is_shared_with_curator() {
    election_shared(Kind::Curator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_is_shared_with_kazoo() {
    election_shared(Kind::Kazoo).await;
}
