//! The Redis backend (feature `redis`): baton's queues on one Redis primary, every state change
//! one Lua script, waits woken through per-process mailboxes. docs/redis.md says what it
//! promises and what it needs from the server.

mod mailbox;
mod primary;
mod scripts;
pub(crate) mod tls;

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, Script, ServerErrorKind, Value};
use tokio::time::Instant;

use self::mailbox::Mailbox;
use self::primary::{Primary, SentinelUrl, is_sentinel_url};
use self::scripts::SCRIPTS;
use super::{
    Backend, Enqueued, Entry, FencingToken, HeadEvent, Lease, LeaseId, Position, WriteOp,
    queue_of_bytes,
};
use crate::epoch::{Epoch, StoreEpochs, grace_rest};
use crate::error::{BoxError, Error, LostReason, Result};
use crate::retry::{Backoff, Retry};

/// The oldest Redis baton runs on: 5.0 (streams, and scripts that read the clock before they
/// write).
const MINIMUM_VERSION: (u32, u32) = (5, 0);

/// Eviction policies that never evict a key without a TTL (baton's queues have none).
const SAFE_EVICTION: &[&str] = &[
    "noeviction",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
];

/// Options for [`RedisBackend::connect`].
///
/// ```
/// # use std::time::Duration;
/// let options = baton::RedisOptions::new()
///     .with_prefix("billing:")
///     .with_request_timeout(Duration::from_secs(2));
/// ```
///
/// Over TLS (`rediss://`), with the CA that signed the server's certificate and, for a server
/// that asks for one (`tls-auth-clients yes`), a client certificate:
///
/// ```no_run
/// # fn main() -> std::io::Result<()> {
/// let options = baton::RedisOptions::new()
///     .with_ca_cert(std::fs::read("ca.pem")?)
///     .with_client_cert(std::fs::read("client.pem")?, std::fs::read("client-key.pem")?);
/// // baton::RedisBackend::connect("rediss://redis.internal:6380", options)
/// # let _ = options; Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisOptions {
    connect_timeout: Duration,
    request_timeout: Duration,
    retry_for: Duration,
    prefix: String,
    recheck: Duration,
    restart_grace: Duration,
    tls: tls::TlsFiles,
    /// The Sentinels' own credentials (user, password), for `redis+sentinel://`.
    sentinel_auth: Option<primary::SentinelAuth>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl RedisOptions {
    /// Defaults: connect timeout 5 s, request timeout 5 s, retries for up to 10 s, key prefix
    /// `baton:`, waits re-checked at least every 30 s, restart grace 60 s (the default
    /// session TTL).
    pub fn new() -> Self {
        RedisOptions {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            retry_for: Duration::from_secs(10),
            prefix: "baton:".to_owned(),
            recheck: Duration::from_secs(30),
            restart_grace: crate::SessionOptions::DEFAULT_TTL,
            tls: tls::TlsFiles::default(),
            sentinel_auth: None,
        }
    }

    /// The Sentinels' own credentials, for a `redis+sentinel://` URL whose Sentinels ask for
    /// a password (`requirepass` in sentinel.conf; with `user`, an ACL user of theirs). The
    /// URL's `user:password@` is the primary's; the URL's `?sentinel_username=` and
    /// `?sentinel_password=`, when given, take precedence over these.
    ///
    /// Checked at connect: Sentinels that refuse them are [`Error::Auth`].
    pub fn with_sentinel_auth(mut self, user: Option<String>, password: impl Into<String>) -> Self {
        self.sentinel_auth = Some(primary::SentinelAuth {
            user,
            password: password.into(),
        });
        self
    }

    /// Trusts the CA certificates in `pem` (one or more, PEM-encoded: redis-cli's `--cacert`
    /// file) for the server's certificate, instead of the system's roots. For `rediss://`
    /// URLs (TLS); a `redis://` URL with TLS options is refused.
    ///
    /// Checked at connect: a bundle with no certificate, or one that does not parse, is
    /// [`Error::InvalidArgument`]. The server's certificate must name the URL's host.
    pub fn with_ca_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(pem.into());
        self
    }

    /// Presents the client certificate `cert_pem` (a PEM certificate, or a chain with the
    /// client's certificate first) with its private key `key_pem` (PEM, PKCS#8, PKCS#1 or
    /// SEC1), for a server that asks for one (`tls-auth-clients yes`, Redis's default when it
    /// serves TLS; redis-cli's `--cert` and `--key`). For `rediss://` URLs.
    ///
    /// Checked at connect: a certificate or key that does not parse, or a key that is not the
    /// certificate's, is [`Error::InvalidArgument`].
    pub fn with_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// How long nothing is granted after baton's state on the server was lost or rolled back
    /// (default 60 s, the default session TTL).
    ///
    /// Every script checks that the state it reads is the one earlier grants were made on
    /// (the server's `run_id` against the one stored with the state, the state's presence, and
    /// the highest token the client has seen). A restart (with or without persistence, even
    /// from an AOF), a failover, a flush or a deletion of baton's keys starts a new *epoch*:
    /// every lease from before is void and its owners are told at their next renewal, but
    /// until then each believes it holds, for at most its session TTL. So nothing is granted
    /// until the grace has passed since the epoch began. Set it to at least the longest
    /// session TTL of every client of this server: a shorter grace lets a new holder overlap
    /// an old one (a fence still refuses the old holder's writes). The first use of a new or
    /// flushed server waits the grace too: baton cannot tell a server that never held locks
    /// from one that lost them. Each wait is logged once (`warn`).
    ///
    /// `Duration::ZERO` turns the wait off: right only where no holder can predate the
    /// state (a test server started for one run).
    pub fn with_restart_grace(mut self, grace: Duration) -> Self {
        self.restart_grace = grace;
        self
    }

    /// How long [`RedisBackend::connect`] waits for the server to answer.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The limit for one attempt of one request. Waits are not limited by it.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How long a request that fails with a transient error (connection lost, server
    /// loading) is retried, with backoff, before the error is returned. Keep it well below
    /// your session TTL.
    pub fn with_retry_for(mut self, duration: Duration) -> Self {
        self.retry_for = duration;
        self
    }

    /// The prefix of every key baton writes (default `baton:`). Clients that share locks
    /// must use the same prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest a wait goes without asking the server again (default 30 s). Wake-ups
    /// come from the server as they happen; this only bounds how long a wake-up lost with a
    /// restarted server can delay a waiter. A wait on an entry also looks again when that
    /// entry's lease would expire.
    pub fn with_recheck(mut self, every: Duration) -> Self {
        // Never a busy loop.
        self.recheck = every.max(Duration::from_millis(100));
        self
    }
}

