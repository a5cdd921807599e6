//! The LISTEN connection of one [`PgBackend`](super::PgBackend): one connection per backend,
//! shared by every wait and observer of the process, LISTENing on exactly the channels
//! someone waits on.
//!
//! A task owns the connection and runs LISTEN and UNLISTEN in the order they are asked for,
//! so that a channel given up and taken again is never left unlistened. Notifications go to
//! the subscribers of their channel. PostgreSQL drops the notifications of a connection that
//! is lost, so after every reconnect every subscriber is told [`Heard::Reconnected`] and
//! looks again.
//!
//! A queue's channel (an observer's) is also registered in the schema's `observed` table, by
//! this connection's backend pid, in the transaction that LISTENs: the triggers announce a
//! queue's changes only while someone observes it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};

use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::AsyncMessage;

use super::{Target, connect_client};
use crate::error::{Error, Result};
use crate::retry::Backoff;

/// What a subscriber hears.
#[derive(Debug, Clone)]
pub(super) enum Heard {
    /// A notification's payload.
    Payload(Arc<str>),
    /// The LISTEN connection was lost and is back: notifications may have been missed.
    Reconnected,
}

type Subscribers = HashMap<String, Vec<(u64, mpsc::UnboundedSender<Heard>)>>;

#[derive(Debug)]
struct Shared {
    subscribers: StdMutex<Subscribers>,
    next_id: AtomicU64,
    /// Deletion waits woken by a notification so far (see `PgBackend::wakeups`).
    woken: AtomicU64,
    /// To the task; replaced when the task ended with the runtime that ran it.
    commands: StdMutex<mpsc::UnboundedSender<Command>>,
    target: Arc<Target>,
    schema: String,
    /// Why the connection could not be made, while it cannot (cleared once it is): the
    /// connect reports it rather than guess (a server out of connections is not a pooler).
    failure: StdMutex<Option<tokio_postgres::Error>>,
}

impl Shared {
    /// Sends `command` to the task. A task ends with the runtime that runs it (a backend
    /// connected on a runtime that was shut down, used on another): then a new task is
    /// started on the current runtime, which LISTENs on every channel wanted and tells every
    /// subscriber to look again. Returns false only outside a runtime with no task running.
    fn send(self: &Arc<Self>, command: Command) -> bool {
        let mut commands = self.commands.lock().unwrap_or_else(|p| p.into_inner());
        let command = match commands.send(command) {
            Ok(()) => return true,
            Err(mpsc::error::SendError(back)) => back,
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return false;
        }
        *commands = self.spawn_task(false);
        commands.send(command).is_ok()
    }

    /// Starts the task on the current runtime; `first`: no subscriber has missed anything.
    fn spawn_task(self: &Arc<Self>, first: bool) -> mpsc::UnboundedSender<Command> {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(Arc::downgrade(self), rx, first));
        tx
    }
}

#[derive(Debug)]
enum Command {
    Listen(String, oneshot::Sender<()>),
    Unlisten(String),
}

/// The handle: cheap to clone, shared by every clone of the backend.
#[derive(Debug, Clone)]
pub(super) struct Listener {
    shared: Arc<Shared>,
}

/// One subscription: hears its channel until dropped.
#[derive(Debug)]
pub(super) struct Subscription {
    shared: Arc<Shared>,
    channel: String,
    id: u64,
    pub(super) heard: mpsc::UnboundedReceiver<Heard>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut subs = lock(&self.shared.subscribers);
        if let Some(list) = subs.get_mut(&self.channel) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                subs.remove(&self.channel);
                drop(subs);
                self.shared.send(Command::Unlisten(self.channel.clone()));
            }
        }
    }
}

