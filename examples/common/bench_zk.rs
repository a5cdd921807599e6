//! The ZooKeeper part of the benchmark harness (`just bench`; `--only zookeeper` runs it
//! alone): baton's Mutex on one ZooKeeper server beside kazoo's `Lock` and Curator's
//! `InterProcessMutex` (the peer programs of tests/peers, in their `--bench` mode) at each N,
//! with the watches the server fired per release (from `mntr`), then a queue of waiters for
//! baton's client memory per waiter; it writes the `## ZooKeeper` section.
//!
//! A child module of examples/bench.rs: it measures with the harness's own samples,
//! percentiles and heap counter.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use baton::testing::ZkNode;
use baton::{Mutex, Session, ZkBackend, ZkOptions};
use tokio::time::Instant;

use super::{Res, Samples, drain, held, live_bytes, ms, open_sessions, queue_in_order, rss_bytes};

/// Every contended configuration releases as soon as it is granted.
const HOLD: Duration = Duration::ZERO;

/// The queue's waiters are sessions, each a connection and a server-side session: fewer than
/// the other sections' 10,000 (opening and queueing 1,000 took 11 s here, 500 keep the
/// section within a minute).
const MAX_WAITERS: usize = 500;

/// The peers' launchers, as `scripts/install-peers.sh` builds them.
const KAZOO_PEER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/target/peers/kazoo-peer");
const CURATOR_PEER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/target/peers/curator-peer");

/// The `mntr` summaries of the watches one change fired, by the event it fired (each has
/// `zk_sum_<name>`, `zk_cnt_<name>` and `zk_max_<name>`): ZooKeeper adds the number of
/// watchers an event triggered, only when it triggered any.
const WATCH_SUMMARIES: [&str; 4] = [
    "node_created_watch_count",
    "node_deleted_watch_count",
    "node_changed_watch_count",
    "node_children_watch_count",
];

/// The server's `mntr`, as numbers (non-numeric values are left out).
async fn mntr(node: &ZkNode) -> Res<HashMap<String, f64>> {
    let answer = node.four_letter("mntr").await?;
    Ok(answer
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('\t')?;
            Some((k.trim().to_owned(), v.trim().parse().ok()?))
        })
        .collect())
}

/// The connections open on the server.
async fn alive(node: &ZkNode) -> Res<f64> {
    Ok(mntr(node)
        .await?
        .get("zk_num_alive_connections")
        .copied()
        .unwrap_or(0.0))
}

/// Zeroes the server's statistics and metrics (`srst`), so that `mntr` then counts one run.
async fn reset(node: &ZkNode) -> Res<()> {
    let answer = node.four_letter("srst").await?;
    if !answer.contains("reset") {
        return Err(format!("srst answered {answer:?}").into());
    }
    Ok(())
}

/// What the server counted since the last [`reset`].
#[derive(Default, Clone, Copy)]
struct Server {
    /// Watches fired, all events together.
    watches: f64,
    /// The most watches one event fired.
    most_per_event: f64,
    /// Packets received (requests, pings and connects).
    packets: f64,
}

async fn server(node: &ZkNode) -> Res<Server> {
    let m = mntr(node).await?;
    let get = |k: String| m.get(&k).copied().unwrap_or(0.0);
    Ok(Server {
        watches: WATCH_SUMMARIES
            .iter()
            .map(|s| get(format!("zk_sum_{s}")))
            .sum(),
        most_per_event: WATCH_SUMMARIES
            .iter()
            .map(|s| get(format!("zk_max_{s}")))
            .fold(0.0, f64::max),
        packets: get("zk_packets_received".to_owned()),
    })
}

/// The CPU time the server's container has used so far, in seconds (`None` when the server
/// is not in a container or its cgroup cannot be read).
fn server_cpu_seconds(node: &ZkNode) -> Option<f64> {
    crate::container_cpu_seconds(node.container_id()?)
}

/// One contended run, of baton or of a peer.
struct ZkRun {
    impl_name: String,
    n: usize,
    /// Cycles completed inside the window.
    cycles: u64,
    cycles_per_s: f64,
    /// baton only: the peers do not report it.
    acquire: Option<(Duration, Duration)>,
    handoff_p50: Duration,
    handoff_p99: Duration,
    handoff_max: Duration,
    per_contender_min: u64,
    per_contender_max: u64,
    /// Every release, the last one of each contender (past the window) included.
    releases: u64,
    server: Server,
    /// The server's CPU seconds during the run (its container's cgroup), if known.
    server_cpu: Option<f64>,
    /// Peers only: the process's largest resident set seen during the run.
    peak_rss: Option<u64>,
}

