//! [`Barrier`] (raised by holders, waited on by others) and [`DoubleBarrier`] (enter together,
//! leave together), on the same queue engine.

use std::future::Future;
use std::sync::Arc;

use sync_wrapper::SyncFuture;
use tracing::Instrument;

use crate::backend::{Backend, Entry};
use crate::error::{Error, LostReason, Result};
use crate::metrics::Meter;
use crate::queue::{self, Backoff, Held, Mode, Turn};
use crate::session::Session;

/// A barrier: up while anyone holds it, and [`wait`](Barrier::wait) returns once it is down.
///
/// [`hold`](Barrier::hold) raises it with an entry `<name>/<lease hex>_<k>` bound to the
/// holder's session; the barrier is down when no entry remains. Several holders may hold it
/// at once; it is down when the last lets go.
///
/// # Guarantees
/// - **A crashed holder does not keep it up**: its entry vanishes with its lease (the session
///   TTL), and waiters go on. (Curator's and kazoo's barriers are persistent nodes that stay
///   up forever when their owner dies.)
/// - [`wait`](Barrier::wait) misses no lowering: it watches the oldest holder's entry, then
///   looks again, until none is left.
///
/// # Failure modes
/// - A holder whose session is lost (or whose entry is deleted from outside) no longer holds
///   the barrier: it may come down; [`BarrierGuard::lost`] says so, and its
///   [`release`](BarrierGuard::release) fails with [`Error::NotOwner`].
/// - A `hold()` dropped or failed part way leaves no entry: a dropped call does not raise it.
/// - `wait()` returns a backend error only when a read fails after the backend's retries; it
///   keeps nothing, so it may simply be called again.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
/// use baton::{Barrier, MemoryBackend, Session};
/// let session = Session::new(MemoryBackend::new()).await?;
/// let gate = Barrier::new(&session, "deploy/gate")?;
/// let raised = gate.hold().await?;
/// assert!(gate.is_up().await?);
/// raised.release().await?;
/// gate.wait().await?; // down: returns at once
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Barrier {
    session: Session,
    name: Arc<str>,
    owner: Vec<u8>,
}

impl Barrier {
    /// A barrier named `name`. Nothing is sent until the first call.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty name or one ending in `/`.
    pub fn new(session: &Session, name: impl Into<String>) -> Result<Barrier> {
        Ok(Barrier {
            session: session.clone(),
            name: queue::recipe_name(session, name.into())?,
            owner: crate::inspect::default_owner(),
        })
    }

    /// The barrier's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Raises the barrier (or joins its holders) until the returned guard is released.
    ///
    /// # Errors
    /// [`Error::SessionLost`]; backend errors after retries (no entry is left behind).
    ///
    /// # Cancel safety
    /// Dropping the future leaves no entry: the barrier is not raised by a dropped call.
    pub fn hold(&self) -> impl Future<Output = Result<BarrierGuard>> + Send + Sync + '_ {
        let span = tracing::debug_span!("baton.barrier.hold", name = %self.name, key = tracing::field::Empty, token = tracing::field::Empty);
        SyncFuture::new(
            async move {
                let value = queue::marked(queue::BARRIER, &self.owner);
                let held = enter(&self.session, &self.name, value).await?;
                Ok(BarrierGuard { held })
            }
            .instrument(span),
        )
    }

    /// Whether anyone holds the barrier now.
    ///
    /// # Errors
    /// Backend errors after retries.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub fn is_up(&self) -> impl Future<Output = Result<bool>> + Send + Sync + '_ {
        SyncFuture::new(async move { Ok(self.session.backend().head(&self.name).await?.is_some()) })
    }

    /// Returns once the barrier is down: no holder left (released, or its session ended).
    ///
    /// # Errors
    /// Backend errors of a read after retries. (A failed watch is retried: it says nothing.)
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads and watches.
    pub fn wait(&self) -> impl Future<Output = Result<()>> + Send + Sync + '_ {
        SyncFuture::new(until_empty(&**self.session.backend(), &self.name))
    }
}

/// Creates an entry in `queue` that counts at once.
async fn enter(session: &Session, queue: &Arc<str>, value: Vec<u8>) -> Result<Held> {
    // Not in the lock metrics: a barrier's waits (for the count, for the last holder) are not
    // this entry's, and the entry is granted at once.
    let meter = Meter::unmetered(queue);
    let ask = queue::Ask {
        meter: &meter,
        queue,
        value,
        mode: Mode::Wait,
        turn: Turn::Enter,
    };
    queue::acquire(session, ask).await
}