fn lock<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Listener {
    /// Starts the task (on the current runtime) that connects to `target` and listens, for
    /// the backend on `schema`.
    /// Why the LISTEN connection could not connect, if it cannot now (taken: told once).
    pub(super) fn take_failure(&self) -> Option<tokio_postgres::Error> {
        lock(&self.shared.failure).take()
    }

    pub(super) fn start(target: Arc<Target>, schema: String) -> Listener {
        let shared = Arc::new(Shared {
            subscribers: StdMutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            woken: AtomicU64::new(0),
            // Replaced at once by the task's sender.
            commands: StdMutex::new(mpsc::unbounded_channel().0),
            target,
            schema,
            failure: StdMutex::new(None),
        });
        let commands = shared.spawn_task(true);
        *shared.commands.lock().unwrap_or_else(|p| p.into_inner()) = commands;
        Listener { shared }
    }

    /// How many deletion waits (subscribers of an entry's channel) a notification reached.
    pub(super) fn woken(&self) -> u64 {
        self.shared.woken.load(Ordering::Relaxed)
    }

    /// Subscribes to `channel`; returns once the server LISTENs on it, so that every
    /// notification committed from then on is heard.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing behind but a LISTEN that is undone at once.
    pub(super) async fn subscribe(&self, channel: String) -> Result<Subscription> {
        let (tx, heard) = mpsc::unbounded_channel();
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.shared.subscribers)
            .entry(channel.clone())
            .or_default()
            .push((id, tx));
        let subscription = Subscription {
            shared: Arc::clone(&self.shared),
            channel: channel.clone(),
            id,
            heard,
        };
        let (ack, acked) = oneshot::channel();
        if !self.shared.send(Command::Listen(channel, ack)) {
            return Err(Error::Unavailable);
        }
        acked.await.map_err(|_| Error::Unavailable)?;
        Ok(subscription)
    }
}

/// Tells every subscriber of `channel` (or of every channel, for `None`).
fn dispatch(shared: &Shared, channel: Option<&str>, heard: &Heard) {
    let subs = lock(&shared.subscribers);
    let send = |list: &Vec<(u64, mpsc::UnboundedSender<Heard>)>| {
        for (_, tx) in list {
            let _ = tx.send(heard.clone());
        }
    };
    match channel {
        Some(channel) => {
            if let Some(list) = subs.get(channel) {
                if is_entry_channel(channel) {
                    shared.woken.fetch_add(list.len() as u64, Ordering::Relaxed);
                }
                send(list);
            }
        }
        None => subs.values().for_each(send),
    }
}

/// How many channels stay listened before those nobody waits on are given up.
const IDLE_CHANNELS: usize = 128;

/// Whether `channel` is an entry's (a deletion wait's): `chan('e', ..)` in the schema.
fn is_entry_channel(channel: &str) -> bool {
    channel.starts_with("be")
}

/// Whether `channel` is a queue's (an observer's): `chan('q', ..)` in the schema.
fn is_queue_channel(channel: &str) -> bool {
    channel.starts_with("bq")
}

/// LISTEN on `channel`, registering it in `observed` if it is a queue's. (Channel names are
/// `b`, a kind letter and hex digits: nothing to quote.)
fn listen_sql(schema: &str, channel: &str) -> String {
    if is_queue_channel(channel) {
        format!(
            "LISTEN {channel}; \
             DELETE FROM {schema}.observed WHERE pid <> ALL (SELECT pid FROM pg_stat_activity \
               WHERE pid IS NOT NULL); \
             INSERT INTO {schema}.observed (channel, pid) VALUES ('{channel}', pg_backend_pid()) \
               ON CONFLICT DO NOTHING;"
        )
    } else {
        format!("LISTEN {channel};")
    }
}

/// UNLISTEN on `channel`, and its registration gone if it is a queue's.
fn unlisten_sql(schema: &str, channel: &str) -> String {
    if is_queue_channel(channel) {
        format!(
            "UNLISTEN {channel}; \
             DELETE FROM {schema}.observed WHERE channel = '{channel}' AND pid = pg_backend_pid();"
        )
    } else {
        format!("UNLISTEN {channel};")
    }
}

