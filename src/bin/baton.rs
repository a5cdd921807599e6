//! `baton`: locks and elections from the shell, compatible with `etcdctl lock` / `elect`.

use std::process::ExitCode;
use std::time::Duration;

use baton::{
    Election, Error, EtcdBackend, EtcdOptions, LeaderEvent, Mutex, Session, SessionOptions,
};
use clap::{Parser, Subcommand};
use futures::StreamExt;
use tokio::signal::unix::{SignalKind, signal};

const EXIT_CODES: &str = "\
Exit codes:
  0   success (with a command: the command's own exit code; 128+N if a signal N ended it)
  1   unexpected error
  64  bad arguments
  69  etcd unreachable, or a request failed after retries
  75  --timeout elapsed before the lock or leadership was granted
  77  authentication failed
  79  the lock or leadership was lost (the command, if any, was terminated)";

/// Exit codes, as documented in `EXIT_CODES` and docs/cli.md.
mod exit {
    pub(crate) const ERROR: u8 = 1;
    pub(crate) const USAGE: u8 = 64;
    pub(crate) const UNAVAILABLE: u8 = 69;
    pub(crate) const TIMEOUT: u8 = 75;
    pub(crate) const AUTH: u8 = 77;
    pub(crate) const LOST: u8 = 79;
}

#[derive(Parser, Debug)]
#[command(
    name = "baton",
    version,
    about = "Fair distributed locks and leader election on etcd",
    after_help = EXIT_CODES
)]
struct Cli {
    /// etcd endpoints, comma-separated.
    #[arg(
        long,
        env = "BATON_ENDPOINTS",
        default_value = "127.0.0.1:2379",
        value_delimiter = ',',
        global = true
    )]
    endpoints: Vec<String>,
    /// User name for etcd authentication.
    #[arg(long, env = "BATON_USER", global = true)]
    user: Option<String>,
    /// Password for etcd authentication.
    #[arg(long, env = "BATON_PASSWORD", hide_env_values = true, global = true)]
    password: Option<String>,
    /// Seconds to wait for an endpoint to answer.
    #[arg(long, default_value = "5", value_parser = seconds, global = true)]
    connect_timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Acquire a lock; run a command while holding it, or hold it until a signal.
    ///
    /// Prints the lock key and the fencing token (one per line) once the lock is held.
    /// The command gets BATON_LOCK_KEY, BATON_FENCING_TOKEN, and for etcdctl compatibility
    /// ETCD_LOCK_KEY and ETCD_LOCK_REV (the create revision: the fencing token).
    Lock {
        /// The lock name (keys are `<name>/<lease id hex>`, as `etcdctl lock`).
        name: String,
        /// Session TTL in seconds: how long the lock survives this process dying.
        #[arg(long, default_value = "10", value_parser = seconds)]
        ttl: Duration,
        /// Give up after this many seconds of waiting (exit code 75).
        #[arg(long, value_parser = seconds)]
        timeout: Option<Duration>,
        /// Seconds between SIGTERM and SIGKILL when the command must be stopped.
        #[arg(long, default_value = "10", value_parser = seconds)]
        kill_after: Duration,
        /// The command to run while holding the lock.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Campaign in an election and lead until a signal, or observe it with --listen.
    Elect {
        /// The election name.
        name: String,
        /// The value to lead with (not with --listen).
        #[arg(required_unless_present = "listen")]
        proposal: Option<String>,
        /// Print one line per leader event instead of campaigning.
        #[arg(short, long)]
        listen: bool,
        /// With --listen: JSON lines.
        #[arg(long, requires = "listen")]
        json: bool,
        /// Session TTL in seconds.
        #[arg(long, default_value = "10", value_parser = seconds)]
        ttl: Duration,
        /// Give up campaigning after this many seconds (exit code 75).
        #[arg(long, value_parser = seconds)]
        timeout: Option<Duration>,
    },
    /// Show the queue of a lock or election: holder first, then waiters in order.
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
            Error::InvalidArgument(_) => exit::USAGE,
            Error::Connect { .. } | Error::Backend { .. } | Error::Unavailable => exit::UNAVAILABLE,
            Error::Auth { .. } => exit::AUTH,
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
        Failure::new(code, message.replace('\n', " "))
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
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

async fn connect(cli: &Cli) -> Result<EtcdBackend, Failure> {
    let mut options = EtcdOptions::new().with_connect_timeout(cli.connect_timeout);
    match (&cli.user, &cli.password) {
        (Some(user), Some(password)) => options = options.with_user(user, password),
        (Some(_), None) => {
            return Err(Failure::new(
                exit::USAGE,
                "--user needs --password (or BATON_PASSWORD)",
            ));
        }
        _ => {}
    }
    Ok(EtcdBackend::connect(&cli.endpoints, options).await?)
}

async fn run(cli: Cli) -> Result<u8, Failure> {
    let backend = connect(&cli).await?;
    match cli.command {
        Command::Lock {
            name,
            ttl,
            timeout,
            kill_after,
            command,
        } => {
            let session = session(backend, ttl).await?;
            let result = lock(&session, &name, timeout, kill_after, &command).await;
            // Whatever happened, revoke the lease: no key of ours outlives this process.
            let _ = session.close().await;
            result
        }
        Command::Elect {
            name,
            proposal,
            listen,
            json,
            ttl,
            timeout,
        } => {
            let session = session(backend, ttl).await?;
            let result = match (listen, proposal) {
                (true, _) => listen_election(&session, &name, json).await,
                (false, Some(proposal)) => elect(&session, &name, proposal, timeout).await,
                (false, None) => Err(Failure::new(exit::USAGE, "a proposal is required")),
            };
            let _ = session.close().await;
            result
        }
        Command::Status { name, json } => status(&backend, &name, json).await,
    }
}

async fn session(backend: EtcdBackend, ttl: Duration) -> Result<Session, Failure> {
    Ok(Session::with_options(backend, SessionOptions::new().with_ttl(ttl)).await?)
}

/// Resolves at the first SIGINT, SIGTERM or SIGHUP, with the signal number.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Self, Failure> {
        let install = |kind| {
            signal(kind)
                .map_err(|e| Failure::new(exit::ERROR, format!("cannot handle signals: {e}")))
        };
        Ok(Signals {
            int: install(SignalKind::interrupt())?,
            term: install(SignalKind::terminate())?,
            hup: install(SignalKind::hangup())?,
        })
    }

    async fn recv(&mut self) -> nix::sys::signal::Signal {
        use nix::sys::signal::Signal;
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

/// Waits for `fut`, giving up with exit code 75 after `timeout`, or 128+N on signal N.
async fn wait_granted<T>(
    what: &str,
    timeout: Option<Duration>,
    signals: &mut Signals,
    fut: impl std::future::Future<Output = baton::Result<T>>,
) -> Result<T, Failure> {
    let limit = async {
        match timeout {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        granted = fut => Ok(granted?),
        () = limit => Err(Failure::new(exit::TIMEOUT, format!("timed out waiting for {what}"))),
        sig = signals.recv() => Err(Failure::new(
            u8::try_from(128 + sig as i32).unwrap_or(exit::ERROR),
            format!("interrupted by {sig} while waiting for {what}"),
        )),
    }
}

async fn lock(
    session: &Session,
    name: &str,
    timeout: Option<Duration>,
    kill_after: Duration,
    command: &[String],
) -> Result<u8, Failure> {
    let mut signals = Signals::new()?;
    let owner = format!("baton-cli pid={}", std::process::id());
    let mutex = Mutex::new(session, name)?.with_owner_info(owner);
    let what = format!("lock `{name}`");
    let guard = wait_granted(&what, timeout, &mut signals, mutex.lock()).await?;
    let token = guard.fencing_token();
    println!("{}", guard.key());
    println!("{token}");

    let Some((program, args)) = command.split_first() else {
        // Hold until a signal, or until the lock is lost.
        return tokio::select! {
            _ = signals.recv() => {
                guard.unlock().await?;
                Ok(0)
            }
            reason = guard.lost() => Err(Failure::new(exit::LOST, format!("lock `{name}` lost: {reason}"))),
        };
    };

    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env("BATON_LOCK_KEY", guard.key())
        .env("BATON_FENCING_TOKEN", token.to_string())
        .env("ETCD_LOCK_KEY", guard.key())
        .env("ETCD_LOCK_REV", token.to_string())
        .spawn()
        .map_err(|e| Failure::new(exit::ERROR, format!("cannot run `{program}`: {e}")))?;
    let lost = guard.lost();
    tokio::pin!(lost);
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|e| Failure::new(exit::ERROR, format!("waiting for `{program}`: {e}")))?;
                guard.unlock().await?;
                return Ok(exit_code(status));
            }
            sig = signals.recv() => {
                // Forward, keep the lock until the command has exited.
                send_signal(&child, sig);
            }
            reason = &mut lost => {
                eprintln!("baton: lock `{name}` lost ({reason}); stopping `{program}`");
                stop_child(&mut child, kill_after).await;
                return Err(Failure::new(exit::LOST, format!("lock `{name}` lost: {reason}; the command was terminated")));
            }
        }
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

