//! TLS for the Redis backend (`rediss://`): the options as given ([`TlsFiles`]), checked and
//! turned into the `redis` crate's client ([`client`]); the failures that retrying cannot fix,
//! told apart and described ([`Refused`]); and the probes of our own that learn what the
//! `redis` crate's connection hides ([`Probe`]): a server that speaks plain text on a
//! `rediss://` URL (it may never answer a TLS greeting), a TLS server reached at `redis://`,
//! a server's verdict on the client certificate.
//!
//! One TLS stack for the crate: rustls on ring, as for etcd (docs/design.md, 2026-11-25).

use std::sync::Arc;
use std::time::Duration;

use redis::RedisError;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::backend::tls::{
    Handshake, Tickets, Wording, certificates, client_identity, ensure_provider, tls_cause,
};
pub(crate) use crate::backend::tls::{Refused, TlsFiles};
use crate::error::{Error, Result};

/// How the TLS errors of a Redis server are told.
const WORDING: Wording = Wording {
    wrong_host: "the server's TLS certificate is not issued for the host connected to (connect \
                 to a host name the certificate names)",
    not_tls: NOT_TLS,
};

/// The `redis` crate's client for `url`, with `tls` for a `rediss://` URL, and the probe that
/// can tell what a failed connection hides. Checks what can be checked without the server:
/// the scheme agrees with the options, the PEMs parse, the key is the certificate's.
pub(crate) fn client(url: &str, tls: &TlsFiles) -> Result<(redis::Client, Probe)> {
    let Some(rest) = url.strip_prefix("rediss://") else {
        if tls.is_set() {
            return Err(Error::InvalidArgument(
                "TLS options (a CA, a client certificate) need a rediss:// URL; redis:// is \
                 plain text",
            ));
        }
        let client = redis::Client::open(url).map_err(|e| malformed(url, e))?;
        let probe = Probe::plain(host_port(&client));
        return Ok((client, probe));
    };
    if rest.contains('#') {
        return Err(Error::InvalidArgument(
            "rediss:// URLs take no #fragment: #insecure (no certificate check) is not \
             supported; give the CA that signed the server's certificate (with_ca_cert)",
        ));
    }
    let roots = match &tls.ca {
        Some(pem) => certificates(
            pem,
            "the CA certificate (with_ca_cert) holds no PEM certificate",
        )?,
        // As redis-cli: without a CA, the system's roots (the `redis` crate loads them too).
        None => {
            let system = rustls_native_certs::load_native_certs().certs;
            if system.is_empty() {
                return Err(Error::InvalidArgument(
                    "rediss:// without a CA certificate (with_ca_cert) trusts the system's \
                     roots, and this system has none",
                ));
            }
            system
        }
    };
    let identity = match &tls.identity {
        Some((cert, key)) => Some(client_identity(cert, key)?),
        None => None,
    };
    ensure_provider();
    let client = redis::Client::build_with_tls(url, redis_certificates(tls))
        .map_err(|e| malformed(url, e))?;
    let probe = Probe {
        address: host_port(&client),
        tls: Some(Handshake { roots, identity }),
    };
    Ok((client, probe))
}

/// `tls`'s CA and client identity, as the `redis` crate takes them.
pub(crate) fn redis_certificates(tls: &TlsFiles) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: tls
            .identity
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca.clone(),
    }
}

/// Checks what can be checked of `tls` without a server (the PEMs parse, the key is the
/// certificate's), for a Sentinel URL, whose connections the `redis` crate makes itself; and
/// installs the TLS provider those connections need.
pub(crate) fn check(tls: &TlsFiles) -> Result<()> {
    if let Some(pem) = &tls.ca {
        certificates(
            pem,
            "the CA certificate (with_ca_cert) holds no PEM certificate",
        )?;
    }
    if let Some((cert, key)) = &tls.identity {
        client_identity(cert, key)?;
    }
    ensure_provider();
    Ok(())
}

/// A URL the `redis` crate does not take: [`Error::Connect`], as before TLS.
fn malformed(url: &str, e: RedisError) -> Error {
    Error::Connect {
        endpoints: vec![crate::connect::redacted(url)],
        source: Box::new(e),
    }
}

/// `host` and `port` of the client's TCP address (`None` for a Unix socket).
fn host_port(client: &redis::Client) -> Option<(String, u16)> {
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port)
        | redis::ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
        _ => None,
    }
}

