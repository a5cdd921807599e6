//! Store epochs on etcd ([`crate::StoreEpochs`] holds the rules; this is where etcd keeps
//! them).
//!
//! - The epoch's marker is the key `_baton-epoch` (no lease), whose value names the epoch
//!   and how its tokens are made from create revisions. Every request that decides a grant or
//!   changes an entry compares it (`Compare::value`) in the same transaction, so nothing is
//!   granted or written under an epoch the store has left.
//! - The grace is the key `_baton-grace`, bound to a lease of the grace's length: etcd's
//!   leader measures it, on its own clock, and a client that finds the key learns what is
//!   left from the lease's TTL.
//! - Identity and position: the cluster id and the revision and raft term of every
//!   linearizable answer. A revision or term below one seen means the store went back (a
//!   member restarted without its data dir, `etcdctl snapshot restore`); the client that sees
//!   it begins a new epoch.
//!
//! Both keys live outside every lock's prefix, beside `_baton-sessions/`: etcdctl and Go's
//! recipes never see them, and one permission on the prefix `_baton-` covers all three.

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, PutOptions, ResponseHeader, Txn, TxnOp, TxnOpResponse, TxnResponse,
};

use tokio::time::Instant;

use super::EtcdBackend;
use crate::epoch::{Epoch, clock_us};
use crate::error::{Error, Result};

/// The key of the epoch marker.
pub(super) const MARKER: &str = "_baton-epoch";
/// The key bound to the grace's lease while the grace lasts.
pub(super) const GRACE: &str = "_baton-grace";

/// How many times a client reads the marker again because another client changed it while
/// it looked (each time, someone else began an epoch: the next look enters it).
const MARKER_RACES: usize = 8;

impl EtcdBackend {
    /// The epoch in force, entering the store's (or beginning one) if this client is in none:
    /// at connect, and after it saw the store go back.
    pub(super) async fn epoch(&self) -> Result<Epoch> {
        match self.inner.epochs.current() {
            Some(epoch) => Ok(epoch),
            None => self.establish("epoch").await,
        }
    }

    /// The compare that keeps a transaction within `epoch`.
    pub(super) fn in_epoch(epoch: &Epoch) -> Compare {
        Compare::value(MARKER, CompareOp::Equal, epoch.encode())
    }

    /// The read that tells, in a transaction whose compares failed, whether the epoch was
    /// the cause.
    pub(super) fn read_marker() -> TxnOp {
        TxnOp::get(MARKER, None)
    }

    /// Whether the marker read by [`read_marker`](Self::read_marker) (the operation at
    /// `index` of a failed transaction's answer) still names `epoch`. If not, this client
    /// enters the store's epoch now (every session from before is lost) and the caller's
    /// request was refused for that reason.
    pub(super) async fn marker_moved(
        &self,
        resp: &TxnResponse,
        index: usize,
        epoch: &Epoch,
    ) -> Result<bool> {
        let marker = match resp.op_responses().get(index) {
            Some(TxnOpResponse::Get(get)) => get.kvs().first().map(|kv| kv.value().to_vec()),
            _ => return Err(super::malformed("epoch")),
        };
        if marker.as_deref() == Some(epoch.encode().as_bytes()) {
            return Ok(false);
        }
        tracing::debug!("the epoch marker moved; entering the store's epoch");
        self.establish("epoch").await?;
        Ok(true)
    }

    /// Takes in the header of a linearizable answer: a new cluster, or a revision or term
    /// below one seen, begins a new epoch (after which every grant waits the grace).
    ///
    /// `write`: the answer is to a write, applied in the term the header names; a read's
    /// term may lag on a follower, so only its revision is compared.
    ///
    /// `sent`: when the request was sent (see [`StoreEpochs::saw`](crate::StoreEpochs)).
    pub(super) async fn saw_header(
        &self,
        header: Option<&ResponseHeader>,
        write: bool,
        sent: Instant,
    ) -> Result<()> {
        let Some(h) = header else { return Ok(()) };
        let revision = u64::try_from(h.revision()).unwrap_or(0);
        let term = [revision, h.raft_term()];
        let positions = if write { &term[..] } else { &term[..1] };
        if let Err(back) = self
            .inner
            .epochs
            .saw(&h.cluster_id().to_be_bytes(), positions, sent)
        {
            tracing::warn!(store = %self.label(), "etcd went back in time ({}): beginning a new epoch", back.what);
            self.establish("epoch").await?;
        }
        Ok(())
    }

    /// Reads the marker and enters its epoch, or begins one: when there is no marker (a new
    /// store, or one that lost its data), when it is not baton's, or when it is from before
    /// the store went back (this client saw it go back: [`StoreEpochs::may_enter`]).
    ///
    /// `init`: the caller asserts that no holder from before can exist (`baton init`): an
    /// epoch it begins has no grace.
    ///
    /// `op` names the operation in errors (the caller's, when it is the reason for the look).
    pub(super) async fn establish(&self, op: &'static str) -> Result<Epoch> {
        Ok(self.establish_as(op, false).await?.0)
    }

