//! The simulated network between a client and the in-memory store: a [`Backend`] decorator
//! that, by a seeded plan, delays requests and answers, loses answers of requests it applied,
//! refuses requests before they are sent, sends a request twice, delivers an `enqueue` after
//! its caller gave up on it, cuts a client off for a while, and freezes it (holds its
//! requests and answers, watches' included, until the freeze ends).

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use async_trait::async_trait;
use baton::{
    Backend, Enqueued, Entry, Error, HeadEvent, Lease, LeaseId, MemoryBackend, Result, StoreEpochs,
    WriteOp,
};
use futures::stream::BoxStream;
use tokio::time::Instant;

use super::Rng;

/// How often each fault is drawn, per request (out of 1,000).
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    pub delay: u32,
    pub fail_before: u32,
    pub lose_answer: u32,
    pub duplicate: u32,
    pub late: u32,
}

impl Faults {
    pub const NONE: Faults = Faults {
        delay: 0,
        fail_before: 0,
        lose_answer: 0,
        duplicate: 0,
        late: 0,
    };
}

/// One client's network: its own client of the store, its faults, and whether it is cut off.
#[derive(Debug, Clone)]
pub struct SimNet {
    inner: MemoryBackend,
    state: Arc<StdMutex<NetState>>,
}

#[derive(Debug)]
struct NetState {
    rng: Rng,
    /// The client's process faults (when it freezes, for how long): a generator of their own,
    /// so that the network's faults are those the seed drew before freezes existed.
    process: Rng,
    faults: Faults,
    /// Until when every request fails (a partition, a pause: the client cannot be reached).
    cut_until: Option<Instant>,
    /// Until when the client is frozen (`SIGSTOP`, a GC pause): nothing it sends leaves, and
    /// nothing sent to it (an answer, a watch's event) is taken in, until then.
    frozen_until: Option<Instant>,
    /// Enqueues held back to be delivered late, by (queue, tag, lease): a give-up
    /// (`abandon`) cancels them, as the network backends' session fences do.
    late: Vec<(String, String, i64, tokio::task::AbortHandle)>,
    /// Faults applied, by kind, for the run's report (the first `NET_FAULTS` of
    /// [`FAULT_NAMES`]).
    counts: [u64; NET_FAULTS],
}

/// What the plan decided for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Normal,
    Delay(Duration),
    FailBefore,
    LoseAnswer,
    Duplicate,
    Late(Duration),
}

/// The names of the fault counters, for the report: a client's network's faults (the first
/// [`NET_FAULTS`]), then the process's: the keep-alive driver starved (on its own, or with a
/// client frozen), and the wall clock stepped.
pub const FAULT_NAMES: [&str; 9] = [
    "delay",
    "fail-before",
    "lost-answer",
    "duplicate",
    "late-delivery",
    "cut-off",
    "frozen",
    "starved-driver",
    "clock-step",
];

/// How many of [`FAULT_NAMES`] a client's network counts.
pub const NET_FAULTS: usize = 7;

