//! [`Election`]: leader election on the same queue as [`Mutex`](crate::Mutex), with the key
//! layout of etcd's Go `concurrency.Election`.

use std::future::Future;
use std::sync::Arc;

use futures::FutureExt;
use futures::stream::{BoxStream, StreamExt};
use tracing::Instrument;

use crate::backend::{Entry, FencingToken, WriteOp};
use crate::error::{Error, LostReason, Result};
use crate::queue::{self, Held, Mode};
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
/// A leader whose session is lost is told through [`Leadership::lost`]; from then on
/// another campaigner may lead, and [`proclaim`](Leadership::proclaim) and guarded writes
/// fail with [`Error::NotOwner`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
/// use baton::{Election, MemoryBackend, Session};
/// let session = Session::new(MemoryBackend::new()).await?;
/// let election = Election::new(&session, "services/scheduler")?;
/// let mut leadership = election.campaign("node-a").await?;
/// leadership.proclaim("node-a (draining)").await?;
/// let leader = election.leader().await?.expect("we lead");
/// assert_eq!(leader.value, b"node-a (draining)");
/// leadership.resign().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    session: Session,
    /// Shared with the session's in-process queue for this name.
    name: Arc<str>,
}

/// The current leader of an election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leader's key, `<name>/<lease id hex>`.
    pub key: String,
    /// The leader's proposal (its latest proclaimed value).
    pub value: Vec<u8>,
    /// The leader's fencing token (its key's create revision).
    pub token: FencingToken,
}

impl From<Entry> for Leader {
    fn from(e: Entry) -> Self {
        Leader {
            key: e.key,
            value: e.value,
            token: e.token,
        }
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
}

impl Election {
    /// An election named `name` (any non-empty string).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty name.
    pub fn new(session: &Session, name: impl Into<String>) -> Result<Election> {
        let name: String = name.into();
        if name.is_empty() {
            return Err(Error::InvalidArgument("election name must not be empty"));
        }
        let name: Arc<str> = name.into();
        Ok(Election {
            session: session.clone(),
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
    pub async fn campaign(&self, value: impl Into<Vec<u8>>) -> Result<Leadership> {
        let span = tracing::debug_span!(
            "baton.campaign",
            name = %self.name,
            key = tracing::field::Empty,
            token = tracing::field::Empty,
        );
        let held = queue::acquire(&self.session, &self.name, value.into(), Mode::Wait)
            .instrument(span)
            .await?;
        Ok(Leadership {
            name: self.name.clone(),
            value: held.entry().value.clone(),
            held,
        })
    }

    /// The current leader, or `None` if no one leads.
    ///
    /// # Errors
    /// Backend errors after retries.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        Ok(self
            .session
            .backend()
            .head(&self.name)
            .await?
            .map(Leader::from))
    }

    /// A stream of leader events: the current state first ([`LeaderEvent::Elected`] or
    /// [`LeaderEvent::Vacant`]), then every change. Each leader the observer learns of is
    /// reported, one after the other, never skipped; the stream resumes by itself after
    /// reconnects and compactions (a compaction may hide leaders that came and went while
    /// the observer was cut off). Backend errors are reported as items, and the stream goes
    /// on.
    pub fn observe(&self) -> BoxStream<'static, Result<LeaderEvent>> {
        let mut last: Option<Leader> = None;
        self.session
            .backend()
            .observe_head(&self.name)
            .map(move |head| {
                Ok(match head? {
                    None => {
                        last = None;
                        LeaderEvent::Vacant
                    }
                    Some(entry) => {
                        let leader = Leader::from(entry);
                        let same = last
                            .as_ref()
                            .is_some_and(|l| l.key == leader.key && l.token == leader.token);
                        last = Some(leader.clone());
                        if same {
                            LeaderEvent::Proclaimed(leader)
                        } else {
                            LeaderEvent::Elected(leader)
                        }
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
    /// # Errors
    /// As for [`campaign`](Election::campaign); [`Error::LeadershipLost`] as above.
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
        let backend = self.session.backend().clone();
        let own_key_gone = backend.wait_gone(leadership.held.entry());
        tokio::select! {
            out = work(leadership.fencing_token()) => {
                leadership.resign().await?;
                Ok(out)
            }
            reason = leadership.lost() => {
                tracing::warn!(name = %self.name, %reason, "leadership lost; work cancelled");
                Err(Error::LeadershipLost { name: self.name.to_string() })
            }
            _ = own_key_gone => {
                tracing::warn!(name = %self.name, "leadership key deleted; work cancelled");
                Err(Error::LeadershipLost { name: self.name.to_string() })
            }
        }
    }
}

/// Proof of leading an [`Election`]. Resign with [`resign`](Leadership::resign); dropping it
/// resigns in the background.
#[must_use = "leadership is resigned in the background as soon as it is dropped"]
#[derive(Debug)]
pub struct Leadership {
    name: Arc<str>,
    value: Vec<u8>,
    held: Held,
}

impl Leadership {
    /// The fencing token: our key's create revision, strictly increasing across leaders.
    pub fn fencing_token(&self) -> FencingToken {
        self.held.entry().token
    }

    /// Our key, `<name>/<lease id hex>`.
    pub fn key(&self) -> &str {
        &self.held.entry().key
    }

    /// The value we last proclaimed.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// Resolves when the session under this leadership is lost.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping it only stops this one observer.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.held.session().lost()
    }

    /// Replaces our value (the proposal observers see), only while we still lead.
    ///
    /// # Errors
    /// [`Error::NotOwner`] if leadership was lost (nothing was written); backend errors.
    ///
    /// # Cancel safety
    /// If dropped, the new value may or may not have been written, never after leadership
    /// was lost.
    pub async fn proclaim(&mut self, value: impl Into<Vec<u8>>) -> Result<()> {
        let value = value.into();
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
    }

    /// Applies `ops` atomically only while we still lead (see
    /// [`MutexGuard::write`](crate::MutexGuard::write)).
    ///
    /// # Errors
    /// [`Error::NotOwner`] if leadership was lost (nothing was written); backend errors.
    ///
    /// # Cancel safety
    /// As for [`MutexGuard::write`](crate::MutexGuard::write).
    pub async fn write(&self, ops: &[WriteOp]) -> Result<()> {
        self.held.write(ops).await
    }

    /// Gives up leadership: deletes our key if it is still ours. The next campaigner leads.
    ///
    /// # Errors
    /// Backend errors; the key is then deleted by a background retry, or vanishes with the
    /// lease.
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped before the delete answered, the resignation is
    /// finished by a background task, as when the leadership is dropped.
    pub fn resign(self) -> impl Future<Output = Result<()>> + Send + 'static {
        let span = tracing::debug_span!("baton.resign", name = %self.name, key = %self.key());
        // A combinator: an `async fn` or block would keep a second copy of the release.
        self.held
            .release()
            .map(|released| released.map(|_| ()))
            .instrument(span)
    }
}
