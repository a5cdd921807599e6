//! etcd fixtures: one member ([`EtcdNode`]) or three ([`EtcdCluster`]), in containers; one
//! member may serve TLS ([`EtcdTls`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use testcontainers::{ContainerAsync, GenericImage};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::fixture::{FixtureError, Server, Watchdog, free_port, or_local, start_shared};
use super::tls::{CONTAINER_TLS_DIR, ServerTls, TLS_CA, TLS_CERT, TLS_KEY};
use crate::{EtcdBackend, EtcdOptions};

/// The image used when `BATON_ETCD_IMAGE` is not set: the one `scripts/build-etcd-image.sh`
/// builds from Debian's `etcd-server` (no registry needed). A fixture that finds it missing
/// builds it with that script (embedded in the crate).
pub const DEFAULT_IMAGE: &str = "local/etcd:debian";

const READY: &str = "ready to serve client requests";

const ETCD: Server = Server {
    name: "etcd",
    image_var: "BATON_ETCD_IMAGE",
    default_image: DEFAULT_IMAGE,
    entrypoint: "etcd",
    local: "`etcd`",
    ready: READY,
    build_script: include_str!("../../scripts/build-etcd-image.sh"),
    layout: None,
};

/// The certificates of an etcd that serves TLS to its clients, PEM-encoded, and whether it
/// asks them for a client certificate (etcd's `--client-cert-auth`), for
/// [`EtcdNode::start_tls`]; with the client certificate the fixture's own clients present.
///
/// [`generate`](Self::generate) makes the whole set for tests: a CA, a server certificate for
/// `127.0.0.1` and `localhost`, and a client certificate. Peer traffic stays plain text (one
/// member, on 127.0.0.1).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use baton::testing::{EtcdNode, EtcdTls};
/// let tls = EtcdTls::generate()?;
/// let etcd = EtcdNode::start_tls(&tls).await?; // https://127.0.0.1:<port>
/// // Your client: the node's endpoints, the CA, the client certificate.
/// let options = tls.client_options();
/// let backend = baton::EtcdBackend::connect(etcd.endpoints(), options).await?;
/// // A certificate the server refuses: an expired one, from the same CA.
/// let ca = tls.ca().ok_or("generated, so the CA is known")?;
/// let long_ago = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30);
/// let expired = ca.client_cert_valid("old", long_ago, long_ago)?;
/// # let _ = (backend, expired); Ok(()) }
/// ```
pub type EtcdTls = ServerTls;

impl ServerTls {
    /// Options for a client of this server: the CA and, if there is one, the client
    /// certificate.
    pub fn client_options(&self) -> EtcdOptions {
        let options = EtcdOptions::new().with_ca_cert(self.ca_pem().to_owned());
        match self.client_cert() {
            Some(client) => options.with_client_cert(client.cert_pem(), client.key_pem()),
            None => options,
        }
    }
}

#[derive(Debug, Clone)]
struct MemberSpec {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Extra `etcd` arguments, after the fixture's own.
    extra: Vec<String>,
    /// TLS for clients: whether client certificates are required. The files are in the
    /// directory given to [`args`](Self::args).
    tls: Option<bool>,
    /// A directory of the host holding the member's data (bound into its container), so
    /// that a test can wipe it or restore a snapshot into it.
    host_data: Option<PathBuf>,
}

impl MemberSpec {
    fn new(name: &str) -> std::io::Result<Self> {
        Ok(MemberSpec {
            name: name.to_owned(),
            client_port: free_port()?,
            peer_port: free_port()?,
            extra: Vec::new(),
            tls: None,
            host_data: None,
        })
    }

    fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    fn args(&self, initial_cluster: &str, data_dir: &str, tls_dir: &str) -> Vec<String> {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let tls: Vec<String> = match self.tls {
            None => Vec::new(),
            Some(client_cert_auth) => {
                let file = |name: &str| format!("{tls_dir}/{name}");
                let mut args = vec![
                    "--cert-file".to_owned(),
                    file(TLS_CERT),
                    "--key-file".to_owned(),
                    file(TLS_KEY),
                ];
                // etcd asks every client for a certificate as soon as it has a CA to check
                // them with: the CA only when they are required.
                if client_cert_auth {
                    args.extend([
                        "--trusted-ca-file".to_owned(),
                        file(TLS_CA),
                        "--client-cert-auth".to_owned(),
                    ]);
                }
                args
            }
        };
        [
            "--name",
            &self.name,
            "--data-dir",
            data_dir,
            "--listen-client-urls",
            &self.endpoint(),
            "--advertise-client-urls",
            &self.endpoint(),
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            initial_cluster,
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            "baton-test",
            // Short heartbeats make leader changes in fault tests quick.
            "--heartbeat-interval",
            "50",
            "--election-timeout",
            "500",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .chain(tls)
        .chain(self.extra.iter().cloned())
        .collect()
    }
}

fn initial_cluster(specs: &[MemberSpec]) -> String {
    specs
        .iter()
        .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
        .collect::<Vec<_>>()
        .join(",")
}

async fn start_container(
    spec: &MemberSpec,
    initial: &str,
) -> Result<ContainerAsync<GenericImage>, FixtureError> {
    start_container_tls(spec, initial, None).await
}

async fn start_container_tls(
    spec: &MemberSpec,
    initial: &str,
    tls: Option<&EtcdTls>,
) -> Result<ContainerAsync<GenericImage>, FixtureError> {
    let files = tls.map_or_else(Vec::new, |tls| {
        tls.files()
            .iter()
            .map(|(name, pem)| {
                (
                    format!("{CONTAINER_TLS_DIR}/{name}"),
                    pem.as_bytes().to_vec(),
                )
            })
            .collect()
    });
    let mount = spec.host_data.as_ref().map(|dir| {
        (
            dir.to_string_lossy().into_owned(),
            CONTAINER_DATA_DIR.to_owned(),
        )
    });
    ETCD.start_container_mounted(
        spec.args(initial, CONTAINER_DATA_DIR, CONTAINER_TLS_DIR),
        files,
        mount,
    )
    .await
}

/// Where a member's container keeps its data.
const CONTAINER_DATA_DIR: &str = "/tmp/etcd-data";

/// An etcd started as a child process (the opt-in fallback when Docker is unavailable).
#[derive(Debug)]
struct EtcdProcess {
    child: Child,
    data_dir: PathBuf,
    /// The TLS files, if any: removed with the process.
    tls_dir: Option<PathBuf>,
    /// Kills etcd by its PID and removes its files if this process dies.
    _watchdog: Option<Watchdog>,
}

impl EtcdProcess {
    async fn start(spec: &MemberSpec, tls: Option<&EtcdTls>) -> Result<Self, FixtureError> {
        let dir = |what: &str| {
            std::env::temp_dir().join(format!(
                "baton-etcd-{what}{}-{}",
                std::process::id(),
                spec.client_port
            ))
        };
        let data_dir = dir("");
        let tls_dir = match tls {
            Some(tls) => Some(write_tls_files(&dir("tls-"), tls)?),
            None => None,
        };
        let tls_path = tls_dir.as_deref().map(Path::to_string_lossy);
        let mut child = Command::new("etcd")
            .args(spec.args(
                &initial_cluster(std::slice::from_ref(spec)),
                &data_dir.to_string_lossy(),
                tls_path.as_deref().unwrap_or(""),
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| FixtureError::Spawn {
                server: ETCD.name,
                source,
            })?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| ETCD.process_error("no stderr pipe"))?;
        let mut lines = BufReader::new(stderr).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains(READY) {
                    return true;
                }
            }
            false
        })
        .await;
        if ready != Ok(true) {
            return Err(ETCD.process_error("etcd did not become ready"));
        }
        // Keep draining stderr so etcd never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let quote = |p: &Path| p.to_string_lossy().replace('\'', r"'\''");
        let mut cleanup = format!("rm -rf '{}'", quote(&data_dir));
        if let Some(dir) = &tls_dir {
            cleanup.push_str(&format!(" '{}'", quote(dir)));
        }
        if let Some(pid) = child.id() {
            cleanup = format!("kill {pid} 2>/dev/null; {cleanup}");
        }
        Ok(EtcdProcess {
            child,
            data_dir,
            tls_dir,
            _watchdog: Watchdog::spawn(&cleanup),
        })
    }
}

