//! The one error type of the crate.

use std::error::Error as StdError;
use std::fmt;

use crate::token::FencingToken;

/// A boxed cause, kept as the `source` of an [`Error`] rather than turned into a string.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Why a [`Session`](crate::Session) ended, or a lock or leadership built on it was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// No keep-alive succeeded before the lease could have expired on the server. The
    /// deadline is measured from *before* the last successful renewal was sent, so this fires
    /// no later than the server's own expiry.
    Expired,
    /// The backend reported that the lease no longer exists (revoked from outside, or
    /// expired on the server).
    Revoked,
    /// [`Session::close`](crate::Session::close) was called.
    Closed,
    /// The entry of a lock or leadership was deleted while its session lived (an operator's
    /// `etcdctl del`, a cleanup script, another client). Only guards and leaderships report
    /// it ([`MutexGuard::lost`](crate::MutexGuard::lost),
    /// [`Leadership::lost`](crate::Leadership::lost)); the session goes on.
    EntryDeleted,
    /// The store lost or rolled back state this session's lease was in (restarted without its
    /// data, restored from a snapshot or an older backup, failed over to a replica that missed
    /// writes, flushed): a new *store epoch* began, and someone else may be granted what this
    /// session held once the restart grace has passed (`docs/guarantees.md`).
    StoreReset,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "lease deadline passed without a renewal",
            LostReason::Revoked => "lease no longer exists on the server",
            LostReason::Closed => "session was closed",
            LostReason::EntryDeleted => "the entry was deleted while the session lived",
            LostReason::StoreReset => {
                "the store lost or rolled back its state (a new store epoch began)"
            }
        })
    }
}

