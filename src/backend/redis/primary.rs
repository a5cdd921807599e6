//! Which Redis the backend talks to: one primary named by its URL, or the primary a set of
//! Sentinels names (`redis+sentinel://`), followed across failovers. Every connection of the
//! backend (requests, the mailbox's blocking reads, observers) takes the current primary from
//! here; a request that fails as a dead or demoted primary fails asks the Sentinels again.
//!
//! Following a failover is only half of it: the promoted replica may have missed writes. That
//! half is the store epoch's (lib.lua compares the server's run_id with the one its state was
//! written under, so the first script on the new primary starts a new epoch, and the restart
//! grace holds grants back until every holder from before has been told).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, RwLock, Weak};
use std::time::Duration;

use tokio::time::Instant;

use futures::StreamExt;
use tokio::task::JoinHandle;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, TlsMode};

use super::tls::TlsFiles;
use crate::error::{Error, Result};

/// The primary the backend talks to now: a client (for connections of its own) and the shared
/// request connection, with the generation that names them.
#[derive(Clone)]
pub(super) struct Current {
    pub(super) client: redis::Client,
    pub(super) conn: ConnectionManager,
    /// Bumped each time the backend moves to another primary: a connection made under an
    /// older generation is dropped.
    pub(super) generation: u64,
    /// `host:port`, for logs.
    pub(super) address: String,
}

/// Where requests go.
pub(super) struct Primary {
    current: RwLock<Current>,
    /// How to find the primary again (`redis+sentinel://` only).
    sentinels: Option<Sentinels>,
    generation: AtomicU64,
    /// The tasks that hear the Sentinels announce a failover (`+switch-master`) and that
    /// notice this process stalling ([`Stalls`]).
    watchers: StdMutex<Vec<JoinHandle<()>>>,
    /// Whether this process ran without a gap since the Sentinels last named the primary
    /// (`redis+sentinel://` only).
    stalls: Arc<Stalls>,
    /// A failover the Sentinels announced and the backend has not followed yet: no request
    /// goes to its old primary meanwhile ([`Announced`]).
    announced: StdMutex<Option<Announced>>,
}

/// A `+switch-master` heard and not yet followed. The old primary goes on answering as a
/// primary until Sentinel reconfigures it (a second or more later), and a lookup may still
/// name it (a Sentinel that has not heard of the failover yet): a session or a grant made
/// there meanwhile is lost when it resyncs. The TLS test saw one made 125 ms after the
/// announcement, while the listener was still connecting to the new primary. So while the
/// backend is on `from`, requests wait ([`Primary::current_checked`] answers `None`) until a
/// lookup names a primary other than `from`, or until [`ANNOUNCED_FOR`] has passed; and a
/// lookup that names `from` never moves the backend (back) there.
#[derive(Debug)]
struct Announced {
    /// The primary the failover moved away from (`host:port` as the Sentinels name it).
    from: String,
    at: Instant,
}

/// Why a request is not sent now: a failover was announced and the Sentinels do not name its
/// new primary yet (see [`Announced`]). Retried like a primary that does not answer.
#[derive(Debug, thiserror::Error)]
#[error("the Sentinels announced a failover and do not name its new primary yet")]
pub(super) struct Moving;

impl From<Moving> for redis::RedisError {
    fn from(moving: Moving) -> redis::RedisError {
        std::io::Error::other(moving).into()
    }
}

/// How long an announced failover holds requests back while the Sentinels still name the old
/// primary: well past the 2 s period of their hello messages, by which every Sentinel has the
/// new configuration. Past it the Sentinels' answer is taken as it is (a failover undone by a
/// newer one).
const ANNOUNCED_FOR: Duration = Duration::from_secs(10);

impl Drop for Primary {
    fn drop(&mut self) {
        for watcher in self
            .watchers
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            watcher.abort();
        }
    }
}

/// How often [`Stalls`] ticks.
const TICK: Duration = Duration::from_millis(50);

/// A gap between ticks longer than this is a stall of this process (SIGSTOP, a GC pause, a
/// frozen VM, a starved runtime): long enough to ignore scheduling noise, shorter than any
/// failover (a manual `SENTINEL FAILOVER` announces its new primary about a second after it
/// is asked for).
const STALL: Duration = Duration::from_millis(250);

