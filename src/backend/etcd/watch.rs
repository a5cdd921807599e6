//! One multiplexed watch stream per [`EtcdBackend`](super::EtcdBackend), with watches kept
//! on recently waited keys.
//!
//! Every deletion wait of the backend goes through one driver task and one gRPC watch
//! stream. A watch on a key stays open for [`LINGER`] after its last waiter is done: in a
//! FIFO queue a contender's predecessor is usually the same key from one cycle to the next,
//! so the next wait finds its watch already registered and synced on the server. That keeps
//! handoffs off etcd's catch-up loop for newly created watches (up to 100 ms).
//!
//! The driver talks to etcd through [`Transport`], a seam of three calls (open a stream with
//! a first watch, add a watch, cancel one), so that its bookkeeping is tested against
//! scripted streams that break exactly where a test wants.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions, WatchRequestSender};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::members::Members;
use crate::error::BoxError;

/// How long a watch is kept after its last waiter finished.
pub(crate) const LINGER: Duration = Duration::from_secs(30);

/// Why a registered wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fired {
    /// The incarnation waited for was deleted (or replaced).
    Gone,
    /// The watch was lost (stream broken, watch canceled): read again and wait again.
    Recheck,
}

/// What a confirmed watch is known to cover.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Coverage {
    /// The watch has reported (to this driver) every deletion of an incarnation created
    /// after this revision; `None` if that is not known (then the waiter must read).
    pub(crate) since: Option<i64>,
}

/// A wait registered with the driver.
pub(crate) struct Registration {
    /// Resolves once the server confirmed the watch (existing or new) and the waiter is
    /// registered: every event after this is delivered to `fired`.
    pub(crate) ready: oneshot::Receiver<Coverage>,
    pub(crate) fired: oneshot::Receiver<Fired>,
}

/// One response of the watch stream, reduced to what the driver reads.
#[derive(Debug, Clone, Default)]
pub(crate) struct Msg {
    pub(crate) watch_id: i64,
    pub(crate) created: bool,
    pub(crate) canceled: bool,
    /// The header's revision.
    pub(crate) revision: Option<i64>,
    pub(crate) changes: Vec<Change>,
}

/// One event of a watched key.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Change {
    /// Deleted at this revision (`None`: not known).
    Deleted(Option<i64>),
    /// A new incarnation, created at this revision.
    Created(i64),
}

impl From<etcd_client::WatchResponse> for Msg {
    fn from(resp: etcd_client::WatchResponse) -> Msg {
        let changes = resp
            .events()
            .iter()
            .filter_map(|ev| match ev.event_type() {
                EventType::Delete => Some(Change::Deleted(
                    ev.kv().map(|kv| kv.mod_revision()).filter(|&r| r > 0),
                )),
                EventType::Put => ev.kv().map(|kv| Change::Created(kv.create_revision())),
            })
            .collect();
        Msg {
            watch_id: resp.watch_id(),
            created: resp.created(),
            canceled: resp.canceled(),
            revision: resp.header().map(|h| h.revision()),
            changes,
        }
    }
}

/// The responses of one watch stream.
pub(crate) type Responses = BoxStream<'static, Result<Msg, BoxError>>;

/// How the driver reaches the server.
pub(crate) trait Transport: Clone + Send + Sync + 'static {
    /// Adds watches to, and cancels watches of, an open stream.
    type Sender: RequestSender;

    /// Opens a new stream whose first watch is `key`, with client-chosen id `watch_id`.
    fn open(
        &mut self,
        key: &[u8],
        watch_id: i64,
    ) -> impl Future<Output = Result<(Self::Sender, Responses), BoxError>> + Send;
}

/// The request half of an open stream.
pub(crate) trait RequestSender: Send + 'static {
    /// Adds a watch on `key` to the stream. An error means the stream is broken.
    fn watch(
        &mut self,
        key: &[u8],
        watch_id: i64,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;

    /// Cancels a watch of the stream. An error means the stream is broken.
    fn cancel(&mut self, watch_id: i64) -> impl Future<Output = Result<(), BoxError>> + Send;
}