/// Everything that can go wrong in baton.
///
/// Causes from the backend (gRPC status, transport errors) are kept as [`source`]s, never
/// flattened into strings, and backend-specific types never appear in the variants.
///
/// [`source`]: std::error::Error::source
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was rejected before anything was sent: nothing was created.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),

    /// An argument was rejected before anything was sent, for a reason that names it (a URL
    /// option the driver does not know, a port out of range, a lock name longer than the
    /// backend can index): nothing was created. Like [`InvalidArgument`](Error::InvalidArgument),
    /// with the offending value (shortened) in the message and the parser's error, if any, as
    /// the source.
    #[error("invalid argument: {what}")]
    InvalidInput {
        /// What was wrong, naming the value (shortened) and the limit or the form expected.
        what: String,
        /// The parser's error, where there is one.
        #[source]
        source: Option<BoxError>,
    },

    /// A PostgreSQL schema baton was told to use exists and is not baton's: it holds tables,
    /// sequences or functions of someone else's, and no `schema_version` of baton's. baton
    /// would mix its tables with the application's (or fail on a name both use), so nothing
    /// was created; choose another schema (`PgOptions::with_schema`).
    #[error(
        "schema `{schema}` exists and is not baton's (it holds objects of another application); \
         choose another schema for baton (PgOptions::with_schema; in a URL, `baton_schema=NAME`)"
    )]
    ForeignSchema {
        /// The schema.
        schema: String,
    },

    /// A semaphore's stored limit is not the one this contender was created with (or is
    /// not a positive number). Nothing was created; no contender ever holds more permits
    /// than the stored limit allows. Change a limit with
    /// [`Semaphore::set_limit`](crate::Semaphore::set_limit).
    #[error("semaphore `{name}` has limit {stored} stored, not {requested}")]
    LimitMismatch {
        /// The semaphore.
        name: String,
        /// What is stored, as text (`nothing` if the key is missing).
        stored: String,
        /// The limit this contender was created with.
        requested: u32,
    },

    /// [`RwLock::write`](crate::RwLock::write) was asked for through a handle whose read
    /// guards are alive: the write would wait behind our own read forever. Nothing was
    /// created; release the read lock first.
    #[error(
        "read-write lock `{name}`: a write while holding a read would deadlock; release the read first"
    )]
    Upgrade {
        /// The lock.
        name: String,
    },

    /// A ZooKeeper queue holds nodes named in another layout than the backend's
    /// (`ZkOptions::with_layout`): clients of one lock must all use Curator's or all kazoo's
    /// names, or they would not exclude each other. Also etcd's indexed layout
    /// (`EtcdLayout::Indexed`) when a key inside a queue's `<name>/_q/` is not one of its
    /// entries and sorts below them (another lock named `<name>/_q/...`): it would fail every
    /// enqueue. Nothing was created.
    #[error("queue `{queue}` holds `{node}`, a node in {layout}'s layout; use one layout per lock")]
    ForeignLayout {
        /// The queue (lock name).
        queue: String,
        /// The foreign node, as a key.
        node: String,
        /// The layout the node is in (`Curator`, `kazoo`).
        layout: &'static str,
    },

    /// The server is older than baton supports (etcd 3.4: its waits name the watches they
    /// add to a stream; Redis 5.0: streams, and scripts that read the clock). Nothing was
    /// sent beyond the checks.
    #[error("{server} {version} is older than {minimum}, the oldest version baton supports")]
    UnsupportedVersion {
        /// The server software (`etcd`, `Redis`).
        server: &'static str,
        /// The version the server reported.
        version: String,
        /// The oldest version baton supports.
        minimum: &'static str,
    },

    /// A server setting would break baton's promises (a Redis `maxmemory-policy` that may
    /// evict lock entries). Nothing was created; change the setting.
    #[error("server setting `{setting}` is `{value}`; baton needs {needed}")]
    ServerSetting {
        /// The setting.
        setting: &'static str,
        /// Its value on the server.
        value: String,
        /// What baton needs, and why.
        needed: &'static str,
    },

    /// A `try_*` call ([`Mutex::try_lock`](crate::Mutex::try_lock),
    /// [`Semaphore::try_acquire`](crate::Semaphore::try_acquire), ...) found the lock held or
    /// contended: nothing was left behind.
    #[error("lock `{name}` is held or contended")]
    Locked {
        /// The lock name.
        name: String,
    },

    /// A `try_*` call found that the backend grants nothing at all for now: the store is in
    /// a new *store epoch* (it lost or rolled back its state, or this process found it
    /// without baton's marker, as on its first use), and a holder from before may still
    /// believe it holds until the restart grace has passed
    /// ([`Session::restart_grace`](crate::Session::restart_grace); `with_restart_grace` on
    /// each backend's options). The lock may be free; nothing was left behind. A waiting
    /// call (`lock()`) waits it out.
    #[error(
        "lock `{name}` cannot be granted for {:.1} s more: the store is in a new epoch (it lost or rolled back its state, or baton had never marked it), and a holder from before may still believe it holds until the restart grace has passed; mark a new store with `baton init` (`Backend::init_store`) to skip it",
        left.as_secs_f64()
    )]
    RestartGrace {
        /// The lock name.
        name: String,
        /// How much longer the backend grants nothing, as far as this process knows.
        left: std::time::Duration,
    },

    /// The session's lease is gone; every lock and wait built on it has ended.
    #[error("session lost: {0}")]
    SessionLost(LostReason),

    /// Our queue entry vanished (deleted from outside, or its lease expired): the lock or
    /// the place in the queue is gone.
    #[error("queue entry `{key}` no longer exists")]
    EntryGone {
        /// The key of the entry.
        key: String,
    },

    /// Leadership ended while [`Election::run_while_leader`](crate::Election::run_while_leader)
    /// ran its work: the work was cancelled.
    #[error("leadership of `{name}` lost")]
    LeadershipLost {
        /// The election name.
        name: String,
    },

    /// A fenced write or claim was refused: a higher token was already accepted (written or
    /// claimed) for the resource. Nothing was written.
    #[error(
        "write to `{resource}` with fencing token {token} refused: token {highest} was already accepted"
    )]
    StaleToken {
        /// The resource written to.
        resource: String,
        /// The token of the refused write.
        token: FencingToken,
        /// The highest token the resource has accepted.
        highest: FencingToken,
    },

    /// The token stored for a fenced resource is not a token: the resource was written by
    /// something else. Nothing was written.
    #[error("fence of `{resource}` holds `{stored}`, which is not a fencing token")]
    CorruptFence {
        /// The resource.
        resource: String,
        /// What was stored, lossily decoded.
        stored: String,
    },

    /// The lock or leadership had already been lost when this call reached the backend (its
    /// entry was gone): a guarded write or proclamation was not applied; an unlock or
    /// resignation found nothing to delete, and tells you that the protected work may have
    /// overlapped a successor's.
    #[error("not the owner of `{key}` any more; nothing was written")]
    NotOwner {
        /// The key of the lock entry that was checked.
        key: String,
    },

    /// The request may or may not have been applied: it failed after it may have reached the
    /// server (a timeout, a broken connection), and no later attempt could tell. Read the state
    /// to learn what happened. Never returned for a request known not to have been applied;
    /// every other error of a write means it was not.
    #[error("the outcome of `{op}`{at} is unknown: it may have been applied")]
    OutcomeUnknown {
        /// The operation.
        op: &'static str,
        /// The lock and the server concerned, where known.
        at: Where,
        /// The last failure seen.
        #[source]
        source: BoxError,
    },

    /// A guarded write (`MutexGuard::write`, `Leadership::write`) named the lock's own key or a
    /// key under the lock's name, which would put an entry without a lease into the lock's
    /// queue. Refused before anything was sent.
    #[error("guarded write to `{key}` refused: it is in the lock's own queue `{queue}`")]
    WriteIntoQueue {
        /// The key of the refused write.
        key: String,
        /// The lock's name (its queue).
        queue: String,
    },

    /// A fenced write or claim came with the token of another lock than the one the resource
    /// is bound to. Tokens compare only within one lock: nothing was written.
    #[error("`{resource}` is fenced by lock `{bound}`, not by `{lock}`")]
    ForeignLock {
        /// The resource.
        resource: String,
        /// The lock the resource is bound to (the first to claim or write it).
        bound: String,
        /// The lock of the refused token.
        lock: String,
    },

    /// The server could not be reached: every endpoint refused the connection or named a
    /// host that does not exist (both reported at once, without waiting out the connect
    /// timeout), or no endpoint answered within the connect timeout. The source says which,
    /// in words (its own source is the operating system's or the transport's error, e.g. an
    /// [`std::io::Error`] of kind [`ConnectionRefused`](std::io::ErrorKind::ConnectionRefused)).
    /// Trying again later may succeed.
    #[error("could not connect to {}", list(endpoints))]
    Connect {
        /// The endpoints that were tried.
        endpoints: Vec<String>,
        /// The last failure seen.
        #[source]
        source: BoxError,
    },

    /// The server answered, but not as configured, and retrying cannot change that: an
    /// `https://` endpoint that does not speak TLS (or an `http://` one that does), a server
    /// certificate the client does not trust (another CA, expired, issued for another name),
    /// no TLS version or cipher in common, a user and password for an etcd without
    /// authentication. Reported at once. The source says what, in words; its own source is
    /// the TLS library's or the server's error.
    #[error("{} does not match the configuration", list(endpoints))]
    Misconfigured {
        /// The endpoints that were tried.
        endpoints: Vec<String>,
        /// What does not match.
        #[source]
        source: BoxError,
    },

    /// The server rejected the credentials (or wants some and got none).
    #[error("authentication failed")]
    Auth {
        /// The server's answer.
        #[source]
        source: BoxError,
    },

    /// The server accepted the credentials but refused a command: the user lacks a
    /// permission baton needs (on Redis, an ACL without `+info`, `+eval`/`+evalsha`,
    /// `+blpop` or `+time`; docs/redis.md lists them). Nothing was applied.
    #[error("permission denied by the server: the user lacks a permission baton needs")]
    Permission {
        /// The server's answer (it names the command).
        #[source]
        source: BoxError,
    },

    /// A request failed after its retries were exhausted.
    #[error("backend request `{op}`{at} failed")]
    Backend {
        /// The operation that failed.
        op: &'static str,
        /// The lock and the server concerned, where known.
        at: Where,
        /// The backend's error.
        #[source]
        source: BoxError,
    },

    /// The backend (or its test double) is shut down or unreachable.
    #[error("backend unavailable")]
    Unavailable,
}

