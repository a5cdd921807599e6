//! Redis fixtures: one server ([`RedisNode`]) or several independent ones ([`RedisNodes`]),
//! in containers, that fault tests can stop, restart and pause; a server may serve TLS
//! ([`RedisTls`]).

use std::sync::OnceLock;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use tokio::time::Instant;

use super::fixture::{
    FixtureError, Instance, Server, ServerProcess, exchange, free_port, free_ports, start_shared,
};
use super::tls::{CONTAINER_TLS_DIR, ServerTls, TLS_CA, TLS_CERT, TLS_KEY};

/// The image used when `BATON_REDIS_IMAGE` is not set: the one `scripts/build-redis-image.sh`
/// builds from Debian's `redis-server`. A fixture that finds it missing builds it with that
/// script (embedded in the crate).
pub const DEFAULT_REDIS_IMAGE: &str = "local/redis:debian";

const REDIS: Server = Server {
    name: "redis",
    image_var: "BATON_REDIS_IMAGE",
    default_image: DEFAULT_REDIS_IMAGE,
    entrypoint: "redis-server",
    local: "`redis-server`",
    ready: "Ready to accept connections",
    build_script: include_str!("../../scripts/build-redis-image.sh"),
    layout: None,
};

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
/// loading, paused or stopped): the fixtures' readiness probe.
fn ping(port: u16) -> BoxFuture<'static, bool> {
    Box::pin(async move {
        let reply = exchange(format!("127.0.0.1:{port}"), b"PING\r\n".to_vec(), |reply| {
            reply.ends_with(b"\r\n")
        })
        .await;
        matches!(reply, Ok(reply) if reply.starts_with(b"+PONG"))
    })
}

/// Whether 127.0.0.1:`port` accepts a TCP connection: the readiness probe of a server that
/// serves TLS only (no plain-text `PING` reaches it). A server with persistence off has no
/// data to load, so it serves once it listens (a container is also waited for until it logs
/// that it is ready).
fn listening(port: u16) -> BoxFuture<'static, bool> {
    Box::pin(async move {
        exchange(format!("127.0.0.1:{port}"), Vec::new(), |_| true)
            .await
            .is_ok()
    })
}

/// What the local fallback runs: `redis-server` from `PATH`, its files in its working
/// directory.
fn local_process(port: u16, extra: &[String]) -> std::io::Result<ServerProcess> {
    let mut args = vec!["--dir".to_owned(), ".".to_owned()];
    args.extend(server_args(port, extra));
    ServerProcess::new(REDIS, port, ping, "redis-server", args)
}

/// The certificates of a Redis that serves TLS, PEM-encoded, and whether it asks its clients
/// for a certificate (`--tls-auth-clients`), for [`RedisNode::start_tls`]; with the client
/// certificate the fixture's own clients present.
///
/// [`generate`](Self::generate) makes the whole set for tests: a CA, a server certificate for
/// `127.0.0.1` and `localhost`, and a client certificate.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use baton::testing::{RedisNode, RedisTls};
/// let tls = RedisTls::generate()?.with_client_cert_auth(false);
/// let redis = RedisNode::start_tls(&tls).await?; // rediss://127.0.0.1:<port>, TLS only
/// // Your client: the node's URL and the CA (and a client certificate, if the server asks).
/// let options = baton::ConnectOptions::new().with_ca_cert(tls.ca_pem());
/// let backend = baton::connect_with(&redis.url(), options).await?;
/// # let _ = backend; Ok(()) }
/// ```
pub type RedisTls = ServerTls;

impl ServerTls {
    /// `options` with the CA and, if there is one, the client certificate: for a client of
    /// this server.
    pub fn redis_options(&self, options: crate::RedisOptions) -> crate::RedisOptions {
        let options = options.with_ca_cert(self.ca_pem().to_owned());
        match self.client_cert() {
            Some(client) => options.with_client_cert(client.cert_pem(), client.key_pem()),
            None => options,
        }
    }

    /// A client of the `redis` crate for `url` (`rediss://`) with these certificates, for the
    /// fixture's own commands, on the crypto provider baton's own Redis client installs (the
    /// fixture may talk to a server before any backend has).
    fn client(&self, url: String) -> redis::RedisResult<redis::Client> {
        crate::backend::ensure_provider();
        redis::Client::build_with_tls(url, self.certificates())
    }

