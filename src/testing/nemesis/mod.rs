//! The nemesis (feature `nemesis`, which brings `testing` and every backend): client **processes** lock, make a fenced
//! read-modify-write of a counter, append an entry to the lock's log and unlock, on a Mutex, a Semaphore, a RwLock and an
//! Election, while a seeded schedule pauses (SIGSTOP past the TTL), kills (SIGKILL, then
//! restarts) and cuts off (both ways, or answers only) clients, pauses, restarts, rolls
//! back or flushes the server, restarts it without its data or from an earlier copy (etcd,
//! ZooKeeper and PostgreSQL started with their data on the host: a wipe; etcd's snapshot,
//! PostgreSQL's base backup), (Redis) promotes its replica, in sync or after it missed
//! writes, (ZooKeeper) expires a client's sessions, and (PostgreSQL) crashes the server
//! (immediate shutdown), ends every client connection from its side, or promotes its
//! standby, in sync or after it missed writes (a new WAL timeline). On a three-member
//! etcd cluster ([`Server::EtcdCluster`]) or ZooKeeper ensemble ([`Server::ZkEnsemble`]) the
//! server faults are a member's instead: a follower or the leader paused, a member or the
//! leader killed and restarted with its data, one member at a time (each fault ends once its
//! member serves again), so the quorum is kept; each client reaches every member through a
//! proxy of its own per member, so a client cut off is cut off from the whole cluster. Under
//! Redis Sentinel ([`Server::RedisSentinel`]) the clients follow the Sentinels
//! (`redis+sentinel://`) and the server faults are the three ways a Sentinel deployment fails
//! over: a manual `SENTINEL FAILOVER`, the primary killed, the primary frozen past
//! `down-after-milliseconds` (each ending with a replica in sync again); its clients are
//! paused and killed, not cut off (they reach the primary where the Sentinels say, past any
//! proxy). Every event goes into one history on one clock (`CLOCK_MONOTONIC`), and [`check`]
//! reads it:
//!
//! 1. **fence**, **counter**: the resource never accepts a token lower than one it accepted;
//!    every accepted write adds one to what the last left; acknowledged increments <= applied
//!    <= acknowledged + those of unknown outcome; **log**: each log entry follows its own
//!    holder's write, with no other write accepted in between;
//! 2. **token-order**: no token is granted twice, and a grant that returned before another
//!    was asked for has the lower token;
//! 3. **lost-first**: no grant while a holder that could be told (not paused) still holds and
//!    was not told (`lost()`), beyond the recipe's permits;
//! 4. **progress**: after the last fault healed, every client is granted within
//!    [`Options::progress_bound`];
//! 5. **leftover**: no entry is left in the backend once every client stopped;
//! 6. **epoch** (after every fault that loses state, its `loses_state`: a server
//!    restarted without its data or from an earlier copy, a Redis `FLUSHALL`, a Redis
//!    replica or a PostgreSQL standby promoted, every failover under Sentinel, whose end is
//!    the first `+switch-master` a Sentinel announces): a grant asked for once the store is
//!    back waits the restart grace (after a manual `SENTINEL FAILOVER`, whose old primary
//!    answers until its clients hear the announcement, a grant within 500 ms of it is the old
//!    store's); a grant after that has a token above every token granted before (and holders
//!    from before are told first: rule 3).
//!
//! A violation prints the seed and the shortest window of events that shows it; the seed
//! replays the schedule (which faults, on whom, when; the processes' interleaving is the
//! operating system's, and a member fault strikes whoever leads when it strikes). A run
//! carries out its whole schedule, however long the server takes, so one seed carries out
//! the same faults every time; [`schedule()`] shows them without a server.
//! `docs/reliability.md` says what each backend promises under each fault. The rules are the same on a cluster as on one server: etcd is linearizable through
//! a leader change (a new leader keeps every lease), and ZooKeeper's czxids keep increasing
//! across epochs and its sessions move to another member, so every rule above is promised
//! under every member fault.
//!
//! Besides the verdict, a [`Report`] measures [`Recovery`]: from each moment every fault had
//! healed to every lock granted again, and from the last heal to every client granted (the
//! numbers behind the progress bound). A run saved with [`Options::with_history_dir`] has its
//! plan at the head of its history, and [`recheck`] checks it again with this build's checker.
//!
//! # Client processes
//! The runner starts each client by running a program again (by default the current
//! executable) with `BATON_NEMESIS_CLIENT` set: call [`client_if_requested`] first thing in
//! that program's `main`, as baton's own `tests/nemesis.rs` (a test with `harness = false`)
//! does.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use baton::testing::nemesis::{self, Options, Server};
//! // In main, before anything else:
//! if let Some(code) = nemesis::client_if_requested() {
//!     std::process::exit(code);
//! }
//! let report = nemesis::run(&Server::External("redis://127.0.0.1:6379".into()),
//!     Options::new(60, 1)).await?;
//! assert!(report.violations.is_empty(), "{}", report.summary());
//! # Ok(()) }
//! ```

mod check;
mod client;
mod cluster;
mod history;
mod resource;
mod schedule;
mod sentinel;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub use check::{Plan, Recovery, Violation, check, recovery};
pub use history::{Event, What, now_ns};
pub use resource::Bug;

use crate::testing::Proxy;
use resource::{Resource, Sink, record};
use schedule::{Fault, FaultKind};

/// The variable that makes a program a nemesis client (see [`client_if_requested`]).
pub const ENV_CLIENT: &str = "BATON_NEMESIS_CLIENT";

/// The recipes the clients use, one lock (and one fenced resource) each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipe {
    /// `Mutex::lock`.
    Mutex,
    /// `Semaphore::acquire` with [`Recipe::SEMAPHORE_PERMITS`] permits.
    Semaphore,
    /// `RwLock::read` or `write` (half each); writers write, readers only hold.
    RwLock,
    /// `Election::campaign`; the leader writes.
    Election,
}

impl Recipe {
    /// The semaphore's limit.
    pub const SEMAPHORE_PERMITS: u32 = 2;
    /// Every recipe.
    pub const ALL: [Recipe; 4] = [
        Recipe::Mutex,
        Recipe::Semaphore,
        Recipe::RwLock,
        Recipe::Election,
    ];

    /// Its name in a lock's name and in the environment.
    pub fn name(self) -> &'static str {
        match self {
            Recipe::Mutex => "mutex",
            Recipe::Semaphore => "semaphore",
            Recipe::RwLock => "rwlock",
            Recipe::Election => "election",
        }
    }

    /// The recipe `name` names.
    pub fn parse(name: &str) -> Option<Recipe> {
        Recipe::ALL.into_iter().find(|r| r.name() == name)
    }
}

/// When this process was started as a nemesis client (`BATON_NEMESIS_CLIENT` set), runs the
/// client to its end and returns its exit code; otherwise `None` at once.
pub fn client_if_requested() -> Option<i32> {
    std::env::var_os(ENV_CLIENT)?;
    let Some(config) = client::ClientConfig::from_env() else {
        eprintln!("nemesis client: incomplete BATON_NEMESIS_* environment");
        return Some(2);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("nemesis client: no runtime: {e}");
            return Some(2);
        }
    };
    Some(runtime.block_on(client::run(config)))
}

