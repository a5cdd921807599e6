//! [`Session`]: one lease, kept alive in the background, and the signal that it was lost.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{Backend, Lease, LeaseId};
use crate::error::{Error, LostReason, Result};

mod keeper;

/// What a [`Session`] can run on: any [`Backend`], an `Arc` of one, or the
/// `Arc<dyn Backend>` that [`connect`](crate::connect) returns. So `Session::new` takes each
/// of them as it comes, and one line (the URL) switches backends.
pub trait IntoBackend {
    /// The backend, shared.
    fn into_backend(self) -> Arc<dyn Backend>;
}

impl<B: Backend> IntoBackend for B {
    fn into_backend(self) -> Arc<dyn Backend> {
        Arc::new(self)
    }
}

impl<B: Backend> IntoBackend for Arc<B> {
    fn into_backend(self) -> Arc<dyn Backend> {
        self
    }
}

impl IntoBackend for Arc<dyn Backend> {
    fn into_backend(self) -> Arc<dyn Backend> {
        self
    }
}

/// Stops the keep-alive driver of the current tokio runtime for `d`
/// ([`crate::testing::starve_keep_alive`]).
#[cfg(feature = "testing")]
pub(crate) fn starve_keep_alive(d: Duration) -> Result<()> {
    keeper::starve(Instant::now() + d)
}

/// Options for [`Session::with_options`].
#[derive(Debug, Clone)]
#[must_use]
pub struct SessionOptions {
    ttl: Duration,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl SessionOptions {
    /// The default TTL, 60 s, as in etcd's Go `concurrency` package.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(60);

    /// Options with the default TTL.
    pub fn new() -> Self {
        SessionOptions {
            ttl: Self::DEFAULT_TTL,
        }
    }

    /// The lease TTL: how long after the last renewal the server keeps this session's keys
    /// when the process stops renewing (crash, pause, partition).
    ///
    /// ## Warning
    /// A short TTL hands the lock to the next waiter sooner after a crash, but also ends the
    /// session after a shorter pause or network hiccup. A process paused longer than the TTL
    /// (GC, swap, `SIGSTOP`) may still believe it holds the lock: protect writes with the
    /// fencing token. etcd rounds the TTL up to whole seconds and to its minimum.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }
}

/// A client's liveness in the backend: one lease, renewed every TTL/3 in the background.
///
/// Every lock and leadership taken through a session is bound to its lease and ends with it.
/// The session is **lost** when the server reports the lease gone, or when a deadline passes
/// without a successful renewal. The deadline is measured from *before* the last successful
/// renewal request was sent, so it passes no later than the server could expire the lease:
/// when [`lost`](Session::lost) resolves, assume that someone else may hold your locks.
///
/// `Session` is a cheap handle (clone it freely). [`close`](Session::close) revokes the lease
/// at once; when the last handle (including those held by guards) is dropped, renewals stop
/// and the lease is revoked in the background, best effort.
///
/// Renewals of all sessions of a tokio runtime are sent by one driver task of that runtime
/// (started with the first session), so a session costs a few hundred bytes and no task of
/// its own; a slow renewal of one session never delays another's. Create a session on the
/// runtime that will keep running: if that runtime shuts down, renewals stop, and the
/// session is lost at its deadline ([`is_lost`](Session::is_lost) and every
/// [`lost`](Session::lost) future check the deadline themselves, whichever runtime they run
/// on).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
/// use std::time::Duration;
/// use baton::{MemoryBackend, Session, SessionOptions};
/// let options = SessionOptions::new().with_ttl(Duration::from_secs(10));
/// let session = Session::with_options(MemoryBackend::new(), options).await?;
/// assert!(!session.is_lost());
/// session.close().await?;
/// assert!(session.is_lost());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    backend: Arc<dyn Backend>,
    lease: Lease,
    /// The runtime whose keep-alive driver renews this lease: cleanups that have no runtime
    /// of their own (a guard dropped outside one) run there.
    runtime: tokio::runtime::Handle,
    lost: Arc<LostSignal>,
    /// Set by [`Session::close`]; the keep-alive driver then stops renewing.
    closed: AtomicBool,
    /// Background cleanups (releases, abandoned acquisitions) still running.
    cleanups: AtomicUsize,
    cleanups_done: Notify,
    /// In-process FIFO per lock name, so that two tasks sharing this session (and so the
    /// same key) queue here before they queue in the backend.
    /// A list, not a map: a session waits on a handful of names at a time, and a map's
    /// smallest table costs more than the list's one entry (this is per waiter at scale).
    locals: StdMutex<Vec<LocalQueue>>,
}