    /// The same, for the `redis` crate's own clients ([`RedisNode::command`]).
    fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self.client_cert().map(|client| redis::ClientTlsConfig {
                client_cert: client.cert_pem().as_bytes().to_vec(),
                client_key: client.key_pem().as_bytes().to_vec(),
            }),
            root_cert: Some(self.ca_pem().as_bytes().to_vec()),
        }
    }

    /// The arguments that make a server read its files from `dir` and serve TLS only, on
    /// `port`.
    fn redis_args(&self, port: u16, dir: &str) -> Vec<String> {
        let file = |name: &str| format!("{dir}/{name}");
        let auth = if self.client_cert_auth() { "yes" } else { "no" };
        [
            "--port".to_owned(),
            "0".to_owned(),
            "--tls-port".to_owned(),
            port.to_string(),
            "--tls-cert-file".to_owned(),
            file(TLS_CERT),
            "--tls-key-file".to_owned(),
            file(TLS_KEY),
            "--tls-ca-cert-file".to_owned(),
            file(TLS_CA),
            "--tls-auth-clients".to_owned(),
            auth.to_owned(),
        ]
        .into()
    }
}

/// Where a local process finds them: in its working directory.
const LOCAL_TLS_DIR: &str = "tls";

/// [`local_process`] for a server that serves TLS: the files written into its working
/// directory (the key readable by its owner only).
fn local_tls_process(
    port: u16,
    tls: &RedisTls,
    container_args: &[String],
) -> std::io::Result<ServerProcess> {
    // The container's arguments, with the files where a local process finds them.
    let args: Vec<String> = container_args
        .iter()
        .map(|a| a.replace(CONTAINER_TLS_DIR, LOCAL_TLS_DIR))
        .collect();
    let process = local_process(port, &args)?;
    tls.write_files(&REDIS.work_dir(port).join(LOCAL_TLS_DIR))?;
    Ok(process)
}

/// One Redis server for tests, with persistence off.
///
/// Fault tests can [`stop`](Self::stop) it, [`start_again`](Self::start_again) or
/// [`restart`](Self::restart) it on the same port (its data is lost), and
/// [`pause`](Self::pause) it. See the [module docs](super) for the environment it reads.
#[derive(Debug)]
pub struct RedisNode {
    url: String,
    instance: Instance,
    /// The certificates of a node that serves TLS.
    tls: Option<RedisTls>,
}

impl RedisNode {
    /// Starts a Redis server on a free port of 127.0.0.1, or uses the one `BATON_REDIS_URL`
    /// names.
    ///
    /// # Errors
    /// [`FixtureError`] if neither a container nor (when allowed) a local `redis-server`
    /// starts.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing running: a container or process started so far is
    /// removed by the fixture's watchdog when this test process exits.
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
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing running: a container or process started so far is
    /// removed by the fixture's watchdog when this test process exits.
    pub async fn start_with(args: &[&str]) -> Result<RedisNode, FixtureError> {
        if let Ok(url) = std::env::var("BATON_REDIS_URL") {
            if !args.is_empty() {
                tracing::warn!(?args, %url, "BATON_REDIS_URL is set: extra arguments ignored");
            }
            let reason = "the server is external (BATON_REDIS_URL); the test did not start it";
            return Ok(RedisNode {
                instance: Instance::external(REDIS, port_of(&url), reason),
                url,
                tls: None,
            });
        }
        RedisNode::start_on(free_port()?, args).await
    }

    /// Starts a server on `port`, in a container or (when allowed) as a local process.
    async fn start_on(port: u16, args: &[&str]) -> Result<RedisNode, FixtureError> {
        let extra: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        let fallback = || local_process(port, &extra);
        let instance =
            Instance::start(REDIS, port, ping, server_args(port, &extra), fallback).await?;
        Ok(RedisNode {
            url: format!("redis://127.0.0.1:{port}"),
            instance,
            tls: None,
        })
    }

    /// Starts a Redis server that serves TLS only (`--port 0 --tls-port <port>`), on a free
    /// port of 127.0.0.1, with `tls`'s certificates; its URL is `rediss://127.0.0.1:<port>`.
    /// `BATON_REDIS_URL` does not apply: the server is always started (in a container, or as
    /// a local process under the same rules as [`start`](Self::start)).
    ///
    /// [`backend`](Self::backend) and [`command`](Self::command) connect with the CA and, if
    /// there is one, `tls`'s client certificate.
    ///
    /// # Errors
    /// [`FixtureError`] if neither a container nor (when allowed) a local `redis-server`
    /// starts.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing running: a container or process started so far is
    /// removed by the fixture's watchdog when this test process exits.
    pub async fn start_tls(tls: &RedisTls) -> Result<RedisNode, FixtureError> {
        RedisNode::start_tls_on(free_port()?, tls, &[]).await
    }

    /// [`start_tls`](Self::start_tls) on `port`, with extra `redis-server` arguments.
    async fn start_tls_on(
        port: u16,
        tls: &RedisTls,
        args: &[&str],
    ) -> Result<RedisNode, FixtureError> {
        let files = tls
            .files()
            .iter()
            .map(|(name, pem)| {
                (
                    format!("{CONTAINER_TLS_DIR}/{name}"),
                    pem.as_bytes().to_vec(),
                )
            })
            .collect();
        let mut extra = tls.redis_args(port, CONTAINER_TLS_DIR);
        extra.extend(args.iter().map(|a| (*a).to_owned()));
        let args = server_args(port, &extra);
        let fallback = || local_tls_process(port, tls, &extra);
        let instance =
            Instance::start_with_files(REDIS, port, listening, args, files, fallback).await?;
        Ok(RedisNode {
            url: format!("rediss://127.0.0.1:{port}"),
            instance,
            tls: Some(tls.clone()),
        })
    }

