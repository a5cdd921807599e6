//! [`EtcdFence`]: a [`Fence`] stored in etcd itself.

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse, TxnResponse};

use super::{Fence, Ticket, admit, check_args};
use crate::backend::{EtcdBackend, FencingToken};
use crate::error::{Error, Result};
use crate::token::{decode_token, encode_token};

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
    /// A fence in `backend`'s etcd whose keys live under `prefix`. As every fence in a
    /// store, made from that store's backend (`&backend`, or the backend itself).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty prefix.
    pub fn new(
        backend: impl std::borrow::Borrow<EtcdBackend>,
        prefix: impl Into<String>,
    ) -> Result<Self> {
        let prefix = prefix.into();
        if prefix.is_empty() {
            return Err(Error::InvalidArgument("fence prefix must not be empty"));
        }
        Ok(EtcdFence {
            backend: backend.borrow().clone(),
            prefix,
        })
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
                return after_uncertain(op, highest, seen.data, bound.as_deref(), &ticket, data);
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
