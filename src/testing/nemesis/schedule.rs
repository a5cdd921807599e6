//! The seeded schedule of faults: a small PRNG (SplitMix64) seeded from the run's seed, no
//! other source of randomness, so one seed gives one schedule.

use std::time::Duration;

/// SplitMix64: small, fast, and the same sequence for a seed on every machine.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`0` when `n` is 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A duration in `lo..=hi`.
    pub(crate) fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let (lo_ms, hi_ms) = (lo.as_millis() as u64, hi.as_millis() as u64);
        Duration::from_millis(lo_ms + self.below(hi_ms.saturating_sub(lo_ms) + 1))
    }
}

/// One fault of a schedule. Which ones a schedule draws depends on the server (and so on the
/// backend features built in): a build without Redis never makes a flush.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FaultKind {
    /// SIGSTOP a client for `hold` (past its TTL), then SIGCONT.
    Pause(usize),
    /// SIGKILL a client; start it again after `hold`.
    Kill(usize),
    /// Cut a client off both ways (its proxy drops everything) for `hold`.
    Cut(usize),
    /// The client's requests reach the server, the answers are dropped, for `hold`.
    CutAnswers(usize),
    /// Freeze the server for `hold`.
    ServerPause,
    /// Kill the server, start it again with its data after `hold`.
    ServerRestart,
    /// Kill the server, start it again empty after `hold` (Redis: flushed and saved first;
    /// etcd, ZooKeeper, PostgreSQL: its data directory wiped while it is down).
    ServerRestartEmpty,
    /// Copy the server's state (Redis: `SAVE`; etcd: `etcdctl snapshot save`; PostgreSQL: a
    /// base backup), let it run for `lead` (and until a grant was asked for and made after
    /// the copy), kill it, start it again from the copy after `hold`.
    ServerRestartFromSnapshot,
    /// `FLUSHALL` (Redis).
    Flush,
    /// Kill the server with no chance to tidy up, start it again after `hold`: it recovers
    /// from its log (PostgreSQL: an immediate shutdown, SIGQUIT, then WAL replay).
    ServerCrash,
    /// End every client's connections from the server's side (PostgreSQL:
    /// `pg_terminate_backend` on every connection baton opened).
    KillConnections,
    /// A failover (Redis): the primary's replica, attached to it since the run began or the
    /// last promotion, is cut off from it for `.0` (zero: not at all, it is in sync) and so
    /// misses what was written meanwhile; then the primary is killed, `hold` later (a
    /// failover's detection time) the replica is promoted and every client sent to it. In a
    /// server's list of faults the duration is a placeholder; the schedule draws it.
    PromoteReplica(Duration),
    /// Cut a client off both ways for longer than the server takes to expire every session
    /// it has (ZooKeeper: its leases' and its backend's own, [`ZK_SESSION_TIMEOUT`]), then
    /// let it back: it finds its sessions expired. In a server's list of faults the client
    /// is a placeholder; the schedule draws it.
    Expire(usize),
    /// Freeze a follower of a cluster (etcd) or an ensemble (ZooKeeper) for `hold`: of the
    /// members that do not lead when the fault strikes, in member order, the one this number
    /// (mod their count) names. In a server's list of faults the number is a placeholder; the
    /// schedule draws it.
    FollowerPause(usize),
    /// Freeze the member that leads when the fault strikes, for `hold`.
    LeaderPause,
    /// Kill member `n` of a cluster or an ensemble (whether it leads or not), start it again
    /// with its data after `hold`. The number is drawn as for [`FaultKind::FollowerPause`].
    MemberRestart(usize),
    /// Kill the member that leads when the fault strikes, start it again with its data after
    /// `hold`.
    LeaderRestart,
    /// Redis under Sentinel: a manual `SENTINEL FAILOVER` (the replica, in sync, promoted; the
    /// old primary, still up, demoted by Sentinel once it has announced the new one). `lead`
    /// is only the plan's estimate of how long Sentinel takes; the fault lasts until its
    /// replica is in sync again.
    SentinelFailover,
    /// Redis under Sentinel: the primary killed (SIGKILL; what it had not replicated is lost),
    /// the replica promoted by the Sentinels past `down-after-milliseconds`; the old primary
    /// stays down `hold` longer, then is started again as a replica of the new one. `lead`:
    /// as for [`FaultKind::SentinelFailover`].
    PrimaryKilled,
    /// Redis under Sentinel: the primary frozen (`docker pause`) until the Sentinels promoted
    /// the replica behind its back, and `hold` longer; then unfrozen, still believing itself
    /// the primary, until Sentinel demotes it. `lead`: as for [`FaultKind::SentinelFailover`].
    PrimaryPaused,
}