fn send_signal(child: &tokio::process::Child, sig: nix::sys::signal::Signal) {
    if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}

/// SIGTERM, then SIGKILL if the command has not exited after `grace`.
async fn stop_child(child: &mut tokio::process::Child, grace: Duration) {
    send_signal(child, nix::sys::signal::Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

async fn elect(
    session: &Session,
    name: &str,
    proposal: String,
    timeout: Option<Duration>,
) -> Result<u8, Failure> {
    let mut signals = Signals::new()?;
    let election = Election::new(session, name)?;
    let what = format!("leadership of `{name}`");
    let leadership = wait_granted(
        &what,
        timeout,
        &mut signals,
        election.campaign(proposal.clone()),
    )
    .await?;
    println!("{}", leadership.key());
    println!("{proposal}");
    println!("{}", leadership.fencing_token());
    tokio::select! {
        _ = signals.recv() => {
            leadership.resign().await?;
            Ok(0)
        }
        reason = leadership.lost() => Err(Failure::new(exit::LOST, format!("leadership of `{name}` lost: {reason}"))),
    }
}

async fn listen_election(session: &Session, name: &str, json: bool) -> Result<u8, Failure> {
    let mut signals = Signals::new()?;
    let election = Election::new(session, name)?;
    let mut events = election.observe();
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = signals.recv() => return Ok(0),
        };
        match event {
            None => return Err(Failure::new(exit::ERROR, "the observer stopped")),
            Some(Err(e)) => eprintln!("baton: observing `{name}`: {e} (retrying)"),
            Some(Ok(event)) => println!("{}", render_event(&event, json)),
        }
    }
}