/// Returns once `queue` has no entry.
async fn until_empty(backend: &dyn Backend, queue: &str) -> Result<()> {
    let mut backoff = Backoff::new();
    while let Some(oldest) = backend.head(queue).await? {
        if let Err(e) = backend.wait_gone(&oldest).await {
            tracing::debug!(%queue, error = %e, "watching the barrier failed; retrying");
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }
    Ok(())
}

/// A hold on a [`Barrier`]: the barrier stays up (at least) until it is released or its
/// session ends. Dropping it releases in the background.
#[must_use = "the barrier is lowered in the background as soon as the guard is dropped"]
#[derive(Debug)]
pub struct BarrierGuard {
    held: Held,
}

crate::guard::entry_guard!(BarrierGuard, "the hold (the barrier may then be down)");

impl BarrierGuard {
    /// Lets go of the barrier; it is down once no other holder remains.
    ///
    /// # Errors
    /// [`Error::NotOwner`] if our entry was already gone (the barrier may have come down
    /// early); other errors: the delete goes on in the background.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped release is finished in the background.
    pub fn release(self) -> impl Future<Output = Result<()>> + Send + Sync + 'static {
        SyncFuture::new(self.held.release())
    }
}

/// A double barrier: [`enter`](DoubleBarrier::enter) returns once `members` participants have
/// entered; [`DoubleBarrierGuard::leave`] returns once all of them have left.
///
/// Each participant is an entry `<name>/<lease hex>_<k>` bound to its session. The
/// participant whose entry completes the count records it at the key `<name>`
/// (`entered <token>`, the token of the newest entry it counted), and the others, watching
/// that key, go on: only entries that were counted are released, however late a participant
/// reads.
///
/// # Guarantees
/// - **No phantoms**: a participant whose session ends stops counting when its lease ends;
///   the others neither proceed on its account (before the count is complete) nor wait for it
///   to leave.
/// - **Nothing left behind**: an `enter()` that times out or is dropped deletes its entry.
/// - A waiter watches one key (the count record); entering wakes each waiter once, when the
///   count completes. Leaving watches the oldest remaining entry.
///
/// # Failure modes
/// - The session lost while entering or leaving ends the call with [`Error::SessionLost`].
/// - One name serves one round at a time: participants of a next round that enter while
///   this round leaves are waited for by the leavers. Use a name per round (`job/42/start`).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
/// use baton::{DoubleBarrier, MemoryBackend, Session};
/// let session = Session::new(MemoryBackend::new()).await?;
/// let shards = DoubleBarrier::new(&session, "batch/7", 2)?;
/// let (a, b) = tokio::try_join!(shards.enter(), shards.enter())?;
/// // ... both shards run ...
/// tokio::try_join!(a.leave(), b.leave())?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct DoubleBarrier {
    session: Session,
    name: Arc<str>,
    members: u32,
    owner: Vec<u8>,
}

impl DoubleBarrier {
    /// A double barrier named `name` for `members` participants (at least 1).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty name, one ending in `/`, or 0 members.
    pub fn new(session: &Session, name: impl Into<String>, members: u32) -> Result<DoubleBarrier> {
        if members == 0 {
            return Err(Error::InvalidArgument(
                "a double barrier needs at least one member",
            ));
        }
        Ok(DoubleBarrier {
            session: session.clone(),
            name: queue::recipe_name(session, name.into())?,
            members,
            owner: crate::inspect::default_owner(),
        })
    }

