//! The checker: the rules every schedule's history must keep (docs/reliability.md lists
//! them with the mutants each one caught).

use std::collections::{BTreeMap, HashMap};

use super::{Event, History, Kind, Plan};

/// A rule a history broke, with the events that show it.
#[derive(Debug, Clone)]
pub struct Violation {
    pub rule: &'static str,
    pub detail: String,
}

/// A hold as the checker follows it.
#[derive(Debug, Clone)]
struct Hold {
    id: u64,
    client: usize,
    name: String,
    kind: Kind,
    token: u64,
    granted: u64,
}

/// Every rule, on one history.
pub fn check(plan: &Plan, history: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    exclusion_and_order(plan, history, &mut out);
    fenced_counters(history, &mut out);
    observers(history, &mut out);
    barriers(plan, history, &mut out);
    progress(history, &mut out);
    out
}

/// Holds never overlap beyond what their kinds allow (a holder is told it lost the lock no
/// later than a successor is granted); grants on a name come in token order (queue order,
/// FIFO); after the store forgot, sessions of the new epoch are granted only once the grace
/// has passed, and with tokens above every token granted before.
fn exclusion_and_order(plan: &Plan, history: &History, out: &mut Vec<Violation>) {
    let grace = u64::try_from(plan.grace.as_millis()).unwrap_or(u64::MAX);
    // When each hold ended: a hold that ends at the very instant a successor is granted did
    // not overlap it (two tasks of one instant are recorded in either order).
    // (A hold lost and then released ends twice: the first counts.)
    let mut ended: HashMap<u64, u64> = HashMap::new();
    for event in &history.events {
        if let Event::Ended { at, hold, .. } = event {
            ended.entry(*hold).or_insert(*at);
        }
    }
    let freezes = freezes(history);
    let mut active: BTreeMap<u64, Hold> = BTreeMap::new();
    // Per name: the highest token granted to an exclusive holder, and to any holder.
    let mut last_token: HashMap<String, (u64, u64)> = HashMap::new();
    // Every limit in force, by name, with when it took effect: a permit's grant is decided
    // by a read up to one network delay before the grant is recorded, and a change of the
    // limit is recorded up to one delay after it was made.
    let mut limit_history: HashMap<String, Vec<(u64, u32)>> = HashMap::new();
    let mut highest_before_loss = 0u64;
    let mut highest = 0u64;
    let mut losses: Vec<u64> = Vec::new();
    for event in &history.events {
        match event {
            Event::Limit { at, name, limit } => {
                let history = limit_history.entry(name.clone()).or_default();
                // A change answered just after the store forgot may have been made before it
                // (its answer held up on the way), and lost with it: any limit ever stored may
                // be the one in force.
                let limit = match losses.last() {
                    Some(loss) if at.saturating_sub(*loss) <= NETWORK_DELAY_MS => {
                        let ever = history.iter().map(|(_, l)| *l).max().unwrap_or(0);
                        (*limit).max(ever).max(plan.first_limit)
                    }
                    _ => *limit,
                };
                history.push((*at, limit));
            }
            Event::LimitMayRise { at, name, to } => {
                let history = limit_history.entry(name.clone()).or_default();
                let now = history.last().map_or(plan.first_limit, |(_, l)| *l);
                history.push((*at, now.max(*to)));
            }
            Event::StoreLost { at, .. } => {
                losses.push(*at);
                highest_before_loss = highest;
                // The first permit asked for afterwards stores its handle's limit again: any
                // limit ever stored (a handle made before the loss carries an old one), until
                // the administrator's next change says which.
                for history in limit_history.values_mut() {
                    let ever = history.iter().map(|(_, l)| *l).max().unwrap_or(0);
                    history.push((*at, ever.max(plan.first_limit)));
                }
                // A new epoch: tokens start above, queue order starts over.
                last_token.clear();
            }
            Event::Granted {
                at,
                hold,
                client,
                name,
                kind,
                token,
                session_at,
                deadline,
            } => {
                // Nothing is granted to a lost session, even one whose loss nothing recorded
                // yet (its deadline passed while the keep-alive driver was starved).
                if at > deadline {
                    out.push(Violation {
                        rule: "nothing is granted to a lost session",
                        detail: format!(
                            "at {at} ms client {client} was granted `{name}` (token {token}) on a session whose deadline passed at {deadline} ms"
                        ),
                    });
                }
                // Overlap, by kind: what is still held on this name after this instant. A
                // holder frozen past its lease may still believe it holds while a successor is
                // granted, until it thaws: only then can it hear of its loss (what fencing is
                // for). That time, and no more, is excused.
                let others: Vec<&Hold> = active
                    .iter()
                    .filter(|(id, h)| &h.name == name && ended.get(*id).is_none_or(|e| e > at))
                    .filter(|(id, h)| !frozen_past_lease(&freezes, h, *at, ended.get(*id)))
                    .map(|(_, h)| h)
                    .collect();
                let exclusive = others.iter().find(|h| h.kind == Kind::Exclusive);
                let clash = match kind {
                    Kind::Exclusive => others.first().copied(),
                    Kind::Read => exclusive
                        .copied()
                        .or_else(|| others.iter().find(|h| h.kind == Kind::Permit).copied()),
                    Kind::Permit => {
                        // The semaphore's rule: fewer than the limit ahead of it. A permit behind
                        // it that holds was granted under a higher limit, before a lowering
                        // (permits granted stay granted).
                        let ahead: Vec<&&Hold> = others
                            .iter()
                            .filter(|h| h.kind == Kind::Permit && h.token < *token)
                            .collect();
                        let permits = ahead.len();
                        let held: Vec<String> = ahead
                            .iter()
                            .map(|h| {
                                format!(
                                    "client {} token {} since {} ms",
                                    h.client, h.token, h.granted
                                )
                            })
                            .collect();
                        let limit = limit_around(
                            limit_history.get(name).map_or(&[][..], Vec::as_slice),
                            decided_from(&freezes, *client, *at),
                            *at,
                            plan.first_limit,
                        );
                        if permits >= limit as usize {
                            out.push(Violation {
                                rule: "never more holders than permits",
                                detail: format!(
                                    "at {at} ms client {client} was granted a permit of `{name}` (token {token}) while {permits} permits ahead of it were held ({}) and the stored limit was {limit}",
                                    held.join("; ")
                                ),
                            });
                        }
                        exclusive
                            .copied()
                            .or_else(|| others.iter().find(|h| h.kind == Kind::Read).copied())
                    }
                };
                if let Some(other) = clash {
                    out.push(Violation {
                        rule: "one holder, or sharers of one kind, at a time",
                        detail: format!(
                            "at {at} ms client {client} was granted `{name}` ({kind:?}, token {token}) while client {} held it since {} ms ({:?}, token {}), not told it lost it",
                            other.client, other.granted, other.kind, other.token
                        ),
                    });
                }
                // Queue order: an exclusive entry holds only as the head, so every grant before
                // it had a lower token; a shared one waits for every exclusive entry ahead of
                // it, so no exclusive grant before it had a higher token. (Sharers granted
                // together may finish their calls in any order.)
                let (exclusive_max, any_max) = last_token.get(name).copied().unwrap_or((0, 0));
                let bound = if *kind == Kind::Exclusive {
                    any_max
                } else {
                    exclusive_max
                };
                if *token <= bound {
                    out.push(Violation {
                        rule: "grants in token order (queue order)",
                        detail: format!(
                            "at {at} ms `{name}` was granted ({kind:?}) with token {token}, after a grant with token {bound}"
                        ),
                    });
                }
                let entry = last_token.entry(name.clone()).or_default();
                entry.1 = entry.1.max(*token);
                if *kind == Kind::Exclusive {
                    entry.0 = entry.0.max(*token);
                }
                // The epoch rule, for sessions that began after the store forgot.
                if let Some(&loss) = losses.iter().rev().find(|&&l| l <= *session_at) {
                    if *at < loss + grace {
                        out.push(Violation {
                            rule: "after the store forgot, nothing is granted within the grace",
                            detail: format!(
                                "the store forgot at {loss} ms; at {at} ms `{name}` was granted (token {token}) to client {client}, whose session began at {session_at} ms: {} ms into a grace of {grace} ms",
                                at - loss
                            ),
                        });
                    }
                    if *token <= highest_before_loss {
                        out.push(Violation {
                            rule: "after the store forgot, tokens rise above every earlier one",
                            detail: format!(
                                "at {at} ms `{name}` was granted token {token}, not above {highest_before_loss}, granted before the store forgot at {loss} ms"
                            ),
                        });
                    }
                }
                highest = highest.max(*token);
                active.insert(
                    *hold,
                    Hold {
                        id: *hold,
                        client: *client,
                        name: name.clone(),
                        kind: *kind,
                        token: *token,
                        granted: *at,
                    },
                );
            }
            Event::Ended { hold, .. } => {
                active.remove(hold);
            }
            _ => {}
        }
    }
}

