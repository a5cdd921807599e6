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
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

use crate::backend::{Backend, Enqueued, Entry};
use crate::error::{Error, LostReason, Result};
use crate::metrics::Meter;
use crate::session::Session;

/// Whether [`acquire`] waits for its turn or gives up at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Wait,
    Try,
}

/// The retry policy's pauses (`crate::retry`), named here for the recipes built on the engine.
pub(crate) use crate::retry::Backoff;

/// The pause before going round a loop that should not have come round at all.
const SLOW: Duration = Duration::from_millis(250);

/// The head of a queue, held: the entry exists and no older entry does.
#[derive(Debug)]
pub(crate) struct Held {
    session: Session,
    /// The lock, election or recipe: its name (the queue, or for a read-write lock the queue
    /// that holds the entry's own) and where the hold time is reported.
    meter: Arc<Meter>,
    entry: Entry,
    /// Kept until the entry is deleted, so the next local task cannot reuse the key early.
    local: Option<OwnedMutexGuard<()>>,
    /// When the entry was granted, for the hold time.
    granted: Instant,
    /// [`LET_GO`] and [`RELEASED`], shared with the `lost()` futures (one word: every
    /// holder keeps a guard).
    state: Arc<AtomicU8>,
}

/// The holder let go (the release's start, or the drop), set before the delete is sent: the
/// deletion `lost()` then sees is ours, not a loss. The hold time is reported then, once.
const LET_GO: u8 = 1;
/// The release was done or handed to a cleanup task: `Drop` has nothing to do.
const RELEASED: u8 = 2;

/// Where an acquisition puts its entry: the key `<queue>/<tag>` (tags have no `/`). One
/// string: this is kept by every waiter.
#[derive(Debug, Clone)]
struct Slot(Box<str>);

impl Slot {
    fn new(queue: &str, tag: &str) -> Slot {
        Slot(format!("{queue}/{tag}").into())
    }

    fn parts(&self) -> (&str, &str) {
        self.0.rsplit_once('/').unwrap_or(("", &self.0))
    }
}

