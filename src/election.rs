//! [`Election`]: leader election on the same queue as [`Mutex`](crate::Mutex), with the key
//! layout of etcd's Go `concurrency.Election`.

use std::future::Future;
use std::sync::Arc;

use futures::stream::{BoxStream, StreamExt};
use sync_wrapper::SyncFuture;
use tracing::Instrument;

use crate::backend::{Entry, FencingToken, HeadEvent};
use crate::error::{Error, Result};
use crate::fence::Ticket;
use crate::metrics::{Meter, Recipe};
use crate::queue::{self, Held, Mode, Turn};
use crate::session::Session;

/// Leader election: campaigners queue under `<name>/`, the oldest key leads, and its value
/// is the leader's proposal.
///
/// The layout is etcd's Go `concurrency.Election` (`etcdctl elect`): baton, Go services and
/// shell scripts can campaign in, and observe, the same election.
///
/// # Guarantees
/// - At most one leader at a time per the backend; leadership passes in campaign order.
/// - The leader's [`fencing_token`](Leadership::fencing_token) increases strictly from one
///   leader to the next.
/// - A campaigner whose session is lost while waiting gets an error, never leadership.
///
/// # Failure modes
/// A leader whose session is lost, or whose key is deleted from outside, is told through
/// [`Leadership::lost`]; from then on another campaigner may lead, and
/// [`proclaim`](Leadership::proclaim), guarded writes and [`release`](Leadership::release) fail
/// with [`Error::NotOwner`]. A campaign that fails part way leaves no key behind (a cleanup
/// looks for it and deletes it, retrying until that is confirmed or the session is lost);
/// a later campaign on the same session waits for that cleanup, then creates a new key with
/// its own value and a new token: it never takes over an old one.
///
/// Names that nest share a queue, as in etcd's Go recipes and `etcdctl elect`: an election
/// named `svc` sees the keys of an election named `svc/b` (they live under `svc/`), reports
/// them as leaders, and queues behind them. Use names that are not prefixes of one another.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
/// use baton::{Election, MemoryBackend, Session};
/// let session = Session::new(MemoryBackend::new()).await?;
/// let election = Election::new(&session, "services/scheduler")?;
/// let mut leadership = election.campaign("node-a").await?;
/// leadership.proclaim("node-a (draining)").await?;
/// let leader = election.leader().await?.expect("we lead");
/// assert_eq!(leader.value(), b"node-a (draining)");
/// leadership.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    session: Session,
    /// Shared with the session's in-process queue for this name.
    name: Arc<str>,
    meter: Arc<Meter>,
}

/// The current leader of an election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    entry: Entry,
}

impl Leader {
    /// The leader's key, `<name>/<lease id hex>` (see [`Entry::key`] for keys that are not
    /// UTF-8).
    pub fn key(&self) -> &str {
        self.entry.key()
    }

    /// The leader's proposal (its latest proclaimed value).
    pub fn value(&self) -> &[u8] {
        self.entry.value()
    }

    /// The leader's fencing token (its key's create revision).
    pub fn fencing_token(&self) -> FencingToken {
        self.entry.token()
    }

    /// The former name of [`fencing_token`](Leader::fencing_token).
    #[deprecated(since = "0.4.0", note = "renamed `fencing_token`, as on every guard")]
    pub fn token(&self) -> FencingToken {
        self.fencing_token()
    }

    /// The leader's queue entry, as read.
    pub fn entry(&self) -> &Entry {
        &self.entry
    }
}

impl From<Entry> for Leader {
    fn from(entry: Entry) -> Self {
        Leader { entry }
    }
}

/// What [`Election::observe`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaderEvent {
    /// A new leader (a different key, or a new incarnation of the same key).
    Elected(Leader),
    /// The same leader proclaimed a new value.
    Proclaimed(Leader),
    /// No one leads.
    Vacant,
    /// Leader changes were missed here and cannot be replayed (etcd compacted its history
    /// while this observer was cut off or behind): leaders may have come and gone unseen.
    /// The next event is the current state, reported as [`LeaderEvent::Elected`] or
    /// [`LeaderEvent::Vacant`] even if it is the leader seen before the gap.
    Skipped,
}

impl Election {
    /// An election named `name`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty name or one that ends in `/`: the rule of
    /// every recipe.
    pub fn new(session: &Session, name: impl Into<String>) -> Result<Election> {
        let name = queue::recipe_name(session, name.into())?;
        Ok(Election {
            session: session.clone(),
            meter: Meter::new(Recipe::Election, &name),
            name,
        })
    }

