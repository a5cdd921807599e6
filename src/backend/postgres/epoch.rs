//! Store epochs on PostgreSQL ([`StoreEpochs`](crate::StoreEpochs) holds the rules; this is
//! where PostgreSQL keeps them: schema version 8).
//!
//! - The epoch's marker is the row `store` of baton's schema, beside the schema's
//!   incarnation. Every request that decides a grant (the enqueue, the read of the entries
//!   ahead), the grant of a lease and every renewal answer it, in the same statement, with
//!   how long ago the epoch began (the server's clock times the grace).
//! - Identity and position: the server's system identifier (read when a connection opens)
//!   and the schema's incarnation; the timeline and the flush LSN of the same answers. A
//!   flush LSN below one seen on the same timeline or a lower one, or another identity,
//!   means the store went back (restored from an earlier base backup, a standby that missed
//!   commits promoted): the client that sees it begins a new epoch on the server, which
//!   every client then finds in its next answer.
//! - A new timeline (a promotion, a recovery to a point in time) begins an epoch on the
//!   server at its first call there (`epoch_state`); a schema without a marker (created
//!   anew, first use) begins one at its first client, unless an operator marks it new
//!   ([`PgBackend::init_store`]).
//! - Ids and tokens are the server's: its sequences jump to the clock at every postmaster
//!   start and at every new epoch, so the epoch's base (the clock's microseconds when it
//!   began) only names it and orders it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::Row;
use tokio_postgres::types::Type;

use super::PgBackend;
use crate::epoch::{Epoch, grace_rest};
use crate::error::{Error, Result};

/// How many times a client reads the marker again because another client changed it while
/// it looked (each time, someone else began an epoch: the next look enters it).
const MARKER_RACES: usize = 8;

/// What a statement answered of the store's epoch and position (`epoch_state`).
#[derive(Debug, Default)]
pub(super) struct EpochAnswer {
    /// The marker (`None`: no epoch yet).
    marker: Option<String>,
    /// How long ago the epoch began, ms (`None`: marked new, nothing to wait).
    age_ms: Option<i64>,
    incarnation: Option<String>,
    timeline: Option<i32>,
    lsn: Option<i64>,
    /// When the server's postmaster started (µs since 1970).
    started: Option<i64>,
}

impl EpochAnswer {
    /// The six columns from `at` on: marker, age_ms, incarnation, tl, lsn, started.
    pub(super) fn from_row(row: &Row, at: usize) -> EpochAnswer {
        EpochAnswer {
            marker: row.try_get(at).ok().flatten(),
            age_ms: row.try_get(at + 1).ok().flatten(),
            incarnation: row.try_get(at + 2).ok().flatten(),
            timeline: row.try_get(at + 3).ok().flatten(),
            lsn: row.try_get(at + 4).ok().flatten(),
            started: row.try_get(at + 5).ok().flatten(),
        }
    }

    fn epoch(&self) -> Option<Epoch> {
        Epoch::decode(self.marker.as_deref()?.as_bytes())
    }

    /// The store's identity, as [`StoreEpochs::saw`](crate::StoreEpochs) compares it: the
    /// server's system identifier, then the schema's incarnation.
    fn identity(&self, system_id: u64) -> Option<Vec<u8>> {
        let incarnation = self.incarnation.as_deref()?;
        let mut identity = system_id.to_be_bytes().to_vec();
        identity.extend_from_slice(incarnation.as_bytes());
        Some(identity)
    }

    /// The positions, as compared: the timeline, then the flush LSN.
    fn positions(&self) -> Option<[u64; 2]> {
        Some([
            u64::try_from(self.timeline?).ok()?,
            u64::try_from(self.lsn?).ok()?,
        ])
    }
}

/// Whether a deletion's notice sent on `timeline` by the postmaster that started at
/// `started` comes from the server this client's answers came from (`seen`: the highest
/// positions seen, the timeline first; `answered`: the postmaster of the latest answer):
/// only then may the waiter take its word for the head, rather than read again. Every way a
/// server goes back in time is a new postmaster (a restore, a crash, a new cluster) or a new
/// timeline (a promotion), and a read compares the position, so it notices.
///
/// (A flush LSN in the notice, compared with the highest seen, was tried first: the notice's
/// is read in the deleting transaction before it commits, and an answer to another request
/// may show a later one before the notice arrives: a false "behind", which costs a read.)
pub(super) fn notice_is_current(
    seen: Option<&[u64]>,
    answered: Option<i64>,
    timeline: i32,
    started: Option<i64>,
) -> bool {
    let (Some([tl, ..]), Some(answered), Some(started)) = (seen, answered, started) else {
        return false;
    };
    u64::try_from(timeline).is_ok_and(|t| t == *tl) && started == answered
}

impl PgBackend {
    /// What is left of an epoch's grace that began `age_ms` ago (`None`: marked new, or
    /// passed), by this client's grace.
    fn grace_left(&self, age_ms: Option<i64>) -> Option<Duration> {
        grace_rest(self.inner.epochs.grace(), age_ms?)
    }