/// The Redis backend: a single Redis primary (5.0 or newer; not Redis Cluster).
///
/// Layout (under a prefix, `baton:` by default; see docs/redis.md): a lease is a deadline on
/// the **server's** clock in a sorted set, renewed by its session; an entry is a hash bound to
/// a lease, listed in a sorted set per queue (and per enclosing name: names that nest share a
/// queue) scored by its token. Tokens come from one counter that never goes backwards: each
/// is one more than the last and at least the server clock in microseconds, so a restart
/// that loses the data (or a failover to a replica that missed writes) still hands out larger
/// tokens. Every state change is one Lua script, atomic on the server; an entry whose lease
/// expired is removed by the next script that meets it, and every grant or renewal also ends
/// a few expired leases.
///
/// **Waits wake exactly their waiters, losslessly.** Each backend owns a mailbox (a list on
/// the server) read by one blocking connection. A waiter registers its mailbox on the entry
/// it waits for, in the same script that checks the entry; whoever deletes the entry (release,
/// revoke, expiry) pushes a wake-up into each registered mailbox. A process with 10,000
/// waiters uses two connections: one for requests, one for its mailbox (plus one per
/// [`observe_head`](Backend::observe_head) stream).
///
/// **What Redis can promise.** Mutual exclusion holds on a single primary. Any loss or
/// rollback of baton's state (a restart with or without persistence, a failover to a replica
/// that missed writes, a flush or deletion of baton's keys) is detected by the first script
/// that runs on the state that follows it, before it grants anything: every lease from before
/// is void, every token after it is higher than any before it, and nothing is granted until
/// the restart grace ([`RedisOptions::with_restart_grace`], at least the longest session TTL)
/// has passed, by when every holder from before has been told (`lost()`). What stays open is
/// a split brain: an old primary that goes on serving its clients after a replica was
/// promoted; only a fenced resource stays safe then (docs/redis.md).
///
/// `RedisBackend` is a handle: clones share the connections and the mailbox.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Shared>,
}

struct Shared {
    /// The primary requests go to (for `redis+sentinel://`, the one the Sentinels name now).
    primary: Arc<Primary>,
    options: RedisOptions,
    /// The server's address, without credentials (for errors and `Debug`).
    endpoint: String,
    mailbox: Mailbox,
    requests: AtomicU64,
    /// What this client remembers of the server's epochs (the core's rules: a new one ends
    /// every session from before, and holds grants back for its grace).
    epochs: StoreEpochs,
    /// The highest counter value (token, lease id, epoch) this backend has seen: sent with
    /// the requests that take new values, so that the server never hands out a lower one
    /// (and knows its state went back in time if its counter is below it).
    floor: Arc<AtomicU64>,
    /// The stamp of the last `enqueue` call: stamps increase from call to call, so the server
    /// can tell a request that arrives after a later call of the same lease for the same
    /// entry (see `enqueue` in scripts.rs).
    stamps: AtomicU64,
    clock: ServerClock,
}

/// An estimate of the server's clock, from the times its scripts answer with: never ahead of
/// the server's (a time read on the server before the answer came back, taken as the time
/// of its arrival), behind by at most a round trip.
#[derive(Debug)]
struct ServerClock {
    base: Instant,
    /// Server ms minus ms since `base`, at the last answer that told the time.
    offset: AtomicI64,
}

impl ServerClock {
    fn new(server_ms: i64) -> ServerClock {
        ServerClock {
            base: Instant::now(),
            offset: AtomicI64::new(server_ms),
        }
    }

    fn local_ms(&self) -> i64 {
        i64::try_from(self.base.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    fn now(&self) -> i64 {
        self.local_ms()
            .saturating_add(self.offset.load(Ordering::Relaxed))
    }

    /// The server said its clock read `server_ms` (just now, as far as we can tell).
    fn told(&self, server_ms: i64) {
        self.offset
            .store(server_ms.saturating_sub(self.local_ms()), Ordering::Relaxed);
    }
}

/// Added to an `enqueue` call's deadline on the server's clock, for the error of our estimate
/// of that clock (a round trip) and drift: a request that arrives this late, after its caller
/// gave up, is still refused, because the caller's cleanup ([`Backend::abandon`]) makes sure
/// of it.
const DEADLINE_SLACK: Duration = Duration::from_secs(1);

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("endpoint", &self.inner.endpoint)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

/// Whether a request only reads (or is idempotent), or changes state (then a failure after
/// sending it leaves its outcome unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

/// Whether a failed request may be sent again: the connection broke or timed out, or the
/// server is not ready yet.
fn is_transient(e: &RedisError) -> bool {
    is_busy(e)
        || e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
            )
        )
}

/// Another script runs too long (`BUSY`): ours was not run.
fn is_busy(e: &RedisError) -> bool {
    e.code() == Some("BUSY")
}

/// Whether a failed request certainly never reached the server (or was refused unapplied).
fn never_sent(e: &RedisError) -> bool {
    is_busy(e)
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::BusyLoading | ServerErrorKind::ReadOnly)
        )
}

fn redis_err(op: &'static str, e: RedisError) -> Error {
    match e.kind() {
        ErrorKind::AuthenticationFailed => Error::Auth {
            source: Box::new(e),
        },
        // A server that wants a password and got none answers NOAUTH to every command.
        _ if e.code() == Some("NOAUTH") => Error::Auth {
            source: Box::new(e),
        },
        ErrorKind::Server(ServerErrorKind::NoPerm) => Error::Permission {
            source: Box::new(e),
        },
        // What a script gets when the user may not run one of the commands it calls (Redis 7
        // answers ERR, not NOPERM, for those).
        _ if e.to_string().contains("can't run this command") => Error::Permission {
            source: Box::new(e),
        },
        _ => Error::Backend {
            op,
            source: Box::new(e),
            at: Default::default(),
        },
    }
}

/// The request connection's configuration.
fn manager_config(options: &RedisOptions) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        // Each attempt is bounded by our own timeout (see `attempts`), so that a slow answer
        // is a retry, not a broken connection.
        .set_response_timeout(None)
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(250))
}

