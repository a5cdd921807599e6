//! [`Mutex`]: the queue-fair distributed lock, and its [`MutexGuard`].

use std::future::Future;
use std::sync::Arc;

use sync_wrapper::SyncFuture;
use tracing::Instrument;

#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::fence::Ticket;
use crate::metrics::{Meter, Recipe};
use crate::queue::{self, Held, Mode, Turn};
use crate::session::Session;

/// A queue-fair distributed lock with fencing tokens.
///
/// Each contender creates one key, `<name>/<lease id in hex>`, bound to its session's lease;
/// the oldest key holds the lock. A waiter watches only the key created just before its own,
/// so a release wakes exactly one waiter however long the queue is. The layout is etcd's Go
/// recipe (`concurrency.NewMutex`), so baton, Go services and `etcdctl lock <name>` share
/// locks.
///
/// # Guarantees
/// - **FIFO**: the lock is granted in the order contenders entered the queue.
/// - **Fencing**: [`MutexGuard::fencing_token`] increases strictly in grant order, across all
///   clients. A resource that rejects tokens lower than the highest it has seen stays safe
///   even when a holder pauses past its lease.
/// - **Liveness**: a holder that crashes loses the lock when its lease expires (the session
///   TTL); a holder whose lease is lost is told through [`MutexGuard::lost`].
/// - Two tasks of one process using one [`Session`] and one name queue in process first,
///   then in the backend: they never share a key.
///
/// # Failure modes
/// - The session is lost while waiting: [`lock`](Mutex::lock) fails with
///   [`Error::SessionLost`], never returns a guard.
/// - The holder's lease is lost (expiry, revoke, partition longer than the TTL), or its key
///   is deleted from outside (an operator's `etcdctl del`): another contender may be granted
///   the lock; [`MutexGuard::lost`] resolves, guarded writes ([`MutexGuard::write`]) fail
///   with [`Error::NotOwner`], and so does [`release`](MutexGuard::release), so that the loss
///   is never hidden.
/// - A call that fails part way (the backend timed out after creating the key) leaves no key
///   behind: a cleanup task looks for the key and deletes it, retrying until that is
///   confirmed or the session is lost. Until then, other tasks of this process that use the
///   same session and name wait, so none of them can be granted the old key and its token.
///
/// Names that nest share a queue, as in etcd's Go recipes and `etcdctl lock`: a lock named
/// `job` sees the keys of a lock named `job/sub` (they live under `job/`) and waits behind
/// them. Use names that are not prefixes of one another (`job/lock`, `job/sub/lock`).
///
/// To give up after a while, wrap the call: `tokio::time::timeout(d, mutex.lock())`; the
/// timed-out call leaves nothing behind.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
/// use baton::{MemoryBackend, Mutex, Session};
/// let session = Session::new(MemoryBackend::new()).await?;
/// let mutex = Mutex::new(&session, "orders/lock")?;
/// let guard = mutex.lock().await?;
/// println!("holding {} with token {}", guard.key(), guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Mutex {
    session: Session,
    /// Shared with the session's in-process queue for this name.
    name: Arc<str>,
    meter: Arc<Meter>,
    owner: Vec<u8>,
}

impl Mutex {
    /// A lock named `name` (keys are `<name>/<lease hex>`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty name or one that ends in `/`: the rule of
    /// every recipe.
    pub fn new(session: &Session, name: impl Into<String>) -> Result<Mutex> {
        let name = queue::recipe_name(session, name.into())?;
        Ok(Mutex {
            session: session.clone(),
            meter: Meter::new(Recipe::Mutex, &name),
            name,
            owner: crate::inspect::default_owner(),
        })
    }

