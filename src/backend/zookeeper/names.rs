//! Names: baton's queue names checked as ZooKeeper paths, plain keys mapped to one node each,
//! the node names of the Curator and kazoo layouts, and the protected prefix that lets a
//! create whose answer was lost be found again.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// The node under which plain keys ([`read`](crate::Backend::read),
/// [`swap`](crate::Backend::swap), the keys of guarded writes) live, one node per key, apart
/// from the queues: a semaphore keeps its limit at its own name, which in ZooKeeper is also
/// the directory of its entries.
pub(super) const KEYS: &str = "/_baton-keys";

/// The node under which each session keeps its fence: an ephemeral node whose data version
/// every entry's create checks, and which a session bumps before it looks for a create whose
/// answer it lost, so that the create cannot land afterwards.
pub(super) const SESSIONS: &str = "/_baton-sessions";

/// The fence node of session `id`.
pub(super) fn fence_path(id: i64) -> String {
    format!("{SESSIONS}/{id:016x}")
}

/// Whose node names a queue's entries take. Both peers' mutexes sort their nodes by the
/// sequence number ZooKeeper appends; baton does the same, so a baton [`Mutex`](crate::Mutex)
/// and a peer's mutex on the same path exclude each other (see `docs/zookeeper.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ZkLayout {
    /// Apache Curator's `InterProcessMutex` (and `LeaderSelector`): protected ephemeral
    /// sequential nodes `_c_<uuid>-lock-<sequence>`. The default.
    #[default]
    Curator,
    /// kazoo's `Lock` (and `Election`): ephemeral sequential nodes
    /// `<32 hex digits>__lock__<sequence>`.
    Kazoo,
}

impl ZkLayout {
    /// The layout's name, for errors and logs.
    pub fn name(self) -> &'static str {
        match self {
            ZkLayout::Curator => "Curator",
            ZkLayout::Kazoo => "kazoo",
        }
    }

    /// The other layout: the one whose nodes must not be found in our queues.
    pub(super) fn other(self) -> ZkLayout {
        match self {
            ZkLayout::Curator => ZkLayout::Kazoo,
            ZkLayout::Kazoo => ZkLayout::Curator,
        }
    }

    /// The name given to a create (ZooKeeper appends the sequence number).
    pub(super) fn prefix(self, id: NodeId) -> String {
        let (t, r) = (id.tag, id.random);
        match self {
            ZkLayout::Curator => format!(
                "_c_{:08x}-{:04x}-{:04x}-{:04x}-{:012x}-lock-",
                t >> 32,
                (t >> 16) & 0xffff,
                t & 0xffff,
                r >> 48,
                r & 0xffff_ffff_ffff
            ),
            ZkLayout::Kazoo => format!("{t:016x}{r:016x}__lock__"),
        }
    }

    /// The start of every name this layout gives an entry of `tag`, whatever the attempt.
    pub(super) fn tag_prefix(self, tag: u64) -> String {
        match self {
            ZkLayout::Curator => format!(
                "_c_{:08x}-{:04x}-{:04x}-",
                tag >> 32,
                (tag >> 16) & 0xffff,
                tag & 0xffff
            ),
            ZkLayout::Kazoo => format!("{tag:016x}"),
        }
    }

    /// The sequence number of `name` if it is an entry node of this layout.
    pub(super) fn sequence(self, name: &str) -> Option<i64> {
        let (id, seq) = match self {
            ZkLayout::Curator => {
                let rest = name.strip_prefix("_c_")?;
                let id = rest.get(..36)?;
                let dashes = [8, 13, 18, 23];
                let ok = id.char_indices().all(|(i, c)| {
                    if dashes.contains(&i) {
                        c == '-'
                    } else {
                        c.is_ascii_hexdigit()
                    }
                });
                if !ok {
                    return None;
                }
                (id, rest.get(36..)?.strip_prefix("-lock-")?)
            }
            ZkLayout::Kazoo => {
                let id = name.get(..32)?;
                if !id.chars().all(|c| c.is_ascii_hexdigit()) {
                    return None;
                }
                (id, name.get(32..)?.strip_prefix("__lock__")?)
            }
        };
        let _ = id;
        let digits = seq.strip_prefix('-').unwrap_or(seq);
        if digits.len() < 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        seq.parse().ok()
    }
}

