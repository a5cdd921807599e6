//! Failures of `connect` that are final, found out at once instead of after the connect
//! timeout: every endpoint refuses the connection or names a host that does not exist
//! ([`unreachable`]), an `https://` endpoint answers in plain text ([`answers_plain_text`]),
//! a user and password for an etcd without authentication ([`AuthNotEnabled`]); and the
//! words for a connect timeout ([`NoAnswer`]).
//!
//! etcd-client's channel balances over the endpoints and its errors do not say which
//! endpoint failed, nor always why (a refused connection and an unknown host both come back
//! as "transport error"). These checks ask each endpoint themselves, with a plain TCP
//! connection: cheap, and only run once a request has failed or is slow to answer.

use std::fmt;
use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::tls::host_port;

/// Why one endpoint can certainly not be reached.
#[derive(Debug)]
enum Why {
    /// Every address of the host refused the connection.
    Refused(io::Error),
    /// The host name does not exist (the resolver said so; a resolver that could not answer
    /// is not this).
    NoSuchHost(io::Error),
}

/// Every endpoint, and why it cannot be reached: the source of an
/// [`Error::Connect`](crate::Error::Connect) that ended at once.
#[derive(Debug)]
pub(super) struct Unreachable(Vec<(String, Why)>);

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = |why: &Why| match why {
            Why::Refused(_) => "connection refused",
            Why::NoSuchHost(_) => "no such host",
        };
        match self.0.as_slice() {
            [(_, one)] => f.write_str(why(one)),
            all => {
                for (i, (endpoint, one)) in all.iter().enumerate() {
                    let sep = if i == 0 { "" } else { "; " };
                    write!(f, "{sep}{endpoint}: {}", why(one))?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for Unreachable {
    /// The operating system's error for the first endpoint (`ConnectionRefused`, or the
    /// resolver's).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.first().map(|(_, why)| match why {
            Why::Refused(e) | Why::NoSuchHost(e) => e as &(dyn std::error::Error + 'static),
        })
    }
}

/// Whether `e`, from resolving a host name, says that the name does not exist (glibc's
/// `EAI_NONAME` and `EAI_NODATA`, the BSDs' and macOS's `EAI_NONAME`), as opposed to a
/// resolver that could not answer (`EAI_AGAIN`), which may pass. The standard library keeps
/// only the resolver's text of these errors.
fn no_such_host(e: &io::Error) -> bool {
    let text = e.to_string();
    [
        "Name or service not known",
        "No address associated with hostname",
        "nodename nor servname provided, or not known",
    ]
    .iter()
    .any(|known| text.contains(known))
}

/// Why `endpoint` certainly cannot be reached, if it certainly cannot; `None` when it can be,
/// or when that is not known within `within`.
async fn certainly_unreachable(endpoint: &str, within: Duration) -> Option<Why> {
    let (host, port) = host_port(endpoint)?;
    let look = async {
        let addresses = match tokio::net::lookup_host((host, port)).await {
            Ok(addresses) => addresses.collect::<Vec<_>>(),
            Err(e) if no_such_host(&e) => return Some(Why::NoSuchHost(e)),
            Err(_) => return None,
        };
        let mut refused = None;
        for address in addresses {
            match tokio::net::TcpStream::connect(address).await {
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => refused = Some(e),
                // Accepted (something else is wrong), or not refused outright.
                _ => return None,
            }
        }
        refused.map(Why::Refused)
    };
    tokio::time::timeout(within, look).await.ok().flatten()
}

/// Every endpoint and why it cannot be reached, if none can certainly be; `None` if one may
/// be reachable (or does not tell within `within`).
pub(super) async fn unreachable(endpoints: &[String], within: Duration) -> Option<Unreachable> {
    let checks = endpoints.iter().map(|endpoint| async move {
        certainly_unreachable(endpoint, within)
            .await
            .map(|why| (endpoint.clone(), why))
    });
    let found: Option<Vec<_>> = futures::future::join_all(checks)
        .await
        .into_iter()
        .collect();
    found.map(Unreachable)
}

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
                let request = format!(
                    "GET /version HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_endpoints_are_each_named() {
        let refused = || io::Error::from(io::ErrorKind::ConnectionRefused);
        let one = Unreachable(vec![("a:1".into(), Why::Refused(refused()))]);
        assert_eq!(one.to_string(), "connection refused");
        let two = Unreachable(vec![
            ("a:1".into(), Why::Refused(refused())),
            ("b:2".into(), Why::NoSuchHost(io::Error::other("x"))),
        ]);
        assert_eq!(
            two.to_string(),
            "a:1: connection refused; b:2: no such host"
        );
    }
}