    /// The certificates of a node started with [`start_tls`](Self::start_tls).
    pub fn tls(&self) -> Option<&RedisTls> {
        self.tls.as_ref()
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
    pub fn shared() -> &'static RedisNode {
        static SHARED: OnceLock<RedisNode> = OnceLock::new();
        SHARED.get_or_init(|| start_shared(REDIS.name, RedisNode::start))
    }

    /// The URL to connect to, `redis://127.0.0.1:<port>` (`rediss://` for a TLS node; or
    /// `BATON_REDIS_URL` as given).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The port the server listens on (for `BATON_REDIS_URL`, the URL's port, 6379 if it
    /// names none).
    pub fn port(&self) -> u16 {
        self.instance.port()
    }

    /// Whether this node runs in a container (not the `redis-server`-on-PATH fallback, nor a
    /// server named by `BATON_REDIS_URL`).
    pub fn is_container(&self) -> bool {
        self.instance.is_container()
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
        self.instance.stop().await
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
        self.instance.start_again().await
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
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing running: a container or process started so far is
    /// removed by the fixture's watchdog when this test process exits.
    pub async fn start_replica(&self) -> Result<RedisNode, FixtureError> {
        let port = self.port().to_string();
        let replica = RedisNode::start_with(&["--replicaof", "127.0.0.1", &port]).await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let info: Result<String, _> = replica.command("INFO", &["replication"]).await;
            if info.is_ok_and(|i| i.contains("master_link_status:up")) {
                return Ok(replica);
            }
            if Instant::now() >= deadline {
                return Err(FixtureError::NotReady {
                    server: REDIS.name,
                    address: format!("127.0.0.1:{} (replica in sync)", replica.port()),
                });
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Makes this replica a primary (`REPLICAOF NO ONE`): what a failover does. It keeps what
    /// it had replicated, no more.
    ///
    /// # Errors
    /// [`FixtureError::Command`] if the server refuses or cannot be reached.
    ///
    /// # Cancel safety
    /// If the future is dropped the replica may or may not have been made a primary.
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
    ///
    /// # Cancel safety
    /// If the future is dropped the replica may or may not replicate still.
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
        let client = match &self.tls {
            Some(tls) => tls.client(self.url()),
            None => redis::Client::open(self.url()),
        }
        .map_err(failed)?;
        one_command(&client, command, args).await.map_err(failed)
    }

    /// Freezes the server (`docker pause`): connections stay open and requests hang until
    /// [`unpause`](Self::unpause). Containers only.
    ///
    /// # Errors
    /// The container runtime's error; [`FixtureError::Unsupported`] for a node that is not a
    /// container.
    ///
    /// # Cancel safety
    /// If the future is dropped the server may or may not be frozen.
    pub async fn pause(&self) -> Result<(), FixtureError> {
        self.instance.pause().await
    }

    /// Unfreezes the server after [`pause`](Self::pause).
    ///
    /// # Errors
    /// The container runtime's error; [`FixtureError::Unsupported`] for a node that is not a
    /// container.
    ///
    /// # Cancel safety
    /// If the future is dropped the server may or may not be frozen still.
    pub async fn unpause(&self) -> Result<(), FixtureError> {
        self.instance.unpause().await
    }

    /// A backend connected to this node (over TLS, with the CA and the client certificate, for
    /// a TLS node), without a restart grace: the node was started for
    /// this test run, so no lock holder can predate its state (see
    /// [`RedisOptions::with_restart_grace`](crate::RedisOptions::with_restart_grace); a test
    /// of restarts passes its own options to `RedisBackend::connect`).
    ///
    /// # Errors
    /// As [`RedisBackend::connect`](crate::RedisBackend::connect).
    ///
    /// # Cancel safety
    /// Cancel safe: a backend not yet connected is dropped with the future.
    pub async fn backend(&self) -> crate::Result<crate::RedisBackend> {
        let options = crate::RedisOptions::new().with_restart_grace(std::time::Duration::ZERO);
        let options = match &self.tls {
            Some(tls) => tls.redis_options(options),
            None => options,
        };
        crate::RedisBackend::connect(&self.url(), options).await
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
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing running: a container or process started so far is
    /// removed by the fixture's watchdog when this test process exits.
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
    ///
    /// # Cancel safety
    /// If the future is dropped the server may or may not have been stopped.
    pub async fn stop_node(&self, i: usize) -> Result<(), FixtureError> {
        self.get(i)?.stop().await
    }

    /// Starts server `i` again, empty, on its port ([`RedisNode::start_again`]).
    ///
    /// # Errors
    /// [`FixtureError::NoSuchMember`] for an index out of range; as
    /// [`RedisNode::start_again`].
    ///
    /// # Cancel safety
    /// If the future is dropped the server may or may not be running again (if it is, the
    /// fixture's watchdog removes it when this test process exits).
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

/// How a Sentinel runs in a container: Debian's `redis-sentinel` is `redis-server` under
/// another name (one binary, whose mode follows its name or `--sentinel`), so the Redis image
/// runs it, with its configuration file copied in (Sentinel rewrites it as it learns).
const SENTINEL: Server = Server {
    ready: "+monitor master",
    ..REDIS
};

/// Where a Sentinel's configuration file is, in its container.
const SENTINEL_CONF: &str = "/data/sentinel.conf";

/// How long a Sentinel waits without an answer from the primary before it calls it down (the
/// fixture's `down-after-milliseconds`): small, so that a test's failover is quick.
pub const SENTINEL_DOWN_AFTER: Duration = Duration::from_millis(1000);

/// The fixture's `failover-timeout`: a failover that does not finish in this is abandoned, and
/// Sentinel fails the same primary over again no sooner than twice this after the last
/// attempt.
pub const SENTINEL_FAILOVER_TIMEOUT: Duration = Duration::from_millis(2000);

/// A Redis primary, one replica and three Sentinels (quorum 2) that watch them, all on
/// 127.0.0.1 (containers with host networking, or local processes under the same rules as
/// [`RedisNode::start`]), for tests of failovers: [`url`](Self::url) is the
/// `redis+sentinel://` URL of the three, for the service [`SERVICE`](Self::SERVICE).
///
/// Sentinel's timeouts are small ([`SENTINEL_DOWN_AFTER`], [`SENTINEL_FAILOVER_TIMEOUT`]):
/// a primary that is killed or paused is failed over within a few seconds. The nodes have no
/// persistence. `BATON_REDIS_URL` does not apply.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use baton::testing::RedisSentinel;
/// let redis = RedisSentinel::start().await?;
/// let backend = baton::connect(&redis.url()).await?; // redis+sentinel://127.0.0.1:<p>,.../baton
/// let old = redis.primary().await?.port();
/// redis.failover().await?; // SENTINEL FAILOVER baton
/// let new = redis.await_new_primary(old).await?;
/// # let _ = (backend, new); Ok(()) }
/// ```
#[derive(Debug)]
pub struct RedisSentinel {
    nodes: Vec<RedisNode>,
    sentinels: Vec<Instance>,
    password: Option<String>,
    /// The certificates of a fixture that speaks TLS only ([`start_tls`](Self::start_tls)).
    tls: Option<RedisTls>,
}

impl RedisSentinel {
    /// The name the Sentinels monitor the primary under (the URL's service).
    pub const SERVICE: &'static str = "baton";

    /// Starts the primary, its replica (in sync when this returns) and three Sentinels, each
    /// on a free port; returns once every Sentinel has found the replica and the other
    /// Sentinels (so that a failover can be agreed at once).
    ///
    /// # Errors
    /// [`FixtureError`] if a server does not start or the Sentinels do not find each other
    /// within 30 s.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing running: what started so far is removed by the
    /// fixture's watchdog when this test process exits.
    pub async fn start() -> Result<RedisSentinel, FixtureError> {
        RedisSentinel::start_with_password(None).await
    }

    /// [`start`](Self::start), with Sentinels that ask their clients (and each other) for
    /// `password` (`requirepass`, `sentinel sentinel-pass`): the Sentinels' own password, not
    /// the primary's (which has none).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing running: what started so far is removed by the
    /// fixture's watchdog when this test process exits.
    pub async fn start_with_password(
        password: Option<&str>,
    ) -> Result<RedisSentinel, FixtureError> {
        RedisSentinel::start_all(password, None).await
    }

    /// [`start`](Self::start), every server speaking TLS only, with `tls`'s certificates:
    /// the primary and the replica (`--tls-port`, replication over TLS) and the Sentinels
    /// (`tls-port`, and TLS to the servers and to each other: `tls-replication yes`). Its
    /// [`url`](Self::url) is `rediss+sentinel://`; [`backend`](Self::backend) and the
    /// fixture's own commands connect with the CA (and `tls`'s client certificate, if it has
    /// one). Give `tls` without client certificate authentication
    /// ([`with_client_cert_auth(false)`](RedisTls::with_client_cert_auth)) unless its server
    /// certificate may also serve as a client's (the servers present it to each other).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing running: what started so far is removed by the
    /// fixture's watchdog when this test process exits.
    pub async fn start_tls(tls: &RedisTls) -> Result<RedisSentinel, FixtureError> {
        RedisSentinel::start_all(None, Some(tls)).await
    }

    async fn start_all(
        password: Option<&str>,
        tls: Option<&RedisTls>,
    ) -> Result<RedisSentinel, FixtureError> {
        // Over TLS, a node replicates over TLS (and so does the primary, once demoted).
        let node = |port: u16, args: Vec<String>| async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            match tls {
                Some(tls) => {
                    let mut args = args;
                    args.extend(["--tls-replication", "yes"]);
                    RedisNode::start_tls_on(port, tls, &args).await
                }
                None => RedisNode::start_on(port, &args).await,
            }
        };
        let primary = node(free_port()?, Vec::new()).await?;
        let replica_args = ["--replicaof", "127.0.0.1", &primary.port().to_string()]
            .map(str::to_owned)
            .to_vec();
        let replica = node(free_port()?, replica_args).await?;
        let ports = free_ports(3)?;
        let started = futures::future::join_all(
            ports
                .iter()
                .map(|port| start_sentinel(*port, primary.port(), password, tls)),
        )
        .await;
        let sentinels = started.into_iter().collect::<Result<Vec<_>, _>>()?;
        let fixture = RedisSentinel {
            nodes: vec![primary, replica],
            sentinels,
            password: password.map(str::to_owned),
            tls: tls.cloned(),
        };
        fixture.await_ready(Duration::from_secs(30)).await?;
        Ok(fixture)
    }

    /// The Sentinels' URL, `redis+sentinel://127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>/baton`
    /// (with `?sentinel_password=` for Sentinels started with a password).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        let auth = match &self.password {
            Some(password) => format!("?sentinel_password={password}"),
            None => String::new(),
        };
        let scheme = if self.tls.is_some() {
            "rediss+sentinel"
        } else {
            "redis+sentinel"
        };
        format!(
            "{scheme}://{}/{}{auth}",
            hosts.join(","),
            RedisSentinel::SERVICE
        )
    }

    /// The Sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(Instance::port).collect()
    }

