//! The fencing scenarios of the `inventory`, `payment` and `bank_transfer` examples, each run
//! with its first holder paused at a chosen point: its lease runs out while it is paused (we
//! revoke it, which is what the server does after the TTL), its successor is granted, claims
//! and reads, and then the paused holder resumes and carries on with what it had read, before
//! the successor writes: the worst order for a read-modify-write. Each scenario checks its own invariant and fails if it is broken;
//! `tests/examples.rs` runs every pause point on the memory backend and on etcd.
//!
//! Every holder follows the read-modify-write rule: **claim, then read, then write**. The
//! claim returns what it reads, and refuses every older token from then on.
//!
//! Each scenario tells its story in a [`Report`]: where the first holder paused, the token
//! its successor was granted, which of the paused holder's late writes the resource refused
//! and the two tokens (the refused one, and the one the resource had seen), then the
//! invariant it checked.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use baton::backend::Backend;
use baton::{Error, Fence, FencingToken, Mutex, MutexGuard, Session};
use tokio::sync::Notify;

pub(crate) type Failure = Box<dyn std::error::Error + Send + Sync>;

/// Where the first holder pauses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pause {
    /// It does not.
    Never,
    /// Granted, before it claims anything.
    AfterGrant,
    /// After it claimed and read, before it writes: the worst point for a read-modify-write.
    AfterRead,
    /// In the middle of its writes (a side effect done, its record not yet written).
    MidWrite,
    /// After its writes, before it unlocks.
    AfterWrite,
}

impl Pause {
    /// The points of the inventory scenario (it has no side effect to pause in the middle of).
    pub(crate) const INVENTORY: [Pause; 4] = [
        Pause::Never,
        Pause::AfterGrant,
        Pause::AfterRead,
        Pause::AfterWrite,
    ];

    pub(crate) const ALL: [Pause; 5] = [
        Pause::Never,
        Pause::AfterGrant,
        Pause::AfterRead,
        Pause::MidWrite,
        Pause::AfterWrite,
    ];
}

impl fmt::Display for Pause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Pause::Never => "no pause",
            Pause::AfterGrant => "paused after the grant",
            Pause::AfterRead => "paused after reading, before writing",
            Pause::MidWrite => "paused in the middle of its writes",
            Pause::AfterWrite => "paused after writing, before unlocking",
        })
    }
}

/// What a scenario did, in order, one line per event, the invariant last.
#[derive(Debug, Clone, Default)]
pub(crate) struct Report {
    pub(crate) lines: Vec<String>,
}

impl Report {
    /// The line that says a late write was refused, if one was.
    pub(crate) fn refusal(&self) -> Option<&str> {
        self.lines
            .iter()
            .map(String::as_str)
            .find(|line| line.contains("REFUSED"))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.lines.join("\n"))
    }
}

/// Where a scenario runs.
pub(crate) struct World {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) fence: Arc<dyn Fence>,
    /// Unique per run: lock and resource names start with it.
    pub(crate) prefix: String,
}

/// The first holder's pause. At the chosen point its lease ends (we revoke it, as the server
/// does after the TTL) and it stops. The successor, once granted, claims and reads, then
/// resumes it and waits until it has done all it will do, then writes.
struct Pauser {
    at: Pause,
    /// Set while the first holder is stopped (from just before its lease ends).
    paused: AtomicBool,
    resume: Notify,
    first_done: Notify,
    /// What happened, for the [`Report`].
    story: StdMutex<Vec<String>>,
    /// Stripped from resource names in the story.
    prefix: String,
}

impl Pauser {
    fn new(at: Pause, world: &World) -> Arc<Pauser> {
        Arc::new(Pauser {
            at,
            paused: AtomicBool::new(false),
            resume: Notify::new(),
            first_done: Notify::new(),
            story: StdMutex::new(Vec::new()),
            prefix: format!("{}/", world.prefix),
        })
    }

    /// Adds a line to the story.
    fn say(&self, line: String) {
        self.story
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(line);
    }