    /// Takes in what an answer said of the store (`system_id`: of the connection that
    /// carried it; `sent`: when its request was first sent). Another identity, or a position
    /// below one seen, begins a new epoch (every session from before is lost at once); a new
    /// marker is entered (the same); a store without a marker gets its first epoch, with a
    /// grace. An answer naming an older epoch than this client's (sent before it changed) is
    /// ignored.
    pub(super) async fn epoch_answered(
        &self,
        op: &'static str,
        system_id: u64,
        answer: &EpochAnswer,
        sent: Instant,
    ) -> Result<()> {
        let (Some(identity), Some(positions)) = (answer.identity(system_id), answer.positions())
        else {
            return Ok(());
        };
        let epochs = &self.inner.epochs;
        let saw = epochs.saw(&identity, &positions, sent);
        if let Some(started) = answer.started {
            self.inner.postmaster.store(started, Ordering::Relaxed);
        }
        if let Err(back) = saw {
            tracing::warn!(
                store = %self.inner.target.endpoint,
                "PostgreSQL went back in time ({}: restored from an earlier backup, or a standby \
                 that missed commits promoted): beginning a new store epoch",
                back.what
            );
            self.establish(op, false).await?;
            return Ok(());
        }
        match answer.epoch() {
            Some(epoch) if epochs.may_enter(&epoch) => {
                epochs.enter(epoch, self.grace_left(answer.age_ms));
            }
            // Older than this client's epoch: an answer sent before it changed.
            Some(_) => {}
            None => {
                self.establish(op, false).await?;
            }
        }
        Ok(())
    }

    /// Reads the marker and enters its epoch, or begins one: when there is none (a schema
    /// created anew) or it is from before the store went back (this client saw it go back).
    /// `init`: the caller asserts no holder from before can exist (an operator's
    /// [`init_store`](Self::init_store)): an epoch it begins has no grace. Returns the epoch
    /// and whether this client began it.
    pub(super) async fn establish(&self, op: &'static str, init: bool) -> Result<(Epoch, bool)> {
        let epochs = &self.inner.epochs;
        for _ in 0..MARKER_RACES {
            let sent = Instant::now();
            let sql = &self.inner.sql.epoch_state;
            let (row, system_id) = self
                .read_request(op, |c| async move {
                    let row = c.query(sql, &[]).await?.into_iter().next();
                    Ok((row, c.system_id()))
                })
                .await?;
            let answer = row
                .map(|r| EpochAnswer::from_row(&r, 0))
                .unwrap_or_default();
            if let (Some(identity), Some(positions)) =
                (answer.identity(system_id), answer.positions())
            {
                // Recorded: a look that finds the store gone back treats its marker as stale.
                let _ = epochs.saw(&identity, &positions, sent);
            }
            if let Some(epoch) = answer.epoch().filter(|e| epochs.may_enter(e)) {
                epochs.enter(epoch, self.grace_left(answer.age_ms));
                return Ok((epoch, false));
            }
            let sql = &self.inner.sql.begin_epoch;
            let expected = answer.marker.as_deref();
            let floor = i64::try_from(self.top_token()).unwrap_or(i64::MAX);
            let (row, _) = self
                .request(op, |c| async move {
                    Ok(c.query(
                        sql,
                        &[
                            (&expected, Type::TEXT),
                            (&init, Type::BOOL),
                            (&floor, Type::INT8),
                        ],
                    )
                    .await?
                    .into_iter()
                    .next())
                })
                .await?;
            let Some(row) = row else { continue };
            let begun: bool = row.try_get(0).unwrap_or(false);
            let answer = EpochAnswer::from_row(&row, 1);
            let Some(epoch) = answer.epoch() else {
                continue;
            };
            if begun {
                let grace = self.grace_left(answer.age_ms);
                tracing::info!(
                    store = %self.inner.target.endpoint,
                    %epoch,
                    grace_ms = grace.map_or(0, |g| g.as_millis()),
                    "began a new store epoch"
                );
                epochs.enter(epoch, grace);
                return Ok((epoch, true));
            }
            // Another client changed the marker meanwhile: its epoch is the store's now.
        }
        Err(Error::Backend {
            op,
            at: self.at(),
            source: "the epoch marker kept changing while this client read it".into(),
        })
    }

    /// Marks this schema as baton's, as `baton init` does: if it has no epoch marker (a
    /// schema created just now, or after the server lost its data), its first store epoch
    /// begins now **without a restart grace**. Returns whether it began one (`false`: the
    /// store was marked already, and nothing changed).
    ///
    /// Call it only for a database you know is new, or whose every baton client has
    /// stopped: the grace it skips is what keeps a newcomer from being granted while a holder
    /// from before (of a store that lost its data) still believes it holds.
    ///
    /// # Errors
    /// The backend's errors.
    ///
    /// # Cancel safety
    /// Cancel safe: the marker is written in one statement, or not at all.
    pub async fn init_store(&self) -> Result<bool> {
        Ok(self.establish("init_store", true).await?.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_is_taken_at_its_word_only_from_where_the_client_was() {
        let seen = [2u64, 1_000];
        assert!(notice_is_current(Some(&seen), Some(77), 2, Some(77)));
        // Another postmaster (a restore, a crash), another timeline, nothing known.
        assert!(!notice_is_current(Some(&seen), Some(77), 2, Some(78)));
        assert!(!notice_is_current(Some(&seen), Some(77), 3, Some(77)));
        assert!(!notice_is_current(Some(&seen), Some(77), 2, None));
        assert!(!notice_is_current(Some(&seen), None, 2, Some(77)));
        assert!(!notice_is_current(None, Some(77), 2, Some(77)));
    }
}
