//! [`FaultyBackend`]: a decorator that injects faults into the calls of any backend.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard as StdMutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::{Backend, Enqueued, Entry, Error, HeadEvent, Lease, LeaseId, Result, WriteOp};

/// A call of the [`Backend`] trait, as [`FaultyBackend`] names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Call {
    /// [`Backend::grant_lease`].
    GrantLease,
    /// [`Backend::keep_alive`].
    KeepAlive,
    /// [`Backend::revoke_lease`].
    RevokeLease,
    /// [`Backend::enqueue`].
    Enqueue,
    /// [`Backend::find_entry`].
    FindEntry,
    /// [`Backend::abandon`].
    Abandon,
    /// [`Backend::predecessor`].
    Predecessor,
    /// [`Backend::ahead`].
    Ahead,
    /// [`Backend::was_head`].
    WasHead,
    /// [`Backend::wait_gone`].
    WaitGone,
    /// [`Backend::head`].
    Head,
    /// [`Backend::entries`].
    Entries,
    /// [`Backend::delete_entry`].
    DeleteEntry,
    /// [`Backend::update_entry`].
    UpdateEntry,
    /// [`Backend::guarded`].
    Guarded,
    /// [`Backend::read`].
    Read,
    /// [`Backend::swap`].
    Swap,
    /// [`Backend::wait_value`].
    WaitValue,
    /// [`Backend::lease_ttl`].
    LeaseTtl,
}

impl Call {
    /// The operation, as the backends name it in their errors: the [`Backend`] method's name
    /// (`enqueue`, `grant_lease`).
    fn op(self) -> &'static str {
        match self {
            Call::GrantLease => "grant_lease",
            Call::KeepAlive => "keep_alive",
            Call::RevokeLease => "revoke_lease",
            Call::Enqueue => "enqueue",
            Call::FindEntry => "find_entry",
            Call::Abandon => "abandon",
            Call::Predecessor => "predecessor",
            Call::Ahead => "ahead",
            Call::WasHead => "was_head",
            Call::WaitGone => "wait_gone",
            Call::Head => "head",
            Call::Entries => "entries",
            Call::DeleteEntry => "delete_entry",
            Call::UpdateEntry => "update_entry",
            Call::Guarded => "guarded",
            Call::Read => "read",
            Call::Swap => "swap",
            Call::WaitValue => "wait_value",
            Call::LeaseTtl => "lease_ttl",
        }
    }

    /// Whether the call creates or changes state: a failure of such a call leaves its outcome
    /// unknown, which is what [`Fault::FailAfter`] simulates.
    pub fn changes_state(self) -> bool {
        matches!(
            self,
            Call::GrantLease
                | Call::KeepAlive
                | Call::RevokeLease
                | Call::Enqueue
                | Call::DeleteEntry
                | Call::UpdateEntry
                | Call::Guarded
                | Call::Swap
        )
    }
}

/// What happens to a faulted call. A call failed before it reached the backend gets
/// [`Error::Unavailable`] (not applied); one failed after, [`Error::OutcomeUnknown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Fails without reaching the backend: nothing is applied.
    FailBefore,
    /// Reaches the backend, which applies it, then fails with
    /// [`Error::OutcomeUnknown`]: the answer is lost.
    FailAfter,
    /// Waits until [`FaultyBackend::release`] before reaching the backend.
    HangBefore,
    /// Reaches the backend, then waits until [`FaultyBackend::release`] before answering.
    HangAfter,
    /// Waits this long (tokio time) before reaching the backend.
    DelayBefore(Duration),
    /// Reaches the backend, then waits this long (tokio time) before answering.
    DelayAfter(Duration),
}

impl Fault {
    /// Whether the fault holds its call until [`FaultyBackend::release`].
    pub fn hangs(self) -> bool {
        matches!(self, Fault::HangBefore | Fault::HangAfter)
    }
}

/// One call made through a [`FaultyBackend`], as its log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallRecord {
    /// Which call.
    pub call: Call,
    /// When it started (tokio time).
    pub at: Instant,
    /// The fault it was given, if any.
    pub fault: Option<Fault>,
}

/// When a rule applies: to one call (its index among the calls of that kind, from 1), or to
/// every call of that kind.
#[derive(Debug, Clone, Copy)]
enum When {
    Nth(u64),
    Every,
}

#[derive(Debug, Default)]
struct State {
    counts: HashMap<Call, u64>,
    rules: Vec<(Call, When, Fault)>,
    log: Vec<CallRecord>,
    /// Spin guard: at most this many calls within this window.
    guard: Option<(usize, Duration)>,
    recent: VecDeque<Instant>,
    spins: u64,
}