impl SimNet {
    pub fn new(inner: MemoryBackend, rng: Rng, process: Rng, faults: Faults) -> SimNet {
        SimNet {
            inner,
            state: Arc::new(StdMutex::new(NetState {
                rng,
                process,
                faults,
                cut_until: None,
                frozen_until: None,
                late: Vec::new(),
                counts: [0; NET_FAULTS],
            })),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, NetState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cuts this client off for `d` (every request fails, renewals included).
    pub fn cut_off(&self, d: Duration) {
        let mut state = self.state();
        state.cut_until = Some(Instant::now() + d);
        state.counts[5] += 1;
    }

    /// Freezes this client for `d`: what it sends is held until then, and so is what it is
    /// sent (answers, watch and wait results). Freezes that overlap end with the last.
    pub fn freeze(&self, d: Duration) {
        let mut state = self.state();
        let until = Instant::now() + d;
        state.frozen_until = state.frozen_until.max(Some(until));
        state.counts[6] += 1;
    }

    /// `true` with probability `per_mille / 1000`, from the client's process-fault generator.
    pub fn draw(&self, per_mille: u64) -> bool {
        self.state().process.chance(per_mille)
    }

    /// A number in `0..n`, from the client's process-fault generator.
    pub fn draw_below(&self, n: u64) -> u64 {
        self.state().process.below(n)
    }

    /// When the client's freeze ends, if it is frozen now.
    pub fn frozen_until(&self) -> Option<Instant> {
        self.state()
            .frozen_until
            .filter(|until| Instant::now() < *until)
    }

    /// Waits until the client is not frozen: at once (without yielding) if it is not.
    pub async fn thawed(&self) {
        while let Some(until) = self.frozen_until() {
            tokio::time::sleep_until(until).await;
        }
    }

    /// No more faults from now on (the network heals; a freeze in progress ends as drawn).
    pub fn heal(&self) {
        let mut state = self.state();
        state.faults = Faults::NONE;
        state.cut_until = None;
    }

    pub fn counts(&self) -> [u64; NET_FAULTS] {
        self.state().counts
    }

    /// The fate of the next request (`writes`: it changes state; `late`: it may be delivered
    /// after its caller gave up, which only an enqueue's give-up fences off).
    fn fate_of(&self, writes: bool, late: bool) -> Result<Fate> {
        let mut state = self.state();
        if state.cut_until.is_some_and(|until| Instant::now() < until) {
            return Err(Error::Unavailable);
        }
        let f = state.faults;
        let roll = state.rng.below(1000) as u32;
        let fate = if roll < f.delay {
            let ms = state.rng.below(400) + 1;
            Fate::Delay(Duration::from_millis(ms))
        } else if roll < f.delay + f.fail_before {
            Fate::FailBefore
        } else if roll < f.delay + f.fail_before + f.lose_answer {
            Fate::LoseAnswer
        } else if writes && roll < f.delay + f.fail_before + f.lose_answer + f.duplicate {
            Fate::Duplicate
        } else if late && roll < f.delay + f.fail_before + f.lose_answer + f.duplicate + f.late {
            let ms = state.rng.below(3_000) + 100;
            Fate::Late(Duration::from_millis(ms))
        } else {
            Fate::Normal
        };
        let index = match fate {
            Fate::Normal => None,
            Fate::Delay(_) => Some(0),
            Fate::FailBefore => Some(1),
            Fate::LoseAnswer => Some(2),
            Fate::Duplicate => Some(3),
            Fate::Late(_) => Some(4),
        };
        if let Some(i) = index {
            state.counts[i] += 1;
        }
        Ok(fate)
    }

    /// Runs `call` under a fate: the answer of a write whose answer is lost is an unknown
    /// outcome, a read's a plain failure.
    async fn through<T, F, Fut>(&self, op: &'static str, writes: bool, call: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        self.thawed().await;
        let answer = match self.fate_of(writes, false)? {
            Fate::Normal | Fate::Late(_) => call().await,
            Fate::Delay(d) => {
                tokio::time::sleep(d / 2).await;
                // Sent before a freeze began, delivered to the store: it is on the way.
                let answer = call().await;
                tokio::time::sleep(d / 2).await;
                answer
            }
            Fate::FailBefore => Err(Error::Unavailable),
            Fate::LoseAnswer => {
                let _ = call().await;
                Err(lost(op, writes))
            }
            Fate::Duplicate => {
                let first = call().await;
                let _ = call().await;
                first
            }
        };
        // An answer that arrives while the client is frozen is taken in when it thaws.
        self.thawed().await;
        answer
    }
}

fn lost(op: &'static str, writes: bool) -> Error {
    if writes {
        Error::OutcomeUnknown {
            op,
            source: "the simulated network lost the answer".into(),
            at: Default::default(),
        }
    } else {
        Error::Unavailable
    }
}

#[async_trait]
impl Backend for SimNet {
    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        self.through("grant_lease", true, || self.inner.grant_lease(ttl))
            .await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>> {
        // Idempotent: a lost answer is a failure, retried.
        self.through("keep_alive", false, || self.inner.keep_alive(lease))
            .await
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.through("revoke_lease", false, || self.inner.revoke_lease(lease))
            .await
    }

    async fn enqueue(
        &self,
        queue: &str,
        tag: &str,
        lease: LeaseId,
        value: &[u8],
    ) -> Result<Enqueued> {
        self.thawed().await;
        let answer = match self.fate_of(true, true)? {
            Fate::Late(d) => {
                // Sent, held up on the way, and delivered after the caller gave up (unless the
                // caller's give-up, `abandon`, fences it off first).
                let (inner, q, t, v) = (
                    self.inner.clone(),
                    queue.to_owned(),
                    tag.to_owned(),
                    value.to_vec(),
                );
                let task = tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    let _ = inner.enqueue(&q, &t, lease, &v).await;
                });
                self.state().late.push((
                    queue.to_owned(),
                    tag.to_owned(),
                    lease.get(),
                    task.abort_handle(),
                ));
                Err(lost("enqueue", true))
            }
            Fate::FailBefore => Err(Error::Unavailable),
            Fate::LoseAnswer => {
                let _ = self.inner.enqueue(queue, tag, lease, value).await;
                Err(lost("enqueue", true))
            }
            Fate::Delay(d) => {
                tokio::time::sleep(d / 2).await;
                let answer = self.inner.enqueue(queue, tag, lease, value).await;
                tokio::time::sleep(d / 2).await;
                answer
            }
            Fate::Duplicate => {
                let first = self.inner.enqueue(queue, tag, lease, value).await;
                let _ = self.inner.enqueue(queue, tag, lease, value).await;
                first
            }
            Fate::Normal => self.inner.enqueue(queue, tag, lease, value).await,
        };
        self.thawed().await;
        answer
    }

