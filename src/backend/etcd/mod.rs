//! [`EtcdBackend`]: the [`Backend`] trait on etcd, with the key layout of etcd's Go recipes.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchOptions,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::time::Instant;

use self::value::ValueWatches;
use self::watch::{EtcdTransport, Fired, WatchHub};
use super::{
    Backend, Enqueued, Entry, FencingToken, HeadEvent, Lease, LeaseId, Position, QueueChange,
    QueueMirror, WriteOp, queue_of, queue_of_bytes,
};
use crate::epoch::{Epoch, StoreEpochs};
use crate::error::{BoxError, Error, LostReason, Result};
use crate::retry::{Backoff, Retry};

mod epoch;
pub(crate) mod indexed;
mod members;
mod reach;
mod tls;
pub(crate) mod value;
mod watch;
use members::Members;
use tls::{HandshakeCheck, TlsConfig, refused_of};

pub use self::indexed::EtcdLayout;

/// Connection options for [`EtcdBackend::connect`].
///
/// ```
/// # use std::time::Duration;
/// let options = baton::EtcdOptions::new()
///     .with_connect_timeout(Duration::from_secs(2))
///     .with_user("app", "secret");
/// ```
///
/// # TLS
/// An etcd that serves TLS is reached at `https://host:port` endpoints (or bare `host:port`
/// once a TLS option is set), with the CA that signed its certificate
/// ([`with_ca_cert`](Self::with_ca_cert), etcdctl's `--cacert`) and, when it asks for one
/// (`--client-cert-auth`), a client certificate ([`with_client_cert`](Self::with_client_cert),
/// `--cert`/`--key`). Without a CA, the system's trusted roots are used. The certificates are
/// PEM, as etcd and etcdctl take them; they are read and checked at connect.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use baton::{EtcdBackend, EtcdOptions};
/// let options = EtcdOptions::new()
///     .with_ca_cert(std::fs::read("/etc/etcd/ca.pem")?)
///     .with_client_cert(
///         std::fs::read("/etc/etcd/client.pem")?,
///         std::fs::read("/etc/etcd/client-key.pem")?,
///     );
/// let backend = EtcdBackend::connect(&["https://10.0.0.1:2379"], options).await?;
/// # let _ = backend; Ok(()) }
/// ```
///
/// A certificate refused during the handshake fails [`EtcdBackend::connect`] at once, not
/// after the connect timeout: retrying cannot fix it. [`Error::Misconfigured`] when baton does
/// not trust the server's certificate (its source says why: an unknown CA, expired, issued for
/// another name), [`Error::Auth`] when the server refuses the client certificate (missing,
/// expired, or signed by a CA it does not trust; etcd does not say which).
#[derive(Clone)]
#[must_use]
pub struct EtcdOptions {
    connect_timeout: Duration,
    request_timeout: Duration,
    retry_for: Duration,
    restart_grace: Duration,
    user: Option<(String, String)>,
    tls: TlsConfig,
    layout: EtcdLayout,
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("retry_for", &self.retry_for)
            .field("restart_grace", &self.restart_grace)
            // Never print the password, nor the client's private key.
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("ca_cert", &self.tls.ca.is_some())
            .field("client_cert", &self.tls.identity.is_some())
            .field("tls_server_name", &self.tls.server_name)
            .field("layout", &self.layout)
            .finish()
    }
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl EtcdOptions {
    /// Defaults: connect timeout 5 s, request timeout 5 s, retries for up to 10 s, restart
    /// grace 60 s (the default session TTL), no authentication.
    pub fn new() -> Self {
        EtcdOptions {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            retry_for: Duration::from_secs(10),
            restart_grace: crate::SessionOptions::DEFAULT_TTL,
            user: None,
            tls: TlsConfig::default(),
            layout: EtcdLayout::Go,
        }
    }

    /// Where this backend puts the entries it creates: [`EtcdLayout::Go`] (the default: the
    /// keys of etcd's Go `concurrency` package, shared with `etcdctl lock` and Go services) or
    /// [`EtcdLayout::Indexed`] (keys whose order is queue order, for queues thousands deep).
    /// See [`EtcdLayout`] for which to pick.
    pub fn with_layout(mut self, layout: EtcdLayout) -> Self {
        self.layout = layout;
        self
    }

    /// How long [`EtcdBackend::connect`] waits for an endpoint to answer.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The limit for one attempt of one request. Waits (watches) are not limited by it.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How long a request that fails with a transient error (member down, leader change,
    /// timeout) is retried, with backoff, before the error is returned.
    ///
    /// ## Warning
    /// Keep it well below your session TTL: a keep-alive that is still retrying when the
    /// lease deadline passes ends the session anyway.
    pub fn with_retry_for(mut self, duration: Duration) -> Self {
        self.retry_for = duration;
        self
    }

    /// How long nothing is granted after etcd lost or rolled back its state (a member
    /// restarted without its data dir, `etcdctl snapshot restore`), and after the first use of
    /// an etcd that baton has never marked: a holder from before may still believe it holds
    /// until its lease would have expired. The client that finds the store so begins a new
    /// *store epoch* ([`StoreEpochs`]), whose grace etcd itself times (a key bound to a lease
    /// of this length); every client waits it out.
    ///
    /// ## Warning
    /// At least the longest session TTL of every client of this etcd: a shorter grace lets
    /// a new holder overlap one from before. An operator who knows an etcd is new marks it
    /// first (`baton init`), and its first use waits nothing.
    pub fn with_restart_grace(mut self, grace: Duration) -> Self {
        self.restart_grace = grace;
        self
    }

    /// Authenticates as `user` with `password`.
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }

    /// Trusts the CA certificates in `pem` (one or more, PEM-encoded: etcdctl's `--cacert`
    /// file) for the servers' certificates, instead of the system's roots. Turns TLS on:
    /// endpoints must be `https://` or bare `host:port`.
    ///
    /// Checked at connect: a bundle with no certificate, or one that does not parse, is
    /// [`Error::InvalidArgument`].
    pub fn with_ca_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(pem.into());
        self
    }

    /// Presents the client certificate `cert_pem` (a PEM certificate, or a chain with the
    /// client's certificate first) with its private key `key_pem` (PEM, PKCS#8, PKCS#1 or
    /// SEC1), for an etcd started with `--client-cert-auth` (etcdctl's `--cert` and `--key`).
    /// Turns TLS on. When etcd's authentication is on too, the certificate's common name is
    /// the etcd user unless a user is given ([`with_user`](Self::with_user)).
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

    /// Verifies the servers' certificates against `name` (a DNS name or an IP address)
    /// instead of each endpoint's host, and sends it as the TLS server name: for endpoints
    /// given by address whose certificate names a host. Turns TLS on.
    ///
    /// ## Warning
    /// Every endpoint is then checked against this one name: a certificate for `name` is
    /// accepted from any of them.
    pub fn with_tls_server_name(mut self, name: impl Into<String>) -> Self {
        self.tls.server_name = Some(name.into());
        self
    }
}

/// The etcd backend.
///
/// Keys follow etcd's Go `concurrency` package: an entry of queue `name` is the key
/// `name/<lease id in lowercase hex>`, its position and fencing token are the key's create
/// revision. A Rust service using baton, a Go service using `concurrency.NewMutex(session,
/// name)` and `etcdctl lock name` therefore queue on the same lock.
///
/// Requests that fail with transient errors are retried with backoff (see
/// [`EtcdOptions::with_retry_for`]); every retried request is idempotent (create-if-absent,
/// deletes and writes conditioned on a create revision, reads). Waits re-establish their
/// watch after a broken stream or a compaction and re-read before they resume, so a
/// deletion is never missed.
///
/// `EtcdBackend` is a handle: clones share one connection, one watch stream and one request
/// counter, and cost one reference count.
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Shared>,
}

struct Shared {
    /// The balanced client ([`EtcdBackend::client`], and every request with a single
    /// endpoint) and, with more than one endpoint, the members each request and each watch
    /// stream goes to, one in turn; the watches of waits (in `watches`), value watches and
    /// observers open their streams through it.
    reach: EtcdTransport,
    options: EtcdOptions,
    endpoints: Vec<String>,
    watches: WatchHub<EtcdTransport>,
    values: ValueWatches,
    requests: Arc<AtomicU64>,
    /// Keys etcd loaded to answer this backend's queue reads ([`EtcdBackend::keys_read`]).
    keys_read: AtomicU64,
    /// The next sequence number this process proposes, per queue of the indexed layout.
    seqs: std::sync::Mutex<std::collections::HashMap<String, indexed::Numbering>>,
    /// The mod revision of each lease's fence ([`fence_key`]) as this process last set or
    /// read it; a lease absent here has never moved its fence (0: no such key).
    fences: std::sync::Mutex<std::collections::HashMap<i64, i64>>,
    /// What this client remembers of the store's epochs.
    epochs: StoreEpochs,
}

