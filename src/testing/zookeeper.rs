//! ZooKeeper fixtures: one server ([`ZkNode`]) or a three-member ensemble ([`ZkEnsemble`]), in
//! containers, that fault tests can stop, restart and pause; and [`four_letter`], ZooKeeper's
//! four-letter administrative words over TCP.

use std::path::PathBuf;
use std::sync::OnceLock;

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::fixture::{
    FixtureError, Instance, Server, ServerProcess, exchange, free_port, free_ports, start_shared,
};
use super::tls::{CONTAINER_TLS_DIR, ServerTls, TLS_CA};

/// The image used when `BATON_ZOOKEEPER_IMAGE` is not set: the one
/// `scripts/build-zookeeper-image.sh` builds from Debian's `zookeeper`. A fixture that finds
/// it missing builds it with that script (embedded in the crate).
pub const DEFAULT_ZOOKEEPER_IMAGE: &str = "local/zookeeper:debian";

const ZOOKEEPER: Server = Server {
    name: "zookeeper",
    image_var: "BATON_ZOOKEEPER_IMAGE",
    default_image: DEFAULT_ZOOKEEPER_IMAGE,
    // The image's entrypoint turns `key=value` arguments into zoo.cfg and runs the server.
    entrypoint: "zookeeper-entrypoint",
    // The fallback does not run the image's entrypoint: `java` on Debian's jars.
    local: "`java` on Debian's ZooKeeper jars (/usr/share/java/zookeeper.jar)",
    // The client port is bound: the JVM is up. Whether the server serves (in a quorum, for a
    // member of an ensemble) is then asked with `srvr`.
    ready: "binding to port",
    build_script: include_str!("../../scripts/build-zookeeper-image.sh"),
    // 2: the Netty jars a TLS server loads, and a secure client port only.
    layout: Some("2"),
};

/// What the fallback runs: `java` from `PATH` on Debian's jars (the `zookeeper` package; the
/// jar's manifest names its dependencies) and slf4j-simple, which logs to stderr.
const CLASSPATH: &str = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar";
/// ZooKeeper's entry point, as Debian's `zkServer.sh` runs it, for a single server or a member.
const MAIN: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";
/// The JVM options of the image's entrypoint, given to the fallback too.
const JVM_OPTIONS: [&str; 4] = [
    "-Xmx512m",
    "-XX:+ExitOnOutOfMemoryError",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
];

/// Where a server's container keeps its data: the image's `dataDir`.
const CONTAINER_DATA_DIR: &str = "/tmp/zookeeper/data";

/// How long [`ZkEnsemble::wait_for_leader`] waits.
const LEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// The pause between two looks for a leader.
const POLL: std::time::Duration = std::time::Duration::from_millis(25);

/// The zoo.cfg lines every server gets: loopback only, every four-letter word, no admin
/// server, a short tick for quick elections and failure detection, session timeouts from 1 s
/// to 60 s, no limit on connections per address (every client comes from 127.0.0.1), and no
/// fsync (a killed server still finds its log in the page cache). `extra` comes last, so that
/// it overrides.
fn config(client_port: u16, extra: &[String]) -> Vec<String> {
    let base = [
        format!("clientPort={client_port}"),
        "clientPortAddress=127.0.0.1".to_owned(),
        "admin.enableServer=false".to_owned(),
        "4lw.commands.whitelist=*".to_owned(),
        // initLimit and syncLimit are in ticks: 5 s to join a leader, 2 s of silence from one.
        "tickTime=200".to_owned(),
        "initLimit=25".to_owned(),
        "syncLimit=10".to_owned(),
        "minSessionTimeout=1000".to_owned(),
        "maxSessionTimeout=60000".to_owned(),
        "maxClientCnxns=0".to_owned(),
        // Unknown keys become system properties: zookeeper.forceSync.
        "forceSync=no".to_owned(),
    ];
    base.into_iter().chain(extra.iter().cloned()).collect()
}

/// The certificates of a ZooKeeper that serves TLS on its client port, PEM-encoded, and
/// whether it asks its clients for a certificate (`ssl.clientAuth=need`, or `none`), for
/// [`ZkNode::start_tls`]; with the client certificate the fixture's own clients present.
///
/// [`generate`](ServerTls::generate) makes the whole set for tests: a CA, a server
/// certificate for `127.0.0.1` and `localhost`, and a client certificate.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use baton::testing::{ZkNode, ZkTls};
/// let tls = ZkTls::generate()?.with_client_cert_auth(false);
/// let zk = ZkNode::start_tls(&tls).await?; // zks://127.0.0.1:<port>, TLS only
/// // Your client: the node's URL and the CA (and a client certificate, if the server asks).
/// let options = baton::ZkOptions::new().with_ca_cert(tls.ca_pem());
/// let backend = baton::ZkBackend::connect(&zk.url(), options).await?;
/// # let _ = backend; Ok(()) }
/// ```
pub type ZkTls = ServerTls;

impl ServerTls {
    /// `options` with the CA and, if there is one, the client certificate: for a client of
    /// a node started with these certificates.
    pub fn zk_options(&self, options: crate::ZkOptions) -> crate::ZkOptions {
        let options = options.with_ca_cert(self.ca_pem().to_owned());
        match self.client_cert() {
            Some(client) => options.with_client_cert(client.cert_pem(), client.key_pem()),
            None => options,
        }
    }

