//! The [`Backend`] trait: leases and queues of entries, the only thing recipes talk to.
//!
//! The trait speaks in queues, entries and leases, not in etcd revisions, so that etcd, the
//! in-memory model and later ZooKeeper or Redis can implement it without the recipes knowing
//! which is which.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;

use crate::error::Result;

#[cfg(feature = "etcd")]
pub(crate) mod etcd;
#[cfg(feature = "etcd")]
mod etcd_watch;
pub(crate) mod memory;

/// A lease: the liveness of one owner. Entries bound to it vanish when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub i64);

impl LeaseId {
    /// The lease id in lowercase hex: the tag etcd's Go recipes use for a contender's key.
    pub fn to_hex(self) -> String {
        format!("{:x}", self.0)
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

/// A fencing token: strictly increasing in the order a queue grants its head.
///
/// For etcd it is the create revision of the holder's key. Pass it to the resource you
/// protect and have the resource reject any token lower than the highest it accepted
/// (see [`Fence`](crate::Fence) and `docs/fencing.md`). With the `serde` feature it
/// serialises as a plain integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value (an etcd create revision).
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The raw value, for storing in a resource that checks it.
    pub const fn get(self) -> u64 {
        self.0
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for FencingToken {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for FencingToken {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        u64::deserialize(deserializer).map(FencingToken)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An entry's place in its queue. Only entries of the same queue are comparable; a smaller
/// position was created earlier and is served earlier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Position(u64);

impl Position {
    /// Wraps a backend-specific position value.
    pub const fn new(value: u64) -> Self {
        Position(value)
    }

    /// The raw position value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// One contender in a queue, as last read from the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The full key, `<queue>/<tag>` for etcd.
    pub key: String,
    /// What the owner stored (an owner description, an election proposal); may be empty.
    pub value: Vec<u8>,
    /// The place in the queue.
    pub position: Position,
    /// The fencing token this entry holds when it reaches the head.
    pub token: FencingToken,
    /// The lease the entry is bound to, if any (keys written by foreign clients may have none).
    pub lease: Option<LeaseId>,
}

/// The answer to [`Backend::enqueue`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued {
    /// My entry (created now, or found from an earlier call with the same tag).
    pub entry: Entry,
    /// Whether my entry is the oldest of the queue, i.e. holds it.
    pub is_head: bool,
    /// When my entry is not the head: the newest entry created before mine, if the backend
    /// read it in the same round trip (it does when it created my entry). `None` otherwise;
    /// ask [`Backend::predecessor`].
    pub predecessor: Option<Entry>,
}

/// A write applied by [`Backend::guarded`] only while a given entry still exists.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteOp {
    /// Set `key` to `value` (no lease).
    Put {
        /// The key to write.
        key: String,
        /// The value to write.
        value: Vec<u8>,
    },
    /// Remove `key` if present.
    Delete {
        /// The key to remove.
        key: String,
    },
}

impl WriteOp {
    /// A put of `value` at `key`.
    pub fn put(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        WriteOp::Put {
            key: key.into(),
            value: value.into(),
        }
    }

    /// A delete of `key`.
    pub fn delete(key: impl Into<String>) -> Self {
        WriteOp::Delete { key: key.into() }
    }
}

/// A granted lease and the TTL the server actually gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The lease id.
    pub id: LeaseId,
    /// The granted TTL; may be larger than asked (etcd rounds up to whole seconds and to its
    /// minimum TTL).
    pub ttl: Duration,
}

/// Storage for the recipes: leases plus queues of entries ordered by creation.
///
/// # Contract
/// - A *queue* is named by a string; its entries are keyed `<queue>/<tag>`. Entries are
///   ordered by [`Position`]; the oldest entry is the *head*.
/// - Every entry created through [`enqueue`](Backend::enqueue) is bound to a lease and
///   vanishes with it (revoked or expired). Foreign entries (written by other clients) may
///   be present in a queue and take their place by creation order like any other.
/// - Operations that act on an entry ([`delete_entry`](Backend::delete_entry),
///   [`update_entry`](Backend::update_entry), [`guarded`](Backend::guarded)) act only on that
///   exact incarnation (same key *and* same token): a key deleted and created again is a
///   different entry, and is left alone.
/// - [`FencingToken`]s of one queue increase strictly in creation order, across all clients.
/// - Implementations retry idempotent requests on transient failures themselves; an error
///   returned means the operation is not known to have happened.
///
/// # Cancel safety
/// Reads ([`predecessor`](Backend::predecessor), [`was_head`](Backend::was_head),
/// [`head`](Backend::head), [`entries`](Backend::entries), [`read`](Backend::read)) and waits
/// create nothing and may be dropped at any point. For calls that create state,
/// implementors must release everything a dropped future created, or document that the
/// caller must: the recipes never drop an [`enqueue`](Backend::enqueue) in flight (they
/// hand it to a cleanup task that lets it finish and deletes what it created).
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// Grants a lease of at least `ttl`. The returned TTL may be larger (server minimum).
    async fn grant_lease(&self, ttl: Duration) -> Result<Lease>;

    /// Renews the lease once. `Ok(Some(ttl))` is the remaining TTL after the renewal;
    /// `Ok(None)` means the lease no longer exists.
    async fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>>;

    /// Revokes the lease: it and every entry bound to it vanish. Revoking a lease that is
    /// already gone is not an error.
    async fn revoke_lease(&self, lease: LeaseId) -> Result<()>;

    /// Creates my entry `<queue>/<tag>` bound to `lease` holding `value` unless it already
    /// exists (then the existing entry is returned unchanged), and tells whether it is the
    /// head, in one round trip where the backend allows.
    async fn enqueue(
        &self,
        queue: &str,
        tag: &str,
        lease: LeaseId,
        value: &[u8],
    ) -> Result<Enqueued>;

    /// The newest live entry of `mine`'s queue created before `mine`, or `None` if `mine` is
    /// the head. Fails with [`Error::EntryGone`](crate::Error::EntryGone) if `mine` itself no
    /// longer exists.
    async fn predecessor(&self, mine: &Entry) -> Result<Option<Entry>>;

    /// A cheaper check, made after a predecessor of `mine` was seen gone: `Ok(true)` only if
    /// some committed state of the queue had `mine` present and no older entry. `false`
    /// means "not known": the caller then reads [`predecessor`](Backend::predecessor).
    ///
    /// The answer may come from a replica that lags behind (that is what makes it cheaper):
    /// a positive answer stays true because no entry older than `mine` can be created later,
    /// so from that state on `mine` is the head until it is deleted, which its owner learns
    /// through its session. Anything less certain (a replica that has not yet seen the
    /// deletion, or `mine` not visible) must answer `false`. The default always does.
    async fn was_head(&self, mine: &Entry) -> Result<bool> {
        let _ = mine;
        Ok(false)
    }

    /// Resolves once `entry` (this incarnation) no longer exists; at once if it is already
    /// gone. Never misses a deletion, whatever happens to connections meanwhile.
    async fn wait_gone(&self, entry: &Entry) -> Result<()>;

    /// The oldest entry of `queue`, if any.
    async fn head(&self, queue: &str) -> Result<Option<Entry>>;

    /// All entries of `queue`, oldest first.
    async fn entries(&self, queue: &str) -> Result<Vec<Entry>>;

    /// Deletes `entry` if this incarnation still exists; tells whether it did.
    async fn delete_entry(&self, entry: &Entry) -> Result<bool>;

    /// Replaces the value of `entry` if this incarnation still exists; tells whether it did.
    async fn update_entry(&self, entry: &Entry, value: &[u8]) -> Result<bool>;

    /// Applies `ops` atomically if and only if `entry` (this incarnation) still exists;
    /// tells whether they were applied. This is the fenced write: it cannot land after the
    /// entry was lost.
    async fn guarded(&self, entry: &Entry, ops: &[WriteOp]) -> Result<bool>;

    /// Reads a plain key (for example one written by [`guarded`](Backend::guarded)).
    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>>;

    /// The remaining TTL of `lease`, or `None` if it no longer exists.
    async fn lease_ttl(&self, lease: LeaseId) -> Result<Option<Duration>>;

    /// A stream of the head of `queue`: its current head first (`None` = the queue is
    /// empty), then every change of head entry or of the head's value, in order. Each head
    /// the stream learns of is reported, even when it is replaced right away; only a
    /// compaction or a lagging consumer may make it skip heads it never saw. It resumes by
    /// itself after reconnects and compactions, and ends only when dropped.
    fn observe_head(&self, queue: &str) -> BoxStream<'static, Result<Option<Entry>>>;
}

/// A change to one key under a queue's prefix, as a watch reports it.
#[derive(Debug, Clone)]
pub(crate) enum QueueChange {
    Put(Entry),
    Delete(String),
}

/// A client-side copy of one queue, kept from a snapshot plus changes, that tells when its
/// head changes. Shared by the backends' [`Backend::observe_head`].
#[derive(Debug, Default)]
pub(crate) struct QueueMirror {
    by_key: HashMap<String, Entry>,
    order: BTreeMap<Position, String>,
    /// The head last reported: `None` before the first report.
    reported: Option<Option<(FencingToken, Vec<u8>)>>,
}

impl QueueMirror {
    pub(crate) fn reset(&mut self, entries: Vec<Entry>) {
        self.by_key.clear();
        self.order.clear();
        for e in entries {
            self.apply(QueueChange::Put(e));
        }
    }

