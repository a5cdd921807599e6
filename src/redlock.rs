//! Redlock (feature `redlock`): a lock over several independent Redis masters, for
//! **efficiency only**. It owns the algorithm, the per-node connections and the guard.
//!
//! <div class="warning">
//!
//! **Not fenced, not FIFO, not for correctness.** A [`RedlockGuard`] carries no fencing token,
//! and waiters are not queued: whoever retries at the right moment wins. Use Redlock to avoid
//! doing the same work twice (two cron hosts sending the same report, two workers rebuilding
//! the same cache entry), where an occasional duplicate costs time or money but corrupts
//! nothing.
//!
//! Why not for correctness: the lock is a lease measured by clocks. A holder that pauses (a
//! GC pause, swapping, a VM migration, `SIGSTOP`) past its validity, or whose Redis servers'
//! clocks jump forward and expire its keys early, still believes it holds the lock while
//! another client holds it too. Nothing the holder checks before it writes closes that window
//! (it can pause between the check and the write), and with no token the resource it writes
//! to cannot tell the stale holder from the new one. This is Martin Kleppmann's critique
//! ("How to do distributed locking", 2016); `docs/redlock.md` has it in full, with Salvatore
//! Sanfilippo's reply.
//!
//! **For correctness** use [`Mutex`](crate::Mutex) (on `RedisBackend` with feature `redis`,
//! or on etcd) and hand its [`FencingToken`](crate::FencingToken) to a [`Fence`](crate::Fence)
//! or to any store that refuses lower tokens: a paused holder's late write is then refused,
//! whatever the timing (`docs/fencing.md`).
//!
//! </div>
//!
//! # The algorithm, as implemented
//! For `N` independent servers (no replication between them) and quorum `N/2 + 1`:
//!
//! 1. Take a random 20-byte owner value (40 hex characters), one per [`Redlock::lock`] call,
//!    and note the local monotonic time `t0`.
//! 2. Send `SET <prefix><resource> <value> NX PX <ttl>` to every node at once, each request
//!    (connecting included) bounded by the per-node timeout.
//! 3. The lock is held if at least a quorum of nodes answered `OK` and the validity
//!    `ttl - (now - t0) - (ttl * drift_factor + 2 ms)` is still positive.
//! 4. Otherwise release on **every** node (not only those that said `OK`: a `SET` whose answer
//!    was lost may have been applied), wait `retry_delay ± retry_jitter`, and try again, up to
//!    `retry_count` more times; then fail with [`Error::Locked`].
//!
//! Release is a compare-and-delete script (`DEL` only if the key still holds our value) sent
//! to every node; extension is a compare-and-`PEXPIRE` script with the same quorum and
//! validity rule. The key layout is the one the Redlock description uses (the resource name
//! is the key, a random value, `SET NX PX`, compare-and-delete), so with the default empty
//! prefix another client following it that locks the same resource name excludes baton and is
//! excluded by it.
//!
//! **Not a [`Backend`](crate::Backend).** Redlock has no revisions and no ordered queue: the
//! recipes (semaphore, election, read-write lock) and fencing do not apply to it.
//!
//! # Example
//! ```no_run
//! # async fn example() -> baton::Result<()> {
//! use std::time::Duration;
//! use baton::redlock::{Redlock, RedlockOptions};
//!
//! let nodes = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"];
//! let redlock = Redlock::connect(&nodes, RedlockOptions::new().with_ttl(Duration::from_secs(30))).await?;
//!
//! let guard = redlock.lock("reports/daily").await?;
//! // Efficiency only: at worst, a paused holder and its successor both send the report.
//! if guard.validity() > Duration::from_secs(5) {
//!     // ... send the daily report ...
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard as StdMutexGuard, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError, Value};
use sync_wrapper::SyncFuture;
use tokio::sync::Notify;
use tracing::Instrument;

use crate::backend::redis::tls::{self, Probe, TlsFiles};
use crate::error::{BoxError, Error, Result};

/// Deletes the key only if it still holds our value: never a successor's key.
const RELEASE_SCRIPT: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     return redis.call('DEL', KEYS[1]) else return 0 end";

/// Moves the key's expiry only if it still holds our value.
const EXTEND_SCRIPT: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";

/// The fixed part of the clock drift allowance (the reference implementation's 2 ms).
const DRIFT_FIXED: Duration = Duration::from_millis(2);

/// Options for [`Redlock::connect`].
///
/// Defaults follow the reference implementations: TTL 10 s, 3 retries 200 ms ± 100 ms apart,
/// clock drift factor 0.01 (plus 2 ms), per-node timeout 50 ms, connect timeout 1 s, no key
/// prefix.
///
/// ```
/// # use std::time::Duration;
/// let options = baton::redlock::RedlockOptions::new()
///     .with_ttl(Duration::from_secs(30))
///     .with_retry_count(10)
///     .with_prefix("locks:");
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct RedlockOptions {
    ttl: Duration,
    retry_count: u32,
    retry_delay: Duration,
    retry_jitter: Duration,
    drift_factor: f64,
    node_timeout: Duration,
    connect_timeout: Duration,
    prefix: String,
    tls: TlsFiles,
}

impl Default for RedlockOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl RedlockOptions {
    /// The defaults: see the type's documentation.
    pub fn new() -> Self {
        RedlockOptions {
            ttl: Duration::from_secs(10),
            retry_count: 3,
            retry_delay: Duration::from_millis(200),
            retry_jitter: Duration::from_millis(100),
            drift_factor: 0.01,
            node_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            prefix: String::new(),
            tls: TlsFiles::default(),
        }
    }

