//! [`Fence`]: resources that check fencing tokens, so that a holder that lost its lock
//! cannot write after its successor.

use std::collections::HashMap;
use std::sync::Mutex as StdMutex;

use async_trait::async_trait;

use crate::backend::FencingToken;
use crate::error::{Error, Result};

/// A resource guarded by fencing tokens.
///
/// A write for `resource` is admitted only if its token is **not lower** than the highest
/// token already accepted for that resource; the token is recorded together with the data,
/// atomically. A holder that paused past its lease carries an older token than its
/// successor, so its late write is refused with [`Error::StaleToken`], whatever the timing.
/// Equal tokens are admitted: one holder may write several times.
///
/// # Contract for implementations
/// - `write` is atomic: the check, the data and the new highest token are one step.
/// - A zero token and an empty resource name are [`Error::InvalidArgument`]; a stored
///   token that does not parse is [`Error::CorruptFence`]; in every error case nothing is
///   written.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
/// use baton::{Error, Fence, FencingToken, MemoryFence};
/// let fence = MemoryFence::new();
/// fence.write("accounts/42", FencingToken::new(7), b"balance=100").await?;
/// let late = fence.write("accounts/42", FencingToken::new(5), b"balance=0").await;
/// assert!(matches!(late, Err(Error::StaleToken { highest, .. }) if highest.get() == 7));
/// assert_eq!(fence.read("accounts/42").await?.unwrap().1, b"balance=100");
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Fence: Send + Sync + std::fmt::Debug {
    /// Writes `data` for `resource` if `token` is not lower than the highest accepted.
    ///
    /// # Errors
    /// [`Error::StaleToken`] if a higher token was accepted; [`Error::InvalidArgument`],
    /// [`Error::CorruptFence`] or backend errors. Nothing is written on any error.
    ///
    /// # Cancel safety
    /// If the future is dropped, the write may or may not have been applied, but never
    /// partly and never after a higher token was accepted.
    async fn write(&self, resource: &str, token: FencingToken, data: &[u8]) -> Result<()>;

    /// The highest accepted token and the data written with it, if any.
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

/// An in-process [`Fence`]: one register per resource. For tests, demos and resources that
/// live in one process.
#[derive(Debug, Default)]
pub struct MemoryFence {
    registers: StdMutex<HashMap<String, (FencingToken, Vec<u8>)>>,
}

impl MemoryFence {
    /// An empty fence.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl Fence for MemoryFence {
    async fn write(&self, resource: &str, token: FencingToken, data: &[u8]) -> Result<()> {
        check_args(resource, token)?;
        let mut registers = self.registers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((highest, _)) = registers.get(resource)
            && token < *highest
        {
            return Err(Error::StaleToken {
                resource: resource.to_owned(),
                token,
                highest: *highest,
            });
        }
        registers.insert(resource.to_owned(), (token, data.to_vec()));
        Ok(())
    }

    async fn read(&self, resource: &str) -> Result<Option<(FencingToken, Vec<u8>)>> {
        if resource.is_empty() {
            return Err(Error::InvalidArgument("resource name must not be empty"));
        }
        let registers = self.registers.lock().unwrap_or_else(|p| p.into_inner());
        Ok(registers.get(resource).cloned())
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
    use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

    use super::{Fence, check_args, decode_token, encode_token};
    use crate::backend::{EtcdBackend, FencingToken};
    use crate::error::{Error, Result};

    /// A [`Fence`] stored in etcd itself: for resource `r` under prefix `p`, the highest
    /// token is the key `p/r/token` ([`encode_token`] form) and the data `p/r/data`.
    ///
    /// A write reads the stored token, checks it, then writes data and token in one
    /// transaction that compares the token key's mod revision with the one read: if
    /// another writer got in between, it reads again. So the check and the write are one
    /// atomic step, and a stored value that is not a token is reported, never overwritten.
    #[derive(Debug, Clone)]
    pub struct EtcdFence {
        backend: EtcdBackend,
        prefix: String,
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

        fn keys(&self, resource: &str) -> (String, String) {
            (
                format!("{}/{resource}/token", self.prefix),
                format!("{}/{resource}/data", self.prefix),
            )
        }
    }

    /// The value and mod revision of the token key read by the first op of `resp`.
    fn stored_token(resp: &etcd_client::TxnResponse) -> Option<(Vec<u8>, i64)> {
        match resp.op_responses().first() {
            Some(TxnOpResponse::Get(get)) => get
                .kvs()
                .first()
                .map(|kv| (kv.value().to_vec(), kv.mod_revision())),
            _ => None,
        }
    }

    #[async_trait]
    impl Fence for EtcdFence {
        async fn write(&self, resource: &str, token: FencingToken, data: &[u8]) -> Result<()> {
            check_args(resource, token)?;
            let (token_key, data_key) = self.keys(resource);
            let read = Txn::new().and_then([TxnOp::get(token_key.as_str(), None)]);
            let mut seen = stored_token(&self.backend.txn("fence_read", read).await?);
            loop {
                let unchanged = match &seen {
                    None => Compare::create_revision(token_key.as_str(), CompareOp::Equal, 0),
                    Some((stored, mod_rev)) => {
                        let highest = decode_token(stored).ok_or_else(|| Error::CorruptFence {
                            resource: resource.to_owned(),
                            stored: String::from_utf8_lossy(stored).into_owned(),
                        })?;
                        if token < highest {
                            return Err(Error::StaleToken {
                                resource: resource.to_owned(),
                                token,
                                highest,
                            });
                        }
                        Compare::mod_revision(token_key.as_str(), CompareOp::Equal, *mod_rev)
                    }
                };
                let txn = Txn::new()
                    .when([unchanged])
                    .and_then([
                        TxnOp::put(token_key.as_str(), encode_token(token), None),
                        TxnOp::put(data_key.as_str(), data, None),
                    ])
                    .or_else([TxnOp::get(token_key.as_str(), None)]);
                let resp = self.backend.txn("fence_write", txn).await?;
                if resp.succeeded() {
                    return Ok(());
                }
                // Another writer got in between: check against what it wrote.
                seen = stored_token(&resp);
            }
        }

        async fn read(&self, resource: &str) -> Result<Option<(FencingToken, Vec<u8>)>> {
            if resource.is_empty() {
                return Err(Error::InvalidArgument("resource name must not be empty"));
            }
            let (token_key, data_key) = self.keys(resource);
            let txn = Txn::new().and_then([
                TxnOp::get(token_key.as_str(), None),
                TxnOp::get(data_key.as_str(), None),
            ]);
            let resp = self.backend.txn("fence_read", txn).await?;
            let ops = resp.op_responses();
            let first = |i: usize| match ops.get(i) {
                Some(TxnOpResponse::Get(get)) => get.kvs().first().map(|kv| kv.value().to_vec()),
                _ => None,
            };
            let Some(stored) = first(0) else {
                return Ok(None);
            };
            let token = decode_token(&stored).ok_or_else(|| Error::CorruptFence {
                resource: resource.to_owned(),
                stored: String::from_utf8_lossy(&stored).into_owned(),
            })?;
            Ok(Some((token, first(1).unwrap_or_default())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
