//! Runs the command under a lock or leadership the way a process supervisor should: in a
//! process group of its own, so that a stop reaches every process it started; tied to baton's
//! life, so that it cannot outlive baton without the lock; and released only once the whole
//! group is gone.
//!
//! - The command is started through baton itself (`baton __baton-exec ...`): that small step
//!   runs in the child, asks the kernel to kill it when baton dies (`PR_SET_PDEATHSIG`, on
//!   Linux), takes the terminal's foreground if baton had it, and then `exec`s the command. So
//!   no `unsafe` `pre_exec` is needed.
//! - A watchdog (`sh`, in a group of its own) holds the read end of a pipe whose write end only
//!   baton holds: if baton dies, however it dies, the pipe closes and the watchdog stops the
//!   whole group (SIGTERM, then SIGKILL after `--kill-after`). When baton ends normally it
//!   stops the watchdog first, by its pid.
//! - baton is a child subreaper (Linux): processes of the group orphaned by the command are
//!   re-parented to baton, which reaps them while it waits for the group to be gone.

use std::ffi::CString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg, pthread_sigmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgrp, getpid, getppid, tcgetpgrp, tcsetpgrp};

use crate::{Failure, exit};

/// The first argument by which baton runs as the exec step of a command.
pub(crate) const EXEC_STEP: &str = "__baton-exec";

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) program: String,
    pub(crate) args: Vec<String>,
    /// Added to the command's environment.
    pub(crate) env: Vec<(String, String)>,
}

/// Checks that `program` can be run, as `execvp` would find it, before anything else is done:
/// exit code 127 if it is not found, 126 if it is found but cannot be executed (as shells,
/// `env` and `timeout` do).
pub(crate) fn check_runnable(program: &str) -> Result<PathBuf, Failure> {
    let executable = |p: &Path| nix::unistd::access(p, nix::unistd::AccessFlags::X_OK).is_ok();
    if program.is_empty() {
        return Err(Failure::new(exit::NOT_FOUND, "the command is empty"));
    }
    if program.contains('/') {
        let path = PathBuf::from(program);
        return match (path.is_file(), executable(&path)) {
            (true, true) => Ok(path),
            (true, false) => Err(Failure::new(
                exit::NOT_EXECUTABLE,
                format!("`{program}` is not executable"),
            )),
            (false, _) => Err(Failure::new(
                exit::NOT_FOUND,
                format!("`{program}`: no such file"),
            )),
        };
    }
    let mut found_not_executable = None;
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let path = dir.join(program);
        if path.is_file() {
            if executable(&path) {
                return Ok(path);
            }
            found_not_executable.get_or_insert(path);
        }
    }
    Err(match found_not_executable {
        Some(path) => Failure::new(
            exit::NOT_EXECUTABLE,
            format!("`{}` is not executable", path.display()),
        ),
        None => Failure::new(exit::NOT_FOUND, format!("`{program}`: command not found")),
    })
}

/// Sets up baton itself for supervising (once, before any command is started).
pub(crate) fn become_supervisor() {
    // Orphans of the command's group come to us, so we can tell when the group is gone.
    #[cfg(target_os = "linux")]
    let _ = nix::sys::prctl::set_child_subreaper(true);
}

/// Whether baton runs in the foreground of the terminal on its standard input.
fn terminal_foreground() -> bool {
    let stdin = std::io::stdin();
    stdin.is_terminal() && tcgetpgrp(&stdin).is_ok_and(|fg| fg == getpgrp())
}

/// Hands the terminal's foreground to `pgrp`; SIGTTOU is blocked meanwhile, since the caller
/// may be in a background group (then the kernel would stop it instead).
fn give_terminal(pgrp: Pid) {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let mut old = SigSet::empty();
    if pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut old)).is_ok() {
        let _ = tcsetpgrp(std::io::stdin(), pgrp);
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
    }
}

/// The exec step, run in the child: `__baton-exec <baton pid> <0|1 foreground> -- program
/// args...`. Never returns unless the `exec` failed.
pub(crate) fn exec_step(args: &[String]) -> u8 {
    let [parent, foreground, dashes, program, rest @ ..] = args else {
        eprintln!("baton: {EXEC_STEP} needs <pid> <foreground> -- <program> [args]");
        return exit::USAGE;
    };
    // Die with baton. (Linux; elsewhere the watchdog alone stops the group.)
    #[cfg(target_os = "linux")]
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    // baton may have died before the line above: then our parent is not baton any more.
    if parent.parse::<i32>().ok() != Some(getppid().as_raw()) || dashes != "--" {
        return exit::ERROR;
    }
    if foreground == "1" {
        give_terminal(getpgrp());
    }
    let to_c = |s: &String| CString::new(s.as_bytes()).ok();
    let Some(c_program) = to_c(program) else {
        return exit::NOT_FOUND;
    };
    let Some(c_args) = std::iter::once(program)
        .chain(rest)
        .map(to_c)
        .collect::<Option<Vec<_>>>()
    else {
        return exit::NOT_FOUND;
    };
    let Err(e) = nix::unistd::execvp(&c_program, &c_args);
    eprintln!("baton: cannot run `{program}`: {e}");
    if e == Errno::ENOENT {
        exit::NOT_FOUND
    } else {
        exit::NOT_EXECUTABLE
    }
}

