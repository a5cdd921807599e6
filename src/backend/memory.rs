//! [`MemoryBackend`]: the backend's semantics in one process, on tokio time.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard as StdMutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use super::{
    Backend, Enqueued, Entry, FencingToken, HeadEvent, Lease, LeaseId, Position, QueueChange,
    QueueMirror, WriteOp, queue_of,
};
use crate::epoch::{Epoch, StoreEpochs};
use crate::error::{Error, LostReason, Result};

/// An in-process backend with the same semantics as etcd: one global revision counter that
/// orders every entry, leases that expire on tokio time, and deletion waits that wake exactly
/// the waiters of the deleted entry.
///
/// Use it for single-process programs, examples and fast deterministic tests: under
/// `#[tokio::test(start_paused = true)]` lease expiry follows the paused clock. It is not
/// shared between processes.
///
/// A `MemoryBackend` and its clones are one *client* of one store. [`client`](Self::client)
/// opens another client of the same store (another process, as far as baton can tell), and
/// [`lose_state`](Self::lose_state), [`snapshot`](Self::snapshot) and
/// [`restore`](Self::restore) make the store forget, as a server restarted without its data
/// or restored from a backup does: each client notices it as the network backends do (the
/// marker gone, or a revision lower than one it saw), which begins a new store epoch
/// ([`StoreEpochs`]).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
/// use baton::{MemoryBackend, Mutex, Session};
/// let session = Session::new(MemoryBackend::new()).await?;
/// let guard = Mutex::new(&session, "jobs/nightly")?.lock().await?;
/// assert_eq!(guard.key(), format!("jobs/nightly/{}", session.lease_id()));
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryBackend {
    shared: Arc<Shared>,
    /// What this client remembers of the store.
    epochs: Arc<StoreEpochs>,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Debug)]
struct Shared {
    state: StdMutex<State>,
    /// When the store was created: its clock for new epochs' tokens (tokio time, so that a
    /// simulation replays exactly).
    created: Instant,
    /// Wakes the reaper when a lease deadline changes.
    deadlines_changed: Arc<Notify>,
    reaper_started: AtomicBool,
    unavailable: AtomicBool,
    wakeups: AtomicU64,
    /// Leases whose renewals fail, as if their owner were paused or cut off.
    partitioned: StdMutex<BTreeSet<LeaseId>>,
}

#[derive(Debug)]
struct Kv {
    value: Vec<u8>,
    create: u64,
    lease: Option<LeaseId>,
}

#[derive(Debug)]
struct LeaseState {
    ttl: Duration,
    deadline: Instant,
    keys: BTreeSet<String>,
}

#[derive(Debug)]
struct State {
    /// The store's epoch marker (what a network backend keeps in a key) and when its restart
    /// grace ends (`None`: the epoch began without one); `None` once the state was lost,
    /// until a client begins the next epoch.
    marker: Option<(Epoch, Option<Instant>)>,
    revision: u64,
    next_lease: i64,
    kvs: BTreeMap<String, Kv>,
    leases: HashMap<LeaseId, LeaseState>,
    /// Lease deadlines in order, so that expiry looks only at what is due.
    by_deadline: BTreeSet<(Instant, LeaseId)>,
    /// Per key: waiters of one incarnation (create revision) of that key.
    waiters: HashMap<String, Vec<(u64, oneshot::Sender<()>)>>,
    /// Per plain key: waiters for a value other than the one they saw (`None`: absent).
    value_waiters: HashMap<String, Vec<ValueWaiter>>,
    /// Observers of queues (the in-process watch): each gets every change under its prefix,
    /// in order, however slowly it reads (a queue of its own, unbounded: lossless).
    observers: Vec<Observer>,
    /// Changes of the revision being built, published as one batch.
    batch: Vec<(String, QueueChange)>,
}

type ValueWaiter = (Option<Vec<u8>>, oneshot::Sender<Option<Vec<u8>>>);

