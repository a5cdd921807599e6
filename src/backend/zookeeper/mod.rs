//! The ZooKeeper backend (feature `zookeeper`): a lease is a ZooKeeper session, an entry an
//! ephemeral sequential node, its position the node's czxid and its token that czxid in the
//! store epoch (`epoch.rs`). docs/zookeeper.md says what it promises, which peers' layouts it
//! shares, and what its sessions cost.

mod auth;
mod epoch;
mod leases;
mod names;
mod observe;
mod tls;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::time::Instant;
use zookeeper_client::{
    Client, EventType, MultiReadResult, MultiWriteError, MultiWriteResult, SaslOptions, Stat,
};

use self::auth::NodeAcl;

pub use self::names::ZkLayout;
use super::{
    Backend, Enqueued, Entry, FencingToken, HeadEvent, Lease, LeaseId, Position, WriteOp, queue_of,
};
use crate::epoch::{Epoch, StoreEpochs};
use crate::error::{BoxError, Error, LostReason, Result};
use crate::retry::Retry;

type ZkError = zookeeper_client::Error;

/// How many reads one multi-read carries.
const MULTI_READ_MAX: usize = 512;

/// How often a create is retried when the queue's parent node vanishes between creating it
/// and creating the entry (a container reaped in between).
const PARENT_RETRIES: usize = 8;

/// Options for [`ZkBackend::connect`].
///
/// ```
/// # use std::time::Duration;
/// let options = baton::ZkOptions::new()
///     .with_layout(baton::ZkLayout::Kazoo)
///     .with_request_timeout(Duration::from_secs(2));
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ZkOptions {
    layout: ZkLayout,
    connect_timeout: Duration,
    request_timeout: Duration,
    retry_for: Duration,
    session_timeout: Duration,
    restart_grace: Duration,
    tls: tls::TlsFiles,
    sasl: Option<auth::Credentials>,
}

impl Default for ZkOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl ZkOptions {
    /// Defaults: Curator's layout, connect timeout 5 s, request timeout 5 s, retries for up to
    /// 10 s, a 10 s session for the backend's own connection (reads, waits, plain keys), and
    /// a restart grace of 60 s (the default session TTL).
    pub fn new() -> Self {
        ZkOptions {
            layout: ZkLayout::Curator,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            retry_for: Duration::from_secs(10),
            session_timeout: Duration::from_secs(10),
            restart_grace: crate::SessionOptions::DEFAULT_TTL,
            tls: tls::TlsFiles::default(),
            sasl: None,
        }
    }

    /// Authenticate with SASL DIGEST-MD5 as `user` with `password` (a user of the servers'
    /// JAAS `Server` section, `DigestLoginModule`), with `zk://` or `zks://`; the same as
    /// `user:password@` in the connect string, which then must not hold credentials too.
    /// Every node baton then creates carries an ACL that lets only this identity write or
    /// delete under it, and anyone read (docs/zookeeper.md, "SASL"): every client of a lock
    /// must authenticate as the same user. The password is never printed (`Debug` shows the
    /// user only). Checked at connect: an empty user or password is refused.
    pub fn with_sasl_digest(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.sasl = Some(auth::Credentials::unchecked(user.into(), password.into()));
        self
    }

    /// The CA certificate(s), PEM, that signed the servers' certificates: what a `zks://`
    /// connect string (TLS to every server, ZooKeeper's `secureClientPort`) trusts, and all
    /// it trusts. `zks://` needs it; `zk://` refuses it. Checked at connect.
    pub fn with_ca_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(pem.into());
        self
    }

    /// The client certificate (chain) and its private key, PEM, presented to servers that
    /// ask for one (`ssl.clientAuth=need` or `want`), with `zks://` only. Checked at
    /// connect: the key must be the certificate's.
    pub fn with_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Whose node names the entries take: [`ZkLayout::Curator`] (the default) or
    /// [`ZkLayout::Kazoo`]. Every client of a lock must use the same layout: a queue holding
    /// nodes of the other layout is refused with [`Error::ForeignLayout`].
    pub fn with_layout(mut self, layout: ZkLayout) -> Self {
        self.layout = layout;
        self
    }

    /// How long connecting (the backend's connection, and each lease's session) may take.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The limit for one attempt of one request. Waits are not limited by it.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How long a request that fails with a transient error (connection lost, timeout) is
    /// retried, with backoff, before the error is returned. Keep it below your session TTL.
    pub fn with_retry_for(mut self, duration: Duration) -> Self {
        self.retry_for = duration;
        self
    }

    /// The session timeout of the backend's own connection, which holds no entry (default
    /// 10 s). Leases have sessions of their own, with the TTL they are granted.
    pub fn with_session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// How long nothing is granted after ZooKeeper lost its state (a server or the whole
    /// ensemble restarted without its data, a data dir restored from an older copy), and
    /// after the first use of a ZooKeeper that baton has never marked: a holder from before
    /// may still believe it holds until its session would have expired. The client that finds
    /// the store so begins a new *store epoch* ([`StoreEpochs`]), counted from the epoch's
    /// start on the ZooKeeper leader's clock; every client waits it out.
    ///
    /// ## Warning
    /// At least the longest session TTL of every client of this ZooKeeper: a shorter grace
    /// lets a new holder overlap one from before. An operator who knows a ZooKeeper is new
    /// marks it first ([`ZkBackend::init_store`]), and its first use waits nothing.
    pub fn with_restart_grace(mut self, grace: Duration) -> Self {
        self.restart_grace = grace;
        self
    }
}

/// The ZooKeeper backend: ZooKeeper 3.6 or newer (containers, multi-reads, persistent
/// watches), a single server or an ensemble.
///
/// Mapping (see docs/zookeeper.md): a **lease is a session** (one connection; its negotiated
/// timeout is the TTL, every answered request renews it, revoking closes it); an **entry is
/// an ephemeral sequential node** `/<queue>/<name>` named in Curator's or kazoo's layout
/// ([`ZkOptions::with_layout`]); its **position is its czxid**, which within one queue node
/// follows the sequence number ZooKeeper appends and also orders the entries of nested names;
/// its **token is that czxid in the store epoch** (above every token of earlier epochs: a
/// ZooKeeper that lost its data starts its zxids over); a **wait** is a read with a data watch
/// on the entry ahead; a **guarded write** is a `multi` that checks the store epoch and that
/// the entry exists. Parents are created as container nodes, which ZooKeeper removes once
/// they are empty. Plain keys live apart, one node each under `/_baton-keys`.
///
/// **Store epochs.** A ZooKeeper that lost its state (restarted without its data, restored
/// from an older copy) begins a new epoch ([`StoreEpochs`]): every session from before is lost
/// ([`LostReason::StoreReset`]), nothing is granted for the restart grace
/// ([`ZkOptions::with_restart_grace`]), and so is the first use of a ZooKeeper baton never
/// marked: mark a new one with [`init_store`](Self::init_store).
///
/// **Connections.** The backend has one connection of its own (reads, waits, deletes, plain
/// keys), and each lease one more: share a [`Session`](crate::Session) between the locks of a
/// process rather than opening one per lock. A lease can be used through any `ZkBackend` of
/// the process that granted it.
///
/// `ZkBackend` is a handle: clones share the connection.
#[derive(Clone)]
pub struct ZkBackend {
    inner: Arc<Shared>,
}

struct Shared {
    /// The connect string the client takes: `host:port[,host:port][/chroot]`.
    connect: String,
    /// `zks` (TLS, with these options) or `zk`.
    tls: Option<zookeeper_client::TlsOptions>,
    /// SASL DIGEST-MD5 (its `Debug` shows the password: never print it).
    sasl: Option<SaslOptions>,
    options: ZkOptions,
    base: std::sync::Mutex<Client>,
    /// Held while the backend's own session is replaced.
    reconnect: tokio::sync::Mutex<()>,
    requests: AtomicU64,
    /// What this client remembers of the store's epochs (see `epoch.rs`).
    epochs: StoreEpochs,
    /// The ZooKeeper leader's clock as the last write's answer showed it.
    clock: std::sync::Mutex<Option<epoch::ServerClock>>,
    /// Held while this client reads the marker to enter an epoch (or begin one).
    establishing: tokio::sync::Mutex<()>,
    /// The last conclusive look at the marker through a session that connects now, and when
    /// it ended; held while one is made.
    probed: tokio::sync::Mutex<Option<(Instant, epoch::Look)>>,
}

impl Shared {
    /// The ACL of the nodes this backend creates: the authenticated identity's with SASL,
    /// open without.
    fn acl(&self) -> NodeAcl {
        match self.sasl {
            Some(_) => NodeAcl::Owner,
            None => NodeAcl::Open,
        }
    }
}

impl std::fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkBackend")
            .field("connect", &self.inner.connect)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

/// Whether a request only reads, or changes state (then a failure after sending it leaves
/// its outcome unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

/// What an attempt of a request ends with, besides success: a ZooKeeper error (classified
/// by the retry loop) or baton's own verdict (returned as it is).
#[derive(Debug)]
pub(super) enum Failure {
    Zk(ZkError),
    /// A transient failure of a read made before a write was sent: the write was not
    /// applied.
    Unsent(ZkError),
    Stop(Error),
}

impl Failure {
    /// A failure of a read that comes before the write: the write was not sent.
    fn unsent(e: impl Into<Failure>) -> Failure {
        match e.into() {
            Failure::Zk(e) => Failure::Unsent(e),
            other => other,
        }
    }
}

impl From<ZkError> for Failure {
    fn from(e: ZkError) -> Self {
        Failure::Zk(e)
    }
}

/// Whether a failed request may be sent again: the connection broke or timed out, or the
/// server pushed back.
fn is_transient(e: &ZkError) -> bool {
    matches!(
        e,
        ZkError::ConnectionLoss
            | ZkError::Timeout
            | ZkError::Custom(_)
            | ZkError::Throttled
            | ZkError::SessionMoved
            | ZkError::NoHosts
            | ZkError::NotReadOnly
    )
}