    /// Tells of a refused claim or write (`what`: "claim", "write of bob = 130"), with the
    /// refused token and the one the resource had seen, and why.
    fn tell_refused(&self, what: &str, e: &Error) {
        if let Error::StaleToken {
            resource,
            token,
            highest,
        } = e
        {
            let resource = resource.strip_prefix(&self.prefix).unwrap_or(resource);
            self.say(format!(
                "the paused holder's late {what} on `{resource}` was REFUSED: its token {token} \
                 is older than token {highest}, which the resource had seen (its successor \
                 claimed it while the paused holder's lease was over)"
            ));
        }
    }

    /// The story, then `outcome`.
    fn report(&self, outcome: String) -> Report {
        let mut lines = std::mem::take(&mut *self.story.lock().unwrap_or_else(|p| p.into_inner()));
        let refused = lines.iter().any(|l| l.contains("REFUSED"));
        match self.at {
            Pause::Never => lines.push("no pause, so no late write to refuse".to_owned()),
            Pause::AfterWrite if !refused => lines.push(
                "no write refused: the first holder had made all its writes before it paused"
                    .to_owned(),
            ),
            _ => {}
        }
        lines.push(outcome);
        Report { lines }
    }

    /// Called by the first holder at each point; stops it at the chosen one.
    async fn point(
        &self,
        here: Pause,
        session: &Session,
        backend: &dyn Backend,
    ) -> Result<(), Failure> {
        if here != self.at {
            return Ok(());
        }
        let resumed = self.resume.notified();
        self.say(format!(
            "{here}: the first holder stops (a GC pause, SIGSTOP) and its lease runs out"
        ));
        // Marked before the lease ends: the successor may be granted during the revoke.
        self.paused.store(true, Ordering::SeqCst);
        backend.revoke_lease(session.lease_id()).await?;
        resumed.await;
        self.say("the first holder resumes, unaware, and goes on from where it was".to_owned());
        Ok(())
    }

    /// Called by the first holder when it has done all it will do (on every path).
    fn first_finished(&self) {
        self.first_done.notify_one();
    }

    /// Called by the other holders right after they claimed and read: if the first holder is
    /// stopped, resume it, and wait until it has finished.
    async fn successor_read(&self, token: FencingToken) {
        if self.paused.swap(false, Ordering::SeqCst) {
            self.say(format!(
                "its successor is granted the lock with token {token}, claims the resource \
                 and reads it"
            ));
            let finished = self.first_done.notified();
            self.resume.notify_one();
            finished.await;
        }
    }
}

/// What a refused write means for the holder that tried it: it lost the lock, and stops.
fn refused(e: &Error) -> bool {
    matches!(e, Error::StaleToken { .. })
}

async fn session(world: &World) -> Result<Session, Failure> {
    Ok(Session::with_options(Arc::clone(&world.backend), Default::default()).await?)
}

/// Takes the lock; the first holder (`first`) takes it before anyone else starts.
async fn lock(session: &Session, name: &str) -> Result<MutexGuard, Failure> {
    Ok(Mutex::new(session, name)?.lock().await?)
}

