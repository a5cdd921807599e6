//! Fencing a SQL table: the conditional update `... WHERE fence_token <= ?` makes the
//! database refuse a holder whose lock has passed to someone else. SQLite (bundled, no
//! server); the same statement for PostgreSQL is in docs/fencing.md.
//!
//! `cargo run --example sql_fence`

mod common;

use baton::{Backend, Error, Fence, MemoryBackend, Mutex, Session};
use common::sql_fence::{FENCED_UPSERT, SqliteFence};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fence = SqliteFence::new(rusqlite::Connection::open_in_memory()?)?;
    println!("the fenced write is one statement:{FENCED_UPSERT}\n");

    let backend = MemoryBackend::new();
    let old = Session::new(backend.clone()).await?;
    let new = Session::new(backend.clone()).await?;

    let stale = Mutex::new(&old, "orders/lock")?.lock().await?;
    fence
        .write("order-1", stale.fencing_token(), b"status=paid")
        .await?;
    println!(
        "holder 1 (token {}) wrote status=paid",
        stale.fencing_token()
    );

    // Holder 1 loses its lease (revoked here; a pause past the TTL does the same).
    backend.revoke_lease(old.lease_id()).await?;
    let current = Mutex::new(&new, "orders/lock")?.lock().await?;
    fence
        .write("order-1", current.fencing_token(), b"status=refunded")
        .await?;
    println!(
        "holder 2 (token {}) wrote status=refunded",
        current.fencing_token()
    );

    match fence
        .write("order-1", stale.fencing_token(), b"status=shipped")
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
    current.unlock().await?;
    drop(stale);
    Ok(())
}
