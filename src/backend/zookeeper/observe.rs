//! [`Backend::observe_head`](crate::Backend::observe_head) on ZooKeeper: a task per stream
//! that follows a queue through a persistent recursive watch, reading each changed node.
//!
//! ZooKeeper keeps no history of values: a watch event names the node, not the value it had.
//! The task reads each changed entry at once; when a read shows that more than one change
//! happened since the last (its data version jumped), the values in between are taken from
//! what this process wrote ([`written`]), and the gap is reported as
//! [`HeadEvent::Skipped`] only for values another process wrote. After a reconnect (persistent
//! watches lose the events of the disconnection, ZOOKEEPER-4698) the queue is read again, and
//! a change is reported as a gap.

use std::collections::{HashMap, VecDeque};
use std::sync::{LazyLock, Mutex};

use tokio::sync::mpsc::UnboundedSender;
use zookeeper_client::{AddWatchMode, Client, EventType, SessionState};

use super::{Failure, ZkBackend, collect, names, to_entry};
use crate::backend::{Entry, HeadEvent, LeaseId, Position, QueueChange, QueueMirror};
use crate::error::{Error, Result};
use crate::retry::Backoff;

/// Values this process wrote to entries, kept while an observer of their queue runs, so
/// that a fast writer's intermediate values still reach a slower observer.
#[derive(Default)]
struct Written {
    /// Observed queue paths (`/<queue>`) and how many observers each has.
    observed: HashMap<String, usize>,
    /// Entry path -> (data version, value), oldest first.
    values: HashMap<String, VecDeque<(i32, Vec<u8>)>>,
}

/// How many values are kept per entry.
const KEPT: usize = 1 << 14;

static WRITTEN: LazyLock<Mutex<Written>> = LazyLock::new(Default::default);

fn written() -> std::sync::MutexGuard<'static, Written> {
    WRITTEN.lock().unwrap_or_else(|p| p.into_inner())
}

/// Notes that this process set entry `path` to `value` at data `version`.
pub(super) fn record(path: &str, version: i32, value: &[u8]) {
    let mut w = written();
    let observed = w.observed.keys().any(|q| {
        path.strip_prefix(q.as_str())
            .is_some_and(|r| r.starts_with('/'))
    });
    if !observed {
        return;
    }
    let values = w.values.entry(path.to_owned()).or_default();
    if values.len() >= KEPT {
        values.pop_front();
    }
    values.push_back((version, value.to_vec()));
}

fn recorded(path: &str, version: i32) -> Option<Vec<u8>> {
    let w = written();
    w.values
        .get(path)?
        .iter()
        .rev()
        .find(|(v, _)| *v == version)
        .map(|(_, value)| value.clone())
}

/// Registers an observer of `dir` for [`record`]; unregisters on drop.
struct Observing(String);

impl Observing {
    fn new(dir: &str) -> Observing {
        *written().observed.entry(dir.to_owned()).or_default() += 1;
        Observing(dir.to_owned())
    }
}

impl Drop for Observing {
    fn drop(&mut self) {
        let mut w = written();
        let left = w.observed.get_mut(&self.0).map(|n| {
            *n -= 1;
            *n
        });
        if left == Some(0) {
            w.observed.remove(&self.0);
            let dir = self.0.clone();
            w.values.retain(|p, _| {
                !p.strip_prefix(dir.as_str())
                    .is_some_and(|r| r.starts_with('/'))
            });
        }
    }
}

type Events = UnboundedSender<Result<HeadEvent>>;

/// One snapshot of the queue: its entries with their data versions, by key.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    /// (key, czxid, version), by key.
    nodes: Vec<(String, u64, i32)>,
}

