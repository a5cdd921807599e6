//! The [`Backend`] trait: leases and queues of entries, the only thing recipes talk to, and
//! the types it speaks in. For implementers of a backend, and for tests that wrap one
//! (`testing::FaultyBackend`); an application needs none of it beyond choosing a backend
//! ([`connect`](crate::connect), or the backends themselves, also at the crate's root).
//!
//! The trait speaks in queues, entries and leases, not in etcd revisions, so that etcd,
//! Redis, ZooKeeper, PostgreSQL and the in-memory store implement it without the recipes
//! knowing which is which. [`StoreEpochs`] is what every network backend uses to notice a
//! store that lost or rolled back its state.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;

pub use crate::epoch::StoreEpochs;
use crate::error::Result;
pub use crate::token::FencingToken;

#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod memory;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
mod reach;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(any(
    feature = "etcd",
    feature = "redis",
    feature = "postgres",
    feature = "zookeeper"
))]
mod tls;
#[cfg(all(feature = "testing", feature = "redis"))]
pub(crate) use self::tls::ensure_provider;
#[cfg(feature = "zookeeper")]
pub(crate) mod zookeeper;

/// A lease: the liveness of one owner. Entries bound to it vanish when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(i64);

impl LeaseId {
    /// Wraps a backend's lease id (for etcd, the lease id etcd granted).
    pub const fn new(id: i64) -> Self {
        LeaseId(id)
    }

    /// The raw id, as the backend knows it.
    pub const fn get(self) -> i64 {
        self.0
    }

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
///
/// Backends build entries with [`Entry::new`]; recipes and users read them through the
/// accessors. Two entries are the same *incarnation* when they have the same key and the same
/// token: a key deleted and created again is a different entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    // Boxed slices rather than `String`/`Vec`: every waiter keeps its entry for as long as it
    // waits.
    /// The key as text: exact when the key is UTF-8 (every key baton writes is), with
    /// replacement characters otherwise.
    key: Box<str>,
    /// The exact key, only when it is not UTF-8 (written by a foreign client): backends act on
    /// these bytes, never on the lossy text.
    raw_key: Option<Box<[u8]>>,
    value: Box<[u8]>,
    position: Position,
    token: FencingToken,
    lease: Option<LeaseId>,
}

impl Entry {
    /// An entry as a backend read it: its full key (`<queue>/<tag>` for etcd), the value its
    /// owner stored, its place in the queue, the token it holds when it reaches the head, and
    /// the lease it is bound to, if any (keys written by foreign clients may have none).
    pub fn new(
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        position: Position,
        token: FencingToken,
        lease: Option<LeaseId>,
    ) -> Entry {
        let (key, raw_key) = match String::from_utf8(key.into()) {
            Ok(key) => (key.into_boxed_str(), None),
            Err(not_utf8) => {
                let raw = not_utf8.into_bytes();
                (
                    String::from_utf8_lossy(&raw).into(),
                    Some(raw.into_boxed_slice()),
                )
            }
        };
        Entry {
            key,
            raw_key,
            value: value.into().into_boxed_slice(),
            position,
            token,
            lease,
        }
    }

    /// The full key as text. Keys baton writes are always exact; a key that is not UTF-8
    /// (written by another client) is shown with replacement characters: use
    /// [`key_bytes`](Entry::key_bytes) to act on it.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The exact key.
    pub fn key_bytes(&self) -> &[u8] {
        self.raw_key.as_deref().unwrap_or(self.key.as_bytes())
    }

    /// What the owner stored (an owner description, an election proposal); may be empty.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// The value, by move.
    pub fn into_value(self) -> Vec<u8> {
        self.value.into_vec()
    }

    /// The place in the queue.
    pub fn position(&self) -> Position {
        self.position
    }

    /// The fencing token this entry holds when it reaches the head.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The lease the entry is bound to, if any.
    pub fn lease(&self) -> Option<LeaseId> {
        self.lease
    }

