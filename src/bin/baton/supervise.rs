//! Runs the command under a lock or leadership the way a process supervisor should: in a
//! process group of its own, so that a stop reaches every process it started; tied to baton's
//! life, so that it cannot outlive baton without the lock; and released only once the whole
//! group is gone.
//!
//! - The command is started through baton itself (`baton __baton-exec ...`): that small step
//!   runs in the child, asks the kernel to kill it when baton dies (`PR_SET_PDEATHSIG`, on
//!   Linux), takes the terminal's foreground if baton had it, waits until baton has told
//!   the watchdog (below) which group to guard, restores the signal dispositions and mask
//!   baton's caller gave it (`sigstate`), and then `exec`s the command. So no `pre_exec`
//!   closure runs in a forked copy of the runtime, and a baton stopped right after starting
//!   the step leaves no command running unguarded.
//! - A watchdog (baton again, shown as `baton watchdog <baton's pid>`, in a group of its own,
//!   no shell)
//!   holds the read end of a pipe whose write end only baton holds: if baton dies, however it
//!   dies, the pipe closes and the watchdog stops the whole group (SIGTERM, then SIGKILL
//!   early enough that the group is gone before the lease can expire). baton also tells it
//!   the session's deadline whenever a renewal moves it: if baton stops telling (stopped by
//!   SIGSTOP, starved), the watchdog stops the group by that deadline on its own. When baton
//!   ends normally it tells the watchdog to stand down. Without a watchdog no command is
//!   started.
//! - baton is a child subreaper (Linux): processes of the group orphaned by the command are
//!   re-parented to baton, which reaps them while it waits for the group to be gone. Once the
//!   command itself has exited, baton takes the terminal back (so Ctrl-C reaches it) and says
//!   on standard error what it still waits for.

use std::ffi::CString;
use std::io::IsTerminal;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg, pthread_sigmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::time::{ClockId, clock_gettime};
use nix::unistd::{Pid, getpgrp, getpid, getppid, tcgetpgrp, tcsetpgrp};

use crate::failure::{Failure, exit};
use crate::sigstate::{self, CallerSignals};

/// The first argument by which baton runs as the exec step of a command.
pub(crate) const EXEC_STEP: &str = "__baton-exec";

/// The name (`argv[0]`) by which baton runs as the watchdog of a command's group: what `ps`
/// shows, followed by the pid of the baton it watches (`baton watchdog 4242`). A name with a
/// space, which no one types to run baton.
pub(crate) const WATCHDOG_NAME: &str = "baton watchdog";

/// The watchdog's process name (`comm`, 15 bytes at most), what `ps -e` and `top` show.
#[cfg(target_os = "linux")]
const WATCHDOG_COMM: &std::ffi::CStr = c"baton-watchdog";

/// Runs the hidden step `args` name (`args[0]` for the watchdog, `args[1]` for the exec step),
/// if they name one: its exit code.
pub(crate) fn hidden_step(args: &[String]) -> Option<u8> {
    if args.first().map(String::as_str) == Some(WATCHDOG_NAME) {
        return Some(watchdog_step());
    }
    match args.get(1).map(String::as_str) {
        Some(EXEC_STEP) => Some(exec_step(&args[2..])),
        _ => None,
    }
}

/// baton's own executable, to run it again as a hidden step: `/proc/self/exe` on Linux (it
/// works even if the file was replaced or deleted since baton started), else what the
/// platform says.
fn own_executable() -> std::io::Result<PathBuf> {
    let proc_self = Path::new("/proc/self/exe");
    if cfg!(target_os = "linux") && proc_self.exists() {
        return Ok(proc_self.to_path_buf());
    }
    std::env::current_exe()
}

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

