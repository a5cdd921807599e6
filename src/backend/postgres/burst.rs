//! Enqueues sent together (schema version 10, `enqueue_burst_v10`).
//!
//! One backend has one request connection, and the server runs its statements one after
//! another, each enqueue a transaction of its own that waits for its WAL flush. Enqueues that
//! arrive while one is in flight wait for it, and then go together in one call: one
//! transaction, one flush for all of them (10,000 waiters of one process queue in a fraction
//! of the time). A caller alone is sent at once, as before.
//!
//! A burst is sent once, with no retry: if it fails, or its answer does not come within the
//! request timeout, each caller goes on alone, as after a first attempt of its own that failed
//! (`PgBackend::enqueue` gives the burst's stamp up before it tries again, so that a burst
//! applied after all creates nothing more, and finds the entry it made).

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;
use tokio_postgres::Row;
use tokio_postgres::types::Type;

use super::conn::Conn;
use super::{Failure, PgBackend, classify};

/// The most enqueues sent in one call.
const MOST: usize = 256;

/// An enqueue waiting for its burst.
pub(super) struct Pending {
    pub(super) queue: String,
    pub(super) tag: String,
    pub(super) lease: i64,
    pub(super) value: Vec<u8>,
    pub(super) stamp: i64,
    /// Its row and the system identifier of the connection that carried it; nothing if the
    /// burst failed (or the sender ended without sending it).
    pub(super) answer: oneshot::Sender<Option<(Row, u64)>>,
}

/// The enqueues waiting, and whether a sender is at work.
#[derive(Default)]
pub(super) struct Bursts {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    sending: bool,
    pending: Vec<Pending>,
}

impl std::fmt::Debug for Bursts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("Bursts")
            .field("sending", &state.sending)
            .field("pending", &state.pending.len())
            .finish()
    }
}

impl Bursts {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every critical section leaves the state consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `pending`; whether the caller must start a sender (none is at work).
    fn add(&self, pending: Pending) -> bool {
        let mut state = self.state();
        state.pending.push(pending);
        !std::mem::replace(&mut state.sending, true)
    }

    /// The next burst to send, oldest first; none: the sender is done.
    fn next(&self) -> Option<Vec<Pending>> {
        let mut state = self.state();
        if state.pending.is_empty() {
            state.sending = false;
            return None;
        }
        let n = state.pending.len().min(MOST);
        Some(state.pending.drain(..n).collect())
    }
}

/// Ends the sender however it ends (a runtime shut down, a panic): the next enqueue starts
/// another, and those left waiting are answered nothing (they go on alone).
struct Sending<'a>(&'a Bursts);

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.sending = false;
        state.pending.clear();
    }
}

impl PgBackend {
    /// The first attempt of an enqueue: in the next burst. Nothing if it failed, or may not
    /// have been applied: the caller gives `pending.stamp` up and goes on alone.
    pub(super) async fn enqueue_in_burst(
        &self,
        pending: impl FnOnce(oneshot::Sender<Option<(Row, u64)>>) -> Pending,
    ) -> Option<(Row, u64)> {
        let (tx, rx) = oneshot::channel();
        if self.inner.bursts.add(pending(tx)) {
            let backend = self.clone();
            tokio::spawn(async move {
                let bursts = &backend.inner.bursts;
                let _sending = Sending(bursts);
                while let Some(burst) = bursts.next() {
                    backend.send_burst(burst).await;
                }
            });
        }
        rx.await.ok().flatten()
    }

    async fn send_burst(&self, burst: Vec<Pending>) {
        let Ok(client) = self.client().await else {
            return;
        };
        let answer =
            tokio::time::timeout(self.inner.request_timeout, self.burst_call(&client, &burst))
                .await;
        let mut rows = match answer {
            Ok(Ok(rows)) => rows,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, enqueues = burst.len(), "a burst of enqueues failed; each goes on alone");
                if !matches!(classify("enqueue", e), Failure::Fatal(_)) {
                    self.forget(&client).await;
                }
                return;
            }
            Err(_) => {
                self.forget(&client).await;
                return;
            }
        };
        let system_id = client.system_id();
        if burst.len() == 1 {
            if let (Some(p), Some(row)) = (burst.into_iter().next(), rows.pop()) {
                let _ = p.answer.send(Some((row, system_id)));
            }
            return;
        }
        let mut burst: Vec<Option<Pending>> = burst.into_iter().map(Some).collect();
        for row in rows {
            let index = row
                .try_get::<_, i32>(14)
                .ok()
                .and_then(|i| usize::try_from(i).ok())
                .and_then(|i| i.checked_sub(1));
            if let Some(p) = index.and_then(|i| burst.get_mut(i)).and_then(Option::take) {
                let _ = p.answer.send(Some((row, system_id)));
            }
        }
    }

    /// One enqueue as every enqueue is sent; more in one call of `enqueue_burst_v10`.
    async fn burst_call(
        &self,
        client: &Arc<Conn>,
        burst: &[Pending],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        if let [one] = burst {
            return client
                .query(
                    &self.inner.sql.enqueue,
                    &[
                        (&one.queue, Type::TEXT),
                        (&one.tag, Type::TEXT),
                        (&one.lease, Type::INT8),
                        (&one.value, Type::BYTEA),
                        (&one.stamp, Type::INT8),
                    ],
                )
                .await;
        }
        let queues: Vec<&str> = burst.iter().map(|p| p.queue.as_str()).collect();
        let tags: Vec<&str> = burst.iter().map(|p| p.tag.as_str()).collect();
        let leases: Vec<i64> = burst.iter().map(|p| p.lease).collect();
        let values: Vec<&[u8]> = burst.iter().map(|p| p.value.as_slice()).collect();
        let stamps: Vec<i64> = burst.iter().map(|p| p.stamp).collect();
        client
            .query(
                &self.inner.sql.enqueue_burst,
                &[
                    (&queues, Type::TEXT_ARRAY),
                    (&tags, Type::TEXT_ARRAY),
                    (&leases, Type::INT8_ARRAY),
                    (&values, Type::BYTEA_ARRAY),
                    (&stamps, Type::INT8_ARRAY),
                ],
            )
            .await
    }
}
