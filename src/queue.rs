//! The queue engine behind every recipe: enqueue, wait for the predecessor, release.
//!
//! A drop guard owns every acquisition in progress, including the create request while it
//! is in flight: if the caller's future is dropped, the guard moves the unfinished request
//! into a cleanup task that lets it complete and deletes exactly what it created. So a
//! caller can be dropped at any await point without leaving a key behind, and the common
//! path spawns nothing.

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::OwnedMutexGuard;

use crate::backend::{Enqueued, Entry};
use crate::error::{Error, Result};
use crate::session::Session;

/// Whether [`acquire`] waits for its turn or gives up at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Wait,
    Try,
}

/// The head of a queue, held: the entry exists and no older entry does.
#[derive(Debug)]
pub(crate) struct Held {
    session: Session,
    entry: Entry,
    /// Kept until the entry is deleted, so the next local task cannot reuse the key early.
    local: Option<OwnedMutexGuard<()>>,
    /// Set once the release was done or handed to a cleanup task: `Drop` has nothing to do.
    released: bool,
}

/// Cleanup for an acquisition that did not finish: runs on drop, in a task of its own.
struct Pending {
    session: Session,
    local: Option<OwnedMutexGuard<()>>,
    /// The create request, polled in place; moved to the cleanup task if we are dropped.
    enqueue: Option<BoxFuture<'static, Result<Enqueued>>>,
    entry: Option<Entry>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("entry", &self.entry)
            .field("enqueue_in_flight", &self.enqueue.is_some())
            .finish_non_exhaustive()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let (enqueue, entry, local) = (self.enqueue.take(), self.entry.take(), self.local.take());
        if enqueue.is_none() && entry.is_none() {
            return;
        }
        let backend = self.session.backend().clone();
        spawn_cleanup("acquisition abandoned", async move {
            let entry = match (entry, enqueue) {
                (Some(entry), _) => Some(entry),
                // The enqueue request may already be on its way: let it finish rather than
                // race it, then delete exactly what it created.
                (None, Some(enqueue)) => enqueue.await.ok().map(|enqueued| enqueued.entry),
                (None, None) => None,
            };
            if let Some(entry) = entry {
                delete_logged(&*backend, &entry).await;
            }
            drop(local);
        });
    }
}

async fn delete_logged(backend: &dyn crate::Backend, entry: &Entry) {
    match backend.delete_entry(entry).await {
        Ok(_) => tracing::debug!(key = %entry.key, token = %entry.token, "entry removed"),
        Err(e) => tracing::warn!(
            key = %entry.key, error = %e,
            "could not remove entry; it vanishes when its lease ends"
        ),
    }
}

/// Runs `cleanup` in the current runtime, or logs that it could not.
fn spawn_cleanup(what: &'static str, cleanup: impl Future<Output = ()> + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(cleanup);
        }
        Err(_) => tracing::warn!(
            what,
            "dropped outside a tokio runtime; the entry vanishes when its lease ends"
        ),
    }
}

/// Takes the head of `queue` for `session`: in process first, then in the backend.
///
/// (Written as a function returning an `async move` block rather than an `async fn`: an
/// `async fn` keeps a second copy of its arguments in its state, and this state is kept by
/// every waiter for as long as it waits.)
#[allow(clippy::manual_async_fn)] // On purpose: see above.
pub(crate) fn acquire<'a>(
    session: &'a Session,
    queue: &'a Arc<str>,
    value: Vec<u8>,
    mode: Mode,
) -> impl Future<Output = Result<Held>> + Send + 'a {
    async move {
        let lost = session.lost();
        tokio::pin!(lost);
        let local = session.local_queue(queue);
        let local = match mode {
            Mode::Wait => tokio::select! {
                guard = local.lock_owned() => guard,
                reason = &mut lost => return Err(Error::SessionLost(reason)),
            },
            Mode::Try => local.try_lock_owned().map_err(|_| Error::Locked {
                name: queue.to_string(),
            })?,
        };
        if session.is_lost() {
            return Err(Error::SessionLost(lost.await));
        }

        let backend = session.backend().clone();
        let (q, tag, lease) = (
            queue.to_owned(),
            session.lease_id().to_hex(),
            session.lease_id(),
        );
        let mut pending = Pending {
            session: session.clone(),
            local: Some(local),
            enqueue: Some(Box::pin(async move {
                backend.enqueue(&q, &tag, lease, &value).await
            })),
            entry: None,
        };
        let Some(enqueue) = pending.enqueue.as_mut() else {
            unreachable!("set just above")
        };
        let enqueued = tokio::select! {
            enqueued = enqueue => enqueued,
            reason = &mut lost => return Err(Error::SessionLost(reason)),
        };
        pending.enqueue = None;
        let Enqueued {
            entry,
            is_head,
            predecessor,
        } = enqueued?;
        // Our entry lives in the drop guard only (a waiter may wait long: one copy per waiter).
        let mine: &Entry = pending.entry.insert(entry);
        tracing::debug!(key = %mine.key, token = %mine.token, head = is_head, "enqueued");

        if !is_head {
            if mode == Mode::Try {
                let backend = session.backend();
                // Leave nothing behind before reporting "busy"; on failure the drop guard retries.
                if backend.delete_entry(mine).await.is_ok() {
                    pending.entry = None;
                }
                return Err(Error::Locked {
                    name: queue.to_string(),
                });
            }
            wait_for_turn(session, mine, predecessor, &mut lost).await?;
        }

        // Recorded on the caller's span (`baton.lock`, `baton.campaign`), which is current:
        // the callers keep no second handle of it in their state.
        let span = tracing::Span::current();
        span.record("key", mine.key.as_str());
        span.record("token", mine.token.get());
        tracing::debug!("granted");
        let (Some(entry), local) = (pending.entry.take(), pending.local.take()) else {
            unreachable!(
                "the entry was stored above and only taken on the `try` path, which returned"
            )
        };
        Ok(Held {
            session: session.clone(),
            entry,
            local,
            released: false,
        })
    }
}

