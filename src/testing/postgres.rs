//! [`PgNode`]: one PostgreSQL server in a container for tests, from the image
//! `scripts/build-postgres-image.sh` builds out of Debian's package.

use std::time::Duration;

use testcontainers::{ContainerAsync, GenericImage};
use tokio::time::Instant;

use super::fixture::{FixtureError, Server, free_port, start_shared};
use super::tls::{ServerTls, TLS_CA, TLS_CERT, TLS_KEY};

/// The image used when `BATON_POSTGRES_IMAGE` is not set: the one
/// `scripts/build-postgres-image.sh` builds from Debian's `postgresql` package.
pub const DEFAULT_POSTGRES_IMAGE: &str = "local/postgres:debian";

const POSTGRES: Server = Server {
    name: "postgres",
    image_var: "BATON_POSTGRES_IMAGE",
    default_image: DEFAULT_POSTGRES_IMAGE,
    entrypoint: "postgres-entrypoint",
    local: "`postgres`",
    ready: "database system is ready to accept connections",
    build_script: include_str!("../../scripts/build-postgres-image.sh"),
    // `revision` in the script: pg_basebackup, standbys and PgBouncer.
    layout: Some("2"),
};

/// A standby from the same image: its log says it is ready for read-only connections.
const POSTGRES_STANDBY: Server = Server {
    ready: "database system is ready to accept read-only connections",
    ..POSTGRES
};

/// How long a server started again has to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// One PostgreSQL server for tests, in a container with host networking on a free port of
/// 127.0.0.1: user `postgres` (no password, trust authentication), database `postgres`, data
/// in the container (kept across [`stop_fast`](Self::stop_fast) /
/// [`stop_immediate`](Self::stop_immediate) and [`start_again`](Self::start_again)).
///
/// The image runs the server with `fsync=off` (its data lives as long as the container): a
/// stop, even an immediate one, loses nothing the server acknowledged, because the kernel
/// keeps what the server wrote; only a crash of the machine would. Fault tests can stop it
/// (fast or immediate shutdown), start it again, pause it, and end client connections with
/// `pg_terminate_backend` ([`terminate`](Self::terminate)).
///
/// There is no local-process fallback: without Docker, [`start`](Self::start) fails with
/// Docker's error.
#[derive(Debug)]
pub struct PgNode {
    port: u16,
    container: ContainerAsync<GenericImage>,
    /// The host directory bound at the container's `/tmp` (the data directory and base
    /// backups in it), for a node started with [`start_with_host_data`](Self::start_with_host_data).
    host_tmp: Option<std::path::PathBuf>,
    /// The PgBouncers started in the container (port, the script that starts it): started
    /// again with the server.
    poolers: std::sync::Mutex<Vec<(u16, String)>>,
}

impl PgNode {
    /// Starts a server on a free port of 127.0.0.1.
    ///
    /// # Errors
    /// [`FixtureError`] if the container does not start (or the image cannot be built).
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing running: a container started so far is removed.
    pub async fn start() -> Result<PgNode, FixtureError> {
        PgNode::start_with(&[]).await
    }

    /// As [`start`](Self::start), with extra `postgres` arguments after the image's own, e.g.
    /// `&["-c", "max_connections=300"]`.
    ///
    /// # Errors
    /// As for [`start`](Self::start).
    ///
    /// # Cancel safety
    /// As for [`start`](Self::start).
    pub async fn start_with(args: &[&str]) -> Result<PgNode, FixtureError> {
        let port = free_port()?;
        let mut all = vec![port.to_string(), "-c".into(), "max_connections=400".into()];
        all.extend(args.iter().map(|a| (*a).to_owned()));
        PgNode::launch(&POSTGRES, port, all, None).await
    }