/// The watches the driver asks etcd for: deletions only, so that a kept watch is not woken
/// (and costs no event) when its key is created again for the next cycle; no previous values,
/// because the deletion's revision tells what ended and fetching the previous value is a read
/// on the server between the deletion and its event, on every handoff.
fn watch_options(watch_id: i64) -> WatchOptions {
    WatchOptions::new()
        .with_filters([WatchFilterType::NoPut])
        .with_watch_id(watch_id)
}

/// The real transport: etcd-client's bidirectional watch stream.
#[derive(Clone)]
pub(crate) struct EtcdTransport {
    /// The balanced client: every request with a single endpoint, and
    /// [`EtcdBackend::client`](super::EtcdBackend::client).
    pub(crate) client: Client,
    /// With several endpoints, the member each stream goes to (see `members`).
    pub(super) members: Option<Arc<Members>>,
    /// How long opening a stream may take on the balanced client (a member's is bounded by
    /// `members`).
    pub(crate) open_within: Duration,
}

impl EtcdTransport {
    /// The member the next stream goes to, in turn (see `members`); `None` with a single
    /// endpoint (the balanced client).
    pub(crate) fn pick(&self) -> Option<usize> {
        self.members.as_ref().map(|m| m.pick())
    }

    /// `ask`'s answer from `member` (from [`pick`](Self::pick)) within the request timeout:
    /// a member that does not answer or cannot serve is passed over.
    ///
    /// # Cancel safety
    /// Cancel safe if `ask` is: an unanswered request is dropped.
    pub(crate) async fn ask<T, Fut>(
        &self,
        member: Option<usize>,
        ask: impl FnOnce(Client) -> Fut,
    ) -> Result<T, BoxError>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        match (&self.members, member) {
            (Some(members), Some(i)) => Ok(members.ask(i, ask).await?),
            _ => tokio::time::timeout(self.open_within, ask(self.client.clone()))
                .await
                .map_err(|_| format!("no answer within {:?}", self.open_within))?
                .map_err(BoxError::from),
        }
    }

    /// A stream opened on `member` broke with `error`: if that says the member cannot serve
    /// (it stopped answering its pings, it is unreachable or shutting down), the member is
    /// passed over, so that the stream opened next goes elsewhere.
    pub(crate) fn broke(&self, member: Option<usize>, error: &etcd_client::Error) {
        if let (Some(members), Some(i)) = (&self.members, member)
            && super::tonic_code::member_unfit(error)
        {
            members.failed(i);
        }
    }
}

impl Transport for EtcdTransport {
    type Sender = WatchRequestSender;

    async fn open(
        &mut self,
        key: &[u8],
        watch_id: i64,
    ) -> Result<(WatchRequestSender, Responses), BoxError> {
        let member = self.pick();
        let stream = self
            .ask(member, |mut c| async move {
                c.watch(key, Some(watch_options(watch_id))).await
            })
            .await?;
        let (sender, responses) = stream.split();
        let transport = self.clone();
        let responses = responses.map(move |r| {
            if let Err(e) = &r {
                transport.broke(member, e);
            }
            r.map(Msg::from).map_err(BoxError::from)
        });
        Ok((sender, responses.boxed()))
    }
}

impl RequestSender for WatchRequestSender {
    async fn watch(&mut self, key: &[u8], watch_id: i64) -> Result<(), BoxError> {
        Ok(WatchRequestSender::watch(self, key, Some(watch_options(watch_id))).await?)
    }

    async fn cancel(&mut self, watch_id: i64) -> Result<(), BoxError> {
        Ok(WatchRequestSender::cancel(self, watch_id).await?)
    }
}

struct Cmd {
    key: Arc<[u8]>,
    create_revision: i64,
    ready: oneshot::Sender<Coverage>,
    fired: oneshot::Sender<Fired>,
}

/// The handle the backend keeps; the driver is (re)started on first use.
pub(crate) struct WatchHub<T: Transport> {
    transport: T,
    /// Requests sent, shared with the backend's counter (each watch creation counts).
    counter: Arc<AtomicU64>,
    tx: StdMutex<Option<mpsc::UnboundedSender<Cmd>>>,
}

impl<T: Transport> std::fmt::Debug for WatchHub<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchHub").finish_non_exhaustive()
    }
}

impl<T: Transport> WatchHub<T> {
    pub(crate) fn new(transport: T, counter: Arc<AtomicU64>) -> Self {
        WatchHub {
            transport,
            counter,
            tx: StdMutex::new(None),
        }
    }

