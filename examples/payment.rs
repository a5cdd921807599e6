//! The same payment request is delivered to three service instances (a retried webhook, a
//! redelivered message). Each takes the lock for that request; the first to hold it charges,
//! with the request id as idempotency key, and records the charge through a fence; the others
//! find it recorded. Exactly one charge.
//!
//! Each run pauses the first holder at another point (after its grant; after it read, before
//! it wrote; after it charged, before it recorded the charge; after it wrote), lets its lease run out, lets its successor work, then
//! resumes it, and checks that exactly one charge was made. Every holder claims the resource before it reads it,
//! so a paused holder's late writes are refused (docs/fencing.md).
//!
//! `cargo run --example payment` (in memory), or on etcd:
//! `cargo run --features etcd --example payment -- --endpoints 127.0.0.1:2379`, or on
//! Redis: `cargo run --features redis --example payment -- --endpoints redis://127.0.0.1:6379`.

mod common;

use common::scenarios::{self, Failure, Pause};

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let setup = common::from_args().await.map_err(|e| e.to_string())?;
    println!("payment: running on {}", setup.on);
    for (i, pause) in Pause::ALL.into_iter().enumerate() {
        let world = setup.world(&format!("payment-{i}"));
        for line in scenarios::payment(&world, pause).await?.lines {
            println!("payment: {line}");
        }
    }
    Ok(())
}
