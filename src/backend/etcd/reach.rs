//! Failures of an etcd `connect` that are final, found out at once instead of after the
//! connect timeout, beside those of every backend (`backend::reach`): an `https://` endpoint
//! that answers in plain text ([`answers_plain_text`]), a user and password for an etcd
//! without authentication ([`AuthNotEnabled`]); and the words for a connect timeout
//! ([`NoAnswer`]).

use std::fmt;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::backend::reach::host_port;

/// An `https://` endpoint whose server answers in plain text.
#[derive(Debug)]
pub(super) struct NotTls;

impl fmt::Display for NotTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "the server does not answer in TLS: it answers in plain text (reach it at http://, \
             without TLS options)",
        )
    }
}

impl std::error::Error for NotTls {}

/// Whether an endpoint answers a plain-text HTTP request within `within`: an etcd without TLS
/// answers any request (its HTTP/1 handler shares the port with gRPC), where a TLS server
/// refuses it or waits for a handshake. A TLS handshake sent to such a server is read as a
/// malformed request and may stay unanswered until the connect timeout: this asks in its
/// own language instead.
pub(super) async fn answers_plain_text(endpoints: &[String], within: Duration) -> Option<NotTls> {
    let one = |endpoint: &String| {
        let endpoint = endpoint.clone();
        async move {
            let (host, port) = host_port(&endpoint)?;
            let ask = async {
                let mut tcp = tokio::net::TcpStream::connect((host, port)).await.ok()?;
                let request =
                    format!("GET /version HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
                tcp.write_all(request.as_bytes()).await.ok()?;
                let mut answer = [0u8; 5];
                tcp.read_exact(&mut answer).await.ok()?;
                (&answer == b"HTTP/").then_some(())
            };
            tokio::time::timeout(within, ask).await.ok().flatten()
        }
    };
    let answers = futures::future::join_all(endpoints.iter().map(one)).await;
    answers.into_iter().flatten().next().map(|()| NotTls)
}

/// A user and password given for an etcd that has authentication turned off.
#[derive(Debug)]
pub(super) struct AuthNotEnabled(pub(super) etcd_client::Error);

impl fmt::Display for AuthNotEnabled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "the server has authentication turned off, and a user and password were given \
             (with_user): leave them out, or enable authentication on the server",
        )
    }
}

impl std::error::Error for AuthNotEnabled {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

impl AuthNotEnabled {
    /// Whether `e` is etcd's answer to an authentication while authentication is off.
    pub(super) fn is(e: &etcd_client::Error) -> bool {
        matches!(e, etcd_client::Error::GRpcStatus(s)
            if s.message().contains("authentication is not enabled"))
    }
}

/// No endpoint answered within the connect timeout.
#[derive(Debug)]
pub(super) struct NoAnswer {
    pub(super) within: Duration,
}

impl fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no endpoint answered within the connect timeout ({:?}; with_connect_timeout)",
            self.within
        )
    }
}

impl std::error::Error for NoAnswer {}