/// The server the nemesis runs against.
#[derive(Debug)]
#[non_exhaustive]
// One value per run; boxing a fixture would only make every caller write `Box::new`.
#[allow(clippy::large_enum_variant)]
pub enum Server {
    /// A single etcd member started by the fixture: paused, killed and restarted with its
    /// data; and, started with
    /// [`start_with_host_data`](crate::testing::EtcdNode::start_with_host_data), restarted
    /// without it (its data dir wiped) or from a snapshot taken earlier in the run.
    Etcd(crate::testing::EtcdNode),
    /// A Redis started by the fixture: paused, killed and restarted with its data, without
    /// it and from an older snapshot, flushed; and (in a container) failed over: a replica
    /// the run starts beside it is promoted, in sync or after missing writes, the old
    /// primary killed (no split brain: docs/redis.md does not promise it), the clients
    /// redirected, and a new replica attached for the next promotion.
    Redis(crate::testing::RedisNode),
    /// A ZooKeeper server started by the fixture: paused (a container only), killed and
    /// restarted with its data; a client's sessions expired (cut off past every session
    /// timeout it has); and, started with
    /// [`start_with_host_data`](crate::testing::ZkNode::start_with_host_data), restarted
    /// without its data (its data dir wiped).
    ZooKeeper(crate::testing::ZkNode),
    /// A three-member etcd cluster started by the fixture: a follower or the leader paused, a
    /// member or the leader killed and restarted with its data, one member at a time (the
    /// quorum is kept). Each client reaches every member, through a proxy per member.
    EtcdCluster(crate::testing::EtcdCluster),
    /// A three-server ZooKeeper ensemble started by the fixture: as
    /// [`EtcdCluster`](Server::EtcdCluster) (pauses on containers only), and a client's
    /// sessions expired.
    ZkEnsemble(crate::testing::ZkEnsemble),
    /// A PostgreSQL started by the fixture: paused, stopped (fast shutdown) and started
    /// again, crashed (immediate shutdown: WAL replay at the start), every client
    /// connection ended from the server's side (`pg_terminate_backend`); and failed over: a
    /// streaming standby the run starts beside it (replicating through a proxy, which a
    /// failover that misses writes closes first) is promoted, the old primary crashed for
    /// good, the clients redirected, and a new standby attached for the next promotion.
    /// Started with
    /// [`start_with_host_data`](crate::testing::PgNode::start_with_host_data), it is also
    /// re-created without its data (its data directory wiped) and restored from a base backup
    /// taken earlier in the run; not once a standby was promoted (the standby's data is its
    /// container's): such a fault is left out of the run.
    Postgres(crate::testing::PgNode),
    /// Redis under Sentinel ([`RedisSentinel`](crate::testing::RedisSentinel): a primary, a
    /// replica, three Sentinels), the clients connected with its `redis+sentinel://` URL (each
    /// through a proxy per Sentinel) and following the Sentinels on their own: failed over
    /// three ways, one at a time, each ending with a replica in sync again: a manual `SENTINEL
    /// FAILOVER`; the primary killed (the Sentinels promote the replica past
    /// `down-after-milliseconds`; what it had not replicated is lost), then started again as a
    /// replica of the new one; the primary frozen (`docker pause`, containers only) until the
    /// Sentinels promoted the replica behind its back, then unfrozen and demoted by Sentinel.
    /// The client faults are pauses and kills only: a proxy can stand only in front of the
    /// Sentinels (a client reaches the primary at the address they announce), so a cut would
    /// leave a client reaching the old primary without hearing of the new one, the split
    /// brain docs/redis.md does not promise.
    RedisSentinel(crate::testing::RedisSentinel),
    /// A server of yours (`http://127.0.0.1:2379`, `redis://127.0.0.1:6379`,
    /// `zk://127.0.0.1:2181`, `postgres://user@127.0.0.1:5432/db`,
    /// `redis+sentinel://127.0.0.1:26379,.../service`): only the clients are faulted (paused,
    /// killed, cut off; on ZooKeeper, their sessions expired; under Sentinel, paused and killed
    /// only, each client reaching every Sentinel through a proxy of its own). The proxies run
    /// on 127.0.0.1, so the server must be reachable from here; a ZooKeeper connect string's
    /// first server is the one used.
    External(String),
}