/// Waits for `connecting`. For a `rediss://` URL whose TLS greeting is not answered within
/// [`tls::UNANSWERED`], asks the server in plain text whether it speaks it, and if it does,
/// gives up at once with that: a plain-text Redis may wait for the rest of a greeting it reads
/// as a command until the connect timeout.
async fn first_answer<T>(
    probe: &tls::Probe,
    connecting: impl Future<Output = T>,
) -> std::result::Result<T, tls::Refused> {
    if !probe.is_tls() {
        return Ok(connecting.await);
    }
    let plain_text = async {
        tokio::time::sleep(tls::UNANSWERED).await;
        match probe.speaks_plain_text().await {
            Some(refused) => refused,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        answer = connecting => Ok(answer),
        refused = plain_text => Err(refused),
    }
}

/// The error of a connection that failed with `e`: a TLS refusal the error holds, or one a
/// handshake of our own finds (a refused client certificate the connection saw only as a
/// reset; a TLS server reached at `redis://`); else `failed` with `e`.
async fn explain(
    probe: &tls::Probe,
    endpoint: &str,
    e: RedisError,
    failed: impl FnOnce(BoxError) -> Error,
) -> Error {
    if let Some(refused) = tls::refused(&e) {
        return refused.misconfigured(vec![endpoint.to_owned()]);
    }
    // A connection made and then broken (not one refused, not a server's answer).
    if e.is_io_error()
        && !e.is_connection_refusal()
        && let Some(refused) = probe.after_failure(tls::PROBE_LIMIT).await
    {
        return refused.misconfigured(vec![endpoint.to_owned()]);
    }
    failed(Box::new(e))
}

/// The URL without its password, for messages.
/// The server did not answer in time: what it did not answer, and within what. (tokio's
/// `Elapsed` says only "deadline has elapsed": not what, nor how long, nor which option.)
#[derive(Debug)]
struct NoAnswer {
    /// What was not answered (`the connection's handshake`, `INFO`), if not the request
    /// the error names itself.
    what: Option<&'static str>,
    within: Duration,
    /// The option that sets `within`.
    option: &'static str,
}

impl NoAnswer {
    /// Connecting: `what` unanswered within the connect timeout.
    fn connecting(what: &'static str, within: Duration) -> BoxError {
        Box::new(NoAnswer {
            what: Some(what),
            within,
            option: "with_connect_timeout",
        })
    }

    /// A request unanswered within the request timeout.
    fn request(within: Duration) -> BoxError {
        Box::new(NoAnswer {
            what: None,
            within,
            option: "the request timeout",
        })
    }
}

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no answer")?;
        if let Some(what) = self.what {
            write!(f, " to {what}")?;
        }
        write!(f, " within {:?} ({})", self.within, self.option)
    }
}

impl std::error::Error for NoAnswer {}

fn malformed(op: &'static str) -> Error {
    Error::Backend {
        op,
        source: "Redis answered a script with an unexpected shape".into(),
        at: Default::default(),
    }
}

fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn number(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        other => std::str::from_utf8(bytes(other)?).ok()?.parse().ok(),
    }
}

fn items(v: Value) -> Option<Vec<Value>> {
    match v {
        Value::Array(items) => Some(items),
        _ => None,
    }
}

/// An entry as the scripts return it: `{key, value, token, lease}`; nil for none.
fn entry(op: &'static str, v: &Value) -> Result<Option<Entry>> {
    let Value::Array(fields) = v else {
        return match v {
            Value::Nil => Ok(None),
            _ => Err(malformed(op)),
        };
    };
    let [key, value, token, lease] = fields.as_slice() else {
        return Err(malformed(op));
    };
    let (Some(key), Some(value), Some(token), Some(lease)) =
        (bytes(key), bytes(value), number(token), number(lease))
    else {
        return Err(malformed(op));
    };
    let token = u64::try_from(token).map_err(|_| malformed(op))?;
    Ok(Some(Entry::new(
        key,
        value,
        Position::new(token),
        FencingToken::new(token),
        Some(LeaseId::new(lease)),
    )))
}

fn entries(op: &'static str, v: Value) -> Result<Vec<Entry>> {
    items(v)
        .ok_or_else(|| malformed(op))?
        .iter()
        .map(|e| entry(op, e)?.ok_or_else(|| malformed(op)))
        .collect()
}

/// `text` with the characters Redis's glob patterns treat specially escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn gone(entry: &Entry) -> Error {
    Error::EntryGone {
        key: entry.key().to_owned(),
    }
}

fn unknown(op: &'static str) -> Error {
    Error::OutcomeUnknown {
        op,
        source:
            "an attempt failed after it may have been applied, and the retry found the entry gone"
                .into(),
        at: Default::default(),
    }
}

/// The restart grace still to wait, from the `since` and `now` a script answered with (the
/// server's clock, ms).
fn grace_left(grace: Duration, since: Option<&Value>, now: Option<&Value>) -> Option<Duration> {
    let since = since.and_then(number)?;
    let now = now.and_then(number)?;
    grace_rest(grace, now.saturating_sub(since))
}

/// One argument list of a script: the prefix first.
struct Args(Vec<Vec<u8>>);

impl Args {
    fn new(backend: &RedisBackend) -> Args {
        Args(vec![backend.inner.options.prefix.clone().into_bytes()])
    }

    fn arg(mut self, a: impl AsRef<[u8]>) -> Args {
        self.0.push(a.as_ref().to_vec());
        self
    }

    fn token(self, t: FencingToken) -> Args {
        self.arg(t.get().to_string())
    }
}

impl RedisBackend {
    /// Connects to the Redis at `url` (`redis://[user:password@]host:port[/db]`, or
    /// `rediss://` for TLS, with [`RedisOptions::with_ca_cert`] and
    /// [`RedisOptions::with_client_cert`], or the system's roots without a CA) and checks that
    /// the server can keep baton's promises: version 5.0 or newer, and an eviction policy that
    /// never evicts keys without a TTL (`noeviction` or a `volatile-*` policy; `allkeys-*`
    /// could silently delete a lock holder's entry).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for TLS options with a `redis://` URL, a CA, certificate or
    /// key that does not parse, a key that is not the certificate's, or a `rediss://` URL with
    /// a `#fragment` (`#insecure` is not supported); nothing is sent.
    /// [`Error::Connect`] if the URL is malformed or the server does not answer within the
    /// connect timeout; [`Error::Misconfigured`] at once, saying which, if the server's TLS
    /// certificate is not trusted (another CA, another host name, expired), if a `rediss://`
    /// URL names a server that does not speak TLS, or a `redis://` URL one that speaks only
    /// TLS;
    /// [`Error::Auth`] if it refuses the credentials, or the client certificate (or its
    /// absence); [`Error::UnsupportedVersion`] for a server older than 5.0;
    /// [`Error::ServerSetting`] for an eviction policy that may delete entries.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is created on the server before it returns (the mailbox is a key
    /// with a TTL that expires by itself).
    pub async fn connect(url: &str, options: RedisOptions) -> Result<RedisBackend> {
        if is_sentinel_url(url) {
            return RedisBackend::connect_sentinel(url, options).await;
        }
        let endpoint = crate::connect::redacted(url);
        let failed = |source: BoxError| Error::Connect {
            endpoints: vec![endpoint.clone()],
            source,
        };
        let (client, probe) = tls::client(url, &options.tls)?;
        let connecting = tokio::time::timeout(
            options.connect_timeout,
            client.get_connection_manager_with_config(manager_config(&options)),
        );
        let conn = match first_answer(&probe, connecting).await {
            Err(refused) => return Err(refused.misconfigured(vec![endpoint.clone()])),
            Ok(Err(_elapsed)) => {
                return Err(failed(NoAnswer::connecting(
                    "the connection's handshake",
                    options.connect_timeout,
                )));
            }
            Ok(Ok(Ok(conn))) => conn,
            Ok(Ok(Err(e))) if e.kind() == ErrorKind::AuthenticationFailed => {
                return Err(Error::Auth {
                    source: Box::new(e),
                });
            }
            Ok(Ok(Err(e))) => return Err(explain(&probe, &endpoint, e, failed).await),
        };
        let primary = Arc::new(Primary::fixed(client, conn));
        RedisBackend::start(primary, endpoint, &probe, options).await
    }