/// What an [`Error`] means for the caller, whichever variant it is ([`Error::kind`]): fix
/// the call, try again, stop the protected work, or fix the set-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The call was refused before anything was sent, and would be again: an argument, a
    /// name, a limit that is not the stored one, a write into a lock's own queue, a write
    /// lock asked for while holding a read.
    InvalidInput,
    /// The lock is held or contended (`try_*`), or nothing is granted for now (a restart
    /// grace): nothing was left behind; try again later.
    Busy,
    /// What was held is gone (the session, the entry, the leadership): stop the work it
    /// protected; it may have overlapped a successor's.
    Lost,
    /// A fence refused a write or claim: a newer holder got there first, or the resource
    /// belongs to another lock. Nothing was written; do not retry with the same token.
    Fenced,
    /// The request may or may not have been applied: read the state to find out.
    OutcomeUnknown,
    /// The server could not be reached, or a request failed after its retries: trying
    /// again later may succeed.
    Unavailable,
    /// The server or the configuration does not fit (TLS, credentials, permissions, a
    /// server setting or version, a schema or node layout of someone else's): retrying
    /// cannot help.
    Misconfigured,
}

impl Error {
    /// What this error means for the caller (see [`ErrorKind`]).
    ///
    /// ```
    /// use baton::{Error, ErrorKind, LostReason};
    /// let e = Error::SessionLost(LostReason::Expired);
    /// assert_eq!(e.kind(), ErrorKind::Lost);
    /// assert!(e.is_lost() && !e.is_retryable());
    /// assert!(Error::Unavailable.is_retryable());
    /// ```
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidArgument(_)
            | Error::InvalidInput { .. }
            | Error::LimitMismatch { .. }
            | Error::Upgrade { .. }
            | Error::WriteIntoQueue { .. } => ErrorKind::InvalidInput,
            Error::Locked { .. } | Error::RestartGrace { .. } => ErrorKind::Busy,
            Error::SessionLost(_)
            | Error::EntryGone { .. }
            | Error::LeadershipLost { .. }
            | Error::NotOwner { .. } => ErrorKind::Lost,
            Error::StaleToken { .. } | Error::ForeignLock { .. } | Error::CorruptFence { .. } => {
                ErrorKind::Fenced
            }
            Error::OutcomeUnknown { .. } => ErrorKind::OutcomeUnknown,
            Error::Connect { .. } | Error::Backend { .. } | Error::Unavailable => {
                ErrorKind::Unavailable
            }
            Error::ForeignSchema { .. }
            | Error::ForeignLayout { .. }
            | Error::UnsupportedVersion { .. }
            | Error::ServerSetting { .. }
            | Error::Misconfigured { .. }
            | Error::Auth { .. }
            | Error::Permission { .. } => ErrorKind::Misconfigured,
        }
    }

    /// Whether the same call may succeed if made again later: the lock was busy, or the
    /// server unavailable ([`ErrorKind::Busy`], [`ErrorKind::Unavailable`]). Not an unknown
    /// outcome: read first, if doing it twice matters.
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind(), ErrorKind::Busy | ErrorKind::Unavailable)
    }

    /// Whether what was held is gone: stop the work it protected ([`ErrorKind::Lost`]).
    pub fn is_lost(&self) -> bool {
        self.kind() == ErrorKind::Lost
    }
}

