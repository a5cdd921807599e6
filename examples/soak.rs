//! A bounded soak: many contenders on several locks on a three-member etcd cluster while a
//! loop restarts members one at a time. Every grant writes through a fence and a checker;
//! prints grants, handoff gaps, stale writes rejected and overlaps, and fails on an overlap.
//!
//! `just soak` (60 s) or `cargo run --release --features testing --example soak -- --seconds 20`.
//! With `--endpoints a,b,c` it runs against a cluster you started (and restarts nothing).

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use baton::testing::EtcdCluster;
use baton::{EtcdBackend, EtcdFence, EtcdOptions, Fence, Mutex, Session, SessionOptions};
use tokio::time::Instant;

const LOCKS: usize = 3;
const PER_LOCK: usize = 4;

#[derive(Default)]
struct Lock {
    inside: Option<u64>,
    highest: u64,
    released_at: Option<Instant>,
    grants: u64,
    overlaps: u64,
    gaps: Vec<Duration>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    common::check_flags(&["--seconds", "--endpoints"], &[])?;
    let arg = common::flag_value;
    let seconds: u64 = arg("--seconds").map_or(Ok(60), |s| s.parse())?;
    let run_for = Duration::from_secs(seconds);

    let (cluster, endpoints) = match arg("--endpoints") {
        Some(e) => (None, e.split(',').map(str::to_owned).collect()),
        None => {
            let cluster = EtcdCluster::start().await?;
            let endpoints = cluster.endpoints();
            (Some(cluster), endpoints)
        }
    };
    let options = EtcdOptions::new()
        .with_request_timeout(Duration::from_secs(2))
        .with_retry_for(Duration::from_secs(20));
    let backend = EtcdBackend::connect(&endpoints, options).await?;
    let fence = Arc::new(EtcdFence::new(
        backend.clone(),
        format!("soak-{}/fence", std::process::id()),
    )?);
    let state: Arc<StdMutex<HashMap<usize, Lock>>> = Arc::default();
    // Every error a caller saw: (the call, the error).
    let errors: Arc<StdMutex<Vec<(&'static str, String)>>> = Arc::default();
    let stale_rejected = Arc::new(StdMutex::new(0u64));
    let deadline = Instant::now() + run_for;
    println!("soak: {LOCKS} locks x {PER_LOCK} contenders for {seconds} s on {endpoints:?}");

    let mut tasks = Vec::new();
    for lock in 0..LOCKS {
        for _ in 0..PER_LOCK {
            let (backend, fence, state, errors, stale) = (
                backend.clone(),
                Arc::clone(&fence),
                Arc::clone(&state),
                Arc::clone(&errors),
                Arc::clone(&stale_rejected),
            );
            tasks.push(tokio::spawn(async move {
                let name = format!("soak-{}/lock{lock}", std::process::id());
                let options = SessionOptions::new().with_ttl(Duration::from_secs(10));
                while Instant::now() < deadline {
                    let session =
                        match Session::with_options(backend.clone(), options.clone()).await {
                            Ok(session) => session,
                            Err(e) => {
                                errors.lock().unwrap().push(("Session::new", e.to_string()));
                                tokio::time::sleep(Duration::from_millis(200)).await;
                                continue;
                            }
                        };
                    let mutex = match Mutex::new(&session, &name) {
                        Ok(m) => m,
                        Err(e) => return Err(e),
                    };
                    while Instant::now() < deadline && !session.is_lost() {
                        let guard = match tokio::time::timeout_at(deadline, mutex.lock()).await {
                            Err(_) => break,
                            Ok(Err(e)) => {
                                errors.lock().unwrap().push(("lock", e.to_string()));
                                break;
                            }
                            Ok(Ok(g)) => g,
                        };
                        let token = guard.fencing_token();
                        {
                            let mut s = state.lock().unwrap();
                            let l = s.entry(lock).or_default();
                            if l.inside.is_some() {
                                l.overlaps += 1;
                            }
                            if let Some(at) = l.released_at {
                                l.gaps.push(at.elapsed());
                            }
                            l.inside = Some(token.get());
                            l.highest = l.highest.max(token.get());
                            l.grants += 1;
                        }
                        match fence
                            .write(&format!("lock{lock}"), token.into(), b"x")
                            .await
                        {
                            Err(baton::Error::StaleToken { .. }) => *stale.lock().unwrap() += 1,
                            Err(e) => errors.lock().unwrap().push(("fence write", e.to_string())),
                            Ok(()) => {}
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        {
                            let mut s = state.lock().unwrap();
                            let l = s.entry(lock).or_default();
                            l.inside = None;
                            l.released_at = Some(Instant::now());
                        }
                        if let Err(e) = guard.release().await {
                            errors
                                .lock()
                                .unwrap()
                                .push(("unlock", format!("{e}: {e:?}")));
                        }
                    }
                    let _ = session.close().await;
                }
                Ok::<_, baton::Error>(())
            }));
        }
    }

    let mut restarts = 0;
    if let Some(cluster) = &cluster {
        let mut member = 0;
        while Instant::now() + Duration::from_secs(6) < deadline {
            tokio::time::sleep(Duration::from_secs(2)).await;
            cluster.stop_member(member).await?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            cluster.start_member(member).await?;
            restarts += 1;
            member = (member + 1) % 3;
        }
    }
    for t in tasks {
        t.await??;
    }

    let state = state.lock().unwrap();
    let (mut grants, mut overlaps, mut gaps) = (0, 0, Vec::new());
    for l in state.values() {
        grants += l.grants;
        overlaps += l.overlaps;
        gaps.extend(l.gaps.iter().copied());
    }
    gaps.sort();
    let pct = |p: f64| {
        gaps.get(((gaps.len() as f64 * p) as usize).min(gaps.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    // One kind of error is expected, and harmless: a member restart cut a release that was
    // applied; the retry found the entry gone and cannot tell our delete from a loss before
    // it, so `unlock` answers `OutcomeUnknown`. The lock is released either way, and no
    // guarded write can have landed after a loss. Every other error a caller saw fails the
    // soak: with a quorum up, `retry_for` must carry every call through a restart.
    let errors = errors.lock().unwrap();
    let (unknown_releases, failures): (Vec<_>, Vec<_>) = errors
        .iter()
        .partition(|(call, error)| *call == "unlock" && error.contains("OutcomeUnknown"));
    println!(
        "soak: {grants} grants, {restarts} member restarts, handoff gap p50 {:?} p99 {:?} max {:?}, {} stale writes rejected, {} releases with an unknown outcome, {} errors, {overlaps} overlaps",
        pct(0.5),
        pct(0.99),
        gaps.last().copied().unwrap_or_default(),
        stale_rejected.lock().unwrap(),
        unknown_releases.len(),
        failures.len(),
    );
    for (call, error) in &failures {
        println!("soak: {call} failed: {error}");
    }
    if !failures.is_empty() {
        return Err(format!("{} calls failed while a quorum was up", failures.len()).into());
    }
    if overlaps > 0 {
        return Err(format!("{overlaps} overlapping critical sections").into());
    }
    if grants == 0 {
        return Err("no grants at all".into());
    }
    Ok(())
}