/// A [`Backend`] decorator that makes chosen calls fail, hang or be delayed.
///
/// Rules are scripted per test: [`inject`](FaultyBackend::inject) faults the `n`th next call
/// of a kind, [`inject_every`](FaultyBackend::inject_every) every call of a kind until
/// [`clear`](FaultyBackend::clear). Calls count per kind, across every user of the decorator;
/// give the decorator only to the session under test and let everyone else use
/// [`inner`](FaultyBackend::inner). Delays run on tokio time, so under
/// `#[tokio::test(start_paused = true)]` every scenario is deterministic.
///
/// The decorator also records every call ([`log`](FaultyBackend::log)) and can flag request
/// loops without backoff ([`set_spin_guard`](FaultyBackend::set_spin_guard)).
/// [`Backend::observe_head`] is passed through unchanged: its stream makes no trait calls
/// to fault.
#[derive(Debug)]
pub struct FaultyBackend {
    inner: Arc<dyn Backend>,
    state: StdMutex<State>,
    /// Bumped by `release`: hung calls wait for it to change.
    released: watch::Sender<u64>,
    hung: AtomicUsize,
    in_flight: AtomicUsize,
    /// Woken whenever a call starts or hangs.
    progress: Notify,
}

impl FaultyBackend {
    /// Wraps `inner`.
    pub fn new(inner: impl Backend) -> Arc<FaultyBackend> {
        Self::wrap(Arc::new(inner))
    }

    /// Wraps a backend already shared as a trait object.
    pub fn wrap(inner: Arc<dyn Backend>) -> Arc<FaultyBackend> {
        Arc::new(FaultyBackend {
            inner,
            state: StdMutex::default(),
            released: watch::Sender::new(0),
            hung: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            progress: Notify::new(),
        })
    }

    /// The wrapped backend, for everyone who should not meet the faults.
    pub fn inner(&self) -> &Arc<dyn Backend> {
        &self.inner
    }

    fn state(&self) -> StdMutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `nth` next call of kind `call` (1: the next one) gets `fault`.
    ///
    /// # Panics
    /// If `nth` is 0 (a test's mistake).
    pub fn inject(&self, call: Call, nth: u64, fault: Fault) {
        assert!(nth > 0, "calls are counted from 1");
        let mut state = self.state();
        let at = state.counts.get(&call).copied().unwrap_or(0) + nth;
        state.rules.push((call, When::Nth(at), fault));
    }

    /// Every call of kind `call` from now on gets `fault`, until [`clear`](Self::clear).
    pub fn inject_every(&self, call: Call, fault: Fault) {
        self.state().rules.push((call, When::Every, fault));
    }

    /// Removes every rule. Calls already hung stay hung until [`release`](Self::release).
    pub fn clear(&self) {
        self.state().rules.clear();
    }

    /// Lets every call hung so far go on.
    pub fn release(&self) {
        self.released.send_modify(|generation| *generation += 1);
    }

    /// Calls hung right now.
    pub fn hung_calls(&self) -> usize {
        self.hung.load(Ordering::SeqCst)
    }

    /// Calls started and not yet answered (hung, delayed or simply in progress).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// How many calls of kind `call` were made so far.
    pub fn count(&self, call: Call) -> u64 {
        self.state().counts.get(&call).copied().unwrap_or(0)
    }

    /// Every call made so far, in the order they started.
    pub fn log(&self) -> Vec<CallRecord> {
        self.state().log.clone()
    }

    /// Flags request loops without backoff: a call that would be the `max_calls + 1`th
    /// within `window` (tokio time) is counted in [`spins`](Self::spins) and first waits
    /// `window`, so that a loop that would spin forever (under paused time, without ever
    /// letting the clock move) slows down and the test can end and report it.
    pub fn set_spin_guard(&self, max_calls: usize, window: Duration) {
        self.state().guard = Some((max_calls, window));
    }

    /// Calls that broke the spin guard.
    pub fn spins(&self) -> u64 {
        self.state().spins
    }