/// Notices that this process stopped running for a while. The listener hears a failover only
/// when it runs: a process stalled across one wakes with the announcement unread in its
/// socket, and its first requests, racing the listener, would go to the old primary, which
/// answers as a primary until Sentinel demotes it (seconds later). The nemesis saw a session
/// and a grant made there 1.9 s after the announcement (docs/redis.md). So after a stall the
/// Sentinels are asked before the next request ([`Primary::current_checked`]).
#[derive(Debug)]
struct Stalls {
    start: Instant,
    /// When the ticker last ran, in milliseconds since `start`.
    last_tick: AtomicU64,
    /// A stall seen by the ticker (a gap between two of its ticks) and not yet answered by a
    /// lookup.
    seen: AtomicBool,
}

impl Stalls {
    fn new() -> Stalls {
        Stalls {
            start: Instant::now(),
            last_tick: AtomicU64::new(0),
            seen: AtomicBool::new(false),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// One tick: a gap since the last one longer than [`STALL`] is a stall.
    fn tick(&self) {
        let now = self.now_ms();
        let last = self.last_tick.swap(now, Ordering::SeqCst);
        if now.saturating_sub(last) > stall_ms() {
            self.seen.store(true, Ordering::SeqCst);
        }
    }

    /// Whether this process stalled since the last lookup: the ticker saw a gap, or has not
    /// run for longer than [`STALL`] (the request woke before it).
    fn stalled(&self) -> bool {
        self.seen.load(Ordering::SeqCst)
            || self
                .now_ms()
                .saturating_sub(self.last_tick.load(Ordering::SeqCst))
                > stall_ms()
    }

    /// A lookup answered: what the Sentinels said is as fresh as it gets.
    fn answered(&self) {
        self.last_tick.store(self.now_ms(), Ordering::SeqCst);
        self.seen.store(false, Ordering::SeqCst);
    }

    /// Ticks every [`TICK`] until aborted.
    async fn run(self: Arc<Self>) {
        self.answered();
        let mut ticks = tokio::time::interval(TICK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            self.tick();
        }
    }
}

fn stall_ms() -> u64 {
    u64::try_from(STALL.as_millis()).unwrap_or(u64::MAX)
}

/// The channel on which Sentinels announce a new primary: `<service> <old ip> <old port>
/// <new ip> <new port>`.
const SWITCH_MASTER: &str = "+switch-master";

struct Sentinels {
    /// One lookup at a time: the others wait for its outcome instead of asking too.
    client: tokio::sync::Mutex<SentinelClient>,
    config: ConnectionManagerConfig,
    /// The bound of one lookup (the Sentinels' answer and the named primary's `ROLE`).
    timeout: Duration,
    service: String,
}

impl std::fmt::Debug for Primary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Primary")
            .field("address", &self.current().address)
            .field("sentinel", &self.sentinels.as_ref().map(|s| &s.service))
            .finish_non_exhaustive()
    }
}

impl Primary {
    /// The one primary a `redis://` URL names: never moves.
    pub(super) fn fixed(client: redis::Client, conn: ConnectionManager) -> Primary {
        let address = client.get_connection_info().addr().to_string();
        Primary {
            current: RwLock::new(Current {
                client,
                conn,
                generation: 0,
                address,
            }),
            sentinels: None,
            generation: AtomicU64::new(0),
            watchers: StdMutex::new(Vec::new()),
            stalls: Arc::new(Stalls::new()),
            announced: StdMutex::new(None),
        }
    }

    /// The primary `sentinel` names, asked now (within `timeout`), and followed from then on.
    /// Errors are the `redis` crate's, for the caller to classify.
    pub(super) async fn following(
        mut sentinel: SentinelClient,
        service: String,
        config: ConnectionManagerConfig,
        timeout: Duration,
    ) -> std::result::Result<Primary, Lookup> {
        let (client, address) = lookup(&mut sentinel, timeout).await?;
        let conn = tokio::time::timeout(
            timeout,
            client.get_connection_manager_with_config(config.clone()),
        )
        .await
        .map_err(|_| Lookup::TimedOut)?
        .map_err(Lookup::Failed)?;
        Ok(Primary {
            current: RwLock::new(Current {
                client,
                conn,
                generation: 0,
                address,
            }),
            sentinels: Some(Sentinels {
                client: tokio::sync::Mutex::new(sentinel),
                config,
                timeout,
                service,
            }),
            generation: AtomicU64::new(0),
            watchers: StdMutex::new(Vec::new()),
            stalls: Arc::new(Stalls::new()),
            announced: StdMutex::new(None),
        })
    }