    /// Registers interest in the deletion of `key` at `create_revision`.
    pub(crate) fn register(&self, key: &[u8], create_revision: i64) -> Registration {
        let (ready_tx, ready) = oneshot::channel();
        let (fired_tx, fired) = oneshot::channel();
        let mut cmd = Cmd {
            key: key.into(),
            create_revision,
            ready: ready_tx,
            fired: fired_tx,
        };
        let mut tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        // The driver may have ended with the runtime that ran it: start a new one.
        for _ in 0..2 {
            if let Some(sender) = tx.as_ref() {
                match sender.send(cmd) {
                    Ok(()) => break,
                    Err(mpsc::error::SendError(back)) => cmd = back,
                }
            }
            let (sender, rx) = mpsc::unbounded_channel();
            let driver = Driver::new(self.transport.clone(), Arc::clone(&self.counter));
            tokio::spawn(driver.run(rx));
            *tx = Some(sender);
        }
        Registration { ready, fired }
    }
}

struct KeyWatch {
    id: i64,
    created: bool,
    /// The revision the server reported when it created the watch: deletions of
    /// incarnations created after it are all seen here.
    created_revision: Option<i64>,
    /// Every incarnation created at or before this revision is gone: this watch reported
    /// a deletion (or a new incarnation) after it. A key's incarnations are created in
    /// increasing order and a deletion ends whichever one exists, so a deletion at revision
    /// `r` ends every incarnation created before `r`.
    last_ended: i64,
    /// A deletion came without its revision: what it ended is unknown.
    uncertain: bool,
    pending_ready: Vec<oneshot::Sender<Coverage>>,
    waiters: Vec<(i64, oneshot::Sender<Fired>)>,
    idle_since: Option<Instant>,
}

impl KeyWatch {
    fn coverage(&self) -> Coverage {
        Coverage {
            since: if self.uncertain {
                None
            } else {
                self.created_revision
            },
        }
    }

    /// Fires the waiters of every incarnation up to `create` (inclusive): they are gone.
    fn ended(&mut self, create: i64) {
        self.last_ended = self.last_ended.max(create);
        let mut kept = Vec::with_capacity(self.waiters.len());
        for (c, tx) in self.waiters.drain(..) {
            if c <= create {
                let _ = tx.send(Fired::Gone);
            } else {
                kept.push((c, tx));
            }
        }
        self.waiters = kept;
    }
}

/// What a command or a sweep did to the stream.
enum StreamChange {
    Unchanged,
    /// A new stream was opened: read its responses from now on.
    Opened(Responses),
    /// The stream broke: stop reading it (every watch on it was reset).
    Broken,
}

struct Driver<T: Transport> {
    transport: T,
    counter: Arc<AtomicU64>,
    /// The open stream's request half. When it is `None`, no watch is registered: every
    /// path that drops it also forgets every watch (see [`Driver::reset`]).
    sender: Option<T::Sender>,
    next_id: i64,
    /// One key name, shared by both maps: there is an entry per waiter at scale.
    keys: HashMap<Arc<[u8]>, KeyWatch>,
    by_id: HashMap<i64, Arc<[u8]>>,
}

