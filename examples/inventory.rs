//! Ten workers try to sell from a stock of five, each holding the lock while it reads and
//! decrements the stock through a fence. Never more than five are sold.
//!
//! Each run pauses the first holder at another point (after its grant; after it read, before
//! it wrote; after it wrote), lets its lease run out, lets its successor work, then
//! resumes it, and checks that sold + left = stocked. Every holder claims the resource before it reads it,
//! so a paused holder's late writes are refused (docs/fencing.md).
//!
//! `cargo run --example inventory` (in memory), or on etcd:
//! `cargo run --features etcd --example inventory -- --endpoints 127.0.0.1:2379`, or on
//! Redis: `cargo run --features redis --example inventory -- --endpoints redis://127.0.0.1:6379`.

mod common;

use common::scenarios::{self, Failure, Pause};

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let setup = common::from_args().await.map_err(|e| e.to_string())?;
    println!("inventory: running on {}", setup.on);
    for (i, pause) in Pause::INVENTORY.into_iter().enumerate() {
        let world = setup.world(&format!("inventory-{i}"));
        for line in scenarios::inventory(&world, pause).await?.lines {
            println!("inventory: {line}");
        }
    }
    Ok(())
}