/// Writes the files etcd reads for TLS into `dir` (created; the key readable by its owner
/// only), and returns `dir`.
fn write_tls_files(dir: &Path, tls: &EtcdTls) -> std::io::Result<PathBuf> {
    tls.write_files(dir)?;
    Ok(dir.to_owned())
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        // Stopped by its own PID (kill_on_drop would too, but only once the Child drops).
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.data_dir);
        if let Some(dir) = &self.tls_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// What runs the node; held so that dropping the node removes the container or kills the
/// process.
#[derive(Debug)]
enum Running {
    Container(#[allow(dead_code)] Box<ContainerAsync<GenericImage>>),
    Process(#[allow(dead_code)] Box<EtcdProcess>),
    External,
}

/// One etcd member for tests.
#[derive(Debug)]
pub struct EtcdNode {
    endpoints: Vec<String>,
    /// How the member was started (`None`: external), for a restore into its data dir.
    spec: Option<MemberSpec>,
    running: Running,
    /// What [`backend`](Self::backend) connects with (TLS for a TLS node).
    options: EtcdOptions,
    tls: Option<EtcdTls>,
}

impl EtcdNode {
    /// Starts a single-member etcd (see the module docs for the environment it reads).
    ///
    /// # Errors
    /// [`FixtureError`] if neither a container nor (when allowed) a local binary starts.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing running: a container or process started so far is
    /// removed by the fixture's watchdog when this test process exits.
    pub async fn start() -> Result<EtcdNode, FixtureError> {
        EtcdNode::start_with(&[]).await
    }

    /// As [`start`](Self::start), with extra `etcd` arguments after the fixture's own, e.g.
    /// `&["--auth-token-ttl", "1"]`. A node named by `BATON_ETCD_ENDPOINTS` is used as it is
    /// (the arguments are ignored, with a warning).
    ///
    /// # Errors
    /// [`FixtureError`] if neither a container nor (when allowed) a local binary starts.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing running: a container or process started so far is
    /// removed by the fixture's watchdog when this test process exits.
    pub async fn start_with(args: &[&str]) -> Result<EtcdNode, FixtureError> {
        if let Ok(endpoints) = std::env::var("BATON_ETCD_ENDPOINTS") {
            if !args.is_empty() {
                tracing::warn!(
                    ?args,
                    "BATON_ETCD_ENDPOINTS is set: extra arguments ignored"
                );
            }
            return Ok(EtcdNode {
                endpoints: endpoints.split(',').map(str::to_owned).collect(),
                spec: None,
                running: Running::External,
                options: EtcdOptions::new(),
                tls: None,
            });
        }
        let mut spec = MemberSpec::new("n0")?;
        spec.extra = args.iter().map(|a| (*a).to_owned()).collect();
        EtcdNode::start_spec(spec, None).await
    }

    /// Starts a single-member etcd that serves its clients over TLS with `tls`'s
    /// certificates, at `https://127.0.0.1:<port>`, asking for client certificates if `tls`
    /// says so. [`backend`](Self::backend) connects with [`EtcdTls::client_options`].
    /// `BATON_ETCD_ENDPOINTS` is not used: that etcd does not have these certificates.
    ///
    /// In a container the certificates are copied in; an `etcd` on `PATH` (the fallback)
    /// reads them from a directory under the system's temporary directory, removed with the
    /// node.
    ///
    /// # Errors
    /// [`FixtureError`] if neither a container nor (when allowed) a local binary starts, or
    /// the certificates cannot be written.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing running: a container or process started so far is
    /// removed by the fixture's watchdog when this test process exits.
    pub async fn start_tls(tls: &EtcdTls) -> Result<EtcdNode, FixtureError> {
        let mut spec = MemberSpec::new("n0")?;
        spec.tls = Some(tls.client_cert_auth());
        EtcdNode::start_spec(spec, Some(tls)).await
    }

    /// Starts a single-member etcd in a container whose data dir is a directory of the host,
    /// so that a test can make it forget: [`stop`](Self::stop), then
    /// [`wipe_data`](Self::wipe_data) (a member restarted without its data dir) or
    /// [`restore_snapshot`](Self::restore_snapshot) (`etcdctl snapshot restore`), then
    /// [`start_again`](Self::start_again). Needs Docker, and `etcdctl` on `PATH` for a
    /// restore.
    ///
    /// # Errors
    /// [`FixtureError`] if the directory cannot be made or the container does not start.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing running: a container or process started so far is
    /// removed by the fixture's watchdog when this test process exits.
    pub async fn start_with_host_data() -> Result<EtcdNode, FixtureError> {
        let mut spec = MemberSpec::new("n0")?;
        let dir = std::env::temp_dir().join(format!(
            "baton-etcd-data-{}-{}",
            std::process::id(),
            spec.client_port
        ));
        std::fs::create_dir_all(&dir)?;
        spec.host_data = Some(dir);
        let initial = initial_cluster(std::slice::from_ref(&spec));
        let container = start_container(&spec, &initial).await?;
        let node = EtcdNode {
            endpoints: vec![spec.endpoint()],
            spec: Some(spec),
            running: Running::Container(Box::new(container)),
            options: EtcdOptions::new(),
            tls: None,
        };
        node.init_store().await?;
        Ok(node)
    }

    async fn start_spec(spec: MemberSpec, tls: Option<&EtcdTls>) -> Result<EtcdNode, FixtureError> {
        let initial = initial_cluster(std::slice::from_ref(&spec));
        let running = match start_container_tls(&spec, &initial, tls).await {
            Ok(container) => Running::Container(Box::new(container)),
            Err(e) => {
                or_local(&ETCD, e, || async {
                    Ok(Running::Process(Box::new(
                        EtcdProcess::start(&spec, tls).await?,
                    )))
                })
                .await?
            }
        };
        let node = EtcdNode {
            endpoints: vec![spec.endpoint()],
            spec: Some(spec),
            running,
            options: tls.map_or_else(EtcdOptions::new, EtcdTls::client_options),
            tls: tls.cloned(),
        };
        node.init_store().await?;
        Ok(node)
    }

    /// Marks the new store as baton's (`baton init`): its first use waits no restart grace.
    async fn init_store(&self) -> Result<(), FixtureError> {
        let backend = self.backend().await.map_err(|e| FixtureError::Process {
            server: ETCD.name,
            reason: format!("marking the new etcd as baton's: {e}"),
        })?;
        backend
            .init_store()
            .await
            .map_err(|e| FixtureError::Process {
                server: ETCD.name,
                reason: format!("marking the new etcd as baton's: {e}"),
            })?;
        Ok(())
    }

    /// The host directory of a node started with
    /// [`start_with_host_data`](Self::start_with_host_data).
    fn host_data(&self, what: &'static str) -> Result<(&MemberSpec, &Path), FixtureError> {
        self.spec
            .as_ref()
            .and_then(|spec| Some((spec, spec.host_data.as_deref()?)))
            .ok_or(FixtureError::Unsupported {
                op: what,
                reason: "the node was not started with start_with_host_data",
            })
    }

    /// Whether the node was started with
    /// [`start_with_host_data`](Self::start_with_host_data): its data can be wiped or
    /// replaced by a snapshot.
    pub fn has_host_data(&self) -> bool {
        self.spec.as_ref().is_some_and(|s| s.host_data.is_some())
    }

    /// Removes the stopped node's data dir: [`start_again`](Self::start_again) then starts
    /// a member with nothing, with the same name and URLs (so the same cluster id), as an
    /// operator who lost a disk would.
    ///
    /// # Errors
    /// [`FixtureError::Unsupported`] for a node not started with
    /// [`start_with_host_data`](Self::start_with_host_data); the file system's error.
    pub fn wipe_data(&self) -> Result<(), FixtureError> {
        let (_, dir) = self.host_data("wipe_data")?;
        std::fs::remove_dir_all(dir)?;
        std::fs::create_dir_all(dir)?;
        Ok(())
    }

    /// Saves a snapshot of the running node's data to `path` (`etcdctl snapshot save`).
    ///
    /// # Errors
    /// [`FixtureError::Spawn`] or [`FixtureError::Process`] if `etcdctl` cannot be run or
    /// fails.
    ///
    /// # Cancel safety
    /// If the future is dropped, the snapshot file may be missing or partial; the node is
    /// unaffected.
    pub async fn save_snapshot(&self, path: &Path) -> Result<(), FixtureError> {
        let endpoint = self.endpoints.join(",");
        let path = path.to_string_lossy().into_owned();
        etcdctl(&["--endpoints", &endpoint, "snapshot", "save", &path]).await
    }

    /// Replaces the stopped node's data with `snapshot`, as `etcdctl snapshot restore` does
    /// for an operator recovering from a backup (same name and URLs, so the same cluster
    /// id): [`start_again`](Self::start_again) then serves the store as it was.
    ///
    /// # Errors
    /// As [`wipe_data`](Self::wipe_data) and [`save_snapshot`](Self::save_snapshot).
    ///
    /// # Cancel safety
    /// If the future is dropped, the node's data may be partly restored: restore again before
    /// starting it.
    pub async fn restore_snapshot(&self, snapshot: &Path) -> Result<(), FixtureError> {
        self.restore_snapshot_with_token(snapshot, "baton-test")
            .await
    }

    /// As [`restore_snapshot`](Self::restore_snapshot), with a new
    /// `--initial-cluster-token`, as etcd's disaster-recovery guide has it: the restored
    /// member is a new cluster, with a new cluster id.
    ///
    /// # Errors
    /// As [`restore_snapshot`](Self::restore_snapshot).
    ///
    /// # Cancel safety
    /// As [`restore_snapshot`](Self::restore_snapshot).
    pub async fn restore_snapshot_as_new_cluster(
        &self,
        snapshot: &Path,
    ) -> Result<(), FixtureError> {
        self.restore_snapshot_with_token(snapshot, "baton-test-restored")
            .await
    }

    async fn restore_snapshot_with_token(
        &self,
        snapshot: &Path,
        token: &str,
    ) -> Result<(), FixtureError> {
        let (spec, dir) = self.host_data("restore_snapshot")?;
        std::fs::remove_dir_all(dir)?;
        let peer = format!("http://127.0.0.1:{}", spec.peer_port);
        let initial = initial_cluster(std::slice::from_ref(spec));
        etcdctl(&[
            "snapshot",
            "restore",
            &snapshot.to_string_lossy(),
            "--name",
            &spec.name,
            "--data-dir",
            &dir.to_string_lossy(),
            "--initial-cluster",
            &initial,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster-token",
            token,
        ])
        .await
    }

    /// One node shared by every test of this process, started on first use on a runtime of
    /// its own (so that it outlives each test's runtime). Give each test its own key prefix.
    /// The node is removed when the process exits: a watchdog process, tied to this one by
    /// a pipe, removes the container (or kills the etcd process) by its id.
    ///
    /// # Panics
    /// If the node cannot be started: a test cannot run without it.
    pub fn shared() -> &'static EtcdNode {
        static SHARED: OnceLock<EtcdNode> = OnceLock::new();
        SHARED.get_or_init(|| start_shared("etcd", EtcdNode::start))
    }

    /// As [`shared`](Self::shared), a node that serves TLS with [generated](EtcdTls::generate)
    /// certificates and requires client certificates: [`tls`](Self::tls) has them, and its
    /// CA issues more.
    ///
    /// # Panics
    /// If the certificates cannot be made or the node cannot be started.
    pub fn shared_tls() -> &'static EtcdNode {
        static SHARED: OnceLock<EtcdNode> = OnceLock::new();
        SHARED.get_or_init(|| {
            start_shared("TLS etcd", || async {
                EtcdNode::start_tls(&EtcdTls::generate()?).await
            })
        })
    }

