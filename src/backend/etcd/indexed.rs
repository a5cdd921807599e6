//! The indexed layout ([`EtcdLayout::Indexed`]): entry keys whose key order is queue order up
//! to a window, so that an enqueue, a look at the predecessor and a head check each read a
//! bounded number of keys, however deep the queue (#39).
//!
//! An entry of queue `q` created with sequence number `seq` (taken by its enqueue, one more
//! than the newest entry's it knows of) is the key `q/_q/<16 hex digits of u64::MAX - seq>.<tag>`,
//! bound to the session's lease: newer entries get **smaller** keys, so the entries older than
//! mine are found by reading on in ascending key order, a read etcd answers with `limit`
//! applied as it walks its index. (A read sorted or filtered by create revision, which the Go
//! layout needs, makes etcd load every key of the range first.) Its position and token are its
//! create revision, as in the Go layout.
//!
//! An enqueue with sequence number `seq` applies only if no entry numbered `seq + WINDOW` or
//! more exists: of two entries present together, the newer's number is then above the older's
//! minus [`WINDOW`]. Key order is create-revision order up to that window, and a read that
//! starts `WINDOW` numbers above mine and goes on `WINDOW` numbers past the newest older entry
//! it meets has seen every candidate ([`newest_before`]). (An exact order, a window of 1, made
//! most concurrent enqueues of a process lose their number and retry: etcd applies the calls of
//! one connection in an order close to random.) The key `_baton-tags/q/<tag>` (same
//! lease, created and deleted with the entry) names the entry of a tag, for retries and
//! [`find_entry`](crate::Backend::find_entry) after a lost answer.
//!
//! Keys under `q/` that are not in `q/_q/` (an `etcdctl lock` or Go holder, a nested queue
//! `q/sub`) make the queue *mixed*: its reads then take the Go layout's path (every key under
//! `q/` by create revision), which is correct for any mix and as costly as the Go layout. So
//! does a look that meets a key in `q/_q/` that is not one of `q`'s entries (a nested queue
//! `q/_q/x`): its number does not bound its place. Such a key below the entries' keys would
//! also fail every enqueue's compare; the enqueue then says which key blocks it.

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
/// **[`Indexed`](Self::Indexed)** names keys so that queue order is key order, up to a window
/// of 64 numbers (docs/etcd.md, "Layouts"): an enqueue, a waiter's look at its predecessor and
/// a head check read at most about 130 keys at any depth. Its keys are not
/// the Go layout's: an `etcdctl lock` on the same name sees baton's entries as older
/// contenders and waits behind them (safe), while baton's indexed clients, finding a key
/// outside their layout under the name, fall back to reading the whole queue by create
/// revision (safe, and as costly as the Go layout) until it is gone. Listing a
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

/// How far out of sequence order entries may be created: an enqueue numbered `seq` applies
/// only while no entry numbered `seq + WINDOW` or more exists. Wider lets more concurrent
/// enqueues apply out of order without retrying (etcd applies the concurrent calls of one
/// connection in an order close to random); narrower makes each look at the entries before
/// mine read fewer keys (about `2 × WINDOW`). Measured for #39 in docs/design.md (2026-11-29).
const WINDOW: u64 = 64;

/// How many keys a look at the entries before an entry reads at first: from `WINDOW` numbers
/// above it, through it, to `WINDOW` numbers past the newest older entry when no number is
/// shared.
const LOOK: i64 = 2 * WINDOW as i64 + 1;

/// How many keys an enqueue's transaction reads to find its predecessor: from `WINDOW`
/// numbers above its own (none is there) to `WINDOW` numbers past the newest entry, when no
/// number is shared. Numbers shared by several processes leave it undecided, and the enqueue
/// reads on after creating its entry (a round trip more); reading two windows at once instead
/// cost every enqueue of one process time for nothing: 10,000 queued in 8.5 s against 7.7
/// (docs/design.md, 2026-11-29).
const ENQUEUE_LOOK: i64 = WINDOW as i64 + 1;

/// How many enqueues of one queue a process has in flight at once: no more than the window,
/// so that its own enqueues, numbered one after the other, rarely fall out of it.
const IN_FLIGHT: usize = WINDOW as usize;

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

/// The first key of the entries numbered `seq` or less (newer entries have smaller keys).
fn from_seq(queue: &str, seq: u64) -> String {
    format!("{queue}/_q/{:016x}", u64::MAX - seq)
}

/// The first key of an entry numbered below `seq`, if one can exist.
fn older_than(queue: &str, seq: u64) -> Option<String> {
    Some(from_seq(queue, seq.checked_sub(1)?))
}