/// A lock name and its in-process FIFO, alive while a task of this process uses it.
type LocalQueue = (Arc<str>, Weak<tokio::sync::Mutex<()>>);

impl Session {
    /// Grants a lease with the default TTL (60 s) and starts keeping it alive, on `backend`:
    /// what [`connect`](crate::connect) returns, a backend ([`MemoryBackend`](crate::MemoryBackend),
    /// `EtcdBackend`, ...), or an `Arc` of one ([`IntoBackend`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
    /// use std::sync::Arc;
    /// use baton::{MemoryBackend, Session};
    ///
    /// let a = Session::new(baton::connect("memory://").await?).await?;
    /// let b = Session::new(MemoryBackend::new()).await?;
    /// let shared = Arc::new(MemoryBackend::new());
    /// let c = Session::new(Arc::clone(&shared)).await?;
    /// # let _ = (a, b, c);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Whatever the backend returns for the lease grant.
    ///
    /// # Cancel safety
    /// If the future is dropped while the grant is in flight, the lease may have been
    /// granted with no session to keep it alive: it holds no keys and expires after its TTL.
    pub async fn new(backend: impl IntoBackend) -> Result<Session> {
        Self::with_options(backend, SessionOptions::new()).await
    }

    /// Grants a lease with `options` and starts keeping it alive (see [`new`](Session::new)
    /// for what `backend` may be).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero TTL (nothing is created); whatever the backend
    /// returns for the lease grant.
    ///
    /// # Cancel safety
    /// If the future is dropped while the grant is in flight, the lease may have been
    /// granted with no session to keep it alive: it holds no keys and expires after its TTL.
    pub async fn with_options(
        backend: impl IntoBackend,
        options: SessionOptions,
    ) -> Result<Session> {
        Self::start(backend.into_backend(), options).await
    }

