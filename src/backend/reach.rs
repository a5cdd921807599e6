//! Connect failures that are final, found out at once instead of after the connect timeout:
//! every endpoint refuses the connection or names a host that does not exist. The clients
//! baton is built on retry both until their timeout (etcd-client's channel and
//! zookeeper-client alike) and do not say which endpoint failed, nor always why: these checks
//! ask each endpoint themselves, with a plain TCP connection.

use std::fmt;
use std::io;
use std::time::Duration;

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
pub(crate) struct Unreachable(Vec<(String, Why)>);

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
pub(crate) async fn unreachable(endpoints: &[String], within: Duration) -> Option<Unreachable> {
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

/// `host` and `port` of `scheme://host:port/...` or `host:port` (`[v6]:port` too).
pub(super) fn host_port(endpoint: &str) -> Option<(&str, u16)> {
    let rest = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    let rest = rest.split('/').next()?;
    let (host, port) = rest.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some((host, port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_ports_are_read_from_every_scheme() {
        assert_eq!(
            host_port("https://127.0.0.1:2379"),
            Some(("127.0.0.1", 2379))
        );
        assert_eq!(host_port("zk-0:2181/app"), Some(("zk-0", 2181)));
        assert_eq!(host_port("[::1]:2379"), Some(("::1", 2379)));
        assert_eq!(host_port("https://[::1]:2379/"), Some(("::1", 2379)));
        assert_eq!(host_port("http://etcd-0:2379"), Some(("etcd-0", 2379)));
        assert_eq!(host_port("etcd"), None);
    }

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
