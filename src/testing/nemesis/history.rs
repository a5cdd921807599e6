//! The history: one line per event, every line stamped with `CLOCK_MONOTONIC` (nanoseconds),
//! which all processes of one machine share.

use std::fmt;

/// Nanoseconds on `CLOCK_MONOTONIC`: the one clock of a history (the runner, the resource and
/// every client process read the same clock).
pub fn now_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => {
            let secs = u64::try_from(t.tv_sec()).unwrap_or(0);
            let nanos = u64::try_from(t.tv_nsec()).unwrap_or(0);
            secs * 1_000_000_000 + nanos
        }
        // CLOCK_MONOTONIC exists on every Linux; 0 would sort first and show in a window.
        Err(_) => 0,
    }
}

/// The prefix of every history line a client prints on its standard output.
pub(crate) const LINE_PREFIX: &str = "NEMESIS";

/// One event of a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// When, in nanoseconds on `CLOCK_MONOTONIC`.
    pub at: u64,
    /// Who: a client (`c0`, `c1`, ...), `resource`, or `nemesis` (the runner).
    pub who: String,
    /// What happened.
    pub what: What,
}

/// What happened. Tokens are the recipe's fencing tokens; `lock` is the lock's name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum What {
    /// A client process started (`incarnation` counts its restarts).
    Start {
        /// The lock it contends for.
        lock: String,
        /// Its process id.
        pid: u32,
        /// 0 for the first process of this client, then one more per restart.
        incarnation: u32,
    },
    /// A session was created.
    Session,
    /// `lock()`, `acquire()`, `read()`, `write()` or `campaign()` was called.
    Acquire {
        /// `x` exclusive, `r` read, `w` write (RwLock).
        mode: char,
    },
    /// It returned a guard with this token.
    Granted {
        /// The fencing token.
        token: u64,
        /// As in [`What::Acquire`].
        mode: char,
    },
    /// It returned an error or timed out.
    AcquireFailed {
        /// The error, one word per line.
        reason: String,
    },
    /// The guard's `lost()` resolved.
    Lost {
        /// The guard's token.
        token: u64,
    },
    /// The fenced read-modify-write began (claim, read, write).
    WriteInvoked {
        /// The guard's token.
        token: u64,
    },
    /// The resource accepted the write of `value` (acknowledged to the client).
    WriteOk {
        /// The guard's token.
        token: u64,
        /// The counter's new value.
        value: u64,
    },
    /// The resource refused the claim, the read or the write (a higher token came first).
    WriteRefused {
        /// The guard's token.
        token: u64,
    },
    /// The client does not know whether the write was applied (the connection broke).
    WriteUnknown {
        /// The guard's token.
        token: u64,
    },
    /// `unlock()`, `release()` or `resign()` was called.
    Release {
        /// The guard's token.
        token: u64,
    },
    /// ... and returned `Ok`.
    Released {
        /// The guard's token.
        token: u64,
    },
    /// ... and returned an error (`NotOwner` after a loss, or the outcome is unknown).
    ReleaseFailed {
        /// The guard's token.
        token: u64,
        /// The error.
        reason: String,
    },
    /// The client process ends by itself (asked to stop).
    Exit,
    /// The resource accepted a claim (`write: false`) or a write of `value`.
    Accepted {
        /// The lock the resource belongs to.
        lock: String,
        /// The token it carried.
        token: u64,
        /// The client that sent it.
        client: String,
        /// Whether it was the write (else the claim or the read).
        write: bool,
        /// The counter after it.
        value: u64,
    },
    /// The resource appended an entry to the lock's log (after the holder's write, in the same
    /// hold).
    Appended {
        /// The lock the resource belongs to.
        lock: String,
        /// The token it carried.
        token: u64,
        /// The client that sent it.
        client: String,
        /// Its place in the log, from 1.
        index: u64,
    },
    /// The resource refused a claim, read, write or append: its token is below `highest`.
    Refused {
        /// The lock the resource belongs to.
        lock: String,
        /// The token it carried.
        token: u64,
        /// The client that sent it.
        client: String,
        /// The highest token the resource had accepted.
        highest: u64,
    },
    /// A fault began.
    FaultStart {
        /// Its number in the schedule.
        id: u32,
        /// What it is, in words (`pause c3`, `redis restart from snapshot`).
        what: String,
    },
    /// A fault of the schedule that the run leaves out, by the schedule's own rule (never by
    /// what the server of the moment allows), so that the faults carried out are a function
    /// of the seed.
    FaultSkipped {
        /// Its number in the schedule.
        id: u32,
        /// What it would have been, in words.
        what: String,
    },
    /// A fault healed (a paused client resumed, a cut healed, a server is back).
    FaultEnd {
        /// Its number in the schedule.
        id: u32,
    },
    /// The fault of this number makes the store forget or go back in time (recorded just
    /// after its start): its end begins a new store epoch, which the checker's rule 6
    /// (**epoch**) holds the grants after it to.
    StateLost {
        /// The fault's number in the schedule.
        id: u32,
    },
    /// The runner killed a client process (SIGKILL, a fault or the end of the run).
    Killed {
        /// The client.
        client: String,
    },
    /// A client process had ended on its own (not killed, not asked to stop): a crash.
    Died {
        /// The client.
        client: String,
        /// How it ended (`exit status: 1`, `signal: 6 (SIGABRT)`), one word.
        status: String,
    },
    /// The last fault healed: from here, every live client must be granted within the bound.
    Healed,
    /// The runner asked every client to stop.
    Stopping,
    /// The run's backend and seed (the history's first line).
    Run {
        /// `etcd`, `redis`, `zookeeper`, ...
        backend: String,
        /// The seed that replays its schedule.
        seed: u64,
    },
    /// A lock of the run and its recipe (a line of the history's head: what the checker
    /// needs besides the events, so that a saved history can be checked again).
    PlanLock {
        /// The lock's name.
        lock: String,
        /// The recipe's name ([`Recipe::name`](super::Recipe::name)).
        recipe: String,
    },
    /// A client of the run and the lock it contends for.
    PlanClient {
        /// `c0`, `c1`, ...
        client: String,
        /// The lock.
        lock: String,
    },
    /// The progress bound the run was checked against, in milliseconds.
    PlanBound {
        /// Milliseconds.
        ms: u64,
    },
    /// The clients' Redis restart grace the run was checked against, in milliseconds.
    PlanGrace {
        /// Milliseconds.
        ms: u64,
    },
    /// An entry still in the backend after every client stopped and every lease could end.
    Leftover {
        /// The lock.
        lock: String,
        /// The entry's key.
        key: String,
    },
}

