//! A worker pauses past its lease in the middle of a transfer. Its successor finds the
//! half-done transfer, completes it, and processes the next one. When the paused worker
//! wakes up and finishes its debit, the fence rejects it, and the balances still add up.
//!
//! `cargo run --example bank_transfer` (in memory) or `-- --endpoints 127.0.0.1:2379`.

mod common;

use std::time::Duration;

use baton::{Error, Fence, FencingToken, Mutex, Session, SessionOptions};

async fn balance(fence: &dyn Fence, account: &str) -> Result<i64, Box<dyn std::error::Error>> {
    Ok(match fence.read(account).await? {
        Some((_, v)) => String::from_utf8(v)?.parse()?,
        None => 0,
    })
}

async fn set(
    fence: &dyn Fence,
    account: &str,
    token: FencingToken,
    amount: i64,
) -> baton::Result<()> {
    fence
        .write(account, token, amount.to_string().as_bytes())
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let setup = common::from_args().await?;
    let fence = setup.fence.as_ref();
    println!("bank_transfer: running on {}", setup.on);
    let lock = format!("{}/bank/transfers", setup.prefix);
    let (a, b) = (
        format!("{}/accounts/alice", setup.prefix),
        format!("{}/accounts/bob", setup.prefix),
    );
    let journal = format!("{}/transfers/t1", setup.prefix);

    let opts = SessionOptions::new().with_ttl(Duration::from_secs(2));
    let first = Session::from_shared(setup.backend.clone(), opts).await?;
    let second = Session::from_shared(setup.backend.clone(), Default::default()).await?;

    // Worker 1 opens the accounts and starts transfer t1: 30 from alice to bob.
    let guard = Mutex::new(&first, &lock)?.lock().await?;
    let t1 = guard.fencing_token();
    set(fence, &a, t1, 100).await?;
    set(fence, &b, t1, 0).await?;
    println!("worker 1 (token {t1}): alice 100, bob 0; transfer t1: 30 alice -> bob");
    let alice_seen = balance(fence, &a).await?;
    set(fence, &b, t1, 30).await?;
    fence.write(&journal, t1, b"credited").await?;
    println!("worker 1: credited bob 30 ... and pauses (GC, swap, SIGSTOP) before debiting alice");

    // Worker 2 queues behind it.
    let successor = tokio::spawn({
        let (second, lock) = (second.clone(), lock.clone());
        async move { Mutex::new(&second, lock)?.lock().await }
    });

    // While worker 1 is paused its lease runs out. (Here we revoke it to skip the wait; on a
    // real pause the server expires it after the TTL.)
    setup.backend.revoke_lease(first.lease_id()).await?;
    let guard2 = successor.await??;
    let t2 = guard2.fencing_token();
    let state = fence
        .read(&journal)
        .await?
        .map(|(_, s)| s)
        .unwrap_or_default();
    println!(
        "worker 2 (token {t2}): holds the lock; journal of t1 says `{}`",
        String::from_utf8_lossy(&state)
    );
    if state == b"credited" {
        set(fence, &a, t2, balance(fence, &a).await? - 30).await?;
        fence.write(&journal, t2, b"done").await?;
        println!("worker 2: completed t1 (debited alice 30)");
    }
    set(fence, &a, t2, balance(fence, &a).await? - 20).await?;
    set(fence, &b, t2, balance(fence, &b).await? + 20).await?;
    println!("worker 2: transfer t2: 20 alice -> bob, done");
    guard2.unlock().await?;

    // Worker 1 wakes up and finishes what it started, from what it read before the pause.
    println!(
        "worker 1: wakes up (told: {}) and writes alice = {}",
        guard.lost().await,
        alice_seen - 30
    );
    match set(fence, &a, t1, alice_seen - 30).await {
        Err(Error::StaleToken { highest, .. }) => {
            println!("worker 1: late debit REJECTED by the fence (token {t1} < {highest})")
        }
        Ok(()) => return Err("the stale debit was accepted".into()),
        Err(e) => return Err(e.into()),
    }
    drop(guard);

    let (alice, bob) = (balance(fence, &a).await?, balance(fence, &b).await?);
    println!("balances: alice {alice}, bob {bob}, total {}", alice + bob);
    if alice + bob != 100 || alice != 50 {
        return Err("balances do not add up".into());
    }
    second.close().await?;
    Ok(())
}
