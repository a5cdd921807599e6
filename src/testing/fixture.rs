//! What the server fixtures (etcd, Redis, ZooKeeper) share: their error type, the container
//! they start through testcontainers, free ports, the watchdog that removes a shared fixture
//! when the test process exits, and (for ZooKeeper so far) the engine of a node that runs in a
//! container or as a local process and can be stopped, started again and paused.

use std::io::Write;
use std::net::TcpListener;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use testcontainers::core::WaitFor;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, CopyDataSource, GenericImage, ImageExt};

/// The label every fixture container carries, so that leftovers of a killed run can be
/// removed: `docker rm -f $(docker ps -aq --filter label=baton.fixture)`.
pub const LABEL: &str = "baton.fixture";

/// Why a fixture could not start (or could not be stopped, restarted or paused).
///
/// Each message includes its cause (Docker's answer, the operating system's error): a test
/// that prints the error with `{}` shows why, not only what failed. The cause is also the
/// error's `source()`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FixtureError {
    /// Docker could not start the container (and the fallback was not allowed or failed), or
    /// could not stop, start or pause it later.
    #[error("could not start {server} in a container (image {image}): {source}")]
    Container {
        /// The server: `etcd`, `redis`, `zookeeper`.
        server: &'static str,
        /// The image that was tried.
        image: String,
        /// The testcontainers error (boxed: it is large, and errors travel in `Result`s).
        #[source]
        source: Box<testcontainers::TestcontainersError>,
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

/// Whether `BATON_REQUIRE_DOCKER` forbids the fallback to a binary on `PATH`.
pub(crate) fn docker_required() -> bool {
    std::env::var("BATON_REQUIRE_DOCKER").is_ok_and(|v| v == "1" || v == "true")
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
    /// A log line fragment that says the server is ready.
    pub(crate) ready: &'static str,
}

impl Server {
    /// The image's name and tag.
    pub(crate) fn image(&self) -> (String, String) {
        let image = std::env::var(self.image_var).unwrap_or_else(|_| self.default_image.to_owned());
        match image.rsplit_once(':') {
            Some((name, tag)) if !tag.contains('/') => (name.to_owned(), tag.to_owned()),
            _ => (image, "latest".to_owned()),
        }
    }

    /// Starts the server in a container with host networking and waits until it logs
    /// [`ready`](Self::ready).
    #[cfg(any(feature = "redis", feature = "zookeeper"))]
    pub(crate) async fn start_container(
        &self,
        args: Vec<String>,
    ) -> Result<ContainerAsync<GenericImage>, FixtureError> {
        self.start_container_with_files(args, Vec::new()).await
    }

    /// [`start_container`](Self::start_container), with `files` (path in the container,
    /// contents) copied in before the server starts.
    pub(crate) async fn start_container_with_files(
        &self,
        args: Vec<String>,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<ContainerAsync<GenericImage>, FixtureError> {
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
        request
            .start()
            .await
            .map_err(|source| self.container_error(source))
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
        }
    }

    /// The working directory of a fallback process on `port`: in the system's temporary
    /// directory, named after this server, the test process and the port.
    #[cfg(feature = "zookeeper")]
    pub(crate) fn work_dir(&self, port: u16) -> std::path::PathBuf {
        let name = format!("baton-{}-{}-{port}", self.name, std::process::id());
        std::env::temp_dir().join(name)
    }

    /// The error for a fallback process that was spawned but did not become ready.
    pub(crate) fn process_error(&self, reason: impl Into<String>) -> FixtureError {
        FixtureError::Process {
            server: self.name,
            reason: reason.into(),
        }
    }
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
            .arg(r#"while IFS= read -r line; do cleanup=$line; done; eval "$cleanup""#)
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

    /// Keeps the watchdog until the process exits, for a fixture that is never dropped.
    #[cfg(feature = "etcd")]
    pub(crate) fn keep_until_exit(self) {
        std::mem::forget(self);
    }
}

#[cfg(feature = "zookeeper")]
pub(crate) use node::{Instance, ServerProcess, exchange, start_shared};

/// A fixture node's engine: a server in a container, a local process (the fallback), or an
/// external server, stopped, started again and paused the same way whatever the server. The
/// ZooKeeper fixtures run on it; the Redis fixtures still have their own copy of it.
#[cfg(feature = "zookeeper")]
mod node {
    use std::future::Future;
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    use std::path::{Path, PathBuf};
    use std::process::Stdio;
    use std::time::Duration;

    use futures::future::BoxFuture;
    use testcontainers::{ContainerAsync, GenericImage};
    use tokio::process::{Child, Command};
    use tokio::time::Instant;

    use super::{FixtureError, Server, Watchdog, docker_required};

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
        /// [`Server::ready`] and `probe` answers; if no container starts and
        /// `BATON_REQUIRE_DOCKER` allows it, runs the process `fallback` builds instead.
        pub(crate) async fn start(
            server: Server,
            port: u16,
            probe: Probe,
            args: Vec<String>,
            fallback: impl FnOnce() -> std::io::Result<ServerProcess>,
        ) -> Result<Instance, FixtureError> {
            let running = match server.start_container(args).await {
                Ok(container) => {
                    // Dropping the container on failure removes it.
                    wait_ready(&server, port, probe).await?;
                    Running::Container(Box::new(container))
                }
                Err(e) if docker_required() => return Err(e),
                Err(e) => {
                    tracing::warn!(
                        error = %e,
                        server = server.name,
                        "no container; falling back to a local process"
                    );
                    let mut process = fallback()?;
                    process.start().await?;
                    Running::Process(Box::new(tokio::sync::Mutex::new(process)))
                }
            };
            Ok(Instance {
                server,
                port,
                probe,
                running,
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

        /// Gives the instance a [`Watchdog`] that removes the container, or kills the process,
        /// when this process exits.
        pub(crate) async fn remove_on_exit(&mut self) {
            let cleanup = match &self.running {
                Running::Container(c) => Some(format!("docker rm -f {} >/dev/null 2>&1", c.id())),
                Running::Process(p) => Some(p.lock().await.cleanup()),
                Running::External(_) => None,
            };
            self.watchdog = cleanup.as_deref().and_then(Watchdog::spawn);
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

        /// Points the watchdog (a shared node's) at the process as it now is: the new PID after
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