/// Endpoints for a message: `a, b`.
fn list(endpoints: &[String]) -> String {
    endpoints.join(", ")
}

/// Which lock and which server an [`Error::Backend`] or [`Error::OutcomeUnknown`] concerns,
/// where known: shown in the error's message, e.g. "backend request `enqueue` (lock
/// `orders/42`, Redis at redis://10.0.0.5:6379) failed".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Where {
    /// The lock (or election, or recipe) name.
    pub lock: Option<String>,
    /// The server: the backend's name and its endpoints, without credentials.
    pub endpoint: Option<String>,
}

impl fmt::Display for Where {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.lock, &self.endpoint) {
            (None, None) => Ok(()),
            (Some(lock), None) => write!(f, " (lock `{lock}`)"),
            (None, Some(endpoint)) => write!(f, " ({endpoint})"),
            (Some(lock), Some(endpoint)) => write!(f, " (lock `{lock}`, {endpoint})"),
        }
    }
}

impl Error {
    /// Names the server a backend error concerns (kept if already named).
    #[cfg_attr(
        not(any(
            feature = "etcd",
            feature = "redis",
            feature = "zookeeper",
            feature = "postgres"
        )),
        allow(dead_code)
    )]
    pub(crate) fn at_endpoint(mut self, endpoint: &str) -> Self {
        if let Error::Backend { at, .. } | Error::OutcomeUnknown { at, .. } = &mut self
            && at.endpoint.is_none()
        {
            at.endpoint = Some(endpoint.to_owned());
        }
        self
    }

    /// Names the lock a backend error concerns (kept if already named).
    pub(crate) fn in_lock(mut self, lock: &str) -> Self {
        if let Error::Backend { at, .. } | Error::OutcomeUnknown { at, .. } = &mut self
            && at.lock.is_none()
        {
            at.lock = Some(lock.to_owned());
        }
        self
    }
}