    /// [`connect`](Self::connect) for a `redis+sentinel://` URL: the primary the Sentinels
    /// name.
    async fn connect_sentinel(url: &str, options: RedisOptions) -> Result<RedisBackend> {
        let parsed = SentinelUrl::parse(url)?;
        let endpoint = parsed.redacted();
        let sentinel = parsed.client(&options.tls, options.sentinel_auth.as_ref())?;
        let primary = Primary::following(
            sentinel,
            parsed.service.clone(),
            manager_config(&options),
            options.connect_timeout,
        )
        .await
        .map_err(|e| match e {
            primary::Lookup::Failed(e) if e.kind() == ErrorKind::AuthenticationFailed => {
                Error::Auth {
                    source: Box::new(e),
                }
            }
            primary::Lookup::Failed(e) if e.code() == Some("NOAUTH") => Error::Auth {
                source: Box::new(e),
            },
            primary::Lookup::Failed(e) => match tls::refused(&e) {
                Some(refused) => refused.misconfigured(vec![endpoint.clone()]),
                None => Error::Connect {
                    endpoints: vec![endpoint.clone()],
                    source: Box::new(e),
                },
            },
            timed_out @ primary::Lookup::TimedOut => Error::Connect {
                endpoints: vec![endpoint.clone()],
                source: Box::new(timed_out),
            },
        })?;
        let primary = Arc::new(primary);
        primary.watch();
        let probe = tls::Probe::none();
        RedisBackend::start(primary, endpoint, &probe, options).await
    }

    /// Checks the server behind `primary` and starts the backend on it.
    async fn start(
        primary: Arc<Primary>,
        endpoint: String,
        probe: &tls::Probe,
        options: RedisOptions,
    ) -> Result<RedisBackend> {
        let failed = |source: BoxError| Error::Connect {
            endpoints: vec![endpoint.clone()],
            source,
        };
        let conn = primary.current().conn;
        let mut server = conn.clone();
        let info = tokio::time::timeout(
            options.connect_timeout,
            redis::cmd("INFO")
                .arg("server")
                .query_async::<String>(&mut server),
        )
        .await
        .map_err(|_elapsed| failed(NoAnswer::connecting("INFO", options.connect_timeout)))?;
        let info = match info {
            Ok(info) => info,
            // A TLS 1.3 server judges the client certificate after the connection is made.
            Err(e) if probe.is_tls() && e.is_io_error() => {
                return Err(explain(probe, &endpoint, e, failed).await);
            }
            Err(e) => return Err(redis_err("connect", e)),
        };
        check_version(&info)?;
        check_eviction(&mut server).await?;
        let (secs, micros): (i64, i64) = tokio::time::timeout(
            options.connect_timeout,
            redis::cmd("TIME").query_async(&mut server),
        )
        .await
        .map_err(|_elapsed| failed(NoAnswer::connecting("TIME", options.connect_timeout)))?
        .map_err(|e| redis_err("connect", e))?;
        let clock = ServerClock::new(secs * 1000 + micros / 1000);
        let floor = Arc::new(AtomicU64::new(0));
        let mailbox = Mailbox::open(Arc::clone(&primary), &options, Arc::clone(&floor))
            .await
            .map_err(|e| match e {
                Error::Backend { source, .. } => failed(source),
                other => other,
            })?;
        let epochs = StoreEpochs::new(format!("Redis at {endpoint}"), options.restart_grace);
        Ok(RedisBackend {
            inner: Arc::new(Shared {
                primary,
                options,
                endpoint,
                mailbox,
                requests: AtomicU64::new(0),
                epochs,
                floor,
                stamps: AtomicU64::new(0),
                clock,
            }),
        })
    }

    /// Remembers a counter value the server handed out (see `Shared::floor`).
    fn seen(&self, value: u64) {
        self.inner.floor.fetch_max(value, Ordering::Relaxed);
    }

    fn floor(&self) -> String {
        self.inner.floor.load(Ordering::Relaxed).to_string()
    }

    /// The server's clock when a call started now must have been given up on by its caller
    /// (every attempt of it sent and timed out), with slack for our estimate of that clock.
    fn call_deadline(&self) -> i64 {
        let budget = self
            .inner
            .options
            .retry_for
            .saturating_add(self.inner.options.request_timeout)
            .saturating_add(DEADLINE_SLACK);
        self.inner
            .clock
            .now()
            .saturating_add(i64::try_from(budget.as_millis()).unwrap_or(i64::MAX))
    }

    /// How many requests this backend (all its clones) has sent, retries included.
    pub fn requests_sent(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// How many wake-ups the server has sent this backend's waiters (all its clones): one per
    /// waiter whose entry went, or whose key changed. A release wakes exactly the waiter
    /// behind the holder.
    pub fn wakeups(&self) -> u64 {
        self.inner.mailbox.waits().delivered()
    }

    /// The server this backend talks to, without credentials.
    pub fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    /// Runs `script` with `args` until it answers, fails for good, or the retry budget is
    /// spent. Besides the answer, tells whether an earlier attempt failed after it may have
    /// been applied (only for [`Kind::Write`]).
    async fn eval(
        &self,
        op: &'static str,
        kind: Kind,
        script: &Script,
        args: Args,
    ) -> Result<(Value, bool)> {
        self.attempts(op, kind, |mut conn| {
            let mut invocation = script.prepare_invoke();
            for a in &args.0 {
                invocation.arg(a.as_slice());
            }
            async move { invocation.invoke_async::<Value>(&mut conn).await }
        })
        .await
    }

    async fn read_eval(&self, op: &'static str, script: &Script, args: Args) -> Result<Value> {
        Ok(self.eval(op, Kind::Read, script, args).await?.0)
    }

    async fn attempts<T, F, Fut>(&self, op: &'static str, kind: Kind, f: F) -> Result<(T, bool)>
    where
        F: FnMut(ConnectionManager) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        self.attempts_here(op, kind, f)
            .await
            .map_err(|e| e.at_endpoint(&self.label()))
    }

    /// The server, for errors: `Redis at <url without password>`.
    fn label(&self) -> String {
        format!("Redis at {}", self.inner.endpoint)
    }

    async fn attempts_here<T, F, Fut>(
        &self,
        op: &'static str,
        kind: Kind,
        mut f: F,
    ) -> Result<(T, bool)>
    where
        F: FnMut(ConnectionManager) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let mut retry = Retry::new(op, self.inner.options.retry_for);
        loop {
            // After a stall of this process or a failover's announcement, the Sentinels are
            // asked first.
            let Some(primary) = self.inner.primary.current_checked().await else {
                // A failover announced and not followed yet: nothing is sent.
                retry
                    .pause(Box::new(primary::Moving), &self.inner.endpoint)
                    .await?;
                continue;
            };
            self.inner.requests.fetch_add(1, Ordering::Relaxed);
            let attempt = Box::pin(tokio::time::timeout(
                self.inner.options.request_timeout,
                f(primary.conn),
            ));
            let error: BoxError = match attempt.await {
                Ok(Ok(v)) => return Ok((v, retry.maybe_applied())),
                Ok(Err(e)) if !is_transient(&e) => {
                    return Err(if retry.maybe_applied() {
                        retry.failed(Box::new(e))
                    } else {
                        redis_err(op, e)
                    });
                }
                Ok(Err(e)) => {
                    if kind == Kind::Write && !never_sent(&e) {
                        retry.may_have_applied();
                    }
                    Box::new(e)
                }
                Err(_elapsed) => {
                    if kind == Kind::Write {
                        retry.may_have_applied();
                    }
                    NoAnswer::request(self.inner.options.request_timeout)
                }
            };
            // A dead, frozen or demoted primary: ask the Sentinels (if any) where it is now.
            self.inner.primary.follow(primary.generation).await;
            retry.pause(error, &self.inner.endpoint).await?;
        }
    }

