//! `baton`: locks and elections from the shell, compatible with `etcdctl lock` / `elect`.
//!
//! With a command, `baton` supervises it (see `supervise`): the command runs only while the
//! lock (or leadership) is held, as a whole process group, and baton returns its exit code.

mod supervise;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use baton::{
    Backend, ConnectOptions, Election, Endpoints, Error, FencingToken, LeaderEvent, Leadership,
    LostReason, Mutex, MutexGuard, Semaphore, SemaphorePermit, Session, SessionOptions,
};
use clap::{Parser, Subcommand};
use futures::StreamExt;
use nix::sys::signal::Signal;
use supervise::{Group, Spec};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

const EXIT_CODES: &str = "\
Exit codes:
  0    success; with a command, the command's own exit code (128+N if signal N ended it)
  1    unexpected error
  64   bad arguments
  69   etcd unreachable, or a request failed after retries; or its TLS certificate not trusted
  74   standard output could not be written
  75   --timeout elapsed, or --try found the lock held
  77   authentication failed (user and password, or a client certificate refused)
  79   the lock or leadership was lost (its key deleted, or its session lost); the command,
       if any, was stopped
  126  the command is not executable (checked before the lock is taken)
  127  the command was not found (checked before the lock is taken)
  141  standard output was closed (a broken pipe); the lock was released";

const COMMAND_HELP: &str = "\
The command runs in a process group of its own, started only once the lock is held. It ends
with baton: if baton is killed (even with SIGKILL), a watchdog stops the whole group, and on
Linux the kernel kills the command itself at once. SIGINT, SIGTERM and SIGHUP sent to baton
are passed to the whole group (and SIGKILL follows after --kill-after if it does not end; a
second signal sends it at once); signals baton inherited as ignored stay ignored. If the lock
is lost, the group gets SIGTERM, then SIGKILL after --kill-after, and baton exits with 79
without waiting for etcd. The lock is released only once every process of the group is gone;
processes that leave the group on purpose (setsid, a daemon) are not covered. At a terminal,
the command's group gets the terminal, so one Ctrl-C reaches it once.

With a command nothing is written to standard output but the command's own output; the key
and token are in BATON_LOCK_KEY and BATON_FENCING_TOKEN (and ETCD_LOCK_KEY, ETCD_LOCK_REV for
etcdctl compatibility), and on standard error with -v.";

/// Exit codes, as documented in `EXIT_CODES` and docs/cli.md.
mod exit {
    pub(crate) const ERROR: u8 = 1;
    pub(crate) const USAGE: u8 = 64;
    pub(crate) const UNAVAILABLE: u8 = 69;
    pub(crate) const IO: u8 = 74;
    pub(crate) const TIMEOUT: u8 = 75;
    pub(crate) const AUTH: u8 = 77;
    pub(crate) const LOST: u8 = 79;
    pub(crate) const NOT_EXECUTABLE: u8 = 126;
    pub(crate) const NOT_FOUND: u8 = 127;
    pub(crate) const BROKEN_PIPE: u8 = 141;
}

/// The longest lease etcd grants (9,000,000,000 s).
const MAX_TTL: Duration = Duration::from_secs(9_000_000_000);

#[derive(Parser, Debug)]
#[command(
    name = "baton",
    version,
    about = "Fair distributed locks and leader election on etcd, Redis or ZooKeeper",
    after_help = EXIT_CODES
)]
struct Cli {
    /// Where the locks live: etcd endpoints, comma-separated (host:port or http(s)://host:port),
    /// one Redis URL (redis://[user:password@]host:port[/db]), or a ZooKeeper connect string
    /// (zk://host:port[,host:port...][/chroot]).
    #[arg(
        long,
        env = "BATON_ENDPOINTS",
        default_value = "127.0.0.1:2379",
        value_delimiter = ',',
        global = true,
        value_name = "HOST:PORT,...|redis://HOST:PORT|zk://HOST:PORT,..."
    )]
    endpoints: Vec<String>,
    /// User name for etcd authentication (with --password; Redis takes it in the URL).
    #[arg(long, env = "BATON_USER", global = true)]
    user: Option<String>,
    /// Password for etcd authentication (with --user). Not passed on to the command.
    #[arg(long, env = "BATON_PASSWORD", hide_env_values = true, global = true)]
    password: Option<String>,
    /// etcd or Redis over TLS: the CA bundle (PEM) that signed the servers' certificates,
    /// instead of the system's roots. Turns TLS on for etcd's host:port endpoints (https:// is
    /// TLS anyway); Redis takes it with rediss:// only.
    #[arg(long, env = "BATON_CACERT", global = true, value_name = "FILE")]
    cacert: Option<PathBuf>,
    /// etcd or Redis over TLS: the client certificate (PEM) for a server that asks for one
    /// (etcd's --client-cert-auth, Redis's tls-auth-clients); with --key.
    #[arg(long, env = "BATON_CERT", global = true, value_name = "FILE")]
    cert: Option<PathBuf>,
    /// etcd or Redis over TLS: the private key (PEM) of the --cert certificate.
    #[arg(long, env = "BATON_KEY", global = true, value_name = "FILE")]
    key: Option<PathBuf>,
    /// Seconds to wait for an endpoint to answer.
    #[arg(long, default_value = "5", value_parser = seconds, global = true, allow_negative_numbers = true)]
    connect_timeout: Duration,
    /// Redis only: seconds after baton's state was lost or rolled back (a restart, a failover,
    /// a flush, a new server) during which nothing is granted (at least the longest --ttl of
    /// any client; see docs/redis.md).
    #[arg(long, default_value = "60", value_parser = seconds_or_zero, global = true, value_name = "SECONDS")]
    restart_grace: Duration,
    /// ZooKeeper only: whose node names the lock entries take, to share locks with
    /// applications using that library: Curator's InterProcessMutex (the default) or kazoo's
    /// Lock (docs/zookeeper.md).
    #[arg(long, value_enum, env = "BATON_LAYOUT", global = true)]
    layout: Option<Layout>,
    /// Also print the key and fencing token on standard error when running a command.
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

