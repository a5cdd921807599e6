//! A backend's mailbox: one list on the server, read by one task over one blocking connection,
//! that wakes the local waiters a wake-up names. However many tasks wait, a process uses this
//! one connection for all its waits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard as StdMutexGuard};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::RedisOptions;
use super::primary::{Moving, Primary};
use super::scripts::SCRIPTS;
use crate::error::{Error, Result};
use crate::retry::Backoff;

/// How long the server keeps a mailbox marked alive without hearing from its reader. Wake-ups
/// for a mailbox not marked alive are dropped (its process is gone), so the reader renews the
/// mark well within this.
const ALIVE: Duration = Duration::from_secs(30);

/// How long one blocking read waits on the server before the reader looks at the epoch (and
/// renews the mark when due).
const BLOCK: Duration = Duration::from_secs(1);

/// How often the reader asks the server for its epoch while anyone waits: a loss of the
/// server's state (restart, failover, flush) also loses the waiters' registrations, so their
/// wake-ups would never come; a new epoch makes every waiter ask again. A wake-up lost with
/// the state is so late by at most this plus [`BLOCK`] plus a request.
pub(super) const EPOCH_CHECK: Duration = Duration::from_secs(1);

/// The topic of a wait for entry `key` with token `token` to go: the wake-up the scripts push
/// when they remove it (`g<token> <key>`, see `remove_entry` in lib.lua).
pub(super) fn gone_topic(token: u64, key: &[u8]) -> Vec<u8> {
    let mut topic = format!("g{token} ").into_bytes();
    topic.extend_from_slice(key);
    topic
}

/// The topic of a wait for plain key `key` to change (`v<key>`).
pub(super) fn value_topic(key: &[u8]) -> Vec<u8> {
    let mut topic = b"v".to_vec();
    topic.extend_from_slice(key);
    topic
}

/// Each topic's waiters: how many, and what wakes them.
type Topics = HashMap<Vec<u8>, (usize, Arc<Topic>)>;

/// The local waiters, by topic.
#[derive(Debug, Default)]
pub(super) struct Waits {
    topics: StdMutex<Topics>,
    /// Wake-ups read from the mailbox.
    delivered: AtomicU64,
}

#[derive(Debug, Default)]
pub(super) struct Topic {
    notify: Notify,
    /// A wake-up for this topic arrived (for a gone topic: the entry is gone for good).
    fired: AtomicBool,
}

impl Waits {
    fn topics(&self) -> StdMutexGuard<'_, Topics> {
        // A panic elsewhere while holding the lock leaves the map consistent (each change is a
        // single insert or remove).
        self.topics.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Joins the waiters of `topic` until the returned handle drops.
    pub(super) fn join(&self, topic: Vec<u8>) -> Joined<'_> {
        let mut topics = self.topics();
        let slot = topics.entry(topic.clone()).or_default();
        slot.0 += 1;
        let shared = Arc::clone(&slot.1);
        Joined {
            waits: self,
            topic,
            shared,
        }
    }

    fn deliver(&self, topic: &[u8]) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
        if let Some((_, t)) = self.topics().get(topic) {
            t.fired.store(true, Ordering::SeqCst);
            t.notify.notify_waiters();
        }
    }

    pub(super) fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    /// Whether anyone waits.
    fn anyone(&self) -> bool {
        !self.topics().is_empty()
    }

    /// Wakes every waiter to ask the server again (wake-ups may have been lost).
    fn wake_all(&self) {
        for (_, t) in self.topics().values() {
            t.notify.notify_waiters();
        }
    }
}

/// One waiter's membership of a topic.
pub(super) struct Joined<'a> {
    waits: &'a Waits,
    topic: Vec<u8>,
    shared: Arc<Topic>,
}

