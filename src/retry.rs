//! The retry policy, written once for the queue engine and every backend: the pause between
//! attempts ([`Backoff`]: 25 ms, doubling, up to a second), and the rule that ends the retries
//! of one request at its deadline ([`Retry`]), with the error that says whether an attempt
//! may have been applied.
//!
//! What stays with each backend is what differs: which failures are transient, when an
//! attempt may have been applied, and its own knobs (the request timeout, how long to retry).

use std::time::Duration;

use tokio::time::Instant;

use crate::error::{BoxError, Error, Result};

/// The pauses between attempts: 25 ms, doubling after each, up to a cap (a second unless
/// [`capped`](Self::capped)). A loop that succeeds starts over ([`reset`](Self::reset)).
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    /// The longest pause.
    max: Duration,
    /// Pauses handed out since the last reset.
    given: u32,
}

impl Backoff {
    /// The first pause.
    pub(crate) const FIRST: Duration = Duration::from_millis(25);
    /// The longest pause, unless capped lower.
    pub(crate) const MAX: Duration = Duration::from_secs(1);

    /// 25 ms, doubling, up to a second.
    pub(crate) const fn new() -> Self {
        Backoff::capped(Self::MAX)
    }

    /// 25 ms, doubling, up to `max` (a short overall limit, such as a connect timeout, wants
    /// attempts closer together).
    pub(crate) const fn capped(max: Duration) -> Self {
        Backoff { max, given: 0 }
    }

    /// The pause after `failures` failures in a row on the default schedule: 25 ms for the
    /// first, doubling, up to a second.
    pub(crate) fn after(failures: u32) -> Duration {
        Self::nth(failures, Self::MAX)
    }

    fn nth(failures: u32, max: Duration) -> Duration {
        // From the seventh the pause is 1.6 s or more before the cap: the exponent stops
        // there, so the multiplication cannot overflow whatever the count.
        Self::FIRST
            .saturating_mul(1 << failures.saturating_sub(1).min(6))
            .min(max)
    }

    /// The pause the next [`next_delay`](Self::next_delay) hands out.
    pub(crate) fn peek(&self) -> Duration {
        Self::nth(self.given.saturating_add(1), self.max)
    }

    /// The pause to take now; the next one is twice as long, up to the cap.
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.given = self.given.saturating_add(1);
        Self::nth(self.given, self.max)
    }

    /// Starts over from the first pause (after a success).
    #[cfg_attr(
        not(any(
            feature = "etcd",
            feature = "redis",
            feature = "zookeeper",
            feature = "postgres"
        )),
        allow(dead_code)
    )]
    pub(crate) fn reset(&mut self) {
        self.given = 0;
    }

    /// Sleeps the next pause.
    pub(crate) async fn wait(&mut self) {
        // Boxed: a timer is large, and only failing paths need one.
        Box::pin(tokio::time::sleep(self.next_delay())).await;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

/// The retries of one request (`op`) until a deadline: a pause that would end at or after
/// the deadline is not taken, and the request fails then, with the last attempt's error.
/// The error is [`Error::OutcomeUnknown`] once an attempt may have been applied (the caller
/// says so with [`may_have_applied`](Self::may_have_applied)), [`Error::Backend`] otherwise:
/// a retry never turns an unknown outcome into a definite failure.
#[derive(Debug)]
#[cfg_attr(
    not(any(
        feature = "etcd",
        feature = "redis",
        feature = "zookeeper",
        feature = "postgres"
    )),
    allow(dead_code)
)]
pub(crate) struct Retry {
    op: &'static str,
    give_up: Instant,
    backoff: Backoff,
    maybe_applied: bool,
}