/// `--layout`: the ZooKeeper node layouts.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Layout {
    /// Apache Curator's InterProcessMutex: `_c_<uuid>-lock-<sequence>`.
    Curator,
    /// kazoo's Lock: `<uuid>__lock__<sequence>`.
    Kazoo,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Acquire a lock; run a command while holding it, or hold it until a signal.
    ///
    /// Without a command, prints the lock key and the fencing token (one per line) once the
    /// lock is held, and holds it until SIGINT, SIGTERM or SIGHUP. With a command, runs it
    /// while holding the lock (see below) and returns its exit code.
    #[command(after_help = format!("{COMMAND_HELP}\n\n{EXIT_CODES}"))]
    Lock {
        /// The lock name (keys are `<name>/<lease id hex>`, as `etcdctl lock`). Names that
        /// nest share a queue: `job` waits behind `job/sub`.
        name: String,
        /// Session TTL in seconds: how long the lock survives this process dying.
        #[arg(long, default_value = "10", value_parser = ttl_seconds, allow_negative_numbers = true)]
        ttl: Duration,
        /// Give up after this many seconds, connecting included (exit code 75).
        #[arg(long, value_parser = seconds, allow_negative_numbers = true)]
        timeout: Option<Duration>,
        /// Take the lock only if it is free right now; exit 75 if it is held or contended.
        #[arg(long = "try", conflicts_with = "timeout")]
        try_once: bool,
        /// Hold one of N permits of a semaphore named <NAME> instead of the lock (as
        /// `consul lock -n`): at most N holders at once, granted in arrival order. Keys are
        /// `<name>/<lease id hex>_<k>`, and the limit is stored at `<name>`: every holder
        /// must ask for the same N.
        #[arg(short = 'n', long = "permits", value_name = "N")]
        permits: Option<u32>,
        /// Seconds between SIGTERM and SIGKILL when the command must be stopped.
        #[arg(long, default_value = "10", value_parser = seconds, allow_negative_numbers = true)]
        kill_after: Duration,
        /// The command to run while holding the lock.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Campaign in an election; lead until a signal, or run a command while leading; or
    /// observe the election with --listen.
    #[command(after_help = format!("{COMMAND_HELP}\n\n{EXIT_CODES}"))]
    Elect {
        /// The election name.
        name: String,
        /// The value to lead with (not with --listen).
        #[arg(required_unless_present = "listen", conflicts_with = "listen")]
        proposal: Option<String>,
        /// Print one line per leader event instead of campaigning.
        #[arg(short, long)]
        listen: bool,
        /// With --listen: JSON lines.
        #[arg(long, requires = "listen")]
        json: bool,
        /// Session TTL in seconds.
        #[arg(long, default_value = "10", value_parser = ttl_seconds, allow_negative_numbers = true)]
        ttl: Duration,
        /// Give up after this many seconds, connecting included (exit code 75).
        #[arg(long, value_parser = seconds, allow_negative_numbers = true)]
        timeout: Option<Duration>,
        /// Seconds between SIGTERM and SIGKILL when the command must be stopped.
        #[arg(long, default_value = "10", value_parser = seconds, allow_negative_numbers = true)]
        kill_after: Duration,
        /// The command to run while leading.
        #[arg(last = true, conflicts_with = "listen")]
        command: Vec<String>,
    },
    /// Show the queue of a lock or election: holder first, then waiters in order.
    #[command(after_help = EXIT_CODES)]
    Status {
        /// The lock or election name.
        name: String,
        /// JSON lines.
        #[arg(long)]
        json: bool,
    },
}

