//! A worker pauses past its lease in the middle of transfers. Its successor finds each
//! transfer's journal, completes what is left, and the paused worker's late writes are refused:
//! the balances add up.
//!
//! Each run pauses the first holder at another point (after its grant; after it read, before
//! it wrote; after it credited, before it debited; after it wrote), lets its lease run out, lets its successor work, then
//! resumes it, and checks that the balances add up with each transfer applied once. Every holder claims the resource before it reads it,
//! so a paused holder's late writes are refused (docs/fencing.md).
//!
//! `cargo run --example bank_transfer` (in memory), or on etcd:
//! `cargo run --features etcd --example bank_transfer -- --endpoints 127.0.0.1:2379`, or on
//! Redis: `cargo run --features redis --example bank_transfer -- --endpoints redis://127.0.0.1:6379`.

mod common;

use common::scenarios::{self, Failure, Pause};

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let setup = common::from_args().await.map_err(|e| e.to_string())?;
    println!("bank_transfer: running on {}", setup.on);
    for (i, pause) in Pause::ALL.into_iter().enumerate() {
        let world = setup.world(&format!("bank_transfer-{i}"));
        for line in scenarios::bank_transfer(&world, pause).await?.lines {
            println!("bank_transfer: {line}");
        }
    }
    Ok(())
}
