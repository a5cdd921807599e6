//! What the server fixtures (etcd, Redis, ZooKeeper) share: their error type, the image they
//! find or build, the container they start through testcontainers, the opt-in fallback to a
//! local binary, free ports, the watchdogs that remove what a test process started when it
//! exits, however it exits, and (for ZooKeeper so far) the engine of a node that runs in a
//! container or as a local process and can be stopped, started again and paused.

use std::future::Future;
use std::io::Write;
use std::net::TcpListener;
use std::process::Stdio;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use testcontainers::core::WaitFor;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, CopyDataSource, GenericImage, ImageExt};

/// The label every fixture container carries; its value is the PID of the test process that
/// started it.
///
/// A watchdog process removes a test process's containers when that process exits, however
/// it exits (killed included). Should one be left anyway (the machine lost power), remove
/// only those of processes that no longer run, not those of a test running beside yours:
///
/// ```sh
/// for id in $(docker ps -aq --filter label=baton.fixture); do
///   pid=$(docker inspect -f '{{index .Config.Labels "baton.fixture"}}' "$id")
///   kill -0 "$pid" 2>/dev/null || docker rm -f "$id"
/// done
/// ```
pub const LABEL: &str = "baton.fixture";

/// The environment variable that allows the fallback to a server binary on `PATH` when no
/// container starts (`1` or `true`). Off by default: a test that asked for a container does
/// not silently run against something else.
pub const LOCAL_FALLBACK_VAR: &str = "BATON_LOCAL_FALLBACK";