#[derive(Debug)]
struct Observer {
    /// `<queue>/`.
    prefix: String,
    changes: mpsc::UnboundedSender<Vec<QueueChange>>,
}

impl Default for State {
    fn default() -> Self {
        State {
            marker: None,
            revision: 1,
            // Lease ids that look like etcd's (a member id in the high bits).
            next_lease: 0x694d_7a5c_1bf9_c800,
            kvs: BTreeMap::new(),
            leases: HashMap::new(),
            by_deadline: BTreeSet::new(),
            waiters: HashMap::new(),
            value_waiters: HashMap::new(),
            observers: Vec::new(),
            batch: Vec::new(),
        }
    }
}

impl State {
    /// The token of a key created at revision `create`, in the current epoch.
    fn token(&self, create: u64) -> FencingToken {
        self.marker
            .map_or(FencingToken::new(create), |(e, _)| e.token(create))
    }

    fn entry(&self, key: &str) -> Option<Entry> {
        self.kvs.get(key).map(|kv| {
            Entry::new(
                key,
                kv.value.clone(),
                Position::new(kv.create),
                self.token(kv.create),
                kv.lease,
            )
        })
    }

    fn is_live(&self, entry: &Entry) -> bool {
        self.kvs.get(entry.key()).is_some_and(|kv| {
            self.token(kv.create) == entry.token() && kv.create == entry.position().get()
        })
    }

    /// Replaces every key and lease (a store that forgot): waiters and value waiters are
    /// dropped (their waits fail, and they look again), observers are told what changed.
    fn replace(&mut self, kvs: BTreeMap<String, Kv>, leases: HashMap<LeaseId, LeaseState>) {
        let before = std::mem::replace(&mut self.kvs, kvs);
        for key in before.keys() {
            if !self.kvs.contains_key(key) {
                self.batch
                    .push((key.clone(), QueueChange::Delete(key.as_bytes().to_vec())));
            }
        }
        let keys: Vec<String> = self.kvs.keys().cloned().collect();
        for key in keys {
            if let Some(entry) = self.entry(&key) {
                self.batch.push((key, QueueChange::Put(entry)));
            }
        }
        self.leases = leases;
        self.by_deadline = self
            .leases
            .iter()
            .map(|(id, l)| (l.deadline, *id))
            .collect();
        // Every wait fails (its sender dropped), in key order: a simulation replays the order
        // in which their tasks wake (a map's own order differs from process to process).
        let mut waiters: Vec<_> = self.waiters.drain().collect();
        waiters.sort_by(|a, b| a.0.cmp(&b.0));
        drop(waiters);
        // Value waiters hear the new value (or its absence) through `publish`.
        self.publish();
    }

    fn queue(&self, queue: &str) -> Vec<Entry> {
        let prefix = format!("{queue}/");
        let mut entries: Vec<Entry> = self
            .kvs
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter_map(|(k, _)| self.entry(k))
            .collect();
        entries.sort_by_key(Entry::position);
        entries
    }

    /// Removes `key` and wakes the waiters of the removed incarnation. Returns the number
    /// of waiters woken.
    fn remove_key(&mut self, key: &str) -> u64 {
        let Some(kv) = self.kvs.remove(key) else {
            return 0;
        };
        self.batch
            .push((key.to_owned(), QueueChange::Delete(key.as_bytes().to_vec())));
        if let Some(lease) = kv.lease.and_then(|l| self.leases.get_mut(&l)) {
            lease.keys.remove(key);
        }
        let mut woken = 0;
        if let Some(waiters) = self.waiters.remove(key) {
            for (create, tx) in waiters {
                if create == kv.create && tx.send(()).is_ok() {
                    woken += 1;
                }
            }
        }
        woken
    }

