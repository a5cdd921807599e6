//! One multiplexed watch stream per [`EtcdBackend`](super::EtcdBackend), with watches kept
//! on recently waited keys.
//!
//! Every deletion wait of the backend goes through one driver task and one gRPC watch
//! stream. A watch on a key stays open for [`LINGER`] after its last waiter is done: in a
//! FIFO queue a contender's predecessor is usually the same key from one cycle to the next,
//! so the next wait finds its watch already registered and synced on the server. That keeps
//! handoffs off etcd's catch-up loop for newly created watches (up to 100 ms).

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use etcd_client::{
    Client, EventType, WatchFilterType, WatchOptions, WatchRequestSender, WatchResponseStream,
};
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

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

struct Cmd {
    key: String,
    create_revision: i64,
    ready: oneshot::Sender<Coverage>,
    fired: oneshot::Sender<Fired>,
}

/// The handle the backend keeps; the driver is (re)started on first use.
#[derive(Debug, Default)]
pub(crate) struct WatchHub {
    tx: StdMutex<Option<mpsc::UnboundedSender<Cmd>>>,
}

impl WatchHub {
    /// Registers interest in the deletion of `key` at `create_revision`.
    pub(crate) fn register(
        &self,
        client: &Client,
        key: &str,
        create_revision: i64,
        counter: Arc<std::sync::atomic::AtomicU64>,
    ) -> Registration {
        let (ready_tx, ready) = oneshot::channel();
        let (fired_tx, fired) = oneshot::channel();
        let mut cmd = Cmd {
            key: key.to_owned(),
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
            tokio::spawn(Driver::new(client.clone(), counter.clone()).run(rx));
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

struct Driver {
    client: Client,
    counter: Arc<std::sync::atomic::AtomicU64>,
    sender: Option<WatchRequestSender>,
    next_id: i64,
    /// One key name, shared by both maps: there is an entry per waiter at scale.
    keys: HashMap<Arc<str>, KeyWatch>,
    by_id: HashMap<i64, Arc<str>>,
}

impl Driver {
    fn new(client: Client, counter: Arc<std::sync::atomic::AtomicU64>) -> Self {
        Driver {
            client,
            counter,
            sender: None,
            next_id: 1,
            keys: HashMap::new(),
            by_id: HashMap::new(),
        }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Cmd>) {
        let mut responses: Option<WatchResponseStream> = None;
        let mut sweep = tokio::time::interval(LINGER / 3);
        loop {
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(cmd) => {
                        if let Some(stream) = self.handle(cmd).await {
                            responses = Some(stream);
                        }
                    }
                    None => return,
                },
                msg = async { responses.as_mut()?.next().await }, if responses.is_some() => match msg {
                    Some(Ok(resp)) => self.on_response(resp),
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "watch stream broke; waiters re-read");
                        responses = None;
                        self.reset();
                    }
                    None => {
                        responses = None;
                        self.reset();
                    }
                },
                _ = sweep.tick() => self.sweep().await,
            }
        }
    }

    /// Registers a waiter; opens the stream if needed (returned to the caller's loop).
    async fn handle(&mut self, cmd: Cmd) -> Option<WatchResponseStream> {
        if let Some(w) = self.keys.get_mut(cmd.key.as_str()) {
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
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        // Deletions only: a kept watch must not be woken (or cost an event) when the key
        // is created again for the next cycle. No previous values: the deletion's revision
        // tells what ended, and fetching the previous value is a read on the server between
        // the deletion and its event, on every handoff.
        let options = WatchOptions::new()
            .with_filters([WatchFilterType::NoPut])
            .with_watch_id(id);
        self.counter
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut opened = None;
        let sent = match self.sender.as_mut() {
            Some(sender) => sender.watch(cmd.key.as_str(), Some(options)).await.is_ok(),
            None => match self.client.watch(cmd.key.as_str(), Some(options)).await {
                Ok(stream) => {
                    let (sender, responses) = stream.split();
                    self.sender = Some(sender);
                    opened = Some(responses);
                    true
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot open the watch stream");
                    false
                }
            },
        };
        if !sent {
            // Dropping `ready` tells the waiter to back off and try again.
            self.sender = None;
            let _ = cmd.fired.send(Fired::Recheck);
            return opened;
        }
        let key: Arc<str> = cmd.key.into();
        self.by_id.insert(id, Arc::clone(&key));
        self.keys.insert(
            key,
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
        opened
    }

    fn on_response(&mut self, resp: etcd_client::WatchResponse) {
        let Some(key) = self.by_id.get(&resp.watch_id()).cloned() else {
            return;
        };
        if resp.canceled() {
            self.by_id.remove(&resp.watch_id());
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
        if resp.created() {
            w.created = true;
            w.created_revision = resp.header().map(|h| h.revision());
            let coverage = w.coverage();
            // Taken, not drained: an idle kept watch should hold no buffer.
            for ready in std::mem::take(&mut w.pending_ready) {
                let _ = ready.send(coverage);
            }
        }
        for ev in resp.events() {
            match ev.event_type() {
                EventType::Delete => match ev.kv().map(|kv| kv.mod_revision()) {
                    Some(deleted_at) if deleted_at > 0 => w.ended(deleted_at - 1),
                    _ => {
                        // What ended is unknown: everyone reads again.
                        w.uncertain = true;
                        for (_, tx) in w.waiters.drain(..) {
                            let _ = tx.send(Fired::Recheck);
                        }
                    }
                },
                // Filtered out on the server; a new incarnation would end the older ones.
                EventType::Put => {
                    if let Some(kv) = ev.kv() {
                        w.ended(kv.create_revision() - 1);
                    }
                }
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
    async fn sweep(&mut self) {
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
            if let Some(w) = self.keys.remove(&key) {
                self.by_id.remove(&w.id);
                if let Some(sender) = self.sender.as_mut() {
                    let _ = sender.cancel(w.id).await;
                }
            }
        }
    }
}