/// What an acquisition may have left in the backend.
enum Trace {
    /// Nothing: no create was sent, or what was created is known to be gone.
    Nothing,
    /// The create request, built and not sent: dropped unsent, it leaves nothing.
    Unsent(BoxFuture<'static, Result<Enqueued>>, Slot),
    /// The create request, not finished; polled in place by the acquisition, and moved to
    /// the cleanup task if the acquisition ends first.
    Creating(BoxFuture<'static, Result<Enqueued>>, Slot),
    /// The create request failed: it may have been applied anyway, its answer lost.
    Unknown(Slot),
    /// Our entry, as created.
    Created(Entry),
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trace::Nothing => f.write_str("Nothing"),
            Trace::Unsent(_, slot) => f.debug_tuple("Unsent").field(slot).finish(),
            Trace::Creating(_, slot) => f.debug_tuple("Creating").field(slot).finish(),
            Trace::Unknown(slot) => f.debug_tuple("Unknown").field(slot).finish(),
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
        if matches!(trace, Trace::Nothing | Trace::Unsent(..)) {
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
                Trace::Nothing | Trace::Unsent(..) => Trace::Nothing,
                // The create may be on its way: let it finish rather than race it.
                Trace::Creating(create, slot) => match create.await {
                    Ok(enqueued) => Trace::Created(enqueued.into_parts().0),
                    Err(_) => Trace::Unknown(slot),
                },
                Trace::Unknown(slot) => {
                    let (queue, tag) = slot.parts();
                    match backend.abandon(queue, tag, session.lease_id()).await {
                        // Ours: our tag, our lease. The in-process slot we hold (or a tag used
                        // once) means no other task of this session created it.
                        Ok(Some(entry)) if entry.lease() == Some(session.lease_id()) => {
                            Trace::Created(entry)
                        }
                        Ok(_) => Trace::Nothing,
                        Err(e) => {
                            tracing::debug!(key = %slot.0, error = %e, "cleanup: cannot look for the entry; retrying");
                            backoff.wait().await;
                            Trace::Unknown(slot)
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
                        backoff.wait().await;
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

/// What a contender waits for before its entry is granted.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Turn<'a> {
    /// No entry ahead in its own queue (Mutex, Election). The tag is the lease id in hex
    /// (etcd's Go layout), the same for every task of a session: they queue in process
    /// first.
    Head,
    /// Fewer than `limit` entries of queue `of` ahead (Semaphore: `of` is the entry's own
    /// queue; read lock: `of` holds the lock's writers). It watches the `limit` entries of
    /// `of` just ahead of it. The tag is one this session's acquisitions in progress do not
    /// use ([`Session::free_tag`]): tasks of one session hold entries side by side.
    Fewer(&'a Fewer<'a>),
    /// Granted as soon as the entry exists (barriers count entries). Tag as for `Fewer`.
    Enter,
}

/// The rule of [`Turn::Fewer`] (behind a reference: a mutex waiter should not carry its
/// size).
#[derive(Debug)]
pub(crate) struct Fewer<'a> {
    pub(crate) of: &'a str,
    pub(crate) limit: Limit<'a>,
    /// For a kind that holds together with others of its kind (permits, readers): granted
    /// only once no entry of another kind is ahead of it under the name (docs/recipes.md,
    /// "One name, several kinds of lock"). `None`: `of` and `limit` say it all (a write
    /// lock: no entry at all ahead under the name).
    pub(crate) kind: Option<Shared<'a>>,
}

/// A kind of entry that holds together with others of its kind, told by the first bytes of
/// its value ([`PERMIT`], [`READ`]). Every other entry under the name (a Mutex's, an
/// Election's, a write lock's, `etcdctl lock`'s, a Curator or kazoo lock's, anything baton
/// does not recognise) excludes it, and it excludes them: they wait for every older entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shared<'a> {
    /// The name whose entries (nested ones included) are looked at.
    pub(crate) name: &'a str,
    /// The mark every entry of this kind's value starts with.
    pub(crate) mark: &'static [u8],
}

/// The start of a semaphore permit's value.
pub(crate) const PERMIT: &[u8] = b"baton-permit:";
/// The start of a read lock's value.
pub(crate) const READ: &[u8] = b"baton-read:";
/// The start of a barrier entry's value (it counts nowhere; `baton status` shows it).
pub(crate) const BARRIER: &[u8] = b"baton-barrier:";
/// The start of a double barrier member's value (as [`BARRIER`]).
pub(crate) const MEMBER: &[u8] = b"baton-member:";

/// `value` marked as an entry of kind `mark`.
pub(crate) fn marked(mark: &[u8], value: &[u8]) -> Vec<u8> {
    [mark, value].concat()
}

/// Refuses a value an exclusive entry (Mutex, Election, write lock) cannot hold: one that
/// starts like a shared kind's would be taken for one, and let its holders in.
pub(crate) fn check_exclusive_value(value: &[u8]) -> Result<()> {
    if [PERMIT, READ, BARRIER, MEMBER]
        .iter()
        .any(|mark| value.starts_with(mark))
    {
        return Err(Error::InvalidArgument(
            "a lock's value (owner info or proposal) must not start with `baton-permit:`, `baton-read:`, `baton-barrier:` or `baton-member:`: those mark permits, read locks and barriers",
        ));
    }
    Ok(())
}

/// How many entries ahead are too many, for [`Turn::Fewer`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Limit<'a> {
    Fixed(usize),
    /// No count: only entries of another kind ahead hold the contender back (a read lock:
    /// readers hold together, anything else under the name excludes them).
    None,
    /// The limit stored (in decimal) at `key` by [`crate::Semaphore`], read again at every
    /// look, so that a change applies to waiters at once.
    Stored {
        key: &'a str,
        /// For errors: the recipe's name and the limit this contender was created with.
        name: &'a str,
        requested: u32,
    },
}

/// One acquisition: its entry goes to `<queue>/<tag>` holding `value`; `meter` names the lock
/// the entry belongs to (the queue itself, or the queue that contains it) and times it.
#[derive(Debug)]
pub(crate) struct Ask<'a> {
    pub(crate) meter: &'a Arc<Meter>,
    pub(crate) queue: &'a Arc<str>,
    pub(crate) value: Vec<u8>,
    pub(crate) mode: Mode,
    pub(crate) turn: Turn<'a>,
}

/// Takes a turn in a queue for `session`, as `ask` says: for [`Turn::Head`], in process
/// first, then in the backend. The wait is reported to the meter with its outcome, or as
/// cancelled if the future is dropped first.
pub(crate) fn acquire<'a>(
    session: &'a Session,
    ask: Ask<'a>,
) -> impl Future<Output = Result<Held>> + Send + 'a {
    let meter: &'a Meter = ask.meter;
    let waiting = meter.waiting();
    // `map` rather than an `async` block, which would keep a second copy of the acquisition
    // in its state (see `take_turn`).
    take_turn(session, ask).map(move |result| waiting.finish(result))
}