    fn put(&mut self, key: &str, value: Vec<u8>, lease: Option<LeaseId>) {
        if let Some(kv) = self.kvs.get_mut(key) {
            kv.value = value;
        } else {
            self.kvs.insert(
                key.to_owned(),
                Kv {
                    value,
                    create: self.revision,
                    lease,
                },
            );
            if let Some(l) = lease.and_then(|l| self.leases.get_mut(&l)) {
                l.keys.insert(key.to_owned());
            }
        }
        if let Some(entry) = self.entry(key) {
            self.batch.push((key.to_owned(), QueueChange::Put(entry)));
        }
    }

    /// Drops a lease and its keys in one revision, as etcd does.
    fn drop_lease(&mut self, id: LeaseId) -> u64 {
        let Some(lease) = self.leases.remove(&id) else {
            return 0;
        };
        self.by_deadline.remove(&(lease.deadline, id));
        if lease.keys.is_empty() {
            return 0;
        }
        self.revision += 1;
        lease.keys.iter().map(|k| self.remove_key(k)).sum()
    }

    fn expire(&mut self, now: Instant) -> u64 {
        let mut woken = 0;
        while let Some(&(deadline, id)) = self.by_deadline.first() {
            if deadline > now {
                break;
            }
            woken += self.drop_lease(id);
        }
        woken
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.by_deadline.first().map(|(deadline, _)| *deadline)
    }

    /// Renews lease `id` to `now + ttl`; its TTL, or `None` if it does not exist.
    fn renew(&mut self, id: LeaseId, now: Instant) -> Option<Duration> {
        let lease = self.leases.get_mut(&id)?;
        self.by_deadline.remove(&(lease.deadline, id));
        lease.deadline = now + lease.ttl;
        self.by_deadline.insert((lease.deadline, id));
        Some(lease.ttl)
    }

    /// Publishes the changes made under the current lock as one batch: observers never see
    /// the states in between (as etcd's watch delivers a transaction's events together).
    fn publish(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.batch);
        for (key, _) in &batch {
            let Some(waiters) = self.value_waiters.remove(key) else {
                continue;
            };
            let now = self.kvs.get(key).map(|kv| kv.value.clone());
            let (changed, same): (Vec<_>, Vec<_>) =
                waiters.into_iter().partition(|(seen, _)| *seen != now);
            for (_, tx) in changed {
                let _ = tx.send(now.clone());
            }
            let same: Vec<_> = same.into_iter().filter(|(_, tx)| !tx.is_closed()).collect();
            if !same.is_empty() {
                self.value_waiters.insert(key.clone(), same);
            }
        }
        // An observer whose stream was dropped has a closed queue: forget it.
        self.observers.retain(|o| {
            let mine: Vec<QueueChange> = batch
                .iter()
                .filter(|(key, _)| key.starts_with(&o.prefix))
                .map(|(_, change)| change.clone())
                .collect();
            mine.is_empty() || o.changes.send(mine).is_ok()
        });
    }
}

impl MemoryBackend {
    /// A new, empty store, and a client of it. The store is new, so nothing from before can
    /// be held: its first epoch begins without a grace, with tokens equal to the revision at
    /// which each entry was created.
    pub fn new() -> Self {
        let created = Instant::now();
        let state = State {
            marker: Some((Epoch::new(crate::epoch::random_u128(), 1, 1), None)),
            ..State::default()
        };
        let shared = Arc::new(Shared {
            state: StdMutex::new(state),
            created,
            deadlines_changed: Arc::default(),
            reaper_started: AtomicBool::new(false),
            unavailable: AtomicBool::new(false),
            wakeups: AtomicU64::new(0),
            partitioned: StdMutex::default(),
        });
        MemoryBackend {
            shared,
            epochs: Arc::new(Self::epochs_with(crate::SessionOptions::DEFAULT_TTL)),
        }
    }

    fn epochs_with(grace: Duration) -> StoreEpochs {
        StoreEpochs::new("the in-memory store", grace)
    }

    /// Another client of the same store: it shares the store's keys, leases and clock, and
    /// remembers nothing of the store yet (as another process would not). Its restart grace
    /// is this client's.
    #[must_use]
    pub fn client(&self) -> MemoryBackend {
        MemoryBackend {
            shared: Arc::clone(&self.shared),
            epochs: Arc::new(Self::epochs_with(self.epochs.grace())),
        }
    }

