//! TLS for the ZooKeeper backend (`zks://`): the options as given, checked and turned into
//! zookeeper-client's [`TlsOptions`] ([`client_tls`]); and the probe of our own that learns
//! what zookeeper-client hides ([`Probe`]). zookeeper-client retries a server that refuses
//! the handshake (or that speaks the other protocol) until the connect timeout, and says only
//! that no session came: the probe asks each server itself, with a TLS handshake (or, for a
//! `zk://` string, whether a server answers one), and names the refusal at once.
//!
//! One TLS stack for the crate: rustls on ring, as for etcd, Redis and PostgreSQL
//! (docs/design.md, 2026-11-25, 2026-11-28).

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zookeeper_client::TlsOptions;

use crate::backend::tls::{
    Handshake, Tickets, Wording, certificates, client_identity, ensure_provider, tls_cause,
};
pub(crate) use crate::backend::tls::{Refused, TlsFiles};
use crate::error::{Error, Result};

/// How the TLS errors of a ZooKeeper server are told.
const WORDING: Wording = Wording {
    wrong_host: "the server's TLS certificate is not issued for the host connected to (connect \
                 to a host name or address the certificate names)",
    not_tls: NOT_TLS,
};

const NOT_TLS: &str = "the server does not answer in TLS (is it serving plain zk:// on this port, not a secureClientPort?)";

const ANSWERS_TLS: &str = "the server answers in TLS: reach it at zks:// (with the CA that \
                           signed its certificate: with_ca_cert)";

/// The longest a probe waits for a server's verdict (a TLS server that accepts the client
/// sends its session tickets at once, one that refuses it its alert; a plain-text server
/// answers a four-letter word at once).
const PROBE_LIMIT: Duration = Duration::from_secs(1);

/// zookeeper-client's TLS options for `tls` on a `zks://` string, after checking what can be
/// checked without a server (a CA is given, the PEMs parse, the key is the certificate's);
/// `None` for a `zk://` string, which takes no TLS options.
pub(crate) fn client_tls(secure: bool, tls: &TlsFiles) -> Result<Option<(TlsOptions, Handshake)>> {
    if !secure {
        if tls.ca.is_some() || tls.identity.is_some() {
            return Err(Error::InvalidArgument(
                "TLS options (a CA, a client certificate) need a zks:// connect string; zk:// \
                 is plain text",
            ));
        }
        return Ok(None);
    }
    let Some(ca) = &tls.ca else {
        return Err(Error::InvalidArgument(
            "zks:// needs the CA certificate that signed the servers' certificates \
             (with_ca_cert)",
        ));
    };
    let roots = certificates(
        ca,
        "the CA certificate (with_ca_cert) holds no PEM certificate",
    )?;
    let identity = match &tls.identity {
        Some((cert, key)) => Some(client_identity(cert, key)?),
        None => None,
    };
    let text = |pem: &[u8], what: &'static str| {
        std::str::from_utf8(pem)
            .map(str::to_owned)
            .map_err(|_| Error::InvalidArgument(what))
    };
    let ca_text = text(ca, "the CA certificate (with_ca_cert) is not PEM text")?;
    let mut options = TlsOptions::new().with_pem_ca(&ca_text).map_err(|_| {
        Error::InvalidArgument("the CA certificate (with_ca_cert) holds no PEM certificate")
    })?;
    if let Some((cert, key)) = &tls.identity {
        let cert = text(
            cert,
            "the client certificate (with_client_cert) is not PEM text",
        )?;
        let key = text(key, "the client key (with_client_cert) is not PEM text")?;
        options = options.with_pem_identity(&cert, &key).map_err(|_| {
            Error::InvalidArgument("the client certificate or key (with_client_cert) is not PEM")
        })?;
    }
    ensure_provider();
    Ok(Some((options, Handshake { roots, identity })))
}

/// Connections of our own to the servers of a connect string, to learn why no session comes.
#[derive(Debug)]
pub(crate) struct Probe<'a> {
    /// For a `zks://` string: what the handshake trusts and presents.
    tls: Option<&'a Handshake>,
}

