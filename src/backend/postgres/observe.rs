//! [`Backend::observe_head`](crate::Backend::observe_head) on PostgreSQL: a copy of the queue
//! kept from a snapshot plus the changes the triggers announce on the queue's channel.
//!
//! Every statement that changes entries NOTIFYs the channel of each queue they are in with
//! the rows it changed (a lease revoke that removes several entries is one notification: the
//! heads between them never existed). The snapshot is taken while no write to entries can
//! commit and is followed by a marker on the channel in the same transaction: notifications
//! before the marker are in the snapshot, those after it are not. A head about to be reported
//! is checked first: expired leases of the queue are ended (their deletions are heard), so an
//! expired entry is never reported as the head. After a reconnect of the LISTEN connection,
//! or a change too large for one notification, the queue is read again and a gap reported as
//! [`HeadEvent::Skipped`] when the head changed meanwhile.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::time::Instant;
use tokio_postgres::types::Type;

use super::listener::{Heard, Subscription};
use super::{PgBackend, entry_from};
use crate::backend::{Entry, FencingToken, HeadEvent, LeaseId, Position};
use crate::error::{Error, Result};

static MARKERS: AtomicU64 = AtomicU64::new(1);

struct Observer {
    backend: PgBackend,
    queue: String,
    channel: String,
    subscription: Option<Subscription>,
    /// The marker of the last snapshot, until it is heard.
    awaiting: Option<String>,
    by_token: BTreeMap<u64, Entry>,
    by_key: HashMap<String, u64>,
    /// The head last reported (`None`: nothing reported yet).
    reported: Option<Option<(FencingToken, Vec<u8>)>>,
    /// A snapshot was taken again: heads may have been missed.
    gap: bool,
    /// When the reported head's lease could expire.
    timer: Option<Instant>,
    out: VecDeque<HeadEvent>,
    failures: u32,
}

pub(super) fn observe(backend: PgBackend, queue: String) -> BoxStream<'static, Result<HeadEvent>> {
    let channel = backend.inner.sql.channel('q', &queue);
    let observer = Observer {
        backend,
        queue,
        channel,
        subscription: None,
        awaiting: None,
        by_token: BTreeMap::new(),
        by_key: HashMap::new(),
        reported: None,
        gap: false,
        timer: None,
        out: VecDeque::new(),
        failures: 0,
    };
    futures::stream::unfold(observer, |mut o| async move {
        let item = o.next().await;
        Some((item, o))
    })
    .boxed()
}

