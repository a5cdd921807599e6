//! The queue engine behind every recipe: enqueue, wait for the predecessor, release.
//!
//! A drop guard owns every acquisition in progress, including the create request while it
//! is in flight: if the caller's future is dropped or fails, the guard hands what the
//! acquisition may have left in the backend to a cleanup task. The cleanup lets an
//! unfinished create complete, looks for the entry when a create failed (its answer may have
//! been lost after it was applied), and deletes exactly that incarnation, retrying with
//! backoff until the delete is confirmed or the session is lost. Until then it keeps the
//! in-process slot for the name, so no other task of this session can adopt the old entry and
//! its token. The common path spawns nothing.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::OwnedMutexGuard;

use crate::backend::{Backend, Enqueued, Entry};
use crate::error::{Error, LostReason, Result};
use crate::session::Session;

/// Whether [`acquire`] waits for its turn or gives up at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Wait,
    Try,
}

/// Exponential backoff for retries that must not hammer a failing backend.
#[derive(Debug)]
pub(crate) struct Backoff {
    /// Delays handed out so far.
    given: u32,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(25);
    const MAX: Duration = Duration::from_secs(1);

    pub(crate) fn new() -> Self {
        Backoff { given: 0 }
    }

    /// The pause before going round a loop that should not have come round at all.
    const SLOW: Duration = Duration::from_millis(250);

    /// The pause after `failures` failures in a row: 25 ms, doubling, up to a second.
    fn after(failures: u32) -> Duration {
        Self::FIRST
            .saturating_mul(1 << failures.saturating_sub(1).min(6))
            .min(Self::MAX)
    }

    /// The delay to wait now; the next one is twice as long, up to a second.
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.given = self.given.saturating_add(1);
        Self::after(self.given)
    }
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

/// What an acquisition may have left in the backend.
enum Trace {
    /// Nothing: no create was sent, or what was created is known to be gone.
    Nothing,
    /// The create request (in this queue), not finished; polled in place by the acquisition,
    /// and moved to the cleanup task if the acquisition ends first.
    Creating(BoxFuture<'static, Result<Enqueued>>, Arc<str>),
    /// The create request (in this queue) failed: it may have been applied anyway, its
    /// answer lost.
    Unknown(Arc<str>),
    /// Our entry, as created.
    Created(Entry),
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trace::Nothing => f.write_str("Nothing"),
            Trace::Creating(_, queue) => f.debug_tuple("Creating").field(queue).finish(),
            Trace::Unknown(queue) => f.debug_tuple("Unknown").field(queue).finish(),
            Trace::Created(entry) => f.debug_tuple("Created").field(entry).finish(),
        }
    }
}

/// Cleanup for an acquisition that did not finish: runs on drop, in a task of its own.
#[derive(Debug)]
struct Pending {
    session: Session,
    local: Option<OwnedMutexGuard<()>>,
    trace: Trace,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let trace = std::mem::replace(&mut self.trace, Trace::Nothing);
        let local = self.local.take();
        if matches!(trace, Trace::Nothing) {
            return;
        }
        spawn_cleanup(
            &self.session,
            "acquisition abandoned",
            clean_up(self.session.clone(), trace, local),
        );
    }
}

