//! What the TLS clients of the etcd, Redis, PostgreSQL and ZooKeeper backends share: reading the PEM files given,
//! telling a TLS failure's meaning from its error, and a session store that says when a
//! TLS 1.3 server has accepted the client.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::{Error, Result};

/// The `redis` crate and zookeeper-client build their TLS configurations with rustls's
/// process-wide default provider, and rustls panics when none is installed and its features
/// name more than one (a dependency's rustls brings aws-lc-rs beside our ring). Installs ring,
/// the provider this crate is built with, unless the application installed one. Called before
/// each of their TLS clients is built (the backends', and the Redis fixture's own).
#[cfg(any(feature = "redis", feature = "zookeeper"))]
pub(crate) fn ensure_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may have installed one since: then that one stays, as wanted.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The TLS part of a backend's options, as given (checked at connect): the CA certificates
/// and the client's certificate with its key, PEM. Its `Debug` never shows the key. (etcd's
/// options keep their own, with a server name.)
#[cfg(any(feature = "redis", feature = "postgres", feature = "zookeeper"))]
#[derive(Clone, Default)]
pub(crate) struct TlsFiles {
    /// PEM: one or more CA certificates.
    pub(crate) ca: Option<Vec<u8>>,
    /// PEM: the client's certificate (chain) and its private key.
    pub(crate) identity: Option<(Vec<u8>, Vec<u8>)>,
}

#[cfg(any(feature = "redis", feature = "postgres", feature = "zookeeper"))]
impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("ca", &self.ca.is_some())
            .field("client_cert", &self.identity.is_some())
            .finish()
    }
}

#[cfg(feature = "redis")]
impl TlsFiles {
    /// Whether a CA or a client certificate was given.
    pub(crate) fn is_set(&self) -> bool {
        self.ca.is_some() || self.identity.is_some()
    }
}

/// The certificates in `pem`: at least one, all parsed; else `InvalidArgument(invalid)`.
pub(crate) fn certificates(
    pem: &[u8],
    invalid: &'static str,
) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| Error::InvalidArgument(invalid))?;
    if certs.is_empty() {
        return Err(Error::InvalidArgument(invalid));
    }
    Ok(certs)
}

/// The client's certificate chain and key, parsed, after checking that the key is the
/// certificate's.
pub(crate) fn client_identity(
    cert: &[u8],
    key: &[u8],
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let chain = certificates(
        cert,
        "the client certificate (the certificate of with_client_cert) holds no PEM certificate",
    )?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| {
        Error::InvalidArgument(
            "the client key (the key of with_client_cert) holds no PEM private key",
        )
    })?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|_| {
        Error::InvalidArgument(
            "the client key (the key of with_client_cert) is not a key type TLS supports",
        )
    })?;
    // `Unknown`: the key cannot tell its public half; the server will judge.
    let mismatch = rustls::sign::CertifiedKey::new(chain.clone(), signing)
        .keys_match()
        .is_err_and(|e| {
            !matches!(
                e,
                rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)
            )
        });
    if mismatch {
        return Err(Error::InvalidArgument(
            "the client key (the key of with_client_cert) is not the client certificate's key",
        ));
    }
    Ok((chain, key))
}