    /// The zoo.cfg lines of a server with a TLS client port only, on 127.0.0.1:`port`, its
    /// files in the container's TLS directory: Netty (the NIO server has no TLS), PEM key
    /// and trust stores (ZooKeeper 3.7+), client certificates asked for or not. The server
    /// does not check a client certificate's names against the client's address
    /// (`ssl.hostnameVerification=false`): that check is for quorum peers.
    fn zk_lines(&self, port: u16) -> Vec<String> {
        let auth = if self.client_cert_auth() {
            "need"
        } else {
            "none"
        };
        vec![
            format!("secureClientPort={port}"),
            "secureClientPortAddress=127.0.0.1".to_owned(),
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory".to_owned(),
            format!("ssl.keyStore.location={CONTAINER_TLS_DIR}/{ZK_KEY_STORE}"),
            "ssl.keyStore.type=PEM".to_owned(),
            format!("ssl.trustStore.location={CONTAINER_TLS_DIR}/{TLS_CA}"),
            "ssl.trustStore.type=PEM".to_owned(),
            format!("ssl.clientAuth={auth}"),
            "ssl.hostnameVerification=false".to_owned(),
        ]
    }

    /// The files the server reads, by path in the container: the CA, and the key store (the
    /// server's private key and certificate in one PEM file, as ZooKeeper's PEM loader
    /// takes them).
    fn zk_files(&self) -> Vec<(String, Vec<u8>)> {
        let server = self.server_cert();
        let store = format!("{}\n{}", server.key_pem(), server.cert_pem());
        vec![
            (
                format!("{CONTAINER_TLS_DIR}/{TLS_CA}"),
                self.ca_pem().as_bytes().to_vec(),
            ),
            (
                format!("{CONTAINER_TLS_DIR}/{ZK_KEY_STORE}"),
                store.into_bytes(),
            ),
        ]
    }
}

/// The SASL DIGEST-MD5 users of a ZooKeeper started with [`ZkNode::start_sasl`] (its JAAS
/// `Server` section, `DigestLoginModule`), and whether the server refuses clients that do
/// not authenticate (`enforce.auth.enabled=true`, `enforce.auth.schemes=sasl`). The first
/// user is the one the fixture's own clients ([`ZkNode::backend`]) authenticate as.
/// `Debug` shows the user names only.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use baton::testing::{ZkNode, ZkSasl};
/// let sasl = ZkSasl::new(); // users `baton` and `other`; SASL required
/// let zk = ZkNode::start_sasl(&sasl).await?;
/// let url = format!("zk://{}:{}@{}", sasl.user(), sasl.password(), zk.connect_string());
/// let backend = baton::connect(&url).await?;
/// # let _ = backend; Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZkSasl {
    users: Vec<(String, String)>,
    enforce: bool,
}

impl std::fmt::Debug for ZkSasl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let users: Vec<&str> = self.users.iter().map(|(u, _)| u.as_str()).collect();
        f.debug_struct("ZkSasl")
            .field("users", &users)
            .field("enforce", &self.enforce)
            .finish()
    }
}

impl Default for ZkSasl {
    fn default() -> Self {
        Self::new()
    }
}

/// Where a SASL server's JAAS configuration is, in its container.
const CONTAINER_JAAS: &str = "/baton-sasl/jaas.conf";

impl ZkSasl {
    /// Two users, `baton` (the fixture's own) and `other`, each with a password of its own;
    /// SASL required.
    pub fn new() -> ZkSasl {
        ZkSasl {
            users: vec![
                ("baton".to_owned(), "baton-pw-7Qx2".to_owned()),
                ("other".to_owned(), "other-pw-4Kd9".to_owned()),
            ],
            enforce: true,
        }
    }

    /// One more user (letters, digits, `-` and `_`; a password without `"` or `\\`).
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.users.push((user.into(), password.into()));
        self
    }

    /// Whether the server refuses a client that does not authenticate with SASL (the
    /// default); without, such a client connects as `world:anyone`.
    pub fn with_enforced(mut self, enforce: bool) -> Self {
        self.enforce = enforce;
        self
    }

    /// The first user's name: the fixture's own clients authenticate as it.
    pub fn user(&self) -> &str {
        self.users.first().map_or("", |(u, _)| u.as_str())
    }

    /// The first user's password.
    pub fn password(&self) -> &str {
        self.users.first().map_or("", |(_, p)| p.as_str())
    }

    /// Every user and its password, the first user first.
    pub fn users(&self) -> impl Iterator<Item = (&str, &str)> {
        self.users.iter().map(|(u, p)| (u.as_str(), p.as_str()))
    }

    /// `options` authenticating as the first user.
    pub fn zk_options(&self, options: crate::ZkOptions) -> crate::ZkOptions {
        options.with_sasl_digest(self.user(), self.password())
    }

    /// The zoo.cfg lines (and the JVM option naming the JAAS file) of a server that
    /// authenticates clients with SASL.
    fn zk_lines(&self) -> Vec<String> {
        let mut lines = vec![
            format!("-Djava.security.auth.login.config={CONTAINER_JAAS}"),
            // Unknown keys become system properties: zookeeper.authProvider.1, and so on.
            "authProvider.1=org.apache.zookeeper.server.auth.SASLAuthenticationProvider".to_owned(),
        ];
        if self.enforce {
            lines.push("enforce.auth.enabled=true".to_owned());
            lines.push("enforce.auth.schemes=sasl".to_owned());
        }
        lines
    }

    /// The JAAS file: a `Server` section with `DigestLoginModule` and one `user_<name>` a user.
    fn zk_files(&self) -> Vec<(String, Vec<u8>)> {
        let mut jaas =
            String::from("Server {\n  org.apache.zookeeper.server.auth.DigestLoginModule required");
        for (user, password) in &self.users {
            jaas.push_str(&format!("\n  user_{user}=\"{password}\""));
        }
        jaas.push_str(";\n};\n");
        vec![(CONTAINER_JAAS.to_owned(), jaas.into_bytes())]
    }
}

/// The key store of a TLS server: its key and certificate, PEM.
const ZK_KEY_STORE: &str = "server-store.pem";

/// Whether the server on `port` accepts TCP connections (a TLS-only server answers no
/// four-letter word in plain text; it is started when it has bound its port).
fn listening(port: u16) -> BoxFuture<'static, bool> {
    Box::pin(async move {
        exchange(format!("127.0.0.1:{port}"), Vec::new(), |_| true)
            .await
            .is_ok()
    })
}

