//! [`Semaphore`]: at most N holders at once, granted in queue order, and its
//! [`SemaphorePermit`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sync_wrapper::SyncFuture;
use tracing::Instrument;

use crate::error::{Error, Result};
use crate::metrics::{Meter, Recipe};
use crate::queue::{self, Backoff, Fewer, Held, Limit, Mode, Shared, Turn};
use crate::session::Session;

/// A fair counting semaphore: at most `permits` contenders hold a permit at once, granted in
/// the order they asked (FIFO), each permit bound to its holder's session.
///
/// Use it to bound concurrency across machines: "at most 3 workers run the import at once",
/// a pool of licences or connections. With `permits = 1` it excludes like a [`Mutex`](crate::Mutex)
/// (with its own key layout, not etcd's Go one).
///
/// Each contender creates one entry, `<name>/<lease id hex>_<k>` (`k`: the smallest index its
/// session has free, so one session may hold several permits), bound to its session's lease;
/// it holds a permit when fewer than the limit entries are ahead of it. The limit is
/// stored beside the queue, at the key `<name>` itself (in decimal), by the first contender.
///
/// # Guarantees
/// - **FIFO**: permits are granted in queue order; no contender is overtaken by a later one.
/// - **The stored limit rules**: a contender created with another limit gets
///   [`Error::LimitMismatch`] before it creates anything; no more contenders hold at once
///   than the stored limit allowed when each was granted. Changing it is explicit
///   ([`set_limit`](Semaphore::set_limit), a compare-and-set); lowering it revokes no permit
///   already held, it only delays new grants; raising it grants waiters at once.
/// - **Permits come back**: a permit is an entry bound to its holder's lease; a crashed
///   holder's permit returns when its lease ends (the session TTL). Nothing leaks.
/// - **No herd**: a waiter watches only the `limit` entries just ahead of it (while they all
///   remain, it cannot be a holder). A release wakes at most `limit` waiters, and exactly one
///   when the oldest holder leaves; the benchmark (`docs/performance.md`) counts them. Every
///   waiter also watches the limit key, so raising the limit wakes them all once.
///
/// # Fencing with a semaphore
/// [`SemaphorePermit::fencing_token`] is unique to the permit and increases in grant order,
/// but several holders are legitimately concurrent: a resource that keeps "the highest token
/// seen" and refuses lower ones would refuse a holder that is still valid because a later
/// one wrote first. What a resource *can* conclude: a token names one grant, and a token
/// lower than the oldest live holder's belongs to a permit that is gone. To fence per slot,
/// give each permit its own resource, or use [`SemaphorePermit::write`], which lands only
/// while the permit's entry exists.
///
/// # Failure modes
/// As for [`Mutex`](crate::Mutex): the session lost while waiting ends
/// [`acquire`](Semaphore::acquire) with [`Error::SessionLost`]; a permit whose lease ends or
/// whose entry is deleted from outside is reported by [`SemaphorePermit::lost`], and
/// [`release`](SemaphorePermit::release) then fails with [`Error::NotOwner`]. A call that
/// fails or is dropped part way leaves no entry behind.
///
/// Names that nest share a queue (as for [`Mutex`](crate::Mutex)): use names that are not
/// prefixes of one another.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
/// use baton::{MemoryBackend, Semaphore, Session};
/// let session = Session::new(MemoryBackend::new()).await?;
/// let imports = Semaphore::new(&session, "jobs/import", 3)?;
/// let a = imports.acquire().await?;
/// let b = imports.acquire().await?;
/// let c = imports.acquire().await?;
/// assert!(matches!(imports.try_acquire().await, Err(baton::Error::Locked { .. })));
/// a.release().await?;
/// let d = imports.try_acquire().await?;
/// # drop((b, c, d));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    session: Session,
    name: Arc<str>,
    meter: Arc<Meter>,
    permits: u32,
    owner: Vec<u8>,
    /// Set once this handle (or a clone) found the stored limit equal to its own: later
    /// acquisitions skip that read (the waits read the stored limit anyway).
    checked: Arc<AtomicBool>,
}

impl Semaphore {
    /// The largest limit: a waiter watches as many entries as the limit, so a limit far above
    /// the number of contenders costs without helping.
    pub const MAX_PERMITS: u32 = 1024;