impl<T: Transport> Driver<T> {
    fn new(transport: T, counter: Arc<AtomicU64>) -> Self {
        Driver {
            transport,
            counter,
            sender: None,
            next_id: 1,
            keys: HashMap::new(),
            by_id: HashMap::new(),
        }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Cmd>) {
        let mut responses: Option<Responses> = None;
        let mut sweep = tokio::time::interval(LINGER / 3);
        loop {
            let change = tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(cmd) => self.handle(cmd).await,
                    None => return,
                },
                msg = async { responses.as_mut()?.next().await }, if responses.is_some() => match msg {
                    Some(Ok(msg)) => {
                        self.on_response(msg);
                        StreamChange::Unchanged
                    }
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "watch stream broke; waiters re-read");
                        self.reset();
                        StreamChange::Broken
                    }
                    None => {
                        self.reset();
                        StreamChange::Broken
                    }
                },
                _ = sweep.tick() => self.sweep().await,
            };
            match change {
                StreamChange::Unchanged => {}
                StreamChange::Opened(stream) => responses = Some(stream),
                StreamChange::Broken => responses = None,
            }
        }
    }

    /// Registers a waiter; opens the stream if needed.
    async fn handle(&mut self, cmd: Cmd) -> StreamChange {
        if let Some(w) = self.keys.get_mut(&cmd.key) {
            w.waiters.retain(|(_, tx)| !tx.is_closed());
            w.idle_since = None;
            if cmd.create_revision <= w.last_ended {
                // This watch already saw that incarnation go.
                let _ = cmd.fired.send(Fired::Gone);
            } else {
                w.waiters.push((cmd.create_revision, cmd.fired));
            }
            if w.created {
                let _ = cmd.ready.send(w.coverage());
            } else {
                w.pending_ready.push(cmd.ready);
            }
            return StreamChange::Unchanged;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.counter.fetch_add(1, Ordering::Relaxed);
        let change = match self.sender.as_mut() {
            Some(sender) => match sender.watch(&cmd.key, id).await {
                Ok(()) => StreamChange::Unchanged,
                Err(e) => {
                    // The stream is broken, whether or not its end has been read yet: every
                    // watch on it is gone. Left marked as created, those watches would tell
                    // later waiters that they are covered, and nothing would ever fire them.
                    tracing::debug!(error = %e, "watch stream broke on send; waiters re-read");
                    self.reset();
                    // Dropping `ready` tells the waiter to back off and try again.
                    let _ = cmd.fired.send(Fired::Recheck);
                    return StreamChange::Broken;
                }
            },
            None => match self.transport.open(&cmd.key, id).await {
                Ok((sender, responses)) => {
                    self.sender = Some(sender);
                    StreamChange::Opened(responses)
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot open the watch stream");
                    let _ = cmd.fired.send(Fired::Recheck);
                    return StreamChange::Unchanged;
                }
            },
        };
        self.by_id.insert(id, Arc::clone(&cmd.key));
        self.keys.insert(
            cmd.key,
            KeyWatch {
                id,
                created: false,
                created_revision: None,
                last_ended: 0,
                uncertain: false,
                pending_ready: vec![cmd.ready],
                waiters: vec![(cmd.create_revision, cmd.fired)],
                idle_since: None,
            },
        );
        change
    }

    fn on_response(&mut self, msg: Msg) {
        let Some(key) = self.by_id.get(&msg.watch_id).cloned() else {
            return;
        };
        if msg.canceled {
            // Canceled by the server (a compaction it cannot catch the watch up across, or a
            // refusal): whoever waits reads again and watches anew.
            self.by_id.remove(&msg.watch_id);
            if let Some(w) = self.keys.remove(&key) {
                for (_, tx) in w.waiters {
                    let _ = tx.send(Fired::Recheck);
                }
            }
            return;
        }
        let Some(w) = self.keys.get_mut(&key) else {
            return;
        };
        if msg.created {
            w.created = true;
            w.created_revision = msg.revision;
            let coverage = w.coverage();
            // Taken, not drained: an idle kept watch should hold no buffer.
            for ready in std::mem::take(&mut w.pending_ready) {
                let _ = ready.send(coverage);
            }
        }
        for change in msg.changes {
            match change {
                Change::Deleted(Some(deleted_at)) => w.ended(deleted_at - 1),
                Change::Deleted(None) => {
                    // What ended is unknown: everyone reads again.
                    w.uncertain = true;
                    for (_, tx) in w.waiters.drain(..) {
                        let _ = tx.send(Fired::Recheck);
                    }
                }
                // Filtered out on the server; a new incarnation would end the older ones.
                Change::Created(create_revision) => w.ended(create_revision - 1),
            }
        }
        if w.waiters.is_empty() && w.idle_since.is_none() {
            w.idle_since = Some(Instant::now());
        }
    }

    /// The stream is gone, and every watch on it: waiters read again and re-register.
    fn reset(&mut self) {
        self.sender = None;
        self.by_id.clear();
        for (_, w) in self.keys.drain() {
            for (_, tx) in w.waiters {
                let _ = tx.send(Fired::Recheck);
            }
        }
    }

    /// Cancels watches that nobody waited on for [`LINGER`].
    async fn sweep(&mut self) -> StreamChange {
        let now = Instant::now();
        let mut expired = Vec::new();
        for (key, w) in &mut self.keys {
            w.waiters.retain(|(_, tx)| !tx.is_closed());
            match (w.waiters.is_empty(), w.idle_since) {
                (false, _) => w.idle_since = None,
                (true, None) => w.idle_since = Some(now),
                (true, Some(since)) if now - since >= LINGER && w.created => {
                    expired.push(key.clone())
                }
                _ => {}
            }
        }
        for key in expired {
            let Some(w) = self.keys.remove(&key) else {
                continue;
            };
            self.by_id.remove(&w.id);
            if let Some(sender) = self.sender.as_mut()
                && sender.cancel(w.id).await.is_err()
            {
                self.reset();
                return StreamChange::Broken;
            }
        }
        StreamChange::Unchanged
    }
}

