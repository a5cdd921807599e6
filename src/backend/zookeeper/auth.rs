//! SASL DIGEST-MD5 for the ZooKeeper backend: the credentials (from the connect string's
//! `user:password@` or [`ZkOptions::with_sasl_digest`](super::ZkOptions::with_sasl_digest)),
//! which never print their password; the ACL of every node baton creates ([`NodeAcl`]); and
//! the words of a refusal.

use std::borrow::Cow;

use zookeeper_client::{Acl, Acls, CreateMode, CreateOptions, Permission, SaslOptions};

use crate::error::{Error, Result};

/// A SASL DIGEST-MD5 user and password. Its `Debug` shows the user only.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    user: String,
    password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// `user` and `password`, refused if either is empty.
    pub(crate) fn new(user: String, password: String) -> Result<Credentials> {
        if user.is_empty() {
            return Err(Error::InvalidArgument(
                "a SASL user name must not be empty (zk://user:password@host:port)",
            ));
        }
        if password.is_empty() {
            return Err(Error::InvalidArgument(
                "a SASL password must not be empty (zk://user:password@host:port)",
            ));
        }
        Ok(Credentials { user, password })
    }

    /// As given to `ZkOptions::with_sasl_digest`, checked at connect ([`checked`](Self::checked)).
    pub(crate) fn unchecked(user: String, password: String) -> Credentials {
        Credentials { user, password }
    }

    /// These credentials, if neither is empty.
    pub(crate) fn checked(&self) -> Result<Credentials> {
        Credentials::new(self.user.clone(), self.password.clone())
    }

    /// zookeeper-client's options for them.
    pub(crate) fn sasl(&self) -> SaslOptions {
        SaslOptions::digest_md5(
            Cow::Owned(self.user.clone()),
            Cow::Owned(self.password.clone()),
        )
        .into()
    }
}

/// Splits `user:password@` off the front of a connect string without its scheme
/// (`user:password@host:port[,host:port...][/chroot]`); user and password are
/// percent-decoded (`%40` for `@`, `%3A` for `:`, `%25` for `%`). Only the part before the
/// chroot is looked at, so a chroot may hold `@`.
pub(crate) fn split_credentials(connect: &str) -> Result<(Option<Credentials>, String)> {
    let hosts_end = connect.find('/').unwrap_or(connect.len());
    let Some(at) = connect[..hosts_end].rfind('@') else {
        return Ok((None, connect.to_owned()));
    };
    let Some((user, password)) = connect[..at].split_once(':') else {
        return Err(Error::InvalidArgument(
            "ZooKeeper credentials are user:password@ (SASL DIGEST-MD5): the password is missing",
        ));
    };
    let credentials = Credentials::new(decode(user)?, decode(password)?)?;
    Ok((Some(credentials), connect[at + 1..].to_owned()))
}

/// Percent-decodes `text` (RFC 3986's `%XX`).
fn decode(text: &str) -> Result<String> {
    const BAD: Error = Error::InvalidArgument(
        "a `%` in the connect string's user or password must start a %XX escape, and the result must be UTF-8",
    );
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).ok_or(BAD)?;
            let hex = std::str::from_utf8(hex).map_err(|_| BAD)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| BAD)?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| BAD)
}

/// Every permission for the identities the creating session authenticated as (ZooKeeper's
/// `auth` scheme: the server writes `sasl:<user>` in its place), and reading for anyone.
static OWNER_ALL_ANYONE_READ: [Acl; 2] = [
    Acl::new_const(Permission::ALL, "auth", ""),
    Acl::new_const(Permission::READ, "world", "anyone"),
];

/// The ACL of every node baton creates (docs/design.md, 2026-11-28): open without SASL (as
/// Curator's and kazoo's defaults, so that they share the locks), and with SASL the
/// authenticated identity's alone but for reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeAcl {
    /// `world:anyone` may do everything.
    Open,
    /// The creator's identity may do everything; `world:anyone` may read.
    Owner,
}

impl NodeAcl {
    fn acls(self) -> Acls<'static> {
        match self {
            NodeAcl::Open => Acls::anyone_all(),
            NodeAcl::Owner => Acls::new(&OWNER_ALL_ANYONE_READ),
        }
    }

    /// For a persistent node.
    pub(crate) fn persistent(self) -> CreateOptions<'static> {
        CreateMode::Persistent.with_acls(self.acls())
    }

    /// For a container node (a queue's parents).
    pub(crate) fn container(self) -> CreateOptions<'static> {
        CreateMode::Container.with_acls(self.acls())
    }

    /// For an ephemeral node (a session's fence).
    pub(crate) fn ephemeral(self) -> CreateOptions<'static> {
        CreateMode::Ephemeral.with_acls(self.acls())
    }

    /// For an ephemeral sequential node (an entry).
    pub(crate) fn ephemeral_sequential(self) -> CreateOptions<'static> {
        CreateMode::EphemeralSequential.with_acls(self.acls())
    }
}

/// What a SASL refusal says: with credentials, that the server refused them; without, that
/// the server requires them.
pub(crate) fn refusal(with_credentials: bool) -> &'static str {
    if with_credentials {
        "the server refused the SASL DIGEST-MD5 credentials (unknown user or wrong password)"
    } else {
        "the server requires SASL authentication: give zk://user:password@host:port (or \
         ZkOptions::with_sasl_digest)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_off_the_connect_string_decoded() {
        let (credentials, rest) =
            split_credentials("app:s%40cr%3At@127.0.0.1:2181/ch@root").unwrap();
        let credentials = credentials.unwrap();
        assert_eq!(credentials.user, "app");
        assert_eq!(credentials.password, "s@cr:t");
        assert_eq!(rest, "127.0.0.1:2181/ch@root");
        let (none, rest) = split_credentials("127.0.0.1:2181,127.0.0.1:2182/a@b").unwrap();
        assert!(none.is_none());
        assert_eq!(rest, "127.0.0.1:2181,127.0.0.1:2182/a@b");
        for bad in [
            "app@h:1",
            ":pw@h:1",
            "app:@h:1",
            "app:%4@h:1",
            "app:%ff@h:1",
        ] {
            assert!(
                matches!(split_credentials(bad), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn debug_never_shows_the_password() {
        let credentials = Credentials::new("app".into(), "hunter2".into()).unwrap();
        let shown = format!("{credentials:?}");
        assert!(shown.contains("app"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