    /// Trusts the CA certificates in `pem` (one or more, PEM-encoded: redis-cli's `--cacert`
    /// file) for every node's certificate, instead of the system's roots. For `rediss://`
    /// URLs (TLS); a `redis://` URL with TLS options is refused. The nodes' certificates must
    /// name their URLs' hosts.
    ///
    /// Checked at connect: a bundle with no certificate, or one that does not parse, is
    /// [`Error::InvalidArgument`].
    pub fn with_ca_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(pem.into());
        self
    }

    /// Presents the client certificate `cert_pem` (a PEM certificate, or a chain with the
    /// client's certificate first) with its private key `key_pem` (PEM) to every node that
    /// asks for one (`tls-auth-clients yes`). For `rediss://` URLs.
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

    /// How long the keys live on the servers (`PX`), and so the most a lock is held without
    /// [`RedlockGuard::extend`] (default 10 s). The guard's
    /// [`validity`](RedlockGuard::validity) is shorter: the TTL less the time the acquisition
    /// took and the clock drift allowance.
    ///
    /// ## Warning
    /// A TTL shorter than the work lets the lock lapse while the work goes on, and another
    /// client then does the same work. Check [`validity`](RedlockGuard::validity) and extend
    /// well before it runs out.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How many more rounds [`Redlock::lock`] tries after the first fails (default 3).
    /// [`Redlock::try_lock`] always tries one round.
    pub fn with_retry_count(mut self, retries: u32) -> Self {
        self.retry_count = retries;
        self
    }

    /// The mean pause between two rounds of [`Redlock::lock`] (default 200 ms).
    pub fn with_retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// How far a pause between rounds may stray from the retry delay, either way, chosen at
    /// random each time (default 100 ms). Jitter keeps contenders that failed together from
    /// trying again together and splitting the nodes among themselves.
    pub fn with_retry_jitter(mut self, jitter: Duration) -> Self {
        self.retry_jitter = jitter;
        self
    }

    /// The clock drift allowance as a fraction of the TTL (default 0.01, at least 0 and below
    /// 1); 2 ms are always added. It covers the servers' clocks running faster than ours
    /// during the lock: their keys expire early by that much.
    ///
    /// ## Warning
    /// It covers drift, not jumps: a server clock stepped forward (an operator, an NTP step)
    /// expires keys early by any amount.
    pub fn with_drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// The limit for one request to one node, connecting included (default 50 ms). A node
    /// that does not answer in time counts as failed for that round; a round takes no longer
    /// than this, however many nodes hang. Keep it far below the TTL: it is spent from the
    /// validity when a node hangs.
    ///
    /// The `redis` crate's own response timeout (500 ms by default) is turned off: this limit
    /// replaces it.
    pub fn with_node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// The limit for opening a connection to a node (default 1 s), at
    /// [`connect`](Redlock::connect) and when a lost connection is opened again in the
    /// background.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// What goes before the resource name in the key (default: nothing, as in the reference
    /// implementations, so that other Redlock clients locking the same name share the lock).
    /// Clients that share locks must use the same prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Refuses a combination that could never hold a lock, before anything is sent.
    fn validate(&self) -> Result<()> {
        if !(self.drift_factor.is_finite() && (0.0..1.0).contains(&self.drift_factor)) {
            return Err(Error::InvalidArgument(
                "the clock drift factor must be at least 0 and below 1",
            ));
        }
        if self.node_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "the per-node and connect timeouts must be positive",
            ));
        }
        check_ttl(self.ttl, self)
    }

    /// The drift allowance for `ttl`.
    fn drift(&self, ttl: Duration) -> Duration {
        drift(ttl, self.drift_factor)
    }
}

/// Refuses a TTL that Redis cannot take, or that leaves no validity after the slowest round.
fn check_ttl(ttl: Duration, options: &RedlockOptions) -> Result<()> {
    if ttl.as_millis() == 0 || i64::try_from(ttl.as_millis()).is_err() {
        return Err(Error::InvalidArgument(
            "the TTL must be at least one millisecond, and fit Redis's PX",
        ));
    }
    if Instant::now().checked_add(ttl).is_none() {
        return Err(Error::InvalidArgument("the TTL is too long"));
    }
    if ttl <= options.node_timeout + options.drift(ttl) {
        return Err(Error::InvalidArgument(
            "the TTL must be longer than the per-node timeout plus the clock drift allowance",
        ));
    }
    Ok(())
}

/// `ttl * factor + 2 ms`, the reference implementation's drift allowance.
fn drift(ttl: Duration, factor: f64) -> Duration {
    ttl.mul_f64(factor) + DRIFT_FIXED
}

/// The quorum of `n` nodes: a strict majority.
fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// What is left of a lock taken (or extended) with `ttl` by a round that took `elapsed`:
/// `ttl - elapsed - drift`, or `None` when nothing is left.
fn validity(ttl: Duration, elapsed: Duration, drift: Duration) -> Option<Duration> {
    ttl.checked_sub(elapsed)?
        .checked_sub(drift)
        .filter(|v| !v.is_zero())
}

/// 64 bits that differ between calls, processes and hosts. Built from std alone: a
/// [`RandomState`] is keyed from the operating system's randomness (once per thread, then
/// varied per instance), and the counter, process id, thread and clocks make each input
/// distinct. Uniqueness is what matters here, not unpredictability: this is no source of
/// cryptographic randomness.
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    COUNTER.fetch_add(1, Ordering::Relaxed).hash(&mut hasher);
    std::process::id().hash(&mut hasher);
    std::thread::current().id().hash(&mut hasher);
    std::time::SystemTime::now().hash(&mut hasher);
    Instant::now().hash(&mut hasher);
    hasher.finish()
}

/// A fresh owner value: 20 random bytes as 40 lowercase hex characters.
fn owner_value() -> String {
    let mut bytes = [0_u8; 20];
    for chunk in bytes.chunks_mut(8) {
        let random = random_u64().to_le_bytes();
        chunk.copy_from_slice(&random[..chunk.len()]);
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `delay ± jitter`, uniformly at random.
fn jittered(delay: Duration, jitter: Duration) -> Duration {
    let low = delay.saturating_sub(jitter);
    let span = (delay + jitter - low).as_nanos();
    let offset = u128::from(random_u64()) % (span + 1);
    low + Duration::from_nanos(u64::try_from(offset).unwrap_or(u64::MAX))
}

/// Why one request to one node failed.
#[derive(Debug)]
enum Cause {
    /// No answer within the per-node timeout: the request may have been applied.
    Timeout(Duration),
    /// The node answered with an error, or the connection broke.
    Redis(RedisError),
    /// No connection could be opened (the last attempt's error, if it ended).
    NotConnected(Option<Arc<dyn StdError + Send + Sync>>),
    /// An answer of a shape the command never gives.
    Unexpected(Value),
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Timeout(limit) => write!(f, "no answer within {limit:?}"),
            Cause::Redis(e) => write!(f, "{e}"),
            Cause::NotConnected(Some(e)) => write!(f, "not connected: {e}"),
            Cause::NotConnected(None) => f.write_str("not connected"),
            Cause::Unexpected(v) => write!(f, "unexpected answer {v:?}"),
        }
    }
}