/// Why a fixture could not start (or could not be stopped, restarted or paused).
///
/// Each message is one paragraph that includes its cause (Docker's answer, the operating
/// system's error) and, when no container started, what to do about it (start Docker, or
/// allow the local fallback with `BATON_LOCAL_FALLBACK=1`). `Debug` prints the same paragraph,
/// so a test or a `main` that returns the error with `?` shows it, not a dump of nested
/// structures. The cause is also the error's `source()`.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum FixtureError {
    /// Docker could not start the container (and the fallback was not allowed), or could not
    /// stop, start or pause it later.
    #[error(
        "could not start {server} in a container (image {image}): {source}{}",
        fallback_hint(*fallback)
    )]
    Container {
        /// The server: `etcd`, `redis`, `zookeeper`.
        server: &'static str,
        /// The image that was tried.
        image: String,
        /// The testcontainers error (boxed: it is large, and errors travel in `Result`s).
        #[source]
        source: Box<testcontainers::TestcontainersError>,
        /// When the container was to be started and the local fallback was not allowed (nor
        /// forbidden by `BATON_REQUIRE_DOCKER`): what [`LOCAL_FALLBACK_VAR`] would run instead,
        /// named in the message.
        fallback: Option<&'static str>,
    },
    /// No container started, the fallback was allowed ([`LOCAL_FALLBACK_VAR`]), and it failed
    /// too: both causes.
    #[error(
        "could not start {server}: no container ({container}), and the local fallback failed too ({local})"
    )]
    Unavailable {
        /// The server: `etcd`, `redis`.
        server: &'static str,
        /// Why no container started.
        #[source]
        container: Box<FixtureError>,
        /// Why the local binary did not start.
        local: Box<FixtureError>,
    },
    /// The default image was missing and could not be built from Debian's package.
    #[error("could not build the {server} image {image} from Debian's package: {reason}")]
    Image {
        /// The server: `etcd`, `redis`.
        server: &'static str,
        /// The image that was to be built.
        image: String,
        /// What the build said (the end of its output).
        reason: String,
    },
    /// The server binary of the fallback could not be spawned from `PATH`.
    #[error("could not spawn the {server} binary from PATH: {source}")]
    Spawn {
        /// The server: `etcd`, `redis`, `zookeeper`.
        server: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The server process of the fallback started but did not become ready.
    #[error("could not start the {server} binary from PATH: {reason}")]
    Process {
        /// The server: `etcd`, `redis`, `zookeeper`.
        server: &'static str,
        /// What went wrong, with the end of the server's log when there is one.
        reason: String,
    },
    /// A server started again (after a stop or a restart) did not answer in time.
    #[error("{server} at {address} did not become ready in time")]
    NotReady {
        /// The server: `etcd`, `redis`, `zookeeper`.
        server: &'static str,
        /// The address polled, `127.0.0.1:<port>`.
        address: String,
    },
    /// The operation needs a kind of fixture this one is not (pausing a local process, or
    /// restarting a server the test did not start).
    #[error("cannot {op}: {reason}")]
    Unsupported {
        /// The operation asked for.
        op: &'static str,
        /// Why this fixture cannot do it.
        reason: &'static str,
    },
    /// An administrative command to a test server failed (promoting a Redis replica, a
    /// ZooKeeper four-letter word).
    #[error("{server}: `{command}` failed: {source}")]
    Command {
        /// The server: `etcd`, `redis`, `zookeeper`.
        server: &'static str,
        /// The command.
        command: &'static str,
        /// The server's or the client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Operating-system error (free port lookup, pipes, files).
    #[error("i/o error while starting a test server: {0}")]
    Io(#[from] std::io::Error),
    /// A test certificate could not be made ([`TestCa`](crate::testing::TestCa)).
    #[error("could not make the test certificate `{name}`: {source}")]
    Certificate {
        /// The certificate's common name.
        name: String,
        /// The certificate library's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A member index out of range.
    #[error("no member {index}: the fixture has {members}")]
    NoSuchMember {
        /// The index asked for.
        index: usize,
        /// How many members the fixture has.
        members: usize,
    },
}

impl std::fmt::Debug for FixtureError {
    /// The message: one readable paragraph (see the type's docs).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// The end of a [`FixtureError::Container`] message that says what to do.
fn fallback_hint(fallback: Option<&'static str>) -> String {
    match fallback {
        Some(local) => format!(
            ". Is a Docker daemon running (`docker info`)? Start one, or set \
             {LOCAL_FALLBACK_VAR}=1 to run {local} from PATH instead"
        ),
        None => String::new(),
    }
}

/// A free TCP port on 127.0.0.1 (the listener is closed again; the server binds it right
/// after).
pub(crate) fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `n` free TCP ports on 127.0.0.1, all different: the listeners stay open until every port
/// is chosen.
#[cfg(any(feature = "redis", feature = "zookeeper"))]
pub(crate) fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

#[cfg_attr(
    not(any(feature = "etcd", feature = "redis", feature = "zookeeper")),
    allow(dead_code)
)]
fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1" || v == "true")
}

/// Says something a test's author must see: on the process's standard error directly (the
/// test harness captures `eprintln!`, not this), and through `tracing`.
pub(crate) fn announce(message: &str) {
    tracing::warn!("{message}");
    let _ = writeln!(std::io::stderr().lock(), "baton::testing: {message}");
}

/// Runs `local` (the server binary on `PATH`) if no container started and
/// [`LOCAL_FALLBACK_VAR`] allows it, saying so loudly; otherwise returns `container_error`.
/// When the fallback fails too, the error keeps both causes. `BATON_REQUIRE_DOCKER=1` (CI)
/// forbids the fallback whatever the other variable says.
#[cfg_attr(
    not(any(feature = "etcd", feature = "redis", feature = "zookeeper")),
    allow(dead_code)
)]
pub(crate) async fn or_local<T, F, Fut>(
    server: &Server,
    container_error: FixtureError,
    local: F,
) -> Result<T, FixtureError>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, FixtureError>>,
{
    if env_flag("BATON_REQUIRE_DOCKER") {
        return Err(container_error);
    }
    if !env_flag(LOCAL_FALLBACK_VAR) {
        let mut container_error = container_error;
        if let FixtureError::Container { fallback, .. } = &mut container_error {
            *fallback = Some(server.local);
        }
        return Err(container_error);
    }
    announce(&format!(
        "no container for {} ({container_error}); {LOCAL_FALLBACK_VAR} is set: running {} \
         from PATH instead",
        server.name, server.local
    ));
    local().await.map_err(|local| FixtureError::Unavailable {
        server: server.name,
        container: Box::new(container_error),
        local: Box::new(local),
    })
}