/// The exec step, run in the child: `__baton-exec <baton pid> <0|1 foreground> <caller's
/// signals> <go fd> -- program args...`, where `<go fd>` is the inherited read end of the
/// pipe on which baton says when to start. Never returns unless the `exec` failed or baton
/// gave no go.
pub(crate) fn exec_step(args: &[String]) -> u8 {
    let [parent, foreground, signals, go, dashes, program, rest @ ..] = args else {
        eprintln!(
            "baton: {EXEC_STEP} needs <pid> <foreground> <signals> <go fd> -- <program> [args]"
        );
        return exit::USAGE;
    };
    // Die with baton. (Linux; elsewhere the watchdog alone stops the group.)
    #[cfg(target_os = "linux")]
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    // baton may have died before the line above: then our parent is not baton any more.
    if parent.parse::<i32>().ok() != Some(getppid().as_raw()) || dashes != "--" {
        return exit::ERROR;
    }
    let Some(signals) = CallerSignals::from_arg(signals) else {
        return exit::USAGE;
    };
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
    // Not before the watchdog guards this group: were baton stopped (SIGSTOP, a starved
    // process) between starting this step and telling the watchdog, the command would run on
    // past the lease with no one to stop it (seen in CI once).
    if !told_to_go(go) {
        return exit::ERROR;
    }
    // Last, so that nothing above runs with the caller's mask or dispositions: the command
    // starts with the signals it would have had without baton.
    if let Err(e) = signals.restore() {
        eprintln!("baton: cannot restore the signal dispositions for `{program}`: {e}");
        return exit::ERROR;
    }
    let Err(e) = nix::unistd::execvp(&c_program, &c_args);
    eprintln!("baton: cannot run `{program}`: {e}");
    if e == Errno::ENOENT {
        exit::NOT_FOUND
    } else {
        exit::NOT_EXECUTABLE
    }
}

/// Waits for baton's go on the pipe whose read end is the inherited descriptor `fd`, and
/// closes that descriptor (the command does not inherit it). `false` if the pipe closed
/// without it (baton is gone) or cannot be read.
fn told_to_go(fd: &str) -> bool {
    use std::io::Read;
    let Ok(fd) = fd.parse::<i32>() else {
        return false;
    };
    // Opened by name, which needs no `unsafe` to adopt a raw descriptor; the name's copy is
    // close-on-exec, and the inherited one is closed here.
    let name = format!("/dev/fd/{fd}");
    let pipe = std::fs::File::open(&name);
    let _ = nix::unistd::close(fd);
    let mut pipe = match pipe {
        Ok(pipe) => pipe,
        Err(e) => {
            eprintln!("baton: cannot open {name}, where baton says when to start: {e}");
            return false;
        }
    };
    let mut byte = [0u8; 1];
    loop {
        match pipe.read(&mut byte) {
            Ok(1) => return true,
            // baton is gone before it said so: nothing runs.
            Ok(_) => return false,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("baton: cannot read {name}, where baton says when to start: {e}");
                return false;
            }
        }
    }
}

/// The running command's process group.
pub(crate) struct Group {
    leader: tokio::process::Child,
    pgid: Pid,
    program: String,
    /// The leader's status, once reaped, and when.
    status: Option<(ExitStatus, std::time::Instant)>,
    /// A signal reached the group (passed on by baton, or the one that ended the leader,
    /// e.g. a terminal's Ctrl-C): the next one sends SIGKILL.
    interrupted: bool,
    /// Whether baton said on standard error what it waits for.
    announced: bool,
    watchdog: Watchdog,
    owns_terminal: bool,
}

/// Sends `sig` to every process of the group `pgid`.
pub(crate) fn signal_group(pgid: Pid, sig: Signal) {
    let _ = killpg(pgid, sig);
}

/// How long after the leader's exit baton says what else it waits for: long enough for
/// processes that are just exiting, short enough that nobody wonders.
const ANNOUNCE_AFTER: Duration = Duration::from_millis(200);