impl StdError for Cause {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Cause::Redis(e) => Some(e),
            Cause::NotConnected(Some(e)) => Some(e.as_ref()),
            _ => None,
        }
    }
}

/// The nodes that failed in a round, each with its cause: the `source` of the errors that
/// say a quorum could not be reached.
#[derive(Debug)]
struct NodeFailures {
    nodes: usize,
    failures: Vec<(String, Cause)>,
}

impl fmt::Display for NodeFailures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} of {} nodes failed", self.failures.len(), self.nodes)?;
        for (i, (endpoint, cause)) in self.failures.iter().enumerate() {
            write!(f, "{} {endpoint}: {cause}", if i == 0 { ":" } else { ";" })?;
        }
        Ok(())
    }
}

impl StdError for NodeFailures {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.failures
            .first()
            .map(|(_, c)| c as &(dyn StdError + 'static))
    }
}

/// The connection state of one node.
#[derive(Default)]
struct NodeState {
    /// The connection and its generation (so that only the broken one is forgotten).
    conn: Option<(u64, MultiplexedConnection)>,
    generation: u64,
    connecting: bool,
    /// Since when the connection has answered nothing but timeouts.
    silent_since: Option<Instant>,
    last_error: Option<Arc<dyn StdError + Send + Sync>>,
}

/// One Redis master: one multiplexed connection, opened again in the background when lost.
struct Node {
    endpoint: String,
    client: redis::Client,
    /// What a failed connection hides (a refused client certificate), for the connect error.
    probe: Probe,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    /// A connection that has answered nothing for this long is replaced.
    replace_after: Duration,
    state: StdMutex<NodeState>,
    /// Fired when a connection attempt ends.
    attempted: Notify,
}

/// Ends a connection attempt even if its task is dropped (a runtime shutting down), so that a
/// later request starts another.
struct Attempt(Arc<Node>);

impl Drop for Attempt {
    fn drop(&mut self) {
        self.0.state().connecting = false;
        self.0.attempted.notify_waiters();
    }
}

impl Node {
    fn state(&self) -> StdMutexGuard<'_, NodeState> {
        // The state is consistent at every unlock: a panic elsewhere cannot break it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The node's connection, opened (in a task of its own, bounded by the connect timeout)
    /// if there is none. Callers bound the wait.
    async fn connection(self: &Arc<Self>) -> Result<(u64, MultiplexedConnection), Cause> {
        let attempted = self.attempted.notified();
        tokio::pin!(attempted);
        attempted.as_mut().enable();
        {
            let mut state = self.state();
            if let Some(conn) = &state.conn {
                return Ok(conn.clone());
            }
            if !state.connecting {
                state.connecting = true;
                // A task of its own: a slow handshake that outlives this request's timeout
                // still completes, for the next round.
                tokio::spawn(Arc::clone(self).open());
            }
        }
        attempted.await;
        let state = self.state();
        match &state.conn {
            Some(conn) => Ok(conn.clone()),
            None => Err(Cause::NotConnected(state.last_error.clone())),
        }
    }

    async fn open(self: Arc<Self>) {
        let attempt = Attempt(Arc::clone(&self));
        let opened = tokio::time::timeout(
            self.connect_timeout,
            self.client
                .get_multiplexed_async_connection_with_config(&self.config),
        )
        .await;
        let mut state = self.state();
        match opened {
            Ok(Ok(conn)) => {
                state.generation += 1;
                state.conn = Some((state.generation, conn));
                state.silent_since = None;
                state.last_error = None;
            }
            Ok(Err(e)) => {
                tracing::debug!(endpoint = %self.endpoint, error = %e, "redlock: cannot connect");
                state.last_error = Some(Arc::new(e));
            }
            Err(elapsed) => {
                tracing::debug!(endpoint = %self.endpoint, "redlock: connecting timed out");
                state.last_error = Some(Arc::new(elapsed));
            }
        }
        drop(state);
        drop(attempt);
    }

    /// Sends `cmd`, connecting first if need be, all within `limit`.
    async fn query(
        self: &Arc<Self>,
        op: &'static str,
        cmd: &redis::Cmd,
        limit: Duration,
    ) -> Result<Value, Cause> {
        let deadline = tokio::time::Instant::now() + limit;
        let answer = match tokio::time::timeout_at(deadline, self.connection()).await {
            Err(_) => Err(Cause::Timeout(limit)),
            Ok(Err(cause)) => Err(cause),
            Ok(Ok((generation, mut conn))) => {
                match tokio::time::timeout_at(deadline, cmd.query_async::<Value>(&mut conn)).await {
                    Ok(Ok(value)) => {
                        self.answered();
                        Ok(value)
                    }
                    Ok(Err(e)) => {
                        if e.is_unrecoverable_error()
                            || e.is_io_error()
                            || e.is_connection_dropped()
                        {
                            self.forget(generation);
                        } else {
                            self.answered();
                        }
                        Err(Cause::Redis(e))
                    }
                    Err(_) => {
                        self.silent(generation);
                        Err(Cause::Timeout(limit))
                    }
                }
            }
        };
        if let Err(cause) = &answer {
            tracing::debug!(op, endpoint = %self.endpoint, error = %cause, "redlock: node request failed");
        }
        answer
    }

    fn answered(&self) {
        self.state().silent_since = None;
    }

    fn forget(&self, generation: u64) {
        let mut state = self.state();
        if state.conn.as_ref().is_some_and(|(g, _)| *g == generation) {
            state.conn = None;
            state.silent_since = None;
        }
    }

