//! Failovers of Redis under Sentinel ([`Server::RedisSentinel`](super::Server::RedisSentinel)):
//! the three ways a Sentinel deployment fails over, each ending with a replica in sync again
//! for the next one. The clients follow the Sentinels on their own (`redis+sentinel://`): the
//! nemesis never redirects them.
//!
//! The fault's end, the checker's epoch boundary, is the first `+switch-master` any Sentinel
//! announces: no client can reach the new primary before (the Sentinels name the old one until
//! they announce the new), and every client that listens moves then. A grant the old primary
//! makes later is a client that stayed behind (split brain), which the checker reports.

use std::time::Duration;

use super::Run;
use super::schedule::{Fault, FaultKind};
use crate::testing::RedisSentinel;

/// How long a failover may take to be announced, and a replica to be in sync again.
const SETTLE: Duration = Duration::from_secs(30);

/// Carries out `fault` (a [`FaultKind::SentinelFailover`], [`FaultKind::PrimaryKilled`] or
/// [`FaultKind::PrimaryPaused`]) on `redis`: `start` records its start, `end` its end (once
/// the first Sentinel announced the new primary); returns once the Sentinels agree on the new
/// primary and count the other node as its replica, in sync.
pub(super) async fn inject(
    run: &Run,
    redis: &RedisSentinel,
    fault: &Fault,
    start: impl FnOnce(&Run),
    end: impl FnOnce(&Run),
) -> Result<(), String> {
    // The fixture's error, in words.
    fn e(e: impl std::fmt::Display) -> String {
        e.to_string()
    }
    let old = redis.primary().await.map_err(e)?;
    let old_port = old.port();
    // Listening before the failover, so that no announcement is missed.
    let mut switches = redis.switches().await.map_err(e)?;
    start(run);
    match fault.kind {
        FaultKind::SentinelFailover => failover(redis).await?,
        FaultKind::PrimaryKilled => old.stop().await.map_err(e)?,
        FaultKind::PrimaryPaused => old.pause().await.map_err(e)?,
        _ => return Err(format!("{:?} is not a Sentinel failover", fault.kind)),
    }
    let new_port = switches.next(SETTLE).await.map_err(e)?;
    end(run);
    if new_port == old_port {
        return Err(format!(
            "a Sentinel announced 127.0.0.1:{old_port}, the old primary, as the new one"
        ));
    }
    redis.await_new_primary(old_port).await.map_err(e)?;
    match fault.kind {
        FaultKind::PrimaryKilled => {
            tokio::time::sleep(fault.hold).await;
            redis.start_again_as_replica(old_port).await.map_err(e)?;
        }
        // Back, believing itself the primary, until Sentinel demotes it: clients that follow
        // the Sentinels have moved on.
        FaultKind::PrimaryPaused => {
            tokio::time::sleep(fault.hold).await;
            old.unpause().await.map_err(e)?;
        }
        // The old primary, still up, is demoted by Sentinel.
        _ => {}
    }
    redis.await_replica_in_sync().await.map_err(e)
}

/// `SENTINEL FAILOVER`, asked again (for at most [`SETTLE`]) while a Sentinel refuses it: right
/// after a failover it may not count the replica fit yet.
async fn failover(redis: &RedisSentinel) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + SETTLE;
    loop {
        match redis.failover().await {
            Ok(()) => return Ok(()),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(format!("SENTINEL FAILOVER refused for {SETTLE:?}: {e}"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