impl Server {
    fn name(&self) -> &'static str {
        match self {
            Server::Etcd(_) => "etcd",
            Server::Redis(_) => "redis",
            Server::ZooKeeper(_) => "zookeeper",
            Server::EtcdCluster(_) => "etcd-cluster",
            Server::ZkEnsemble(_) => "zookeeper-ensemble",
            Server::Postgres(_) => "postgres",
            Server::RedisSentinel(_) => "redis-sentinel",
            Server::External(url) if url.starts_with("postgres") => "postgres",
            Server::External(url) if url.contains("+sentinel://") => "redis-sentinel",
            Server::External(url) if url.starts_with("redis") => "redis",
            Server::External(url) if url.starts_with("zk://") => "zookeeper",
            Server::External(_) => "etcd",
        }
    }

    /// The server's URL as clients would use it directly.
    fn url(&self) -> String {
        match self {
            Server::Etcd(n) => n.endpoints().first().cloned().unwrap_or_default(),
            Server::Redis(n) => n.url(),
            Server::ZooKeeper(n) => n.url(),
            Server::EtcdCluster(c) => c.endpoints().join(","),
            Server::ZkEnsemble(e) => e.url(),
            Server::Postgres(n) => n.url(),
            Server::RedisSentinel(s) => s.url(),
            Server::External(url) => url.clone(),
        }
    }

    /// The server faults it can carry out: [`schedule::server_faults`] of its name, with
    /// what its fixture allows (its data on the host, a container).
    fn faults(&self) -> Vec<FaultKind> {
        let (host_data, container) = match self {
            Server::Etcd(n) => (n.has_host_data(), true),
            Server::Redis(n) => (false, n.is_container()),
            Server::ZooKeeper(n) => (n.has_host_data(), n.is_container()),
            Server::EtcdCluster(_) => (false, true),
            Server::ZkEnsemble(e) => (false, e.member(0).is_container()),
            Server::Postgres(n) => (n.has_host_data(), true),
            Server::RedisSentinel(s) => (
                false,
                s.nodes()
                    .first()
                    .is_some_and(crate::testing::RedisNode::is_container),
            ),
            Server::External(url) if url.starts_with("zk://") => return vec![FaultKind::Expire(0)],
            Server::External(_) => return Vec::new(),
        };
        schedule::server_faults(self.name(), host_data, container)
    }

    async fn act(&self, act: ServerAct) -> Result<(), String> {
        // The fixture's error, in words.
        fn e(e: impl std::fmt::Display) -> String {
            e.to_string()
        }
        match (self, act) {
            (Server::Etcd(n), ServerAct::Pause) => n.pause().await.map_err(e),
            (Server::Etcd(n), ServerAct::Unpause) => n.unpause().await.map_err(e),
            (Server::Etcd(n), ServerAct::Stop) => n.stop().await.map_err(e),
            (Server::Etcd(n), ServerAct::Start) => n.start_again().await.map_err(e),
            (Server::Redis(n), ServerAct::Pause) => n.pause().await.map_err(e),
            (Server::Redis(n), ServerAct::Unpause) => n.unpause().await.map_err(e),
            (Server::Redis(n), ServerAct::Stop) => n.stop().await.map_err(e),
            (Server::Redis(n), ServerAct::Start) => n.start_again().await.map_err(e),
            (Server::Redis(n), ServerAct::Save) => n.command::<()>("SAVE", &[]).await.map_err(e),
            (Server::Redis(n), ServerAct::Flush) => {
                n.command::<()>("FLUSHALL", &[]).await.map_err(e)
            }
            (Server::ZooKeeper(n), ServerAct::Pause) => n.pause().await.map_err(e),
            (Server::ZooKeeper(n), ServerAct::Unpause) => n.unpause().await.map_err(e),
            (Server::ZooKeeper(n), ServerAct::Stop) => n.stop().await.map_err(e),
            (Server::ZooKeeper(n), ServerAct::Start) => n.start_again().await.map_err(e),
            (Server::Postgres(n), ServerAct::Pause) => n.pause().await.map_err(e),
            (Server::Postgres(n), ServerAct::Unpause) => n.unpause().await.map_err(e),
            (Server::Postgres(n), ServerAct::Stop) => n.stop_fast().await.map_err(e),
            (Server::Postgres(n), ServerAct::Crash) => n.stop_immediate().await.map_err(e),
            (Server::Postgres(n), ServerAct::Start) => n.start_again().await.map_err(e),
            // baton's connections name themselves `baton` (PgOptions' default).
            (Server::Postgres(n), ServerAct::EndConnections) => {
                n.terminate("baton").await.map(drop).map_err(e)
            }
            (Server::Etcd(n), ServerAct::Wipe) => n.wipe_data().map_err(e),
            (Server::Etcd(n), ServerAct::SaveCopy(id)) => {
                n.save_snapshot(&etcd_snapshot(id)).await.map_err(e)
            }
            (Server::Etcd(n), ServerAct::RestoreCopy(id)) => {
                let path = etcd_snapshot(id);
                let restored = n.restore_snapshot(&path).await.map_err(e);
                let _ = std::fs::remove_file(&path);
                restored
            }
            (Server::Redis(n), ServerAct::SaveCopy(_)) => {
                n.command::<()>("SAVE", &[]).await.map_err(e)
            }
            // The restart loads the snapshot the copy saved.
            (Server::Redis(_), ServerAct::RestoreCopy(_)) => Ok(()),
            (Server::ZooKeeper(n), ServerAct::Wipe) => n.wipe_data().map_err(e),
            (Server::Postgres(n), ServerAct::Wipe) => n.wipe_data().map_err(e),
            (Server::Postgres(n), ServerAct::SaveCopy(id)) => n
                .take_base_backup(&format!("nemesis-{id}"))
                .await
                .map_err(e),
            (Server::Postgres(n), ServerAct::RestoreCopy(id)) => {
                n.restore_base_backup(&format!("nemesis-{id}")).map_err(e)
            }
            (_, act) => Err(format!("{act:?} is not supported on this server")),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum ServerAct {
    Pause,
    Unpause,
    Stop,
    Start,
    Save,
    Flush,
    /// Kill without a chance to tidy up (PostgreSQL's immediate shutdown).
    Crash,
    /// End the clients' connections from the server's side.
    EndConnections,
    /// Remove the stopped server's data (etcd, ZooKeeper, PostgreSQL).
    Wipe,
    /// Copy the running server's state, for fault `.0` (Redis: `SAVE`; etcd: a snapshot;
    /// PostgreSQL: a base backup).
    SaveCopy(u32),
    /// Put the copy of fault `.0` in place of the stopped server's data.
    RestoreCopy(u32),
}

impl Server {
    /// Whether the server (the primary of the moment) can carry out `fault`: after a
    /// promotion, a PostgreSQL standby's data is its container's, not the host's, and it
    /// cannot be wiped or restored.
    fn can(&self, fault: &FaultKind) -> bool {
        match (self, fault) {
            (
                Server::Postgres(n),
                FaultKind::ServerRestartEmpty | FaultKind::ServerRestartFromSnapshot,
            ) => n.has_host_data(),
            _ => true,
        }
    }
}

/// Where an etcd snapshot of fault `id` is kept until it is restored.
fn etcd_snapshot(id: u32) -> PathBuf {
    std::env::temp_dir().join(format!(
        "baton-nemesis-{}-{id}.snapshot",
        std::process::id()
    ))
}

/// A run's settings.
#[derive(Debug, Clone)]
pub struct Options {
    seconds: u64,
    seed: u64,
    clients_per_recipe: usize,
    ttl: Duration,
    bug: Option<Bug>,
    history_dir: Option<PathBuf>,
    program: Option<(PathBuf, Vec<String>)>,
}

impl Options {
    /// A schedule of faults planned to fill `seconds`, drawn from `seed`; the run carries out
    /// every fault of it (which may take longer than `seconds`: a restart waits for its
    /// server), then waits for progress, stops the clients and looks for leftovers.
    /// Defaults: [`DEFAULT_CLIENTS_PER_RECIPE`] clients per recipe, a TTL of 2 s (the restart
    /// grace is the same).
    pub fn new(seconds: u64, seed: u64) -> Options {
        Options {
            seconds,
            seed,
            clients_per_recipe: DEFAULT_CLIENTS_PER_RECIPE,
            ttl: Duration::from_secs(2),
            bug: None,
            history_dir: None,
            program: None,
        }
    }

    /// Clients per recipe (at least 1; default [`DEFAULT_CLIENTS_PER_RECIPE`]). The schedule
    /// draws its clients from all of them, so a seed plans differently for another count.
    ///
    /// ## Warning
    /// Each client is a process: four recipes of `n` clients are `4 n` processes beside the
    /// servers. With no more than [`Recipe::SEMAPHORE_PERMITS`] per recipe, the semaphore
    /// never makes anyone wait.
    #[must_use]
    pub fn with_clients_per_recipe(mut self, n: usize) -> Options {
        self.clients_per_recipe = n.max(1);
        self
    }

    /// Clients per recipe.
    pub fn clients_per_recipe(&self) -> usize {
        self.clients_per_recipe
    }

    /// The sessions' TTL (and the Redis restart grace).
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Options {
        self.ttl = ttl;
        self
    }

    /// Injects a defect, to see the checker catch it.
    #[must_use]
    pub fn with_bug(mut self, bug: Option<Bug>) -> Options {
        self.bug = bug;
        self
    }

    /// Writes the history to `<dir>/<backend>-<seed>.history`.
    #[must_use]
    pub fn with_history_dir(mut self, dir: impl Into<PathBuf>) -> Options {
        self.history_dir = Some(dir.into());
        self
    }

    /// The program (and arguments) run as each client; it must call
    /// [`client_if_requested`]. Default: the current executable, no arguments.
    #[must_use]
    pub fn with_client_program(
        mut self,
        program: impl Into<PathBuf>,
        args: Vec<String>,
    ) -> Options {
        self.program = Some((program.into(), args));
        self
    }

    /// After the last fault heals, every client must be granted within this: the restart
    /// grace, then three TTLs (a killed or cut-off holder's lease ends, the queue moves),
    /// plus 10 s for queues of several clients and reconnections.
    pub fn progress_bound(&self) -> Duration {
        self.ttl * 4 + Duration::from_secs(10)
    }
}

/// Clients per recipe unless [`Options::with_clients_per_recipe`] says otherwise: one more
/// than the semaphore's permits, so that every recipe, the semaphore too, has a client that
/// waits.
pub const DEFAULT_CLIENTS_PER_RECIPE: usize = Recipe::SEMAPHORE_PERMITS as usize + 1;

/// A run's schedule as its seed plans it, seen without a server ([`schedule()`]): the faults in
/// the order the run carries them out, which it leaves out and why, and which kinds it draws
/// of those the server offers.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// The backend's name, as [`Report::backend`].
    pub backend: String,
    /// The seed.
    pub seed: u64,
    /// Every planned fault, in order.
    pub faults: Vec<PlannedFault>,
    /// Every kind of fault a run on this server can carry out, by name (`pause`, `kill`,
    /// `cut`, `cut-answers`, then the server's: `server-restart-empty`, `promote-replica`,
    /// ...).
    pub offered: Vec<&'static str>,
    /// How long the plan takes if every fault takes exactly its planned time (restarts and
    /// waits for a leader add to it).
    pub planned: Duration,
    slots: Vec<schedule::Slot>,
    skipped: HashMap<u32, &'static str>,
}

/// One fault of a [`Schedule`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedFault {
    /// Its number (the history's `fault ID` and `healed ID`).
    pub id: u32,
    /// The slot it belongs to (faults of one slot run together).
    pub slot: usize,
    /// When it strikes, from the end of the warm-up (every client granted once), if every
    /// fault before took its planned time.
    pub at: Duration,
    /// Its kind's name ([`Schedule::offered`]).
    pub kind: &'static str,
    /// What it does, in words (as the history says it).
    pub what: String,
    /// Why the run leaves it out, if it does (a rule of the plan alone: the faults carried
    /// out are a function of the seed).
    pub skipped: Option<&'static str>,
}