    /// For a primary found through Sentinels: starts listening to them for failovers, so
    /// that the backend moves to a new primary as soon as they announce it, not only when a
    /// request to the old one fails. A primary demoted by a manual `SENTINEL FAILOVER` or
    /// back from a pause goes on answering as a primary until Sentinel reconfigures it
    /// (seconds later): a client that stayed there meanwhile would renew leases the new
    /// primary knows nothing of. Also starts noticing stalls of this process ([`Stalls`]).
    /// Both stop when the primary is dropped.
    pub(super) fn watch(self: &Arc<Self>) {
        if self.sentinels.is_none() {
            return;
        }
        let listener = tokio::spawn(listen(Arc::downgrade(self)));
        let ticker = tokio::spawn(Arc::clone(&self.stalls).run());
        self.watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend([listener, ticker]);
    }

    /// The primary to send a request to: [`current`](Self::current), except that after this
    /// process stalled (see [`Stalls`]) or after the Sentinels announced a failover not yet
    /// followed (see [`Announced`]) the Sentinels are asked first, and the backend moves if
    /// they name another primary. A lookup that fails after a stall leaves the primary as it
    /// was (the request then finds out) and is tried again before the next request. `None`:
    /// a failover was announced and the Sentinels asked do not name its new primary yet, so
    /// the request must not be sent anywhere; the caller waits and asks again.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`follow`](Self::follow).
    pub(super) async fn current_checked(&self) -> Option<Current> {
        if self.sentinels.is_none() {
            return Some(self.current());
        }
        let announced = self.on_the_old_primary();
        if announced || self.stalls.stalled() {
            tracing::debug!(
                announced,
                "asking the Sentinels for the primary before the next request"
            );
            if self.follow(self.generation()).await {
                self.stalls.answered();
            }
            if self.on_the_old_primary() {
                return None;
            }
        }
        Some(self.current())
    }

    /// Whether the backend is still on the primary an announced failover left.
    fn on_the_old_primary(&self) -> bool {
        self.announced_from()
            .is_some_and(|from| from == self.current().address)
    }

    /// The old primary of a failover announced and not yet followed, if any (an announcement
    /// older than [`ANNOUNCED_FOR`] is dropped).
    fn announced_from(&self) -> Option<String> {
        let mut announced = self.announced.lock().unwrap_or_else(|p| p.into_inner());
        if announced
            .as_ref()
            .is_some_and(|a| a.at.elapsed() > ANNOUNCED_FOR)
        {
            tracing::warn!(
                after = ?ANNOUNCED_FOR,
                "the Sentinels still name the primary a failover moved away from: taking their answer"
            );
            *announced = None;
        }
        announced.as_ref().map(|a| a.from.clone())
    }

    /// Records that the Sentinels announced a failover away from `from`.
    fn announce(&self, from: String) {
        *self.announced.lock().unwrap_or_else(|p| p.into_inner()) = Some(Announced {
            from,
            at: Instant::now(),
        });
    }

    /// The announced failover, if any, is followed.
    fn forget_announcement(&self) {
        self.announced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }

    /// The primary as it is now.
    pub(super) fn current(&self) -> Current {
        // A panic elsewhere while holding the lock leaves a whole `Current` behind.
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The generation of the current primary.
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// A request to the primary of `generation` failed as a dead or demoted primary would
    /// make it fail: asks the Sentinels which primary to use now, and moves there if it is
    /// another. Does nothing for a fixed primary, nor if another caller has moved since
    /// `generation` (its lookup is as fresh as ours would be). Never fails: a lookup that
    /// fails leaves the primary as it was, for the retry to find out. Answers whether the
    /// primary is now the one the Sentinels name (`false`: the lookup or the connection to
    /// the new primary failed).
    ///
    /// # Cancel safety
    /// Cancel safe: the primary is replaced whole or not at all.
    pub(super) async fn follow(&self, generation: u64) -> bool {
        let Some(sentinels) = &self.sentinels else {
            return true;
        };
        let mut sentinel = sentinels.client.lock().await;
        if self.generation() != generation {
            return true;
        }
        let (client, address) = match lookup(&mut sentinel, sentinels.timeout).await {
            Ok(found) => found,
            Err(e) => {
                tracing::debug!(service = %sentinels.service, error = %e, "Sentinel lookup failed; the primary stays as it was");
                return false;
            }
        };
        let old = self.current().address;
        if self.announced_from().as_deref() == Some(address.as_str()) {
            // A Sentinel that has not heard of the failover yet: never move (back) there.
            tracing::debug!(%address, "the Sentinel asked still names the primary a failover moved away from");
            return old != address;
        }
        if address == old {
            // Where the Sentinels say (an announcement that came after the move is done with).
            self.forget_announcement();
            return true;
        }
        let conn = tokio::time::timeout(
            sentinels.timeout,
            client.get_connection_manager_with_config(sentinels.config.clone()),
        )
        .await;
        let conn = match conn {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                tracing::debug!(%address, error = %e, "cannot connect to the primary Sentinel names");
                return false;
            }
            Err(_) => {
                tracing::debug!(%address, "no answer from the primary Sentinel names");
                return false;
            }
        };
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        tracing::warn!(
            service = %sentinels.service,
            from = %old,
            to = %address,
            "Sentinel names a new Redis primary: following it (a failover; its state starts a new epoch if it missed writes)"
        );
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Current {
            client,
            conn,
            generation,
            address,
        };
        self.forget_announcement();
        true
    }
}

/// Listens to one Sentinel after another for `+switch-master` about our service, and follows
/// each announcement; after each (re)subscription, looks the primary up once (an
/// announcement may have been missed meanwhile).
async fn listen(primary: Weak<Primary>) {
    let mut backoff = crate::retry::Backoff::new();
    loop {
        let subscribed = {
            let Some(primary) = primary.upgrade() else {
                return;
            };
            let Some(sentinels) = &primary.sentinels else {
                return;
            };
            let found = {
                let mut sentinel = sentinels.client.lock().await;
                tokio::time::timeout(sentinels.timeout, sentinel.async_get_sentinel_client()).await
            };
            let subscribed = match found {
                Ok(Ok(client)) => {
                    tokio::time::timeout(sentinels.timeout, async {
                        let mut pubsub = client.get_async_pubsub().await?;
                        pubsub.subscribe(SWITCH_MASTER).await?;
                        Ok::<_, redis::RedisError>(pubsub)
                    })
                    .await
                }
                Ok(Err(e)) => Ok(Err(e)),
                Err(elapsed) => Err(elapsed),
            };
            match subscribed {
                Ok(Ok(pubsub)) => {
                    primary.follow(primary.generation()).await;
                    Some((pubsub, sentinels.service.clone()))
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "cannot subscribe to Sentinel's announcements; retrying");
                    None
                }
                Err(_) => {
                    tracing::debug!("no Sentinel answered a subscription; retrying");
                    None
                }
            }
        };
        if let Some((pubsub, service)) = subscribed {
            backoff.reset();
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                let payload = String::from_utf8_lossy(message.get_payload_bytes()).into_owned();
                // `<service> <old ip> <old port> <new ip> <new port>`
                let parts: Vec<&str> = payload.split(' ').collect();
                if parts.first() != Some(&service.as_str()) {
                    continue;
                }
                let Some(primary) = primary.upgrade() else {
                    return;
                };
                tracing::debug!(%payload, "Sentinel announced a failover");
                if let [_, ip, port, ..] = parts.as_slice() {
                    primary.announce(format!("{ip}:{port}"));
                }
                primary.follow(primary.generation()).await;
            }
        }
        // The Sentinel went away: another one.
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Why a lookup found no primary.
#[derive(Debug, thiserror::Error)]
pub(super) enum Lookup {
    /// No Sentinel answered, or the primary one named did not, within the connect timeout.
    #[error("no Sentinel named a primary that answers within the connect timeout")]
    TimedOut,
    /// The `redis` crate's error: every Sentinel refused or named no valid primary.
    #[error(transparent)]
    Failed(redis::RedisError),
}