    /// Client endpoints, `http://127.0.0.1:<port>` (`https://` for a TLS node).
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The certificates of a node started with [`start_tls`](Self::start_tls) (or
    /// [`shared_tls`](Self::shared_tls)).
    pub fn tls(&self) -> Option<&EtcdTls> {
        self.tls.as_ref()
    }

    /// Whether this node runs in a container (not the `etcd`-on-PATH fallback).
    pub fn is_container(&self) -> bool {
        matches!(self.running, Running::Container(_))
    }

    /// A backend connected to this node (over TLS, with the client certificate, for a TLS
    /// node).
    ///
    /// # Errors
    /// As [`EtcdBackend::connect`].
    ///
    /// # Cancel safety
    /// Cancel safe: a backend not yet connected is dropped with the future.
    pub async fn backend(&self) -> crate::Result<EtcdBackend> {
        EtcdBackend::connect(&self.endpoints, self.options.clone()).await
    }

    fn container(&self, what: &'static str) -> Result<&ContainerAsync<GenericImage>, FixtureError> {
        match &self.running {
            Running::Container(c) => Ok(c),
            Running::Process(_) => Err(FixtureError::Unsupported {
                op: what,
                reason: "the node is a local etcd process, not a container",
            }),
            Running::External => Err(FixtureError::Unsupported {
                op: what,
                reason: "the node is external (BATON_ETCD_ENDPOINTS); the test did not start it",
            }),
        }
    }

    /// Kills the node at once (its container stopped without a grace period); its data
    /// directory stays, so [`start_again`](Self::start_again) brings it back with every key
    /// and lease it had, as a crashed member restarts. Containers only.
    ///
    /// # Errors
    /// The container runtime's error; [`FixtureError::Unsupported`] for a node that is not a
    /// container.
    ///
    /// # Cancel safety
    /// If the future is dropped the node may or may not have been stopped.
    pub async fn stop(&self) -> Result<(), FixtureError> {
        self.container("stop")?
            .stop_with_timeout(Some(0))
            .await
            .map_err(|source| ETCD.container_error(source))
    }

    /// Starts the node again after [`stop`](Self::stop), with its data, and returns once it
    /// serves a linearizable read. Containers only.
    ///
    /// # Errors
    /// The container runtime's error; [`FixtureError::NotReady`] if it does not serve within
    /// 30 s; [`FixtureError::Unsupported`] for a node that is not a container.
    ///
    /// # Cancel safety
    /// If the future is dropped the node may or may not have been started.
    pub async fn start_again(&self) -> Result<(), FixtureError> {
        self.container("start")?
            .start()
            .await
            .map_err(|source| ETCD.container_error(source))?;
        let endpoint = self.endpoints.first().cloned().unwrap_or_default();
        wait_serving(&endpoint, self.options.clone()).await
    }

    /// Freezes the node (`docker pause`): connections stay open, requests hang until
    /// [`unpause`](Self::unpause). Containers only.
    ///
    /// # Errors
    /// The container runtime's error; [`FixtureError::Unsupported`] for a node that is not a
    /// container.
    ///
    /// # Cancel safety
    /// If the future is dropped the node may or may not have been paused.
    pub async fn pause(&self) -> Result<(), FixtureError> {
        self.container("pause")?
            .pause()
            .await
            .map_err(|source| ETCD.container_error(source))
    }

    /// Unfreezes the node after [`pause`](Self::pause).
    ///
    /// # Errors
    /// The container runtime's error; [`FixtureError::Unsupported`] for a node that is not a
    /// container.
    ///
    /// # Cancel safety
    /// If the future is dropped the node may or may not have been unpaused.
    pub async fn unpause(&self) -> Result<(), FixtureError> {
        self.container("unpause")?
            .unpause()
            .await
            .map_err(|source| ETCD.container_error(source))
    }
}

impl Drop for EtcdNode {
    fn drop(&mut self) {
        if let Some(dir) = self.spec.as_ref().and_then(|s| s.host_data.as_deref()) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Runs the host's `etcdctl` (API 3) with `args`.
async fn etcdctl(args: &[&str]) -> Result<(), FixtureError> {
    let out = Command::new("etcdctl")
        .args(args)
        .env("ETCDCTL_API", "3")
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|source| FixtureError::Spawn {
            server: "etcdctl",
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(ETCD.process_error(format!(
            "etcdctl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Waits until `endpoint` serves a linearizable read (it knows a leader and has a quorum), for
/// at most 30 s.
async fn wait_serving(endpoint: &str, options: EtcdOptions) -> Result<(), FixtureError> {
    let healthy = || async {
        let options = options.clone().with_connect_timeout(Duration::from_secs(1));
        let backend = EtcdBackend::connect(&[endpoint.to_owned()], options).await;
        let Ok(backend) = backend else { return false };
        let mut client = backend.client().clone();
        let read = client.get("baton-fixture/health", None);
        matches!(
            tokio::time::timeout(Duration::from_secs(2), read).await,
            Ok(Ok(_))
        )
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if healthy().await {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(FixtureError::NotReady {
                server: ETCD.name,
                address: endpoint.to_owned(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A three-member etcd cluster in three containers, for fault tests. Needs Docker.
#[derive(Debug)]
pub struct EtcdCluster {
    specs: Vec<MemberSpec>,
    members: Vec<ContainerAsync<GenericImage>>,
}

impl EtcdCluster {
    /// Starts three members concurrently (each waits for quorum before it reports ready).
    ///
    /// # Errors
    /// [`FixtureError::Container`] if a member does not start.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing running: a container or process started so far is
    /// removed by the fixture's watchdog when this test process exits.
    pub async fn start() -> Result<EtcdCluster, FixtureError> {
        let specs = ["m0", "m1", "m2"]
            .iter()
            .map(|n| MemberSpec::new(n))
            .collect::<std::io::Result<Vec<_>>>()?;
        let initial = initial_cluster(&specs);
        let started =
            futures::future::join_all(specs.iter().map(|s| start_container(s, &initial))).await;
        let members = started.into_iter().collect::<Result<Vec<_>, _>>()?;
        let cluster = EtcdCluster { specs, members };
        // A new store: marked as baton's, so that its first use waits no restart grace.
        let marked = match cluster.backend().await {
            Ok(backend) => backend.init_store().await.map(drop),
            Err(e) => Err(e),
        };
        marked.map_err(|e| FixtureError::Process {
            server: ETCD.name,
            reason: format!("marking the new etcd cluster as baton's: {e}"),
        })?;
        Ok(cluster)
    }

    /// Client endpoints of all members.
    pub fn endpoints(&self) -> Vec<String> {
        self.specs.iter().map(MemberSpec::endpoint).collect()
    }

    /// The client endpoint of member `i` (0, 1 or 2).
    pub fn endpoint(&self, i: usize) -> String {
        self.specs[i].endpoint()
    }

    /// A backend connected to all members.
    ///
    /// # Errors
    /// As [`EtcdBackend::connect`].
    ///
    /// # Cancel safety
    /// Cancel safe: a backend not yet connected is dropped with the future.
    pub async fn backend(&self) -> crate::Result<EtcdBackend> {
        EtcdBackend::connect(&self.endpoints(), EtcdOptions::new()).await
    }

    /// The index of the current leader, asked of each member that answers.
    ///
    /// # Errors
    /// A backend error if no member answers.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn leader(&self) -> crate::Result<Option<usize>> {
        for spec in &self.specs {
            let Ok(backend) = EtcdBackend::connect(
                &[spec.endpoint()],
                EtcdOptions::new().with_connect_timeout(Duration::from_secs(1)),
            )
            .await
            else {
                continue;
            };
            let mut client = backend.client().clone();
            if let Ok(status) = client.status().await {
                if status.leader() == 0 {
                    return Ok(None);
                }
                let leader = status.leader();
                let members = client
                    .member_list()
                    .await
                    .map_err(|e| crate::Error::Backend {
                        op: "member_list",
                        source: e.into(),
                        at: Default::default(),
                    })?;
                let name = members
                    .members()
                    .iter()
                    .find(|m| m.id() == leader)
                    .map(|m| m.name().to_owned());
                return Ok(name.and_then(|n| self.specs.iter().position(|s| s.name == n)));
            }
        }
        Ok(None)
    }

    /// Stops member `i`'s container (data kept); [`start_member`](Self::start_member) brings
    /// it back.
    ///
    /// # Errors
    /// [`FixtureError::NoSuchMember`] for an index out of range; the container runtime's error.
    ///
    /// # Cancel safety
    /// If the future is dropped the member may or may not have been stopped.
    pub async fn stop_member(&self, i: usize) -> Result<(), FixtureError> {
        self.member(i)?
            .stop_with_timeout(Some(0))
            .await
            .map_err(|source| ETCD.container_error(source))
    }

    /// Starts member `i` again after [`stop_member`](Self::stop_member) and returns once it is
    /// [healthy](Self::wait_healthy): a fault test that stops the next member right after
    /// keeps a quorum.
    ///
    /// # Errors
    /// [`FixtureError::NoSuchMember`] for an index out of range; the container runtime's
    /// error; [`FixtureError::NotReady`] if the member is not healthy within 30 s (a cluster
    /// without quorum never is).
    ///
    /// # Cancel safety
    /// If the future is dropped the member may or may not have been started; nothing else
    /// changes.
    pub async fn start_member(&self, i: usize) -> Result<(), FixtureError> {
        self.member(i)?
            .start()
            .await
            .map_err(|source| ETCD.container_error(source))?;
        self.wait_healthy(i).await
    }

    /// Waits until member `i` is healthy: it knows a leader and serves a linearizable read
    /// through the cluster's quorum (what `etcdctl endpoint health` checks). For a member
    /// started again or unpaused; [`start_member`](Self::start_member) calls it.
    ///
    /// # Errors
    /// [`FixtureError::NoSuchMember`] for an index out of range; [`FixtureError::NotReady`]
    /// if the member is not healthy within 30 s.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads (its probe connections close when dropped).
    pub async fn wait_healthy(&self, i: usize) -> Result<(), FixtureError> {
        let spec = self.specs.get(i).ok_or(FixtureError::NoSuchMember {
            index: i,
            members: self.specs.len(),
        })?;
        let endpoint = spec.endpoint();
        let healthy = || async {
            let options = EtcdOptions::new().with_connect_timeout(Duration::from_secs(1));
            let backend = EtcdBackend::connect(std::slice::from_ref(&endpoint), options).await;
            let Ok(backend) = backend else { return false };
            let mut client = backend.client().clone();
            // A linearizable read goes through the leader's read index: it needs the quorum.
            let read = client.get("baton-fixture/health", None);
            matches!(
                tokio::time::timeout(Duration::from_secs(2), read).await,
                Ok(Ok(_))
            )
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if healthy().await {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(FixtureError::NotReady {
                    server: ETCD.name,
                    address: endpoint,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Freezes member `i` (`docker pause`).
    ///
    /// # Errors
    /// [`FixtureError::NoSuchMember`] for an index out of range; the container runtime's error.
    ///
    /// # Cancel safety
    /// If the future is dropped the member may or may not be frozen.
    pub async fn pause_member(&self, i: usize) -> Result<(), FixtureError> {
        self.member(i)?
            .pause()
            .await
            .map_err(|source| ETCD.container_error(source))
    }

    /// Unfreezes member `i`.
    ///
    /// # Errors
    /// [`FixtureError::NoSuchMember`] for an index out of range; the container runtime's error.
    ///
    /// # Cancel safety
    /// If the future is dropped the member may or may not be frozen still.
    pub async fn unpause_member(&self, i: usize) -> Result<(), FixtureError> {
        self.member(i)?
            .unpause()
            .await
            .map_err(|source| ETCD.container_error(source))
    }

    fn member(&self, index: usize) -> Result<&ContainerAsync<GenericImage>, FixtureError> {
        self.members.get(index).ok_or(FixtureError::NoSuchMember {
            index,
            members: self.members.len(),
        })
    }
}