    /// The two Redis nodes (the first started as the primary, the second as its replica; a
    /// failover swaps their roles).
    pub fn nodes(&self) -> &[RedisNode] {
        &self.nodes
    }

    /// The node the first Sentinel that answers names as the primary now.
    ///
    /// # Errors
    /// [`FixtureError::Command`] if no Sentinel answers, or one names a node not of this
    /// fixture.
    ///
    /// # Cancel safety
    /// Cancel safe: it only asks the Sentinels.
    pub async fn primary(&self) -> Result<&RedisNode, FixtureError> {
        let mut last = None;
        for i in 0..self.sentinels.len() {
            match self.named_primary(i).await {
                Ok(port) => return self.node_on(port),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| command_error("SENTINEL", "no Sentinel".into())))
    }

    /// The node that is not [`primary`](Self::primary).
    ///
    /// # Errors
    /// As [`primary`](Self::primary).
    ///
    /// # Cancel safety
    /// Cancel safe: it only asks the Sentinels.
    pub async fn replica(&self) -> Result<&RedisNode, FixtureError> {
        let primary = self.primary().await?.port();
        self.nodes
            .iter()
            .find(|n| n.port() != primary)
            .ok_or_else(|| command_error("SENTINEL", "no replica".into()))
    }

    /// Asks a Sentinel for a failover at once (`SENTINEL FAILOVER baton`): the replica is
    /// promoted, the primary made its replica. [`await_new_primary`](Self::await_new_primary)
    /// tells when it is done.
    ///
    /// # Errors
    /// [`FixtureError::Command`] if the Sentinel refuses (no replica fit to promote, a
    /// failover already under way).
    ///
    /// # Cancel safety
    /// If the future is dropped the failover may or may not have been asked for.
    pub async fn failover(&self) -> Result<(), FixtureError> {
        self.sentinel_command::<()>(0, "SENTINEL", &["FAILOVER", RedisSentinel::SERVICE])
            .await
    }

