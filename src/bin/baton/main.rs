//! `baton`: locks and elections from the shell, compatible with `etcdctl lock` / `elect`.
//!
//! With a command, `baton` supervises it (see `supervise`): the command runs only while the
//! lock (or leadership) is held, as a whole process group, and baton returns its exit code.

mod closed_output;
mod operator;
mod sigstate;
mod supervise;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use baton::{
    Backend, ConnectOptions, Election, Endpoints, Error, FencingToken, LeaderEvent, Leadership,
    LostReason, Mutex, MutexGuard, RwLock, RwLockReadGuard, Semaphore, SemaphorePermit, Session,
    SessionOptions,
};
use clap::{Parser, Subcommand};
use futures::{FutureExt, StreamExt};
use nix::sys::signal::Signal;
use supervise::{Group, Spec};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

const EXIT_CODES: &str = "\
Exit codes:
  0    success; with a command, the command's own exit code (128+N if signal N ended it)
  1    unexpected error
  64   bad arguments
  69   the server cannot be reached (refused, no such host, no answer before --connect-timeout
       or --timeout), or a request failed after retries or its answer was lost: try again
       later
  74   standard output could not be written
  75   the lock is busy: --timeout elapsed while waiting for it, or --try found it held
  77   authentication failed (user and password, or a client certificate refused)
  78   the server does not match the configuration: https:// to a server without TLS (or
       the reverse), its certificate not trusted, --user for a server without authentication,
       a server too old or set up wrongly, another --layout, a permission the user lacks:
       fix the configuration
  79   the lock or leadership was lost (its key deleted, or its session lost), or renewals
       failed until its lease was about to expire; the command, if any, was stopped (79
       whatever the command returned)
  126  the command is not executable (checked before the lock is taken)
  127  the command was not found (checked before the lock is taken)
  141  standard output was closed (a broken pipe); the lock was released";

