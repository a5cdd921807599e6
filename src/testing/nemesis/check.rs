//! The checker: reads one history and reports every broken promise with the shortest window
//! of events that shows it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use super::Recipe;
use super::history::{Event, What};

/// What the checker needs to know about the run besides the history.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Each lock's name and recipe.
    pub locks: Vec<(String, Recipe)>,
    /// The clients (`c0`, ...), each with the lock it contends for.
    pub clients: Vec<(String, String)>,
    /// Every live client must be granted within this bound after the last fault healed.
    pub progress_bound: Duration,
    /// The clients' restart grace: after a fault that loses state (a replica promoted, a
    /// server restarted without its data or from an earlier copy, a flush), nothing of the
    /// new epoch is granted before it has passed (see [`check`], rule 6).
    pub restart_grace: Duration,
}

impl Plan {
    /// Clients per recipe: the most clients any one lock has.
    pub fn clients_per_recipe(&self) -> usize {
        self.locks
            .iter()
            .map(|(lock, _)| self.clients.iter().filter(|(_, l)| l == lock).count())
            .max()
            .unwrap_or(0)
    }

    /// The head of a history that describes this plan (`run`, `plan-lock`, `plan-client`,
    /// `plan-bound`, `plan-grace` lines), so that a saved history can be checked again
    /// ([`Plan::from_history`]).
    pub fn to_events(&self) -> Vec<What> {
        let mut events: Vec<What> = self
            .locks
            .iter()
            .map(|(lock, recipe)| What::PlanLock {
                lock: lock.clone(),
                recipe: recipe.name().to_owned(),
            })
            .collect();
        events.extend(self.clients.iter().map(|(client, lock)| What::PlanClient {
            client: client.clone(),
            lock: lock.clone(),
        }));
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        events.push(What::PlanBound {
            ms: ms(self.progress_bound),
        });
        events.push(What::PlanGrace {
            ms: ms(self.restart_grace),
        });
        events
    }

    /// The plan a history's head describes; `None` if it has no `plan-lock`, names an
    /// unknown recipe, or lacks `plan-bound` or `plan-grace` (a history written before these
    /// lines).
    pub fn from_history(history: &[Event]) -> Option<Plan> {
        let mut locks = Vec::new();
        let mut clients = Vec::new();
        let mut bound = None;
        let mut grace = None;
        for e in history {
            match &e.what {
                What::PlanLock { lock, recipe } => {
                    locks.push((lock.clone(), Recipe::parse(recipe)?));
                }
                What::PlanClient { client, lock } => clients.push((client.clone(), lock.clone())),
                What::PlanBound { ms } => bound = Some(Duration::from_millis(*ms)),
                What::PlanGrace { ms } => grace = Some(Duration::from_millis(*ms)),
                _ => {}
            }
        }
        if locks.is_empty() {
            return None;
        }
        Some(Plan {
            locks,
            clients,
            progress_bound: bound?,
            restart_grace: grace?,
        })
    }
}

/// How long the locks took to be granted again once faults had healed, measured on a
/// history: the numbers behind [`Plan::progress_bound`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// For each moment at which every fault begun so far had healed (a slot of the schedule
    /// ended): the time until every lock had granted again, with the faults that had just
    /// healed, in words. A next fault that starts meanwhile counts in (an overestimate).
    pub after_each: Vec<(Duration, String)>,
    /// Such moments after which some lock was not granted again before the run ended.
    pub unrecovered: usize,
    /// After the last fault healed: the time until every client had been granted; `None`
    /// if one never was.
    pub after_last: Option<Duration>,
}

impl Recovery {
    /// The median and the longest of [`Recovery::after_each`], with the faults of the
    /// longest.
    pub fn median_and_longest(&self) -> Option<(Duration, Duration, &str)> {
        let mut times: Vec<Duration> = self.after_each.iter().map(|(d, _)| *d).collect();
        times.sort();
        let median = *times.get(times.len() / 2)?;
        let (longest, what) = self.after_each.iter().max_by_key(|(d, _)| *d)?;
        Some((median, *longest, what))
    }
}

/// Measures [`Recovery`] on `history` (sorted by time).
pub fn recovery(history: &[Event], plan: &Plan) -> Recovery {
    let lock_of: HashMap<&str, &str> = plan
        .clients
        .iter()
        .map(|(c, l)| (c.as_str(), l.as_str()))
        .collect();
    // The first grant on each lock at or after each instant: walk the grants once per
    // quiet point (histories are a few ten thousand lines).
    let grants: Vec<(u64, &str, &str)> = history
        .iter()
        .filter(|e| matches!(e.what, What::Granted { .. }))
        .filter_map(|e| Some((e.at, *lock_of.get(e.who.as_str())?, e.who.as_str())))
        .collect();
    let mut open: BTreeMap<u32, String> = BTreeMap::new();
    let mut batch: Vec<String> = Vec::new();
    let mut out = Recovery::default();
    for e in history {
        match &e.what {
            What::FaultStart { id, what } => {
                open.insert(*id, what.replace('_', " "));
            }
            What::FaultEnd { id } => {
                if let Some(what) = open.remove(id) {
                    batch.push(what);
                }
                if !open.is_empty() {
                    continue;
                }
                let faults = std::mem::take(&mut batch).join(" + ");
                let mut longest = Some(0u64);
                for (lock, _) in &plan.locks {
                    let next = grants
                        .iter()
                        .find(|(at, l, _)| *at > e.at && *l == lock.as_str());
                    longest = match (longest, next) {
                        (Some(l), Some((at, _, _))) => Some(l.max(at - e.at)),
                        _ => None,
                    };
                }
                match longest {
                    Some(ns) => out.after_each.push((Duration::from_nanos(ns), faults)),
                    None => out.unrecovered += 1,
                }
            }
            What::Healed => {
                let mut longest = Some(0u64);
                for (client, _) in &plan.clients {
                    let next = grants
                        .iter()
                        .find(|(at, _, who)| *at > e.at && *who == client.as_str());
                    longest = match (longest, next) {
                        (Some(l), Some((at, _, _))) => Some(l.max(at - e.at)),
                        _ => None,
                    };
                }
                out.after_last = longest.map(Duration::from_nanos);
            }
            _ => {}
        }
    }
    out
}

