//! A [`Fence`] on a SQL table (SQLite here; the PostgreSQL form is in docs/fencing.md).
//!
//! The whole check is one statement: the row is updated only if its stored token is not
//! higher than ours, so the database itself refuses a stale writer.

use std::sync::Mutex;

use async_trait::async_trait;
use baton::{Error, Fence, FencingToken};
use rusqlite::{Connection, OptionalExtension, params};

/// The conditional upsert: insert, or update only where `fence_token <= ?2`.
pub(crate) const FENCED_UPSERT: &str = "
    INSERT INTO fenced (resource, fence_token, data) VALUES (?1, ?2, ?3)
    ON CONFLICT (resource) DO UPDATE
        SET fence_token = excluded.fence_token, data = excluded.data
        WHERE fenced.fence_token <= excluded.fence_token";

#[derive(Debug)]
pub(crate) struct SqliteFence {
    conn: Mutex<Connection>,
}

fn sql_error(op: &'static str, e: rusqlite::Error) -> Error {
    Error::Backend {
        op,
        source: e.into(),
    }
}

impl SqliteFence {
    pub(crate) fn new(conn: Connection) -> baton::Result<Self> {
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS fenced (
                 resource    TEXT PRIMARY KEY,
                 fence_token INTEGER NOT NULL,
                 data        BLOB NOT NULL
             )",
        )
        .map_err(|e| sql_error("create table", e))?;
        Ok(SqliteFence {
            conn: Mutex::new(conn),
        })
    }

    /// Runs `f` on the connection (for tests that need raw access).
    pub(crate) fn with_conn<T>(&self, f: impl FnOnce(&Connection) -> T) -> T {
        f(&self.conn.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn stored(conn: &Connection, resource: &str) -> baton::Result<Option<(FencingToken, Vec<u8>)>> {
        let row: Option<(rusqlite::types::Value, Vec<u8>)> = conn
            .query_row(
                "SELECT fence_token, data FROM fenced WHERE resource = ?1",
                params![resource],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(|e| sql_error("select", e))?;
        let Some((token, data)) = row else {
            return Ok(None);
        };
        match token {
            rusqlite::types::Value::Integer(t) if t > 0 => {
                Ok(Some((FencingToken::new(t.unsigned_abs()), data)))
            }
            other => Err(Error::CorruptFence {
                resource: resource.to_owned(),
                stored: format!("{other:?}"),
            }),
        }
    }
}

#[async_trait]
impl Fence for SqliteFence {
    async fn write(&self, resource: &str, token: FencingToken, data: &[u8]) -> baton::Result<()> {
        if resource.is_empty() {
            return Err(Error::InvalidArgument("resource name must not be empty"));
        }
        let t =
            i64::try_from(token.get())
                .ok()
                .filter(|t| *t > 0)
                .ok_or(Error::InvalidArgument(
                    "fencing token must be in 1..=i64::MAX",
                ))?;
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        // Refuse a corrupt row before writing anything over it.
        let current = Self::stored(&conn, resource)?;
        let changed = conn
            .execute(FENCED_UPSERT, params![resource, t, data])
            .map_err(|e| sql_error("fenced upsert", e))?;
        if changed == 1 {
            return Ok(());
        }
        let highest = current.map_or(FencingToken::new(0), |(h, _)| h);
        Err(Error::StaleToken {
            resource: resource.to_owned(),
            token,
            highest,
        })
    }

    async fn read(&self, resource: &str) -> baton::Result<Option<(FencingToken, Vec<u8>)>> {
        if resource.is_empty() {
            return Err(Error::InvalidArgument("resource name must not be empty"));
        }
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        Self::stored(&conn, resource)
    }
}