    /// A request timed out. The connection is kept: a request it carries but the node has not
    /// answered yet (a hung or paused server) is followed, on the same connection and so in
    /// order, by the release sent after it, which undoes a late `SET`. Only a connection
    /// silent for longer than a TTL is replaced: whatever it still carries would expire by
    /// itself.
    fn silent(&self, generation: u64) {
        let mut state = self.state();
        if state.conn.as_ref().is_none_or(|(g, _)| *g != generation) {
            return;
        }
        let since = *state.silent_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= self.replace_after {
            tracing::debug!(endpoint = %self.endpoint, "redlock: replacing a silent connection");
            state.conn = None;
            state.silent_since = None;
        }
    }
}

/// How the nodes answered one round.
#[derive(Debug, Default)]
struct Round {
    /// Nodes that did what was asked (set, extended, deleted).
    yes: usize,
    /// Nodes that answered but refused (the key held by another value, or gone).
    no: usize,
    failures: Vec<(String, Cause)>,
}

/// Decides, from a round's answers, whether a lock was taken or extended.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// A quorum, with this much validity left.
    Held(Duration),
    /// Enough nodes answered for a quorum, but too few for us.
    Refused,
    /// Too many nodes failed for a quorum to be possible.
    Unreachable,
    /// A quorum, but the round took the whole validity.
    TooSlow,
}

fn verdict(nodes: usize, yes: usize, failed: usize, validity: Option<Duration>) -> Verdict {
    let quorum = quorum(nodes);
    if yes >= quorum {
        match validity {
            Some(v) => Verdict::Held(v),
            None => Verdict::TooSlow,
        }
    } else if nodes - failed < quorum {
        Verdict::Unreachable
    } else {
        Verdict::Refused
    }
}

/// What an unlock learned: the lock was ours to the end, it was not, or nodes failed so
/// that no one can tell.
#[derive(Debug, PartialEq, Eq)]
enum Released {
    Owned,
    NotOwned,
    Unknown,
}

fn released(nodes: usize, deleted: usize, failed: usize) -> Released {
    let quorum = quorum(nodes);
    if deleted >= quorum {
        Released::Owned
    } else if deleted + failed < quorum {
        Released::NotOwned
    } else {
        Released::Unknown
    }
}

struct Inner {
    nodes: Vec<Arc<Node>>,
    options: RedlockOptions,
}

impl Inner {
    fn quorum(&self) -> usize {
        quorum(self.nodes.len())
    }

    /// Sends `cmd` to every node at once. `yes` is what an answer that did the work looks
    /// like; `no` what a refusal looks like; anything else is a failure.
    async fn round(
        &self,
        op: &'static str,
        cmd: &redis::Cmd,
        yes: fn(&Value) -> Option<bool>,
    ) -> Round {
        let limit = self.options.node_timeout;
        let answers =
            futures::future::join_all(self.nodes.iter().map(|n| n.query(op, cmd, limit))).await;
        let mut round = Round::default();
        for (node, answer) in self.nodes.iter().zip(answers) {
            match answer.map(|v| (yes(&v), v)) {
                Ok((Some(true), _)) => round.yes += 1,
                Ok((Some(false), _)) => round.no += 1,
                Ok((None, v)) => round
                    .failures
                    .push((node.endpoint.clone(), Cause::Unexpected(v))),
                Err(cause) => round.failures.push((node.endpoint.clone(), cause)),
            }
        }
        round
    }

    fn failures(&self, failures: Vec<(String, Cause)>) -> BoxError {
        Box::new(NodeFailures {
            nodes: self.nodes.len(),
            failures,
        })
    }

    /// The compare-and-delete on every node.
    async fn release(&self, key: &str, value: &str) -> Round {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(RELEASE_SCRIPT).arg(1).arg(key).arg(value);
        self.round("release", &cmd, |v| match v {
            Value::Int(1) => Some(true),
            Value::Int(0) => Some(false),
            _ => None,
        })
        .await
    }
}

/// A handle on the nodes of one Redlock: lock resources through it. Clones share the
/// connections.
///
/// See the [module documentation](self) for the algorithm and, first, for what Redlock does
/// **not** promise.
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redlock")
            .field("endpoints", &self.endpoints())
            .field("quorum", &self.quorum())
            .field("options", &self.inner.options)
            .finish()
    }
}