/// The TLS failure among `error` and its causes, if any means a refusal: a certificate
/// refused by either side (a server that does not speak TLS on a `rediss://` URL, or one that
/// speaks only TLS on a `redis://` URL, the probes find).
pub(crate) fn refused(error: &(dyn std::error::Error + 'static)) -> Option<Refused> {
    Refused::in_chain(error, WORDING)
}

const NOT_TLS: &str =
    "the server does not answer in TLS (is it serving plain redis:// on this port?)";

/// How long a `rediss://` connection may go without an answer to its TLS greeting before
/// [`Probe::speaks_plain_text`] asks the server in plain text. A plain-text Redis reads a TLS
/// greeting as an inline command and waits for a newline the greeting may not hold: without
/// the probe, such a connection would end only with the connect timeout.
pub(super) const UNANSWERED: Duration = Duration::from_millis(300);

/// The longest a probe waits for a server's answer (a TLS server that accepts the client sends
/// its session tickets at once, one that refuses it its alert; a plain-text server answers
/// `PING` at once).
pub(crate) const PROBE_LIMIT: Duration = Duration::from_secs(1);

/// Connections of our own to the server, to learn what the `redis` crate's connection hides.
#[derive(Debug)]
pub(crate) struct Probe {
    /// The server's TCP address (none for a Unix socket: nothing to probe).
    address: Option<(String, u16)>,
    /// For a `rediss://` URL: what the handshake trusts and presents.
    tls: Option<Handshake>,
}

impl Probe {
    fn plain(address: Option<(String, u16)>) -> Probe {
        Probe { address, tls: None }
    }

    /// A probe that finds nothing: for connections the `redis` crate makes to addresses we
    /// learn from Sentinels.
    pub(crate) fn none() -> Probe {
        Probe::plain(None)
    }

    /// Whether the URL is `rediss://`.
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// For a `rediss://` URL whose TLS greeting went unanswered: whether the server answers
    /// `PING` in plain text (RESP: `+PONG`, or an error such as `-NOAUTH`), which a TLS server
    /// never does. Then the refusal to report.
    pub(super) async fn speaks_plain_text(&self) -> Option<Refused> {
        let (host, port) = self.address.as_ref()?;
        let exchange = async {
            let mut tcp = tokio::net::TcpStream::connect((host.as_str(), *port))
                .await
                .ok()?;
            tcp.write_all(b"PING\r\n").await.ok()?;
            let mut reply = [0u8; 64];
            let n = tcp.read(&mut reply).await.ok()?;
            let reply = &reply[..n];
            (matches!(reply.first(), Some(b'+' | b'-')) && reply.ends_with(b"\r\n"))
                .then_some(Refused::new(NOT_TLS, None))
        };
        tokio::time::timeout(PROBE_LIMIT, exchange).await.ok()?
    }

    /// After a failed connection: what a handshake of our own tells, within `within`.
    ///
    /// For a `rediss://` URL, whether the server refuses the client certificate (or its
    /// absence), or we its certificate. With TLS 1.3 a server judges the client certificate
    /// after the client has finished its side of the handshake; the client has sent its first
    /// command by then, and the server, closing on unread data, may reset the connection
    /// before the alert is read, which looks like a connection that broke. This handshake
    /// sends no data after it, so the server's verdict arrives intact: an alert, or (accepted)
    /// the session tickets a TLS 1.3 server issues once it has accepted the client.
    ///
    /// For a `redis://` URL, whether the server speaks TLS (it closes a plain-text connection
    /// without a word, and answers a TLS greeting with its certificate).
    pub(crate) async fn after_failure(&self, within: Duration) -> Option<Refused> {
        tokio::time::timeout(within, self.handshake())
            .await
            .ok()
            .flatten()
    }

    async fn handshake(&self) -> Option<Refused> {
        let (host, port) = self.address.as_ref()?;
        let name = ServerName::try_from(host.clone()).ok()?;
        let tickets = Arc::new(Tickets::default());
        // The `redis` crate's roots and client certificate; for `redis://`, none.
        let config = Arc::new(
            self.tls
                .as_ref()
                .unwrap_or(&Handshake::default())
                .config(Arc::clone(&tickets))?,
        );
        let tcp = tokio::net::TcpStream::connect((host.as_str(), *port))
            .await
            .ok()?;
        let handshake = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await;
        if self.tls.is_none() {
            // No roots: a TLS server's certificate is refused, which proves it is one.
            let tls = tls_cause(&handshake.err()?)?;
            return (!matches!(tls, rustls::Error::InvalidMessage(_))).then(|| {
                Refused::new(
                    "the server answers in TLS: reach it at rediss:// (with the CA that \
                     signed its certificate: with_ca_cert)",
                    Some(tls),
                )
            });
        }
        let mut stream = match handshake {
            Ok(stream) => stream,
            Err(e) => return refused(&e),
        };
        let mut byte = [0u8; 1];
        tokio::select! {
            read = stream.read(&mut byte) => read.err().and_then(|e| refused(&e)),
            // Accepted: the server went on to issue tickets.
            () = tickets.0.notified() => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused client certificate is an authentication failure; a refused server
    /// certificate and a server that does not speak TLS are connect failures; each says so in
    /// one line.
    #[test]
    fn refusals_are_told_apart() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
        );
        let redis = RedisError::from(io);
        let cert = refused(&redis).expect("a refused client certificate");
        assert!(cert.is_client_cert());
        assert!(matches!(
            cert.misconfigured(vec!["e".to_owned()]),
            Error::Auth { .. }
        ));
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let untrusted = refused(&RedisError::from(io)).expect("an untrusted certificate");
        assert!(!untrusted.is_client_cert());
        assert!(untrusted.to_string().contains("not signed by a trusted CA"));
        assert!(matches!(
            untrusted.misconfigured(vec!["e".to_owned()]),
            Error::Misconfigured { .. }
        ));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(refused(&RedisError::from(reset)).is_none());
    }
}