const COMMAND_HELP: &str = "\
The command runs in a process group of its own, started only once the lock is held, with the
signal dispositions and mask it would have had without baton (SIGPIPE at its default). It
ends with baton: if baton is killed (even with SIGKILL), a watchdog sends the whole group
SIGTERM, then SIGKILL after --kill-after or a third of --ttl, whichever is shorter, so it is
gone before the lock can pass on; on Linux the kernel kills the command itself at once. If
baton is stopped (SIGSTOP) or starved, the watchdog does the same by the lease's deadline.
SIGINT, SIGTERM and SIGHUP sent to baton are passed to the whole group (and SIGKILL follows
after --kill-after if it does not end; a second signal sends it at once); SIGTERM and SIGHUP
inherited as ignored (nohup) stay ignored; SIGINT inherited as ignored (a script's `baton
... &`) still stops baton, which passes SIGTERM on. If renewals fail, the group gets SIGTERM
a third of --ttl (or --kill-after, if shorter) before the session's deadline and SIGKILL at
it, so it is gone before the lease can expire; baton then exits with 79.
The lock is released only once every process of the group is gone; if the command exits
first, baton says on standard error what it waits for. Processes that leave the group on
purpose (setsid, a daemon) are not covered. At a terminal, the command's group gets the
terminal, so one Ctrl-C reaches it once; baton takes it back when the command exits, and a
Ctrl-C then reaches baton (after a Ctrl-C that ended the command, the next one kills what it
left).

With a command nothing is written to standard output but the command's own output; the key
and token are in BATON_LOCK_KEY and BATON_FENCING_TOKEN (and ETCD_LOCK_KEY, ETCD_LOCK_REV for
etcdctl compatibility), and on standard error with -v.";

/// The heading of the options every subcommand takes, shown after the subcommand's own.
const GLOBAL: &str = "Global options";

/// The end of `lock -h` and `elect -h`: the rules are in `--help`.
const SEE_LONG_HELP: &str =
    "How the command is supervised (signals, loss, the terminal) and the exit codes: --help";

/// Exit codes, as documented in `EXIT_CODES` and docs/cli.md.
mod exit {
    pub(crate) const ERROR: u8 = 1;
    pub(crate) const USAGE: u8 = 64;
    pub(crate) const UNAVAILABLE: u8 = 69;
    pub(crate) const IO: u8 = 74;
    pub(crate) const TIMEOUT: u8 = 75;
    pub(crate) const AUTH: u8 = 77;
    pub(crate) const CONFIG: u8 = 78;
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
    about = "Fair distributed locks and leader election on etcd, Redis, ZooKeeper or PostgreSQL",
    after_help = EXIT_CODES
)]
struct Cli {
    /// Where the locks live: etcd endpoints, comma-separated (host:port or http(s)://host:port),
    /// one Redis URL (redis://[user:password@]host:port[/db]), a ZooKeeper connect string
    /// (zk://host:port[,host:port...][/chroot]), or one PostgreSQL URL
    /// (postgres://[user:password@]host[:port]/db).
    #[arg(
        long,
        env = "BATON_ENDPOINTS",
        default_value = "127.0.0.1:2379",
        value_delimiter = ',',
        global = true,
        help_heading = GLOBAL,
        value_name = "HOST:PORT,...|redis://HOST:PORT|zk://HOST:PORT,...|postgres://HOST/DB"
    )]
    endpoints: Vec<String>,
    /// User name for etcd authentication (with --password; Redis takes it in the URL).
    #[arg(long, env = "BATON_USER", global = true, help_heading = GLOBAL)]
    user: Option<String>,
    /// Password for etcd authentication (with --user). Not passed on to the command.
    #[arg(long, env = "BATON_PASSWORD", hide_env_values = true, global = true, help_heading = GLOBAL)]
    password: Option<String>,
    /// etcd, Redis or PostgreSQL over TLS: the CA bundle (PEM) that signed the servers'
    /// certificates, instead of the system's roots. Turns TLS on for etcd's host:port endpoints
    /// (https:// is TLS anyway); Redis takes it with rediss:// only, PostgreSQL with
    /// sslmode=verify-full, verify-ca or require in its URL.
    #[arg(long, env = "BATON_CACERT", global = true, help_heading = GLOBAL, value_name = "FILE")]
    cacert: Option<PathBuf>,
    /// etcd, Redis or PostgreSQL over TLS: the client certificate (PEM) for a server that asks
    /// for one (etcd's --client-cert-auth, Redis's tls-auth-clients, PostgreSQL's clientcert=
    /// or cert authentication); with --key.
    #[arg(long, env = "BATON_CERT", global = true, help_heading = GLOBAL, value_name = "FILE")]
    cert: Option<PathBuf>,
    /// etcd, Redis or PostgreSQL over TLS: the private key (PEM) of the --cert certificate.
    #[arg(long, env = "BATON_KEY", global = true, help_heading = GLOBAL, value_name = "FILE")]
    key: Option<PathBuf>,
    /// Seconds to wait for an endpoint to answer.
    #[arg(long, default_value = "5", value_parser = seconds, global = true, help_heading = GLOBAL, allow_negative_numbers = true)]
    connect_timeout: Duration,
    /// Redis and PostgreSQL: seconds after baton's state may have been lost or rolled back
    /// (Redis: a restart, a failover, a flush, a new server; PostgreSQL: a new WAL timeline, a
    /// promoted standby) during which nothing is granted (at least the longest --ttl of any
    /// client; see docs/redis.md, docs/postgres.md).
    #[arg(long, default_value = "60", value_parser = seconds_or_zero, global = true, help_heading = GLOBAL, value_name = "SECONDS")]
    restart_grace: Duration,
    /// ZooKeeper only: whose node names the lock entries take, to share locks with
    /// applications using that library: Curator's InterProcessMutex (the default) or kazoo's
    /// Lock (docs/zookeeper.md).
    #[arg(long, value_enum, env = "BATON_LAYOUT", global = true, help_heading = GLOBAL)]
    layout: Option<Layout>,
    /// Also print the key and fencing token on standard error when running a command.
    #[arg(short, long, global = true, help_heading = GLOBAL)]
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
    #[command(after_help = SEE_LONG_HELP, after_long_help = format!("{COMMAND_HELP}\n\n{EXIT_CODES}"))]
    Lock {
        /// The lock name (keys are `<name>/<lease id hex>`, as `etcdctl lock`). Names that
        /// nest share a queue: `job` waits behind `job/sub`.
        name: String,
        /// Session TTL in seconds: how long the lock survives this process dying.
        #[arg(long, default_value = "10", value_parser = ttl_seconds, allow_negative_numbers = true)]
        ttl: Duration,
        /// Give up after this many seconds, connecting included: exit 75 if the lock was
        /// still held by others, 69 if the backend was not reached (connected, a session
        /// started) in that time.
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
        /// Hold the lock shared, like `flock -s` (the read side of the library's RwLock):
        /// holders with --shared hold together; a plain `baton lock` on the name (or
        /// `etcdctl lock`, a library Mutex) excludes them and they exclude it, in arrival
        /// order. Keys are `<name>/read/<lease id hex>_<k>`.
        #[arg(long, conflicts_with = "permits")]
        shared: bool,
        /// Report each event (waiting, acquired, lost, released, exit) as one JSON object
        /// per line: on standard error with a command, on standard output without one.
        #[arg(long)]
        json: bool,
        /// Seconds between SIGTERM and SIGKILL when the command must be stopped. If baton
        /// itself is killed, at most a third of --ttl: the command is gone before the lock
        /// can pass to another holder.
        #[arg(long, default_value = "10", value_parser = seconds, allow_negative_numbers = true)]
        kill_after: Duration,
        /// The command to run while holding the lock.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Campaign in an election; lead until a signal, or run a command while leading; or
    /// observe the election with --listen.
    #[command(after_help = SEE_LONG_HELP, after_long_help = format!("{COMMAND_HELP}\n\n{EXIT_CODES}"))]
    Elect {
        /// The election name.
        name: String,
        /// The value to lead with (not with --listen).
        #[arg(required_unless_present = "listen", conflicts_with = "listen")]
        proposal: Option<String>,
        /// Print one line per leader event instead of campaigning.
        #[arg(short, long)]
        listen: bool,
        /// JSON lines: with --listen, the leader events; else each event of the campaign
        /// (waiting, acquired, lost, released, exit), on standard error with a command, on
        /// standard output without one.
        #[arg(long)]
        json: bool,
        /// Session TTL in seconds.
        #[arg(long, default_value = "10", value_parser = ttl_seconds, allow_negative_numbers = true)]
        ttl: Duration,
        /// Give up after this many seconds, connecting included: exit 75 if another still
        /// led, 69 if the backend was not reached (connected, a session started) in that
        /// time.
        #[arg(long, value_parser = seconds, allow_negative_numbers = true)]
        timeout: Option<Duration>,
        /// Seconds between SIGTERM and SIGKILL when the command must be stopped. If baton
        /// itself is killed, at most a third of --ttl: the command is gone before the lock
        /// can pass to another holder.
        #[arg(long, default_value = "10", value_parser = seconds, allow_negative_numbers = true)]
        kill_after: Duration,
        /// The command to run while leading.
        #[arg(last = true, conflicts_with = "listen")]
        command: Vec<String>,
    },
    /// Show the queue of a lock or election: holders, then waiters in order, with each
    /// one's lease, remaining TTL, host, process and since when it queued.
    #[command(after_help = EXIT_CODES)]
    Status {
        /// The lock or election name.
        name: String,
        /// JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// List every lock, election, semaphore and barrier with entries: its holders, how many
    /// wait, who holds and since when.
    #[command(after_help = EXIT_CODES)]
    Ls {
        /// Only names that start with this (default: every name).
        prefix: Option<String>,
        /// JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// End the lease of a lock's holder (a stale holder), so that the next waiter is
    /// granted; the holder is told, and a `baton lock` holding it stops its command. Prints
    /// an audit line (what was broken, whose, which token, by whom, when). Refused while the
    /// holder's lease is live (exit 75) unless --force.
    #[command(name = "break", after_help = EXIT_CODES)]
    Break {
        /// The lock or election name.
        name: String,
        /// End the holder's lease even while it is live (the holder may be working: its
        /// writes are refused only by a resource that checks fencing tokens).
        #[arg(long)]
        force: bool,
        /// The audit line as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Mark the store as baton's, so that its first use waits no restart grace: for a store
    /// you know is new, or whose every baton client has stopped. A store baton has never
    /// marked is otherwise taken for one that may have lost its state, and nothing is
    /// granted on it until --restart-grace has passed (docs/guarantees.md).
    #[command(after_help = EXIT_CODES)]
    Init {
        /// The outcome as JSON.
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
            Error::InvalidArgument(_)
            | Error::InvalidInput { .. }
            | Error::LimitMismatch { .. } => exit::USAGE,
            Error::Connect { .. }
            | Error::Backend { .. }
            | Error::OutcomeUnknown { .. }
            | Error::Unavailable => exit::UNAVAILABLE,
            Error::Auth { .. } => exit::AUTH,
            // The credentials were accepted: the role lacks a grant, which is the server's
            // configuration to fix (sysexits' EX_CONFIG), not a failed authentication.
            Error::Permission { .. }
            | Error::ForeignSchema { .. }
            | Error::Misconfigured { .. }
            | Error::UnsupportedVersion { .. }
            | Error::ServerSetting { .. }
            | Error::ForeignLayout { .. } => exit::CONFIG,
            Error::Locked { .. } | Error::RestartGrace { .. } => exit::TIMEOUT,
            Error::SessionLost(_)
            | Error::EntryGone { .. }
            | Error::NotOwner { .. }
            | Error::LeadershipLost { .. } => exit::LOST,
            _ => exit::ERROR,
        };
        Failure::new(code, one_line(&in_flags(&explain(&e))))
    }
}

/// The error and its causes, on one line: a cause that repeats what was said already (an
/// operating system's "Connection refused (os error 111)" after baton's "connection refused")
/// is left out, and of an etcd request's gRPC status only its message is kept.
fn explain(e: &Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let text = match cause.downcast_ref::<baton::etcd_client::Error>() {
            // etcd with authentication on, asked without a user: its words name no flag.
            Some(baton::etcd_client::Error::GRpcStatus(status))
                if status.message().contains("user name is empty") =>
            {
                "the server has authentication on and no user was given: give --user and \
                 --password (or BATON_USER and BATON_PASSWORD)"
                    .to_owned()
            }
            Some(baton::etcd_client::Error::GRpcStatus(status)) => status.message().to_owned(),
            _ => cause.to_string(),
        };
        let said = message.to_lowercase();
        let plain = text
            .split(" (os error")
            .next()
            .unwrap_or(&text)
            .to_lowercase();
        if !said.contains(&plain) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

/// The library's words for its options, as the command's flags (the library's messages name
/// the `EtcdOptions` / `ConnectOptions` setters).
const FLAGS: [(&str, &str); 7] = [
    ("the certificate of with_client_cert", "--cert"),
    ("the key of with_client_cert", "--key"),
    ("with_client_cert", "--cert and --key"),
    ("with_ca_cert", "--cacert"),
    (
        "name the host it is issued for: with_tls_server_name",
        "reach the server by a name it is issued for, in --endpoints",
    ),
    ("with_user", "--user and --password"),
    ("with_connect_timeout", "--connect-timeout"),
];

/// `text` with the library's option names replaced by the command's flags.
fn in_flags(text: &str) -> String {
    FLAGS
        .iter()
        .fold(text.to_owned(), |text, (api, flag)| text.replace(api, flag))
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

/// clap's rendering of a usage error, on one line, like every other error of baton: its first
/// paragraph (the message, and what it lists on the lines below, e.g. the missing
/// arguments), then where to read more (`baton status --help`, from the usage line).
fn usage_error(rendered: &str) -> String {
    let first = rendered.split("\n\n").next().unwrap_or_default();
    let said = first
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let said = said.trim_start_matches("error: ");
    let said = if said.is_empty() {
        "bad arguments"
    } else {
        said
    };
    let command = rendered
        .lines()
        .find_map(|l| l.trim().strip_prefix("Usage: "))
        .map(|usage| {
            usage
                .split_whitespace()
                .take_while(|w| !w.starts_with(['[', '<']))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|c| c.starts_with("baton"))
        .unwrap_or_else(|| "baton".to_owned());
    format!("{} (see `{command} --help`)", one_line(said))
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
    if let Some(code) = supervise::hidden_step(&args) {
        return ExitCode::from(code);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            eprintln!("baton: {}", usage_error(&e.to_string()));
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
    let events = Events::of(&cli);
    let ended = runtime.block_on(run(cli, &events));
    if let Err(failure) = &ended {
        eprintln!("baton: {}", failure.message);
    }
    let code = match &ended {
        Ok(code) => *code,
        Err(failure) => failure.code,
    };
    let mut exit = vec![("code", code.to_string())];
    if let Err(failure) = &ended {
        exit.push(("message", json_str(&failure.message)));
    }
    // The last line; a reader that is gone cannot be told.
    let _ = events.emit("exit", &exit);
    ExitCode::from(code)
}

/// Where `--json` events go: standard error when a command runs (standard output is the
/// command's), standard output without one.
#[derive(Debug, Clone, Copy)]
enum EventStream {
    Stdout,
    Stderr,
}

/// `--json` of `lock` and `elect` (not `--listen`): one JSON object per line for each event
/// of the lock or leadership, each naming it (docs/cli.md). Off, it writes nothing.
#[derive(Debug, Clone)]
struct Events {
    to: Option<EventStream>,
    /// The lock or election, as JSON.
    name: String,
}

impl Events {
    fn of(cli: &Cli) -> Events {
        let (on, name, with_command) = match &cli.command {
            Command::Lock {
                json,
                name,
                command,
                ..
            }
            | Command::Elect {
                json,
                listen: false,
                name,
                command,
                ..
            } => (*json, name.as_str(), !command.is_empty()),
            _ => (false, "", false),
        };
        Events {
            to: on.then_some(if with_command {
                EventStream::Stderr
            } else {
                EventStream::Stdout
            }),
            name: json_str(name),
        }
    }

    /// Whether the events are baton's standard output (no command): they replace the key and
    /// token lines.
    fn on_stdout(&self) -> bool {
        matches!(self.to, Some(EventStream::Stdout))
    }

    /// `{"event":<event>,"name":<name>,<fields>}`, each field's value already JSON. On
    /// standard output, a write that fails is the failure `out` makes of it (141, 74).
    fn emit(&self, event: &str, fields: &[(&str, String)]) -> Result<(), Failure> {
        let Some(to) = self.to else { return Ok(()) };
        let mut line = format!("{{\"event\":{},\"name\":{}", json_str(event), self.name);
        for (key, value) in fields {
            line.push_str(&format!(",{}:{value}", json_str(key)));
        }
        line.push('}');
        match to {
            EventStream::Stdout => out(&line),
            EventStream::Stderr => {
                // Not `eprintln!`, which panics when the reader is gone: the events are not
                // worth baton's life (nor the command's).
                let _ = writeln!(std::io::stderr(), "{line}");
                Ok(())
            }
        }
    }

    /// The lock or leadership is held: its key and token (and a leader's value).
    fn acquired(&self, held: &Held) -> Result<(), Failure> {
        let mut fields = vec![
            ("key", json_str(held.key())),
            ("token", held.token().to_string()),
        ];
        if let Held::Lead(l) = held {
            fields.push(("value", json_str(&String::from_utf8_lossy(l.value()))));
        }
        self.emit("acquired", &fields)
    }

    /// It was lost, and why.
    fn lost(&self, reason: &str) {
        let _ = self.emit("lost", &[("reason", json_str(reason))]);
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

/// --cacert, --cert and --key: for etcd, Redis or PostgreSQL, cert and key together, the files
/// readable. (PostgreSQL's URL must ask for TLS: the library says so.)
fn tls_files(cli: &Cli, endpoints: &Endpoints) -> Result<TlsFiles, Failure> {
    let any = cli.cacert.is_some() || cli.cert.is_some() || cli.key.is_some();
    if any && matches!(endpoints, Endpoints::ZooKeeper(_)) {
        return Err(Failure::new(
            exit::USAGE,
            "--cacert, --cert and --key are for etcd, Redis (rediss://) and PostgreSQL; baton's \
             ZooKeeper backend does not take them",
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
    if endpoints == Endpoints::Memory {
        return Err(Failure::new(
            exit::USAGE,
            "--endpoints: memory:// is an in-process store; no other process would see its locks",
        ));
    }
    if cli.layout.is_some() && !matches!(endpoints, Endpoints::ZooKeeper(_)) {
        return Err(Failure::new(
            exit::USAGE,
            "--layout is for ZooKeeper endpoints (zk://) only",
        ));
    }
    if cli.user.is_some() && !matches!(endpoints, Endpoints::Etcd(_)) {
        return Err(Failure::new(
            exit::USAGE,
            "--user and --password are for etcd; Redis and PostgreSQL take credentials in their URL (redis://user:password@host:port, postgres://user:password@host/db)",
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
        Command::Status { name, .. } | Command::Break { name, .. } => (name, &[][..]),
        Command::Ls { .. } | Command::Init { .. } => return Ok(Checked { spec: None, tls }),
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

/// Waits for `fut` until `deadline`, then fails with `code`: 75 (busy) while waiting for the
/// lock, 69 (unreachable) before it was asked for (connecting, starting a session).
async fn before<T>(
    deadline: Option<Instant>,
    code: u8,
    what: &str,
    fut: impl std::future::Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    match deadline {
        Some(at) => tokio::time::timeout_at(at, fut)
            .await
            .map_err(|_| Failure::new(code, format!("timed out {what} (--timeout)")))?,
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
    // A --timeout that ends while connecting means the server could not be reached in the
    // time given, not that the lock is busy: exit 69, as the connect timeout does.
    before(deadline, exit::UNAVAILABLE, &what, async {
        Ok(baton::connect_with(&endpoints, options).await?)
    })
    .await
}

async fn run(cli: Cli, events: &Events) -> Result<u8, Failure> {
    let Checked { spec, tls } = validate(&cli)?;
    let mut signals = Signals::new()?;
    let deadline = match &cli.command {
        Command::Lock { timeout, .. } | Command::Elect { timeout, .. } => {
            timeout.map(|t| Instant::now() + t)
        }
        Command::Status { .. }
        | Command::Ls { .. }
        | Command::Break { .. }
        | Command::Init { .. } => None,
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
            shared,
            kill_after,
            ..
        } => {
            let session = session(backend, ttl, deadline).await?;
            // What `baton status` shows of this holder: host, process, since when it queued.
            let since = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            let (pid, secs) = (std::process::id(), ttl.as_secs());
            let owner = match operator::baton_host() {
                Some(host) => format!("baton-cli host={host} pid={pid} since={since} ttl={secs}"),
                None => format!("baton-cli pid={pid} since={since} ttl={secs}"),
            };
            let what = match (permits, shared) {
                (Some(n), _) => format!("a permit of `{name}` ({n} permits)"),
                (None, true) => format!("shared lock `{name}`"),
                (None, false) => format!("lock `{name}`"),
            };
            let busy = |e| match e {
                Error::Locked { .. } => Failure::new(
                    exit::TIMEOUT,
                    format!("{what} is held or contended (--try)"),
                ),
                Error::RestartGrace { left, .. } => Failure::new(
                    exit::TIMEOUT,
                    format!(
                        "{what} cannot be granted for {:.1} s more (--try): the store is in a new epoch (it lost or rolled back baton's state, or baton had never marked it), and nothing is granted until the restart grace has passed (--restart-grace); an operator who knows the store is new marks it with `baton init`",
                        left.as_secs_f64()
                    ),
                ),
                other => other.into(),
            };
            if !try_once {
                events.emit("waiting", &[])?;
            }
            let granted = match permits {
                None if shared => {
                    let lock = RwLock::new(&session, &name)?.with_owner_info(owner);
                    if try_once {
                        lock.try_read().await.map_err(busy)
                    } else {
                        wait_granted(&what, deadline, &mut signals, lock.read()).await
                    }
                    .map(Held::Read)
                }
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
                        ttl: ttl.min(session.ttl()),
                        session: session.clone(),
                        events: events.clone(),
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
                    events.emit("waiting", &[])?;
                    match wait_granted(&what, deadline, &mut signals, election.campaign(proposal))
                        .await
                    {
                        Ok(leadership) => {
                            let hold = Hold {
                                what,
                                verbose,
                                kill_after,
                                ttl: ttl.min(session.ttl()),
                                session: session.clone(),
                                events: events.clone(),
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
        Command::Status { name, json } => operator::status(&*backend, &name, json).await,
        Command::Ls { prefix, json } => {
            operator::ls(&*backend, prefix.as_deref().unwrap_or(""), json).await
        }
        Command::Break { name, force, json } => {
            operator::break_holders(&*backend, &name, force, json).await
        }
        Command::Init { json } => operator::init(&*backend, json).await,
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
    before(deadline, exit::UNAVAILABLE, "starting a session", async {
        Ok(Session::with_options(backend, SessionOptions::new().with_ttl(ttl)).await?)
    })
    .await
}

fn interrupted(sig: Signal, what: &str) -> Failure {
    Failure::new(
        u8::try_from(128 + sig as i32).unwrap_or(exit::ERROR),
        format!("interrupted by {sig} while {what}"),
    )
}

/// The first SIGINT, SIGTERM or SIGHUP, with its number: SIGTERM and SIGHUP unless inherited
/// as ignored (`nohup`); SIGINT always, as `etcdctl lock` does, since a shell starts its
/// background jobs (`baton lock x &`) with SIGINT ignored and `kill -INT $!` must still stop
/// them (docs/design.md, 2026-11-25).
struct Signals {
    int: Option<tokio::signal::unix::Signal>,
    term: Option<tokio::signal::unix::Signal>,
    hup: Option<tokio::signal::unix::Signal>,
    /// The caller ignored SIGINT: so does the command, and SIGTERM is passed on instead.
    int_ignored: bool,
}

impl Signals {
    fn new() -> Result<Self, Failure> {
        let ignored = supervise::inherited_ignored();
        let install = |kind: SignalKind, sig: Signal| {
            if ignored.contains(&sig) && sig != Signal::SIGINT {
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
            int_ignored: ignored.contains(&Signal::SIGINT),
        })
    }

    /// The signal to pass on to the command's group for `sig`: `sig` itself, but SIGTERM for
    /// a SIGINT the command started ignoring (as it would have without baton).
    fn passed_on(&self, sig: Signal) -> Signal {
        if sig == Signal::SIGINT && self.int_ignored {
            Signal::SIGTERM
        } else {
            sig
        }
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
        granted = before(deadline, exit::TIMEOUT, &waiting, async { Ok(fut.await?) }) => granted,
        sig = signals.recv() => Err(interrupted(sig, &waiting)),
    }
}

/// A lock, a permit or a leadership, held.
enum Held {
    Lock(MutexGuard),
    Read(RwLockReadGuard),
    Permit(SemaphorePermit),
    Lead(Leadership),
}

impl Held {
    fn key(&self) -> &str {
        match self {
            Held::Lock(g) => g.key(),
            Held::Read(g) => g.key(),
            Held::Permit(p) => p.key(),
            Held::Lead(l) => l.key(),
        }
    }

    fn token(&self) -> FencingToken {
        match self {
            Held::Lock(g) => g.fencing_token(),
            Held::Read(g) => g.fencing_token(),
            Held::Permit(p) => p.fencing_token(),
            Held::Lead(l) => l.fencing_token(),
        }
    }

    /// The entry's place in its queue: etcd's create revision, `ETCD_LOCK_REV` as etcdctl
    /// exports it (the token carries the store epoch above it).
    fn position(&self) -> u64 {
        let entry = match self {
            Held::Lock(g) => g.entry(),
            Held::Read(g) => g.entry(),
            Held::Permit(p) => p.entry(),
            Held::Lead(l) => l.entry(),
        };
        entry.position().get()
    }

    fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        let lost: futures::future::BoxFuture<'static, LostReason> = match self {
            Held::Lock(g) => Box::pin(g.lost()),
            Held::Read(g) => Box::pin(g.lost()),
            Held::Permit(p) => Box::pin(p.lost()),
            Held::Lead(l) => Box::pin(l.lost()),
        };
        lost
    }

    /// Releases; the error, if any, as one line.
    async fn release(self) -> Result<(), Failure> {
        let released = match self {
            Held::Lock(g) => g.release().await,
            Held::Read(g) => g.release().await,
            Held::Permit(p) => p.release().await,
            Held::Lead(l) => l.release().await,
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

/// How much earlier than the watchdog baton decides that the deadline it told is the one that
/// counts: a newer deadline told later than this might reach the watchdog after it acted.
const TELL_SLACK: Duration = Duration::from_millis(10);

/// The session's deadline as the watchdog knows it, and when the group must be stopped for
/// it. baton and the watchdog stop the group on the same deadline, the last one baton told:
/// baton once no renewal has moved it `grace` before it (renewals failing), the watchdog when
/// baton told no newer one by then (baton stopped or starved). Healthy renewals move the
/// deadline two thirds of the TTL ahead each third of the TTL, and `grace` is at most a third,
/// so a renewal is told with a third of the TTL to spare.
struct Told {
    deadline: tokio::time::Instant,
    grace: Duration,
}

impl Told {
    /// When the group gets SIGTERM unless a newer deadline is told.
    fn stop_at(&self) -> tokio::time::Instant {
        self.deadline
            .checked_sub(self.grace)
            .unwrap_or(self.deadline)
    }

    /// When baton looks a last time for a newer deadline before it stops the group.
    fn last_look(&self) -> tokio::time::Instant {
        let at = self.stop_at();
        at.checked_sub(2 * TELL_SLACK).unwrap_or(at)
    }

    /// Whether a deadline told now still reaches the watchdog before it acts.
    fn in_time(&self) -> bool {
        tokio::time::Instant::now() + TELL_SLACK < self.stop_at()
    }

    /// Tells `group`'s watchdog the session's deadline if a renewal moved it and it is not too
    /// late to; whether it did.
    fn update(&mut self, session: &Session, group: &mut Group) -> bool {
        let current = session.deadline();
        if tokio::time::Instant::from_std(current) <= self.deadline || !self.in_time() {
            return false;
        }
        self.deadline = tokio::time::Instant::from_std(current);
        group.tell_deadline(current);
        true
    }
}

/// How a lock or leadership is held once granted.
struct Hold {
    what: String,
    verbose: bool,
    kill_after: Duration,
    /// The TTL asked for or granted, the shorter: bounds how long the group may outlive a
    /// killed baton.
    ttl: Duration,
    /// The session the lock is held on: its deadline says when renewals have failed for too
    /// long.
    session: Session,
    /// `--json`.
    events: Events,
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
        self.events.acquired(&held)?;
        spec.env = vec![
            ("BATON_LOCK_KEY".into(), key.clone()),
            ("BATON_FENCING_TOKEN".into(), token.clone()),
            ("ETCD_LOCK_KEY".into(), key),
            ("ETCD_LOCK_REV".into(), held.position().to_string()),
        ];
        supervise::become_supervisor();
        let orphan_grace = supervise::orphan_grace(self.kill_after, self.ttl);
        let deadline = self.session.deadline();
        let mut group = Group::spawn(&spec, orphan_grace, deadline)?;
        let pgid = group.pgid();
        let lost = held.lost();
        tokio::pin!(lost);
        // Renewals failing (or baton not running to tell the watchdog of them): the group is
        // told to stop `orphan_grace` before the session's deadline and killed at it, so that
        // it is gone before the server can expire the lease (which is no sooner than the
        // deadline) and grant the lock to someone else.
        let mut told = Told {
            deadline: tokio::time::Instant::from_std(deadline),
            grace: orphan_grace,
        };
        let mut at_risk = Box::pin(tokio::time::sleep_until(told.last_look()));
        // How often a renewal is looked for, to tell the watchdog: well within the third of the
        // TTL a renewal leaves before the group would be stopped.
        let every = (self.ttl / 12).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut renewals = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        renewals.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut warned = false;
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
                    self.events.lost(&reason.to_string());
                    // Told to stop already (at risk): what is left is killed now. Else (a
                    // loss the server reported) the grace is the one a killed baton gives.
                    let grace = if warned { Duration::ZERO } else { orphan_grace };
                    let stopped = group.stop(grace, async { signals.recv().await; }).await;
                    group.finish();
                    return Err(Failure::new(
                        exit::LOST,
                        format!("{} lost: {reason}; the command was stopped (`{}` {})", self.what, spec.program, describe(stopped)),
                    ));
                }
                // Before the group's end: a baton that ran late (stopped) learns first that the
                // watchdog has stopped the group for it.
                () = &mut at_risk, if !warned => {
                    if told.update(&self.session, &mut group) {
                        at_risk.as_mut().reset(told.last_look());
                        continue;
                    }
                    warned = true;
                    let deadline = told.deadline;
                    eprintln!(
                        "baton: renewing {} has failed for {:.1} s; stopping `{}` (SIGTERM, then SIGKILL in {:.1} s) before the lease can expire",
                        self.what,
                        (self.ttl.saturating_sub(deadline.saturating_duration_since(tokio::time::Instant::now()))).as_secs_f64(),
                        spec.program,
                        deadline.saturating_duration_since(tokio::time::Instant::now()).as_secs_f64(),
                    );
                    supervise::signal_group(pgid, Signal::SIGTERM);
                    group.note_signalled();
                    // SIGKILL at the deadline, or sooner if a signal passed on asked for it.
                    let kill_at = escalate.as_ref().map_or(deadline, |e| e.deadline().min(deadline));
                    escalate = Some(Box::pin(tokio::time::sleep_until(kill_at)));
                }
                status = group.wait() => break status,
                _ = renewals.tick(), if !warned => {
                    if told.update(&self.session, &mut group) {
                        at_risk.as_mut().reset(told.last_look());
                    }
                }
                sig = signals.recv() => {
                    if !group.interrupted() {
                        supervise::signal_group(pgid, signals.passed_on(sig));
                        group.note_signalled();
                        escalate = Some(Box::pin(tokio::time::sleep(self.kill_after)));
                    } else {
                        // A second signal (the first may have been the terminal's Ctrl-C
                        // that ended the command): stop now.
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
        // Stopped because renewals failed (or lost in the same instant): the lock is lost or
        // about to be, whatever the command returned (a command that handles SIGTERM exits
        // with a code of its own), and a release would only wait on a server that does not
        // answer. Exit 79 now; the lease ends by itself.
        let lost_now = (&mut lost).now_or_never();
        if warned || lost_now.is_some() {
            let why = lost_now.map_or_else(
                || "renewals failed until the lease was about to expire".to_owned(),
                |reason| reason.to_string(),
            );
            self.events.lost(&why);
            return Err(Failure::new(
                exit::LOST,
                format!(
                    "{} lost: {why}; the command was stopped (`{}` {})",
                    self.what,
                    spec.program,
                    describe(status)
                ),
            ));
        }
        let code = exit_code(status);
        // The command's exit code is baton's, whatever the release meets.
        match tokio::time::timeout(Duration::from_secs(2), held.release()).await {
            Ok(Ok(())) => {
                let _ = self.events.emit("released", &[]);
            }
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
        let printed = if self.events.on_stdout() {
            self.events.acquired(&held)
        } else {
            out(held.key())
                .and_then(|()| match &held {
                    Held::Lead(l) => out(&one_line(&String::from_utf8_lossy(l.value()))),
                    _ => Ok(()),
                })
                .and_then(|()| out(&held.token().to_string()))
        };
        if let Err(f) = printed {
            // Nobody reads us: let go at once.
            let _ = tokio::time::timeout(Duration::from_secs(2), held.release()).await;
            return Err(f);
        }
        let lost = held.lost();
        tokio::select! {
            _ = signals.recv() => {
                held.release().await?;
                self.events.emit("released", &[])?;
                Ok(0)
            }
            reason = lost => {
                self.events.lost(&reason.to_string());
                Err(Failure::new(exit::LOST, format!("{} lost: {reason}", self.what)))
            }
            // `baton lock x | head -1`: nobody reads us any more; let go now, not at the
            // next write (there is none).
            () = closed_output::closed() => {
                let _ = tokio::time::timeout(Duration::from_secs(2), held.release()).await;
                Err(Failure::new(
                    exit::BROKEN_PIPE,
                    format!("standard output was closed; {} released", self.what),
                ))
            }
        }
    }
}

/// How a process ended, to follow its name: "exited with 3", "ended by signal 9".
fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with {code}"),
        (None, Some(sig)) => format!("ended by signal {sig}"),
        _ => "ended".to_owned(),
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
    let closed = closed_output::closed();
    tokio::pin!(closed);
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = signals.recv() => return Ok(0),
            // `baton elect --listen x | head -1`: the reader has what it wanted.
            () = &mut closed => return Ok(0),
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
            l.fencing_token()
        ),
        (true, None) => format!("{{\"event\":\"{kind}\"}}"),
        (false, Some(l)) => one_line(&String::from_utf8_lossy(l.value())),
        (false, None) if kind == "skipped" => "(changes missed)".to_owned(),
        (false, None) => "(no leader)".to_owned(),
    }
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

    /// Issue #38: a permission the role lacks is the server's configuration to fix (78),
    /// not a failed authentication (77); a URL that does not parse is a bad argument (64),
    /// not an unreachable server (69); a schema of someone else's is configuration (78).
    #[test]
    fn permission_and_bad_urls_have_their_own_exit_codes() {
        let code = |e: Error| Failure::from(e).code;
        assert_eq!(
            code(Error::Permission {
                source: "no".into()
            }),
            exit::CONFIG
        );
        assert_eq!(
            code(Error::Auth {
                source: "no".into()
            }),
            exit::AUTH
        );
        let bad_url = Error::InvalidInput {
            what: "the PostgreSQL URL `postgres://h:70000/db` does not parse".into(),
            source: None,
        };
        assert_eq!(code(bad_url), exit::USAGE);
        let foreign = Error::ForeignSchema {
            schema: "app".into(),
        };
        assert_eq!(code(foreign), exit::CONFIG);
    }

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

    /// A request whose answer was lost (the server stopped answering mid-request) is "cannot
    /// reach the backend, try again later", as a request that failed is: not "unexpected".
    #[test]
    fn a_lost_answer_exits_as_unreachable() {
        let lost = Error::OutcomeUnknown {
            op: "enqueue",
            at: Default::default(),
            source: "deadline has elapsed".into(),
        };
        assert_eq!(Failure::from(lost).code, exit::UNAVAILABLE);
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
            Just("--shared".to_owned()),
            Just("-n".to_owned()),
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