/// A word with no white space: how free text goes into a line.
pub(crate) fn word(s: &str) -> String {
    let w: String = s
        .chars()
        .map(|c| if c.is_whitespace() { '_' } else { c })
        .take(160)
        .collect();
    if w.is_empty() { "-".to_owned() } else { w }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{LINE_PREFIX} {} {} ", self.at, self.who)?;
        match &self.what {
            What::Start {
                lock,
                pid,
                incarnation,
            } => write!(f, "start {lock} {pid} {incarnation}"),
            What::Session => write!(f, "session"),
            What::Acquire { mode } => write!(f, "acquire {mode}"),
            What::Granted { token, mode } => write!(f, "granted {token} {mode}"),
            What::AcquireFailed { reason } => write!(f, "acquire-failed {}", word(reason)),
            What::Lost { token } => write!(f, "lost {token}"),
            What::WriteInvoked { token } => write!(f, "write {token}"),
            What::WriteOk { token, value } => write!(f, "write-ok {token} {value}"),
            What::WriteRefused { token } => write!(f, "write-refused {token}"),
            What::WriteUnknown { token } => write!(f, "write-unknown {token}"),
            What::Release { token } => write!(f, "release {token}"),
            What::Released { token } => write!(f, "released {token}"),
            What::ReleaseFailed { token, reason } => {
                write!(f, "release-failed {token} {}", word(reason))
            }
            What::Exit => write!(f, "exit"),
            What::Accepted {
                lock,
                token,
                client,
                write,
                value,
            } => {
                let op = if *write { "write" } else { "claim" };
                write!(f, "accepted {lock} {token} {client} {op} {value}")
            }
            What::Refused {
                lock,
                token,
                client,
                highest,
            } => write!(f, "refused {lock} {token} {client} {highest}"),
            What::Appended {
                lock,
                token,
                client,
                index,
            } => write!(f, "appended {lock} {token} {client} {index}"),
            What::FaultStart { id, what } => write!(f, "fault {id} {}", word(what)),
            What::FaultSkipped { id, what } => write!(f, "skipped {id} {}", word(what)),
            What::FaultEnd { id } => write!(f, "healed {id}"),
            What::StateLost { id } => write!(f, "state-lost {id}"),
            What::Killed { client } => write!(f, "killed {client}"),
            What::Died { client, status } => write!(f, "died {client} {}", word(status)),
            What::Healed => write!(f, "all-healed"),
            What::Stopping => write!(f, "stopping"),
            What::Leftover { lock, key } => write!(f, "leftover {lock} {}", word(key)),
            What::Run { backend, seed } => write!(f, "run {} {seed}", word(backend)),
            What::PlanLock { lock, recipe } => write!(f, "plan-lock {lock} {recipe}"),
            What::PlanClient { client, lock } => write!(f, "plan-client {client} {lock}"),
            What::PlanBound { ms } => write!(f, "plan-bound {ms}"),
            What::PlanGrace { ms } => write!(f, "plan-grace {ms}"),
        }
    }
}