/// How a contender's turn came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turned {
    /// Granted without waiting for anyone to leave.
    Free,
    /// Granted after waiting for entries ahead to leave: the lock was handed over.
    Handoff,
    /// Not granted at once, and the call does not wait ([`Mode::Try`]).
    Busy,
}

/// The acquisition itself, untimed: see [`acquire`].
///
/// (Written as a function returning an `async move` block rather than an `async fn`: an
/// `async fn` keeps a second copy of its arguments in its state, and this state is kept by
/// every waiter for as long as it waits.)
#[allow(clippy::manual_async_fn)]
// On purpose: see above.
// The drop guard `pending` is captured by the async block and changed just before a return:
// its `Drop` reads the change (the cleanup), which this lint does not see for captured
// values. `failed_lock_leaves_nothing` fails if the change is lost.
#[allow(unused_assignments)]
fn take_turn<'a>(
    session: &'a Session,
    ask: Ask<'a>,
) -> impl Future<Output = Result<Held>> + Send + 'a {
    let Ask {
        meter,
        queue,
        value,
        mode,
        turn,
    } = ask;
    // The create request is built here, before the state: it takes the value with it (it
    // runs only when awaited below).
    let (tag, pooled): (Box<str>, _) = match turn {
        Turn::Head => (session.lease_id().to_hex().into(), None),
        Turn::Fewer(_) | Turn::Enter => {
            let (tag, slot) = session.free_tag(queue);
            (tag.into(), Some(slot))
        }
    };
    let slot = Slot::new(queue, &tag);
    let create: BoxFuture<'static, Result<Enqueued>> = {
        let (backend, q, lease) = (
            Arc::clone(session.backend()),
            Arc::clone(queue),
            session.lease_id(),
        );
        Box::pin(async move { backend.enqueue(&q, &tag, lease, &value).await })
    };
    // The drop guard is built here too, and used in place: the state holds one of it.
    let mut pending = Pending {
        session: session.clone(),
        local: pooled,
        trace: Trace::Unsent(create, slot),
    };
    async move {
        let lost = session.lost_recorded();
        tokio::pin!(lost);
        match (turn, mode) {
            (Turn::Head, Mode::Wait) => tokio::select! {
                guard = session.local_queue(queue).lock_owned() => pending.local = Some(guard),
                reason = &mut lost => return Err(Error::SessionLost(reason)),
            },
            (Turn::Head, Mode::Try) => {
                let guard = session.local_queue(queue).try_lock_owned();
                pending.local = Some(guard.map_err(|_| Error::Locked {
                    name: meter.name().to_string(),
                })?);
            }
            (Turn::Fewer(_) | Turn::Enter, _) => {}
        }
        if let Some(reason) = session.loss().check() {
            return Err(Error::SessionLost(reason));
        }
        if let Trace::Unsent(create, slot) = std::mem::replace(&mut pending.trace, Trace::Nothing) {
            pending.trace = Trace::Creating(create, slot);
        }
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
                let Trace::Creating(_, slot) =
                    std::mem::replace(&mut pending.trace, Trace::Nothing)
                else {
                    unreachable!("still creating")
                };
                pending.trace = Trace::Unknown(slot);
                // Our entry vanished as the enqueue read on after creating it (etcd's indexed
                // layout may): most likely our lease ended. (No await here: a value held
                // across one would take room in every waiter's state.)
                if matches!(e, Error::EntryGone { .. })
                    && let Some(reason) = session.loss().check()
                {
                    return Err(Error::SessionLost(reason));
                }
                return Err(e);
            }
        };
        // Our entry lives in the drop guard only (a waiter may wait long: one copy per waiter).
        pending.trace = Trace::Created(entry);
        let Trace::Created(mine) = &pending.trace else {
            unreachable!("set just above")
        };
        tracing::debug!(key = %mine.key(), token = %mine.token(), head = is_head, "enqueued");

        let turned = match turn {
            Turn::Head if !is_head && mode == Mode::Wait => {
                wait_for_turn(session, mine, predecessor, &mut lost).await?;
                Turned::Handoff
            }
            _ => {
                // Only the mutex's wait uses the predecessor read with the create. Let go of
                // it before any other await: a value kept across one takes room in every
                // waiter's state (here, an `Entry` in every mutex waiter).
                drop(predecessor);
                match turn {
                    Turn::Enter => Turned::Free,
                    Turn::Head if is_head => Turned::Free,
                    Turn::Head => Turned::Busy,
                    // The head of the queue counted is ahead of no one.
                    Turn::Fewer(rule) if is_head && rule.of == &**queue => Turned::Free,
                    // Boxed: its state is larger than the head wait's, and a mutex waiter
                    // would carry that size for as long as it waits.
                    Turn::Fewer(rule) => {
                        let wait = wait_for_fewer(session, mine, rule, mode, &mut lost);
                        Box::pin(wait).await?
                    }
                }
            }
        };
        // A store epoch's restart grace holds back every grant, whatever the queue says: a
        // holder from before the store forgot may still believe it holds.
        let mut turned = turned;
        while turned != Turned::Busy && session.backend().grants_nothing_for().is_some() {
            if mode == Mode::Try {
                turned = Turned::Busy;
                break;
            }
            wait_out_grace(session, &mut lost).await?;
            // A head stays the head (no older entry can appear), but a stored limit may have
            // been lowered while the grace lasted: count again (found by the simulation, seed
            // 587: three permits granted at the grace's end under a limit of one).
            if let Turn::Fewer(rule) = turn
                && matches!(rule.limit, Limit::Stored { .. })
            {
                let wait = wait_for_fewer(session, mine, rule, mode, &mut lost);
                turned = Box::pin(wait).await?;
            }
        }
        if turned == Turned::Busy {
            // Leave nothing behind before reporting "busy"; on failure the drop guard
            // retries.
            if session.backend().delete_entry(mine).await.is_ok() {
                pending.trace = Trace::Nothing;
            }
            let name = meter.name().to_string();
            return Err(match session.backend().grants_nothing_for() {
                Some(left) => Error::RestartGrace { name, left },
                None => Error::Locked { name },
            });
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
        if turned == Turned::Handoff {
            meter.handoff();
        }
        let Trace::Created(entry) = std::mem::replace(&mut pending.trace, Trace::Nothing) else {
            unreachable!(
                "the entry was stored above and only taken on the `try` path, which returned"
            )
        };
        Ok(Held {
            session: session.clone(),
            meter: Arc::clone(meter),
            entry,
            local: pending.local.take(),
            granted: Instant::now(),
            state: Arc::default(),
        })
    }
}

