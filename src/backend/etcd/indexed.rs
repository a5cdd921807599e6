//! The indexed layout ([`EtcdLayout::Indexed`]): entry keys whose key order is queue order, so
//! that an enqueue, a look at the predecessor and a head check each read a few keys, however
//! deep the queue (#39).
//!
//! An entry of queue `q` created with sequence number `seq` (taken by its enqueue, one more
//! than the newest entry's) is the key `q/_q/<16 hex digits of u64::MAX - seq>.<tag>`, bound to
//! the session's lease: newer entries get **smaller** keys, so the newest entry older than mine
//! is the first key after mine in ascending key order, a read etcd answers with `limit`
//! applied as it walks its index. (A read sorted or filtered by create revision, which the Go
//! layout needs, makes etcd load every key of the range first.) Its position and token are its
//! create revision, as in the Go layout.
//!
//! An enqueue applies only if no entry at or after its sequence number exists: sequence order
//! is then commit order, which is create-revision order. The key `_baton-tags/q/<tag>` (same
//! lease, created and deleted with the entry) names the entry of a tag, for retries and
//! [`find_entry`](crate::Backend::find_entry) after a lost answer.
//!
//! Keys under `q/` that are not in `q/_q/` (an `etcdctl lock` or Go holder, a nested queue
//! `q/sub`) make the queue *mixed*: its reads then take the Go layout's path (every key under
//! `q/` by create revision), which is correct for any mix and as costly as the Go layout.

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::time::Instant;

use super::{EtcdBackend, FENCE_RACES, fence_key, malformed, newest_first, revision};
use crate::backend::{Enqueued, Entry, LeaseId};
use crate::error::{Error, LostReason, Result};

/// Where an [`EtcdBackend`] puts the entries it creates. Every baton client of one lock name
/// should use the same layout: each reads the other's entries correctly, but a queue that
/// holds keys of both loses the indexed layout's speed (see below).
///
/// **Pick [`Go`](Self::Go)** (the default) unless both of these hold for your lock names:
/// queues routinely hold more than about a thousand waiters, and no `etcdctl lock`/`elect` or
/// Go `concurrency` client uses the name. The Go layout interoperates with those clients, and at
/// usual depths costs the same; but etcd answers its reads ("the entry just before mine", by
/// create revision) by loading every key under the name, so each enqueue and each handoff
/// costs O(queue length) there.
///
/// **[`Indexed`](Self::Indexed)** names keys so that queue order is key order: an enqueue, a
/// waiter's look at its predecessor and a head check read O(1) keys (O(log n) work in etcd)
/// at any depth. Its keys are not the Go layout's: an `etcdctl lock` on the same name sees
/// baton's entries as older contenders and waits behind them (safe), while baton's indexed
/// clients, finding a key outside their layout under the name, fall back to reading the whole
/// queue by create revision (safe, and as costly as the Go layout) until it is gone. Listing a
/// whole queue ([`head`](crate::Backend::head), `Election::leader`, `baton ls`) still reads
/// every entry in both layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum EtcdLayout {
    /// `<name>/<lease id in hex>`, as etcd's Go `concurrency` package and `etcdctl lock`.
    #[default]
    Go,
    /// `<name>/_q/<inverted sequence number>.<tag>`, in queue order by key.
    Indexed,
}

impl EtcdLayout {
    /// Parses `go` or `indexed` (the CLI's `--layout`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for any other text.
    pub fn parse(text: &str) -> Result<EtcdLayout> {
        match text {
            "go" => Ok(EtcdLayout::Go),
            "indexed" => Ok(EtcdLayout::Indexed),
            _ => Err(Error::InvalidArgument(
                "an etcd layout is `go` or `indexed`",
            )),
        }
    }
}

/// How many times an indexed enqueue takes a new sequence number because other enqueues took
/// its own first, before it gives up.
const SEQ_RACES: usize = 4096;

/// How many queues' next sequence numbers a backend remembers (forgetting costs one failed
/// attempt at the next enqueue of the queue).
const SEQS_KEPT: usize = 4096;

fn entry_key(queue: &str, seq: u64, tag: &str) -> String {
    format!("{queue}/_q/{:016x}.{tag}", u64::MAX - seq)
}

