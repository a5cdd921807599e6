//! Shared watches of plain keys, for [`Backend::wait_value`](super::Backend::wait_value): one
//! etcd watch per key per [`EtcdBackend`](super::EtcdBackend), however many tasks wait on it
//! (every waiter of a semaphore watches its limit key; one watch serves them all).
//!
//! A task per watched key reads the key, then watches it from the revision after the read, and
//! publishes every value it learns; after a broken stream or a compaction it reads and watches
//! again. It ends when the last waiter is gone.

use etcd_client::{EventType, WatchOptions};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use tokio::sync::watch;

use super::watch::EtcdTransport;
use crate::retry::Backoff;

/// The last value a shared watch learned: `None` until its first read; then the key's value
/// (`None`: absent).
type Known = Option<Option<Vec<u8>>>;

/// The followed keys, each with its task's sender. A task ends only under this map's lock,
/// after it finds itself the sender's last holder: a waiter that subscribes under the same
/// lock either joins a task that goes on or starts a new one, never one that is ending.
type ByKey = Arc<StdMutex<HashMap<String, Weak<watch::Sender<Known>>>>>;

/// The shared watches of one backend.
#[derive(Default)]
pub(crate) struct ValueWatches {
    by_key: ByKey,
}

impl ValueWatches {
    /// A receiver of `key`'s values, starting the key's watch if no one watches it yet. The
    /// watch reads and watches through `reach` (on a member that answers, as waits do).
    pub(crate) fn subscribe(
        &self,
        key: &str,
        reach: &EtcdTransport,
        requests: &Arc<AtomicU64>,
    ) -> (Arc<watch::Sender<Known>>, watch::Receiver<Known>) {
        let mut by_key = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sender) = by_key.get(key).and_then(Weak::upgrade) {
            let rx = sender.subscribe();
            return (sender, rx);
        }
        by_key.retain(|_, w| w.strong_count() > 0);
        let (tx, rx) = watch::channel(None);
        let sender = Arc::new(tx);
        by_key.insert(key.to_owned(), Arc::downgrade(&sender));
        tokio::spawn(follow(
            key.to_owned(),
            reach.clone(),
            Arc::downgrade(&sender),
            Arc::clone(&self.by_key),
            Arc::clone(requests),
        ));
        (sender, rx)
    }
}

/// Keeps `sender`'s value current until no one holds the sender.
async fn follow(
    key: String,
    reach: EtcdTransport,
    sender: Weak<watch::Sender<Known>>,
    by_key: ByKey,
    requests: Arc<AtomicU64>,
) {
    let mut backoff = Backoff::new();
    loop {
        let Some(tx) = sender.upgrade() else { return };
        let publish = |value: Option<Vec<u8>>| {
            tx.send_if_modified(|known| {
                let changed = known.as_ref() != Some(&value);
                *known = Some(value);
                changed
            });
        };
        // The read, then the watch from the revision after it, on one member, each within
        // the request timeout.
        let member = reach.pick();
        let key = key.as_str();
        let started = async {
            requests.fetch_add(1, Ordering::Relaxed);
            let read = reach
                .ask(member, |mut c| async move { c.get(key, None).await })
                .await?;
            publish(read.kvs().first().map(|kv| kv.value().to_vec()));
            let from = read.header().map_or(0, |h| h.revision()) + 1;
            requests.fetch_add(1, Ordering::Relaxed);
            let options = WatchOptions::new().with_start_revision(from);
            reach
                .ask(
                    member,
                    |mut c| async move { c.watch(key, Some(options)).await },
                )
                .await
        };
        let mut stream = match started.await {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!(%key, error = %e, "value watch: read or watch failed; retrying");
                // Not held while waiting: if every waiter leaves meanwhile, the task ends.
                drop(tx);
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
        };
        backoff.reset();
        loop {
            let msg = tokio::select! {
                // Every waiter is gone (the map keeps only a weak handle): stop.
                () = tx.closed() => {
                    // Under the lock `subscribe` upgrades under: no waiter can join between
                    // this check and the sender's drop.
                    let mut followed = by_key.lock().unwrap_or_else(|p| p.into_inner());
                    if Arc::strong_count(&tx) == 1 {
                        #[cfg(feature = "testing")]
                        END_HOOK.call(key);
                        followed.remove(key);
                        drop(tx);
                        return;
                    }
                    continue;
                }
                msg = stream.message() => msg,
            };
            match msg {
                Ok(Some(msg)) if !msg.canceled() => {
                    for event in msg.events() {
                        publish(match event.event_type() {
                            EventType::Put => event.kv().map(|kv| kv.value().to_vec()),
                            EventType::Delete => None,
                        });
                    }
                }
                // Canceled (compacted past `from`) or ended: read and watch again.
                Ok(_) => {
                    tracing::debug!(%key, "value watch lost; reading and watching again");
                    break;
                }
                // Broken: the same, after a pause, elsewhere if the member stopped answering.
                Err(e) => {
                    tracing::debug!(%key, error = %e, "value watch broke; reading and watching again");
                    reach.broke(member, &e);
                    drop(tx);
                    tokio::time::sleep(backoff.next_delay()).await;
                    break;
                }
            }
        }
    }
}

/// What a follow task calls when it has found no waiter left, just before it ends
/// ([`crate::testing::on_value_watch_end`]).
#[cfg(feature = "testing")]
pub(crate) static END_HOOK: crate::testing::hooks::KeyHook = crate::testing::hooks::KeyHook::new();
