//! Transfers between random pairs of 4 accounts, each transfer holding both accounts' locks
//! through a MultiLock. Transfers list their accounts in any order; the locks are taken in
//! name order, so they never deadlock. The example checks its own outcome: every transfer
//! finishes, and the balances add up.
//!
//! `cargo run --example multilock` (in memory), or on etcd:
//! `cargo run --features etcd --example multilock -- --endpoints 127.0.0.1:2379`, or on
//! Redis: `cargo run --features redis --example multilock -- --endpoints redis://127.0.0.1:6379`.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use baton::{MultiLock, Session, SessionOptions};

type Failure = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let setup = common::from_args().await.map_err(|e| e.to_string())?;
    println!("multilock: running on {}", setup.on);
    let accounts: Vec<String> = (0..4)
        .map(|i| format!("{}/accounts/{i}", setup.prefix))
        .collect();
    let balances = Arc::new(StdMutex::new(
        accounts
            .iter()
            .map(|a| (a.clone(), 100i64))
            .collect::<HashMap<_, _>>(),
    ));
    let mut transfers = Vec::new();
    for t in 0..12usize {
        // Pairs in both orders: (0,1) and (1,0), (1,2) and (2,1), ...
        let (from, to) = (
            accounts[t % 4].clone(),
            accounts[(t + 1 + t / 4) % 4].clone(),
        );
        let (from, to) = if t % 2 == 0 { (from, to) } else { (to, from) };
        if from == to {
            continue;
        }
        let session =
            Session::with_options(Arc::clone(&setup.backend), SessionOptions::new()).await?;
        let balances = Arc::clone(&balances);
        transfers.push(tokio::spawn(async move {
            let both = MultiLock::new(&session, [from.clone(), to.clone()])?;
            let guard = both.lock().await?;
            // Read, then write after a pause: without the locks, transfers would lose updates.
            let (a, b) = {
                let balances = balances.lock().map_err(|_| "poisoned")?;
                (balances[&from], balances[&to])
            };
            tokio::time::sleep(Duration::from_millis(5)).await;
            {
                let mut balances = balances.lock().map_err(|_| "poisoned")?;
                balances.insert(from, a - 10);
                balances.insert(to, b + 10);
            }
            guard.release().await?;
            session.close().await?;
            Ok::<_, Failure>(())
        }));
    }
    let n = transfers.len();
    for t in transfers {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .map_err(|_| "a transfer never finished: deadlock")???;
    }
    let total: i64 = balances.lock().map_err(|_| "poisoned")?.values().sum();
    println!("multilock: {n} transfers over overlapping pairs, no deadlock, total {total}");
    if total != 400 {
        return Err(format!("the balances add up to {total}, not 400").into());
    }
    Ok(())
}
