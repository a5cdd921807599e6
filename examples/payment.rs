//! The same payment request is delivered to three service instances (a retried webhook, a
//! redelivered message). Each takes the lock for that request; the first to hold it charges
//! and records the charge through a fence; the others find it recorded. Exactly one charge.
//!
//! `cargo run --example payment` (in memory) or `-- --endpoints 127.0.0.1:2379` (etcd).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use baton::{Mutex, Session};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let setup = common::from_args().await?;
    println!("payment: running on {}", setup.on);
    let request = "req-7f3a";
    let record = format!("{}/charges/{request}", setup.prefix);
    let charges = Arc::new(AtomicUsize::new(0));

    let mut instances = Vec::new();
    for instance in 1..=3 {
        let session = Session::from_shared(setup.backend.clone(), Default::default()).await?;
        let (fence, record, charges) = (setup.fence.clone(), record.clone(), charges.clone());
        let lock = format!("{}/payments/{request}", setup.prefix);
        instances.push(tokio::spawn(async move {
            let guard = Mutex::new(&session, lock)?.lock().await?;
            let token = guard.fencing_token();
            match fence.read(&record).await? {
                Some((by, what)) => println!(
                    "instance {instance}: request {request} already handled (token {by}: {}), acknowledging",
                    String::from_utf8_lossy(&what)
                ),
                None => {
                    // Call the payment provider, then record the charge, fenced by our token.
                    charges.fetch_add(1, Ordering::SeqCst);
                    let what = format!("charged 42.00 EUR by instance {instance}");
                    fence.write(&record, token, what.as_bytes()).await?;
                    println!("instance {instance}: {what} (token {token})");
                }
            }
            guard.unlock().await?;
            session.close().await?;
            Ok::<_, baton::Error>(())
        }));
    }
    for i in instances {
        i.await??;
    }
    let n = charges.load(Ordering::SeqCst);
    println!("payment: {n} charge for request {request} across 3 deliveries");
    if n != 1 {
        return Err(format!("expected exactly one charge, got {n}").into());
    }
    Ok(())
}