#[cfg(test)]
mod tests {
    //! The driver against scripted streams: each stream is a channel of responses the test
    //! feeds, and a request half the test can break.
    use std::sync::atomic::AtomicBool;

    use super::*;

    /// The watch requests a fake stream received: (key, watch id).
    type Requests = Arc<StdMutex<Vec<(Vec<u8>, i64)>>>;

    /// One stream the fake opened: the watch requests it received, a switch that makes its
    /// sends fail (as on a broken connection) and the sender of its responses.
    struct FakeStream {
        requests: Requests,
        broken: Arc<AtomicBool>,
        responses: mpsc::UnboundedSender<Result<Msg, BoxError>>,
    }

    #[derive(Clone, Default)]
    struct Fake {
        streams: Arc<StdMutex<Vec<FakeStream>>>,
    }

    struct FakeSender {
        requests: Requests,
        broken: Arc<AtomicBool>,
    }

    impl Transport for Fake {
        type Sender = FakeSender;

        async fn open(
            &mut self,
            key: &[u8],
            watch_id: i64,
        ) -> Result<(FakeSender, Responses), BoxError> {
            let (tx, rx) = mpsc::unbounded_channel();
            let requests = Arc::new(StdMutex::new(vec![(key.to_vec(), watch_id)]));
            let broken = Arc::new(AtomicBool::new(false));
            self.streams.lock().unwrap().push(FakeStream {
                requests: Arc::clone(&requests),
                broken: Arc::clone(&broken),
                responses: tx,
            });
            let responses =
                futures::stream::unfold(
                    rx,
                    |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
                );
            Ok((FakeSender { requests, broken }, responses.boxed()))
        }
    }

    impl RequestSender for FakeSender {
        async fn watch(&mut self, key: &[u8], watch_id: i64) -> Result<(), BoxError> {
            if self.broken.load(Ordering::SeqCst) {
                return Err("stream broken".into());
            }
            self.requests.lock().unwrap().push((key.to_vec(), watch_id));
            Ok(())
        }

        async fn cancel(&mut self, _watch_id: i64) -> Result<(), BoxError> {
            if self.broken.load(Ordering::SeqCst) {
                return Err("stream broken".into());
            }
            Ok(())
        }
    }

    impl Fake {
        fn stream(&self, i: usize) -> (Vec<(Vec<u8>, i64)>, Arc<AtomicBool>) {
            let streams = self.streams.lock().unwrap();
            let s = &streams[i];
            (s.requests.lock().unwrap().clone(), Arc::clone(&s.broken))
        }

        fn respond(&self, stream: usize, msg: Msg) {
            let streams = self.streams.lock().unwrap();
            streams[stream].responses.send(Ok(msg)).unwrap();
        }

        fn opened(&self) -> usize {
            self.streams.lock().unwrap().len()
        }
    }

    fn created(watch_id: i64, revision: i64) -> Msg {
        Msg {
            watch_id,
            created: true,
            revision: Some(revision),
            ..Msg::default()
        }
    }