    /// Waits (up to 30 s) until every Sentinel names a primary other than the node on port
    /// `old`, and that node says it is a primary (`ROLE`); returns it.
    ///
    /// # Errors
    /// [`FixtureError::NotReady`] if that does not happen within 30 s.
    ///
    /// # Cancel safety
    /// Cancel safe: it only asks the Sentinels and the nodes; dropping it stops the wait.
    pub async fn await_new_primary(&self, old: u16) -> Result<&RedisNode, FixtureError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(port) = self.agreed_primary().await
                && port != old
                && let Ok(node) = self.node_on(port)
                && node_role(node).await.as_deref() == Some("master")
            {
                return Ok(node);
            }
            if Instant::now() >= deadline {
                return Err(FixtureError::NotReady {
                    server: REDIS.name,
                    address: format!("a primary other than 127.0.0.1:{old}, named by Sentinel"),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (up to 30 s) until the node that is not the primary replicates it (link up) and
    /// every Sentinel counts it as a replica fit for a failover: after a failover, before the
    /// next one.
    ///
    /// # Errors
    /// [`FixtureError::NotReady`] if that does not happen within 30 s.
    ///
    /// # Cancel safety
    /// Cancel safe: it only asks the Sentinels; dropping it stops the wait.
    pub async fn await_replica_in_sync(&self) -> Result<(), FixtureError> {
        self.await_ready(Duration::from_secs(30)).await
    }

    /// Brings a node that was stopped ([`RedisNode::stop`], e.g. a primary killed to make the
    /// Sentinels fail it over) back as a replica of the primary the Sentinels name now: starts
    /// it again (empty) and sends it `REPLICAOF` at once, rather than waiting for Sentinel to
    /// reconfigure it (which it does only seconds after it sees it back as a primary). Returns
    /// once it is started; [`await_replica_in_sync`](Self::await_replica_in_sync) tells when
    /// it has synchronised and the Sentinels count it fit for the next failover. No client
    /// that follows the Sentinels reaches it meanwhile: they name the other node.
    ///
    /// # Errors
    /// As [`RedisNode::start_again`] and [`primary`](Self::primary);
    /// [`FixtureError::Command`] if the Sentinels name the node itself as the primary, or it
    /// refuses `REPLICAOF`, or no node of this fixture is on `port`.
    ///
    /// # Cancel safety
    /// If the future is dropped the node may be running as an empty primary that no Sentinel
    /// names, until Sentinel reconfigures it.
    pub async fn start_again_as_replica(&self, port: u16) -> Result<(), FixtureError> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.port() == port)
            .ok_or_else(|| {
                command_error(
                    "REPLICAOF",
                    format!("no node of this fixture on port {port}").into(),
                )
            })?;
        let primary = self.primary().await?.port();
        if primary == port {
            return Err(command_error(
                "REPLICAOF",
                format!("the Sentinels name 127.0.0.1:{port} itself as the primary").into(),
            ));
        }
        node.start_again().await?;
        node.command::<()>("REPLICAOF", &["127.0.0.1", &primary.to_string()])
            .await
    }

    /// Sends one command to Sentinel `i` (with its password, if it has one).
    ///
    /// # Errors
    /// [`FixtureError::Command`] if it cannot be reached or refuses; [`FixtureError::NoSuchMember`]
    /// for an index out of range.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call may or may not have reached the Sentinel.
    pub async fn sentinel_command<T: redis::FromRedisValue>(
        &self,
        i: usize,
        command: &'static str,
        args: &[&str],
    ) -> Result<T, FixtureError> {
        let client = self.sentinel_client(i)?;
        let failed = |source: redis::RedisError| command_error(command, Box::new(source));
        one_command(&client, command, args).await.map_err(failed)
    }

    /// Listens to every Sentinel for its announcements of a new primary (`+switch-master`
    /// about [`SERVICE`](Self::SERVICE)), from now on: subscribe before you cause a failover,
    /// then [`SentinelSwitches::next`] gives the first announcement, as soon as any Sentinel
    /// makes it (the moment a client that listens, as baton does, can move; a nemesis takes it
    /// as the failover's end).
    ///
    /// # Errors
    /// [`FixtureError::Command`] if a Sentinel cannot be reached or refuses the subscription.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves no subscription behind.
    pub async fn switches(&self) -> Result<SentinelSwitches, FixtureError> {
        let mut streams = Vec::new();
        for i in 0..self.sentinels.len() {
            let failed = |source: redis::RedisError| command_error("SUBSCRIBE", Box::new(source));
            let client = self.sentinel_client(i)?;
            let mut pubsub = client.get_async_pubsub().await.map_err(failed)?;
            pubsub.subscribe(SWITCH_MASTER).await.map_err(failed)?;
            streams.push(pubsub.into_on_message().boxed());
        }
        Ok(SentinelSwitches {
            messages: futures::stream::select_all(streams),
        })
    }

    /// A client of Sentinel `i` (with its password, if it has one).
    fn sentinel_client(&self, i: usize) -> Result<redis::Client, FixtureError> {
        let sentinel = self.sentinels.get(i).ok_or(FixtureError::NoSuchMember {
            index: i,
            members: self.sentinels.len(),
        })?;
        let auth = match &self.password {
            Some(password) => format!(":{password}@"),
            None => String::new(),
        };
        match &self.tls {
            Some(tls) => tls.client(format!("rediss://{auth}127.0.0.1:{}", sentinel.port())),
            None => redis::Client::open(format!("redis://{auth}127.0.0.1:{}", sentinel.port())),
        }
        .map_err(|source| command_error("SENTINEL", Box::new(source)))
    }

    /// The port of the primary Sentinel `i` names.
    async fn named_primary(&self, i: usize) -> Result<u16, FixtureError> {
        let (_, port): (String, u16) = self
            .sentinel_command(
                i,
                "SENTINEL",
                &["GET-MASTER-ADDR-BY-NAME", RedisSentinel::SERVICE],
            )
            .await?;
        Ok(port)
    }

    /// The primary every Sentinel names, if they agree.
    async fn agreed_primary(&self) -> Option<u16> {
        let mut agreed = None;
        for i in 0..self.sentinels.len() {
            let port = self.named_primary(i).await.ok()?;
            if agreed.is_some_and(|a| a != port) {
                return None;
            }
            agreed = Some(port);
        }
        agreed
    }

    fn node_on(&self, port: u16) -> Result<&RedisNode, FixtureError> {
        self.nodes.iter().find(|n| n.port() == port).ok_or_else(|| {
            command_error(
                "SENTINEL",
                format!("a Sentinel names 127.0.0.1:{port}, not a node of this fixture").into(),
            )
        })
    }

    /// Until the Sentinels agree on the primary, the other node replicates it, and every
    /// Sentinel knows that replica and the two other Sentinels.
    async fn await_ready(&self, within: Duration) -> Result<(), FixtureError> {
        let deadline = Instant::now() + within;
        loop {
            if self.ready().await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(FixtureError::NotReady {
                    server: REDIS.name,
                    address: format!(
                        "Sentinels on 127.0.0.1:{:?} (knowing the replica and each other)",
                        self.sentinel_ports()
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn ready(&self) -> bool {
        let Some(primary) = self.agreed_primary().await else {
            return false;
        };
        let Some(replica) = self.nodes.iter().find(|n| n.port() != primary) else {
            return false;
        };
        let info: Result<String, _> = replica.command("INFO", &["replication"]).await;
        let linked = info.is_ok_and(|i| {
            i.contains("master_link_status:up") && i.contains(&format!("master_port:{primary}"))
        });
        if !linked {
            return false;
        }
        for i in 0..self.sentinels.len() {
            let master: Result<Vec<String>, _> = self
                .sentinel_command(i, "SENTINEL", &["MASTER", RedisSentinel::SERVICE])
                .await;
            let Ok(master) = master else {
                return false;
            };
            let field = |name: &str| {
                master
                    .chunks(2)
                    .find(|kv| kv[0] == name)
                    .and_then(|kv| kv.get(1))
                    .cloned()
                    .unwrap_or_default()
            };
            if field("num-slaves") != "1"
                || field("num-other-sentinels") != "2"
                || field("flags") != "master"
            {
                return false;
            }
            let replicas: Result<Vec<Vec<String>>, _> = self
                .sentinel_command(i, "SENTINEL", &["REPLICAS", RedisSentinel::SERVICE])
                .await;
            let fit = replicas.is_ok_and(|rs| {
                rs.iter().any(|r| {
                    let get = |name: &str| {
                        r.chunks(2)
                            .find(|kv| kv[0] == name)
                            .and_then(|kv| kv.get(1))
                            .cloned()
                            .unwrap_or_default()
                    };
                    get("port") == replica.port().to_string()
                        && get("flags") == "slave"
                        && get("master-link-status") == "ok"
                })
            });
            if !fit {
                return false;
            }
        }
        true
    }

    /// A backend connected through the Sentinels, with `options` (a test of failovers sets
    /// its restart grace and timeouts).
    ///
    /// # Errors
    /// As [`RedisBackend::connect`](crate::RedisBackend::connect).
    ///
    /// # Cancel safety
    /// Cancel safe: a backend not yet connected is dropped with the future.
    pub async fn backend(
        &self,
        options: crate::RedisOptions,
    ) -> crate::Result<crate::RedisBackend> {
        let options = match &self.tls {
            Some(tls) => tls.redis_options(options),
            None => options,
        };
        crate::RedisBackend::connect(&self.url(), options).await
    }
}

/// The channel on which Sentinels announce a new primary: `<service> <old ip> <old port>
/// <new ip> <new port>`.
const SWITCH_MASTER: &str = "+switch-master";

/// Every Sentinel's announcements of a new primary, from [`RedisSentinel::switches`].
pub struct SentinelSwitches {
    messages: futures::stream::SelectAll<futures::stream::BoxStream<'static, redis::Msg>>,
}

impl std::fmt::Debug for SentinelSwitches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelSwitches")
            .field("sentinels", &self.messages.len())
            .finish()
    }
}

impl SentinelSwitches {
    /// Waits (up to `within`) for the next announcement that
    /// [`SERVICE`](RedisSentinel::SERVICE) has a new primary, from any Sentinel; returns the
    /// new primary's port. Each Sentinel announces each failover once, so a failover is heard
    /// up to three times: the first is the one that matters.
    ///
    /// # Errors
    /// [`FixtureError::NotReady`] if no Sentinel announces one within `within`, or every
    /// Sentinel's connection closed.
    ///
    /// # Cancel safety
    /// Cancel safe: an announcement is taken from the stream only when it is returned.
    pub async fn next(&mut self, within: Duration) -> Result<u16, FixtureError> {
        let not_ready = || FixtureError::NotReady {
            server: REDIS.name,
            address: format!("a Sentinel's {SWITCH_MASTER} within {within:?}"),
        };
        let heard = tokio::time::timeout(within, async {
            while let Some(message) = self.messages.next().await {
                let payload = String::from_utf8_lossy(message.get_payload_bytes()).into_owned();
                let words: Vec<&str> = payload.split(' ').collect();
                if let [service, _, _, _, port] = words.as_slice()
                    && *service == RedisSentinel::SERVICE
                    && let Ok(port) = port.parse::<u16>()
                {
                    return Some(port);
                }
            }
            None
        })
        .await;
        heard.ok().flatten().ok_or_else(not_ready)
    }
}

fn command_error(
    command: &'static str,
    source: Box<dyn std::error::Error + Send + Sync>,
) -> FixtureError {
    FixtureError::Command {
        server: REDIS.name,
        command,
        source,
    }
}

/// What a node says it is (`ROLE`: `master`, `slave`), if it answers.
async fn node_role(node: &RedisNode) -> Option<String> {
    let role: redis::Value = node.command("ROLE", &[]).await.ok()?;
    match role {
        redis::Value::Array(items) => match items.first()? {
            redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            redis::Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// The configuration of a Sentinel on `port` watching the primary on `primary`.
fn sentinel_conf(
    port: u16,
    primary: u16,
    password: Option<&str>,
    tls: Option<(&RedisTls, &str)>,
) -> String {
    let service = RedisSentinel::SERVICE;
    let ports = match tls {
        // TLS only, on `port`; TLS to the servers and to the other Sentinels.
        Some((tls, dir)) => format!(
            "port 0\ntls-port {port}\ntls-cert-file {dir}/{TLS_CERT}\n\
             tls-key-file {dir}/{TLS_KEY}\ntls-ca-cert-file {dir}/{TLS_CA}\n\
             tls-auth-clients {}\ntls-replication yes\n",
            if tls.client_cert_auth() { "yes" } else { "no" }
        ),
        None => format!("port {port}\n"),
    };
    let mut conf = format!(
        "{ports}bind 127.0.0.1\nprotected-mode no\ndir /tmp\n\
         sentinel monitor {service} 127.0.0.1 {primary} 2\n\
         sentinel down-after-milliseconds {service} {}\n\
         sentinel failover-timeout {service} {}\n\
         sentinel parallel-syncs {service} 1\n",
        SENTINEL_DOWN_AFTER.as_millis(),
        SENTINEL_FAILOVER_TIMEOUT.as_millis(),
    );
    if let Some(password) = password {
        conf.push_str(&format!(
            "requirepass {password}\nsentinel sentinel-pass {password}\n"
        ));
    }
    conf
}

/// Starts one Sentinel on `port`.
async fn start_sentinel(
    port: u16,
    primary: u16,
    password: Option<&str>,
    tls: Option<&RedisTls>,
) -> Result<Instance, FixtureError> {
    let conf = sentinel_conf(port, primary, password, tls.map(|t| (t, CONTAINER_TLS_DIR)));
    let mut files = vec![(SENTINEL_CONF.to_owned(), conf.into_bytes())];
    if let Some(tls) = tls {
        files.extend(tls.files().iter().map(|(name, pem)| {
            (
                format!("{CONTAINER_TLS_DIR}/{name}"),
                pem.as_bytes().to_vec(),
            )
        }));
    }
    let args = vec![SENTINEL_CONF.to_owned(), "--sentinel".to_owned()];
    let fallback = || {
        let process = ServerProcess::new(
            SENTINEL,
            port,
            sentinel_ping,
            "redis-server",
            vec!["sentinel.conf".to_owned(), "--sentinel".to_owned()],
        )?;
        let conf = sentinel_conf(port, primary, password, tls.map(|t| (t, LOCAL_TLS_DIR)));
        std::fs::write(SENTINEL.work_dir(port).join("sentinel.conf"), conf)?;
        if let Some(tls) = tls {
            tls.write_files(&SENTINEL.work_dir(port).join(LOCAL_TLS_DIR))?;
        }
        Ok(process)
    };
    Instance::start_with_files(SENTINEL, port, sentinel_ping, args, files, fallback).await
}

/// Whether a Sentinel listens on 127.0.0.1:`port` (one with a password answers `PING` with
/// `-NOAUTH`: listening is enough, the container's log said it monitors).
fn sentinel_ping(port: u16) -> BoxFuture<'static, bool> {
    listening(port)
}

/// Sends one command, with `args`, on a connection of its own to `client`'s server.
async fn one_command<T: redis::FromRedisValue>(
    client: &redis::Client,
    command: &str,
    args: &[&str],
) -> redis::RedisResult<T> {
    let mut conn = client.get_multiplexed_async_connection().await?;
    let mut cmd = redis::cmd(command);
    for a in args {
        cmd.arg(*a);
    }
    cmd.query_async(&mut conn).await
}