/// Sends the four-letter word `word` (`"ruok"`, `"srvr"`, `"mntr"`, `"stat"`, `"conf"`,
/// `"wchs"`...) to the ZooKeeper server on 127.0.0.1:`port` and returns its answer, e.g. for
/// `mntr` one `zk_<name>\t<value>` line a metric (`zk_watch_count`, `zk_znode_count`,
/// `zk_ephemerals_count`, `zk_server_state`...). The fixtures' servers allow every word; a
/// server that does not answers that the word is not in its whitelist, and one that does not
/// serve (a member without a quorum) answers so to every word but `ruok`.
///
/// # Errors
/// [`FixtureError::Command`] if the server cannot be reached or does not answer within 1 s
/// (it is stopped or paused).
///
/// # Cancel safety
/// Dropping the future abandons the exchange (it finishes on the blocking pool); nothing is
/// changed on the server.
pub async fn four_letter(port: u16, word: &'static str) -> Result<String, FixtureError> {
    ask(format!("127.0.0.1:{port}"), word).await
}

/// [`four_letter`] to `address` (`host:port`).
async fn ask(address: String, word: &'static str) -> Result<String, FixtureError> {
    // The server closes the connection once it has answered.
    match exchange(address, word.as_bytes().to_vec(), |_| false).await {
        Ok(answer) => Ok(String::from_utf8_lossy(&answer).into_owned()),
        Err(source) => Err(FixtureError::Command {
            server: ZOOKEEPER.name,
            command: word,
            source: Box::new(source),
        }),
    }
}

/// The mode `srvr` reports: `standalone`, `leader`, `follower` or `observer`; `None` for a
/// server that does not serve.
fn mode(srvr: &str) -> Option<&str> {
    srvr.lines()
        .find_map(|line| line.strip_prefix("Mode: "))
        .map(str::trim)
}

/// Whether the server on `port` is up (`ruok` answers `imok`) and serves (`srvr` reports a
/// mode: `imok` alone only says that the process listens, not that it has a quorum).
fn serving(port: u16) -> BoxFuture<'static, bool> {
    Box::pin(async move {
        matches!(four_letter(port, "ruok").await.as_deref(), Ok("imok"))
            && four_letter(port, "srvr")
                .await
                .is_ok_and(|srvr| mode(&srvr).is_some())
    })
}

/// The fallback: `java` on Debian's jars, with zoo.cfg and the data directory in the process's
/// working directory. `lines` are the container's arguments: zoo.cfg lines, and `myid=N`, which
/// goes to the data directory's `myid` file as the image's entrypoint does.
fn local_process(port: u16, lines: &[String]) -> std::io::Result<ServerProcess> {
    let dir = ZOOKEEPER.work_dir(port);
    let data = dir.join("data");
    std::fs::create_dir_all(&data)?;
    let mut cfg = format!("dataDir={}\n", data.display());
    for line in lines {
        match line.strip_prefix("myid=") {
            Some(id) => std::fs::write(data.join("myid"), format!("{id}\n"))?,
            None => cfg.extend([line.as_str(), "\n"]),
        }
    }
    let cfg_path = dir.join("zoo.cfg");
    std::fs::write(&cfg_path, cfg)?;
    let args = JVM_OPTIONS
        .iter()
        .map(|s| (*s).to_owned())
        .chain(["-cp".to_owned(), CLASSPATH.to_owned(), MAIN.to_owned()])
        .chain([cfg_path.to_string_lossy().into_owned()])
        .collect();
    ServerProcess::new(ZOOKEEPER, port, serving, "java", args)
}

/// The first `host:port` of a connect string (`host[:port][,host[:port]...][/chroot]`), with
/// ZooKeeper's default port 2181 if it names none.
fn first_address(connect: &str) -> (String, u16) {
    let first = connect.split([',', '/']).next().unwrap_or(connect);
    match first.rsplit_once(':').map(|(h, p)| (h, p.parse())) {
        Some((host, Ok(port))) => (format!("{host}:{port}"), port),
        _ => (format!("{first}:2181"), 2181),
    }
}

/// One ZooKeeper server for tests (standalone), with a short tick (200 ms), session timeouts
/// from 1 s to 60 s and no fsync. A server the fixture starts is marked as baton's
/// ([`ZkBackend::init_store`](crate::ZkBackend::init_store)), so that its first use waits no
/// restart grace.
///
/// Fault tests can [`stop`](Self::stop) it, [`start_again`](Self::start_again) or
/// [`restart`](Self::restart) it on the same port, and [`pause`](Self::pause) it. Unlike the
/// Redis fixture's, a restarted server keeps its data: ZooKeeper logs every change before it
/// answers, so its znodes and sessions (with their ephemeral nodes) come back, and a client
/// whose session has not expired meanwhile reconnects to it. A server started with
/// [`start_with_host_data`](Self::start_with_host_data) can also lose it
/// ([`wipe_data`](Self::wipe_data)). See the [module docs](super) for the environment it
/// reads.
#[derive(Debug)]
pub struct ZkNode {
    /// The connect string clients get.
    connect: String,
    /// The `host:port` four-letter words go to.
    address: String,
    instance: Instance,
    /// The host directory bound as the server's data dir, for a server started with
    /// [`start_with_host_data`](Self::start_with_host_data).
    host_data: Option<PathBuf>,
    /// The certificates of a node started with [`start_tls`](Self::start_tls).
    tls: Option<ZkTls>,
    /// The users of a node started with [`start_sasl`](Self::start_sasl).
    sasl: Option<ZkSasl>,
}