/// The first key a look at the entries before an entry numbered `seq` reads: no entry created
/// before it is numbered `seq + WINDOW` or more.
fn window_start(queue: &str, seq: u64) -> String {
    from_seq(queue, seq.saturating_add(WINDOW - 1))
}

/// Of the keys a read returned in key order (sequence numbers descending), given as (sequence
/// number, create revision), the indices of the `k` newest by create revision among those
/// created before revision `before` (among all, with `None`), newest first. `None` while a key
/// the read did not reach (`complete` false: there are more) may still be one of them.
///
/// Why the keys read can decide it: a key not read is numbered at most `last`, the last read.
/// Were its entry `z` newer than an entry `y` read numbered `last + WINDOW` or more, `y` existed
/// when `z` was created (both are present, `y` created first), and `z`'s enqueue would not have
/// applied. So once `k` entries created before `before` and numbered that high are read, every
/// key not read is older than each of them. (Across reads made one after another this still
/// holds: an entry created after the first read is newer than `before`, whose entry exists.)
fn newest_before(
    read: &[(u64, i64)],
    before: Option<i64>,
    k: usize,
    complete: bool,
) -> Option<Vec<usize>> {
    let mut older: Vec<usize> = (0..read.len())
        .filter(|&i| before.is_none_or(|b| read[i].1 < b))
        .collect();
    if !complete {
        let bound = read.last()?.0.checked_add(WINDOW)?;
        if older.iter().filter(|&&i| read[i].0 >= bound).count() < k {
            return None;
        }
    }
    older.sort_by_key(|&i| std::cmp::Reverse(read[i].1));
    older.truncate(k);
    Some(older)
}

/// The (sequence number, create revision) of each key of `kvs`, all entries of `queue`; `None`
/// if one is not (a key under `<name>/_q/` that baton did not write, or a nested queue's),
/// whose place in creation order its key does not bound.
fn numbered(queue: &str, kvs: &[etcd_client::KeyValue]) -> Option<Vec<(u64, i64)>> {
    kvs.iter()
        .map(|kv| match parse(kv.key()) {
            Some((q, seq, _)) if q == queue => Some((seq, kv.create_revision())),
            _ => None,
        })
        .collect()
}

/// Whether the read `resp` stopped at its limit with keys left in its range.
fn more(resp: Option<&TxnOpResponse>) -> bool {
    matches!(resp, Some(TxnOpResponse::Get(get)) if get.more())
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

/// This process's numbering of one queue of the indexed layout.
#[derive(Debug)]
pub(super) struct Numbering {
    /// The next sequence number to propose.
    next: u64,
    /// The enqueues of the queue in flight ([`IN_FLIGHT`]).
    in_flight: std::sync::Arc<tokio::sync::Semaphore>,
}

impl Default for Numbering {
    fn default() -> Numbering {
        Numbering {
            next: 0,
            in_flight: std::sync::Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT)),
        }
    }
}

impl EtcdBackend {
    pub(super) fn indexed(&self) -> bool {
        self.inner.options.layout == EtcdLayout::Indexed
    }

    /// This process's numbering of `queue`, kept or started.
    fn numbering<T>(&self, queue: &str, f: impl FnOnce(&mut Numbering) -> T) -> T {
        let mut seqs = self.inner.seqs.lock().unwrap_or_else(|p| p.into_inner());
        if seqs.len() >= SEQS_KEPT && !seqs.contains_key(queue) {
            seqs.clear();
        }
        f(seqs.entry(queue.to_owned()).or_default())
    }

    /// The next sequence number this process proposes for `queue`.
    fn next_seq(&self, queue: &str) -> u64 {
        self.numbering(queue, |n| {
            let seq = n.next;
            n.next = n.next.saturating_add(1);
            seq
        })
    }

