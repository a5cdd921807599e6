//! The queue engine behind every recipe: enqueue, wait for the predecessor, release.
//!
//! A drop guard owns every acquisition in progress, including the create request while it
//! is in flight: if the caller's future is dropped, the guard moves the unfinished request
//! into a cleanup task that lets it complete and deletes exactly what it created. So a
//! caller can be dropped at any await point without leaving a key behind, and the common
//! path spawns nothing.

use std::future::Future;

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
pub(crate) async fn acquire(
    session: &Session,
    queue: &str,
    value: Vec<u8>,
    mode: Mode,
) -> Result<Held> {
    let lost = session.lost();
    tokio::pin!(lost);
    let local = session.local_queue(queue);
    let local = match mode {
        Mode::Wait => tokio::select! {
            guard = local.lock_owned() => guard,
            reason = &mut lost => return Err(Error::SessionLost(reason)),
        },
        Mode::Try => local.try_lock_owned().map_err(|_| Error::Locked {
            name: queue.to_owned(),
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
    let enqueued = enqueued?;
    let mine = enqueued.entry;
    pending.entry = Some(mine.clone());
    tracing::debug!(key = %mine.key, token = %mine.token, head = enqueued.is_head, "enqueued");

    if !enqueued.is_head {
        if mode == Mode::Try {
            let backend = session.backend();
            // Leave nothing behind before reporting "busy"; on failure the drop guard retries.
            if backend.delete_entry(&mine).await.is_ok() {
                pending.entry = None;
            }
            return Err(Error::Locked {
                name: queue.to_owned(),
            });
        }
        wait_for_turn(session, &mine, enqueued.predecessor, &mut lost).await?;
    }

    let local = pending.local.take();
    pending.entry = None;
    Ok(Held {
        session: session.clone(),
        entry: mine,
        local,
        released: false,
    })
}

/// Waits until no entry older than `mine` remains, watching only the newest older one.
/// Returns only after the backend confirmed in the same read that `mine` still exists.
async fn wait_for_turn(
    session: &Session,
    mine: &Entry,
    mut known: Option<Entry>,
    lost: &mut (impl Future<Output = crate::LostReason> + Unpin),
) -> Result<()> {
    let backend = session.backend();
    loop {
        // The first predecessor may come with the enqueue answer; later ones are read.
        let predecessor = match known.take() {
            Some(p) => Ok(Some(p)),
            None => tokio::select! {
                p = backend.predecessor(mine) => p,
                reason = &mut *lost => return Err(Error::SessionLost(reason)),
            },
        };
        let predecessor = match predecessor {
            Ok(Some(p)) => p,
            Ok(None) => return Ok(()),
            // Our own key vanished: most likely our lease ended.
            Err(Error::EntryGone { .. }) if session.is_lost() => {
                return Err(Error::SessionLost(lost.await));
            }
            Err(e) => return Err(e),
        };
        tracing::debug!(key = %mine.key, predecessor = %predecessor.key, "waiting for predecessor");
        tokio::select! {
            gone = backend.wait_gone(&predecessor) => gone?,
            reason = &mut *lost => return Err(Error::SessionLost(reason)),
        }
        // The predecessor may have been a waiter that gave up, not the holder: look again.
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
    pub(crate) async fn release(mut self) -> Result<bool> {
        self.released = true;
        let result = self.session.backend().delete_entry(&self.entry).await;
        if result.is_err() {
            // Retry once in the background rather than leave the key until the lease ends;
            // the local queue stays taken until then, so no local task reuses the key.
            self.cleanup_in_background("release failed");
        }
        result
    }

    fn cleanup_in_background(&mut self, what: &'static str) {
        self.released = true;
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