/// Per client, the intervals it was frozen (overlapping freezes merged), each with the latest
/// deadline its session had when one of them began.
type Freezes = HashMap<usize, Vec<(u64, u64, u64)>>;

fn freezes(history: &History) -> Freezes {
    let mut by_client: Freezes = HashMap::new();
    for event in &history.events {
        if let Event::Frozen {
            at,
            client,
            ms,
            deadline,
        } = event
        {
            let (from, to, lease) = (*at, at + ms, deadline.unwrap_or(u64::MAX));
            let intervals = by_client.entry(*client).or_default();
            match intervals.last_mut() {
                Some(last) if from <= last.1 => {
                    last.1 = last.1.max(to);
                    last.2 = last.2.max(lease);
                }
                _ => intervals.push((from, to, lease)),
            }
        }
    }
    by_client
}

/// Whether `hold` may overlap a grant at `at` because its holder was frozen then, past its
/// lease: `at` falls in one of its freezes, not before the deadline its session had when the
/// freeze began, and the hold ended (its holder told) by the time the freeze ended.
fn frozen_past_lease(freezes: &Freezes, hold: &Hold, at: u64, ended: Option<&u64>) -> bool {
    let Some(ended) = ended else {
        return false;
    };
    freezes.get(&hold.client).is_some_and(|intervals| {
        intervals
            .iter()
            .any(|&(from, to, lease)| from <= at && at <= to && at >= lease && *ended <= to)
    })
}