    /// The election name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Campaigns with `value` as proposal and waits until this campaigner leads.
    ///
    /// # Errors
    /// [`Error::SessionLost`] if the session is lost before leadership is granted (never a
    /// false leadership); [`Error::EntryGone`] if our key was deleted from outside while
    /// waiting; backend errors after retries.
    ///
    /// # Cancel safety
    /// Dropping the future at any point withdraws the candidacy and leaves no key.
    pub fn campaign(
        &self,
        value: impl Into<Vec<u8>>,
    ) -> impl Future<Output = Result<Leadership>> + Send + Sync + '_ {
        let span = tracing::debug_span!(
            "baton.campaign",
            name = %self.name,
            key = tracing::field::Empty,
            token = tracing::field::Empty,
        );
        let value = value.into();
        SyncFuture::new(async move {
            queue::check_exclusive_value(&value)?;
            let held = queue::acquire(
                &self.session,
                queue::Ask {
                    meter: &self.meter,
                    queue: &self.name,
                    value,
                    mode: Mode::Wait,
                    turn: Turn::Head,
                },
            )
            .instrument(span)
            .await?;
            Ok(Leadership {
                name: self.name.clone(),
                value: held.entry().value().to_vec(),
                held,
            })
        })
    }

    /// The current leader, or `None` if no one leads.
    ///
    /// # Errors
    /// Backend errors after retries.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub fn leader(&self) -> impl Future<Output = Result<Option<Leader>>> + Send + Sync + '_ {
        SyncFuture::new(async move {
            Ok(self
                .session
                .backend()
                .head(&self.name)
                .await?
                .map(Leader::from))
        })
    }

    /// A stream of leader events: the current state first ([`LeaderEvent::Elected`] or
    /// [`LeaderEvent::Vacant`]), then every change, in order, however slowly it is read:
    /// every leader, every proclamation and every vacancy the backend applied, each once.
    /// The stream resumes by itself after reconnects. Where the backend cannot replay what the
    /// observer missed (etcd, when its history was compacted while the observer was cut off
    /// or far behind) the stream says so with [`LeaderEvent::Skipped`] and goes on from the
    /// current state. Backend errors are reported as items, and the stream goes on.
    ///
    /// Creating the stream sends nothing and needs no runtime; it works while it is polled.
    /// Several changes applied in one step (a transaction, a lease revoke that removes many
    /// keys) are one change: the heads "between" them never existed.
    pub fn observe(&self) -> BoxStream<'static, Result<LeaderEvent>> {
        let mut last: Option<Leader> = None;
        self.session
            .backend()
            .observe_head(&self.name)
            .map(move |event| {
                Ok(match event? {
                    HeadEvent::Head(None) => {
                        last = None;
                        LeaderEvent::Vacant
                    }
                    HeadEvent::Head(Some(entry)) => {
                        let leader = Leader::from(entry);
                        let same = last
                            .as_ref()
                            .is_some_and(|l| l.entry.is_same_incarnation(&leader.entry));
                        last = Some(leader.clone());
                        if same {
                            LeaderEvent::Proclaimed(leader)
                        } else {
                            LeaderEvent::Elected(leader)
                        }
                    }
                    // `HeadEvent` may grow; anything else is a gap too.
                    _ => {
                        last = None;
                        LeaderEvent::Skipped
                    }
                })
            })
            .boxed()
    }

    /// Campaigns with `value`, then runs `work` while leading, and resigns when it
    /// finishes.
    ///
    /// `work` receives the leadership's fencing token: pass it to the resources it writes
    /// to. If leadership is lost while `work` runs (session lost, or our key deleted from
    /// outside), the `work` future is **dropped at its current await point** and this
    /// returns [`Error::LeadershipLost`]. Writes that `work` had already sent may or may not
    /// have been applied; writes fenced with the token are refused once a newer leader has
    /// written.
    ///
    /// `Ok` means more than "the work finished": a read after the work found our key still
    /// there, the same incarnation, so no one else led at any point while the work ran. That
    /// read is retried (with backoff) until it is answered; a backend error or outage while
    /// the work runs, or while resigning, is not taken for a loss. The resignation itself
    /// goes on in the background if it fails.
    ///
    /// # Errors
    /// As for [`campaign`](Election::campaign). [`Error::LeadershipLost`] if leadership was
    /// lost while the work ran (the work was cancelled), or if the work finished but its
    /// leadership cannot be confirmed to the end: the key was gone when the work finished, or
    /// the session was lost before that could be read. The work's output is dropped then: it
    /// ran, at least in part, while another campaigner may have led.
    ///
    /// # Cancel safety
    /// Dropping the future cancels `work` and resigns in the background (or withdraws the
    /// candidacy if it was still waiting).
    pub async fn run_while_leader<F, Fut, T>(&self, value: impl Into<Vec<u8>>, work: F) -> Result<T>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let leadership = self.campaign(value).await?;
        let lost = leadership.held.lost();
        let lost_leadership = || Error::LeadershipLost {
            name: self.name.to_string(),
        };
        let out = tokio::select! {
            biased;
            out = work(leadership.fencing_token()) => out,
            reason = lost => {
                tracing::warn!(name = %self.name, %reason, "leadership lost; work cancelled");
                return Err(lost_leadership());
            }
        };
        // Still our key (the same incarnation) after the work: we led throughout. Decided by
        // a read rather than by the resignation's answer, which cannot tell "already gone"
        // from "deleted by our own earlier attempt whose answer was lost".
        match leadership.held.still_held().await {
            Ok(true) => {
                if let Err(e) = leadership.release().await {
                    // It goes on in the background; the work's result stands.
                    tracing::debug!(name = %self.name, error = %e, "resigning after the work failed; retrying in the background");
                }
                Ok(out)
            }
            Ok(false) => {
                tracing::warn!(name = %self.name, "the work finished after leadership was lost (key already gone)");
                Err(lost_leadership())
            }
            Err(e) => {
                tracing::warn!(name = %self.name, error = %e, "the work finished but leadership could not be confirmed");
                Err(lost_leadership())
            }
        }
    }
}

