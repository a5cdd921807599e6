//! The nemesis on real servers (issue #26): client processes on every recipe while a seeded
//! schedule pauses, kills and cuts them off, restarts, rolls back or flushes the server,
//! (Redis) promotes its replica, (on a cluster) pauses a follower or the leader and kills and
//! restarts a member or the leader, (ZooKeeper) expires their sessions, (PostgreSQL) crashes
//! the server, ends their connections or promotes its standby, and (etcd, ZooKeeper,
//! PostgreSQL) restarts the server without its data or (etcd, PostgreSQL) from an earlier
//! copy; the checker reads the one history. This file has its own `main` (`harness =
//! false`): the same binary, run again with `BATON_NEMESIS_CLIENT` set, is each client
//! process.
//!
//! - `cargo test --test nemesis --features nemesis`: the short
//!   runs CI makes, with fixed seeds (each single server, a three-member etcd cluster, a
//!   three-server ZooKeeper ensemble); then the same with a defect injected, which the
//!   checker must catch.
//! - `cargo test ... -- BACKEND SECONDS [SEED]` (`just nemesis`): one run, its history kept in
//!   `target/nemesis/`; `-- check FILE` (`just nemesis-check FILE`) checks a saved history
//!   again. `BATON_NEMESIS_BUG=admit-lower`, `read-before-claim` or `no-grace`
//!   injects a defect.

use std::process::ExitCode;

use baton::testing::nemesis::{self, Bug, Options, Report, Server};
use baton::testing::{EtcdCluster, EtcdNode, PgNode, RedisNode, ZkEnsemble, ZkNode};

/// What `BACKEND` may be: one server each (PostgreSQL too), a three-member etcd cluster, a
/// three-server ZooKeeper ensemble.
const BACKENDS: [&str; 6] = [
    "etcd",
    "redis",
    "zookeeper",
    "etcd-cluster",
    "zookeeper-ensemble",
    "postgres",
];

fn main() -> ExitCode {
    if let Some(code) = nemesis::client_if_requested() {
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        match args.as_slice() {
            [backend, seconds, rest @ ..]
                if BACKENDS.contains(&backend.as_str()) && seconds.parse::<u64>().is_ok() =>
            {
                let seconds = seconds.parse().unwrap_or(30);
                let seed = match rest.first() {
                    Some(s) => s.parse().expect("SEED is a number"),
                    None => std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(1, |d| d.as_secs()),
                };
                let bug = std::env::var("BATON_NEMESIS_BUG")
                    .ok()
                    .map(|b| Bug::parse(&b).expect("a known BATON_NEMESIS_BUG"));
                let report = one(backend, seconds, seed, bug).await;
                println!("{}", report.summary());
                if report.violations.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            [check, file] if check == "check" => match nemesis::recheck(std::path::Path::new(file))
            {
                Ok(report) => {
                    println!("{}", report.summary());
                    if report.violations.is_empty() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("nemesis check: {e}");
                    ExitCode::from(2)
                }
            },
            [] => suite().await,
            // A test-name filter meant for the other test binaries (`cargo test NAME`):
            // nothing here matches it, as libtest would say.
            _ => {
                println!("nemesis: no run for {args:?} (usage: BACKEND SECONDS [SEED])");
                ExitCode::SUCCESS
            }
        }
    })
}

async fn one(backend: &str, seconds: u64, seed: u64, bug: Option<Bug>) -> Report {
    let options = Options::new(seconds, seed)
        .with_bug(bug)
        .with_history_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/target/nemesis"));
    let server = match backend {
        // Their data on the host, so that the nemesis can wipe or restore it.
        "etcd" => Server::Etcd(EtcdNode::start_with_host_data().await.expect("etcd")),
        "redis" => Server::Redis(RedisNode::start().await.expect("redis")),
        "zookeeper" => Server::ZooKeeper(ZkNode::start_with_host_data().await.expect("zookeeper")),
        "postgres" => Server::Postgres(PgNode::start_with_host_data(&[]).await.expect("postgres")),
        "etcd-cluster" => Server::EtcdCluster(EtcdCluster::start().await.expect("etcd cluster")),
        "zookeeper-ensemble" => {
            Server::ZkEnsemble(ZkEnsemble::start().await.expect("zookeeper ensemble"))
        }
        other => panic!("unknown backend {other}: one of {BACKENDS:?}"),
    };
    nemesis::run(&server, options)
        .await
        .expect("the nemesis runs")
}

