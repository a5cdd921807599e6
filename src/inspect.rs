//! What a queue holds, as the recipes decide it: who holds, who waits and in what order,
//! their leases and owners. For operators (`baton status`, `baton ls`) and for programs that
//! show the state of their locks; the rules are the recipes' own, written once here rather
//! than re-derived from each backend's key layout.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use crate::backend::{Backend, Entry};
use crate::error::Result;
use crate::queue::{BARRIER, MEMBER, PERMIT, READ};

/// What one name's queue holds, read at one moment ([`inspect`]).
#[derive(Debug, Clone)]
pub struct QueueView {
    name: String,
    limit: Option<u32>,
    members: Vec<Member>,
}

impl QueueView {
    /// The name looked at (as the recipes spell it on this backend).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A semaphore's stored limit, if one is stored at the name.
    pub fn limit(&self) -> Option<u32> {
        self.limit
    }

    /// Every entry, in queue order (names that nest share a queue: entries of nested names
    /// are included, [`Member::name`] says whose they are).
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The entries that hold (a lock's holder, the permits and read locks granted, a
    /// barrier's holders).
    pub fn holders(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(|m| m.role != Role::Waiter)
    }

    /// How many entries wait.
    pub fn waiters(&self) -> usize {
        self.members
            .iter()
            .filter(|m| m.role == Role::Waiter)
            .count()
    }
}

/// Whether an entry holds or waits, as the recipes decide it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Role {
    /// It holds: a lock's oldest entry, a permit within the limit, a read lock with no
    /// exclusive entry ahead, a barrier's or a double barrier's entry.
    Holder,
    /// It waits for entries ahead of it.
    Waiter,
}

/// What kind of entry it is, from the mark its value carries (`docs/recipes.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EntryKind {
    /// A lock, a leadership, a write lock, or an entry baton does not recognise
    /// (`etcdctl lock`, a Go, Curator or kazoo client): it excludes every other.
    Exclusive,
    /// A read lock: shares with read locks.
    Read,
    /// A read-write lock's writer (an exclusive entry under `<name>/write`).
    Write,
    /// A semaphore permit: shares with permits, up to the stored limit.
    Permit,
    /// A barrier's entry: it holds the barrier up.
    Barrier,
    /// A double barrier's member.
    Member,
}

impl EntryKind {
    /// Its name, as `baton status` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Exclusive => "exclusive",
            EntryKind::Read => "read",
            EntryKind::Write => "write",
            EntryKind::Permit => "permit",
            EntryKind::Barrier => "barrier",
            EntryKind::Member => "member",
        }
    }

    fn of(value: &[u8]) -> (EntryKind, &[u8]) {
        for (mark, kind) in [
            (READ, EntryKind::Read),
            (PERMIT, EntryKind::Permit),
            (BARRIER, EntryKind::Barrier),
            (MEMBER, EntryKind::Member),
        ] {
            if let Some(rest) = value.strip_prefix(mark) {
                return (kind, rest);
            }
        }
        (EntryKind::Exclusive, value)
    }
}

/// One entry of a queue, with what the recipes make of it.
#[derive(Debug, Clone)]
pub struct Member {
    entry: Entry,
    role: Role,
    place: usize,
    kind: EntryKind,
    name: String,
    ttl: Option<Duration>,
    owner: Owner,
}

impl Member {
    /// The entry as read.
    pub fn entry(&self) -> &Entry {
        &self.entry
    }

    /// Holder or waiter.
    pub fn role(&self) -> Role {
        self.role
    }

    /// For a waiter, its place among the waiters (1: the next); 0 for a holder.
    pub fn place(&self) -> usize {
        self.place
    }

    /// What kind of entry it is.
    pub fn kind(&self) -> EntryKind {
        self.kind
    }

    /// The name it belongs to: the name looked at, or a name nested under it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What is left of its lease, as the server counts it; `None` if it has none, or the
    /// backend cannot tell (ZooKeeper knows only its own sessions' timeouts).
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// Who owns it, as its value says.
    pub fn owner(&self) -> &Owner {
        &self.owner
    }
}

/// An entry's owner, as its value describes it: baton's recipes write `host=<name> pid=<id>`
/// unless told otherwise, and the CLI adds `since=<ms since 1970>` and `ttl=<seconds>`;
/// anything else is kept as text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owner {
    host: Option<String>,
    pid: Option<u32>,
    since: Option<SystemTime>,
    ttl: Option<Duration>,
    text: String,
}

impl Owner {
    /// Parses a value (its kind's mark already taken off).
    fn parse(value: &[u8]) -> Owner {
        let text = String::from_utf8_lossy(value).into_owned();
        let mut owner = Owner::default();
        for word in text.split_ascii_whitespace() {
            match word.split_once('=') {
                Some(("host", h)) => owner.host = Some(h.to_owned()),
                Some(("pid", p)) => owner.pid = p.parse().ok(),
                Some(("ttl", secs)) => owner.ttl = secs.parse().ok().map(Duration::from_secs),
                Some(("since", ms)) => {
                    owner.since = ms
                        .parse()
                        .ok()
                        .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
                }
                _ => {}
            }
        }
        owner.text = text;
        owner
    }

    /// The host it runs on, if it says.
    pub fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    /// Its process id, if it says.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// When it joined the queue, if it says (the owner's clock).
    pub fn since(&self) -> Option<SystemTime> {
        self.since
    }

    /// The TTL its owner's session was granted, if it says (`ttl=<seconds>`): what a
    /// backend that cannot tell another process's remaining TTL (ZooKeeper) can show.
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// The value as text (lossy), mark removed.
    pub fn text(&self) -> &str {
        &self.text
    }
}