/// The running command's process group.
pub(crate) struct Group {
    leader: tokio::process::Child,
    pgid: Pid,
    /// The leader's status, once reaped.
    status: Option<ExitStatus>,
    watchdog: Option<std::process::Child>,
    owns_terminal: bool,
}

/// Sends `sig` to every process of the group `pgid`.
pub(crate) fn signal_group(pgid: Pid, sig: Signal) {
    let _ = killpg(pgid, sig);
}

impl Group {
    /// Starts `spec` in a new process group.
    pub(crate) fn spawn(spec: &Spec, kill_after: Duration) -> Result<Group, Failure> {
        let foreground = terminal_foreground();
        let mut command = match std::env::current_exe() {
            Ok(baton) => {
                let mut c = tokio::process::Command::new(baton);
                c.arg(EXEC_STEP)
                    .arg(getpid().to_string())
                    .arg(if foreground { "1" } else { "0" })
                    .arg("--")
                    .arg(&spec.program);
                c
            }
            // Without our own path, run it directly: no parent-death signal then.
            Err(_) => tokio::process::Command::new(&spec.program),
        };
        command
            .args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            // The password is ours, not the command's.
            .env_remove("BATON_PASSWORD")
            .process_group(0);
        let leader = command.spawn().map_err(|e| {
            Failure::new(exit::ERROR, format!("cannot run `{}`: {e}", spec.program))
        })?;
        let pgid = leader
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw)
            .ok_or_else(|| Failure::new(exit::ERROR, "the command exited at once"))?;
        let watchdog = watchdog(pgid, kill_after);
        Ok(Group {
            leader,
            pgid,
            status: None,
            watchdog,
            owns_terminal: foreground,
        })
    }

    pub(crate) fn pgid(&self) -> Pid {
        self.pgid
    }

    /// Resolves with the leader's status once it has exited and every other process of the
    /// group is gone too.
    pub(crate) async fn wait(&mut self) -> ExitStatus {
        let status = match self.status {
            Some(status) => status,
            None => {
                let status = match self.leader.wait().await {
                    Ok(status) => status,
                    // Lost track of it (reaped elsewhere): it is gone.
                    Err(_) => std::os::unix::process::ExitStatusExt::from_raw(1 << 8),
                };
                self.status = Some(status);
                status
            }
        };
        self.group_gone().await;
        status
    }

    /// Waits until no process of the group is left, reaping those re-parented to us. (Only
    /// once the leader is reaped: reaping it here would hide its status from the runtime.)
    async fn group_gone(&self) {
        loop {
            loop {
                match waitpid(
                    Pid::from_raw(-self.pgid.as_raw()),
                    Some(WaitPidFlag::WNOHANG),
                ) {
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            if killpg(self.pgid, None) == Err(Errno::ESRCH) {
                return;
            }
            // No event tells when the last process of a group exits: look again shortly.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the group: SIGTERM to all, SIGKILL to all after `grace`, or at once when
    /// `interrupted` fires (a second signal); returns once the group is gone.
    pub(crate) async fn stop(
        &mut self,
        grace: Duration,
        interrupted: impl std::future::Future<Output = ()>,
    ) -> ExitStatus {
        signal_group(self.pgid, Signal::SIGTERM);
        let pgid = self.pgid;
        tokio::pin!(interrupted);
        tokio::select! {
            status = self.wait() => return status,
            () = tokio::time::sleep(grace) => {}
            () = &mut interrupted => {}
        }
        signal_group(pgid, Signal::SIGKILL);
        self.wait().await
    }

    /// The group is gone: give the terminal back and stop the watchdog.
    pub(crate) fn finish(mut self) {
        if self.owns_terminal {
            give_terminal(getpgrp());
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

/// Starts the watchdog of group `pgid`: it waits for end of file on its standard input (baton
/// holds the only write end), then stops the group. In a process group of its own, so that
/// a terminal's signals do not reach it.
fn watchdog(pgid: Pid, kill_after: Duration) -> Option<std::process::Child> {
    use std::os::unix::process::CommandExt;
    // `kill -TERM -PGID`, not `kill -s TERM -- -PGID`: dash, Debian's sh, takes neither `--`
    // nor a negative pid after `-s`.
    let script = format!(
        "read _ ; kill -TERM -{pgid} 2>/dev/null; sleep {grace}; kill -KILL -{pgid} 2>/dev/null",
        grace = kill_after.as_secs_f64()
    );
    std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .ok()
}

/// Which of SIGINT, SIGTERM and SIGHUP baton inherited as ignored (`nohup`, a parent that
/// ignores them): those stay ignored, for baton and for the command. Read from
/// `/proc/self/status` on Linux; elsewhere, none.
pub(crate) fn inherited_ignored() -> Vec<Signal> {
    let mask = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("SigIgn:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .unwrap_or(0);
    [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP]
        .into_iter()
        .filter(|s| mask & (1u64 << (*s as i32 - 1)) != 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runnable_is_checked_as_execvp_would() {
        assert!(check_runnable("sh").is_ok());
        assert_eq!(
            check_runnable("no-such-command-baton").unwrap_err().code,
            exit::NOT_FOUND
        );
        assert_eq!(
            check_runnable("/no/such/file").unwrap_err().code,
            exit::NOT_FOUND
        );
        // A file that exists but cannot be executed.
        assert_eq!(
            check_runnable("/etc/passwd").unwrap_err().code,
            exit::NOT_EXECUTABLE
        );
    }
}