/// Proof of leading an [`Election`]. Resign with [`release`](Leadership::release); dropping
/// it resigns in the background.
#[must_use = "leadership is resigned in the background as soon as it is dropped"]
#[derive(Debug)]
pub struct Leadership {
    name: Arc<str>,
    value: Vec<u8>,
    held: Held,
}

crate::guard::entry_guard!(Leadership, "leadership");

impl Leadership {
    /// The fencing token together with the election's name, for a
    /// [`Fence`](crate::Fence) (see [`MutexGuard::ticket`](crate::MutexGuard::ticket)).
    pub fn ticket(&self) -> Ticket {
        Ticket::new(self.fencing_token(), self.held.queue())
    }

    /// The value we last proclaimed.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// Replaces our value (the proposal observers see), only while we still lead.
    ///
    /// # Errors
    /// Not applied: [`Error::NotOwner`] (leadership was lost), [`Error::Backend`].
    /// [`Error::OutcomeUnknown`]: the value may have been written (the answer was lost),
    /// never after leadership was lost.
    ///
    /// # Cancel safety
    /// If dropped, the new value may or may not have been written, never after leadership
    /// was lost.
    pub fn proclaim(
        &mut self,
        value: impl Into<Vec<u8>>,
    ) -> impl Future<Output = Result<()>> + Send + Sync + '_ {
        let value = value.into();
        SyncFuture::new(async move {
            queue::check_exclusive_value(&value)?;
            let entry = self.held.entry();
            if self
                .held
                .session()
                .backend()
                .update_entry(entry, &value)
                .await?
            {
                self.value = value;
                Ok(())
            } else {
                Err(self.held.not_owner())
            }
        })
    }

    /// Gives up leadership: deletes our key if it is still ours. The next campaigner leads.
    ///
    /// # Errors
    /// [`Error::NotOwner`] if the key was already gone: leadership had been lost before this
    /// call, and nothing was deleted. Any other error ([`Error::OutcomeUnknown`]: the delete
    /// may have been applied; [`Error::Backend`]: it was not): the delete goes on in the
    /// background until it is confirmed or the session is lost (a campaign of this session on
    /// the same name waits for it).
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped before the delete answered, the resignation is
    /// finished by a background task, as when the leadership is dropped.
    pub fn release(self) -> impl Future<Output = Result<()>> + Send + Sync + 'static {
        let span = tracing::debug_span!("baton.resign", name = %self.name, key = %self.key());
        // Not an `async fn` or block: those would keep a second copy of the release.
        SyncFuture::new(self.held.release().instrument(span))
    }

    /// The former name of [`release`](Leadership::release) (etcd's Go package says
    /// `Resign`).
    ///
    /// # Errors
    /// As [`release`](Leadership::release).
    ///
    /// # Cancel safety
    /// As [`release`](Leadership::release).
    #[deprecated(since = "0.4.0", note = "every guard releases with `release`")]
    pub fn resign(self) -> impl Future<Output = Result<()>> + Send + Sync + 'static {
        self.release()
    }
}