impl ZkRun {
    fn watches_per_release(&self) -> f64 {
        self.server.watches / self.releases.max(1) as f64
    }

    fn packets_per_cycle(&self) -> f64 {
        self.server.packets / self.cycles.max(1) as f64
    }

    fn is_baton(&self) -> bool {
        self.impl_name.starts_with("baton")
    }
}

/// A peer that did not run, and why.
struct Skipped {
    peer: &'static str,
    n: usize,
    why: String,
}

/// baton: `n` contenders, each with its own session (a ZooKeeper session, its own connection)
/// on one backend, in the peers' bench protocol: each loops lock, unlock until the window
/// ends; the acquisition that finds the window over is released and not counted.
async fn baton_contended(
    node: &ZkNode,
    n: usize,
    secs: Duration,
    name: &str,
    label: &str,
) -> Res<ZkRun> {
    let backend = ZkBackend::connect(&node.connect_string(), ZkOptions::new()).await?;
    let sessions = futures::future::join_all((0..n).map(|_| Session::new(backend.clone())))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let mutexes = sessions
        .iter()
        .map(|s| Mutex::new(s, name))
        .collect::<Result<Vec<_>, _>>()?;
    let samples = Arc::new(StdMutex::new(Samples::default()));
    reset(node).await?;
    let cpu0 = server_cpu_seconds(node);
    let start = Instant::now();
    let deadline = start + secs;
    let tasks: Vec<_> = mutexes
        .into_iter()
        .map(|mutex| {
            let samples = Arc::clone(&samples);
            tokio::spawn(async move {
                let mut cycles = 0u64;
                loop {
                    let asked = Instant::now();
                    let guard = mutex.lock().await?;
                    if Instant::now() >= deadline {
                        guard.release().await?;
                        return Res::Ok(cycles);
                    }
                    samples.lock().unwrap().granted(asked);
                    cycles += 1;
                    held(&samples, HOLD).await;
                    guard.release().await?;
                }
            })
        })
        .collect();
    let mut per_contender = Vec::with_capacity(n);
    for t in tasks {
        per_contender.push(t.await??);
    }
    let server = server(node).await?;
    let server_cpu = server_cpu_seconds(node).zip(cpu0).map(|(a, b)| a - b);
    futures::future::join_all(sessions.iter().map(Session::close)).await;
    let mut s = std::mem::take(&mut *samples.lock().unwrap());
    s.acquire.sort();
    s.handoff.sort();
    let cycles: u64 = per_contender.iter().sum();
    Ok(ZkRun {
        impl_name: label.to_owned(),
        n,
        cycles,
        cycles_per_s: cycles as f64 / secs.as_secs_f64(),
        acquire: Some((super::pct(&s.acquire, 0.5), super::pct(&s.acquire, 0.99))),
        handoff_p50: super::pct(&s.handoff, 0.5),
        handoff_p99: super::pct(&s.handoff, 0.99),
        handoff_max: s.handoff.last().copied().unwrap_or_default(),
        per_contender_min: per_contender.iter().min().copied().unwrap_or(0),
        per_contender_max: per_contender.iter().max().copied().unwrap_or(0),
        releases: cycles + n as u64,
        server,
        server_cpu,
        peak_rss: None,
    })
}

/// The resident set of process `pid`, in bytes.
fn rss_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
}

/// Runs a peer's launcher with `args` and `stdin`, sampling its resident set every 50 ms;
/// returns its stdout and the largest resident set seen.
async fn run_peer(launcher: &str, args: &[String], stdin: &str) -> Res<(String, u64)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut child = tokio::process::Command::new(launcher)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().unwrap_or(0);
    let mut input = child.stdin.take().ok_or("no stdin")?;
    input.write_all(stdin.as_bytes()).await?;
    // Kept open: the peers end 10 s after end of input even if a command still runs.
    let mut out = child.stdout.take().ok_or("no stdout")?;
    let mut err = child.stderr.take().ok_or("no stderr")?;
    let reading = tokio::spawn(async move {
        let (mut o, mut e) = (String::new(), String::new());
        let _ = tokio::join!(out.read_to_string(&mut o), err.read_to_string(&mut e));
        (o, e)
    });
    let mut peak = 0;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        peak = peak.max(rss_of(pid).unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    drop(input);
    let (stdout, stderr) = reading.await?;
    if !status.success() {
        let last = stdout.lines().last().unwrap_or("");
        let tail: String = stderr.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
        return Err(format!("{launcher} exited with {status}: {last} {tail}").into());
    }
    Ok((stdout, peak))
}