    /// Like [`with_options`](Session::with_options), for a backend already shared as a
    /// trait object.
    ///
    /// # Errors
    /// As for [`with_options`](Session::with_options).
    ///
    /// # Cancel safety
    /// As for [`with_options`](Session::with_options).
    #[deprecated(
        since = "0.4.0",
        note = "`Session::with_options` takes an `Arc<dyn Backend>` too"
    )]
    pub async fn from_shared(
        backend: Arc<dyn Backend>,
        options: SessionOptions,
    ) -> Result<Session> {
        Self::start(backend, options).await
    }

    async fn start(backend: Arc<dyn Backend>, options: SessionOptions) -> Result<Session> {
        if options.ttl.is_zero() {
            return Err(Error::InvalidArgument(
                "session TTL must be greater than zero",
            ));
        }
        let (keeper, runtime) = keeper::for_current_runtime()?;
        let asked_at = Instant::now();
        let lease = backend.grant_lease(options.ttl).await?;
        let inner = Arc::new(Inner {
            backend,
            lease,
            runtime,
            lost: Arc::new(LostSignal::new(lease.id(), asked_at + lease.ttl())),
            closed: AtomicBool::new(false),
            cleanups: AtomicUsize::new(0),
            cleanups_done: Notify::new(),
            locals: StdMutex::new(Vec::new()),
        });
        if let Some(epochs) = inner.backend.epochs() {
            // Told when the store's epoch changes from the one it is in now. A lease granted
            // while another request found a new epoch may be from before it: it holds nothing
            // yet, and whatever it takes is granted by a request that compares the epoch.
            epochs.register(epochs.generation(), &inner.lost);
        }
        keeper.keep(&inner, asked_at);
        tracing::debug!(lease = %lease.id(), ttl = ?lease.ttl(), "session started");
        Ok(Session { inner })
    }

    /// The lease id; keys created through this session end in it, in lowercase hex.
    pub fn lease_id(&self) -> LeaseId {
        self.inner.lease.id()
    }

    /// The TTL the backend granted (may be larger than asked).
    pub fn ttl(&self) -> Duration {
        self.inner.lease.ttl()
    }

    /// The backend this session lives in.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// The instant this session is lost at unless a renewal succeeds first: the server keeps
    /// the lease at least until then (it is measured from before the last successful renewal
    /// was sent). Healthy renewals keep it between two thirds of the TTL and the TTL ahead;
    /// less than that means renewals are failing. A program that must stop work before its
    /// lease can expire (the CLI stops its command) watches it.
    pub fn deadline(&self) -> std::time::Instant {
        self.inner.lost.deadline().into_std()
    }

    /// How much longer nothing is granted on this session's store: the rest of the restart
    /// grace of a store epoch, `None` when grants are not held back. A store that lost or
    /// rolled back its state, or that this process had never seen without baton's marker,
    /// begins an epoch; until the grace (at least the longest session TTL) has passed, every
    /// `lock()` waits and every `try_*` call answers
    /// [`Error::RestartGrace`](crate::Error::RestartGrace). An operator who knows a store is
    /// new marks it first (`baton init`), and its first use waits nothing.
    ///
    /// A program may show it to its user before it waits:
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
    /// # let session = baton::Session::new(baton::MemoryBackend::new()).await?;
    /// if let Some(left) = session.restart_grace() {
    ///     eprintln!("the lock store forgot its state: no lock is granted for {left:?}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn restart_grace(&self) -> Option<Duration> {
        self.inner.backend.grants_nothing_for()
    }

    /// Whether the session has been lost (or closed): `true` from the instant its deadline
    /// passes without a renewal, even if nothing has run to notice it yet.
    pub fn is_lost(&self) -> bool {
        self.inner.lost.check().is_some()
    }

    /// Resolves when the session is lost, with the reason; at once if it already is.
    ///
    /// The future owns what it needs (`'static`), so it can be moved into a task or a
    /// `select!` next to the work the lock protects.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping it only stops this one observer.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + Sync + 'static {
        // Only the signal, not the session: a pending `lost()` must not keep the lease alive.
        sync_wrapper::SyncFuture::new(Arc::clone(&self.inner.lost).wait())
    }

    /// Resolves once no background cleanup of this session is running: every guard dropped
    /// or release that failed, every `lock()` or `campaign()` dropped or failed part way, has
    /// had its entry deleted (confirmed by the backend), or the session was lost. At once if
    /// none is running.
    ///
    /// Tests use it to check that nothing was left behind while the session still lives;
    /// a program can use it to let background releases finish before it exits.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub async fn settled(&self) {
        loop {
            let done = self.inner.cleanups_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.inner.cleanups.load(Ordering::Acquire) == 0 {
                return;
            }
            done.await;
        }
    }

    /// Counts a background cleanup until the returned token is dropped.
    pub(crate) fn cleanup_started(&self) -> CleanupToken {
        self.inner.cleanups.fetch_add(1, Ordering::AcqRel);
        CleanupToken(Arc::clone(&self.inner))
    }

    /// A handle on this session's loss that does not keep the session alive.
    pub(crate) fn loss(&self) -> Arc<LostSignal> {
        Arc::clone(&self.inner.lost)
    }

    /// Waits for the loss as recorded, without a timer of its own: for the queue engine's
    /// waiters, which stay small and check [`is_lost`](Session::is_lost) before every grant.
    pub(crate) fn lost_recorded(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let signal = Arc::clone(&self.inner.lost);
        async move {
            loop {
                let notified = signal.notify.notified();
                tokio::pin!(notified);
                // Registered before the check, so a loss recorded after it wakes us.
                notified.as_mut().enable();
                if let Some(reason) = signal.reason() {
                    return reason;
                }
                notified.await;
            }
        }
    }

    /// The runtime that keeps this session alive, for cleanups started outside a runtime.
    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.inner.runtime
    }

    /// Revokes the lease: every key of this session is deleted, waiters behind it proceed,
    /// and [`lost`](Session::lost) resolves with [`LostReason::Closed`] for every handle.
    ///
    /// # Errors
    /// The backend's error if the revoke could not be sent; the lease then expires after
    /// its TTL.
    ///
    /// # Cancel safety
    /// The session is marked closed before the revoke is sent; if the future is dropped
    /// before the revoke completes, the lease expires after its TTL.
    pub async fn close(&self) -> Result<()> {
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.inner.lost.mark(LostReason::Closed);
        self.inner.backend.revoke_lease(self.inner.lease.id()).await
    }

    /// A tag for an entry of `queue` that no acquisition of this session in progress uses:
    /// `<lease id hex>_<k>`, the smallest `k` free, with the in-process slot that reserves it
    /// (kept until the entry is confirmed gone). For recipes where one session holds several
    /// entries of one queue at once (permits, read locks); reusing tags keeps key names
    /// stable from one acquisition to the next, so the watches on them are reused.
    pub(crate) fn free_tag(&self, queue: &str) -> (String, tokio::sync::OwnedMutexGuard<()>) {
        let lease = self.lease_id().to_hex();
        let mut k = 0u64;
        loop {
            let tag = format!("{lease}_{k}");
            let slot = self.local_queue(&Arc::from(format!("{queue}/{tag}")));
            if let Ok(guard) = slot.try_lock_owned() {
                return (tag, guard);
            }
            k += 1;
        }
    }

    /// The in-process FIFO for lock `name` on this session.
    pub(crate) fn local_queue(&self, name: &Arc<str>) -> Arc<tokio::sync::Mutex<()>> {
        let mut locals = self.inner.locals.lock().unwrap_or_else(|p| p.into_inner());
        let existing = locals.iter().find(|(n, _)| n == name);
        if let Some(queue) = existing.and_then(|(_, q)| q.upgrade()) {
            return queue;
        }
        locals.retain(|(_, q)| q.strong_count() > 0);
        let queue = Arc::new(tokio::sync::Mutex::new(()));
        locals.reserve_exact(1);
        locals.push((Arc::clone(name), Arc::downgrade(&queue)));
        queue
    }
}

