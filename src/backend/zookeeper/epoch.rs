//! Store epochs on ZooKeeper ([`StoreEpochs`](crate::StoreEpochs) holds the rules; this is
//! where ZooKeeper keeps them). docs/design.md (2026-11-28) says why each choice was made.
//!
//! - **The marker** is the persistent node `/_baton-epoch` (under the chroot). Its data names
//!   the epoch and how its tokens are made from czxids ([`Epoch::encode`]); its mtime, set by
//!   the ZooKeeper leader's clock in the transaction that wrote it, is when the epoch began.
//! - **The epoch's own node** `/_baton-epoch/<id, 32 hex digits>` holds the epoch's restart
//!   grace in milliseconds (0 for a store marked new). Every request that decides a grant or
//!   changes an entry checks that it exists (`check` version -1) in the same `multi`. A version
//!   check on the marker could not tell epochs apart: a marker created again after a wipe
//!   starts at version 0, as the one it replaces did. A node named after the epoch exists only
//!   while the store is in that epoch (a new epoch deletes it in the transaction that writes
//!   the new marker; a wipe loses it).
//! - **Position**: the zxid of each write's answer (a create's czxid, a setData's mzxid),
//!   which never goes back while ZooKeeper keeps its state. A read's zxids only bound the
//!   store's position from below (a node read may be old) and are not compared.
//! - **The server's clock**: the mtime of a write's answer (a session fence's create, a
//!   setData of `/_baton-sessions`), plus the time this process measured since it arrived.
//!   The grace is counted on it, from the marker's mtime, and a new epoch's tokens start from
//!   it: neither depends on one client's wall clock.
//! - **A session refused by a server that is behind it** (one that lost its data) is no error
//!   the client library reports: it stays disconnected until 1.4 times its timeout has passed.
//!   A renewal of a disconnected session asks a session that connects now instead (the
//!   backend's own, or a fresh one that then replaces it) whether the marker still names this
//!   client's epoch, and, if it does, writes once through it: a store restored from an older
//!   copy brings its marker back, but its zxids are below what this client saw.

use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client::{Client, MultiReadResult, MultiWriteError, MultiWriteResult, Stat};

use super::{Kind, NodeAcl, ZkBackend, ZkError, is_connected, names, open, sync};
use crate::epoch::{Epoch, clock_us, grace_rest};
use crate::error::{Error, LostReason, Result};
use crate::token::FencingToken;

/// The marker node.
pub(super) const MARKER: &str = "/_baton-epoch";

/// What the store is called in [`StoreEpochs::saw`](crate::StoreEpochs): ZooKeeper has no
/// cluster id, so one store is one history of zxids.
const IDENTITY: &[u8] = b"zookeeper";

/// How many times a client reads the marker again because another client changed it while
/// it looked (each time, someone else began an epoch: the next look enters it).
const MARKER_RACES: usize = 8;

/// How long a look through a fresh session waits for it to connect: a server that serves
/// accepts a session within milliseconds.
const PROBE_CONNECT: Duration = Duration::from_secs(2);

