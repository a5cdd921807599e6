//! A loopback TCP proxy for fault tests: cut a client off from a server, drop only the
//! server's answers, hold requests back and deliver them late, or move clients to another
//! server, then heal. baton's own fault tests use it; so can yours.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex as StdMutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A TCP proxy on 127.0.0.1 in front of a server on the loopback interface. `black_hole` stops
/// forwarding (the connections stay open, everything sent is dropped, as on a cut network);
/// `drop_answers` forwards requests but drops what the server sends back (a request is
/// applied, its answer lost); `heal` closes the connections of the outage, as TCP eventually
/// would, and forwards new ones again. `hold_requests` keeps what clients send from the
/// server; after `heal` the clients' side of those connections is closed (they reconnect and
/// retry; a client that gave up on such a connection by itself closed it already), and
/// [`deliver_held`](Proxy::deliver_held) later sends what was held to the server on the old
/// connections: requests that arrive after their clients gave up on them.
/// `redirect` sends new connections to another server (a failover behind a fixed address).
/// It stops when dropped.
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
    /// Where new connections go.
    upstream: Arc<StdMutex<SocketAddr>>,
    /// What `hold_requests` kept back.
    held: Arc<Held>,
}

/// What the proxy kept back: every byte held so far (for tests to wait on), and the server
/// connections parked by `heal` with what they still have to send.
#[derive(Debug)]
struct Held {
    bytes: watch::Sender<Vec<u8>>,
    parked: StdMutex<Vec<(u64, Vec<u8>, TcpStream)>>,
    /// Connections that kept requests back and are not parked (or dropped) yet.
    holding: watch::Sender<usize>,
}

/// Counts one connection in `Held::holding` while it lives.
struct Holding<'a>(&'a watch::Sender<usize>);