/// A server a fixture runs: how to find its image and how to tell that it is ready.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Server {
    /// Short name for errors and logs.
    pub(crate) name: &'static str,
    /// The environment variable naming the image (`name:tag`).
    pub(crate) image_var: &'static str,
    /// The image when the variable is not set.
    pub(crate) default_image: &'static str,
    /// The binary the container runs; it must be on the image's `PATH`.
    pub(crate) entrypoint: &'static str,
    /// What the local fallback runs from the host's `PATH`, for messages (`` `etcd` ``; for
    /// ZooKeeper `java` on Debian's jars, not the image's entrypoint).
    #[cfg_attr(
        not(any(feature = "etcd", feature = "redis", feature = "zookeeper")),
        allow(dead_code)
    )]
    pub(crate) local: &'static str,
    /// A log line fragment that says the server is ready.
    pub(crate) ready: &'static str,
    /// The script that builds [`default_image`](Self::default_image) from Debian's package
    /// (`scripts/build-<server>-image.sh`, embedded), run when that image is missing.
    pub(crate) build_script: &'static str,
    /// The value of the image's `baton.layout` label the tests need (`None`: any): an image
    /// built by an older script (without something a test uses) is built again.
    pub(crate) layout: Option<&'static str>,
}

/// The helpers the image scripts source.
const IMAGE_LIB: &str = include_str!("../../scripts/image-lib.sh");

impl Server {
    /// The image's name and tag.
    pub(crate) fn image(&self) -> (String, String) {
        let image = std::env::var(self.image_var).unwrap_or_else(|_| self.default_image.to_owned());
        match image.rsplit_once(':') {
            Some((name, tag)) if !tag.contains('/') => (name.to_owned(), tag.to_owned()),
            _ => (image, "latest".to_owned()),
        }
    }

