//! etcd fixtures: one member ([`EtcdNode`]) or three ([`EtcdCluster`]), in containers.

use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use testcontainers::{ContainerAsync, GenericImage};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::fixture::{FixtureError, Server, Watchdog, docker_required, free_port};
use crate::{EtcdBackend, EtcdOptions};

/// The image used when `BATON_ETCD_IMAGE` is not set: the etcd project's official image.
pub const DEFAULT_IMAGE: &str = "gcr.io/etcd-development/etcd:v3.5.17";

const READY: &str = "ready to serve client requests";

const ETCD: Server = Server {
    name: "etcd",
    image_var: "BATON_ETCD_IMAGE",
    default_image: DEFAULT_IMAGE,
    entrypoint: "etcd",
    ready: READY,
};

#[derive(Debug, Clone)]
struct MemberSpec {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Extra `etcd` arguments, after the fixture's own.
    extra: Vec<String>,
}

impl MemberSpec {
    fn new(name: &str) -> std::io::Result<Self> {
        Ok(MemberSpec {
            name: name.to_owned(),
            client_port: free_port()?,
            peer_port: free_port()?,
            extra: Vec::new(),
        })
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    fn args(&self, initial_cluster: &str, data_dir: &str) -> Vec<String> {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
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
    ETCD.start_container(spec.args(initial, "/tmp/etcd-data"))
        .await
}

/// An etcd started as a child process (the fallback when Docker is unavailable).
#[derive(Debug)]
struct EtcdProcess {
    child: Child,
    data_dir: std::path::PathBuf,
}

impl EtcdProcess {
    async fn start(spec: &MemberSpec) -> Result<Self, FixtureError> {
        let data_dir = std::env::temp_dir().join(format!(
            "baton-etcd-{}-{}",
            std::process::id(),
            spec.client_port
        ));
        let mut child = Command::new("etcd")
            .args(spec.args(
                &initial_cluster(std::slice::from_ref(spec)),
                &data_dir.to_string_lossy(),
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
        Ok(EtcdProcess { child, data_dir })
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        // Stopped by its own PID (kill_on_drop would too, but only once the Child drops).
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

#[derive(Debug)]
enum Running {
    Container(Box<ContainerAsync<GenericImage>>),
    Process(Box<EtcdProcess>),
    External,
}

/// One etcd member for tests.
#[derive(Debug)]
pub struct EtcdNode {
    endpoints: Vec<String>,
    running: Running,
}

impl EtcdNode {
    /// Starts a single-member etcd (see the module docs for the environment it reads).
    ///
    /// # Errors
    /// [`FixtureError`] if neither a container nor (when allowed) a local binary starts.
    pub async fn start() -> Result<EtcdNode, FixtureError> {
        EtcdNode::start_with(&[]).await
    }

    /// As [`start`](Self::start), with extra `etcd` arguments after the fixture's own, e.g.
    /// `&["--auth-token-ttl", "1"]`. A node named by `BATON_ETCD_ENDPOINTS` is used as it is
    /// (the arguments are ignored, with a warning).
    ///
    /// # Errors
    /// [`FixtureError`] if neither a container nor (when allowed) a local binary starts.
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
                running: Running::External,
            });
        }
        let mut spec = MemberSpec::new("n0")?;
        spec.extra = args.iter().map(|a| (*a).to_owned()).collect();
        let running =
            match start_container(&spec, &initial_cluster(std::slice::from_ref(&spec))).await {
                Ok(container) => Running::Container(Box::new(container)),
                Err(e) if docker_required() => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, "no container; falling back to `etcd` on PATH");
                    Running::Process(Box::new(EtcdProcess::start(&spec).await?))
                }
            };
        Ok(EtcdNode {
            endpoints: vec![spec.endpoint()],
            running,
        })
    }

    /// One node shared by every test of this process, started on first use on a runtime of
    /// its own (so that it outlives each test's runtime). Give each test its own key prefix.
    /// The node is removed when the process exits: a watchdog process, tied to this one by
    /// a pipe, removes the container (or kills the etcd process) by its id.
    ///
    /// # Panics
    /// If the node cannot be started: a test cannot run without it.
    #[allow(clippy::expect_used)]
    pub fn shared() -> &'static EtcdNode {
        static SHARED: OnceLock<EtcdNode> = OnceLock::new();
        SHARED.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime for the shared etcd fixture");
                rt.block_on(async move {
                    let node = EtcdNode::start().await;
                    if let Ok(node) = &node {
                        node.remove_on_exit();
                    }
                    let _ = tx.send(node);
                    // Keep this runtime (and so the container's client) alive.
                    std::future::pending::<()>().await;
                });
            });
            rx.recv()
                .expect("the fixture thread answers")
                .expect("start the shared etcd fixture")
        })
    }

    /// Spawns a [`Watchdog`]: when this process exits it removes the container or kills etcd
    /// by its PID.
    fn remove_on_exit(&self) {
        let cleanup = match &self.running {
            Running::Container(c) => format!("docker rm -f {} >/dev/null 2>&1", c.id()),
            Running::Process(p) => match p.child.id() {
                Some(pid) => format!("kill {pid} 2>/dev/null"),
                None => return,
            },
            Running::External => return,
        };
        if let Some(watchdog) = Watchdog::spawn(&cleanup) {
            watchdog.keep_until_exit();
        }
    }

    /// Client endpoints, `http://127.0.0.1:<port>`.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Whether this node runs in a container (not the `etcd`-on-PATH fallback).
    pub fn is_container(&self) -> bool {
        matches!(self.running, Running::Container(_))
    }

    /// A backend connected to this node.
    ///
    /// # Errors
    /// As [`EtcdBackend::connect`].
    pub async fn backend(&self) -> crate::Result<EtcdBackend> {
        EtcdBackend::connect(&self.endpoints, EtcdOptions::new()).await
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
    pub async fn start() -> Result<EtcdCluster, FixtureError> {
        let specs = ["m0", "m1", "m2"]
            .iter()
            .map(|n| MemberSpec::new(n))
            .collect::<std::io::Result<Vec<_>>>()?;
        let initial = initial_cluster(&specs);
        let started =
            futures::future::join_all(specs.iter().map(|s| start_container(s, &initial))).await;
        let members = started.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(EtcdCluster { specs, members })
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
    pub async fn backend(&self) -> crate::Result<EtcdBackend> {
        EtcdBackend::connect(&self.endpoints(), EtcdOptions::new()).await
    }

    /// The index of the current leader, asked of each member that answers.
    ///
    /// # Errors
    /// A backend error if no member answers.
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
    pub async fn stop_member(&self, i: usize) -> Result<(), FixtureError> {
        self.member(i)?
            .stop_with_timeout(Some(0))
            .await
            .map_err(|source| ETCD.container_error(source))
    }

    /// Starts member `i` again after [`stop_member`](Self::stop_member). Returns once the
    /// container runs; the member rejoins the cluster in the background (clients retry
    /// meanwhile).
    ///
    /// # Errors
    /// [`FixtureError::NoSuchMember`] for an index out of range; the container runtime's error.
    pub async fn start_member(&self, i: usize) -> Result<(), FixtureError> {
        self.member(i)?
            .start()
            .await
            .map_err(|source| ETCD.container_error(source))
    }

    /// Freezes member `i` (`docker pause`).
    ///
    /// # Errors
    /// [`FixtureError::NoSuchMember`] for an index out of range; the container runtime's error.
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
