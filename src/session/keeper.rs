//! One keep-alive driver per tokio runtime: renews the lease of every session created in
//! that runtime, and marks a session lost when its deadline passes without a renewal.
//!
//! A task per session would cost each session its task and timer (about half a KiB) and
//! 10,000 tasks for 10,000 sessions; the driver keeps one ordered map entry per session
//! instead, and runs the renewals that are due concurrently, so a slow one never delays
//! another.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Inner;
use crate::error::{Error, LostReason, Result};

/// The drivers started so far, by runtime. A driver ends with its runtime (its receiver is
/// dropped with the task), which `is_closed` reveals; such entries are pruned.
static DRIVERS: StdMutex<Vec<(tokio::runtime::Id, mpsc::UnboundedSender<Msg>)>> =
    StdMutex::new(Vec::new());

/// What the driver is told: a session to keep alive, or (tests) to stop for a while.
enum Msg {
    Keep(Kept),
    /// Stop until this instant, as a driver whose thread is starved or whose process is
    /// frozen: no renewal sent, no answer handled, no deadline marked
    /// ([`crate::testing::starve_keep_alive`]).
    #[cfg(feature = "testing")]
    Starve(Instant),
}

/// The driver of the current runtime (started if there is none), and that runtime.
pub(super) fn for_current_runtime() -> Result<(Keeper, tokio::runtime::Handle)> {
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|_| Error::InvalidArgument("a session needs a tokio runtime"))?;
    let mut drivers = DRIVERS.lock().unwrap_or_else(|p| p.into_inner());
    drivers.retain(|(_, tx)| !tx.is_closed());
    if let Some((_, tx)) = drivers.iter().find(|(id, _)| *id == runtime.id()) {
        return Ok((Keeper { tx: tx.clone() }, runtime));
    }
    let (tx, rx) = mpsc::unbounded_channel();
    runtime.spawn(drive(rx));
    drivers.push((runtime.id(), tx.clone()));
    Ok((Keeper { tx }, runtime))
}

/// A handle to a runtime's driver.
pub(super) struct Keeper {
    tx: mpsc::UnboundedSender<Msg>,
}

impl Keeper {
    /// Starts renewing `session`'s lease. `asked_at` is the instant before the grant was
    /// requested: the server's clock for the lease started no earlier than that.
    pub(super) fn keep(&self, session: &Arc<Inner>, asked_at: Instant) {
        let ttl = session.lease.ttl();
        let kept = Kept {
            session: Arc::downgrade(session),
            ttl,
            deadline: asked_at + ttl,
            next: Some(asked_at + ttl / 3),
        };
        if self.tx.send(Msg::Keep(kept)).is_err() {
            // Only if the runtime is shutting down: nothing will run to renew it.
            session.lost.mark(LostReason::Expired);
        }
    }
}

/// Stops the current runtime's driver (started if there is none) until `until`: the
/// driver's loop awaits it inline, exactly as a starved task does nothing.
#[cfg(feature = "testing")]
pub(super) fn starve(until: Instant) -> Result<()> {
    let (keeper, _) = for_current_runtime()?;
    keeper
        .tx
        .send(Msg::Starve(until))
        .map_err(|_| Error::InvalidArgument("the tokio runtime is shutting down"))
}

/// A session as the driver tracks it.
struct Kept {
    /// Weak: the driver does not keep a session alive. A dropped session is forgotten
    /// at its next wakeup (its `Drop` revokes the lease).
    session: Weak<Inner>,
    ttl: Duration,
    /// The lease may have expired on the server from this instant on.
    deadline: Instant,
    /// When to send the next renewal; `None` while one is in flight (the session then
    /// wakes the driver only at its deadline).
    next: Option<Instant>,
}

/// Files `kept` under the instant it next needs attention; returns its key.
fn schedule(sessions: &mut BTreeMap<Key, Kept>, id: u64, kept: Kept) -> Key {
    let wake_at = kept
        .next
        .map_or(kept.deadline, |next| next.min(kept.deadline));
    let key = (wake_at, id);
    sessions.insert(key, kept);
    key
}

/// Sessions by the instant they need attention, and a sequence number for uniqueness.
type Key = (Instant, u64);

/// What a renewal reports back: the session's key while it was in flight, the instant
/// before it was sent, and the backend's answer.
type Renewed = (Key, Instant, Result<Option<Duration>>);

/// Says so when a runtime with live sessions shuts down: the driver is dropped with it, and
/// nothing renews those sessions any more. Each is then lost at its deadline, which
/// `Session::is_lost` and `Session::lost` check by themselves.
#[derive(Default)]
struct Sessions(BTreeMap<Key, Kept>);

impl Drop for Sessions {
    fn drop(&mut self) {
        let orphaned = self
            .0
            .values()
            .filter(|kept| kept.session.strong_count() > 0)
            .count();
        if orphaned > 0 {
            tracing::warn!(
                sessions = orphaned,
                "the tokio runtime that renewed these sessions shut down; they are lost at their deadlines"
            );
        }
    }
}

