//! [`MultiLock`]: several [`Mutex`]es taken as one, all or nothing, without deadlock.

use std::future::Future;

use futures::FutureExt;
use sync_wrapper::SyncFuture;
use tracing::Instrument;

use crate::error::{Error, LostReason, Result};
use crate::mutex::{Mutex, MutexGuard};
use crate::session::Session;
use crate::token::FencingToken;

/// Several named locks taken as one: the account locks of a transfer, the rows of a batch.
///
/// # Guarantees
/// - **No deadlock between MultiLocks**: the locks are taken one after another in one global
///   order (sorted by name, duplicates removed), so two MultiLocks over overlapping sets
///   always meet in the same order. (Curator's InterProcessMultiLock takes them in the
///   caller's order, and two callers listing them differently can deadlock.)
/// - **All or nothing**: if any acquisition fails, everything already taken is released
///   (in reverse order) before the error is returned; if the call is dropped or times out,
///   the locks taken so far are released in the background.
/// - The guard exposes each lock's fencing token, and [`MultiLockGuard::lost`] fires when any
///   of them is lost. [`release`](MultiLockGuard::release) releases in reverse order.
/// - Each lock is an ordinary [`Mutex`] (etcd's Go layout): other programs may take one of
///   them alone, and wait as usual.
///
/// # Failure modes
/// - A lock whose session is lost or whose key is deleted from outside is lost alone: the
///   others are still held. [`MultiLockGuard::lost`] fires at the first such loss; stop the
///   protected work then, and [`release`](MultiLockGuard::release) reports it
///   ([`Error::NotOwner`]) while releasing the others.
/// - The locks are taken one after another, not atomically: while a MultiLock waits for its
///   second lock it holds the first, and contenders for that one wait behind it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
/// use baton::{MemoryBackend, MultiLock, Session};
/// let session = Session::new(MemoryBackend::new()).await?;
/// let transfer = MultiLock::new(&session, ["accounts/bob", "accounts/alice"])?;
/// let guard = transfer.lock().await?;
/// let names: Vec<&str> = guard.fencing_tokens().map(|(name, _)| name).collect();
/// assert_eq!(names, ["accounts/alice", "accounts/bob"]);
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MultiLock {
    /// In acquisition order: sorted by name.
    locks: Vec<Mutex>,
}

impl MultiLock {
    /// The locks `names` (at least one), taken in sorted order; a name listed twice is taken
    /// once.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no names or an empty name.
    pub fn new<I, S>(session: &Session, names: I) -> Result<MultiLock>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        // Spelled as the backend spells them before sorting and dropping duplicates: on
        // ZooKeeper `/a` and `a` are one lock, which must be taken once.
        let mut names: Vec<String> = names
            .into_iter()
            .map(|name| {
                let name: String = name.into();
                session.backend().recipe_name(&name).to_owned()
            })
            .collect();
        names.sort();
        names.dedup();
        if names.is_empty() {
            return Err(Error::InvalidArgument(
                "a MultiLock needs at least one name",
            ));
        }
        let locks = names
            .into_iter()
            .map(|name| Mutex::new(session, name))
            .collect::<Result<_>>()?;
        Ok(MultiLock { locks })
    }

    /// The lock names, in the order they are taken.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.locks.iter().map(Mutex::name)
    }

    /// Takes every lock, waiting for each in turn.
    ///
    /// # Errors
    /// The first lock's error (as for [`Mutex::lock`]), after the locks already taken were
    /// released.
    ///
    /// # Cancel safety
    /// Dropping the future releases the locks taken so far in the background and gives up
    /// the place in the queue of the one being waited for; nothing is left behind.
    pub fn lock(&self) -> impl Future<Output = Result<MultiLockGuard>> + Send + Sync + '_ {
        SyncFuture::new(self.take(false))
    }

    /// Takes every lock only if each is free at once; never waits.
    ///
    /// # Errors
    /// [`Error::Locked`] for the first lock held or contended (the locks already taken are
    /// released first); otherwise as for [`lock`](MultiLock::lock).
    ///
    /// # Cancel safety
    /// As for [`lock`](MultiLock::lock).
    pub fn try_lock(&self) -> impl Future<Output = Result<MultiLockGuard>> + Send + Sync + '_ {
        SyncFuture::new(self.take(true))
    }

    async fn take(&self, try_only: bool) -> Result<MultiLockGuard> {
        let span = tracing::debug_span!("baton.multilock", locks = self.locks.len());
        async {
            let mut guards = Vec::with_capacity(self.locks.len());
            for lock in &self.locks {
                let taken = if try_only {
                    lock.try_lock().await
                } else {
                    lock.lock().await
                };
                match taken {
                    Ok(guard) => guards.push(guard),
                    Err(e) => {
                        // Its own error matters more than a release's; the releases that fail
                        // go on in the background.
                        let _ = release_in_reverse(guards).await;
                        return Err(e);
                    }
                }
            }
            Ok(MultiLockGuard { guards })
        }
        .instrument(span)
        .await
    }
}