/// The runs CI makes: each backend with a fixed seed must find nothing; with the fence
/// broken, the checker must find the stale writes.
async fn suite() -> ExitCode {
    let mut failed = false;
    // Redis seed 8: restarts with data, a pause, a replica promoted after missing 1 s of
    // writes and one promoted in sync, beside client faults. etcd seed 1: a pause, restarts
    // with its data, without it (wiped) and from an older snapshot. ZooKeeper seed 1: a
    // pause, a restart with its data and one without, expiries. The clusters' seeds draw all
    // four member faults (a follower and the leader paused, a member and the leader killed
    // and restarted) in their windows; the ensemble's also an expiry. PostgreSQL seed 57
    // draws it re-created without its data and restored from a base backup (both before the
    // first promotion, after which its data is a standby's), a crash, a restart, a pause,
    // ended connections, and a standby promoted in sync and one after missing 2.5 s of
    // writes.
    for (backend, seconds, seed) in [
        ("etcd", 60, 1),
        ("redis", 60, 8),
        ("zookeeper", 60, 1),
        ("etcd-cluster", 60, 4),
        ("zookeeper-ensemble", 60, 8),
        ("postgres", 60, 57),
    ] {
        let report = one(backend, seconds, seed, None).await;
        println!("{}", report.summary());
        if !report.violations.is_empty() {
            println!("FAILED: {backend} seed {seed} found violations");
            failed = true;
        }
    }
    let broken = one("redis", 30, 3, Some(Bug::AdmitLower)).await;
    println!("{}", broken.summary());
    if !broken
        .violations
        .iter()
        .any(|v| v.rule == "fence" || v.rule == "counter")
    {
        println!("FAILED: the checker missed the broken fence (seed 3)");
        failed = true;
    }
    // Without the restart grace, a promoted standby grants at once (seed 7 promotes one within
    // 12 s; seed 5 did before the state-loss faults joined PostgreSQL's schedule): the checker
    // must see grants of the new timeline made within the grace.
    let graceless = one("postgres", 12, 7, Some(Bug::NoGrace)).await;
    println!("{}", graceless.summary());
    if !graceless.violations.iter().any(|v| v.rule == "epoch") {
        println!("FAILED: the checker missed grants within the restart grace (postgres seed 7)");
        failed = true;
    }
    // Nor after etcd restarted without its data (seed 1 wipes it 3 s in): the checker must
    // see grants of the new epoch made within the grace.
    let wiped = one("etcd", 12, 1, Some(Bug::NoGrace)).await;
    println!("{}", wiped.summary());
    if !wiped.violations.iter().any(|v| v.rule == "epoch") {
        println!("FAILED: the checker missed grants within the restart grace (etcd seed 1)");
        failed = true;
    }
    // The saved history, checked again, shows the same violations.
    let again = broken
        .history_file
        .as_deref()
        .map(nemesis::recheck)
        .map(|r| {
            r.map(|r| {
                r.violations
                    .iter()
                    .map(|v| v.message.clone())
                    .collect::<Vec<_>>()
            })
        });
    let found: Vec<String> = broken
        .violations
        .iter()
        .map(|v| v.message.clone())
        .collect();
    match again {
        Some(Ok(messages)) if messages == found => {}
        other => {
            println!("FAILED: the saved history checked again differs: {other:?}");
            failed = true;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