/// Asks the Sentinels for the primary (the `redis` crate checks its `ROLE`).
async fn lookup(
    sentinel: &mut SentinelClient,
    timeout: Duration,
) -> std::result::Result<(redis::Client, String), Lookup> {
    let client = tokio::time::timeout(timeout, sentinel.async_get_client())
        .await
        .map_err(|_| Lookup::TimedOut)?
        .map_err(Lookup::Failed)?;
    let address = client.get_connection_info().addr().to_string();
    Ok((client, address))
}

/// The Sentinels' own credentials (`RedisOptions::with_sentinel_auth`). Its `Debug` never
/// shows the password.
#[derive(Clone)]
pub(super) struct SentinelAuth {
    pub(super) user: Option<String>,
    pub(super) password: String,
}

impl std::fmt::Debug for SentinelAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelAuth")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// A parsed `redis+sentinel://` (or `rediss+sentinel://`) URL.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct SentinelUrl {
    pub(super) tls: bool,
    /// The primary's (and replicas') credentials.
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    pub(super) sentinels: Vec<(String, u16)>,
    pub(super) service: String,
    pub(super) db: i64,
    /// The Sentinels' own credentials (query `sentinel_username`, `sentinel_password`).
    pub(super) sentinel_username: Option<String>,
    pub(super) sentinel_password: Option<String>,
}

/// Whether `url` names Sentinels.
pub(super) fn is_sentinel_url(url: &str) -> bool {
    url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://")
}

const SHAPE: &str = "a Sentinel URL is redis+sentinel://[user:password@]host:port[,host:port...]/<service>[/db] (rediss+sentinel:// over TLS)";