    /// A semaphore named `name` with `permits` permits (1 to [`MAX_PERMITS`](Self::MAX_PERMITS)).
    /// Nothing is sent until the first [`acquire`](Semaphore::acquire).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty name or a limit out of range.
    pub fn new(session: &Session, name: impl Into<String>, permits: u32) -> Result<Semaphore> {
        let name = queue::recipe_name(session, name.into())?;
        if permits == 0 || permits > Self::MAX_PERMITS {
            return Err(Error::InvalidArgument(
                "semaphore permits must be between 1 and Semaphore::MAX_PERMITS",
            ));
        }
        Ok(Semaphore {
            session: session.clone(),
            meter: Meter::new(Recipe::Semaphore, &name),
            name,
            permits,
            owner: crate::inspect::default_owner(),
            checked: Arc::default(),
        })
    }

    /// Sets the value stored in this contender's entry (default `host=<host name> pid=<process id>`).
    #[must_use]
    pub fn with_owner_info(mut self, info: impl Into<Vec<u8>>) -> Semaphore {
        self.owner = info.into();
        self
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The limit this handle was created with (the stored one may differ: see
    /// [`limit`](Semaphore::limit)).
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Waits in the queue until this contender holds a permit.
    ///
    /// # Errors
    /// [`Error::LimitMismatch`] if the stored limit differs from this handle's (nothing is
    /// created); [`Error::SessionLost`] if the session is lost first; [`Error::EntryGone`]
    /// if our entry was deleted from outside while waiting; backend errors after retries.
    /// On every error, our entry (if it was created) is removed in the background.
    ///
    /// # Cancel safety
    /// Dropping the future at any point gives up the place in the queue and leaves no entry:
    /// a cleanup task waits for an in-flight create and deletes exactly what it created.
    pub fn acquire(&self) -> impl Future<Output = Result<SemaphorePermit>> + Send + Sync + '_ {
        SyncFuture::new(self.take(Mode::Wait))
    }

    /// Takes a permit only if one is free and no one waits before us; never waits.
    ///
    /// # Errors
    /// [`Error::Locked`] if no permit is free at once (no entry is left behind); otherwise as
    /// for [`acquire`](Semaphore::acquire).
    ///
    /// # Cancel safety
    /// As for [`acquire`](Semaphore::acquire).
    pub fn try_acquire(&self) -> impl Future<Output = Result<SemaphorePermit>> + Send + Sync + '_ {
        SyncFuture::new(self.take(Mode::Try))
    }

    async fn take(&self, mode: Mode) -> Result<SemaphorePermit> {
        let span = tracing::debug_span!(
            "baton.acquire",
            name = %self.name,
            permits = self.permits,
            try_acquire = mode == Mode::Try,
            key = tracing::field::Empty,
            token = tracing::field::Empty,
        );
        async {
            if !self.checked.load(Ordering::Acquire) {
                self.store_limit(mode).await?;
                self.checked.store(true, Ordering::Release);
            }
            let rule = Fewer {
                of: &self.name,
                limit: Limit::Stored {
                    key: &self.name,
                    name: &self.name,
                    requested: self.permits,
                },
                kind: Some(Shared {
                    name: &self.name,
                    mark: queue::PERMIT,
                }),
            };
            let ask = queue::Ask {
                meter: &self.meter,
                queue: &self.name,
                value: queue::marked(queue::PERMIT, &self.owner),
                mode,
                turn: Turn::Fewer(&rule),
            };
            let held = queue::acquire(&self.session, ask).await.inspect_err(|e| {
                if matches!(e, Error::LimitMismatch { .. }) {
                    self.checked.store(false, Ordering::Release);
                }
            })?;
            Ok(SemaphorePermit { held })
        }
        .instrument(span)
        .await
    }

