//! [`EtcdBackend`]: the [`Backend`] trait on etcd, with the key layout of etcd's Go recipes.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchOptions,
};
use futures::stream::BoxStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::etcd_watch::{Fired, WatchHub};
use super::{
    Backend, Enqueued, Entry, FencingToken, Lease, LeaseId, Position, QueueChange, QueueMirror,
    WriteOp, queue_of, receiver_stream,
};
use crate::error::{BoxError, Error, LostReason, Result};

/// Connection options for [`EtcdBackend::connect`].
///
/// ```
/// # use std::time::Duration;
/// let options = baton::EtcdOptions::new()
///     .with_connect_timeout(Duration::from_secs(2))
///     .with_user("app", "secret");
/// ```
#[derive(Clone)]
#[must_use]
pub struct EtcdOptions {
    connect_timeout: Duration,
    request_timeout: Duration,
    retry_for: Duration,
    user: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("retry_for", &self.retry_for)
            // Never print the password.
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .finish()
    }
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl EtcdOptions {
    /// Defaults: connect timeout 5 s, request timeout 5 s, retries for up to 10 s, no
    /// authentication.
    pub fn new() -> Self {
        EtcdOptions {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            retry_for: Duration::from_secs(10),
            user: None,
        }
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

    /// Authenticates as `user` with `password`.
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
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
    client: Client,
    options: EtcdOptions,
    endpoints: Vec<String>,
    watches: WatchHub,
    requests: Arc<AtomicU64>,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.inner.endpoints)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

fn etcd_err(op: &'static str, e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
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
    }
}

/// gRPC status codes, by number, so that no tonic type leaks into our signatures.
mod tonic_code {
    use etcd_client::Error as E;
    pub(super) type Code = i32;
    pub(super) const DEADLINE_EXCEEDED: Code = 4;
    pub(super) const PERMISSION_DENIED: Code = 7;
    pub(super) const UNAVAILABLE: Code = 14;
    pub(super) const UNAUTHENTICATED: Code = 16;
    pub(super) const UNKNOWN: Code = 2;