/// How long a request or its answer may be held up on the simulated network (net.rs: up to
/// 400 ms, split before and after the call).
const NETWORK_DELAY_MS: u64 = 500;

/// The earliest instant a grant recorded at `at` may have been decided at: a network delay
/// before, or, if its client was frozen meanwhile, a network delay before the freeze began
/// (an answer read before a freeze is taken in as the client thaws).
fn decided_from(freezes: &Freezes, client: usize, at: u64) -> u64 {
    let mut from = at.saturating_sub(NETWORK_DELAY_MS);
    if let Some(intervals) = freezes.get(&client) {
        for &(start, end, _) in intervals.iter().rev() {
            if start <= at && end >= from {
                from = from.min(start.saturating_sub(NETWORK_DELAY_MS));
            }
        }
    }
    from
}

/// The highest limit that may have decided a grant recorded at `at`: the one in force when it
/// may have been decided (`from`, see [`decided_from`]), and any set since.
fn limit_around(history: &[(u64, u32)], from: u64, at: u64, first: u32) -> u32 {
    let before = history
        .iter()
        .rev()
        .find(|(t, _)| *t <= from)
        .map_or(first, |(_, l)| *l);
    history
        .iter()
        .filter(|(t, _)| *t > from && *t <= at)
        .map(|(_, l)| *l)
        .fold(before, u32::max)
}

/// Fenced counters: every acknowledged increment is in the counter, and nothing else (a
/// late write of a paused holder is refused, or lands before the successor's claim).
fn fenced_counters(history: &History, out: &mut Vec<Violation>) {
    let mut acked: HashMap<&str, u64> = HashMap::new();
    for event in &history.events {
        if let Event::Acked { name, .. } = event {
            *acked.entry(name.as_str()).or_default() += 1;
        }
    }
    for event in &history.events {
        if let Event::Final { counters, .. } = event {
            for (name, value) in counters {
                let expected = acked.get(name.as_str()).copied().unwrap_or(0);
                if *value != expected {
                    out.push(Violation {
                        rule: "a fenced counter holds every acknowledged increment",
                        detail: format!(
                            "`{name}` counts {value}, but {expected} increments were acknowledged"
                        ),
                    });
                }
            }
        }
    }
}

