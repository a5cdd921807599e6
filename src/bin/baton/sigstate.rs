//! The signal state baton's caller gave it, recorded before Rust's runtime changes it, and
//! restored in the command just before `exec` (issue #25).
//!
//! Rust's runtime sets SIGPIPE to "ignored" before `main` runs, and an ignored signal stays
//! ignored across `exec`: without this module every command would start with SIGPIPE ignored
//! (`yes | head -1` exiting 1 with "Broken pipe" instead of dying of SIGPIPE, Python printing
//! `BrokenPipeError`, `while :; do echo y; done | head -1` never ending). And `std`'s
//! `Command` empties the signal mask of the children it starts. A command under baton must
//! start as it would have without baton: the signals the caller ignored ignored (`nohup`,
//! `trap '' INT`, a shell's background job), every other one at its default, and the
//! caller's signal mask.
//!
//! The only `unsafe` code of the binary lives here, each use small and commented:
//! - a function in `.init_array` (run by the C runtime before `main`, so before Rust's
//!   runtime touches SIGPIPE) that *reads* the caller's dispositions and mask;
//! - setting a signal to `SIG_DFL` or `SIG_IGN` in the exec step, just before `exec`.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use nix::libc;
use nix::sys::signal::{SigHandler, Signal};

/// Signals 1..=64 as bits (`1 << (n - 1)`): which the caller ignored and which it blocked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallerSignals {
    pub(crate) ignored: u64,
    pub(crate) blocked: u64,
}

static RECORDED: AtomicBool = AtomicBool::new(false);
static IGNORED: AtomicU64 = AtomicU64::new(0);
static BLOCKED: AtomicU64 = AtomicU64::new(0);

/// The highest signal number looked at (Linux has 64; others fewer, and the C library says
/// "invalid" for the rest).
const MAX_SIGNAL: i32 = 64;

fn bit(sig: i32) -> u64 {
    1u64 << (sig - 1)
}

// Run by the C runtime before `main` (glibc and musl call `.init_array` entries, macOS the
// `__mod_init_func` ones), so before `std` sets SIGPIPE to ignored.
#[cfg(any(
    target_os = "linux",
    target_os = "android",
    target_os = "freebsd",
    target_os = "netbsd",
    target_os = "openbsd",
    target_os = "dragonfly"
))]
#[used]
// SAFETY: a plain `extern "C" fn()` pointer in the section the C runtime calls at start.
#[unsafe(link_section = ".init_array")]
static RECORD_AT_START: extern "C" fn() = record_at_start;

#[cfg(target_vendor = "apple")]
#[used]
// SAFETY: as above, in the section dyld calls at start.
#[unsafe(link_section = "__DATA,__mod_init_func")]
static RECORD_AT_START: extern "C" fn() = record_at_start;

extern "C" fn record_at_start() {
    let state = read_current();
    IGNORED.store(state.ignored, Ordering::Relaxed);
    BLOCKED.store(state.blocked, Ordering::Relaxed);
    RECORDED.store(true, Ordering::Release);
}

/// The process's current dispositions ("ignored" or not) and mask. Only reads.
fn read_current() -> CallerSignals {
    let mut state = CallerSignals {
        ignored: 0,
        blocked: 0,
    };
    for sig in 1..=MAX_SIGNAL {
        // SAFETY: an all-zero `sigaction` is a valid value to be overwritten; a null new
        // action makes `sigaction` only read the current one.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        let read = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
        if read == 0 && old.sa_sigaction == libc::SIG_IGN {
            state.ignored |= bit(sig);
        }
    }
    // SAFETY: as above; a null new set makes `pthread_sigmask` only read the mask.
    let mut mask: libc::sigset_t = unsafe { std::mem::zeroed() };
    if unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut mask) } == 0 {
        for sig in 1..=MAX_SIGNAL {
            // SAFETY: `mask` was filled in by `pthread_sigmask`.
            if unsafe { libc::sigismember(&mask, sig) } == 1 {
                state.blocked |= bit(sig);
            }
        }
    }
    state
}

/// What the caller gave baton. Where nothing ran before `main` (an unknown platform), what
/// is current, with SIGPIPE taken as not ignored (Rust's runtime ignored it itself).
pub(crate) fn caller() -> CallerSignals {
    if RECORDED.load(Ordering::Acquire) {
        return CallerSignals {
            ignored: IGNORED.load(Ordering::Relaxed),
            blocked: BLOCKED.load(Ordering::Relaxed),
        };
    }
    let mut now = read_current();
    now.ignored &= !bit(libc::SIGPIPE);
    now
}

impl CallerSignals {
    /// Whether the caller ignored `sig`.
    pub(crate) fn ignores(&self, sig: Signal) -> bool {
        self.ignored & bit(sig as i32) != 0
    }

    /// The two sets as one argument of the exec step: `<ignored hex>:<blocked hex>`.
    pub(crate) fn to_arg(self) -> String {
        format!("{:x}:{:x}", self.ignored, self.blocked)
    }

    pub(crate) fn from_arg(arg: &str) -> Option<Self> {
        let (ignored, blocked) = arg.split_once(':')?;
        Some(CallerSignals {
            ignored: u64::from_str_radix(ignored, 16).ok()?,
            blocked: u64::from_str_radix(blocked, 16).ok()?,
        })
    }

    /// In the exec step, just before `exec`: every signal the caller ignored ignored, every
    /// other one at its default (handlers would not survive `exec` anyway), and the caller's
    /// mask. Signals the C library keeps for itself are refused by it and left alone.
    pub(crate) fn restore(self) -> nix::Result<()> {
        for sig in Signal::iterator() {
            if matches!(sig, Signal::SIGKILL | Signal::SIGSTOP) {
                continue;
            }
            let handler = if self.ignores(sig) {
                SigHandler::SigIgn
            } else {
                SigHandler::SigDfl
            };
            // SAFETY: SIG_DFL and SIG_IGN are no handler: no code of ours runs on a signal,
            // so nothing can be unsound about when it runs. The exec step has one thread.
            unsafe { nix::sys::signal::signal(sig, handler) }?;
        }
        // Real-time signals: nobody in baton changes their dispositions, so they are as the
        // caller left them; only their place in the mask is restored.
        // SAFETY: `sigemptyset` initialises the set; `sigaddset` refuses numbers it does not
        // know (ignored here); `pthread_sigmask` reads the set and writes no old one.
        let mut mask: libc::sigset_t = unsafe { std::mem::zeroed() };
        unsafe { libc::sigemptyset(&mut mask) };
        for sig in 1..=MAX_SIGNAL {
            if self.blocked & bit(sig) != 0 {
                unsafe { libc::sigaddset(&mut mask, sig) };
            }
        }
        let set = unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut()) };
        nix::errno::Errno::result(set).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_passes_through_an_argument() {
        let state = CallerSignals {
            ignored: bit(libc::SIGHUP) | bit(libc::SIGINT),
            blocked: bit(libc::SIGUSR1) | bit(40),
        };
        assert_eq!(CallerSignals::from_arg(&state.to_arg()), Some(state));
        assert!(state.ignores(Signal::SIGHUP) && !state.ignores(Signal::SIGPIPE));
        assert_eq!(CallerSignals::from_arg("zz:1"), None);
    }

    #[test]
    fn recorded_before_the_runtime_ignored_sigpipe() {
        // The test harness is started by cargo with SIGPIPE at its default; Rust's runtime
        // ignores it before `main`, the recording ran before that.
        assert!(RECORDED.load(Ordering::Acquire));
        assert!(!caller().ignores(Signal::SIGPIPE));
    }
}
