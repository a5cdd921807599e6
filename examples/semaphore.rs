//! At most 3 imports at once across all workers: 8 workers share a semaphore of 3 permits.
//! The example checks its own outcome: never more than 3 imports inside at once, a contender
//! that asks for another limit is refused, and a crashed worker's permits come back when its
//! lease ends.
//!
//! `cargo run --example semaphore` (in memory), or on etcd:
//! `cargo run --features etcd --example semaphore -- --endpoints 127.0.0.1:2379`, or on
//! Redis: `cargo run --features redis --example semaphore -- --endpoints redis://127.0.0.1:6379`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use baton::{Semaphore, Session, SessionOptions};

type Failure = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let setup = common::from_args().await.map_err(|e| e.to_string())?;
    let name = format!("{}/imports", setup.prefix);
    println!("semaphore: running on {}", setup.on);

    let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut workers = Vec::new();
    for worker in 0..8 {
        let session =
            Session::with_options(Arc::clone(&setup.backend), SessionOptions::new()).await?;
        let imports =
            Semaphore::new(&session, &name, 3)?.with_owner_info(format!("worker {worker}"));
        let (inside, most) = (Arc::clone(&inside), Arc::clone(&most));
        workers.push(tokio::spawn(async move {
            let permit = imports.acquire().await?;
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            // The import: stop at once if the permit is lost.
            tokio::select! {
                reason = permit.lost() => return Err(format!("permit lost: {reason}").into()),
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
            inside.fetch_sub(1, Ordering::SeqCst);
            let token = permit.fencing_token();
            permit.release().await?;
            session.close().await?;
            Ok::<_, Failure>(token)
        }));
    }
    for w in workers {
        w.await??;
    }
    let most = most.load(Ordering::SeqCst);
    println!("semaphore: 8 imports ran, at most {most} at once (3 permits)");
    if most > 3 {
        return Err(format!("{most} imports ran at once with 3 permits").into());
    }

    // A contender configured with another limit is refused before it creates anything.
    let other = Session::with_options(Arc::clone(&setup.backend), SessionOptions::new()).await?;
    match Semaphore::new(&other, &name, 5)?.acquire().await {
        Err(baton::Error::LimitMismatch { .. }) => {
            println!("semaphore: a contender asking for 5 permits was refused")
        }
        other => return Err(format!("a contender with another limit got {other:?}").into()),
    }

    // A worker that crashes holding every permit: they come back when its lease ends (here
    // revoked, which is what the server does after the TTL), and the next contender gets one.
    let crashed = Session::with_options(Arc::clone(&setup.backend), SessionOptions::new()).await?;
    let imports = Semaphore::new(&crashed, &name, 3)?;
    let held = [
        imports.acquire().await?,
        imports.acquire().await?,
        imports.acquire().await?,
    ];
    let waiting = tokio::spawn({
        let imports = Semaphore::new(&other, &name, 3)?;
        async move { imports.acquire().await }
    });
    setup.backend.revoke_lease(crashed.lease_id()).await?;
    let next = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .map_err(|_| "the crashed worker's permits never came back")???;
    if next.fencing_token() <= held[2].fencing_token() {
        return Err("a permit was granted out of queue order".into());
    }
    println!(
        "semaphore: a crashed worker's 3 permits came back; the waiter got token {}",
        next.fencing_token()
    );
    drop(held);
    next.release().await?;
    other.close().await?;
    Ok(())
}