impl Joined<'_> {
    /// Resolves at the next wake-up of this topic (or a wake-all). Enable it before asking
    /// the server, so that a wake-up arriving in between is not missed.
    pub(super) fn woken(&self) -> tokio::sync::futures::Notified<'_> {
        self.shared.notify.notified()
    }

    /// Whether a wake-up for this topic arrived since anyone joined it.
    pub(super) fn fired(&self) -> bool {
        self.shared.fired.load(Ordering::SeqCst)
    }
}

impl Drop for Joined<'_> {
    fn drop(&mut self) {
        let mut topics = self.waits.topics();
        if let Some(slot) = topics.get_mut(&self.topic) {
            slot.0 -= 1;
            if slot.0 == 0 {
                topics.remove(&self.topic);
            }
        }
    }
}

/// The mailbox of one backend (and its clones): its id on the server, and the task reading it.
#[derive(Debug)]
pub(super) struct Mailbox {
    id: String,
    waits: Arc<Waits>,
    reader: JoinHandle<()>,
}

impl Mailbox {
    /// Creates a mailbox on the server and starts its reader.
    pub(super) async fn open(
        primary: Arc<Primary>,
        options: &RedisOptions,
        floor: Arc<AtomicU64>,
    ) -> Result<Mailbox> {
        let mut probe = primary.current().conn;
        let (id, epoch): (String, u64) = tokio::time::timeout(
            options.connect_timeout,
            SCRIPTS
                .mailbox
                .prepare_invoke()
                .arg(options.prefix.as_str())
                .arg("")
                .arg(ALIVE.as_millis().to_string())
                .arg(floor.load(Ordering::Relaxed).to_string())
                .invoke_async(&mut probe),
        )
        .await
        .map_err(|_elapsed| Error::Backend {
            op: "connect",
            source: super::NoAnswer::connecting(
                "the mailbox's first script",
                options.connect_timeout,
            ),
            at: Default::default(),
        })?
        .map_err(|e| super::redis_err("connect", e))?;
        floor.fetch_max(epoch, Ordering::Relaxed);
        let waits = Arc::new(Waits::default());
        let reader = Reader {
            primary,
            prefix: options.prefix.clone(),
            id: id.clone(),
            waits: Arc::clone(&waits),
            connect_timeout: options.connect_timeout,
            request_timeout: options.request_timeout,
            floor,
            epoch,
        };
        Ok(Mailbox {
            id,
            waits,
            reader: tokio::spawn(reader.run()),
        })
    }

    pub(super) fn id(&self) -> &str {
        &self.id
    }

    pub(super) fn waits(&self) -> &Waits {
        &self.waits
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        // The list and its mark expire on the server by themselves.
        self.reader.abort();
    }
}

struct Reader {
    /// Where the mailbox is: the backend's primary, wherever it moves.
    primary: Arc<Primary>,
    prefix: String,
    id: String,
    waits: Arc<Waits>,
    connect_timeout: Duration,
    request_timeout: Duration,
    /// The backend's highest counter value seen (see `Shared::floor`).
    floor: Arc<AtomicU64>,
    /// The epoch of the server's state, as last seen.
    epoch: u64,
}

