//! TLS for the etcd backend: the options as given ([`TlsConfig`]), checked and turned into
//! etcd-client's; the failures that retrying cannot fix, told apart and described
//! ([`Refused`]); and the handshake of our own that learns a server's verdict on the client
//! certificate when the gRPC connection hides it ([`HandshakeCheck`]).

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Certificate, Identity, TlsOptions};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::io::AsyncReadExt;

use crate::backend::reach::host_port;
use crate::backend::tls::{
    Handshake, Refused, Tickets, Wording, certificates, client_identity, tls_cause,
};
use crate::error::{Error, Result};

/// How the TLS errors of etcd's endpoints are told.
const WORDING: Wording = Wording {
    wrong_host: "the server's TLS certificate is not issued for the host connected to (name the \
                 host it is issued for: with_tls_server_name)",
    not_tls: "the server does not answer in TLS (is it serving plain http:// on this port?)",
};

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
                handshake: Handshake { roots, identity },
                server_name: self.server_name.clone(),
                endpoints: endpoints.to_vec(),
                plain: false,
            },
        }))
    }
}

/// The TLS failure in `e`'s causes, if any means a refusal. etcd-client's errors do not chain
/// to their causes: the walk starts inside the gRPC status or the transport error.
pub(super) fn refused_of(e: &etcd_client::Error) -> Option<Refused> {
    use etcd_client::Error as E;
    match e {
        E::GRpcStatus(status) => Refused::in_chain(status, WORDING),
        E::TransportError(transport) => Refused::in_chain(transport, WORDING),
        E::IoError(io) => Refused::in_chain(io, WORDING),
        _ => None,
    }
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
    /// The CA certificates given (or the system's), and the client certificate.
    handshake: Handshake,
    server_name: Option<String>,
    endpoints: Vec<String>,
    /// The endpoints are plain text: only ask whether they answer in TLS.
    plain: bool,
}

/// What a [`HandshakeCheck`] found.
pub(super) enum Finding {
    /// The server refused the handshake (or we its certificate).
    Refused(Refused),
    /// A plain-text endpoint answers in TLS.
    ServesTls(ServesTls),
}

impl Finding {
    /// As an [`Error`] ([`Refused::into_error`]; `ServesTls` through `other`).
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
            handshake: Handshake::default(),
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
            Err(e) => return Refused::in_chain(&e, WORDING).map(Finding::Refused),
        };
        let mut byte = [0u8; 1];
        tokio::select! {
            read = stream.read(&mut byte) => read
                .err()
                .and_then(|e| Refused::in_chain(&e, WORDING))
                .map(Finding::Refused),
            // Accepted: the server went on to issue tickets.
            () = tickets.0.notified() => None,
        }
    }

    /// A client configuration like etcd-client's (the same roots, client certificate and
    /// ALPN), whose session tickets are reported to `tickets`.
    fn config(&self, tickets: Arc<Tickets>) -> Option<ClientConfig> {
        let mut config = self.handshake.config(tickets)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Some(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The alert text h2 leaves of a TLS error is read back as a refused client certificate.
    #[test]
    fn alerts_are_read_back_from_their_text() {
        let text =
            rustls::Error::AlertReceived(rustls::AlertDescription::BadCertificate).to_string();
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, text);
        let refused = Refused::in_chain(&io, WORDING).expect("a refused client certificate");
        assert!(refused.is_client_cert());
    }
}
