//! Redis fixtures: one server ([`RedisNode`]) or several independent ones ([`RedisNodes`]),
//! in containers, that fault tests can stop, restart and pause.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use testcontainers::{ContainerAsync, GenericImage};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::fixture::{FixtureError, Server, Watchdog, free_port, free_ports, or_local};

/// The image used when `BATON_REDIS_IMAGE` is not set: the one `scripts/build-redis-image.sh`
/// builds from Debian's `redis-server`. A fixture that finds it missing builds it with that
/// script (embedded in the crate).
pub const DEFAULT_REDIS_IMAGE: &str = "local/redis:debian";

const REDIS: Server = Server {
    name: "redis",
    image_var: "BATON_REDIS_IMAGE",
    default_image: DEFAULT_REDIS_IMAGE,
    entrypoint: "redis-server",
    ready: "Ready to accept connections",
    build_script: include_str!("../../scripts/build-redis-image.sh"),
};

/// How long a server started again, or a fallback process, has to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a killed fallback process has to exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause between two readiness (or exit) checks.
const POLL: Duration = Duration::from_millis(25);

/// The arguments every server gets: loopback only, no persistence (a restart loses the data,
/// which is what fault tests want), no protected mode (no password is set). `extra` comes
/// last, so that it overrides.
fn server_args(port: u16, extra: &[String]) -> Vec<String> {
    let port = port.to_string();
    let base = [
        "--bind",
        "127.0.0.1",
        "--port",
        &port,
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "no",
    ];
    base.iter()
        .map(|s| (*s).to_owned())
        .chain(extra.iter().cloned())
        .collect()
}

/// Whether a server answers `PING` with `+PONG` on 127.0.0.1:`port` (not while it is still
/// loading, paused or stopped).
async fn ping(port: u16) -> bool {
    // Blocking std I/O on the blocking pool: the library's tokio has no `net` feature.
    let answered = tokio::task::spawn_blocking(move || -> std::io::Result<bool> {
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut stream =
            std::net::TcpStream::connect_timeout(&address, Duration::from_millis(250))?;
        stream.set_read_timeout(Some(Duration::from_millis(500)))?;
        stream.set_write_timeout(Some(Duration::from_millis(500)))?;
        stream.write_all(b"PING\r\n")?;
        let mut reply = Vec::new();
        let mut buf = [0_u8; 64];
        while !reply.ends_with(b"\r\n") {
            let n = stream.read(&mut buf)?;
            if n == 0 {
                break;
            }
            reply.extend_from_slice(&buf[..n]);
        }
        Ok(reply.starts_with(b"+PONG"))
    })
    .await;
    matches!(answered, Ok(Ok(true)))
}