/// The session of the client is over (a terminal state: nothing was sent).
fn is_over(e: &ZkError) -> bool {
    matches!(e, ZkError::SessionExpired | ZkError::ClientClosed)
}

pub(super) fn zk_err(op: &'static str, e: ZkError) -> Error {
    match e {
        // Authenticated (or not asked to be), but a node's ACL refuses this identity.
        ZkError::NoAuth => Error::Permission {
            source: format!(
                "{e}: a node's ACL does not let this identity do it (with SASL, every client of \
                 a lock must authenticate as the user that created its nodes)"
            )
            .into(),
        },
        ZkError::AuthFailed => Error::Auth {
            source: Box::new(e),
        },
        _ => Error::Backend {
            op,
            source: Box::new(e),
            at: Default::default(),
        },
    }
}

fn unknown(op: &'static str, source: BoxError) -> Error {
    Error::OutcomeUnknown {
        op,
        source,
        at: Default::default(),
    }
}

/// The session's fence node is gone while the session lives: deleted from outside. No entry
/// can be created safely any more; the lease is over.
fn fence_gone() -> Error {
    tracing::warn!("the session's fence node under /_baton-sessions was deleted: ending the lease");
    Error::SessionLost(LostReason::Revoked)
}

/// What an enqueue attempt ends with when one of its requests failed with `e`, the entry not
/// known to be created: a session that is over is lost; a transient failure is a lost answer
/// (`Ok(Err)`: the entry may exist); anything else was refused, and created nothing.
fn attempt_failed(e: ZkError) -> Result<Result<Entry, ZkError>> {
    if is_over(&e) {
        Err(Error::SessionLost(LostReason::Revoked))
    } else if is_transient(&e) {
        Ok(Err(e))
    } else {
        Err(zk_err("enqueue", e))
    }
}

fn gone(entry: &Entry) -> Error {
    Error::EntryGone {
        key: entry.key().to_owned(),
    }
}

/// An entry as read: its position is the czxid, its token the czxid in the store epoch
/// `epochs` is in, its lease its ephemeral owner.
pub(super) fn to_entry(key: String, data: Vec<u8>, stat: &Stat, epochs: &StoreEpochs) -> Entry {
    let zxid = u64::try_from(stat.czxid).unwrap_or(0);
    Entry::new(
        key,
        data,
        Position::new(zxid),
        epochs.token(zxid).unwrap_or(FencingToken::new(zxid)),
        (stat.ephemeral_owner != 0).then(|| LeaseId::new(stat.ephemeral_owner)),
    )
}

/// An entry known by its key only (its node's name, read in a listing): no value, no lease,
/// position and token 0 (no czxid is 0). Enough to wait for it to go: a node's name is one
/// incarnation, since every attempt names its node with random bits.
fn by_name_only(key: String) -> Entry {
    Entry::new(
        key,
        Vec::new(),
        Position::new(0),
        FencingToken::new(0),
        None,
    )
}

/// `mine`'s node name and sequence number, if it is an entry of `layout` directly in `queue`.
fn own_name<'m>(layout: ZkLayout, queue: &str, mine: &'m Entry) -> Option<(&'m str, i64)> {
    let name = mine.key().strip_prefix(queue)?.strip_prefix('/')?;
    Some((name, layout.sequence(name)?))
}

/// Whether `client`'s session is connected (not refused, not waiting for a server).
fn is_connected(client: &Client) -> bool {
    matches!(
        client.state(),
        zookeeper_client::SessionState::SyncConnected
            | zookeeper_client::SessionState::ConnectedReadOnly
    )
}

/// A queue as [`collect`] read it.
#[derive(Debug, Default)]
pub(super) struct Listing {
    /// Every entry, oldest first, each with its data version.
    pub(super) entries: Vec<(Entry, i32)>,
    /// The epoch marker's data, read with the entries when asked for (`None`: absent).
    pub(super) marker: Option<Vec<u8>>,
}

/// Adds the read of the epoch marker to `reader` if `marker` asks for it and it has not been
/// added yet.
fn read_marker_with(
    reader: &mut zookeeper_client::MultiReader<'_>,
    marker: &mut bool,
) -> Result<bool, ZkError> {
    if !std::mem::take(marker) {
        return Ok(false);
    }
    reader.add_get_data(epoch::MARKER)?;
    Ok(true)
}

/// The marker's data from the answer to its read.
fn marker_of(result: Option<MultiReadResult>) -> Result<Option<Vec<u8>>, Failure> {
    match result {
        Some(MultiReadResult::Data { data, .. }) => Ok(Some(data)),
        Some(MultiReadResult::Error {
            err: ZkError::NoNode,
        }) => Ok(None),
        Some(MultiReadResult::Error { err }) => Err(err.into()),
        _ => Err(ZkError::UnexpectedError("a multi-read answered out of order".into()).into()),
    }
}

/// Every entry of `queue` (its node and the nodes of nested names), oldest first, each with
/// its data version, tokens in the epoch `epochs` is in. With `strict`, nodes named in the
/// other layout are refused. `known` is an entry this client has just created (data version
/// 0): it is taken as it is, not read again, so that a queue holding only it costs one
/// request (a listing), as Curator's does. With `marker`, the epoch marker is read in the
/// same request as the entries (the first multi-read; one more request if there is none).
pub(super) async fn collect(
    client: &Client,
    layout: ZkLayout,
    queue: &str,
    strict: bool,
    known: Option<&Entry>,
    epochs: &StoreEpochs,
    marker: bool,
) -> Result<Listing, Failure> {
    let mut dirs = vec![queue.to_owned()];
    let mut out = Vec::new();
    let (mut want_marker, mut seen_marker) = (marker, None);
    while let Some(dir) = dirs.pop() {
        let children = match client.list_children(&format!("/{dir}")).await {
            Ok(children) => children,
            Err(ZkError::NoNode) => continue,
            Err(e) => return Err(e.into()),
        };
        if let Some(foreign) = children
            .iter()
            .find(|c| strict && layout.other().sequence(c).is_some())
        {
            return Err(Failure::Stop(Error::ForeignLayout {
                queue: queue.to_owned(),
                node: format!("{dir}/{foreign}"),
                layout: layout.other().name(),
            }));
        }
        let children: Vec<String> = children
            .into_iter()
            .filter(|name| match known {
                Some(entry)
                    if entry.key().len() == dir.len() + 1 + name.len()
                        && entry.key().starts_with(dir.as_str())
                        && entry.key().ends_with(name.as_str()) =>
                {
                    out.push((entry.clone(), 0));
                    false
                }
                _ => true,
            })
            .collect();
        for chunk in children.chunks(MULTI_READ_MAX) {
            let mut reader = client.new_multi_reader();
            let with_marker = read_marker_with(&mut reader, &mut want_marker)?;
            for name in chunk {
                reader.add_get_data(&format!("/{dir}/{name}"))?;
            }
            let mut results = reader.commit().await?.into_iter();
            if with_marker {
                seen_marker = marker_of(results.next())?;
            }
            for (name, result) in chunk.iter().zip(results) {
                match result {
                    MultiReadResult::Data { data, stat } => {
                        let key = format!("{dir}/{name}");
                        if layout.sequence(name).is_some() {
                            out.push((to_entry(key, data, &stat, epochs), stat.version));
                        } else if stat.num_children > 0 {
                            dirs.push(key);
                        }
                    }
                    MultiReadResult::Error {
                        err: ZkError::NoNode,
                    } => {}
                    MultiReadResult::Error { err } => return Err(err.into()),
                    _ => {}
                }
            }
        }
    }
    if want_marker {
        // Nothing was read with it.
        let mut reader = client.new_multi_reader();
        read_marker_with(&mut reader, &mut want_marker)?;
        seen_marker = marker_of(reader.commit().await?.into_iter().next())?;
    }
    out.sort_by_key(|(e, _)| e.position());
    Ok(Listing {
        entries: out,
        marker: seen_marker,
    })
}

/// Opens a session on `connect` with `timeout`, within `limit`.
/// How long a connect runs before [`ZkBackend::connect`] asks the servers whether any can be
/// reached at all (a healthy connect is done by then, and the check costs nothing).
const UNREACHABLE_CHECK_AFTER: Duration = Duration::from_millis(100);

async fn open(
    connect: &str,
    tls: Option<&zookeeper_client::TlsOptions>,
    sasl: Option<&SaslOptions>,
    timeout: Duration,
    limit: Duration,
) -> Result<Client, BoxError> {
    // The client's default idle limit is 2/5 of the session timeout, and after a lost
    // connection it may pick the same frozen member again: two such tries cost 0.8 x the
    // TTL, past what baton's Session tolerates before it calls the lease lost (measured in
    // the ensemble pause scenario). A fifth of the timeout leaves room for four tries; pings
    // go out every 3/8 of it.
    let mut connector = Client::connector()
        .with_session_timeout(timeout)
        .with_connection_timeout(timeout / 5);
    if let Some(sasl) = sasl {
        connector = connector.with_sasl(sasl.clone());
    }
    let connecting = async {
        match tls {
            Some(tls) => {
                connector
                    .with_tls(tls.clone())
                    .secure_connect(connect)
                    .await
            }
            None => connector.connect(connect).await,
        }
    };
    match tokio::time::timeout(limit, connecting).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(Box::new(e)),
        Err(elapsed) => Err(Box::new(elapsed)),
    }
}

/// What a session that did not open (`open`'s error) is: a refused authentication (or one
/// the server requires) is [`Error::Auth`], anything else a backend failure of `op`.
fn not_opened(op: &'static str, source: BoxError, with_credentials: bool) -> Error {
    if matches!(source.downcast_ref::<ZkError>(), Some(ZkError::AuthFailed)) {
        return Error::Auth {
            source: auth::refusal(with_credentials).into(),
        };
    }
    Error::Backend {
        op,
        source,
        at: Default::default(),
    }
}

