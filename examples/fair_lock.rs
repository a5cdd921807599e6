//! Several workers share one lock on the in-memory backend (no server needed):
//! they are served in the order they queued, every write goes through a store that checks
//! fencing tokens, and a worker that pauses past its lease has its late write rejected.
//!
//! Run: `cargo run --example fair_lock`

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use baton::backend::Backend;
use baton::{FencingToken, MemoryBackend, Mutex, Session, SessionOptions};

/// A resource that remembers the highest fencing token it accepted and rejects lower ones.
#[derive(Default)]
struct FencedStore {
    inner: StdMutex<(u64, Vec<String>)>,
}

impl FencedStore {
    fn write(&self, token: FencingToken, line: String) -> Result<(), String> {
        let mut inner = self.inner.lock().map_err(|_| "store poisoned".to_owned())?;
        if token.get() < inner.0 {
            return Err(format!(
                "rejected: token {token} is older than {} already accepted",
                inner.0
            ));
        }
        inner.0 = token.get();
        inner.1.push(line);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Some(arg) = std::env::args().nth(1) {
        return Err(format!(
            "unknown option `{arg}`: fair_lock takes none (it runs on the in-memory backend)"
        )
        .into());
    }
    let backend = MemoryBackend::new();
    let store = Arc::new(FencedStore::default());
    let lock = "demo/ledger";

    // The first holder has a short lease; it is about to stall (think: a long GC pause).
    let ttl = Duration::from_secs(1);
    let slow = Session::with_options(backend.clone(), SessionOptions::new().with_ttl(ttl)).await?;
    let guard = Mutex::new(&slow, lock)?.lock().await?;
    let slow_token = guard.fencing_token();
    store.write(slow_token, "slow worker: begin".into())?;
    println!("slow worker  holds the lock with token {slow_token}");

    // Three workers queue behind it, in this order.
    let mut workers = Vec::new();
    for name in ["alice", "bob", "carol"] {
        let session = Session::new(backend.clone()).await?;
        let store = Arc::clone(&store);
        workers.push(tokio::spawn(async move {
            let guard = Mutex::new(&session, lock)?.lock().await?;
            let token = guard.fencing_token();
            let written = store.write(token, format!("{name}: update"));
            println!(
                "{name:<12} got the lock with token {token}: write {}",
                match &written {
                    Ok(()) => "accepted".to_owned(),
                    Err(e) => e.clone(),
                }
            );
            guard.release().await?;
            Ok::<_, baton::Error>(())
        }));
        // Wait until this worker's key is in the queue before starting the next one.
        while backend.entries(lock).await?.len() < workers.len() + 1 {
            tokio::task::yield_now().await;
        }
    }

    // The slow worker stalls: its renewals stop reaching the server and its lease expires.
    println!("slow worker  stalls: its renewals stop reaching the server (lease {ttl:?})");
    backend.partition_lease(slow.lease_id(), true);
    let lost = guard.lost();
    for worker in workers {
        worker.await??;
    }
    println!("slow worker  was told its session is gone: {}", lost.await);

    // Waking up, it still tries to finish its write with its old token.
    match store.write(slow_token, "slow worker: late debit".into()) {
        Ok(()) => return Err("the late write was accepted".into()),
        Err(e) => println!("slow worker  late write {e}"),
    }
    drop(guard);

    let (highest, lines) = &*store.inner.lock().map_err(|_| "store poisoned")?;
    println!("store: highest token {highest}, writes in order: {lines:?}");
    Ok(())
}