/// Polls [`ping`] until the server answers, for at most [`READY_TIMEOUT`].
async fn wait_ready(port: u16) -> Result<(), FixtureError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    while !ping(port).await {
        if Instant::now() >= deadline {
            return Err(FixtureError::NotReady {
                server: REDIS.name,
                address: format!("127.0.0.1:{port}"),
            });
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

/// The last lines of a log file, joined on one line, for an error message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// A `redis-server` run as a child process (the fallback when Docker is unavailable), which
/// can be stopped and started again on the same port. Its working directory, in the system's
/// temporary directory, holds its log.
#[derive(Debug)]
struct RedisProcess {
    port: u16,
    args: Vec<String>,
    dir: PathBuf,
    /// `None` while stopped.
    child: Option<Child>,
}

impl RedisProcess {
    /// Prepares the working directory; [`start`](Self::start) runs the server.
    fn new(port: u16, extra: &[String]) -> std::io::Result<Self> {
        let dir = std::env::temp_dir().join(format!("baton-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut args = vec!["--dir".to_owned(), dir.to_string_lossy().into_owned()];
        args.extend(server_args(port, extra));
        Ok(RedisProcess {
            port,
            args,
            dir,
            child: None,
        })
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// Spawns the server and waits until it answers `PING`; does nothing if it runs already.
    async fn start(&mut self) -> Result<(), FixtureError> {
        if let Some(child) = &mut self.child
            && child.try_wait()?.is_none()
        {
            return Ok(());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        // Its output goes to a file, not a pipe: nothing has to drain it, whichever runtime
        // started it and whether or not that runtime still runs.
        let mut child = Command::new("redis-server")
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| FixtureError::Spawn {
                server: REDIS.name,
                source,
            })?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                return Err(REDIS.process_error(format!(
                    "redis-server exited ({status}); its log: {}",
                    log_tail(&self.log_path())
                )));
            }
            if ping(self.port).await {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() >= deadline {
                // kill_on_drop stops it as `child` drops.
                return Err(REDIS.process_error(format!(
                    "redis-server did not answer PING in time; its log: {}",
                    log_tail(&self.log_path())
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Kills the server (SIGKILL) and waits until it has exited, so that its port is free.
    async fn stop(&mut self) -> Result<(), FixtureError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        child.start_kill()?;
        // Polled rather than awaited with `wait`: the child may have been spawned on another
        // runtime (the shared node's).
        let deadline = Instant::now() + EXIT_TIMEOUT;
        while child.try_wait()?.is_none() {
            if Instant::now() >= deadline {
                return Err(REDIS.process_error("redis-server did not exit after SIGKILL"));
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }

    /// The shell command that kills the running process, if any, and removes the working
    /// directory.
    fn cleanup(&self) -> String {
        let dir = self.dir.to_string_lossy().replace('\'', r"'\''");
        match self.child.as_ref().and_then(Child::id) {
            Some(pid) => format!("kill {pid} 2>/dev/null; rm -rf '{dir}'"),
            None => format!("rm -rf '{dir}'"),
        }
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        // Stopped by its own PID (kill_on_drop would too, but only once the Child drops).
        if let Some(child) = &mut self.child {
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(Debug)]
enum Running {
    Container(Box<ContainerAsync<GenericImage>>),
    Process(Box<tokio::sync::Mutex<RedisProcess>>),
    External,
}

/// One Redis server for tests, with persistence off.
///
/// Fault tests can [`stop`](Self::stop) it, [`start_again`](Self::start_again) or
/// [`restart`](Self::restart) it on the same port (its data is lost), and
/// [`pause`](Self::pause) it. See the [module docs](super) for the environment it reads.
#[derive(Debug)]
pub struct RedisNode {
    port: u16,
    url: String,
    running: Running,
    watchdog: Option<Watchdog>,
}

impl RedisNode {
    /// Starts a Redis server on a free port of 127.0.0.1, or uses the one `BATON_REDIS_URL`
    /// names.
    ///
    /// # Errors
    /// [`FixtureError`] if neither a container nor (when allowed) a local `redis-server`
    /// starts.
    pub async fn start() -> Result<RedisNode, FixtureError> {
        RedisNode::start_with(&[]).await
    }

    /// As [`start`](Self::start), with extra `redis-server` arguments, e.g.
    /// `&["--maxmemory", "10mb", "--maxmemory-policy", "allkeys-lru"]`. They come after the
    /// fixture's own (`--bind 127.0.0.1 --port <port> --save "" --appendonly no
    /// --protected-mode no`), so they override them. A server named by `BATON_REDIS_URL` is
    /// used as it is: the arguments are ignored (with a warning).
    ///
    /// # Errors
    /// [`FixtureError`] if neither a container nor (when allowed) a local `redis-server`
    /// starts.
    pub async fn start_with(args: &[&str]) -> Result<RedisNode, FixtureError> {
        if let Ok(url) = std::env::var("BATON_REDIS_URL") {
            if !args.is_empty() {
                tracing::warn!(?args, %url, "BATON_REDIS_URL is set: extra arguments ignored");
            }
            return Ok(RedisNode {
                port: port_of(&url),
                url,
                running: Running::External,
                watchdog: None,
            });
        }
        RedisNode::start_on(free_port()?, args).await
    }

    /// Starts a server on `port`, in a container or (when allowed) as a local process.
    async fn start_on(port: u16, args: &[&str]) -> Result<RedisNode, FixtureError> {
        let extra: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        let (running, watchdog) = match REDIS.start_container(server_args(port, &extra)).await {
            // The process's watchdog removes the container if this process dies.
            Ok(container) => (Running::Container(Box::new(container)), None),
            Err(e) => {
                or_local(&REDIS, e, || async {
                    let mut process = RedisProcess::new(port, &extra)?;
                    process.start().await?;
                    // Killed by its PID if this process dies; told each new PID.
                    let watchdog = Watchdog::spawn(&process.cleanup());
                    Ok((
                        Running::Process(Box::new(tokio::sync::Mutex::new(process))),
                        watchdog,
                    ))
                })
                .await?
            }
        };
        Ok(RedisNode {
            port,
            url: format!("redis://127.0.0.1:{port}"),
            running,
            watchdog,
        })
    }

    /// One node shared by every test of this process, started on first use on a runtime of
    /// its own (so that it outlives each test's runtime). Give each test its own key prefix.
    /// The node is removed when the process exits, as every fixture is: a watchdog process,
    /// tied to this one by a pipe, removes the container (or kills the `redis-server`
    /// process) by its id.
    ///
    /// Every test sees what another does to it: start a node of your own to stop, restart or
    /// pause.
    ///
    /// # Panics
    /// If the node cannot be started: a test cannot run without it.
    #[allow(clippy::expect_used)]
    pub fn shared() -> &'static RedisNode {
        static SHARED: OnceLock<RedisNode> = OnceLock::new();
        SHARED.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime for the shared redis fixture");
                rt.block_on(async move {
                    let _ = tx.send(RedisNode::start().await);
                    // Keep this runtime (and so the container's client) alive.
                    std::future::pending::<()>().await;
                });
            });
            rx.recv()
                .expect("the fixture thread answers")
                .expect("start the shared redis fixture")
        })
    }

    /// The URL to connect to, `redis://127.0.0.1:<port>` (or `BATON_REDIS_URL` as given).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The port the server listens on (for `BATON_REDIS_URL`, the URL's port, 6379 if it
    /// names none).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether this node runs in a container (not the `redis-server`-on-PATH fallback, nor a
    /// server named by `BATON_REDIS_URL`).
    pub fn is_container(&self) -> bool {
        matches!(self.running, Running::Container(_))
    }

    /// Kills the server at once (no shutdown: clients see their connections reset); its data
    /// is lost. [`start_again`](Self::start_again) brings it back on the same port.
    ///
    /// # Cancel safety
    /// If the future is dropped the server may or may not have been stopped.
    ///
    /// # Errors
    /// The container runtime's error; [`FixtureError::Process`] if the local process does not
    /// exit; [`FixtureError::Unsupported`] for a server named by `BATON_REDIS_URL`.
    pub async fn stop(&self) -> Result<(), FixtureError> {
        match &self.running {
            Running::Container(c) => c
                .stop_with_timeout(Some(0))
                .await
                .map_err(|source| REDIS.container_error(source)),
            Running::Process(p) => {
                let mut process = p.lock().await;
                let stopped = process.stop().await;
                self.watch(&process);
                stopped
            }
            Running::External => Err(external("stop")),
        }
    }

    /// Starts the server again after [`stop`](Self::stop), empty, on the same port, and
    /// returns once it answers `PING`. Does nothing to a server that runs.
    ///
    /// # Cancel safety
    /// If the future is dropped the server may or may not have been started.
    ///
    /// # Errors
    /// The container runtime's error; [`FixtureError::NotReady`] if the container does not
    /// answer `PING` within 30 s; [`FixtureError::Spawn`] or [`FixtureError::Process`] for
    /// the local process; [`FixtureError::Unsupported`] for a server named by
    /// `BATON_REDIS_URL`.
    pub async fn start_again(&self) -> Result<(), FixtureError> {
        match &self.running {
            Running::Container(c) => {
                c.start()
                    .await
                    .map_err(|source| REDIS.container_error(source))?;
                wait_ready(self.port).await
            }
            Running::Process(p) => {
                let mut process = p.lock().await;
                let started = process.start().await;
                self.watch(&process);
                started
            }
            Running::External => Err(external("start")),
        }
    }

    /// [`stop`](Self::stop), then [`start_again`](Self::start_again): the server comes back
    /// empty, on the same port; this returns once it answers `PING`.
    ///
    /// # Cancel safety
    /// If the future is dropped the server may be stopped, and stays so until
    /// [`start_again`](Self::start_again).
    ///
    /// # Errors
    /// As [`stop`](Self::stop) and [`start_again`](Self::start_again).
    pub async fn restart(&self) -> Result<(), FixtureError> {
        self.stop().await?;
        self.start_again().await
    }

    /// Starts a replica of this server (`--replicaof`, asynchronous replication, in its own
    /// container or process) and returns once it has synchronised with this one.
    ///
    /// # Errors
    /// As [`start`](Self::start); [`FixtureError::NotReady`] if it does not synchronise within
    /// 30 s.
    pub async fn start_replica(&self) -> Result<RedisNode, FixtureError> {
        let port = self.port.to_string();
        let replica = RedisNode::start_with(&["--replicaof", "127.0.0.1", &port]).await?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let info: Result<String, _> = replica.command("INFO", &["replication"]).await;
            if info.is_ok_and(|i| i.contains("master_link_status:up")) {
                return Ok(replica);
            }
            if Instant::now() >= deadline {
                return Err(FixtureError::NotReady {
                    server: REDIS.name,
                    address: format!("127.0.0.1:{} (replica in sync)", replica.port),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Makes this replica a primary (`REPLICAOF NO ONE`): what a failover does. It keeps what
    /// it had replicated, no more.
    ///
    /// # Errors
    /// [`FixtureError::Command`] if the server refuses or cannot be reached.
    pub async fn promote(&self) -> Result<(), FixtureError> {
        self.command::<()>("REPLICAOF", &["NO", "ONE"]).await
    }

    /// Stops replicating from anyone while staying a replica (`REPLICAOF` to a port nobody
    /// listens on): the replica misses every write from now on, as when a partition separates
    /// it from its primary.
    ///
    /// # Errors
    /// [`FixtureError::Command`] if the server refuses or cannot be reached;
    /// [`FixtureError::Io`] if no free port can be found.
    pub async fn detach(&self) -> Result<(), FixtureError> {
        let nowhere = free_port()?.to_string();
        self.command::<()>("REPLICAOF", &["127.0.0.1", &nowhere])
            .await
    }

    /// Sends one command to the server (for a test's own administration: `WAIT`, `INFO`,
    /// `CONFIG SET`, reading a key), on a connection of its own.
    ///
    /// # Errors
    /// [`FixtureError::Command`] if the server cannot be reached or refuses the command, or
    /// its answer is not a `T`.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call may or may not have reached the server.
    pub async fn command<T: redis::FromRedisValue>(
        &self,
        command: &'static str,
        args: &[&str],
    ) -> Result<T, FixtureError> {
        let failed = |source: redis::RedisError| FixtureError::Command {
            server: REDIS.name,
            command,
            source: Box::new(source),
        };
        let client = redis::Client::open(self.url()).map_err(failed)?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(failed)?;
        let mut cmd = redis::cmd(command);
        for a in args {
            cmd.arg(*a);
        }
        cmd.query_async(&mut conn).await.map_err(failed)
    }

    /// Freezes the server (`docker pause`): connections stay open and requests hang until
    /// [`unpause`](Self::unpause). Containers only.
    ///
    /// # Errors
    /// The container runtime's error; [`FixtureError::Unsupported`] for a node that is not a
    /// container.
    pub async fn pause(&self) -> Result<(), FixtureError> {
        self.container("pause")?
            .pause()
            .await
            .map_err(|source| REDIS.container_error(source))
    }

    /// Unfreezes the server after [`pause`](Self::pause).
    ///
    /// # Errors
    /// The container runtime's error; [`FixtureError::Unsupported`] for a node that is not a
    /// container.
    pub async fn unpause(&self) -> Result<(), FixtureError> {
        self.container("unpause")?
            .unpause()
            .await
            .map_err(|source| REDIS.container_error(source))
    }

    /// Points the watchdog (a local process's) at the process as it now is: the new PID after
    /// a start, none after a stop (so that it never kills a PID the system reused).
    fn watch(&self, process: &RedisProcess) {
        if let Some(watchdog) = &self.watchdog {
            watchdog.set(&process.cleanup());
        }
    }

    fn container(&self, op: &'static str) -> Result<&ContainerAsync<GenericImage>, FixtureError> {
        match &self.running {
            Running::Container(c) => Ok(c),
            Running::Process(_) => Err(FixtureError::Unsupported {
                op,
                reason: "the node runs as a local process, not in a container",
            }),
            Running::External => Err(external(op)),
        }
    }

    /// A backend connected to this node, without a restart grace: the node was started for
    /// this test run, so no lock holder can predate its state (see
    /// [`RedisOptions::with_restart_grace`](crate::RedisOptions::with_restart_grace); a test
    /// of restarts passes its own options to `RedisBackend::connect`).
    ///
    /// # Errors
    /// As [`RedisBackend::connect`](crate::RedisBackend::connect).
    pub async fn backend(&self) -> crate::Result<crate::RedisBackend> {
        let options = crate::RedisOptions::new().with_restart_grace(std::time::Duration::ZERO);
        crate::RedisBackend::connect(&self.url(), options).await
    }
}

fn external(op: &'static str) -> FixtureError {
    FixtureError::Unsupported {
        op,
        reason: "the server is external (BATON_REDIS_URL); the test did not start it",
    }
}

/// The port of a `redis://[user:password@]host[:port][/db]` URL; 6379 if it names none.
fn port_of(url: &str) -> u16 {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    host_port
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or(6379)
}

/// Several independent Redis servers (masters, no replication between them), for tests of
/// algorithms that lock on a majority of servers, such as Redlock. Each one is a
/// [`RedisNode`] that can be stopped, started again, restarted or paused on its own.
///
/// `BATON_REDIS_URL` does not apply: the servers are always started (in containers, or as
/// local processes under the same rules as [`RedisNode::start`]).
#[derive(Debug)]
pub struct RedisNodes {
    nodes: Vec<RedisNode>,
}

impl RedisNodes {
    /// Starts `n` servers concurrently, each on its own free port.
    ///
    /// # Errors
    /// [`FixtureError`] if one of them does not start (the others are then removed).
    pub async fn start(n: usize) -> Result<RedisNodes, FixtureError> {
        let ports = free_ports(n)?;
        let started =
            futures::future::join_all(ports.into_iter().map(|p| RedisNode::start_on(p, &[]))).await;
        let nodes = started.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(RedisNodes { nodes })
    }

    /// The URLs of all servers, in index order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisNode::url).collect()
    }

    /// Server `i`.
    ///
    /// # Panics
    /// If `i` is out of range.
    pub fn node(&self, i: usize) -> &RedisNode {
        &self.nodes[i]
    }

    /// All servers, in index order.
    pub fn nodes(&self) -> &[RedisNode] {
        &self.nodes
    }

    /// Stops server `i` ([`RedisNode::stop`]).
    ///
    /// # Errors
    /// [`FixtureError::NoSuchMember`] for an index out of range; as [`RedisNode::stop`].
    pub async fn stop_node(&self, i: usize) -> Result<(), FixtureError> {
        self.get(i)?.stop().await
    }

    /// Starts server `i` again, empty, on its port ([`RedisNode::start_again`]).
    ///
    /// # Errors
    /// [`FixtureError::NoSuchMember`] for an index out of range; as
    /// [`RedisNode::start_again`].
    pub async fn start_node(&self, i: usize) -> Result<(), FixtureError> {
        self.get(i)?.start_again().await
    }

    fn get(&self, index: usize) -> Result<&RedisNode, FixtureError> {
        self.nodes.get(index).ok_or(FixtureError::NoSuchMember {
            index,
            members: self.nodes.len(),
        })
    }
}
