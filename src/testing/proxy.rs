//! A loopback TCP proxy for fault tests: cut a client off from a server, or drop only the
//! server's answers, then heal. baton's own fault tests use it; so can yours.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A TCP proxy on 127.0.0.1 in front of a server on the loopback interface. `black_hole` stops
/// forwarding (the connections stay open, everything sent is dropped, as on a cut network);
/// `drop_answers` forwards requests but drops what the server sends back (a request is
/// applied, its answer lost); `heal` closes the connections of the outage, as TCP eventually
/// would, and forwards new ones again. It stops when dropped.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use baton::testing::Proxy;
/// let proxy = Proxy::start("127.0.0.1:2379").await?;
/// // Give clients `proxy.endpoint()` (`http://127.0.0.1:<port>`) instead of the server's.
/// proxy.black_hole(); // ... the client is cut off ...
/// proxy.heal();
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    /// (what is forwarded, generation): connections of an older generation are closed.
    state: watch::Sender<(Flow, u64)>,
}

/// What the proxy forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Both,
    RequestsOnly,
    Nothing,
}

impl Proxy {
    /// A proxy in front of `upstream` (`127.0.0.1:<port>`, with or without `http://`).
    ///
    /// # Errors
    /// [`std::io::ErrorKind::InvalidInput`] for an address that does not parse or is not on
    /// the loopback interface (a test tool sends nothing elsewhere); the operating system's
    /// error if no port can be bound.
    ///
    /// # Cancel safety
    /// Cancel safe: the proxy runs only once this returns.
    pub async fn start(upstream: &str) -> std::io::Result<Proxy> {
        let invalid =
            |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, why.to_owned());
        let upstream: SocketAddr = upstream
            .trim_start_matches("http://")
            .parse()
            .map_err(|_| invalid("expected ip:port or http://ip:port"))?;
        if !upstream.ip().is_loopback() {
            return Err(invalid("the proxy forwards to the loopback interface only"));
        }
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (state, rx) = watch::channel((Flow::Both, 0u64));
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let rx = rx.clone();
                tokio::spawn(async move {
                    let generation = rx.borrow().1;
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(
                        pipe(cr, sw, rx.clone(), generation, true),
                        pipe(sr, cw, rx, generation, false)
                    );
                });
            }
        });
        Ok(Proxy { addr, state })
    }

    /// The endpoint to give a client that should go through the proxy,
    /// `http://127.0.0.1:<port>` (use [`addr`](Self::addr) for other schemes).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The proxy's address, `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops forwarding, both ways; connections stay open, as on a cut network.
    pub fn black_hole(&self) {
        self.state.send_modify(|s| s.0 = Flow::Nothing);
    }

    /// Forwards requests but drops the server's answers: requests are applied, their answers
    /// lost.
    pub fn drop_answers(&self) {
        self.state.send_modify(|s| s.0 = Flow::RequestsOnly);
    }

    /// Closes the connections of the outage (as TCP eventually would) and forwards new ones.
    pub fn heal(&self) {
        self.state.send_modify(|s| *s = (Flow::Both, s.1 + 1));
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut state: watch::Receiver<(Flow, u64)>,
    generation: u64,
    request: bool,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = state.changed() => {
                if changed.is_err() || state.borrow().1 != generation {
                    return; // healed: this connection belongs to the outage
                }
                continue;
            }
        };
        let (flow, current) = *state.borrow();
        if current != generation {
            return;
        }
        let forwarding = flow == Flow::Both || (flow == Flow::RequestsOnly && request);
        if forwarding && to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn forwards_to_the_loopback_interface_only() {
        for bad in ["10.0.0.1:2379", "http://192.168.1.2:2379", "nonsense"] {
            let err = Proxy::start(bad).await.unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{bad}");
        }
        let proxy = Proxy::start("http://127.0.0.1:9").await.unwrap();
        assert!(proxy.addr().ip().is_loopback());
        assert_eq!(proxy.endpoint(), format!("http://{}", proxy.addr()));
    }
}
