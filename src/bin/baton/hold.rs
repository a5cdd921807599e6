//! A lock, a permit or a leadership once granted: held until a signal or a loss, or while a
//! command runs under supervision (the group stopped before the lease can expire).

use std::time::Duration;

use baton::{
    FencingToken, Leadership, LostReason, MutexGuard, RwLockReadGuard, SemaphorePermit, Session,
};
use futures::FutureExt;
use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::closed_output;
use crate::failure::{Failure, exit};
use crate::output::{Events, one_line, out};
use crate::supervise::{self, Group, Spec};
use crate::wait::Signals;

/// What `lock` and `elect` are given to hold what they are granted: the command to run, the
/// `--timeout` deadline, `-v`, `--kill-after`, `--ttl`, the `--json` events and the signals.
pub(crate) struct Holder<'a> {
    pub(crate) spec: Option<Spec>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) verbose: bool,
    pub(crate) kill_after: Duration,
    pub(crate) ttl: Duration,
    pub(crate) events: &'a Events,
    pub(crate) signals: &'a mut Signals,
}

impl Holder<'_> {
    /// Holds `held` (`what`, in messages), granted on `session`: until a signal or a loss, or
    /// while the command runs.
    pub(crate) async fn hold(
        self,
        what: String,
        session: &Session,
        held: Held,
    ) -> Result<u8, Failure> {
        let hold = Hold {
            what,
            verbose: self.verbose,
            kill_after: self.kill_after,
            ttl: self.ttl.min(session.ttl()),
            session: session.clone(),
            events: self.events.clone(),
        };
        hold.run(held, self.spec, self.signals).await
    }
}

/// A lock, a permit or a leadership, held.
pub(crate) enum Held {
    Lock(MutexGuard),
    Read(RwLockReadGuard),
    Permit(SemaphorePermit),
    Lead(Leadership),
}

impl Held {
    pub(crate) fn key(&self) -> &str {
        match self {
            Held::Lock(g) => g.key(),
            Held::Read(g) => g.key(),
            Held::Permit(p) => p.key(),
            Held::Lead(l) => l.key(),
        }
    }

    pub(crate) fn token(&self) -> FencingToken {
        match self {
            Held::Lock(g) => g.fencing_token(),
            Held::Read(g) => g.fencing_token(),
            Held::Permit(p) => p.fencing_token(),
            Held::Lead(l) => l.fencing_token(),
        }
    }

    /// The entry's place in its queue: etcd's create revision, `ETCD_LOCK_REV` as etcdctl
    /// exports it (the token carries the store epoch above it).
    pub(crate) fn position(&self) -> u64 {
        let entry = match self {
            Held::Lock(g) => g.entry(),
            Held::Read(g) => g.entry(),
            Held::Permit(p) => p.entry(),
            Held::Lead(l) => l.entry(),
        };
        entry.position().get()
    }

    pub(crate) fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        let lost: futures::future::BoxFuture<'static, LostReason> = match self {
            Held::Lock(g) => Box::pin(g.lost()),
            Held::Read(g) => Box::pin(g.lost()),
            Held::Permit(p) => Box::pin(p.lost()),
            Held::Lead(l) => Box::pin(l.lost()),
        };
        lost
    }

    /// Releases; the error, if any, as one line.
    pub(crate) async fn release(self) -> Result<(), Failure> {
        let released = match self {
            Held::Lock(g) => g.release().await,
            Held::Read(g) => g.release().await,
            Held::Permit(p) => p.release().await,
            Held::Lead(l) => l.release().await,
        };
        released.map_err(Failure::from)
    }
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
pub(crate) fn describe(status: std::process::ExitStatus) -> String {
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