/// Waits until the backend grants again after a store epoch's restart grace (see
/// [`Backend::grants_nothing_for`]); [`Error::SessionLost`] if the session is lost first (a
/// session from before the epoch is).
async fn wait_out_grace(
    session: &Session,
    lost: &mut (impl Future<Output = LostReason> + Unpin + Send),
) -> Result<()> {
    while let Some(left) = session.backend().grants_nothing_for() {
        tracing::debug!(left_ms = left.as_millis(), "waiting out a restart grace");
        tokio::select! {
            () = Box::pin(tokio::time::sleep(left)) => {}
            reason = &mut *lost => return Err(Error::SessionLost(reason)),
        }
    }
    Ok(())
}

/// Checks a recipe name: not empty, not ending in `/` (its entries would be `<name>//...`),
/// once the backend has spelled it its way ([`Backend::recipe_name`]).
pub(crate) fn recipe_name(session: &Session, name: String) -> Result<Arc<str>> {
    let name = session.backend().recipe_name(&name);
    if name.is_empty() {
        return Err(Error::InvalidArgument("name must not be empty"));
    }
    if name.ends_with('/') {
        return Err(Error::InvalidArgument("name must not end with `/`"));
    }
    Ok(name.into())
}

/// What one look at the queue found, for [`Turn::Fewer`].
enum Look {
    /// Granted by the count; with every entry ahead in `of` when the count read them all.
    Granted(Option<Vec<Entry>>),
    /// Not yet: the entries to watch (the `limit` just ahead), and the stored limit as read.
    Wait(Vec<Entry>, Option<Vec<u8>>),
    /// Few enough ahead, but these entries of another kind are ahead too: wait for them to
    /// go (a change of the limit changes nothing).
    Others(Vec<Entry>),
}