/// With SASL, whether the server authenticated the session: one that has no SASL
/// authentication provider (or no JAAS `Server` section) answers the SASL exchange without
/// authenticating anyone, and would refuse every node baton creates (their ACL names the
/// session's identities, and it has none). Asked with WhoAmI (ZooKeeper 3.7+); an older
/// server, or one that does not answer within `limit`, is not asked: its first create tells.
async fn check_authenticated(client: &Client, endpoint: &str, limit: Duration) -> Result<()> {
    match tokio::time::timeout(limit, client.list_auth_users()).await {
        Ok(Ok(users)) if !users.iter().any(|user| user.scheme() == "sasl") => {
            Err(Error::Misconfigured {
                endpoints: vec![endpoint.to_owned()],
                source: "the server did not authenticate the session with SASL: it has no SASL \
                         authentication provider (authProvider.1=org.apache.zookeeper.server.\
                         auth.SASLAuthenticationProvider) or no JAAS Server section"
                    .into(),
            })
        }
        _ => Ok(()),
    }
}

/// With a chroot in `connect`, whether its node exists: a missing one is a configuration
/// error, named, not the "node not exists" of the first create under it (every path baton
/// uses is under it, and baton does not create it: that would hide a mistyped chroot).
async fn check_chroot(client: &Client, scheme: &str, connect: &str) -> Result<()> {
    let Some(chroot) = connect
        .split_once('/')
        .map(|(_, path)| format!("/{}", path.trim_end_matches('/')))
        .filter(|chroot| chroot != "/")
    else {
        return Ok(());
    };
    match client.check_stat("/").await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(Error::Misconfigured {
            endpoints: vec![format!("{scheme}://{connect}")],
            source: format!(
                "the chroot `{chroot}` does not exist on this ZooKeeper: create it (`zkCli.sh create {chroot} \"\"`) or correct the connect string"
            )
            .into(),
        }),
        Err(e) => Err(Error::Connect {
            endpoints: vec![format!("{scheme}://{connect}")],
            source: Box::new(e),
        }),
    }
}