/// The members of a cluster or an ensemble the nemesis starts (`EtcdCluster`, `ZkEnsemble`).
pub(crate) const MEMBERS: usize = 3;

/// The session timeout of a ZooKeeper backend's own connection (`ZkOptions`' default, which
/// `baton::connect` keeps): the longest session a nemesis client has.
pub(crate) const ZK_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

impl FaultKind {
    pub(crate) fn on_server(&self) -> bool {
        !matches!(
            self,
            FaultKind::Pause(_)
                | FaultKind::Kill(_)
                | FaultKind::Cut(_)
                | FaultKind::CutAnswers(_)
                | FaultKind::Expire(_)
        )
    }

    /// Whether the store forgets or goes back in time: a new store epoch begins (every
    /// holder from before told first, nothing granted for the restart grace, every token
    /// above every earlier one), which the checker's rule 6 (**epoch**) holds it to.
    pub(crate) fn loses_state(&self) -> bool {
        matches!(
            self,
            FaultKind::ServerRestartEmpty
                | FaultKind::ServerRestartFromSnapshot
                | FaultKind::Flush
                | FaultKind::PromoteReplica(_)
                // A promoted replica has another `run_id`: a new epoch, missed writes or not.
                | FaultKind::SentinelFailover
                | FaultKind::PrimaryKilled
                | FaultKind::PrimaryPaused
        )
    }

    pub(crate) fn client(&self) -> Option<usize> {
        match self {
            FaultKind::Pause(c)
            | FaultKind::Kill(c)
            | FaultKind::Cut(c)
            | FaultKind::CutAnswers(c)
            | FaultKind::Expire(c) => Some(*c),
            _ => None,
        }
    }

    /// The kind's name, whatever its client, member or duration: what a run must draw
    /// ([`offered_kinds`]) and what the suite counts.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            FaultKind::Pause(_) => "pause",
            FaultKind::Kill(_) => "kill",
            FaultKind::Cut(_) => "cut",
            FaultKind::CutAnswers(_) => "cut-answers",
            FaultKind::ServerPause => "server-pause",
            FaultKind::ServerRestart => "server-restart",
            FaultKind::ServerRestartEmpty => "server-restart-empty",
            FaultKind::ServerRestartFromSnapshot => "server-restart-from-snapshot",
            FaultKind::Flush => "flush",
            FaultKind::ServerCrash => "server-crash",
            FaultKind::KillConnections => "kill-connections",
            FaultKind::PromoteReplica(_) => "promote-replica",
            FaultKind::Expire(_) => "expire",
            FaultKind::FollowerPause(_) => "follower-pause",
            FaultKind::LeaderPause => "leader-pause",
            FaultKind::MemberRestart(_) => "member-restart",
            FaultKind::LeaderRestart => "leader-restart",
            FaultKind::SentinelFailover => "sentinel-failover",
            FaultKind::PrimaryKilled => "primary-killed",
            FaultKind::PrimaryPaused => "primary-paused",
        }
    }

    /// In words, for the history.
    pub(crate) fn describe(&self, backend: &str) -> String {
        match self {
            FaultKind::Pause(c) => format!("pause c{c} (SIGSTOP)"),
            FaultKind::Kill(c) => format!("kill c{c} (SIGKILL), restart"),
            FaultKind::Cut(c) => format!("cut c{c} off both ways"),
            FaultKind::CutAnswers(c) => format!("cut c{c} off one way (answers dropped)"),
            FaultKind::ServerPause => format!("{backend} paused"),
            FaultKind::ServerRestart => format!("{backend} killed, restarted with its data"),
            FaultKind::ServerRestartEmpty => format!("{backend} killed, restarted without data"),
            FaultKind::ServerRestartFromSnapshot if backend == "postgres" => {
                format!("{backend} killed, restored from an earlier base backup")
            }
            FaultKind::ServerRestartFromSnapshot => {
                format!("{backend} killed, restarted from an older snapshot")
            }
            FaultKind::Flush => format!("{backend} FLUSHALL"),
            FaultKind::ServerCrash => {
                format!("{backend} crashed (immediate shutdown), restarted from its log")
            }
            FaultKind::KillConnections => {
                format!("{backend} ended every client connection (pg_terminate_backend)")
            }
            FaultKind::PromoteReplica(missed) if missed.is_zero() => {
                format!("{backend} replica promoted (in sync), the old primary killed")
            }
            FaultKind::PromoteReplica(missed) => format!(
                "{backend} replica promoted after missing {} ms of writes, the old primary killed",
                missed.as_millis()
            ),
            FaultKind::Expire(c) => {
                format!("expire c{c}'s sessions (cut off past the session timeouts)")
            }
            FaultKind::FollowerPause(n) => format!("{backend}: a follower (#{n}) paused"),
            FaultKind::LeaderPause => format!("{backend}: the leader paused"),
            FaultKind::MemberRestart(m) => {
                format!("{backend}: member m{m} killed, restarted with its data")
            }
            FaultKind::LeaderRestart => {
                format!("{backend}: the leader killed, restarted with its data")
            }
            FaultKind::SentinelFailover => {
                format!("{backend}: SENTINEL FAILOVER (the replica promoted in sync)")
            }
            FaultKind::PrimaryKilled => format!(
                "{backend}: the primary killed, its replica promoted by Sentinel, the old one back as a replica"
            ),
            FaultKind::PrimaryPaused => format!(
                "{backend}: the primary frozen until Sentinel promoted its replica, then back and demoted"
            ),
        }
    }
}