    /// [`establish`](Self::establish), and whether this client began the epoch.
    pub(super) async fn establish_as(&self, op: &'static str, init: bool) -> Result<(Epoch, bool)> {
        for _ in 0..MARKER_RACES {
            let sent = Instant::now();
            let look = Txn::new().and_then([TxnOp::get(MARKER, None), TxnOp::get(GRACE, None)]);
            let resp = self.read_txn_raw(op, look).await?;
            let header_revision = resp.header().map_or(0, |h| h.revision());
            if let Some(h) = resp.header() {
                // Recorded: a look that finds the store gone back treats its marker as stale.
                let positions = [u64::try_from(h.revision()).unwrap_or(0)];
                let _ = self
                    .inner
                    .epochs
                    .saw(&h.cluster_id().to_be_bytes(), &positions, sent);
            }
            let kv = |i: usize| match resp.op_responses().get(i) {
                Some(TxnOpResponse::Get(get)) => get.kvs().first().cloned(),
                _ => None,
            };
            let (marker, grace) = (kv(0), kv(1));
            let cluster = resp.header().map_or(0, |h| h.cluster_id());
            let found = marker.as_ref().and_then(|kv| Epoch::decode(kv.value()));
            // A marker that names another cluster came with a restore onto a new one
            // (`etcdctl snapshot restore` with a new --initial-cluster-token): from before.
            let ours = |e: &Epoch| e.store() == 0 || e.store() == cluster;
            if let Some(epoch) = found.filter(|e| ours(e) && self.inner.epochs.may_enter(e)) {
                let left = match grace {
                    Some(kv) if kv.lease() != 0 => self.grace_lease_left(op, kv.lease()).await?,
                    _ => None,
                };
                self.inner.epochs.enter(epoch, left);
                return Ok((epoch, false));
            }
            let origin = u64::try_from(header_revision).unwrap_or(0);
            // A marker refused (from before the store went back, or below what this client
            // saw) may have had its grace pass and its tokens handed out, up to its token at
            // the store's revision now: the new epoch starts above them too, whatever the
            // clock says.
            if let Some(refused) = found.filter(ours) {
                self.inner.epochs.above(refused.token(origin).get());
            }
            let epoch = self
                .inner
                .epochs
                .next_epoch(origin, clock_us())
                .on_store(cluster);
            let grace = if init {
                Duration::ZERO
            } else {
                self.inner.epochs.grace()
            };
            if self
                .begin(op, marker.as_ref().map(|kv| kv.value()), &epoch, grace)
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

    /// Writes `epoch`'s marker in place of `previous` (`None`: there is none), with its grace
    /// key; `false` if the marker changed meanwhile.
    async fn begin(
        &self,
        op: &'static str,
        previous: Option<&[u8]>,
        epoch: &Epoch,
        grace: Duration,
    ) -> Result<bool> {
        let unchanged = match previous {
            None => Compare::create_revision(MARKER, CompareOp::Equal, 0),
            Some(value) => Compare::value(MARKER, CompareOp::Equal, value),
        };
        let mut ops = vec![TxnOp::put(MARKER, epoch.encode(), None)];
        let lease = if grace.is_zero() {
            ops.push(TxnOp::delete(GRACE, None));
            None
        } else {
            // etcd counts whole seconds: round up, so the grace is never shorter.
            let secs = i64::try_from(grace.as_secs() + u64::from(grace.subsec_nanos() > 0))
                .unwrap_or(i64::MAX);
            let (granted, _) = self
                .write(
                    "epoch",
                    |mut c| async move { c.lease_grant(secs, None).await },
                )
                .await?;
            let options = PutOptions::new().with_lease(granted.id());
            ops.push(TxnOp::put(GRACE, "", Some(options)));
            Some(granted.id())
        };
        let txn = Txn::new().when([unchanged]).and_then(ops);
        let (resp, _) = self.write_txn_raw(op, txn).await?;
        if !resp.succeeded()
            && let Some(lease) = lease
        {
            // Ours was not written: its lease would only hold an orphan key back.
            let _ = self
                .call(op, |mut c| async move { c.lease_revoke(lease).await })
                .await;
        }
        Ok(resp.succeeded())
    }

    /// What is left of a grace whose key is bound to `lease` (`None`: it has ended). etcd
    /// answers whole seconds, rounded down: one more is added, so it is never shorter.
    async fn grace_lease_left(&self, op: &'static str, lease: i64) -> Result<Option<Duration>> {
        let resp = self
            .call(op, |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
            .await?;
        Ok(u64::try_from(resp.ttl())
            .ok()
            .map(|s| Duration::from_secs(s + 1)))
    }

    /// A linearizable read that confirms this client's epoch is still the store's: after a
    /// renewal (a lease that a restore brought back renews, and only the marker tells its
    /// holder that the store went back), and before a lease is granted (so that a new session
    /// knows of a grace at once).
    pub(super) async fn confirm_epoch(&self, op: &'static str) -> Result<()> {
        let Some(epoch) = self.inner.epochs.current() else {
            // Its first look (or a look after the store went back) reads the marker anyway.
            return self.establish(op).await.map(drop);
        };
        let sent = Instant::now();
        let resp = self
            .call(op, |mut c| async move { c.get(MARKER, None).await })
            .await?;
        self.saw_header(resp.header(), false, sent).await?;
        let marker = resp.kvs().first().map(|kv| kv.value().to_vec());
        if marker.as_deref() != Some(epoch.encode().as_bytes()) {
            tracing::debug!("the epoch marker moved; entering the store's epoch");
            self.establish(op).await?;
        }
        Ok(())
    }
}