/// Parses a stored limit; an error that names the recipe if it is not a positive number.
pub(crate) fn parse_limit(raw: Option<&[u8]>, name: &str, requested: u32) -> Result<usize> {
    let text = raw.map(String::from_utf8_lossy);
    match text.as_deref().map(str::parse::<u32>) {
        Some(Ok(limit)) if limit > 0 => Ok(limit as usize),
        _ => Err(Error::LimitMismatch {
            name: name.to_owned(),
            stored: text.map_or_else(|| "nothing".to_owned(), |t| format!("`{t}`")),
            requested,
        }),
    }
}

/// Reads how many entries of `rule.of` are ahead of `mine`, and the limit; when they are
/// few enough, whether an entry of another kind is ahead under the name.
async fn look(backend: &dyn Backend, mine: &Entry, rule: &Fewer<'_>) -> Result<Look> {
    let looked = count(backend, mine, rule.of, rule.limit).await?;
    let Some(kind) = rule.kind else {
        return Ok(looked);
    };
    let (ahead, complete) = match looked {
        // The count read everything ahead under the name already.
        Look::Granted(Some(all)) if kind.name == rule.of => (all, true),
        Look::Granted(_) => {
            let ahead = backend.ahead(kind.name, mine, KINDS_READ).await?;
            let complete = ahead.len() < KINDS_READ;
            (ahead, complete)
        }
        waiting => return Ok(waiting),
    };
    // Entries ahead only ever go (new ones come behind): none of another kind now means none
    // for as long as `mine` lives. While the newest of them remains, `mine` cannot hold: it is
    // the one to watch. A read that may have missed some (as many as asked for came back)
    // cannot say there are none: then the newest entry ahead, whatever its kind, is watched,
    // and the look made again once it has gone.
    let newest = if complete {
        ahead
            .into_iter()
            .filter(|e| !e.value().starts_with(kind.mark))
            .max_by_key(Entry::token)
    } else {
        ahead.into_iter().max_by_key(Entry::token)
    };
    Ok(match newest {
        None => Look::Granted(None),
        Some(other) => Look::Others(vec![other]),
    })
}

/// The most entries a look for other kinds reads (the entries ahead under the name, for a
/// read lock; a permit's count reads them already). More ahead than that (1,024 read locks
/// holding, or a backend's stand-ins for a restart grace) is taken as "maybe another kind".
const KINDS_READ: usize = crate::Semaphore::MAX_PERMITS as usize;

/// Reads how many entries of `of` are ahead of `mine`, and the limit.
async fn count(backend: &dyn Backend, mine: &Entry, of: &str, limit: Limit<'_>) -> Result<Look> {
    match limit {
        Limit::Fixed(limit) => {
            let ahead = backend.ahead(of, mine, limit).await?;
            Ok(if ahead.len() < limit {
                Look::Granted(Some(ahead))
            } else {
                Look::Wait(ahead, None)
            })
        }
        Limit::None => Ok(Look::Granted(None)),
        Limit::Stored {
            key,
            name,
            requested,
        } => {
            let mut want = requested as usize;
            loop {
                // The limit is read no earlier than the entries: entries ahead of ours only
                // ever go, so "fewer than the limit" held at the instant the limit was read,
                // and a grant never follows a lowered limit it did not see.
                let (ahead, raw) = backend.ahead_and_read(of, mine, want, key).await?;
                let limit = parse_limit(raw.as_deref(), name, requested)?;
                if ahead.len() < want {
                    // All of them.
                    if ahead.len() < limit {
                        return Ok(Look::Granted(Some(ahead)));
                    }
                } else if want < limit {
                    // There may be more than were asked for: ask for enough.
                    want = limit;
                    continue;
                }
                let mut window = ahead;
                window.truncate(limit);
                return Ok(Look::Wait(window, raw));
            }
        }
    }
}