fn seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!("`{s}` must be a positive number of seconds"));
    }
    Duration::try_from_secs_f64(secs).map_err(|e| e.to_string())
}

/// Seconds, zero allowed (a wait that can be turned off).
fn seconds_or_zero(s: &str) -> Result<Duration, String> {
    if s.parse::<f64>() == Ok(0.0) {
        return Ok(Duration::ZERO);
    }
    seconds(s)
}

fn ttl_seconds(s: &str) -> Result<Duration, String> {
    let ttl = seconds(s)?;
    if ttl > MAX_TTL {
        return Err(format!(
            "`{s}` is longer than the longest lease etcd grants ({} s)",
            MAX_TTL.as_secs()
        ));
    }
    Ok(ttl)
}

/// A failure to report: one line on stderr and an exit code.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let code = match &e {
            Error::InvalidArgument(_) | Error::LimitMismatch { .. } => exit::USAGE,
            Error::Connect { .. } | Error::Backend { .. } | Error::Unavailable => exit::UNAVAILABLE,
            Error::Auth { .. } | Error::Permission { .. } => exit::AUTH,
            Error::Locked { .. } => exit::TIMEOUT,
            Error::SessionLost(_)
            | Error::EntryGone { .. }
            | Error::NotOwner { .. }
            | Error::LeadershipLost { .. } => exit::LOST,
            _ => exit::ERROR,
        };
        // One line: the error and its causes.
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        Failure::new(code, one_line(&message))
    }
}