    /// The barrier's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Enters, and returns once `members` participants (this one included) have entered.
    ///
    /// # Errors
    /// [`Error::SessionLost`]; [`Error::EntryGone`] if our entry was deleted from outside;
    /// backend errors after retries. On every error our entry is removed in the background.
    ///
    /// # Cancel safety
    /// Dropping the future (a timeout) leaves no entry: we stop counting.
    pub fn enter(&self) -> impl Future<Output = Result<DoubleBarrierGuard>> + Send + Sync + '_ {
        let span = tracing::debug_span!("baton.barrier.enter", name = %self.name, members = self.members, key = tracing::field::Empty, token = tracing::field::Empty);
        SyncFuture::new(
            async move {
                let value = queue::marked(queue::MEMBER, &self.owner);
                let held = enter(&self.session, &self.name, value).await?;
                let lost = held.lost();
                tokio::select! {
                    biased;
                    reason = lost => return Err(lost_error(&self.session, reason, held.entry())),
                    counted = self.until_counted(held.entry()) => counted?,
                }
                Ok(DoubleBarrierGuard {
                    held,
                    name: Arc::clone(&self.name),
                })
            }
            .instrument(span),
        )
    }

    /// Returns once `mine` was counted in a complete set. Failed requests are retried (a
    /// failed read says nothing); the caller ends the wait when the session is lost.
    async fn until_counted(&self, mine: &Entry) -> Result<()> {
        let backend = self.session.backend();
        let mut backoff = Backoff::new();
        loop {
            match self.count_once(&**backend, mine).await {
                Ok(true) => return Ok(()),
                Ok(false) => backoff = Backoff::new(),
                Err(e) => {
                    tracing::debug!(name = %self.name, error = %e, "counting members failed; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
    }

    /// One look: `true` if `mine` was counted in a complete set (completing it now if the
    /// count is reached); otherwise waits for the count record to change.
    async fn count_once(&self, backend: &dyn Backend, mine: &Entry) -> Result<bool> {
        // The record first, then the entries: a set completed after the record was read
        // changes it, and the wait below sees that.
        let seen = backend.read(&self.name).await?;
        if record(seen.as_deref()) >= mine.token().get() {
            return Ok(true);
        }
        let entries = backend.entries(&self.name).await?;
        if entries.len() >= self.members as usize {
            let newest = entries.iter().map(|e| e.token().get()).max().unwrap_or(0);
            raise_record(backend, &self.name, newest).await?;
            return Ok(true);
        }
        tracing::debug!(name = %self.name, entered = entries.len(), members = self.members, "waiting for members");
        backend.wait_value(&self.name, seen.as_deref()).await?;
        Ok(false)
    }
}

/// The count record, `entered <token>`: the token of the newest entry of the last complete
/// set (0: none). Not a bare number, so that no one takes it for a semaphore's limit.
fn record(raw: Option<&[u8]>) -> u64 {
    raw.and_then(|r| std::str::from_utf8(r).ok())
        .and_then(|t| t.strip_prefix("entered "))
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

/// Raises the count record to `to` unless it is already at least that.
async fn raise_record(backend: &dyn Backend, key: &str, to: u64) -> Result<()> {
    let mut backoff = Backoff::new();
    loop {
        let seen = backend.read(key).await?;
        if record(seen.as_deref()) >= to {
            return Ok(());
        }
        let record = format!("entered {to}");
        match backend.swap(key, seen.as_deref(), record.as_bytes()).await {
            Ok(true) => return Ok(()),
            // Changed meanwhile, or our attempt may have landed: look again.
            Ok(false) | Err(Error::OutcomeUnknown { .. }) => {
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The error for a participation that ended while waiting.
fn lost_error(session: &Session, reason: LostReason, entry: &Entry) -> Error {
    if session.is_lost() {
        Error::SessionLost(reason)
    } else {
        Error::EntryGone {
            key: entry.key().to_owned(),
        }
    }
}

/// A participant inside a [`DoubleBarrier`]. [`leave`](DoubleBarrierGuard::leave) when
/// done, to wait for the others; dropping it (or [`release`](DoubleBarrierGuard::release))
/// leaves without waiting for them.
#[must_use = "the participant leaves in the background as soon as this is dropped"]
#[derive(Debug)]
pub struct DoubleBarrierGuard {
    held: Held,
    name: Arc<str>,
}

/// The former name of [`DoubleBarrierGuard`].
#[deprecated(
    since = "0.4.0",
    note = "renamed `DoubleBarrierGuard`, as every recipe's guard"
)]
pub type Entered = DoubleBarrierGuard;

crate::guard::entry_guard!(DoubleBarrierGuard, "our participation");

impl DoubleBarrierGuard {
    /// Leaves without waiting for the other participants: deletes our entry if it is still
    /// ours. [`leave`](DoubleBarrierGuard::leave) also waits for them.
    ///
    /// # Errors
    /// [`Error::NotOwner`] if our entry was already gone (we had stopped counting); other
    /// errors: the delete goes on in the background.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped release is finished in the background.
    pub fn release(self) -> impl Future<Output = Result<()>> + Send + Sync + 'static {
        SyncFuture::new(self.held.release())
    }

    /// Leaves, and returns once every participant has left (or its session ended).
    ///
    /// # Errors
    /// [`Error::NotOwner`] if our entry was already gone (we had stopped counting); backend
    /// errors after retries.
    ///
    /// # Cancel safety
    /// Our entry is deleted first (a dropped call finishes that in the background); dropping
    /// the wait that follows only stops waiting.
    pub fn leave(self) -> impl Future<Output = Result<()>> + Send + Sync + 'static {
        let backend = Arc::clone(self.held.session().backend());
        let name = self.name;
        let span = tracing::debug_span!("baton.barrier.leave", name = %name);
        SyncFuture::new(
            async move {
                self.held.release().await?;
                until_empty(&*backend, &name).await
            }
            .instrument(span),
        )
    }
}