    /// Makes sure the image exists when it is the default one (no variable names another):
    /// if Docker answers and the image is missing (or lacks the [`layout`](Self::layout)
    /// label the tests need), builds it from Debian's package with the
    /// project's script, saying so. Once per image and process; concurrent callers wait for
    /// the one build. Without a Docker CLI or daemon it does nothing (starting the container
    /// then fails with Docker's own error).
    async fn ensure_image(&self) -> Result<(), FixtureError> {
        static CHECKED: tokio::sync::Mutex<Vec<&'static str>> =
            tokio::sync::Mutex::const_new(Vec::new());
        if std::env::var_os(self.image_var).is_some() {
            return Ok(());
        }
        let mut checked = CHECKED.lock().await;
        if checked.contains(&self.default_image) {
            return Ok(());
        }
        // Present, and (if a layout is asked for) built by the current script.
        let inspected = tokio::process::Command::new("docker")
            .args([
                "image",
                "inspect",
                "--format",
                "{{index .Config.Labels \"baton.layout\"}}",
                self.default_image,
            ])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .await;
        let present = inspected.is_ok_and(|out| {
            let label = String::from_utf8_lossy(&out.stdout);
            let current = self.layout.is_none_or(|layout| label.trim() == layout);
            if out.status.success() && !current {
                announce(&format!(
                    "the image {} was built by an older script (its baton.layout label is \
                     not {})",
                    self.default_image,
                    self.layout.unwrap_or_default()
                ));
            }
            out.status.success() && current
        });
        if !present {
            let daemon = tokio::process::Command::new("docker")
                .args(["version", "--format", "{{.Server.Version}}"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .await;
            if !daemon.is_ok_and(|status| status.success()) {
                // No CLI or no daemon: nothing to build with; the container start says why.
                return Ok(());
            }
            self.build_image().await?;
        }
        checked.push(self.default_image);
        Ok(())
    }

    /// Runs the embedded build script in a directory of its own.
    async fn build_image(&self) -> Result<(), FixtureError> {
        let image_error = |reason: String| FixtureError::Image {
            server: self.name,
            image: self.default_image.to_owned(),
            reason,
        };
        let script = format!("build-{}-image.sh", self.name);
        announce(&format!(
            "the image {} is missing: building it from Debian's package with {script} \
             (once; it may install the package with apt-get)",
            self.default_image
        ));
        let started = Instant::now();
        let dir =
            std::env::temp_dir().join(format!("baton-image-{}-{}", self.name, std::process::id()));
        let script = format!("build-{}-image.sh", self.name);
        std::fs::create_dir_all(dir.join("scripts"))?;
        std::fs::write(dir.join("scripts").join(&script), self.build_script)?;
        std::fs::write(dir.join("scripts/image-lib.sh"), IMAGE_LIB)?;
        let output = tokio::process::Command::new("bash")
            .arg(dir.join("scripts").join(&script))
            .current_dir(&dir)
            .stdin(Stdio::null())
            .output()
            .await;
        let _ = std::fs::remove_dir_all(&dir);
        let output = output.map_err(|e| image_error(format!("could not run bash: {e}")))?;
        if !output.status.success() {
            let text = String::from_utf8_lossy(&output.stderr);
            let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            return Err(image_error(format!(
                "{script} failed ({}): {}",
                output.status,
                lines[lines.len().saturating_sub(5)..].join(" | ")
            )));
        }
        announce(&format!(
            "built {} in {:.0?}",
            self.default_image,
            started.elapsed()
        ));
        Ok(())
    }

    /// Starts the server in a container with host networking, with `files` (path in the
    /// container, contents) copied in before the server starts, and waits until it logs
    /// [`ready`](Self::ready).
    pub(crate) async fn start_container_with_files(
        &self,
        args: Vec<String>,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<ContainerAsync<GenericImage>, FixtureError> {
        self.start_container_mounted(args, files, None).await
    }

    /// [`start_container_with_files`](Self::start_container_with_files), with a directory of
    /// the host bound at a path of the container (`(host, container)`): data a test can wipe
    /// or replace while the container is stopped.
    pub(crate) async fn start_container_mounted(
        &self,
        args: Vec<String>,
        files: Vec<(String, Vec<u8>)>,
        mount: Option<(String, String)>,
    ) -> Result<ContainerAsync<GenericImage>, FixtureError> {
        self.ensure_image().await?;
        let (name, tag) = self.image();
        let mut request = GenericImage::new(name, tag)
            .with_entrypoint(self.entrypoint)
            .with_wait_for(WaitFor::message_on_either_std(self.ready))
            .with_cmd(args)
            // Host networking: no bridge, no private-range address; we connect to 127.0.0.1.
            .with_network("host")
            .with_label(LABEL, std::process::id().to_string())
            .with_startup_timeout(Duration::from_secs(60));
        for (path, contents) in files {
            request = request.with_copy_to(path, CopyDataSource::Data(contents));
        }
        if let Some((host, container)) = mount {
            request = request.with_mount(testcontainers::core::Mount::bind_mount(host, container));
        }
        let container = request
            .start()
            .await
            .map_err(|source| self.container_error(source))?;
        remove_containers_on_exit();
        Ok(container)
    }

    /// A container runtime's error, naming this server and its image.
    pub(crate) fn container_error(
        &self,
        source: testcontainers::TestcontainersError,
    ) -> FixtureError {
        let (name, tag) = self.image();
        FixtureError::Container {
            server: self.name,
            image: format!("{name}:{tag}"),
            source: Box::new(source),
            fallback: None,
        }
    }

    /// The working directory of a fallback process on `port`: in the system's temporary
    /// directory, named after this server, the test process and the port.
    #[cfg(any(feature = "redis", feature = "zookeeper"))]
    pub(crate) fn work_dir(&self, port: u16) -> std::path::PathBuf {
        let name = format!("baton-{}-{}-{port}", self.name, std::process::id());
        std::env::temp_dir().join(name)
    }

    /// The error for a fallback process that was spawned but did not become ready.
    #[cfg_attr(
        not(any(feature = "etcd", feature = "redis", feature = "zookeeper")),
        allow(dead_code)
    )]
    pub(crate) fn process_error(&self, reason: impl Into<String>) -> FixtureError {
        FixtureError::Process {
            server: self.name,
            reason: reason.into(),
        }
    }
}

/// Spawns, once per process, the [`Watchdog`] that removes every container this process
/// started (those whose [`LABEL`] is this PID) when the process exits: a test process that is
/// killed leaves none behind, and it touches no other process's containers.
fn remove_containers_on_exit() {
    static WATCHDOG: OnceLock<Option<Watchdog>> = OnceLock::new();
    WATCHDOG.get_or_init(|| {
        let pid = std::process::id();
        Watchdog::spawn(&format!(
            "ids=$(docker ps -aq --filter label={LABEL}={pid}); \
             [ -z \"$ids\" ] || docker rm -f $ids >/dev/null 2>&1"
        ))
    });
}

/// A `sh` process that runs a cleanup command (remove a container, kill a process by its PID)
/// when our end of its stdin closes: when this handle is dropped or the test process exits,
/// however it exits. [`set`](Self::set) replaces the command, for a server restarted under a
/// new PID.
#[derive(Debug)]
pub(crate) struct Watchdog {
    stdin: Mutex<std::process::ChildStdin>,
}

impl Watchdog {
    /// Spawns the watchdog; `None` if `sh` cannot be spawned (the fixture then leaks at exit,
    /// as it would without a watchdog).
    pub(crate) fn spawn(cleanup: &str) -> Option<Watchdog> {
        // Each line replaces the command; the last one runs once stdin reaches end of file.
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            // Ctrl-C in a terminal signals the whole process group: the watchdog must
            // outlive the test process to clean up after it.
            .arg(r#"trap '' INT HUP TERM; while IFS= read -r line; do cleanup=$line; done; eval "$cleanup""#)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        // Dropping the Child neither kills nor waits for `sh`; only its stdin matters.
        let watchdog = Watchdog {
            stdin: Mutex::new(child.stdin.take()?),
        };
        watchdog.set(cleanup);
        Some(watchdog)
    }

    /// Replaces the cleanup command (one line of shell).
    pub(crate) fn set(&self, cleanup: &str) {
        let mut stdin = match self.stdin.lock() {
            Ok(stdin) => stdin,
            Err(poisoned) => poisoned.into_inner(),
        };
        // A watchdog that died cannot be told; there is nothing better to do than carry on.
        let _ = writeln!(stdin, "{cleanup}").and_then(|()| stdin.flush());
    }
}

/// Starts a fixture on a runtime of its own, on a thread that keeps that runtime (and so
/// the container's client) alive until the process exits: what a `shared()` fixture does.
///
/// # Panics
/// If the thread's runtime cannot be built or `start` fails: a test cannot run without its
/// fixture.
#[allow(clippy::expect_used)]
pub(crate) fn start_shared<T, F, Fut>(server: &'static str, start: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, FixtureError>>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for a shared fixture");
        rt.block_on(async move {
            let _ = tx.send(start().await);
            // Keep this runtime (and so the container's client) alive.
            std::future::pending::<()>().await;
        });
    });
    match rx.recv().expect("the fixture thread answers") {
        Ok(fixture) => fixture,
        Err(e) => panic!("could not start the shared {server} fixture: {e}"),
    }
}