impl<'a> Probe<'a> {
    /// A probe for a `zks://` string (`Some`) or a `zk://` one.
    pub(crate) fn new(tls: Option<&'a Handshake>) -> Probe<'a> {
        Probe { tls }
    }

    /// Whether every server of `servers` (`host:port`) refuses, and the first refusal: for
    /// `zks://`, a certificate refused by either side, or a server that answers in plain
    /// text; for `zk://`, a server that answers in TLS. `None` if any server may yet give a
    /// session (or does not answer within the probe's limit).
    pub(crate) async fn refused(&self, servers: &[String]) -> Option<Refused> {
        let probes = servers.iter().map(|server| async move {
            tokio::time::timeout(PROBE_LIMIT, self.server(server))
                .await
                .ok()
                .flatten()
        });
        let mut all = futures::future::join_all(probes).await.into_iter();
        let first = all.next().flatten()?;
        all.all(|one| one.is_some()).then_some(first)
    }

    async fn server(&self, server: &str) -> Option<Refused> {
        let (host, port) = server.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        match self.handshake(host, port).await? {
            Verdict::Refused(refused) => Some(refused),
            // A plain-text server closes a TLS greeting without a word.
            Verdict::Broken if self.tls.is_some() => speaks_plain_text(host, port).await,
            Verdict::Broken | Verdict::Accepted => None,
        }
    }

    /// A handshake of our own. For `zks://`: the refusal it ends with, if any; a server that
    /// accepts the client goes on to issue session tickets (TLS 1.3), and its verdict on the
    /// client certificate arrives intact since this handshake sends no data. For `zk://`,
    /// with no roots: whether the server answers in TLS (its certificate is refused).
    async fn handshake(&self, host: &str, port: u16) -> Option<Verdict> {
        let name = ServerName::try_from(host.to_owned()).ok()?;
        let tickets = Arc::new(Tickets::default());
        // zookeeper-client's roots and client certificate; for `zk://`, none.
        let config = Arc::new(
            self.tls
                .unwrap_or(&Handshake::default())
                .config(Arc::clone(&tickets))?,
        );
        let tcp = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        let handshake = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await;
        if self.tls.is_none() {
            let tls = tls_cause(&handshake.err()?)?;
            return Some(match tls {
                rustls::Error::InvalidMessage(_) => Verdict::Broken,
                tls => Verdict::Refused(Refused::new(ANSWERS_TLS, Some(tls))),
            });
        }
        let refused_or_broken = |e: &std::io::Error| match Refused::in_chain(e, WORDING) {
            Some(refused) => Verdict::Refused(refused),
            None => Verdict::Broken,
        };
        let mut stream = match handshake {
            Ok(stream) => stream,
            Err(e) => return Some(refused_or_broken(&e)),
        };
        let mut byte = [0u8; 1];
        tokio::select! {
            read = stream.read(&mut byte) => Some(match read {
                Err(e) => refused_or_broken(&e),
                Ok(_) => Verdict::Accepted,
            }),
            // Accepted: the server went on to issue tickets.
            () = tickets.0.notified() => Some(Verdict::Accepted),
        }
    }
}

/// What a handshake of our own found.
enum Verdict {
    /// The server accepted it (it issued tickets, or sent data).
    Accepted,
    /// A refusal that retrying cannot fix.
    Refused(Refused),
    /// The connection broke without a TLS reason (a plain-text server closing it).
    Broken,
}

/// Whether the server on `host:port` answers the four-letter word `srvr` in plain text (its
/// statistics, or that the word is not in its whitelist: either way text), which a TLS
/// server never does. Then the refusal to report.
async fn speaks_plain_text(host: &str, port: u16) -> Option<Refused> {
    let mut tcp = tokio::net::TcpStream::connect((host, port)).await.ok()?;
    tcp.write_all(b"srvr").await.ok()?;
    let mut reply = [0u8; 64];
    let n = tcp.read(&mut reply).await.ok()?;
    let reply = &reply[..n];
    (n > 0
        && reply
            .iter()
            .all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace()))
    .then(|| Refused::new(NOT_TLS, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TLS options need `zks://`, and `zks://` needs a CA: both refused before any server is
    /// asked.
    #[test]
    fn scheme_and_options_must_agree() {
        let ca = TlsFiles {
            ca: Some(b"not PEM".to_vec()),
            identity: None,
        };
        assert!(matches!(
            client_tls(false, &ca),
            Err(Error::InvalidArgument(m)) if m.contains("zks://")
        ));
        assert!(matches!(
            client_tls(true, &TlsFiles::default()),
            Err(Error::InvalidArgument(m)) if m.contains("CA")
        ));
        assert!(matches!(
            client_tls(true, &ca),
            Err(Error::InvalidArgument(m)) if m.contains("no PEM certificate")
        ));
        assert!(matches!(client_tls(false, &TlsFiles::default()), Ok(None)));
    }
}