impl ZkNode {
    /// Starts a ZooKeeper server on a free port of 127.0.0.1, or uses the one
    /// `BATON_ZOOKEEPER_CONNECT` names; returns once it serves.
    ///
    /// # Errors
    /// [`FixtureError`] if neither a container nor (when allowed) a local `java` with Debian's
    /// ZooKeeper jars starts.
    ///
    /// # Cancel safety
    /// Dropping the future removes a container (or kills a process) it had started.
    pub async fn start() -> Result<ZkNode, FixtureError> {
        ZkNode::start_with(&[]).await
    }

    /// As [`start`](Self::start), with extra zoo.cfg lines, e.g. `&["forceSync=yes"]` or
    /// `&["maxSessionTimeout=10000"]`. They come after the fixture's own (see the
    /// [module docs](super)), so they override them. A server named by
    /// `BATON_ZOOKEEPER_CONNECT` is used as it is: the lines are ignored (with a warning).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    ///
    /// # Cancel safety
    /// As [`start`](Self::start).
    pub async fn start_with(config: &[&str]) -> Result<ZkNode, FixtureError> {
        if let Ok(connect) = std::env::var("BATON_ZOOKEEPER_CONNECT") {
            if !config.is_empty() {
                tracing::warn!(
                    ?config,
                    %connect,
                    "BATON_ZOOKEEPER_CONNECT is set: extra configuration ignored"
                );
            }
            let (address, port) = first_address(&connect);
            let reason =
                "the server is external (BATON_ZOOKEEPER_CONNECT); the test did not start it";
            return Ok(ZkNode {
                connect,
                address,
                instance: Instance::external(ZOOKEEPER, port, reason),
                host_data: None,
                tls: None,
                sasl: None,
            });
        }
        let extra: Vec<String> = config.iter().map(|s| (*s).to_owned()).collect();
        let node = ZkNode::start_on(free_port()?, &extra).await?;
        init_store(&node.connect).await?;
        Ok(node)
    }

    /// Starts a server on `port` with the fixture's configuration and `extra`, in a container
    /// or (when allowed) as a local process, and waits until it serves.
    async fn start_on(port: u16, extra: &[String]) -> Result<ZkNode, FixtureError> {
        let lines = config(port, extra);
        let fallback = || local_process(port, &lines);
        let instance = Instance::start(ZOOKEEPER, port, serving, lines.clone(), fallback).await?;
        Ok(ZkNode {
            connect: format!("127.0.0.1:{port}"),
            address: format!("127.0.0.1:{port}"),
            instance,
            host_data: None,
            tls: None,
            sasl: None,
        })
    }

    /// Starts a server (standalone) that serves TLS only (a `secureClientPort`, no
    /// `clientPort`), on a free port of 127.0.0.1, with `tls`'s certificates; its URL is
    /// `zks://127.0.0.1:<port>`. Needs Docker (no local fallback). `BATON_ZOOKEEPER_CONNECT`
    /// does not apply. [`backend`](Self::backend) connects with the CA and, if there is one,
    /// `tls`'s client certificate; four-letter words in plain text get no answer.
    ///
    /// # Errors
    /// [`FixtureError`] if the container does not start.
    ///
    /// # Cancel safety
    /// Dropping the future removes the container it had started.
    pub async fn start_tls(tls: &ZkTls) -> Result<ZkNode, FixtureError> {
        ZkNode::start_secured(Some(tls), None).await
    }

