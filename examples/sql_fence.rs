//! Fencing a SQL table: the conditional upsert `... WHERE fenced.fence_token <= excluded...`
//! makes the database refuse a holder whose lock has passed to someone else; the claim
//! (the same condition, recording only the token) makes it refuse the old holder from the
//! moment the new one reads. SQLite (bundled, no server, a file in the temporary directory);
//! the PostgreSQL form is in docs/fencing.md.
//!
//! `cargo run --example sql_fence`

mod common;

use baton::backend::Backend;
use baton::{Error, Fence, MemoryBackend, Mutex, Session};
use common::sql_fence::{FENCED_CLAIM, FENCED_WRITE, SqliteFence};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    common::check_flags(&[], &[])?;
    let path = std::env::temp_dir().join(format!("baton-sql-fence-{}.db", std::process::id()));
    let fence = SqliteFence::open(&path)?;
    println!("the fenced write is one statement:{FENCED_WRITE}\n");
    println!("and so is the claim:{FENCED_CLAIM}\n");

    let backend = MemoryBackend::new();
    let old = Session::new(backend.clone()).await?;
    let new = Session::new(backend.clone()).await?;

    let stale = Mutex::new(&old, "orders/lock")?.lock().await?;
    fence.claim("order-1", stale.ticket()).await?;
    fence
        .write("order-1", stale.ticket(), b"status=paid")
        .await?;
    println!(
        "holder 1 (token {}) wrote status=paid",
        stale.fencing_token()
    );

    // Holder 1 loses its lease (revoked here; a pause past the TTL does the same).
    backend.revoke_lease(old.lease_id()).await?;
    let current = Mutex::new(&new, "orders/lock")?.lock().await?;
    // Claim, then read, then write: from the claim on, holder 1 is refused.
    let seen = fence.claim("order-1", current.ticket()).await?;
    println!(
        "holder 2 (token {}) claimed order-1 and read {}",
        current.fencing_token(),
        String::from_utf8_lossy(&seen.unwrap_or_default())
    );
    fence
        .write("order-1", current.ticket(), b"status=refunded")
        .await?;
    println!(
        "holder 2 (token {}) wrote status=refunded",
        current.fencing_token()
    );

    match fence
        .write("order-1", stale.ticket(), b"status=shipped")
        .await
    {
        Err(Error::StaleToken { token, highest, .. }) => {
            println!(
                "holder 1 tried status=shipped with token {token}: refused by the database (highest {highest})"
            )
        }
        other => return Err(format!("the stale write was not refused: {other:?}").into()),
    }
    let (token, data) = fence.read("order-1").await?.ok_or("row missing")?;
    println!(
        "row: fence_token={token}, {}",
        String::from_utf8_lossy(&data)
    );
    current.release().await?;
    drop(stale);
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
    Ok(())
}