/// The client faults every server gets, by name ([`FaultKind::name`]), but Redis under
/// Sentinel ([`client_kinds`]).
pub(crate) const CLIENT_KINDS: [&str; 4] = ["pause", "kill", "cut", "cut-answers"];

/// The client faults of a backend, by name: [`CLIENT_KINDS`], but under Sentinel (`redis-
/// sentinel`) only `pause` and `kill`. A client there reaches the Sentinels (through its
/// proxies) and then the primary at the address they name, directly: a proxy can stand only
/// in front of the Sentinels (a Sentinel announces one address per node to every client), so a
/// "cut" would cut a client off from the Sentinels while it still reaches the old primary,
/// which is the split brain docs/redis.md does not promise, not a cut.
pub(crate) fn client_kinds(backend: &str) -> &'static [&'static str] {
    if backend == "redis-sentinel" {
        &CLIENT_KINDS[..2]
    } else {
        &CLIENT_KINDS
    }
}

/// The server faults of a backend, by the backend's name (`etcd`, `redis`, `zookeeper`,
/// `etcd-cluster`, `zookeeper-ensemble`, `postgres`): a pure function of the name and of
/// what the fixture allows, so that a schedule can be seen without a server. `host_data`:
/// the server's data is on the host (it can be wiped or restored); `container`: it runs in a
/// container (it can be paused, and a Redis replica can be started beside it). In the CI's
/// runs both are true. An unknown name has none.
pub(crate) fn server_faults(backend: &str, host_data: bool, container: bool) -> Vec<FaultKind> {
    let mut faults = Vec::new();
    match backend {
        "etcd" => {
            faults.extend([FaultKind::ServerPause, FaultKind::ServerRestart]);
            // Its data on the host: it can lose it, or go back to a snapshot.
            if host_data {
                faults.extend([
                    FaultKind::ServerRestartEmpty,
                    FaultKind::ServerRestartFromSnapshot,
                ]);
            }
        }
        "redis" => {
            faults.extend([
                FaultKind::ServerPause,
                FaultKind::ServerRestart,
                FaultKind::ServerRestartEmpty,
                FaultKind::ServerRestartFromSnapshot,
                FaultKind::Flush,
            ]);
            // The replica is started beside the server, in a container of its own: not
            // beside a server named by `BATON_REDIS_URL`, which no fixture controls.
            if container {
                faults.push(FaultKind::PromoteReplica(Duration::ZERO));
            }
        }
        // `docker pause` freezes a container only; the local `java` fallback is not paused.
        "zookeeper" if container => {
            faults.extend([
                FaultKind::ServerPause,
                FaultKind::ServerRestart,
                FaultKind::Expire(0),
            ]);
            // Its data on the host: it can lose it. (A copy of it is made only while it is
            // stopped: no restore from an earlier copy here.)
            if host_data {
                faults.push(FaultKind::ServerRestartEmpty);
            }
        }
        "zookeeper" => faults.extend([FaultKind::ServerRestart, FaultKind::Expire(0)]),
        // A manual failover needs only the Sentinels; freezing the primary needs a container.
        "redis-sentinel" => {
            faults.extend([FaultKind::SentinelFailover, FaultKind::PrimaryKilled]);
            if container {
                faults.push(FaultKind::PrimaryPaused);
            }
        }
        "etcd-cluster" => faults.extend([
            FaultKind::FollowerPause(0),
            FaultKind::LeaderPause,
            FaultKind::MemberRestart(0),
            FaultKind::LeaderRestart,
        ]),
        "zookeeper-ensemble" if container => faults.extend([
            FaultKind::FollowerPause(0),
            FaultKind::LeaderPause,
            FaultKind::MemberRestart(0),
            FaultKind::LeaderRestart,
            FaultKind::Expire(0),
        ]),
        "zookeeper-ensemble" => faults.extend([
            FaultKind::MemberRestart(0),
            FaultKind::LeaderRestart,
            FaultKind::Expire(0),
        ]),
        "postgres" => {
            faults.extend([
                FaultKind::ServerPause,
                FaultKind::ServerRestart,
                FaultKind::ServerCrash,
                FaultKind::KillConnections,
                FaultKind::PromoteReplica(Duration::ZERO),
            ]);
            // Its data on the host: it can lose it, or go back to a base backup (until a
            // promotion: a standby's data is its container's).
            if host_data {
                faults.extend([
                    FaultKind::ServerRestartEmpty,
                    FaultKind::ServerRestartFromSnapshot,
                ]);
            }
        }
        _ => {}
    }
    faults
}