/// One write that tells the store's position and the server's clock: a setData of
/// `/_baton-sessions` (whose data nothing reads), created if missing.
async fn sample_once(client: &Client, acl: NodeAcl) -> Result<Stat, ZkError> {
    loop {
        match client.set_data(names::SESSIONS, &[], None).await {
            Ok(stat) => return Ok(stat),
            Err(ZkError::NoNode) => {
                match client.create(names::SESSIONS, &[], &acl.persistent()).await {
                    Ok((stat, _)) => return Ok(stat),
                    Err(ZkError::NodeExists) => {}
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// The epoch's own node, whose existence every grant checks.
pub(super) fn epoch_node(epoch: &Epoch) -> String {
    format!("{MARKER}/{:032x}", epoch.id())
}

/// The ZooKeeper leader's clock as a write's answer showed it, and when that answer arrived.
#[derive(Debug, Clone, Copy)]
pub(super) struct ServerClock {
    ms: i64,
    at: Instant,
}

impl ServerClock {
    /// The server's clock now in milliseconds, measured from the answer's arrival: never ahead
    /// of the server (the write happened before its answer arrived).
    fn now_ms(&self) -> i64 {
        let since = i64::try_from(self.at.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.ms.saturating_add(since)
    }

    /// [`now_ms`](Self::now_ms) in microseconds, with this process's clock below the
    /// millisecond.
    fn now_us(&self) -> u64 {
        let since = u64::try_from(self.at.elapsed().as_micros()).unwrap_or(u64::MAX);
        u64::try_from(self.ms)
            .unwrap_or(0)
            .saturating_mul(1000)
            .saturating_add(since)
    }
}

/// The marker as read, with the names of the epoch nodes beside it.
#[derive(Debug, Default)]
struct MarkerRead {
    marker: Option<(Vec<u8>, Stat)>,
    children: Vec<String>,
}

/// What a look at the marker through a session that connects now found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Look {
    /// It names this client's epoch.
    Same,
    /// It does not: the store is in another epoch.
    Moved,
    /// No session connected, or the read failed: nothing learned.
    Unknown,
}

impl ZkBackend {
    /// The epoch in force, entering the store's (or beginning one) if this client is in none:
    /// at first use, and after it saw the store go back.
    pub(super) async fn epoch(&self) -> Result<Epoch> {
        match self.inner.epochs.current() {
            Some(epoch) => Ok(epoch),
            None => self.establish("epoch").await,
        }
    }

    /// The token of czxid `czxid` in the current epoch (the czxid itself before this client
    /// has entered one).
    pub(super) fn token(&self, czxid: u64) -> FencingToken {
        self.inner
            .epochs
            .token(czxid)
            .unwrap_or(FencingToken::new(czxid))
    }

    /// The server's clock as last learned, if it was.
    fn server_clock(&self) -> Option<ServerClock> {
        *self.inner.clock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes in the answer to a write sent at `sent` (a create's or a setData's stat, or the
    /// stat of a node this client has just created): the server's clock from its mtime, the
    /// store's position from its zxid. A zxid below one seen before `sent` means the store
    /// went back: every session from before is lost, and so is the caller's request
    /// ([`Error::SessionLost`] with [`LostReason::StoreReset`]).
    pub(super) fn wrote(&self, stat: &Stat, sent: Instant) -> Result<()> {
        if stat.is_invalid() || stat.mzxid <= 0 {
            return Ok(());
        }
        if stat.mtime > 0 {
            *self.inner.clock.lock().unwrap_or_else(|p| p.into_inner()) = Some(ServerClock {
                ms: stat.mtime,
                at: Instant::now(),
            });
        }
        let zxid = u64::try_from(stat.mzxid).unwrap_or(0);
        match self.inner.epochs.saw(IDENTITY, &[zxid], sent) {
            Ok(()) => Ok(()),
            Err(back) => {
                tracing::warn!(store = %self.label(), "ZooKeeper went back in time ({}): it lost or rolled back writes this client saw", back.what);
                Err(Error::SessionLost(LostReason::StoreReset))
            }
        }
    }

    /// A write that tells the store's position and the server's clock now (see
    /// [`sample_once`]), with the backend's retries; taken in as [`wrote`](Self::wrote) does.
    async fn sample(&self, op: &'static str) -> Result<Stat> {
        let sent = Instant::now();
        let acl = self.inner.acl();
        let (stat, _) = self
            .attempts(op, Kind::Write, |client| async move {
                Ok(sample_once(&client, acl).await?)
            })
            .await?;
        self.wrote(&stat, sent)?;
        Ok(stat)
    }

    /// Reads the marker and enters its epoch, or begins one: when there is no marker (a new
    /// store, or one that lost its data), when it is not baton's, or when it is from before
    /// the store went back (this client saw it go back: [`StoreEpochs::may_enter`]).
    ///
    /// `op` names the operation in errors (the caller's, when it is the reason for the look).
    ///
    /// [`StoreEpochs::may_enter`]: crate::StoreEpochs
    pub(super) async fn establish(&self, op: &'static str) -> Result<Epoch> {
        Ok(self.establish_as(op, false).await?.0)
    }

    /// [`establish`](Self::establish), and whether this client began the epoch. `init`: the
    /// caller asserts that no holder from before can exist (`init_store`): an epoch it begins
    /// has no grace.
    pub(super) async fn establish_as(&self, op: &'static str, init: bool) -> Result<(Epoch, bool)> {
        // One look at a time: the tasks that found no epoch together enter the one it finds.
        let _one = self.inner.establishing.lock().await;
        if let Some(epoch) = self.inner.epochs.current() {
            return Ok((epoch, false));
        }
        for _ in 0..MARKER_RACES {
            let read = self.read_marker(op).await?;
            let found = read
                .marker
                .as_ref()
                .and_then(|(data, _)| Epoch::decode(data));
            if let Some(epoch) = found.filter(|e| self.inner.epochs.may_enter(e)) {
                let id = format!("{:032x}", epoch.id());
                if read.children.contains(&id) {
                    let Some(grace) = self.epoch_grace(op, &epoch).await? else {
                        continue;
                    };
                    let began = read.marker.as_ref().map_or(0, |(_, stat)| stat.mtime);
                    let left = match self.grace_left(op, began, grace).await {
                        Ok(left) => left,
                        // The look showed the store gone back: the marker may be from before.
                        Err(Error::SessionLost(LostReason::StoreReset)) => continue,
                        Err(e) => return Err(e),
                    };
                    self.inner.epochs.enter(epoch, left);
                    return Ok((epoch, false));
                }
                // A marker whose epoch node is missing is not a whole epoch: replaced.
            }
            let origin = match self.sample(op).await {
                Ok(stat) => u64::try_from(stat.mzxid).unwrap_or(0),
                Err(Error::SessionLost(LostReason::StoreReset)) => continue,
                Err(e) => return Err(e),
            };
            let clock = self.server_clock().map_or_else(clock_us, |c| c.now_us());
            let epoch = self.inner.epochs.next_epoch(origin, clock);
            let grace = if init {
                Duration::ZERO
            } else {
                self.inner.epochs.grace()
            };
            let previous = read.marker.as_ref().map(|(_, stat)| stat.version);
            if self
                .begin(op, previous, &read.children, &epoch, grace)
                .await?
            {
                tracing::info!(store = %self.label(), %epoch, grace_ms = grace.as_millis(), "began a new store epoch");
                self.inner.epochs.enter(epoch, Some(grace));
                return Ok((epoch, true));
            }
            // Another client changed the marker meanwhile: its epoch is the store's now.
        }
        Err(Error::Backend {
            op,
            source: "the epoch marker kept changing while this client read it".into(),
            at: Default::default(),
        }
        .at_endpoint(&self.label()))
    }

    /// The marker and the names of the epoch nodes, read in sync with the leader.
    async fn read_marker(&self, op: &'static str) -> Result<MarkerRead> {
        let (read, _) = self
            .attempts(op, Kind::Read, |client| async move {
                sync(&client, MARKER).await?;
                let mut reader = client.new_multi_reader();
                reader.add_get_data(MARKER)?;
                reader.add_get_children(MARKER)?;
                let mut results = reader.commit().await?.into_iter();
                let mut read = MarkerRead::default();
                match results.next() {
                    Some(MultiReadResult::Data { data, stat }) => read.marker = Some((data, stat)),
                    Some(MultiReadResult::Error {
                        err: ZkError::NoNode,
                    }) => {}
                    Some(MultiReadResult::Error { err }) => return Err(err.into()),
                    _ => {
                        return Err(ZkError::UnexpectedError(
                            "a multi-read answered out of order".into(),
                        )
                        .into());
                    }
                }
                match results.next() {
                    Some(MultiReadResult::Children { children }) => read.children = children,
                    Some(MultiReadResult::Error {
                        err: ZkError::NoNode,
                    }) => {}
                    Some(MultiReadResult::Error { err }) => return Err(err.into()),
                    _ => {
                        return Err(ZkError::UnexpectedError(
                            "a multi-read answered out of order".into(),
                        )
                        .into());
                    }
                }
                Ok(read)
            })
            .await?;
        Ok(read)
    }

    /// The restart grace recorded in `epoch`'s node; `None` if the node is gone (the epoch
    /// changed meanwhile). A value that is not baton's counts as this client's own grace.
    async fn epoch_grace(&self, op: &'static str, epoch: &Epoch) -> Result<Option<Duration>> {
        let path = epoch_node(epoch);
        let (data, _) = self
            .attempts(op, Kind::Read, |client| {
                let path = path.clone();
                async move {
                    match client.get_data(&path).await {
                        Ok((data, _)) => Ok(Some(data)),
                        Err(ZkError::NoNode) => Ok(None),
                        Err(e) => Err(e.into()),
                    }
                }
            })
            .await?;
        Ok(data.map(|data| {
            std::str::from_utf8(&data)
                .ok()
                .and_then(|text| text.trim().parse().ok())
                .map_or(self.inner.epochs.grace(), Duration::from_millis)
        }))
    }

    /// What is left of a grace of `grace` that began at `began` (the server's clock, ms):
    /// counted on the server's clock as last learned from a write (one is made if this client
    /// has not written yet). `None`: it has passed.
    async fn grace_left(
        &self,
        op: &'static str,
        began: i64,
        grace: Duration,
    ) -> Result<Option<Duration>> {
        if grace.is_zero() {
            return Ok(None);
        }
        if self.server_clock().is_none() {
            self.sample(op).await?;
        }
        let now = match self.server_clock() {
            Some(clock) => clock.now_ms(),
            // A server that answers writes without a time: this process's clock.
            None => i64::try_from(clock_us() / 1000).unwrap_or(i64::MAX),
        };
        // mtime is whole milliseconds, rounded down: one more, so the grace is never shorter.
        let grace = grace.saturating_add(Duration::from_millis(1));
        Ok(grace_rest(grace, now.saturating_sub(began)))
    }

    /// Writes `epoch`'s marker and node in one `multi`: creates the marker if there was none
    /// (`previous` is `None`), or replaces it at version `previous` and deletes the epoch
    /// nodes beside it (`children`), so that no request of their epochs passes its check
    /// again. `false` if the marker changed meanwhile.
    async fn begin(
        &self,
        op: &'static str,
        previous: Option<i32>,
        children: &[String],
        epoch: &Epoch,
        grace: Duration,
    ) -> Result<bool> {
        let node = epoch_node(epoch);
        let data = epoch.encode();
        let grace = grace.as_millis().to_string();
        let (node, data, grace) = (&node, &data, &grace);
        let acl = self.inner.acl();
        let sent = Instant::now();
        let (stat, _) = self
            .attempts(op, Kind::Write, |client| async move {
                let mut writer = client.new_multi_writer();
                match previous {
                    None => writer.add_create(MARKER, data.as_bytes(), &acl.persistent())?,
                    Some(version) => {
                        writer.add_set_data(MARKER, data.as_bytes(), Some(version))?;
                        for child in children {
                            writer.add_delete(&format!("{MARKER}/{child}"), None)?;
                        }
                    }
                }
                writer.add_create(node, grace.as_bytes(), &acl.persistent())?;
                // A setData answers with a stat even where a create in a `multi` does not
                // (ZOOKEEPER-4026): the epoch's start and the store's position.
                writer.add_set_data(node, grace.as_bytes(), Some(0))?;
                match writer.commit().await {
                    Ok(results) => Ok(results.into_iter().rev().find_map(|r| match r {
                        MultiWriteResult::SetData { stat } => Some(stat),
                        _ => None,
                    })),
                    // The chroot node is missing: nothing can be created under it.
                    Err(MultiWriteError::OperationFailed {
                        index: 0,
                        source: ZkError::NoNode,
                    }) if previous.is_none() => Err(ZkError::NoNode.into()),
                    // Created, replaced or deleted by another client meanwhile.
                    Err(MultiWriteError::OperationFailed {
                        source: ZkError::NodeExists | ZkError::BadVersion | ZkError::NoNode,
                        ..
                    }) => Ok(None),
                    Err(
                        MultiWriteError::OperationFailed { source, .. }
                        | MultiWriteError::RequestFailed { source },
                    ) => Err(source.into()),
                }
            })
            .await?;
        let Some(stat) = stat else {
            return Ok(false);
        };
        // Its clock and position: the epoch's own write cannot be from before the loss it
        // answers (positions started over if it was seen), so the answer is only recorded.
        let _ = self.wrote(&stat, sent);
        Ok(true)
    }

    /// Whether `seen` (the marker's data as read, `None`: absent) still names this client's
    /// epoch. A read at a server that may lag (`synced` false) is read again in sync with the
    /// leader before anything is concluded. If the store is in another epoch, every session
    /// from before is lost, and so is the caller's ([`Error::SessionLost`] with
    /// [`LostReason::StoreReset`]); the next request that needs the epoch enters the store's.
    pub(super) async fn check_marker(
        &self,
        op: &'static str,
        seen: Option<&[u8]>,
        synced: bool,
    ) -> Result<()> {
        let Some(epoch) = self.inner.epochs.current() else {
            // Lost already: this client saw the store go back and has not entered its epoch.
            return Err(Error::SessionLost(LostReason::StoreReset));
        };
        let encoded = epoch.encode();
        if seen == Some(encoded.as_bytes()) {
            return Ok(());
        }
        let again;
        let seen = if synced {
            seen
        } else {
            again = self.read_marker(op).await?.marker.map(|(data, _)| data);
            again.as_deref()
        };
        if seen == Some(encoded.as_bytes()) {
            return Ok(());
        }
        self.forget(&epoch, seen);
        Err(Error::SessionLost(LostReason::StoreReset))
    }

    /// The error for a `multi` whose check of `epoch`'s node failed: the store is not in that
    /// epoch (a write's checks are decided in ZooKeeper's one order: no lagging server can
    /// refuse it).
    pub(super) fn epoch_refused(&self, epoch: &Epoch) -> Error {
        self.forget(epoch, None);
        Error::SessionLost(LostReason::StoreReset)
    }

    /// This client's `epoch` is over: the marker is gone, or names another epoch (`seen`).
    fn forget(&self, epoch: &Epoch, seen: Option<&[u8]>) {
        let what = match seen.map(Epoch::decode) {
            None => format!("epoch {epoch} is gone from ZooKeeper"),
            Some(Some(other)) => format!("ZooKeeper is in epoch {other}, not {epoch}"),
            Some(None) => format!("ZooKeeper's epoch marker is not baton's (epoch {epoch} was)"),
        };
        if self.inner.epochs.forgot(epoch, &what) {
            tracing::warn!(store = %self.label(), "{what}: it lost or rolled back its state");
        }
    }

    /// A new session learns of a store that forgot (and of its grace) before it is granted
    /// anything: reads the marker through `client` (the new session's).
    pub(super) async fn confirm_epoch(&self, op: &'static str, client: &Client) -> Result<()> {
        if self.inner.epochs.current().is_none() {
            return self.establish(op).await.map(drop);
        }
        let limit = self.inner.options.request_timeout;
        let seen = match tokio::time::timeout(limit, client.get_data(MARKER)).await {
            Ok(Ok((data, _))) => Some(data),
            Ok(Err(ZkError::NoNode)) => None,
            Ok(Err(e)) => return Err(super::zk_err(op, e).at_endpoint(&self.label())),
            Err(elapsed) => {
                return Err(Error::Backend {
                    op,
                    source: Box::new(elapsed),
                    at: Default::default(),
                }
                .at_endpoint(&self.label()));
            }
        };
        match self.check_marker(op, seen.as_deref(), false).await {
            Err(Error::SessionLost(LostReason::StoreReset)) => self.establish(op).await.map(drop),
            other => other,
        }
    }

    /// Asks, through a session that connects now, whether the store is still in this
    /// client's epoch (its marker, then the zxid of one write): how a process learns that a
    /// server refusing its older sessions (one that is behind them) lost its state or went
    /// back to an older copy of it. The backend's own session is used if it is
    /// connected; otherwise a fresh one, which then replaces it. Looks made while callers
    /// waited are shared: a look finished after `since` answers for them all.
    ///
    /// [`Error::SessionLost`] with [`LostReason::StoreReset`] if the store is in another
    /// epoch (every session from before is then lost); `Ok` otherwise, also when nothing
    /// could be learned.
    pub(super) async fn probe(&self, since: Instant) -> Result<()> {
        let mut last = self.inner.probed.lock().await;
        let look = match *last {
            Some((at, look)) if at >= since => look,
            _ => {
                let look = self.look().await;
                if look != Look::Unknown {
                    *last = Some((Instant::now(), look));
                }
                look
            }
        };
        drop(last);
        match look {
            Look::Moved => Err(Error::SessionLost(LostReason::StoreReset)),
            Look::Same | Look::Unknown => Ok(()),
        }
    }

    /// One look for [`probe`](Self::probe).
    async fn look(&self) -> Look {
        let Some(epoch) = self.inner.epochs.current() else {
            // The store was seen going back and its epoch not entered since: the sessions
            // from before are lost already.
            return Look::Moved;
        };
        let Some((client, fresh)) = self.connected_client().await else {
            return Look::Unknown;
        };
        let look = self.look_through(&client, &epoch).await;
        if fresh {
            // Only now: the backend's own requests would otherwise see the store as it is
            // (an entry gone, say) before this look has said why.
            self.replace_base(client);
        }
        look
    }

    /// [`look`](Self::look) through `client`, a session that is connected.
    async fn look_through(&self, client: &Client, epoch: &Epoch) -> Look {
        let read = async {
            sync(client, MARKER).await?;
            match client.get_data(MARKER).await {
                Ok((data, _)) => Ok(Some(data)),
                Err(ZkError::NoNode) => Ok(None),
                Err(e) => Err(e.into()),
            }
        };
        let limit = self.inner.options.request_timeout;
        let seen: Option<Vec<u8>> = match tokio::time::timeout(limit, read).await {
            Ok(Ok(seen)) => seen,
            Ok(Err(super::Failure::Zk(e) | super::Failure::Unsent(e))) => {
                tracing::debug!(error = %e, "looking at the epoch marker failed");
                return Look::Unknown;
            }
            Ok(Err(super::Failure::Stop(_))) | Err(_) => return Look::Unknown,
        };
        if seen.as_deref() != Some(epoch.encode().as_bytes()) {
            self.forget(epoch, seen.as_deref());
            return Look::Moved;
        }
        // The same marker, and yet an older session is refused: a store restored from an
        // older copy (its transaction log lost, its data dir restored) brings its marker
        // back. A write tells: its zxid is below what this client saw.
        let sent = Instant::now();
        match tokio::time::timeout(limit, sample_once(client, self.inner.acl())).await {
            Ok(Ok(stat)) if self.wrote(&stat, sent).is_err() => Look::Moved,
            _ => Look::Same,
        }
    }

    /// The backend's own client if it is connected (`false`); otherwise a fresh session
    /// (`true`), for [`replace_base`](Self::replace_base). `None` if no session connects
    /// within a short limit.
    async fn connected_client(&self) -> Option<(Client, bool)> {
        let current = self.current_base();
        if is_connected(&current) {
            return Some((current, false));
        }
        drop(current);
        let options = &self.inner.options;
        let limit = options.connect_timeout.min(PROBE_CONNECT);
        match open(
            &self.inner.connect,
            self.inner.tls.as_ref(),
            self.inner.sasl.as_ref(),
            options.session_timeout,
            limit,
        )
        .await
        {
            Ok(fresh) => Some((fresh, true)),
            Err(e) => {
                tracing::debug!(error = %e, "no ZooKeeper session connects to look at the epoch marker");
                None
            }
        }
    }

    /// Makes `fresh` the backend's own session if the current one is still not connected:
    /// it may be refused by a server that lost its data, which the client library retries
    /// until 1.4 times its timeout has passed, while `fresh` connected.
    fn replace_base(&self, fresh: Client) {
        let mut base = self.inner.base.lock().unwrap_or_else(|p| p.into_inner());
        if !is_connected(&base) && is_connected(&fresh) {
            tracing::info!(endpoint = %self.inner.connect, "the backend's ZooKeeper session is disconnected while a new one connects: replacing it");
            *base = fresh;
        }
    }
}