/// Follows `queue` and sends its heads to `tx` until the receiver is dropped.
pub(super) async fn run(backend: ZkBackend, queue: String, tx: Events) {
    if let Err(e) = names::check_name(&queue) {
        let _ = tx.send(Err(e));
        tx.closed().await;
        return;
    }
    let dir = format!("/{queue}");
    let _observing = Observing::new(&dir);
    let mut observer = Observer {
        backend,
        queue,
        dir,
        tx,
        mirror: QueueMirror::default(),
        versions: HashMap::new(),
        owners: HashMap::new(),
        last: None,
        backoff: Backoff::new(),
    };
    let closed = observer.tx.clone();
    loop {
        let outcome = tokio::select! {
            outcome = observer.follow() => outcome,
            () = closed.closed() => return,
        };
        match outcome {
            Ok(()) => observer.backoff.reset(),
            Err(e) => {
                if observer.tx.send(Err(e)).is_err() {
                    return;
                }
                let delay = observer.backoff.next_delay();
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = closed.closed() => return,
                }
            }
        }
    }
}

struct Observer {
    backend: ZkBackend,
    queue: String,
    dir: String,
    tx: Events,
    mirror: QueueMirror,
    /// Entry key -> (czxid, data version last read).
    versions: HashMap<String, (u64, i32)>,
    /// Entry key -> its lease, to rebuild an entry from a value this process wrote.
    owners: HashMap<String, Option<LeaseId>>,
    /// The last snapshot, or `None` before the first.
    last: Option<Snapshot>,
    backoff: Backoff,
}

impl Observer {
    fn send(&mut self, event: HeadEvent) {
        let _ = self.tx.send(Ok(event));
    }

    fn report(&mut self) {
        if let Some(event) = self.mirror.head_change() {
            self.send(event);
        }
    }

    fn head_key(&mut self) -> Option<String> {
        // The mirror reports changes only; peek through a copy of its answer.
        self.versions
            .iter()
            .min_by_key(|(_, (token, _))| *token)
            .map(|(k, _)| k.clone())
    }

    /// Watches the queue, reads it, and follows its changes until the session breaks (then
    /// returns `Ok` to start again) or a request fails.
    async fn follow(&mut self) -> Result<()> {
        // Tokens are the store epoch's: entered first.
        self.backend.epoch().await?;
        let client = self.backend.base().await?;
        let label = self.backend.label();
        let fail = |e: zookeeper_client::Error| super::zk_err("observe", e).at_endpoint(&label);
        let mut watcher = client
            .watch(&self.dir, AddWatchMode::PersistentRecursive)
            .await
            .map_err(fail)?;
        let snapshot = self.snapshot(&client).await?;
        let changed = self.last.as_ref().is_some_and(|last| *last != snapshot.0);
        if changed {
            self.send(HeadEvent::Skipped);
            self.mirror.forget_reported();
        }
        self.versions = snapshot
            .0
            .nodes
            .iter()
            .map(|(k, t, v)| (k.clone(), (*t, *v)))
            .collect();
        self.owners = snapshot
            .1
            .iter()
            .map(|e| (e.key().to_owned(), e.lease()))
            .collect();
        self.mirror.reset(snapshot.1);
        self.last = Some(snapshot.0);
        self.report();
        let mut disconnected = false;
        loop {
            let event = watcher.changed().await;
            match event.event_type {
                EventType::Session => match event.session_state {
                    SessionState::Disconnected => disconnected = true,
                    SessionState::SyncConnected if disconnected => return Ok(()),
                    // The watcher may not be asked again after a terminal state.
                    s if s.is_terminated() => return Ok(()),
                    _ => {}
                },
                EventType::NodeDeleted => {
                    let key = event.path.trim_start_matches('/').to_owned();
                    self.owners.remove(&key);
                    if self.versions.remove(&key).is_some() {
                        self.mirror.apply(QueueChange::Delete(key.into_bytes()));
                        self.report();
                    }
                }
                EventType::NodeCreated | EventType::NodeDataChanged => {
                    self.changed(&client, &event.path).await.map_err(fail)?;
                }
                EventType::NodeChildrenChanged => {}
            }
            self.note_change();
        }
    }

    /// Keeps the last snapshot's idea of the queue in step with what was followed, so that
    /// a reconnect compares the queue with what was last reported.
    fn note_change(&mut self) {
        if let Some(last) = self.last.as_mut() {
            let mut nodes: Vec<_> = self
                .versions
                .iter()
                .map(|(k, (t, v))| (k.clone(), *t, *v))
                .collect();
            nodes.sort();
            last.nodes = nodes;
        }
    }

