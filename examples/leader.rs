//! A scheduled job that runs only on the leader, with failover.
//!
//! In-memory (default): two instances in one process; the leader runs the job, then
//! "crashes" (its lease stops being renewed), and the other takes over after the TTL.
//!
//! ```sh
//! cargo run --example leader
//! ```
//!
//! On etcd (or Redis, with `--features redis` and `--endpoints redis://127.0.0.1:6379`): one
//! instance per process. Start two, kill the first (Ctrl-C resigns at once;
//! `kill -9` shows failover after the TTL):
//!
//! ```sh
//! cargo run --features etcd --example leader -- --endpoints 127.0.0.1:2379 --name a
//! cargo run --features etcd --example leader -- --endpoints 127.0.0.1:2379 --name b
//! ```

mod common;

use std::time::Duration;

use baton::{Election, FencingToken, MemoryBackend, Session, SessionOptions};

const ELECTION: &str = "examples/scheduler";
const TTL: Duration = Duration::from_secs(2);

/// The job: runs every `period` for as long as it is allowed to (it is cancelled when
/// leadership is lost), or `runs` times.
async fn job(instance: &str, token: FencingToken, period: Duration, runs: Option<u32>) {
    let mut tick = tokio::time::interval(period);
    let mut n = 0;
    loop {
        tick.tick().await;
        n += 1;
        println!("{instance}: running the scheduled job (run {n}, fencing token {token})");
        if runs.is_some_and(|r| n >= r) {
            return;
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    common::check_flags(&["--endpoints", "--name"], &[])?;
    let arg = common::flag_value;
    match arg("--endpoints") {
        Some(endpoints) => {
            let name = arg("--name").unwrap_or_else(|| format!("instance-{}", std::process::id()));
            run_on_server(&endpoints, &name).await
        }
        None => run_in_memory().await,
    }
}

/// One instance on etcd or Redis (the endpoints' scheme decides; the build needs the feature).
async fn run_on_server(endpoints: &str, name: &str) -> Result<(), Box<dyn std::error::Error>> {
    use baton::Error;
    let backend = baton::connect(endpoints).await?;
    let options = SessionOptions::new().with_ttl(TTL);
    loop {
        let session = Session::with_options(backend.clone(), options.clone()).await?;
        let election = Election::new(&session, ELECTION)?;
        println!("{name}: campaigning");
        let run = election.run_while_leader(name, |token| async move {
            println!("{name}: I am the leader");
            job(name, token, Duration::from_secs(1), None).await;
        });
        tokio::select! {
            result = run => match result {
                Err(Error::LeadershipLost { .. }) => println!("{name}: leadership lost; campaigning again"),
                other => other?,
            },
            _ = tokio::signal::ctrl_c() => {
                // Dropping the campaign resigns in the background; close() makes it immediate.
                session.close().await?;
                println!("{name}: stopped");
                return Ok(());
            }
        }
    }
}

async fn run_in_memory() -> Result<(), Box<dyn std::error::Error>> {
    let backend = MemoryBackend::new();
    let options = SessionOptions::new().with_ttl(TTL);
    let a = Session::with_options(backend.clone(), options.clone()).await?;
    let b = Session::with_options(backend.clone(), options).await?;

    let leader_a = Election::new(&a, ELECTION)?.campaign("a").await?;
    println!("a: I am the leader");
    let standby = tokio::spawn({
        let b = b.clone();
        async move {
            println!("b: campaigning (standing by)");
            Election::new(&b, ELECTION)?
                .run_while_leader("b", |token| async move {
                    println!("b: I am the leader");
                    job("b", token, Duration::from_millis(300), Some(3)).await;
                })
                .await
        }
    });

    job(
        "a",
        leader_a.fencing_token(),
        Duration::from_millis(300),
        Some(3),
    )
    .await;
    println!("a: crashes (its lease is no longer renewed; TTL {TTL:?})");
    backend.partition_lease(a.lease_id(), true);
    let started = tokio::time::Instant::now();
    let reason = leader_a.lost().await;
    println!("a: would be told: {reason}");
    standby.await??;
    println!(
        "b took over {:.1?} after a crashed, and resigned after its runs",
        started.elapsed()
    );
    Ok(())
}
