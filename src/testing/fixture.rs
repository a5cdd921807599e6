//! What the server fixtures (etcd, Redis) share: their error type, the container they start
//! through testcontainers, free ports, and the watchdog that removes a shared fixture when the
//! test process exits.

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
        /// The server: `etcd`, `redis`.
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
        /// The server: `etcd`, `redis`.
        server: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The server process of the fallback started but did not become ready.
    #[error("could not start the {server} binary from PATH: {reason}")]
    Process {
        /// The server: `etcd`, `redis`.
        server: &'static str,
        /// What went wrong, with the end of the server's log when there is one.
        reason: String,
    },
    /// A server started again (after a stop or a restart) did not answer in time.
    #[error("{server} at {address} did not become ready in time")]
    NotReady {
        /// The server: `etcd`, `redis`.
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
    /// An administrative command to a test server failed (promoting a Redis replica).
    #[error("{server}: `{command}` failed: {source}")]
    Command {
        /// The server: `etcd`, `redis`.
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
#[cfg(feature = "redis")]
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
    #[cfg(feature = "redis")]
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