impl Schedule {
    fn new(backend: &str, server_faults: &[FaultKind], options: &Options) -> Schedule {
        let slots = schedule::plan(
            options.seed,
            options.clients_per_recipe * Recipe::ALL.len(),
            schedule::client_kinds(backend).len(),
            server_faults,
            options.ttl,
            Duration::from_secs(options.seconds),
        );
        let skipped: HashMap<u32, &'static str> =
            schedule::skipped(&slots, backend).into_iter().collect();
        let mut faults = Vec::new();
        let mut at = Duration::ZERO;
        for (i, slot) in slots.iter().enumerate() {
            at += slot.gap;
            for f in &slot.faults {
                faults.push(PlannedFault {
                    id: f.id,
                    slot: i,
                    at,
                    kind: f.kind.name(),
                    what: f.kind.describe(backend),
                    skipped: skipped.get(&f.id).copied(),
                });
            }
            at += slot
                .faults
                .iter()
                .map(|f| f.lead + f.hold)
                .max()
                .unwrap_or_default();
        }
        Schedule {
            backend: backend.to_owned(),
            seed: options.seed,
            faults,
            offered: schedule::offered_kinds(schedule::client_kinds(backend), server_faults),
            planned: at,
            slots,
            skipped,
        }
    }

    /// The kinds of the faults the run carries out (not skipped), each once, in the order of
    /// [`offered`](Schedule::offered).
    pub fn drawn(&self) -> Vec<&'static str> {
        self.offered
            .iter()
            .copied()
            .filter(|k| {
                self.faults
                    .iter()
                    .any(|f| f.kind == *k && f.skipped.is_none())
            })
            .collect()
    }

    /// The kinds the server offers that the run does not carry out.
    pub fn missing(&self) -> Vec<&'static str> {
        let drawn = self.drawn();
        self.offered
            .iter()
            .copied()
            .filter(|k| !drawn.contains(k))
            .collect()
    }
}

/// The schedule a run with `options` would carry out on a server of `backend` (`etcd`,
/// `redis`, `zookeeper`, `etcd-cluster`, `zookeeper-ensemble`, `postgres`,
/// `redis-sentinel`) as the CI starts it (in containers, the data on the host), seen without
/// starting anything; `None` for
/// another name. The same seed, options and backend give the same schedule as
/// [`run`] carries out on such a server.
pub fn schedule(backend: &str, options: &Options) -> Option<Schedule> {
    let faults = schedule::server_faults(backend, true, true);
    if faults.is_empty() {
        return None;
    }
    Some(Schedule::new(backend, &faults, options))
}

/// What a run did and found.
#[derive(Debug)]
pub struct Report {
    /// The seed (replays the schedule).
    pub seed: u64,
    /// `etcd`, `redis`, `zookeeper`, `etcd-cluster`, `zookeeper-ensemble`, `postgres` or
    /// `redis-sentinel`.
    pub backend: String,
    /// The faults injected, in words.
    pub faults: Vec<String>,
    /// The faults the schedule planned and the run left out (the rule of
    /// [`PlannedFault::skipped`]), in words.
    pub skipped: Vec<String>,
    /// The kinds of fault the server offers that the run did not carry out
    /// ([`Schedule::missing`]); empty when the history was checked again ([`recheck`]), which
    /// does not know the server.
    pub missing_kinds: Vec<&'static str>,
    /// Clients per recipe (read back from the plan at a saved history's head).
    pub clients_per_recipe: usize,
    /// The whole history, sorted by time.
    pub history: Vec<Event>,
    /// What the checker found.
    pub violations: Vec<Violation>,
    /// Where the history was written, if anywhere.
    pub history_file: Option<PathBuf>,
    /// How long the locks took to be granted again after faults healed.
    pub recovery: Recovery,
    /// The bound the progress rule checked.
    pub progress_bound: Duration,
}

impl Report {
    /// Counts and every violation with its window, ending with how to replay the run.
    pub fn summary(&self) -> String {
        let count = |f: fn(&What) -> bool| self.history.iter().filter(|e| f(&e.what)).count();
        let mut s = format!(
            "nemesis {} seed {}: {} faults, {} grants, {} writes accepted, {} refused, {} lost, {} violations; {} clients per recipe, {} faults skipped{}\n",
            self.backend,
            self.seed,
            self.faults.len(),
            count(|w| matches!(w, What::Granted { .. })),
            count(|w| matches!(w, What::Accepted { write: true, .. })),
            count(|w| matches!(w, What::Refused { .. })),
            count(|w| matches!(w, What::Lost { .. })),
            self.violations.len(),
            self.clients_per_recipe,
            self.skipped.len(),
            if self.missing_kinds.is_empty() {
                String::new()
            } else {
                format!(", kinds not drawn: {}", self.missing_kinds.join(" "))
            },
        );
        if let Some((median, longest, what)) = self.recovery.median_and_longest() {
            s.push_str(&format!(
                "recovery after faults healed: median {} ms, longest {} ms ({what}), {} not recovered before the end; every client granted {} after the last heal (bound {} ms)\n",
                median.as_millis(),
                longest.as_millis(),
                self.recovery.unrecovered,
                match self.recovery.after_last {
                    Some(d) => format!("within {} ms", d.as_millis()),
                    None => "not".to_owned(),
                },
                self.progress_bound.as_millis(),
            ));
        }
        for v in &self.violations {
            s.push_str(&v.to_string());
        }
        if let Some(f) = &self.history_file {
            s.push_str(&format!("history: {}\n", f.display()));
        }
        if !self.violations.is_empty() {
            s.push_str(&format!(
                "replay: just nemesis {} <seconds> {}\n",
                self.backend, self.seed
            ));
        }
        s
    }
}

/// One client: how to start it again, its process, its proxy (to a cluster's first member;
/// `others` to the rest, so that a cut cuts it off from the whole cluster).
#[derive(Debug)]
struct Slot {
    config: client::ClientConfig,
    child: Option<Child>,
    proxy: Proxy,
    others: Vec<Proxy>,
}

impl Slot {
    fn proxies(&self) -> impl Iterator<Item = &Proxy> {
        std::iter::once(&self.proxy).chain(&self.others)
    }

    fn black_hole(&self) {
        self.proxies().for_each(Proxy::black_hole);
    }

    fn drop_answers(&self) {
        self.proxies().for_each(Proxy::drop_answers);
    }

    fn heal(&self) {
        self.proxies().for_each(Proxy::heal);
    }
}

/// The runner's state shared by the fault tasks.
#[derive(Debug)]
struct Run {
    sink: Sink,
    slots: Vec<tokio::sync::Mutex<Slot>>,
    program: (PathBuf, Vec<String>),
    /// Clients a fault has cut off (a server fault's own cut must not heal them).
    cut: StdMutex<Cuts>,
    /// Which server the server faults strike, after promotions (Redis). Held by each server
    /// fault while it runs (one at a time: a slot has at most one).
    failover: tokio::sync::Mutex<Failover>,
}

