//! [`RwLock`]: many readers or one writer, in one FIFO queue, and its guards.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sync_wrapper::SyncFuture;
use tracing::Instrument;

use crate::error::{Error, Result};
use crate::fence::Ticket;
use crate::metrics::{Meter, Recipe};
use crate::queue::{self, Fewer, Held, Limit, Mode, Shared, Turn};
use crate::session::Session;

/// A fair distributed read-write lock: many readers at once, or one writer.
///
/// Readers and writers share one queue, ordered by arrival. Entries are
/// `<name>/read/<lease hex>_<k>` and `<name>/write/<lease hex>_<k>` (the prefixes of etcd's
/// Go `recipes.RWMutex`), each bound to its session's lease.
///
/// # Guarantees
/// - **FIFO, no writer starvation**: a reader holds once no writer is ahead of it (it
///   watches the newest writer ahead); a writer holds once nothing is ahead of it (it watches
///   the entry just ahead). A reader that arrives after a waiting writer waits behind it.
/// - **Writers exclude**: two writers never hold at once, nor a writer and a reader,
///   including when a waiter between them gives up or its lease expires (the bug of etcd's
///   Go RWMutex, etcd issue 16221): a writer that wakes looks again at the whole queue
///   ahead and holds only if it is empty, and only while its own entry exists.
/// - **Fencing**: [`RwLockWriteGuard::fencing_token`] increases strictly in the order writers
///   are granted, and is higher than every reader granted before. Use
///   [`RwLockWriteGuard::ticket`] with a [`Fence`](crate::Fence) as for a
///   [`Mutex`](crate::Mutex). Readers' tokens are unique, but readers hold together: see
///   [`Semaphore`](crate::Semaphore) for what a resource can conclude from them.
/// - Each guard reports its loss ([`RwLockReadGuard::lost`], [`RwLockWriteGuard::lost`]), and
///   a crashed holder's entry vanishes with its lease.
///
/// # Upgrade and downgrade
/// - **Upgrade (read -> write) is refused**: a write asked for through a handle whose read
///   guards are alive fails with [`Error::Upgrade`]. The write entry would queue behind our
///   own read entry and wait for it forever (it deadlocks in every peer that allows it).
///   Release the read lock first.
/// - **Downgrade (write -> read) is not offered**: an entry's kind is part of its key, and a
///   key cannot be renamed while keeping its place in the queue. A new read entry would queue
///   behind the writers already waiting, and one of them would take the lock between our
///   write release and our read: the window a downgrade must not have.
///
/// # Failure modes
/// As for [`Mutex`](crate::Mutex): session loss while waiting ends the call with
/// [`Error::SessionLost`]; a call that fails or is dropped part way leaves no entry; a guard
/// whose entry is gone is told through `lost()`, and its release fails with
/// [`Error::NotOwner`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
/// use baton::{MemoryBackend, RwLock, Session};
/// let session = Session::new(MemoryBackend::new()).await?;
/// let config = RwLock::new(&session, "config/lock")?;
/// let r1 = config.read().await?;
/// let r2 = config.read().await?; // readers share
/// // A write through this handle now would wait for its own reads: refused.
/// assert!(matches!(config.write().await, Err(baton::Error::Upgrade { .. })));
/// // Another handle (another task) waits, or with `try_write` is told the lock is busy.
/// let other = config.clone();
/// assert!(matches!(other.try_write().await, Err(baton::Error::Locked { .. })));
/// r1.release().await?;
/// r2.release().await?;
/// let w = other.write().await?;
/// w.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RwLock {
    session: Session,
    name: Arc<str>,
    readers: Arc<str>,
    writers: Arc<str>,
    read_meter: Arc<Meter>,
    write_meter: Arc<Meter>,
    owner: Vec<u8>,
    /// Read guards of this handle still alive: a write asked for meanwhile is an upgrade.
    reading: Arc<AtomicUsize>,
}

impl Clone for RwLock {
    /// A handle on the same lock, with its own count of read guards (a task that holds a
    /// read lock through one handle may wait for a write through another).
    fn clone(&self) -> Self {
        RwLock {
            session: self.session.clone(),
            name: Arc::clone(&self.name),
            readers: Arc::clone(&self.readers),
            writers: Arc::clone(&self.writers),
            read_meter: Arc::clone(&self.read_meter),
            write_meter: Arc::clone(&self.write_meter),
            owner: self.owner.clone(),
            reading: Arc::default(),
        }
    }
}

impl RwLock {
    /// A read-write lock named `name`. Nothing is sent until the first call.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty name or one ending in `/`.
    pub fn new(session: &Session, name: impl Into<String>) -> Result<RwLock> {
        let name = queue::recipe_name(session, name.into())?;
        Ok(RwLock {
            session: session.clone(),
            readers: format!("{name}/read").into(),
            writers: format!("{name}/write").into(),
            read_meter: Meter::new(Recipe::Read, &name),
            write_meter: Meter::new(Recipe::Write, &name),
            name,
            owner: crate::inspect::default_owner(),
            reading: Arc::default(),
        })
    }

    /// Sets the value stored in this contender's entries (default `host=<host name> pid=<process id>`).
    #[must_use]
    pub fn with_owner_info(mut self, info: impl Into<Vec<u8>>) -> RwLock {
        self.owner = info.into();
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits until no writer is ahead of us, then holds a read lock.
    ///
    /// # Errors
    /// As for [`Mutex::lock`](crate::Mutex::lock).
    ///
    /// # Cancel safety
    /// Dropping the future at any point gives up the place in the queue and leaves no entry.
    pub fn read(&self) -> impl Future<Output = Result<RwLockReadGuard>> + Send + Sync + '_ {
        SyncFuture::new(self.take_read(Mode::Wait))
    }