impl Redlock {
    /// Prepares a Redlock over the independent Redis masters at `urls`
    /// (`redis://[user:password@]host:port[/db]`, or `rediss://` over TLS with
    /// [`RedlockOptions::with_ca_cert`] and [`RedlockOptions::with_client_cert`], or the
    /// system's roots without a CA) and opens one multiplexed connection to each, all at once.
    ///
    /// Use at least three nodes (an odd number: four tolerate no more failures than three);
    /// with fewer, a single node failure stops every lock, and a warning is logged. Each node
    /// must be its own server, on its own host, with no replication between them: a replica
    /// promoted after a failover may have missed a key and grant the lock twice. A server
    /// restarted without its data should stay down for a TTL first.
    ///
    /// Nodes that cannot be reached now are tried again at each use. A node whose eviction
    /// policy could drop lock keys (any policy but `noeviction`, when `maxmemory` is set) is
    /// accepted with a warning.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no URL, TLS options with a `redis://` URL, a CA or
    /// client certificate that does not parse, a server named twice (two URLs with the same
    /// host and port, or two URLs whose servers answer with the same `run_id`: one server
    /// behind two names), or options that could never hold a lock (a TTL not longer than the
    /// per-node timeout plus the drift allowance, a drift factor outside `[0, 1)`);
    /// [`Error::Connect`] for a malformed URL, or when fewer than a quorum of nodes answered
    /// within the connect timeout (its source names each failure); when that is for a TLS
    /// refusal, [`Error::Misconfigured`] (a node's certificate not trusted, or issued for
    /// another host) or [`Error::Auth`] (a node refused the client certificate), as
    /// [`RedisBackend::connect`](crate::RedisBackend::connect) says them.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is written to the servers.
    pub fn connect(
        urls: &[impl AsRef<str>],
        options: RedlockOptions,
    ) -> impl Future<Output = Result<Redlock>> + Send + Sync + 'static {
        let prepared = prepare(urls, &options);
        SyncFuture::new(async move { Redlock::open(prepared?, options).await })
    }

    async fn open(nodes: Vec<Arc<Node>>, options: RedlockOptions) -> Result<Redlock> {
        if nodes.len() < 3 {
            tracing::warn!(
                nodes = nodes.len(),
                "Redlock on fewer than three nodes: one node failure stops every lock"
            );
        }
        let limit = options.connect_timeout + options.node_timeout;
        let opened = futures::future::join_all(nodes.iter().map(|node| async move {
            match tokio::time::timeout(limit, node.connection()).await {
                Ok(Ok((_, mut conn))) => {
                    check_eviction(node, &mut conn, limit).await;
                    Ok(run_id(&mut conn, limit).await)
                }
                Ok(Err(cause)) => Err((node.endpoint.clone(), cause)),
                Err(_) => Err((node.endpoint.clone(), Cause::Timeout(limit))),
            }
        }))
        .await;
        // Two URLs can name one server in ways their text does not show (127.0.0.1 and
        // localhost, a DNS alias, a proxy): one server would then count twice towards the
        // quorum. Tell servers apart by the id each process reports.
        let mut ids = std::collections::HashSet::new();
        for id in opened.iter().flatten().flatten() {
            if !ids.insert(id.clone()) {
                return Err(Error::InvalidArgument(
                    "two Redlock nodes are the same Redis server (the same run_id answered on both): each node must be its own server",
                ));
            }
        }
        let failures: Vec<(String, Cause)> = opened.into_iter().filter_map(Result::err).collect();
        let inner = Inner { nodes, options };
        if inner.nodes.len() - failures.len() < inner.quorum() {
            if let Some(refused) = tls_refusal(&inner.nodes, &failures).await {
                return Err(refused);
            }
            return Err(Error::Connect {
                endpoints: inner.nodes.iter().map(|n| n.endpoint.clone()).collect(),
                source: inner.failures(failures),
            });
        }
        Ok(Redlock {
            inner: Arc::new(inner),
        })
    }

    /// How many nodes must agree for a lock to be held: a strict majority, `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        self.inner.quorum()
    }

    /// The nodes' addresses (`host:port`, no credentials), in the order given to
    /// [`connect`](Self::connect).
    pub fn endpoints(&self) -> Vec<String> {
        self.inner
            .nodes
            .iter()
            .map(|n| n.endpoint.clone())
            .collect()
    }

    /// Takes the lock on `resource`, trying up to `1 + retry_count` rounds, `retry_delay ±
    /// retry_jitter` apart. Not FIFO: a contender that arrives later may win.
    ///
    /// Every failed round releases on every node before the next, so a failed `lock` leaves
    /// no key behind on the nodes that answered; a key on a node that did not answer (and
    /// the release that follows it may be lost too) expires after the TTL.
    ///
    /// # Errors
    /// [`Error::Locked`] when another client held the lock through every round;
    /// [`Error::Backend`] when, in the last round, too many nodes failed for a quorum (its
    /// source names each node and why), or the round took longer than the TTL less the drift
    /// allowance; [`Error::InvalidArgument`] for an empty resource name.
    ///
    /// # Cancel safety
    /// Dropping the future mid-round leaves keys with our value on some nodes. A release on
    /// every node is then spawned on the current tokio runtime; if it cannot run (no
    /// runtime, or the runtime is shutting down) or a node does not answer it, the keys
    /// expire after the TTL, blocking that resource on those nodes until then.
    pub fn lock<'a>(
        &'a self,
        resource: &'a str,
    ) -> impl Future<Output = Result<RedlockGuard>> + Send + Sync + 'a {
        let span = tracing::debug_span!("redlock.lock", resource);
        SyncFuture::new(
            self.acquire(resource, self.inner.options.retry_count)
                .instrument(span),
        )
    }

    /// One round of [`lock`](Self::lock): takes the lock if a quorum is free now.
    ///
    /// # Errors
    /// [`Error::Locked`] if another client holds the lock on enough nodes (nothing is left
    /// behind on the nodes that answered); otherwise as [`lock`](Self::lock).
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    pub fn try_lock<'a>(
        &'a self,
        resource: &'a str,
    ) -> impl Future<Output = Result<RedlockGuard>> + Send + Sync + 'a {
        let span = tracing::debug_span!("redlock.try_lock", resource);
        SyncFuture::new(self.acquire(resource, 0).instrument(span))
    }

    async fn acquire(&self, resource: &str, retries: u32) -> Result<RedlockGuard> {
        if resource.is_empty() {
            return Err(Error::InvalidArgument(
                "the resource name must not be empty",
            ));
        }
        let options = &self.inner.options;
        let ttl = options.ttl;
        let drift = options.drift(ttl);
        let mut claim = Claim {
            inner: Arc::clone(&self.inner),
            key: format!("{}{resource}", options.prefix),
            value: owner_value(),
            armed: true,
        };
        let mut cmd = redis::cmd("SET");
        cmd.arg(&claim.key)
            .arg(&claim.value)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis().to_string());
        let mut attempt = 0;
        loop {
            let started = Instant::now();
            let round = self
                .inner
                .round("lock", &cmd, |v| match v {
                    Value::Okay => Some(true),
                    Value::SimpleString(s) if s == "OK" => Some(true),
                    Value::Nil => Some(false),
                    _ => None,
                })
                .await;
            let ended = Instant::now();
            let elapsed = ended - started;
            let nodes = self.inner.nodes.len();
            let failed = round.failures.len();
            let verdict = verdict(nodes, round.yes, failed, validity(ttl, elapsed, drift));
            tracing::debug!(
                attempt,
                yes = round.yes,
                no = round.no,
                failed,
                ?elapsed,
                ?verdict,
                "redlock: round"
            );
            if let Verdict::Held(left) = verdict {
                return Ok(RedlockGuard {
                    resource: resource.to_owned(),
                    valid_until: ended.checked_add(left).unwrap_or(ended),
                    claim,
                });
            }
            // A SET whose answer was lost may have been applied: release everywhere.
            claim.release().await;
            if attempt >= retries {
                claim.armed = false;
                return Err(match verdict {
                    Verdict::Refused | Verdict::Held(_) => Error::Locked {
                        name: resource.to_owned(),
                    },
                    Verdict::Unreachable => Error::Backend {
                        op: "redlock lock",
                        source: self.inner.failures(round.failures),
                        at: Default::default(),
                    },
                    Verdict::TooSlow => Error::Backend {
                        op: "redlock lock",
                        at: Default::default(),
                        source: format!(
                            "the round took {elapsed:?}: no validity left of a {ttl:?} TTL"
                        )
                        .into(),
                    },
                });
            }
            attempt += 1;
            tokio::time::sleep(jittered(options.retry_delay, options.retry_jitter)).await;
        }
    }
}