async fn run(
    shared: Weak<Shared>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    mut first: bool,
) {
    let Some((target, schema)) = shared
        .upgrade()
        .map(|s| (Arc::clone(&s.target), s.schema.clone()))
    else {
        return;
    };
    let mut backoff = Backoff::new();
    loop {
        let connected = tokio::time::timeout(target.connect_timeout, connect_client(&target)).await;
        let (client, mut connection) = match connected {
            Ok(Ok(pair)) => pair,
            failed => {
                let error = match failed {
                    Ok(Err(e)) => {
                        let text = e.to_string();
                        if let Some(shared) = shared.upgrade() {
                            *lock(&shared.failure) = Some(e);
                        }
                        text
                    }
                    _ => "timed out".to_owned(),
                };
                tracing::debug!(error = %error, "the LISTEN connection could not connect; retrying");
                if shared.strong_count() == 0 {
                    return;
                }
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
        };
        if let Some(shared) = shared.upgrade() {
            lock(&shared.failure).take();
        }
        // Notifications go straight to their subscribers from the connection's own task.
        let (dead_tx, mut dead) = oneshot::channel::<()>();
        let weak = shared.clone();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(n) = message {
                    let Some(shared) = weak.upgrade() else { break };
                    dispatch(
                        &shared,
                        Some(n.channel()),
                        &Heard::Payload(Arc::from(n.payload())),
                    );
                }
            }
            let _ = dead_tx.send(());
        });
        // LISTEN on every channel someone waits on, then tell them all to look again.
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let wanted: Vec<String> = lock(&strong.subscribers).keys().cloned().collect();
        drop(strong);
        let mut listening: HashSet<String> = HashSet::new();
        // One transaction: LISTENs and registrations take effect together; and the isolation
        // the later registrations were written for, whatever the role's default (a SET in a
        // batch takes effect for the transactions after it).
        let sql: String = wanted
            .iter()
            .map(|c| listen_sql(&schema, c))
            .chain(std::iter::once(super::ISOLATION.to_owned()))
            .collect();
        if let Err(e) = client.batch_execute(&sql).await {
            tracing::debug!(error = %e, "the LISTEN connection could not listen; reconnecting");
            tokio::time::sleep(backoff.next_delay()).await;
            continue;
        }
        backoff.reset();
        listening.extend(wanted);
        if !first && let Some(strong) = shared.upgrade() {
            dispatch(&strong, None, &Heard::Reconnected);
        }
        first = false;
        // A command taken from the queue while gathering LISTENs, to run next.
        let mut next: Option<Command> = None;
        loop {
            let command = match next.take() {
                Some(command) => command,
                None => {
                    let command = tokio::select! {
                        command = commands.recv() => command,
                        _ = &mut dead => break,
                    };
                    let Some(command) = command else {
                        return;
                    };
                    command
                }
            };
            match command {
                Command::Listen(channel, ack) => {
                    // Every LISTEN asked for meanwhile, in one transaction (one round trip): a
                    // waiter that joins behind thousands waits for one, not for thousands.
                    // An UNLISTEN asked for after them runs after them.
                    let mut batch = vec![(channel, ack)];
                    while let Ok(more) = commands.try_recv() {
                        match more {
                            Command::Listen(channel, ack) => batch.push((channel, ack)),
                            other => {
                                next = Some(other);
                                break;
                            }
                        }
                    }
                    let mut seen: HashSet<&String> = HashSet::new();
                    let new: Vec<&String> = batch
                        .iter()
                        .map(|(channel, _)| channel)
                        .filter(|c| !listening.contains(*c) && seen.insert(*c))
                        .collect();
                    if !new.is_empty() {
                        let sql: String = new.iter().map(|c| listen_sql(&schema, c)).collect();
                        if client.batch_execute(&sql).await.is_err() {
                            // Heard after the reconnect: LISTENed with the others then.
                            drop(batch);
                            break;
                        }
                        listening.extend(new.into_iter().cloned());
                    }
                    for (_, ack) in batch {
                        let _ = ack.send(());
                    }
                }
                Command::Unlisten(channel) => {
                    let Some(strong) = shared.upgrade() else {
                        return;
                    };
                    // An entry's channel nobody waits on stays listened for a while: the same
                    // keys are waited on again and again (a session's entry in a lock keeps its
                    // key), and each LISTEN or UNLISTEN is a transaction. Once more than
                    // IDLE_CHANNELS listened channels have nobody waiting on them, they go in
                    // one UNLISTEN (so a deep queue, whose every release leaves one channel
                    // idle, sends one UNLISTEN per IDLE_CHANNELS releases).
                    // A queue's channel goes at once (its registration makes the triggers
                    // announce that queue's changes).
                    let idle: Vec<String> = {
                        let subscribers = lock(&strong.subscribers);
                        if is_queue_channel(&channel) {
                            if subscribers.contains_key(&channel) || !listening.contains(&channel) {
                                Vec::new()
                            } else {
                                vec![channel]
                            }
                        } else if listening.len() > subscribers.len() + IDLE_CHANNELS {
                            listening
                                .iter()
                                .filter(|c| !is_queue_channel(c) && !subscribers.contains_key(*c))
                                .cloned()
                                .collect()
                        } else {
                            Vec::new()
                        }
                    };
                    drop(strong);
                    if idle.is_empty() {
                        continue;
                    }
                    let sql: String = idle.iter().map(|c| unlisten_sql(&schema, c)).collect();
                    if client.batch_execute(&sql).await.is_err() {
                        break;
                    }
                    for c in &idle {
                        listening.remove(c);
                    }
                }
            }
        }
        tracing::debug!("the LISTEN connection was lost; reconnecting");
    }
}