/// Removes what an acquisition or a hold left in the backend, retrying with backoff until
/// the removal is confirmed or the session is lost (its lease, and every entry bound to it,
/// then ends on the server without us). The in-process slot is released only then.
async fn clean_up(session: Session, mut trace: Trace, local: Option<OwnedMutexGuard<()>>) {
    let backend = Arc::clone(session.backend());
    let lost = session.lost();
    tokio::pin!(lost);
    let mut backoff = Backoff::new();
    loop {
        let step = async {
            match trace {
                Trace::Nothing => Trace::Nothing,
                // The create may be on its way: let it finish rather than race it.
                Trace::Creating(create, queue) => match create.await {
                    Ok(enqueued) => Trace::Created(enqueued.into_parts().0),
                    Err(_) => Trace::Unknown(queue),
                },
                Trace::Unknown(queue) => {
                    let tag = session.lease_id().to_hex();
                    match backend.find_entry(&queue, &tag).await {
                        // Ours: our tag, our lease. The slot we hold means no other task of
                        // this session created it.
                        Ok(Some(entry)) if entry.lease() == Some(session.lease_id()) => {
                            Trace::Created(entry)
                        }
                        Ok(_) => Trace::Nothing,
                        Err(e) => {
                            tracing::debug!(%queue, error = %e, "cleanup: cannot look for the entry; retrying");
                            wait(&mut backoff).await;
                            Trace::Unknown(queue)
                        }
                    }
                }
                Trace::Created(entry) => match backend.delete_entry(&entry).await {
                    Ok(_) => {
                        tracing::debug!(key = %entry.key(), token = %entry.token(), "entry removed");
                        Trace::Nothing
                    }
                    Err(e) => {
                        tracing::debug!(key = %entry.key(), error = %e, "cleanup: delete failed; retrying");
                        wait(&mut backoff).await;
                        Trace::Created(entry)
                    }
                },
            }
        };
        trace = tokio::select! {
            biased;
            reason = &mut lost => {
                tracing::debug!(%reason, "cleanup ends with the session; the lease takes its entries");
                break;
            }
            next = step => next,
        };
        if matches!(trace, Trace::Nothing) {
            break;
        }
    }
    drop(local);
}

async fn wait(backoff: &mut Backoff) {
    // Boxed: a timer is large, and only failing paths need one.
    Box::pin(tokio::time::sleep(backoff.next_delay())).await;
}