#[cfg(any(feature = "redis", feature = "zookeeper"))]
pub(crate) use node::{Instance, ServerProcess, exchange};

/// A fixture node's engine: a server in a container, a local process (the fallback), or an
/// external server, stopped, started again and paused the same way whatever the server. The
/// Redis and ZooKeeper fixtures run on it.
#[cfg(any(feature = "redis", feature = "zookeeper"))]
mod node {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    use std::path::{Path, PathBuf};
    use std::process::Stdio;
    use std::time::Duration;

    use futures::future::BoxFuture;
    use testcontainers::{ContainerAsync, GenericImage};
    use tokio::process::{Child, Command};
    use tokio::time::Instant;

    use super::{FixtureError, Server, Watchdog, or_local};

    /// How long a server started again, or a fallback process, has to become ready.
    const READY_TIMEOUT: Duration = Duration::from_secs(30);
    /// How long a killed fallback process has to exit.
    const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
    /// The pause between two readiness (or exit) checks.
    const POLL: Duration = Duration::from_millis(25);
    /// How long a probe may wait to connect, and then for each read or write: a paused server
    /// must not hold a probe up for long.
    const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

    /// Whether the server on 127.0.0.1:`port` is ready (answers as it does once it serves).
    pub(crate) type Probe = fn(u16) -> BoxFuture<'static, bool>;