/// Text made safe for one line of output: control characters (newlines included) escaped.
fn one_line(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// Prints the library's warnings (with `-v`, its notices too) on standard error, one line
/// each: a wait the operator would otherwise not see (a Redis restart grace) is said where
/// they look. `BATON_LOG` (a `tracing` filter, e.g. `baton=debug`) overrides the level.
fn log_to_stderr(verbose: bool) {
    let default = if verbose { "baton=info" } else { "baton=warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("BATON_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .with_ansi(false)
        .try_init();
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(supervise::EXEC_STEP) {
        return ExitCode::from(supervise::exec_step(&args[2..]));
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            // One line, like every other error of baton.
            let rendered = e.to_string();
            let first = rendered
                .lines()
                .next()
                .unwrap_or("bad arguments")
                .trim_start_matches("error: ");
            eprintln!("baton: {} (see `baton --help`)", one_line(first));
            return ExitCode::from(exit::USAGE);
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    log_to_stderr(cli.verbose);
    // One thread: the command is started from it, and on Linux a child's parent-death signal
    // follows the thread that started it.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("baton: cannot start the runtime: {e}");
            return ExitCode::from(exit::ERROR);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("baton: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

/// What [`validate`] found good: the command to supervise, if any, and the TLS files read.
struct Checked {
    spec: Option<Spec>,
    tls: TlsFiles,
}

/// The contents of --cacert, --cert and --key (no `Debug`: the key is a secret).
struct TlsFiles {
    ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

/// Reads the file given with `flag` (the certificates are checked when connecting, before
/// anything is sent).
fn read_tls_file(flag: &str, path: &Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| {
        Failure::new(
            exit::USAGE,
            format!("{flag} {}: cannot read it: {e}", path.display()),
        )
    })
}

/// --cacert, --cert and --key: for etcd or Redis, cert and key together, the files readable.
fn tls_files(cli: &Cli, endpoints: &Endpoints) -> Result<TlsFiles, Failure> {
    let any = cli.cacert.is_some() || cli.cert.is_some() || cli.key.is_some();
    if any && matches!(endpoints, Endpoints::ZooKeeper(_)) {
        return Err(Failure::new(
            exit::USAGE,
            "--cacert, --cert and --key are for etcd and Redis (rediss://); baton's ZooKeeper \
             backend does not take them",
        ));
    }
    if any && matches!(endpoints, Endpoints::Redis(url) if !url.starts_with("rediss://")) {
        return Err(Failure::new(
            exit::USAGE,
            "--cacert, --cert and --key need a rediss:// URL; redis:// is plain text",
        ));
    }
    let client = match (&cli.cert, &cli.key) {
        (Some(cert), Some(key)) => {
            Some((read_tls_file("--cert", cert)?, read_tls_file("--key", key)?))
        }
        (Some(_), None) => {
            return Err(Failure::new(
                exit::USAGE,
                "--cert needs --key (or BATON_KEY): the certificate's private key",
            ));
        }
        (None, Some(_)) => {
            return Err(Failure::new(
                exit::USAGE,
                "--key needs --cert (or BATON_CERT): the certificate it belongs to",
            ));
        }
        (None, None) => None,
    };
    let ca = match &cli.cacert {
        Some(path) => Some(read_tls_file("--cacert", path)?),
        None => None,
    };
    Ok(TlsFiles { ca, client })
}

/// Checks what can be checked before connecting: nothing is sent for bad input.
fn validate(cli: &Cli) -> Result<Checked, Failure> {
    let endpoints = Endpoints::parse(&cli.endpoints.join(","))
        .map_err(|e| Failure::new(exit::USAGE, format!("--endpoints: {e}")))?;
    if cli.layout.is_some() && !matches!(endpoints, Endpoints::ZooKeeper(_)) {
        return Err(Failure::new(
            exit::USAGE,
            "--layout is for ZooKeeper endpoints (zk://) only",
        ));
    }
    if cli.user.is_some() && !matches!(endpoints, Endpoints::Etcd(_)) {
        return Err(Failure::new(
            exit::USAGE,
            "--user and --password are for etcd; Redis takes credentials in its URL (redis://user:password@host:port)",
        ));
    }
    let tls = tls_files(cli, &endpoints)?;
    match (&cli.user, &cli.password) {
        (Some(_), None) => {
            return Err(Failure::new(
                exit::USAGE,
                "--user needs --password (or BATON_PASSWORD)",
            ));
        }
        (None, Some(_)) => {
            return Err(Failure::new(
                exit::USAGE,
                "--password needs --user (or BATON_USER)",
            ));
        }
        _ => {}
    }
    let (name, command) = match &cli.command {
        Command::Lock { name, command, .. } | Command::Elect { name, command, .. } => {
            (name, command.as_slice())
        }
        Command::Status { name, .. } => (name, &[][..]),
    };
    if name.is_empty() {
        return Err(Failure::new(exit::USAGE, "the name must not be empty"));
    }
    let Some((program, args)) = command.split_first() else {
        return Ok(Checked { spec: None, tls });
    };
    supervise::check_runnable(program)?;
    Ok(Checked {
        spec: Some(Spec {
            program: program.clone(),
            args: args.to_vec(),
            env: Vec::new(),
        }),
        tls,
    })
}

/// `host:port`, `http://host:port` or `https://host:port`, with a port in 1..=65535.
/// Waits for `fut` until `deadline` (exit code 75 then).
async fn before<T>(
    deadline: Option<Instant>,
    what: &str,
    fut: impl std::future::Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    match deadline {
        Some(at) => tokio::time::timeout_at(at, fut)
            .await
            .map_err(|_| Failure::new(exit::TIMEOUT, format!("timed out {what}")))?,
        None => fut.await,
    }
}

async fn connect(
    cli: &Cli,
    tls: TlsFiles,
    deadline: Option<Instant>,
) -> Result<Arc<dyn Backend>, Failure> {
    let endpoints = cli.endpoints.join(",");
    let mut options = ConnectOptions::new()
        .with_connect_timeout(cli.connect_timeout)
        .with_restart_grace(cli.restart_grace);
    if let (Some(user), Some(password)) = (&cli.user, &cli.password) {
        options = options.with_user(user, password);
    }
    if let Some(ca) = tls.ca {
        options = options.with_ca_cert(ca);
    }
    if let Some((cert, key)) = tls.client {
        options = options.with_client_cert(cert, key);
    }
    if let Some(layout) = cli.layout {
        options = options.with_zk_layout(match layout {
            Layout::Curator => baton::ZkLayout::Curator,
            Layout::Kazoo => baton::ZkLayout::Kazoo,
        });
    }
    let what = match Endpoints::parse(&endpoints) {
        Ok(parsed) => format!("connecting to {}", parsed.backend_name()),
        Err(_) => "connecting".to_owned(),
    };
    before(deadline, &what, async {
        Ok(baton::connect_with(&endpoints, options).await?)
    })
    .await
}

async fn run(cli: Cli) -> Result<u8, Failure> {
    let Checked { spec, tls } = validate(&cli)?;
    let mut signals = Signals::new()?;
    let deadline = match &cli.command {
        Command::Lock { timeout, .. } | Command::Elect { timeout, .. } => {
            timeout.map(|t| Instant::now() + t)
        }
        Command::Status { .. } => None,
    };
    let backend = tokio::select! {
        backend = connect(&cli, tls, deadline) => backend?,
        sig = signals.recv() => return Err(interrupted(sig, "connecting")),
    };
    let verbose = cli.verbose;
    match cli.command {
        Command::Lock {
            name,
            ttl,
            try_once,
            permits,
            kill_after,
            ..
        } => {
            let session = session(backend, ttl, deadline).await?;
            let owner = format!("baton-cli pid={}", std::process::id());
            let what = match permits {
                Some(n) => format!("a permit of `{name}` ({n} permits)"),
                None => format!("lock `{name}`"),
            };
            let busy = |e| match e {
                Error::Locked { .. } => Failure::new(
                    exit::TIMEOUT,
                    format!("{what} is held or contended (--try)"),
                ),
                other => other.into(),
            };
            let granted = match permits {
                None => {
                    let mutex = Mutex::new(&session, &name)?.with_owner_info(owner);
                    if try_once {
                        mutex.try_lock().await.map_err(busy)
                    } else {
                        wait_granted(&what, deadline, &mut signals, mutex.lock()).await
                    }
                    .map(Held::Lock)
                }
                Some(n) => {
                    let semaphore = Semaphore::new(&session, &name, n)?.with_owner_info(owner);
                    if try_once {
                        semaphore.try_acquire().await.map_err(busy)
                    } else {
                        wait_granted(&what, deadline, &mut signals, semaphore.acquire()).await
                    }
                    .map(Held::Permit)
                }
            };
            let result = match granted {
                Ok(held) => {
                    let hold = Hold {
                        what,
                        verbose,
                        kill_after,
                    };
                    hold.run(held, spec, &mut signals).await
                }
                Err(e) => Err(e),
            };
            finish(&session, &result).await;
            result
        }
        Command::Elect {
            name,
            proposal,
            listen,
            json,
            ttl,
            kill_after,
            ..
        } => {
            let session = session(backend, ttl, deadline).await?;
            let result = match (listen, proposal) {
                (true, _) => listen_election(&session, &name, json, &mut signals).await,
                (false, Some(proposal)) => {
                    let election = Election::new(&session, &name)?;
                    let what = format!("leadership of `{name}`");
                    match wait_granted(&what, deadline, &mut signals, election.campaign(proposal))
                        .await
                    {
                        Ok(leadership) => {
                            let hold = Hold {
                                what,
                                verbose,
                                kill_after,
                            };
                            hold.run(Held::Lead(leadership), spec, &mut signals).await
                        }
                        Err(e) => Err(e),
                    }
                }
                (false, None) => Err(Failure::new(exit::USAGE, "a proposal is required")),
            };
            finish(&session, &result).await;
            result
        }
        Command::Status { name, json } => status(&*backend, &name, json).await,
    }
}

/// Ends the session: revokes the lease (so no key of ours outlives this process), within a
/// bound. After a loss nothing is waited for: the server may not answer, and the lease ends
/// on its own.
async fn finish(session: &Session, result: &Result<u8, Failure>) {
    let lost = matches!(result, Err(f) if f.code == exit::LOST) || session.is_lost();
    let bound = if lost {
        Duration::from_millis(200)
    } else {
        Duration::from_secs(2)
    };
    if tokio::time::timeout(bound, session.close()).await.is_err() {
        eprintln!("baton: could not revoke the session in time; its lease ends after its TTL");
    }
}

async fn session(
    backend: Arc<dyn Backend>,
    ttl: Duration,
    deadline: Option<Instant>,
) -> Result<Session, Failure> {
    before(deadline, "starting a session", async {
        Ok(Session::from_shared(backend, SessionOptions::new().with_ttl(ttl)).await?)
    })
    .await
}

fn interrupted(sig: Signal, what: &str) -> Failure {
    Failure::new(
        u8::try_from(128 + sig as i32).unwrap_or(exit::ERROR),
        format!("interrupted by {sig} while {what}"),
    )
}

/// The first SIGINT, SIGTERM or SIGHUP (those not inherited as ignored), with its number.
struct Signals {
    int: Option<tokio::signal::unix::Signal>,
    term: Option<tokio::signal::unix::Signal>,
    hup: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Result<Self, Failure> {
        let ignored = supervise::inherited_ignored();
        let install = |kind: SignalKind, sig: Signal| {
            if ignored.contains(&sig) {
                // Ignored by whoever started us (nohup): stays ignored, for the command too.
                return Ok(None);
            }
            signal(kind)
                .map(Some)
                .map_err(|e| Failure::new(exit::ERROR, format!("cannot handle signals: {e}")))
        };
        Ok(Signals {
            int: install(SignalKind::interrupt(), Signal::SIGINT)?,
            term: install(SignalKind::terminate(), Signal::SIGTERM)?,
            hup: install(SignalKind::hangup(), Signal::SIGHUP)?,
        })
    }

    async fn recv(&mut self) -> Signal {
        async fn on(signal: &mut Option<tokio::signal::unix::Signal>) {
            match signal {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = on(&mut self.int) => Signal::SIGINT,
            () = on(&mut self.term) => Signal::SIGTERM,
            () = on(&mut self.hup) => Signal::SIGHUP,
        }
    }
}

/// Waits for `fut`, giving up with exit code 75 at `deadline`, or 128+N on signal N.
async fn wait_granted<T>(
    what: &str,
    deadline: Option<Instant>,
    signals: &mut Signals,
    fut: impl std::future::Future<Output = baton::Result<T>>,
) -> Result<T, Failure> {
    let waiting = format!("waiting for {what}");
    tokio::select! {
        granted = before(deadline, &waiting, async { Ok(fut.await?) }) => granted,
        sig = signals.recv() => Err(interrupted(sig, &waiting)),
    }
}

/// A lock, a permit or a leadership, held.
enum Held {
    Lock(MutexGuard),
    Permit(SemaphorePermit),
    Lead(Leadership),
}

impl Held {
    fn key(&self) -> &str {
        match self {
            Held::Lock(g) => g.key(),
            Held::Permit(p) => p.key(),
            Held::Lead(l) => l.key(),
        }
    }

    fn token(&self) -> FencingToken {
        match self {
            Held::Lock(g) => g.fencing_token(),
            Held::Permit(p) => p.fencing_token(),
            Held::Lead(l) => l.fencing_token(),
        }
    }

    fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        let lost: futures::future::BoxFuture<'static, LostReason> = match self {
            Held::Lock(g) => Box::pin(g.lost()),
            Held::Permit(p) => Box::pin(p.lost()),
            Held::Lead(l) => Box::pin(l.lost()),
        };
        lost
    }

    /// Releases; the error, if any, as one line.
    async fn release(self) -> Result<(), Failure> {
        let released = match self {
            Held::Lock(g) => g.unlock().await,
            Held::Permit(p) => p.release().await,
            Held::Lead(l) => l.resign().await,
        };
        released.map_err(Failure::from)
    }
}

/// Writes one line to standard output; a closed output is exit code 141, like a pipe's
/// SIGPIPE, any other failure 74.
fn out(line: &str) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => {
                Failure::new(exit::BROKEN_PIPE, "standard output was closed")
            }
            _ => Failure::new(exit::IO, format!("cannot write standard output: {e}")),
        })
}

/// How a lock or leadership is held once granted.
struct Hold {
    what: String,
    verbose: bool,
    kill_after: Duration,
}

impl Hold {
    async fn run(
        self,
        held: Held,
        spec: Option<Spec>,
        signals: &mut Signals,
    ) -> Result<u8, Failure> {
        let Some(mut spec) = spec else {
            return self.hold_until_signal(held, signals).await;
        };
        let (key, token) = (held.key().to_owned(), held.token().to_string());
        if self.verbose {
            eprintln!(
                "baton: holding {} as {key} with fencing token {token}",
                self.what
            );
        }
        spec.env = vec![
            ("BATON_LOCK_KEY".into(), key.clone()),
            ("BATON_FENCING_TOKEN".into(), token.clone()),
            ("ETCD_LOCK_KEY".into(), key),
            ("ETCD_LOCK_REV".into(), token),
        ];
        supervise::become_supervisor();
        let mut group = Group::spawn(&spec, self.kill_after)?;
        let pgid = group.pgid();
        let lost = held.lost();
        tokio::pin!(lost);
        // After a signal is passed on: SIGKILL at this instant if the group is still there.
        let mut escalate: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
        let status = loop {
            let escalation = async {
                match escalate.as_mut() {
                    Some(at) => at.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                reason = &mut lost => {
                    eprintln!("baton: {} lost ({reason}); stopping `{}`", self.what, spec.program);
                    let stopped = group.stop(self.kill_after, async { signals.recv().await; }).await;
                    group.finish();
                    return Err(Failure::new(
                        exit::LOST,
                        format!("{} lost: {reason}; the command was stopped ({})", self.what, describe(stopped)),
                    ));
                }
                status = group.wait() => break status,
                sig = signals.recv() => {
                    if escalate.is_none() {
                        supervise::signal_group(pgid, sig);
                        escalate = Some(Box::pin(tokio::time::sleep(self.kill_after)));
                    } else {
                        // A second signal: stop now.
                        supervise::signal_group(pgid, Signal::SIGKILL);
                    }
                }
                () = escalation => {
                    supervise::signal_group(pgid, Signal::SIGKILL);
                    escalate = None;
                }
            }
        };
        group.finish();
        let code = exit_code(status);
        // The command's exit code is baton's, whatever the release meets.
        match tokio::time::timeout(Duration::from_secs(2), held.release()).await {
            Ok(Ok(())) => {}
            Ok(Err(f)) if f.code == exit::LOST => {
                eprintln!(
                    "baton: {} had been lost before the command ended: {}",
                    self.what, f.message
                );
            }
            Ok(Err(f)) => eprintln!("baton: releasing {}: {}", self.what, f.message),
            Err(_) => eprintln!(
                "baton: releasing {} timed out; it ends with the lease",
                self.what
            ),
        }
        Ok(code)
    }

    /// No command: print what etcdctl prints, then hold until a signal or a loss.
    async fn hold_until_signal(self, held: Held, signals: &mut Signals) -> Result<u8, Failure> {
        let printed = out(held.key()).and_then(|()| match &held {
            Held::Lock(g) => out(&g.fencing_token().to_string()),
            Held::Permit(p) => out(&p.fencing_token().to_string()),
            Held::Lead(l) => out(&String::from_utf8_lossy(l.value()))
                .and_then(|()| out(&l.fencing_token().to_string())),
        });
        if let Err(f) = printed {
            // Nobody reads us: let go at once.
            let _ = tokio::time::timeout(Duration::from_secs(2), held.release()).await;
            return Err(f);
        }
        let lost = held.lost();
        tokio::select! {
            _ = signals.recv() => {
                held.release().await?;
                Ok(0)
            }
            reason = lost => Err(Failure::new(exit::LOST, format!("{} lost: {reason}", self.what))),
        }
    }
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("it exited with {code}"),
        (None, Some(sig)) => format!("ended by signal {sig}"),
        _ => "it ended".to_owned(),
    }
}

fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(exit::ERROR),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(exit::ERROR),
        (None, None) => exit::ERROR,
    }
}