fn render_event(event: &LeaderEvent, json: bool) -> String {
    let (kind, leader) = match event {
        LeaderEvent::Elected(l) => ("elected", Some(l)),
        LeaderEvent::Proclaimed(l) => ("proclaimed", Some(l)),
        LeaderEvent::Vacant => ("vacant", None),
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
        (false, Some(l)) => String::from_utf8_lossy(l.value()).into_owned(),
        (false, None) => "(no leader)".to_owned(),
    }
}

async fn status(backend: &EtcdBackend, name: &str, json: bool) -> Result<u8, Failure> {
    use baton::Backend;
    if name.is_empty() {
        return Err(Failure::new(exit::USAGE, "the name must not be empty"));
    }
    let entries = backend.entries(name).await?;
    // Names that nest share a queue (as with etcdctl): a key under `<name>/sub/` belongs to
    // the lock `<name>/sub`, yet `<name>` queues behind it. Say so rather than hide it.
    let prefix = format!("{name}/");
    let owner_name = |key: &str| -> String {
        key.strip_prefix(&prefix)
            .and_then(|rest| rest.rsplit_once('/'))
            .map_or_else(|| name.to_owned(), |(sub, _)| format!("{name}/{sub}"))
    };
    let mut nested: Vec<String> = Vec::new();
    if !json {
        println!(
            "{:<8} {:<40} {:>10} {:>18} {:>6}  OWNER",
            "ROLE", "KEY", "TOKEN", "LEASE", "TTL"
        );
    }
    for (i, e) in entries.iter().enumerate() {
        let ttl = match e.lease() {
            Some(lease) => backend.lease_ttl(lease).await?.map(|d| d.as_secs()),
            None => None,
        };
        let mut role = if i == 0 {
            "holder".to_owned()
        } else {
            format!("waiter{i}")
        };
        let of = owner_name(e.key());
        if of != name {
            if !json {
                role.push('*');
            }
            if !nested.contains(&of) {
                nested.push(of.clone());
            }
        }
        let owner = String::from_utf8_lossy(e.value());
        let lease = e.lease().map(|l| l.to_hex());
        if json {
            println!(
                "{{\"role\":{},\"position\":{i},\"name\":{},\"key\":{},\"token\":{},\"lease\":{},\"ttl\":{},\"owner\":{}}}",
                json_str(&role),
                json_str(&of),
                json_str(e.key()),
                e.token(),
                lease.as_deref().map_or("null".to_owned(), json_str),
                ttl.map_or("null".to_owned(), |t| t.to_string()),
                json_str(&owner),
            );
        } else {
            println!(
                "{:<8} {:<40} {:>10} {:>18} {:>6}  {}",
                role,
                e.key(),
                e.token(),
                lease.as_deref().unwrap_or("-"),
                ttl.map_or("-".to_owned(), |t| format!("{t}s")),
                owner.chars().take(60).collect::<String>(),
            );
        }
    }
    if !json && !nested.is_empty() {
        println!(
            "* a key of the nested name {}: names that nest share a queue, so `{name}` waits behind it",
            nested.join(", ")
        );
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