fn tag_key(queue: &str, tag: &str) -> String {
    format!("_baton-tags/{queue}/{tag}")
}

fn dir(queue: &str) -> String {
    format!("{queue}/_q/")
}

fn dir_end(queue: &str) -> String {
    format!("{queue}/_q0")
}

/// The first key of an entry older than `seq` (a larger inverted number), if one can exist.
fn older_than(queue: &str, seq: u64) -> Option<String> {
    let inverted = (u64::MAX - seq).checked_add(1)?;
    Some(format!("{queue}/_q/{inverted:016x}"))
}

/// The key range of entries at or after `seq`: `[dir, end)`.
fn at_or_after(queue: &str, seq: u64) -> (String, String) {
    let end = older_than(queue, seq).unwrap_or_else(|| dir_end(queue));
    (dir(queue), end)
}

/// The two ranges of keys under `queue/` outside its entries' directory `queue/_q/`.
fn others(queue: &str) -> [(String, String); 2] {
    [
        (format!("{queue}/"), dir(queue)),
        (dir_end(queue), format!("{queue}0")),
    ]
}

/// The queue, sequence number and tag of an indexed entry key.
pub(super) fn parse(key: &[u8]) -> Option<(&str, u64, &str)> {
    let key = std::str::from_utf8(key).ok()?;
    let (queue, rest) = key.rsplit_once("/_q/")?;
    let (hex, tag) = rest.split_at_checked(16)?;
    let tag = tag.strip_prefix('.')?;
    if tag.contains('/') || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let inverted = u64::from_str_radix(hex, 16).ok()?;
    Some((queue, u64::MAX - inverted, tag))
}

fn key_ascending(limit: i64, end: String) -> GetOptions {
    GetOptions::new().with_range(end).with_limit(limit)
}

fn kvs(resp: Option<&TxnOpResponse>) -> &[etcd_client::KeyValue] {
    match resp {
        Some(TxnOpResponse::Get(get)) => get.kvs(),
        _ => &[],
    }
}

impl EtcdBackend {
    pub(super) fn indexed(&self) -> bool {
        self.inner.options.layout == EtcdLayout::Indexed
    }

    /// The next sequence number this process proposes for `queue`.
    fn next_seq(&self, queue: &str) -> u64 {
        let mut seqs = self.inner.seqs.lock().unwrap_or_else(|p| p.into_inner());
        if seqs.len() >= SEQS_KEPT && !seqs.contains_key(queue) {
            seqs.clear();
        }
        let next = seqs.entry(queue.to_owned()).or_insert(0);
        let seq = *next;
        *next = next.saturating_add(1);
        seq
    }

    /// Records that `queue` has an entry with sequence number `seq`.
    fn saw_seq(&self, queue: &str, seq: u64) {
        let mut seqs = self.inner.seqs.lock().unwrap_or_else(|p| p.into_inner());
        let next = seqs.entry(queue.to_owned()).or_insert(0);
        *next = (*next).max(seq.saturating_add(1));
    }

    /// Reads that tell whether `queue` holds keys outside its entries' directory (keys only,
    /// at most one each: O(1) when there are none).
    fn others_reads(queue: &str, serializable: bool) -> [TxnOp; 2] {
        others(queue).map(|(start, end)| {
            let mut options = key_ascending(1, end).with_keys_only();
            if serializable {
                options = options.with_serializable();
            }
            TxnOp::get(start, Some(options))
        })
    }