    /// Stores our limit if none is, or checks that the stored one is ours. A call that
    /// waits ([`Mode::Wait`]) retries failed requests, as every wait does (a failed read says
    /// nothing), until the session is lost; `try_acquire` reports them.
    async fn store_limit(&self, mode: Mode) -> Result<()> {
        let backend = self.session.backend();
        let ours = self.permits.to_string();
        let lost = self.session.lost();
        tokio::pin!(lost);
        let mut backoff = Backoff::new();
        loop {
            let attempt = async {
                match backend.read(&self.name).await? {
                    Some(stored) => Ok(Some(stored)),
                    None => match backend.swap(&self.name, None, ours.as_bytes()).await? {
                        true => Ok(Some(ours.clone().into_bytes())),
                        // Someone stored one meanwhile: read it.
                        false => Ok(None),
                    },
                }
            };
            let stored = tokio::select! {
                biased;
                reason = &mut lost => return Err(Error::SessionLost(reason)),
                stored = attempt => stored,
            };
            let stored = match stored {
                Ok(Some(stored)) => stored,
                Ok(None) => continue,
                Err(e) if mode == Mode::Try => return Err(e),
                // Not stored, or perhaps stored by our own attempt: look again.
                Err(e) => {
                    tracing::debug!(name = %self.name, error = %e, "storing the limit failed; retrying");
                    tokio::select! {
                        biased;
                        reason = &mut lost => return Err(Error::SessionLost(reason)),
                        () = tokio::time::sleep(backoff.next_delay()) => continue,
                    }
                }
            };
            let limit = queue::parse_limit(Some(&stored), &self.name, self.permits)?;
            return if limit == self.permits as usize {
                Ok(())
            } else {
                Err(Error::LimitMismatch {
                    name: self.name.to_string(),
                    stored: limit.to_string(),
                    requested: self.permits,
                })
            };
        }
    }

    /// The stored limit, or `None` if no contender has stored one yet.
    ///
    /// # Errors
    /// [`Error::LimitMismatch`] if what is stored is not a limit; backend errors.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub fn limit(&self) -> impl Future<Output = Result<Option<u32>>> + Send + Sync + '_ {
        SyncFuture::new(async move {
            match self.session.backend().read(&self.name).await? {
                None => Ok(None),
                Some(raw) => {
                    let limit = queue::parse_limit(Some(&raw), &self.name, self.permits)?;
                    Ok(u32::try_from(limit).ok())
                }
            }
        })
    }

    /// Changes the stored limit from `from` to `to`, only if it is `from` now
    /// (compare-and-set). Permits already held are kept when the limit is lowered (new
    /// grants wait until fewer than `to` are ahead); raising it grants waiters at once.
    /// Handles created with the old limit that have not acquired yet get
    /// [`Error::LimitMismatch`] from [`acquire`](Semaphore::acquire) (create them with the new
    /// one); a handle checks the stored limit at its first acquisition only, and every wait
    /// follows the stored limit, whatever its handle was created with.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `to` is out of range; [`Error::LimitMismatch`] if the
    /// stored limit is not `from` (nothing changed); [`Error::OutcomeUnknown`] if the change
    /// may or may not have been applied (read [`limit`](Semaphore::limit)).
    ///
    /// # Cancel safety
    /// If the future is dropped, the change may or may not have been applied.
    pub fn set_limit(
        &self,
        from: u32,
        to: u32,
    ) -> impl Future<Output = Result<()>> + Send + Sync + '_ {
        SyncFuture::new(self.change_limit(from, to))
    }

    async fn change_limit(&self, from: u32, to: u32) -> Result<()> {
        if to == 0 || to > Self::MAX_PERMITS {
            return Err(Error::InvalidArgument(
                "semaphore permits must be between 1 and Semaphore::MAX_PERMITS",
            ));
        }
        let (from_text, to_text) = (from.to_string(), to.to_string());
        let backend = self.session.backend();
        if backend
            .swap(&self.name, Some(from_text.as_bytes()), to_text.as_bytes())
            .await?
        {
            tracing::info!(name = %self.name, from, to, "semaphore limit changed");
            return Ok(());
        }
        let stored = backend.read(&self.name).await?;
        Err(Error::LimitMismatch {
            name: self.name.to_string(),
            stored: stored.map_or_else(
                || "nothing".to_owned(),
                |s| format!("`{}`", String::from_utf8_lossy(&s)),
            ),
            requested: from,
        })
    }
}

/// One permit of a [`Semaphore`]. Release it with [`release`](SemaphorePermit::release);
/// dropping it releases in the background.
#[must_use = "the permit is released in the background as soon as it is dropped"]
#[derive(Debug)]
pub struct SemaphorePermit {
    held: Held,
}

crate::guard::entry_guard!(SemaphorePermit, "the permit");
crate::guard::release_guard!(SemaphorePermit, "the permit");