async fn listen_election(
    session: &Session,
    name: &str,
    json: bool,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let election = Election::new(session, name)?;
    let mut events = election.observe();
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = signals.recv() => return Ok(0),
        };
        match event {
            None => return Err(Failure::new(exit::ERROR, "the observer stopped")),
            Some(Err(e)) => eprintln!(
                "baton: observing `{name}`: {} (retrying)",
                one_line(&e.to_string())
            ),
            Some(Ok(event)) => match out(&render_event(&event, json)) {
                Ok(()) => {}
                // `baton elect --listen | head -1`: the reader has what it wanted.
                Err(f) if f.code == exit::BROKEN_PIPE => return Ok(0),
                Err(f) => return Err(f),
            },
        }
    }
}

fn render_event(event: &LeaderEvent, json: bool) -> String {
    let (kind, leader) = match event {
        LeaderEvent::Elected(l) => ("elected", Some(l)),
        LeaderEvent::Proclaimed(l) => ("proclaimed", Some(l)),
        LeaderEvent::Vacant => ("vacant", None),
        LeaderEvent::Skipped => ("skipped", None),
        _ => ("unknown", None),
    };
    match (json, leader) {
        (true, Some(l)) => format!(
            "{{\"event\":\"{kind}\",\"key\":{},\"value\":{},\"token\":{}}}",
            json_str(l.key()),
            json_str(&String::from_utf8_lossy(l.value())),
            l.token()
        ),
        (true, None) => format!("{{\"event\":\"{kind}\"}}"),
        (false, Some(l)) => one_line(&String::from_utf8_lossy(l.value())),
        (false, None) if kind == "skipped" => "(changes missed)".to_owned(),
        (false, None) => "(no leader)".to_owned(),
    }
}