impl Group {
    /// Starts `spec` in a new process group, guarded by a watchdog that stops the group if
    /// baton dies (SIGTERM, then SIGKILL `orphan_grace` later), or if `deadline` (the
    /// session's; see [`Group::tell_deadline`]) comes within `orphan_grace` with no newer one
    /// told (SIGTERM, then SIGKILL at the deadline). Without a watchdog nothing is started:
    /// the command never runs unguarded.
    pub(crate) fn spawn(
        spec: &Spec,
        orphan_grace: Duration,
        deadline: std::time::Instant,
    ) -> Result<Group, Failure> {
        let mut watchdog = Watchdog::start(orphan_grace).map_err(|e| {
            Failure::new(
                exit::ERROR,
                format!(
                    "cannot start the watchdog that stops `{}` if baton dies ({e}); not running it unguarded",
                    spec.program
                ),
            )
        })?;
        // Before the command starts: from its first instant, a stopped baton cannot keep it
        // running past the lease.
        watchdog.deadline(deadline);
        let baton = own_executable().map_err(|e| {
            Failure::new(
                exit::ERROR,
                format!(
                    "cannot find baton's own executable to start `{}`: {e}",
                    spec.program
                ),
            )
        })?;
        let foreground = terminal_foreground();
        // The step waits on this pipe until the watchdog knows its group; it inherits the read
        // end alone (the write end is close-on-exec, so that baton's death closes the pipe).
        let no_pipe = |e: Errno| {
            Failure::new(
                exit::ERROR,
                format!("cannot make the pipe that starts `{}`: {e}", spec.program),
            )
        };
        let (go_read, go_write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(no_pipe)?;
        fcntl(&go_read, FcntlArg::F_SETFD(FdFlag::empty())).map_err(no_pipe)?;
        let mut command = tokio::process::Command::new(baton);
        command
            .arg(EXEC_STEP)
            .arg(getpid().to_string())
            .arg(if foreground { "1" } else { "0" })
            .arg(sigstate::caller().to_arg())
            .arg(go_read.as_raw_fd().to_string())
            .arg("--")
            .arg(&spec.program)
            .args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            // The password is ours, not the command's.
            .env_remove("BATON_PASSWORD")
            .process_group(0);
        let leader = command
            .spawn()
            .map_err(|e| Failure::new(exit::ERROR, format!("cannot run `{}`: {e}", spec.program)));
        drop(go_read);
        let leader = leader?;
        let pgid = leader
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw)
            .ok_or_else(|| Failure::new(exit::ERROR, "the command exited at once"))?;
        if !watchdog.guard(pgid) {
            // No go: the step sees the pipe close and runs nothing (tokio reaps it).
            drop(go_write);
            watchdog.stand_down();
            return Err(Failure::new(
                exit::ERROR,
                format!(
                    "the watchdog that stops `{}` if baton dies is gone; not running it unguarded",
                    spec.program
                ),
            ));
        }
        // Told (the line is in the watchdog's pipe, read even if baton stops now): go.
        let _ = nix::unistd::write(&go_write, b"g");
        drop(go_write);
        Ok(Group {
            leader,
            pgid,
            program: spec.program.clone(),
            status: None,
            interrupted: false,
            announced: false,
            watchdog,
            owns_terminal: foreground,
        })
    }

    pub(crate) fn pgid(&self) -> Pid {
        self.pgid
    }

    /// Tells the watchdog the session's new deadline. Unless told a newer one, it sends the
    /// group SIGTERM `orphan_grace` before `deadline` and SIGKILL at it, as baton itself
    /// does when renewals fail: what keeps the command from outliving the lease when baton
    /// is alive but does not run (SIGSTOP).
    pub(crate) fn tell_deadline(&mut self, deadline: std::time::Instant) {
        self.watchdog.deadline(deadline);
    }

    /// Whether a signal reached the group already: then the next one sends SIGKILL.
    pub(crate) fn interrupted(&self) -> bool {
        self.interrupted
    }

    /// baton passed a signal on to the group.
    pub(crate) fn note_signalled(&mut self) {
        self.interrupted = true;
    }

    /// Resolves with the leader's status once it has exited and every other process of the
    /// group is gone too.
    pub(crate) async fn wait(&mut self) -> ExitStatus {
        let status = match self.status {
            Some((status, _)) => status,
            None => {
                let status = match self.leader.wait().await {
                    Ok(status) => status,
                    // Lost track of it (reaped elsewhere): it is gone.
                    Err(_) => std::os::unix::process::ExitStatusExt::from_raw(1 << 8),
                };
                self.leader_exited(status);
                status
            }
        };
        self.group_gone().await;
        status
    }

    /// The leader is gone; what it left in the group may run on. Take the terminal back, so
    /// that the next Ctrl-C reaches baton (the group's members would not hear it: a
    /// non-interactive shell starts its background jobs with SIGINT ignored), and count a
    /// signal that ended the leader as one the group got.
    fn leader_exited(&mut self, status: ExitStatus) {
        use std::os::unix::process::ExitStatusExt;
        self.status = Some((status, std::time::Instant::now()));
        if status.signal().is_some() {
            self.interrupted = true;
        }
        if self.owns_terminal {
            give_terminal(getpgrp());
        }
    }

