//! Faults on a cluster's members: an etcd cluster's or a ZooKeeper ensemble's follower or
//! leader paused, a member or the leader killed and started again with its data. The member
//! is resolved when the fault strikes (who leads then), recorded in the fault's words, and the
//! fault ends once the member serves again, so that the next one finds a quorum.

use std::time::Duration;

use super::Server;
use super::history::What;
use super::resource::{Sink, record};
use super::schedule::{Fault, FaultKind, MEMBERS};

/// How long a fault waits for a leader to strike at, or for a member to serve again.
const SETTLE: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy)]
enum MemberAct {
    Pause,
    Unpause,
    Stop,
    Start,
}

impl Server {
    /// Each member's client address (`127.0.0.1:<port>`, in member order) for a cluster or
    /// an ensemble, each Sentinel's for Redis under Sentinel; `None` for a single server.
    pub(super) fn members(&self) -> Option<Vec<String>> {
        // `http://127.0.0.1:2379` or `127.0.0.1:2181`: the address the proxies stand for.
        fn address(url: &str) -> String {
            url.split_once("://").map_or(url, |(_, a)| a).to_owned()
        }
        match self {
            Server::EtcdCluster(c) => Some(c.endpoints().iter().map(|e| address(e)).collect()),
            Server::ZkEnsemble(e) => Some(
                (0..MEMBERS)
                    .map(|i| address(&e.member_connect_string(i)))
                    .collect(),
            ),
            // Redis under Sentinel: the Sentinels (the primary is reached where they say).
            Server::RedisSentinel(s) => Some(
                s.sentinel_ports()
                    .iter()
                    .map(|port| format!("127.0.0.1:{port}"))
                    .collect(),
            ),
            Server::External(url) if url.contains("+sentinel://") => {
                let rest = address(url);
                let authority = rest.split(['/', '?']).next().unwrap_or(&rest);
                let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
                Some(hosts.split(',').map(str::to_owned).collect())
            }
            _ => None,
        }
    }

    /// The member that leads, if one does (asked of every member that answers).
    async fn leader(&self) -> Option<usize> {
        match self {
            Server::EtcdCluster(c) => c.leader().await.ok().flatten(),
            Server::ZkEnsemble(e) => e.leader().await,
            _ => None,
        }
    }

    /// Waits (up to [`SETTLE`]) for a member to lead.
    async fn wait_for_leader(&self) -> Result<usize, String> {
        let deadline = tokio::time::Instant::now() + SETTLE;
        loop {
            if let Some(leader) = self.leader().await {
                return Ok(leader);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("{}: no member leads after {SETTLE:?}", self.name()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn member_act(&self, i: usize, act: MemberAct) -> Result<(), String> {
        fn e(e: impl std::fmt::Display) -> String {
            e.to_string()
        }
        match (self, act) {
            (Server::EtcdCluster(c), MemberAct::Pause) => c.pause_member(i).await.map_err(e),
            (Server::EtcdCluster(c), MemberAct::Unpause) => c.unpause_member(i).await.map_err(e),
            (Server::EtcdCluster(c), MemberAct::Stop) => c.stop_member(i).await.map_err(e),
            // Returns once the member serves a linearizable read through the quorum.
            (Server::EtcdCluster(c), MemberAct::Start) => c.start_member(i).await.map_err(e),
            (Server::ZkEnsemble(z), MemberAct::Pause) => z.pause_member(i).await.map_err(e),
            (Server::ZkEnsemble(z), MemberAct::Unpause) => z.unpause_member(i).await.map_err(e),
            (Server::ZkEnsemble(z), MemberAct::Stop) => z.stop_member(i).await.map_err(e),
            // Returns once the member serves (it has joined a quorum).
            (Server::ZkEnsemble(z), MemberAct::Start) => z.start_member(i).await.map_err(e),
            (_, act) => Err(format!("{act:?} m{i} is not supported on this server")),
        }
    }

    /// Waits (up to [`SETTLE`]) until member `i`, unfrozen, serves again: etcd, a
    /// linearizable read through it; ZooKeeper, `srvr` reports a mode (it has rejoined a
    /// quorum, after a resync if the leader had dropped it).
    async fn wait_serving(&self, i: usize) -> Result<(), String> {
        match self {
            Server::EtcdCluster(c) => c.wait_healthy(i).await.map_err(|e| e.to_string()),
            Server::ZkEnsemble(z) => {
                let deadline = tokio::time::Instant::now() + SETTLE;
                while z.member(i).mode().await.is_none() {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(format!("{}: m{i} does not serve", self.name()));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(())
            }
            _ => Err(format!("{}: m{i} is not a member", self.name())),
        }
    }
}

/// Carries out a member fault ([`FaultKind::FollowerPause`], [`FaultKind::LeaderPause`],
/// [`FaultKind::MemberRestart`], [`FaultKind::LeaderRestart`]): finds its member, records the
/// start with that member named, strikes, heals after `hold`, waits until the member serves,
/// and records the end.
pub(super) async fn inject(server: &Server, fault: &Fault, sink: &Sink) -> Result<(), String> {
    let backend = server.name();
    let (member, what, pause) = match fault.kind {
        FaultKind::FollowerPause(n) => {
            let leader = server.wait_for_leader().await?;
            let followers: Vec<usize> = (0..MEMBERS).filter(|&m| m != leader).collect();
            let m = followers[n % followers.len()];
            (m, format!("{backend}: follower m{m} paused"), true)
        }
        FaultKind::LeaderPause => {
            let m = server.wait_for_leader().await?;
            (m, format!("{backend}: leader m{m} paused"), true)
        }
        FaultKind::MemberRestart(m) => {
            let role = match server.leader().await {
                Some(l) if l == m => "leader",
                Some(_) => "follower",
                None => "member",
            };
            let what = format!("{backend}: {role} m{m} killed, restarted with its data");
            (m % MEMBERS, what, false)
        }
        FaultKind::LeaderRestart => {
            let m = server.wait_for_leader().await?;
            let what = format!("{backend}: leader m{m} killed, restarted with its data");
            (m, what, false)
        }
        _ => return Err(format!("{:?} is not a member fault", fault.kind)),
    };
    record(sink, "nemesis", What::FaultStart { id: fault.id, what });
    if pause {
        server.member_act(member, MemberAct::Pause).await?;
        tokio::time::sleep(fault.hold).await;
        server.member_act(member, MemberAct::Unpause).await?;
        server.wait_serving(member).await?;
    } else {
        server.member_act(member, MemberAct::Stop).await?;
        tokio::time::sleep(fault.hold).await;
        server.member_act(member, MemberAct::Start).await?;
    }
    record(sink, "nemesis", What::FaultEnd { id: fault.id });
    Ok(())
}