/// A broken promise.
#[derive(Debug, Clone)]
pub struct Violation {
    /// The rule: `fence`, `counter`, `log`, `token-order`, `lost-first`, `epoch`, `progress`,
    /// `crash`, `leftover`.
    pub rule: &'static str,
    /// What is wrong, in words.
    pub message: String,
    /// The shortest window of the history that shows it.
    pub window: Vec<Event>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "[{}] {}", self.rule, self.message)?;
        let start = self.window.first().map_or(0, |e| e.at);
        for e in &self.window {
            let line = e.to_string();
            // Drop the prefix and the raw clock: show milliseconds into the window.
            let rest = line.splitn(3, ' ').nth(2).unwrap_or(&line);
            let offset_ms = (e.at.saturating_sub(start)) as f64 / 1e6;
            writeln!(f, "    +{offset_ms:>10.3} ms  {rest}")?;
        }
        Ok(())
    }
}

/// One hold: from the grant to the release call, the `lost()`, the process's death or exit.
#[derive(Debug, Clone)]
struct Hold {
    client: String,
    token: u64,
    mode: char,
    invoked: u64,
    granted: u64,
    end: u64,
    /// The client was paused (SIGSTOP) between the call and the end: it cannot be told in
    /// time, only fenced.
    paused: bool,
}

/// The fault's kind and target from its words (`pause c4 (SIGSTOP)`, or as read back from a
/// line, `pause_c4_(SIGSTOP)`).
fn client_of_fault(what: &str) -> Option<(&str, &str)> {
    let mut w = what.split(|c: char| c == '_' || c.is_whitespace());
    Some((w.next()?, w.next()?))
}

/// How late a grant of a new epoch may seem to come before its restart grace ended: the
/// server counts the grace in whole milliseconds of its own clock, the history in
/// nanoseconds of `CLOCK_MONOTONIC`.
const GRACE_SLACK: Duration = Duration::from_millis(5);

/// How long after a manual `SENTINEL FAILOVER` is announced the old primary may still grant to
/// a client that asked after the announcement: the old primary stays up and answers as a
/// primary until Sentinel demotes it (seconds), and a client leaves it once it has heard the
/// announcement and looked the new primary up (50-90 ms in the nemesis's runs on 2 busy
/// cores). Such a grant is the old store's, not the new epoch's: the epoch rule's early-grant
/// check starts after it (its holder is told when it reaches the new primary, which rule 3
/// checks; a client that stayed behind longer is still caught). Below the restart grace
/// (the nemesis's is 2 s), or the check would see nothing.
const SENTINEL_HANDOFF: Duration = Duration::from_millis(500);

/// Whether a fault's words say the old primary stays up, answering, past the fault's end: a
/// manual `SENTINEL FAILOVER` (`redis-sentinel: SENTINEL FAILOVER ...`, or as read back, with
/// `_` for spaces).
fn old_primary_answers_on(what: &str) -> bool {
    what.replace('_', " ").contains("SENTINEL FAILOVER")
}

/// Whether a fault's words (`redis replica promoted ...`, or as read back from a line, with
/// `_` for spaces) say it is a promotion.
fn is_promotion(what: &str) -> bool {
    what.contains("replica") && what.contains("promoted")
}

/// `; and N more grants like it` when there were `n` > 1.
fn more(n: usize) -> String {
    if n > 1 {
        format!("; and {} more grants like it", n - 1)
    } else {
        String::new()
    }
}