    /// [`Backend::enqueue`](crate::Backend::enqueue) in the indexed layout.
    pub(super) async fn enqueue_indexed(
        &self,
        queue: &str,
        tag: &str,
        lease: LeaseId,
        value: &[u8],
    ) -> Result<Enqueued> {
        let fence = fence_key(lease);
        let tags = tag_key(queue, tag);
        let (mut fence_races, mut seq_races, mut mixed) = (0, 0, false);
        loop {
            let epoch = self.epoch().await?;
            let seq = self.next_seq(queue);
            let key = entry_key(queue, seq, tag);
            let (newer, newer_end) = at_or_after(queue, seq);
            let txn = |fence_seen: i64| {
                let mut when = vec![
                    Compare::create_revision(tags.as_str(), CompareOp::Equal, 0),
                    Compare::create_revision(newer.as_str(), CompareOp::Equal, 0)
                        .with_range(newer_end.as_str()),
                    Compare::mod_revision(fence.as_str(), CompareOp::Equal, fence_seen),
                    Self::in_epoch(&epoch),
                ];
                // The predecessor, read before the puts: in a queue of baton's indexed
                // entries only, the first key after mine; otherwise the newest key under the
                // name by create revision, as the Go layout reads it.
                let predecessor = if mixed {
                    TxnOp::get(format!("{queue}/"), Some(newest_first(1)))
                } else {
                    when.extend(others(queue).map(|(start, end)| {
                        Compare::create_revision(start, CompareOp::Equal, 0).with_range(end)
                    }));
                    match older_than(queue, seq) {
                        Some(start) => TxnOp::get(start, Some(key_ascending(1, dir_end(queue)))),
                        // Nothing can be older than sequence number 0: an empty range.
                        None => TxnOp::get(dir_end(queue), Some(key_ascending(1, dir_end(queue)))),
                    }
                };
                let bound = || Some(PutOptions::new().with_lease(lease.get()));
                let [other_low, other_high] = Self::others_reads(queue, false);
                Txn::new()
                    .when(when)
                    .and_then([
                        predecessor,
                        TxnOp::put(key.as_str(), value, bound()),
                        TxnOp::put(tags.as_str(), key.as_str(), bound()),
                    ])
                    .or_else([
                        TxnOp::get(tags.as_str(), None),
                        TxnOp::get(
                            dir(queue),
                            Some(key_ascending(1, dir_end(queue)).with_keys_only()),
                        ),
                        TxnOp::get(fence.as_str(), None),
                        Self::read_marker(),
                        other_low,
                        other_high,
                    ])
            };
            // As in the Go layout: a retry first moves the fence, so that an earlier attempt
            // still on its way cannot apply after the entry is released; the tag makes the
            // retry find what an applied attempt created.
            let sent = std::sync::atomic::AtomicBool::new(false);
            let sent_at = Instant::now();
            let (resp, _) = self
                .write("enqueue", |mut c| {
                    let retry = sent.swap(true, std::sync::atomic::Ordering::SeqCst);
                    let txn = &txn;
                    async move {
                        if retry {
                            self.put_fence(&mut c, lease).await?;
                        }
                        c.txn(txn(self.fence_seen(lease))).await
                    }
                })
                .await?;
            self.saw_header(resp.header(), true, sent_at).await?;
            let ops = resp.op_responses();
            if resp.succeeded() {
                self.saw_seq(queue, seq);
                if let Some(TxnOpResponse::Get(get)) = ops.first() {
                    self.read_keys(get, mixed);
                }
                return self.created(&resp, key, value, lease);
            }
            if self.marker_moved(&resp, 3, &epoch).await? {
                return Err(Error::SessionLost(LostReason::StoreReset));
            }
            // The tag has an entry: an earlier attempt (or call) created it.
            if let Some(tagged) = kvs(ops.first()).first() {
                if let Some(found) = self.entry_of_tag(tagged).await? {
                    let predecessor = self.predecessor_indexed(&found).await?;
                    return Ok(Enqueued::new(found, predecessor.is_none(), predecessor));
                }
                // A tag left behind by an entry deleted from outside: remove it, try again.
                let stale = Txn::new()
                    .when([Compare::create_revision(
                        tags.as_str(),
                        CompareOp::Equal,
                        tagged.create_revision(),
                    )])
                    .and_then([TxnOp::delete(tags.as_str(), None)]);
                self.write_txn("enqueue", stale).await?;
                continue;
            }
            if let Some(newest) = kvs(ops.get(1)).first().and_then(|kv| parse(kv.key())) {
                self.saw_seq(queue, newest.1);
            }
            if !kvs(ops.get(4)).is_empty() || !kvs(ops.get(5)).is_empty() {
                mixed = true;
            }
            let fence_now = match ops.get(2) {
                Some(TxnOpResponse::Get(get)) => get.kvs().first().map(|kv| kv.mod_revision()),
                _ => return Err(malformed("enqueue")),
            };
            let seen = self.fence_seen(lease);
            match fence_now {
                Some(revision) if revision != seen => {
                    self.fenced_at(lease, revision);
                    fence_races += 1;
                }
                None if seen != 0 => {
                    self.move_fence(lease).await?;
                    fence_races += 1;
                }
                // Other enqueues took this sequence number (or a newer one), or the queue
                // turned out mixed: take the next one.
                _ => seq_races += 1,
            }
            if fence_races >= FENCE_RACES || seq_races >= SEQ_RACES {
                return Err(Error::Backend {
                    op: "enqueue",
                    source: if fence_races >= FENCE_RACES {
                        "the lease's fence kept moving under the enqueue".into()
                    } else {
                        "other enqueues kept taking the queue's next place".into()
                    },
                    at: Default::default(),
                }
                .at_endpoint(&self.label()));
            }
        }
    }