/// The first TLS library error among `error` and its causes, looking inside the I/O errors
/// on the way (the TLS library reports through them, and `io::Error::source` skips the error
/// it wraps) and inside shared errors (the `redis` crate keeps its causes in an
/// `Arc<dyn Error>`, which is an error of its own type).
pub(crate) fn tls_cause(error: &(dyn std::error::Error + 'static)) -> Option<rustls::Error> {
    type Shared = Arc<dyn std::error::Error + Send + Sync>;
    let mut next = Some(error);
    while let Some(mut cause) = next {
        if let Some(shared) = cause.downcast_ref::<Shared>() {
            cause = &**shared;
        }
        if let Some(tls) = cause.downcast_ref::<rustls::Error>() {
            return Some(tls.clone());
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
        {
            if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
                return Some(tls.clone());
            }
            if io.kind() == std::io::ErrorKind::InvalidData
                && let Some(alert) = alert_in_text(&inner.to_string())
            {
                return Some(alert);
            }
        }
        next = cause.source();
    }
    None
}

/// The alerts a server refuses a client certificate with.
pub(crate) const CLIENT_CERT_ALERTS: [rustls::AlertDescription; 7] = [
    rustls::AlertDescription::BadCertificate,
    rustls::AlertDescription::CertificateRequired,
    rustls::AlertDescription::CertificateExpired,
    rustls::AlertDescription::CertificateRevoked,
    rustls::AlertDescription::CertificateUnknown,
    rustls::AlertDescription::UnsupportedCertificate,
    rustls::AlertDescription::UnknownCA,
];

/// The alert a TLS error reported as text stands for. With TLS 1.3 the server checks a client
/// certificate after the client has finished its handshake, so its alert arrives on the
/// HTTP/2 connection, whose I/O errors keep only their kind and text (h2 does that): the text
/// is the TLS library's own rendering of the error, matched against the same rendering here.
fn alert_in_text(text: &str) -> Option<rustls::Error> {
    CLIENT_CERT_ALERTS
        .iter()
        .map(|alert| rustls::Error::AlertReceived(*alert))
        .find(|tls| tls.to_string() == text)
}

/// A TLS failure that retrying cannot fix: a certificate refused by either side, or TLS on
/// one side only. Says which, in words; its source is the TLS library's error, where there is
/// one (the transport layers in between add nothing to it and are not kept).
#[derive(Debug)]
pub(crate) struct Refused {
    /// What went wrong, for the message.
    what: &'static str,
    /// The server refused our client certificate (rather than we its certificate).
    client_cert: bool,
    tls: Option<rustls::Error>,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.what)
    }
}

impl std::error::Error for Refused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.tls.as_ref().map(|e| e as _)
    }
}

impl Refused {
    /// A refusal that is not the server's verdict on our client certificate: `what`, with
    /// the TLS library's error if there is one (a plain-text server has none).
    #[cfg(any(feature = "redis", feature = "zookeeper"))]
    pub(crate) fn new(what: &'static str, tls: Option<rustls::Error>) -> Refused {
        Refused {
            what,
            client_cert: false,
            tls,
        }
    }

    /// The TLS failure among `error` and its causes, if any means a refusal, told in the
    /// backend's `wording`.
    pub(crate) fn in_chain(
        error: &(dyn std::error::Error + 'static),
        wording: Wording,
    ) -> Option<Refused> {
        let tls = tls_cause(error)?;
        let (what, client_cert) = describe(&tls, wording)?;
        Some(Refused {
            what,
            client_cert,
            tls: Some(tls),
        })
    }

    /// Whether the server refused our client certificate.
    #[cfg(all(test, any(feature = "etcd", feature = "redis")))]
    pub(crate) fn is_client_cert(&self) -> bool {
        self.client_cert
    }

    /// As an [`Error`]: [`Error::Auth`] for a refused client certificate, else `other` with
    /// this as its source.
    pub(crate) fn into_error(self, other: impl FnOnce(crate::error::BoxError) -> Error) -> Error {
        if self.client_cert {
            Error::Auth {
                source: Box::new(self),
            }
        } else {
            other(Box::new(self))
        }
    }

    /// [`into_error`](Self::into_error) with [`Error::Misconfigured`] for `endpoints`: a
    /// certificate we do not trust, TLS on one side only; the configuration must change.
    #[cfg(any(feature = "redis", feature = "postgres", feature = "zookeeper"))]
    pub(crate) fn misconfigured(self, endpoints: Vec<String>) -> Error {
        self.into_error(|source| Error::Misconfigured { endpoints, source })
    }
}

/// The words of [`describe`] that differ between backends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wording {
    /// A server certificate issued for another host: what to do about it.
    pub(crate) wrong_host: &'static str,
    /// A server that does not answer in TLS.
    pub(crate) not_tls: &'static str,
}

