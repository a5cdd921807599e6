//! What ends a wait: `--timeout` (a deadline) and the signals baton handles.

use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::failure::{Failure, exit};
use crate::supervise;

/// The first SIGINT, SIGTERM or SIGHUP, with its number: SIGTERM and SIGHUP unless inherited
/// as ignored (`nohup`); SIGINT always, as `etcdctl lock` does, since a shell starts its
/// background jobs (`baton lock x &`) with SIGINT ignored and `kill -INT $!` must still stop
/// them (docs/design.md, 2026-11-25).
pub(crate) struct Signals {
    int: Option<tokio::signal::unix::Signal>,
    term: Option<tokio::signal::unix::Signal>,
    hup: Option<tokio::signal::unix::Signal>,
    /// The caller ignored SIGINT: so does the command, and SIGTERM is passed on instead.
    int_ignored: bool,
}

impl Signals {
    pub(crate) fn new() -> Result<Self, Failure> {
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
    pub(crate) fn passed_on(&self, sig: Signal) -> Signal {
        if sig == Signal::SIGINT && self.int_ignored {
            Signal::SIGTERM
        } else {
            sig
        }
    }

    pub(crate) async fn recv(&mut self) -> Signal {
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

pub(crate) fn interrupted(sig: Signal, what: &str) -> Failure {
    Failure::new(
        u8::try_from(128 + sig as i32).unwrap_or(exit::ERROR),
        format!("interrupted by {sig} while {what}"),
    )
}

/// Waits for `fut` until `deadline`, then fails with `code`: 75 (busy) while waiting for the
/// lock, 69 (unreachable) before it was asked for (connecting, starting a session).
pub(crate) async fn before<T>(
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

/// Waits for `fut`, giving up with exit code 75 at `deadline`, or 128+N on signal N.
pub(crate) async fn wait_granted<T>(
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