    /// A server with TLS only ([`start_tls`](Self::start_tls)), SASL
    /// ([`start_sasl`](Self::start_sasl)), or both, marked as baton's by its own client.
    async fn start_secured(
        tls: Option<&ZkTls>,
        sasl: Option<&ZkSasl>,
    ) -> Result<ZkNode, FixtureError> {
        let port = free_port()?;
        let mut extra = Vec::new();
        let mut files = Vec::new();
        if let Some(tls) = tls {
            extra.extend(tls.zk_lines(port));
            files.extend(tls.zk_files());
        }
        if let Some(sasl) = sasl {
            extra.extend(sasl.zk_lines());
            files.extend(sasl.zk_files());
        }
        let mut lines = config(port, &extra);
        let probe = if tls.is_some() {
            // The secure port replaces the plain one (the image leaves out its defaults too).
            lines.retain(|line| !line.starts_with("clientPort"));
            listening
        } else {
            serving
        };
        let fallback = || {
            Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "a ZooKeeper with TLS or SASL runs in a container only",
            ))
        };
        let instance =
            Instance::start_with_files(ZOOKEEPER, port, probe, lines, files, fallback).await?;
        let node = ZkNode {
            connect: format!("127.0.0.1:{port}"),
            address: format!("127.0.0.1:{port}"),
            instance,
            host_data: None,
            tls: tls.cloned(),
            sasl: sasl.cloned(),
        };
        let failed = |e: crate::Error| FixtureError::Process {
            server: ZOOKEEPER.name,
            reason: format!("marking the new ZooKeeper as baton's: {e}"),
        };
        node.backend()
            .await
            .map_err(failed)?
            .init_store()
            .await
            .map_err(failed)?;
        Ok(node)
    }

    /// The certificates of a node started with [`start_tls`](Self::start_tls).
    pub fn tls(&self) -> Option<&ZkTls> {
        self.tls.as_ref()
    }

    /// Starts a server (standalone) that authenticates clients with SASL DIGEST-MD5 as
    /// `sasl` says (its users; whether it refuses clients without SASL), on a free port of
    /// 127.0.0.1 (plain `zk://`). Needs Docker (no local fallback). `BATON_ZOOKEEPER_CONNECT`
    /// does not apply. [`backend`](Self::backend) authenticates as `sasl`'s first user, and
    /// marks the store as baton's with it: its marker belongs to that user.
    ///
    /// # Errors
    /// [`FixtureError`] if the container does not start.
    ///
    /// # Cancel safety
    /// Dropping the future removes the container it had started.
    pub async fn start_sasl(sasl: &ZkSasl) -> Result<ZkNode, FixtureError> {
        ZkNode::start_secured(None, Some(sasl)).await
    }

    /// A server with a TLS client port only, as [`start_tls`](Self::start_tls) starts it,
    /// that also authenticates clients with SASL, as [`start_sasl`](Self::start_sasl) does:
    /// `zks://`, with both. Needs Docker.
    ///
    /// # Errors
    /// [`FixtureError`] if the container does not start.
    ///
    /// # Cancel safety
    /// Dropping the future removes the container it had started.
    pub async fn start_tls_sasl(tls: &ZkTls, sasl: &ZkSasl) -> Result<ZkNode, FixtureError> {
        ZkNode::start_secured(Some(tls), Some(sasl)).await
    }

    /// The users of a node started with [`start_sasl`](Self::start_sasl).
    pub fn sasl(&self) -> Option<&ZkSasl> {
        self.sasl.as_ref()
    }

    /// Starts a server (standalone) in a container whose data dir is a directory of the host,
    /// so that a test can make it forget: [`stop`](Self::stop), then
    /// [`wipe_data`](Self::wipe_data) (a server restarted without its data: znodes, sessions
    /// and zxids start over), then [`start_again`](Self::start_again). Needs Docker (no local
    /// fallback). The directory is removed when the node is dropped.
    ///
    /// # Errors
    /// [`FixtureError`] if the directory cannot be made or the container does not start.
    ///
    /// # Cancel safety
    /// Dropping the future removes the container it had started; the directory may stay (in
    /// the system's temporary directory, named after this process and the port).
    pub async fn start_with_host_data() -> Result<ZkNode, FixtureError> {
        let node = ZkNode::start_mounted_on(free_port()?, &[]).await?;
        init_store(&node.connect).await?;
        Ok(node)
    }

    /// [`start_on`](Self::start_on) in a container only, with the data dir on the host.
    async fn start_mounted_on(port: u16, extra: &[String]) -> Result<ZkNode, FixtureError> {
        let dir = std::env::temp_dir().join(format!(
            "baton-zookeeper-data-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir)?;
        let mount = (
            dir.to_string_lossy().into_owned(),
            CONTAINER_DATA_DIR.to_owned(),
        );
        let lines = config(port, extra);
        match Instance::start_mounted(ZOOKEEPER, port, serving, lines, mount).await {
            Ok(instance) => Ok(ZkNode {
                connect: format!("127.0.0.1:{port}"),
                address: format!("127.0.0.1:{port}"),
                instance,
                host_data: Some(dir),
                tls: None,
                sasl: None,
            }),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// Removes everything in the stopped server's data dir (snapshots, transaction logs,
    /// `currentEpoch`): [`start_again`](Self::start_again) then starts a server with nothing,
    /// on the same port, as an operator who lost a disk would. A member of an ensemble keeps
    /// its id (the image writes `myid` at every start). Call it only while the server is
    /// stopped.
    ///
    /// # Errors
    /// [`FixtureError::Unsupported`] for a server not started with
    /// [`start_with_host_data`](Self::start_with_host_data) (or
    /// [`ZkEnsemble::start_with_host_data`]); the file system's error.
    pub fn wipe_data(&self) -> Result<(), FixtureError> {
        let dir = self.host_data_dir("wipe_data")?;
        // The directory itself stays: it is what the container has bound.
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path)?;
            } else {
                std::fs::remove_file(&path)?;
            }
        }
        Ok(())
    }

    /// Copies the stopped server's data dir to `to` (a directory, made if missing): a backup
    /// that [`restore_data`](Self::restore_data) brings back.
    ///
    /// # Errors
    /// As [`wipe_data`](Self::wipe_data).
    pub fn save_data(&self, to: &std::path::Path) -> Result<(), FixtureError> {
        let dir = self.host_data_dir("save_data")?;
        copy_dir(dir, to)?;
        Ok(())
    }

    /// Replaces the stopped server's data with the copy [`save_data`](Self::save_data) made:
    /// [`start_again`](Self::start_again) then serves the store as it was then (its zxids go
    /// back, its sessions and nodes of that time come back), as for an operator who restores
    /// a backup, or a server that lost its transaction log and kept an older snapshot.
    ///
    /// # Errors
    /// As [`wipe_data`](Self::wipe_data).
    pub fn restore_data(&self, from: &std::path::Path) -> Result<(), FixtureError> {
        self.wipe_data()?;
        copy_dir(from, self.host_data_dir("restore_data")?)?;
        Ok(())
    }

    /// Whether the server was started with
    /// [`start_with_host_data`](Self::start_with_host_data) (or as a member of
    /// [`ZkEnsemble::start_with_host_data`]): its data can be wiped, saved and restored.
    pub fn has_host_data(&self) -> bool {
        self.host_data.is_some()
    }

    fn host_data_dir(&self, op: &'static str) -> Result<&std::path::Path, FixtureError> {
        self.host_data.as_deref().ok_or(FixtureError::Unsupported {
            op,
            reason: "the server was not started with its data on the host (start_with_host_data)",
        })
    }

    /// One server shared by every test of this process, started on first use on a runtime of
    /// its own (so that it outlives each test's runtime). Give each test its own path prefix.
    /// The server is removed when the process exits, as every fixture is: a watchdog process,
    /// tied to this one by a pipe, removes the container (or kills the `java` process).
    ///
    /// Every test sees what another does to it: start a server of your own to stop, restart
    /// or pause.
    ///
    /// # Panics
    /// If the server cannot be started: a test cannot run without it.
    pub fn shared() -> &'static ZkNode {
        static SHARED: OnceLock<ZkNode> = OnceLock::new();
        SHARED.get_or_init(|| start_shared(ZOOKEEPER.name, ZkNode::start))
    }

    /// As [`shared`](Self::shared), a server that serves TLS only
    /// ([`start_tls`](Self::start_tls)) with [generated](ServerTls::generate) certificates and
    /// requires client certificates: [`tls`](Self::tls) has them, and its CA issues more.
    ///
    /// # Panics
    /// If the certificates cannot be made or the server cannot be started.
    pub fn shared_tls() -> &'static ZkNode {
        static SHARED: OnceLock<ZkNode> = OnceLock::new();
        SHARED.get_or_init(|| {
            start_shared("TLS zookeeper", || async {
                ZkNode::start_tls(&ZkTls::generate()?).await
            })
        })
    }

    /// As [`shared`](Self::shared), a server that requires SASL DIGEST-MD5
    /// ([`start_sasl`](Self::start_sasl)) with [`ZkSasl::new`]'s users: [`sasl`](Self::sasl)
    /// has them.
    ///
    /// # Panics
    /// If the server cannot be started.
    pub fn shared_sasl() -> &'static ZkNode {
        static SHARED: OnceLock<ZkNode> = OnceLock::new();
        SHARED.get_or_init(|| {
            start_shared("SASL zookeeper", || async {
                ZkNode::start_sasl(&ZkSasl::new()).await
            })
        })
    }

    /// The connect string, `127.0.0.1:<port>` (or `BATON_ZOOKEEPER_CONNECT` as given).
    pub fn connect_string(&self) -> String {
        self.connect.clone()
    }

    /// The URL baton's `connect` takes, `zk://` and the [connect string](Self::connect_string)
    /// (`zks://` for a node started with [`start_tls`](Self::start_tls)).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "zks" } else { "zk" };
        format!("{scheme}://{}", self.connect)
    }

    /// A backend connected to this server, with the default options (Curator's node layout;
    /// pass [`ZkOptions`](crate::ZkOptions) to `ZkBackend::connect` for others), as
    /// `EtcdNode::backend` and `RedisNode::backend` give theirs.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let zk = baton::testing::ZkNode::start().await?;
    /// let session = baton::Session::new(zk.backend().await?).await?;
    /// # let _ = session; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`ZkBackend::connect`](crate::ZkBackend::connect).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is created on the server before it returns.
    pub async fn backend(&self) -> crate::Result<crate::ZkBackend> {
        let options = match &self.tls {
            Some(tls) => tls.zk_options(crate::ZkOptions::new()),
            None => crate::ZkOptions::new(),
        };
        let options = match &self.sasl {
            Some(sasl) => sasl.zk_options(options),
            None => options,
        };
        crate::ZkBackend::connect(&self.url(), options).await
    }

    /// The client port (for `BATON_ZOOKEEPER_CONNECT`, its first server's; 2181 if it names
    /// none).
    pub fn port(&self) -> u16 {
        self.instance.port()
    }

    /// Whether this server runs in a container (not the local-`java` fallback, nor a server
    /// named by `BATON_ZOOKEEPER_CONNECT`).
    pub fn is_container(&self) -> bool {
        self.instance.is_container()
    }

    /// The Docker id of the server's container (`None`: the local-`java` fallback, or a
    /// server named by `BATON_ZOOKEEPER_CONNECT`), e.g. to read its cgroup's CPU time.
    pub fn container_id(&self) -> Option<&str> {
        self.instance.container_id()
    }

    /// [`four_letter`] to this server (for `BATON_ZOOKEEPER_CONNECT`, to its first one).
    ///
    /// # Errors
    /// As [`four_letter`].
    ///
    /// # Cancel safety
    /// As [`four_letter`].
    pub async fn four_letter(&self, word: &'static str) -> Result<String, FixtureError> {
        ask(self.address.clone(), word).await
    }

    /// The mode `srvr` reports: `standalone` for a [`ZkNode`], `leader` or `follower` for a
    /// member of a [`ZkEnsemble`]; `None` if the server does not serve (no quorum), does not
    /// answer (stopped, paused) or answers something else.
    ///
    /// # Cancel safety
    /// As [`four_letter`].
    pub async fn mode(&self) -> Option<String> {
        let srvr = self.four_letter("srvr").await.ok()?;
        mode(&srvr).map(str::to_owned)
    }

    /// Kills the server at once (SIGKILL: clients see their connections reset).
    /// [`start_again`](Self::start_again) brings it back on the same port, with its data.
    ///
    /// # Errors
    /// The container runtime's error; [`FixtureError::Process`] if the local process does not
    /// exit; [`FixtureError::Unsupported`] for a server named by `BATON_ZOOKEEPER_CONNECT`.
    ///
    /// # Cancel safety
    /// If the future is dropped the server may or may not have been stopped.
    pub async fn stop(&self) -> Result<(), FixtureError> {
        self.instance.stop().await
    }

    /// Starts the server again after [`stop`](Self::stop), on the same port with the data it
    /// had, and returns once it serves (a member of an ensemble needs a quorum of members
    /// running for that: start members of an ensemble that lost its quorum concurrently).
    /// Does nothing to a server that runs.
    ///
    /// # Errors
    /// The container runtime's error; [`FixtureError::NotReady`] if the server does not serve
    /// within 30 s; [`FixtureError::Spawn`] or [`FixtureError::Process`] for the local process;
    /// [`FixtureError::Unsupported`] for a server named by `BATON_ZOOKEEPER_CONNECT`.
    ///
    /// # Cancel safety
    /// If the future is dropped the server may or may not have been started.
    pub async fn start_again(&self) -> Result<(), FixtureError> {
        self.instance.start_again().await
    }

    /// [`stop`](Self::stop), then [`start_again`](Self::start_again): the server comes back
    /// on the same port with its data; this returns once it serves.
    ///
    /// # Errors
    /// As [`stop`](Self::stop) and [`start_again`](Self::start_again).
    ///
    /// # Cancel safety
    /// If the future is dropped the server may be stopped, and stays so until
    /// [`start_again`](Self::start_again).
    pub async fn restart(&self) -> Result<(), FixtureError> {
        self.stop().await?;
        self.start_again().await
    }

    /// Freezes the server (`docker pause`): connections stay open and requests (four-letter
    /// words too) hang until [`unpause`](Self::unpause). Containers only.
    ///
    /// # Errors
    /// The container runtime's error; [`FixtureError::Unsupported`] for a server that is not a
    /// container.
    ///
    /// # Cancel safety
    /// If the future is dropped the server may or may not have been paused.
    pub async fn pause(&self) -> Result<(), FixtureError> {
        self.instance.pause().await
    }

    /// Unfreezes the server after [`pause`](Self::pause).
    ///
    /// # Errors
    /// The container runtime's error; [`FixtureError::Unsupported`] for a server that is not a
    /// container.
    ///
    /// # Cancel safety
    /// If the future is dropped the server may or may not have been unpaused.
    pub async fn unpause(&self) -> Result<(), FixtureError> {
        self.instance.unpause().await
    }
}