    /// A conditional write on `entry` (`delete`, `update`, `guarded`): `Ok(true)` applied,
    /// `Ok(false)` the entry was gone, [`Error::OutcomeUnknown`] when an earlier attempt may
    /// have been applied and the last found the entry gone.
    async fn write_if_live(&self, op: &'static str, script: &Script, args: Args) -> Result<bool> {
        let (answer, maybe_applied) = self.eval(op, Kind::Write, script, args).await?;
        match number(&answer) {
            Some(1) => Ok(true),
            Some(0) if maybe_applied => Err(unknown(op).at_endpoint(&self.label())),
            Some(0) => Ok(false),
            _ => Err(malformed(op)),
        }
    }

    async fn ahead_impl(
        &self,
        queue: &str,
        mine: &Entry,
        limit: usize,
        key: Option<&str>,
    ) -> Result<(Vec<Entry>, Option<Vec<u8>>)> {
        self.ahead_impl_bytes(queue.as_bytes(), mine, limit, key)
            .await
    }

    /// [`ahead_impl`](Self::ahead_impl) for a queue named by exact bytes.
    async fn ahead_impl_bytes(
        &self,
        queue: &[u8],
        mine: &Entry,
        limit: usize,
        key: Option<&str>,
    ) -> Result<(Vec<Entry>, Option<Vec<u8>>)> {
        let mut args = Args::new(self)
            .arg(queue)
            .arg(mine.key_bytes())
            .token(mine.token())
            .arg(limit.to_string());
        if let Some(key) = key {
            args = args.arg(key);
        }
        let answer = self.read_eval("ahead", &SCRIPTS.ahead, args).await?;
        let mut answer = items(answer).ok_or_else(|| malformed("ahead"))?.into_iter();
        match answer.next().as_ref().and_then(number) {
            Some(0) => return Err(gone(mine)),
            Some(1) => {}
            _ => return Err(malformed("ahead")),
        }
        let ahead = entries("ahead", answer.next().ok_or_else(|| malformed("ahead"))?)?;
        if let Some(newest) = ahead.first() {
            self.seen(newest.token().get());
        }
        let value = answer.next().as_ref().and_then(bytes).map(<[u8]>::to_vec);
        let (since, now) = (answer.next(), answer.next());
        if let Some(now) = now.as_ref().and_then(number) {
            self.inner.clock.told(now);
        }
        self.epoch_answered(since.as_ref(), now.as_ref());
        let _ = limit;
        Ok((ahead, value))
    }

    /// The server's clock, in ms.
    async fn server_ms(&self) -> Result<i64> {
        let ((secs, micros), _) = self
            .attempts("time", Kind::Read, |mut conn| async move {
                redis::cmd("TIME")
                    .query_async::<(i64, i64)>(&mut conn)
                    .await
            })
            .await?;
        Ok(secs * 1000 + micros / 1000)
    }

    /// Takes in the epoch a script ran in (`since`: when it began, server ms; `now`: the
    /// server's clock): a new one ends every session from before at once, and holds grants
    /// back for the rest of its grace. An answer to a request sent before the epoch changed
    /// names the older one: ignored.
    fn epoch_answered(&self, since: Option<&Value>, now: Option<&Value>) {
        let Some(start) = since.and_then(number) else {
            return;
        };
        let start = u64::try_from(start).unwrap_or(0);
        // Redis makes its own tokens (above every earlier one, see lib.lua): the epoch is
        // named by when it began, which only grows.
        let epoch = Epoch::new(u128::from(start), start, 0);
        if self.inner.epochs.may_enter(&epoch) {
            let left = grace_left(self.inner.options.restart_grace, since, now);
            self.inner.epochs.enter(epoch, left);
        }
    }

    /// Runs a script that takes `lease` and answers a number of milliseconds (a TTL), or nil
    /// when the lease is gone.
    async fn lease_ms(
        &self,
        op: &'static str,
        script: &Script,
        lease: LeaseId,
    ) -> Result<Option<Duration>> {
        let args = Args::new(self).arg(lease.get().to_string());
        Ok(match self.read_eval(op, script, args).await? {
            Value::Nil => None,
            other => Some(Duration::from_millis(
                number(&other)
                    .and_then(|n| u64::try_from(n).ok())
                    .ok_or_else(|| malformed(op))?,
            )),
        })
    }

    async fn oldest(&self, queue: &str, limit: usize) -> Result<Vec<Entry>> {
        let args = Args::new(self).arg(queue).arg(limit.to_string());
        entries(
            "entries",
            self.read_eval("entries", &SCRIPTS.oldest, args).await?,
        )
    }
}

impl RedisBackend {
    /// One `enqueue` call (its attempts share a stamp and a deadline): the script's answer.
    async fn enqueue_once(
        &self,
        queue: &str,
        tag: &str,
        lease: LeaseId,
        value: &[u8],
    ) -> Result<Vec<Value>> {
        let stamp = self.inner.stamps.fetch_add(1, Ordering::SeqCst) + 1;
        let args = Args::new(self)
            .arg(queue)
            .arg(tag)
            .arg(lease.get().to_string())
            .arg(value)
            .arg(stamp.to_string())
            .arg(self.call_deadline().to_string())
            .arg(self.floor());
        let (answer, _) = self
            .eval("enqueue", Kind::Write, &SCRIPTS.enqueue, args)
            .await?;
        items(answer).ok_or_else(|| malformed("enqueue"))
    }
}

/// Refuses a server older than [`MINIMUM_VERSION`], from the `INFO server` text.
fn check_version(info: &str) -> Result<()> {
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(str::trim)
        .unwrap_or("unknown");
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next().flatten(), parts.next().flatten());
    match (major, minor) {
        (Some(major), Some(minor)) if (major, minor) >= MINIMUM_VERSION => Ok(()),
        _ => Err(Error::UnsupportedVersion {
            server: "Redis",
            version: version.to_owned(),
            minimum: "5.0",
        }),
    }
}