impl SentinelUrl {
    /// Parses `url`; [`Error::InvalidArgument`] for anything but the documented shape.
    pub(super) fn parse(url: &str) -> Result<SentinelUrl> {
        let bad = || Error::InvalidArgument(SHAPE);
        let (tls, rest) = if let Some(rest) = url.strip_prefix("rediss+sentinel://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            (false, rest)
        } else {
            return Err(bad());
        };
        if rest.contains('#') {
            return Err(Error::InvalidArgument(
                "Sentinel URLs take no #fragment: #insecure (no certificate check) is not supported",
            ));
        }
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = rest.split_once('/').ok_or_else(bad)?;
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => {
                let (user, password) = match userinfo.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    None => (userinfo, None),
                };
                let user = (!user.is_empty()).then(|| decode(user)).transpose()?;
                let password = password.map(decode).transpose()?;
                (user, password)
            }
        };
        let sentinels = hosts
            .split(',')
            .map(|h| {
                let (host, port) = h.rsplit_once(':').ok_or_else(bad)?;
                let port: u16 = port.parse().map_err(|_| bad())?;
                let host = host.trim_start_matches('[').trim_end_matches(']');
                if host.is_empty() {
                    return Err(bad());
                }
                Ok((host.to_owned(), port))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut segments = path.split('/');
        let service = segments.next().filter(|s| !s.is_empty()).ok_or_else(bad)?;
        let db = match segments.next() {
            None | Some("") => 0,
            Some(db) => db.parse().map_err(|_| bad())?,
        };
        if segments.next().is_some_and(|s| !s.is_empty()) {
            return Err(bad());
        }
        let (mut sentinel_username, mut sentinel_password) = (None, None);
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            match pair.split_once('=') {
                Some(("sentinel_username", v)) => sentinel_username = Some(decode(v)?),
                Some(("sentinel_password", v)) => sentinel_password = Some(decode(v)?),
                _ => {
                    return Err(Error::InvalidArgument(
                        "a Sentinel URL takes only sentinel_username= and sentinel_password= after `?`",
                    ));
                }
            }
        }
        Ok(SentinelUrl {
            tls,
            username,
            password,
            sentinels,
            service: decode(service)?,
            db,
            sentinel_username,
            sentinel_password,
        })
    }

    /// The URL without any password, for messages.
    pub(super) fn redacted(&self) -> String {
        let scheme = if self.tls {
            "rediss+sentinel"
        } else {
            "redis+sentinel"
        };
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(h, p)| format!("{h}:{p}"))
            .collect();
        let auth = if self.username.is_some() || self.password.is_some() {
            "***@"
        } else {
            ""
        };
        format!(
            "{scheme}://{auth}{}/{}/{}",
            hosts.join(","),
            self.service,
            self.db
        )
    }

    /// The `redis` crate's Sentinel client for this URL, with `tls` for both the Sentinels
    /// and the primary (`rediss+sentinel://`), and the Sentinels' credentials from
    /// `sentinel_auth` where the URL gives none.
    pub(super) fn client(
        &self,
        tls: &TlsFiles,
        sentinel_auth: Option<&SentinelAuth>,
    ) -> Result<SentinelClient> {
        if !self.tls && tls.is_set() {
            return Err(Error::InvalidArgument(
                "TLS options (a CA, a client certificate) need a rediss+sentinel:// URL; \
                 redis+sentinel:// is plain text",
            ));
        }
        let addresses = self.sentinels.iter().map(|(host, port)| {
            if self.tls {
                ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port: *port,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(host.clone(), *port)
            }
        });
        let invalid = |e: redis::RedisError| Error::Connect {
            endpoints: vec![self.redacted()],
            source: Box::new(e),
        };
        let mut builder =
            SentinelClientBuilder::new(addresses, &self.service, SentinelServerType::Master)
                .map_err(invalid)?
                .set_client_to_redis_db(self.db);
        if let Some(user) = &self.username {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = &self.password {
            builder = builder.set_client_to_redis_password(password);
        }
        let (user, password) = match (&self.sentinel_username, &self.sentinel_password) {
            (None, None) => match sentinel_auth {
                Some(auth) => (auth.user.clone(), Some(auth.password.clone())),
                None => (None, None),
            },
            (user, password) => (user.clone(), password.clone()),
        };
        if let Some(user) = user {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if self.tls {
            super::tls::check(tls)?;
            builder = builder
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure);
            if tls.is_set() {
                let certificates = || super::tls::redis_certificates(tls);
                builder = builder
                    .set_client_to_redis_certificates(certificates())
                    .set_client_to_sentinel_certificates(certificates());
            }
        }
        builder.build().map_err(invalid)
    }
}

/// `text` with its `%XX` escapes decoded (a password may hold `@`, `:` or `/`).
fn decode(text: &str) -> Result<String> {
    let bad = || Error::InvalidArgument("a Sentinel URL holds a malformed %-escape");
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).ok_or_else(bad)?;
            let hex = std::str::from_utf8(hex).map_err(|_| bad())?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_parse() {
        let url = SentinelUrl::parse(
            "redis+sentinel://app:p%40ss@127.0.0.1:26379,localhost:26380/mymaster/2?sentinel_password=s3",
        )
        .unwrap();
        assert_eq!(
            url,
            SentinelUrl {
                tls: false,
                username: Some("app".to_owned()),
                password: Some("p@ss".to_owned()),
                sentinels: vec![
                    ("127.0.0.1".to_owned(), 26379),
                    ("localhost".to_owned(), 26380)
                ],
                service: "mymaster".to_owned(),
                db: 2,
                sentinel_username: None,
                sentinel_password: Some("s3".to_owned()),
            }
        );
        assert_eq!(
            url.redacted(),
            "redis+sentinel://***@127.0.0.1:26379,localhost:26380/mymaster/2"
        );
        let tls = SentinelUrl::parse("rediss+sentinel://h:1/svc").unwrap();
        assert!(tls.tls);
        assert_eq!(tls.db, 0);
        for bad in [
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel://h/svc",
            "redis+sentinel://h:x/svc",
            "redis+sentinel://h:1/svc/notadb",
            "redis+sentinel://h:1/svc?other=1",
            "redis+sentinel://h:1/svc#insecure",
            "redis://h:1/svc",
        ] {
            assert!(
                matches!(SentinelUrl::parse(bad), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
    }
}