fn unhex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Observer {
    async fn next(&mut self) -> Result<HeadEvent> {
        loop {
            if let Some(event) = self.out.pop_front() {
                return Ok(event);
            }
            if let Err(e) = self.step().await {
                self.failures = self.failures.saturating_add(1);
                let pause = Duration::from_millis(50 << self.failures.min(5));
                tokio::time::sleep(pause).await;
                return Err(e);
            }
            self.failures = 0;
        }
    }

    async fn step(&mut self) -> Result<()> {
        if self.subscription.is_none() {
            let subscription = self
                .backend
                .inner
                .listener
                .subscribe(self.channel.clone())
                .await?;
            self.subscription = Some(subscription);
            return self.snapshot().await;
        }
        let timer = self.timer;
        let heard = {
            let Some(subscription) = self.subscription.as_mut() else {
                return Ok(());
            };
            let sleep = async {
                match timer {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                heard = subscription.heard.recv() => Some(heard.ok_or(Error::Unavailable)?),
                () = sleep => None,
            }
        };
        match heard {
            None => {
                self.timer = None;
                self.settle().await
            }
            Some(Heard::Reconnected) => self.snapshot().await,
            Some(Heard::Payload(payload)) => {
                if let Some(marker) = payload.strip_prefix("M ") {
                    if self.awaiting.as_deref() == Some(marker) {
                        self.awaiting = None;
                    }
                    return Ok(());
                }
                if &*payload == "R" {
                    return self.snapshot().await;
                }
                if self.awaiting.is_some() {
                    // Committed before the snapshot: already in it.
                    return Ok(());
                }
                if !self.apply(&payload) {
                    return self.snapshot().await;
                }
                self.settle().await
            }
        }
    }

    /// Applies one notification's rows; `false` if it could not be read.
    fn apply(&mut self, payload: &str) -> bool {
        for line in payload.lines() {
            let mut fields = line.split(' ');
            match (fields.next(), fields.next()) {
                (Some("D"), Some(token)) => {
                    let (Ok(token), Some(key)) = (token.parse::<u64>(), fields.next()) else {
                        return false;
                    };
                    let Some(key) = unhex(key).and_then(|k| String::from_utf8(k).ok()) else {
                        return false;
                    };
                    if self.by_key.get(&key) == Some(&token) {
                        self.by_key.remove(&key);
                        self.by_token.remove(&token);
                    }
                }
                (Some("P"), Some(token)) => {
                    let (Ok(token), Some(Ok(lease)), Some(key), Some(value)) = (
                        token.parse::<u64>(),
                        fields.next().map(str::parse::<i64>),
                        fields.next().and_then(unhex),
                        fields.next().map_or(Some(Vec::new()), unhex),
                    ) else {
                        return false;
                    };
                    let Ok(key) = String::from_utf8(key) else {
                        return false;
                    };
                    if let Some(old) = self.by_key.insert(key.clone(), token) {
                        self.by_token.remove(&old);
                    }
                    self.by_token.insert(
                        token,
                        Entry::new(
                            key,
                            value,
                            Position::new(token),
                            FencingToken::new(token),
                            Some(LeaseId::new(lease)),
                        ),
                    );
                }
                _ => return false,
            }
        }
        true
    }

    /// Reads the queue again; heads between the last report and now are a gap.
    async fn snapshot(&mut self) -> Result<()> {
        let marker = format!(
            "{}-{}",
            std::process::id(),
            MARKERS.fetch_add(1, Ordering::Relaxed)
        );
        let sql = &self.backend.inner.sql.snapshot;
        let queue = &self.queue;
        let m = &marker;
        let rows = self
            .backend
            .read_request("observe", |c| async move {
                c.query(sql, &[(queue, Type::TEXT), (m, Type::TEXT)]).await
            })
            .await?;
        self.by_token.clear();
        self.by_key.clear();
        for row in &rows {
            let entry = entry_from(row, 0);
            let token = entry.token().get();
            self.by_key.insert(entry.key().to_owned(), token);
            self.by_token.insert(token, entry);
        }
        self.awaiting = Some(marker);
        self.gap = self.reported.is_some();
        self.settle().await
    }

    /// Reports the head if it changed. A new head entry is checked with the server first:
    /// reported if it is the live head there, or if its lease is still live (a head that
    /// existed, the observer being behind); otherwise its lease expired, and the deletion
    /// that says so is on its way: it is never reported.
    async fn settle(&mut self) -> Result<()> {
        let head = self.by_token.values().next().cloned();
        let now = head.as_ref().map(|h| (h.token(), h.value().to_vec()));
        if self.reported.as_ref() == Some(&now) && (now.is_none() || self.timer.is_some()) {
            // Nothing new to report, and the head's expiry is already watched.
            return Ok(());
        }
        let same_entry = matches!(
            (&self.reported, &now),
            (Some(Some((was, _))), Some((is, _))) if was == is
        );
        if let Some(candidate) = head
            .as_ref()
            .filter(|_| !same_entry || self.timer.is_none())
        {
            let sql = &self.backend.inner.sql.reap;
            let queue = &self.queue;
            let lease = candidate.lease().map_or(0, |l| l.get());
            let rows = self
                .backend
                .read_request("observe", |c| async move {
                    c.query(sql, &[(queue, Type::TEXT), (&lease, Type::INT8)])
                        .await
                })
                .await?;
            let Some(row) = rows.first() else {
                return Ok(());
            };
            let ended: i32 = row.get(0);
            let head_token: Option<i64> = row.get(1);
            let head_ms: Option<i64> = row.get(2);
            let live: bool = row.get(3);
            let current = head_token.map(i64::unsigned_abs) == Some(candidate.token().get());
            if ended > 0 || !(current || live) {
                // An expiry: its deletion is on its way; report once it is applied.
                self.timer = None;
                return Ok(());
            }
            // Watch the head's expiry only while the copy is current.
            self.timer = head_ms.filter(|_| current).map(|ms| {
                Instant::now() + Duration::from_millis(ms.unsigned_abs()) + Duration::from_millis(5)
            });
        } else if head.is_none() {
            self.timer = None;
        }
        if self.reported.as_ref() == Some(&now) {
            self.gap = false;
            return Ok(());
        }
        if std::mem::take(&mut self.gap) {
            self.out.push_back(HeadEvent::Skipped);
        }
        self.reported = Some(now);
        self.out.push_back(HeadEvent::Head(head));
        Ok(())
    }
}