/// Refuses an eviction policy that may delete keys without a TTL. A server that does not let
/// us read its configuration (a managed service that renamed `CONFIG`) is trusted, with a
/// warning.
async fn check_eviction(conn: &mut ConnectionManager) -> Result<()> {
    let answer: Result<Vec<String>, RedisError> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(conn)
        .await;
    match answer {
        Ok(pair) => match pair.get(1) {
            Some(policy) if !SAFE_EVICTION.contains(&policy.as_str()) => {
                Err(Error::ServerSetting {
                    setting: "maxmemory-policy",
                    value: policy.clone(),
                    needed: "noeviction (or a volatile-* policy): this policy may evict lock entries",
                })
            }
            Some(policy) if policy.starts_with("volatile") => {
                tracing::warn!(
                    policy = %policy,
                    "Redis may evict keys with a TTL: baton's queues have none, but its wake-up mailboxes do; an evicted one delays waiters until they look again (RedisOptions::with_recheck). noeviction avoids that"
                );
                Ok(())
            }
            _ => Ok(()),
        },
        Err(e) => {
            tracing::warn!(error = %e, "cannot read Redis's maxmemory-policy; make sure it is noeviction");
            Ok(())
        }
    }
}

#[async_trait]
impl Backend for RedisBackend {
    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        if ms == 0 {
            return Err(Error::InvalidArgument(
                "lease TTL must be at least one millisecond",
            ));
        }
        // A retried grant may leave an extra lease behind; it holds nothing and expires.
        let args = Args::new(self).arg(ms.to_string()).arg(self.floor());
        let (answer, _) = self
            .eval("grant_lease", Kind::Write, &SCRIPTS.grant, args)
            .await?;
        let Value::Array(answer) = answer else {
            return Err(malformed("grant_lease"));
        };
        let id = answer
            .first()
            .and_then(number)
            .ok_or_else(|| malformed("grant_lease"))?;
        self.seen(u64::try_from(id).unwrap_or(0));
        // The session registers in the epoch its lease was granted in: this client takes it
        // in first.
        self.epoch_answered(answer.get(1), answer.get(2));
        Ok(Lease::new(LeaseId::new(id), Duration::from_millis(ms)))
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>> {
        // Idempotent: renewing twice is renewing.
        self.lease_ms("keep_alive", &SCRIPTS.keep_alive, lease)
            .await
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        let args = Args::new(self).arg(lease.get().to_string());
        self.read_eval("revoke_lease", &SCRIPTS.revoke, args)
            .await
            .map(drop)
    }

    async fn enqueue(
        &self,
        queue: &str,
        tag: &str,
        lease: LeaseId,
        value: &[u8],
    ) -> Result<Enqueued> {
        // Create-if-absent: a retry after an attempt that was applied finds the entry. Every
        // attempt of this call carries the same stamp and deadline: the server creates the
        // entry only for a call no later call has overtaken, before the deadline.
        let mut answer = self.enqueue_once(queue, tag, lease, value).await?;
        if answer.first().and_then(number) == Some(2) {
            // Refused as late although we still wait for it: our estimate of the server's
            // clock was off (its clock stepped). Learn it again and ask once more, as a new
            // call.
            tracing::warn!(endpoint = %self.inner.endpoint, "Redis refused an enqueue as late: its clock may have stepped; asking again");
            let now = self.server_ms().await?;
            self.inner.clock.told(now);
            answer = self.enqueue_once(queue, tag, lease, value).await?;
        }
        match answer.first().and_then(number) {
            Some(0) => return Err(Error::SessionLost(LostReason::Revoked)),
            Some(1) => {}
            Some(2) => {
                return Err(Error::Backend {
                    op: "enqueue",
                    source: "the server refused the request as late twice: is its clock stepping?"
                        .into(),
                    at: Default::default(),
                }
                .at_endpoint(&self.label()));
            }
            _ => return Err(malformed("enqueue")),
        }
        let mine = answer
            .get(1)
            .map(|e| entry("enqueue", e))
            .transpose()?
            .flatten()
            .ok_or_else(|| malformed("enqueue"))?;
        self.seen(mine.token().get());
        let predecessor = answer
            .get(2)
            .map(|e| entry("enqueue", e))
            .transpose()?
            .flatten();
        if let Some(now) = answer.get(4).and_then(number) {
            self.inner.clock.told(now);
        }
        self.epoch_answered(answer.get(3), answer.get(4));
        Ok(Enqueued::new(mine, predecessor.is_none(), predecessor))
    }

    async fn find_entry(&self, queue: &str, tag: &str) -> Result<Option<Entry>> {
        let args = Args::new(self).arg(format!("{queue}/{tag}"));
        entry(
            "find_entry",
            &self.read_eval("find_entry", &SCRIPTS.find, args).await?,
        )
    }

    fn epochs(&self) -> Option<&StoreEpochs> {
        Some(&self.inner.epochs)
    }

    async fn abandon(&self, queue: &str, tag: &str, lease: LeaseId) -> Result<Option<Entry>> {
        // Every enqueue call this backend started so far has a stamp up to this one; the
        // latest deadline any of them can have is the one a call starting now would get.
        let args = Args::new(self)
            .arg(format!("{queue}/{tag}"))
            .arg(lease.get().to_string())
            .arg(self.inner.stamps.load(Ordering::SeqCst).to_string())
            .arg(self.call_deadline().to_string());
        entry(
            "abandon",
            &self.read_eval("abandon", &SCRIPTS.abandon, args).await?,
        )
    }

    async fn predecessor(&self, mine: &Entry) -> Result<Option<Entry>> {
        let (ahead, _) = self
            .ahead_impl_bytes(queue_of_bytes(mine.key_bytes()), mine, 1, None)
            .await?;
        Ok(ahead.into_iter().next())
    }

    async fn ahead(&self, queue: &str, mine: &Entry, limit: usize) -> Result<Vec<Entry>> {
        Ok(self.ahead_impl(queue, mine, limit, None).await?.0)
    }