    /// The entry the tag key `tagged` names, if it is still the one created with it.
    async fn entry_of_tag(&self, tagged: &etcd_client::KeyValue) -> Result<Option<Entry>> {
        let key = tagged.value().to_vec();
        let sent = Instant::now();
        let resp = self
            .call("find_entry", |mut c| {
                let key = key.clone();
                async move { c.get(key, None).await }
            })
            .await?;
        self.saw_header(resp.header(), false, sent).await?;
        self.epoch().await?;
        Ok(resp
            .kvs()
            .first()
            .filter(|kv| kv.create_revision() == tagged.create_revision())
            .map(|kv| self.to_entry(kv)))
    }

    /// [`Backend::find_entry`](crate::Backend::find_entry) in the indexed layout.
    pub(super) async fn find_entry_indexed(&self, queue: &str, tag: &str) -> Result<Option<Entry>> {
        let key = tag_key(queue, tag);
        let sent = Instant::now();
        let resp = self
            .call("find_entry", |mut c| {
                let key = key.clone();
                async move { c.get(key, None).await }
            })
            .await?;
        self.saw_header(resp.header(), false, sent).await?;
        match resp.kvs().first() {
            Some(tagged) => self.entry_of_tag(tagged).await,
            None => {
                self.epoch().await?;
                Ok(None)
            }
        }
    }

    /// The predecessor of the indexed entry `mine`.
    pub(super) async fn predecessor_indexed(&self, mine: &Entry) -> Result<Option<Entry>> {
        let Some((queue, _, _)) = parse(mine.key_bytes()) else {
            return Err(malformed("predecessor"));
        };
        let queue = queue.to_owned();
        Ok(self
            .ahead_indexed("predecessor", &queue, mine, 1, None)
            .await?
            .0
            .into_iter()
            .next())
    }

    /// Up to `limit` entries of `queue` just before the indexed entry `mine` (its own queue),
    /// newest first, and the plain key `key` if asked: the first keys after mine, in one
    /// transaction that runs only while `mine` exists. A mixed queue takes the Go layout's
    /// read.
    pub(super) async fn ahead_indexed(
        &self,
        op: &'static str,
        queue: &str,
        mine: &Entry,
        limit: usize,
        key: Option<&str>,
    ) -> Result<(Vec<Entry>, Option<Vec<u8>>)> {
        let Some((_, seq, _)) = parse(mine.key_bytes()) else {
            return Err(malformed(op));
        };
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let start = older_than(queue, seq).unwrap_or_else(|| dir_end(queue));
        let [other_low, other_high] = Self::others_reads(queue, false);
        let mut ops = vec![
            TxnOp::get(start, Some(key_ascending(limit, dir_end(queue)))),
            other_low,
            other_high,
        ];
        ops.extend(key.map(|key| TxnOp::get(key, None)));
        let resp = self.if_live(op, mine, ops).await?;
        if !resp.succeeded() {
            return Err(Error::EntryGone {
                key: mine.key().to_owned(),
            });
        }
        let ops = resp.op_responses();
        if !kvs(ops.get(1)).is_empty() || !kvs(ops.get(2)).is_empty() {
            return self
                .ahead_txn(
                    op,
                    queue,
                    mine,
                    usize::try_from(limit).unwrap_or(usize::MAX),
                    key,
                )
                .await;
        }
        if let Some(TxnOpResponse::Get(get)) = ops.first() {
            self.read_keys(get, false);
        }
        let value = kvs(ops.get(3)).first().map(|kv| kv.value().to_vec());
        Ok((
            kvs(ops.first())
                .iter()
                .map(|kv| self.to_entry(kv))
                .collect(),
            value,
        ))
    }