/// How many times an enqueue catches up with its lease's fence before it gives up (each
/// time means another task of this process moved it meanwhile).
const FENCE_RACES: usize = 8;

/// Where a lease's fence lives, outside every queue: `_baton-sessions/<lease, 16 hex digits>`,
/// bound to the lease. Every enqueue compares its mod revision with the one its session
/// knows; moving it (a put) before looking for an enqueue whose answer was lost stops that
/// enqueue from applying later.
fn fence_key(lease: LeaseId) -> String {
    format!("_baton-sessions/{:016x}", lease.get())
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.inner.endpoints)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

/// The error for a request refused for good: [`Error::OutcomeUnknown`] if an earlier attempt
/// may have been applied.
fn final_error(retry: &Retry, op: &'static str, e: etcd_client::Error) -> Error {
    if retry.maybe_applied() {
        retry.failed(e.into())
    } else {
        etcd_err(op, e)
    }
}

fn etcd_err(op: &'static str, e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    if let Some(refused) = refused_of(&e) {
        return refused.into_error(|source| Error::Backend {
            op,
            source,
            at: Default::default(),
        });
    }
    if let E::GRpcStatus(status) = &e {
        let msg = status.message();
        let code = status.code() as i32;
        if code == tonic_code::UNAUTHENTICATED
            || code == tonic_code::PERMISSION_DENIED
            || msg.contains("authentication failed")
            || msg.contains("invalid auth token")
            || msg.contains("user name is empty")
            || msg.contains("permission denied")
        {
            return Error::Auth { source: e.into() };
        }
        if msg.contains("requested lease not found") {
            return Error::SessionLost(LostReason::Revoked);
        }
    }
    // etcd-client's keep-alive reports a lease etcd no longer has this way.
    if matches!(&e, E::LeaseKeepAliveError(m) if m.contains("lease not found")) {
        return Error::SessionLost(LostReason::Revoked);
    }
    Error::Backend {
        op,
        source: e.into(),
        at: Default::default(),
    }
}

/// The oldest etcd baton supports: its watch driver chooses the ids of the watches it adds to
/// a stream (etcd 3.4 and later).
const MINIMUM_VERSION: (u64, u64) = (3, 4);

/// Refuses a server older than [`MINIMUM_VERSION`]. A version that does not parse is let
/// through (with a warning): etcd has always reported `major.minor.patch`.
fn check_version(version: &str) -> Result<()> {
    let mut parts = version.split('.').map(str::parse::<u64>);
    let (Some(Ok(major)), Some(Ok(minor))) = (parts.next(), parts.next()) else {
        tracing::warn!(
            version,
            "etcd reported a version baton cannot read; going on"
        );
        return Ok(());
    };
    if (major, minor) < MINIMUM_VERSION {
        return Err(Error::UnsupportedVersion {
            server: "etcd",
            version: version.to_owned(),
            minimum: "3.4",
        });
    }
    Ok(())
}

/// gRPC status codes, by number, so that no tonic type leaks into our signatures.
mod tonic_code {
    use etcd_client::Error as E;
    pub(super) type Code = i32;
    pub(super) const CANCELLED: Code = 1;
    pub(super) const DEADLINE_EXCEEDED: Code = 4;
    pub(super) const PERMISSION_DENIED: Code = 7;
    pub(super) const UNAVAILABLE: Code = 14;
    pub(super) const UNAUTHENTICATED: Code = 16;
    pub(super) const UNKNOWN: Code = 2;

    /// Whether a failed request certainly never reached a server: the connection could not
    /// be made. Anything else may have been applied.
    pub(super) fn never_sent(e: &E) -> bool {
        let refused = |mut source: Option<&(dyn std::error::Error + 'static)>| {
            while let Some(cause) = source {
                if let Some(io) = cause.downcast_ref::<std::io::Error>()
                    && matches!(
                        io.kind(),
                        std::io::ErrorKind::ConnectionRefused
                            | std::io::ErrorKind::AddrNotAvailable
                    )
                {
                    return true;
                }
                source = cause.source();
            }
            false
        };
        // A refused handshake: the server received none of the request.
        if super::refused_of(e).is_some() {
            return true;
        }
        match e {
            E::GRpcStatus(s) => {
                s.code() as i32 == UNAVAILABLE
                    && (s.message().contains("connect error")
                        || s.message().contains("error trying to connect")
                        || refused(std::error::Error::source(s)))
            }
            E::TransportError(t) => refused(std::error::Error::source(t)),
            _ => false,
        }
    }

    /// Whether a failed request says that its member cannot serve now (unreachable, cut
    /// off from its leader, shutting down): the next requests go elsewhere for a while.
    pub(super) fn member_unfit(e: &E) -> bool {
        match e {
            E::GRpcStatus(s) => {
                let code = s.code() as i32;
                code == UNAVAILABLE || code == CANCELLED
            }
            E::TransportError(_) | E::IoError(_) => true,
            _ => false,
        }
    }

    /// Whether a failed request may succeed when sent again (possibly to another member).
    pub(super) fn is_transient(e: &E) -> bool {
        // A certificate refused is refused again: failing at once says what is wrong, where
        // retrying until the timeout would only hide it.
        if super::refused_of(e).is_some() {
            return false;
        }
        match e {
            E::GRpcStatus(s) => {
                let code = s.code() as i32;
                code == UNAVAILABLE
                    || code == DEADLINE_EXCEEDED
                    // A connection closed under the request (a member restarting): the
                    // transport cancels it. Not our caller: a caller that gives up drops the
                    // future instead. Whether it was applied is unknown (`never_sent` says no).
                    || code == CANCELLED
                    // etcd reports leader loss and "too many requests" this way.
                    || (code == UNKNOWN && !s.message().contains("authentication"))
                    || s.message().contains("leader changed")
                    || s.message().contains("no leader")
            }
            E::TransportError(_) | E::IoError(_) => true,
            _ => false,
        }
    }
}