    /// Waits until no process of the group is left, reaping those re-parented to us. (Only
    /// once the leader is reaped: reaping it here would hide its status from the runtime.)
    /// Says on standard error what it waits for if that takes more than a moment.
    async fn group_gone(&mut self) {
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
            if let Some((status, at)) = self.status
                && !self.announced
                && at.elapsed() >= ANNOUNCE_AFTER
            {
                self.announced = true;
                self.announce(status);
            }
            // No event tells when the last process of a group exits: look again shortly.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// One line on standard error: the command ended, what baton still waits for, and what a
    /// signal does now.
    fn announce(&self, status: ExitStatus) {
        let members = members(self.pgid);
        let what = if members.is_empty() {
            format!("the rest of its process group {}", self.pgid)
        } else {
            let mut listed: Vec<String> = members
                .iter()
                .take(5)
                .map(|(pid, name)| format!("pid {pid} ({})", crate::output::one_line(name)))
                .collect();
            if members.len() > 5 {
                listed.push(format!("{} more", members.len() - 5));
            }
            format!("what it left in its process group: {}", listed.join(", "))
        };
        let key = if self.owns_terminal {
            "Ctrl-C or a signal to baton"
        } else {
            "a signal to baton"
        };
        let then = if self.interrupted {
            format!("{key} kills them (SIGKILL)")
        } else {
            format!("{key} is passed on to them, a second one kills them")
        };
        eprintln!(
            "baton: `{}` {}; the lock is held until {what} ends; {then}",
            self.program,
            crate::hold::describe(status)
        );
    }

    /// Stops the group: SIGTERM to all, SIGKILL to all after `grace`, or at once when
    /// `interrupted` fires (a second signal); returns once the group is gone.
    pub(crate) async fn stop(
        &mut self,
        grace: Duration,
        interrupted: impl std::future::Future<Output = ()>,
    ) -> ExitStatus {
        signal_group(self.pgid, Signal::SIGTERM);
        self.interrupted = true;
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

    /// The group is gone: give the terminal back and stand the watchdog down.
    pub(crate) fn finish(self) {
        if self.owns_terminal {
            give_terminal(getpgrp());
        }
        self.watchdog.stand_down();
    }
}

/// The processes of group `pgid` (pid and name), from `/proc` (Linux; elsewhere none).
fn members(pgid: Pid) -> Vec<(i32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<(i32, String)> = dir
        .filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (name) state ppid pgrp ...`; the name may hold spaces and parentheses.
            let (head, tail) = stat.rsplit_once(')')?;
            let name = head.split_once('(')?.1.to_owned();
            let pgrp: i32 = tail.split_whitespace().nth(2)?.parse().ok()?;
            let zombie = tail.split_whitespace().next() == Some("Z");
            (pgrp == pgid.as_raw() && !zombie).then_some((pid, name))
        })
        .collect();
    found.sort_unstable();
    found
}

/// The watchdog of a command's group: baton itself, run again as a hidden step named
/// `baton watchdog <baton's pid>` (see [`WATCHDOG_NAME`]), in a process group of its own (a
/// terminal's signals do not reach it), reading a pipe whose write end only baton holds.
/// It says `ready` on its standard output (another pipe) once it runs, before baton starts the
/// command. baton writes `grace <seconds>` first, then `deadline <ns>`
/// (the session's deadline on `CLOCK_MONOTONIC`, which every process of the machine reads
/// alike) before the command starts and whenever a renewal moves it, `group <pgid>` once the
/// command is started, and `done` once the group is gone. End of file without `done` means
/// baton died, however it died: the watchdog then sends the group SIGTERM, and SIGKILL
/// `grace` later (at the deadline, if that comes first) if any of it is left. A deadline that
/// comes within `grace` with no newer one told means baton is not running (stopped, starved):
/// the watchdog sends SIGTERM then, and SIGKILL at the deadline. No shell is involved.
struct Watchdog {
    child: std::process::Child,
    pipe: Option<std::process::ChildStdin>,
}

impl Watchdog {
    fn start(grace: Duration) -> std::io::Result<Watchdog> {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new(own_executable()?)
            .arg0(WATCHDOG_NAME)
            .arg(getpid().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()?;
        let pipe = child.stdin.take();
        let said = child.stdout.take();
        let mut watchdog = Watchdog { child, pipe };
        // It says `ready` once it runs as the watchdog (named, reading its pipe): the command
        // is started only then. End of file instead: it died.
        let mut line = String::new();
        let ready = said
            .map(|out| std::io::BufReader::new(out).read_line(&mut line))
            .is_some_and(|read| read.is_ok() && line.trim_end() == "ready");
        if !ready || !watchdog.tell(&format!("grace {}", grace.as_secs_f64())) {
            watchdog.stand_down();
            return Err(std::io::Error::other("it did not start"));
        }
        Ok(watchdog)
    }

    fn tell(&mut self, line: &str) -> bool {
        use std::io::Write;
        self.pipe
            .as_mut()
            .is_some_and(|p| writeln!(p, "{line}").and_then(|()| p.flush()).is_ok())
    }

    /// Tells the watchdog the group to guard; `false` if it cannot be told (it is gone).
    fn guard(&mut self, pgid: Pid) -> bool {
        self.tell(&format!("group {pgid}"))
    }

    fn deadline(&mut self, at: std::time::Instant) {
        if let Some(at) = monotonic(at) {
            self.tell(&format!("deadline {}", at.as_nanos()));
        }
    }

    /// The group is gone: the watchdog exits without touching it (its number may be reused
    /// from now on).
    fn stand_down(mut self) {
        if !self.tell("done") {
            let _ = self.child.kill();
        }
        drop(self.pipe.take());
        let _ = self.child.wait();
    }
}

/// Now on `CLOCK_MONOTONIC`: the clock std's `Instant` reads on Linux, shared by every
/// process of the machine, so that baton and its watchdog agree on a deadline.
fn monotonic_now() -> Option<Duration> {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .ok()
        .map(Duration::from)
}

/// `at` on `CLOCK_MONOTONIC` (an `Instant` cannot be sent to another process).
fn monotonic(at: std::time::Instant) -> Option<Duration> {
    let now = std::time::Instant::now();
    let mono = monotonic_now()?;
    Some(match at.checked_duration_since(now) {
        Some(ahead) => mono + ahead,
        None => mono.saturating_sub(now - at),
    })
}

/// What the watchdog knows and has done.
#[derive(Debug, Default)]
struct Watched {
    /// How long the group may handle SIGTERM before SIGKILL.
    grace: Duration,
    pgid: Option<Pid>,
    /// The latest session deadline baton told, on `CLOCK_MONOTONIC`.
    deadline: Option<Duration>,
    /// When SIGTERM was sent, the instant SIGKILL follows (it stays, whatever baton tells
    /// afterwards, as baton's own stop does).
    kill_at: Option<Duration>,
    killed: bool,
}

impl Watched {
    /// Takes one line of baton's; `true` for `done`.
    fn told(&mut self, line: &str) -> bool {
        match line.split_once(' ') {
            _ if line == "done" => return true,
            Some(("grace", secs)) => {
                if let Some(grace) = secs
                    .parse::<f64>()
                    .ok()
                    .and_then(|g| Duration::try_from_secs_f64(g).ok())
                {
                    self.grace = grace;
                }
            }
            Some(("group", n)) => self.pgid = n.parse().ok().map(Pid::from_raw),
            Some(("deadline", ns)) => {
                if let Ok(ns) = ns.parse::<u64>() {
                    let at = Duration::from_nanos(ns);
                    self.deadline = Some(self.deadline.map_or(at, |d| d.max(at)));
                }
            }
            _ => {}
        }
        false
    }

    /// When the next signal is due without news from baton, if one is.
    fn next(&self) -> Option<Duration> {
        if self.killed {
            return None;
        }
        self.pgid?;
        self.kill_at
            .or_else(|| self.deadline.map(|d| d.saturating_sub(self.grace)))
    }

    /// Sends what is due at `now`.
    fn act(&mut self, now: Duration) {
        let (Some(pgid), Some(due)) = (self.pgid, self.next()) else {
            return;
        };
        if now < due {
            return;
        }
        match self.kill_at {
            None => {
                signal_group(pgid, Signal::SIGTERM);
                self.kill_at = self.deadline;
            }
            Some(_) => {
                signal_group(pgid, Signal::SIGKILL);
                self.killed = true;
            }
        }
    }
}

/// The watchdog step (see [`Watchdog`]): named `baton watchdog <baton's pid>`, the pipe on its
/// standard input.
fn watchdog_step() -> u8 {
    use std::os::fd::AsFd;
    #[cfg(target_os = "linux")]
    let _ = nix::sys::prctl::set_name(WATCHDOG_COMM);
    {
        use std::io::Write;
        // baton waits for this before it starts the command; nothing else is written here.
        let mut stdout = std::io::stdout().lock();
        if writeln!(stdout, "ready")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return exit::ERROR;
        }
    }
    let stdin = std::io::stdin();
    let mut watched = Watched::default();
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        let now = monotonic_now().unwrap_or_default();
        // Wait for baton's next line until the next signal is due (rounded up, so as not to
        // wake just before it).
        let timeout = match watched.next() {
            None => PollTimeout::NONE,
            Some(due) => {
                let ms = due.saturating_sub(now).as_nanos().div_ceil(1_000_000);
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
            }
        };
        let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(0) => {
                // Nothing more from baton: what is due is due. (Only here, once every line
                // baton wrote has been read: a deadline told in time always counts.)
                watched.act(monotonic_now().unwrap_or_default());
                continue;
            }
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(_) => break,
        }
        match nix::unistd::read(&stdin, &mut chunk) {
            Ok(0) => break,
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
            Err(Errno::EINTR) => continue,
            Err(_) => break,
        }
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            if watched.told(String::from_utf8_lossy(&line).trim_end()) {
                return 0;
            }
        }
    }
    // End of file without "done": baton is gone.
    let Some(pgid) = watched.pgid else { return 0 };
    if watched.killed {
        return 0;
    }
    let now = monotonic_now().unwrap_or_default();
    let kill_at = match watched.kill_at {
        Some(at) => at,
        None => {
            signal_group(pgid, Signal::SIGTERM);
            let after_grace = now + watched.grace;
            watched.deadline.map_or(after_grace, |d| d.min(after_grace))
        }
    };
    while monotonic_now().unwrap_or(kill_at) < kill_at {
        if killpg(pgid, None) == Err(Errno::ESRCH) {
            return 0;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    signal_group(pgid, Signal::SIGKILL);
    0
}

/// How long the watchdog lets the group handle SIGTERM after baton died before SIGKILL: at
/// most a third of the TTL (and `--kill-after` if shorter). The keep-alive renews the lease
/// every third of the TTL, from before each request, so when baton dies the lease has at
/// least two thirds of the TTL left (less only if renewals were failing, and then baton
/// itself was about to stop the group as lost); the group gets SIGKILL with a third of the TTL
/// to spare, before the lease can have expired and another holder can have been granted.
pub(crate) fn orphan_grace(kill_after: Duration, ttl: Duration) -> Duration {
    kill_after.min(ttl / 3)
}

/// Which of SIGINT, SIGTERM and SIGHUP baton inherited as ignored (`nohup`, a parent that
/// ignores them): those stay ignored, for the command (and SIGTERM and SIGHUP for baton).
pub(crate) fn inherited_ignored() -> Vec<Signal> {
    let caller = sigstate::caller();
    [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP]
        .into_iter()
        .filter(|s| caller.ignores(*s))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_killed_batons_group_is_killed_within_a_third_of_the_ttl() {
        let s = Duration::from_secs;
        assert_eq!(orphan_grace(s(10), s(10)), s(10) / 3);
        assert_eq!(orphan_grace(s(60), s(2)), s(2) / 3);
        assert_eq!(orphan_grace(s(1), s(30)), s(1));
    }

    /// The watchdog stops the group on the last deadline baton told: SIGTERM `grace` before
    /// it, SIGKILL at it; a deadline told after SIGTERM does not put SIGKILL off.
    #[test]
    fn the_watchdog_acts_on_the_last_deadline_told() {
        let s = Duration::from_secs;
        let mut watched = Watched::default();
        assert!(!watched.told("grace 1"));
        assert_eq!(watched.grace, s(1));
        assert!(!watched.told(&format!("deadline {}", s(10).as_nanos())));
        assert_eq!(watched.next(), None, "no group yet");
        assert!(!watched.told("group 4242"));
        assert_eq!(watched.next(), Some(s(9)));
        // A renewal moves it; an older one told late does not move it back.
        watched.told(&format!("deadline {}", s(13).as_nanos()));
        watched.told(&format!("deadline {}", s(12).as_nanos()));
        assert_eq!(watched.next(), Some(s(12)));
        // Once SIGTERM is sent (here: as `act` records it), SIGKILL stays at that deadline.
        watched.kill_at = watched.deadline;
        watched.told(&format!("deadline {}", s(20).as_nanos()));
        assert_eq!(watched.next(), Some(s(13)));
        watched.killed = true;
        assert_eq!(watched.next(), None);
        assert!(watched.told("done"));
    }

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