    async fn ahead_and_read(
        &self,
        queue: &str,
        mine: &Entry,
        limit: usize,
        key: &str,
    ) -> Result<(Vec<Entry>, Option<Vec<u8>>)> {
        self.ahead_impl(queue, mine, limit, Some(key)).await
    }

    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        let topic = mailbox::gone_topic(entry.token().get(), entry.key_bytes());
        let waiter = self.inner.mailbox.waits().join(topic);
        loop {
            let woken = waiter.woken();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if waiter.fired() {
                return Ok(());
            }
            let args = Args::new(self)
                .arg(entry.key_bytes())
                .token(entry.token())
                .arg(self.inner.mailbox.id());
            let left = self
                .read_eval("wait_gone", &SCRIPTS.watch_gone, args)
                .await?;
            let left = number(&left).ok_or_else(|| malformed("wait_gone"))?;
            if left < 0 {
                return Ok(());
            }
            // Look again when the entry's lease would expire (its owner may have crashed; its
            // renewals push the deadline on), and at least every `recheck`.
            let recheck = Duration::from_millis(u64::try_from(left).unwrap_or(0))
                .max(Duration::from_millis(20))
                .min(self.inner.options.recheck);
            let _ = tokio::time::timeout(recheck, woken).await;
        }
    }

    async fn head(&self, queue: &str) -> Result<Option<Entry>> {
        Ok(self.oldest(queue, 1).await?.into_iter().next())
    }

    async fn entries(&self, queue: &str) -> Result<Vec<Entry>> {
        // Any count Redis takes as an integer; no queue is that long.
        self.oldest(queue, i32::MAX as usize).await
    }

    async fn init_store(&self) -> Result<bool> {
        let args = Args::new(self).arg(self.floor());
        let (answer, _) = self
            .eval("init_store", Kind::Write, &SCRIPTS.init, args)
            .await?;
        Ok(number(&answer) == Some(1))
    }

    async fn entries_under(&self, prefix: &str) -> Result<Vec<Entry>> {
        // Entry hashes are `P e:<key>`: SCAN them (an operator's listing, not a recipe's
        // path), then read each as `find_entry` does (a live lease, this epoch).
        let hashes = format!("{}e:", self.inner.options.prefix);
        let pattern = format!("{}{}*", glob_escape(&hashes), glob_escape(prefix));
        let mut cursor = 0u64;
        let mut found = Vec::new();
        loop {
            let pattern = pattern.as_str();
            let ((next, keys), _) = self
                .attempts("entries_under", Kind::Read, |mut conn| async move {
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(1000)
                        .query_async::<(u64, Vec<Vec<u8>>)>(&mut conn)
                        .await
                })
                .await?;
            for key in keys {
                let Some(key) = key.strip_prefix(hashes.as_bytes()) else {
                    continue;
                };
                let args = Args::new(self).arg(key);
                let answer = self.read_eval("entries_under", &SCRIPTS.find, args).await?;
                found.extend(entry("entries_under", &answer)?);
            }
            if next == 0 {
                return Ok(found);
            }
            cursor = next;
        }
    }

    async fn delete_entry(&self, entry: &Entry) -> Result<bool> {
        let args = Args::new(self).arg(entry.key_bytes()).token(entry.token());
        self.write_if_live("delete_entry", &SCRIPTS.delete, args)
            .await
    }

    async fn update_entry(&self, entry: &Entry, value: &[u8]) -> Result<bool> {
        let args = Args::new(self)
            .arg(entry.key_bytes())
            .token(entry.token())
            .arg(value);
        self.write_if_live("update_entry", &SCRIPTS.update, args)
            .await
    }

    async fn guarded(&self, entry: &Entry, ops: &[WriteOp]) -> Result<bool> {
        let mut args = Args::new(self).arg(entry.key_bytes()).token(entry.token());
        for op in ops {
            args = match op {
                WriteOp::Put { key, value } => args.arg("p").arg(key).arg(value),
                WriteOp::Delete { key } => args.arg("d").arg(key),
            };
        }
        self.write_if_live("guarded", &SCRIPTS.guarded, args).await
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let key = format!("{}k:{key}", self.inner.options.prefix);
        let (value, _) = self
            .attempts("read", Kind::Read, |mut conn| {
                let key = key.clone();
                async move {
                    redis::cmd("GET")
                        .arg(key)
                        .query_async::<Option<Vec<u8>>>(&mut conn)
                        .await
                }
            })
            .await?;
        Ok(value)
    }

    async fn swap(&self, key: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<bool> {
        let args = Args::new(self)
            .arg(key)
            .arg(if expected.is_some() { "1" } else { "0" })
            .arg(expected.unwrap_or_default())
            .arg(new);
        self.write_if_live("swap", &SCRIPTS.swap, args).await
    }

    async fn wait_value(&self, key: &str, seen: Option<&[u8]>) -> Result<Option<Vec<u8>>> {
        let waiter = self
            .inner
            .mailbox
            .waits()
            .join(mailbox::value_topic(key.as_bytes()));
        loop {
            let woken = waiter.woken();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let args = Args::new(self)
                .arg(key)
                .arg(if seen.is_some() { "1" } else { "0" })
                .arg(seen.unwrap_or_default())
                .arg(self.inner.mailbox.id());
            let answer = self
                .read_eval("wait_value", &SCRIPTS.watch_value, args)
                .await?;
            let answer = items(answer).ok_or_else(|| malformed("wait_value"))?;
            if answer.first().and_then(number) == Some(1) {
                return Ok(answer.get(1).and_then(bytes).map(<[u8]>::to_vec));
            }
            let _ = tokio::time::timeout(self.inner.options.recheck, woken).await;
        }
    }

    async fn lease_ttl(&self, lease: LeaseId) -> Result<Option<Duration>> {
        self.lease_ms("lease_ttl", &SCRIPTS.lease_ttl, lease).await
    }

    fn observe_head(&self, queue: &str) -> BoxStream<'static, Result<HeadEvent>> {
        let observer = Observer {
            backend: self.clone(),
            queue: queue.to_owned(),
            stream_key: format!("{}h:{queue}", self.inner.options.prefix),
            conn: None,
            last_id: None,
            reported: None,
            pending: VecDeque::new(),
            started: false,
            epoch: None,
            delay: None,
            backoff: Backoff::new(),
        };
        futures::stream::unfold(observer, |mut o| async move {
            let event = o.next_event().await;
            Some((event, o))
        })
        .boxed()
    }
}

/// How long one blocking read of an observer waits on the server before it looks again.
const OBSERVE_BLOCK: Duration = Duration::from_secs(5);

/// The state of one [`Backend::observe_head`] stream, driven by whoever polls it: the queue's
/// heads, read from the stream of heads the scripts append to while the queue is observed.
///
/// Each logged head names the one before it, so a gap (the stream trimmed while the consumer
/// was slow, or lost with a restarted server) is seen: the observer then reports
/// [`HeadEvent::Skipped`] and starts again from the current head.
struct Observer {
    backend: RedisBackend,
    queue: String,
    stream_key: String,
    /// The blocking connection of this observer (never shared: a blocking read dropped
    /// half-way would leave its connection unusable), with the generation of the primary it
    /// was made to.
    conn: Option<(MultiplexedConnection, u64)>,
    /// The id of the last head read: `None` means start over.
    last_id: Option<String>,
    /// The head last reported (token and value), to report each change once.
    reported: Option<Option<(u64, Vec<u8>)>>,
    pending: VecDeque<Result<HeadEvent>>,
    started: bool,
    /// The epoch of the server's state when the observer (re)started: a new one means the
    /// heads logged before may be gone or rolled back (see `epoch` in lib.lua).
    epoch: Option<u64>,
    delay: Option<Duration>,
    backoff: Backoff,
}

/// One logged head: its id, the id before it, and the entry (`None`: the queue was empty).
type LoggedHead = (String, String, Option<Entry>);

