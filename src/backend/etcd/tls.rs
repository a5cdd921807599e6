//! TLS for the etcd backend: the options as given ([`TlsConfig`]), checked and turned into
//! etcd-client's; the failures that retrying cannot fix, told apart and described
//! ([`TlsRefused`]); and the handshake of our own that learns a server's verdict on the client
//! certificate when the gRPC connection hides it ([`HandshakeCheck`]).

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Certificate, Identity, TlsOptions};
use rustls::client::{ClientSessionStore, Tls12ClientSessionValue, Tls13ClientSessionValue};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, NamedGroup, RootCertStore};
use tokio::io::AsyncReadExt;
use tokio::sync::Notify;

use crate::error::{Error, Result};

/// The TLS part of [`EtcdOptions`](super::EtcdOptions), as given: checked and turned into
/// etcd-client's options at connect ([`TlsConfig::options`]).
#[derive(Clone, Default)]
pub(super) struct TlsConfig {
    /// PEM: one or more CA certificates.
    pub(super) ca: Option<Vec<u8>>,
    /// PEM: the client's certificate (chain) and its private key.
    pub(super) identity: Option<(Vec<u8>, Vec<u8>)>,
    pub(super) server_name: Option<String>,
}

/// What [`TlsConfig::options`] makes of the options: etcd-client's, and the check that can
/// tell a refused client certificate apart.
pub(super) struct Prepared {
    pub(super) options: TlsOptions,
    pub(super) check: HandshakeCheck,
}

impl TlsConfig {
    fn is_set(&self) -> bool {
        self.ca.is_some() || self.identity.is_some() || self.server_name.is_some()
    }

    /// etcd-client's TLS options for `endpoints`, or `None` for plain-text endpoints, after
    /// checking what can be checked without the server: the schemes agree with the options,
    /// the PEMs parse, the key is the certificate's. `handshake` bounds a TLS handshake.
    pub(super) fn options(
        &self,
        endpoints: &[String],
        handshake: Duration,
    ) -> Result<Option<Prepared>> {
        let https = endpoints.iter().any(|e| e.starts_with("https://"));
        let http = endpoints.iter().any(|e| e.starts_with("http://"));
        if https && http {
            return Err(Error::InvalidArgument(
                "endpoints mix http:// and https://: a cluster is reached one way",
            ));
        }
        if http && self.is_set() {
            return Err(Error::InvalidArgument(
                "TLS options (a CA, a client certificate, a server name) need https:// \
                 endpoints (or bare host:port); http:// is plain text",
            ));
        }
        if !https && !self.is_set() {
            return Ok(None);
        }
        // A handshake that is never answered (a server that reads and says nothing) ends
        // with the connect timeout, like a connection that is never accepted.
        let mut options = TlsOptions::new().timeout(handshake);
        let roots = match &self.ca {
            Some(pem) => {
                let ca = certificates(
                    pem,
                    "the CA certificate (with_ca_cert) holds no PEM certificate",
                )?;
                options = options.ca_certificate(Certificate::from_pem(pem));
                ca
            }
            // As etcdctl: without --cacert, the system's roots.
            None => {
                let system = rustls_native_certs::load_native_certs().certs;
                if system.is_empty() {
                    return Err(Error::InvalidArgument(
                        "https:// without a CA certificate (with_ca_cert) trusts the \
                         system's roots, and this system has none",
                    ));
                }
                options = options.with_native_roots();
                system
            }
        };
        let mut identity = None;
        if let Some((cert, key)) = &self.identity {
            let (chain, key_der) = client_identity(cert, key)?;
            options = options.identity(Identity::from_pem(cert, key));
            identity = Some((chain, key_der));
        }
        if let Some(name) = &self.server_name {
            if ServerName::try_from(name.as_str()).is_err() {
                return Err(Error::InvalidArgument(
                    "the TLS server name is neither a DNS name nor an IP address",
                ));
            }
            options = options.domain_name(name.clone());
        }
        Ok(Some(Prepared {
            options,
            check: HandshakeCheck {
                roots,
                identity,
                server_name: self.server_name.clone(),
                endpoints: endpoints.to_vec(),
                plain: false,
            },
        }))
    }
}