async fn drive(mut rx: mpsc::UnboundedReceiver<Msg>) {
    let mut owned = Sessions::default();
    let sessions = &mut owned.0;
    let mut renewals: FuturesUnordered<BoxFuture<'static, Renewed>> = FuturesUnordered::new();
    let mut seq = 0u64;
    let timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(timer);
    loop {
        if let Some(&(at, _)) = sessions.keys().next()
            && timer.deadline() != at
        {
            timer.as_mut().reset(at);
        }
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(Msg::Keep(kept)) => {
                    seq += 1;
                    schedule(sessions, seq, kept);
                }
                #[cfg(feature = "testing")]
                Some(Msg::Starve(until)) => starved(&mut rx, sessions, &mut seq, until).await,
                // Every sender is gone: only when the process-wide list itself is dropped.
                None => return,
            },
            Some((key, sent, answer)) = renewals.next(), if !renewals.is_empty() => {
                crate::metrics::keepalive_answered(sent, answer.is_err());
                if let Some(kept) = sessions.remove(&key) {
                    renewed(sessions, key.1, kept, sent, answer);
                }
                // Else the deadline passed while the renewal was in flight: already lost.
            }
            () = &mut timer, if !sessions.is_empty() => {
                let now = Instant::now();
                while let Some(entry) = sessions.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    let ((_, id), kept) = entry.remove_entry();
                    if let Some(renewal) = due(sessions, id, kept, now) {
                        renewals.push(renewal);
                    }
                }
            }
        }
    }
}

/// The driver starved until `until`: it only sleeps. What was sent to it meanwhile is taken
/// in afterwards, a later starvation included (so that overlapping ones starve it until
/// the last ends).
#[cfg(feature = "testing")]
async fn starved(
    rx: &mut mpsc::UnboundedReceiver<Msg>,
    sessions: &mut BTreeMap<Key, Kept>,
    seq: &mut u64,
    until: Instant,
) {
    let mut until = until;
    loop {
        tokio::time::sleep_until(until).await;
        let mut later = None;
        while let Ok(msg) = rx.try_recv() {
            match msg {
                Msg::Keep(kept) => {
                    *seq += 1;
                    schedule(sessions, *seq, kept);
                }
                Msg::Starve(next) => later = later.max(Some(next)),
            }
        }
        match later {
            Some(next) if next > until => until = next,
            _ => return,
        }
    }
}

/// Handles a session whose wakeup came: expired, forgotten, or renewed now.
fn due(
    sessions: &mut BTreeMap<Key, Kept>,
    id: u64,
    mut kept: Kept,
    now: Instant,
) -> Option<BoxFuture<'static, Renewed>> {
    let session = kept.session.upgrade()?;
    if session.closed.load(std::sync::atomic::Ordering::SeqCst) {
        return None;
    }
    if now >= kept.deadline {
        session.lost.mark(LostReason::Expired);
        return None;
    }
    if matches!(
        session.lost.reason(),
        Some(LostReason::Expired | LostReason::Revoked)
    ) {
        // Lost already (see `renewed`): never renewed again.
        return None;
    }
    if session.lost.reason() == Some(LostReason::StoreReset) {
        // The store forgot the epoch this lease was granted in: renewing it (a lease a
        // restore brought back) would keep its entries ahead of the new epoch's holders.
        // Ended instead, best effort; the new epoch's grace covers it if this fails.
        let (backend, lease) = (Arc::clone(&session.backend), session.lease.id());
        tokio::spawn(async move {
            if let Err(e) = backend.revoke_lease(lease).await {
                tracing::debug!(%lease, error = %e, "revoking a lease from before a store epoch failed");
            }
        });
        return None;
    }
    kept.next = None;
    let key = schedule(sessions, id, kept);
    let (backend, lease) = (Arc::clone(&session.backend), session.lease.id());
    drop(session);
    let sent = Instant::now();
    Some(Box::pin(async move {
        let answer = backend.keep_alive(lease).await;
        (key, sent, answer)
    }))
}

/// Applies a renewal's answer to the session it was sent for.
fn renewed(
    sessions: &mut BTreeMap<Key, Kept>,
    id: u64,
    mut kept: Kept,
    sent: Instant,
    answer: Result<Option<Duration>>,
) {
    let Some(session) = kept.session.upgrade() else {
        return;
    };
    if matches!(
        session.lost.reason(),
        Some(LostReason::Expired | LostReason::Revoked)
    ) {
        // Lost meanwhile (its deadline passed before this answer was handled: a check before
        // a grant, or a `lost()` future, recorded it): its holders were told, its waiters
        // failed, and its cleanups leave its entries to the lease. Renewing it now would keep
        // those entries, and everyone queued behind them, for as long as the process runs.
        return;
    }
    match answer {
        Ok(Some(granted)) => {
            kept.ttl = granted;
            kept.deadline = sent + granted;
            kept.next = Some(sent + granted / 3);
            session.lost.extend(kept.deadline);
        }
        Ok(None) => {
            session.lost.mark(LostReason::Revoked);
            return;
        }
        Err(e) => {
            let retry = (kept.ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
            tracing::debug!(lease = %session.lease.id(), error = %e, ?retry, "keep-alive failed; retrying");
            kept.next = Some(Instant::now() + retry);
        }
    }
    schedule(sessions, id, kept);
}