/// Copies the files and directories under `from` into `to` (made if missing).
fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

impl Drop for ZkNode {
    fn drop(&mut self) {
        if let Some(dir) = &self.host_data {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Marks the new store at `connect` as baton's (`ZkBackend::init_store`): its first use waits
/// no restart grace.
async fn init_store(connect: &str) -> Result<(), FixtureError> {
    let failed = |e: crate::Error| FixtureError::Process {
        server: ZOOKEEPER.name,
        reason: format!("marking the new ZooKeeper as baton's: {e}"),
    };
    let backend = crate::ZkBackend::connect(connect, crate::ZkOptions::new())
        .await
        .map_err(failed)?;
    backend.init_store().await.map_err(failed)?;
    Ok(())
}

/// A three-member ZooKeeper ensemble for fault tests: each member a [`ZkNode`] in its own
/// container (or local process, under the same rules as [`ZkNode::start`]) with its client,
/// quorum and election ports on free ports of 127.0.0.1, configured as the [`ZkNode`] is.
/// Members are numbered 0, 1 and 2 (their ZooKeeper ids are 1, 2 and 3). A new ensemble is
/// marked as baton's ([`ZkBackend::init_store`](crate::ZkBackend::init_store)), so that its
/// first use waits no restart grace.
///
/// `BATON_ZOOKEEPER_CONNECT` does not apply: the members are always started.
#[derive(Debug)]
pub struct ZkEnsemble {
    members: Vec<ZkNode>,
}

impl ZkEnsemble {
    /// Starts three members concurrently and returns once each serves: a leader is elected
    /// and both followers have joined it.
    ///
    /// # Errors
    /// [`FixtureError`] if a member does not start or does not serve within 30 s (the others
    /// are then removed).
    ///
    /// # Cancel safety
    /// Dropping the future removes the members it had started.
    pub async fn start() -> Result<ZkEnsemble, FixtureError> {
        ZkEnsemble::start_members(false).await
    }

    /// As [`start`](Self::start), each member in a container whose data dir is a directory of
    /// the host, so that a test can make a member, or the whole ensemble, forget:
    /// [`wipe_member_data`](Self::wipe_member_data) (a member restarted without its data
    /// resynchronises from the leader before it serves) and
    /// [`restart_without_data`](Self::restart_without_data) (every member wiped: the
    /// ensemble starts over, zxids from epoch 1 again). Needs Docker (no local fallback).
    ///
    /// # Errors
    /// As [`start`](Self::start), and if a directory cannot be made.
    ///
    /// # Cancel safety
    /// As [`start`](Self::start); the directories may stay (see
    /// [`ZkNode::start_with_host_data`]).
    pub async fn start_with_host_data() -> Result<ZkEnsemble, FixtureError> {
        ZkEnsemble::start_members(true).await
    }

    async fn start_members(host_data: bool) -> Result<ZkEnsemble, FixtureError> {
        const MEMBERS: usize = 3;
        // Client, quorum and election ports, all different.
        let ports = free_ports(3 * MEMBERS)?;
        let (client, peers) = ports.split_at(MEMBERS);
        let servers: Vec<String> = (0..MEMBERS)
            .map(|i| {
                let (quorum, election) = (peers[i], peers[MEMBERS + i]);
                format!("server.{}=127.0.0.1:{quorum}:{election}", i + 1)
            })
            .collect();
        let started = futures::future::join_all((0..MEMBERS).map(|i| {
            let mut extra = vec![
                format!("myid={}", i + 1),
                // A paused member's election port accepts connections that never answer.
                "cnxTimeout=1000".to_owned(),
            ];
            extra.extend(servers.iter().cloned());
            async move {
                if host_data {
                    ZkNode::start_mounted_on(client[i], &extra).await
                } else {
                    ZkNode::start_on(client[i], &extra).await
                }
            }
        }))
        .await;
        let members = started.into_iter().collect::<Result<Vec<_>, _>>()?;
        let ensemble = ZkEnsemble { members };
        init_store(&ensemble.connect_string()).await?;
        Ok(ensemble)
    }

    /// The connect string of all members, `127.0.0.1:<port>,...` in member order.
    pub fn connect_string(&self) -> String {
        let members: Vec<String> = self.members.iter().map(ZkNode::connect_string).collect();
        members.join(",")
    }

    /// The URL baton's `connect` takes, `zk://` and the
    /// [connect string](Self::connect_string).
    pub fn url(&self) -> String {
        format!("zk://{}", self.connect_string())
    }

    /// The connect string of member `i` alone, `127.0.0.1:<port>`.
    ///
    /// # Panics
    /// If `i` is out of range.
    pub fn member_connect_string(&self, i: usize) -> String {
        self.members[i].connect_string()
    }

    /// Member `i`, to ask it four-letter words or read its port.
    ///
    /// # Panics
    /// If `i` is out of range.
    pub fn member(&self, i: usize) -> &ZkNode {
        &self.members[i]
    }

    /// Kills member `i` ([`ZkNode::stop`]); its data is kept.
    ///
    /// # Errors
    /// [`FixtureError::NoSuchMember`] for an index out of range; as [`ZkNode::stop`].
    ///
    /// # Cancel safety
    /// As [`ZkNode::stop`].
    pub async fn stop_member(&self, i: usize) -> Result<(), FixtureError> {
        self.get(i)?.stop().await
    }

    /// Starts member `i` again and returns once it serves ([`ZkNode::start_again`]): it needs
    /// another member running to form a quorum with.
    ///
    /// # Errors
    /// [`FixtureError::NoSuchMember`] for an index out of range; as [`ZkNode::start_again`].
    ///
    /// # Cancel safety
    /// As [`ZkNode::start_again`].
    pub async fn start_member(&self, i: usize) -> Result<(), FixtureError> {
        self.get(i)?.start_again().await
    }

    /// Removes everything in stopped member `i`'s data dir ([`ZkNode::wipe_data`]): started
    /// again, it joins with nothing and takes a snapshot from the leader before it serves.
    ///
    /// # Errors
    /// [`FixtureError::NoSuchMember`] for an index out of range; as [`ZkNode::wipe_data`].
    pub fn wipe_member_data(&self, i: usize) -> Result<(), FixtureError> {
        self.get(i)?.wipe_data()
    }

    /// Stops every member, wipes every member's data dir and starts them all again (an
    /// ensemble that lost every disk): it elects a leader with nothing, and zxids start over
    /// at epoch 1. Returns once every member serves.
    ///
    /// # Errors
    /// As [`stop_member`](Self::stop_member), [`wipe_member_data`](Self::wipe_member_data) and
    /// [`start_member`](Self::start_member).
    ///
    /// # Cancel safety
    /// If the future is dropped, members may be stopped, wiped or not, until started again.
    pub async fn restart_without_data(&self) -> Result<(), FixtureError> {
        for member in &self.members {
            member.stop().await?;
        }
        for member in &self.members {
            member.wipe_data()?;
        }
        // Concurrently: a member serves only once a quorum has formed.
        let started = futures::future::join_all(self.members.iter().map(ZkNode::start_again)).await;
        started.into_iter().collect::<Result<Vec<()>, _>>()?;
        Ok(())
    }

    /// Freezes member `i` ([`ZkNode::pause`]). The others notice after 2 s of silence (the
    /// sync limit) and, if it led, elect a new leader: about 4 s in all.
    ///
    /// # Errors
    /// [`FixtureError::NoSuchMember`] for an index out of range; as [`ZkNode::pause`].
    ///
    /// # Cancel safety
    /// As [`ZkNode::pause`].
    pub async fn pause_member(&self, i: usize) -> Result<(), FixtureError> {
        self.get(i)?.pause().await
    }

    /// Unfreezes member `i` ([`ZkNode::unpause`]).
    ///
    /// # Errors
    /// [`FixtureError::NoSuchMember`] for an index out of range; as [`ZkNode::unpause`].
    ///
    /// # Cancel safety
    /// As [`ZkNode::unpause`].
    pub async fn unpause_member(&self, i: usize) -> Result<(), FixtureError> {
        self.get(i)?.unpause().await
    }

    /// The member whose `srvr` says `Mode: leader`, asked of every member at once; `None` while
    /// no member answering within 1 s leads (during an election, or without a quorum). A
    /// leader whose followers were just stopped still says so until it notices (up to the
    /// sync limit, 2 s).
    ///
    /// # Cancel safety
    /// As [`four_letter`].
    pub async fn leader(&self) -> Option<usize> {
        let modes = futures::future::join_all(self.members.iter().map(ZkNode::mode)).await;
        modes.iter().position(|m| m.as_deref() == Some("leader"))
    }

    /// Waits until a member leads ([`leader`](Self::leader)) and returns it: after
    /// [`stop_member`](Self::stop_member) of the leader, the one the others elect.
    ///
    /// # Errors
    /// [`FixtureError::NotReady`] if no member leads within 30 s.
    ///
    /// # Cancel safety
    /// Dropping the future only stops the waiting.
    pub async fn wait_for_leader(&self) -> Result<usize, FixtureError> {
        let deadline = Instant::now() + LEADER_TIMEOUT;
        loop {
            if let Some(leader) = self.leader().await {
                return Ok(leader);
            }
            if Instant::now() >= deadline {
                return Err(FixtureError::NotReady {
                    server: ZOOKEEPER.name,
                    address: format!("{} (a leader)", self.connect_string()),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn get(&self, index: usize) -> Result<&ZkNode, FixtureError> {
        self.members.get(index).ok_or(FixtureError::NoSuchMember {
            index,
            members: self.members.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_address_defaults_the_port_and_drops_the_chroot() {
        assert_eq!(
            first_address("127.0.0.1:2182"),
            ("127.0.0.1:2182".to_owned(), 2182)
        );
        assert_eq!(
            first_address("a:1,b:2/app"),
            ("a:1".to_owned(), 1),
            "the first server of several"
        );
        assert_eq!(first_address("zk/app"), ("zk:2181".to_owned(), 2181));
    }

    #[test]
    fn mode_reads_srvr() {
        let srvr = "Zookeeper version: 3.8.0\nZxid: 0x0\nMode: follower\nNode count: 5\n";
        assert_eq!(mode(srvr), Some("follower"));
        assert_eq!(
            mode("This ZooKeeper instance is not currently serving requests\n"),
            None
        );
    }

    #[test]
    fn extra_configuration_comes_last() {
        let lines = config(2181, &["tickTime=2000".to_owned()]);
        assert_eq!(lines.first().map(String::as_str), Some("clientPort=2181"));
        assert_eq!(lines.last().map(String::as_str), Some("tickTime=2000"));
    }
}
