//! `baton lock`: a lock, a shared lock (`--shared`) or a semaphore's permit (`-n`), waited
//! for or tried (`--try`), then held (see `hold`).

use std::sync::Arc;

use baton::{Backend, Error, Mutex, RwLock, Semaphore};

use crate::connect::{finish, session};
use crate::failure::{Failure, exit};
use crate::hold::{Held, Holder};
use crate::operator;
use crate::wait::wait_granted;

/// Takes `name` (a permit of it with `permits`, its read side with `shared`) on a session of
/// its own, holds it as `h` says, and ends the session.
pub(crate) async fn lock(
    backend: Arc<dyn Backend>,
    h: Holder<'_>,
    name: &str,
    try_once: bool,
    permits: Option<u32>,
    shared: bool,
) -> Result<u8, Failure> {
    let session = session(backend, h.ttl, h.deadline).await?;
    // What `baton status` shows of this holder: host, process, since when it queued.
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let (pid, secs) = (std::process::id(), h.ttl.as_secs());
    let owner = match operator::baton_host() {
        Some(host) => format!("baton-cli host={host} pid={pid} since={since} ttl={secs}"),
        None => format!("baton-cli pid={pid} since={since} ttl={secs}"),
    };
    let what = match (permits, shared) {
        (Some(n), _) => format!("a permit of `{name}` ({n} permits)"),
        (None, true) => format!("shared lock `{name}`"),
        (None, false) => format!("lock `{name}`"),
    };
    let busy = |e| match e {
        Error::Locked { .. } => Failure::new(
            exit::TIMEOUT,
            format!("{what} is held or contended (--try)"),
        ),
        Error::RestartGrace { left, .. } => Failure::new(
            exit::TIMEOUT,
            format!(
                "{what} cannot be granted for {:.1} s more (--try): the store is in a new epoch (it lost or rolled back baton's state, or baton had never marked it), and nothing is granted until the restart grace has passed (--restart-grace); an operator who knows the store is new marks it with `baton init`",
                left.as_secs_f64()
            ),
        ),
        other => other.into(),
    };
    if !try_once {
        h.events.emit("waiting", &[])?;
    }
    let granted = match permits {
        None if shared => {
            let lock = RwLock::new(&session, name)?.with_owner_info(owner);
            if try_once {
                lock.try_read().await.map_err(busy)
            } else {
                wait_granted(&what, h.deadline, h.signals, lock.read()).await
            }
            .map(Held::Read)
        }
        None => {
            let mutex = Mutex::new(&session, name)?.with_owner_info(owner);
            if try_once {
                mutex.try_lock().await.map_err(busy)
            } else {
                wait_granted(&what, h.deadline, h.signals, mutex.lock()).await
            }
            .map(Held::Lock)
        }
        Some(n) => {
            let semaphore = Semaphore::new(&session, name, n)?.with_owner_info(owner);
            if try_once {
                semaphore.try_acquire().await.map_err(busy)
            } else {
                wait_granted(&what, h.deadline, h.signals, semaphore.acquire()).await
            }
            .map(Held::Permit)
        }
    };
    let result = match granted {
        Ok(held) => h.hold(what, &session, held).await,
        Err(e) => Err(e),
    };
    finish(&session, &result).await;
    result
}