#[cfg_attr(
    not(any(
        feature = "etcd",
        feature = "redis",
        feature = "zookeeper",
        feature = "postgres"
    )),
    allow(dead_code)
)]
impl Retry {
    /// Retries of `op` for `retry_for` from now (a duration too long to count is forever).
    pub(crate) fn new(op: &'static str, retry_for: Duration) -> Retry {
        let now = Instant::now();
        let give_up = now
            .checked_add(retry_for)
            .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365));
        Retry::until(op, give_up)
    }

    /// Retries of `op` until `give_up`.
    pub(crate) fn until(op: &'static str, give_up: Instant) -> Retry {
        Retry {
            op,
            give_up,
            backoff: Backoff::new(),
            maybe_applied: false,
        }
    }

    /// The same retries with pauses of at most `max`.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn capped(mut self, max: Duration) -> Retry {
        self.backoff = Backoff::capped(max);
        self
    }

    /// The deadline.
    #[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
    pub(crate) fn give_up(&self) -> Instant {
        self.give_up
    }

    /// An attempt may have been applied (its answer was lost): the request's failure, if it
    /// fails, is an unknown outcome.
    pub(crate) fn may_have_applied(&mut self) {
        self.maybe_applied = true;
    }

    /// Whether an attempt may have been applied.
    pub(crate) fn maybe_applied(&self) -> bool {
        self.maybe_applied
    }

    /// Whether the next pause ends before the deadline.
    pub(crate) fn pause_fits(&self) -> bool {
        Instant::now() + self.backoff.peek() < self.give_up
    }

    /// The next pause, if it ends before the deadline (`None`: give up now).
    pub(crate) fn next_pause(&mut self) -> Option<Duration> {
        self.pause_fits().then(|| self.backoff.next_delay())
    }

    /// The error that ends the request with `source` (the last attempt's error):
    /// [`Error::OutcomeUnknown`] if an attempt may have been applied, else [`Error::Backend`].
    pub(crate) fn failed(&self, source: BoxError) -> Error {
        if self.maybe_applied {
            Error::OutcomeUnknown {
                op: self.op,
                source,
                at: Default::default(),
            }
        } else {
            Error::Backend {
                op: self.op,
                source,
                at: Default::default(),
            }
        }
    }

    /// After an attempt failed with the transient `error`: sleeps the next pause and returns,
    /// or, if that pause would end at or after the deadline, returns the error that ends the
    /// request ([`failed`](Self::failed)). `server` names the server in the log line.
    pub(crate) async fn pause(&mut self, error: BoxError, server: &str) -> Result<()> {
        let Some(pause) = self.next_pause() else {
            return Err(self.failed(error));
        };
        tracing::debug!(op = self.op, error = %error, backoff = ?pause, server, "request failed; retrying");
        Box::pin(tokio::time::sleep(pause)).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_from_25_ms_up_to_the_cap() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new();
        let pauses: Vec<Duration> = (0..9).map(|_| b.next_delay()).collect();
        assert_eq!(
            pauses,
            [25, 50, 100, 200, 400, 800, 1000, 1000, 1000].map(ms)
        );
        let mut short = Backoff::capped(ms(250));
        let pauses: Vec<Duration> = (0..6).map(|_| short.next_delay()).collect();
        assert_eq!(pauses, [25, 50, 100, 200, 250, 250].map(ms));
        // `after` counts failures on the default schedule; `peek` does not take the pause.
        assert_eq!(Backoff::after(1), ms(25));
        assert_eq!(Backoff::after(3), ms(100));
        assert_eq!(Backoff::after(u32::MAX), ms(1000));
        assert_eq!(Backoff::after(0), ms(25));
        let mut b = Backoff::new();
        assert_eq!(b.peek(), ms(25));
        assert_eq!(b.peek(), ms(25));
        b.next_delay();
        assert_eq!(b.peek(), ms(50));
    }

    #[test]
    fn a_success_starts_the_pauses_over() {
        let mut b = Backoff::new();
        for _ in 0..10 {
            b.next_delay();
        }
        b.reset();
        assert_eq!(b.next_delay(), Backoff::FIRST);
    }

    #[tokio::test(start_paused = true)]
    async fn no_pause_ends_past_the_deadline() {
        let started = Instant::now();
        let mut retry = Retry::new("probe", Duration::from_millis(200));
        let mut pauses = Vec::new();
        while let Some(pause) = retry.next_pause() {
            pauses.push(pause.as_millis());
            tokio::time::advance(pause).await;
        }
        // 25 + 50 + 100 = 175 ms; the next pause (200 ms) would end past 200 ms.
        assert_eq!(pauses, [25, 50, 100]);
        assert_eq!(started.elapsed(), Duration::from_millis(175));
        assert!(!retry.pause_fits());
        // A pause that would end exactly at the deadline is not taken either.
        let mut exact = Retry::new("probe", Duration::from_millis(25));
        assert_eq!(exact.next_pause(), None);
        // Nothing to retry for: one attempt, no pause.
        assert_eq!(Retry::new("probe", Duration::ZERO).next_pause(), None);
        // Forever does not overflow.
        assert!(Retry::new("probe", Duration::MAX).pause_fits());
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_error_says_whether_an_attempt_may_have_applied() {
        let mut retry = Retry::new("enqueue", Duration::from_millis(30));
        // The first pause (25 ms) fits; the second (50 ms) does not.
        assert!(retry.pause("first".into(), "test").await.is_ok());
        let failed = retry.pause("second".into(), "test").await;
        match failed {
            Err(Error::Backend { op, source, .. }) => {
                assert_eq!(op, "enqueue");
                assert_eq!(source.to_string(), "second");
            }
            other => panic!("{other:?}"),
        }
        retry.may_have_applied();
        assert!(retry.maybe_applied());
        match retry.failed("lost answer".into()) {
            Error::OutcomeUnknown { op, source, .. } => {
                assert_eq!(op, "enqueue");
                assert_eq!(source.to_string(), "lost answer");
            }
            other => panic!("{other:?}"),
        }
    }
}