/// Every kind a run on a server with these client kinds ([`client_kinds`]) and server faults
/// can carry out, by name: the client kinds, then the server's, each once.
pub(crate) fn offered_kinds(
    client_kinds: &[&'static str],
    server_faults: &[FaultKind],
) -> Vec<&'static str> {
    let mut kinds: Vec<&'static str> = client_kinds.to_vec();
    for f in server_faults {
        if !kinds.contains(&f.name()) {
            kinds.push(f.name());
        }
    }
    kinds
}

/// The planned faults a run leaves out, each with the reason, by a rule that reads the plan
/// alone (never the server of the moment), so that the faults carried out are a function of
/// the seed: on PostgreSQL, once a standby was promoted the primary's data is its container's,
/// not the host's, so a wipe or a restore planned after the first promotion is skipped.
pub(crate) fn skipped(slots: &[Slot], backend: &str) -> Vec<(u32, &'static str)> {
    let mut promoted = false;
    let mut skipped = Vec::new();
    for fault in slots.iter().flat_map(|s| &s.faults) {
        match fault.kind {
            FaultKind::PromoteReplica(_) => promoted = true,
            FaultKind::ServerRestartEmpty | FaultKind::ServerRestartFromSnapshot
                if promoted && backend == "postgres" =>
            {
                skipped.push((
                    fault.id,
                    "a promoted standby's data is its container's: it cannot be wiped or restored",
                ));
            }
            _ => {}
        }
    }
    skipped
}

/// A fault and when: it starts `at` after the first slot's start, waits `lead` (a snapshot's
/// age; how long a replica to be promoted is cut off), strikes, and heals `hold` later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fault {
    pub(crate) id: u32,
    pub(crate) kind: FaultKind,
    pub(crate) lead: Duration,
    pub(crate) hold: Duration,
}

/// Faults that run together (a combination); slots run one after another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slot {
    /// The pause before this slot starts (after the previous one healed).
    pub(crate) gap: Duration,
    pub(crate) faults: Vec<Fault>,
}