    /// [`Backend::was_head`](crate::Backend::was_head) for the indexed entry `mine`: one
    /// serializable transaction that sees `mine`, no key after it, nothing else under the name,
    /// and this client's epoch marker.
    pub(super) async fn was_head_indexed(&self, mine: &Entry) -> Result<bool> {
        let Some((queue, seq, _)) = parse(mine.key_bytes()) else {
            return Ok(false);
        };
        let Some(epoch) = self.inner.epochs.current() else {
            return Ok(false);
        };
        let start = older_than(queue, seq).unwrap_or_else(|| dir_end(queue));
        let [other_low, other_high] = Self::others_reads(queue, true);
        let txn = Txn::new().and_then([
            TxnOp::get(
                start,
                Some(
                    key_ascending(1, dir_end(queue))
                        .with_keys_only()
                        .with_serializable(),
                ),
            ),
            TxnOp::get(
                mine.key_bytes(),
                Some(GetOptions::new().with_keys_only().with_serializable()),
            ),
            other_low,
            other_high,
            TxnOp::get(
                super::epoch::MARKER,
                Some(GetOptions::new().with_serializable()),
            ),
        ]);
        let resp = self
            .call_within("was_head", std::time::Duration::ZERO, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        let ops = resp.op_responses();
        if let Some(TxnOpResponse::Get(get)) = ops.first() {
            self.read_keys(get, false);
        }
        if kvs(ops.get(4)).first().map(etcd_client::KeyValue::value)
            != Some(epoch.encode().as_bytes())
        {
            return Ok(false);
        }
        Ok(kvs(ops.first()).is_empty()
            && kvs(ops.get(1))
                .first()
                .is_some_and(|kv| kv.create_revision() == revision(mine))
            && kvs(ops.get(2)).is_empty()
            && kvs(ops.get(3)).is_empty())
    }

    /// The tag key deleted with the indexed entry `entry`, if it is one.
    pub(super) fn tag_key_of(&self, entry: &Entry) -> Option<String> {
        let (queue, _, tag) = parse(entry.key_bytes())?;
        self.indexed().then(|| tag_key(queue, tag))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_newest_first_and_parse_back() {
        let (a, b) = (entry_key("q", 1, "t1"), entry_key("q", 2, "t2"));
        assert!(b < a, "the newer entry sorts first");
        assert_eq!(parse(a.as_bytes()), Some(("q", 1, "t1")));
        assert_eq!(parse(b"q/_q/ffffffffffffffff.x"), Some(("q", 0, "x")));
        assert_eq!(parse(b"q/1234"), None);
        assert_eq!(parse(b"q/_q/FFFFFFFFFFFFFFFF.x"), None);
        assert_eq!(parse(b"q/_q/ffffffffffffffff.x/y"), None);
        // The first key of an older entry is after every key of mine.
        let older = older_than("q", 2).unwrap();
        assert!(older > b && older <= a);
        assert_eq!(older_than("q", 0), None);
        let (start, end) = at_or_after("q", 2);
        assert!(start <= b && b < end && a >= end);
        // The directory lies between the two ranges of other keys.
        let [(l0, l1), (h0, h1)] = others("q");
        let (l0, l1, h0, h1) = (l0.as_str(), l1.as_str(), h0.as_str(), h1.as_str());
        assert!(l0 <= "q/1234" && "q/1234" < l1 && l1 <= a.as_str());
        assert!(dir_end("q").as_str() <= h0 && h0 <= "q/abcd" && "q/abcd" < h1);
        assert!(h1 > "q/sub/_q/x" && "q/sub/_q/x" >= h0);
    }
}