/// Parses the URLs and checks the options: everything [`Redlock::connect`] can refuse before
/// it sends anything.
fn prepare(urls: &[impl AsRef<str>], options: &RedlockOptions) -> Result<Vec<Arc<Node>>> {
    options.validate()?;
    if urls.is_empty() {
        return Err(Error::InvalidArgument(
            "Redlock needs at least one Redis node (three or more independent ones)",
        ));
    }
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        // Every request is bounded by the per-node timeout instead (`Node::query`).
        .set_response_timeout(None);
    let mut nodes: Vec<Arc<Node>> = Vec::with_capacity(urls.len());
    for url in urls {
        let url = url.as_ref();
        // `rediss://` with the options' CA and client certificate, as `RedisBackend`.
        let (client, probe) = tls::client(url, &options.tls)?;
        let endpoint = client.get_connection_info().addr().to_string();
        if nodes.iter().any(|n| n.endpoint == endpoint) {
            return Err(Error::InvalidArgument(
                "a Redis server is named twice: each Redlock node must be its own server",
            ));
        }
        nodes.push(Arc::new(Node {
            endpoint,
            client,
            probe,
            config: config.clone(),
            connect_timeout: options.connect_timeout,
            replace_after: options.ttl,
            state: StdMutex::new(NodeState::default()),
            attempted: Notify::new(),
        }));
    }
    Ok(nodes)
}

/// A TLS refusal among `failures` (in a cause, or found by a handshake of our own: a client
/// certificate refused after the handshake looks like a reset to the connection): the error
/// that says what to change, as `RedisBackend::connect` gives it.
async fn tls_refusal(nodes: &[Arc<Node>], failures: &[(String, Cause)]) -> Option<Error> {
    for (endpoint, cause) in failures {
        if let Some(refused) = tls::refused(cause) {
            return Some(refused.misconfigured(vec![endpoint.clone()]));
        }
    }
    for (endpoint, _) in failures {
        if let Some(node) = nodes.iter().find(|n| &n.endpoint == endpoint)
            && node.probe.is_tls()
            && let Some(refused) = node.probe.after_failure(tls::PROBE_LIMIT).await
        {
            return Some(refused.misconfigured(vec![endpoint.clone()]));
        }
    }
    None
}

/// The id of the server process behind `conn` (`run_id` in `INFO server`), if it tells.
async fn run_id(conn: &mut MultiplexedConnection, limit: Duration) -> Option<String> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("server");
    let info = tokio::time::timeout(limit, cmd.query_async::<String>(conn))
        .await
        .ok()?
        .ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .map(|id| id.trim().to_owned())
}

/// Reads the node's eviction settings and warns when they could drop lock keys. Best effort:
/// a server that hides `CONFIG` is trusted.
async fn check_eviction(node: &Node, conn: &mut MultiplexedConnection, limit: Duration) {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory*");
    let Ok(Ok(settings)) = tokio::time::timeout(limit, cmd.query_async::<Vec<String>>(conn)).await
    else {
        return;
    };
    let get = |name: &str| {
        settings
            .chunks(2)
            .find(|kv| kv[0] == name)
            .and_then(|kv| kv.get(1))
            .map(String::as_str)
    };
    let limited = get("maxmemory").is_some_and(|m| m != "0");
    if let Some(policy) = get("maxmemory-policy")
        && limited
        && policy != "noeviction"
    {
        tracing::warn!(endpoint = %node.endpoint, policy, "this Redis may evict Redlock keys under memory pressure; use noeviction");
    }
}

/// Keys with our value that may exist on the nodes. Releases them on every node in the
/// background when dropped while armed.
struct Claim {
    inner: Arc<Inner>,
    key: String,
    value: String,
    armed: bool,
}

impl Claim {
    async fn release(&self) -> Round {
        self.inner.release(&self.key, &self.value).await
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let inner = Arc::clone(&self.inner);
                let key = std::mem::take(&mut self.key);
                let value = std::mem::take(&mut self.value);
                runtime.spawn(async move {
                    let round = inner.release(&key, &value).await;
                    tracing::debug!(
                        key,
                        deleted = round.yes,
                        failed = round.failures.len(),
                        "redlock: released on drop"
                    );
                });
            }
            Err(_) => {
                tracing::debug!(key = %self.key, "redlock: dropped outside a runtime; the keys expire by themselves");
            }
        }
    }
}

/// A Redlock held on a resource. **No fencing token, not FIFO**: see the
/// [module documentation](self).
///
/// The lock is believed held until [`validity`](Self::validity) reaches zero: check it before
/// each step of the work, and [`extend`](Self::extend) in time. Release with
/// [`release`](Self::release); dropping the guard releases in the background instead.
#[must_use = "dropping the guard releases the lock at once (in the background)"]
pub struct RedlockGuard {
    resource: String,
    /// Local monotonic time past which the keys may have expired on the servers.
    valid_until: Instant,
    claim: Claim,
}

impl fmt::Debug for RedlockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockGuard")
            .field("resource", &self.resource)
            .field("key", &self.claim.key)
            .field("validity", &self.validity())
            .finish_non_exhaustive()
    }
}

impl RedlockGuard {
    /// The resource name passed to [`Redlock::lock`].
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The key on the servers: the prefix, then the resource name.
    pub fn key(&self) -> &str {
        &self.claim.key
    }

    /// How long the lock is still believed held: the TTL less the time the acquisition (or
    /// the last extension) took and the drift allowance, counted down on this process's
    /// monotonic clock. Zero once it has passed, or once an extension failed.
    ///
    /// It is a belief, not a promise: a pause that starts right after this call makes the
    /// answer stale, and a monotonic clock that stops while the host is suspended
    /// under-counts. That is why Redlock is for efficiency only.
    pub fn validity(&self) -> Duration {
        if !self.claim.armed {
            return Duration::ZERO;
        }
        self.valid_until.saturating_duration_since(Instant::now())
    }