impl EtcdBackend {
    /// Connects to the cluster at `endpoints` (`host:port`, `http://host:port` or
    /// `https://host:port`) and checks that at least one answers within the connect timeout,
    /// and that the credentials, if any, are accepted. Bare `host:port` is plain text, or TLS
    /// once a TLS option is set (see [`EtcdOptions`], "TLS").
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty endpoint list, `http://` mixed with `https://`
    /// or with TLS options, or a CA, client certificate or key that does not parse (or a key
    /// that is not the certificate's); [`Error::Connect`] if no endpoint answers in time, or
    /// at once if every endpoint refuses the connection or names a host that does not exist;
    /// [`Error::Misconfigured`] at once if baton refuses the server's TLS certificate, an
    /// endpoint does not speak TLS as its scheme says, or a user is given to an etcd without
    /// authentication; [`Error::Auth`] for rejected credentials, a client certificate included
    /// (at once);
    /// [`Error::UnsupportedVersion`] for an etcd older than 3.4 (baton's waits name their
    /// watches, which etcd supports from 3.4). The TLS errors' sources say what was refused.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is created on the server.
    pub async fn connect<S: AsRef<str>>(endpoints: &[S], options: EtcdOptions) -> Result<Self> {
        let endpoints: Vec<String> = endpoints.iter().map(|e| e.as_ref().to_owned()).collect();
        if endpoints.is_empty() || endpoints.iter().any(|e| e.trim().is_empty()) {
            return Err(Error::InvalidArgument("endpoints must be a non-empty list"));
        }
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout)
            // HTTP/2 pings notice a dead connection under a long-lived watch. Only while a
            // stream is open: etcd refuses pings without a stream more often than every 5 s
            // (GOAWAY "too_many_pings"), and with no stream there is nothing to notice.
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(3))
            .with_keep_alive_while_idle(false)
            // A token that expires (simple tokens after `--auth-token-ttl`, JWTs, every token
            // after a member restart) is fetched again, not reported as a refused request.
            .with_auto_token_refresh(true)
            // A member cut off from the quorum fails requests and cancels watches ("no
            // leader") instead of holding waits and observers silently for the whole
            // partition: both are retried, reaching a member that has a leader.
            .with_require_leader(true);
        if let Some((user, password)) = &options.user {
            opts = opts.with_user(user.clone(), password.clone());
        }
        let (tls_check, tls) = match options.tls.options(&endpoints, options.connect_timeout)? {
            Some(tls) => {
                opts = opts.with_tls(tls.options);
                (tls.check, true)
            }
            None => (HandshakeCheck::plain(&endpoints), false),
        };
        // The channel balances over the endpoints, so a dead one may take the first request
        // (the authentication at connect, or the probe below): try again (another endpoint
        // gets its turn) until the connect timeout, as etcdctl does.
        let mut retry = ConnectRetry {
            retry: Retry::new("connect", options.connect_timeout).capped(CONNECT_BACKOFF_MAX),
            connect_timeout: options.connect_timeout,
            endpoints: &endpoints,
            tls_check: Some(tls_check),
            tls,
        };
        // With several endpoints, an attempt (the login, with a user) that has no answer soon
        // is joined by another, whose channel picks a member again: the one the first went to
        // may be frozen, and would hold it until the connect timeout.
        let hedge_after =
            (endpoints.len() > 1).then(|| options.request_timeout.min(LOGIN_HEDGE_AFTER));
        // `Client::connect` reports its own setup (endpoints, TLS options) as transport
        // errors, before any I/O: those do not pass. What fails on the wire comes back as a
        // gRPC status.
        let client = retry
            .until_answered_if(
                "connecting",
                || {
                    hedged(hedge_after, || {
                        Client::connect(&endpoints, Some(opts.clone()))
                    })
                },
                |e| {
                    !matches!(e, etcd_client::Error::TransportError(_))
                        && tonic_code::is_transient(e)
                },
            )
            .await?;
        let members = Members::new(&endpoints, &opts, options.request_timeout).map(Arc::new);
        Self::checked(client, members, options, endpoints.clone(), retry).await
    }

    /// Builds the backend on an etcd-client `Client` the application already has (its
    /// endpoints, TLS and credentials as it configured them), after the same checks as
    /// [`connect`](Self::connect): a member answers within `options`' connect timeout, and it
    /// runs etcd 3.4 or later. `options`' user is not used (the client authenticates itself).
    ///
    /// Keep-alive pings: baton's own connections ping every 5 s while idle, so that a waiter
    /// parked on a watch learns of a dead connection; configure your client likewise
    /// (`ConnectOptions::with_keep_alive`) if you rely on that.
    ///
    /// ```no_run
    /// # async fn demo() -> baton::Result<()> {
    /// use baton::{EtcdBackend, EtcdOptions, etcd_client::Client};
    /// let client = Client::connect(["127.0.0.1:2379"], None).await.map_err(|e| {
    ///     baton::Error::Connect { endpoints: vec!["127.0.0.1:2379".into()], source: e.into() }
    /// })?;
    /// let backend = EtcdBackend::from_client(client, EtcdOptions::new()).await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Connect`] if no member answers in time, [`Error::Auth`] if the client's
    /// credentials are refused, [`Error::UnsupportedVersion`] for an etcd older than 3.4.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is created on the server.
    pub async fn from_client(client: Client, options: EtcdOptions) -> Result<Self> {
        let endpoints = vec!["(an application's etcd client)".to_owned()];
        let retry = ConnectRetry {
            retry: Retry::new("connect", options.connect_timeout).capped(CONNECT_BACKOFF_MAX),
            connect_timeout: options.connect_timeout,
            endpoints: &endpoints,
            tls_check: None,
            tls: false,
        };
        Self::checked(client, None, options, endpoints.clone(), retry).await
    }

    /// Proves that a member answers (the channel is lazy) and accepts the client's token, and
    /// that it runs a version baton supports; then builds the backend.
    async fn checked(
        client: Client,
        members: Option<Arc<Members>>,
        options: EtcdOptions,
        endpoints: Vec<String>,
        mut retry: ConnectRetry<'_>,
    ) -> Result<Self> {
        // With several members, each asks all of them at once, so that one that never
        // answers (a frozen process) does not hold the connect until its timeout.
        let members_ref = members.as_deref();
        retry
            .until_answered("probing", || {
                first_answer(members_ref, &client, |mut c| async move {
                    c.get("\0", None).await.map(drop)
                })
            })
            .await?;
        let status = retry
            .until_answered("checking the version", || {
                first_answer(
                    members_ref,
                    &client,
                    |mut c| async move { c.status().await },
                )
            })
            .await?;
        check_version(status.version())?;
        let requests = Arc::new(AtomicU64::new(0));
        let transport = EtcdTransport {
            client,
            members,
            open_within: options.request_timeout,
        };
        let epochs = StoreEpochs::new(
            format!("etcd at {}", endpoints.join(",")),
            options.restart_grace,
        );
        let backend = EtcdBackend {
            inner: Arc::new(Shared {
                options,
                endpoints,
                values: ValueWatches::default(),
                watches: WatchHub::new(transport.clone(), Arc::clone(&requests)),
                reach: transport,
                requests,
                keys_read: AtomicU64::new(0),
                seqs: Default::default(),
                fences: Default::default(),
                epochs,
            }),
        };
        // The store's epoch is looked at by the first request that needs it, so that an
        // operator's `init_store` can come first.
        Ok(backend)
    }

    /// Marks this etcd as baton's, as `baton init` does: if it has no epoch marker, its first
    /// store epoch begins now **without a restart grace**. Returns whether it began one
    /// (`false`: the store was marked already, and nothing changed).
    ///
    /// Call it only for an etcd you know is new, or whose every baton client has stopped:
    /// the grace it skips is what keeps a newcomer from being granted while a holder from
    /// before (of a store that lost its data) still believes it holds.
    ///
    /// # Errors
    /// The backend's errors.
    ///
    /// # Cancel safety
    /// Cancel safe: the marker is written in one transaction, or not at all.
    pub async fn init_store(&self) -> Result<bool> {
        Ok(self.establish_as("init_store", true).await?.1)
    }

    /// Requests sent to etcd so far by this backend and its clones: unary requests
    /// (each retry counts) and watch creations. For measuring what an operation costs.
    pub fn requests_sent(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// Keys etcd has loaded from its store to answer this backend's reads of queues so far
    /// (enqueues, predecessors, entries ahead, head checks, heads and listings): for a read
    /// sorted or filtered by create revision, every key of its range, since etcd loads them
    /// all before it sorts, filters and applies the limit; for a read in key order, the keys
    /// it returned. For measuring what an operation costs at a queue depth: in the Go layout a
    /// waiter's reads grow with the queue, in [`EtcdLayout::Indexed`] they do not.
    pub fn keys_read(&self) -> u64 {
        self.inner.keys_read.load(Ordering::Relaxed)
    }

    /// Counts the keys etcd loaded for `get`: its whole range when `whole_range` (a read sorted
    /// or filtered by create revision), else what it returned.
    fn read_keys(&self, get: &etcd_client::GetResponse, whole_range: bool) {
        let n = if whole_range {
            u64::try_from(get.count()).unwrap_or(0)
        } else {
            get.kvs().len() as u64
        };
        self.inner.keys_read.fetch_add(n, Ordering::Relaxed);
    }

    /// The underlying etcd-client, for operations baton does not wrap.
    pub fn client(&self) -> &Client {
        &self.inner.reach.client
    }

    /// Runs the read `f` until it succeeds, fails for good, or the retry budget is spent.
    async fn call<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_within(op, self.inner.options.retry_for, f).await
    }

    /// [`call`](Self::call) with its own retry budget; `Duration::ZERO` sends one attempt.
    async fn call_within<T, F, Fut>(&self, op: &'static str, retry_for: Duration, f: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        Ok(self.attempts(op, retry_for, Kind::Read, f).await?.0)
    }

    /// Runs the write `f` with retries. Besides its answer, tells whether an earlier attempt
    /// failed after it may have been applied: then an answer that says "not applied now"
    /// (a condition that failed) cannot tell whether that earlier attempt was applied. If
    /// every attempt fails and one may have been applied, the error is
    /// [`Error::OutcomeUnknown`]; any other error means nothing was applied.
    async fn write<T, F, Fut>(&self, op: &'static str, f: F) -> Result<(T, bool)>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.attempts(op, self.inner.options.retry_for, Kind::Write, f)
            .await
    }

    async fn attempts<T, F, Fut>(
        &self,
        op: &'static str,
        retry_for: Duration,
        kind: Kind,
        f: F,
    ) -> Result<(T, bool)>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.attempts_here(op, retry_for, kind, f)
            .await
            .map_err(|e| e.at_endpoint(&self.label()))
    }

    /// The server, for errors: `etcd at <endpoints>`.
    fn label(&self) -> String {
        format!("etcd at {}", self.inner.endpoints.join(","))
    }

    async fn attempts_here<T, F, Fut>(
        &self,
        op: &'static str,
        retry_for: Duration,
        kind: Kind,
        mut f: F,
    ) -> Result<(T, bool)>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut retry = Retry::new(op, retry_for);
        let timeout = self.inner.options.request_timeout;
        loop {
            let members = self.inner.reach.members.as_deref();
            let member = members.map(|m| (m, m.pick()));
            // The member's own client, connected (and logged in) on its first use: apart
            // from the request, since nothing of the request is sent while it connects.
            let client = match member {
                None => self.inner.reach.client.clone(),
                Some((members, i)) => match members.connected(i).await {
                    Ok(client) => client,
                    Err(e) if !tonic_code::is_transient(&e) => {
                        return Err(final_error(&retry, op, e));
                    }
                    Err(e) => {
                        retry.pause(e.into(), "etcd").await?;
                        continue;
                    }
                },
            };
            self.inner.requests.fetch_add(1, Ordering::Relaxed);
            // Boxed: a gRPC request future is several KiB, and every caller that awaits this
            // one (a waiter parked on its predecessor, too) would otherwise carry that size
            // for as long as it lives.
            let outcome = Box::pin(tokio::time::timeout(timeout, f(client))).await;
            if let Some((members, i)) = member {
                match &outcome {
                    Ok(Err(e)) if tonic_code::member_unfit(e) => members.failed(i),
                    Err(_) => members.failed(i),
                    Ok(_) => members.answered(i),
                }
            }
            let error: BoxError = match outcome {
                Ok(Ok(v)) => return Ok((v, retry.maybe_applied())),
                Ok(Err(e)) if !tonic_code::is_transient(&e) => {
                    return Err(final_error(&retry, op, e));
                }
                Ok(Err(e)) => {
                    if kind == Kind::Write && !tonic_code::never_sent(&e) {
                        retry.may_have_applied();
                    }
                    e.into()
                }
                // The request may be on its way, or applied with its answer on its way back.
                Err(elapsed) => {
                    if kind == Kind::Write {
                        retry.may_have_applied();
                    }
                    elapsed.into()
                }
            };
            retry.pause(error, "etcd").await?;
        }
    }

    /// Runs the read-only transaction `txn` with the backend's retries, and takes in the
    /// store's position from its answer (a store that went back begins a new epoch).
    pub(crate) async fn read_txn(&self, op: &'static str, txn: Txn) -> Result<TxnResponse> {
        let sent = Instant::now();
        let resp = self.read_txn_raw(op, txn).await?;
        self.saw_header(resp.header(), false, sent).await?;
        Ok(resp)
    }

    /// [`read_txn`](Self::read_txn) without looking at the store's position.
    async fn read_txn_raw(&self, op: &'static str, txn: Txn) -> Result<TxnResponse> {
        self.call(op, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// Runs the writing transaction `txn` with the backend's retries; see
    /// [`write`](Self::write) for the flag that comes with the answer. Takes in the store's
    /// position from the answer, as [`read_txn`](Self::read_txn) does.
    pub(crate) async fn write_txn(
        &self,
        op: &'static str,
        txn: Txn,
    ) -> Result<(TxnResponse, bool)> {
        let sent = Instant::now();
        let (resp, maybe_applied) = self.write_txn_raw(op, txn).await?;
        self.saw_header(resp.header(), true, sent).await?;
        Ok((resp, maybe_applied))
    }

    /// [`write_txn`](Self::write_txn) without looking at the store's position.
    async fn write_txn_raw(&self, op: &'static str, txn: Txn) -> Result<(TxnResponse, bool)> {
        self.write(op, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// The mod revision of `lease`'s fence as this process knows it.
    fn fence_seen(&self, lease: LeaseId) -> i64 {
        let fences = self.inner.fences.lock().unwrap_or_else(|p| p.into_inner());
        fences.get(&lease.get()).copied().unwrap_or(0)
    }

    /// Records a mod revision of `lease`'s fence read or set later than any recorded.
    fn fenced_at(&self, lease: LeaseId, revision: i64) {
        let mut fences = self.inner.fences.lock().unwrap_or_else(|p| p.into_inner());
        let seen = fences.entry(lease.get()).or_insert(0);
        *seen = (*seen).max(revision);
    }

    /// Moves `lease`'s fence on (puts its key, bound to the lease): no enqueue of the lease
    /// sent before this returns applies after it, because each compares the fence's mod
    /// revision it was sent with. A request can reach etcd long after its client gave up on
    /// it (held up on a connection the client left, or in a frozen member); one sent earlier
    /// and applied is before the put in etcd's order, so a read after this sees it.
    async fn move_fence(&self, lease: LeaseId) -> Result<()> {
        self.write("enqueue", |mut c| async move {
            self.put_fence(&mut c, lease).await
        })
        .await?;
        Ok(())
    }

    /// One attempt of [`move_fence`](Self::move_fence) on `c`, recording the new revision.
    async fn put_fence(&self, c: &mut Client, lease: LeaseId) -> Result<(), etcd_client::Error> {
        let options = PutOptions::new().with_lease(lease.get());
        let put = c.put(fence_key(lease), "", Some(options)).await?;
        self.fenced_at(lease, put.header().map_or(0, |h| h.revision()));
        Ok(())
    }

    fn live_compare(entry: &Entry) -> Compare {
        Compare::create_revision(entry.key_bytes(), CompareOp::Equal, revision(entry))
    }

    /// A transaction that runs `ops` only if `entry`'s key still has its create revision and
    /// the store is still in the epoch `entry` was read in; [`Error::SessionLost`] with
    /// [`LostReason::StoreReset`] if the store is in another epoch now (every session from
    /// before is lost with it).
    async fn live_txn(
        &self,
        op: &'static str,
        entry: &Entry,
        ops: Vec<TxnOp>,
        write: bool,
    ) -> Result<(TxnResponse, bool)> {
        let epoch = self.epoch().await?;
        let txn = Txn::new()
            .when([Self::live_compare(entry), Self::in_epoch(&epoch)])
            .and_then(ops)
            .or_else([Self::read_marker()]);
        let (resp, maybe_applied) = if write {
            self.write_txn(op, txn).await?
        } else {
            (self.read_txn(op, txn).await?, false)
        };
        if !resp.succeeded() && self.marker_moved(&resp, 0, &epoch).await? {
            return Err(Error::SessionLost(LostReason::StoreReset));
        }
        Ok((resp, maybe_applied))
    }

    /// A read-only transaction that runs `ops` only if `entry`'s key still has its create
    /// revision (see [`live_txn`](Self::live_txn)).
    async fn if_live(
        &self,
        op: &'static str,
        entry: &Entry,
        ops: Vec<TxnOp>,
    ) -> Result<TxnResponse> {
        Ok(self.live_txn(op, entry, ops, false).await?.0)
    }

    /// Applies the writes `ops` only if `entry`'s key still has its create revision; tells
    /// whether they were. If an earlier attempt may have been applied and the last found the
    /// entry gone, which of the two happened is unknown: [`Error::OutcomeUnknown`], never a
    /// `false` that would claim "not applied".
    async fn write_if_live(
        &self,
        op: &'static str,
        entry: &Entry,
        ops: Vec<TxnOp>,
    ) -> Result<bool> {
        let (resp, maybe_applied) = self.live_txn(op, entry, ops, true).await?;
        if resp.succeeded() {
            Ok(true)
        } else if maybe_applied {
            Err(Error::OutcomeUnknown {
                op,
                source: "an attempt failed after it may have been applied, and the retry found the entry gone".into(),
                at: Default::default(),
            }
            .at_endpoint(&self.label()))
        } else {
            Ok(false)
        }
    }
}

/// The longest [`HandshakeCheck`] waits for a server's verdict: a server that accepts the
/// client sends its session tickets at once, and one that refuses it its alert; a server that
/// sends neither leaves the check undecided after this. Also the longest the other checks of
/// a failing connect wait for an endpoint ([`reach`]).
const TLS_CHECK_LIMIT: Duration = Duration::from_secs(1);

/// How long a TLS request may go unanswered before `connect` asks the endpoints in plain text
/// whether they speak TLS at all ([`reach::answers_plain_text`]): a TLS handshake sent to an
/// etcd without TLS may go unanswered until the connect timeout.
const PLAIN_TEXT_CHECK_AFTER: Duration = Duration::from_millis(250);

/// How long an attempt of `connect` with several endpoints waits before another joins it
/// (see [`hedged`]); at most the request timeout.
const LOGIN_HEDGE_AFTER: Duration = Duration::from_millis(500);

/// The first answer of `attempt`, started again every `every` for as long as none has
/// answered, all of them running on (`None`: one attempt). A first attempt that is merely
/// slow is not cut short; one that went to a frozen member is overtaken.
///
/// # Cancel safety
/// Cancel safe if `attempt` is: the attempts still running are dropped.
async fn hedged<T, E, Fut>(
    every: Option<Duration>,
    mut attempt: impl FnMut() -> Fut,
) -> std::result::Result<T, E>
where
    Fut: Future<Output = std::result::Result<T, E>>,
{
    let Some(every) = every else {
        return attempt().await;
    };
    let mut running = futures::stream::FuturesUnordered::new();
    running.push(attempt());
    loop {
        tokio::select! {
            Some(answer) = running.next() => return answer,
            () = tokio::time::sleep(every) => running.push(attempt()),
        }
    }
}

/// The longest pause between the attempts of `connect`: its limit (the connect timeout,
/// 5 s by default) is short, so attempts stay close together.
const CONNECT_BACKOFF_MAX: Duration = Duration::from_millis(250);

/// `ask`'s answer from the first member to give one, or from the balanced `client` when there
/// is a single endpoint.
async fn first_answer<T, Fut>(
    members: Option<&Members>,
    client: &Client,
    ask: impl Fn(Client) -> Fut,
) -> std::result::Result<T, etcd_client::Error>
where
    Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    match members {
        Some(members) => members.first_to_answer(ask).await,
        None => ask(client.clone()).await,
    }
}

/// Retries of the requests `connect` makes, until the connect timeout: the channel balances
/// over the endpoints, so a dead one may take a request while a live one would answer. A
/// failure that retrying cannot fix ends it at once: every endpoint refused or unknown, a
/// certificate refused, a TLS endpoint that answers in plain text or the reverse.
struct ConnectRetry<'a> {
    /// Until the connect timeout, pauses of at most [`CONNECT_BACKOFF_MAX`]; shared by the
    /// requests of one `connect`.
    retry: Retry,
    connect_timeout: Duration,
    endpoints: &'a [String],
    /// Run once, at the first failure after a connection was made: it may hide a refused
    /// client certificate, or a TLS server reached in plain text.
    tls_check: Option<HandshakeCheck>,
    /// The endpoints are reached in TLS: a request slow to answer may be a handshake sent to
    /// a server without TLS.
    tls: bool,
}

impl ConnectRetry<'_> {
    /// Sends `request` until it is answered, fails for a reason other than an unreachable
    /// endpoint, or the connect timeout passes.
    async fn until_answered<T, F>(
        &mut self,
        what: &'static str,
        request: impl FnMut() -> F,
    ) -> Result<T>
    where
        F: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.until_answered_if(what, request, tonic_code::is_transient)
            .await
    }

    /// [`until_answered`](Self::until_answered), trying again only after errors for which
    /// `transient` holds.
    async fn until_answered_if<T, F>(
        &mut self,
        what: &'static str,
        mut request: impl FnMut() -> F,
        transient: impl Fn(&etcd_client::Error) -> bool,
    ) -> Result<T>
    where
        F: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        use futures::FutureExt;
        let (endpoints, tls) = (self.endpoints, self.tls);
        // Runs (once) while a TLS request goes unanswered; never ends for plain text.
        let mut plain_text = std::pin::pin!(
            async move {
                if !tls {
                    return std::future::pending().await;
                }
                tokio::time::sleep(PLAIN_TEXT_CHECK_AFTER).await;
                reach::answers_plain_text(endpoints, TLS_CHECK_LIMIT).await
            }
            .fuse()
        );
        loop {
            let left = self
                .retry
                .give_up()
                .saturating_duration_since(Instant::now());
            let answer = tokio::select! {
                answer = tokio::time::timeout(left, request()) => answer,
                Some(not_tls) = &mut plain_text => {
                    return Err(self.misconfigured(Box::new(not_tls)));
                }
            };
            match answer {
                Err(_elapsed) => {
                    return Err(self.failed(Box::new(reach::NoAnswer {
                        within: self.connect_timeout,
                    })));
                }
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) if transient(&e) && self.retry.pause_fits() => {
                    let within = self
                        .retry
                        .give_up()
                        .saturating_duration_since(Instant::now())
                        .min(TLS_CHECK_LIMIT);
                    // A connection that was made and then failed may be a server refusing
                    // the client certificate, or a TLS server spoken to in plain text: ask
                    // with a handshake of our own (once).
                    if !tonic_code::never_sent(&e)
                        && let Some(check) = self.tls_check.take()
                        && let Some(found) = check.run(within).await
                    {
                        return Err(found.into_error(|source| self.misconfigured(source)));
                    }
                    // Every endpoint refuses, or names a host that does not exist: waiting
                    // cannot help.
                    if let Some(unreachable) =
                        super::reach::unreachable(self.endpoints, within).await
                    {
                        return Err(self.failed(Box::new(unreachable)));
                    }
                    tracing::debug!(error = %e, "connect: an endpoint did not answer; {what} again");
                    // The checks above may have taken the time left: then the next attempt
                    // finds none, and says so.
                    if let Some(pause) = self.retry.next_pause() {
                        tokio::time::sleep(pause).await;
                    }
                }
                Ok(Err(e)) if reach::AuthNotEnabled::is(&e) => {
                    return Err(self.misconfigured(Box::new(reach::AuthNotEnabled(e))));
                }
                Ok(Err(e)) => {
                    if let Some(refused) = refused_of(&e) {
                        return Err(refused.into_error(|source| self.misconfigured(source)));
                    }
                    return Err(match etcd_err("connect", e) {
                        Error::Backend { source, .. } => self.failed(source),
                        other => other,
                    });
                }
            }
        }
    }

    fn failed(&self, source: BoxError) -> Error {
        Error::Connect {
            endpoints: self.endpoints.to_vec(),
            source,
        }
    }

    fn misconfigured(&self, source: BoxError) -> Error {
        Error::Misconfigured {
            endpoints: self.endpoints.to_vec(),
            source,
        }
    }
}