    /// Whether `other` is this incarnation: same key and same token.
    pub fn is_same_incarnation(&self, other: &Entry) -> bool {
        self.token == other.token && self.key_bytes() == other.key_bytes()
    }
}

/// The answer to [`Backend::enqueue`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued {
    entry: Entry,
    is_head: bool,
    predecessor: Option<Entry>,
}

impl Enqueued {
    /// `entry` is my entry (created now, or found from an earlier call with the same tag);
    /// `is_head` whether it is the oldest of the queue; `predecessor` the newest entry
    /// created before mine when the backend read it in the same round trip (`None`
    /// otherwise, and always `None` for the head).
    pub fn new(entry: Entry, is_head: bool, predecessor: Option<Entry>) -> Enqueued {
        Enqueued {
            entry,
            is_head,
            predecessor: if is_head { None } else { predecessor },
        }
    }

    /// My entry.
    pub fn entry(&self) -> &Entry {
        &self.entry
    }

    /// Whether my entry is the oldest of the queue, i.e. holds it.
    pub fn is_head(&self) -> bool {
        self.is_head
    }

    /// The newest entry created before mine, if the backend read it in the same round trip;
    /// otherwise ask [`Backend::predecessor`].
    ///
    /// It may be known by its key only: the ZooKeeper backend finds it from the names of the
    /// queue's nodes, as Curator does, and answers with no value, no lease, and position and
    /// token 0. Such an entry is for [`Backend::wait_gone`] (which waits for its key) and
    /// nothing else; [`Backend::predecessor`] reads it whole.
    pub fn predecessor(&self) -> Option<&Entry> {
        self.predecessor.as_ref()
    }

    /// The entry, whether it is the head, and the predecessor read with it.
    pub fn into_parts(self) -> (Entry, bool, Option<Entry>) {
        (self.entry, self.is_head, self.predecessor)
    }
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
    id: LeaseId,
    ttl: Duration,
}

impl Lease {
    /// A lease `id` granted with `ttl`.
    pub const fn new(id: LeaseId, ttl: Duration) -> Lease {
        Lease { id, ttl }
    }

    /// The lease id.
    pub const fn id(&self) -> LeaseId {
        self.id
    }

    /// The granted TTL; may be larger than asked (etcd rounds up to whole seconds and to
    /// its minimum).
    pub const fn ttl(&self) -> Duration {
        self.ttl
    }
}

/// What [`Backend::observe_head`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeadEvent {
    /// The head of the queue is now this entry (`None`: the queue is empty).
    Head(Option<Entry>),
    /// The stream lost track of the queue and could not replay what it missed (etcd: the
    /// history was compacted while the observer was cut off or behind). Heads may have come
    /// and gone unreported; the next item is the current head.
    Skipped,
}

