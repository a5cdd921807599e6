//! [`Fence`]: resources that check fencing tokens, so that a holder that lost its lock
//! cannot write after its successor.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};

use async_trait::async_trait;

use crate::backend::FencingToken;
use crate::error::{Error, Result};

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

/// Encodes a token as 20 decimal digits, so that byte order equals numeric order (etcd
/// compares values as bytes; so do `ORDER BY` on text columns and `etcdctl get`).
pub fn encode_token(token: FencingToken) -> String {
    format!("{:020}", token.get())
}

/// Decodes [`encode_token`]'s form. `None` if `bytes` is not exactly 20 decimal digits.
pub fn decode_token(bytes: &[u8]) -> Option<FencingToken> {
    if bytes.len() != 20 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(bytes)
        .ok()?
        .parse()
        .ok()
        .map(FencingToken::new)
}

#[cfg(feature = "etcd")]
pub use self::etcd::EtcdFence;

#[cfg(feature = "etcd")]
mod etcd {
    use async_trait::async_trait;
    use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse, TxnResponse};

    use super::{Fence, Ticket, admit, check_args, decode_token, encode_token};
    use crate::backend::{EtcdBackend, FencingToken};
    use crate::error::{Error, Result};

    /// A [`Fence`] stored in etcd itself: for resource `r` under prefix `p`, the highest
    /// token is the key `p/r/token` ([`encode_token`] form), the data `p/r/data`, and the lock
    /// the resource is bound to `p/r/lock`.
    ///
    /// A claim or write reads those keys, checks them, then writes in one transaction that
    /// compares the token key's and the lock key's mod revisions with the ones read: if
    /// another writer got in between, it reads again. So the check and the write are one
    /// atomic step, and a stored value that is not a token is reported, never overwritten.
    /// When a request timed out and its retry finds the resource changed, the fence tells
    /// whether the state it finds is its own write (then `Ok`), and otherwise answers
    /// [`Error::OutcomeUnknown`], never a refusal it cannot prove.
    #[derive(Debug, Clone)]
    pub struct EtcdFence {
        backend: EtcdBackend,
        prefix: String,
    }

    /// What the fence keys held when read: (value, mod revision) of each.
    #[derive(Debug, Default)]
    struct Stored {
        token: Option<(Vec<u8>, i64)>,
        data: Option<Vec<u8>>,
        lock: Option<(Vec<u8>, i64)>,
    }

    impl Stored {
        /// From the three gets of a transaction's ops (`first` is the first of them).
        fn from(resp: &TxnResponse) -> Stored {
            let ops = resp.op_responses();
            let kv = |i: usize| match ops.get(i) {
                Some(TxnOpResponse::Get(get)) => get
                    .kvs()
                    .first()
                    .map(|kv| (kv.value().to_vec(), kv.mod_revision())),
                _ => None,
            };
            Stored {
                token: kv(0),
                data: kv(1).map(|(v, _)| v),
                lock: kv(2),
            }
        }

        fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
            self.token
                .as_ref()
                .map(|(stored, _)| {
                    decode_token(stored).ok_or_else(|| Error::CorruptFence {
                        resource: resource.to_owned(),
                        stored: String::from_utf8_lossy(stored).into_owned(),
                    })
                })
                .transpose()
        }

        fn lock(&self) -> Option<String> {
            self.lock
                .as_ref()
                .map(|(v, _)| String::from_utf8_lossy(v).into_owned())
        }
    }

    impl EtcdFence {
        /// A fence whose keys live under `prefix`.
        ///
        /// # Errors
        /// [`Error::InvalidArgument`] for an empty prefix.
        pub fn new(backend: EtcdBackend, prefix: impl Into<String>) -> Result<Self> {
            let prefix = prefix.into();
            if prefix.is_empty() {
                return Err(Error::InvalidArgument("fence prefix must not be empty"));
            }
            Ok(EtcdFence { backend, prefix })
        }

        /// The token, data and lock keys of `resource`.
        fn keys(&self, resource: &str) -> [String; 3] {
            ["token", "data", "lock"].map(|k| format!("{}/{resource}/{k}", self.prefix))
        }

        fn gets(keys: &[String; 3]) -> [TxnOp; 3] {
            [
                TxnOp::get(keys[0].as_str(), None),
                TxnOp::get(keys[1].as_str(), None),
                TxnOp::get(keys[2].as_str(), None),
            ]
        }

        /// Claims (and writes `data`, if given) in one transaction; returns the data as of
        /// the claim.
        async fn accept(
            &self,
            op: &'static str,
            resource: &str,
            ticket: Ticket,
            data: Option<&[u8]>,
        ) -> Result<Option<Vec<u8>>> {
            check_args(resource, ticket.token())?;
            let keys = self.keys(resource);
            let read = Txn::new().and_then(Self::gets(&keys));
            let mut seen = Stored::from(&self.backend.read_txn("fence_read", read).await?);
            let mut maybe_applied = false;
            loop {
                let highest = seen.highest(resource)?;
                let bound = seen.lock();
                if maybe_applied {
                    return after_uncertain(
                        op,
                        highest,
                        seen.data,
                        bound.as_deref(),
                        &ticket,
                        data,
                    );
                }
                admit(resource, highest, bound.as_deref(), &ticket)?;
                let unchanged = |kv: &Option<(Vec<u8>, i64)>, key: &str| match kv {
                    None => Compare::create_revision(key, CompareOp::Equal, 0),
                    Some((_, mod_rev)) => Compare::mod_revision(key, CompareOp::Equal, *mod_rev),
                };
                let mut puts = vec![TxnOp::put(
                    keys[0].as_str(),
                    encode_token(ticket.token()),
                    None,
                )];
                if let Some(data) = data {
                    puts.push(TxnOp::put(keys[1].as_str(), data, None));
                }
                if let (None, Some(lock)) = (&bound, ticket.lock()) {
                    puts.push(TxnOp::put(keys[2].as_str(), lock, None));
                }
                let txn = Txn::new()
                    .when([
                        unchanged(&seen.token, &keys[0]),
                        unchanged(&seen.lock, &keys[2]),
                    ])
                    .and_then(puts)
                    .or_else(Self::gets(&keys));
                let (resp, retried_after_unknown) = self.backend.write_txn(op, txn).await?;
                if resp.succeeded() {
                    return Ok(match data {
                        Some(data) => Some(data.to_vec()),
                        // The token key was unchanged, so was the data written with it.
                        None => seen.data,
                    });
                }
                // Another writer got in between (or our own earlier attempt): check against
                // what is there now.
                maybe_applied |= retried_after_unknown;
                seen = Stored::from(&resp);
            }
        }
    }

    /// The answer after an attempt that may have been applied, given what the resource holds
    /// now: if it holds exactly our claim or write, that attempt was applied (or an identical
    /// one was), and the answer is `Ok`; anything else (a higher token, other data) cannot be
    /// told apart from a refusal, and the answer is [`Error::OutcomeUnknown`], never
    /// `StaleToken`.
    pub(super) fn after_uncertain(
        op: &'static str,
        highest: Option<FencingToken>,
        stored: Option<Vec<u8>>,
        bound: Option<&str>,
        ticket: &Ticket,
        data: Option<&[u8]>,
    ) -> Result<Option<Vec<u8>>> {
        let ours = highest == Some(ticket.token())
            && data.is_none_or(|d| stored.as_deref() == Some(d))
            && (ticket.lock().is_none() || bound == ticket.lock());
        if ours {
            Ok(stored)
        } else {
            Err(Error::OutcomeUnknown {
                op,
                source: "an attempt failed after it may have been applied, and the resource has changed since".into(),
at: Default::default(),
})
        }
    }

    #[async_trait]
    impl Fence for EtcdFence {
        async fn claim(&self, resource: &str, ticket: Ticket) -> Result<Option<Vec<u8>>> {
            self.accept("fence_claim", resource, ticket, None).await
        }

        async fn write(&self, resource: &str, ticket: Ticket, data: &[u8]) -> Result<()> {
            self.accept("fence_write", resource, ticket, Some(data))
                .await
                .map(drop)
        }

        async fn read(&self, resource: &str) -> Result<Option<(FencingToken, Vec<u8>)>> {
            if resource.is_empty() {
                return Err(Error::InvalidArgument("resource name must not be empty"));
            }
            let keys = self.keys(resource);
            let txn = Txn::new().and_then(Self::gets(&keys));
            let stored = Stored::from(&self.backend.read_txn("fence_read", txn).await?);
            Ok(stored
                .highest(resource)?
                .map(|token| (token, stored.data.unwrap_or_default())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After an attempt that may have been applied (its answer lost), a retry that finds a
    /// higher token cannot say "refused": that attempt may have landed before the higher one.
    /// It finds its own write: applied. (The reproduction of issue 13: a fence write applied
    /// at revision 22, then StaleToken { token: 100, highest: 200 } from the retry.)
    #[cfg(feature = "etcd")]
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

    #[test]
    fn encoding_orders_like_numbers() {
        let a = encode_token(FencingToken::new(9));
        let b = encode_token(FencingToken::new(10));
        assert!(a < b);
        assert_eq!(decode_token(b.as_bytes()), Some(FencingToken::new(10)));
        assert_eq!(
            decode_token(encode_token(FencingToken::new(u64::MAX)).as_bytes()),
            Some(FencingToken::new(u64::MAX))
        );
        assert_eq!(decode_token(b"10"), None);
        assert_eq!(decode_token(b"0000000000000000000x"), None);
    }
}
