//! The fenced resource the runner serves on 127.0.0.1: per lock, a counter, a log and the
//! highest token accepted. Claims, reads, writes and appends carrying a lower token are
//! refused; every answer is recorded in the history.
//!
//! Protocol, one line per request and per answer:
//! `CLAIM <lock> <token> <client>` / `READ ...` -> `OK <value>` or `STALE <highest>`;
//! `WRITE <lock> <token> <client> <value>` -> `OK <value>` or `STALE <highest>`;
//! `APPEND <lock> <token> <client>` -> `OK <length of the log>` or `STALE <highest>`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex as StdMutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use super::history::{Event, What, now_ns};

/// A deliberate defect, to show that the checker catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Bug {
    /// The resource admits tokens lower than the highest it accepted (no fence).
    AdmitLower,
    /// Clients read before they claim (the fencing rule broken on the client's side).
    ReadBeforeClaim,
    /// Clients connect with no restart grace (every backend: `ConnectOptions`' grace of
    /// zero): after a fault that loses state (a failover, a server restarted without its
    /// data or from an earlier copy, a flush) they may be granted what a holder from before
    /// still believes it holds.
    NoGrace,
}

impl Bug {
    /// Its name in `BATON_NEMESIS_BUG`.
    pub fn name(self) -> &'static str {
        match self {
            Bug::AdmitLower => "admit-lower",
            Bug::ReadBeforeClaim => "read-before-claim",
            Bug::NoGrace => "no-grace",
        }
    }

    /// The bug `name` names.
    pub fn parse(name: &str) -> Option<Bug> {
        [Bug::AdmitLower, Bug::ReadBeforeClaim, Bug::NoGrace]
            .into_iter()
            .find(|b| b.name() == name)
    }
}

#[derive(Debug, Default)]
struct Store {
    highest: u64,
    value: u64,
    /// The log's length (its entries are the `Appended` records of the history).
    logged: u64,
}

/// The history as it is recorded, shared by the runner's tasks.
pub(crate) type Sink = Arc<StdMutex<Vec<Event>>>;

pub(crate) fn record(sink: &Sink, who: &str, what: What) {
    let mut events = sink.lock().unwrap_or_else(|p| p.into_inner());
    events.push(Event {
        at: now_ns(),
        who: who.to_owned(),
        what,
    });
}

/// The resource; it stops serving when dropped.
#[derive(Debug)]
pub(crate) struct Resource {
    addr: SocketAddr,
    task: tokio::task::AbortHandle,
}

impl Drop for Resource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Resource {
    pub(crate) async fn start(sink: Sink, bug: Option<Bug>) -> std::io::Result<Resource> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let stores: Arc<StdMutex<HashMap<String, Store>>> = Arc::default();
        let shared = Arc::clone(&stores);
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (stores, sink) = (Arc::clone(&shared), Arc::clone(&sink));
                tokio::spawn(async move {
                    let (read, mut write) = conn.into_split();
                    let mut lines = BufReader::new(read).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let answer = serve(&stores, &sink, bug, &line);
                        if write.write_all(answer.as_bytes()).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Ok(Resource {
            addr,
            task: task.abort_handle(),
        })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Answers one request, recording it: the lock on the stores is held while the event is
/// stamped, so the history has the resource's order.
fn serve(
    stores: &StdMutex<HashMap<String, Store>>,
    sink: &Sink,
    bug: Option<Bug>,
    line: &str,
) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let (op, lock, token, client) = match words.as_slice() {
        [op, lock, token, client, ..] => match token.parse::<u64>() {
            Ok(token) => (*op, *lock, token, *client),
            Err(_) => return "ERR token\n".to_owned(),
        },
        _ => return "ERR request\n".to_owned(),
    };
    let mut stores = stores.lock().unwrap_or_else(|p| p.into_inner());
    let store = stores.entry(lock.to_owned()).or_default();
    let admitted = token >= store.highest || bug == Some(Bug::AdmitLower);
    if !admitted {
        record(
            sink,
            "resource",
            What::Refused {
                lock: lock.to_owned(),
                token,
                client: client.to_owned(),
                highest: store.highest,
            },
        );
        return format!("STALE {}\n", store.highest);
    }
    store.highest = store.highest.max(token);
    match op {
        "CLAIM" | "READ" => {
            if op == "CLAIM" {
                record(
                    sink,
                    "resource",
                    What::Accepted {
                        lock: lock.to_owned(),
                        token,
                        client: client.to_owned(),
                        write: false,
                        value: store.value,
                    },
                );
            }
            format!("OK {}\n", store.value)
        }
        "WRITE" => {
            let Some(value) = words.get(4).and_then(|v| v.parse::<u64>().ok()) else {
                return "ERR value\n".to_owned();
            };
            store.value = value;
            // The record below is the resource's log: the checker reads the writes in the
            // order the resource applied them.
            record(
                sink,
                "resource",
                What::Accepted {
                    lock: lock.to_owned(),
                    token,
                    client: client.to_owned(),
                    write: true,
                    value,
                },
            );
            format!("OK {value}\n")
        }
        "APPEND" => {
            store.logged += 1;
            record(
                sink,
                "resource",
                What::Appended {
                    lock: lock.to_owned(),
                    token,
                    client: client.to_owned(),
                    index: store.logged,
                },
            );
            format!("OK {}\n", store.logged)
        }
        _ => "ERR op\n".to_owned(),
    }
}