impl Observer {
    async fn next_event(&mut self) -> Result<HeadEvent> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return event;
            }
            if let Some(delay) = self.delay.take() {
                tokio::time::sleep(delay).await;
            }
            if let Err(e) = self.step().await {
                self.failed();
                return Err(e);
            }
        }
    }

    fn failed(&mut self) {
        self.conn = None;
        self.delay = Some(self.backoff.next_delay());
    }

    fn report(&mut self, head: Option<Entry>) {
        let now = head.as_ref().map(|h| (h.token().get(), h.value().to_vec()));
        if self.reported.as_ref() != Some(&now) {
            self.reported = Some(now);
            self.pending.push_back(Ok(HeadEvent::Head(head)));
        }
    }

    /// Starts over from the current head (reporting the gap if this is not the first start).
    async fn start(&mut self) -> Result<()> {
        let args = Args::new(&self.backend).arg(&self.queue).arg("1");
        let answer = self
            .backend
            .read_eval("observe", &SCRIPTS.observe, args)
            .await?;
        let (id, head, epoch) = logged(answer)?.ok_or_else(|| malformed("observe"))?;
        self.epoch = Some(epoch);
        if self.started {
            self.pending.push_back(Ok(HeadEvent::Skipped));
            self.reported = None;
        }
        self.started = true;
        self.last_id = Some(id);
        self.report(head);
        Ok(())
    }

    async fn step(&mut self) -> Result<()> {
        let Some(last_id) = self.last_id.clone() else {
            return self.start().await;
        };
        let primary = self.backend.inner.primary.current();
        if self
            .conn
            .as_ref()
            .is_some_and(|(_, generation)| *generation != primary.generation)
        {
            // Made to a primary the backend has left (a failover).
            self.conn = None;
        }
        let (conn, _) = match self.conn.as_mut() {
            Some(conn) => conn,
            None => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.backend.inner.options.connect_timeout))
                    .set_response_timeout(None);
                let conn = primary
                    .client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map_err(|e| redis_err("observe", e))?;
                self.conn.insert((conn, primary.generation))
            }
        };
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT")
            .arg(64)
            .arg("BLOCK")
            .arg(OBSERVE_BLOCK.as_millis().to_string())
            .arg("STREAMS")
            .arg(&self.stream_key)
            .arg(&last_id);
        let read = cmd.query_async::<Value>(conn);
        let limit = OBSERVE_BLOCK.saturating_add(self.backend.inner.options.request_timeout);
        let answer = tokio::time::timeout(limit, read)
            .await
            .map_err(|_elapsed| Error::Backend {
                op: "observe",
                source: NoAnswer::request(limit),
                at: Default::default(),
            })?
            .map_err(|e| redis_err("observe", e))?;
        self.backoff.reset();
        let heads = stream_heads(answer)?;
        for (id, previous, head) in heads {
            if previous != self.last_id.as_deref().unwrap_or_default() {
                // Trimmed or lost: what came between cannot be replayed.
                self.last_id = None;
                return Ok(());
            }
            self.last_id = Some(id);
            self.report(head);
        }
        // Keep the log alive while we observe; a log that is gone (a restarted server) means
        // starting over.
        let args = Args::new(&self.backend).arg(&self.queue).arg("0");
        let kept = self
            .backend
            .read_eval("observe", &SCRIPTS.observe, args)
            .await?;
        match logged(kept)? {
            Some((_, _, epoch)) if Some(epoch) == self.epoch => {}
            // Gone with a restarted server, or a new epoch: start over (reported as skipped).
            _ => self.last_id = None,
        }
        Ok(())
    }
}

/// The answer of the `observe` script: `{id, k, t, v, l, epoch}`, or `{}` when the log is
/// gone.
fn logged(answer: Value) -> Result<Option<(String, Option<Entry>, u64)>> {
    let fields = items(answer).ok_or_else(|| malformed("observe"))?;
    if fields.is_empty() {
        return Ok(None);
    }
    let text = |i: usize| fields.get(i).and_then(bytes).unwrap_or_default();
    let id = String::from_utf8_lossy(text(0)).into_owned();
    let epoch = fields
        .get(5)
        .and_then(number)
        .and_then(|e| u64::try_from(e).ok())
        .ok_or_else(|| malformed("observe"))?;
    Ok(Some((
        id,
        head_of(text(1), text(2), text(3), text(4))?,
        epoch,
    )))
}

fn head_of(key: &[u8], token: &[u8], value: &[u8], lease: &[u8]) -> Result<Option<Entry>> {
    if key.is_empty() {
        return Ok(None);
    }
    let parse = |b: &[u8]| std::str::from_utf8(b).ok()?.parse::<i64>().ok();
    let token = parse(token)
        .and_then(|t| u64::try_from(t).ok())
        .ok_or_else(|| malformed("observe"))?;
    Ok(Some(Entry::new(
        key,
        value,
        Position::new(token),
        FencingToken::new(token),
        parse(lease).map(LeaseId::new),
    )))
}

/// The heads in an `XREAD` answer: `[[stream, [[id, [field, value, ...]], ...]]]` or nil.
fn stream_heads(answer: Value) -> Result<Vec<LoggedHead>> {
    let bad = || malformed("observe");
    let Some(streams) = items(answer) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for stream in streams {
        let mut stream = items(stream).ok_or_else(bad)?.into_iter();
        let records = stream.nth(1).and_then(items).ok_or_else(bad)?;
        for record in records {
            let mut record = items(record).ok_or_else(bad)?.into_iter();
            let id = record.next().ok_or_else(bad)?;
            let id = String::from_utf8_lossy(bytes(&id).ok_or_else(bad)?).into_owned();
            let fields = record.next().and_then(items).ok_or_else(bad)?;
            let field = |name: &[u8]| {
                fields
                    .chunks(2)
                    .find(|kv| bytes(&kv[0]) == Some(name))
                    .and_then(|kv| kv.get(1))
                    .and_then(bytes)
                    .unwrap_or_default()
            };
            let head = head_of(field(b"k"), field(b"t"), field(b"v"), field(b"l"))?;
            out.push((id, String::from_utf8_lossy(field(b"p")).into_owned(), head));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_older_than_5_are_refused_by_name() {
        assert!(check_version("# Server\r\nredis_version:7.0.15\r\n").is_ok());
        assert!(check_version("redis_version:5.0.0").is_ok());
        let old = check_version("redis_version:4.0.14");
        assert!(
            matches!(&old, Err(Error::UnsupportedVersion { version, .. }) if version == "4.0.14"),
            "{old:?}"
        );
        assert!(check_version("no version here").is_err());
    }

    #[test]
    fn urls_lose_their_password_in_messages() {
        assert_eq!(
            crate::connect::redacted("redis://app:secret@127.0.0.1:6379/0"),
            "redis://***@127.0.0.1:6379/0"
        );
        assert_eq!(
            crate::connect::redacted("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
    }

    #[test]
    fn entries_decode_from_script_answers() {
        let answer = Value::Array(vec![
            Value::BulkString(b"q/a".to_vec()),
            Value::BulkString(b"v".to_vec()),
            Value::BulkString(b"1763913808123456".to_vec()),
            Value::BulkString(b"17".to_vec()),
        ]);
        let e = entry("t", &answer).unwrap().unwrap();
        assert_eq!(e.token(), FencingToken::new(1_763_913_808_123_456));
        assert_eq!(e.lease(), Some(LeaseId::new(17)));
        assert_eq!(entry("t", &Value::Nil).unwrap(), None);
        assert!(entry("t", &Value::Array(vec![])).is_err());
    }
}