    /// Bounds a wait the test expects to end: a wait that never wakes is the bug these tests
    /// look for, and must fail the test rather than hang it.
    async fn bounded<T>(what: &str, fut: impl Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(60), fut)
            .await
            .unwrap_or_else(|_| panic!("{what}: never happened"))
    }

    /// Lets the driver task run until it has nothing left to do.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// Regression: a send that fails on the open stream means that stream is broken. Every
    /// watch on it must be forgotten and its waiters told to re-read, even if the stream's end
    /// has not been read yet and another stream is opened meanwhile. Before, the old watches
    /// stayed marked as created; a later wait on one of those keys was told it was covered,
    /// skipped its existence read, and waited on a watch that no longer existed.
    #[tokio::test(start_paused = true)]
    async fn a_failed_send_ends_every_watch_of_its_stream() {
        let fake = Fake::default();
        let hub = WatchHub::new(fake.clone(), Arc::default());

        let first = hub.register(b"q/a", 5);
        settle().await;
        assert_eq!(fake.opened(), 1);
        fake.respond(0, created(1, 10));
        let coverage = bounded("first ready", first.ready)
            .await
            .expect("confirmed");
        assert_eq!(coverage.since, Some(10));

        // The connection breaks; the driver learns it from a failed send, before it reads
        // the end of the response stream (which here never comes).
        let (_, broken) = fake.stream(0);
        broken.store(true, Ordering::SeqCst);
        let failed = hub.register(b"q/b", 6);
        assert!(
            bounded("failed ready", failed.ready).await.is_err(),
            "told to back off and retry"
        );
        assert_eq!(
            bounded("failed fired", failed.fired).await,
            Ok(Fired::Recheck)
        );
        assert_eq!(
            bounded("the first wait ends", first.fired).await,
            Ok(Fired::Recheck),
            "the wait on the broken stream must re-read"
        );

        // A new wait on the same key opens a new stream and is not covered until that
        // stream confirms its own watch.
        let mut again = hub.register(b"q/a", 11);
        settle().await;
        assert_eq!(fake.opened(), 2, "a new stream for the new wait");
        let (requests, _) = fake.stream(1);
        assert_eq!(requests.len(), 1);
        assert_eq!(requests[0].0, b"q/a");
        assert!(
            again.ready.try_recv().is_err(),
            "not confirmed before the new stream says so"
        );
        fake.respond(1, created(requests[0].1, 12));
        assert_eq!(
            bounded("again ready", again.ready)
                .await
                .expect("confirmed")
                .since,
            Some(12)
        );
    }

    /// A watch the server cancels (a compaction it cannot catch the watch up across) sends
    /// its waiters back to read; other watches on the stream go on.
    #[tokio::test(start_paused = true)]
    async fn a_canceled_watch_sends_its_waiters_to_read() {
        let fake = Fake::default();
        let hub = WatchHub::new(fake.clone(), Arc::default());
        let a = hub.register(b"q/a", 5);
        let b = hub.register(b"q/b", 6);
        settle().await;
        let (requests, _) = fake.stream(0);
        let (id_a, id_b) = (requests[0].1, requests[1].1);
        fake.respond(0, created(id_a, 10));
        fake.respond(0, created(id_b, 10));
        bounded("a ready", a.ready).await.unwrap();
        bounded("b ready", b.ready).await.unwrap();
        fake.respond(
            0,
            Msg {
                watch_id: id_a,
                canceled: true,
                ..Msg::default()
            },
        );
        assert_eq!(bounded("a fired", a.fired).await, Ok(Fired::Recheck));
        fake.respond(
            0,
            Msg {
                watch_id: id_b,
                changes: vec![Change::Deleted(Some(20))],
                ..Msg::default()
            },
        );
        assert_eq!(bounded("b fired", b.fired).await, Ok(Fired::Gone));
    }

    /// A deletion ends the incarnations created before it, not a newer one.
    #[tokio::test(start_paused = true)]
    async fn a_deletion_ends_only_older_incarnations() {
        let fake = Fake::default();
        let hub = WatchHub::new(fake.clone(), Arc::default());
        let old = hub.register(b"q/a", 5);
        let new = hub.register(b"q/a", 30);
        settle().await;
        let (requests, _) = fake.stream(0);
        assert_eq!(requests.len(), 1, "one watch per key");
        fake.respond(
            0,
            Msg {
                watch_id: requests[0].1,
                created: true,
                revision: Some(10),
                changes: vec![Change::Deleted(Some(20))],
                ..Msg::default()
            },
        );
        assert_eq!(bounded("old fired", old.fired).await, Ok(Fired::Gone));
        let mut new = new;
        settle().await;
        assert!(new.fired.try_recv().is_err(), "created after the deletion");
    }
}