    /// This client with restart grace `grace`: after the store forgot, nothing is granted
    /// until `grace` has passed since the new epoch began. At least the longest session TTL
    /// of every client (default: 60 s, the default TTL). Call it before the client is used:
    /// it forgets what the client remembered of the store.
    #[must_use]
    pub fn with_restart_grace(mut self, grace: Duration) -> MemoryBackend {
        self.epochs = Arc::new(Self::epochs_with(grace));
        self
    }

    /// Fault injection: the store loses everything (keys, leases, the epoch marker) and its
    /// revision starts over, as an etcd restarted without its data dir would. Waits in
    /// progress fail (and look again); observers see every entry go. Lease ids are not
    /// reused. The next client request begins a new epoch.
    pub fn lose_state(&self) {
        let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        state.replace(BTreeMap::new(), HashMap::new());
        state.revision = 1;
        state.marker = None;
        drop(state);
        self.shared.deadlines_changed.notify_one();
    }

    /// A copy of the store as it is now (keys, leases, revision, epoch marker), for
    /// [`restore`](Self::restore).
    pub fn snapshot(&self) -> MemorySnapshot {
        let state = self.lock_state();
        MemorySnapshot {
            revision: state.revision,
            marker: state.marker,
            kvs: state
                .kvs
                .iter()
                .map(|(k, kv)| (k.clone(), (kv.value.clone(), kv.create, kv.lease)))
                .collect(),
            leases: state.leases.iter().map(|(id, l)| (*id, l.ttl)).collect(),
        }
    }

    /// Fault injection: the store goes back to `snapshot`, as a server restored from a
    /// snapshot or a backup does: keys, leases (each with its full TTL from now, as etcd
    /// renews leases when it recovers), revision and epoch marker as they were. Waits in
    /// progress fail (and look again); observers see the difference. Lease ids are not
    /// reused.
    ///
    /// A client that saw a revision higher than the snapshot's notices (a new epoch); one
    /// that never saw past it cannot tell a restore from nothing (`docs/guarantees.md`).
    pub fn restore(&self, snapshot: &MemorySnapshot) {
        let now = Instant::now();
        let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut leases: HashMap<LeaseId, LeaseState> = snapshot
            .leases
            .iter()
            .map(|(id, ttl)| {
                let lease = LeaseState {
                    ttl: *ttl,
                    deadline: now + *ttl,
                    keys: BTreeSet::new(),
                };
                (*id, lease)
            })
            .collect();
        let kvs = snapshot
            .kvs
            .iter()
            .map(|(key, (value, create, lease))| {
                if let Some(l) = lease.and_then(|l| leases.get_mut(&l)) {
                    l.keys.insert(key.clone());
                }
                let kv = Kv {
                    value: value.clone(),
                    create: *create,
                    lease: *lease,
                };
                (key.clone(), kv)
            })
            .collect();
        state.marker = snapshot.marker;
        state.replace(kvs, leases);
        state.revision = snapshot.revision;
        drop(state);
        self.shared.deadlines_changed.notify_one();
    }

