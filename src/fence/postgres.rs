//! [`PgFence`]: a [`Fence`] in baton's schema, usable inside the application's own
//! transaction so that the token check and the protected write commit together.

use async_trait::async_trait;
use tokio_postgres::types::Type;

use super::{Fence, Ticket, admit, check_args};
use crate::backend::postgres::{PgBackend, map_db_error, schema};
use crate::error::{Error, Result};
use crate::token::FencingToken;

/// The claim, and with data the write: one statement, so the check and the record are one
/// step for the database (the conflicting row is locked and the condition evaluated on its
/// latest version). `$4` NULL claims: the data stays as it is and is returned.
const ACCEPT: &str = "
    INSERT INTO {s}.fences AS f (resource, token, lock_name, data) VALUES ($1, $2, $3, $4)
    ON CONFLICT (resource) DO UPDATE
        SET token = EXCLUDED.token,
            data = CASE WHEN $5 THEN EXCLUDED.data ELSE f.data END,
            lock_name = coalesce(f.lock_name, EXCLUDED.lock_name)
        WHERE f.token <= EXCLUDED.token
          AND (f.lock_name IS NULL OR EXCLUDED.lock_name IS NULL
               OR f.lock_name = EXCLUDED.lock_name)
    RETURNING data";

const WHY: &str = "SELECT token, lock_name FROM {s}.fences WHERE resource = $1";
const READ: &str = "SELECT token, data FROM {s}.fences WHERE resource = $1";

/// A [`Fence`] kept in PostgreSQL, in baton's schema (table `fences`), beside the locks.
///
/// Use it when the resource a lock protects lives in PostgreSQL too: [`claim_in`] and
/// [`write_in`] check and record the token **inside your own transaction**, so that your
/// writes and the fence's record commit together or not at all. The fence's row stays locked
/// until that transaction ends: a newer holder's claim waits for it, then either sees this
/// token (and goes on) or, if this transaction rolled back, never does. A holder that paused
/// past its lease cannot commit a write after its successor claimed: its claim is refused, and
/// if it claimed first the successor's claim waited for its commit, so the successor reads
/// what it wrote. No idempotency key, no second system, no window between "fence says yes"
/// and "data written".
///
/// The [`Fence`] methods do the same in a transaction of their own, through the backend's
/// connection.
///
/// [`claim_in`]: PgFence::claim_in
/// [`write_in`]: PgFence::write_in
///
/// ```no_run
/// # async fn demo(backend: baton::PgBackend, guard: baton::MutexGuard, db: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
/// let fence = baton::PgFence::new(&backend);
/// let tx = db.transaction().await?;
/// fence.claim_in(&tx, "stock/widget", &guard.ticket()).await?; // refused if stale
/// tx.execute("UPDATE stock SET count = count - 1 WHERE item = 'widget'", &[]).await?;
/// tx.commit().await?; // the claim and the update, together
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgFence {
    backend: PgBackend,
    accept: String,
    why: String,
    read: String,
}

fn token_param(resource: &str, ticket: &Ticket) -> Result<i64> {
    check_args(resource, ticket.token())?;
    i64::try_from(ticket.token().get())
        .map_err(|_| Error::InvalidArgument("fencing token above PostgreSQL's bigint"))
}

fn pg(op: &'static str, e: tokio_postgres::Error) -> Error {
    map_db_error(op, e)
}

impl PgFence {
    /// A fence in `backend`'s schema (the table is created with the schema). As every
    /// fence in a store, made from that store's backend (`&backend`, or the backend itself).
    pub fn new(backend: impl std::borrow::Borrow<PgBackend>) -> PgFence {
        let backend = backend.borrow();
        let s = backend.schema();
        PgFence {
            backend: backend.clone(),
            accept: schema::render(ACCEPT, s),
            why: schema::render(WHY, s),
            read: schema::render(READ, s),
        }
    }

    /// Claims `resource` for `ticket` inside `tx` (see [`Fence::claim`]): records the token
    /// unless a higher one was accepted, and returns the data as it stands. Nothing is
    /// committed until `tx` is; the fence's row stays locked until then.
    ///
    /// # Errors
    /// [`Error::StaleToken`] or [`Error::ForeignLock`] if refused (nothing recorded; roll
    /// `tx` back or leave it: nothing of the fence's is in it); [`Error::InvalidArgument`];
    /// a server error as [`Error::Backend`] (the transaction is then aborted, as for any
    /// failed statement).
    ///
    /// # Cancel safety
    /// If the future is dropped, the claim may be part of `tx` or not; `tx` decides.
    pub async fn claim_in(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        resource: &str,
        ticket: &Ticket,
    ) -> Result<Option<Vec<u8>>> {
        self.accept_in(tx, resource, ticket, None).await
    }