    async fn find_entry(&self, queue: &str, tag: &str) -> Result<Option<Entry>> {
        self.through("find_entry", false, || self.inner.find_entry(queue, tag))
            .await
    }

    async fn abandon(&self, queue: &str, tag: &str, lease: LeaseId) -> Result<Option<Entry>> {
        // The network backends fence a given-up enqueue off before they look: so does this
        // network (a held enqueue of that tag and lease is dropped).
        self.state().late.retain(|(q, t, l, task)| {
            let ours = q == queue && t == tag && *l == lease.get();
            if ours {
                task.abort();
            }
            !ours
        });
        self.through("abandon", false, || self.inner.find_entry(queue, tag))
            .await
    }

    async fn predecessor(&self, mine: &Entry) -> Result<Option<Entry>> {
        self.through("predecessor", false, || self.inner.predecessor(mine))
            .await
    }

    async fn ahead(&self, queue: &str, mine: &Entry, limit: usize) -> Result<Vec<Entry>> {
        self.through("ahead", false, || self.inner.ahead(queue, mine, limit))
            .await
    }

    async fn ahead_and_read(
        &self,
        queue: &str,
        mine: &Entry,
        limit: usize,
        key: &str,
    ) -> Result<(Vec<Entry>, Option<Vec<u8>>)> {
        self.through("ahead_and_read", false, || {
            self.inner.ahead_and_read(queue, mine, limit, key)
        })
        .await
    }

    async fn was_head(&self, mine: &Entry) -> Result<bool> {
        self.through("was_head", false, || self.inner.was_head(mine))
            .await
    }

    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        // A wait is a watch: its failure says nothing, and the caller waits again.
        self.thawed().await;
        if let Fate::FailBefore | Fate::LoseAnswer = self.fate_of(false, false)? {
            return Err(Error::Unavailable);
        }
        let gone = self.inner.wait_gone(entry).await;
        // A deletion seen while the client is frozen reaches it when it thaws.
        self.thawed().await;
        gone
    }

    async fn head(&self, queue: &str) -> Result<Option<Entry>> {
        self.through("head", false, || self.inner.head(queue)).await
    }

    async fn entries(&self, queue: &str) -> Result<Vec<Entry>> {
        self.through("entries", false, || self.inner.entries(queue))
            .await
    }

    async fn delete_entry(&self, entry: &Entry) -> Result<bool> {
        self.through("delete_entry", true, || self.inner.delete_entry(entry))
            .await
    }

    async fn update_entry(&self, entry: &Entry, value: &[u8]) -> Result<bool> {
        self.through("update_entry", true, || {
            self.inner.update_entry(entry, value)
        })
        .await
    }

    async fn guarded(&self, entry: &Entry, ops: &[WriteOp]) -> Result<bool> {
        self.through("guarded", !ops.is_empty(), || {
            self.inner.guarded(entry, ops)
        })
        .await
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.through("read", false, || self.inner.read(key)).await
    }

    async fn swap(&self, key: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<bool> {
        self.through("swap", true, || self.inner.swap(key, expected, new))
            .await
    }

    async fn wait_value(&self, key: &str, seen: Option<&[u8]>) -> Result<Option<Vec<u8>>> {
        self.thawed().await;
        if let Fate::FailBefore | Fate::LoseAnswer = self.fate_of(false, false)? {
            return Err(Error::Unavailable);
        }
        let value = self.inner.wait_value(key, seen).await;
        self.thawed().await;
        value
    }

    async fn lease_ttl(&self, lease: LeaseId) -> Result<Option<Duration>> {
        self.through("lease_ttl", false, || self.inner.lease_ttl(lease))
            .await
    }

    fn observe_head(&self, queue: &str) -> BoxStream<'static, Result<HeadEvent>> {
        self.inner.observe_head(queue)
    }

    fn epochs(&self) -> Option<&StoreEpochs> {
        self.inner.epochs()
    }
}
