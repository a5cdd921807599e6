//! The restart grace after a new WAL timeline ([`PgOptions::with_restart_grace`]).
//!
//! A standby promoted by a failover (or a server recovered to a point in time) runs on a new
//! timeline and may lack the old primary's last commits: a grant, so that the lock looks free,
//! or a renewal, so that a lease looks older than it is. Every statement that decides a grant
//! (the enqueue, the read of the entries ahead) also answers the current timeline and how long
//! baton has known it (`timeline_age`, schema version 4). While that is less than the grace,
//! this backend answers as if stand-in entries were ahead of every entry, and a wait for a
//! stand-in ends when the grace does: the recipes wait as for any holder, and grant nothing.
//!
//! [`PgOptions::with_restart_grace`]: super::PgOptions::with_restart_grace

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Entry, FencingToken, Position};

/// The key prefix of a stand-in. PostgreSQL's `text` cannot hold a NUL, so no real entry's key
/// starts with it.
const STAND_IN: &str = "\u{0}baton:restart-grace/";

/// What this backend knows of the grace of the timelines it has seen.
#[derive(Debug)]
pub(super) struct Grace {
    grace: Duration,
    endpoint: String,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The highest timeline an answer showed out of its grace.
    clear: i32,
    /// When the grace of the newest timeline seen within it ends (this process's clock).
    end: Option<Instant>,
    /// The last timeline whose grace was logged.
    told: i32,
}

impl Grace {
    pub(super) fn new(grace: Duration, endpoint: String) -> Grace {
        Grace {
            grace,
            endpoint,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes in a grant decision's answer: the server runs on `timeline`, known to baton for
    /// `age_ms` (`None`: since before anything could have been lost). Returns how much longer
    /// nothing is granted, or `None` if the grace has passed.
    pub(super) fn seen(&self, timeline: i32, age_ms: Option<i64>) -> Option<Duration> {
        let age = age_ms.map(|ms| Duration::from_millis(ms.max(0).unsigned_abs()));
        let left = age.and_then(|age| self.grace.checked_sub(age).filter(|l| !l.is_zero()));
        let mut state = self.state();
        let Some(left) = left else {
            state.clear = state.clear.max(timeline);
            return None;
        };
        let end = Instant::now() + left;
        state.end = Some(state.end.map_or(end, |e| e.max(end)));
        if state.told != timeline {
            state.told = timeline;
            tracing::warn!(
                timeline,
                wait_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
                grace_ms = u64::try_from(self.grace.as_millis()).unwrap_or(u64::MAX),
                endpoint = %self.endpoint,
                "PostgreSQL runs on a new WAL timeline (a promoted standby or a recovery to a point in time), which may lack the last grants and renewals of before: nothing is granted for {:.1} s more, until the restart grace has passed, since a holder from before may still believe it holds; the grace is PgOptions::with_restart_grace (CLI: --restart-grace) and must be at least the longest session TTL",
                left.as_secs_f64()
            );
        }
        Some(left)
    }

    /// Whether an answer showed `timeline` out of its grace (a notification sent on it may be
    /// taken at its word).
    pub(super) fn is_clear(&self, timeline: i32) -> bool {
        timeline <= self.state().clear
    }

    /// How much longer nothing is granted, as far as this process knows.
    pub(super) fn left(&self) -> Option<Duration> {
        let end = self.state().end?;
        let left = end.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    /// `ahead` padded to `limit` with stand-ins while the grace lasts (`left` is what
    /// [`seen`](Self::seen) answered): a caller that gets as many as it asked for takes it
    /// that more may be ahead, up to the most any caller counts (a semaphore's limit).
    pub(super) fn pad(
        &self,
        mut ahead: Vec<Entry>,
        limit: usize,
        left: Option<Duration>,
    ) -> Vec<Entry> {
        if left.is_some() && ahead.len() < limit {
            let missing = (limit - ahead.len()).min(crate::Semaphore::MAX_PERMITS as usize);
            ahead.extend((0..missing).map(|i| {
                Entry::new(
                    format!("{STAND_IN}{i}"),
                    Vec::new(),
                    Position::new(1),
                    FencingToken::new(1),
                    None,
                )
            }));
        }
        ahead
    }

    /// Whether `entry` is a stand-in of [`pad`](Self::pad).
    pub(super) fn is_stand_in(entry: &Entry) -> bool {
        entry.lease().is_none() && entry.key().starts_with(STAND_IN)
    }

    /// Resolves when the grace this process knows of has passed (the caller then asks the
    /// server again, which may say it lasts longer).
    pub(super) async fn wait(&self) {
        let end = self.state().end;
        if let Some(end) = end {
            tokio::time::sleep_until(end).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_young_timeline_pads_until_its_grace_has_passed() {
        let grace = Grace::new(Duration::from_secs(10), "test".into());
        // Timeline 1 from the start, known for ever: clear.
        assert_eq!(grace.seen(1, None), None);
        assert!(grace.is_clear(1) && !grace.is_clear(2));
        assert_eq!(grace.pad(Vec::new(), 1, None).len(), 0);
        // Timeline 2, seen 4 s ago: 6 s left, stand-ins ahead of everyone.
        let left = grace.seen(2, Some(4_000));
        assert_eq!(left, Some(Duration::from_secs(6)));
        assert!(!grace.is_clear(2));
        let ahead = grace.pad(Vec::new(), 3, left);
        assert_eq!(ahead.len(), 3);
        assert!(ahead.iter().all(Grace::is_stand_in));
        assert_eq!(grace.left(), Some(Duration::from_secs(6)));
        grace.wait().await;
        assert_eq!(grace.left(), None);
        // Asked again once it passed: clear.
        assert_eq!(grace.seen(2, Some(10_000)), None);
        assert!(grace.is_clear(2));
    }

    #[test]
    fn a_zero_grace_never_waits() {
        let grace = Grace::new(Duration::ZERO, "test".into());
        assert_eq!(grace.seen(3, Some(0)), None);
        assert!(grace.is_clear(3));
    }
}