/// Whether a request only reads, or changes state (then a failure after sending it leaves its
/// outcome unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

/// An entry's create revision: its position (its token carries the store epoch above it).
fn revision(entry: &Entry) -> i64 {
    i64::try_from(entry.position().get()).unwrap_or(i64::MAX)
}

impl EtcdBackend {
    /// The entry `kv` is: its position the create revision, its token the create revision in
    /// the store's current epoch.
    fn to_entry(&self, kv: &KeyValue) -> Entry {
        let create = u64::try_from(kv.create_revision()).unwrap_or(0);
        // The exact key: foreign clients may write keys that are not UTF-8, and a wait or a
        // compare on a lossy copy of such a key would name a key that does not exist.
        Entry::new(
            kv.key(),
            kv.value(),
            Position::new(create),
            self.token(create),
            (kv.lease() != 0).then_some(LeaseId::new(kv.lease())),
        )
    }

    /// The token of create revision `create` in the current epoch.
    fn token(&self, create: u64) -> FencingToken {
        self.inner
            .epochs
            .token(create)
            .unwrap_or(FencingToken::new(create))
    }

    fn first_kv(&self, resp: Option<&TxnOpResponse>) -> Option<Entry> {
        match resp {
            Some(TxnOpResponse::Get(get)) => get.kvs().first().map(|kv| self.to_entry(kv)),
            _ => None,
        }
    }