/// Shorthand for `Result<T, baton::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_reached_and_only_busy_and_unavailable_retry() {
        let cases = [
            (Error::InvalidArgument("x"), ErrorKind::InvalidInput),
            (Error::Locked { name: "a".into() }, ErrorKind::Busy),
            (
                Error::RestartGrace {
                    name: "a".into(),
                    left: std::time::Duration::from_secs(1),
                },
                ErrorKind::Busy,
            ),
            (Error::NotOwner { key: "a/1".into() }, ErrorKind::Lost),
            (
                Error::StaleToken {
                    resource: "r".into(),
                    token: FencingToken::new(1),
                    highest: FencingToken::new(2),
                },
                ErrorKind::Fenced,
            ),
            (
                Error::OutcomeUnknown {
                    op: "enqueue",
                    at: Where::default(),
                    source: "lost".into(),
                },
                ErrorKind::OutcomeUnknown,
            ),
            (Error::Unavailable, ErrorKind::Unavailable),
            (
                Error::Auth {
                    source: "no".into(),
                },
                ErrorKind::Misconfigured,
            ),
        ];
        for (error, kind) in &cases {
            assert_eq!(error.kind(), *kind, "{error}");
            assert_eq!(
                error.is_retryable(),
                matches!(kind, ErrorKind::Busy | ErrorKind::Unavailable),
                "{error}"
            );
            assert_eq!(error.is_lost(), *kind == ErrorKind::Lost, "{error}");
        }
    }

    #[test]
    fn backend_errors_name_the_lock_and_the_server_once() {
        let err = Error::Backend {
            op: "enqueue",
            at: Where::default(),
            source: "connection reset".into(),
        };
        assert_eq!(err.to_string(), "backend request `enqueue` failed");
        let err = err
            .at_endpoint("etcd at http://127.0.0.1:2379")
            .in_lock("orders/42")
            .at_endpoint("elsewhere")
            .in_lock("other");
        assert_eq!(
            err.to_string(),
            "backend request `enqueue` (lock `orders/42`, etcd at http://127.0.0.1:2379) failed"
        );
        let unknown = Error::OutcomeUnknown {
            op: "delete",
            at: Where::default(),
            source: "timeout".into(),
        }
        .in_lock("jobs");
        assert_eq!(
            unknown.to_string(),
            "the outcome of `delete` (lock `jobs`) is unknown: it may have been applied"
        );
        // Other errors are left as they are.
        assert!(matches!(
            Error::Unavailable.in_lock("x"),
            Error::Unavailable
        ));
    }
}