impl Reader {
    async fn run(mut self) {
        // With the generation of the primary it was made to.
        let mut blocking: Option<(MultiplexedConnection, u64)> = None;
        // When the last mark that the server confirmed was sent (the mark lasts ALIVE from
        // the server's receipt, so from no earlier than this).
        let mut marked: Option<Instant> = None;
        // After a reconnect, a blocking read of the old connection may still be pending on the
        // server and take a wake-up meant for us: every waiter asks again once it has ended.
        let mut wake_after: Option<Instant> = None;
        let mut backoff = Backoff::new();
        let fail = |backoff: &mut Backoff| tokio::time::sleep(backoff.next_delay());
        loop {
            // Renew the mark a few times per ALIVE, and look at the epoch every EPOCH_CHECK
            // while anyone waits; not per wake-up.
            let due = if self.waits.anyone() {
                EPOCH_CHECK
            } else {
                ALIVE / 3
            };
            if marked.is_none_or(|at| at.elapsed() >= due) {
                let sent = Instant::now();
                let generation = self.primary.generation();
                let epoch = match self.mark_alive().await {
                    Ok(epoch) => epoch,
                    Err(e) => {
                        tracing::debug!(error = %e, "redis mailbox: cannot renew; retrying");
                        self.primary.follow(generation).await;
                        fail(&mut backoff).await;
                        continue;
                    }
                };
                if marked.is_some_and(|at| sent.saturating_duration_since(at) >= ALIVE) {
                    // The mark lapsed: wake-ups sent meanwhile were dropped.
                    self.waits.wake_all();
                }
                if epoch != self.epoch {
                    tracing::warn!(
                        epoch,
                        "Redis lost or rolled back baton's state (a restart, a failover or a flush): every lease from before is void, and nothing is granted until the restart grace has passed"
                    );
                    self.epoch = epoch;
                    self.waits.wake_all();
                }
                marked = Some(sent);
            }
            if wake_after.is_some_and(|at| Instant::now() >= at) {
                wake_after = None;
                self.waits.wake_all();
            }
            let generation = self.primary.generation();
            if blocking.as_ref().is_some_and(|(_, g)| *g != generation) {
                // Made to a primary the backend has left (a failover): it would block on a
                // list no wake-up reaches any more.
                blocking = None;
            }
            let (conn, _) = match blocking.as_mut() {
                Some(conn) => conn,
                None => match self.connect().await {
                    Ok(conn) => {
                        // Registrations may have been lost with the old connection's server
                        // (a restart): every waiter asks again, now and once an old blocking
                        // read must have ended.
                        self.waits.wake_all();
                        wake_after = Some(Instant::now() + BLOCK + self.request_timeout);
                        blocking.insert(conn)
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "redis mailbox: cannot connect; retrying");
                        self.primary.follow(generation).await;
                        fail(&mut backoff).await;
                        continue;
                    }
                },
            };
            let mut cmd = redis::cmd("BLPOP");
            cmd.arg(format!("{}mb:{}", self.prefix, self.id))
                .arg(BLOCK.as_secs());
            let pop = cmd.query_async::<Value>(conn);
            match tokio::time::timeout(BLOCK.saturating_add(self.request_timeout), pop).await {
                Ok(Ok(answer)) => {
                    backoff.reset();
                    if let Value::Array(pair) = answer
                        && let Some(Value::BulkString(topic)) = pair.get(1)
                    {
                        self.waits.deliver(topic);
                    }
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "redis mailbox: read failed; reconnecting");
                    // Never reused: a blocking read may still be pending on the server.
                    blocking = None;
                    self.primary.follow(generation).await;
                    fail(&mut backoff).await;
                }
                Err(_) => {
                    blocking = None;
                    self.primary.follow(generation).await;
                    fail(&mut backoff).await;
                }
            }
        }
    }

    /// Marks the mailbox alive; answers the epoch of the server's state.
    async fn mark_alive(&self) -> Result<u64, redis::RedisError> {
        let mut conn = self.primary.current_checked().await.ok_or(Moving)?.conn;
        let marked = tokio::time::timeout(
            self.request_timeout,
            SCRIPTS
                .mailbox
                .prepare_invoke()
                .arg(self.prefix.as_str())
                .arg(self.id.as_str())
                .arg(ALIVE.as_millis().to_string())
                .arg(self.floor.load(Ordering::Relaxed).to_string())
                .invoke_async::<(String, u64)>(&mut conn),
        )
        .await;
        match marked {
            Ok(answer) => {
                let (_, epoch) = answer?;
                self.floor.fetch_max(epoch, Ordering::Relaxed);
                Ok(epoch)
            }
            Err(elapsed) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, elapsed).into()),
        }
    }

    /// A blocking connection to the current primary, with its generation.
    async fn connect(&self) -> Result<(MultiplexedConnection, u64), redis::RedisError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None);
        let primary = self.primary.current_checked().await.ok_or(Moving)?;
        let conn = primary
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok((conn, primary.generation))
    }
}
