//! [`Fence`]: resources that check fencing tokens, so that a holder that lost its lock
//! cannot write after its successor.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::token::FencingToken;

/// A fencing token and the lock it came from: what a [`Fence`] is given.
///
/// Tokens compare only within one lock on one cluster: a newer token of an unrelated lock says
/// nothing about this resource. A ticket from a guard ([`MutexGuard::ticket`],
/// [`Leadership::ticket`]) names its lock, and a fence binds each resource to the lock that
/// first claimed or wrote it, refusing tickets of another lock with [`Error::ForeignLock`]. A
/// bare token (`FencingToken::into()`) names no lock and is not checked for it.
///
/// [`MutexGuard::ticket`]: crate::MutexGuard::ticket
/// [`Leadership::ticket`]: crate::Leadership::ticket
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ticket {
    token: FencingToken,
    lock: Option<Arc<str>>,
}

impl Ticket {
    /// The token `token` of the lock named `lock`.
    pub fn new(token: FencingToken, lock: impl Into<Arc<str>>) -> Ticket {
        Ticket {
            token,
            lock: Some(lock.into()),
        }
    }

    /// The fencing token.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The lock the token came from, if the ticket names one.
    pub fn lock(&self) -> Option<&str> {
        self.lock.as_deref()
    }
}

impl From<FencingToken> for Ticket {
    /// A ticket that names no lock: the fence compares the token only.
    fn from(token: FencingToken) -> Ticket {
        Ticket { token, lock: None }
    }
}

/// A resource guarded by fencing tokens.
///
/// The fence keeps, per resource, the highest token it has accepted, and refuses lower ones
/// with [`Error::StaleToken`]. A token is accepted by a [`claim`](Fence::claim) (which records
/// it and returns the data as it stands) or a [`write`](Fence::write) (which records it with
/// new data), atomically. Equal tokens are admitted: one holder may claim and write several
/// times.
///
/// **Read-modify-write: claim, then read, then write.** A holder that paused past its lease
/// carries an older token than its successor. If the successor reads before the resource knows
/// its token, the paused holder can still write after that read, and the successor then writes
/// on top of a state it never saw. Claiming first closes that window: from the claim on, the
/// old token is refused, so whatever the successor read (the claim returns it) stays true
/// until the successor writes. See `docs/fencing.md` for the interleaving step by step.
///
/// # Outcomes
/// `Ok` is definite. [`Error::StaleToken`], [`Error::ForeignLock`], [`Error::CorruptFence`],
/// [`Error::InvalidArgument`] and [`Error::Backend`] mean nothing was written.
/// [`Error::OutcomeUnknown`] means the request may have been applied (its answer was lost);
/// read to find out. No fence answers a definite refusal for a request it cannot show was not
/// applied.
///
/// # Contract for implementations
/// - `claim` and `write` are atomic: the check, the new highest token (and the data, and the
///   binding to a lock) are one step.
/// - A zero token and an empty resource name are [`Error::InvalidArgument`]; a stored token
///   that does not parse is [`Error::CorruptFence`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
/// use baton::{Error, Fence, FencingToken, MemoryFence};
/// let fence = MemoryFence::new();
/// // The successor claims before it reads: from now on, token 5 is refused.
/// let stock = fence.claim("stock/widget", FencingToken::new(7).into()).await?;
/// assert_eq!(stock, None);
/// let late = fence.write("stock/widget", FencingToken::new(5).into(), b"4").await;
/// assert!(matches!(late, Err(Error::StaleToken { highest, .. }) if highest.get() == 7));
/// fence.write("stock/widget", FencingToken::new(7).into(), b"5").await?;
/// assert_eq!(fence.read("stock/widget").await?.unwrap().1, b"5");
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Fence: Send + Sync + std::fmt::Debug {
    /// Records `ticket`'s token as the highest for `resource` unless a higher one was
    /// accepted, and returns the data as it stands (`None` if never written): from now on
    /// every lower token is refused, so nothing can change that data but this holder's (or a
    /// newer holder's) writes.
    ///
    /// # Errors
    /// [`Error::StaleToken`] if a higher token was accepted; [`Error::ForeignLock`] if the
    /// resource is bound to another lock; [`Error::InvalidArgument`], [`Error::CorruptFence`]
    /// or backend errors. Nothing is recorded on any of these; see the trait's "Outcomes" for
    /// [`Error::OutcomeUnknown`].
    ///
    /// # Cancel safety
    /// If the future is dropped, the claim may or may not have been recorded, never partly.
    async fn claim(&self, resource: &str, ticket: Ticket) -> Result<Option<Vec<u8>>>;

    /// Writes `data` for `resource` if `ticket`'s token is not lower than the highest
    /// accepted, and records the token.
    ///
    /// # Errors
    /// As for [`claim`](Fence::claim).
    ///
    /// # Cancel safety
    /// If the future is dropped, the write may or may not have been applied, but never partly
    /// and never after a higher token was accepted.
    async fn write(&self, resource: &str, ticket: Ticket, data: &[u8]) -> Result<()>;

    /// The highest accepted token and the data last written (empty if the resource was only
    /// claimed), if any.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`], [`Error::CorruptFence`] or backend errors.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    async fn read(&self, resource: &str) -> Result<Option<(FencingToken, Vec<u8>)>>;
}