/// A running cleanup of a session, counted for [`Session::settled`].
#[derive(Debug)]
pub(crate) struct CleanupToken(Arc<Inner>);

impl Drop for CleanupToken {
    fn drop(&mut self) {
        if self.0.cleanups.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.cleanups_done.notify_waiters();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Observers outliving every handle hear that the session ended.
        self.lost.mark(LostReason::Closed);
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        let backend = Arc::clone(&self.backend);
        let lease = self.lease.id();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if let Err(e) = backend.revoke_lease(lease).await {
                        tracing::warn!(%lease, error = %e, "revoking a dropped session's lease failed; it expires after its TTL");
                    }
                });
            }
            Err(_) => {
                tracing::warn!(%lease, "session dropped outside a tokio runtime; its lease expires after its TTL");
            }
        }
    }
}

/// Whether (and why) a session was lost, the instant it will be if no renewal comes, and a
/// wakeup for those waiting to hear it. A few dozen bytes per session, where a `watch`
/// channel takes hundreds.
#[derive(Debug)]
pub(crate) struct LostSignal {
    lease: LeaseId,
    /// 0 while the session lives, else the [`LostReason`] as [`LostSignal::code`] encodes it.
    reason: AtomicU8,
    /// From this instant the server may have expired the lease: moved by each renewal.
    deadline: StdMutex<Instant>,
    notify: Notify,
}

impl LostSignal {
    pub(crate) fn new(lease: LeaseId, deadline: Instant) -> Self {
        crate::metrics::session_started();
        LostSignal {
            lease,
            reason: AtomicU8::new(0),
            deadline: StdMutex::new(deadline),
            notify: Notify::new(),
        }
    }

    fn code(reason: LostReason) -> u8 {
        match reason {
            LostReason::Expired => 1,
            LostReason::Revoked => 2,
            LostReason::Closed => 3,
            LostReason::EntryDeleted => 4,
            LostReason::StoreReset => 5,
        }
    }

    fn reason(&self) -> Option<LostReason> {
        match self.reason.load(Ordering::Acquire) {
            0 => None,
            1 => Some(LostReason::Expired),
            2 => Some(LostReason::Revoked),
            4 => Some(LostReason::EntryDeleted),
            5 => Some(LostReason::StoreReset),
            _ => Some(LostReason::Closed),
        }
    }

    pub(crate) fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A renewal succeeded: the server keeps the lease at least until `deadline`.
    pub(crate) fn extend(&self, deadline: Instant) {
        let mut current = self.deadline.lock().unwrap_or_else(|p| p.into_inner());
        *current = (*current).max(deadline);
    }

    /// The reason, recording `Expired` first if the deadline has passed.
    pub(crate) fn check(&self) -> Option<LostReason> {
        if let Some(reason) = self.reason() {
            return Some(reason);
        }
        if Instant::now() >= self.deadline() {
            self.mark(LostReason::Expired);
            return self.reason();
        }
        None
    }

    /// Records `reason` unless a reason is recorded already (the first one stays), and wakes
    /// every observer.
    pub(crate) fn mark(&self, reason: LostReason) {
        let first = self
            .reason
            .compare_exchange(0, Self::code(reason), Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if first {
            crate::metrics::session_ended(reason);
            self.notify.notify_waiters();
            if reason != LostReason::Closed {
                tracing::warn!(lease = %self.lease, %reason, "session lost");
            }
        }
    }

    /// Resolves with the reason once the session is lost, or at the deadline (when polled
    /// inside a tokio runtime), so the loss is heard even if the keep-alive driver no longer
    /// runs.
    pub(crate) async fn wait(self: Arc<Self>) -> LostReason {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the check, so a loss recorded after it wakes us.
            notified.as_mut().enable();
            if let Some(reason) = self.check() {
                return reason;
            }
            if tokio::runtime::Handle::try_current().is_ok() {
                // Boxed: this future is kept by every caller of `lost()`.
                let at_deadline = Box::pin(tokio::time::sleep_until(self.deadline()));
                tokio::select! {
                    () = notified => {}
                    () = at_deadline => {}
                }
            } else {
                notified.await;
            }
        }
    }
}
