//! Fencing tokens: the number every grant carries, and its text form.
//!
//! A leaf: nothing here depends on the rest of the crate, so that errors, backends and
//! fences all name tokens without importing one another.

use std::fmt;

/// A fencing token: strictly increasing in the order a queue grants its head.
///
/// For etcd it is the create revision of the holder's key. Pass it to the resource you
/// protect and have the resource reject any token lower than the highest it accepted
/// (see [`Fence`](crate::Fence) and `docs/fencing.md`). With the `serde` feature it
/// serialises as a plain integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value (an etcd create revision).
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The raw value, for storing in a resource that checks it.
    pub const fn get(self) -> u64 {
        self.0
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for FencingToken {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for FencingToken {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        u64::deserialize(deserializer).map(FencingToken)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
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