    /// Starts `server`'s container on `port` with `args` and waits until it answers; a new
    /// primary is marked as baton's ([`PgBackend::init_store`](crate::PgBackend::init_store)),
    /// so that tests wait no restart grace at its first use.
    async fn launch(
        server: &Server,
        port: u16,
        args: Vec<String>,
        host_tmp: Option<std::path::PathBuf>,
    ) -> Result<PgNode, FixtureError> {
        let mount = host_tmp
            .as_ref()
            .map(|dir| (dir.to_string_lossy().into_owned(), "/tmp".to_owned()));
        let container = server
            .start_container_mounted(args, Vec::new(), mount)
            .await?;
        let node = PgNode {
            port,
            container,
            host_tmp,
            poolers: std::sync::Mutex::new(Vec::new()),
        };
        node.wait_ready().await?;
        if server.ready == POSTGRES.ready {
            node.init_store().await?;
        }
        Ok(node)
    }

    /// Marks the new server's schema `baton` as baton's (`baton init`).
    async fn init_store(&self) -> Result<(), FixtureError> {
        let failed = |e: crate::Error| FixtureError::Process {
            server: "postgres",
            reason: format!("marking the new PostgreSQL as baton's: {e}"),
        };
        self.backend()
            .await
            .map_err(failed)?
            .init_store()
            .await
            .map_err(failed)?;
        Ok(())
    }