/// Releases `guards` last first, reporting the first error (every one is attempted).
async fn release_in_reverse(guards: Vec<MutexGuard>) -> Result<()> {
    let mut first_error = None;
    for guard in guards.into_iter().rev() {
        if let Err(e) = guard.release().await {
            tracing::debug!(error = %e, "releasing a lock of a MultiLock failed");
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Proof of holding every lock of a [`MultiLock`]. Unlock with
/// [`release`](MultiLockGuard::release); dropping it releases them in the background.
#[must_use = "the locks are released in the background as soon as the guard is dropped"]
#[derive(Debug)]
pub struct MultiLockGuard {
    guards: Vec<MutexGuard>,
}

impl MultiLockGuard {
    /// Each lock's name and fencing token, in acquisition order.
    pub fn fencing_tokens(&self) -> impl Iterator<Item = (&str, FencingToken)> {
        self.guards.iter().map(|g| (g.name(), g.fencing_token()))
    }

    /// The former name of [`fencing_tokens`](MultiLockGuard::fencing_tokens).
    #[deprecated(
        since = "0.4.0",
        note = "renamed `fencing_tokens`, as guards name tokens"
    )]
    pub fn tokens(&self) -> impl Iterator<Item = (&str, FencingToken)> {
        self.fencing_tokens()
    }

    /// Whether every one of our entries still exists with its token, checked against the
    /// backend now (`false` as soon as one is gone).
    ///
    /// # Errors
    /// Backend errors after retries.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub fn is_owner(&self) -> impl Future<Output = Result<bool>> + Send + Sync + '_ {
        SyncFuture::new(async move {
            for guard in &self.guards {
                if !guard.is_owner().await? {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }

    /// The guard of each lock, in acquisition order (for its ticket or guarded writes).
    pub fn guards(&self) -> &[MutexGuard] {
        &self.guards
    }

    /// Resolves when any of the locks is lost, with its reason.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping it only stops these observers.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + Sync + 'static {
        let all = futures::future::select_all(self.guards.iter().map(|g| g.lost().boxed()));
        SyncFuture::new(all.map(|(reason, _, _)| reason))
    }

    /// Releases every lock, last taken first.
    ///
    /// # Errors
    /// The first error of the releases (each is attempted; see [`MutexGuard::release`]):
    /// [`Error::NotOwner`] means that lock had been lost before.
    ///
    /// # Cancel safety
    /// Cancel safe: the locks not yet released are released in the background.
    pub fn release(self) -> impl Future<Output = Result<()>> + Send + Sync + 'static {
        SyncFuture::new(release_in_reverse(self.guards))
    }

    /// The former name of [`release`](MultiLockGuard::release).
    ///
    /// # Errors
    /// As [`release`](MultiLockGuard::release).
    ///
    /// # Cancel safety
    /// As [`release`](MultiLockGuard::release).
    #[deprecated(since = "0.4.0", note = "every guard releases with `release`")]
    pub fn unlock(self) -> impl Future<Output = Result<()>> + Send + Sync + 'static {
        self.release()
    }
}