/// The schedule of a run: slots of one or two faults (two on different targets: a
/// combination), with gaps between, planned to fill `window`. The client faults are the first
/// `client_kinds` of [`CLIENT_KINDS`] ([`client_kinds`]; with all four, every backend's
/// schedules are what they were before it could have fewer).
pub(crate) fn plan(
    seed: u64,
    clients: usize,
    client_kinds: usize,
    server_faults: &[FaultKind],
    ttl: Duration,
    window: Duration,
) -> Vec<Slot> {
    let mut rng = Rng::new(seed);
    let mut slots = Vec::new();
    let mut planned = Duration::ZERO;
    let mut id = 0;
    while planned < window {
        let gap = rng.between(Duration::from_millis(500), Duration::from_millis(3000));
        let count = if rng.below(3) == 0 { 2 } else { 1 };
        let mut faults: Vec<Fault> = Vec::new();
        for _ in 0..count {
            let kind = loop {
                let client_kinds = client_kinds.min(CLIENT_KINDS.len()) as u64;
                let choice = rng.below(client_kinds + server_faults.len() as u64);
                let client = rng.below(clients as u64) as usize;
                let kind = match choice {
                    n if n >= client_kinds => match server_faults[(n - client_kinds) as usize] {
                        FaultKind::Expire(_) => FaultKind::Expire(client),
                        // Drawn only when chosen: other servers' schedules stay as they were.
                        FaultKind::FollowerPause(_) => {
                            FaultKind::FollowerPause(rng.below(MEMBERS as u64 - 1) as usize)
                        }
                        FaultKind::MemberRestart(_) => {
                            FaultKind::MemberRestart(rng.below(MEMBERS as u64) as usize)
                        }
                        // Half the promotions find the replica in sync, half find it behind.
                        FaultKind::PromoteReplica(_) => {
                            FaultKind::PromoteReplica(if rng.below(2) == 0 {
                                Duration::ZERO
                            } else {
                                rng.between(Duration::from_millis(200), Duration::from_millis(3000))
                            })
                        }
                        ref other => other.clone(),
                    },
                    0 => FaultKind::Pause(client),
                    1 => FaultKind::Kill(client),
                    2 => FaultKind::Cut(client),
                    _ => FaultKind::CutAnswers(client),
                };
                // A combination hits two different targets.
                let clash = faults.iter().any(|f| {
                    (f.kind.on_server() && kind.on_server())
                        || (f.kind.client().is_some() && f.kind.client() == kind.client())
                });
                if !clash {
                    break kind;
                }
            };
            let past_ttl = |rng: &mut Rng| rng.between(ttl + ttl / 4, ttl * 2);
            let (lead, hold) = match kind {
                FaultKind::Pause(_) | FaultKind::Cut(_) | FaultKind::CutAnswers(_) => {
                    (Duration::ZERO, past_ttl(&mut rng))
                }
                FaultKind::Kill(_) => (
                    Duration::ZERO,
                    rng.between(Duration::from_millis(100), Duration::from_millis(2000)),
                ),
                // A leader frozen past ZooKeeper's sync limit (2 s in the fixture) or etcd's
                // election timeout (500 ms) is replaced; a shorter pause only stalls.
                FaultKind::ServerPause | FaultKind::FollowerPause(_) | FaultKind::LeaderPause => (
                    Duration::ZERO,
                    rng.between(Duration::from_millis(300), ttl * 2),
                ),
                // One member of three down keeps the quorum: it may stay down longer than a
                // lone server, long enough for the others to move on without it.
                FaultKind::MemberRestart(_) | FaultKind::LeaderRestart => (
                    Duration::ZERO,
                    rng.between(Duration::from_millis(100), ttl * 2),
                ),
                FaultKind::ServerRestart
                | FaultKind::ServerRestartEmpty
                | FaultKind::ServerCrash => (
                    Duration::ZERO,
                    rng.between(Duration::from_millis(100), Duration::from_millis(1500)),
                ),
                FaultKind::ServerRestartFromSnapshot => (
                    rng.between(Duration::from_millis(500), Duration::from_millis(3000)),
                    rng.between(Duration::from_millis(100), Duration::from_millis(1500)),
                ),
                FaultKind::Flush | FaultKind::KillConnections => (Duration::ZERO, Duration::ZERO),
                FaultKind::PromoteReplica(missed) => (
                    missed,
                    rng.between(Duration::from_millis(100), Duration::from_millis(1500)),
                ),
                // How long Sentinel takes, as the plan's estimate (the fault waits for it): a
                // manual failover about a second (the promoted replica's next `INFO`); a primary
                // killed or frozen is called down after `down-after-milliseconds` (1 s in the
                // fixture), then the Sentinels vote and promote. A killed or frozen primary stays
                // so 0.1-1.5 s past the promotion.
                FaultKind::SentinelFailover => (Duration::from_secs(1), Duration::ZERO),
                FaultKind::PrimaryKilled | FaultKind::PrimaryPaused => (
                    Duration::from_millis(2500),
                    rng.between(Duration::from_millis(100), Duration::from_millis(1500)),
                ),
                // Past the server's expiry: the timeout, then its next expiry tick (ZooKeeper
                // expires sessions in buckets of one tick, 200 ms in the fixture), with room.
                FaultKind::Expire(_) => (
                    Duration::ZERO,
                    rng.between(
                        ttl.max(ZK_SESSION_TIMEOUT) + Duration::from_secs(1),
                        ttl.max(ZK_SESSION_TIMEOUT) + Duration::from_secs(3),
                    ),
                ),
            };
            faults.push(Fault {
                id,
                kind,
                lead,
                hold,
            });
            id += 1;
        }
        let longest = faults
            .iter()
            .map(|f| f.lead + f.hold)
            .max()
            .unwrap_or_default();
        planned += gap + longest;
        slots.push(Slot { gap, faults });
    }
    slots
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_one_schedule() {
        let server = [FaultKind::ServerRestart, FaultKind::Flush];
        let ttl = Duration::from_secs(2);
        let a = plan(
            7,
            6,
            CLIENT_KINDS.len(),
            &server,
            ttl,
            Duration::from_secs(60),
        );
        assert_eq!(
            a,
            plan(
                7,
                6,
                CLIENT_KINDS.len(),
                &server,
                ttl,
                Duration::from_secs(60)
            )
        );
        assert_ne!(
            a,
            plan(
                8,
                6,
                CLIENT_KINDS.len(),
                &server,
                ttl,
                Duration::from_secs(60)
            )
        );
        for slot in &a {
            let on_server = slot.faults.iter().filter(|f| f.kind.on_server()).count();
            assert!(on_server <= 1);
            for f in &slot.faults {
                if let FaultKind::Pause(_) | FaultKind::Cut(_) | FaultKind::CutAnswers(_) = f.kind {
                    assert!(f.hold > ttl, "a pause or a cut outlasts the TTL");
                }
            }
        }
    }

    #[test]
    fn each_backend_offers_its_faults_by_name_alone() {
        let kinds =
            |backend| offered_kinds(client_kinds(backend), &server_faults(backend, true, true));
        assert_eq!(
            kinds("redis"),
            [
                "pause",
                "kill",
                "cut",
                "cut-answers",
                "server-pause",
                "server-restart",
                "server-restart-empty",
                "server-restart-from-snapshot",
                "flush",
                "promote-replica"
            ]
        );
        for (backend, losing) in [
            ("etcd", 2),
            ("redis", 4),
            ("zookeeper", 1),
            ("etcd-cluster", 0),
            ("zookeeper-ensemble", 0),
            ("postgres", 3),
            ("redis-sentinel", 3),
        ] {
            let faults = server_faults(backend, true, true);
            assert_eq!(
                faults.iter().filter(|f| f.loses_state()).count(),
                losing,
                "{backend}'s state-loss faults"
            );
            // An expiry is a client's fault that only ZooKeeper offers; the rest strike the
            // server.
            assert!(
                faults
                    .iter()
                    .all(|f| f.on_server() || matches!(f, FaultKind::Expire(_)))
            );
            assert_eq!(
                kinds(backend).len(),
                client_kinds(backend).len() + faults.len()
            );
        }
        // Under Sentinel a proxy stands only in front of the Sentinels: no cuts.
        assert_eq!(
            kinds("redis-sentinel"),
            [
                "pause",
                "kill",
                "sentinel-failover",
                "primary-killed",
                "primary-paused"
            ]
        );
        // Without a container, no freeze.
        assert!(!server_faults("redis-sentinel", true, false).contains(&FaultKind::PrimaryPaused));
        // Without its data on the host, nothing to wipe or restore.
        assert!(
            !server_faults("postgres", false, true)
                .iter()
                .any(|f| matches!(f, FaultKind::ServerRestartEmpty))
        );
        // The local fallback (no container) is not paused.
        assert!(!server_faults("zookeeper", true, false).contains(&FaultKind::ServerPause));
        assert!(server_faults("consul", true, true).is_empty());
    }

    #[test]
    fn a_wipe_or_restore_after_a_promotion_is_skipped_on_postgres_only() {
        let server = server_faults("postgres", true, true);
        let ttl = Duration::from_secs(2);
        let mut skipped_any = false;
        for seed in 0..40 {
            let slots = plan(
                seed,
                12,
                CLIENT_KINDS.len(),
                &server,
                ttl,
                Duration::from_secs(30),
            );
            let left = skipped(&slots, "postgres");
            assert_eq!(left, skipped(&slots, "postgres"), "a function of the plan");
            assert!(skipped(&slots, "redis").is_empty());
            let mut promoted = false;
            for f in slots.iter().flat_map(|s| &s.faults) {
                let left_out = left.iter().any(|(id, _)| *id == f.id);
                let host_data = matches!(
                    f.kind,
                    FaultKind::ServerRestartEmpty | FaultKind::ServerRestartFromSnapshot
                );
                assert_eq!(left_out, promoted && host_data, "seed {seed}, {f:?}");
                skipped_any |= left_out;
                promoted |= matches!(f.kind, FaultKind::PromoteReplica(_));
            }
        }
        assert!(skipped_any, "some seed plans a wipe after a promotion");
    }

    #[test]
    fn member_faults_draw_their_member_and_never_combine() {
        let server = [
            FaultKind::FollowerPause(0),
            FaultKind::LeaderPause,
            FaultKind::MemberRestart(0),
            FaultKind::LeaderRestart,
        ];
        let ttl = Duration::from_secs(2);
        let slots: Vec<Slot> = (0..20)
            .flat_map(|seed| {
                plan(
                    seed,
                    8,
                    CLIENT_KINDS.len(),
                    &server,
                    ttl,
                    Duration::from_secs(60),
                )
            })
            .collect();
        let mut followers = [0; MEMBERS - 1];
        let mut members = [0; MEMBERS];
        for slot in &slots {
            assert!(slot.faults.iter().filter(|f| f.kind.on_server()).count() <= 1);
            for f in &slot.faults {
                match f.kind {
                    FaultKind::FollowerPause(n) => followers[n] += 1,
                    FaultKind::MemberRestart(m) => members[m] += 1,
                    _ => {}
                }
                if f.kind.on_server() {
                    assert!(f.hold <= ttl * 2, "one member is down at most 2 TTL");
                }
            }
        }
        assert!(followers.iter().all(|&n| n > 0), "{followers:?}");
        assert!(members.iter().all(|&n| n > 0), "{members:?}");
    }

    #[test]
    fn promotions_find_the_replica_in_sync_or_behind() {
        let server = [
            FaultKind::ServerRestart,
            FaultKind::PromoteReplica(Duration::ZERO),
        ];
        let ttl = Duration::from_secs(2);
        let promotions: Vec<Fault> = (0..20)
            .flat_map(|seed| {
                plan(
                    seed,
                    8,
                    CLIENT_KINDS.len(),
                    &server,
                    ttl,
                    Duration::from_secs(60),
                )
            })
            .flat_map(|slot| slot.faults)
            .filter(|f| matches!(f.kind, FaultKind::PromoteReplica(_)))
            .collect();
        let behind = |f: &Fault| f.kind != FaultKind::PromoteReplica(Duration::ZERO);
        assert!(promotions.iter().any(behind), "some replicas missed writes");
        assert!(!promotions.iter().all(behind), "some were in sync");
        for f in &promotions {
            assert!(f.kind.on_server());
            // The replica is cut off for the fault's lead, which the history's words give.
            assert_eq!(f.kind, FaultKind::PromoteReplica(f.lead));
            assert!(f.kind.describe("redis").contains("replica promoted"));
        }
    }

    #[test]
    fn the_faults_that_lose_state_are_the_ones_the_epoch_rule_checks() {
        let losing = [
            FaultKind::ServerRestartEmpty,
            FaultKind::ServerRestartFromSnapshot,
            FaultKind::Flush,
            FaultKind::PromoteReplica(Duration::ZERO),
            FaultKind::PromoteReplica(Duration::from_secs(1)),
            FaultKind::SentinelFailover,
            FaultKind::PrimaryKilled,
            FaultKind::PrimaryPaused,
        ];
        let keeping = [
            FaultKind::Pause(0),
            FaultKind::Kill(0),
            FaultKind::Cut(0),
            FaultKind::CutAnswers(0),
            FaultKind::ServerPause,
            FaultKind::ServerRestart,
            FaultKind::ServerCrash,
            FaultKind::KillConnections,
            FaultKind::Expire(0),
            FaultKind::FollowerPause(0),
            FaultKind::LeaderPause,
            FaultKind::MemberRestart(0),
            FaultKind::LeaderRestart,
        ];
        assert!(losing.iter().all(|f| f.loses_state() && f.on_server()));
        assert!(keeping.iter().all(|f| !f.loses_state()));
        // A copy is taken before the kill: the schedule gives it an age.
        let server = [
            FaultKind::ServerRestartEmpty,
            FaultKind::ServerRestartFromSnapshot,
        ];
        let ttl = Duration::from_secs(2);
        let drawn: Vec<Fault> = (0..10)
            .flat_map(|seed| {
                plan(
                    seed,
                    8,
                    CLIENT_KINDS.len(),
                    &server,
                    ttl,
                    Duration::from_secs(60),
                )
            })
            .flat_map(|slot| slot.faults)
            .filter(|f| f.kind == FaultKind::ServerRestartFromSnapshot)
            .collect();
        assert!(!drawn.is_empty());
        assert!(drawn.iter().all(|f| f.lead >= Duration::from_millis(500)));
        assert!(
            FaultKind::ServerRestartFromSnapshot
                .describe("postgres")
                .contains("base backup")
        );
    }

    #[test]
    fn under_sentinel_no_client_is_cut_and_every_failover_is_drawn() {
        let server = server_faults("redis-sentinel", true, true);
        let kinds = client_kinds("redis-sentinel");
        let ttl = Duration::from_secs(2);
        let faults: Vec<Fault> = (0..20)
            .flat_map(|seed| plan(seed, 12, kinds.len(), &server, ttl, Duration::from_secs(60)))
            .flat_map(|slot| slot.faults)
            .collect();
        assert!(
            faults
                .iter()
                .all(|f| !matches!(f.kind, FaultKind::Cut(_) | FaultKind::CutAnswers(_)))
        );
        for kind in [
            FaultKind::SentinelFailover,
            FaultKind::PrimaryKilled,
            FaultKind::PrimaryPaused,
        ] {
            assert!(faults.iter().any(|f| f.kind == kind), "{kind:?}");
        }
    }

    #[test]
    fn an_expiry_targets_a_drawn_client_and_outlasts_every_session() {
        let server = [FaultKind::ServerRestart, FaultKind::Expire(0)];
        let ttl = Duration::from_secs(2);
        let expiries: Vec<Fault> = (0..20)
            .flat_map(|seed| {
                plan(
                    seed,
                    8,
                    CLIENT_KINDS.len(),
                    &server,
                    ttl,
                    Duration::from_secs(60),
                )
            })
            .flat_map(|slot| slot.faults)
            .filter(|f| matches!(f.kind, FaultKind::Expire(_)))
            .collect();
        assert!(!expiries.is_empty());
        assert!(
            expiries.iter().any(|f| f.kind.client() != Some(0)),
            "the client is drawn"
        );
        for f in &expiries {
            assert!(!f.kind.on_server());
            assert!(f.hold > ZK_SESSION_TIMEOUT + Duration::from_millis(200) && f.hold > ttl);
        }
    }
}