    /// As [`start_with`](Self::start_with), with the container's `/tmp` (the data directory,
    /// and the base backups [`take_base_backup`](Self::take_base_backup) makes) in a
    /// directory of the host, so that a stopped server's data can be wiped
    /// ([`wipe_data`](Self::wipe_data): a server re-created without its data) or replaced
    /// by a base backup ([`restore_base_backup`](Self::restore_base_backup)), and
    /// [`start_again`](Self::start_again) serves what is there, on the same port.
    ///
    /// # Errors
    /// [`FixtureError`] if the directory cannot be made or the container does not start.
    ///
    /// # Cancel safety
    /// As for [`start`](Self::start).
    pub async fn start_with_host_data(args: &[&str]) -> Result<PgNode, FixtureError> {
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("baton-pg-data-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        // The server runs as its own user: /tmp's mode, for any user, with the sticky bit.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777))?;
        let mut all = vec![port.to_string(), "-c".into(), "max_connections=400".into()];
        all.extend(args.iter().map(|a| (*a).to_owned()));
        PgNode::launch(&POSTGRES, port, all, Some(dir)).await
    }

    /// Whether the server was started with
    /// [`start_with_host_data`](Self::start_with_host_data): its data can be wiped or
    /// replaced by a base backup.
    pub fn has_host_data(&self) -> bool {
        self.host_tmp.is_some()
    }

    fn host_tmp(&self, what: &'static str) -> Result<&std::path::Path, FixtureError> {
        self.host_tmp
            .as_deref()
            .ok_or_else(|| FixtureError::Process {
                server: "postgres",
                reason: format!("{what}: the node was not started with start_with_host_data"),
            })
    }

    /// Takes a base backup of the running server (`pg_basebackup -X stream -c fast`, as an
    /// operator's nightly backup), named `name`, beside its data directory.
    ///
    /// # Errors
    /// Docker's error, or `pg_basebackup`'s.
    ///
    /// # Cancel safety
    /// If the future is dropped, the backup may be half written.
    pub async fn take_base_backup(&self, name: &str) -> Result<(), FixtureError> {
        self.host_tmp("take_base_backup")?;
        let port = self.port.to_string();
        let dir = format!("/tmp/backup-{name}");
        docker(&[
            "exec",
            self.container.id(),
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "postgres",
            "-D",
            &dir,
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        ])
        .await
    }

    /// Replaces the stopped server's data directory with the base backup `name` (restored
    /// as an operator restores one, without a `recovery.signal`: the server recovers to the
    /// end of the backup and goes on on the same timeline, its WAL position back where the
    /// backup ended). [`start_again`](Self::start_again) then serves it.
    ///
    /// # Errors
    /// The file system's error, or `cp`'s.
    pub fn restore_base_backup(&self, name: &str) -> Result<(), FixtureError> {
        let tmp = self.host_tmp("restore_base_backup")?;
        let data = tmp.join("pgdata");
        std::fs::remove_dir_all(&data)?;
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(tmp.join(format!("backup-{name}")))
            .arg(&data)
            .status()?;
        if !status.success() {
            return Err(FixtureError::Process {
                server: "postgres",
                reason: format!("cp -a of the base backup {name}: {status}"),
            });
        }
        Ok(())
    }

    /// Deletes the stopped server's data directory: [`start_again`](Self::start_again) then
    /// creates a new cluster on the same port (a server re-created without its data: another
    /// system identifier, no baton schema).
    ///
    /// # Errors
    /// The file system's error.
    pub fn wipe_data(&self) -> Result<(), FixtureError> {
        let tmp = self.host_tmp("wipe_data")?;
        std::fs::remove_dir_all(tmp.join("pgdata"))?;
        Ok(())
    }

    /// Starts an asynchronous streaming standby of the server on 127.0.0.1:`primary_port`
    /// (a server's [`port`](Self::port), or a [`Proxy`](crate::testing::Proxy) in front of
    /// it, so that a test can cut replication), in a container of its own on a free port: a
    /// copy made with `pg_basebackup`, read-only until [`promote`](Self::promote)d. The
    /// primary does not wait for it (no `synchronous_standby_names`): what the primary
    /// committed after the standby last heard from it is not on the standby.
    ///
    /// # Errors
    /// [`FixtureError`] if the container does not start (the primary cannot be reached, say).
    ///
    /// # Cancel safety
    /// As for [`start`](Self::start).
    pub async fn start_standby_of(primary_port: u16) -> Result<PgNode, FixtureError> {
        let port = free_port()?;
        let args = vec![
            port.to_string(),
            "--standby-of".into(),
            primary_port.to_string(),
            "-c".into(),
            "max_connections=400".into(),
        ];
        PgNode::launch(&POSTGRES_STANDBY, port, args, None).await
    }

    /// Promotes this standby to a primary (`pg_promote()`, which waits until it is one): it
    /// starts a new timeline and accepts writes.
    ///
    /// # Errors
    /// The client's error; [`FixtureError::NotReady`] if it was not promoted within a minute.
    ///
    /// # Cancel safety
    /// If the future is dropped, the promotion may go on.
    pub async fn promote(&self) -> Result<(), FixtureError> {
        let failed = |e: tokio_postgres::Error| FixtureError::Command {
            server: "postgres",
            command: "SELECT pg_promote(true, 60)",
            source: Box::new(e),
        };
        let client = self.client().await.map_err(failed)?;
        let promoted: bool = client
            .query_one("SELECT pg_promote(true, 60)", &[])
            .await
            .map_err(failed)?
            .get(0);
        if !promoted {
            return Err(FixtureError::NotReady {
                server: "postgres",
                address: format!("127.0.0.1:{} (promotion)", self.port),
            });
        }
        Ok(())
    }

    /// Waits until this standby has replayed everything `primary` had written when called
    /// (checked every 25 ms, for up to 30 s).
    ///
    /// # Errors
    /// The client's error if either server cannot be read; [`FixtureError::NotReady`] if the
    /// standby is still behind after 30 s.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn wait_replayed(&self, primary: &PgNode) -> Result<(), FixtureError> {
        const WRITTEN: &str = "SELECT pg_current_wal_lsn()::text";
        const REPLAYED: &str =
            "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false)";
        let failed = |command: &'static str| {
            move |e: tokio_postgres::Error| FixtureError::Command {
                server: "postgres",
                command,
                source: Box::new(e),
            }
        };
        let written: String = primary
            .client()
            .await
            .map_err(failed(WRITTEN))?
            .query_one(WRITTEN, &[])
            .await
            .map_err(failed(WRITTEN))?
            .get(0);
        let standby = self.client().await.map_err(failed(REPLAYED))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let replayed: bool = standby
                .query_one(REPLAYED, &[&written])
                .await
                .map_err(failed(REPLAYED))?
                .get(0);
            if replayed {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(FixtureError::NotReady {
                    server: "postgres",
                    address: format!("127.0.0.1:{} (replaying {written})", self.port),
                });
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The server of this test process, started on first use and shared by its tests (each
    /// should use its own lock names, or its own schema).
    ///
    /// # Panics
    /// If the server cannot be started: a test cannot run without it.
    pub fn shared() -> &'static PgNode {
        static SHARED: std::sync::OnceLock<PgNode> = std::sync::OnceLock::new();
        SHARED.get_or_init(|| start_shared("postgres", PgNode::start))
    }

    /// The URL: `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The container's id, for `docker` commands and its cgroup (the bench reads the
    /// server's CPU time there).
    pub fn container_id(&self) -> &str {
        self.container.id()
    }

    /// A backend on this server with default options (schema `baton`).
    ///
    /// # Errors
    /// As for [`PgBackend::connect`](crate::PgBackend::connect).
    ///
    /// # Cancel safety
    /// As for [`PgBackend::connect`](crate::PgBackend::connect).
    pub async fn backend(&self) -> crate::Result<crate::PgBackend> {
        crate::PgBackend::connect(&self.url(), crate::PgOptions::new()).await
    }

    /// A plain client as the superuser, its connection driven on the current runtime: for
    /// tests that read or write behind baton's back, or play the application.
    ///
    /// # Errors
    /// The client's error, if it cannot connect.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is created on the server.
    pub async fn client(&self) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let (client, connection) = tokio_postgres::connect(
            &format!(
                "host=127.0.0.1 port={} user=postgres dbname=postgres",
                self.port
            ),
            tokio_postgres::NoTls,
        )
        .await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }

    /// Ends, with `pg_terminate_backend`, every connection whose `application_name` is
    /// `application` (set it with `?application_name=...` in a backend's URL; baton's own
    /// connections say `baton` unless told otherwise). Returns how many it ended.
    ///
    /// # Errors
    /// The client's error.
    ///
    /// # Cancel safety
    /// If the future is dropped, some connections may have been ended.
    pub async fn terminate(&self, application: &str) -> Result<u64, tokio_postgres::Error> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = $1 AND pid <> pg_backend_pid()",
                &[&application],
            )
            .await?;
        Ok(row.get::<_, i64>(0).unsigned_abs())
    }

    /// Stops the server with a fast shutdown (`docker stop`: SIGINT to postgres: clients are
    /// disconnected, a checkpoint is written). [`start_again`](Self::start_again) brings it
    /// back with its data.
    ///
    /// # Errors
    /// Docker's error.
    ///
    /// # Cancel safety
    /// If the future is dropped, the server may or may not be stopping.
    pub async fn stop_fast(&self) -> Result<(), FixtureError> {
        self.container
            .stop_with_timeout(Some(30))
            .await
            .map_err(|e| POSTGRES.container_error(e))
    }

    /// Stops the server with an immediate shutdown (SIGQUIT to postgres: no checkpoint; the
    /// next start replays the WAL, as after a crash of the server process).
    ///
    /// # Errors
    /// Docker's error.
    ///
    /// # Cancel safety
    /// If the future is dropped, the server may or may not be stopping.
    pub async fn stop_immediate(&self) -> Result<(), FixtureError> {
        let id = self.container.id();
        docker(&["kill", "--signal", "QUIT", id]).await?;
        // The entrypoint exits once postgres has; wait for the container to stop.
        docker(&["wait", id]).await
    }

    /// Starts the server again after a stop, on the same port with the same data, and waits
    /// until it accepts connections; and the PgBouncers started in front of it, on their
    /// ports.
    ///
    /// # Errors
    /// Docker's error, or [`FixtureError::NotReady`] if it does not come up in time.
    ///
    /// # Cancel safety
    /// If the future is dropped, the server may be starting.
    pub async fn start_again(&self) -> Result<(), FixtureError> {
        self.container
            .start()
            .await
            .map_err(|e| POSTGRES.container_error(e))?;
        self.wait_ready().await?;
        let poolers = self
            .poolers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for (port, script) in poolers {
            // Its pid file is still in the container's /tmp; pgbouncer replaces a stale one.
            self.run_pgbouncer(port, &script).await?;
        }
        Ok(())
    }

    /// Freezes the server (`docker pause`): connections stay open, nothing answers.
    ///
    /// # Errors
    /// Docker's error.
    ///
    /// # Cancel safety
    /// If the future is dropped, the server may or may not be paused.
    pub async fn pause(&self) -> Result<(), FixtureError> {
        self.container
            .pause()
            .await
            .map_err(|e| POSTGRES.container_error(e))
    }

    /// Unfreezes the server.
    ///
    /// # Errors
    /// Docker's error.
    ///
    /// # Cancel safety
    /// If the future is dropped, the server may or may not be unpaused.
    pub async fn unpause(&self) -> Result<(), FixtureError> {
        self.container
            .unpause()
            .await
            .map_err(|e| POSTGRES.container_error(e))
    }

    /// Serves TLS from now on with `tls`'s certificates (the server's certificate and key, the
    /// CA for client certificates), and takes roles other than `postgres` over TLS only:
    /// `pg_hba.conf` becomes `hostssl` with trust authentication for them (with
    /// `clientcert=verify-ca` when `tls` [requires client
    /// certificates](ServerTls::client_cert_auth)) and `hostnossl ... reject`. `postgres` still
    /// connects either way, so that [`client`](Self::client) and the fixture keep working.
    /// Returns once a new connection sees `ssl = on`.
    ///
    /// # Errors
    /// Docker's error, the server's (as [`FixtureError::Process`]), or
    /// [`FixtureError::NotReady`] if the server does not take the certificates.
    ///
    /// # Cancel safety
    /// If the future is dropped, the server may serve TLS or not.
    pub async fn require_tls(&self, tls: &ServerTls) -> Result<(), FixtureError> {
        // The image has neither cat nor mkdir: dash's printf writes the files into /tmp (PEM
        // has no single quote), readable by the server's user only, as PostgreSQL requires
        // of its key.
        let dir = "/tmp";
        let mut script = "umask 077".to_owned();
        for (name, pem) in tls.files() {
            script.push_str(&format!(" && printf '%s' '{pem}' > {dir}/{name}"));
        }
        let clientcert = if tls.client_cert_auth() {
            " clientcert=verify-ca"
        } else {
            ""
        };
        let hba = [
            "local all all trust".to_owned(),
            "host all postgres 127.0.0.1/32 trust".to_owned(),
            format!("hostssl all all 127.0.0.1/32 trust{clientcert}"),
            "hostnossl all all 127.0.0.1/32 reject".to_owned(),
        ];
        let quoted: Vec<String> = hba.iter().map(|l| format!("'{l}'")).collect();
        script.push_str(&format!(
            " && printf '%s\\n' {} > /tmp/pgdata/pg_hba.conf",
            quoted.join(" ")
        ));
        docker(&["exec", self.container.id(), "sh", "-c", &script]).await?;
        let fail = |command: &'static str| {
            move |e: tokio_postgres::Error| FixtureError::Command {
                server: "postgres",
                command,
                source: match e.as_db_error() {
                    Some(db) => Box::new(db.clone()),
                    None => Box::new(e),
                },
            }
        };
        let client = self.client().await.map_err(fail("connect"))?;
        // ALTER SYSTEM runs outside a transaction: one statement at a time.
        let settings = [
            format!("ALTER SYSTEM SET ssl_cert_file = '{dir}/{TLS_CERT}'"),
            format!("ALTER SYSTEM SET ssl_key_file = '{dir}/{TLS_KEY}'"),
            format!("ALTER SYSTEM SET ssl_ca_file = '{dir}/{TLS_CA}'"),
            "ALTER SYSTEM SET ssl = on".to_owned(),
            "SELECT pg_reload_conf()".to_owned(),
        ];
        for statement in &settings {
            client
                .batch_execute(statement)
                .await
                .map_err(fail("ALTER SYSTEM SET ssl"))?;
        }
        // The postmaster reloads on its signal; a connection forked after that sees it.
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let ssl = match self.client().await {
                Ok(c) => c
                    .query_one("SHOW ssl", &[])
                    .await
                    .ok()
                    .map(|r| r.get::<_, String>(0)),
                Err(_) => None,
            };
            if ssl.as_deref() == Some("on") {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(FixtureError::NotReady {
                    server: "postgres (TLS)",
                    address: format!("127.0.0.1:{}", self.port),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts PgBouncer (Debian's, from the same image) inside the server's container, in
    /// front of this server, on a free port of 127.0.0.1, and returns that port. `pool_mode`
    /// is `session` or `transaction`. Trust authentication for the user `postgres`; it stops
    /// with the server, and [`start_again`](Self::start_again) starts it again on its port.
    ///
    /// # Errors
    /// Docker's error, or
    /// [`FixtureError::NotReady`] if it does not accept connections.
    ///
    /// # Cancel safety
    /// If the future is dropped, PgBouncer may be running.
    pub async fn start_pgbouncer(&self, pool_mode: &str) -> Result<u16, FixtureError> {
        let port = free_port()?;
        let name = format!("pgbouncer-{port}");
        let lines = [
            "[databases]".to_owned(),
            format!(
                "postgres = host=127.0.0.1 port={} dbname=postgres",
                self.port
            ),
            "[pgbouncer]".to_owned(),
            "listen_addr = 127.0.0.1".to_owned(),
            format!("listen_port = {port}"),
            "unix_socket_dir =".to_owned(),
            "auth_type = trust".to_owned(),
            format!("auth_file = /tmp/{name}.users"),
            format!("pool_mode = {pool_mode}"),
            format!("pidfile = /tmp/{name}.pid"),
            format!("logfile = /tmp/{name}.log"),
        ];
        // The image has no cat: dash's printf writes the files.
        let quoted: Vec<String> = lines.iter().map(|l| format!("'{l}'")).collect();
        let script = format!(
            "printf '%s\\n' {} > /tmp/{name}.ini && printf '\"postgres\" \"\"\\n' > \
             /tmp/{name}.users && pgbouncer -d /tmp/{name}.ini",
            quoted.join(" ")
        );
        self.run_pgbouncer(port, &script).await?;
        self.poolers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((port, script));
        Ok(port)
    }

    async fn run_pgbouncer(&self, port: u16, script: &str) -> Result<(), FixtureError> {
        docker(&["exec", self.container.id(), "sh", "-c", script]).await?;
        let deadline = Instant::now() + READY_TIMEOUT;
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if Instant::now() >= deadline {
                return Err(FixtureError::NotReady {
                    server: "pgbouncer",
                    address: format!("127.0.0.1:{port}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    async fn wait_ready(&self) -> Result<(), FixtureError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Ok(client)) =
                tokio::time::timeout(Duration::from_secs(2), self.client()).await
                && client.simple_query("SELECT 1").await.is_ok()
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(FixtureError::NotReady {
                    server: "postgres",
                    address: format!("127.0.0.1:{}", self.port),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for PgNode {
    fn drop(&mut self) {
        // The data and backups of a node started with host data: gone with it (the
        // container is removed right after, by its own drop).
        if let Some(dir) = &self.host_tmp {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

async fn docker(args: &[&str]) -> Result<(), FixtureError> {
    let output = tokio::process::Command::new("docker")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await?;
    if output.status.success() {
        return Ok(());
    }
    Err(FixtureError::Process {
        server: "postgres",
        reason: format!(
            "docker {}: {}",
            args.first().copied().unwrap_or_default(),
            String::from_utf8_lossy(&output.stderr).trim()
        ),
    })
}