/// The certificates in `pem`: at least one, all parsed; else `InvalidArgument(invalid)`.
fn certificates(pem: &[u8], invalid: &'static str) -> Result<Vec<CertificateDer<'static>>> {
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
fn client_identity(
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

/// A TLS failure that retrying cannot fix: a certificate refused by either side, or a server
/// that does not speak TLS. Says which, in words; its source is the TLS library's error (the
/// transport layers in between add nothing to it and are not kept).
#[derive(Debug)]
pub(super) struct TlsRefused {
    /// What went wrong, for the message.
    what: &'static str,
    /// The server refused our client certificate (rather than we its certificate).
    client_cert: bool,
    tls: rustls::Error,
}

impl std::fmt::Display for TlsRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.what)
    }
}

impl std::error::Error for TlsRefused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.tls)
    }
}

impl TlsRefused {
    /// The TLS failure in `e`'s causes, if any. etcd-client's errors do not chain to their
    /// causes: the walk starts inside the gRPC status or the transport error.
    pub(super) fn of(e: &etcd_client::Error) -> Option<TlsRefused> {
        use etcd_client::Error as E;
        match e {
            E::GRpcStatus(status) => Self::in_chain(status),
            E::TransportError(transport) => Self::in_chain(transport),
            E::IoError(io) => Self::in_chain(io),
            _ => None,
        }
    }

    /// The TLS failure among `error` and its causes, if any.
    fn in_chain(error: &(dyn std::error::Error + 'static)) -> Option<TlsRefused> {
        let tls = tls_cause(error)?;
        let (what, client_cert) = describe(&tls)?;
        Some(TlsRefused {
            what,
            client_cert,
            tls,
        })
    }

    /// As an [`Error`]: [`Error::Auth`] for a refused client certificate, else `other` with
    /// this as its source ([`Error::Connect`] while connecting, [`Error::Backend`] later).
    pub(super) fn into_error(self, other: impl FnOnce(crate::error::BoxError) -> Error) -> Error {
        if self.client_cert {
            Error::Auth {
                source: Box::new(self),
            }
        } else {
            other(Box::new(self))
        }
    }
}

/// The first TLS library error among `error` and its causes, looking inside the I/O errors
/// on the way (the TLS library reports through them, and `io::Error::source` skips the error
/// it wraps).
fn tls_cause(error: &(dyn std::error::Error + 'static)) -> Option<rustls::Error> {
    let mut next = Some(error);
    while let Some(cause) = next {
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
const CLIENT_CERT_ALERTS: [rustls::AlertDescription; 7] = [
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

/// What a TLS error means for the user, and whether it is the server refusing our client
/// certificate. `None` for errors that may pass.
fn describe(tls: &rustls::Error) -> Option<(&'static str, bool)> {
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
        Tls::InvalidCertificate(Cert::NotValidForName | Cert::NotValidForNameContext { .. }) => (
            "the server's TLS certificate is not issued for the host connected to (name the \
             host it is issued for: with_tls_server_name)",
            false,
        ),
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
        Tls::InvalidMessage(_) => (
            "the server does not answer in TLS (is it serving plain http:// on this port?)",
            false,
        ),
        Tls::InconsistentKeys(_) => ("the client key is not the client certificate's key", false),
        _ => return None,
    })
}

/// A TLS handshake of our own with each endpoint, to learn what the gRPC connection hides:
/// whether the server refuses the client certificate (or its absence), or, for plain-text
/// endpoints, whether the server speaks TLS.
///
/// With TLS 1.3 a server judges the client certificate after the client has finished its
/// side of the handshake; the client has sent its first HTTP/2 request by the time the
/// server's alert arrives, and the server, closing on unread data, may reset the connection
/// before the alert is read. The gRPC request then fails with "connection closed", which looks
/// like a member going away. This check sends no data after its handshake, so the server's
/// verdict arrives intact: an alert, or (accepted) the session tickets a TLS 1.3 server issues
/// once it has accepted the client.
///
/// A plain-text request to a TLS port is closed without a word; a TLS handshake there is
/// answered, which tells that the endpoint wants `https://`.
pub(super) struct HandshakeCheck {
    /// The CA certificates given, or the system's.
    roots: Vec<CertificateDer<'static>>,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    server_name: Option<String>,
    endpoints: Vec<String>,
    /// The endpoints are plain text: only ask whether they answer in TLS.
    plain: bool,
}

/// What a [`HandshakeCheck`] found.
pub(super) enum Finding {
    /// The server refused the handshake (or we its certificate).
    Refused(TlsRefused),
    /// A plain-text endpoint answers in TLS.
    ServesTls(ServesTls),
}

impl Finding {
    /// As an [`Error`] ([`TlsRefused::into_error`]; `ServesTls` through `other`).
    pub(super) fn into_error(self, other: impl FnOnce(crate::error::BoxError) -> Error) -> Error {
        match self {
            Finding::Refused(refused) => refused.into_error(other),
            Finding::ServesTls(serves) => other(Box::new(serves)),
        }
    }
}

/// A plain-text (`http://`) endpoint whose server speaks TLS.
#[derive(Debug)]
pub(super) struct ServesTls;

impl std::fmt::Display for ServesTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "the server answers in TLS: reach it at https:// (with the CA that signed its \
             certificate: with_ca_cert)",
        )
    }
}

