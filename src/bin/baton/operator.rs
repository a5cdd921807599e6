//! The operator's commands: `status`, `ls`, `break` and `init`. They read what the library's
//! `inspect` module says of a queue (the recipes' own rules), never a backend's key layout.

use std::time::{Duration, SystemTime};

use baton::backend::Backend;
use baton::inspect::{self, EntryKind, Member, QueueView, Role};

use crate::failure::{Failure, exit};
use crate::output::{json_str, one_line, out};

/// `baton status NAME`: the queue of one name, holders first, then waiters in order.
pub(crate) async fn status(backend: &dyn Backend, name: &str, json: bool) -> Result<u8, Failure> {
    let view = inspect::inspect(backend, name).await?;
    if json {
        for (i, m) in view.members().iter().enumerate() {
            out(&member_json(&view, i, m))?;
        }
        return Ok(0);
    }
    let header = [
        "ROLE", "KEY", "TOKEN", "LEASE", "TTL", "HOST", "PID", "SINCE", "OWNER",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    let mut nested = Vec::new();
    for m in view.members() {
        let mut role = role_text(m);
        if m.name() != view.name() && m.kind() == EntryKind::Exclusive {
            role.push('*');
            if !nested.contains(&m.name()) {
                nested.push(m.name());
            }
        }
        let owner = m.owner();
        rows.push(vec![
            role,
            one_line(m.entry().key()),
            m.entry().token().get().to_string(),
            m.entry()
                .lease()
                .map_or_else(|| "-".to_owned(), |l| l.to_hex()),
            match (m.ttl(), owner.ttl()) {
                (Some(left), _) => format!("{}s", left.as_secs()),
                // The backend cannot tell (ZooKeeper): at most the session's TTL.
                (None, Some(ttl)) if m.entry().lease().is_some() => format!("≤{}s", ttl.as_secs()),
                _ => "-".to_owned(),
            },
            owner.host().map_or_else(|| "-".to_owned(), one_line),
            owner
                .pid()
                .map_or_else(|| "-".to_owned(), |p| p.to_string()),
            owner.since().map_or_else(|| "-".to_owned(), ago),
            one_line(owner.text()).chars().take(60).collect(),
        ]);
    }
    // TOKEN, LEASE, TTL and PID line up on the right.
    table(&rows, &[2, 3, 4, 6])?;
    if !nested.is_empty() {
        out(&format!(
            "* a key of the nested name {}: names that nest share a queue, so `{}` waits behind it",
            one_line(&nested.join(", ")),
            view.name()
        ))?;
    }
    Ok(0)
}

/// `baton ls [PREFIX]`: every name with entries under the prefix, one line each.
pub(crate) async fn ls(backend: &dyn Backend, prefix: &str, json: bool) -> Result<u8, Failure> {
    let views = inspect::list(backend, prefix).await?;
    if json {
        for view in &views {
            let holders: Vec<String> = view.holders().map(|m| json_str(m.entry().key())).collect();
            out(&format!(
                "{{\"name\":{},\"holders\":[{}],\"waiters\":{},\"oldest_since_ms\":{}}}",
                json_str(view.name()),
                holders.join(","),
                view.waiters(),
                oldest(view).map_or_else(|| "null".to_owned(), |t| millis(t).to_string()),
            ))?;
        }
        return Ok(0);
    }
    let mut rows = vec![
        ["NAME", "HOLDERS", "WAITERS", "HELD BY", "SINCE"]
            .iter()
            .map(|h| (*h).to_owned())
            .collect::<Vec<_>>(),
    ];
    for view in &views {
        let first = view.holders().next();
        rows.push(vec![
            one_line(view.name()),
            view.holders().count().to_string(),
            view.waiters().to_string(),
            first.map_or_else(|| "-".to_owned(), who),
            oldest(view).map_or_else(|| "-".to_owned(), ago),
        ]);
    }
    table(&rows, &[1, 2])?;
    Ok(0)
}

/// `baton break NAME`: ends the holders' leases (or, where the backend cannot end another
/// process's lease, deletes their entries), so that the next waiter is granted and the
/// holders are told. Refused while a holder's lease is live unless `force`.
pub(crate) async fn break_holders(
    backend: &dyn Backend,
    name: &str,
    force: bool,
    json: bool,
) -> Result<u8, Failure> {
    let view = inspect::inspect(backend, name).await?;
    let holders: Vec<&Member> = view.holders().collect();
    if holders.is_empty() {
        eprintln!(
            "baton: `{}` has no holder: nothing to break",
            one_line(view.name())
        );
        return Ok(0);
    }
    if !force && let Some(live) = holders.iter().find(|m| m.ttl().is_some()) {
        return Err(Failure::new(
            exit::TIMEOUT,
            format!(
                "the holder {} of `{}` has a live lease ({} s left): it may still be working; wait for it, or pass --force to end its lease now",
                who(live),
                one_line(view.name()),
                live.ttl().map_or(0, |t| t.as_secs()),
            ),
        ));
    }
    if !force && let Some(unknown) = holders.iter().find(|m| m.entry().lease().is_some()) {
        return Err(Failure::new(
            exit::TIMEOUT,
            format!(
                "this backend cannot tell whether the lease of the holder {} of `{}` is live: pass --force to end it",
                who(unknown),
                one_line(view.name())
            ),
        ));
    }
    let by = format!(
        "{}pid {}",
        baton_host().map_or_else(String::new, |h| format!("{h} ")),
        std::process::id()
    );
    for holder in holders {
        let entry = holder.entry();
        // Ending the lease ends every entry of the holder's session and tells it at its next
        // renewal; a backend that cannot end another process's session (ZooKeeper), or an
        // entry with no lease, gets its entry deleted, which its guard hears at once.
        let how = match entry.lease() {
            Some(lease) if backend.revoke_lease(lease).await.is_ok() => {
                format!("ended lease {}", lease.to_hex())
            }
            _ => {
                backend.delete_entry(entry).await?;
                "deleted the entry".to_owned()
            }
        };
        let at = millis(SystemTime::now());
        if json {
            out(&format!(
                "{{\"event\":\"broken\",\"name\":{},\"key\":{},\"token\":{},\"holder\":{},\"how\":{},\"by\":{},\"at_ms\":{at},\"forced\":{force}}}",
                json_str(view.name()),
                json_str(entry.key()),
                entry.token(),
                json_str(&who(holder)),
                json_str(&how),
                json_str(&by),
            ))?;
        } else {
            out(&format!(
                "baton: broke `{}`: {how} of {} (key {}, token {}) by {by} at {at} ms since 1970{}",
                one_line(view.name()),
                who(holder),
                one_line(entry.key()),
                entry.token(),
                if force { ", forced" } else { "" },
            ))?;
        }
    }
    Ok(0)
}

/// `baton init`: marks the store as baton's, without a restart grace.
pub(crate) async fn init(backend: &dyn Backend, json: bool) -> Result<u8, Failure> {
    let began = backend.init_store().await?;
    let said = if began {
        "marked as baton's: its first store epoch began without a restart grace. This asserts that no baton holder from before exists (the store is new, or every client that used it has stopped); the first lock is granted at once"
    } else {
        "already marked as baton's (or a store that never forgets): nothing changed"
    };
    if json {
        out(&format!(
            "{{\"event\":\"init\",\"began_epoch\":{began},\"message\":{}}}",
            json_str(said)
        ))?;
    } else {
        out(&format!("baton: {said}"))?;
    }
    Ok(0)
}

/// `holder`, or `waiter<N>` (N: its place among the waiters).
fn role_word(m: &Member) -> String {
    match m.role() {
        Role::Holder => "holder".to_owned(),
        _ => format!("waiter{}", m.place()),
    }
}

fn role_text(m: &Member) -> String {
    let mut role = role_word(m);
    if m.kind() != EntryKind::Exclusive {
        role.push_str(&format!("({})", m.kind().as_str()));
    }
    role
}

fn member_json(view: &QueueView, i: usize, m: &Member) -> String {
    let owner = m.owner();
    format!(
        "{{\"role\":{},\"kind\":{},\"position\":{i},\"name\":{},\"key\":{},\"token\":{},\"lease\":{},\"ttl\":{},\"host\":{},\"pid\":{},\"since_ms\":{},\"owner\":{},\"limit\":{}}}",
        json_str(&role_word(m)),
        json_str(m.kind().as_str()),
        json_str(m.name()),
        json_str(m.entry().key()),
        m.entry().token(),
        m.entry()
            .lease()
            .map_or_else(|| "null".to_owned(), |l| json_str(&l.to_hex())),
        m.ttl()
            .map_or_else(|| "null".to_owned(), |t| t.as_secs().to_string()),
        owner.host().map_or_else(|| "null".to_owned(), json_str),
        owner
            .pid()
            .map_or_else(|| "null".to_owned(), |p| p.to_string()),
        owner
            .since()
            .map_or_else(|| "null".to_owned(), |t| millis(t).to_string()),
        json_str(owner.text()),
        view.limit()
            .map_or_else(|| "null".to_owned(), |l| l.to_string()),
    )
}

/// Who an entry's owner is, in a few words: `host pid N`, or its value.
fn who(m: &Member) -> String {
    let owner = m.owner();
    match (owner.host(), owner.pid()) {
        (Some(h), Some(p)) => format!("{} pid {p}", one_line(h)),
        (None, Some(p)) => format!("pid {p}"),
        _ if owner.text().is_empty() => m.entry().lease().map_or_else(
            || "(no owner info)".to_owned(),
            |l| format!("lease {}", l.to_hex()),
        ),
        _ => one_line(owner.text()).chars().take(40).collect(),
    }
}

/// When the longest-standing holder joined, if its owner said.
fn oldest(view: &QueueView) -> Option<SystemTime> {
    view.holders().filter_map(|m| m.owner().since()).min()
}

/// A past instant as an age: `42s ago`, `3m ago`, `2h ago`.
fn ago(t: SystemTime) -> String {
    let age = SystemTime::now()
        .duration_since(t)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    match age {
        0..120 => format!("{age}s ago"),
        120..7_200 => format!("{}m ago", age / 60),
        _ => format!("{}h ago", age / 3_600),
    }
}

fn millis(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// This host's name, for the audit line of `break` and for the value of baton's entries.
pub(crate) fn baton_host() -> Option<&'static str> {
    inspect::host_name()
}

/// Prints rows as a table: columns padded to their widest cell (those `right` names aligned
/// to the right, as numbers are), the last left as it is.
fn table(rows: &[Vec<String>], right: &[usize]) -> Result<(), Failure> {
    let columns = rows.first().map_or(0, Vec::len);
    let mut width = vec![0usize; columns];
    for row in rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else if right.contains(&i) {
                line.push_str(&format!("{cell:>w$}  ", w = width[i]));
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = width[i]));
            }
        }
        out(line.trim_end())?;
    }
    Ok(())
}