/// Storage for the recipes: leases plus queues of entries ordered by creation.
///
/// # Contract
/// - A *queue* is named by a string; its entries are keyed `<queue>/<tag>`. Entries are
///   ordered by [`Position`]; the oldest entry is the *head*. Every key under `<queue>/` is
///   an entry, including keys under a nested name (`<queue>/sub/<tag>`): names that nest
///   share a queue, as in etcd's Go recipes.
/// - Every entry created through [`enqueue`](Backend::enqueue) is bound to a lease and
///   vanishes with it (revoked or expired). Foreign entries (written by other clients) may
///   be present in a queue and take their place by creation order like any other; their
///   keys need not be UTF-8 ([`Entry::key_bytes`] is exact).
/// - Operations that act on an entry ([`delete_entry`](Backend::delete_entry),
///   [`update_entry`](Backend::update_entry), [`guarded`](Backend::guarded),
///   [`wait_gone`](Backend::wait_gone)) act only on that exact incarnation (same key *and*
///   same token): a key deleted and created again is a different entry, and is left alone.
/// - [`FencingToken`]s of one queue increase strictly in creation order, across all clients.
/// - Implementations retry idempotent requests on transient failures themselves.
/// - **Errors and outcomes.** An error from a read or a wait means nothing. For a call that
///   creates or changes state ([`enqueue`](Backend::enqueue), the deletes, updates and
///   guarded writes, [`swap`](Backend::swap), [`grant_lease`](Backend::grant_lease)), `Ok`
///   is definite,
///   [`Error::OutcomeUnknown`](crate::Error::OutcomeUnknown) means the request may have been
///   applied (its answer was lost), and every other error means it was not. A retry must not
///   turn an unknown outcome into a definite one it cannot prove: a conditional write whose
///   retry finds its condition failed, after an attempt that may have been applied, answers
///   `OutcomeUnknown`, not `Ok(false)`. Callers that must know look again
///   ([`abandon`](Backend::abandon) after a failed `enqueue`, a new conditional delete
///   after a failed delete). [`revoke_lease`](Backend::revoke_lease) and
///   [`keep_alive`](Backend::keep_alive) are idempotent and retried like reads.
///
/// # Cancel safety
/// Reads ([`predecessor`](Backend::predecessor), [`ahead`](Backend::ahead),
/// [`ahead_and_read`](Backend::ahead_and_read), [`was_head`](Backend::was_head),
/// [`find_entry`](Backend::find_entry), [`head`](Backend::head),
/// [`entries`](Backend::entries), [`read`](Backend::read)) and waits
/// ([`wait_gone`](Backend::wait_gone), [`wait_value`](Backend::wait_value)) create nothing and
/// may be dropped at any point. A dropped call that creates or changes state may or may not have
/// been applied, like a failed one: the recipes never drop an [`enqueue`](Backend::enqueue)
/// in flight (they hand it to a cleanup task that lets it finish, looks for what it created
/// and deletes it).
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
    ///
    /// Idempotent per tag, so that a retry after a lost answer finds the entry the first
    /// attempt created. On an error the entry may exist: see
    /// [`find_entry`](Backend::find_entry).
    async fn enqueue(
        &self,
        queue: &str,
        tag: &str,
        lease: LeaseId,
        value: &[u8],
    ) -> Result<Enqueued>;

    /// The entry `<queue>/<tag>`, if it exists: how a caller whose
    /// [`enqueue`](Backend::enqueue) failed learns whether it was applied.
    async fn find_entry(&self, queue: &str, tag: &str) -> Result<Option<Entry>>;

    /// How much longer this backend grants nothing at all, whatever its queues hold, as far as
    /// this process knows: the rest of the restart grace of a store epoch that began when
    /// the store lost or rolled back its state ([`StoreEpochs`]). The
    /// queue engine asks before every grant and waits it out; a `try_*` call refused while
    /// it lasts says so ([`Error::RestartGrace`](crate::Error::RestartGrace)) instead of
    /// "held or contended". The default asks [`epochs`](Backend::epochs).
    fn grants_nothing_for(&self) -> Option<Duration> {
        self.epochs().and_then(StoreEpochs::grace_left)
    }

    /// What this client remembers of its store's epochs, if the store can lose or roll back
    /// its state ([`StoreEpochs`]). A session registers there when it is
    /// granted, and is lost at once ([`LostReason::StoreReset`](crate::LostReason)) when a
    /// new epoch begins. The backend must have entered the store's current epoch before it
    /// answers a request that decides a grant, and must compare the epoch in that request.
    ///
    /// The default: `None`, a store that never forgets (decorators forward it).
    fn epochs(&self) -> Option<&StoreEpochs> {
        None
    }

    /// The entry `<queue>/<tag>` of `lease`, if it exists, for a caller that gave up on an
    /// [`enqueue`](Backend::enqueue) of it (failed, or dropped in flight): like
    /// [`find_entry`](Backend::find_entry), and moreover no `enqueue` of that tag for that
    /// lease sent before this call creates the entry after it answered. A request can reach
    /// the server long after it was sent (held up on a connection its client gave up on);
    /// without this, such a request would create an entry nobody waits for, bound to a live
    /// lease, and block the queue for as long as the lease lives.
    ///
    /// The default is [`find_entry`](Backend::find_entry): right for a backend whose
    /// requests cannot arrive once their caller gave up on them (the in-memory one). Every
    /// network backend overrides it.
    async fn abandon(&self, queue: &str, tag: &str, lease: LeaseId) -> Result<Option<Entry>> {
        let _ = lease;
        self.find_entry(queue, tag).await
    }

    /// The newest live entry of `mine`'s queue created before `mine`, or `None` if `mine` is
    /// the head. Fails with [`Error::EntryGone`](crate::Error::EntryGone) if `mine` itself no
    /// longer exists.
    async fn predecessor(&self, mine: &Entry) -> Result<Option<Entry>>;

    /// Up to `limit` live entries of `queue` created before `mine`, newest first: "the
    /// entries just ahead of mine". Fails with [`Error::EntryGone`](crate::Error::EntryGone)
    /// if `mine` itself no longer exists (checked in the same read).
    ///
    /// `queue` is `mine`'s queue, a queue that contains it, or a queue nested in one that
    /// contains it (a reader of a read-write lock asks for the writers of its lock): entries
    /// under one name compare by [`Position`], whatever sub-name they are under. With
    /// `limit` 1 and `mine`'s own queue this is [`predecessor`](Backend::predecessor).
    async fn ahead(&self, queue: &str, mine: &Entry, limit: usize) -> Result<Vec<Entry>>;

    /// [`ahead`](Backend::ahead), and the plain key `key` as [`read`](Backend::read) returns
    /// it, read no earlier than the entries: one round trip where the backend allows. A
    /// semaphore's waiter decides with both (fewer entries ahead than the limit read after
    /// them: since entries ahead of mine only ever go, that held at the instant of the read).
    /// The default reads one after the other.
    async fn ahead_and_read(
        &self,
        queue: &str,
        mine: &Entry,
        limit: usize,
        key: &str,
    ) -> Result<(Vec<Entry>, Option<Vec<u8>>)> {
        let ahead = self.ahead(queue, mine, limit).await?;
        Ok((ahead, self.read(key).await?))
    }

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
    /// gone. Never misses a deletion, whatever happens to connections meanwhile. An error
    /// says nothing about the entry: the caller waits again. `entry` may be one this backend
    /// returned as an [`Enqueued::predecessor`] known by its key only.
    async fn wait_gone(&self, entry: &Entry) -> Result<()>;

    /// [`wait_gone`](Backend::wait_gone) for `predecessor`, then
    /// [`was_head`](Backend::was_head) for `mine`, as one step: a backend whose deletion
    /// notice already says which entry is the head then (PostgreSQL's NOTIFY, sent by the
    /// deleting transaction) answers without another request. An error is `wait_gone`'s
    /// (nothing known; the caller waits again); a failed head check answers `false`. The
    /// default calls one, then the other.
    ///
    /// # Cancel safety
    /// As for `wait_gone` and `was_head`: cancel safe, nothing is created.
    async fn wait_gone_then_head(&self, predecessor: &Entry, mine: &Entry) -> Result<bool> {
        self.wait_gone(predecessor).await?;
        Ok(self.was_head(mine).await.unwrap_or(false))
    }

    /// The oldest entry of `queue`, if any.
    async fn head(&self, queue: &str) -> Result<Option<Entry>>;

    /// All entries of `queue`, oldest first.
    async fn entries(&self, queue: &str) -> Result<Vec<Entry>>;

    /// Every entry whose key starts with `prefix` (`""`: every entry of the store), in no
    /// particular order: what an operator's listing reads (`baton ls`, [`crate::inspect::list`]).
    /// Not for recipes: it may scan the store.
    ///
    /// The default lists the entries of the queue `prefix` names (a prefix that ends in `/`
    /// or is a name); backends that can list by any prefix override it.
    async fn entries_under(&self, prefix: &str) -> Result<Vec<Entry>> {
        self.entries(prefix.trim_end_matches('/')).await
    }

    /// Marks the store as baton's without a restart grace, as `baton init` does: if it has no
    /// store-epoch marker, its first epoch begins now, and its first use waits nothing.
    /// Returns whether it began one (`false`: it was marked already, or this backend's store
    /// never forgets: the default). The caller asserts that no holder from before can exist
    /// (a new store, or one whose every client has stopped).
    async fn init_store(&self) -> Result<bool> {
        Ok(false)
    }

    /// Deletes `entry` if this incarnation still exists; tells whether it did.
    async fn delete_entry(&self, entry: &Entry) -> Result<bool>;

    /// Replaces the value of `entry` if this incarnation still exists, keeping its lease;
    /// tells whether it did.
    async fn update_entry(&self, entry: &Entry, value: &[u8]) -> Result<bool>;

    /// Applies `ops` atomically if and only if `entry` (this incarnation) still exists;
    /// tells whether they were applied. This is the fenced write: it cannot land after the
    /// entry was lost.
    async fn guarded(&self, entry: &Entry, ops: &[WriteOp]) -> Result<bool>;

    /// Reads a plain key (for example one written by [`guarded`](Backend::guarded)).
    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>>;

    /// Compare-and-set on a plain key (not an entry: no lease): sets `key` to `new` if and
    /// only if its value is `expected` (`None`: the key does not exist); tells whether it
    /// did. Recipes keep their settings this way (a semaphore's limit).
    async fn swap(&self, key: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<bool>;

    /// Resolves with the value of the plain key `key` once it is not `seen` (`None`: the key
    /// does not exist); at once if it already differs. Never misses a change, whatever
    /// happens to connections meanwhile; it may miss a change that was undone before it
    /// looked (it reports values, not events). An error says nothing: the caller waits again.
    async fn wait_value(&self, key: &str, seen: Option<&[u8]>) -> Result<Option<Vec<u8>>>;

    /// The remaining TTL of `lease`, or `None` if it no longer exists.
    async fn lease_ttl(&self, lease: LeaseId) -> Result<Option<Duration>>;

    /// A stream of the head of `queue`: its current head first, then every change of head
    /// entry or of the head's value, in order, one [`HeadEvent::Head`] per change: no head
    /// the backend applied is left out, however slowly the stream is consumed, except where
    /// the backend cannot replay its history; then the stream says so with
    /// [`HeadEvent::Skipped`] and goes on from the current head. It resumes by itself after
    /// reconnects, reports backend errors as items, and ends only when dropped.
    ///
    /// Creating the stream does nothing; it works when polled, so it may be created outside
    /// an async runtime.
    fn observe_head(&self, queue: &str) -> BoxStream<'static, Result<HeadEvent>>;

    /// The queue a recipe given the name `name` uses on this backend. Recipes
    /// ([`Mutex::new`](crate::Mutex::new) and the others) call it once, before anything else
    /// sees the name, so that two spellings of one queue are one queue in process too.
    ///
    /// By default `name` itself: on etcd and Redis a leading `/` is part of the key. On
    /// ZooKeeper, names are paths relative to the connect string's chroot, and one leading
    /// `/` (`/orders`, as ZooKeeper users write paths) is dropped: `/orders` and `orders` are
    /// the node `<chroot>/orders`. Decorators forward it to the backend they wrap.
    fn recipe_name<'n>(&self, name: &'n str) -> &'n str {
        name
    }

    /// The queue (the name) an entry key of this backend was enqueued on, as
    /// [`inspect`](crate::inspect) and `baton ls` group entries: by default everything before
    /// the key's last `/`. etcd's indexed layout keeps a queue's entries one level down
    /// (`<name>/_q/<sequence>.<tag>`) and says so here. Decorators forward it to the backend
    /// they wrap.
    fn queue_of_key<'k>(&self, key: &'k str) -> &'k str {
        queue_of(key)
    }
}