async fn status(backend: &dyn Backend, name: &str, json: bool) -> Result<u8, Failure> {
    let entries = backend.entries(name).await?;
    // Names that nest share a queue (as with etcdctl): a key under `<name>/sub/` belongs to
    // the lock `<name>/sub`, yet `<name>` queues behind it. Say so rather than hide it.
    let prefix = format!("{name}/");
    let owner_name = |key: &str| -> String {
        key.strip_prefix(&prefix)
            .and_then(|rest| rest.rsplit_once('/'))
            .map_or_else(|| name.to_owned(), |(sub, _)| format!("{name}/{sub}"))
    };
    // Which recipe the queue belongs to decides who holds: a read-write lock's entries are
    // under `<name>/read/` and `<name>/write/`; a semaphore keeps its limit at `<name>`.
    let (reads, writes) = (format!("{name}/read"), format!("{name}/write"));
    let kind_of = |e: &baton::Entry| -> Option<&'static str> {
        let of = owner_name(e.key());
        (of == reads)
            .then_some("read")
            .or((of == writes).then_some("write"))
    };
    let rwlock = entries.iter().any(|e| kind_of(e).is_some());
    // Barriers and double barriers: every entry is in (a recipe tag `<lease>_<k>` each, and
    // no limit).
    let all_in = !entries.is_empty()
        && entries.iter().all(|e| {
            e.key()
                .rsplit('/')
                .next()
                .is_some_and(|tag| tag.contains('_'))
        });
    let limit = match backend.read(name).await? {
        Some(raw) => String::from_utf8_lossy(&raw)
            .parse::<u32>()
            .ok()
            .filter(|l| (1..=Semaphore::MAX_PERMITS).contains(l)),
        None => None,
    };
    let mut nested: Vec<String> = Vec::new();
    let mut rows = Vec::new();
    let (mut waiters, mut writer_ahead) = (0, false);
    for (i, e) in entries.iter().enumerate() {
        let ttl = match e.lease() {
            Some(lease) => backend.lease_ttl(lease).await?.map(|d| d.as_secs()),
            None => None,
        };
        let kind = if rwlock { kind_of(e) } else { None };
        let holds = match (kind, limit) {
            (Some("read"), _) => !writer_ahead,
            (Some(_), _) => i == 0,
            (None, Some(limit)) => i < limit as usize,
            (None, None) => all_in || i == 0,
        };
        writer_ahead |= kind == Some("write");
        let mut role = if holds {
            "holder".to_owned()
        } else {
            waiters += 1;
            format!("waiter{waiters}")
        };
        if let Some(kind) = kind {
            role.push_str(&format!("({kind})"));
        }
        let of = owner_name(e.key());
        if of != name && kind.is_none() {
            if !json {
                role.push('*');
            }
            if !nested.contains(&of) {
                nested.push(of.clone());
            }
        }
        let owner = String::from_utf8_lossy(e.value()).into_owned();
        let lease = e.lease().map(|l| l.to_hex());
        if json {
            out(&format!(
                "{{\"role\":{},\"position\":{i},\"name\":{},\"key\":{},\"token\":{},\"lease\":{},\"ttl\":{},\"owner\":{}}}",
                json_str(&role),
                json_str(&of),
                json_str(e.key()),
                e.token(),
                lease.as_deref().map_or("null".to_owned(), json_str),
                ttl.map_or("null".to_owned(), |t| t.to_string()),
                json_str(&owner),
            ))?;
        } else {
            rows.push([
                role,
                one_line(e.key()),
                e.token().get().to_string(),
                lease.unwrap_or_else(|| "-".to_owned()),
                ttl.map_or("-".to_owned(), |t| format!("{t}s")),
                one_line(&owner).chars().take(60).collect(),
            ]);
        }
    }
    if json {
        return Ok(0);
    }
    let header = ["ROLE", "KEY", "TOKEN", "LEASE", "TTL", "OWNER"].map(str::to_owned);
    let mut width = [0usize; 6];
    for row in std::iter::once(&header).chain(&rows) {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        out(format!(
            "{:<w0$}  {:<w1$}  {:>w2$}  {:>w3$}  {:>w4$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            row[4],
            row[5],
            w0 = width[0],
            w1 = width[1],
            w2 = width[2],
            w3 = width[3],
            w4 = width[4],
        )
        .trim_end())?;
    }
    if !nested.is_empty() {
        out(&format!(
            "* a key of the nested name {}: names that nest share a queue, so `{name}` waits behind it",
            one_line(&nested.join(", "))
        ))?;
    }
    Ok(0)
}

