//! `baton`: locks and elections from the shell, compatible with `etcdctl lock` / `elect`.
//!
//! With a command, `baton` supervises it (see `supervise`): the command runs only while the
//! lock (or leadership) is held, as a whole process group, and baton returns its exit code.
//!
//! This file is the entry and the dispatch; each concern has its module: the command line
//! (`args`), failures and exit codes (`failure`), what is written (`output`), connecting and
//! the session (`connect`), what ends a wait (`wait`), holding once granted (`hold`,
//! `supervise`), and the commands (`lock`, `elect`, and `operator` for `status`, `ls`,
//! `break` and `init`).

mod args;
mod closed_output;
mod connect;
mod elect;
mod failure;
mod hold;
mod lock;
mod operator;
mod output;
mod sigstate;
mod supervise;
mod wait;

use std::process::ExitCode;

use clap::Parser;
use tokio::time::Instant;

use crate::args::{Cli, Command, usage_error};
use crate::connect::{Checked, connect, validate};
use crate::failure::{Failure, exit};
use crate::hold::Holder;
use crate::output::{Events, json_str};
use crate::wait::{Signals, interrupted};

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
            let holder = Holder {
                spec,
                deadline,
                verbose,
                kill_after,
                ttl,
                events,
                signals: &mut signals,
            };
            lock::lock(backend, holder, &name, try_once, permits, shared).await
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
            let holder = Holder {
                spec,
                deadline,
                verbose,
                kill_after,
                ttl,
                events,
                signals: &mut signals,
            };
            elect::elect(backend, holder, &name, proposal, listen, json).await
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
