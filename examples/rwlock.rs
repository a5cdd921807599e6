//! Many readers of a shared configuration, and an occasional writer, on one read-write lock.
//! The example checks its own outcome: readers overlap one another, a writer is never inside
//! with anyone, and a reader that arrives after a waiting writer waits behind it (no writer
//! starves).
//!
//! `cargo run --example rwlock` (in memory), or on etcd:
//! `cargo run --features etcd --example rwlock -- --endpoints 127.0.0.1:2379`, or on
//! Redis: `cargo run --features redis --example rwlock -- --endpoints redis://127.0.0.1:6379`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use baton::{RwLock, Session, SessionOptions};

type Failure = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let setup = common::from_args().await.map_err(|e| e.to_string())?;
    let name = format!("{}/config", setup.prefix);
    println!("rwlock: running on {}", setup.on);

    let (readers, writers, most_readers) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let mut tasks = Vec::new();
    for i in 0..10 {
        let session =
            Session::with_options(Arc::clone(&setup.backend), SessionOptions::new()).await?;
        let lock = RwLock::new(&session, &name)?;
        let (readers, writers, most) = (readers.clone(), writers.clone(), most_readers.clone());
        tasks.push(tokio::spawn(async move {
            if i % 5 == 4 {
                let w = lock.write().await?;
                if writers.fetch_add(1, Ordering::SeqCst) != 0
                    || readers.load(Ordering::SeqCst) != 0
                {
                    return Err::<(), Failure>("a writer was not alone".into());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                writers.fetch_sub(1, Ordering::SeqCst);
                w.release().await?;
            } else {
                let r = lock.read().await?;
                let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                if writers.load(Ordering::SeqCst) != 0 {
                    return Err("a reader beside a writer".into());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                readers.fetch_sub(1, Ordering::SeqCst);
                r.release().await?;
            }
            session.close().await?;
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let most = most_readers.load(Ordering::SeqCst);
    println!("rwlock: 8 reads and 2 writes; up to {most} readers at once, writers alone");
    if most < 2 {
        return Err("readers never shared the lock".into());
    }

    // No writer starvation: a reader holds, a writer waits, a later reader waits behind it.
    let s = Session::with_options(Arc::clone(&setup.backend), SessionOptions::new()).await?;
    let first = RwLock::new(&s, &name)?.read().await?;
    let writer = tokio::spawn({
        let lock = RwLock::new(&s, &name)?;
        async move { lock.write().await }
    });
    while setup.backend.entries(&name).await?.len() < 2 {
        tokio::task::yield_now().await;
    }
    match RwLock::new(&s, &name)?.try_read().await {
        Err(baton::Error::Locked { .. }) => {}
        other => return Err(format!("a reader overtook a waiting writer: {other:?}").into()),
    }
    first.release().await?;
    let w = writer.await??;
    println!(
        "rwlock: a later reader waited behind the waiting writer (token {})",
        w.fencing_token()
    );
    w.release().await?;
    s.close().await?;
    Ok(())
}