    /// Whether a failed request may succeed when sent again (possibly to another member).
    pub(super) fn is_transient(e: &E) -> bool {
        match e {
            E::GRpcStatus(s) => {
                let code = s.code() as i32;
                code == UNAVAILABLE
                    || code == DEADLINE_EXCEEDED
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
    /// Connects to the cluster at `endpoints` (`host:port` or `http://host:port`) and checks
    /// that at least one answers within the connect timeout, and that the credentials, if
    /// any, are accepted.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty endpoint list, [`Error::Connect`] if no
    /// endpoint answers in time, [`Error::Auth`] for rejected credentials.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is created on the server.
    pub async fn connect<S: AsRef<str>>(endpoints: &[S], options: EtcdOptions) -> Result<Self> {
        let endpoints: Vec<String> = endpoints.iter().map(|e| e.as_ref().to_owned()).collect();
        if endpoints.is_empty() || endpoints.iter().any(|e| e.trim().is_empty()) {
            return Err(Error::InvalidArgument("endpoints must be a non-empty list"));
        }
        let connect_error = |source: BoxError| Error::Connect {
            endpoints: endpoints.clone(),
            source,
        };
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout)
            // HTTP/2 pings notice a dead connection under a long-lived watch.
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(3))
            .with_keep_alive_while_idle(true);
        if let Some((user, password)) = &options.user {
            opts = opts.with_user(user.clone(), password.clone());
        }
        let connecting = Client::connect(&endpoints, Some(opts));
        let client = match tokio::time::timeout(options.connect_timeout, connecting).await {
            Err(elapsed) => return Err(connect_error(elapsed.into())),
            Ok(Err(e)) => {
                return Err(match etcd_err("connect", e) {
                    Error::Backend { source, .. } => connect_error(source),
                    other => other,
                });
            }
            Ok(Ok(client)) => client,
        };
        // The channel is lazy: prove that a member answers (and accepts our token).
        let mut probe = client.clone();
        match tokio::time::timeout(options.connect_timeout, probe.get("\0", None)).await {
            Err(elapsed) => Err(connect_error(elapsed.into())),
            Ok(Err(e)) => Err(match etcd_err("connect", e) {
                Error::Backend { source, .. } => connect_error(source),
                other => other,
            }),
            Ok(Ok(_)) => Ok(EtcdBackend {
                inner: Arc::new(Shared {
                    client,
                    options,
                    endpoints,
                    watches: WatchHub::default(),
                    requests: Arc::default(),
                }),
            }),
        }
    }

    /// Requests sent to etcd so far by this backend and its clones: unary requests
    /// (each retry counts) and watch creations. For measuring what an operation costs.
    pub fn requests_sent(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// The underlying etcd-client, for operations baton does not wrap.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Runs `f` until it succeeds, fails for good, or the retry budget is spent.
    async fn call<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_within(op, self.inner.options.retry_for, f).await
    }

    /// [`call`](Self::call) with its own retry budget; `Duration::ZERO` sends one attempt.
    async fn call_within<T, F, Fut>(
        &self,
        op: &'static str,
        retry_for: Duration,
        mut f: F,
    ) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let give_up = Instant::now() + retry_for;
        let mut backoff = Duration::from_millis(25);
        loop {
            self.inner.requests.fetch_add(1, Ordering::Relaxed);
            // Boxed: a gRPC request future is several KiB, and every caller that awaits this
            // one (a waiter parked on its predecessor, too) would otherwise carry that size
            // for as long as it lives.
            let attempt = Box::pin(tokio::time::timeout(
                self.inner.options.request_timeout,
                f(self.inner.client.clone()),
            ));
            let error: BoxError = match attempt.await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if !tonic_code::is_transient(&e) => return Err(etcd_err(op, e)),
                Ok(Err(e)) => e.into(),
                Err(elapsed) => elapsed.into(),
            };
            if Instant::now() + backoff >= give_up {
                return Err(Error::Backend { op, source: error });
            }
            tracing::debug!(op, error = %error, ?backoff, "etcd request failed; retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// Runs `txn` with the backend's retries.
    pub(crate) async fn txn(&self, op: &'static str, txn: Txn) -> Result<TxnResponse> {
        self.call(op, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// A transaction that runs `ops` only if `entry`'s key still has its create revision.
    async fn if_live(
        &self,
        op: &'static str,
        entry: &Entry,
        ops: Vec<TxnOp>,
    ) -> Result<TxnResponse> {
        let cmp =
            Compare::create_revision(entry.key.as_str(), CompareOp::Equal, revision(entry.token));
        self.txn(op, Txn::new().when([cmp]).and_then(ops)).await
    }
}

fn revision(token: FencingToken) -> i64 {
    i64::try_from(token.get()).unwrap_or(i64::MAX)
}

fn to_entry(kv: &KeyValue) -> Entry {
    let create = u64::try_from(kv.create_revision()).unwrap_or(0);
    Entry {
        // Foreign clients may write keys that are not UTF-8; keep them visible and ordered.
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        position: Position::new(create),
        token: FencingToken::new(create),
        lease: (kv.lease() != 0).then_some(LeaseId(kv.lease())),
    }
}

fn queue_prefix(queue: &str) -> String {
    format!("{queue}/")
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

fn first_kv(resp: Option<&TxnOpResponse>) -> Option<Entry> {
    match resp {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().map(to_entry),
        _ => None,
    }
}

fn malformed(op: &'static str) -> Error {
    Error::Backend {
        op,
        source: "etcd answered a transaction without the expected responses".into(),
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        if ttl.is_zero() {
            return Err(Error::InvalidArgument(
                "lease TTL must be greater than zero",
            ));
        }
        // etcd counts whole seconds: round up so that the lease is never shorter than asked.
        let secs =
            i64::try_from(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).unwrap_or(i64::MAX);
        let resp = self
            .call("grant_lease", |mut c| async move {
                c.lease_grant(secs, None).await
            })
            .await?;
        Ok(Lease {
            id: LeaseId(resp.id()),
            ttl: Duration::from_secs(u64::try_from(resp.ttl()).unwrap_or(0)),
        })
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>> {
        let result = self
            .call("keep_alive", |mut c| async move {
                // Opening the stream renews once; renew again to learn the TTL.
                let (mut keeper, mut stream) = c.lease_keep_alive(lease.0).await?;
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
            Ok(ttl) if ttl > 0 => Ok(Some(Duration::from_secs(ttl.unsigned_abs()))),
            // etcd answers TTL <= 0 for a lease it no longer has.
            Ok(_) | Err(Error::SessionLost(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        let result = self
            .call("revoke_lease", |mut c| async move {
                c.lease_revoke(lease.0).await
            })
            .await;
        match result {
            Ok(_) | Err(Error::SessionLost(_)) => Ok(()),
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
        let key = format!("{queue}/{tag}");
        // Created now: read the newest entry *before* the put, which is our predecessor (or
        // none: we are the head), so a waiter can start waiting without another read.
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::get(queue_prefix(queue), Some(newest_first(1))),
                TxnOp::put(
                    key.as_str(),
                    value,
                    Some(PutOptions::new().with_lease(lease.0)),
                ),
            ])
            .or_else([
                TxnOp::get(key.as_str(), None),
                TxnOp::get(queue_prefix(queue), Some(oldest_first(1))),
            ]);
        let resp = self.txn("enqueue", txn).await?;
        let ops = resp.op_responses();
        if resp.succeeded() {
            let rev = resp.header().map_or(0, |h| h.revision());
            let rev = u64::try_from(rev).map_err(|_| malformed("enqueue"))?;
            let predecessor = first_kv(ops.first());
            return Ok(Enqueued {
                entry: Entry {
                    key,
                    value: value.to_vec(),
                    position: Position::new(rev),
                    token: FencingToken::new(rev),
                    lease: Some(lease),
                },
                is_head: predecessor.is_none(),
                predecessor,
            });
        }
        // Deleted between the compare and the read cannot happen inside a transaction.
        let entry = first_kv(ops.first()).ok_or_else(|| malformed("enqueue"))?;
        let is_head = first_kv(ops.get(1)).is_some_and(|h| h.token == entry.token);
        Ok(Enqueued {
            entry,
            is_head,
            predecessor: None,
        })
    }

    async fn predecessor(&self, mine: &Entry) -> Result<Option<Entry>> {
        let queue = queue_of(&mine.key);
        let before = newest_first(1).with_max_create_revision(revision(mine.token) - 1);
        let resp = self
            .if_live(
                "predecessor",
                mine,
                vec![TxnOp::get(queue_prefix(queue), Some(before))],
            )
            .await?;
        if !resp.succeeded() {
            return Err(Error::EntryGone {
                key: mine.key.clone(),
            });
        }
        Ok(first_kv(resp.op_responses().first()))
    }

    async fn was_head(&self, mine: &Entry) -> Result<bool> {
        // A serializable read, answered by whichever member receives it without a round of
        // consensus: it does not wait behind writes in flight (the next contender's enqueue
        // usually is), which is most of a handoff's cost on a busy lock. Trusted only when it
        // shows `mine` and nothing older; a lagging member shows the predecessor still there
        // or `mine` not yet, and the caller falls back to the linearizable read.
        let queue = queue_of(&mine.key);
        // Keys and revisions are all it looks at: no values (an election's can be large).
        let newest_two = newest_first(2)
            .with_max_create_revision(revision(mine.token))
            .with_keys_only()
            .with_serializable();
        // One attempt: a failed hint is "not known", and the authoritative read that
        // follows it has the retries.
        let resp = self
            .call_within("was_head", Duration::ZERO, |mut c| {
                let (prefix, options) = (queue_prefix(queue), newest_two.clone());
                async move { c.get(prefix, Some(options)).await }
            })
            .await?;
        Ok(match resp.kvs() {
            [only] => {
                only.create_revision() == revision(mine.token) && only.key() == mine.key.as_bytes()
            }
            _ => false,
        })
    }

    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        // Register with the shared watch stream; once the watch is confirmed, check that the
        // entry still exists unless the watch is older than the entry: a deletion after that
        // point is delivered.
        let mut backoff = Duration::from_millis(25);
        loop {
            let registration = self.inner.watches.register(
                &self.inner.client,
                &entry.key,
                revision(entry.token),
                Arc::clone(&self.inner.requests),
            );
            let Ok(coverage) = registration.ready.await else {
                tracing::debug!(key = %entry.key, ?backoff, "watch not established; retrying");
                Box::pin(tokio::time::sleep(backoff)).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            };
            // A watch that existed before this incarnation was created has reported (or will
            // report) its deletion: no read needed. That is the usual case in a FIFO queue,
            // where the predecessor's key name is watched from one cycle to the next.
            // (The read is boxed: this future is parked on `fired` for as long as the wait
            // lasts, and should not carry a request's size all that time.)
            let covered = coverage.since.is_some_and(|w| revision(entry.token) > w);
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
                    tracing::debug!(key = %entry.key, "watch lost; re-reading and watching again");
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

    async fn delete_entry(&self, entry: &Entry) -> Result<bool> {
        self.guarded(entry, &[WriteOp::delete(entry.key.clone())])
            .await
    }

    async fn update_entry(&self, entry: &Entry, value: &[u8]) -> Result<bool> {
        let put = TxnOp::put(
            entry.key.as_str(),
            value,
            Some(PutOptions::new().with_ignore_lease()),
        );
        Ok(self
            .if_live("update_entry", entry, vec![put])
            .await?
            .succeeded())
    }

    async fn guarded(&self, entry: &Entry, ops: &[WriteOp]) -> Result<bool> {
        let ops = ops
            .iter()
            .map(|op| match op {
                WriteOp::Put { key, value } => TxnOp::put(key.as_str(), value.as_slice(), None),
                WriteOp::Delete { key } => TxnOp::delete(key.as_str(), None),
            })
            .collect();
        Ok(self.if_live("guarded", entry, ops).await?.succeeded())
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let resp = self
            .call("read", |mut c| async move { c.get(key, None).await })
            .await?;
        Ok(resp.kvs().first().map(|kv| kv.value().to_vec()))
    }

    async fn lease_ttl(&self, lease: LeaseId) -> Result<Option<Duration>> {
        let resp = self
            .call("lease_ttl", |mut c| async move {
                c.lease_time_to_live(lease.0, None).await
            })
            .await?;
        // etcd answers -1 for a lease it does not know.
        Ok(u64::try_from(resp.ttl()).ok().map(Duration::from_secs))
    }

    fn observe_head(&self, queue: &str) -> BoxStream<'static, Result<Option<Entry>>> {
        let (tx, rx) = mpsc::channel(16);
        let (backend, queue) = (self.clone(), queue.to_owned());
        tokio::spawn(async move {
            tokio::select! {
                () = backend.observe_loop(&queue, &tx) => {}
                () = tx.closed() => {}
            }
        });
        receiver_stream(rx)
    }
}

impl EtcdBackend {
    /// Feeds `tx` with head changes of `queue` until the receiver is dropped: a snapshot,
    /// then a prefix watch from the snapshot's revision. A broken stream is resumed from the
    /// last revision seen; a compacted one starts over with a fresh snapshot.
    async fn observe_loop(&self, queue: &str, tx: &mpsc::Sender<Result<Option<Entry>>>) {
        let prefix = queue_prefix(queue);
        let mut mirror = QueueMirror::default();
        let mut backoff = Duration::from_millis(25);
        let mut resume_from: Option<i64> = None;
        loop {
            let start = match resume_from {
                Some(rev) => rev,
                None => {
                    let snapshot = self
                        .call("observe", |mut c| {
                            let prefix = prefix.clone();
                            async move { c.get(prefix, Some(oldest_first(0))).await }
                        })
                        .await;
                    let resp = match snapshot {
                        Ok(resp) => resp,
                        Err(e) => {
                            if tx.send(Err(e)).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(Duration::from_secs(1));
                            continue;
                        }
                    };
                    mirror.reset(resp.kvs().iter().map(to_entry).collect());
                    if !mirror.report(tx).await {
                        return;
                    }
                    resp.header().map_or(0, |h| h.revision()) + 1
                }
            };
            let options = WatchOptions::new().with_prefix().with_start_revision(start);
            let mut client = self.inner.client.clone();
            let mut stream = match client.watch(prefix.as_str(), Some(options)).await {
                Ok(stream) => stream,
                Err(e) => {
                    tracing::debug!(%queue, error = %e, "observe: watch failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    resume_from = Some(start);
                    continue;
                }
            };
            let mut next = start;
            loop {
                let resp = match stream.message().await {
                    Ok(Some(resp)) => resp,
                    Ok(None) | Err(_) => {
                        // Broken: resume from the first revision not yet seen.
                        resume_from = Some(next);
                        break;
                    }
                };
                if resp.canceled() {
                    // Compacted (or refused): nothing to resume from, take a snapshot.
                    tracing::debug!(%queue, compact = resp.compact_revision(), "observe: watch canceled; re-reading");
                    resume_from = None;
                    break;
                }
                backoff = Duration::from_millis(25);
                let events = resp.events();
                for (i, ev) in events.iter().enumerate() {
                    let Some(kv) = ev.kv() else { continue };
                    next = next.max(kv.mod_revision() + 1);
                    mirror.apply(match ev.event_type() {
                        EventType::Put => QueueChange::Put(to_entry(kv)),
                        EventType::Delete => {
                            QueueChange::Delete(String::from_utf8_lossy(kv.key()).into_owned())
                        }
                    });
                    // Report once a revision is complete: the events of one transaction
                    // (a lease revoke, a prefix delete) share a revision, and the heads in
                    // between never existed.
                    let revision_done = events
                        .get(i + 1)
                        .and_then(|n| n.kv())
                        .is_none_or(|n| n.mod_revision() != kv.mod_revision());
                    if revision_done && !mirror.report(tx).await {
                        return;
                    }
                }
            }
        }
    }
}

impl EtcdBackend {
    async fn entries_limited(&self, queue: &str, limit: i64) -> Result<Vec<Entry>> {
        let prefix = queue_prefix(queue);
        let resp = self
            .call("entries", |mut c| {
                let prefix = prefix.clone();
                async move { c.get(prefix, Some(oldest_first(limit))).await }
            })
            .await?;
        Ok(resp.kvs().iter().map(to_entry).collect())
    }
}
