//! The command line: what `baton` takes (clap's definitions), the help texts, and the parsers
//! of its values.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::output::one_line;

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

/// The longest lease etcd grants (9,000,000,000 s).
const MAX_TTL: Duration = Duration::from_secs(9_000_000_000);

#[derive(Parser, Debug)]
#[command(
    name = "baton",
    version,
    about = "Fair distributed locks and leader election on etcd, Redis, ZooKeeper or PostgreSQL",
    after_help = EXIT_CODES
)]
pub(crate) struct Cli {
    /// Where the locks live: etcd endpoints, comma-separated (host:port or http(s)://host:port),
    /// one Redis URL (redis://[user:password@]host:port[/db]) or the Sentinels of one
    /// (redis+sentinel://[user:password@]host:port[,host:port...]/SERVICE[/db]; rediss+sentinel://
    /// over TLS; the Sentinels' password as ?sentinel_password=), a ZooKeeper connect string
    /// (zk://[user:password@]host:port[,host:port...][/chroot]; zks:// over TLS, with --cacert;
    /// user:password@ for SASL DIGEST-MD5), or one
    /// PostgreSQL URL
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
    pub(crate) endpoints: Vec<String>,
    /// User name for etcd authentication (with --password; Redis takes it in the URL).
    #[arg(long, env = "BATON_USER", global = true, help_heading = GLOBAL)]
    pub(crate) user: Option<String>,
    /// Password for etcd authentication (with --user). Not passed on to the command.
    #[arg(long, env = "BATON_PASSWORD", hide_env_values = true, global = true, help_heading = GLOBAL)]
    pub(crate) password: Option<String>,
    /// etcd, Redis, ZooKeeper or PostgreSQL over TLS: the CA bundle (PEM) that signed the
    /// servers' certificates, instead of the system's roots. Turns TLS on for etcd's host:port
    /// endpoints (https:// is TLS anyway); Redis takes it with rediss:// only, ZooKeeper with
    /// zks:// only (which needs it), PostgreSQL with sslmode=verify-full, verify-ca or require
    /// in its URL.
    #[arg(long, env = "BATON_CACERT", global = true, help_heading = GLOBAL, value_name = "FILE")]
    pub(crate) cacert: Option<PathBuf>,
    /// etcd, Redis, ZooKeeper or PostgreSQL over TLS: the client certificate (PEM) for a server
    /// that asks for one (etcd's --client-cert-auth, Redis's tls-auth-clients, ZooKeeper's
    /// ssl.clientAuth, PostgreSQL's clientcert= or cert authentication); with --key.
    #[arg(long, env = "BATON_CERT", global = true, help_heading = GLOBAL, value_name = "FILE")]
    pub(crate) cert: Option<PathBuf>,
    /// etcd, Redis, ZooKeeper or PostgreSQL over TLS: the private key (PEM) of the --cert
    /// certificate.
    #[arg(long, env = "BATON_KEY", global = true, help_heading = GLOBAL, value_name = "FILE")]
    pub(crate) key: Option<PathBuf>,
    /// Seconds to wait for an endpoint to answer.
    #[arg(long, default_value = "5", value_parser = seconds, global = true, help_heading = GLOBAL, allow_negative_numbers = true)]
    pub(crate) connect_timeout: Duration,
    /// Redis and PostgreSQL: seconds after baton's state may have been lost or rolled back
    /// (Redis: a restart, a failover, a flush, a new server; PostgreSQL: a new WAL timeline, a
    /// promoted standby) during which nothing is granted (at least the longest --ttl of any
    /// client; see docs/redis.md, docs/postgres.md).
    #[arg(long, default_value = "60", value_parser = seconds_or_zero, global = true, help_heading = GLOBAL, value_name = "SECONDS")]
    pub(crate) restart_grace: Duration,
    /// Where the lock entries live. ZooKeeper: whose node names they take, to share locks
    /// with applications using that library: Curator's InterProcessMutex (the default) or
    /// kazoo's Lock (docs/zookeeper.md). etcd: the Go layout (the default, shared with
    /// `etcdctl lock` and etcd's Go recipes) or the indexed one, for queues thousands deep
    /// (docs/etcd.md, "Layouts"). Every client of one lock uses the same layout.
    #[arg(long, value_enum, env = "BATON_LAYOUT", global = true, help_heading = GLOBAL)]
    pub(crate) layout: Option<Layout>,
    /// Also print the key and fencing token on standard error when running a command.
    #[arg(short, long, global = true, help_heading = GLOBAL)]
    pub(crate) verbose: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// `--layout`: the ZooKeeper node layouts and the etcd key layouts.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub(crate) enum Layout {
    /// ZooKeeper: Apache Curator's InterProcessMutex, `_c_<uuid>-lock-<sequence>`.
    Curator,
    /// ZooKeeper: kazoo's Lock, `<uuid>__lock__<sequence>`.
    Kazoo,
    /// etcd: `<name>/<lease id in hex>`, as etcd's Go recipes and `etcdctl lock`.
    Go,
    /// etcd: `<name>/_q/<sequence>.<tag>`, in queue order by key up to a window (reads at
    /// most about 130 keys per enqueue at any depth; not shared with `etcdctl lock`).
    Indexed,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
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

/// clap's rendering of a usage error, on one line, like every other error of baton: its first
/// paragraph (the message, and what it lists on the lines below, e.g. the missing
/// arguments), then where to read more (`baton status --help`, from the usage line).
pub(crate) fn usage_error(rendered: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
