//! Ten workers try to sell from a stock of five, each holding the lock while it reads and
//! decrements the stock through a fence. Never more than five are sold.
//!
//! `cargo run --example inventory` (in memory) or `-- --endpoints 127.0.0.1:2379` (etcd).

mod common;

use baton::{Mutex, Session};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let setup = common::from_args().await?;
    println!("inventory: running on {}", setup.on);
    let lock = format!("{}/inventory/widget", setup.prefix);
    let stock = format!("{}/stock/widget", setup.prefix);

    // Stock the shelf under the lock, like any other write.
    let session = Session::from_shared(setup.backend.clone(), Default::default()).await?;
    let guard = Mutex::new(&session, &lock)?.lock().await?;
    setup
        .fence
        .write(&stock, guard.fencing_token(), b"5")
        .await?;
    guard.unlock().await?;
    println!("inventory: 5 widgets in stock, 10 buyers");

    let mut workers = Vec::new();
    for worker in 1..=10 {
        let session = Session::from_shared(setup.backend.clone(), Default::default()).await?;
        let (fence, lock, stock) = (setup.fence.clone(), lock.clone(), stock.clone());
        workers.push(tokio::spawn(async move {
            let guard = Mutex::new(&session, lock)?.lock().await?;
            let left: u32 = match fence.read(&stock).await? {
                Some((_, v)) => String::from_utf8_lossy(&v).parse().unwrap_or(0),
                None => 0,
            };
            let sold = if left > 0 {
                fence
                    .write(
                        &stock,
                        guard.fencing_token(),
                        (left - 1).to_string().as_bytes(),
                    )
                    .await?;
                println!(
                    "worker {worker:>2}: sold one (token {}), {} left",
                    guard.fencing_token(),
                    left - 1
                );
                true
            } else {
                println!("worker {worker:>2}: sold out");
                false
            };
            guard.unlock().await?;
            session.close().await?;
            Ok::<_, baton::Error>(sold)
        }));
    }
    let mut sold = 0;
    for w in workers {
        sold += usize::from(w.await??);
    }
    println!("inventory: {sold} sold, never more than the 5 in stock");
    if sold != 5 {
        return Err(format!("sold {sold}, expected 5").into());
    }
    Ok(())
}
