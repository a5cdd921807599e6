//! A batch of 4 shards that must start together and finish together (a double barrier), held
//! back by a deploy gate (a barrier) until the gate's holder lets go. The example checks its
//! own outcome: no shard starts before the gate is down and all 4 have entered, none leaves
//! before all 4 are done, and a gate whose holder crashes does not stay up.
//!
//! `cargo run --example barriers` (in memory), or on etcd:
//! `cargo run --features etcd --example barriers -- --endpoints 127.0.0.1:2379`, or on
//! Redis: `cargo run --features redis --example barriers -- --endpoints redis://127.0.0.1:6379`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use baton::{Barrier, DoubleBarrier, Session, SessionOptions};

type Failure = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let setup = common::from_args().await.map_err(|e| e.to_string())?;
    let (gate_name, batch_name) = (
        format!("{}/gate", setup.prefix),
        format!("{}/batch", setup.prefix),
    );
    println!("barriers: running on {}", setup.on);

    let deployer = Session::with_options(Arc::clone(&setup.backend), SessionOptions::new()).await?;
    let gate = Barrier::new(&deployer, &gate_name)?;
    let raised = gate.hold().await?;

    let (entered, started, finished) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let mut shards = Vec::new();
    for _ in 0..4 {
        let session =
            Session::with_options(Arc::clone(&setup.backend), SessionOptions::new()).await?;
        let gate = Barrier::new(&session, &gate_name)?;
        let batch = DoubleBarrier::new(&session, &batch_name, 4)?;
        let (entered, started, finished) = (entered.clone(), started.clone(), finished.clone());
        shards.push(tokio::spawn(async move {
            gate.wait().await?;
            entered.fetch_add(1, Ordering::SeqCst);
            let inside = batch.enter().await?;
            if entered.load(Ordering::SeqCst) != 4 {
                return Err::<(), Failure>("a shard started before all had entered".into());
            }
            started.fetch_add(1, Ordering::SeqCst);
            finished.fetch_add(1, Ordering::SeqCst);
            inside.leave().await?;
            if finished.load(Ordering::SeqCst) != 4 {
                return Err("a shard left before all were done".into());
            }
            session.close().await?;
            Ok(())
        }));
    }
    // The gate holds them all back.
    tokio::time::sleep(Duration::from_millis(100)).await;
    if entered.load(Ordering::SeqCst) != 0 {
        return Err("a shard passed the gate while it was up".into());
    }
    raised.release().await?;
    for s in shards {
        s.await??;
    }
    println!("barriers: 4 shards passed the gate, started together, finished together");

    // A gate whose holder crashes comes down with its lease.
    let crashed = Session::with_options(Arc::clone(&setup.backend), SessionOptions::new()).await?;
    let _up = Barrier::new(&crashed, &gate_name)?.hold().await?;
    setup.backend.revoke_lease(crashed.lease_id()).await?;
    tokio::time::timeout(Duration::from_secs(10), gate.wait())
        .await
        .map_err(|_| "the gate stayed up after its holder crashed")??;
    println!("barriers: a gate whose holder crashed came down");
    deployer.close().await?;
    Ok(())
}