/// Creates the fence node of `client`'s session (and, once, the node above it) and returns
/// its data version: every entry's create checks it (see `ZkBackend::move_fence`). With it,
/// the create's stat when its answer came (not when an earlier attempt had created the node).
async fn make_fence(client: &Client, acl: NodeAcl, limit: Duration) -> Result<(i32, Option<Stat>)> {
    let path = names::fence_path(client.session_id().0);
    let ephemeral = acl.ephemeral();
    let mut retry = Retry::new("grant_lease", limit);
    let give_up = retry.give_up();
    loop {
        let attempt = async {
            match client.create(&path, &[], &ephemeral).await {
                Ok((stat, _)) => Ok(Some((0, Some(stat)))),
                // Ours: an earlier attempt whose answer was lost.
                Err(ZkError::NodeExists) => {
                    Ok(client.check_stat(&path).await?.map(|s| (s.version, None)))
                }
                Err(ZkError::NoNode) => {
                    match client.create(names::SESSIONS, &[], &acl.persistent()).await {
                        Ok(_) | Err(ZkError::NodeExists) => Ok(None),
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            }
        };
        let error = match tokio::time::timeout_at(give_up, attempt).await {
            Ok(Ok(Some(fence))) => return Ok(fence),
            Ok(Ok(None)) => continue,
            Ok(Err(e)) if is_transient(&e) => Box::new(e) as BoxError,
            Ok(Err(e)) => return Err(zk_err("grant_lease", e)),
            Err(elapsed) => Box::new(elapsed),
        };
        let Some(pause) = retry.next_pause() else {
            return Err(retry.failed(error));
        };
        tokio::time::sleep(pause).await;
    }
}

impl ZkBackend {
    /// Connects to the ZooKeeper ensemble `connect`: `zk://host:port[,host:port][/chroot]`,
    /// or the same without `zk://` (a ZooKeeper connect string), or `zks://...` for TLS to
    /// every server (their `secureClientPort`), with the CA of
    /// [`ZkOptions::with_ca_cert`] (and the client certificate of
    /// [`ZkOptions::with_client_cert`] if the servers ask for one). The certificate must name
    /// the host connected to (an IP address too). With a chroot, every path baton uses is
    /// under it; the chroot node must exist. `user:password@` before the hosts
    /// (percent-encoded: `%40` for `@`), or [`ZkOptions::with_sasl_digest`], authenticates
    /// with SASL DIGEST-MD5; the nodes baton then creates are that identity's (docs/zookeeper.md).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for TLS options with `zk://`, `zks://` without a CA, or
    /// PEMs that do not parse (or a key that is not the certificate's);
    /// [`Error::Connect`] if the string is malformed or no server gives a session within
    /// the connect timeout, or at once if every server refuses the connection or names a host
    /// that does not exist (the source says which, in words); [`Error::Misconfigured`] if
    /// the chroot does not exist (it names the chroot), and at once if every server refuses
    /// the TLS handshake (a certificate not signed by the CA, or issued for another host),
    /// answers in plain text to `zks://`, or in TLS to `zk://`; [`Error::Auth`] at once if
    /// every server refuses the client certificate (or its absence); [`Error::Auth`] as soon as
    /// the server answers if it refuses the SASL credentials (an unknown user, a wrong
    /// password), or requires SASL (`enforce.auth.enabled`) and none were given;
    /// [`Error::InvalidArgument`] for credentials given both in the string and the options,
    /// an empty user or password, or `user@` without a password.
    ///
    /// # Cancel safety
    /// Cancel safe: a session opened by a dropped call is closed with it.
    pub async fn connect(connect: &str, options: ZkOptions) -> Result<ZkBackend> {
        let (scheme, connect) = match connect.strip_prefix("zks://") {
            Some(rest) => ("zks", rest),
            None => ("zk", connect.strip_prefix("zk://").unwrap_or(connect)),
        };
        // From here on the connect string holds no password: it is printed in errors.
        let (in_url, connect) = auth::split_credentials(connect)?;
        let credentials = match (in_url, &options.sasl) {
            (Some(_), Some(_)) => {
                return Err(Error::InvalidArgument(
                    "SASL credentials given twice: in the connect string (user:password@) and \
                     with ZkOptions::with_sasl_digest; give them once",
                ));
            }
            (Some(credentials), None) => Some(credentials),
            (None, Some(credentials)) => Some(credentials.checked()?),
            (None, None) => None,
        };
        let sasl = credentials.as_ref().map(auth::Credentials::sasl);
        let (tls, handshake) = match tls::client_tls(scheme == "zks", &options.tls)? {
            Some((tls, handshake)) => (Some(tls), Some(handshake)),
            None => (None, None),
        };
        let endpoint = format!("{scheme}://{connect}");
        let failed = |source| Error::Connect {
            endpoints: vec![endpoint.clone()],
            source,
        };
        // The client retries a refused server until the timeout: ask the servers ourselves,
        // once a healthy connect would have been made, whether waiting can help.
        let servers: Vec<String> = connect
            .split('/')
            .next()
            .unwrap_or_default()
            .split(',')
            .map(str::to_owned)
            .collect();
        // And whether each refuses the TLS handshake (or answers in the other protocol than
        // the scheme's): zookeeper-client retries that too.
        let hopeless = async {
            tokio::time::sleep(UNREACHABLE_CHECK_AFTER).await;
            if let Some(unreachable) =
                super::reach::unreachable(&servers, Duration::from_secs(1)).await
            {
                return Some(failed(Box::new(unreachable)));
            }
            let refused = tls::Probe::new(handshake.as_ref())
                .refused(&servers)
                .await?;
            Some(refused.misconfigured(vec![endpoint.clone()]))
        };
        let opening = open(
            &connect,
            tls.as_ref(),
            sasl.as_ref(),
            options.session_timeout,
            options.connect_timeout,
        );
        let client = tokio::select! {
            opened = opening => opened.map_err(|source| {
                if matches!(source.downcast_ref::<ZkError>(), Some(ZkError::AuthFailed)) {
                    Error::Auth {
                        source: format!(
                            "{endpoint}: {}",
                            auth::refusal(credentials.is_some())
                        )
                        .into(),
                    }
                } else if source.is::<tokio::time::error::Elapsed>() {
                    failed(
                        format!(
                            "no server gave a session within the connect timeout ({:?})",
                            options.connect_timeout
                        )
                        .into(),
                    )
                } else {
                    failed(source)
                }
            })?,
            Some(refused) = hopeless => return Err(refused),
        };
        check_chroot(&client, scheme, &connect).await?;
        if sasl.is_some() {
            check_authenticated(&client, &endpoint, options.request_timeout).await?;
        }
        let epochs = StoreEpochs::new(format!("ZooKeeper at {endpoint}"), options.restart_grace);
        // The store's epoch is looked at by the first request that needs it, so that an
        // operator's `init_store` can come first.
        Ok(ZkBackend {
            inner: Arc::new(Shared {
                connect,
                tls,
                sasl,
                options,
                base: std::sync::Mutex::new(client),
                reconnect: tokio::sync::Mutex::new(()),
                requests: AtomicU64::new(0),
                epochs,
                clock: std::sync::Mutex::new(None),
                establishing: tokio::sync::Mutex::new(()),
                probed: tokio::sync::Mutex::new(None),
            }),
        })
    }

    /// Marks this ZooKeeper as baton's: if it has no epoch marker, its first store epoch
    /// begins now **without a restart grace**. Returns whether it began one (`false`: the
    /// store was marked already, and nothing changed).
    ///
    /// Call it only for a ZooKeeper you know is new, or whose every baton client has stopped:
    /// the grace it skips is what keeps a newcomer from being granted while a holder from
    /// before (of a store that lost its data) still believes it holds.
    ///
    /// # Errors
    /// The backend's errors: [`Error::Backend`] when ZooKeeper cannot be reached or refuses
    /// the write (with a chroot, the chroot node must exist).
    ///
    /// # Cancel safety
    /// Cancel safe: the marker is written in one `multi`, or not at all.
    pub async fn init_store(&self) -> Result<bool> {
        Ok(self.establish_as("init_store", true).await?.1)
    }

    /// How many requests this backend (all its clones) has sent through its own connection,
    /// retries included.
    pub fn requests_sent(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// The layout this backend names entries in.
    pub fn layout(&self) -> ZkLayout {
        self.inner.options.layout
    }

    /// The start of the node name every entry of `tag` in `queue` gets, whatever the attempt:
    /// `_c_<first 18 characters of the UUID>-` (Curator) or the first 16 hex digits (kazoo).
    /// The rest of the name is random per attempt, so no two attempts share a name. This is
    /// how [`Backend::find_entry`] finds an entry whose create answer was lost.
    pub fn tag_prefix(&self, queue: &str, tag: &str) -> String {
        self.inner
            .options
            .layout
            .tag_prefix(names::tag_hash(queue, tag))
    }

    /// The server, for errors: `ZooKeeper at zk://<connect string>` (or `zks://`).
    fn label(&self) -> String {
        let scheme = if self.inner.tls.is_some() {
            "zks"
        } else {
            "zk"
        };
        format!("ZooKeeper at {scheme}://{}", self.inner.connect)
    }

    /// The backend's own client as it is now.
    fn current_base(&self) -> Client {
        self.inner
            .base
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The backend's own client, opening a new session if the last one ended.
    async fn base(&self) -> Result<Client> {
        let current = || self.current_base();
        let client = current();
        if !client.state().is_terminated() {
            return Ok(client);
        }
        drop(client);
        let _one = self.inner.reconnect.lock().await;
        let client = current();
        if !client.state().is_terminated() {
            return Ok(client);
        }
        tracing::info!(endpoint = %self.inner.connect, "ZooKeeper session of the backend ended; opening a new one");
        let options = &self.inner.options;
        let fresh = open(
            &self.inner.connect,
            self.inner.tls.as_ref(),
            self.inner.sasl.as_ref(),
            options.session_timeout,
            options.connect_timeout,
        )
        .await
        .map_err(|source| not_opened("connect", source, self.inner.sasl.is_some()))?;
        *self.inner.base.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        Ok(fresh)
    }

    /// Runs `f` on the backend's client until it answers, fails for good, or the retry
    /// budget is spent. Besides the answer, tells whether an earlier attempt failed after it
    /// may have been applied (only for [`Kind::Write`]).
    async fn attempts<T, F, Fut>(&self, op: &'static str, kind: Kind, f: F) -> Result<(T, bool)>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        self.attempts_here(op, kind, None, f)
            .await
            .map_err(|e| e.at_endpoint(&self.label()))
    }

    /// `sent`, when given, is set by `f` just before it sends its write: an attempt that
    /// times out before that was not applied.
    async fn attempts_here<T, F, Fut>(
        &self,
        op: &'static str,
        kind: Kind,
        sent: Option<&AtomicBool>,
        mut f: F,
    ) -> Result<(T, bool)>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let options = &self.inner.options;
        let mut retry = Retry::new(op, options.retry_for);
        loop {
            let error: BoxError = match self.base().await {
                Err(e) => Box::new(e),
                Ok(client) => {
                    self.inner.requests.fetch_add(1, Ordering::Relaxed);
                    if let Some(sent) = sent {
                        sent.store(false, Ordering::SeqCst);
                    }
                    match tokio::time::timeout(options.request_timeout, f(client)).await {
                        Ok(Ok(v)) => return Ok((v, retry.maybe_applied())),
                        Ok(Err(Failure::Stop(e))) => return Err(e),
                        Ok(Err(Failure::Unsent(e))) if is_transient(&e) || is_over(&e) => {
                            Box::new(e)
                        }
                        Ok(Err(Failure::Unsent(e) | Failure::Zk(e))) if is_transient(&e) => {
                            if kind == Kind::Write {
                                retry.may_have_applied();
                            }
                            Box::new(e)
                        }
                        // The session ended: the request was refused unsent; a new session
                        // is opened for the next attempt.
                        Ok(Err(Failure::Zk(e))) if is_over(&e) => Box::new(e),
                        Ok(Err(Failure::Zk(e) | Failure::Unsent(e))) => {
                            return Err(if retry.maybe_applied() {
                                retry.failed(Box::new(e))
                            } else {
                                zk_err(op, e)
                            });
                        }
                        Err(elapsed) => {
                            if kind == Kind::Write && sent.is_none_or(|s| s.load(Ordering::SeqCst))
                            {
                                retry.may_have_applied();
                            }
                            Box::new(elapsed)
                        }
                    }
                }
            };
            retry.pause(error, &self.inner.connect).await?;
        }
    }

    /// A conditional write: `Ok(true)` applied, `Ok(false)` its entry was gone,
    /// [`Error::OutcomeUnknown`] when an earlier attempt may have been applied and the last
    /// found the entry gone.
    async fn write_if_live<F, Fut>(&self, op: &'static str, f: F) -> Result<bool>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<bool, Failure>>,
    {
        self.write_if_live_flagged(op, None, f).await
    }

    /// [`write_if_live`](Self::write_if_live) for a write that reads first: `f` sets `sent`
    /// just before it sends the write.
    async fn write_if_live_flagged<F, Fut>(
        &self,
        op: &'static str,
        sent: Option<&AtomicBool>,
        f: F,
    ) -> Result<bool>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<bool, Failure>>,
    {
        let attempt = self
            .attempts_here(op, Kind::Write, sent, f)
            .await
            .map_err(|e| e.at_endpoint(&self.label()));
        match attempt? {
            (true, _) => Ok(true),
            (false, false) => Ok(false),
            (false, true) => Err(unknown(
                op,
                "an attempt failed after it may have been applied, and the retry found the entry gone"
                    .into(),
            )
            .at_endpoint(&self.label())),
        }
    }

    /// Reads `queue` through `client` (a lease's, whose own writes it sees) or, without one,
    /// through the backend's after a `sync`, with tokens in the current store epoch.
    async fn read_queue(
        &self,
        op: &'static str,
        client: Option<&Client>,
        queue: &str,
    ) -> Result<Vec<(Entry, i32)>> {
        self.epoch().await?;
        self.read_queue_as(op, client, queue, true, None, false)
            .await
    }

    /// [`read_queue`](Self::read_queue), tolerating nodes of the other layout unless `strict`.
    /// With `in_epoch`, for a read that decides a grant: the epoch marker is read with the
    /// entries, and a store in another epoch than this client's fails the read with
    /// [`Error::SessionLost`] ([`LostReason::StoreReset`]: every session from before is
    /// lost).
    async fn read_queue_as(
        &self,
        op: &'static str,
        client: Option<&Client>,
        queue: &str,
        strict: bool,
        known: Option<&Entry>,
        in_epoch: bool,
    ) -> Result<Vec<(Entry, i32)>> {
        let layout = self.inner.options.layout;
        let epochs = &self.inner.epochs;
        if let Some(client) = client {
            let client = client.clone();
            let read = self
                .lease_attempts(op, || {
                    let client = client.clone();
                    async move {
                        collect(&client, layout, queue, strict, known, epochs, in_epoch).await
                    }
                })
                .await;
            match read {
                Ok(listing) => {
                    if in_epoch {
                        // A lease's server may lag: a marker it shows otherwise is read
                        // again in sync with the leader before anything is concluded.
                        self.check_marker(op, listing.marker.as_deref(), false)
                            .await?;
                    }
                    return Ok(listing.entries);
                }
                Err(Error::SessionLost(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let dir = format!("/{queue}");
        let (listing, _) = self
            .attempts(op, Kind::Read, |client| {
                let dir = dir.clone();
                async move {
                    sync(&client, &dir).await?;
                    collect(&client, layout, queue, strict, None, epochs, in_epoch).await
                }
            })
            .await?;
        if in_epoch {
            self.check_marker(op, listing.marker.as_deref(), true)
                .await?;
        }
        Ok(listing.entries)
    }

    /// Runs a read on a lease's client, retrying transient failures; a session that ended is
    /// [`Error::SessionLost`].
    async fn lease_attempts<T, F, Fut>(&self, op: &'static str, mut f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let options = &self.inner.options;
        let mut retry = Retry::new(op, options.retry_for);
        loop {
            let error: BoxError = match tokio::time::timeout(options.request_timeout, f()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(Failure::Stop(e))) => return Err(e),
                Ok(Err(Failure::Zk(e) | Failure::Unsent(e))) if is_over(&e) => {
                    return Err(Error::SessionLost(LostReason::Revoked));
                }
                Ok(Err(Failure::Zk(e) | Failure::Unsent(e))) if is_transient(&e) => Box::new(e),
                Ok(Err(Failure::Zk(e) | Failure::Unsent(e))) => {
                    return Err(zk_err(op, e).at_endpoint(&self.label()));
                }
                Err(elapsed) => Box::new(elapsed),
            };
            let Some(pause) = retry.next_pause() else {
                return Err(retry.failed(error).at_endpoint(&self.label()));
            };
            tokio::time::sleep(pause).await;
        }
    }

    /// Deletes `key`'s node through the backend's client, best effort (a foreign session's
    /// node found under our protected prefix).
    async fn discard(&self, key: &str) {
        let path = format!("/{key}");
        let deleted = self
            .attempts("discard", Kind::Write, |client| {
                let path = path.clone();
                async move {
                    match client.delete(&path, None).await {
                        Ok(()) | Err(ZkError::NoNode) => Ok(()),
                        Err(e) => Err(Failure::Zk(e)),
                    }
                }
            })
            .await;
        if let Err(e) = deleted {
            tracing::warn!(key, error = %e, "cannot delete a node of another session found under our prefix");
        }
    }

    /// Creates the entry node for one enqueue attempt, in a `multi` that moves the session's
    /// fence on from the version this process last saw (see [`move_fence`](Self::move_fence));
    /// `Ok(Err(_))` when the answer was lost (the node may exist).
    /// The `multi` is also conditional on `epoch` (its node exists): a store in another epoch
    /// creates nothing, and the caller's session, from before, is lost
    /// ([`LostReason::StoreReset`]).
    ///
    /// The fence's setData answers with its stat whatever the server's version: its mzxid is
    /// the `multi`'s zxid, which is the new node's czxid. So no second request reads the
    /// node's stat on servers that answer a create inside a `multi` without it
    /// (ZOOKEEPER-4026, 3.8.x: the server of the fixtures), and the enqueue costs one request
    /// as Curator's create does.
    async fn create_entry(
        &self,
        held: &leases::Held,
        epoch: &Epoch,
        queue: &str,
        prefix: &str,
        value: &[u8],
    ) -> Result<Result<Entry, ZkError>> {
        let client = &held.client;
        let dir = format!("/{queue}");
        let path = format!("{dir}/{prefix}");
        let options = self.inner.acl().ephemeral_sequential();
        let limit = self.inner.options.request_timeout;
        let in_epoch = epoch::epoch_node(epoch);
        // One create of this session at a time: each expects the fence version the last left.
        let _one = held.creating.lock().await;
        for _ in 0..PARENT_RETRIES {
            let mut writer = client.new_multi_writer();
            let fenced_at = held.fence_version();
            writer
                .add_check_version(&in_epoch, -1)
                .and_then(|()| writer.add_set_data(&held.fence, &[], Some(fenced_at)))
                .and_then(|()| writer.add_create(&path, value, &options))
                .map_err(|e| zk_err("enqueue", e))?;
            let sent = Instant::now();
            let created = tokio::time::timeout(limit, writer.commit()).await;
            let failed = match created {
                Ok(Ok(results)) => {
                    let mut results = results.into_iter().skip(1);
                    let (
                        Some(MultiWriteResult::SetData { stat: fence }),
                        Some(MultiWriteResult::Create { path, stat }),
                    ) = (results.next(), results.next())
                    else {
                        return Err(Error::Backend {
                            op: "enqueue",
                            source: "ZooKeeper answered a create with something else".into(),
                            at: Default::default(),
                        });
                    };
                    held.fenced_at(fence.version);
                    // Some servers answer a create in a `multi` without its stat
                    // (ZOOKEEPER-4026): the fence's stat tells what it would say. All the
                    // operations of a `multi` are one transaction with one zxid.
                    let stat = if stat.is_invalid() {
                        Stat {
                            czxid: fence.mzxid,
                            mzxid: fence.mzxid,
                            pzxid: fence.mzxid,
                            ctime: fence.mtime,
                            mtime: fence.mtime,
                            version: 0,
                            cversion: 0,
                            aversion: 0,
                            ephemeral_owner: client.session_id().0,
                            data_length: i32::try_from(value.len()).unwrap_or(i32::MAX),
                            num_children: 0,
                        }
                    } else {
                        stat
                    };
                    let key = path.trim_start_matches('/').to_owned();
                    observe::record(&path, stat.version, value);
                    // The entry's czxid is the store's position: below one seen before the
                    // create was sent, the store went back (the session with it).
                    self.wrote(&fence, sent)?;
                    if self.inner.epochs.current() != Some(*epoch) {
                        return Err(Error::SessionLost(LostReason::StoreReset));
                    }
                    return Ok(Ok(self.to_entry(key, value.to_vec(), &stat)));
                }
                // The store is in another epoch: this session is from before it.
                Ok(Err(MultiWriteError::OperationFailed {
                    index: 0,
                    source: ZkError::NoNode,
                })) => return Err(self.epoch_refused(epoch)),
                // The fence moved since this process last read it (an answer to moving it was
                // lost): read it again and create again. Nothing was applied.
                Ok(Err(MultiWriteError::OperationFailed {
                    index: 1,
                    source: ZkError::BadVersion,
                })) => match tokio::time::timeout(limit, client.check_stat(&held.fence)).await {
                    Ok(Ok(Some(stat))) => {
                        held.fenced_at(stat.version);
                        continue;
                    }
                    Ok(Ok(None)) => return Err(fence_gone()),
                    Ok(Err(e)) => return attempt_failed(e),
                    Err(_) => return Ok(Err(ZkError::Timeout)),
                },
                Ok(Err(MultiWriteError::OperationFailed {
                    index: 1,
                    source: ZkError::NoNode,
                })) => return Err(fence_gone()),
                Ok(Err(
                    MultiWriteError::OperationFailed { source, .. }
                    | MultiWriteError::RequestFailed { source },
                )) => source,
                Err(_) => return Ok(Err(ZkError::Timeout)),
            };
            match failed {
                // The queue node is missing (never made, or a container reaped since): make
                // it and its parents as containers, and create again.
                ZkError::NoNode => {
                    match tokio::time::timeout(
                        limit,
                        client.mkdir(&dir, &self.inner.acl().container()),
                    )
                    .await
                    {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => return attempt_failed(e),
                        Err(_) => return Ok(Err(ZkError::Timeout)),
                    }
                }
                ZkError::NoChildrenForEphemerals => {
                    return Err(Error::InvalidArgument(
                        "a queue cannot be nested under an entry (an ephemeral node)",
                    ));
                }
                e => return attempt_failed(e),
            }
        }
        Err(Error::Backend {
            op: "enqueue",
            source: "the queue's parent node kept vanishing before the entry was created".into(),
            at: Default::default(),
        })
    }

    /// Moves `held`'s fence on (a new data version), so that no create sent before this
    /// returns lands after it: each create checks the version it was sent with. A create can
    /// reach ZooKeeper long after its client gave up on it: held up on a connection the
    /// client left (ZOOKEEPER-22), and even let through by a member that a stale reconnection
    /// made the session's again (ZOOKEEPER-2886). One sent earlier and applied is before the
    /// move in ZooKeeper's order, so a read on the session after this sees it.
    async fn move_fence(&self, held: &leases::Held) -> Result<()> {
        let sent = Instant::now();
        let stat = self
            .lease_attempts("enqueue", || async {
                match held.client.set_data(&held.fence, &[], None).await {
                    Ok(stat) => Ok(stat),
                    Err(ZkError::NoNode) => Err(Failure::Stop(fence_gone())),
                    Err(e) => Err(Failure::Zk(e)),
                }
            })
            .await?;
        held.fenced_at(stat.version);
        self.wrote(&stat, sent)
    }

    async fn enqueue_here(
        &self,
        queue: &str,
        tag: &str,
        lease: LeaseId,
        value: &[u8],
    ) -> Result<Enqueued> {
        names::check_name(queue)?;
        if tag.is_empty() || tag.contains('/') {
            return Err(Error::InvalidArgument(
                "a tag is one non-empty path segment",
            ));
        }
        let held = leases::get(lease.get()).ok_or(Error::SessionLost(LostReason::Revoked))?;
        let client = held.client.clone();
        // The create is conditional on the store epoch this client is in.
        let epoch = self.epoch().await?;
        let layout = self.inner.options.layout;
        let id = names::NodeId::new(queue, tag);
        let prefix = layout.prefix(id);
        let tag_prefix = layout.tag_prefix(id.tag);
        let mut retry = Retry::new("enqueue", self.inner.options.retry_for);
        let mut maybe_created = false;
        let (mut mine, mut entries) = loop {
            if maybe_created {
                // The last create's answer was lost: fence it off, so that it cannot land
                // later, then look for its node before creating again.
                match self.move_fence(&held).await {
                    Ok(()) => {}
                    Err(e @ Error::SessionLost(_)) => return Err(e),
                    Err(e) => return Err(unknown("enqueue", Box::new(e))),
                }
                let entries = match self.read_queue("enqueue", Some(&client), queue).await {
                    Ok(entries) => entries,
                    Err(e @ Error::SessionLost(_)) => return Err(e),
                    Err(e) => return Err(unknown("enqueue", Box::new(e))),
                };
                let found = entries.iter().find(|(e, _)| {
                    queue_of(e.key()) == queue
                        && e.key()[queue.len() + 1..].starts_with(&prefix)
                        && e.lease() == Some(lease)
                });
                if let Some((e, _)) = found {
                    break (e.clone(), entries);
                }
            }
            let created = match self
                .create_entry(&held, &epoch, queue, &prefix, value)
                .await
            {
                Ok(created) => created,
                // The session ended: its nodes went with it.
                Err(e @ Error::SessionLost(_)) => return Err(e),
                Err(e) if maybe_created => return Err(unknown("enqueue", Box::new(e))),
                Err(e) => return Err(e),
            };
            let failure = match created {
                Ok(entry) => {
                    match self.by_name(&client, queue, &entry, &tag_prefix).await {
                        Ok(Some(predecessor)) => {
                            tracing::debug!(key = %entry.key(), token = %entry.token(), head = predecessor.is_none(), "ZooKeeper entry created");
                            return Ok(Enqueued::new(entry, predecessor.is_none(), predecessor));
                        }
                        // The names do not tell: the entries are read.
                        Ok(None) => {}
                        Err(e @ Error::ForeignLayout { .. }) => {
                            // Not applied: the entry is taken back before saying so.
                            self.discard(entry.key()).await;
                            return Err(e);
                        }
                        Err(e @ Error::SessionLost(_)) => return Err(e),
                        Err(e) => return Err(unknown("enqueue", Box::new(e))),
                    }
                    let known = Some(&entry);
                    let read =
                        self.read_queue_as("enqueue", Some(&client), queue, true, known, false);
                    let entries = match read.await {
                        Ok(entries) => entries,
                        Err(Error::ForeignLayout {
                            queue: q,
                            node,
                            layout: l,
                        }) => {
                            // Not applied: the entry is taken back before saying so.
                            self.discard(entry.key()).await;
                            return Err(Error::ForeignLayout {
                                queue: q,
                                node,
                                layout: l,
                            });
                        }
                        Err(e) => return Err(unknown("enqueue", Box::new(e))),
                    };
                    break (entry, entries);
                }
                Err(e) => e,
            };
            maybe_created = true;
            retry.may_have_applied();
            let Some(pause) = retry.next_pause() else {
                return Err(retry.failed(Box::new(failure)));
            };
            tracing::debug!(error = %failure, queue, "ZooKeeper create failed; looking for its node");
            tokio::time::sleep(pause).await;
        };
        // Nodes of this tag: another session's are never adopted (CURATOR-604) but deleted;
        // an older one of ours (an earlier call with the same tag) is the entry.
        let ours_before: Vec<(Entry, bool)> = entries
            .iter()
            .filter(|(e, _)| {
                queue_of(e.key()) == queue
                    && e.key()[queue.len() + 1..].starts_with(&tag_prefix)
                    && !e.is_same_incarnation(&mine)
            })
            .map(|(e, _)| (e.clone(), e.lease() == Some(lease)))
            .collect();
        for (other, same_session) in ours_before {
            if !same_session {
                tracing::warn!(key = %other.key(), "a node of another session carries this tag's prefix: deleting it, not adopting it");
                self.discard(other.key()).await;
                entries.retain(|(e, _)| !e.is_same_incarnation(&other));
            } else if other.position() < mine.position() {
                self.discard(mine.key()).await;
                entries.retain(|(e, _)| !e.is_same_incarnation(&mine));
                mine = other;
            }
        }
        let predecessor = entries
            .iter()
            .rev()
            .find(|(e, _)| e.position() < mine.position())
            .map(|(e, _)| e.clone());
        tracing::debug!(key = %mine.key(), token = %mine.token(), head = predecessor.is_none(), "ZooKeeper entry created");
        Ok(Enqueued::new(mine, predecessor.is_none(), predecessor))
    }

    /// The predecessor of `mine` (just created by `client`'s session) from the names of the
    /// queue's children alone, as Curator finds it: one `getChildren`, no data read. Within
    /// one parent node the sequence suffix follows creation order (czxid order), so the
    /// predecessor is the child with the greatest suffix below mine. `Some(None)`: mine is
    /// the head. It comes back with its key only (see [`by_name_only`]).
    ///
    /// `None` when names do not tell, and the entries must be read: a child that is not an
    /// entry of this layout (a nested name, whose entries are ordered by czxid with ours),
    /// another node of this tag (whose session decides whether it is adopted or deleted), or
    /// mine not listed. A node of the other layout is [`Error::ForeignLayout`].
    async fn by_name(
        &self,
        client: &Client,
        queue: &str,
        mine: &Entry,
        tag_prefix: &str,
    ) -> Result<Option<Option<Entry>>> {
        let layout = self.inner.options.layout;
        let Some((my_name, my_seq)) = own_name(layout, queue, mine) else {
            return Ok(None);
        };
        let dir = format!("/{queue}");
        let children = self
            .lease_attempts("enqueue", || async {
                match client.list_children(&dir).await {
                    Ok(children) => Ok(Some(children)),
                    Err(ZkError::NoNode) => Ok(None),
                    Err(e) => Err(Failure::Zk(e)),
                }
            })
            .await?;
        let Some(children) = children else {
            return Ok(None);
        };
        let mut listed = false;
        let mut before: Option<(i64, &str)> = None;
        for child in &children {
            if child == my_name {
                listed = true;
                continue;
            }
            if layout.other().sequence(child).is_some() {
                return Err(Error::ForeignLayout {
                    queue: queue.to_owned(),
                    node: format!("{queue}/{child}"),
                    layout: layout.other().name(),
                });
            }
            let Some(seq) = layout.sequence(child) else {
                return Ok(None);
            };
            if child.starts_with(tag_prefix) {
                return Ok(None);
            }
            if seq < my_seq && before.is_none_or(|(b, _)| seq > b) {
                before = Some((seq, child));
            }
        }
        if !listed {
            return Ok(None);
        }
        Ok(Some(
            before.map(|(_, name)| by_name_only(format!("{queue}/{name}"))),
        ))
    }

    /// The entry a node read as `stat` is, its token in the current store epoch.
    fn to_entry(&self, key: String, data: Vec<u8>, stat: &Stat) -> Entry {
        to_entry(key, data, stat, &self.inner.epochs)
    }

    /// The client of `lease` if this process holds it and its session lives.
    fn lease_client(lease: Option<LeaseId>) -> Option<Client> {
        let held = leases::get(lease?.get())?;
        (!held.is_over()).then(|| held.client.clone())
    }

    /// The entries ahead of `mine`, newest first, read with the epoch marker: a queue read in
    /// another store epoch than this client's decides no grant.
    async fn ahead_here(&self, queue: &str, mine: &Entry, limit: usize) -> Result<Vec<Entry>> {
        names::check_name(queue)?;
        let client = Self::lease_client(mine.lease());
        self.epoch().await?;
        let entries = self
            .read_queue_as("ahead", client.as_ref(), queue, true, None, true)
            .await?;
        let inside = mine
            .key()
            .strip_prefix(queue)
            .is_some_and(|r| r.starts_with('/'));
        if inside {
            if !entries.iter().any(|(e, _)| e.is_same_incarnation(mine)) {
                return Err(gone(mine));
            }
        } else if !self.exists(client.as_ref(), mine).await? {
            return Err(gone(mine));
        }
        Ok(entries
            .into_iter()
            .rev()
            .filter(|(e, _)| e.position() < mine.position())
            .take(limit)
            .map(|(e, _)| e)
            .collect())
    }

    /// Whether `entry` (this incarnation) exists.
    async fn exists(&self, client: Option<&Client>, entry: &Entry) -> Result<bool> {
        let path = format!("/{}", entry.key());
        let czxid = i64::try_from(entry.position().get()).unwrap_or(-1);
        let check = |stat: Option<Stat>| stat.is_some_and(|s| s.czxid == czxid);
        if let Some(client) = client {
            let read = self
                .lease_attempts("ahead", || {
                    let (client, path) = (client.clone(), path.clone());
                    async move { Ok(client.check_stat(&path).await?) }
                })
                .await;
            match read {
                Ok(stat) => return Ok(check(stat)),
                Err(Error::SessionLost(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let (stat, _) = self
            .attempts("ahead", Kind::Read, |client| {
                let path = path.clone();
                async move {
                    sync(&client, &path).await?;
                    Ok(client.check_stat(&path).await?)
                }
            })
            .await?;
        Ok(check(stat))
    }
}

/// `sync` on `path`, or on the nearest existing ancestor: a read after it sees every write the
/// leader had committed when it was sent.
async fn sync(client: &Client, path: &str) -> Result<(), Failure> {
    let mut at = path;
    loop {
        match client.sync(at).await {
            Ok(()) => return Ok(()),
            Err(ZkError::NoNode) => match at.rfind('/') {
                Some(0) | None => return client.sync("/").await.map_err(Failure::Zk),
                Some(i) => at = &at[..i],
            },
            Err(e) => return Err(e.into()),
        }
    }
}

/// The keys node's children are created on demand: makes it when missing.
async fn make_keys_node(client: &Client, acl: NodeAcl) -> Result<(), Failure> {
    match client.create(names::KEYS, &[], &acl.persistent()).await {
        Ok(_) | Err(ZkError::NodeExists) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[async_trait]
impl Backend for ZkBackend {
    /// Names are paths relative to the chroot: one leading `/`, as ZooKeeper users write
    /// paths, is dropped (`/orders` is `<chroot>/orders`, the same lock as `orders`).
    fn recipe_name<'n>(&self, name: &'n str) -> &'n str {
        name.strip_prefix('/').unwrap_or(name)
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        if ttl.is_zero() {
            return Err(Error::InvalidArgument(
                "lease TTL must be at least one millisecond",
            ));
        }
        let sent = Instant::now();
        let client = open(
            &self.inner.connect,
            self.inner.tls.as_ref(),
            self.inner.sasl.as_ref(),
            ttl,
            self.inner.options.connect_timeout,
        )
        .await
        .map_err(|source| {
            not_opened("grant_lease", source, self.inner.sasl.is_some()).at_endpoint(&self.label())
        })?;
        let id = LeaseId::new(client.session_id().0);
        // On failure the client is dropped, and its session closed with it.
        let (fence, created) = make_fence(
            &client,
            self.inner.acl(),
            self.inner.options.connect_timeout,
        )
        .await
        .map_err(|e| e.at_endpoint(&self.label()))?;
        if let Some(stat) = created {
            // The server's clock, and the store's position: a store that went back ends every
            // session from before (this one is granted in the epoch entered below).
            let _ = self.wrote(&stat, sent);
        }
        // A new session learns of a store that forgot (and of its grace) before it is
        // granted anything.
        self.confirm_epoch("grant_lease", &client).await?;
        let held = leases::register(client, sent, fence);
        tracing::debug!(lease = %id, ttl = ?held.ttl, "ZooKeeper session opened as a lease");
        Ok(Lease::new(id, held.ttl))
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>> {
        let Some(held) = leases::get(lease.get()) else {
            return Ok(None);
        };
        let sent = Instant::now();
        if held.is_over() {
            leases::forget(lease.get(), &held);
            // A session that ended may be the first sign that the store forgot (a server
            // that lost its data and has since passed the session's zxid says it expired):
            // lost with that reason if so.
            let _ = self.probe(sent).await;
            return Ok(None);
        }
        if !is_connected(&held.client) {
            // Refused by a server that is behind it (one that lost its data: the client
            // library retries until 1.4 TTL has passed), or its server is down: a session
            // that connects now tells which. Nothing is sent on a disconnected session (it
            // would wait for a reconnection); the next try comes soon.
            self.probe(sent).await?;
            return Err(Error::Backend {
                op: "keep_alive",
                source: "the session is disconnected".into(),
                at: Default::default(),
            }
            .at_endpoint(&self.label()));
        }
        // A real round trip: its answer proves the server heard from the session after
        // `sent`, so the session lasts at least its timeout from then. The session's fence is
        // read, not the root: a session whose fence was deleted from outside can create no
        // entry safely, and is ended. The epoch marker comes in the same request: a session
        // a restore brought back renews, and only the marker tells its holder.
        let renewal = async {
            let mut reader = held.client.new_multi_reader();
            reader.add_get_data(&held.fence)?;
            reader.add_get_data(epoch::MARKER)?;
            let mut results = reader.commit().await?.into_iter();
            let fence = match results.next() {
                Some(MultiReadResult::Data { .. }) => true,
                Some(MultiReadResult::Error {
                    err: ZkError::NoNode,
                }) => false,
                Some(MultiReadResult::Error { err }) => return Err(err),
                _ => {
                    return Err(ZkError::UnexpectedError(
                        "a multi-read answered out of order".into(),
                    ));
                }
            };
            let marker = match marker_of(results.next()) {
                Ok(marker) => marker,
                Err(Failure::Zk(e) | Failure::Unsent(e)) => return Err(e),
                Err(Failure::Stop(_)) => None,
            };
            Ok((fence, marker))
        };
        let answer = tokio::time::timeout(self.inner.options.request_timeout, renewal).await;
        match answer {
            Ok(Ok((true, marker))) => {
                held.renewed(sent);
                self.check_marker("keep_alive", marker.as_deref(), false)
                    .await?;
                Ok(Some(held.ttl))
            }
            Ok(Ok((false, _))) => {
                tracing::warn!(%lease, "the session's fence node under /_baton-sessions was deleted: ending the lease");
                // The session closes once no one holds its client.
                drop(held);
                leases::close(lease.get(), self.inner.options.request_timeout).await;
                Ok(None)
            }
            Ok(Err(e)) if is_over(&e) => {
                leases::forget(lease.get(), &held);
                let _ = self.probe(sent).await;
                Ok(None)
            }
            Ok(Err(e)) => {
                if is_transient(&e) {
                    self.probe(sent).await?;
                }
                Err(zk_err("keep_alive", e).at_endpoint(&self.label()))
            }
            Err(elapsed) => {
                self.probe(sent).await?;
                Err(Error::Backend {
                    op: "keep_alive",
                    source: Box::new(elapsed),
                    at: Default::default(),
                }
                .at_endpoint(&self.label()))
            }
        }
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        if !leases::close(lease.get(), self.inner.options.request_timeout).await {
            tracing::warn!(%lease, "ZooKeeper did not confirm the session's close in time; it expires by itself");
        }
        Ok(())
    }

    async fn enqueue(
        &self,
        queue: &str,
        tag: &str,
        lease: LeaseId,
        value: &[u8],
    ) -> Result<Enqueued> {
        self.enqueue_here(queue, tag, lease, value)
            .await
            .map_err(|e| e.at_endpoint(&self.label()))
    }

    async fn find_entry(&self, queue: &str, tag: &str) -> Result<Option<Entry>> {
        // Nothing can exist under a name ZooKeeper refuses (an enqueue of it was refused before
        // sending anything): the cleanup after such a refusal must not wait for ever.
        if names::check_name(queue).is_err() {
            return Ok(None);
        }
        let prefix = self.tag_prefix(queue, tag);
        let owner = names::tag_owner(tag).map(LeaseId::new);
        let client = Self::lease_client(owner);
        // Foreign nodes are tolerated: the entry looked for may be one whose enqueue was
        // refused because of them.
        self.epoch().await?;
        let entries = self
            .read_queue_as("find_entry", client.as_ref(), queue, false, None, false)
            .await?;
        let mut found = None;
        for (e, _) in entries {
            if queue_of(e.key()) != queue || !e.key()[queue.len() + 1..].starts_with(&prefix) {
                continue;
            }
            match owner {
                // Another session's node under this tag's prefix is never adopted.
                Some(owner) if e.lease() != Some(owner) => {
                    tracing::warn!(key = %e.key(), "a node of another session carries this tag's prefix: deleting it");
                    self.discard(e.key()).await;
                }
                _ => {
                    if found.is_none() {
                        found = Some(e);
                    }
                }
            }
        }
        Ok(found)
    }

    /// Moves the session's fence on first, so that no create of this lease sent before can
    /// land after the answer (see `ZkBackend::move_fence`).
    async fn abandon(&self, queue: &str, tag: &str, lease: LeaseId) -> Result<Option<Entry>> {
        if let Some(held) = leases::get(lease.get()).filter(|h| !h.is_over()) {
            match self.move_fence(&held).await {
                // A session that ended took its nodes, the late ones too.
                Ok(()) | Err(Error::SessionLost(_)) => {}
                Err(e) => return Err(e),
            }
        }
        self.find_entry(queue, tag).await
    }

    /// After a wake, the check Curator makes (its second `getChildren`), with the epoch
    /// marker in the same request (`[getChildren, getData(marker)]`), as a read that decides
    /// a grant must be: `mine` listed and no entry of this layout with a smaller sequence
    /// suffix. Read through the backend's connection, which delivered the deletion that woke
    /// us (so it has seen it). Anything the names cannot decide (a nested name, a node of
    /// another layout) answers `false`: the caller then reads the entries.
    async fn was_head(&self, mine: &Entry) -> Result<bool> {
        let queue = queue_of(mine.key());
        let layout = self.inner.options.layout;
        let Some((my_name, my_seq)) = own_name(layout, queue, mine) else {
            return Ok(false);
        };
        self.epoch().await?;
        let dir = format!("/{queue}");
        let dir = &dir;
        let ((children, marker), _) = self
            .attempts("was_head", Kind::Read, |client| async move {
                let mut reader = client.new_multi_reader();
                reader.add_get_children(dir)?;
                reader.add_get_data(epoch::MARKER)?;
                let mut results = reader.commit().await?.into_iter();
                let children = match results.next() {
                    Some(MultiReadResult::Children { children }) => Some(children),
                    Some(MultiReadResult::Error {
                        err: ZkError::NoNode,
                    }) => None,
                    Some(MultiReadResult::Error { err }) => return Err(err.into()),
                    _ => {
                        return Err(ZkError::UnexpectedError(
                            "a multi-read answered out of order".into(),
                        )
                        .into());
                    }
                };
                Ok((children, marker_of(results.next())?))
            })
            .await?;
        let Some(children) = children else {
            return Ok(false);
        };
        let mut listed = false;
        for child in &children {
            if child == my_name {
                listed = true;
                continue;
            }
            match layout.sequence(child) {
                Some(seq) if seq > my_seq => {}
                _ => return Ok(false),
            }
        }
        if !listed {
            return Ok(false);
        }
        // This client's epoch must still be the store's (read again in sync with the leader
        // if the marker looks otherwise).
        self.check_marker("was_head", marker.as_deref(), false)
            .await?;
        Ok(true)
    }

    async fn predecessor(&self, mine: &Entry) -> Result<Option<Entry>> {
        Ok(self
            .ahead_here(queue_of(mine.key()), mine, 1)
            .await?
            .into_iter()
            .next())
    }

    async fn ahead(&self, queue: &str, mine: &Entry, limit: usize) -> Result<Vec<Entry>> {
        self.ahead_here(queue, mine, limit).await
    }

    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        let path = format!("/{}", entry.key());
        let czxid = i64::try_from(entry.position().get()).unwrap_or(-1);
        loop {
            let client = self.base().await?;
            let read = tokio::time::timeout(
                self.inner.options.request_timeout,
                client.get_and_watch_data(&path),
            )
            .await;
            let watcher = match read {
                // Another incarnation of the name (an entry known by name only has no
                // czxid to compare, and needs none: see `by_name_only`).
                Ok(Ok((_, stat, _))) if czxid != 0 && stat.czxid != czxid => return Ok(()),
                Ok(Ok((_, _, watcher))) => watcher,
                Ok(Err(ZkError::NoNode)) => return Ok(()),
                Ok(Err(e)) => return Err(zk_err("wait_gone", e).at_endpoint(&self.label())),
                Err(elapsed) => {
                    return Err(Error::Backend {
                        op: "wait_gone",
                        source: Box::new(elapsed),
                        at: Default::default(),
                    }
                    .at_endpoint(&self.label()));
                }
            };
            drop(client);
            let event = watcher.changed().await;
            match event.event_type {
                EventType::NodeDeleted => return Ok(()),
                // The backend's session ended: a new one is opened and the entry read again.
                EventType::Session if event.session_state.is_terminated() => {}
                // A data change (a proclamation): the watch is set again.
                _ => {}
            }
        }
    }

    async fn head(&self, queue: &str) -> Result<Option<Entry>> {
        names::check_name(queue)?;
        Ok(self
            .read_queue("head", None, queue)
            .await?
            .into_iter()
            .next()
            .map(|(e, _)| e))
    }

    async fn entries(&self, queue: &str) -> Result<Vec<Entry>> {
        names::check_name(queue)?;
        Ok(self
            .read_queue("entries", None, queue)
            .await?
            .into_iter()
            .map(|(e, _)| e)
            .collect())
    }

    async fn init_store(&self) -> Result<bool> {
        ZkBackend::init_store(self).await
    }

    async fn delete_entry(&self, entry: &Entry) -> Result<bool> {
        // A node's name is one incarnation: every attempt names its node with random bits.
        let path = format!("/{}", entry.key());
        // In the store epoch this client is in (its node exists), in the same `multi`.
        let epoch = self.epoch().await?;
        let in_epoch = epoch::epoch_node(&epoch);
        let (path, in_epoch, epoch) = (&path, &in_epoch, &epoch);
        let attempt = self
            .attempts_here("delete_entry", Kind::Write, None, |client| async move {
                let mut writer = client.new_multi_writer();
                writer.add_check_version(in_epoch, -1)?;
                writer.add_delete(path, None)?;
                match writer.commit().await {
                    Ok(_) => Ok(true),
                    Err(MultiWriteError::OperationFailed {
                        index: 0,
                        source: ZkError::NoNode,
                    }) => Err(Failure::Stop(self.epoch_refused(epoch))),
                    Err(MultiWriteError::OperationFailed {
                        index: 1,
                        source: ZkError::NoNode,
                    }) => Ok(false),
                    Err(
                        MultiWriteError::OperationFailed { source, .. }
                        | MultiWriteError::RequestFailed { source },
                    ) => Err(source.into()),
                }
            })
            .await
            .map_err(|e| e.at_endpoint(&self.label()))?;
        match attempt {
            (deleted, false) | (deleted @ true, true) => Ok(deleted),
            // An attempt whose answer was lost may have deleted it. An entry is an ephemeral
            // node of its lease's session: while that session lives, nothing but an explicit
            // delete removes it: ours, or an operator's (`baton break`) at the same moment,
            // which changes nothing for a holder that was letting go. So if the lease lives,
            // the entry is released, not "outcome unknown" (#38). If the lease is over, the
            // entry may have gone with it before the delete: that stays unknown.
            (false, true) => match entry.lease() {
                Some(lease) if self.lease_ttl(lease).await?.is_some() => {
                    tracing::debug!(key = %entry.key(), "the delete's answer was lost; the entry is gone while its session lives: it was ours");
                    Ok(true)
                }
                _ => Err(unknown(
                    "delete_entry",
                    "an attempt failed after it may have been applied, and the retry found the entry gone with its session"
                        .into(),
                )
                .at_endpoint(&self.label())),
            },
        }
    }

    async fn update_entry(&self, entry: &Entry, value: &[u8]) -> Result<bool> {
        let path = format!("/{}", entry.key());
        let epoch = self.epoch().await?;
        let in_epoch = epoch::epoch_node(&epoch);
        let (path, in_epoch, epoch) = (&path, &in_epoch, &epoch);
        self.write_if_live("update_entry", |client| async move {
            let mut writer = client.new_multi_writer();
            writer.add_check_version(in_epoch, -1)?;
            writer.add_set_data(path, value, None)?;
            let sent = Instant::now();
            match writer.commit().await {
                Ok(results) => {
                    if let Some(MultiWriteResult::SetData { stat }) = results.into_iter().nth(1) {
                        observe::record(path, stat.version, value);
                        self.wrote(&stat, sent).map_err(Failure::Stop)?;
                    }
                    Ok(true)
                }
                Err(MultiWriteError::OperationFailed {
                    index: 0,
                    source: ZkError::NoNode,
                }) => Err(Failure::Stop(self.epoch_refused(epoch))),
                Err(MultiWriteError::OperationFailed {
                    index: 1,
                    source: ZkError::NoNode,
                }) => Ok(false),
                Err(
                    MultiWriteError::OperationFailed { source, .. }
                    | MultiWriteError::RequestFailed { source },
                ) => Err(source.into()),
            }
        })
        .await
    }

    async fn guarded(&self, entry: &Entry, ops: &[WriteOp]) -> Result<bool> {
        let guard = format!("/{}", entry.key());
        let mut planned = Vec::with_capacity(ops.len());
        for op in ops {
            planned.push(match op {
                WriteOp::Put { key, value } => (names::key_path(key)?, Some(value.as_slice())),
                WriteOp::Delete { key } => (names::key_path(key)?, None),
            });
        }
        let planned = &planned;
        let epoch = self.epoch().await?;
        let epoch = &epoch;
        let sent = AtomicBool::new(false);
        let flag = &sent;
        self.write_if_live_flagged("guarded", Some(flag), |client| {
            let guard = guard.clone();
            async move { guarded_once(self, epoch, &client, &guard, planned, flag).await }
        })
        .await
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let path = names::key_path(key)?;
        let (value, _) = self
            .attempts("read", Kind::Read, |client| {
                let path = path.clone();
                async move {
                    sync(&client, &path).await?;
                    match client.get_data(&path).await {
                        Ok((data, _)) => Ok(Some(data)),
                        Err(ZkError::NoNode) => Ok(None),
                        Err(e) => Err(e.into()),
                    }
                }
            })
            .await?;
        Ok(value)
    }

    async fn swap(&self, key: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<bool> {
        let path = names::key_path(key)?;
        let sent = AtomicBool::new(false);
        let flag = &sent;
        let acl = self.inner.acl();
        self.write_if_live_flagged("swap", Some(flag), |client| {
            let path = path.clone();
            async move {
                loop {
                    let Some(expected) = expected else {
                        flag.store(true, Ordering::SeqCst);
                        match client.create(&path, new, &acl.persistent()).await {
                            Ok(_) => return Ok(true),
                            Err(ZkError::NodeExists) => return Ok(false),
                            Err(ZkError::NoNode) => {
                                make_keys_node(&client, acl).await?;
                                continue;
                            }
                            Err(e) => return Err(e.into()),
                        }
                    };
                    sync(&client, &path).await.map_err(Failure::unsent)?;
                    let (data, stat) = match client.get_data(&path).await {
                        Ok(read) => read,
                        Err(ZkError::NoNode) => return Ok(false),
                        Err(e) => return Err(Failure::unsent(e)),
                    };
                    if data != expected {
                        return Ok(false);
                    }
                    flag.store(true, Ordering::SeqCst);
                    match client.set_data(&path, new, Some(stat.version)).await {
                        Ok(_) => return Ok(true),
                        // Changed meanwhile: compare again.
                        Err(ZkError::BadVersion | ZkError::NoNode) => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        })
        .await
    }

    async fn wait_value(&self, key: &str, seen: Option<&[u8]>) -> Result<Option<Vec<u8>>> {
        let path = names::key_path(key)?;
        loop {
            let client = self.base().await?;
            let limit = self.inner.options.request_timeout;
            let fail = |e: ZkError| zk_err("wait_value", e).at_endpoint(&self.label());
            let watcher = match tokio::time::timeout(limit, client.get_and_watch_data(&path)).await
            {
                Ok(Ok((data, _, watcher))) => {
                    if seen != Some(data.as_slice()) {
                        return Ok(Some(data));
                    }
                    watcher
                }
                Ok(Err(ZkError::NoNode)) => {
                    if seen.is_some() {
                        return Ok(None);
                    }
                    // Absent, as seen: wait for its creation.
                    match tokio::time::timeout(limit, client.check_and_watch_stat(&path)).await {
                        Ok(Ok((Some(_), _))) => continue,
                        Ok(Ok((None, watcher))) => watcher,
                        Ok(Err(e)) => return Err(fail(e)),
                        Err(_) => return Err(fail(ZkError::Timeout)),
                    }
                }
                Ok(Err(e)) => return Err(fail(e)),
                Err(_) => return Err(fail(ZkError::Timeout)),
            };
            drop(client);
            let _ = watcher.changed().await;
        }
    }

    async fn lease_ttl(&self, lease: LeaseId) -> Result<Option<Duration>> {
        Ok(leases::get(lease.get())
            .filter(|held| !held.is_over())
            .map(|held| held.remaining()))
    }

    fn epochs(&self) -> Option<&StoreEpochs> {
        Some(&self.inner.epochs)
    }

    fn observe_head(&self, queue: &str) -> BoxStream<'static, Result<HeadEvent>> {
        let backend = self.clone();
        let queue = queue.to_owned();
        futures::stream::once(async move {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(observe::run(backend, queue, tx));
            futures::stream::unfold(rx, |mut rx| async move {
                let event = rx.recv().await?;
                Some((event, rx))
            })
        })
        .flatten()
        .boxed()
    }
}

/// One attempt of a guarded write: a `multi` that checks the store epoch and the entry, then
/// puts or deletes each key. ZooKeeper has no "create or set" nor "delete if present", so
/// each key is read first and the `multi` asserts what was read: a set needs the node, a
/// create fails if it appeared, and a key read absent is created and deleted again (failing
/// if it appeared). A race with another writer of a key is retried.
async fn guarded_once(
    backend: &ZkBackend,
    epoch: &Epoch,
    client: &Client,
    guard: &str,
    planned: &[(String, Option<&[u8]>)],
    sent: &AtomicBool,
) -> Result<bool, Failure> {
    loop {
        let mut exists = std::collections::HashMap::new();
        if !planned.is_empty() {
            sync(client, names::KEYS).await.map_err(Failure::unsent)?;
            let mut reader = client.new_multi_reader();
            for (path, _) in planned {
                reader.add_get_data(path)?;
            }
            let read = reader.commit().await.map_err(Failure::unsent)?;
            for ((path, _), result) in planned.iter().zip(read) {
                let present = match result {
                    MultiReadResult::Data { .. } => true,
                    MultiReadResult::Error {
                        err: ZkError::NoNode,
                    } => false,
                    MultiReadResult::Error { err } => return Err(err.into()),
                    _ => false,
                };
                exists.insert(path.as_str(), present);
            }
        }
        let acl = backend.inner.acl();
        let mut writer = client.new_multi_writer();
        writer.add_check_version(&epoch::epoch_node(epoch), -1)?;
        writer.add_check_version(guard, -1)?;
        for (path, value) in planned {
            let present = exists.get(path.as_str()).copied().unwrap_or(false);
            match (value, present) {
                (Some(value), true) => writer.add_set_data(path, value, None)?,
                (Some(value), false) => writer.add_create(path, value, &acl.persistent())?,
                (None, true) => writer.add_delete(path, None)?,
                (None, false) => {
                    writer.add_create(path, &[], &acl.persistent())?;
                    writer.add_delete(path, None)?;
                }
            }
            exists.insert(path.as_str(), value.is_some());
        }
        sent.store(true, Ordering::SeqCst);
        match writer.commit().await {
            Ok(_) => return Ok(true),
            Err(MultiWriteError::OperationFailed {
                index: 0,
                source: ZkError::NoNode,
            }) => return Err(Failure::Stop(backend.epoch_refused(epoch))),
            Err(MultiWriteError::OperationFailed { index: 1, source }) => {
                return match source {
                    ZkError::NoNode => Ok(false),
                    e => Err(e.into()),
                };
            }
            // The keys node does not exist yet.
            Err(MultiWriteError::OperationFailed {
                source: ZkError::NoNode,
                ..
            }) if client.check_stat(names::KEYS).await?.is_none() => {
                make_keys_node(client, acl).await?;
            }
            // A key changed between the read and the write: read again.
            Err(MultiWriteError::OperationFailed {
                source: ZkError::NoNode | ZkError::NodeExists,
                ..
            }) => {}
            Err(MultiWriteError::OperationFailed { source, .. }) => return Err(source.into()),
            Err(MultiWriteError::RequestFailed { source }) => return Err(source.into()),
        }
    }
}
