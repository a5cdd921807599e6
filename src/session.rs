//! [`Session`]: one lease, kept alive in the background, and the signal that it was lost.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::backend::{Backend, Lease, LeaseId};
use crate::error::{Error, LostReason, Result};

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

/// A client's liveness in the backend: one lease, renewed every TTL/3 by a background task.
///
/// Every lock and leadership taken through a session is bound to its lease and ends with it.
/// The session is **lost** when the server reports the lease gone, or when a deadline passes
/// without a successful renewal. The deadline is measured from *before* the last successful
/// renewal request was sent, so it passes no later than the server could expire the lease:
/// when [`lost`](Session::lost) resolves, assume that someone else may hold your locks.
///
/// `Session` is a cheap handle (clone it freely). [`close`](Session::close) revokes the lease
/// at once; when the last handle (including those held by guards) is dropped, the keep-alive
/// task stops and the lease is revoked in the background, best effort.
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
    lost: watch::Sender<Option<LostReason>>,
    keeper: AbortHandle,
    closed: AtomicBool,
    /// In-process FIFO per lock name, so that two tasks sharing this session (and so the
    /// same key) queue here before they queue in the backend.
    locals: StdMutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl Session {
    /// Grants a lease with the default TTL (60 s) and starts keeping it alive.
    ///
    /// # Errors
    /// Whatever the backend returns for the lease grant.
    ///
    /// # Cancel safety
    /// If the future is dropped while the grant is in flight, the lease may have been
    /// granted with no session to keep it alive: it holds no keys and expires after its TTL.
    pub async fn new(backend: impl Backend) -> Result<Session> {
        Self::with_options(backend, SessionOptions::new()).await
    }

    /// Grants a lease with `options` and starts keeping it alive.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero TTL (nothing is created); whatever the backend
    /// returns for the lease grant.
    ///
    /// # Cancel safety
    /// If the future is dropped while the grant is in flight, the lease may have been
    /// granted with no session to keep it alive: it holds no keys and expires after its TTL.
    pub async fn with_options(backend: impl Backend, options: SessionOptions) -> Result<Session> {
        Self::from_shared(Arc::new(backend), options).await
    }

    /// Like [`with_options`](Session::with_options), for a backend already shared as a
    /// trait object.
    ///
    /// # Errors
    /// As for [`with_options`](Session::with_options).
    ///
    /// # Cancel safety
    /// If the future is dropped while the grant is in flight, the lease may have been
    /// granted with no session to keep it alive: it holds no keys and expires after its TTL.
    pub async fn from_shared(
        backend: Arc<dyn Backend>,
        options: SessionOptions,
    ) -> Result<Session> {
        if options.ttl.is_zero() {
            return Err(Error::InvalidArgument(
                "session TTL must be greater than zero",
            ));
        }
        let asked_at = Instant::now();
        let lease = backend.grant_lease(options.ttl).await?;
        let (lost, _) = watch::channel(None);
        let keeper = tokio::spawn(keep_alive(
            Arc::clone(&backend),
            lease,
            asked_at,
            lost.clone(),
        ))
        .abort_handle();
        tracing::debug!(lease = %lease.id, ttl = ?lease.ttl, "session started");
        Ok(Session {
            inner: Arc::new(Inner {
                backend,
                lease,
                lost,
                keeper,
                closed: AtomicBool::new(false),
                locals: StdMutex::new(HashMap::new()),
            }),
        })
    }

    /// The lease id; keys created through this session end in it, in lowercase hex.
    pub fn lease_id(&self) -> LeaseId {
        self.inner.lease.id
    }

    /// The TTL the backend granted (may be larger than asked).
    pub fn ttl(&self) -> Duration {
        self.inner.lease.ttl
    }

    /// The backend this session lives in.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// Whether the session has been lost (or closed).
    pub fn is_lost(&self) -> bool {
        self.inner.lost.borrow().is_some()
    }

    /// Resolves when the session is lost, with the reason; at once if it already is.
    ///
    /// The future owns what it needs (`'static`), so it can be moved into a task or a
    /// `select!` next to the work the lock protects.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping it only stops this one observer.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let mut rx = self.inner.lost.subscribe();
        async move {
            loop {
                if let Some(reason) = *rx.borrow_and_update() {
                    return reason;
                }
                // The sender lives as long as any handle of the session.
                if rx.changed().await.is_err() {
                    return LostReason::Closed;
                }
            }
        }
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
        self.inner.keeper.abort();
        mark_lost(&self.inner.lost, self.inner.lease.id, LostReason::Closed);
        self.inner.backend.revoke_lease(self.inner.lease.id).await
    }

    /// The in-process FIFO for lock `name` on this session.
    pub(crate) fn local_queue(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locals = self.inner.locals.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(queue) = locals.get(name).and_then(Weak::upgrade) {
            return queue;
        }
        locals.retain(|_, q| q.strong_count() > 0);
        let queue = Arc::new(tokio::sync::Mutex::new(()));
        locals.insert(name.to_owned(), Arc::downgrade(&queue));
        queue
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.keeper.abort();
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        let backend = Arc::clone(&self.backend);
        let lease = self.lease.id;
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

fn mark_lost(lost: &watch::Sender<Option<LostReason>>, lease: LeaseId, reason: LostReason) {
    let changed = lost.send_if_modified(|state| {
        if state.is_some() {
            return false;
        }
        *state = Some(reason);
        true
    });
    if changed && reason != LostReason::Closed {
        tracing::warn!(%lease, %reason, "session lost");
    }
}

/// Renews `lease` every TTL/3 until it is lost. `asked_at` is the instant before the grant
/// was requested: the server's clock for the lease started no earlier than that.
async fn keep_alive(
    backend: Arc<dyn Backend>,
    lease: Lease,
    asked_at: Instant,
    lost: watch::Sender<Option<LostReason>>,
) {
    let mut ttl = lease.ttl;
    let mut deadline = asked_at + ttl;
    let mut next = asked_at + ttl / 3;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = tokio::time::sleep_until(deadline) => break,
        }
        let sent = Instant::now();
        let renewed = tokio::select! {
            r = backend.keep_alive(lease.id) => r,
            () = tokio::time::sleep_until(deadline) => break,
        };
        match renewed {
            Ok(Some(granted)) => {
                ttl = granted;
                deadline = sent + ttl;
                next = sent + ttl / 3;
            }
            Ok(None) => {
                mark_lost(&lost, lease.id, LostReason::Revoked);
                return;
            }
            Err(e) => {
                let retry = (ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
                tracing::debug!(lease = %lease.id, error = %e, ?retry, "keep-alive failed; retrying");
                next = Instant::now() + retry;
            }
        }
    }
    mark_lost(&lost, lease.id, LostReason::Expired);
}