    /// Resolves once some call is hung.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub async fn until_hung(&self) {
        self.until(|| self.hung_calls() > 0).await;
    }

    /// Resolves once `n` calls of kind `call` have been made in all.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub async fn until_count(&self, call: Call, n: u64) {
        self.until(|| self.count(call) >= n).await;
    }

    async fn until(&self, done: impl Fn() -> bool) {
        loop {
            let progress = self.progress.notified();
            tokio::pin!(progress);
            progress.as_mut().enable();
            if done() {
                return;
            }
            progress.await;
        }
    }

    /// Counts and logs a call; its fault, and how long the spin guard holds it first.
    fn begin(&self, call: Call) -> (Option<Fault>, Option<Duration>) {
        let now = Instant::now();
        let mut state = self.state();
        let count = state.counts.entry(call).or_insert(0);
        *count += 1;
        let index = *count;
        let fault = state
            .rules
            .iter()
            .find(|(c, when, _)| {
                *c == call
                    && match when {
                        When::Nth(n) => *n == index,
                        When::Every => true,
                    }
            })
            .map(|(_, _, fault)| *fault);
        state.log.push(CallRecord {
            call,
            at: now,
            fault,
        });
        let mut hold = None;
        if let Some((max, window)) = state.guard {
            state.recent.push_back(now);
            while state.recent.front().is_some_and(|t| now - *t >= window) {
                state.recent.pop_front();
            }
            if state.recent.len() > max {
                state.spins += 1;
                hold = Some(window);
            }
        }
        drop(state);
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.progress.notify_waiters();
        (fault, hold)
    }

    async fn hang(&self) {
        let mut released = self.released.subscribe();
        released.borrow_and_update();
        let _hung = Counted::new(&self.hung);
        self.progress.notify_waiters();
        // `Err` only if the decorator is gone, which cannot happen while `self` is borrowed.
        let _ = released.changed().await;
    }

    async fn run<T>(&self, call: Call, op: impl Future<Output = Result<T>>) -> Result<T> {
        let (fault, hold) = self.begin(call);
        let _in_flight = Uncount(&self.in_flight);
        if let Some(hold) = hold {
            tokio::time::sleep(hold).await;
        }
        match fault {
            None => op.await,
            Some(Fault::FailBefore) => Err(Error::Unavailable),
            Some(Fault::FailAfter) => {
                let _ = op.await;
                Err(Error::OutcomeUnknown {
                    op: call.op(),
                    source: "the answer was lost (FaultyBackend::FailAfter)".into(),
                    at: Default::default(),
                })
            }
            Some(Fault::HangBefore) => {
                self.hang().await;
                op.await
            }
            Some(Fault::HangAfter) => {
                let answer = op.await;
                self.hang().await;
                answer
            }
            Some(Fault::DelayBefore(d)) => {
                tokio::time::sleep(d).await;
                op.await
            }
            Some(Fault::DelayAfter(d)) => {
                let answer = op.await;
                tokio::time::sleep(d).await;
                answer
            }
        }
    }
}

/// Increments a counter for as long as it lives.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Counted(counter)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Decrements a counter that was incremented elsewhere, when dropped.
struct Uncount<'a>(&'a AtomicUsize);

