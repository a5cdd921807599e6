//! A [`Fence`] on a SQL table (SQLite here; the PostgreSQL form is in docs/fencing.md and is
//! tested in tests/fence.rs).
//!
//! Each check is one statement: the row is claimed or written only if its stored token is not
//! higher than ours (and it is bound to no other lock), so the database itself refuses a
//! stale writer. When it refuses, the highest token is read in the same transaction. Every
//! call opens its own connection, as the processes sharing a database would.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use baton::fence::admit;
use baton::{Error, Fence, FencingToken, Ticket};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

/// The table. `fence_token` is a 64-bit integer in SQLite (`INTEGER`); in PostgreSQL it must
/// be `BIGINT` (`INTEGER` is 32-bit there). `data` is NULL until the first write.
pub(crate) const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS fenced (
        resource    TEXT PRIMARY KEY,
        fence_token INTEGER NOT NULL,
        lock_name   TEXT,
        data        BLOB
    )";

/// The fenced write: insert, or update only where the stored token is not higher than ours
/// and the row is bound to no other lock. A row bound to no lock is bound to ours. A stored
/// token that is not a positive integer (written by something else) is never overwritten:
/// SQLite compares values of mixed types, so the type is checked too.
pub(crate) const FENCED_WRITE: &str = "
    INSERT INTO fenced (resource, fence_token, lock_name, data) VALUES (?1, ?2, ?3, ?4)
    ON CONFLICT (resource) DO UPDATE
        SET fence_token = excluded.fence_token,
            data = excluded.data,
            lock_name = coalesce(fenced.lock_name, excluded.lock_name)
        WHERE fenced.fence_token <= excluded.fence_token
          AND typeof(fenced.fence_token) = 'integer' AND fenced.fence_token > 0
          AND (fenced.lock_name IS NULL OR excluded.lock_name IS NULL
               OR fenced.lock_name = excluded.lock_name)";

/// The claim: the same condition, the token (and lock) recorded, the data left as it is and
/// returned.
pub(crate) const FENCED_CLAIM: &str = "
    INSERT INTO fenced (resource, fence_token, lock_name, data) VALUES (?1, ?2, ?3, NULL)
    ON CONFLICT (resource) DO UPDATE
        SET fence_token = excluded.fence_token,
            lock_name = coalesce(fenced.lock_name, excluded.lock_name)
        WHERE fenced.fence_token <= excluded.fence_token
          AND typeof(fenced.fence_token) = 'integer' AND fenced.fence_token > 0
          AND (fenced.lock_name IS NULL OR excluded.lock_name IS NULL
               OR fenced.lock_name = excluded.lock_name)
    RETURNING data";

#[derive(Debug)]
pub(crate) struct SqliteFence {
    path: PathBuf,
}

/// Checks what every SQL fence refuses before it sends anything, and gives the token as the
/// signed 64-bit integer SQL stores.
pub(crate) fn sql_token(resource: &str, ticket: &Ticket) -> baton::Result<i64> {
    if resource.is_empty() {
        return Err(Error::InvalidArgument("resource name must not be empty"));
    }
    i64::try_from(ticket.token().get())
        .ok()
        .filter(|t| *t > 0)
        .ok_or(Error::InvalidArgument(
            "fencing token must be in 1..=i64::MAX",
        ))
}

fn sql_error(op: &'static str, e: rusqlite::Error) -> Error {
    Error::Backend {
        op,
        source: e.into(),
        at: Default::default(),
    }
}

/// What a row holds: its token, its lock, its data.
type Row = (FencingToken, Option<String>, Option<Vec<u8>>);

impl SqliteFence {
    /// A fence on the database file at `path` (created if missing).
    pub(crate) fn open(path: impl AsRef<Path>) -> baton::Result<Self> {
        let fence = SqliteFence {
            path: path.as_ref().to_owned(),
        };
        fence
            .connect()?
            .execute_batch(SCHEMA)
            .map_err(|e| sql_error("create table", e))?;
        Ok(fence)
    }

    /// A new connection, as another process would open one.
    pub(crate) fn connect(&self) -> baton::Result<Connection> {
        let conn = Connection::open(&self.path).map_err(|e| sql_error("open", e))?;
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(|e| sql_error("busy timeout", e))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| sql_error("journal mode", e))?;
        Ok(conn)
    }

    fn stored(conn: &Connection, resource: &str) -> baton::Result<Option<Row>> {
        let row: Option<(rusqlite::types::Value, Option<String>, Option<Vec<u8>>)> = conn
            .query_row(
                "SELECT fence_token, lock_name, data FROM fenced WHERE resource = ?1",
                params![resource],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(|e| sql_error("select", e))?;
        let Some((token, lock, data)) = row else {
            return Ok(None);
        };
        match token {
            rusqlite::types::Value::Integer(t) if t > 0 => {
                Ok(Some((FencingToken::new(t.unsigned_abs()), lock, data)))
            }
            other => Err(Error::CorruptFence {
                resource: resource.to_owned(),
                stored: format!("{other:?}"),
            }),
        }
    }

    /// Claims, and writes `data` if given, in one transaction on a connection of its own.
    fn accept(
        &self,
        resource: &str,
        ticket: &Ticket,
        data: Option<&[u8]>,
    ) -> baton::Result<Option<Vec<u8>>> {
        let t = sql_token(resource, ticket)?;
        let mut conn = self.connect()?;
        // Deferred: the first statement is the conditional write, which takes the write
        // lock; nothing is read before it.
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Deferred)
            .map_err(|e| sql_error("begin", e))?;
        let outcome = match data {
            Some(data) => tx
                .execute(FENCED_WRITE, params![resource, t, ticket.lock(), data])
                .map(|changed| (changed == 1).then(|| Some(data.to_vec())))
                .map_err(|e| sql_error("fenced write", e))?,
            None => tx
                .query_row(FENCED_CLAIM, params![resource, t, ticket.lock()], |r| {
                    r.get::<_, Option<Vec<u8>>>(0)
                })
                .optional()
                .map_err(|e| sql_error("fenced claim", e))?,
        };
        // In the same transaction: what made the statement refuse (or a corrupt token).
        let stored = Self::stored(&tx, resource)?;
        match outcome {
            Some(data) => {
                tx.commit().map_err(|e| sql_error("commit", e))?;
                Ok(data)
            }
            None => {
                let (highest, bound) = stored.map_or((None, None), |(h, l, _)| (Some(h), l));
                admit(resource, highest, bound.as_deref(), ticket)?;
                Err(Error::Backend {
                    op: "fenced write",
                    source: "the row was neither written nor refused".into(),
                    at: Default::default(),
                })
            }
        }
    }
}

#[async_trait]
impl Fence for SqliteFence {
    async fn claim(&self, resource: &str, ticket: Ticket) -> baton::Result<Option<Vec<u8>>> {
        self.accept(resource, &ticket, None)
    }

    async fn write(&self, resource: &str, ticket: Ticket, data: &[u8]) -> baton::Result<()> {
        self.accept(resource, &ticket, Some(data)).map(drop)
    }

    async fn read(&self, resource: &str) -> baton::Result<Option<(FencingToken, Vec<u8>)>> {
        if resource.is_empty() {
            return Err(Error::InvalidArgument("resource name must not be empty"));
        }
        let conn = self.connect()?;
        Ok(Self::stored(&conn, resource)?.map(|(t, _, d)| (t, d.unwrap_or_default())))
    }
}