/// Waits until no entry older than `mine` remains, watching only the newest older one.
/// Returns only after a read that showed `mine` present and nothing older (the same read:
/// [`Backend::predecessor`](crate::Backend::predecessor) or, after a wake,
/// [`Backend::was_head`](crate::Backend::was_head)).
#[allow(clippy::manual_async_fn)] // Kept by every waiter: see `acquire`.
fn wait_for_turn<'a>(
    session: &'a Session,
    mine: &'a Entry,
    mut predecessor: Option<Entry>,
    lost: &'a mut (impl Future<Output = crate::LostReason> + Unpin + Send),
) -> impl Future<Output = Result<()>> + Send + 'a {
    async move {
        let backend = session.backend();
        loop {
            // The first predecessor may come with the enqueue answer; later ones are read. One
            // variable holds it throughout: this state is kept by every waiter.
            let waited_for = match &mut predecessor {
                Some(p) => p,
                empty => {
                    let read = tokio::select! {
                        p = backend.predecessor(mine) => p,
                        reason = &mut *lost => return Err(Error::SessionLost(reason)),
                    };
                    match read {
                        Ok(Some(p)) => empty.insert(p),
                        Ok(None) => return Ok(()),
                        // Our own key vanished: most likely our lease ended.
                        Err(Error::EntryGone { .. }) if session.is_lost() => break,
                        Err(e) => return Err(e),
                    }
                }
            };
            tracing::debug!(key = %mine.key, predecessor = %waited_for.key, "waiting for predecessor");
            tokio::select! {
                gone = backend.wait_gone(waited_for) => gone?,
                reason = &mut *lost => return Err(Error::SessionLost(reason)),
            }
            predecessor = None;
            // Usually the predecessor was the holder and we are now the head: a cheap check
            // first (it may be answered by a replica); when it cannot tell, or fails, the
            // authoritative read decides: the predecessor may have been a waiter that gave up.
            let head = tokio::select! {
                head = backend.was_head(mine) => head.unwrap_or(false),
                reason = &mut *lost => return Err(Error::SessionLost(reason)),
            };
            if head {
                if session.is_lost() {
                    break;
                }
                return Ok(());
            }
        }
        // (Out of the loop, so that the failed read is not kept during this wait.)
        Err(Error::SessionLost(lost.await))
    }
}

impl Held {
    pub(crate) fn entry(&self) -> &Entry {
        &self.entry
    }

    pub(crate) fn session(&self) -> &Session {
        &self.session
    }

    /// The error for a write refused because our entry is gone.
    pub(crate) fn not_owner(&self) -> Error {
        Error::NotOwner {
            key: self.entry.key.clone(),
        }
    }

    /// Applies `ops` only while our entry exists; [`Error::NotOwner`] otherwise.
    pub(crate) async fn write(&self, ops: &[crate::WriteOp]) -> Result<()> {
        if self.session.backend().guarded(&self.entry, ops).await? {
            Ok(())
        } else {
            Err(self.not_owner())
        }
    }

    /// Deletes the entry if it is still this incarnation; tells whether it was.
    ///
    /// (An `async` block, not an `async fn`, which would keep `self` twice in its state.)
    #[allow(clippy::manual_async_fn)] // On purpose: see above.
    pub(crate) fn release(mut self) -> impl Future<Output = Result<bool>> + Send + 'static {
        async move {
            // `released` is set only once the delete answered: if this future is dropped
            // before, `Drop` hands the (idempotent, revision-conditioned) delete to a task.
            let result = self.session.backend().delete_entry(&self.entry).await;
            if result.is_ok() {
                self.disarm();
            } else {
                // Retry once in the background rather than leave the key until the lease
                // ends; the local queue stays taken until then, so no local task reuses it.
                self.cleanup_in_background("release failed");
            }
            result
        }
    }

    /// Nothing left for `Drop` to do.
    fn disarm(&mut self) {
        self.released = true;
    }

    fn cleanup_in_background(&mut self, what: &'static str) {
        self.disarm();
        let (backend, entry, local) = (
            self.session.backend().clone(),
            self.entry.clone(),
            self.local.take(),
        );
        spawn_cleanup(what, async move {
            delete_logged(&*backend, &entry).await;
            drop(local);
        });
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.released {
            self.cleanup_in_background("guard dropped");
        }
    }
}