/// Reads `name`'s queue and tells, by the recipes' rules, who holds and who waits:
/// - an exclusive entry holds when it is the oldest;
/// - a read lock holds when no exclusive entry is ahead of it;
/// - a permit holds when no exclusive entry is ahead and fewer permits than the stored
///   limit are;
/// - barrier and double-barrier entries hold (they are in).
///
/// It reads the entries, the limit and each lease's TTL: a handful of requests, not one
/// snapshot, so a queue that moves meanwhile may show a mix.
///
/// # Errors
/// The backend's errors.
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn inspect(backend: &dyn Backend, name: &str) -> Result<QueueView> {
    let name = backend.recipe_name(name);
    let entries = backend.entries(name).await?;
    let limit = match backend.read(name).await? {
        Some(raw) => String::from_utf8_lossy(&raw)
            .parse::<u32>()
            .ok()
            .filter(|l| (1..=crate::Semaphore::MAX_PERMITS).contains(l)),
        None => None,
    };
    view(backend, name, entries, limit).await
}

/// [`inspect`] for every name under `prefix` that has entries (`""`: everything), in name
/// order: what `baton ls` prints. Names are entries' queues (a key's part before its last
/// `/`); a name and the names nested under it are each shown with their own entries.
///
/// # Errors
/// The backend's errors.
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn list(backend: &dyn Backend, prefix: &str) -> Result<Vec<QueueView>> {
    let mut by_name: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
    for entry in backend.entries_under(prefix).await? {
        let name = backend.queue_of_key(entry.key()).to_owned();
        by_name.entry(name).or_default().push(entry);
    }
    let mut views = Vec::with_capacity(by_name.len());
    for (name, mut entries) in by_name {
        entries.sort_by_key(Entry::position);
        let limit = if entries.iter().any(|e| e.value().starts_with(PERMIT)) {
            match backend.read(&name).await? {
                Some(raw) => String::from_utf8_lossy(&raw).parse::<u32>().ok(),
                None => None,
            }
        } else {
            None
        };
        views.push(view(backend, &name, entries, limit).await?);
    }
    Ok(views)
}

async fn view(
    backend: &dyn Backend,
    name: &str,
    entries: Vec<Entry>,
    limit: Option<u32>,
) -> Result<QueueView> {
    let prefix = format!("{name}/");
    let writers = format!("{name}/write");
    let (mut exclusive_ahead, mut permits_ahead, mut waiters) = (false, 0u32, 0usize);
    let mut members = Vec::with_capacity(entries.len());
    for (i, entry) in entries.into_iter().enumerate() {
        let (kind, rest) = EntryKind::of(entry.value());
        // The name it was enqueued on: this one, or one nested under it.
        let queue = backend.queue_of_key(entry.key());
        let of = if queue.starts_with(&prefix) {
            queue.to_owned()
        } else {
            name.to_owned()
        };
        // A read-write lock keeps its writers under `<name>/write` (its readers are marked).
        let kind = if kind == EntryKind::Exclusive && of == writers {
            EntryKind::Write
        } else {
            kind
        };
        let holds = match kind {
            EntryKind::Exclusive | EntryKind::Write => i == 0,
            EntryKind::Read => !exclusive_ahead,
            EntryKind::Permit => {
                !exclusive_ahead && limit.is_none_or(|limit| permits_ahead < limit)
            }
            EntryKind::Barrier | EntryKind::Member => true,
        };
        exclusive_ahead |= matches!(kind, EntryKind::Exclusive | EntryKind::Write);
        permits_ahead += u32::from(kind == EntryKind::Permit);
        let place = if holds {
            0
        } else {
            waiters += 1;
            waiters
        };
        let owner = Owner::parse(rest);
        let ttl = match entry.lease() {
            Some(lease) => backend.lease_ttl(lease).await?,
            None => None,
        };
        members.push(Member {
            entry,
            role: if holds { Role::Holder } else { Role::Waiter },
            place,
            kind,
            name: of,
            ttl,
            owner,
        });
    }
    Ok(QueueView {
        name: name.to_owned(),
        limit,
        members,
    })
}

/// The value recipes store in an entry unless told otherwise: this host and this process
/// (`host=<name> pid=<id>`, for `baton status`).
pub(crate) fn default_owner() -> Vec<u8> {
    match host_name() {
        Some(host) => format!("host={host} pid={}", std::process::id()),
        None => format!("pid={}", std::process::id()),
    }
    .into_bytes()
}

/// This machine's host name as baton records it in its entries' values (Linux: the kernel's),
/// read once; `None` where it cannot be read.
pub fn host_name() -> Option<&'static str> {
    static HOST: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty() && !h.contains(char::is_whitespace))
    })
    .as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_say_what_they_know_and_keep_the_rest() {
        let o = Owner::parse(b"host=db1 pid=42 since=1000");
        assert_eq!(o.host(), Some("db1"));
        assert_eq!(o.pid(), Some(42));
        assert_eq!(
            o.since(),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1))
        );
        let free = Owner::parse(b"worker 7 of the night shift");
        assert_eq!((free.host(), free.pid()), (None, None));
        assert_eq!(free.text(), "worker 7 of the night shift");
    }

    #[test]
    fn kinds_come_from_the_marks() {
        assert_eq!(EntryKind::of(b"baton-read:pid=1").0, EntryKind::Read);
        assert_eq!(EntryKind::of(b"baton-permit:x").0, EntryKind::Permit);
        assert_eq!(EntryKind::of(b"baton-barrier:x").0, EntryKind::Barrier);
        assert_eq!(EntryKind::of(b"baton-member:x").0, EntryKind::Member);
        assert_eq!(EntryKind::of(b"").0, EntryKind::Exclusive);
    }
}
