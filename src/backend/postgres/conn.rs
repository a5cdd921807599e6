//! The request connection, with the statements prepared on it.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row, Statement};

/// One request connection. Each distinct SQL text is prepared (named) on first use and kept
/// for the connection's life, so the server parses and plans it once per connection instead of
/// once per request: at the queue's rate, planning was the larger part of the server's time
/// (docs/design.md, 2026-11-26).
#[derive(Debug)]
pub(crate) struct Conn {
    client: Client,
    prepared: Mutex<HashMap<String, Statement>>,
    /// The server's system identifier (`pg_control_system()`), read when the connection
    /// opened: the first half of the store's identity (see `epoch_answered`).
    system_id: u64,
}

/// A parameter and its PostgreSQL type.
pub(crate) type Param<'a> = (&'a (dyn ToSql + Sync), Type);

impl Conn {
    pub(crate) fn new(client: Client, system_id: u64) -> Conn {
        Conn {
            client,
            prepared: Mutex::new(HashMap::new()),
            system_id,
        }
    }

    /// The client, for a caller that runs its own transaction (the migration, before the
    /// connection is shared).
    pub(crate) fn client_mut(&mut self) -> &mut Client {
        &mut self.client
    }

    /// The system identifier of the server this connection reached.
    pub(crate) fn system_id(&self) -> u64 {
        self.system_id
    }

    /// Whether the connection is closed (a request would fail at once).
    pub(crate) fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    async fn statement(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Statement, tokio_postgres::Error> {
        let cached = self
            .prepared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(sql)
            .cloned();
        if let Some(statement) = cached {
            return Ok(statement);
        }
        let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
        // Two tasks may prepare the same text at once: both statements work, one is kept.
        let statement = self.client.prepare_typed(sql, &types).await?;
        self.prepared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    /// Sends a notification on `channel` (an unnamed statement: one round trip, nothing kept
    /// on the connection).
    pub(crate) async fn notify(&self, channel: &str) -> Result<(), tokio_postgres::Error> {
        self.client
            .query_typed("SELECT pg_notify($1, '')", &[(&channel, Type::TEXT)])
            .await
            .map(drop)
    }

    /// Runs `sql` (prepared on first use) and returns its rows.
    pub(crate) async fn query(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let statement = self.statement(sql, params).await?;
        let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
        self.client.query(&statement, &values).await
    }

    /// Runs `sql` (prepared on first use) and returns how many rows it changed.
    pub(crate) async fn execute(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<u64, tokio_postgres::Error> {
        let statement = self.statement(sql, params).await?;
        let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
        self.client.execute(&statement, &values).await
    }
}