/// A JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_str("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
    }

    #[test]
    fn seconds_must_be_positive_numbers() {
        assert_eq!(seconds("1.5"), Ok(Duration::from_millis(1500)));
        assert!(seconds("0").is_err());
        assert_eq!(seconds_or_zero("0"), Ok(Duration::ZERO));
        assert!(seconds_or_zero("-1").is_err());
        assert!(seconds("-1").is_err());
        assert!(seconds("soon").is_err());
        assert!(seconds("inf").is_err());
    }

    #[test]
    fn cli_parses() {
        Cli::command_check();
    }

    impl Cli {
        fn command_check() {
            use clap::CommandFactory;
            Cli::command().debug_assert();
        }
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn word() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("lock".to_owned()),
            Just("elect".to_owned()),
            Just("status".to_owned()),
            Just("--".to_owned()),
            Just("--ttl".to_owned()),
            Just("--timeout".to_owned()),
            Just("--listen".to_owned()),
            Just("--json".to_owned()),
            Just("--endpoints".to_owned()),
            Just("--connect-timeout".to_owned()),
            Just("--cacert".to_owned()),
            Just("--cert".to_owned()),
            Just("--key".to_owned()),
            "-?[0-9]{0,3}(\\.[0-9]{0,2})?",
            ".{0,12}",
        ]
    }

    proptest! {
        /// Arbitrary command lines are parsed or refused, never a panic.
        #[test]
        fn any_command_line_is_parsed_or_refused(args in proptest::collection::vec(word(), 0..8)) {
            let _ = Cli::try_parse_from(std::iter::once("baton".to_owned()).chain(args));
        }

        #[test]
        fn any_duration_text_is_parsed_or_refused(text in ".{0,20}") {
            if let Ok(d) = seconds(&text) {
                prop_assert!(d > Duration::ZERO);
            }
        }
    }
}