/// Runs `cleanup` in the current runtime, else in the session's; logs if neither runs.
fn spawn_cleanup(
    session: &Session,
    what: &'static str,
    cleanup: impl Future<Output = ()> + Send + 'static,
) {
    let runtime =
        tokio::runtime::Handle::try_current().unwrap_or_else(|_| session.runtime().clone());
    tracing::debug!(what, "cleanup started");
    // Counted from now, not from its first poll, so that `Session::settled` cannot miss it.
    let counted = session.cleanup_started();
    // If that runtime is shutting down the task never runs: its session is lost at its
    // deadline then (nothing renews it), and the lease takes the entry.
    drop(runtime.spawn(async move {
        cleanup.await;
        drop(counted);
    }));
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
        let lost = session.lost_recorded();
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
        if let Some(reason) = session.loss().check() {
            return Err(Error::SessionLost(reason));
        }

        let backend = Arc::clone(session.backend());
        let (q, tag, lease) = (
            Arc::clone(queue),
            session.lease_id().to_hex(),
            session.lease_id(),
        );
        let mut pending = Pending {
            session: session.clone(),
            local: Some(local),
            trace: Trace::Creating(
                Box::pin(async move { backend.enqueue(&q, &tag, lease, &value).await }),
                Arc::clone(queue),
            ),
        };
        let Trace::Creating(create, _) = &mut pending.trace else {
            unreachable!("set just above")
        };
        // Matched at once, not kept in a local: a named answer would stay in this state for
        // as long as the waiter waits.
        let (entry, is_head, predecessor) = match tokio::select! {
            enqueued = create => enqueued,
            reason = &mut lost => return Err(Error::SessionLost(reason)),
        } {
            Ok(enqueued) => enqueued.into_parts(),
            Err(e) => {
                // The create may have been applied and its answer lost: the cleanup looks.
                pending.trace = Trace::Unknown(Arc::clone(queue));
                return Err(e);
            }
        };
        // Our entry lives in the drop guard only (a waiter may wait long: one copy per waiter).
        pending.trace = Trace::Created(entry);
        let Trace::Created(mine) = &pending.trace else {
            unreachable!("set just above")
        };
        tracing::debug!(key = %mine.key(), token = %mine.token(), head = is_head, "enqueued");

        if !is_head {
            if mode == Mode::Try {
                // Leave nothing behind before reporting "busy"; on failure the drop guard
                // retries.
                if session.backend().delete_entry(mine).await.is_ok() {
                    pending.trace = Trace::Nothing;
                }
                return Err(Error::Locked {
                    name: queue.to_string(),
                });
            }
            wait_for_turn(session, mine, predecessor, &mut lost).await?;
        }
        // Nothing is granted to a lost session, even one whose loss nothing has recorded yet
        // (its deadline passed while the keep-alive driver did not run).
        if let Some(reason) = session.loss().check() {
            return Err(Error::SessionLost(reason));
        }

        // Recorded on the caller's span (`baton.lock`, `baton.campaign`), which is current:
        // the callers keep no second handle of it in their state.
        let span = tracing::Span::current();
        span.record("key", mine.key());
        span.record("token", mine.token().get());
        tracing::debug!("granted");
        let Trace::Created(entry) = std::mem::replace(&mut pending.trace, Trace::Nothing) else {
            unreachable!(
                "the entry was stored above and only taken on the `try` path, which returned"
            )
        };
        Ok(Held {
            session: session.clone(),
            entry,
            local: pending.local.take(),
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
    lost: &'a mut (impl Future<Output = LostReason> + Unpin + Send),
) -> impl Future<Output = Result<()>> + Send + 'a {
    async move {
        let backend = session.backend();
        // The token of the predecessor last seen gone (0: none; tokens start at 1). A read
        // that shows it again (a backend whose wait cannot see that entry, a lagging replica)
        // backs off instead of spinning.
        let mut last_gone = 0u64;
        // Reads and waits that failed in a row. A failed read or wait says nothing about
        // the queue (the backend contract): go round again, after a pause that grows. An
        // outage that lasts ends the wait through the session, which is lost by then.
        let mut failures = 0u32;
        loop {
            let seen_again = predecessor
                .as_ref()
                .is_some_and(|p| p.token().get() == last_gone);
            if failures > 0 || seen_again {
                let pause = if failures > 0 {
                    Backoff::after(failures)
                } else {
                    tracing::debug!(key = %mine.key(), "predecessor seen again after it was gone; backing off");
                    Backoff::SLOW
                };
                tokio::select! {
                    () = Box::pin(tokio::time::sleep(pause)) => {}
                    reason = &mut *lost => return Err(Error::SessionLost(reason)),
                }
            }
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
                        Ok(Some(p)) if p.token().get() == last_gone => {
                            // Shown again after it was seen gone: pause before waiting on it.
                            predecessor = Some(p);
                            continue;
                        }
                        Ok(Some(p)) => empty.insert(p),
                        Ok(None) => return Ok(()),
                        // Our own key vanished: most likely our lease ended.
                        Err(Error::EntryGone { .. }) if session.is_lost() => break,
                        Err(e @ Error::EntryGone { .. }) => return Err(e),
                        Err(e) => {
                            tracing::debug!(key = %mine.key(), error = %e, "reading the predecessor failed; retrying");
                            failures = failures.saturating_add(1);
                            continue;
                        }
                    }
                }
            };
            tracing::debug!(key = %mine.key(), predecessor = %waited_for.key(), "waiting for predecessor");
            let gone = tokio::select! {
                gone = backend.wait_gone(waited_for) => gone,
                reason = &mut *lost => return Err(Error::SessionLost(reason)),
            };
            if let Err(e) = gone {
                tracing::debug!(key = %mine.key(), error = %e, "waiting for the predecessor failed; retrying");
                failures = failures.saturating_add(1);
                continue;
            }
            failures = 0;
            last_gone = waited_for.token().get();
            predecessor = None;
            // Usually the predecessor was the holder and we are now the head: a cheap check
            // first (it may be answered by a replica); when it cannot tell, or fails, the
            // authoritative read decides: the predecessor may have been a waiter that gave up.
            let head = tokio::select! {
                head = backend.was_head(mine) => head.unwrap_or(false),
                reason = &mut *lost => return Err(Error::SessionLost(reason)),
            };
            if head {
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
            key: self.entry.key().to_owned(),
        }
    }

    /// The name of the lock or election (the queue our entry is in).
    pub(crate) fn queue(&self) -> &str {
        crate::backend::queue_of(self.entry.key())
    }

    /// Applies `ops` only while our entry exists; [`Error::NotOwner`] otherwise. A write to
    /// our own key, or to any key under the queue's name, is refused before anything is sent:
    /// it would put an entry without a lease into the queue (or detach ours from its lease).
    pub(crate) async fn write(&self, ops: &[crate::WriteOp]) -> Result<()> {
        let queue = self.queue();
        for op in ops {
            let key = match op {
                crate::WriteOp::Put { key, .. } | crate::WriteOp::Delete { key } => key,
            };
            if key
                .strip_prefix(queue)
                .is_some_and(|rest| rest.starts_with('/'))
            {
                return Err(Error::WriteIntoQueue {
                    key: key.clone(),
                    queue: queue.to_owned(),
                });
            }
        }
        if self.session.backend().guarded(&self.entry, ops).await? {
            Ok(())
        } else {
            Err(self.not_owner())
        }
    }

    /// Resolves when the hold is lost: the session is lost, or our entry was deleted while
    /// the session lives. Holds no session handle, so it does not keep the lease alive.
    pub(crate) fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let loss = self.session.loss();
        let backend = Arc::clone(self.session.backend());
        let entry = self.entry.clone();
        let lease = self.session.lease_id();
        async move {
            tokio::select! {
                biased;
                reason = Arc::clone(&loss).wait() => reason,
                () = entry_deleted(&*backend, &entry) => {
                    if let Some(reason) = loss.check() {
                        return reason;
                    }
                    // Gone with the lease? Then the session is lost, and says why.
                    if let Ok(None) = backend.lease_ttl(lease).await {
                        loss.mark(LostReason::Revoked);
                        return LostReason::Revoked;
                    }
                    tracing::warn!(key = %entry.key(), "entry deleted while its session lives");
                    LostReason::EntryDeleted
                }
            }
        }
    }

    /// Deletes the entry if it is still this incarnation; [`Error::NotOwner`] if it was
    /// already gone. On another error (the outcome is unknown) the delete goes on in the
    /// background until it is confirmed or the session is lost.
    ///
    /// (An `async` block, not an `async fn`, which would keep `self` twice in its state.)
    #[allow(clippy::manual_async_fn)] // On purpose: see above.
    pub(crate) fn release(mut self) -> impl Future<Output = Result<()>> + Send + 'static {
        async move {
            // `released` is set only once the delete answered: if this future is dropped
            // before, `Drop` hands the (idempotent, revision-conditioned) delete to a task.
            match self.session.backend().delete_entry(&self.entry).await {
                Ok(was_ours) => {
                    self.disarm();
                    if was_ours {
                        Ok(())
                    } else {
                        tracing::warn!(key = %self.entry.key(), "lost before the release: the entry was already gone");
                        Err(self.not_owner())
                    }
                }
                Err(e) => {
                    // The local queue stays taken until the cleanup confirms, so no local
                    // task reuses the key (and its token) meanwhile.
                    self.cleanup_in_background("release failed");
                    Err(e)
                }
            }
        }
    }

    /// Whether our entry still exists (this incarnation), asked until the backend answers:
    /// `Ok(true)` means the hold lasted without a break from the grant until now (no entry
    /// older than ours can appear, and ours is the same incarnation). A failed read is
    /// retried with backoff; [`Error::SessionLost`] if the session is lost first.
    pub(crate) async fn still_held(&self) -> Result<bool> {
        let lost = self.session.lost();
        tokio::pin!(lost);
        let mut backoff = Backoff::new();
        loop {
            let read = self.session.backend().guarded(&self.entry, &[]);
            let result = tokio::select! {
                biased;
                reason = &mut lost => return Err(Error::SessionLost(reason)),
                result = read => result,
            };
            match result {
                Ok(held) => return Ok(held),
                Err(e) => {
                    tracing::debug!(key = %self.entry.key(), error = %e, "ownership check failed; retrying");
                    tokio::select! {
                        biased;
                        reason = &mut lost => return Err(Error::SessionLost(reason)),
                        () = wait(&mut backoff) => {}
                    }
                }
            }
        }
    }

    /// Nothing left for `Drop` to do.
    fn disarm(&mut self) {
        self.released = true;
    }

    fn cleanup_in_background(&mut self, what: &'static str) {
        self.disarm();
        let trace = Trace::Created(self.entry.clone());
        let local = self.local.take();
        spawn_cleanup(
            &self.session,
            what,
            clean_up(self.session.clone(), trace, local),
        );
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.released {
            self.cleanup_in_background("guard dropped");
        }
    }
}

/// Resolves once `entry` is deleted. A failed wait says nothing about the entry: it is
/// retried with backoff, never taken for a deletion.
async fn entry_deleted(backend: &dyn Backend, entry: &Entry) {
    let mut backoff = Backoff::new();
    while let Err(e) = backend.wait_gone(entry).await {
        tracing::debug!(key = %entry.key(), error = %e, "watching our own entry failed; retrying");
        wait(&mut backoff).await;
    }
}