    /// The entry `key` an enqueue transaction `resp` created (at its revision), and its
    /// predecessor as the transaction read it (none: the entry is the head).
    fn created(
        &self,
        resp: &etcd_client::TxnResponse,
        key: String,
        value: &[u8],
        lease: LeaseId,
        predecessor: Option<Entry>,
    ) -> Result<Enqueued> {
        let rev = resp.header().map_or(0, |h| h.revision());
        let rev = u64::try_from(rev).map_err(|_| malformed("enqueue"))?;
        let entry = Entry::new(key, value, Position::new(rev), self.token(rev), Some(lease));
        Ok(Enqueued::new(entry, predecessor.is_none(), predecessor))
    }
}

fn queue_prefix(queue: &str) -> String {
    format!("{queue}/")
}

/// The prefix of the queue an entry belongs to (`<queue>/`), from its exact key.
fn prefix_of(entry: &Entry) -> Vec<u8> {
    let mut prefix = queue_of_bytes(entry.key_bytes()).to_vec();
    prefix.push(b'/');
    prefix
}

fn oldest_first(limit: i64) -> GetOptions {
    by_creation(SortOrder::Ascend, limit)
}

fn newest_first(limit: i64) -> GetOptions {
    by_creation(SortOrder::Descend, limit)
}

/// A prefix read sorted by create revision (queue order), at most `limit` keys (0: all).
fn by_creation(order: SortOrder, limit: i64) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, order)
        .with_limit(limit)
}