/// A peer's `--bench n` on `path`, for `secs`.
async fn peer_contended(
    node: &ZkNode,
    peer: &'static str,
    launcher: &str,
    n: usize,
    secs: Duration,
    path: &str,
) -> Res<ZkRun> {
    let args = [
        "--connect".to_owned(),
        node.connect_string(),
        "--path".to_owned(),
        path.to_owned(),
        "--bench".to_owned(),
        n.to_string(),
        "--seconds".to_owned(),
        secs.as_secs_f64().to_string(),
    ];
    reset(node).await?;
    let cpu0 = server_cpu_seconds(node);
    let (stdout, peak) = run_peer(launcher, &args, "").await?;
    let server = server(node).await?;
    let server_cpu = server_cpu_seconds(node).zip(cpu0).map(|(a, b)| a - b);
    let line = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| format!("{peer}: no JSON line in {stdout:?}"))?;
    let j: serde_json::Value = serde_json::from_str(line)?;
    let num = |k: &str| j.get(k).and_then(serde_json::Value::as_f64).unwrap_or(0.0);
    let dur = |k: &str| Duration::from_secs_f64(num(k).max(0.0) / 1000.0);
    let cycles = num("cycles") as u64;
    Ok(ZkRun {
        impl_name: peer.to_owned(),
        n,
        cycles,
        cycles_per_s: num("cycles_per_s"),
        acquire: None,
        handoff_p50: dur("handoff_p50_ms"),
        handoff_p99: dur("handoff_p99_ms"),
        handoff_max: dur("handoff_max_ms"),
        per_contender_min: num("per_contender_min") as u64,
        per_contender_max: num("per_contender_max") as u64,
        // Each contender's last acquisition, past the window, is released and not counted.
        releases: cycles + n as u64,
        server,
        server_cpu,
        peak_rss: Some(peak),
    })
}

/// A peer's `version` answer, e.g. `kazoo 2.11.0` or `curator 5.4.0 zookeeper 3.8.0`.
async fn peer_version(node: &ZkNode, launcher: &str, path: &str) -> Res<String> {
    let args = [
        "--connect".to_owned(),
        node.connect_string(),
        "--path".to_owned(),
        path.to_owned(),
    ];
    let (stdout, _) = run_peer(launcher, &args, "version\nquit\n").await?;
    Ok(stdout
        .lines()
        .find_map(|l| l.strip_prefix("version "))
        .unwrap_or("?")
        .to_owned())
}

#[derive(Default)]
struct Scale {
    waiters: usize,
    /// Live heap per waiter, all included (session, lock task, queue entry, wait).
    heap_per_waiter: f64,
    /// Of which opening the session (its ZooKeeper session and connection, before any
    /// request on it).
    heap_per_session: f64,
    rss_per_waiter: f64,
    connections: f64,
    queue_time: Duration,
    drain_time: Duration,
    /// Watches the server fired during the drain.
    watches: f64,
    most_per_event: f64,
    fifo: bool,
}

/// `waiters` waiters, each with its own session, queued behind a holder on one backend, then
/// drained: each releases as soon as it is granted.
async fn scale(node: &ZkNode, waiters: usize, name: &str) -> Res<Scale> {
    let backend = ZkBackend::connect(&node.connect_string(), ZkOptions::new()).await?;
    let holder = Session::new(backend.clone()).await?;
    let guard = Mutex::new(&holder, name)?.lock().await?;
    let connections0 = alive(node).await?;
    let (rss0, heap0) = (rss_bytes(), live_bytes());
    let started = Instant::now();
    let sessions = open_sessions(&backend, waiters).await?;
    let heap_sessions = live_bytes();
    let mut rx = queue_in_order(&sessions, name, || async {
        Ok(baton::backend::Backend::entries(&backend, name)
            .await?
            .len())
    })
    .await?;
    let queue_time = started.elapsed();
    let (rss1, heap1) = (rss_bytes(), live_bytes());
    let connections = alive(node).await? - connections0;
    reset(node).await?;
    let drain_start = Instant::now();
    guard.release().await?;
    let tokens = drain(&mut rx, waiters).await?;
    let drain_time = drain_start.elapsed();
    let server = server(node).await?;
    futures::future::join_all(sessions.iter().map(Session::close)).await;
    holder.close().await?;
    Ok(Scale {
        waiters,
        heap_per_waiter: (heap1 - heap0) as f64 / waiters as f64,
        heap_per_session: (heap_sessions - heap0) as f64 / waiters as f64,
        rss_per_waiter: rss1.saturating_sub(rss0) as f64 / waiters as f64,
        connections,
        queue_time,
        drain_time,
        watches: server.watches,
        most_per_event: server.most_per_event,
        fifo: tokens.windows(2).all(|w| w[0] < w[1]),
    })
}