impl std::error::Error for ServesTls {}

impl HandshakeCheck {
    /// The check for plain-text `endpoints`: do they speak TLS?
    pub(super) fn plain(endpoints: &[String]) -> HandshakeCheck {
        HandshakeCheck {
            roots: Vec::new(),
            identity: None,
            server_name: None,
            endpoints: endpoints.to_vec(),
            plain: true,
        }
    }

    /// What an endpoint's handshake tells, if any does within `within`; `None` if none tells
    /// anything (an endpoint unreachable, a server that accepts and issues no tickets).
    pub(super) async fn run(&self, within: Duration) -> Option<Finding> {
        let checks = self.endpoints.iter().map(|endpoint| async move {
            tokio::time::timeout(within, self.one(endpoint))
                .await
                .ok()
                .flatten()
        });
        futures::future::join_all(checks)
            .await
            .into_iter()
            .flatten()
            .next()
    }

    async fn one(&self, endpoint: &str) -> Option<Finding> {
        let (host, port) = host_port(endpoint)?;
        let name =
            ServerName::try_from(self.server_name.as_deref().unwrap_or(host).to_owned()).ok()?;
        let tickets = Arc::new(Tickets::default());
        let config = Arc::new(self.config(Arc::clone(&tickets))?);
        let tcp = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        let handshake = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await;
        if self.plain {
            // No roots: a TLS server's certificate is refused, which proves it is one.
            let tls = tls_cause(&handshake.err()?)?;
            return (!matches!(tls, rustls::Error::InvalidMessage(_)))
                .then_some(Finding::ServesTls(ServesTls));
        }
        let mut stream = match handshake {
            Ok(stream) => stream,
            Err(e) => return TlsRefused::in_chain(&e).map(Finding::Refused),
        };
        let mut byte = [0u8; 1];
        tokio::select! {
            read = stream.read(&mut byte) => read
                .err()
                .and_then(|e| TlsRefused::in_chain(&e))
                .map(Finding::Refused),
            // Accepted: the server went on to issue tickets.
            () = tickets.0.notified() => None,
        }
    }

    /// A client configuration like etcd-client's (the same roots, client certificate and
    /// ALPN), whose session tickets are reported to `tickets`.
    fn config(&self, tickets: Arc<Tickets>) -> Option<ClientConfig> {
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
        let mut roots = RootCertStore::empty();
        roots.add_parsable_certificates(self.roots.iter().cloned());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .ok()?
            .with_root_certificates(roots);
        let mut config = match &self.identity {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .ok()?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        config.resumption = rustls::client::Resumption::store(tickets);
        Some(config)
    }
}

/// `host` and `port` of `http(s)://host:port` or `host:port` (`[v6]:port` too).
pub(super) fn host_port(endpoint: &str) -> Option<(&str, u16)> {
    let rest = endpoint
        .strip_prefix("https://")
        .or_else(|| endpoint.strip_prefix("http://"))
        .unwrap_or(endpoint);
    let rest = rest.split('/').next()?;
    let (host, port) = rest.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some((host, port.parse().ok()?))
}

/// A session store that keeps nothing and tells when a TLS 1.3 ticket arrives.
#[derive(Debug, Default)]
struct Tickets(Notify);

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_name_their_host_and_port() {
        assert_eq!(
            host_port("https://127.0.0.1:2379"),
            Some(("127.0.0.1", 2379))
        );
        assert_eq!(host_port("etcd-0:2379"), Some(("etcd-0", 2379)));
        assert_eq!(host_port("http://etcd-0:2379"), Some(("etcd-0", 2379)));
        assert_eq!(host_port("https://[::1]:2379/"), Some(("::1", 2379)));
        assert_eq!(host_port("https://etcd"), None);
    }

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
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, text);
        let refused = TlsRefused::in_chain(&io).expect("a refused client certificate");
        assert!(refused.client_cert);
    }
}