    /// Sets the value stored in this contender's key (default `host=<host name> pid=<process id>`): a short
    /// owner description shown by tools that list the queue. Readers need not parse it.
    #[must_use]
    pub fn with_owner_info(mut self, info: impl Into<Vec<u8>>) -> Mutex {
        self.owner = info.into();
        self
    }

    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits in the queue until this contender holds the lock.
    ///
    /// # Errors
    /// [`Error::SessionLost`] if the session is lost before the lock is granted (the key, if
    /// created, vanishes with the lease); [`Error::EntryGone`] if our key was deleted from
    /// outside while waiting; backend errors after retries. On every error, the key (if it
    /// was created, even by a request whose answer was lost) is removed in the background.
    ///
    /// # Cancel safety
    /// Dropping the future at any point gives up the place in the queue and leaves no key:
    /// a cleanup task, independent of the dropped future, waits for an in-flight create and
    /// deletes exactly the key it created.
    pub fn lock(&self) -> impl Future<Output = Result<MutexGuard>> + Send + Sync + '_ {
        SyncFuture::new(self.acquire(Mode::Wait))
    }

    /// Takes the lock only if no one holds it or waits for it; never waits.
    ///
    /// # Errors
    /// [`Error::Locked`] if it is held or contended (no key is left behind), or another task
    /// of this process holds it through the same session; otherwise as for
    /// [`lock`](Mutex::lock).
    ///
    /// # Cancel safety
    /// As for [`lock`](Mutex::lock): a dropped call leaves no key.
    pub fn try_lock(&self) -> impl Future<Output = Result<MutexGuard>> + Send + Sync + '_ {
        SyncFuture::new(self.acquire(Mode::Try))
    }

    async fn acquire(&self, mode: Mode) -> Result<MutexGuard> {
        queue::check_exclusive_value(&self.owner)?;
        let span = tracing::debug_span!(
            "baton.lock",
            name = %self.name,
            try_lock = mode == Mode::Try,
            key = tracing::field::Empty,
            token = tracing::field::Empty,
        );
        let held = queue::acquire(
            &self.session,
            queue::Ask {
                meter: &self.meter,
                queue: &self.name,
                value: self.owner.clone(),
                mode,
                turn: Turn::Head,
            },
        )
        .instrument(span)
        .await?;
        Ok(MutexGuard { held })
    }
}

/// Proof of holding a [`Mutex`]. Release it with [`release`](MutexGuard::release); dropping the
/// guard releases the lock in the background.
#[must_use = "the lock is released in the background as soon as the guard is dropped"]
#[derive(Debug)]
pub struct MutexGuard {
    held: Held,
}

crate::guard::entry_guard!(MutexGuard, "the lock");

impl MutexGuard {
    /// The fencing token together with the lock's name, for a [`Fence`](crate::Fence): the
    /// fence binds each resource to the first lock that claims it and refuses tokens of any
    /// other lock ([`Error::ForeignLock`]).
    pub fn ticket(&self) -> Ticket {
        Ticket::new(self.fencing_token(), self.held.queue())
    }

    /// Releases the lock: deletes our key if it is still ours (never a successor's key).
    ///
    /// # Errors
    /// [`Error::NotOwner`] if the key was already gone: the lock had been lost before this
    /// call (lease ended, key deleted from outside), so the protected work may have overlapped
    /// a successor's; nothing was deleted. Any other error ([`Error::OutcomeUnknown`]: the
    /// delete may have been applied; [`Error::Backend`]: it was not): the delete goes on in
    /// the background until it is confirmed or the session is lost (until then, other tasks of
    /// this process wait to take the same lock through this session).
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped before the delete answered, the release is
    /// finished by a background task, as when the guard is dropped.
    pub fn release(self) -> impl Future<Output = Result<()>> + Send + Sync + 'static {
        let span = tracing::debug_span!(
            "baton.release",
            key = %self.key(),
            token = self.fencing_token().get()
        );
        // Not an `async fn` or block: those would keep a second copy of the guard or of the
        // release in their state, and callers keep this future in theirs.
        SyncFuture::new(self.held.release().instrument(span))
    }

    /// The former name of [`release`](MutexGuard::release).
    ///
    /// # Errors
    /// As [`release`](MutexGuard::release).
    ///
    /// # Cancel safety
    /// As [`release`](MutexGuard::release).
    #[deprecated(since = "0.4.0", note = "every guard releases with `release`")]
    pub fn unlock(self) -> impl Future<Output = Result<()>> + Send + Sync + 'static {
        self.release()
    }
}