    /// Fault injection: while `true`, every operation fails with [`Error::Unavailable`], as if
    /// the network to the server were cut. Leases keep expiring meanwhile.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.shared.unavailable.store(unavailable, Ordering::SeqCst);
    }

    /// Fault injection for one owner: while partitioned, renewals of `lease` fail with
    /// [`Error::Unavailable`], as if its process were paused or cut off from the server, and
    /// the lease expires after its TTL. Everything else keeps working.
    pub fn partition_lease(&self, lease: LeaseId, partitioned: bool) {
        let mut set = self
            .shared
            .partitioned
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if partitioned {
            set.insert(lease);
        } else {
            set.remove(&lease);
        }
    }

    /// How many deletion waits ([`Backend::wait_gone`]) were woken by a deletion so far: the
    /// in-process analogue of the watch events etcd sends. One release should add one.
    pub fn wakeups(&self) -> u64 {
        self.shared.wakeups.load(Ordering::SeqCst)
    }

    /// The number of keys stored, leased or not.
    pub fn key_count(&self) -> usize {
        self.lock_state().kvs.len()
    }

    /// Locks the state after expiring every lease whose deadline has passed, so that each
    /// operation sees the store as of now even if the reaper has not run yet.
    fn lock_state(&self) -> StdMutexGuard<'_, State> {
        // A poisoned lock means a panic inside one of the short critical sections below; the
        // state is still consistent (every section mutates in one step), so keep going.
        let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        let woken = state.expire(Instant::now());
        state.publish();
        self.shared.wakeups.fetch_add(woken, Ordering::SeqCst);
        state
    }

    /// The state, for a request: fails while the store is unavailable, and first does what
    /// a network backend does with each answer: notices a store that forgot (no marker, or
    /// a revision below one this client saw) and begins a new epoch, and enters the store's
    /// epoch (with the rest of its grace).
    fn available(&self) -> Result<Answering<'_>> {
        if self.shared.unavailable.load(Ordering::SeqCst) {
            return Err(Error::Unavailable);
        }
        let mut state = self.lock_state();
        let now = Instant::now();
        // One lock, one order: every answer is read after the one before it.
        let _ = self.epochs.saw(b"memory", &[state.revision], now);
        let stale = state
            .marker
            .is_none_or(|(epoch, _)| !self.epochs.may_enter(&epoch));
        if stale {
            // A marker refused (from before the store went back, or below what this client
            // saw) may have had its grace pass and its tokens handed out, up to its token at
            // the revision now: the new epoch starts above them too (with the clock stepped
            // back, nothing else would put it there).
            if let Some((refused, _)) = state.marker {
                self.epochs.above(refused.token(state.revision).get());
            }
            // The store's clock, as a network store's clients use the wall clock: later
            // epochs start far above the first one's tokens (its revisions).
            // Stepped with the wall clock when a test steps it (`testing::step_wall_clock`).
            let clock = crate::epoch::stepped(
                u64::try_from((now - self.shared.created).as_micros())
                    .unwrap_or(u64::MAX)
                    .saturating_add(CLOCK_START),
            );
            let epoch = self.epochs.next_epoch(state.revision, clock);
            // Leases from before stay until they expire: their owners stop renewing them
            // when they notice the new epoch, as on a network store.
            state.marker = Some((epoch, Some(now + self.epochs.grace())));
        }
        if let Some((epoch, grace_end)) = state.marker {
            let left = grace_end
                .map(|end| end.saturating_duration_since(now))
                .filter(|left| !left.is_zero());
            self.epochs.enter(epoch, left);
        }
        Ok(Answering {
            state,
            epochs: &self.epochs,
        })
    }

    fn start_reaper(&self) {
        if self.shared.reaper_started.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
        let changed = Arc::clone(&self.shared.deadlines_changed);
        tokio::spawn(async move {
            loop {
                let notified = changed.notified();
                let Some(shared) = weak.upgrade() else { return };
                let next = {
                    let mut state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
                    let woken = state.expire(Instant::now());
                    state.publish();
                    shared.wakeups.fetch_add(woken, Ordering::SeqCst);
                    state.next_deadline()
                };
                drop(shared);
                match next {
                    Some(at) => {
                        tokio::select! {
                            () = tokio::time::sleep_until(at) => {}
                            () = notified => {}
                        }
                    }
                    None => notified.await,
                }
            }
        });
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Let the reaper notice that the backend is gone.
        self.deadlines_changed.notify_one();
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        if ttl.is_zero() {
            return Err(Error::InvalidArgument(
                "lease TTL must be greater than zero",
            ));
        }
        let id = {
            let mut state = self.available()?;
            let id = LeaseId::new(state.next_lease);
            state.next_lease += 1;
            let deadline = Instant::now() + ttl;
            state.leases.insert(
                id,
                LeaseState {
                    ttl,
                    deadline,
                    keys: BTreeSet::new(),
                },
            );
            state.by_deadline.insert((deadline, id));
            id
        };
        self.start_reaper();
        self.shared.deadlines_changed.notify_one();
        Ok(Lease::new(id, ttl))
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>> {
        let partitioned = self
            .shared
            .partitioned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&lease);
        if partitioned {
            return Err(Error::Unavailable);
        }
        Ok(self.available()?.renew(lease, Instant::now()))
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        let mut state = self.available()?;
        let woken = state.drop_lease(lease);
        state.publish();
        self.shared.wakeups.fetch_add(woken, Ordering::SeqCst);
        Ok(())
    }

    async fn enqueue(
        &self,
        queue: &str,
        tag: &str,
        lease: LeaseId,
        value: &[u8],
    ) -> Result<Enqueued> {
        let mut state = self.available()?;
        let key = format!("{queue}/{tag}");
        if !state.kvs.contains_key(&key) {
            if !state.leases.contains_key(&lease) {
                return Err(Error::SessionLost(LostReason::Revoked));
            }
            let predecessor = state.queue(queue).pop();
            state.revision += 1;
            state.put(&key, value.to_vec(), Some(lease));
            state.publish();
            let entry = state.entry(&key).ok_or(Error::EntryGone { key })?;
            return Ok(Enqueued::new(entry, predecessor.is_none(), predecessor));
        }
        let entry = state.entry(&key).ok_or(Error::EntryGone { key })?;
        let is_head = state
            .queue(queue)
            .first()
            .is_some_and(|h| h.key() == entry.key());
        Ok(Enqueued::new(entry, is_head, None))
    }

    async fn find_entry(&self, queue: &str, tag: &str) -> Result<Option<Entry>> {
        Ok(self.available()?.entry(&format!("{queue}/{tag}")))
    }

    async fn predecessor(&self, mine: &Entry) -> Result<Option<Entry>> {
        let state = self.available()?;
        if !state.is_live(mine) {
            return Err(Error::EntryGone {
                key: mine.key().to_owned(),
            });
        }
        let queue = queue_of(mine.key());
        Ok(state
            .queue(queue)
            .into_iter()
            .take_while(|e| e.position() < mine.position())
            .last())
    }

    async fn ahead(&self, queue: &str, mine: &Entry, limit: usize) -> Result<Vec<Entry>> {
        let state = self.available()?;
        if !state.is_live(mine) {
            return Err(Error::EntryGone {
                key: mine.key().to_owned(),
            });
        }
        let mut before: Vec<Entry> = state
            .queue(queue)
            .into_iter()
            .take_while(|e| e.position() < mine.position())
            .collect();
        before.reverse();
        before.truncate(limit);
        Ok(before)
    }

    async fn was_head(&self, mine: &Entry) -> Result<bool> {
        // One store, always current: the exact answer.
        super::present_without_predecessor(self, mine).await
    }

    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        let rx = {
            let mut state = self.available()?;
            if !state.is_live(entry) {
                return Ok(());
            }
            let (tx, rx) = oneshot::channel();
            let waiters = state.waiters.entry(entry.key().to_owned()).or_default();
            waiters.retain(|(_, tx)| !tx.is_closed());
            waiters.push((entry.token().get(), tx));
            rx
        };
        // The sender is dropped unsent only if the backend itself is dropped.
        rx.await.map_err(|_| Error::Unavailable)
    }

    async fn head(&self, queue: &str) -> Result<Option<Entry>> {
        Ok(self.available()?.queue(queue).into_iter().next())
    }

    async fn entries(&self, queue: &str) -> Result<Vec<Entry>> {
        Ok(self.available()?.queue(queue))
    }

    async fn entries_under(&self, prefix: &str) -> Result<Vec<Entry>> {
        let state = self.available()?;
        Ok(state
            .kvs
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(_, kv)| kv.lease.is_some())
            .filter_map(|(k, _)| state.entry(k))
            .collect())
    }

    async fn delete_entry(&self, entry: &Entry) -> Result<bool> {
        self.guarded(entry, &[WriteOp::delete(entry.key())]).await
    }

    async fn update_entry(&self, entry: &Entry, value: &[u8]) -> Result<bool> {
        self.guarded(entry, &[WriteOp::put(entry.key(), value)])
            .await
    }

    async fn guarded(&self, entry: &Entry, ops: &[WriteOp]) -> Result<bool> {
        let mut state = self.available()?;
        if !state.is_live(entry) {
            return Ok(false);
        }
        state.revision += 1;
        let mut woken = 0;
        for op in ops {
            match op {
                WriteOp::Put { key, value } => state.put(key, value.clone(), None),
                WriteOp::Delete { key } => woken += state.remove_key(key),
            }
        }
        state.publish();
        self.shared.wakeups.fetch_add(woken, Ordering::SeqCst);
        Ok(true)
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.available()?.kvs.get(key).map(|kv| kv.value.clone()))
    }

    async fn swap(&self, key: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<bool> {
        let mut state = self.available()?;
        if state.kvs.get(key).map(|kv| kv.value.as_slice()) != expected {
            return Ok(false);
        }
        state.revision += 1;
        state.put(key, new.to_vec(), None);
        state.publish();
        Ok(true)
    }

    async fn wait_value(&self, key: &str, seen: Option<&[u8]>) -> Result<Option<Vec<u8>>> {
        let rx = {
            let mut state = self.available()?;
            let now = state.kvs.get(key).map(|kv| kv.value.clone());
            if now.as_deref() != seen {
                return Ok(now);
            }
            let (tx, rx) = oneshot::channel();
            let waiters = state.value_waiters.entry(key.to_owned()).or_default();
            waiters.retain(|(_, tx)| !tx.is_closed());
            waiters.push((now, tx));
            rx
        };
        // The sender is dropped unsent only if the backend itself is dropped.
        rx.await.map_err(|_| Error::Unavailable)
    }

    async fn lease_ttl(&self, lease: LeaseId) -> Result<Option<Duration>> {
        let now = Instant::now();
        Ok(self
            .available()?
            .leases
            .get(&lease)
            .map(|l| l.deadline.saturating_duration_since(now)))
    }

    fn epochs(&self) -> Option<&StoreEpochs> {
        Some(&self.epochs)
    }

    fn observe_head(&self, queue: &str) -> BoxStream<'static, Result<HeadEvent>> {
        /// Before the first poll: nothing subscribed yet. Then: the subscription and the
        /// copy of the queue it keeps current.
        enum Observing {
            Start(MemoryBackend, String),
            Running(mpsc::UnboundedReceiver<Vec<QueueChange>>, QueueMirror),
        }
        let start = Observing::Start(self.clone(), queue.to_owned());
        futures::stream::unfold(start, |state| async move {
            match state {
                Observing::Start(backend, queue) => {
                    // Subscribe and snapshot under one lock: no change falls between the two.
                    let (changes, entries) = {
                        let mut state = backend.lock_state();
                        let (tx, rx) = mpsc::unbounded_channel();
                        state.observers.push(Observer {
                            prefix: format!("{queue}/"),
                            changes: tx,
                        });
                        (rx, state.queue(&queue))
                    };
                    let mut mirror = QueueMirror::default();
                    mirror.reset(entries);
                    let first = mirror.head_change()?;
                    Some((Ok(first), Observing::Running(changes, mirror)))
                }
                Observing::Running(mut changes, mut mirror) => loop {
                    // `None` only once the backend itself is gone.
                    for change in changes.recv().await? {
                        mirror.apply(change);
                    }
                    if let Some(event) = mirror.head_change() {
                        return Some((Ok(event), Observing::Running(changes, mirror)));
                    }
                },
            }
        })
        .boxed()
    }
}