/// A change to one key under a queue's prefix, as a watch reports it.
#[derive(Debug, Clone)]
pub(crate) enum QueueChange {
    Put(Entry),
    /// The exact key that was deleted.
    Delete(Vec<u8>),
}

/// A client-side copy of one queue, kept from a snapshot plus changes, that tells when its
/// head changes. Shared by the backends' [`Backend::observe_head`].
#[derive(Debug, Default)]
pub(crate) struct QueueMirror {
    by_key: HashMap<Vec<u8>, Entry>,
    order: BTreeMap<Position, Vec<u8>>,
    /// The head last reported: `None` before the first report (and after a gap).
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

    /// The next head is reported whatever it is: the observer skipped what came before it.
    #[cfg(any(feature = "etcd", feature = "zookeeper"))]
    pub(crate) fn forget_reported(&mut self) {
        self.reported = None;
    }

    pub(crate) fn apply(&mut self, change: QueueChange) {
        match change {
            QueueChange::Put(e) => {
                let key = e.key_bytes().to_vec();
                let position = e.position();
                if let Some(old) = self.by_key.insert(key.clone(), e) {
                    self.order.remove(&old.position());
                }
                self.order.insert(position, key);
            }
            QueueChange::Delete(key) => {
                if let Some(old) = self.by_key.remove(&key) {
                    self.order.remove(&old.position());
                }
            }
        }
    }

