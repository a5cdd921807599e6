//! PostgreSQL for the fence tests: the server of the test binary is
//! `baton::testing::PgNode::shared()` (the image `scripts/build-postgres-image.sh` builds, in a
//! container with host networking on a free 127.0.0.1 port). And [`PgFence`]: the SQL fencing
//! pattern of docs/fencing.md, every call on a connection of its
//! own, at PostgreSQL's default isolation level (READ COMMITTED).
#![allow(unreachable_pub)]

use std::sync::OnceLock;

use async_trait::async_trait;
use baton::{Error, Fence, FencingToken, Ticket, admit};

/// The table. `BIGINT`: tokens are 64-bit (`INTEGER` is 32-bit in PostgreSQL).
pub const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS fenced (
        resource    TEXT PRIMARY KEY,
        fence_token BIGINT NOT NULL CHECK (fence_token > 0),
        lock_name   TEXT,
        data        BYTEA
    )";

/// The fenced write: one statement, so the check and the write are one step for the database
/// (the conflicting row is locked and the condition evaluated on its latest version).
pub const FENCED_WRITE: &str = "
    INSERT INTO fenced (resource, fence_token, lock_name, data) VALUES ($1, $2, $3, $4)
    ON CONFLICT (resource) DO UPDATE
        SET fence_token = EXCLUDED.fence_token,
            data = EXCLUDED.data,
            lock_name = coalesce(fenced.lock_name, EXCLUDED.lock_name)
        WHERE fenced.fence_token <= EXCLUDED.fence_token
          AND (fenced.lock_name IS NULL OR EXCLUDED.lock_name IS NULL
               OR fenced.lock_name = EXCLUDED.lock_name)";

/// The claim: the same condition; records the token (and lock), returns the data.
pub const FENCED_CLAIM: &str = "
    INSERT INTO fenced (resource, fence_token, lock_name, data) VALUES ($1, $2, $3, NULL)
    ON CONFLICT (resource) DO UPDATE
        SET fence_token = EXCLUDED.fence_token,
            lock_name = coalesce(fenced.lock_name, EXCLUDED.lock_name)
        WHERE fenced.fence_token <= EXCLUDED.fence_token
          AND (fenced.lock_name IS NULL OR EXCLUDED.lock_name IS NULL
               OR fenced.lock_name = EXCLUDED.lock_name)
    RETURNING data";

/// The running server.
pub struct Postgres {
    pub port: u16,
}

impl Postgres {
    /// The server of this test binary (`baton::testing::PgNode::shared()`), with the
    /// `fenced` table created once.
    pub fn shared() -> &'static Postgres {
        static SHARED: OnceLock<Postgres> = OnceLock::new();
        SHARED.get_or_init(|| {
            let port = baton::testing::PgNode::shared().port();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let client = connect(port).await.unwrap();
                    client.batch_execute(SCHEMA).await.unwrap();
                })
            })
            .join()
            .expect("the fenced table");
            Postgres { port }
        })
    }
}

/// A new connection (its driver runs on the current runtime).
pub async fn connect(port: u16) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={port} user=postgres dbname=postgres"),
        tokio_postgres::NoTls,
    )
    .await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

fn pg_error(op: &'static str, e: tokio_postgres::Error) -> Error {
    Error::Backend {
        op,
        source: e.into(),
        at: Default::default(),
    }
}

/// A [`Fence`] on the `fenced` table; resources are stored under `prefix/`.
#[derive(Debug)]
pub struct PgFence {
    port: u16,
    prefix: String,
}

impl PgFence {
    pub fn new(prefix: &str) -> PgFence {
        PgFence {
            port: Postgres::shared().port,
            prefix: prefix.to_owned(),
        }
    }

    /// Claims, and writes `data` if given, in one transaction on a connection of its own.
    async fn accept(
        &self,
        resource: &str,
        ticket: &Ticket,
        data: Option<&[u8]>,
    ) -> baton::Result<Option<Vec<u8>>> {
        let t = crate::sql_fence::sql_token(resource, ticket)?;
        let key = format!("{}/{resource}", self.prefix);
        let mut client = connect(self.port)
            .await
            .map_err(|e| pg_error("connect", e))?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| pg_error("begin", e))?;
        let outcome = match data {
            Some(data) => tx
                .execute(FENCED_WRITE, &[&key, &t, &ticket.lock(), &data])
                .await
                .map(|changed| (changed == 1).then(|| Some(data.to_vec())))
                .map_err(|e| pg_error("fenced write", e))?,
            None => tx
                .query_opt(FENCED_CLAIM, &[&key, &t, &ticket.lock()])
                .await
                .map_err(|e| pg_error("fenced claim", e))?
                .map(|row| row.get::<_, Option<Vec<u8>>>(0)),
        };
        if let Some(data) = outcome {
            tx.commit().await.map_err(|e| pg_error("commit", e))?;
            return Ok(data);
        }
        // Refused: why, read in the same transaction (a token at least as high as the one
        // that refused us, since tokens only grow).
        let row = tx
            .query_opt(
                "SELECT fence_token, lock_name FROM fenced WHERE resource = $1",
                &[&key],
            )
            .await
            .map_err(|e| pg_error("select", e))?;
        let (highest, bound) = row.map_or((None, None), |r| {
            let token: i64 = r.get(0);
            (
                Some(FencingToken::new(token.unsigned_abs())),
                r.get::<_, Option<String>>(1),
            )
        });
        admit(resource, highest, bound.as_deref(), ticket)?;
        Err(Error::Backend {
            op: "fenced write",
            source: "the row was neither written nor refused".into(),
            at: Default::default(),
        })
    }
}

#[async_trait]
impl Fence for PgFence {
    async fn claim(&self, resource: &str, ticket: Ticket) -> baton::Result<Option<Vec<u8>>> {
        self.accept(resource, &ticket, None).await
    }

    async fn write(&self, resource: &str, ticket: Ticket, data: &[u8]) -> baton::Result<()> {
        self.accept(resource, &ticket, Some(data)).await.map(drop)
    }

    async fn read(&self, resource: &str) -> baton::Result<Option<(FencingToken, Vec<u8>)>> {
        if resource.is_empty() {
            return Err(Error::InvalidArgument("resource name must not be empty"));
        }
        let client = connect(self.port)
            .await
            .map_err(|e| pg_error("connect", e))?;
        let row = client
            .query_opt(
                "SELECT fence_token, data FROM fenced WHERE resource = $1",
                &[&format!("{}/{resource}", self.prefix)],
            )
            .await
            .map_err(|e| pg_error("select", e))?;
        Ok(row.map(|r| {
            let token: i64 = r.get(0);
            (
                FencingToken::new(token.unsigned_abs()),
                r.get::<_, Option<Vec<u8>>>(1).unwrap_or_default(),
            )
        }))
    }
}