/// Unlocks; a lock lost meanwhile (a paused holder's) is reported, not an error.
async fn unlock(guard: MutexGuard) -> Result<(), Failure> {
    match guard.release().await {
        Ok(()) | Err(Error::NotOwner { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Ten workers sell from a stock of five. Invariant: sold + left = stocked.
pub(crate) async fn inventory(world: &World, pause: Pause) -> Result<Report, Failure> {
    const STOCKED: u32 = 5;
    let lock_name = format!("{}/inventory/widget", world.prefix);
    let stock = format!("{}/stock/widget", world.prefix);
    let s = session(world).await?;
    let guard = lock(&s, &lock_name).await?;
    world
        .fence
        .write(&stock, guard.ticket(), STOCKED.to_string().as_bytes())
        .await?;
    unlock(guard).await?;

    let pauser = Pauser::new(pause, world);
    let first_granted = Arc::new(Notify::new());
    let mut workers = Vec::new();
    for worker in 0..10 {
        let s = session(world).await?;
        let (fence, backend, pauser, granted) = (
            Arc::clone(&world.fence),
            Arc::clone(&world.backend),
            Arc::clone(&pauser),
            Arc::clone(&first_granted),
        );
        let (lock_name, stock) = (lock_name.clone(), stock.clone());
        let first = worker == 0;
        workers.push(tokio::spawn(async move {
            let guard = lock(&s, &lock_name).await?;
            let sold = async {
                if first {
                    pauser.say(format!(
                        "the first worker is granted the lock with token {}",
                        guard.fencing_token()
                    ));
                    granted.notify_one();
                    pauser.point(Pause::AfterGrant, &s, &*backend).await?;
                }
                // Claim, then read (the claim returns what it read), then write.
                let left: u32 = match fence.claim(&stock, guard.ticket()).await {
                    Ok(data) => u32::try_from(parse(data)?)?,
                    Err(e) if refused(&e) => {
                        pauser.tell_refused("claim", &e);
                        return Ok::<_, Failure>(false);
                    }
                    Err(e) => return Err(e.into()),
                };
                if first {
                    pauser.point(Pause::AfterRead, &s, &*backend).await?;
                } else {
                    pauser.successor_read(guard.fencing_token()).await;
                }
                let sold = left > 0
                    && match fence
                        .write(&stock, guard.ticket(), (left - 1).to_string().as_bytes())
                        .await
                    {
                        Ok(()) => true,
                        Err(e) if refused(&e) => {
                            pauser.tell_refused(&format!("write stock = {}", left - 1), &e);
                            false
                        }
                        Err(e) => return Err(e.into()),
                    };
                if first {
                    pauser.point(Pause::AfterWrite, &s, &*backend).await?;
                }
                Ok(sold)
            }
            .await;
            if first {
                pauser.first_finished();
            }
            unlock(guard).await?;
            sold
        }));
        if first {
            // The first worker holds before the others queue.
            first_granted.notified().await;
        }
    }
    let mut sold = 0;
    for w in workers {
        sold += u32::from(w.await??);
    }
    let left = u32::try_from(parse(world.fence.read(&stock).await?.map(|(_, v)| v))?)?;
    if sold + left != STOCKED {
        return Err(format!("{pause}: sold {sold} + left {left} != {STOCKED} stocked").into());
    }
    Ok(pauser.report(format!(
        "{pause}: sold {sold}, {left} left, {STOCKED} stocked"
    )))
}

/// A payment provider that honours idempotency keys, as real ones do: a second charge with
/// the same key returns the first charge instead of charging again.
#[derive(Debug, Default)]
pub(crate) struct Provider {
    charges: StdMutex<HashMap<String, String>>,
}

impl Provider {
    /// Charges once per idempotency key; returns the charge id, and whether this call made
    /// the charge (rather than finding it made).
    pub(crate) fn charge(&self, idempotency_key: &str, amount: &str) -> (String, bool) {
        let mut charges = self.charges.lock().unwrap_or_else(|p| p.into_inner());
        let n = charges.len() + 1;
        let mut new = false;
        let id = charges
            .entry(idempotency_key.to_owned())
            .or_insert_with(|| {
                new = true;
                format!("ch_{n} ({amount})")
            })
            .clone();
        (id, new)
    }

    pub(crate) fn count(&self) -> usize {
        self.charges.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// One payment request delivered to three instances. Invariant: exactly one charge. The
/// charge is a side effect outside the fenced store: no token check can undo it, so it goes
/// out with an idempotency key (the request id) and the provider makes the second one a no-op.
pub(crate) async fn payment(world: &World, pause: Pause) -> Result<Report, Failure> {
    let request = "req-7f3a";
    let lock_name = format!("{}/payments/{request}", world.prefix);
    let record = format!("{}/charges/{request}", world.prefix);
    let provider = Arc::new(Provider::default());
    let pauser = Pauser::new(pause, world);
    let first_granted = Arc::new(Notify::new());
    let mut instances = Vec::new();
    for instance in 0..3 {
        let s = session(world).await?;
        let (fence, backend, provider, pauser, granted) = (
            Arc::clone(&world.fence),
            Arc::clone(&world.backend),
            Arc::clone(&provider),
            Arc::clone(&pauser),
            Arc::clone(&first_granted),
        );
        let (lock_name, record) = (lock_name.clone(), record.clone());
        let first = instance == 0;
        instances.push(tokio::spawn(async move {
            let guard = lock(&s, &lock_name).await?;
            let token = guard.fencing_token();
            let handled = async {
                if first {
                    pauser.say(format!(
                        "the first instance is granted the lock with token {token}"
                    ));
                    granted.notify_one();
                    pauser.point(Pause::AfterGrant, &s, &*backend).await?;
                }
                let handled = match fence.claim(&record, guard.ticket()).await {
                    Ok(handled) => handled,
                    Err(e) if refused(&e) => {
                        pauser.tell_refused("claim", &e);
                        return Ok::<_, Failure>(());
                    }
                    Err(e) => return Err(e.into()),
                };
                if first {
                    pauser.point(Pause::AfterRead, &s, &*backend).await?;
                } else {
                    pauser.successor_read(token).await;
                }
                if handled.is_none() {
                    let (charge, new) = provider.charge(request, "42.00 EUR");
                    pauser.say(if new {
                        format!("the holder with token {token} charges: {charge}")
                    } else {
                        format!(
                            "the holder with token {token} charges with the same idempotency \
                             key `{request}`: the provider answers with {charge}, no second charge"
                        )
                    });
                    if first {
                        pauser.point(Pause::MidWrite, &s, &*backend).await?;
                    }
                    match fence
                        .write(&record, guard.ticket(), charge.as_bytes())
                        .await
                    {
                        Ok(()) => {}
                        Err(e) if refused(&e) => {
                            pauser.tell_refused(&format!("write of the charge {charge}"), &e);
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                if first {
                    pauser.point(Pause::AfterWrite, &s, &*backend).await?;
                }
                Ok(())
            }
            .await;
            if first {
                pauser.first_finished();
            }
            unlock(guard).await?;
            handled
        }));
        if first {
            first_granted.notified().await;
        }
    }
    for i in instances {
        i.await??;
    }
    let charges = provider.count();
    let recorded = world.fence.read(&record).await?.map(|(_, v)| v);
    if charges != 1 || recorded.is_none() {
        return Err(format!("{pause}: {charges} charges, recorded: {recorded:?}").into());
    }
    Ok(pauser.report(format!("{pause}: exactly one charge, recorded once")))
}

/// Transfers t1 (30 alice -> bob) and t2 (20 alice -> bob), each journalled. The first
/// worker starts them and pauses; its successor completes whatever the journal says is left.
/// Invariant: the total is conserved and each transfer is applied once (alice 50, bob 50).
pub(crate) async fn bank_transfer(world: &World, pause: Pause) -> Result<Report, Failure> {
    let lock_name = format!("{}/bank/transfers", world.prefix);
    let alice = format!("{}/accounts/alice", world.prefix);
    let bob = format!("{}/accounts/bob", world.prefix);
    let s = session(world).await?;
    let guard = lock(&s, &lock_name).await?;
    world.fence.write(&alice, guard.ticket(), b"100").await?;
    world.fence.write(&bob, guard.ticket(), b"0").await?;
    unlock(guard).await?;

    let pauser = Pauser::new(pause, world);
    let first = session(world).await?;
    let guard = lock(&first, &lock_name).await?;
    pauser.say(format!(
        "the first worker is granted the lock with token {}",
        guard.fencing_token()
    ));
    let successor = tokio::spawn({
        let (s, lock_name, pauser) = (
            session(world).await?,
            lock_name.clone(),
            Arc::clone(&pauser),
        );
        let (fence, alice, bob) = (Arc::clone(&world.fence), alice.clone(), bob.clone());
        let prefix = world.prefix.clone();
        async move {
            let guard = lock(&s, &lock_name).await?;
            let role = Role::Successor(&pauser);
            let done = transfers(&*fence, &guard, &prefix, &alice, &bob, role).await;
            unlock(guard).await?;
            done
        }
    });
    let role = Role::First(&pauser, &first, &*world.backend);
    let first_done = transfers(&*world.fence, &guard, &world.prefix, &alice, &bob, role).await;
    pauser.first_finished();
    unlock(guard).await?;
    successor.await??;
    first_done?;
    let a = parse(world.fence.read(&alice).await?.map(|(_, v)| v))?;
    let b = parse(world.fence.read(&bob).await?.map(|(_, v)| v))?;
    if a + b != 100 || a != 50 {
        return Err(format!("{pause}: alice {a} + bob {b}: not alice 50, bob 50").into());
    }
    Ok(pauser.report(format!("{pause}: alice {a}, bob {b}, total 100")))
}

/// Which worker runs [`transfers`]: the first (which may pause) or its successor.
#[derive(Clone, Copy)]
enum Role<'a> {
    First(&'a Pauser, &'a Session, &'a dyn Backend),
    Successor(&'a Pauser),
}

/// Applies whatever is left of t1 and t2, as the journal says; stops (without error) at the
/// first claim or write the fence refuses: the lock was lost. The first worker pauses where
/// its pauser says; the successor resumes it after its first claims and reads.
async fn transfers(
    fence: &dyn Fence,
    guard: &MutexGuard,
    prefix: &str,
    alice: &str,
    bob: &str,
    role: Role<'_>,
) -> Result<(), Failure> {
    let at = |here: Pause| async move {
        match role {
            Role::First(pauser, session, backend) => pauser.point(here, session, backend).await,
            Role::Successor(pauser) if here == Pause::AfterRead => {
                pauser.successor_read(guard.fencing_token()).await;
                Ok(())
            }
            Role::Successor(_) => Ok(()),
        }
    };
    at(Pause::AfterGrant).await?;
    for (id, amount) in [("t1", 30i64), ("t2", 20i64)] {
        let journal = format!("{prefix}/transfers/{id}");
        // Claim everything this transfer touches, then read it. `doing` names the step in
        // the story should the fence refuse it.
        let doing = StdMutex::new(String::new());
        let step = |what: String| {
            *doing.lock().unwrap_or_else(|p| p.into_inner()) = what;
        };
        let run = async {
            step(format!("claim for {id}"));
            let state = fence.claim(&journal, guard.ticket()).await?;
            let a = parse(fence.claim(alice, guard.ticket()).await?)?;
            let b = parse(fence.claim(bob, guard.ticket()).await?)?;
            at(Pause::AfterRead).await?;
            if state.is_none() {
                step(format!("write bob = {} ({id}'s credit)", b + amount));
                fence
                    .write(bob, guard.ticket(), (b + amount).to_string().as_bytes())
                    .await?;
                fence.write(&journal, guard.ticket(), b"credited").await?;
                at(Pause::MidWrite).await?;
            }
            if state.as_deref() != Some(b"done") {
                step(format!("write alice = {} ({id}'s debit)", a - amount));
                fence
                    .write(alice, guard.ticket(), (a - amount).to_string().as_bytes())
                    .await?;
                fence.write(&journal, guard.ticket(), b"done").await?;
            }
            Ok::<(), Failure>(())
        };
        if let Err(e) = run.await {
            return match e.downcast_ref::<Error>() {
                Some(e) if refused(e) => {
                    let (Role::First(pauser, ..) | Role::Successor(pauser)) = role;
                    let what = doing.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    pauser.tell_refused(&what, e);
                    Ok(())
                }
                _ => Err(e),
            };
        }
    }
    at(Pause::AfterWrite).await?;
    Ok(())
}

fn parse(data: Option<Vec<u8>>) -> Result<i64, Failure> {
    Ok(match data {
        Some(v) => String::from_utf8(v)?.parse()?,
        None => 0,
    })
}
