//! A loopback TCP proxy for fault tests: cut a client off from a server, or drop only the
//! server's answers, then heal.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A TCP proxy on 127.0.0.1 in front of `upstream`. `black_hole` stops forwarding (the
/// connections stay open, everything sent is dropped, as on a cut network); `drop_answers`
/// forwards requests but drops what the server sends back (a request is applied, its answer
/// lost); `heal` closes the connections of the outage, as TCP eventually would, and forwards
/// new ones again.
pub struct Proxy {
    addr: SocketAddr,
    /// (what is forwarded, generation): connections of an older generation are closed.
    state: watch::Sender<(Flow, u64)>,
}

/// What the proxy forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Both,
    RequestsOnly,
    Nothing,
}

impl Proxy {
    /// A proxy in front of `endpoint` (`http://127.0.0.1:port`).
    pub async fn start(endpoint: &str) -> Proxy {
        let upstream: SocketAddr = endpoint
            .trim_start_matches("http://")
            .parse()
            .expect("an endpoint of the form http://ip:port");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
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
        Proxy { addr, state }
    }

    /// The endpoint to give a client that should go through the proxy.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn black_hole(&self) {
        self.state.send_modify(|s| s.0 = Flow::Nothing);
    }

    pub fn drop_answers(&self) {
        self.state.send_modify(|s| s.0 = Flow::RequestsOnly);
    }

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