/// Who is cut off: clients by their own faults, every client by a server fault that loses
/// state (no client may reach the server before the fault's end is recorded).
#[derive(Debug, Default)]
struct Cuts {
    /// Clients a client fault has cut off.
    clients: HashSet<usize>,
    /// A server fault has cut every client off ([`Run::black_out`]): a client fault that
    /// ends meanwhile leaves its client to [`Run::let_back`].
    blackout: bool,
}

/// A primary's replica (Redis) or standby (PostgreSQL), and the primary since the last
/// promotion.
#[derive(Debug, Default)]
struct Failover {
    /// The primary since the last promotion; `None` while it is the server the run was given.
    primary: Option<Server>,
    /// A replica of the current primary, attached to it, to promote next; `None` when the
    /// server's faults include no promotion.
    replica: Option<Server>,
    /// The proxy a PostgreSQL standby replicates through (refused to cut it off).
    link: Option<Proxy>,
}

impl Failover {
    /// Starts a replica of `server` if its faults include a promotion.
    async fn start(server: &Server) -> std::io::Result<Failover> {
        let promotes = |server: &Server| {
            server
                .faults()
                .iter()
                .any(|f| matches!(f, FaultKind::PromoteReplica(_)))
        };
        let (replica, link) = match server {
            Server::Redis(primary) if promotes(server) => (
                Some(Server::Redis(
                    replica_of(primary).await.map_err(std::io::Error::other)?,
                )),
                None,
            ),
            Server::Postgres(primary) if promotes(server) => {
                let (standby, link) = standby_of(primary).await.map_err(std::io::Error::other)?;
                (Some(Server::Postgres(standby)), Some(link))
            }
            _ => (None, None),
        };
        Ok(Failover {
            primary: None,
            replica,
            link,
        })
    }
}

/// A new Redis server made a replica of `primary` (`REPLICAOF` sent once it runs, rather than
/// given as an argument, so that once promoted a restart brings it back as a primary), once
/// it has synchronised.
async fn replica_of(
    primary: &crate::testing::RedisNode,
) -> Result<crate::testing::RedisNode, String> {
    let replica = crate::testing::RedisNode::start()
        .await
        .map_err(|e| e.to_string())?;
    let port = primary.port().to_string();
    replica
        .command::<()>("REPLICAOF", &["127.0.0.1", &port])
        .await
        .map_err(|e| e.to_string())?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let info: Result<String, _> = replica.command("INFO", &["replication"]).await;
        if info.is_ok_and(|i| i.contains("master_link_status:up")) {
            return Ok(replica);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "the replica on port {} did not synchronise with 127.0.0.1:{port} within 30 s",
                replica.port()
            ));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A new PostgreSQL standby of `primary`, replicating through a proxy (so that a failover
/// can cut it off first), once it has replayed everything `primary` had written.
async fn standby_of(
    primary: &crate::testing::PgNode,
) -> Result<(crate::testing::PgNode, Proxy), String> {
    let link = Proxy::start(&format!("127.0.0.1:{}", primary.port()))
        .await
        .map_err(|e| e.to_string())?;
    let standby = crate::testing::PgNode::start_standby_of(link.addr().port())
        .await
        .map_err(|e| e.to_string())?;
    standby
        .wait_replayed(primary)
        .await
        .map_err(|e| e.to_string())?;
    Ok((standby, link))
}

impl Run {
    fn spawn(&self, slot: &mut Slot) -> std::io::Result<()> {
        let mut child = Command::new(&self.program.0)
            .args(&self.program.1)
            .envs(slot.config.to_env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        if let Some(stdout) = child.stdout.take() {
            let sink = Arc::clone(&self.sink);
            let who = format!("c{}", slot.config.id);
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(event) = Event::parse(&line)
                        && event.who == who
                    {
                        sink.lock().unwrap_or_else(|p| p.into_inner()).push(event);
                    }
                }
            });
        }
        slot.child = Some(child);
        Ok(())
    }

    /// Records client `c` as dead if its process has ended without the runner killing it
    /// or asking it to stop (only ever called before either).
    fn note_death(sink: &Sink, c: usize, slot: &mut Slot) {
        if let Some(child) = slot.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            record(
                sink,
                "nemesis",
                What::Died {
                    client: format!("c{c}"),
                    status: status.to_string(),
                },
            );
        }
    }

    fn signal(slot: &Slot, signal: Signal) {
        if let Some(pid) = slot.child.as_ref().and_then(Child::id)
            && let Ok(pid) = i32::try_from(pid)
        {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }

    fn cuts(&self) -> std::sync::MutexGuard<'_, Cuts> {
        self.cut.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cuts every client off, until [`let_back`](Self::let_back): a server that restarts
    /// without its state, or from an earlier copy, must not be reached by anyone before the
    /// fault's end is recorded (the checker's epoch boundary), nor a flush seen before the
    /// kill. A client that a client fault cut off stays so, and is let back by whichever
    /// ends last; a client in a pause or a kill is cut off once that fault ended.
    async fn black_out(&self) {
        let spared: Vec<usize> = {
            let mut cuts = self.cuts();
            cuts.blackout = true;
            (0..self.slots.len())
                .filter(|c| !cuts.clients.contains(c))
                .collect()
        };
        for c in spared {
            self.slots[c].lock().await.black_hole();
        }
    }

    /// Ends [`black_out`](Self::black_out): every client not cut off by a fault of its own
    /// reaches the server again.
    async fn let_back(&self) {
        let back: Vec<usize> = {
            let mut cuts = self.cuts();
            cuts.blackout = false;
            (0..self.slots.len())
                .filter(|c| !cuts.clients.contains(c))
                .collect()
        };
        for c in back {
            self.slots[c].lock().await.heal();
        }
    }

    /// Waits until some client asked for a grant after `since` and was granted it (a write
    /// the store made after `since`, which that client saw), for at most `bound`.
    async fn granted_after(&self, since: u64, bound: Duration) {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let mut asked: HashMap<String, u64> = HashMap::new();
            let seen = self.events().iter().any(|e| match e.what {
                What::Acquire { .. } => {
                    asked.insert(e.who.clone(), e.at);
                    false
                }
                What::Granted { .. } => asked.get(&e.who).is_some_and(|&at| at > since),
                _ => false,
            });
            if seen || tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn events(&self) -> Vec<Event> {
        self.sink.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether every client was granted after `since`.
    fn all_granted_since(&self, since: u64) -> bool {
        let events = self.events();
        (0..self.slots.len()).all(|i| {
            let who = format!("c{i}");
            events
                .iter()
                .any(|e| e.who == who && e.at > since && matches!(e.what, What::Granted { .. }))
        })
    }
}

/// Runs the nemesis against `server` and checks the history.
///
/// # Errors
/// An I/O error starting the resource, a proxy, a client or (Redis) the replica to promote;
/// a fault the server could not carry out (a restart that failed), in words.
///
/// # Cancel safety
/// Dropping the future ends the run where it is: the client processes are killed with it
/// (`kill_on_drop`, and each dies with the runner), the proxies close, the Redis servers the
/// run started (replica, promoted primary) are removed; a fault in progress is not healed (a
/// paused server stays paused, a primary killed by a promotion stays down, until its fixture
/// is dropped).
pub async fn run(server: &Server, options: Options) -> std::io::Result<Report> {
    let sink: Sink = Arc::default();
    let resource = Resource::start(Arc::clone(&sink), options.bug).await?;
    let url = server.url();
    // The proxies stand for the server's address; a path after it (a ZooKeeper chroot, a
    // Redis database) goes after each proxy's, and of a ZooKeeper connect string's servers the
    // first is used.
    let rest = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    // A user (`postgres://user@host:port`) stays in each client's URL, not in the proxy's.
    let (userinfo, authority) = match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{user}@"), host),
        None => (String::new(), authority),
    };
    let upstream = authority.split(',').next().unwrap_or(authority).to_owned();
    // A cluster: a proxy per member for each client.
    let upstreams = server.members().unwrap_or_else(|| vec![upstream]);
    let path = if path.is_empty() {
        String::new()
    } else {
        format!("/{path}")
    };
    let prefix = format!("nemesis-{}-{}", options.seed, std::process::id());
    let program = match options.program.clone() {
        Some(p) => p,
        None => (std::env::current_exe()?, Vec::new()),
    };
    let mut slots = Vec::new();
    let mut clients = Vec::new();
    let mut locks = Vec::new();
    for recipe in Recipe::ALL {
        let lock = format!("{prefix}/{}", recipe.name());
        locks.push((lock.clone(), recipe));
        for _ in 0..options.clients_per_recipe {
            let id = slots.len();
            let mut proxies = Vec::new();
            for upstream in &upstreams {
                proxies.push(Proxy::start(upstream).await?);
            }
            // Every member, in member order, as the connect string lists them.
            let addrs =
                |f: fn(&Proxy) -> String| proxies.iter().map(f).collect::<Vec<_>>().join(",");
            let endpoint = match server.name() {
                "redis" => format!(
                    "redis://{userinfo}{}{path}",
                    addrs(|p| p.addr().to_string())
                ),
                "zookeeper" | "zookeeper-ensemble" => {
                    format!("zk://{}{path}", addrs(|p| p.addr().to_string()))
                }
                "postgres" => format!(
                    "postgres://{userinfo}{}{path}",
                    addrs(|p| p.addr().to_string())
                ),
                // A proxy per Sentinel; the primary is reached at the address they name.
                "redis-sentinel" => format!(
                    "{}://{userinfo}{}{path}",
                    url.split_once("://")
                        .map_or("redis+sentinel", |(scheme, _)| scheme),
                    addrs(|p| p.addr().to_string())
                ),
                _ => addrs(Proxy::endpoint),
            };
            let mut proxies = proxies.into_iter();
            let proxy = proxies
                .next()
                .ok_or_else(|| std::io::Error::other("the server has no address to proxy"))?;
            clients.push((format!("c{id}"), lock.clone()));
            slots.push(Slot {
                config: client::ClientConfig {
                    id,
                    incarnation: 0,
                    endpoint,
                    lock: lock.clone(),
                    recipe,
                    resource: resource.addr().to_string(),
                    ttl: options.ttl,
                    grace: if options.bug == Some(Bug::NoGrace) {
                        Duration::ZERO
                    } else {
                        options.ttl
                    },
                    seed: options.seed,
                    bug: options.bug,
                },
                child: None,
                proxy,
                others: proxies.collect(),
            });
        }
    }
    let plan = Plan {
        locks: locks.clone(),
        clients,
        progress_bound: options.progress_bound(),
        restart_grace: options.ttl,
    };
    record(
        &sink,
        "nemesis",
        What::Run {
            backend: server.name().to_owned(),
            seed: options.seed,
        },
    );
    for what in plan.to_events() {
        record(&sink, "nemesis", what);
    }
    let run = Arc::new(Run {
        sink: Arc::clone(&sink),
        slots: slots.into_iter().map(tokio::sync::Mutex::new).collect(),
        program,
        cut: StdMutex::default(),
        failover: tokio::sync::Mutex::new(Failover::start(server).await?),
    });
    let schedule = Schedule::new(server.name(), &server.faults(), &options);
    let outcome = drive(&run, server, &schedule, &options).await;
    // Whatever happened, every client ends: asked (stdin closed), then killed by its PID.
    let stopped = stop_clients(&run).await;
    // After a promotion, the state is on the promoted replica.
    let url = match &run.failover.lock().await.primary {
        Some(primary) => primary.url(),
        None => url,
    };
    let leftovers = if outcome.is_ok() {
        find_leftovers(server, &url, &locks, &options, &sink).await
    } else {
        Ok(())
    };
    let driven = outcome?;
    stopped?;
    leftovers?;
    drop(resource);
    let mut history = run.events();
    history.sort_by_key(|e| e.at);
    let violations = check(&history, &plan);
    let history_file = match &options.history_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            let path = dir.join(format!("{}-{}.history", server.name(), options.seed));
            let text: String = history.iter().map(|e| format!("{e}\n")).collect();
            std::fs::write(&path, text)?;
            Some(path)
        }
        None => None,
    };
    let missing_kinds = schedule
        .offered
        .iter()
        .copied()
        .filter(|k| !driven.done.iter().any(|(_, kind)| kind == k))
        .collect();
    Ok(Report {
        seed: options.seed,
        backend: server.name().to_owned(),
        faults: driven.done.into_iter().map(|(what, _)| what).collect(),
        skipped: driven.skipped,
        missing_kinds,
        clients_per_recipe: options.clients_per_recipe,
        recovery: recovery(&history, &plan),
        progress_bound: plan.progress_bound,
        history,
        violations,
        history_file,
    })
}