    /// Sends `request` to `address` (`host:port`) and returns what the server answers until it
    /// closes the connection or `complete` says the answer is whole. Blocking std I/O on the
    /// blocking pool: the library's tokio has no `net` feature.
    pub(crate) async fn exchange(
        address: String,
        request: Vec<u8>,
        complete: fn(&[u8]) -> bool,
    ) -> std::io::Result<Vec<u8>> {
        let answer = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
            let socket = address
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address"))?;
            let mut stream = std::net::TcpStream::connect_timeout(&socket, PROBE_TIMEOUT)?;
            stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
            stream.set_write_timeout(Some(PROBE_TIMEOUT))?;
            stream.write_all(&request)?;
            let mut reply = Vec::new();
            let mut buf = [0_u8; 4096];
            while !complete(&reply) {
                let n = stream.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                reply.extend_from_slice(&buf[..n]);
            }
            Ok(reply)
        })
        .await;
        answer.map_err(std::io::Error::other)?
    }

    /// Polls `probe` until it answers, for at most [`READY_TIMEOUT`].
    async fn wait_ready(server: &Server, port: u16, probe: Probe) -> Result<(), FixtureError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        while !probe(port).await {
            if Instant::now() >= deadline {
                return Err(FixtureError::NotReady {
                    server: server.name,
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

    /// A server run as a child process (the fallback when Docker is unavailable), which can be
    /// stopped and started again on the same port. Its working directory,
    /// [`Server::work_dir`], holds its log and whatever files the fixture put there (its data
    /// survives a stop); it is removed on drop.
    #[derive(Debug)]
    pub(crate) struct ServerProcess {
        server: Server,
        port: u16,
        probe: Probe,
        program: String,
        args: Vec<String>,
        dir: PathBuf,
        /// `None` while stopped.
        child: Option<Child>,
    }

    impl ServerProcess {
        /// Prepares (creates) the working directory; [`start`](Self::start) runs `program`.
        pub(crate) fn new(
            server: Server,
            port: u16,
            probe: Probe,
            program: &str,
            args: Vec<String>,
        ) -> std::io::Result<Self> {
            let dir = server.work_dir(port);
            std::fs::create_dir_all(&dir)?;
            Ok(ServerProcess {
                server,
                port,
                probe,
                program: program.to_owned(),
                args,
                dir,
                child: None,
            })
        }

        fn log_path(&self) -> PathBuf {
            self.dir.join("server.log")
        }

        /// Spawns the server and waits until `probe` answers; does nothing if it runs already.
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
            let mut child = Command::new(&self.program)
                .args(&self.args)
                .current_dir(&self.dir)
                .stdin(Stdio::null())
                .stdout(Stdio::from(log.try_clone()?))
                .stderr(Stdio::from(log))
                .kill_on_drop(true)
                .spawn()
                .map_err(|source| FixtureError::Spawn {
                    server: self.server.name,
                    source,
                })?;
            let deadline = Instant::now() + READY_TIMEOUT;
            loop {
                if let Some(status) = child.try_wait()? {
                    return Err(self.server.process_error(format!(
                        "{} exited ({status}); its log: {}",
                        self.program,
                        log_tail(&self.log_path())
                    )));
                }
                if (self.probe)(self.port).await {
                    self.child = Some(child);
                    return Ok(());
                }
                if Instant::now() >= deadline {
                    // kill_on_drop stops it as `child` drops.
                    return Err(self.server.process_error(format!(
                        "{} did not become ready in time; its log: {}",
                        self.program,
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
            // runtime (a shared node's).
            let deadline = Instant::now() + EXIT_TIMEOUT;
            while child.try_wait()?.is_none() {
                if Instant::now() >= deadline {
                    return Err(self
                        .server
                        .process_error(format!("{} did not exit after SIGKILL", self.program)));
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

    impl Drop for ServerProcess {
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
        Process(Box<tokio::sync::Mutex<ServerProcess>>),
        /// A server the test did not start; why it cannot be stopped (which variable named it).
        External(&'static str),
    }

    /// One server of a fixture, on 127.0.0.1:`port` (or external), ready when its
    /// [`Probe`] answers.
    #[derive(Debug)]
    pub(crate) struct Instance {
        server: Server,
        port: u16,
        probe: Probe,
        running: Running,
        watchdog: Option<Watchdog>,
    }

    impl Instance {
        /// Starts `server` on `port` in a container with `args` and waits until it logs
        /// [`Server::ready`] and `probe` answers; if no container starts and the fallback is
        /// allowed ([`or_local`]), runs the process `fallback` builds instead.
        pub(crate) async fn start(
            server: Server,
            port: u16,
            probe: Probe,
            args: Vec<String>,
            fallback: impl FnOnce() -> std::io::Result<ServerProcess>,
        ) -> Result<Instance, FixtureError> {
            Instance::start_with_files(server, port, probe, args, Vec::new(), fallback).await
        }

        /// [`start`](Self::start), with `files` (path in the container, contents) copied into
        /// the container before the server starts; `fallback` writes its own.
        pub(crate) async fn start_with_files(
            server: Server,
            port: u16,
            probe: Probe,
            args: Vec<String>,
            files: Vec<(String, Vec<u8>)>,
            fallback: impl FnOnce() -> std::io::Result<ServerProcess>,
        ) -> Result<Instance, FixtureError> {
            let started = server.start_container_with_files(args, files).await;
            let (running, watchdog) = match started {
                Ok(container) => {
                    // Dropping the container on failure removes it; the process's watchdog
                    // removes it if this process dies.
                    wait_ready(&server, port, probe).await?;
                    (Running::Container(Box::new(container)), None)
                }
                Err(e) => {
                    or_local(&server, e, || async {
                        let mut process = fallback()?;
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
            Ok(Instance {
                server,
                port,
                probe,
                running,
                watchdog,
            })
        }

        /// Starts `server` on `port` in a container with `args` and a directory of the host
        /// bound into it (`(host, container)`: data a test can wipe while the server is
        /// stopped), and waits until it logs [`Server::ready`] and `probe` answers. No
        /// fallback: a local process would not keep its data where the test wipes it.
        #[cfg(feature = "zookeeper")]
        pub(crate) async fn start_mounted(
            server: Server,
            port: u16,
            probe: Probe,
            args: Vec<String>,
            mount: (String, String),
        ) -> Result<Instance, FixtureError> {
            let container = server
                .start_container_mounted(args, Vec::new(), Some(mount))
                .await?;
            wait_ready(&server, port, probe).await?;
            Ok(Instance {
                server,
                port,
                probe,
                running: Running::Container(Box::new(container)),
                watchdog: None,
            })
        }

        /// A server the test did not start, on `port`; `reason` says why it cannot be stopped,
        /// started or paused.
        pub(crate) fn external(server: Server, port: u16, reason: &'static str) -> Instance {
            Instance {
                server,
                port,
                probe: |_| Box::pin(async { true }),
                running: Running::External(reason),
                watchdog: None,
            }
        }

        pub(crate) fn port(&self) -> u16 {
            self.port
        }

        pub(crate) fn is_container(&self) -> bool {
            matches!(self.running, Running::Container(_))
        }

        /// The container's Docker id, if the server runs in one.
        pub(crate) fn container_id(&self) -> Option<&str> {
            match &self.running {
                Running::Container(c) => Some(c.id()),
                _ => None,
            }
        }

        /// Kills the server at once (SIGKILL, no shutdown).
        pub(crate) async fn stop(&self) -> Result<(), FixtureError> {
            match &self.running {
                Running::Container(c) => c
                    .stop_with_timeout(Some(0))
                    .await
                    .map_err(|source| self.server.container_error(source)),
                Running::Process(p) => {
                    let mut process = p.lock().await;
                    let stopped = process.stop().await;
                    self.watch(&process);
                    stopped
                }
                Running::External(reason) => Err(unsupported("stop", reason)),
            }
        }

        /// Starts the server again after [`stop`](Self::stop) and waits until the probe
        /// answers.
        pub(crate) async fn start_again(&self) -> Result<(), FixtureError> {
            match &self.running {
                Running::Container(c) => {
                    c.start()
                        .await
                        .map_err(|source| self.server.container_error(source))?;
                    wait_ready(&self.server, self.port, self.probe).await
                }
                Running::Process(p) => {
                    let mut process = p.lock().await;
                    let started = process.start().await;
                    self.watch(&process);
                    started
                }
                Running::External(reason) => Err(unsupported("start", reason)),
            }
        }

        /// Freezes the container (`docker pause`).
        pub(crate) async fn pause(&self) -> Result<(), FixtureError> {
            self.container("pause")?
                .pause()
                .await
                .map_err(|source| self.server.container_error(source))
        }

        /// Unfreezes the container.
        pub(crate) async fn unpause(&self) -> Result<(), FixtureError> {
            self.container("unpause")?
                .unpause()
                .await
                .map_err(|source| self.server.container_error(source))
        }

        /// Points the watchdog (a local process's) at the process as it now is: the new PID after
        /// a start, none after a stop (so that it never kills a PID the system reused).
        fn watch(&self, process: &ServerProcess) {
            if let Some(watchdog) = &self.watchdog {
                watchdog.set(&process.cleanup());
            }
        }

        fn container(
            &self,
            op: &'static str,
        ) -> Result<&ContainerAsync<GenericImage>, FixtureError> {
            match &self.running {
                Running::Container(c) => Ok(c),
                Running::Process(_) => Err(unsupported(
                    op,
                    "the node runs as a local process, not in a container",
                )),
                Running::External(reason) => Err(unsupported(op, reason)),
            }
        }
    }

    fn unsupported(op: &'static str, reason: &'static str) -> FixtureError {
        FixtureError::Unsupported { op, reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_include_their_cause() {
        let spawn = FixtureError::Spawn {
            server: "etcd",
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory"),
        };
        assert_eq!(
            spawn.to_string(),
            "could not spawn the etcd binary from PATH: No such file or directory"
        );
        assert!(std::error::Error::source(&spawn).is_some());
    }
}