    /// Records that `queue` has an entry with sequence number `seq`.
    fn saw_seq(&self, queue: &str, seq: u64) {
        self.numbering(queue, |n| n.next = n.next.max(seq.saturating_add(1)));
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
        // Never closed: a failure to acquire can only mean going on without a slot.
        let in_flight = self.numbering(queue, |n| std::sync::Arc::clone(&n.in_flight));
        let _slot = in_flight.acquire_owned().await.ok();
        loop {
            let epoch = self.epoch().await?;
            let seq = self.next_seq(queue);
            let key = entry_key(queue, seq, tag);
            let (newer, newer_end) = at_or_after(queue, seq.saturating_add(WINDOW));
            let txn = |fence_seen: i64| {
                let mut when = vec![
                    Compare::create_revision(tags.as_str(), CompareOp::Equal, 0),
                    Compare::create_revision(newer.as_str(), CompareOp::Equal, 0)
                        .with_range(newer_end.as_str()),
                    Compare::mod_revision(fence.as_str(), CompareOp::Equal, fence_seen),
                    Self::in_epoch(&epoch),
                ];
                // The predecessor, read before the puts: in a queue of baton's indexed
                // entries only, the newest entries in key order, enough of them to decide
                // which is the newest by create revision ([`newest_before`]); otherwise the
                // newest key under the name by create revision, as the Go layout reads it.
                let predecessor = if mixed {
                    TxnOp::get(format!("{queue}/"), Some(newest_first(1)))
                } else {
                    when.extend(others(queue).map(|(start, end)| {
                        Compare::create_revision(start, CompareOp::Equal, 0).with_range(end)
                    }));
                    TxnOp::get(
                        window_start(queue, seq),
                        Some(key_ascending(ENQUEUE_LOOK, dir_end(queue))),
                    )
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
                let read = kvs(ops.first());
                if mixed {
                    let predecessor = read.first().map(|kv| self.to_entry(kv));
                    return self.created(&resp, key, value, lease, predecessor);
                }
                let numbers = numbered(queue, read);
                if let Some(&(newest, _)) = numbers.as_ref().and_then(|n| n.first()) {
                    self.saw_seq(queue, newest);
                }
                let complete = !more(ops.first());
                let decided = numbers.and_then(|n| newest_before(&n, None, 1, complete));
                return match decided {
                    Some(newest) => {
                        let predecessor = newest.first().map(|&i| self.to_entry(&read[i]));
                        self.created(&resp, key, value, lease, predecessor)
                    }
                    // Entries numbered alike (other processes') filled the read, or a key the
                    // layout does not bound was in it: read on.
                    None => {
                        let entry = self.created(&resp, key, value, lease, None)?.into_parts().0;
                        let predecessor = self.predecessor_indexed(&entry).await?;
                        Ok(Enqueued::new(entry, predecessor.is_none(), predecessor))
                    }
                };
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
            if let Some(first) = kvs(ops.get(1)).first() {
                match parse(first.key()) {
                    Some((q, newest, _)) if q == queue => self.saw_seq(queue, newest),
                    // Not an entry of this queue, and below the entries' keys: it fails the
                    // compare of every enqueue, whatever its number. Say so at once.
                    _ if first.key() < window_start(queue, seq).as_bytes() => {
                        return Err(Error::ForeignLayout {
                            queue: queue.to_owned(),
                            node: String::from_utf8_lossy(first.key()).into_owned(),
                            layout: "another lock's (a name inside the indexed queue's `_q/`)",
                        });
                    }
                    _ => {}
                }
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
    /// newest first, and the plain key `key` if asked: keys from `WINDOW` numbers above mine
    /// on, in key order, in one transaction that runs only while `mine` exists, and in more
    /// such reads if those keys do not decide it ([`newest_before`]). The plain key is read in
    /// each of them and its value taken from the last: the caller relies on it being read no
    /// earlier than the entries. A mixed queue, or a key under `<name>/_q/` that is not one of
    /// its entries, takes the Go layout's read.
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
        let page = i64::try_from(limit)
            .unwrap_or(i64::MAX)
            .saturating_add(LOOK);
        let mut start = window_start(queue, seq).into_bytes();
        let (mut read, mut numbers) = (Vec::new(), Vec::new());
        loop {
            let [other_low, other_high] = Self::others_reads(queue, false);
            let mut ops = vec![
                TxnOp::get(start.clone(), Some(key_ascending(page, dir_end(queue)))),
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
                return self.ahead_txn(op, queue, mine, limit, key).await;
            }
            if let Some(TxnOpResponse::Get(get)) = ops.first() {
                self.read_keys(get, false);
            }
            let page_kvs = kvs(ops.first());
            let Some(page_numbers) = numbered(queue, page_kvs) else {
                return self.ahead_txn(op, queue, mine, limit, key).await;
            };
            read.extend_from_slice(page_kvs);
            numbers.extend(page_numbers);
            let complete = !more(ops.first());
            if let Some(newest) = newest_before(&numbers, Some(revision(mine)), limit, complete) {
                let ahead = newest.iter().map(|&i| self.to_entry(&read[i])).collect();
                let value = kvs(ops.get(3)).first().map(|kv| kv.value().to_vec());
                return Ok((ahead, value));
            }
            // Read on from just after the last key read.
            let Some(last) = page_kvs.last() else {
                return Err(malformed(op));
            };
            start = last.key().to_vec();
            start.push(0);
            #[cfg(feature = "testing")]
            PAGE_HOOK.call(queue);
        }
    }

    /// [`Backend::was_head`](crate::Backend::was_head) for the indexed entry `mine`: one
    /// serializable transaction that reads keys from `WINDOW` numbers above mine to the end of
    /// the queue (no more than one look's worth: a longer read answers "not known to be the
    /// head", and the caller reads on), nothing else under the name, and this client's epoch
    /// marker. The head is the entry that sees no entry created before it.
    pub(super) async fn was_head_indexed(&self, mine: &Entry) -> Result<bool> {
        let Some((queue, seq, _)) = parse(mine.key_bytes()) else {
            return Ok(false);
        };
        let Some(epoch) = self.inner.epochs.current() else {
            return Ok(false);
        };
        let [other_low, other_high] = Self::others_reads(queue, true);
        let txn = Txn::new().and_then([
            TxnOp::get(
                window_start(queue, seq),
                Some(
                    key_ascending(LOOK, dir_end(queue))
                        .with_keys_only()
                        .with_serializable(),
                ),
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
        if kvs(ops.get(3)).first().map(etcd_client::KeyValue::value)
            != Some(epoch.encode().as_bytes())
        {
            return Ok(false);
        }
        let read = kvs(ops.first());
        let rev = revision(mine);
        Ok(!more(ops.first())
            && read
                .iter()
                .any(|kv| kv.key() == mine.key_bytes() && kv.create_revision() == rev)
            && read.iter().all(|kv| kv.create_revision() >= rev)
            && kvs(ops.get(1)).is_empty()
            && kvs(ops.get(2)).is_empty())
    }

    /// The tag key deleted with the indexed entry `entry`, if it is one.
    pub(super) fn tag_key_of(&self, entry: &Entry) -> Option<String> {
        let (queue, _, tag) = parse(entry.key_bytes())?;
        self.indexed().then(|| tag_key(queue, tag))
    }
}

/// What a look calls before it reads on ([`crate::testing::on_indexed_page`]).
#[cfg(feature = "testing")]
pub(crate) static PAGE_HOOK: crate::testing::hooks::KeyHook = crate::testing::hooks::KeyHook::new();

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
        // A look starts `WINDOW` numbers above the entry.
        assert_eq!(window_start("q", 5), from_seq("q", 5 + WINDOW - 1));
        assert_eq!(window_start("q", u64::MAX), from_seq("q", u64::MAX));
    }

    /// (sequence number, create revision) in key order, as a read returns them.
    fn keys(read: &[(u64, i64)]) -> Vec<(u64, i64)> {
        let mut read = read.to_vec();
        read.sort_by_key(|&(seq, _)| std::cmp::Reverse(seq));
        read
    }

    #[test]
    fn a_complete_read_is_sorted_by_creation() {
        // Entries created out of number order, within the window.
        let read = keys(&[(10, 100), (9, 105), (12, 101), (8, 103)]);
        assert_eq!(read, [(12, 101), (10, 100), (9, 105), (8, 103)]);
        assert_eq!(newest_before(&read, None, 1, true), Some(vec![2]));
        assert_eq!(newest_before(&read, None, 3, true), Some(vec![2, 3, 0]));
        assert_eq!(newest_before(&read, Some(103), 9, true), Some(vec![0, 1]));
        assert_eq!(newest_before(&read, Some(100), 1, true), Some(vec![]));
        assert_eq!(newest_before(&[], None, 1, true), Some(vec![]));
    }

    #[test]
    fn an_incomplete_read_decides_only_past_the_window() {
        let w = WINDOW;
        // Numbers 2w down to 0, one entry each, created in number order.
        let read: Vec<(u64, i64)> = (0..=2 * w).rev().map(|n| (n, n as i64 + 1)).collect();
        let upto = |last: usize| &read[..=last];
        // Keys not read (numbered at most the last read) may be newer than any entry read
        // fewer than `WINDOW` numbers above them.
        assert_eq!(newest_before(upto(w as usize - 1), None, 1, false), None);
        // One entry `WINDOW` numbers above the last read: it is newer than every key not read.
        assert_eq!(
            newest_before(upto(w as usize), None, 1, false),
            Some(vec![0])
        );
        assert_eq!(newest_before(upto(w as usize), None, 2, false), None);
        assert_eq!(
            newest_before(upto(w as usize + 1), None, 2, false),
            Some(vec![0, 1])
        );
        // Entries created after `before` do not count.
        let before = Some(2 * w as i64 + 1);
        assert_eq!(newest_before(upto(w as usize), before, 1, false), None);
        assert_eq!(
            newest_before(upto(w as usize + 1), before, 1, false),
            Some(vec![1])
        );
        // Nothing read, or numbers too high to add the window to: not decided.
        assert_eq!(newest_before(&[], None, 1, false), None);
        assert_eq!(newest_before(&[(u64::MAX, 1)], None, 1, false), None);
    }
}