/// Checks a history saved by a run ([`Options::with_history_dir`]) again: with the checker
/// of this build, against the plan written at its head. A history is the evidence of a run;
/// the seed replays only its schedule, not the processes' interleaving.
///
/// # Errors
/// The file cannot be read, or it has no plan at its head (written before the plan was
/// saved, or not a history).
pub fn recheck(path: &std::path::Path) -> std::io::Result<Report> {
    let text = std::fs::read_to_string(path)?;
    let mut history: Vec<Event> = text.lines().filter_map(Event::parse).collect();
    history.sort_by_key(|e| e.at);
    let plan = Plan::from_history(&history).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: no nemesis plan at its head", path.display()),
        )
    })?;
    let (backend, seed) = history
        .iter()
        .find_map(|e| match &e.what {
            What::Run { backend, seed } => Some((backend.clone(), *seed)),
            _ => None,
        })
        .unwrap_or_else(|| ("?".to_owned(), 0));
    let words = |skipped: bool| {
        history
            .iter()
            .filter_map(|e| match &e.what {
                What::FaultStart { what, .. } if !skipped => Some(what.replace('_', " ")),
                What::FaultSkipped { what, .. } if skipped => Some(what.replace('_', " ")),
                _ => None,
            })
            .collect()
    };
    Ok(Report {
        seed,
        backend,
        faults: words(false),
        skipped: words(true),
        missing_kinds: Vec::new(),
        clients_per_recipe: plan.clients_per_recipe(),
        recovery: recovery(&history, &plan),
        progress_bound: plan.progress_bound,
        violations: check(&history, &plan),
        history,
        history_file: Some(path.to_owned()),
    })
}