/// Waits until fewer than `limit` entries of `of` are ahead of `mine` ([`Turn::Fewer`]);
/// [`Turned::Busy`] if it is not so at once and `mode` is [`Mode::Try`].
///
/// It watches the entries just ahead, as many as the limit: while all of them remain, at
/// least that many are ahead, so no other change can make `mine` a holder. A departure among
/// them wakes it to look again; a departure further ahead does not. (Watching only the entry
/// `limit` places ahead would miss a holder nearer to it leaving first.) A stored limit is
/// watched too, so that raising it grants at once.
async fn wait_for_fewer(
    session: &Session,
    mine: &Entry,
    rule: &Fewer<'_>,
    mode: Mode,
    lost: &mut (impl Future<Output = LostReason> + Unpin + Send),
) -> Result<Turned> {
    let backend = session.backend();
    let mut failures = 0u32;
    // Whether an entry ahead has left (or the limit changed) since the first look.
    let mut waited = false;
    loop {
        if failures > 0 {
            tokio::select! {
                () = Box::pin(tokio::time::sleep(Backoff::after(failures))) => {}
                reason = &mut *lost => return Err(Error::SessionLost(reason)),
            }
        }
        let looked = tokio::select! {
            looked = look(&**backend, mine, rule) => looked,
            reason = &mut *lost => return Err(Error::SessionLost(reason)),
        };
        let (window, seen) = match looked {
            Ok(Look::Granted(_)) if waited => return Ok(Turned::Handoff),
            Ok(Look::Granted(_)) => return Ok(Turned::Free),
            Ok(Look::Wait(..) | Look::Others(_)) if mode == Mode::Try => return Ok(Turned::Busy),
            Ok(Look::Wait(window, seen)) => (window, Some(seen)),
            Ok(Look::Others(window)) => (window, None),
            // Our own entry vanished: most likely our lease ended.
            Err(Error::EntryGone { .. }) if session.is_lost() => {
                return Err(Error::SessionLost(lost.await));
            }
            Err(e @ (Error::EntryGone { .. } | Error::LimitMismatch { .. })) => return Err(e),
            Err(e) => {
                tracing::debug!(key = %mine.key(), error = %e, "looking at the queue failed; retrying");
                failures = failures.saturating_add(1);
                continue;
            }
        };
        tracing::debug!(key = %mine.key(), watching = window.len(), "waiting for fewer ahead");
        let departures = async {
            if window.is_empty() {
                // (Only with a limit of 0, which no recipe asks for: never granted.)
                return std::future::pending().await;
            }
            let waits = window.iter().map(|e| Box::pin(backend.wait_gone(e)));
            futures::future::select_all(waits).await.0
        };
        let limit_changed = async {
            match (rule.limit, &seen) {
                (Limit::Stored { key, .. }, Some(seen)) => {
                    backend.wait_value(key, seen.as_deref()).await.map(drop)
                }
                _ => std::future::pending().await,
            }
        };
        let woken = tokio::select! {
            gone = departures => gone,
            changed = limit_changed => changed,
            reason = &mut *lost => return Err(Error::SessionLost(reason)),
        };
        match woken {
            Ok(()) => {
                failures = 0;
                waited = true;
            }
            Err(e) => {
                tracing::debug!(key = %mine.key(), error = %e, "waiting failed; retrying");
                failures = failures.saturating_add(1);
            }
        }
    }
}

/// What [`wait_for_turn`] remembers of the predecessor it saw go: a hash of its key and
/// token (a waiter keeps 8 bytes, not a key). Two entries that collide only cost a pause.
fn fingerprint(entry: &Entry) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    entry.key_bytes().hash(&mut h);
    entry.token().get().hash(&mut h);
    h.finish()
}