/// What the ZooKeeper part measured, for its section of docs/performance.md.
pub(super) struct Report {
    server_version: String,
    secs: Duration,
    wall: Duration,
    peers: Vec<(&'static str, String)>,
    runs: Vec<ZkRun>,
    skipped: Vec<Skipped>,
    scale: Scale,
}

/// Starts one ZooKeeper server (a container on 127.0.0.1) and measures on it: baton, kazoo
/// and Curator at each of `ns` contenders for `secs` each, then `waiters` (at most 500)
/// waiters on one baton lock.
pub(super) async fn run(secs: Duration, ns: &[usize], waiters: usize) -> Res<Report> {
    let started = Instant::now();
    // Durable, as ZooKeeper ships: every transaction's log write is fsynced before it is
    // acknowledged (the fixture turns that off for tests).
    let node = ZkNode::start_with(&["forceSync=yes"]).await?;
    let prefix = format!("bench-{}", std::process::id());
    let mut peers = Vec::new();
    let mut skipped = Vec::new();
    for (peer, launcher) in [("kazoo", KAZOO_PEER), ("Curator", CURATOR_PEER)] {
        if !Path::new(launcher).exists() {
            skipped.push(Skipped {
                peer,
                n: 0,
                why: format!("{launcher} is missing (scripts/install-peers.sh builds it)"),
            });
            continue;
        }
        match peer_version(&node, launcher, &format!("/{prefix}/version")).await {
            Ok(version) => peers.push((peer, version)),
            Err(e) => skipped.push(Skipped {
                peer,
                n: 0,
                why: e.to_string(),
            }),
        }
    }
    // The server's JVM compiles its hot paths during the first seconds of load: a run that
    // is not reported comes first, so that the first configuration measured (baton at the
    // smallest N) does not pay for it alone.
    eprintln!("bench: ZooKeeper, warming the server up");
    baton_contended(&node, 8, secs, &format!("{prefix}/warm-up"), "warm-up").await?;
    let mut runs = Vec::new();
    for &n in ns {
        eprintln!("bench: ZooKeeper, N = {n}");
        let baton_path = format!("{prefix}/n{n}/baton");
        runs.push(baton_contended(&node, n, secs, &baton_path, "baton").await?);
        for (peer, _) in &peers {
            let launcher = if *peer == "kazoo" {
                KAZOO_PEER
            } else {
                CURATOR_PEER
            };
            let path = format!("/{prefix}/n{n}/{}", peer.to_lowercase());
            match peer_contended(&node, peer, launcher, n, secs, &path).await {
                Ok(run) => runs.push(run),
                Err(e) => skipped.push(Skipped {
                    peer,
                    n,
                    why: e.to_string(),
                }),
            }
        }
        // baton once more after the peers: the machine's speed drifts, and a verdict
        // against peers measured between two baton runs does not ride on the drift.
        if !peers.is_empty() {
            runs.push(baton_contended(&node, n, secs, &baton_path, "baton, again").await?);
        }
    }
    let waiters = waiters.min(MAX_WAITERS);
    eprintln!("bench: ZooKeeper, {waiters} waiters");
    let scale = scale(&node, waiters, &format!("{prefix}/scale")).await?;
    let server_version = node
        .four_letter("mntr")
        .await?
        .lines()
        .find_map(|l| l.strip_prefix("zk_version\t"))
        .map_or("?", |v| v.split(['-', ',']).next().unwrap_or("?"))
        .to_owned();
    Ok(Report {
        server_version,
        secs,
        wall: started.elapsed(),
        peers,
        runs,
        skipped,
        scale,
    })
}

fn mib(bytes: u64) -> String {
    format!("{:.0}", bytes as f64 / (1024.0 * 1024.0))
}

impl Report {
    pub(super) fn markdown(&self) -> String {
        let peers = if self.peers.is_empty() {
            "no peer could run (see below)".to_owned()
        } else {
            self.peers
                .iter()
                .map(|(p, v)| format!("{p} (`version {v}`)"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut md = format!(
            "## ZooKeeper\n\nOne ZooKeeper {} server in a container on 127.0.0.1 (Debian's package, standalone, tick 200 ms, durable as ZooKeeper ships: `forceSync=yes`, each transaction's log write fsynced before it is acknowledged), started for this run, on the same machine as the clients; {:.0} s for the section. Each configuration ran {:.0} s, hold 0 ms, on a path of its own. Beside baton (one `ZkBackend`, Curator's layout; **each contender with its own `Session`, i.e. its own ZooKeeper session and connection**, as each peer contender has its own client; the backend's own connection carries the reads, waits and deletes of all of them): the peers of tests/peers in their `--bench N` mode, {peers}: a process each, each contender its own client (session), `acquire(); release()` back to back. All three follow the same protocol: the acquisition that finds the window over is released and not counted.\n\n",
            self.server_version,
            self.wall.as_secs_f64(),
            self.secs.as_secs_f64(),
        );
        md.push_str("| impl | N | cycles/s | acquire p50 / p99 ms | handoff p50 / p99 / max ms | grants per contender, min–max | watches fired per release | most watches one event fired | server packets per cycle | server CPU ms per cycle | peer process peak RSS MiB |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        for r in &self.runs {
            md.push_str(&format!(
                "| {} | {} | {:.0} | {} | {} / {} / {} | {}–{} | {:.3} | {:.0} | {:.2} | {} | {} |\n",
                r.impl_name,
                r.n,
                r.cycles_per_s,
                r.acquire.map_or("–".to_owned(), |(p50, p99)| format!(
                    "{} / {}",
                    ms(p50),
                    ms(p99)
                )),
                ms(r.handoff_p50),
                ms(r.handoff_p99),
                ms(r.handoff_max),
                r.per_contender_min,
                r.per_contender_max,
                r.watches_per_release(),
                r.server.most_per_event,
                r.packets_per_cycle(),
                r.server_cpu.map_or("–".to_owned(), |cpu| format!(
                    "{:.3}",
                    cpu * 1000.0 / r.cycles.max(1) as f64
                )),
                r.peak_rss.map_or("–".to_owned(), mib),
            ));
        }
        md.push_str("\nHandoff = from the holder starting its release to the next grant, in any contender (with N = 1, its own next acquisition). Watches fired: the server's own count (`mntr` after `srst`: `zk_sum_node_{created,deleted,changed,children}_watch_count`, the watchers each change triggered), divided by the releases, the uncounted last one of each contender included; \"most watches one event fired\" is the largest of the `zk_max_…` of the same summaries (1 = no herd). Server packets: `zk_packets_received` per counted cycle, pings and the clients' connects included. Server CPU: the CPU time of the server's container (its cgroup's) during the run, per counted cycle: for the peers, whose processes connect inside the measured span, their N sessions' opening and closing are in it (for baton they are not). baton runs twice at each N, before and after the peers (\"baton, again\"), so that the machine's drift does not decide the comparison, and an unreported baton run at N = 8 warms the server's JVM up before the first. The peers' times come from their own clocks (`System.nanoTime`, `time.monotonic_ns`), measured the same way; the JVM is not warmed beyond opening the sessions.\n\n");
        for s in &self.skipped {
            if s.n == 0 {
                md.push_str(&format!("**{} did not run**: {}.\n\n", s.peer, s.why));
            } else {
                md.push_str(&format!(
                    "**{} at N = {} failed**: {}.\n\n",
                    s.peer, s.n, s.why
                ));
            }
        }
        let sc = &self.scale;
        md.push_str(&format!(
            "### ZooKeeper: {} waiters on one lock, one process\n\nEach waiter with its own session (a ZooKeeper session each: a connection, a server-side session and its heartbeats), as each peer contender has its own client. Waiters of one process that share one `Session` instead hold one entry on the server for that session and queue behind it in the process.\n\n| what | value |\n| --- | ---: |\n| client memory per waiter: live heap (session, lock task, queue entry, wait) | {:.0} bytes |\n| of which opening the session (ZooKeeper client and connection, before its first request) | {:.0} bytes |\n| RSS growth per waiter | {:.0} bytes |\n| server connections opened | {:.0} |\n| time to queue them all | {:.2} s |\n| time to drain the queue | {:.2} s ({} ms per handoff) |\n| watches fired during the drain (most by one event) | {:.0} ({:.0}) for {} releases |\n| granted in FIFO (token) order | {} |\n\n",
            sc.waiters,
            sc.heap_per_waiter,
            sc.heap_per_session,
            sc.rss_per_waiter,
            sc.connections,
            sc.queue_time.as_secs_f64(),
            sc.drain_time.as_secs_f64(),
            ms(sc.drain_time / u32::try_from(sc.waiters.max(1)).unwrap_or(u32::MAX)),
            sc.watches,
            sc.most_per_event,
            sc.waiters,
            if sc.fifo { "yes" } else { "NO" },
        ));
        md.push_str(&self.peer_memory());
        md.push_str(&self.targets());
        md
    }

    /// The peers' resident set per contender: the growth of the process's peak RSS from the
    /// smallest N to the largest.
    fn peer_memory(&self) -> String {
        let mut out = String::new();
        for (peer, _) in &self.peers {
            let of = |f: fn(&&ZkRun, &&ZkRun) -> std::cmp::Ordering| {
                self.runs
                    .iter()
                    .filter(|r| r.impl_name == *peer)
                    .max_by(f)
                    .and_then(|r| Some((r.n, r.peak_rss?)))
            };
            if let (Some((n0, rss0)), Some((n1, rss1))) =
                (of(|a, b| b.n.cmp(&a.n)), of(|a, b| a.n.cmp(&b.n)))
                && n1 > n0
            {
                out.push_str(&format!(
                    "{peer}: peak RSS {} MiB at N = {n0}, {} MiB at N = {n1}: {:.0} bytes per contender (each its own client; the process's RSS, whatever the runtime keeps, not a live heap).\n",
                    mib(rss0),
                    mib(rss1),
                    (rss1 as f64 - rss0 as f64) / (n1 - n0) as f64,
                ));
            }
        }
        if !out.is_empty() {
            out = format!("For the peers, the closest measure from outside: {out}\n");
        }
        out
    }

    /// The targets: ahead of both peers at every N (each baton run), no more packets
    /// per cycle than Curator's, one watch fired per release.
    fn targets(&self) -> String {
        let yes = |ok: bool| if ok { "met" } else { "**not met**" };
        let mut md = String::from("Targets for baton on ZooKeeper:\n\n");
        for r in self.runs.iter().filter(|r| r.is_baton()) {
            let others: Vec<&ZkRun> = self
                .runs
                .iter()
                .filter(|o| !o.is_baton() && o.n == r.n)
                .collect();
            if others.is_empty() {
                md.push_str(&format!(
                    "- N = {}: {:.0} cycles/s; no peer measured.\n",
                    r.n, r.cycles_per_s
                ));
                continue;
            }
            let best = others.iter().map(|o| o.cycles_per_s).fold(0.0, f64::max);
            let vs: Vec<String> = others
                .iter()
                .map(|o| format!("{} {:.0}", o.impl_name, o.cycles_per_s))
                .collect();
            md.push_str(&format!(
                "- N = {} ({}): ahead of both peers: baton {:.0} cycles/s vs {}, {}.\n",
                r.n,
                r.impl_name,
                r.cycles_per_s,
                vs.join(", "),
                yes(r.cycles_per_s > best && others.len() == 2),
            ));
            if let Some(curator) = others.iter().find(|o| o.impl_name == "Curator")
                && r.n > 1
            {
                md.push_str(&format!(
                    "- N = {} ({}): no more server packets per cycle than Curator: {:.2} vs {:.2}, {}.\n",
                    r.n,
                    r.impl_name,
                    r.packets_per_cycle(),
                    curator.packets_per_cycle(),
                    yes(r.packets_per_cycle() <= curator.packets_per_cycle()),
                ));
            }
        }
        let worst = self
            .runs
            .iter()
            .filter(|r| r.is_baton() && r.n > 1)
            .map(ZkRun::watches_per_release)
            .fold(0.0, f64::max);
        let most = self
            .runs
            .iter()
            .filter(|r| r.is_baton())
            .map(|r| r.server.most_per_event)
            .fold(self.scale.most_per_event, f64::max);
        md.push_str(&format!(
            "- One watch fired per release (N > 1, and the drain): at most {worst:.3} per release, at most {most:.0} by one event, {} per release in the drain, {}.\n",
            format_args!(
                "{:.3}",
                self.scale.watches / self.scale.waiters.max(1) as f64
            ),
            yes(worst <= 1.0 && most <= 1.0),
        ));
        md
    }
}