/// What [`drive`] carried out: each fault's words and kind, and the words of those it left
/// out.
#[derive(Debug, Default)]
struct Driven {
    done: Vec<(String, &'static str)>,
    skipped: Vec<String>,
}

/// Starts the clients, waits for their first grants, carries out every fault of the schedule
/// (those its rule skips are recorded as skipped), then waits for every client to be granted
/// after the last heal (or the bound). The whole schedule, never cut short by the clock: the
/// faults carried out are a function of the seed.
async fn drive(
    run: &Arc<Run>,
    server: &Server,
    schedule: &Schedule,
    options: &Options,
) -> std::io::Result<Driven> {
    for slot in &run.slots {
        let mut slot = slot.lock().await;
        run.spawn(&mut slot)?;
    }
    // Every client granted once before the first fault (a Redis server's first use waits out
    // the restart grace), for at most the progress bound.
    let warm = tokio::time::Instant::now() + options.progress_bound();
    while !run.all_granted_since(0) && tokio::time::Instant::now() < warm {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut driven = Driven::default();
    for slot in &schedule.slots {
        tokio::time::sleep(slot.gap).await;
        let (left_out, carried): (Vec<&Fault>, Vec<&Fault>) = slot
            .faults
            .iter()
            .partition(|f| schedule.skipped.contains_key(&f.id));
        for fault in left_out {
            let what = fault.kind.describe(server.name());
            record(
                &run.sink,
                "nemesis",
                What::FaultSkipped {
                    id: fault.id,
                    what: what.clone(),
                },
            );
            driven.skipped.push(what);
        }
        let results =
            futures::future::join_all(carried.iter().map(|f| inject(run, server, f))).await;
        for (fault, result) in carried.iter().zip(results) {
            result.map_err(std::io::Error::other)?;
            driven
                .done
                .push((fault.kind.describe(server.name()), fault.kind.name()));
        }
    }
    record(&run.sink, "nemesis", What::Healed);
    let healed = now_ns();
    let bound = tokio::time::Instant::now() + options.progress_bound();
    while !run.all_granted_since(healed) && tokio::time::Instant::now() < bound {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(driven)
}

/// Carries out one fault, recording its start (and, for a fault that loses state, that it
/// does) and its end. A fault the server of the moment cannot carry out is an error: the
/// schedule's rule ([`schedule::skipped`]) should have left it out, and a run that skipped it
/// by what it found would no longer carry out what its seed plans.
async fn inject(run: &Run, server: &Server, fault: &Fault) -> Result<(), String> {
    let start = |run: &Run| {
        record(
            &run.sink,
            "nemesis",
            What::FaultStart {
                id: fault.id,
                what: fault.kind.describe(server.name()),
            },
        );
        if fault.kind.loses_state() {
            record(&run.sink, "nemesis", What::StateLost { id: fault.id });
        }
    };
    let end = |run: &Run| record(&run.sink, "nemesis", What::FaultEnd { id: fault.id });
    // A server fault strikes the primary of the moment (a promotion changes it), and holds it
    // meanwhile; a client fault beside it does not wait for it.
    let mut failover = if fault.kind.on_server() {
        Some(run.failover.lock().await)
    } else {
        None
    };
    if let (FaultKind::PromoteReplica(missed), Some(failover)) = (&fault.kind, &mut failover) {
        start(run);
        return promote(run, server, failover, *missed, fault.hold, || end(run)).await;
    }
    let server = failover
        .as_ref()
        .and_then(|f| f.primary.as_ref())
        .unwrap_or(server);
    if !server.can(&fault.kind) {
        return Err(format!(
            "fault {} ({}) cannot be carried out by the server of the moment, and the \
             schedule's rule did not leave it out",
            fault.id,
            fault.kind.describe(server.name())
        ));
    }
    match fault.kind {
        FaultKind::Pause(c) => {
            let slot = run.slots[c].lock().await;
            start(run);
            Run::signal(&slot, Signal::SIGSTOP);
            tokio::time::sleep(fault.hold).await;
            Run::signal(&slot, Signal::SIGCONT);
            end(run);
        }
        FaultKind::Kill(c) => {
            let mut slot = run.slots[c].lock().await;
            Run::note_death(&run.sink, c, &mut slot);
            start(run);
            Run::signal(&slot, Signal::SIGKILL);
            record(
                &run.sink,
                "nemesis",
                What::Killed {
                    client: format!("c{c}"),
                },
            );
            if let Some(mut child) = slot.child.take() {
                let _ = child.wait().await;
            }
            tokio::time::sleep(fault.hold).await;
            slot.config.incarnation += 1;
            run.spawn(&mut slot).map_err(|e| e.to_string())?;
            end(run);
        }
        FaultKind::Cut(c) | FaultKind::CutAnswers(c) | FaultKind::Expire(c) => {
            let slot = run.slots[c].lock().await;
            run.cuts().clients.insert(c);
            start(run);
            // An expiry is a cut held past the sessions' timeouts (the schedule's `hold`).
            if matches!(fault.kind, FaultKind::Cut(_) | FaultKind::Expire(_)) {
                slot.black_hole();
            } else {
                slot.drop_answers();
            }
            tokio::time::sleep(fault.hold).await;
            let blackout = {
                let mut cuts = run.cuts();
                cuts.clients.remove(&c);
                cuts.blackout
            };
            // A server fault that cut every client off lets this one back at its own end.
            if !blackout {
                slot.heal();
            }
            end(run);
        }
        FaultKind::ServerPause => {
            start(run);
            server.act(ServerAct::Pause).await?;
            tokio::time::sleep(fault.hold).await;
            server.act(ServerAct::Unpause).await?;
            end(run);
        }
        FaultKind::ServerRestart => {
            start(run);
            if server.name() == "redis" {
                // Redis keeps its data across a restart only in a snapshot: take it now.
                server.act(ServerAct::Save).await?;
            }
            server.act(ServerAct::Stop).await?;
            tokio::time::sleep(fault.hold).await;
            server.act(ServerAct::Start).await?;
            end(run);
        }
        FaultKind::ServerRestartEmpty => {
            start(run);
            // The clients must not see the store before its end is recorded (nor, on Redis,
            // the flush before the kill): cut them all off first, empty it (Redis: flush and
            // save the snapshot the restart loads; the others: wipe the stopped server's
            // data directory), kill, start, record the end, then let them back.
            run.black_out().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            if server.name() == "redis" {
                server.act(ServerAct::Flush).await?;
                server.act(ServerAct::Save).await?;
                server.act(ServerAct::Stop).await?;
            } else {
                server.act(ServerAct::Stop).await?;
                server.act(ServerAct::Wipe).await?;
            }
            tokio::time::sleep(fault.hold).await;
            server.act(ServerAct::Start).await?;
            end(run);
            run.let_back().await;
        }
        FaultKind::ServerRestartFromSnapshot => {
            start(run);
            server.act(ServerAct::SaveCopy(fault.id)).await?;
            let copied = now_ns();
            tokio::time::sleep(fault.lead).await;
            // Only a client that saw the store past the copy can tell that it went back
            // (docs/reliability.md): let one be granted after the copy first (a write the copy
            // does not have), for at most a progress bound's worth of TTLs.
            run.granted_after(copied, Duration::from_secs(20)).await;
            run.black_out().await;
            server.act(ServerAct::Stop).await?;
            server.act(ServerAct::RestoreCopy(fault.id)).await?;
            tokio::time::sleep(fault.hold).await;
            server.act(ServerAct::Start).await?;
            end(run);
            run.let_back().await;
        }
        FaultKind::Flush => {
            start(run);
            server.act(ServerAct::Flush).await?;
            end(run);
        }
        FaultKind::FollowerPause(_)
        | FaultKind::LeaderPause
        | FaultKind::MemberRestart(_)
        | FaultKind::LeaderRestart => cluster::inject(server, fault, &run.sink).await?,
        FaultKind::ServerCrash => {
            start(run);
            server.act(ServerAct::Crash).await?;
            tokio::time::sleep(fault.hold).await;
            server.act(ServerAct::Start).await?;
            end(run);
        }
        FaultKind::KillConnections => {
            start(run);
            server.act(ServerAct::EndConnections).await?;
            end(run);
        }
        FaultKind::SentinelFailover | FaultKind::PrimaryKilled | FaultKind::PrimaryPaused => {
            let Server::RedisSentinel(redis) = server else {
                return Err(format!(
                    "fault {} needs Redis under Sentinel, not {}",
                    fault.id,
                    server.name()
                ));
            };
            sentinel::inject(run, redis, fault, start, end).await?;
        }
        // Carried out above.
        FaultKind::PromoteReplica(_) => {}
    }
    Ok(())
}

/// A failover: cuts the replica (Redis) or standby (PostgreSQL) off from the primary for
/// `missed` (it misses what is written meanwhile), kills the primary (for good: two primaries
/// serving at once, split brain, is what neither backend's doc promises; PostgreSQL's with an
/// immediate shutdown, a crash), promotes the replica `hold` later, calls `end` (every grant
/// of the old primary was made before, every grant of the new epoch comes after: the
/// checker's boundary), sends every client to the new primary and starts a fresh replica of
/// it for the next promotion.
async fn promote(
    run: &Run,
    given: &Server,
    failover: &mut Failover,
    missed: Duration,
    hold: Duration,
    end: impl FnOnce(),
) -> Result<(), String> {
    // The fixture's error, in words.
    fn e(e: impl std::fmt::Display) -> String {
        e.to_string()
    }
    let old = failover.primary.as_ref().unwrap_or(given);
    let port = match &failover.replica {
        Some(Server::Redis(replica)) => {
            if !missed.is_zero() {
                replica.detach().await.map_err(e)?;
                tokio::time::sleep(missed).await;
            }
            old.act(ServerAct::Stop).await?;
            tokio::time::sleep(hold).await;
            replica.promote().await.map_err(e)?;
            replica.port()
        }
        Some(Server::Postgres(standby)) => {
            if !missed.is_zero() {
                if let Some(link) = &failover.link {
                    link.refuse().map_err(|e| e.to_string())?;
                }
                tokio::time::sleep(missed).await;
            }
            old.act(ServerAct::Crash).await?;
            tokio::time::sleep(hold).await;
            standby.promote().await.map_err(e)?;
            standby.port()
        }
        _ => return Err("a promotion needs a Redis replica or a PostgreSQL standby".to_owned()),
    };
    end();
    // A client whose own fault holds its slot moves when that fault ends: it cannot reach
    // anyone meanwhile anyway (or, cut off one way, only the dead primary).
    let to = format!("127.0.0.1:{port}");
    let mut busy = Vec::new();
    for (c, slot) in run.slots.iter().enumerate() {
        match slot.try_lock() {
            Ok(slot) => slot.proxy.redirect(&to).map_err(|e| e.to_string())?,
            Err(_) => busy.push(c),
        }
    }
    for c in busy {
        let slot = run.slots[c].lock().await;
        slot.proxy.redirect(&to).map_err(|e| e.to_string())?;
    }
    // The old primary, if the run started it, goes (it is stopped already); the server the
    // run was given stays stopped until its owner drops it.
    let (next, link) = match &failover.replica {
        Some(Server::Redis(replica)) => (Server::Redis(replica_of(replica).await?), None),
        Some(Server::Postgres(standby)) => {
            let (next, link) = standby_of(standby).await?;
            (Server::Postgres(next), Some(link))
        }
        _ => return Err("a promotion needs a Redis replica or a PostgreSQL standby".to_owned()),
    };
    failover.primary = failover.replica.replace(next);
    failover.link = link;
    Ok(())
}

/// Asks every client to stop (closes its standard input), waits up to 15 s for each, then
/// kills what is left by its PID.
async fn stop_clients(run: &Run) -> std::io::Result<()> {
    record(&run.sink, "nemesis", What::Stopping);
    for (c, slot) in run.slots.iter().enumerate() {
        let mut slot = slot.lock().await;
        Run::note_death(&run.sink, c, &mut slot);
        Run::signal(&slot, Signal::SIGCONT);
        if let Some(child) = slot.child.as_mut() {
            drop(child.stdin.take());
        }
    }
    for (i, slot) in run.slots.iter().enumerate() {
        let mut slot = slot.lock().await;
        let Some(mut child) = slot.child.take() else {
            continue;
        };
        if tokio::time::timeout(Duration::from_secs(15), child.wait())
            .await
            .is_err()
        {
            child.start_kill()?;
            record(
                &run.sink,
                "nemesis",
                What::Killed {
                    client: format!("c{i}"),
                },
            );
            child.wait().await?;
        }
    }
    Ok(())
}

/// Once every client stopped: waits until no lock has an entry (a killed client's lease ends
/// within its TTL), for at most two TTLs, the restart grace and 5 s; records what is left.
async fn find_leftovers(
    server: &Server,
    url: &str,
    locks: &[(String, Recipe)],
    options: &Options,
    sink: &Sink,
) -> std::io::Result<()> {
    let connect = crate::ConnectOptions::new().with_restart_grace(options.ttl);
    let backend = crate::connect_with(url, connect).await.map_err(|e| {
        std::io::Error::other(format!("{} for the leftover check: {e}", server.name()))
    })?;
    let deadline = tokio::time::Instant::now() + options.ttl * 3 + Duration::from_secs(5);
    loop {
        let mut left = Vec::new();
        for (lock, _) in locks {
            match backend.entries(lock).await {
                Ok(entries) => left.extend(
                    entries
                        .into_iter()
                        .map(|e| (lock.clone(), e.key().to_owned())),
                ),
                Err(e) => left.push((lock.clone(), format!("(read failed: {e})"))),
            }
        }
        if left.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            for (lock, key) in left {
                record(sink, "nemesis", What::Leftover { lock, key });
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_clients_than_permits_by_default() {
        let options = Options::new(30, 1);
        assert!(options.clients_per_recipe() > Recipe::SEMAPHORE_PERMITS as usize);
        assert_eq!(options.clients_per_recipe(), DEFAULT_CLIENTS_PER_RECIPE);
        assert_eq!(options.with_clients_per_recipe(0).clients_per_recipe(), 1);
    }

    #[test]
    fn a_seed_plans_the_same_faults_every_time_and_draws_from_every_client() {
        let options = Options::new(60, 7);
        let a = schedule("zookeeper-ensemble", &options).expect("a backend");
        let b = schedule("zookeeper-ensemble", &options).expect("a backend");
        assert_eq!(a.faults, b.faults);
        assert_eq!(a.planned, b.planned);
        assert!(
            a.planned >= Duration::from_secs(60),
            "the plan fills its window"
        );
        // Every client of the four recipes can be drawn, none beyond.
        let clients = options.clients_per_recipe() * Recipe::ALL.len();
        let targets: HashSet<usize> = (0..200)
            .filter_map(|seed| schedule("redis", &Options::new(60, seed)))
            .flat_map(|s| s.slots)
            .flat_map(|slot| slot.faults)
            .filter_map(|f| f.kind.client())
            .collect();
        assert_eq!(targets, (0..clients).collect());
        assert!(schedule("consul", &options).is_none());
    }

    #[test]
    fn drawn_and_missing_kinds_split_what_the_server_offers() {
        for seed in 0..30 {
            let s = schedule("postgres", &Options::new(30, seed)).expect("a backend");
            let (drawn, missing) = (s.drawn(), s.missing());
            assert_eq!(drawn.len() + missing.len(), s.offered.len());
            assert!(drawn.iter().all(|k| !missing.contains(k)));
            // A kind counts as drawn only if some fault of it is carried out.
            for k in &drawn {
                assert!(s.faults.iter().any(|f| f.kind == *k && f.skipped.is_none()));
            }
            for f in s.faults.iter().filter(|f| f.skipped.is_some()) {
                let promoted_before = s
                    .faults
                    .iter()
                    .any(|p| p.kind == "promote-replica" && p.id < f.id);
                assert!(promoted_before, "seed {seed}: {f:?}");
            }
        }
    }
}