/// What names one create attempt: a part fixed by the queue and the caller's tag (so that
/// [`find_entry`](crate::Backend::find_entry) finds it) and a random part (so that no two
/// attempts, even of one tag, ever share a name: a name is one incarnation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NodeId {
    pub(super) tag: u64,
    pub(super) random: u64,
}

impl NodeId {
    pub(super) fn new(queue: &str, tag: &str) -> NodeId {
        NodeId {
            tag: tag_hash(queue, tag),
            random: random_u64(),
        }
    }
}

/// FNV-1a of the queue and the tag: stable across processes and builds.
pub(super) fn tag_hash(queue: &str, tag: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in queue.bytes().chain([0]).chain(tag.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// 64 bits that differ between attempts and processes (std's randomly keyed hasher over a
/// counter and the clock): uniqueness, not secrecy.
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.write_u128(now);
    h.finish()
}

/// The session a baton tag names: tags are the lease id in hex, optionally followed by `_n`.
pub(super) fn tag_owner(tag: &str) -> Option<i64> {
    let hex = tag.split('_').next()?;
    u64::from_str_radix(hex, 16).ok().map(|v| v as i64)
}

/// Characters ZooKeeper refuses in a path (`PathUtils.validatePath`).
fn refused(c: char) -> bool {
    c == '\0'
        || ('\u{1}'..='\u{1f}').contains(&c)
        || ('\u{7f}'..='\u{9f}').contains(&c)
        || ('\u{e000}'..='\u{f8ff}').contains(&c)
        || ('\u{fff0}'..='\u{ffff}').contains(&c)
}

/// Checks that `name` (a queue, or a segment to append to one) maps to a valid ZooKeeper path
/// `/<name>`: no empty segment (so no leading, trailing or doubled `/`), no `.` or `..`
/// segment, no character ZooKeeper refuses, and not under ZooKeeper's own `/zookeeper` nor
/// baton's own nodes (keys, session fences, the store epoch).
pub(super) fn check_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidArgument("a ZooKeeper name may not be empty"));
    }
    for segment in name.split('/') {
        if segment.is_empty() {
            return Err(Error::InvalidArgument(
                "a ZooKeeper name may not start or end with `/` nor hold `//` (empty path segment)",
            ));
        }
        if segment == "." || segment == ".." {
            return Err(Error::InvalidArgument(
                "`.` and `..` are not allowed as ZooKeeper path segments",
            ));
        }
    }
    if name.chars().any(refused) {
        return Err(Error::InvalidArgument(
            "ZooKeeper paths may not hold control characters, U+D800..U+F8FF or U+FFF0..U+FFFF",
        ));
    }
    let first = name.split('/').next().unwrap_or_default();
    if first == "zookeeper" {
        return Err(Error::InvalidArgument(
            "`/zookeeper` is ZooKeeper's own subtree",
        ));
    }
    if first == &KEYS[1..] {
        return Err(Error::InvalidArgument(
            "`/_baton-keys` holds baton's plain keys, not queues",
        ));
    }
    if first == &SESSIONS[1..] {
        return Err(Error::InvalidArgument(
            "`/_baton-sessions` holds baton's session fences, not queues",
        ));
    }
    if first == &super::epoch::MARKER[1..] {
        return Err(Error::InvalidArgument(
            "`/_baton-epoch` holds baton's store epoch, not queues",
        ));
    }
    Ok(())
}