fn malformed(op: &'static str) -> Error {
    Error::Backend {
        op,
        source: "etcd answered a transaction without the expected responses".into(),
        at: Default::default(),
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    /// An indexed entry's key (`<name>/_q/<sequence>.<tag>`) belongs to `<name>`, whichever
    /// layout this backend writes; any other key to the part before its last `/`.
    fn queue_of_key<'k>(&self, key: &'k str) -> &'k str {
        indexed::parse(key.as_bytes()).map_or_else(|| queue_of(key), |(queue, _, _)| queue)
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        if ttl.is_zero() {
            return Err(Error::InvalidArgument(
                "lease TTL must be greater than zero",
            ));
        }
        // A new session learns of a store that forgot (and of its grace) before it is
        // granted anything.
        self.confirm_epoch("grant_lease").await?;
        // etcd counts whole seconds: round up so that the lease is never shorter than asked.
        let secs =
            i64::try_from(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).unwrap_or(i64::MAX);
        // A retried grant may leave an extra lease behind; it holds nothing and expires.
        let (resp, _) = self
            .write("grant_lease", |mut c| async move {
                c.lease_grant(secs, None).await
            })
            .await?;
        Ok(Lease::new(
            LeaseId::new(resp.id()),
            Duration::from_secs(u64::try_from(resp.ttl()).unwrap_or(0)),
        ))
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>> {
        let result = self
            .call("keep_alive", |mut c| async move {
                // Opening the stream renews once; renew again to learn the TTL.
                let (mut keeper, mut stream) = c.lease_keep_alive(lease.get()).await?;
                keeper.keep_alive().await?;
                // A stream that ends without an answer says nothing about the lease: a
                // transient failure, retried, never "lease gone".
                stream.message().await?.map(|r| r.ttl()).ok_or_else(|| {
                    etcd_client::Error::IoError(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "keep-alive stream closed without an answer",
                    ))
                })
            })
            .await;
        match result {
            Ok(ttl) if ttl > 0 => {
                // A lease that a restore brought back renews like any other: only the epoch
                // marker, read after the renewal was sent, tells that the store went back
                // (its sessions are then lost, this one with them).
                self.confirm_epoch("keep_alive").await?;
                Ok(Some(Duration::from_secs(ttl.unsigned_abs())))
            }
            // etcd answers TTL <= 0 for a lease it no longer has.
            Ok(_) | Err(Error::SessionLost(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        // Idempotent, so retried like a read: "already gone" after an attempt that was
        // applied is the answer wanted.
        let result = self
            .call("revoke_lease", |mut c| async move {
                c.lease_revoke(lease.get()).await
            })
            .await;
        match result {
            Ok(_) | Err(Error::SessionLost(_)) => {
                let mut fences = self.inner.fences.lock().unwrap_or_else(|p| p.into_inner());
                fences.remove(&lease.get());
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn enqueue(
        &self,
        queue: &str,
        tag: &str,
        lease: LeaseId,
        value: &[u8],
    ) -> Result<Enqueued> {
        if self.indexed() {
            return self.enqueue_indexed(queue, tag, lease, value).await;
        }
        let key = format!("{queue}/{tag}");
        let fence = fence_key(lease);
        // Created now: read the newest entry *before* the put, which is our predecessor (or
        // none: we are the head), so a waiter can start waiting without another read. The
        // put applies only while the lease's fence is where this process last saw it.
        // ... and only in the store epoch this client is in: a store that forgot grants
        // nothing to a request from before (see `epoch.rs`).
        let txn = |fence_seen: i64, epoch: &Epoch| {
            Txn::new()
                .when([
                    Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                    Compare::mod_revision(fence.as_str(), CompareOp::Equal, fence_seen),
                    Self::in_epoch(epoch),
                ])
                .and_then([
                    TxnOp::get(queue_prefix(queue), Some(newest_first(1))),
                    TxnOp::put(
                        key.as_str(),
                        value,
                        Some(PutOptions::new().with_lease(lease.get())),
                    ),
                ])
                .or_else([
                    TxnOp::get(key.as_str(), None),
                    TxnOp::get(queue_prefix(queue), Some(oldest_first(1))),
                    TxnOp::get(fence.as_str(), None),
                    Self::read_marker(),
                ])
        };
        for _ in 0..FENCE_RACES {
            let epoch = self.epoch().await?;
            // Create-if-absent: a retry after an attempt that was applied finds the entry, so
            // the flag says nothing here. A retry first moves the fence, so that an earlier
            // attempt still on its way cannot apply after the entry is released.
            let sent = std::sync::atomic::AtomicBool::new(false);
            let sent_at = Instant::now();
            let (resp, _) = self
                .write("enqueue", |mut c| {
                    let retry = sent.swap(true, Ordering::SeqCst);
                    let (txn, epoch) = (&txn, &epoch);
                    async move {
                        if retry {
                            self.put_fence(&mut c, lease).await?;
                        }
                        c.txn(txn(self.fence_seen(lease), epoch)).await
                    }
                })
                .await?;
            self.saw_header(resp.header(), true, sent_at).await?;
            let ops = resp.op_responses();
            if let Some(TxnOpResponse::Get(get)) = ops.get(if resp.succeeded() { 0 } else { 1 }) {
                self.read_keys(get, true);
            }
            if resp.succeeded() {
                let predecessor = self.first_kv(resp.op_responses().first());
                return self.created(&resp, key, value, lease, predecessor);
            }
            // The store is in another epoch: this session is from before it.
            if self.marker_moved(&resp, 3, &epoch).await? {
                return Err(Error::SessionLost(LostReason::StoreReset));
            }
            // Deleted between the compare and the read cannot happen inside a transaction.
            if let Some(entry) = self.first_kv(ops.first()) {
                let is_head = self
                    .first_kv(ops.get(1))
                    .is_some_and(|h| h.token() == entry.token());
                return Ok(Enqueued::new(entry, is_head, None));
            }
            // No entry, so the fence had moved: this process's record of it is behind (an
            // answer to moving it was lost). Catch up and create again: nothing was applied.
            let fence_now = match ops.get(2) {
                Some(TxnOpResponse::Get(get)) => get.kvs().first().map(|kv| kv.mod_revision()),
                _ => return Err(malformed("enqueue")),
            };
            match fence_now {
                Some(revision) => self.fenced_at(lease, revision),
                // Gone while this process had moved it: deleted from outside (the lease's
                // end would have failed the put). Set it again, at a revision no earlier
                // request carries.
                None => self.move_fence(lease).await?,
            }
        }
        Err(Error::Backend {
            op: "enqueue",
            source: "the lease's fence kept moving under the enqueue".into(),
            at: Default::default(),
        }
        .at_endpoint(&self.label()))
    }

    /// Moves the lease's fence on first, so that no enqueue of this lease sent before can
    /// apply after the answer (see `EtcdBackend::move_fence`).
    async fn abandon(&self, queue: &str, tag: &str, lease: LeaseId) -> Result<Option<Entry>> {
        match self.move_fence(lease).await {
            // A lease that ended took its entries, and no late put can attach to it.
            Ok(()) | Err(Error::SessionLost(_)) => {}
            Err(e) => return Err(e),
        }
        self.find_entry(queue, tag).await
    }

    async fn find_entry(&self, queue: &str, tag: &str) -> Result<Option<Entry>> {
        if self.indexed() {
            return self.find_entry_indexed(queue, tag).await;
        }
        let key = format!("{queue}/{tag}");
        let sent = Instant::now();
        let resp = self
            .call("find_entry", |mut c| {
                let key = key.clone();
                async move { c.get(key, None).await }
            })
            .await?;
        self.saw_header(resp.header(), false, sent).await?;
        self.epoch().await?;
        Ok(resp.kvs().first().map(|kv| self.to_entry(kv)))
    }

    async fn predecessor(&self, mine: &Entry) -> Result<Option<Entry>> {
        if self.indexed() && indexed::parse(mine.key_bytes()).is_some() {
            return self.predecessor_indexed(mine).await;
        }
        let before = newest_first(1).with_max_create_revision(revision(mine) - 1);
        let resp = self
            .if_live(
                "predecessor",
                mine,
                vec![TxnOp::get(prefix_of(mine), Some(before))],
            )
            .await?;
        if !resp.succeeded() {
            return Err(Error::EntryGone {
                key: mine.key().to_owned(),
            });
        }
        if let Some(TxnOpResponse::Get(get)) = resp.op_responses().first() {
            self.read_keys(get, true);
        }
        Ok(self.first_kv(resp.op_responses().first()))
    }

    async fn ahead(&self, queue: &str, mine: &Entry, limit: usize) -> Result<Vec<Entry>> {
        if self.in_own_indexed_queue(queue, mine) {
            return Ok(self
                .ahead_indexed("ahead", queue, mine, limit, None)
                .await?
                .0);
        }
        Ok(self.ahead_txn("ahead", queue, mine, limit, None).await?.0)
    }

    async fn ahead_and_read(
        &self,
        queue: &str,
        mine: &Entry,
        limit: usize,
        key: &str,
    ) -> Result<(Vec<Entry>, Option<Vec<u8>>)> {
        if self.in_own_indexed_queue(queue, mine) {
            return self
                .ahead_indexed("ahead_and_read", queue, mine, limit, Some(key))
                .await;
        }
        self.ahead_txn("ahead_and_read", queue, mine, limit, Some(key))
            .await
    }

    async fn was_head(&self, mine: &Entry) -> Result<bool> {
        if self.indexed() && indexed::parse(mine.key_bytes()).is_some() {
            return self.was_head_indexed(mine).await;
        }
        // A serializable read, answered by whichever member receives it without a round of
        // consensus: it does not wait behind writes in flight (the next contender's enqueue
        // usually is), which is most of a handoff's cost on a busy lock. Trusted only when it
        // shows `mine` and nothing older; a lagging member shows the predecessor still there
        // or `mine` not yet, and the caller falls back to the linearizable read.
        // Cheaper in consensus, not in keys: a read filtered and sorted by create revision
        // makes etcd fetch every key under the prefix before it applies the limit, so on a
        // queue n deep this reads n keys (a drain of n waiters reads O(n²); #39). No read of
        // the Go layout, whose keys are named by lease, finds the oldest key for less.
        let prefix = prefix_of(mine);
        // Keys and revisions are all it looks at: no values (an election's can be large).
        let newest_two = newest_first(2)
            .with_max_create_revision(revision(mine))
            .with_keys_only()
            .with_serializable();
        // The epoch marker in the same read (a transaction of serializable reads is served
        // serializably): a state of another epoch than this client's says nothing.
        let Some(epoch) = self.inner.epochs.current() else {
            return Ok(false);
        };
        let txn = Txn::new().and_then([
            TxnOp::get(prefix, Some(newest_two)),
            TxnOp::get(epoch::MARKER, Some(GetOptions::new().with_serializable())),
        ]);
        // One attempt: a failed hint is "not known", and the authoritative read that
        // follows it has the retries.
        let resp = self
            .call_within("was_head", Duration::ZERO, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        let kvs = |i: usize| match resp.op_responses().get(i) {
            Some(TxnOpResponse::Get(get)) => get.kvs().to_vec(),
            _ => Vec::new(),
        };
        if let Some(TxnOpResponse::Get(get)) = resp.op_responses().first() {
            self.read_keys(get, true);
        }
        let marker = kvs(1);
        if marker.first().map(KeyValue::value) != Some(epoch.encode().as_bytes()) {
            return Ok(false);
        }
        Ok(match &kvs(0)[..] {
            [only] => only.create_revision() == revision(mine) && only.key() == mine.key_bytes(),
            _ => false,
        })
    }

    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        // Register with the shared watch stream; once the watch is confirmed, check that the
        // entry still exists unless the watch is older than the entry: a deletion after that
        // point is delivered.
        let mut backoff = Backoff::new();
        loop {
            let registration = self
                .inner
                .watches
                .register(entry.key_bytes(), revision(entry));
            let Ok(coverage) = registration.ready.await else {
                tracing::debug!(key = %entry.key(), backoff = ?backoff.peek(), "watch not established; retrying");
                backoff.wait().await;
                continue;
            };
            // A watch that existed before this incarnation was created has reported (or will
            // report) its deletion: no read needed. That is the usual case in a FIFO queue,
            // where the predecessor's key name is watched from one cycle to the next.
            // (The read is boxed: this future is parked on `fired` for as long as the wait
            // lasts, and should not carry a request's size all that time.)
            let covered = coverage.since.is_some_and(|w| revision(entry) > w);
            if !covered
                && !Box::pin(self.if_live("wait_gone", entry, vec![]))
                    .await?
                    .succeeded()
            {
                return Ok(());
            }
            match registration.fired.await {
                Ok(Fired::Gone) => return Ok(()),
                Ok(Fired::Recheck) | Err(_) => {
                    tracing::debug!(key = %entry.key(), "watch lost; re-reading and watching again");
                }
            }
        }
    }

    async fn head(&self, queue: &str) -> Result<Option<Entry>> {
        Ok(self.entries_limited(queue, 1).await?.into_iter().next())
    }

    async fn entries(&self, queue: &str) -> Result<Vec<Entry>> {
        self.entries_limited(queue, 0).await
    }

    async fn entries_under(&self, prefix: &str) -> Result<Vec<Entry>> {
        // Every key under the prefix bound to a lease: entries (baton's and etcdctl's, Go's);
        // plain keys (a semaphore's limit, fences) have none. baton's own bookkeeping keys
        // (`_baton-...`) are left out.
        let options = if prefix.is_empty() {
            GetOptions::new().with_all_keys()
        } else {
            GetOptions::new().with_prefix()
        };
        let resp = self
            .call("entries_under", |mut c| {
                let options = options.clone();
                async move { c.get(prefix, Some(options)).await }
            })
            .await?;
        self.epoch().await?;
        Ok(resp
            .kvs()
            .iter()
            .filter(|kv| kv.lease() != 0 && !kv.key().starts_with(b"_baton-"))
            .map(|kv| self.to_entry(kv))
            .collect())
    }

    async fn init_store(&self) -> Result<bool> {
        EtcdBackend::init_store(self).await
    }

    async fn delete_entry(&self, entry: &Entry) -> Result<bool> {
        let mut deletes = vec![TxnOp::delete(entry.key_bytes(), None)];
        // An indexed entry's tag goes with it.
        deletes.extend(self.tag_key_of(entry).map(|tag| TxnOp::delete(tag, None)));
        self.write_if_live("delete_entry", entry, deletes).await
    }

    async fn update_entry(&self, entry: &Entry, value: &[u8]) -> Result<bool> {
        let put = TxnOp::put(
            entry.key_bytes(),
            value,
            Some(PutOptions::new().with_ignore_lease()),
        );
        self.write_if_live("update_entry", entry, vec![put]).await
    }

    async fn guarded(&self, entry: &Entry, ops: &[WriteOp]) -> Result<bool> {
        let ops: Vec<TxnOp> = ops
            .iter()
            .map(|op| match op {
                WriteOp::Put { key, value } => TxnOp::put(key.as_str(), value.as_slice(), None),
                WriteOp::Delete { key } => TxnOp::delete(key.as_str(), None),
            })
            .collect();
        // No ops: an ownership check, a read.
        if ops.is_empty() {
            return Ok(self.if_live("guarded", entry, ops).await?.succeeded());
        }
        self.write_if_live("guarded", entry, ops).await
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let resp = self
            .call("read", |mut c| async move { c.get(key, None).await })
            .await?;
        Ok(resp.kvs().first().map(|kv| kv.value().to_vec()))
    }

    async fn swap(&self, key: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<bool> {
        let compare = match expected {
            None => Compare::create_revision(key, CompareOp::Equal, 0),
            Some(value) => Compare::value(key, CompareOp::Equal, value),
        };
        let txn = Txn::new()
            .when([compare])
            .and_then([TxnOp::put(key, new, None)]);
        let (resp, maybe_applied) = self.write_txn("swap", txn).await?;
        if resp.succeeded() {
            Ok(true)
        } else if maybe_applied {
            Err(Error::OutcomeUnknown {
                op: "swap",
                source: "an attempt failed after it may have been applied, and the retry found the value changed".into(),
                at: Default::default(),
            }
            .at_endpoint(&self.label()))
        } else {
            Ok(false)
        }
    }

    async fn wait_value(&self, key: &str, seen: Option<&[u8]>) -> Result<Option<Vec<u8>>> {
        // One watch per key for the whole backend (see `value`); this waiter follows it.
        let (_keep, mut values) =
            self.inner
                .values
                .subscribe(key, &self.inner.reach, &self.inner.requests);
        loop {
            let known = values.borrow_and_update().clone();
            if let Some(value) = known
                && value.as_deref() != seen
            {
                // The shared watch may not have caught up with the caller's own read yet:
                // confirm before answering, so that a lagging watch does not wake it in a
                // loop.
                let now = self.read(key).await?;
                if now.as_deref() != seen {
                    return Ok(now);
                }
            }
            // The sender is held by `_keep`: this ends only if the backend is gone.
            values.changed().await.map_err(|_| Error::Unavailable)?;
        }
    }

    async fn lease_ttl(&self, lease: LeaseId) -> Result<Option<Duration>> {
        let resp = self
            .call("lease_ttl", |mut c| async move {
                c.lease_time_to_live(lease.get(), None).await
            })
            .await?;
        // etcd answers -1 for a lease it does not know.
        Ok(u64::try_from(resp.ttl()).ok().map(Duration::from_secs))
    }

    fn epochs(&self) -> Option<&StoreEpochs> {
        Some(&self.inner.epochs)
    }

    fn observe_head(&self, queue: &str) -> BoxStream<'static, Result<HeadEvent>> {
        let observer = Observer {
            backend: self.clone(),
            prefix: queue_prefix(queue),
            mirror: QueueMirror::default(),
            pending: VecDeque::new(),
            resume_from: None,
            stream: None,
            member: None,
            snapshotted: false,
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

/// The state of one [`Backend::observe_head`] stream: a copy of the queue kept from a
/// snapshot plus a prefix watch, driven by whoever polls the stream (no task of its own).
///
/// While the consumer does not poll, etcd holds the watch's events; a consumer that falls far
/// behind is caught up from etcd's history, so nothing is lost unless that history is
/// compacted meanwhile. Then the watch is canceled, the observer reports
/// [`HeadEvent::Skipped`] and starts again from a snapshot.
struct Observer {
    backend: EtcdBackend,
    prefix: String,
    mirror: QueueMirror,
    /// Events worked out but not yet handed out (one watch response can hold several).
    pending: VecDeque<Result<HeadEvent>>,
    /// The first revision not yet seen, where a watch (re)starts: `None` means a snapshot
    /// is needed first. Always `Some` while `stream` is open.
    resume_from: Option<i64>,
    stream: Option<etcd_client::WatchStream>,
    /// The member `stream` is open on (`None`: the balanced client, a single endpoint).
    member: Option<usize>,
    /// A snapshot was reported: starting over from another one skips what came between.
    snapshotted: bool,
    /// Wait this long before the next attempt (after a failure).
    delay: Option<Duration>,
    backoff: Backoff,
}

impl Observer {
    async fn next_event(&mut self) -> Result<HeadEvent> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return event;
            }
            if let Some(delay) = self.delay.take() {
                tokio::time::sleep(delay).await;
            }
            self.step().await?;
        }
    }

    fn failed(&mut self) {
        self.delay = Some(self.backoff.next_delay());
    }

    /// One step: take a snapshot, open the watch, or read one response.
    async fn step(&mut self) -> Result<()> {
        let Some(stream) = self.stream.as_mut() else {
            let Some(start) = self.resume_from else {
                return self.snapshot().await;
            };
            let options = WatchOptions::new().with_prefix().with_start_revision(start);
            let prefix = self.prefix.as_str();
            let reach = &self.backend.inner.reach;
            let member = reach.pick();
            let opened = reach
                .ask(member, |mut c| async move {
                    c.watch(prefix, Some(options)).await
                })
                .await;
            match opened {
                Ok(stream) => {
                    self.stream = Some(stream);
                    self.member = member;
                }
                Err(e) => {
                    tracing::debug!(prefix = %self.prefix, error = %e, "observe: watch failed; retrying");
                    self.failed();
                }
            }
            return Ok(());
        };
        let resp = match stream.message().await {
            Ok(Some(resp)) => resp,
            broken @ (Ok(None) | Err(_)) => {
                // Broken: resume from the first revision not yet seen, losing nothing (on
                // another member if this one stopped answering).
                if let Err(e) = &broken {
                    self.backend.inner.reach.broke(self.member, e);
                }
                self.stream = None;
                self.failed();
                return Ok(());
            }
        };
        if resp.canceled() {
            // Compacted (or refused): the events in between cannot be replayed.
            tracing::debug!(prefix = %self.prefix, compact = resp.compact_revision(), "observe: watch canceled; re-reading");
            self.stream = None;
            self.resume_from = None;
            return Ok(());
        }
        self.backoff.reset();
        let events = resp.events();
        let mut next = self.resume_from.unwrap_or(0);
        for (i, ev) in events.iter().enumerate() {
            let Some(kv) = ev.kv() else { continue };
            next = next.max(kv.mod_revision() + 1);
            self.mirror.apply(match ev.event_type() {
                EventType::Put => QueueChange::Put(self.backend.to_entry(kv)),
                EventType::Delete => QueueChange::Delete(kv.key().to_vec()),
            });
            // Report once a revision is complete: the events of one transaction (a lease
            // revoke, a prefix delete) share a revision, and the heads in between never
            // existed.
            let revision_done = events
                .get(i + 1)
                .and_then(|n| n.kv())
                .is_none_or(|n| n.mod_revision() != kv.mod_revision());
            if revision_done && let Some(head) = self.mirror.head_change() {
                self.pending.push_back(Ok(head));
            }
        }
        self.resume_from = Some(next);
        Ok(())
    }

    async fn snapshot(&mut self) -> Result<()> {
        let prefix = self.prefix.clone();
        let snapshot = self
            .backend
            .call("observe", |mut c| {
                let prefix = prefix.clone();
                async move { c.get(prefix, Some(oldest_first(0))).await }
            })
            .await;
        let resp = match snapshot {
            Ok(resp) => resp,
            Err(e) => {
                self.failed();
                return Err(e);
            }
        };
        self.mirror.reset(
            resp.kvs()
                .iter()
                .map(|kv| self.backend.to_entry(kv))
                .collect(),
        );
        if self.snapshotted {
            self.pending.push_back(Ok(HeadEvent::Skipped));
            self.mirror.forget_reported();
        }
        self.snapshotted = true;
        if let Some(head) = self.mirror.head_change() {
            self.pending.push_back(Ok(head));
        }
        self.resume_from = Some(resp.header().map_or(0, |h| h.revision()) + 1);
        Ok(())
    }
}

impl EtcdBackend {
    /// The `limit` entries of `queue` just before `mine` (newest first) and, if asked, the
    /// plain key `key`, in one transaction that runs only while `mine` exists.
    async fn ahead_txn(
        &self,
        op: &'static str,
        queue: &str,
        mine: &Entry,
        limit: usize,
        key: Option<&str>,
    ) -> Result<(Vec<Entry>, Option<Vec<u8>>)> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let before = newest_first(limit).with_max_create_revision(revision(mine) - 1);
        let mut ops = vec![TxnOp::get(queue_prefix(queue), Some(before))];
        ops.extend(key.map(|key| TxnOp::get(key, None)));
        let resp = self.if_live(op, mine, ops).await?;
        if !resp.succeeded() {
            return Err(Error::EntryGone {
                key: mine.key().to_owned(),
            });
        }
        if let Some(TxnOpResponse::Get(get)) = resp.op_responses().first() {
            self.read_keys(get, true);
        }
        let kvs = |i: usize| match resp.op_responses().get(i) {
            Some(TxnOpResponse::Get(get)) => get.kvs().to_vec(),
            _ => Vec::new(),
        };
        let value = kvs(1).first().map(|kv| kv.value().to_vec());
        Ok((kvs(0).iter().map(|kv| self.to_entry(kv)).collect(), value))
    }

    async fn entries_limited(&self, queue: &str, limit: i64) -> Result<Vec<Entry>> {
        let prefix = queue_prefix(queue);
        let sent = Instant::now();
        let resp = self
            .call("entries", |mut c| {
                let prefix = prefix.clone();
                async move { c.get(prefix, Some(oldest_first(limit))).await }
            })
            .await?;
        self.saw_header(resp.header(), false, sent).await?;
        self.epoch().await?;
        self.inner
            .keys_read
            .fetch_add(u64::try_from(resp.count()).unwrap_or(0), Ordering::Relaxed);
        Ok(resp.kvs().iter().map(|kv| self.to_entry(kv)).collect())
    }

    /// Whether `mine` is an indexed entry of `queue` itself (not of a queue nested in it).
    fn in_own_indexed_queue(&self, queue: &str, mine: &Entry) -> bool {
        self.indexed() && indexed::parse(mine.key_bytes()).is_some_and(|(q, _, _)| q == queue)
    }
}

#[cfg(test)]
mod tests {
    use super::check_version;
    use super::tonic_code::{is_transient, never_sent};

    #[test]
    fn etcd_older_than_3_4_is_refused_with_its_version() {
        for old in ["3.3.27", "3.2.0", "2.3.8"] {
            let refused = check_version(old);
            assert!(
                matches!(&refused, Err(crate::Error::UnsupportedVersion { version, .. }) if version == old),
                "{old}: {refused:?}"
            );
        }
        // Compared as numbers, not as text: 3.10 is newer than 3.4.
        for supported in [
            "3.4.0",
            "3.4.23",
            "3.5.17",
            "3.10.0",
            "4.0.0",
            "not-a-version",
        ] {
            assert!(check_version(supported).is_ok(), "{supported}");
        }
    }
    use etcd_client::Error;

    fn status(code: tonic::Code, message: &str) -> Error {
        Error::GRpcStatus(tonic::Status::new(code, message))
    }

    /// What a member restart does to a request in flight (seen in the soak: an `unlock` failed
    /// with `Cancelled`, "connection closed", while a quorum was up): retried, and counted as
    /// possibly applied, never as a definite "not applied".
    #[test]
    fn a_request_cut_off_by_a_closed_connection_is_retried_and_may_have_been_applied() {
        let cut = status(tonic::Code::Cancelled, "operation was canceled");
        assert!(is_transient(&cut));
        assert!(!never_sent(&cut));
    }

    #[test]
    fn refused_connections_were_never_sent_and_denials_are_final() {
        let refused = status(tonic::Code::Unavailable, "tcp connect error");
        assert!(is_transient(&refused) && never_sent(&refused));
        let denied = status(tonic::Code::PermissionDenied, "permission denied");
        assert!(!is_transient(&denied) && !never_sent(&denied));
    }
}