    async fn changed(
        &mut self,
        client: &Client,
        path: &str,
    ) -> Result<(), zookeeper_client::Error> {
        let Some(name) = path.rsplit('/').next() else {
            return Ok(());
        };
        let layout = self.backend.inner.options.layout;
        if layout.other().sequence(name).is_some() {
            let _ = self.tx.send(Err(Error::ForeignLayout {
                queue: self.queue.clone(),
                node: path.trim_start_matches('/').to_owned(),
                layout: layout.other().name(),
            }));
            return Ok(());
        }
        if layout.sequence(name).is_none() {
            return Ok(());
        }
        let key = path.trim_start_matches('/').to_owned();
        let (data, stat) = match client.get_data(path).await {
            Ok(read) => read,
            // Deleted since (its delete event follows): the values this process wrote before
            // the delete are still reported.
            Err(zookeeper_client::Error::NoNode) => {
                self.replay(path, &key);
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let token = stat.czxid as u64;
        // The first version not yet reported: the next one, or the creation's (0) for a node
        // first seen now.
        let from = match self.versions.get(&key) {
            Some(&(t, v)) if t == token => {
                if stat.version <= v {
                    return Ok(());
                }
                v + 1
            }
            _ => 0,
        };
        // Values between the last read and this one: from this process's writes.
        let mut missed = false;
        for version in from..stat.version {
            match recorded(path, version) {
                Some(value) => {
                    self.versions.insert(key.clone(), (token, version));
                    let e = to_entry(key.clone(), value, &stat, &self.backend.inner.epochs);
                    self.mirror.apply(QueueChange::Put(e));
                    self.report();
                }
                None => missed = true,
            }
        }
        self.versions.insert(key.clone(), (token, stat.version));
        self.owners.insert(
            key.clone(),
            (stat.ephemeral_owner != 0).then(|| LeaseId::new(stat.ephemeral_owner)),
        );
        if missed && self.head_key().as_deref() == Some(key.as_str()) {
            self.send(HeadEvent::Skipped);
            self.mirror.forget_reported();
        }
        self.mirror.apply(QueueChange::Put(to_entry(
            key,
            data,
            &stat,
            &self.backend.inner.epochs,
        )));
        self.report();
        Ok(())
    }

    /// Reports the values this process wrote to `key` after the version last read, as far as
    /// they run without a gap: the node is gone, so they cannot be read any more.
    fn replay(&mut self, path: &str, key: &str) {
        let Some(&(token, mut version)) = self.versions.get(key) else {
            return;
        };
        let lease = self.owners.get(key).copied().flatten();
        while let Some(value) = recorded(path, version + 1) {
            version += 1;
            self.versions.insert(key.to_owned(), (token, version));
            let e = Entry::new(
                key,
                value,
                Position::new(token),
                self.backend.token(token),
                lease,
            );
            self.mirror.apply(QueueChange::Put(e));
            self.report();
        }
    }

    /// Reads the whole queue, after a `sync`.
    async fn snapshot(&mut self, client: &Client) -> Result<(Snapshot, Vec<Entry>)> {
        let label = self.backend.label();
        let layout = self.backend.inner.options.layout;
        let fail = |e: Failure| match e {
            Failure::Zk(e) | Failure::Unsent(e) => super::zk_err("observe", e).at_endpoint(&label),
            Failure::Stop(e) => e,
        };
        client.sync(&self.dir).await.or_else(|e| match e {
            zookeeper_client::Error::NoNode => Ok(()),
            e => Err(fail(Failure::Zk(e))),
        })?;
        let epochs = &self.backend.inner.epochs;
        let nodes = collect(client, layout, &self.queue, false, None, epochs, false)
            .await
            .map_err(fail)?
            .entries;
        let mut listed: Vec<_> = nodes
            .iter()
            .map(|(e, version)| (e.key().to_owned(), e.position().get(), *version))
            .collect();
        listed.sort();
        Ok((
            Snapshot { nodes: listed },
            nodes.into_iter().map(|(e, _)| e).collect(),
        ))
    }
}