    /// Writes `data` for `resource` with `ticket` inside `tx` (see [`Fence::write`]).
    ///
    /// # Errors
    /// As for [`claim_in`](PgFence::claim_in).
    ///
    /// # Cancel safety
    /// As for [`claim_in`](PgFence::claim_in).
    pub async fn write_in(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        resource: &str,
        ticket: &Ticket,
        data: &[u8],
    ) -> Result<()> {
        self.accept_in(tx, resource, ticket, Some(data))
            .await
            .map(drop)
    }

    async fn accept_in(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        resource: &str,
        ticket: &Ticket,
        data: Option<&[u8]>,
    ) -> Result<Option<Vec<u8>>> {
        let token = token_param(resource, ticket)?;
        let lock = ticket.lock();
        let write = data.is_some();
        let rows = tx
            .query_typed(
                &self.accept,
                &[
                    (&resource, Type::TEXT),
                    (&token, Type::INT8),
                    (&lock, Type::TEXT),
                    (&data, Type::BYTEA),
                    (&write, Type::BOOL),
                ],
            )
            .await
            .map_err(|e| pg("fence", e))?;
        if let Some(row) = rows.first() {
            return Ok(row.get::<_, Option<Vec<u8>>>(0));
        }
        // Refused: why, read in the same transaction (the row is as the refusal saw it or
        // newer; tokens only grow).
        let rows = tx
            .query_typed(&self.why, &[(&resource, Type::TEXT)])
            .await
            .map_err(|e| pg("fence", e))?;
        refusal(resource, ticket, rows.first())
    }
}

fn refusal(
    resource: &str,
    ticket: &Ticket,
    row: Option<&tokio_postgres::Row>,
) -> Result<Option<Vec<u8>>> {
    let (highest, bound) = row.map_or((None, None), |r| {
        let token: i64 = r.get(0);
        (
            Some(FencingToken::new(token.unsigned_abs())),
            r.get::<_, Option<String>>(1),
        )
    });
    admit(resource, highest, bound.as_deref(), ticket)?;
    Err(Error::Backend {
        op: "fence",
        at: Default::default(),
        source: "the fence row was neither written nor refused".into(),
    })
}

impl PgFence {
    async fn accept(
        &self,
        resource: &str,
        ticket: &Ticket,
        data: Option<&[u8]>,
    ) -> Result<Option<Vec<u8>>> {
        let token = token_param(resource, ticket)?;
        let lock = ticket.lock();
        let write = data.is_some();
        let accept = &self.accept;
        // One statement, retried as one: a retry with the same token is admitted again
        // (equal tokens are), so a lost answer is answered by the retry.
        let (rows, maybe_applied) = self
            .backend
            .request("fence", |c| async move {
                c.query(
                    accept,
                    &[
                        (&resource, Type::TEXT),
                        (&token, Type::INT8),
                        (&lock, Type::TEXT),
                        (&data, Type::BYTEA),
                        (&write, Type::BOOL),
                    ],
                )
                .await
            })
            .await?;
        if let Some(row) = rows.first() {
            return Ok(row.get::<_, Option<Vec<u8>>>(0));
        }
        if maybe_applied {
            // An earlier attempt may have been applied before a higher token came: refusing
            // now would claim more than anyone knows.
            return Err(Error::OutcomeUnknown {
                op: "fence",
                at: Default::default(),
                source: "an earlier attempt may have been applied; the retry was refused".into(),
            });
        }
        let why = &self.why;
        let rows = self
            .backend
            .read_request("fence", |c| async move {
                c.query(why, &[(&resource, Type::TEXT)]).await
            })
            .await?;
        refusal(resource, ticket, rows.first())
    }
}

#[async_trait]
impl Fence for PgFence {
    async fn claim(&self, resource: &str, ticket: Ticket) -> Result<Option<Vec<u8>>> {
        self.accept(resource, &ticket, None).await
    }

    async fn write(&self, resource: &str, ticket: Ticket, data: &[u8]) -> Result<()> {
        self.accept(resource, &ticket, Some(data)).await.map(drop)
    }

    async fn read(&self, resource: &str) -> Result<Option<(FencingToken, Vec<u8>)>> {
        if resource.is_empty() {
            return Err(Error::InvalidArgument("resource name must not be empty"));
        }
        let read = &self.read;
        let rows = self
            .backend
            .read_request("fence", |c| async move {
                c.query(read, &[(&resource, Type::TEXT)]).await
            })
            .await?;
        Ok(rows.first().map(|r| {
            let token: i64 = r.get(0);
            (
                FencingToken::new(token.unsigned_abs()),
                r.get::<_, Option<Vec<u8>>>(1).unwrap_or_default(),
            )
        }))
    }
}