/// Waits until no entry older than `mine` remains, watching only the newest older one.
/// Returns only after a read that showed `mine` present and nothing older (the same read:
/// [`Backend::predecessor`](crate::Backend::predecessor) or, after a wake,
/// [`Backend::was_head`](crate::Backend::was_head), or the deletion notice that
/// [`Backend::wait_gone_then_head`](crate::Backend::wait_gone_then_head) reads).
#[allow(clippy::manual_async_fn)] // Kept by every waiter: see `acquire`.
fn wait_for_turn<'a>(
    session: &'a Session,
    mine: &'a Entry,
    mut predecessor: Option<Entry>,
    lost: &'a mut (impl Future<Output = LostReason> + Unpin + Send),
) -> impl Future<Output = Result<()>> + Send + 'a {
    async move {
        let backend = session.backend();
        // The predecessor last seen gone, as a fingerprint of its key and token (`None`:
        // none). A read that shows it again (a backend whose wait cannot see that entry, a
        // lagging replica) backs off instead of spinning. The key is part of it: a backend may
        // answer the enqueue with a predecessor known by key only (token 0, ZooKeeper).
        let mut last_gone: Option<u64> = None;
        // Reads and waits that failed in a row. A failed read or wait says nothing about
        // the queue (the backend contract): go round again, after a pause that grows. An
        // outage that lasts ends the wait through the session, which is lost by then.
        let mut failures = 0u32;
        loop {
            let seen_again = predecessor
                .as_ref()
                .is_some_and(|p| Some(fingerprint(p)) == last_gone);
            if failures > 0 || seen_again {
                let pause = if failures > 0 {
                    Backoff::after(failures)
                } else {
                    tracing::debug!(key = %mine.key(), "predecessor seen again after it was gone; backing off");
                    SLOW
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
                        Ok(Some(p)) if Some(fingerprint(&p)) == last_gone => {
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
            // Usually the predecessor was the holder and we are now the head: a cheap check
            // comes with the wait (it may be answered by a replica, or by the deletion's own
            // notice); when it cannot tell, the authoritative read decides: the predecessor
            // may have been a waiter that gave up.
            let gone = tokio::select! {
                gone = backend.wait_gone_then_head(waited_for, mine) => gone,
                reason = &mut *lost => return Err(Error::SessionLost(reason)),
            };
            let head = match gone {
                Ok(head) => head,
                Err(e) => {
                    tracing::debug!(key = %mine.key(), error = %e, "waiting for the predecessor failed; retrying");
                    failures = failures.saturating_add(1);
                    continue;
                }
            };
            failures = 0;
            last_gone = Some(fingerprint(waited_for));
            predecessor = None;
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

    /// The name of the lock, election or recipe our entry belongs to.
    pub(crate) fn queue(&self) -> &str {
        self.meter.name()
    }

    /// Applies `ops` only while our entry exists; [`Error::NotOwner`] otherwise. A write to
    /// our own key, to any key under the recipe's name, or to the name itself (where a
    /// semaphore keeps its limit) is refused before anything is sent: it would put an entry
    /// without a lease into the queue, detach ours from its lease, or change the recipe.
    pub(crate) async fn write(&self, ops: &[crate::WriteOp]) -> Result<()> {
        let queue = self.queue();
        for op in ops {
            let key = match op {
                crate::WriteOp::Put { key, .. } | crate::WriteOp::Delete { key } => key,
            };
            if key
                .strip_prefix(queue)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            {
                return Err(Error::WriteIntoQueue {
                    key: key.clone(),
                    queue: queue.to_owned(),
                });
            }
        }
        let applied = self.session.backend().guarded(&self.entry, ops).await;
        if applied.map_err(|e| e.in_lock(queue))? {
            Ok(())
        } else {
            Err(self.not_owner())
        }
    }

    /// Resolves when the hold is lost: the session is lost, or our entry was deleted while
    /// the session lives. Our own release is not a loss: once the holder lets go, the
    /// deletion is ours and only the session's end resolves it. Holds no session handle, so
    /// it does not keep the lease alive.
    pub(crate) fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let loss = self.session.loss();
        let backend = Arc::clone(self.session.backend());
        let entry = self.entry.clone();
        let lease = self.session.lease_id();
        let state = Arc::clone(&self.state);
        async move {
            tokio::select! {
                biased;
                reason = Arc::clone(&loss).wait() => reason,
                () = entry_deleted(&*backend, &entry) => {
                    if let Some(reason) = loss.check() {
                        return reason;
                    }
                    // Set before our delete was sent, so seen here if the deletion was ours.
                    if state.load(Ordering::Acquire) & LET_GO != 0 {
                        return loss.wait().await;
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
        // The hold ends when the holder lets go, however long the delete takes.
        self.end_hold();
        async move {
            // `RELEASED` is set only once the delete answered: if this future is dropped
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
                    Err(e.in_lock(self.queue()))
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
                        () = backoff.wait() => {}
                    }
                }
            }
        }
    }

    /// Marks that the holder lets go (see [`Held::lost`]) and reports the hold time, once.
    fn end_hold(&mut self) {
        if self.state.fetch_or(LET_GO, Ordering::AcqRel) & LET_GO == 0 {
            self.meter.held_since(self.granted);
        }
    }

    /// Nothing left for `Drop` to do.
    fn disarm(&mut self) {
        self.state.fetch_or(RELEASED, Ordering::Release);
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
        self.end_hold();
        if self.state.load(Ordering::Acquire) & RELEASED == 0 {
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
        backoff.wait().await;
    }
}