/// The store's state while it answers one request; the client takes in the store's position
/// (its revision) as the answer leaves, as a network client reads it from the answer.
struct Answering<'a> {
    state: StdMutexGuard<'a, State>,
    epochs: &'a StoreEpochs,
}

impl std::ops::Deref for Answering<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

impl std::ops::DerefMut for Answering<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.state
    }
}

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        let _ = self
            .epochs
            .saw(b"memory", &[self.state.revision], Instant::now());
        // Every token of this epoch so far is at most the one of the store's revision: a new
        // epoch this client begins starts above it, whatever the clock says (a clock stepped
        // back would otherwise start it below tokens handed out before).
        let _ = self.epochs.token(self.state.revision);
    }
}

/// The clock new epochs' tokens start from (microseconds) when the store is created: far
/// above the revisions of its first epoch, whose tokens are the revisions.
const CLOCK_START: u64 = 1_000_000_000;

/// A key as a snapshot keeps it: value, create revision, lease.
type SavedKv = (Vec<u8>, u64, Option<LeaseId>);

/// A copy of a [`MemoryBackend`]'s store, from [`MemoryBackend::snapshot`].
#[derive(Debug, Clone)]
pub struct MemorySnapshot {
    revision: u64,
    marker: Option<(Epoch, Option<Instant>)>,
    kvs: Vec<(String, SavedKv)>,
    leases: Vec<(LeaseId, Duration)>,
}