    /// Takes a read lock only if no writer holds or waits; never waits.
    ///
    /// # Errors
    /// [`Error::Locked`] if a writer holds or waits (no entry is left behind); otherwise as
    /// for [`read`](RwLock::read).
    ///
    /// # Cancel safety
    /// As for [`read`](RwLock::read).
    pub fn try_read(&self) -> impl Future<Output = Result<RwLockReadGuard>> + Send + Sync + '_ {
        SyncFuture::new(self.take_read(Mode::Try))
    }

    /// Waits until nothing is ahead of us, then holds the write lock.
    ///
    /// # Errors
    /// [`Error::Upgrade`] if read guards of this handle are alive (nothing is created);
    /// otherwise as for [`Mutex::lock`](crate::Mutex::lock).
    ///
    /// # Cancel safety
    /// Dropping the future at any point gives up the place in the queue and leaves no entry.
    pub fn write(&self) -> impl Future<Output = Result<RwLockWriteGuard>> + Send + Sync + '_ {
        SyncFuture::new(self.take_write(Mode::Wait))
    }

    /// Takes the write lock only if no one holds or waits; never waits.
    ///
    /// # Errors
    /// [`Error::Locked`] if anyone holds or waits (no entry is left behind); otherwise as for
    /// [`write`](RwLock::write).
    ///
    /// # Cancel safety
    /// As for [`write`](RwLock::write).
    pub fn try_write(&self) -> impl Future<Output = Result<RwLockWriteGuard>> + Send + Sync + '_ {
        SyncFuture::new(self.take_write(Mode::Try))
    }

    async fn take_read(&self, mode: Mode) -> Result<RwLockReadGuard> {
        // Counted from the start, so that a write asked for while this read waits is refused
        // too: it would queue behind this read.
        let reading = Reading::new(&self.reading);
        // Readers hold together; a writer, or any entry of another kind under the name (a
        // Mutex's, a permit, `etcdctl lock`'s), ahead of this one holds it back.
        let rule = Fewer {
            of: &self.name,
            limit: Limit::None,
            kind: Some(Shared {
                name: &self.name,
                mark: queue::READ,
            }),
        };
        let value = queue::marked(queue::READ, &self.owner);
        let held = self
            .take(&self.readers, &rule, value, "read", &self.read_meter, mode)
            .await?;
        Ok(RwLockReadGuard {
            held,
            _reading: reading,
        })
    }

    async fn take_write(&self, mode: Mode) -> Result<RwLockWriteGuard> {
        if self.reading.load(Ordering::Acquire) > 0 {
            return Err(Error::Upgrade {
                name: self.name.to_string(),
            });
        }
        queue::check_exclusive_value(&self.owner)?;
        let rule = Fewer {
            of: &self.name,
            limit: Limit::Fixed(1),
            kind: None,
        };
        let held = self
            .take(
                &self.writers,
                &rule,
                self.owner.clone(),
                "write",
                &self.write_meter,
                mode,
            )
            .await?;
        Ok(RwLockWriteGuard { held })
    }

    /// Queues in `queue` and holds once no entry of `blockers` is ahead; timed by `meter`.
    async fn take(
        &self,
        queue: &Arc<str>,
        rule: &Fewer<'_>,
        value: Vec<u8>,
        kind: &'static str,
        meter: &Arc<Meter>,
        mode: Mode,
    ) -> Result<Held> {
        let span = tracing::debug_span!(
            "baton.rwlock",
            name = %self.name,
            kind,
            try_lock = mode == Mode::Try,
            key = tracing::field::Empty,
            token = tracing::field::Empty,
        );
        let ask = queue::Ask {
            meter,
            queue,
            value,
            mode,
            turn: Turn::Fewer(rule),
        };
        queue::acquire(&self.session, ask).instrument(span).await
    }
}

/// Counts a read guard (or a read being taken) of one handle while it lives.
#[derive(Debug)]
struct Reading(Arc<AtomicUsize>);

impl Reading {
    fn new(count: &Arc<AtomicUsize>) -> Reading {
        count.fetch_add(1, Ordering::AcqRel);
        Reading(Arc::clone(count))
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A read lock of an [`RwLock`]. Release it with [`release`](RwLockReadGuard::release);
/// dropping it releases in the background.
#[must_use = "the read lock is released in the background as soon as the guard is dropped"]
#[derive(Debug)]
pub struct RwLockReadGuard {
    held: Held,
    _reading: Reading,
}

crate::guard::entry_guard!(RwLockReadGuard, "the read lock");
crate::guard::release_guard!(RwLockReadGuard, "the read lock");

/// The write lock of an [`RwLock`]. Release it with [`release`](RwLockWriteGuard::release);
/// dropping it releases in the background.
#[must_use = "the write lock is released in the background as soon as the guard is dropped"]
#[derive(Debug)]
pub struct RwLockWriteGuard {
    held: Held,
}

crate::guard::entry_guard!(RwLockWriteGuard, "the write lock");
crate::guard::release_guard!(RwLockWriteGuard, "the write lock");

impl RwLockWriteGuard {
    /// The fencing token with the lock's name, for a [`Fence`](crate::Fence).
    pub fn ticket(&self) -> Ticket {
        Ticket::new(self.fencing_token(), self.held.queue())
    }
}