    pub(crate) fn apply(&mut self, change: QueueChange) {
        match change {
            QueueChange::Put(e) => {
                if let Some(old) = self.by_key.insert(e.key.clone(), e.clone()) {
                    self.order.remove(&old.position);
                }
                self.order.insert(e.position, e.key);
            }
            QueueChange::Delete(key) => {
                if let Some(old) = self.by_key.remove(&key) {
                    self.order.remove(&old.position);
                }
            }
        }
    }

    /// Sends the head to `tx` if it changed since the last report; `false` once the
    /// receiver is gone.
    pub(crate) async fn report(
        &mut self,
        tx: &tokio::sync::mpsc::Sender<Result<Option<Entry>>>,
    ) -> bool {
        match self.head_change() {
            Some(head) => tx.send(Ok(head)).await.is_ok(),
            None => true,
        }
    }

    /// The head, if it differs (entry or value) from the one last reported.
    fn head_change(&mut self) -> Option<Option<Entry>> {
        let head = self
            .order
            .values()
            .next()
            .and_then(|k| self.by_key.get(k))
            .cloned();
        let now = head.as_ref().map(|h| (h.token, h.value.clone()));
        if self.reported.as_ref() == Some(&now) {
            return None;
        }
        self.reported = Some(now);
        Some(head)
    }
}

/// The queue an entry key belongs to: everything before the last `/`.
pub(crate) fn queue_of(key: &str) -> &str {
    key.rsplit_once('/').map_or(key, |(q, _)| q)
}

/// Turns a channel fed by an observer task into a stream; the task notices when the stream
/// is dropped through `Sender::closed`.
pub(crate) fn receiver_stream<T: Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<T>,
) -> BoxStream<'static, T> {
    Box::pin(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}

#[cfg(feature = "etcd")]
pub use self::etcd::{EtcdBackend, EtcdOptions};
pub use memory::MemoryBackend;

#[cfg(test)]
mod tests {
    use super::queue_of;

    #[test]
    fn queue_of_strips_the_tag_only() {
        assert_eq!(queue_of("orders/lock/694d"), "orders/lock");
        assert_eq!(queue_of("plain"), "plain");
    }
}