/// Checks `history` (sorted by time) against `plan`.
///
/// Besides the rules of the [module docs](super), after every fault that makes the store
/// forget or go back in time (6, **epoch**: a `state-lost` line names it; a Redis replica or
/// a PostgreSQL standby promoted, a server restarted without its data or from an earlier
/// copy, a Redis `FLUSHALL`; docs/reliability.md): the fault ends once the store is back,
/// before any client can reach it (the nemesis cuts every client off for a restart, and sends
/// them to a promoted replica only after), so every grant of the store from before was made
/// before its end and every grant of the new epoch after (but after a manual `SENTINEL
/// FAILOVER`, whose old primary answers until its clients have heard the announcement: its
/// grants within 500 ms (`SENTINEL_HANDOFF`) of the end are the old store's). A grant asked for after
/// the end comes no sooner than [`Plan::restart_grace`] after it; a grant that came later than that,
/// to a client not paused since the end (so not an answer from before read late), has a
/// token above every token granted before it. (Holders from before told first: rule 3.)
pub fn check(history: &[Event], plan: &Plan) -> Vec<Violation> {
    let mut violations = Vec::new();
    let lock_of: HashMap<&str, &str> = plan
        .clients
        .iter()
        .map(|(c, l)| (c.as_str(), l.as_str()))
        .collect();
    // Pause windows per client.
    let mut pause_start: HashMap<u32, (String, u64)> = HashMap::new();
    let mut pauses: HashMap<String, Vec<(u64, u64)>> = HashMap::new();
    let end_of_history = history.last().map_or(0, |e| e.at);
    for e in history {
        match &e.what {
            What::FaultStart { id, what } => {
                if let Some(("pause", client)) = client_of_fault(what) {
                    pause_start.insert(*id, (client.to_owned(), e.at));
                }
            }
            What::FaultEnd { id } => {
                if let Some((client, from)) = pause_start.remove(id) {
                    pauses.entry(client).or_default().push((from, e.at));
                }
            }
            _ => {}
        }
    }
    for (_, (client, from)) in pause_start {
        pauses
            .entry(client)
            .or_default()
            .push((from, end_of_history));
    }
    let paused_during = |client: &str, from: u64, to: u64| {
        pauses
            .get(client)
            .is_some_and(|p| p.iter().any(|&(a, b)| a <= to && b >= from))
    };

    // Holds, per lock.
    let mut holds: BTreeMap<String, Vec<Hold>> = BTreeMap::new();
    let mut open: HashMap<String, Hold> = HashMap::new();
    let mut invoked: HashMap<String, u64> = HashMap::new();
    let close = |open: &mut HashMap<String, Hold>,
                 holds: &mut BTreeMap<String, Vec<Hold>>,
                 client: &str,
                 at: u64| {
        if let Some(mut h) = open.remove(client) {
            h.end = at;
            h.paused = paused_during(client, h.invoked, h.end);
            if let Some(lock) = lock_of.get(client) {
                holds.entry((*lock).to_owned()).or_default().push(h);
            }
        }
    };
    for e in history {
        let who = e.who.as_str();
        match &e.what {
            What::Acquire { .. } => {
                invoked.insert(e.who.clone(), e.at);
            }
            What::Granted { token, mode } => {
                close(&mut open, &mut holds, who, e.at);
                open.insert(
                    e.who.clone(),
                    Hold {
                        client: e.who.clone(),
                        token: *token,
                        mode: *mode,
                        invoked: invoked.get(who).copied().unwrap_or(e.at),
                        granted: e.at,
                        end: e.at,
                        paused: false,
                    },
                );
            }
            What::Lost { token } | What::Release { token }
                if open.get(who).is_some_and(|h| h.token == *token) =>
            {
                close(&mut open, &mut holds, who, e.at);
            }
            What::Exit | What::Start { .. } => close(&mut open, &mut holds, who, e.at),
            What::Killed { client } => close(&mut open, &mut holds, client, e.at),
            _ => {}
        }
    }
    let left: Vec<String> = open.keys().cloned().collect();
    for client in left {
        close(&mut open, &mut holds, &client, end_of_history);
    }

    let window = |from: u64, to: u64, clients: &[&str], lock: &str| -> Vec<Event> {
        history
            .iter()
            .filter(|e| e.at >= from && e.at <= to)
            .filter(|e| match &e.what {
                What::Accepted {
                    lock: l, client, ..
                }
                | What::Refused {
                    lock: l, client, ..
                }
                | What::Appended {
                    lock: l, client, ..
                } => l == lock && clients.contains(&client.as_str()),
                What::Killed { client } => clients.contains(&client.as_str()),
                What::FaultStart { .. }
                | What::FaultEnd { .. }
                | What::StateLost { .. }
                | What::Healed => true,
                _ => clients.contains(&e.who.as_str()),
            })
            .cloned()
            .collect()
    };

    // The ends of the faults that lose state (each begins a new store epoch), with their
    // words.
    let mut losing: HashMap<u32, &str> = HashMap::new();
    let mut words: HashMap<u32, &str> = HashMap::new();
    let mut epochs: Vec<(u64, &str)> = Vec::new();
    for e in history {
        match &e.what {
            What::FaultStart { id, what } => {
                words.insert(*id, what);
                // A history written before `state-lost` lines: its promotions lost state.
                if is_promotion(what) {
                    losing.insert(*id, what);
                }
            }
            What::StateLost { id } => {
                losing.insert(*id, words.get(id).copied().unwrap_or("a_state_loss"));
            }
            What::FaultEnd { id } => {
                if let Some(what) = losing.remove(id) {
                    epochs.push((e.at, what));
                }
            }
            _ => {}
        }
    }
    let grace = plan.restart_grace.saturating_sub(GRACE_SLACK).as_nanos() as u64;

    for (lock, recipe) in &plan.locks {
        let mut list = holds.remove(lock).unwrap_or_default();
        list.sort_by_key(|h| h.granted);
        // (6) A fault that loses state begins a new epoch when it ends (the store is back).
        // Each kind of breach is shown once per such fault and lock, with how many grants
        // broke it.
        for &(back, what) in &epochs {
            let what = what.replace('_', " ");
            let handoff = if old_primary_answers_on(&what) {
                SENTINEL_HANDOFF.as_nanos() as u64
            } else {
                0
            };
            let before = list
                .iter()
                .filter(|h| h.granted < back)
                .max_by_key(|h| h.token);
            let after = || list.iter().filter(|h| h.granted >= back);
            let early: Vec<&Hold> = after()
                .filter(|h| {
                    h.invoked > back && h.granted >= back + handoff && h.granted < back + grace
                })
                .collect();
            if let Some(h) = early.first() {
                violations.push(Violation {
                    rule: "epoch",
                    message: format!(
                        "{lock}: {} asked {:.0} ms after the store came back ({what}) and was granted token {} {:.0} ms after it, within the restart grace ({:?}){}",
                        h.client,
                        (h.invoked - back) as f64 / 1e6,
                        h.token,
                        (h.granted - back) as f64 / 1e6,
                        plan.restart_grace,
                        more(early.len())
                    ),
                    window: window(back, h.granted, &[&h.client], lock),
                });
            }
            let Some(b) = before else { continue };
            let low: Vec<&Hold> = after()
                .filter(|h| {
                    h.granted >= back + grace
                        && h.token <= b.token
                        && !paused_during(&h.client, back, h.granted)
                })
                .collect();
            if let Some(h) = low.first() {
                violations.push(Violation {
                    rule: "epoch",
                    message: format!(
                        "{lock}: {} was granted token {} {:.0} ms after the store came back ({what}), not above token {} granted to {} before it{}",
                        h.client,
                        h.token,
                        (h.granted - back) as f64 / 1e6,
                        b.token,
                        b.client,
                        more(low.len())
                    ),
                    window: window(b.granted, h.granted, &[&b.client, &h.client], lock),
                });
            }
        }
        // (2) Tokens: unique, and a grant that returned before another was asked for has the
        // lower token.
        let mut seen: HashMap<u64, &Hold> = HashMap::new();
        for h in &list {
            if let Some(other) = seen.insert(h.token, h) {
                violations.push(Violation {
                    rule: "token-order",
                    message: format!(
                        "{lock}: token {} granted twice ({} and {})",
                        h.token, other.client, h.client
                    ),
                    window: window(other.granted, h.granted, &[&other.client, &h.client], lock),
                });
            }
        }
        let mut by_invoke: Vec<&Hold> = list.iter().collect();
        by_invoke.sort_by_key(|h| h.invoked);
        let mut best: Option<&Hold> = None;
        let mut next = 0;
        for b in &by_invoke {
            while next < list.len() && list[next].granted < b.invoked {
                if best.is_none_or(|x| list[next].token > x.token) {
                    best = Some(&list[next]);
                }
                next += 1;
            }
            if let Some(a) = best
                && a.token > b.token
            {
                violations.push(Violation {
                    rule: "token-order",
                    message: format!(
                        "{lock}: {} was granted token {} before {} asked, and {} got the lower token {}",
                        a.client, a.token, b.client, b.client, b.token
                    ),
                    window: window(a.granted, b.granted, &[&a.client, &b.client], lock),
                });
            }
        }
        // (3) No more holders than the recipe admits, among holders that could be told.
        let permits = match recipe {
            Recipe::Semaphore => Recipe::SEMAPHORE_PERMITS as usize,
            _ => 1,
        };
        let told: Vec<&Hold> = list.iter().filter(|h| !h.paused).collect();
        for (i, b) in told.iter().enumerate() {
            let beside: Vec<&&Hold> = told[..i]
                .iter()
                .filter(|a| a.end > b.granted && !(a.mode == 'r' && b.mode == 'r'))
                .collect();
            if beside.len() >= permits {
                let first = beside.iter().map(|a| a.granted).min().unwrap_or(b.granted);
                let mut clients: Vec<&str> = beside.iter().map(|a| a.client.as_str()).collect();
                clients.push(&b.client);
                violations.push(Violation {
                    rule: "lost-first",
                    message: format!(
                        "{lock}: {} granted token {} ({}) while {} still held, not told of a loss",
                        b.client,
                        b.token,
                        b.mode,
                        beside
                            .iter()
                            .map(|a| format!("{} (token {}, {})", a.client, a.token, a.mode))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    window: window(first, b.granted, &clients, lock),
                });
            }
        }
        // (1) The resource: accepted tokens never go down; every accepted write adds one to
        // the value the last accepted write left; acknowledged <= applied <= acknowledged +
        // unknown.
        let mut highest: Option<&Event> = None;
        let mut last_write: Option<&Event> = None;
        let mut applied = 0u64;
        for e in history {
            let What::Accepted {
                lock: l,
                token,
                write,
                value,
                client,
            } = &e.what
            else {
                continue;
            };
            if l != lock {
                continue;
            }
            if let Some(h) = highest
                && let What::Accepted {
                    token: top,
                    client: top_client,
                    ..
                } = &h.what
            {
                if token < top {
                    violations.push(Violation {
                        rule: "fence",
                        message: format!(
                            "{lock}: the resource accepted token {token} from {client} after token {top} from {top_client}"
                        ),
                        window: window(h.at, e.at, &[client, top_client], lock),
                    });
                } else {
                    highest = Some(e);
                }
            } else {
                highest = Some(e);
            }
            if *write {
                applied += 1;
                let before = match last_write.map(|w| &w.what) {
                    Some(What::Accepted { value, .. }) => *value,
                    _ => 0,
                };
                if *value != before + 1 {
                    let (from, other) = match last_write {
                        Some(w) => match &w.what {
                            What::Accepted { client, .. } => (w.at, client.as_str()),
                            _ => (w.at, client.as_str()),
                        },
                        None => (e.at, client.as_str()),
                    };
                    violations.push(Violation {
                        rule: "counter",
                        message: format!(
                            "{lock}: {client} (token {token}) wrote {value} over {before}: an increment was lost"
                        ),
                        window: window(from, e.at, &[client, other], lock),
                    });
                }
                last_write = Some(e);
            }
        }
        // The log: each entry follows its holder's own write, with nobody's write accepted
        // in between (what a hold is for); an entry whose last write is another's shows two
        // holders inside the critical section, as the resource saw it.
        let mut last_write: Option<&Event> = None;
        for e in history {
            match &e.what {
                What::Accepted {
                    lock: l,
                    write: true,
                    ..
                } if l == lock => last_write = Some(e),
                What::Appended {
                    lock: l,
                    token,
                    client,
                    index,
                } if l == lock => {
                    let paired = matches!(
                        last_write.map(|w| &w.what),
                        Some(What::Accepted { token: t, client: c, .. }) if t == token && c == client
                    );
                    if !paired {
                        let (from, other, other_token) = match last_write.map(|w| (w.at, &w.what)) {
                            Some((
                                at,
                                What::Accepted {
                                    client: c,
                                    token: t,
                                    ..
                                },
                            )) => (at, c.as_str(), *t),
                            _ => (e.at, client.as_str(), 0),
                        };
                        violations.push(Violation {
                            rule: "log",
                            message: format!(
                                "{lock}: log entry {index} from {client} (token {token}) follows a write by {other} (token {other_token}), not its own"
                            ),
                            window: window(from, e.at, &[client, other], lock),
                        });
                    }
                }
                _ => {}
            }
        }
        let mut acked = 0u64;
        let mut unknown = 0u64;
        let mut pending: HashMap<&str, bool> = HashMap::new();
        for e in history {
            if lock_of.get(e.who.as_str()) != Some(&lock.as_str()) {
                continue;
            }
            match &e.what {
                What::WriteInvoked { .. } => {
                    pending.insert(&e.who, true);
                }
                What::WriteOk { .. } => {
                    acked += 1;
                    pending.remove(e.who.as_str());
                }
                What::WriteRefused { .. } => {
                    pending.remove(e.who.as_str());
                }
                What::WriteUnknown { .. } => {
                    unknown += 1;
                    pending.remove(e.who.as_str());
                }
                // The process before this one died with its write unanswered.
                What::Start { .. } if pending.remove(e.who.as_str()).is_some() => {
                    unknown += 1;
                }
                _ => {}
            }
        }
        unknown += pending.len() as u64;
        if applied < acked || applied > acked + unknown {
            violations.push(Violation {
                rule: "counter",
                message: format!(
                    "{lock}: {applied} increments applied, {acked} acknowledged, {unknown} of unknown outcome"
                ),
                window: Vec::new(),
            });
        }
    }

    // (4) Progress after the last fault healed.
    if let Some(healed) = history.iter().find(|e| e.what == What::Healed) {
        let bound = plan.progress_bound.as_nanos() as u64;
        for (client, lock) in &plan.clients {
            let granted = history.iter().any(|e| {
                &e.who == client
                    && matches!(e.what, What::Granted { .. })
                    && e.at > healed.at
                    && e.at <= healed.at + bound
            });
            if !granted {
                let to = (healed.at + bound).min(end_of_history);
                let mut w = window(healed.at, to, &[client], lock);
                // The shortest window: the heal and this client's last few events.
                let keep = w.len().saturating_sub(12);
                let tail = w.split_off(keep);
                w.truncate(1);
                w.extend(tail);
                violations.push(Violation {
                    rule: "progress",
                    message: format!(
                        "{client} ({lock}) was not granted within {:?} after the last fault healed",
                        plan.progress_bound
                    ),
                    window: w,
                });
            }
        }
    }

    // A client process that ended on its own (a crash: the runner found it gone).
    for e in history {
        if let What::Died { client, status } = &e.what {
            violations.push(Violation {
                rule: "crash",
                message: format!("{client}'s process ended on its own ({status})"),
                window: vec![e.clone()],
            });
        }
    }

    // (5) Nothing left in the backend.
    for e in history {
        if let What::Leftover { lock, key } = &e.what {
            violations.push(Violation {
                rule: "leftover",
                message: format!(
                    "{lock}: entry {key} left in the backend after every client stopped"
                ),
                window: vec![e.clone()],
            });
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(at: u64, who: &str, what: What) -> Event {
        Event {
            at,
            who: who.into(),
            what,
        }
    }

    fn plan() -> Plan {
        Plan {
            locks: vec![("l".into(), Recipe::Mutex)],
            clients: vec![("c0".into(), "l".into()), ("c1".into(), "l".into())],
            progress_bound: Duration::from_secs(1),
            restart_grace: Duration::from_millis(100),
        }
    }

    /// The resource accepted a write on lock `l`.
    fn accepted(at: u64, token: u64, client: &str, value: u64) -> Event {
        ev(
            at,
            "resource",
            What::Accepted {
                lock: "l".into(),
                token,
                client: client.into(),
                write: true,
                value,
            },
        )
    }

    fn grant(at: u64, who: &str, token: u64) -> [Event; 2] {
        [
            ev(at, who, What::Acquire { mode: 'x' }),
            ev(at + 1, who, What::Granted { token, mode: 'x' }),
        ]
    }

    #[test]
    fn a_client_that_died_on_its_own_is_caught() {
        let mut h = Vec::new();
        h.extend(grant(0, "c0", 5));
        h.push(ev(10, "c0", What::Release { token: 5 }));
        h.push(ev(
            20,
            "nemesis",
            What::Died {
                client: "c1".into(),
                status: "signal:_6_(SIGABRT)".into(),
            },
        ));
        let v = check(&h, &plan());
        assert!(v.iter().any(|v| v.rule == "crash"), "{v:?}");
    }

    #[test]
    fn a_clean_handoff_passes() {
        let mut h = Vec::new();
        h.extend(grant(0, "c0", 5));
        h.push(ev(10, "c0", What::Release { token: 5 }));
        h.extend(grant(20, "c1", 7));
        h.push(ev(30, "c1", What::Release { token: 7 }));
        assert!(check(&h, &plan()).is_empty());
    }

    #[test]
    fn an_overlap_without_a_pause_is_caught_and_with_one_excused() {
        let mut h = Vec::new();
        h.extend(grant(0, "c0", 5));
        h.extend(grant(20, "c1", 7));
        h.push(ev(30, "c0", What::Lost { token: 5 }));
        let v = check(&h, &plan());
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].rule, "lost-first");
        let mut paused = vec![ev(
            5,
            "nemesis",
            What::FaultStart {
                id: 0,
                what: "pause c0 (SIGSTOP)".into(),
            },
        )];
        paused.extend(h);
        paused.push(ev(29, "nemesis", What::FaultEnd { id: 0 }));
        paused.sort_by_key(|e| e.at);
        assert!(check(&paused, &plan()).is_empty());
    }

    #[test]
    fn a_lower_token_after_a_higher_one_is_caught() {
        let mut h = Vec::new();
        h.extend(grant(0, "c0", 9));
        h.push(ev(10, "c0", What::Release { token: 9 }));
        h.extend(grant(20, "c1", 7));
        let v = check(&h, &plan());
        assert!(v.iter().any(|v| v.rule == "token-order"), "{v:?}");
    }

    #[test]
    fn a_plan_reads_back_from_its_history() {
        let plan = plan();
        let head: Vec<Event> = plan
            .to_events()
            .into_iter()
            .map(|what| ev(0, "nemesis", what))
            .collect();
        let text: String = head.iter().map(|e| format!("{e}\n")).collect();
        let read: Vec<Event> = text.lines().filter_map(Event::parse).collect();
        let back = Plan::from_history(&read).expect("a plan");
        assert_eq!(back.locks, plan.locks);
        assert_eq!(back.clients, plan.clients);
        assert_eq!(back.progress_bound, plan.progress_bound);
        assert_eq!(back.restart_grace, plan.restart_grace);
        assert!(Plan::from_history(&[]).is_none());
        // Clients per recipe come back too: the most clients of one lock.
        let mut three = plan;
        three.locks.push(("m".into(), Recipe::Semaphore));
        three.clients.extend(
            ["c2", "c3", "c4"]
                .into_iter()
                .map(|c| (c.to_owned(), "m".to_owned())),
        );
        let head: Vec<Event> = three
            .to_events()
            .into_iter()
            .map(|what| ev(0, "nemesis", what))
            .collect();
        let back = Plan::from_history(&head).expect("a plan");
        assert_eq!(back.clients_per_recipe(), 3);
    }

    #[test]
    fn recovery_is_measured_from_each_quiet_moment() {
        let fault = |at, id, what: &str| {
            ev(
                at,
                "nemesis",
                What::FaultStart {
                    id,
                    what: what.into(),
                },
            )
        };
        let mut h = vec![
            fault(0, 0, "pause c0"),
            fault(5, 1, "kill c1"),
            ev(10, "nemesis", What::FaultEnd { id: 1 }),
            ev(20, "nemesis", What::FaultEnd { id: 0 }),
        ];
        h.extend(grant(60, "c1", 3));
        h.push(fault(100, 2, "cut c0"));
        h.push(ev(110, "nemesis", What::FaultEnd { id: 2 }));
        h.push(ev(111, "nemesis", What::Healed));
        h.extend(grant(130, "c0", 4));
        let r = recovery(&h, &plan());
        // 20 -> 61: one lock, granted 41 ns after both faults healed (in the order they
        // healed); 110 -> 131.
        assert_eq!(
            r.after_each,
            vec![
                (Duration::from_nanos(41), "kill c1 + pause c0".to_owned()),
                (Duration::from_nanos(21), "cut c0".to_owned()),
            ]
        );
        assert_eq!(r.unrecovered, 0);
        // c1 was not granted after the last heal.
        assert_eq!(r.after_last, None);
        let (median, longest, what) = r.median_and_longest().expect("two");
        assert_eq!(
            (median, longest, what),
            (
                Duration::from_nanos(41),
                Duration::from_nanos(41),
                "kill c1 + pause c0"
            )
        );
    }

    #[test]
    fn a_promotion_begins_an_epoch_that_waits_the_grace_with_higher_tokens() {
        const MS: u64 = 1_000_000;
        let promotion = |at: u64| {
            [
                ev(
                    at - 10 * MS,
                    "nemesis",
                    What::FaultStart {
                        id: 0,
                        what: "redis_replica_promoted_after_missing_900_ms_of_writes,_the_old_primary_killed".into(),
                    },
                ),
                ev(at, "nemesis", What::FaultEnd { id: 0 }),
            ]
        };
        // c0 holds token 9 across the promotion and is told; c1, queued before it, is
        // granted after the grace with a higher token: as promised.
        let mut h = Vec::new();
        h.extend(grant(0, "c0", 9));
        h.push(ev(MS, "c1", What::Acquire { mode: 'x' }));
        h.extend(promotion(50 * MS));
        h.push(ev(120 * MS, "c0", What::Lost { token: 9 }));
        h.push(ev(
            160 * MS,
            "c1",
            What::Granted {
                token: 20,
                mode: 'x',
            },
        ));
        assert!(check(&h, &plan()).is_empty(), "{:?}", check(&h, &plan()));

        // The same grant with a token below the old holder's.
        let mut low = h.clone();
        low.retain(|e| e.who != "c1" || !matches!(e.what, What::Granted { .. }));
        low.push(ev(
            160 * MS,
            "c1",
            What::Granted {
                token: 7,
                mode: 'x',
            },
        ));
        let v = check(&low, &plan());
        assert!(v.iter().any(|v| v.rule == "epoch"), "{v:?}");

        // c0 told, c1 asks after the promotion and is granted before the grace passed.
        let mut early = Vec::new();
        early.extend(grant(0, "c0", 9));
        early.extend(promotion(50 * MS));
        early.push(ev(55 * MS, "c0", What::Lost { token: 9 }));
        early.extend(grant(60 * MS, "c1", 20));
        let v = check(&early, &plan());
        assert!(v.iter().any(|v| v.rule == "epoch"), "{v:?}");
    }

    #[test]
    fn after_a_manual_sentinel_failover_the_old_primary_may_grant_until_its_clients_move() {
        const MS: u64 = 1_000_000;
        let plan = Plan {
            restart_grace: Duration::from_secs(2),
            ..plan()
        };
        let failover = |words: &str| server_fault(100 * MS, words, true);
        let manual = "redis-sentinel:_SENTINEL_FAILOVER_(the_replica_promoted_in_sync)";
        // c1 asks 1 ms after the announcement and the old primary, still up, grants it 38 ms
        // after, before c1 moved; c0 was told before.
        let mut tail = Vec::new();
        tail.extend(grant(0, "c0", 9));
        tail.extend(failover(manual));
        tail.push(ev(100 * MS + MS / 2, "c0", What::Lost { token: 9 }));
        tail.push(ev(101 * MS, "c1", What::Acquire { mode: 'x' }));
        tail.push(ev(
            138 * MS,
            "c1",
            What::Granted {
                token: 12,
                mode: 'x',
            },
        ));
        assert!(check(&tail, &plan).is_empty(), "{:?}", check(&tail, &plan));
        // The same grant after a failover whose old primary is gone is the new epoch's, within
        // the grace.
        let mut killed: Vec<Event> = tail
            .iter()
            .filter(|e| e.who != "nemesis")
            .cloned()
            .chain(failover("redis-sentinel:_the_primary_killed"))
            .collect();
        killed.sort_by_key(|e| e.at);
        let v = check(&killed, &plan);
        assert!(v.iter().any(|v| v.rule == "epoch"), "{v:?}");
        // A grant 700 ms after the announcement, within the grace, is caught after a manual
        // failover too: a client that stayed behind, or a new epoch that did not wait.
        let mut late = tail.clone();
        late.retain(|e| e.who != "c1");
        late.extend(grant(700 * MS, "c1", 12));
        let v = check(&late, &plan);
        assert!(v.iter().any(|v| v.rule == "epoch"), "{v:?}");
    }

    /// A server fault from 10 ms before `at` to `at`, in `words`; `lost` adds the line
    /// that says it loses state.
    fn server_fault(at: u64, words: &str, lost: bool) -> Vec<Event> {
        let mut h = vec![ev(
            at - 10_000_000,
            "nemesis",
            What::FaultStart {
                id: 0,
                what: words.into(),
            },
        )];
        if lost {
            h.push(ev(at - 10_000_000, "nemesis", What::StateLost { id: 0 }));
        }
        h.push(ev(at, "nemesis", What::FaultEnd { id: 0 }));
        h
    }

    #[test]
    fn every_fault_that_loses_state_begins_an_epoch_that_waits_the_grace_with_higher_tokens() {
        const MS: u64 = 1_000_000;
        for words in [
            "etcd_killed,_restarted_without_data",
            "etcd_killed,_restarted_from_an_older_snapshot",
            "zookeeper_killed,_restarted_without_data",
            "postgres_killed,_restored_from_an_earlier_base_backup",
            "redis_FLUSHALL",
        ] {
            // c0 holds token 9 across the fault and is told; c1, queued before it, is
            // granted after the grace with a higher token: as promised.
            let mut h = Vec::new();
            h.extend(grant(0, "c0", 9));
            h.push(ev(MS, "c1", What::Acquire { mode: 'x' }));
            h.extend(server_fault(50 * MS, words, true));
            h.push(ev(60 * MS, "c0", What::Lost { token: 9 }));
            h.push(ev(
                160 * MS,
                "c1",
                What::Granted {
                    token: 20,
                    mode: 'x',
                },
            ));
            h.sort_by_key(|e| e.at);
            assert!(
                check(&h, &plan()).is_empty(),
                "{words}: {:?}",
                check(&h, &plan())
            );

            // After the grace, but with a token from before the store forgot (a new store's
            // counters start again).
            let mut low = h.clone();
            low.retain(|e| e.who != "c1" || !matches!(e.what, What::Granted { .. }));
            low.push(ev(
                160 * MS,
                "c1",
                What::Granted {
                    token: 3,
                    mode: 'x',
                },
            ));
            let v = check(&low, &plan());
            assert!(
                v.iter()
                    .any(|v| v.rule == "epoch" && v.message.contains("not above token 9")),
                "{words}: {v:?}"
            );

            // c0 told, c1 asks once the store is back and is granted before the grace passed.
            let mut early = Vec::new();
            early.extend(grant(0, "c0", 9));
            early.extend(server_fault(50 * MS, words, true));
            early.push(ev(55 * MS, "c0", What::Lost { token: 9 }));
            early.extend(grant(60 * MS, "c1", 20));
            early.sort_by_key(|e| e.at);
            let v = check(&early, &plan());
            assert!(
                v.iter().any(|v| v.rule == "epoch"
                    && v.message.contains("within the restart grace")
                    && v.message.contains(&words.replace('_', " "))),
                "{words}: {v:?}"
            );

            // Without the line that says the fault lost state, the same grant is no breach:
            // the rule keys off the fault's property, not its words.
            let mut kept = Vec::new();
            kept.extend(grant(0, "c0", 9));
            kept.extend(server_fault(50 * MS, words, false));
            kept.push(ev(55 * MS, "c0", What::Lost { token: 9 }));
            kept.extend(grant(60 * MS, "c1", 20));
            kept.sort_by_key(|e| e.at);
            let v = check(&kept, &plan());
            assert!(!v.iter().any(|v| v.rule == "epoch"), "{words}: {v:?}");
        }
    }

    #[test]
    fn a_holder_from_before_a_wipe_not_told_before_the_next_grant_is_caught() {
        const MS: u64 = 1_000_000;
        // c0 holds token 9 across the wipe and is never told; c1 is granted after the grace.
        let mut h = Vec::new();
        h.extend(grant(0, "c0", 9));
        h.push(ev(MS, "c1", What::Acquire { mode: 'x' }));
        h.extend(server_fault(
            50 * MS,
            "etcd_killed,_restarted_without_data",
            true,
        ));
        h.push(ev(
            160 * MS,
            "c1",
            What::Granted {
                token: 20,
                mode: 'x',
            },
        ));
        h.push(ev(170 * MS, "c0", What::Lost { token: 9 }));
        h.sort_by_key(|e| e.at);
        let v = check(&h, &plan());
        assert!(v.iter().any(|v| v.rule == "lost-first"), "{v:?}");
    }

    #[test]
    fn the_fence_and_the_counter_are_checked() {
        let h = vec![accepted(1, 7, "c1", 1), accepted(2, 5, "c0", 1)];
        let v = check(&h, &plan());
        assert!(v.iter().any(|v| v.rule == "fence"), "{v:?}");
        assert!(v.iter().any(|v| v.rule == "counter"), "{v:?}");
    }

    #[test]
    fn each_log_entry_follows_its_own_write() {
        let app = |at, token, client: &str, index| {
            ev(
                at,
                "resource",
                What::Appended {
                    lock: "l".into(),
                    token,
                    client: client.into(),
                    index,
                },
            )
        };
        let good = vec![
            accepted(1, 5, "c0", 1),
            app(2, 5, "c0", 1),
            accepted(3, 7, "c1", 2),
            app(4, 7, "c1", 2),
        ];
        let v = check(&good, &plan());
        assert!(!v.iter().any(|v| v.rule == "log"), "{v:?}");
        // c1's write lands between c0's write and c0's entry.
        let bad = vec![
            accepted(1, 5, "c0", 1),
            accepted(2, 7, "c1", 2),
            app(3, 5, "c0", 1),
            app(4, 7, "c1", 2),
        ];
        let v = check(&bad, &plan());
        assert_eq!(v.iter().filter(|v| v.rule == "log").count(), 1, "{v:?}");
    }
}