impl Event {
    /// Parses a line printed by [`Display`](fmt::Display); `None` for any other line.
    pub fn parse(line: &str) -> Option<Event> {
        let mut w = line.split_whitespace();
        if w.next()? != LINE_PREFIX {
            return None;
        }
        let at = w.next()?.parse().ok()?;
        let who = w.next()?.to_owned();
        let kind = w.next()?;
        let mut s = || w.next().map(str::to_owned);
        let n = |v: Option<String>| v.and_then(|v| v.parse::<u64>().ok());
        let c = |v: Option<String>| v.and_then(|v| v.chars().next());
        let what = match kind {
            "start" => What::Start {
                lock: s()?,
                pid: n(s())?.try_into().ok()?,
                incarnation: n(s())?.try_into().ok()?,
            },
            "session" => What::Session,
            "acquire" => What::Acquire { mode: c(s())? },
            "granted" => What::Granted {
                token: n(s())?,
                mode: c(s())?,
            },
            "acquire-failed" => What::AcquireFailed { reason: s()? },
            "lost" => What::Lost { token: n(s())? },
            "write" => What::WriteInvoked { token: n(s())? },
            "write-ok" => What::WriteOk {
                token: n(s())?,
                value: n(s())?,
            },
            "write-refused" => What::WriteRefused { token: n(s())? },
            "write-unknown" => What::WriteUnknown { token: n(s())? },
            "release" => What::Release { token: n(s())? },
            "released" => What::Released { token: n(s())? },
            "release-failed" => What::ReleaseFailed {
                token: n(s())?,
                reason: s()?,
            },
            "exit" => What::Exit,
            "accepted" => What::Accepted {
                lock: s()?,
                token: n(s())?,
                client: s()?,
                write: s()? == "write",
                value: n(s())?,
            },
            "appended" => What::Appended {
                lock: s()?,
                token: n(s())?,
                client: s()?,
                index: n(s())?,
            },
            "refused" => What::Refused {
                lock: s()?,
                token: n(s())?,
                client: s()?,
                highest: n(s())?,
            },
            "fault" => What::FaultStart {
                id: n(s())?.try_into().ok()?,
                what: s()?,
            },
            "skipped" => What::FaultSkipped {
                id: n(s())?.try_into().ok()?,
                what: s()?,
            },
            "healed" => What::FaultEnd {
                id: n(s())?.try_into().ok()?,
            },
            "state-lost" => What::StateLost {
                id: n(s())?.try_into().ok()?,
            },
            "killed" => What::Killed { client: s()? },
            "died" => What::Died {
                client: s()?,
                status: s()?,
            },
            "all-healed" => What::Healed,
            "stopping" => What::Stopping,
            "leftover" => What::Leftover {
                lock: s()?,
                key: s()?,
            },
            "run" => What::Run {
                backend: s()?,
                seed: n(s())?,
            },
            "plan-lock" => What::PlanLock {
                lock: s()?,
                recipe: s()?,
            },
            "plan-client" => What::PlanClient {
                client: s()?,
                lock: s()?,
            },
            "plan-bound" => What::PlanBound { ms: n(s())? },
            "plan-grace" => What::PlanGrace { ms: n(s())? },
            _ => return None,
        };
        Some(Event { at, who, what })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_reads_back() {
        let events = [
            What::Start {
                lock: "n/mutex".into(),
                pid: 7,
                incarnation: 1,
            },
            What::Session,
            What::Acquire { mode: 'w' },
            What::Granted {
                token: 41,
                mode: 'x',
            },
            What::AcquireFailed {
                reason: "session_lost".into(),
            },
            What::Lost { token: 41 },
            What::WriteInvoked { token: 41 },
            What::WriteOk {
                token: 41,
                value: 3,
            },
            What::WriteRefused { token: 41 },
            What::WriteUnknown { token: 41 },
            What::Release { token: 41 },
            What::Released { token: 41 },
            What::ReleaseFailed {
                token: 41,
                reason: "not_owner".into(),
            },
            What::Exit,
            What::Accepted {
                lock: "n/mutex".into(),
                token: 41,
                client: "c1".into(),
                write: true,
                value: 3,
            },
            What::Refused {
                lock: "n/mutex".into(),
                token: 40,
                client: "c2".into(),
                highest: 41,
            },
            What::FaultStart {
                id: 3,
                what: "pause_c1".into(),
            },
            What::FaultEnd { id: 3 },
            What::FaultSkipped {
                id: 4,
                what: "postgres_killed,_restarted_without_data".into(),
            },
            What::StateLost { id: 3 },
            What::Appended {
                lock: "n/mutex".into(),
                token: 41,
                client: "c1".into(),
                index: 7,
            },
            What::Killed {
                client: "c1".into(),
            },
            What::Died {
                client: "c1".into(),
                status: "signal_6".into(),
            },
            What::Healed,
            What::Stopping,
            What::Leftover {
                lock: "n/mutex".into(),
                key: "n/mutex/ab".into(),
            },
            What::Run {
                backend: "redis".into(),
                seed: 2,
            },
            What::PlanLock {
                lock: "n/mutex".into(),
                recipe: "mutex".into(),
            },
            What::PlanClient {
                client: "c0".into(),
                lock: "n/mutex".into(),
            },
            What::PlanBound { ms: 18_000 },
            What::PlanGrace { ms: 2_000 },
        ];
        for what in events {
            let e = Event {
                at: 12,
                who: "c1".into(),
                what,
            };
            assert_eq!(Event::parse(&e.to_string()), Some(e));
        }
        assert_eq!(Event::parse("something else"), None);
    }
}
