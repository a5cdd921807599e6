//! Leases: one ZooKeeper session each, kept in a registry of this process, and ended by a
//! watchdog when nothing renews them.
//!
//! A session's own client pings the server by itself, so a lease nobody renews would live on
//! for as long as the process does. baton's leases must end when their owner stops renewing
//! them (a stuck keep-alive task, a test's "crashed" holder): the watchdog closes the session
//! at the instant the [`Session`](crate::Session) layer would call it lost, its TTL after the
//! last renewal that was answered was sent.
//!
//! The registry is process-wide rather than per backend, so that every
//! [`ZkBackend`](super::ZkBackend) of the process can act on a lease another one granted
//! (revoke it, create an entry bound to it), as with etcd and Redis, whose leases are server
//! objects any client can name.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client::Client;

/// One live lease: the session's client, its negotiated timeout, and the instant the
/// watchdog closes it unless it is renewed first.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) client: Client,
    pub(super) ttl: Duration,
    deadline: Mutex<Instant>,
    /// The session's fence node ([`names::fence_path`](super::names::fence_path)).
    pub(super) fence: String,
    /// The fence's data version as this process last set or read it: an entry's create
    /// sets the fence's data expecting it (the answer is the new node's czxid).
    fence_version: AtomicI32,
    /// Held across one create of an entry: each create moves the fence on from the version
    /// the last one left, so the creates of one session go one at a time.
    pub(super) creating: tokio::sync::Mutex<()>,
}

impl Held {
    /// Renewed by a round trip sent at `sent`.
    pub(super) fn renewed(&self, sent: Instant) {
        let mut deadline = self.deadline.lock().unwrap_or_else(|p| p.into_inner());
        *deadline = (*deadline).max(sent + self.ttl);
    }

    /// What is left of the lease, as this process counts it.
    pub(super) fn remaining(&self) -> Duration {
        let deadline = *self.deadline.lock().unwrap_or_else(|p| p.into_inner());
        deadline.saturating_duration_since(Instant::now())
    }

    fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the session is over for the client (expired, closed, refused).
    pub(super) fn is_over(&self) -> bool {
        self.client.state().is_terminated()
    }

    pub(super) fn fence_version(&self) -> i32 {
        self.fence_version.load(Ordering::SeqCst)
    }

    /// Records a version of the fence read or set later than any recorded so far.
    pub(super) fn fenced_at(&self, version: i32) {
        self.fence_version.fetch_max(version, Ordering::SeqCst);
    }
}

static LEASES: LazyLock<Mutex<HashMap<i64, Arc<Held>>>> = LazyLock::new(Default::default);

fn leases() -> std::sync::MutexGuard<'static, HashMap<i64, Arc<Held>>> {
    LEASES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers the session of `client` as a lease and starts its watchdog. `sent`: when the
/// session was asked for (its first renewal).
pub(super) fn register(client: Client, sent: Instant, fence_version: i32) -> Arc<Held> {
    let ttl = client.session_timeout();
    let id = client.session_id().0;
    let held = Arc::new(Held {
        client,
        ttl,
        deadline: Mutex::new(sent + ttl),
        fence: super::names::fence_path(id),
        fence_version: AtomicI32::new(fence_version),
        creating: tokio::sync::Mutex::new(()),
    });
    leases().insert(id, Arc::clone(&held));
    tokio::spawn(watchdog(id, Arc::downgrade(&held)));
    held
}

/// The lease `id`, if this process holds it.
pub(super) fn get(id: i64) -> Option<Arc<Held>> {
    leases().get(&id).cloned()
}

/// Ends lease `id`: forgets it and closes its session (dropping the last handle of the client
/// sends `CloseSession`; the server then deletes the session's ephemeral nodes at once).
/// Waits up to `limit` for the server to confirm; tells whether it did (a lease this process
/// does not hold counts as ended).
pub(super) async fn close(id: i64, limit: Duration) -> bool {
    let Some(held) = leases().remove(&id) else {
        return true;
    };
    let mut state = held.client.state_watcher();
    // Handles still in use by requests in flight keep the session open until they finish.
    drop(held);
    tokio::time::timeout(limit, async {
        while !state.peek_state().is_terminated() {
            state.changed().await;
        }
    })
    .await
    .is_ok()
}

/// Forgets lease `id` (its session ended on its own) if it is still `held`.
pub(super) fn forget(id: i64, held: &Arc<Held>) {
    let mut leases = leases();
    if leases.get(&id).is_some_and(|h| Arc::ptr_eq(h, held)) {
        leases.remove(&id);
    }
}

/// Closes lease `id` once its deadline passes without a renewal.
async fn watchdog(id: i64, held: Weak<Held>) {
    loop {
        let Some(deadline) = held.upgrade().map(|h| h.deadline()) else {
            return;
        };
        tokio::time::sleep_until(deadline).await;
        let Some(h) = held.upgrade() else {
            return;
        };
        if h.deadline() <= Instant::now() {
            let registered = leases().get(&id).is_some_and(|r| Arc::ptr_eq(r, &h));
            drop(h);
            if registered {
                tracing::warn!(lease = %format_args!("{id:x}"), "ZooKeeper lease not renewed within its TTL: closing its session");
                close(id, Duration::from_secs(5)).await;
            }
            return;
        }
    }
}