/// Checks the arguments every fence refuses.
pub(crate) fn check_args(resource: &str, token: FencingToken) -> Result<()> {
    if resource.is_empty() {
        return Err(Error::InvalidArgument("resource name must not be empty"));
    }
    if token.get() == 0 {
        return Err(Error::InvalidArgument(
            "fencing token 0 is never granted; refusing it",
        ));
    }
    Ok(())
}

/// The fence rule, shared by every fence: whether `ticket` is admitted for `resource`, given
/// the highest token accepted so far and the lock the resource is bound to.
pub fn admit(
    resource: &str,
    highest: Option<FencingToken>,
    bound: Option<&str>,
    ticket: &Ticket,
) -> Result<()> {
    if let (Some(bound), Some(lock)) = (bound, ticket.lock())
        && bound != lock
    {
        return Err(Error::ForeignLock {
            resource: resource.to_owned(),
            bound: bound.to_owned(),
            lock: lock.to_owned(),
        });
    }
    match highest {
        Some(highest) if ticket.token() < highest => Err(Error::StaleToken {
            resource: resource.to_owned(),
            token: ticket.token(),
            highest,
        }),
        _ => Ok(()),
    }
}

/// One resource of a [`MemoryFence`].
#[derive(Debug)]
struct Register {
    highest: FencingToken,
    data: Option<Vec<u8>>,
    lock: Option<Arc<str>>,
}

/// An in-process [`Fence`]: one register per resource. For tests, demos and resources that
/// live in one process.
#[derive(Debug, Default)]
pub struct MemoryFence {
    registers: StdMutex<HashMap<String, Register>>,
}

impl MemoryFence {
    /// An empty fence.
    pub fn new() -> Self {
        Self::default()
    }

    /// Claims, and writes `data` if given, in one step.
    fn accept(
        &self,
        resource: &str,
        ticket: Ticket,
        data: Option<&[u8]>,
    ) -> Result<Option<Vec<u8>>> {
        check_args(resource, ticket.token())?;
        let mut registers = self.registers.lock().unwrap_or_else(|p| p.into_inner());
        let current = registers.get(resource);
        admit(
            resource,
            current.map(|r| r.highest),
            current.and_then(|r| r.lock.as_deref()),
            &ticket,
        )?;
        let register = registers
            .entry(resource.to_owned())
            .or_insert_with(|| Register {
                highest: ticket.token(),
                data: None,
                lock: None,
            });
        register.highest = ticket.token();
        if register.lock.is_none() {
            register.lock = ticket.lock;
        }
        if let Some(data) = data {
            register.data = Some(data.to_vec());
        }
        Ok(register.data.clone())
    }
}

#[async_trait]
impl Fence for MemoryFence {
    async fn claim(&self, resource: &str, ticket: Ticket) -> Result<Option<Vec<u8>>> {
        self.accept(resource, ticket, None)
    }

    async fn write(&self, resource: &str, ticket: Ticket, data: &[u8]) -> Result<()> {
        self.accept(resource, ticket, Some(data)).map(drop)
    }

    async fn read(&self, resource: &str) -> Result<Option<(FencingToken, Vec<u8>)>> {
        if resource.is_empty() {
            return Err(Error::InvalidArgument("resource name must not be empty"));
        }
        let registers = self.registers.lock().unwrap_or_else(|p| p.into_inner());
        Ok(registers
            .get(resource)
            .map(|r| (r.highest, r.data.clone().unwrap_or_default())))
    }
}

#[cfg(feature = "etcd")]
pub use self::etcd::EtcdFence;

#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
pub use self::postgres::PgFence;

#[cfg(all(test, feature = "etcd"))]
mod tests {
    use super::*;

    /// After an attempt that may have been applied (its answer lost), a retry that finds a
    /// higher token cannot say "refused": that attempt may have landed before the higher one.
    /// It finds its own write: applied. (The reproduction of issue 13: a fence write applied
    /// at revision 22, then StaleToken { token: 100, highest: 200 } from the retry.)
    #[test]
    fn an_uncertain_fence_write_is_never_reported_refused() {
        use super::etcd::after_uncertain;
        let t = |n| FencingToken::new(n);
        let ticket = Ticket::new(t(100), "orders/lock");
        let overtaken = after_uncertain(
            "w",
            Some(t(200)),
            Some(b"newer".to_vec()),
            Some("orders/lock"),
            &ticket,
            Some(b"late"),
        );
        assert!(
            matches!(overtaken, Err(Error::OutcomeUnknown { .. })),
            "{overtaken:?}"
        );
        let other_data = after_uncertain(
            "w",
            Some(t(100)),
            Some(b"other".to_vec()),
            Some("orders/lock"),
            &ticket,
            Some(b"late"),
        );
        assert!(
            matches!(other_data, Err(Error::OutcomeUnknown { .. })),
            "{other_data:?}"
        );
        let ours = after_uncertain(
            "w",
            Some(t(100)),
            Some(b"late".to_vec()),
            Some("orders/lock"),
            &ticket,
            Some(b"late"),
        );
        assert_eq!(ours.unwrap(), Some(b"late".to_vec()));
        let claimed = after_uncertain("c", Some(t(100)), None, Some("orders/lock"), &ticket, None);
        assert_eq!(claimed.unwrap(), None);
    }
}
