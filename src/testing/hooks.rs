//! Hooks that put the library itself in the states a process meets when its thread is
//! starved, it is frozen, or its wall clock is stepped: for tests (the deterministic
//! simulation uses them, tests/sim).

use std::time::Duration;

use crate::error::Result;

/// Stops the keep-alive driver of the current tokio runtime for `d`, as if its thread were
/// starved or its process frozen (`SIGSTOP`, a long GC pause): for tests.
///
/// One driver renews the lease of every session created in a runtime and marks a session
/// lost when its deadline passes. For `d` it sends no renewal, handles no answer and marks no
/// deadline, while everything else in the runtime runs on: a session whose deadline passes
/// meanwhile is lost, but nothing has recorded it. What must still hold then is what the
/// library promises for a starved or frozen process: [`Session::is_lost`] and every
/// `lost()` future check the deadline themselves, and nothing is granted to a session whose
/// deadline has passed. Starvations that overlap end when the last one ends. The driver of the
/// runtime is started if there is none yet.
///
/// Errors: [`Error::InvalidArgument`](crate::Error::InvalidArgument) outside a tokio runtime,
/// or while it shuts down.
///
/// [`Session::is_lost`]: crate::Session::is_lost
pub fn starve_keep_alive(d: Duration) -> Result<()> {
    crate::session::starve_keep_alive(d)
}

/// Steps the wall clock that baton reads by `by_us` microseconds (negative: back), on top of
/// the steps before, for the whole process: for tests.
///
/// baton reads the wall clock in one place: a client that begins a new store epoch (the
/// store lost or rolled back its state) starts the epoch's tokens at the clock's
/// microseconds since 1970, or above every token the client has seen if that is higher
/// (etcd, ZooKeeper without a leader clock, and the in-memory store, whose stand-in for the
/// wall clock is tokio's clock since the store was created). A step back is what an operator
/// or NTP does to a clock that ran ahead; tokens must still rise. Without the `testing`
/// feature the clock is read as it is, at no cost.
pub fn step_wall_clock(by_us: i64) {
    crate::epoch::step_wall_clock(by_us);
}

/// Puts the wall clock that baton reads back on the system's (undoes every
/// [`step_wall_clock`]): for tests.
pub fn reset_wall_clock() {
    crate::epoch::reset_wall_clock();
}

/// A hook for [`on_value_watch_end`]: called with the watched key.
#[cfg(feature = "etcd")]
pub type ValueWatchEnd = Box<dyn Fn(&str) + Send + Sync>;

/// Calls `hook` with the key each time an etcd backend's shared watch of a plain key (the one
/// every [`Backend::wait_value`](crate::Backend::wait_value) on that key follows) ends because
/// its last waiter left, just before it lets go of the key; `None` removes the hook. For tests:
/// the hook may block for a while, to hold an ending watch at that point while a new waiter
/// arrives, which must then be served (by a new watch). It runs under the lock that new
/// waiters of every key of that backend subscribe under, so it must bound its wait: a new
/// waiter blocks until it returns. Process-wide; one hook at a time.
#[cfg(feature = "etcd")]
pub fn on_value_watch_end(hook: Option<ValueWatchEnd>) {
    crate::backend::etcd::value::END_HOOK.set(hook);
}

/// A hook for [`on_indexed_page`]: called with the queue's name.
#[cfg(feature = "etcd")]
pub type IndexedPage = Box<dyn Fn(&str) + Send + Sync>;

/// Calls `hook` with the queue's name each time a look at the entries ahead of an entry of
/// etcd's indexed layout (`predecessor`, `ahead`, `ahead_and_read`) needs another read, between
/// the two; `None` removes the hook. For tests: what changes in the store meanwhile must not
/// make the look answer for an instant that never was. The hook runs on the task doing the
/// look and blocks it until it returns. Process-wide; one hook at a time.
#[cfg(feature = "etcd")]
pub fn on_indexed_page(hook: Option<IndexedPage>) {
    crate::backend::etcd::indexed::PAGE_HOOK.set(hook);
}

/// A hook called with a key or a name.
#[cfg(feature = "etcd")]
type KeyFn = dyn Fn(&str) + Send + Sync;

/// A slot for a hook called with a key or a name, set by a test and called by the library.
#[cfg(feature = "etcd")]
pub(crate) struct KeyHook(std::sync::Mutex<Option<std::sync::Arc<KeyFn>>>);

#[cfg(feature = "etcd")]
impl KeyHook {
    /// An empty slot.
    pub(crate) const fn new() -> KeyHook {
        KeyHook(std::sync::Mutex::new(None))
    }

    /// Sets the hook, or with `None` clears it.
    pub(crate) fn set(&self, hook: Option<Box<KeyFn>>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = hook.map(std::sync::Arc::from);
    }

    /// Calls the hook, if any, without holding its slot (the hook may set another).
    pub(crate) fn call(&self, key: &str) {
        let hook = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(hook) = hook {
            hook(key);
        }
    }
}