/// What a TLS error means for the user, and whether it is the server refusing our client
/// certificate. `None` for errors that may pass.
pub(crate) fn describe(tls: &rustls::Error, wording: Wording) -> Option<(&'static str, bool)> {
    use rustls::{AlertDescription as Alert, CertificateError as Cert, Error as Tls};
    Some(match tls {
        Tls::InvalidCertificate(Cert::UnknownIssuer | Cert::BadSignature) => (
            "the server's TLS certificate is not signed by a trusted CA (give the CA that \
             signed it: with_ca_cert)",
            false,
        ),
        Tls::InvalidCertificate(
            Cert::Expired
            | Cert::ExpiredContext { .. }
            | Cert::NotValidYet
            | Cert::NotValidYetContext { .. },
        ) => (
            "the server's TLS certificate is expired or not yet valid",
            false,
        ),
        Tls::InvalidCertificate(Cert::NotValidForName | Cert::NotValidForNameContext { .. }) => {
            (wording.wrong_host, false)
        }
        Tls::InvalidCertificate(_) | Tls::NoCertificatesPresented => {
            ("the server's TLS certificate was refused", false)
        }
        Tls::AlertReceived(alert) if CLIENT_CERT_ALERTS.contains(alert) => (
            "the server refused the client certificate: none was given (with_client_cert), or \
             it is expired, or not signed by a CA the server trusts",
            true,
        ),
        Tls::AlertReceived(Alert::HandshakeFailure | Alert::ProtocolVersion) => (
            "the TLS handshake failed: the server and baton share no TLS version or cipher",
            false,
        ),
        Tls::InvalidMessage(_) => (wording.not_tls, false),
        Tls::InconsistentKeys(_) => ("the client key is not the client certificate's key", false),
        _ => return None,
    })
}

#[cfg(any(feature = "etcd", feature = "redis", feature = "zookeeper"))]
pub(crate) use tickets::Tickets;

/// The roots and client certificate a backend's TLS client trusts and presents, which a
/// handshake of our own (the etcd, Redis and ZooKeeper probes) repeats. None of either (the
/// default) trusts no server: a TLS server's certificate is refused, which proves it is one.
#[cfg(any(feature = "etcd", feature = "redis", feature = "zookeeper"))]
#[derive(Default)]
pub(crate) struct Handshake {
    pub(crate) roots: Vec<CertificateDer<'static>>,
    pub(crate) identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
}

#[cfg(any(feature = "etcd", feature = "redis", feature = "zookeeper"))]
impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake")
            .field("roots", &self.roots.len())
            .field("client_cert", &self.identity.is_some())
            .finish()
    }
}

#[cfg(any(feature = "etcd", feature = "redis", feature = "zookeeper"))]
impl Handshake {
    /// A client configuration with these roots and this client certificate, on the process's
    /// crypto provider (ring if none is installed), whose session tickets are reported to
    /// `tickets` (a TLS 1.3 server issues them once it has accepted the client).
    pub(crate) fn config(&self, tickets: Arc<Tickets>) -> Option<rustls::ClientConfig> {
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(self.roots.iter().cloned());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .ok()?
            .with_root_certificates(roots);
        let mut config = match &self.identity {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .ok()?,
            None => builder.with_no_client_auth(),
        };
        config.resumption = rustls::client::Resumption::store(tickets);
        Some(config)
    }
}

/// The session store of the etcd, Redis and ZooKeeper probes.
#[cfg(any(feature = "etcd", feature = "redis", feature = "zookeeper"))]
mod tickets {
    use rustls::NamedGroup;
    use rustls::client::{ClientSessionStore, Tls12ClientSessionValue, Tls13ClientSessionValue};
    use rustls::pki_types::ServerName;
    use tokio::sync::Notify;

    /// A session store that keeps nothing and tells when a TLS 1.3 ticket arrives.
    #[derive(Debug, Default)]
    pub(crate) struct Tickets(pub(crate) Notify);

    impl ClientSessionStore for Tickets {
        fn set_kx_hint(&self, _: ServerName<'static>, _: NamedGroup) {}

        fn kx_hint(&self, _: &ServerName<'_>) -> Option<NamedGroup> {
            None
        }

        fn set_tls12_session(&self, _: ServerName<'static>, _: Tls12ClientSessionValue) {}

        fn tls12_session(&self, _: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
            None
        }

        fn remove_tls12_session(&self, _: &ServerName<'static>) {}

        fn insert_tls13_ticket(&self, _: ServerName<'static>, _: Tls13ClientSessionValue) {
            self.0.notify_one();
        }

        fn take_tls13_ticket(&self, _: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The alert text h2 leaves of a TLS error is read back as that alert, and nothing else
    /// is.
    #[test]
    fn alerts_are_read_back_from_their_text() {
        let text =
            rustls::Error::AlertReceived(rustls::AlertDescription::BadCertificate).to_string();
        assert_eq!(
            alert_in_text(&text),
            Some(rustls::Error::AlertReceived(
                rustls::AlertDescription::BadCertificate
            ))
        );
        assert_eq!(alert_in_text("connection reset by peer"), None);
    }
}