/// Election observers: within a store epoch each sees leaders in rising token order, and
/// sees every leader that was granted while it watched.
fn observers(history: &History, out: &mut Vec<Violation>) {
    let mut seen: HashMap<(usize, &str), u64> = HashMap::new();
    let mut loss_at: Option<u64> = None;
    for event in &history.events {
        match event {
            Event::StoreLost { at, .. } => {
                seen.clear();
                loss_at = Some(*at);
            }
            // In the instant of a loss, an observer may take in a leader from before it after
            // one from after it (a restore brings an older leader back): not compared.
            Event::Observed {
                at,
                observer,
                name,
                token,
                ..
            } if *token > 0 && loss_at == Some(*at) => {
                seen.insert((*observer, name.as_str()), *token);
            }
            Event::Observed {
                at,
                observer,
                name,
                token,
                ..
            } if *token > 0 => {
                let last = seen.entry((*observer, name.as_str())).or_default();
                // (A proclamation repeats its leader's token.)
                if *token < *last {
                    out.push(Violation {
                        rule: "observers see leaders in order",
                        detail: format!(
                            "at {at} ms observer {observer} of `{name}` saw leader token {token} after {last}"
                        ),
                    });
                }
                *last = *token;
            }
            _ => {}
        }
    }
    // Every proclamation acknowledged is seen by every observer of its name, with its value.
    let values: std::collections::HashSet<(usize, &str, u64, &str)> = history
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Observed {
                observer,
                name,
                token,
                value,
                ..
            } => Some((*observer, name.as_str(), *token, value.as_str())),
            _ => None,
        })
        .collect();
    let watchers: std::collections::HashSet<(usize, &str)> =
        values.iter().map(|(o, n, _, _)| (*o, *n)).collect();
    for event in &history.events {
        if let Event::Proclaimed {
            at,
            name,
            token,
            value,
        } = event
        {
            for &(o, n) in &watchers {
                if n == name && !values.contains(&(o, n, *token, value.as_str())) {
                    out.push(Violation {
                        rule: "observers see every proclamation",
                        detail: format!(
                            "observer {o} of `{name}` never saw leader {token} proclaim `{value}` (acknowledged at {at} ms)"
                        ),
                    });
                }
            }
        }
    }
    // Every leadership granted (by token) is seen by every observer of its name.
    let observed: std::collections::HashSet<(usize, &str, u64)> = history
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Observed {
                observer,
                name,
                token,
                ..
            } => Some((*observer, name.as_str(), *token)),
            _ => None,
        })
        .collect();
    let observers_of: std::collections::HashSet<(usize, &str)> =
        observed.iter().map(|(o, n, _)| (*o, *n)).collect();
    for event in &history.events {
        if let Event::Granted {
            at,
            name,
            token,
            kind: Kind::Exclusive,
            ..
        } = event
        {
            for &(o, n) in &observers_of {
                if n == name && !observed.contains(&(o, n, *token)) {
                    out.push(Violation {
                        rule: "observers see every leader",
                        detail: format!(
                            "observer {o} of `{name}` never saw the leader granted at {at} ms with token {token}"
                        ),
                    });
                }
            }
        }
    }
}