    /// Extends the lock to `ttl` from now: compare-and-`PEXPIRE` on every node, held only if a
    /// quorum still had our value and validity is left after the round. On success
    /// [`validity`](Self::validity) starts again from `ttl`.
    ///
    /// # Errors
    /// Every error means **stop working on the resource**: the lock may already be someone
    /// else's. The keys are then released on every node (best effort) and the guard is spent
    /// (further calls return [`Error::NotOwner`]).
    /// - [`Error::NotOwner`]: the validity had already passed (nothing was sent but the
    ///   release), or too few nodes still held our value.
    /// - [`Error::Backend`]: too many nodes failed for a quorum (the source names each), or the
    ///   round took the whole new validity.
    /// - [`Error::InvalidArgument`]: `ttl` is not longer than the per-node timeout plus the
    ///   drift allowance (nothing was sent; the guard stays as it was).
    ///
    /// # Cancel safety
    /// If the future is dropped, the guard keeps its old validity; some nodes may have
    /// extended their keys, which only delays their expiry (unlock or drop deletes them).
    pub fn extend(&mut self, ttl: Duration) -> impl Future<Output = Result<()>> + Send + Sync + '_ {
        let span = tracing::debug_span!("redlock.extend", resource = %self.resource);
        SyncFuture::new(self.extend_inner(ttl).instrument(span))
    }

    async fn extend_inner(&mut self, ttl: Duration) -> Result<()> {
        if !self.claim.armed {
            return Err(self.not_owner());
        }
        check_ttl(ttl, &self.claim.inner.options)?;
        if self.validity().is_zero() {
            tracing::debug!("redlock: validity passed before extend");
            self.give_up().await;
            return Err(self.not_owner());
        }
        let drift = self.claim.inner.options.drift(ttl);
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(EXTEND_SCRIPT)
            .arg(1)
            .arg(&self.claim.key)
            .arg(&self.claim.value)
            .arg(ttl.as_millis().to_string());
        let started = Instant::now();
        let round = self
            .claim
            .inner
            .round("extend", &cmd, |v| match v {
                Value::Int(1) => Some(true),
                Value::Int(0) => Some(false),
                _ => None,
            })
            .await;
        let ended = Instant::now();
        let elapsed = ended - started;
        let nodes = self.claim.inner.nodes.len();
        let failed = round.failures.len();
        let verdict = verdict(nodes, round.yes, failed, validity(ttl, elapsed, drift));
        tracing::debug!(
            yes = round.yes,
            no = round.no,
            failed,
            ?elapsed,
            ?verdict,
            "redlock: extend round"
        );
        let error = match verdict {
            Verdict::Held(left) => {
                self.valid_until = ended.checked_add(left).unwrap_or(ended);
                return Ok(());
            }
            Verdict::Refused => self.not_owner(),
            Verdict::Unreachable => Error::Backend {
                op: "redlock extend",
                source: self.claim.inner.failures(round.failures),
                at: Default::default(),
            },
            Verdict::TooSlow => Error::Backend {
                op: "redlock extend",
                at: Default::default(),
                source: format!("the round took {elapsed:?}: no validity left of a {ttl:?} TTL")
                    .into(),
            },
        };
        self.give_up().await;
        Err(error)
    }

    /// Releases on every node, best effort, and spends the guard.
    async fn give_up(&mut self) {
        let round = self.claim.release().await;
        tracing::debug!(
            deleted = round.yes,
            failed = round.failures.len(),
            "redlock: released after a lost lock"
        );
        self.claim.armed = false;
    }

    fn not_owner(&self) -> Error {
        Error::NotOwner {
            key: self.claim.key.clone(),
        }
    }

    /// Releases the lock: compare-and-delete on every node (never a key that holds another
    /// client's value).
    ///
    /// # Errors
    /// - [`Error::NotOwner`]: fewer than a quorum of nodes still held our value: the lock had
    ///   lapsed (or nodes lost their data) before the release, and the work may have
    ///   overlapped another holder's. Whatever was left of ours is deleted.
    /// - [`Error::Backend`]: too many nodes failed to tell either way (the source names
    ///   each); keys on those nodes expire after the TTL.
    ///
    /// # Cancel safety
    /// If the future is dropped, the release is sent again from a spawned task (as when the
    /// guard is dropped).
    pub fn release(mut self) -> impl Future<Output = Result<()>> + Send + Sync + 'static {
        let span = tracing::debug_span!("redlock.release", resource = %self.resource);
        SyncFuture::new(
            async move {
                if !self.claim.armed {
                    return Err(self.not_owner());
                }
                let round = self.claim.release().await;
                self.claim.armed = false;
                let nodes = self.claim.inner.nodes.len();
                tracing::debug!(
                    deleted = round.yes,
                    no = round.no,
                    failed = round.failures.len(),
                    "redlock: unlock round"
                );
                match released(nodes, round.yes, round.failures.len()) {
                    Released::Owned => Ok(()),
                    Released::NotOwned => Err(self.not_owner()),
                    Released::Unknown => Err(Error::Backend {
                        op: "redlock unlock",
                        source: self.claim.inner.failures(round.failures),
                        at: Default::default(),
                    }),
                }
            }
            .instrument(span),
        )
    }

    /// The former name of [`release`](RedlockGuard::release).
    ///
    /// # Errors
    /// As [`release`](RedlockGuard::release).
    ///
    /// # Cancel safety
    /// As [`release`](RedlockGuard::release).
    #[deprecated(since = "0.4.0", note = "every guard releases with `release`")]
    pub fn unlock(self) -> impl Future<Output = Result<()>> + Send + Sync + 'static {
        self.release()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TLS options go with `rediss://` URLs: with a `redis://` one they are refused in words
    /// before anything is sent, not reported as an unreachable node; so is a CA that is not
    /// PEM.
    #[test]
    fn tls_options_are_checked_before_anything_is_sent() {
        let with_ca = RedlockOptions::new().with_ca_cert("not a certificate");
        let refused = prepare(&["redis://127.0.0.1:1"], &with_ca);
        assert!(
            matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("rediss://")),
            "{:?}",
            refused.err()
        );
        let refused = prepare(&["rediss://127.0.0.1:2"], &with_ca);
        assert!(
            matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("PEM")),
            "{:?}",
            refused.err()
        );
    }

    #[test]
    fn quorum_is_a_strict_majority() {
        let expected = [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)];
        for (n, q) in expected {
            assert_eq!(quorum(n), q, "quorum of {n}");
            assert!(2 * quorum(n) > n, "two quorums of {n} always share a node");
        }
    }

    #[test]
    fn validity_is_ttl_less_elapsed_less_drift() {
        let ttl = Duration::from_secs(10);
        let d = drift(ttl, 0.01);
        assert_eq!(d, Duration::from_millis(102));
        assert_eq!(
            validity(ttl, Duration::from_millis(50), d),
            Some(Duration::from_millis(9_848))
        );
        assert_eq!(validity(ttl, Duration::from_millis(9_898), d), None);
        assert_eq!(validity(ttl, Duration::from_secs(11), d), None);
    }

    #[test]
    fn verdicts_follow_the_quorum() {
        let v = Some(Duration::from_secs(1));
        assert_eq!(verdict(5, 3, 0, v), Verdict::Held(Duration::from_secs(1)));
        assert_eq!(verdict(5, 3, 2, v), Verdict::Held(Duration::from_secs(1)));
        assert_eq!(verdict(5, 2, 0, v), Verdict::Refused);
        assert_eq!(verdict(5, 2, 2, v), Verdict::Refused);
        assert_eq!(verdict(5, 2, 3, v), Verdict::Unreachable);
        assert_eq!(verdict(5, 0, 5, v), Verdict::Unreachable);
        assert_eq!(verdict(5, 5, 0, None), Verdict::TooSlow);
        assert_eq!(verdict(1, 1, 0, v), Verdict::Held(Duration::from_secs(1)));
        assert_eq!(verdict(2, 1, 0, v), Verdict::Refused);
    }

    #[test]
    fn an_unlock_owns_only_with_a_quorum() {
        assert_eq!(released(5, 3, 0), Released::Owned);
        assert_eq!(released(5, 5, 0), Released::Owned);
        assert_eq!(released(5, 0, 0), Released::NotOwned);
        assert_eq!(released(5, 2, 0), Released::NotOwned);
        assert_eq!(released(5, 2, 1), Released::Unknown);
        assert_eq!(released(5, 0, 5), Released::Unknown);
    }

    #[test]
    fn owner_values_are_20_bytes_of_hex_and_unique() {
        let values: std::collections::HashSet<String> =
            (0..10_000).map(|_| owner_value()).collect();
        assert_eq!(values.len(), 10_000);
        for v in values.iter().take(10) {
            assert_eq!(v.len(), 40);
            assert!(
                v.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            );
        }
        let from_threads: Vec<String> = (0..4)
            .map(|_| std::thread::spawn(owner_value))
            .map(|t| t.join().unwrap())
            .collect();
        let distinct: std::collections::HashSet<&String> = from_threads.iter().collect();
        assert_eq!(distinct.len(), from_threads.len());
    }

    #[test]
    fn jitter_stays_within_its_bounds() {
        let delay = Duration::from_millis(200);
        let jitter = Duration::from_millis(100);
        let pauses: Vec<Duration> = (0..1_000).map(|_| jittered(delay, jitter)).collect();
        assert!(
            pauses
                .iter()
                .all(|p| (delay - jitter..=delay + jitter).contains(p))
        );
        let (min, max) = (pauses.iter().min().unwrap(), pauses.iter().max().unwrap());
        assert!(
            *max - *min > Duration::from_millis(150),
            "spread {min:?}..{max:?}"
        );
        assert_eq!(jittered(delay, Duration::ZERO), delay);
        assert!(jittered(Duration::from_millis(10), jitter) <= Duration::from_millis(110));
    }

    #[test]
    fn options_that_cannot_hold_a_lock_are_refused() {
        assert!(RedlockOptions::new().validate().is_ok());
        let refused = [
            RedlockOptions::new().with_ttl(Duration::ZERO),
            RedlockOptions::new().with_ttl(Duration::from_millis(50)),
            RedlockOptions::new().with_ttl(Duration::MAX),
            RedlockOptions::new().with_drift_factor(1.0),
            RedlockOptions::new().with_drift_factor(-0.1),
            RedlockOptions::new().with_drift_factor(f64::NAN),
            RedlockOptions::new().with_node_timeout(Duration::ZERO),
        ];
        for options in refused {
            assert!(
                matches!(options.validate(), Err(Error::InvalidArgument(_))),
                "{options:?}"
            );
        }
    }

    #[test]
    fn urls_lose_their_password_in_messages() {
        match prepare(&["redis://u:secret@h:notaport/0"], &RedlockOptions::new()) {
            Err(Error::Connect { endpoints, .. }) => {
                assert!(
                    endpoints.iter().all(|e| !e.contains("secret")),
                    "{endpoints:?}"
                );
            }
            other => panic!("{:?}", other.err()),
        }
    }

    #[test]
    fn failures_keep_their_causes() {
        let failures = NodeFailures {
            nodes: 5,
            failures: vec![
                ("a:1".into(), Cause::Timeout(Duration::from_millis(50))),
                ("b:2".into(), Cause::NotConnected(None)),
            ],
        };
        let text = failures.to_string();
        assert!(
            text.starts_with("2 of 5 nodes failed: a:1: no answer"),
            "{text}"
        );
        assert!(text.contains("; b:2: not connected"), "{text}");
        assert!(failures.source().is_some());
    }

    fn assert_send_sync<T: Send + Sync>(_: &T) {}

    /// Guards and the futures of every async method can move between threads.
    #[allow(dead_code, clippy::let_underscore_future)]
    fn handles_and_futures_are_send_and_sync(redlock: &Redlock, mut guard: RedlockGuard) {
        assert_send_sync(redlock);
        assert_send_sync(&guard);
        assert_send_sync(&Redlock::connect(&["redis://h:1"], RedlockOptions::new()));
        assert_send_sync(&redlock.lock("r"));
        assert_send_sync(&redlock.try_lock("r"));
        assert_send_sync(&guard.extend(Duration::from_secs(1)));
        assert_send_sync(&guard.release());
    }
}