impl Drop for Uncount<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl Backend for FaultyBackend {
    fn recipe_name<'n>(&self, name: &'n str) -> &'n str {
        self.inner.recipe_name(name)
    }

    fn queue_of_key<'k>(&self, key: &'k str) -> &'k str {
        self.inner.queue_of_key(key)
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        self.run(Call::GrantLease, self.inner.grant_lease(ttl))
            .await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>> {
        self.run(Call::KeepAlive, self.inner.keep_alive(lease))
            .await
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.run(Call::RevokeLease, self.inner.revoke_lease(lease))
            .await
    }

    async fn enqueue(
        &self,
        queue: &str,
        tag: &str,
        lease: LeaseId,
        value: &[u8],
    ) -> Result<Enqueued> {
        self.run(Call::Enqueue, self.inner.enqueue(queue, tag, lease, value))
            .await
    }

    async fn find_entry(&self, queue: &str, tag: &str) -> Result<Option<Entry>> {
        self.run(Call::FindEntry, self.inner.find_entry(queue, tag))
            .await
    }

    async fn abandon(&self, queue: &str, tag: &str, lease: LeaseId) -> Result<Option<Entry>> {
        self.run(Call::Abandon, self.inner.abandon(queue, tag, lease))
            .await
    }

    fn grants_nothing_for(&self) -> Option<std::time::Duration> {
        self.inner.grants_nothing_for()
    }

    fn epochs(&self) -> Option<&crate::StoreEpochs> {
        self.inner.epochs()
    }

    async fn predecessor(&self, mine: &Entry) -> Result<Option<Entry>> {
        self.run(Call::Predecessor, self.inner.predecessor(mine))
            .await
    }

    async fn ahead(&self, queue: &str, mine: &Entry, limit: usize) -> Result<Vec<Entry>> {
        self.run(Call::Ahead, self.inner.ahead(queue, mine, limit))
            .await
    }

    async fn was_head(&self, mine: &Entry) -> Result<bool> {
        self.run(Call::WasHead, self.inner.was_head(mine)).await
    }

    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        self.run(Call::WaitGone, self.inner.wait_gone(entry)).await
    }

    async fn head(&self, queue: &str) -> Result<Option<Entry>> {
        self.run(Call::Head, self.inner.head(queue)).await
    }

    async fn entries(&self, queue: &str) -> Result<Vec<Entry>> {
        self.run(Call::Entries, self.inner.entries(queue)).await
    }

    async fn delete_entry(&self, entry: &Entry) -> Result<bool> {
        self.run(Call::DeleteEntry, self.inner.delete_entry(entry))
            .await
    }

    async fn update_entry(&self, entry: &Entry, value: &[u8]) -> Result<bool> {
        self.run(Call::UpdateEntry, self.inner.update_entry(entry, value))
            .await
    }

    async fn guarded(&self, entry: &Entry, ops: &[WriteOp]) -> Result<bool> {
        self.run(Call::Guarded, self.inner.guarded(entry, ops))
            .await
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.run(Call::Read, self.inner.read(key)).await
    }

    async fn swap(&self, key: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<bool> {
        self.run(Call::Swap, self.inner.swap(key, expected, new))
            .await
    }

    async fn wait_value(&self, key: &str, seen: Option<&[u8]>) -> Result<Option<Vec<u8>>> {
        self.run(Call::WaitValue, self.inner.wait_value(key, seen))
            .await
    }

    async fn lease_ttl(&self, lease: LeaseId) -> Result<Option<Duration>> {
        self.run(Call::LeaseTtl, self.inner.lease_ttl(lease)).await
    }

    fn observe_head(&self, queue: &str) -> BoxStream<'static, Result<HeadEvent>> {
        self.inner.observe_head(queue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryBackend;

    #[tokio::test(start_paused = true)]
    async fn faults_apply_to_the_calls_they_name() {
        let faulty = FaultyBackend::new(MemoryBackend::new());
        let lease = faulty.grant_lease(Duration::from_secs(60)).await.unwrap();
        faulty.inject(Call::Enqueue, 2, Fault::FailAfter);
        faulty.inject(Call::Enqueue, 3, Fault::FailBefore);
        let first = faulty.enqueue("q", "a", lease.id(), b"").await;
        assert!(first.is_ok());
        // Applied, answer lost.
        let second = faulty.enqueue("q", "b", lease.id(), b"").await;
        // Named after the call it stands for (before: `injected`).
        assert!(
            matches!(&second, Err(Error::OutcomeUnknown { op: "enqueue", .. })),
            "{second:?}"
        );
        assert!(faulty.find_entry("q", "b").await.unwrap().is_some());
        // Not applied.
        let third = faulty.enqueue("q", "c", lease.id(), b"").await;
        assert!(matches!(third, Err(Error::Unavailable)));
        assert!(faulty.find_entry("q", "c").await.unwrap().is_none());
        assert_eq!(faulty.count(Call::Enqueue), 3);
        let faults: Vec<_> = faulty.log().iter().map(|r| r.fault).collect();
        assert_eq!(
            faults,
            [
                None,                    // grant_lease
                None,                    // enqueue a
                Some(Fault::FailAfter),  // enqueue b
                None,                    // find_entry b
                Some(Fault::FailBefore), // enqueue c
                None,                    // find_entry c
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn hung_calls_wait_for_release_and_apply_as_scripted() {
        let faulty = FaultyBackend::new(MemoryBackend::new());
        let lease = faulty.grant_lease(Duration::from_secs(60)).await.unwrap();
        faulty.inject(Call::Enqueue, 1, Fault::HangAfter);
        let call = tokio::spawn({
            let faulty = Arc::clone(&faulty);
            async move { faulty.enqueue("q", "a", lease.id(), b"").await }
        });
        faulty.until_hung().await;
        // Applied before the hang.
        assert!(faulty.inner().find_entry("q", "a").await.unwrap().is_some());
        assert_eq!(faulty.in_flight(), 1);
        faulty.release();
        assert!(call.await.unwrap().is_ok());
        assert_eq!((faulty.hung_calls(), faulty.in_flight()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn the_spin_guard_slows_and_counts_a_loop_without_backoff() {
        let faulty = FaultyBackend::new(MemoryBackend::new());
        faulty.set_spin_guard(10, Duration::from_secs(1));
        let started = Instant::now();
        for _ in 0..15 {
            faulty.head("q").await.unwrap();
        }
        assert!(faulty.spins() >= 1);
        assert!(Instant::now() - started >= Duration::from_secs(1));
        // A loop with backoff does not trip it.
        let spins = faulty.spins();
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            faulty.head("q").await.unwrap();
        }
        assert_eq!(faulty.spins(), spins);
    }
}