impl MemorySnapshot {
    /// The store's revision when the snapshot was taken: a restore loses what was written
    /// since only if the store's revision is past it by then.
    pub fn revision(&self) -> u64 {
        self.revision
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn entries_order_by_creation_not_by_key() {
        let b = MemoryBackend::new();
        let l1 = b.grant_lease(Duration::from_secs(5)).await.unwrap().id();
        let l2 = b.grant_lease(Duration::from_secs(5)).await.unwrap().id();
        let zz = b.enqueue("q", "zz", l1, b"").await.unwrap();
        let aa = b.enqueue("q", "aa", l2, b"").await.unwrap();
        assert!(zz.is_head() && !aa.is_head());
        assert_eq!(zz.predecessor(), None);
        assert_eq!(aa.predecessor(), Some(zz.entry()), "read in the same step");
        let keys: Vec<_> = b
            .entries("q")
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.key().to_owned())
            .collect();
        assert_eq!(keys, ["q/zz", "q/aa"]);
        // A queue is its prefix plus '/': "q2/..." is not in queue "q".
        b.enqueue("q2", "x", l1, b"").await.unwrap();
        assert_eq!(b.entries("q").await.unwrap().len(), 2);
        assert_eq!(
            b.predecessor(aa.entry()).await.unwrap(),
            Some(zz.entry().clone())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn enqueue_is_idempotent_per_tag_and_needs_a_live_lease() {
        let b = MemoryBackend::new();
        let lease = b.grant_lease(Duration::from_secs(1)).await.unwrap().id();
        let first = b.enqueue("q", "t", lease, b"v").await.unwrap();
        let again = b.enqueue("q", "t", lease, b"other").await.unwrap();
        assert_eq!(first, again);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            b.entries("q").await.unwrap().is_empty(),
            "expired with its lease"
        );
        let late = b.enqueue("q", "t", lease, b"v").await;
        assert!(matches!(late, Err(Error::SessionLost(LostReason::Revoked))));
        assert_eq!(b.key_count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_gone_returns_at_once_for_a_gone_entry() {
        let b = MemoryBackend::new();
        let lease = b.grant_lease(Duration::from_secs(5)).await.unwrap().id();
        let e = b
            .enqueue("q", "t", lease, b"")
            .await
            .unwrap()
            .into_parts()
            .0;
        assert!(b.delete_entry(&e).await.unwrap());
        b.wait_gone(&e).await.unwrap();
        assert!(
            !b.delete_entry(&e).await.unwrap(),
            "acts only on live entries"
        );
    }
}