/// The node of plain key `key`: one node under [`KEYS`], the key percent-encoded (`%`, `/`,
/// and what ZooKeeper refuses), so that keys never nest and never meet a queue.
pub(super) fn key_path(key: &str) -> Result<String> {
    if key.is_empty() {
        return Err(Error::InvalidArgument("a key may not be empty"));
    }
    let mut out = String::with_capacity(KEYS.len() + 1 + key.len());
    out.push_str(KEYS);
    out.push('/');
    let start = out.len();
    for c in key.chars() {
        if c == '%' || c == '/' || refused(c) {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    match &out[start..] {
        "." => out.replace_range(start.., "%2E"),
        ".." => out.replace_range(start.., "%2E%2E"),
        _ => {}
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_name_nodes_as_their_peers_do() {
        let id = NodeId {
            tag: 0x0123_4567_89ab_cdef,
            random: 0xfedc_ba98_7654_3210,
        };
        let curator = ZkLayout::Curator.prefix(id);
        assert_eq!(curator, "_c_01234567-89ab-cdef-fedc-ba9876543210-lock-");
        assert!(curator.starts_with(&ZkLayout::Curator.tag_prefix(id.tag)));
        let node = format!("{curator}0000000042");
        assert_eq!(ZkLayout::Curator.sequence(&node), Some(42));
        assert_eq!(ZkLayout::Kazoo.sequence(&node), None);
        let kazoo = ZkLayout::Kazoo.prefix(id);
        assert_eq!(kazoo, "0123456789abcdeffedcba9876543210__lock__");
        let node = format!("{kazoo}0000000007");
        assert_eq!(ZkLayout::Kazoo.sequence(&node), Some(7));
        assert_eq!(ZkLayout::Curator.sequence(&node), None);
        assert_eq!(ZkLayout::Curator.sequence("sub"), None);
        assert_eq!(ZkLayout::Curator.sequence(&format!("{curator}12")), None);
        // Curator's own nodes (Java UUIDs) are recognised.
        assert_eq!(
            ZkLayout::Curator.sequence("_c_03200612-821a-40fa-861d-1d8cccbf2861-lock-0000000000"),
            Some(0)
        );
    }

    #[test]
    fn attempts_of_one_tag_share_the_tag_part_only() {
        let a = NodeId::new("q", "1f");
        let b = NodeId::new("q", "1f");
        assert_eq!(a.tag, b.tag);
        assert_ne!(a.random, b.random);
        assert_ne!(NodeId::new("q", "1f_1").tag, a.tag);
        assert_ne!(NodeId::new("r", "1f").tag, a.tag);
        assert_eq!(tag_owner("1f"), Some(0x1f));
        assert_eq!(tag_owner("1f_3"), Some(0x1f));
        assert_eq!(tag_owner("zz"), None);
    }

    #[test]
    fn bad_names_are_refused() {
        for bad in [
            "",
            "/a",
            "a/",
            "a//b",
            ".",
            "a/./b",
            "a/..",
            "a\u{1}b",
            "zookeeper",
            "zookeeper/quota",
            "_baton-keys/x",
            "_baton-sessions",
            "_baton-sessions/0000000000000001",
            "_baton-epoch",
            "_baton-epoch/0123",
        ] {
            assert!(
                matches!(check_name(bad), Err(Error::InvalidArgument(_))),
                "{bad:?}"
            );
        }
        for good in ["a", "a/b/c", "orders-42", "ü/x", "zookeeper2", "..a"] {
            check_name(good).unwrap();
        }
    }

    #[test]
    fn keys_map_to_one_node_each() {
        assert_eq!(key_path("a/b").unwrap(), "/_baton-keys/a%2Fb");
        assert_eq!(key_path("50%").unwrap(), "/_baton-keys/50%25");
        assert_eq!(key_path("..").unwrap(), "/_baton-keys/%2E%2E");
        assert_eq!(key_path("a\u{1}").unwrap(), "/_baton-keys/a%01");
        assert_ne!(key_path("a/b").unwrap(), key_path("a%2Fb").unwrap());
        assert!(key_path("").is_err());
    }
}