/// Barriers: a Barrier's `wait` returns only if the barrier was down at some moment since
/// the wait began (the holds acknowledged and not yet ended, cut at each loss of the store's
/// state, did not cover that whole time); a DoubleBarrier member's `enter` returns only once
/// `members` participants had begun to enter the round; its `leave` returns only once every
/// participant that entered had begun to leave or was out of the round (lost, failed), unless
/// the store lost its entries meanwhile.
fn barriers(plan: &Plan, history: &History, out: &mut Vec<Violation>) {
    let losses: Vec<u64> = history
        .events
        .iter()
        .filter_map(|e| match e {
            Event::StoreLost { at, .. } => Some(*at),
            _ => None,
        })
        .collect();
    let mut ups: HashMap<u64, (u64, u64)> = HashMap::new();
    for event in &history.events {
        match event {
            Event::BarrierUp { at, hold, .. } => {
                ups.insert(*hold, (*at, u64::MAX));
            }
            Event::BarrierDown { at, hold } => {
                if let Some(up) = ups.get_mut(hold) {
                    up.1 = up.1.min(*at);
                }
            }
            _ => {}
        }
    }
    // Each hold's interval ends at the first loss of the store's state after it began.
    let mut intervals: Vec<(u64, u64)> = ups
        .values()
        .map(|&(from, to)| {
            let lost = losses
                .iter()
                .find(|l| **l >= from)
                .copied()
                .unwrap_or(u64::MAX);
            (from, to.min(lost))
        })
        .filter(|(from, to)| from < to)
        .collect();
    intervals.sort_unstable();
    for event in &history.events {
        if let Event::BarrierWaited { at, began, client } = event {
            // Whether the intervals cover [began, at] without a gap.
            let mut covered_to = *began;
            for (from, to) in &intervals {
                if *from > covered_to {
                    break;
                }
                covered_to = covered_to.max(*to);
            }
            if covered_to > *at && *at > *began {
                out.push(Violation {
                    rule: "a barrier's wait returns only once it was down",
                    detail: format!(
                        "client {client}'s wait from {began} ms returned at {at} ms while the barrier was held up throughout"
                    ),
                });
            }
        }
    }
    for event in &history.events {
        if let Event::WorkOutlived { at, client, lost } = event {
            out.push(Violation {
                rule: "run_while_leader's work stops when leadership is lost",
                detail: format!(
                    "client {client}'s work went on at {at} ms; its session was lost at {lost} ms"
                ),
            });
        }
    }
    let members = plan.double_members as usize;
    for event in &history.events {
        match event {
            Event::Entered { at, round, client } => {
                let began: std::collections::HashSet<usize> = history
                    .events
                    .iter()
                    .filter_map(|e| match e {
                        Event::EnterBegan {
                            at: t,
                            round: r,
                            client: c,
                        } if r == round && t <= at => Some(*c),
                        _ => None,
                    })
                    .collect();
                if began.len() < members {
                    out.push(Violation {
                        rule: "a double barrier's enter returns once every member entered",
                        detail: format!(
                            "client {client} entered round {round} at {at} ms when {} of {members} members had begun to enter",
                            began.len()
                        ),
                    });
                }
            }
            Event::Left { at, round, client } => {
                let first = history.events.iter().find_map(|e| match e {
                    Event::EnterBegan {
                        at: t, round: r, ..
                    } if r == round => Some(*t),
                    _ => None,
                });
                if losses
                    .iter()
                    .any(|l| first.is_some_and(|f| *l >= f) && l <= at)
                {
                    continue;
                }
                for e in &history.events {
                    let Event::Entered {
                        round: r,
                        client: other,
                        ..
                    } = e
                    else {
                        continue;
                    };
                    if r != round || other == client {
                        continue;
                    }
                    let out_of_it = history.events.iter().any(|e| match e {
                        Event::LeaveBegan {
                            at: t,
                            round: r,
                            client: c,
                        }
                        | Event::RoundGone {
                            at: t,
                            round: r,
                            client: c,
                        } => r == round && c == other && t <= at,
                        _ => false,
                    });
                    if !out_of_it {
                        out.push(Violation {
                            rule: "a double barrier's leave returns once every member left",
                            detail: format!(
                                "client {client} left round {round} at {at} ms while client {other}, which had entered, had not begun to leave"
                            ),
                        });
                    }
                }
            }
            _ => {}
        }
    }
}

/// Once the faults healed, a clean client took every name; and nothing was left behind.
fn progress(history: &History, out: &mut Vec<Violation>) {
    for event in &history.events {
        match event {
            Event::Progress {
                name,
                ok: false,
                error,
                ..
            } => out.push(Violation {
                rule: "progress after healing",
                detail: format!("`{name}`: {error}"),
            }),
            Event::Final { left, .. } if *left > 0 => out.push(Violation {
                rule: "nothing left over",
                detail: format!("{left} entries left once every session ended"),
            }),
            _ => {}
        }
    }
}