impl<'a> Holding<'a> {
    fn new(count: &'a watch::Sender<usize>) -> Holding<'a> {
        count.send_modify(|n| *n += 1);
        Holding(count)
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// What the proxy forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Both,
    RequestsOnly,
    Nothing,
    /// Requests are kept back (answers still flow).
    HoldRequests,
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
        let upstream = loopback(upstream)?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (state, rx) = watch::channel((Flow::Both, 0u64));
        let upstream = Arc::new(StdMutex::new(upstream));
        let held = Arc::new(Held {
            bytes: watch::channel(Vec::new()).0,
            parked: StdMutex::new(Vec::new()),
            holding: watch::channel(0).0,
        });
        let (to, kept) = (Arc::clone(&upstream), Arc::clone(&held));
        tokio::spawn(async move {
            let mut accepted = 0u64;
            while let Ok((client, _)) = listener.accept().await {
                accepted += 1;
                let sequence = accepted;
                let (rx, held) = (rx.clone(), Arc::clone(&kept));
                let target = *to.lock().unwrap_or_else(|p| p.into_inner());
                tokio::spawn(async move {
                    let generation = rx.borrow().1;
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let mut holding = None;
                    let (requests, answers) = tokio::join!(
                        requests(cr, sw, rx.clone(), generation, &held, &mut holding),
                        answers(sr, cw, rx, generation)
                    );
                    // A connection healed while it held requests keeps its server side, with
                    // what it has to send, for `deliver_held`.
                    if let (Some((kept, sw)), Some(sr)) = (requests, answers)
                        && let Ok(server) = sr.reunite(sw)
                    {
                        held.parked
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((sequence, kept, server));
                    }
                    // Parked (or dropped): `deliver_held` may take stock.
                    drop(holding);
                });
            }
        });
        Ok(Proxy {
            addr,
            state,
            upstream,
            held,
        })
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
    /// Connections that held requests ([`hold_requests`](Self::hold_requests)) are closed on
    /// the clients' side only: their server side waits for
    /// [`deliver_held`](Self::deliver_held).
    pub fn heal(&self) {
        self.state.send_modify(|s| *s = (Flow::Both, s.1 + 1));
    }

    /// Keeps back what clients send from now on, on the connections open now and on new
    /// ones (answers to what was sent before still reach them), until [`heal`](Self::heal).
    pub fn hold_requests(&self) {
        self.state.send_modify(|s| s.0 = Flow::HoldRequests);
    }

    /// Waits until the requests held so far contain `needle` (for a test to know that the
    /// request it wants delivered late was sent).
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub async fn held_contains(&self, needle: &[u8]) {
        let mut held = self.held.bytes.subscribe();
        // The sender lives as long as `self`: this ends only with a match.
        let _ = held
            .wait_for(|bytes| bytes.windows(needle.len().max(1)).any(|w| w == needle))
            .await;
    }

    /// Sends what the connections closed by [`heal`](Self::heal) held to their servers, on
    /// those old connections, and returns once the servers have processed it (a Redis
    /// `PING` sent after it was answered: for Redis servers only). Returns how many
    /// connections delivered something. Call it after `heal`: it first waits until every
    /// connection that held requests has been closed and parked.
    ///
    /// # Errors
    /// The operating system's error if a server connection fails.
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped call may have delivered part of what was held, and the
    /// rest is lost.
    pub async fn deliver_held(&self) -> std::io::Result<usize> {
        let parked = self.parked().await;
        let delivered = parked.len();
        for (_, mut bytes, mut server) in parked {
            bytes.extend_from_slice(b"PING\r\n");
            server.write_all(&bytes).await?;
            let mut answers = Vec::new();
            let mut buf = [0u8; 4096];
            while !answers.ends_with(b"+PONG\r\n") {
                let n = server.read(&mut buf).await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                answers.extend_from_slice(&buf[..n]);
            }
        }
        Ok(delivered)
    }

    /// [`deliver_held`](Self::deliver_held) for any protocol, all at once: writes what each
    /// parked connection held, oldest connection first, back to back, then returns once each
    /// server answered something on its old connection or closed it (the requests after the
    /// first may still be in flight). Returns how many connections delivered something. The
    /// servers meet the held requests together, as a server frozen with them in its socket
    /// buffers does when it resumes.
    ///
    /// # Errors
    /// The operating system's error if writing to a server fails.
    ///
    /// # Cancel safety
    /// Not cancel safe, as [`deliver_held`](Self::deliver_held).
    pub async fn deliver_held_together(&self) -> std::io::Result<usize> {
        let mut parked = self.parked().await;
        parked.sort_by_key(|(sequence, _, _)| *sequence);
        for (_, bytes, server) in &mut parked {
            server.write_all(bytes).await?;
        }
        let mut buf = [0u8; 4096];
        for (_, _, server) in &mut parked {
            // An answer, the end, or a reset: the server has read what was sent.
            let _ = server.read(&mut buf).await;
        }
        Ok(parked.len())
    }

    /// The connections parked by [`heal`](Self::heal) with what they held, once every
    /// connection that held requests is parked (or dropped).
    async fn parked(&self) -> Vec<(u64, Vec<u8>, TcpStream)> {
        // A healed connection is parked by its own task, which may not have run yet.
        let mut holding = self.held.holding.subscribe();
        let _ = holding.wait_for(|n| *n == 0).await;
        std::mem::take(&mut *self.held.parked.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Sends new connections to `upstream` (`ip:port` on the loopback interface) from now
    /// on, as a failover behind a fixed address would; [`heal`](Self::heal) closes the
    /// connections to the old one.
    ///
    /// # Errors
    /// [`std::io::ErrorKind::InvalidInput`] as for [`start`](Self::start).
    pub fn redirect(&self, upstream: &str) -> std::io::Result<()> {
        let upstream = loopback(upstream)?;
        *self.upstream.lock().unwrap_or_else(|p| p.into_inner()) = upstream;
        Ok(())
    }

    /// Closes every connection and sends new ones to a closed port, until
    /// [`redirect`](Self::redirect) and [`heal`](Self::heal) name a server again: the server
    /// is gone, and both ends learn it at once. (After [`black_hole`](Self::black_hole) each
    /// end waits on a connection that answers nothing: a PostgreSQL primary's shutdown, or a
    /// standby's promotion, waits up to a minute for its replication connection.)
    ///
    /// # Errors
    /// The operating system's error if no port can be had.
    pub fn refuse(&self) -> std::io::Result<()> {
        // A port bound and released at once: nothing listens there.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        self.redirect(&closed.to_string())?;
        self.heal();
        Ok(())
    }
}

/// `ip:port` or `http://ip:port`, on the loopback interface.
fn loopback(upstream: &str) -> std::io::Result<SocketAddr> {
    let invalid = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, why.to_owned());
    let upstream: SocketAddr = upstream
        .trim_start_matches("http://")
        .parse()
        .map_err(|_| invalid("expected ip:port or http://ip:port"))?;
    if !upstream.ip().is_loopback() {
        return Err(invalid("the proxy forwards to the loopback interface only"));
    }
    Ok(upstream)
}

/// Client to server: forwards, drops or holds back what the client sends, until the
/// connection's generation ends. A connection healed while it held something gives back what
/// it held and its server side.
async fn requests<'a>(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut state: watch::Receiver<(Flow, u64)>,
    generation: u64,
    held: &'a Held,
    holding: &mut Option<Holding<'a>>,
) -> Option<(Vec<u8>, OwnedWriteHalf)> {
    let mut buf = vec![0u8; 16 * 1024];
    let mut kept = Vec::new();
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                // A client that gave up on a connection that held its requests: what was held
                // waits, with the server side, for the heal (the bytes were sent).
                Ok(0) | Err(_) if !kept.is_empty() => {
                    let _ = state.wait_for(|s| s.1 != generation).await;
                    return Some((kept, to));
                }
                Ok(0) | Err(_) => return None,
                Ok(n) => n,
            },
            changed = state.changed() => {
                if changed.is_err() || state.borrow().1 != generation {
                    // Healed: this connection belongs to the outage.
                    return (!kept.is_empty()).then_some((kept, to));
                }
                continue;
            }
        };
        let (flow, current) = *state.borrow();
        if current != generation {
            return (!kept.is_empty()).then_some((kept, to));
        }
        match flow {
            Flow::Both | Flow::RequestsOnly => {
                if to.write_all(&buf[..n]).await.is_err() {
                    return None;
                }
            }
            Flow::HoldRequests => {
                holding.get_or_insert_with(|| Holding::new(&held.holding));
                kept.extend_from_slice(&buf[..n]);
                held.bytes
                    .send_modify(|all| all.extend_from_slice(&buf[..n]));
            }
            Flow::Nothing => {}
        }
    }
}

/// Server to client: forwards or drops the server's answers until the connection's
/// generation ends; then gives back the server side.
async fn answers(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut state: watch::Receiver<(Flow, u64)>,
    generation: u64,
) -> Option<OwnedReadHalf> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return None,
                Ok(n) => n,
            },
            changed = state.changed() => {
                if changed.is_err() || state.borrow().1 != generation {
                    return Some(from);
                }
                continue;
            }
        };
        let (flow, current) = *state.borrow();
        if current != generation {
            return Some(from);
        }
        let forwarding = matches!(flow, Flow::Both | Flow::HoldRequests);
        if forwarding && to.write_all(&buf[..n]).await.is_err() {
            return None;
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