    /// The head, if it differs (entry or value) from the one last reported.
    pub(crate) fn head_change(&mut self) -> Option<HeadEvent> {
        let head = self
            .order
            .values()
            .next()
            .and_then(|k| self.by_key.get(k))
            .cloned();
        let now = head.as_ref().map(|h| (h.token(), h.value().to_vec()));
        if self.reported.as_ref() == Some(&now) {
            return None;
        }
        self.reported = Some(now);
        Some(HeadEvent::Head(head))
    }
}

/// [`Backend::was_head`] for a backend whose reads are always current (one store, one
/// primary): the exact answer, "present with no predecessor".
pub(crate) async fn present_without_predecessor<B: Backend + ?Sized>(
    backend: &B,
    mine: &Entry,
) -> Result<bool> {
    match backend.predecessor(mine).await {
        Ok(predecessor) => Ok(predecessor.is_none()),
        Err(crate::Error::EntryGone { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The queue an entry key belongs to: everything before the last `/`.
pub(crate) fn queue_of(key: &str) -> &str {
    key.rsplit_once('/').map_or(key, |(q, _)| q)
}

/// The queue of an exact key, as bytes.
#[cfg(any(feature = "etcd", feature = "redis", test))]
pub(crate) fn queue_of_bytes(key: &[u8]) -> &[u8] {
    key.iter()
        .rposition(|&b| b == b'/')
        .map_or(key, |slash| &key[..slash])
}

#[cfg(feature = "etcd")]
pub use self::etcd::{EtcdBackend, EtcdLayout, EtcdOptions};
#[cfg(feature = "postgres")]
pub use self::postgres::{PgBackend, PgOptions};
#[cfg(feature = "redis")]
pub use self::redis::{RedisBackend, RedisOptions};
#[cfg(feature = "zookeeper")]
pub use self::zookeeper::{ZkBackend, ZkLayout, ZkOptions};
pub use memory::{MemoryBackend, MemorySnapshot};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_of_strips_the_tag_only() {
        assert_eq!(queue_of("orders/lock/694d"), "orders/lock");
        assert_eq!(queue_of("plain"), "plain");
        assert_eq!(queue_of_bytes(b"orders/\xff/694d"), b"orders/\xff");
        assert_eq!(queue_of_bytes(b"plain"), b"plain");
    }

    #[test]
    fn entries_keep_keys_that_are_not_utf8_exactly() {
        let raw = b"q/\xff\xfe".to_vec();
        let e = Entry::new(
            raw.clone(),
            "",
            Position::new(3),
            FencingToken::new(3),
            None,
        );
        assert_eq!(e.key_bytes(), raw.as_slice());
        assert_eq!(e.key(), "q/\u{fffd}\u{fffd}");
        let text = Entry::new("q/a", "", Position::new(4), FencingToken::new(4), None);
        assert_eq!(text.key_bytes(), b"q/a");
        assert!(!e.is_same_incarnation(&text));
    }
}
