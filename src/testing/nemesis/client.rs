//! A client process: lock -> fenced read-modify-write of the resource's counter -> unlock,
//! in a loop, printing every event on standard output, until its standard input closes.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::history::{Event, What, now_ns};
use super::resource::Bug;
use super::schedule::Rng;
use super::{ENV_CLIENT, Recipe};
use crate::{
    Backend, ConnectOptions, Election, Error, FencingToken, LostReason, Mutex, RwLock, Semaphore,
    Session, SessionOptions,
};

/// How long one `lock()` may wait before the client gives up on it (and says so).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// What a client is told through its environment.
#[derive(Debug)]
pub(crate) struct ClientConfig {
    pub(crate) id: usize,
    pub(crate) incarnation: u32,
    pub(crate) endpoint: String,
    pub(crate) lock: String,
    pub(crate) recipe: Recipe,
    pub(crate) resource: String,
    pub(crate) ttl: Duration,
    pub(crate) grace: Duration,
    pub(crate) seed: u64,
    pub(crate) bug: Option<Bug>,
}

impl ClientConfig {
    pub(crate) fn to_env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            (ENV_CLIENT.to_owned(), self.id.to_string()),
            (
                "BATON_NEMESIS_INCARNATION".into(),
                self.incarnation.to_string(),
            ),
            ("BATON_NEMESIS_ENDPOINT".into(), self.endpoint.clone()),
            ("BATON_NEMESIS_LOCK".into(), self.lock.clone()),
            ("BATON_NEMESIS_RECIPE".into(), self.recipe.name().into()),
            ("BATON_NEMESIS_RESOURCE".into(), self.resource.clone()),
            (
                "BATON_NEMESIS_TTL_MS".into(),
                self.ttl.as_millis().to_string(),
            ),
            (
                "BATON_NEMESIS_GRACE_MS".into(),
                self.grace.as_millis().to_string(),
            ),
            ("BATON_NEMESIS_SEED".into(), self.seed.to_string()),
        ];
        if let Some(bug) = self.bug {
            env.push(("BATON_NEMESIS_BUG".into(), bug.name().into()));
        }
        env
    }

    pub(crate) fn from_env() -> Option<ClientConfig> {
        let var = |name: &str| std::env::var(name).ok();
        let num = |name: &str| var(name).and_then(|v| v.parse::<u64>().ok());
        Some(ClientConfig {
            id: num(ENV_CLIENT)?.try_into().ok()?,
            incarnation: num("BATON_NEMESIS_INCARNATION")?.try_into().ok()?,
            endpoint: var("BATON_NEMESIS_ENDPOINT")?,
            lock: var("BATON_NEMESIS_LOCK")?,
            recipe: Recipe::parse(&var("BATON_NEMESIS_RECIPE")?)?,
            resource: var("BATON_NEMESIS_RESOURCE")?,
            ttl: Duration::from_millis(num("BATON_NEMESIS_TTL_MS")?),
            grace: Duration::from_millis(num("BATON_NEMESIS_GRACE_MS")?),
            seed: num("BATON_NEMESIS_SEED")?,
            bug: var("BATON_NEMESIS_BUG").and_then(|b| Bug::parse(&b)),
        })
    }
}

/// Prints events; a process whose runner is gone (stdout closed) exits.
#[derive(Debug, Clone)]
struct Out {
    who: Arc<str>,
}

impl Out {
    fn emit(&self, what: What) {
        let event = Event {
            at: now_ns(),
            who: self.who.to_string(),
            what,
        };
        let mut stdout = std::io::stdout().lock();
        if writeln!(stdout, "{event}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            std::process::exit(3);
        }
    }
}

/// What a client holds.
enum Held {
    Mutex(crate::MutexGuard),
    Permit(crate::SemaphorePermit),
    Read(crate::RwLockReadGuard),
    Write(crate::RwLockWriteGuard),
    Leader(crate::Leadership),
}

impl Held {
    fn token(&self) -> FencingToken {
        match self {
            Held::Mutex(g) => g.fencing_token(),
            Held::Permit(g) => g.fencing_token(),
            Held::Read(g) => g.fencing_token(),
            Held::Write(g) => g.fencing_token(),
            Held::Leader(g) => g.fencing_token(),
        }
    }

    fn lost(&self) -> futures::future::BoxFuture<'static, LostReason> {
        match self {
            Held::Mutex(g) => Box::pin(g.lost()),
            Held::Permit(g) => Box::pin(g.lost()),
            Held::Read(g) => Box::pin(g.lost()),
            Held::Write(g) => Box::pin(g.lost()),
            Held::Leader(g) => Box::pin(g.lost()),
        }
    }

    async fn release(self) -> crate::Result<()> {
        match self {
            Held::Mutex(g) => g.release().await,
            Held::Permit(g) => g.release().await,
            Held::Read(g) => g.release().await,
            Held::Write(g) => g.release().await,
            Held::Leader(g) => g.release().await,
        }
    }
}

async fn acquire(session: &Session, cfg: &ClientConfig, mode: char) -> crate::Result<Held> {
    let name = cfg.lock.clone();
    Ok(match cfg.recipe {
        Recipe::Mutex => Held::Mutex(Mutex::new(session, name)?.lock().await?),
        Recipe::Semaphore => Held::Permit(
            Semaphore::new(session, name, Recipe::SEMAPHORE_PERMITS)?
                .acquire()
                .await?,
        ),
        Recipe::RwLock if mode == 'r' => Held::Read(RwLock::new(session, name)?.read().await?),
        Recipe::RwLock => Held::Write(RwLock::new(session, name)?.write().await?),
        Recipe::Election => Held::Leader(
            Election::new(session, name)?
                .campaign(format!("c{}", cfg.id))
                .await?,
        ),
    })
}

/// One connection to the resource, opened again after a failure.
#[derive(Default)]
struct Conn(Option<(tokio::io::Lines<BufReader<OwnedReadHalf>>, OwnedWriteHalf)>);

/// The resource's answer to one request.
enum Answer {
    Ok(u64),
    Stale,
    /// The connection broke: the request may or may not have been applied.
    Unknown,
}

impl Conn {
    async fn ask(&mut self, addr: &str, request: String) -> Answer {
        if self.0.is_none() {
            match TcpStream::connect(addr).await {
                Ok(s) => {
                    let (r, w) = s.into_split();
                    self.0 = Some((BufReader::new(r).lines(), w));
                }
                Err(_) => return Answer::Unknown,
            }
        }
        let Some((lines, write)) = &mut self.0 else {
            return Answer::Unknown;
        };
        let answer = match write.write_all(request.as_bytes()).await {
            Ok(()) => lines.next_line().await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(Some(line)) => {
                let mut w = line.split_whitespace();
                match (w.next(), w.next().and_then(|v| v.parse().ok())) {
                    (Some("OK"), Some(v)) => Answer::Ok(v),
                    (Some("STALE"), _) => Answer::Stale,
                    _ => {
                        self.0 = None;
                        Answer::Unknown
                    }
                }
            }
            _ => {
                self.0 = None;
                Answer::Unknown
            }
        }
    }
}

/// The fenced read-modify-write: claim (refuses older tokens from now on), read, write the
/// counter plus one. Returns the event that ends it.
async fn fenced_increment(conn: &mut Conn, cfg: &ClientConfig, rng: &mut Rng, token: u64) -> What {
    let (lock, who) = (&cfg.lock, format!("c{}", cfg.id));
    let claim = format!("CLAIM {lock} {token} {who}\n");
    let read = format!("READ {lock} {token} {who}\n");
    let first = if cfg.bug == Some(Bug::ReadBeforeClaim) {
        // Read, then claim: the value read may be overwritten by an older holder in between.
        let value = conn.ask(&cfg.resource, read.clone()).await;
        match conn.ask(&cfg.resource, claim).await {
            Answer::Ok(_) => value,
            other => other,
        }
    } else {
        match conn.ask(&cfg.resource, claim).await {
            Answer::Ok(_) => conn.ask(&cfg.resource, read).await,
            other => other,
        }
    };
    let value = match first {
        Answer::Ok(v) => v,
        Answer::Stale => return What::WriteRefused { token },
        Answer::Unknown => return What::WriteUnknown { token },
    };
    // Some time between the read and the write: a window for a paused holder's late write.
    tokio::time::sleep(Duration::from_millis(rng.below(30))).await;
    let write = format!("WRITE {lock} {token} {who} {}\n", value + 1);
    let outcome = match conn.ask(&cfg.resource, write).await {
        Answer::Ok(v) => What::WriteOk { token, value: v },
        Answer::Stale => return What::WriteRefused { token },
        Answer::Unknown => return What::WriteUnknown { token },
    };
    // Then an entry in the lock's log, in the same hold: the checker pairs each entry with
    // the write before it. Its answer adds nothing the resource's record does not say.
    let _ = conn
        .ask(&cfg.resource, format!("APPEND {lock} {token} {who}\n"))
        .await;
    outcome
}

fn reason(e: &Error) -> String {
    format!("{e:?}").chars().take(120).collect()
}

/// The client's life: returns its exit code.
pub(crate) async fn run(cfg: ClientConfig) -> i32 {
    // Dies with the runner, even while stopped.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    let out = Out {
        who: format!("c{}", cfg.id).into(),
    };
    out.emit(What::Start {
        lock: cfg.lock.clone(),
        pid: std::process::id(),
        incarnation: cfg.incarnation,
    });
    // Its standard input closing is the order to stop.
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    // A thread of its own (blocking reads), so the runtime needs no stdin support.
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        let mut stdin = std::io::stdin();
        while let Ok(n) = std::io::Read::read(&mut stdin, &mut buf) {
            if n == 0 {
                break;
            }
        }
        let _ = stop_tx.send(true);
    });
    let stopped = || *stop.borrow();
    let mut rng = Rng::new(
        cfg.seed ^ (cfg.id as u64).wrapping_mul(0x1000_0001) ^ u64::from(cfg.incarnation) << 48,
    );
    let options = ConnectOptions::new()
        .with_restart_grace(cfg.grace)
        .with_connect_timeout(Duration::from_secs(2));
    let mut conn = Conn::default();
    let mut backend: Option<Arc<dyn Backend>> = None;
    let mut session: Option<Session> = None;
    while !stopped() {
        let Some(b) = backend.clone() else {
            match crate::connect_with(&cfg.endpoint, options.clone()).await {
                Ok(b) => backend = Some(b),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
            continue;
        };
        let s = match session.take() {
            Some(s) if !s.is_lost() => s,
            old => {
                if let Some(old) = old {
                    let _ = tokio::time::timeout(Duration::from_secs(1), old.close()).await;
                }
                let opts = SessionOptions::new().with_ttl(cfg.ttl);
                match tokio::time::timeout(Duration::from_secs(5), Session::with_options(b, opts))
                    .await
                {
                    Ok(Ok(s)) => {
                        out.emit(What::Session);
                        s
                    }
                    _ => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                }
            }
        };
        let mode = match cfg.recipe {
            Recipe::RwLock if rng.below(2) == 0 => 'r',
            Recipe::RwLock => 'w',
            _ => 'x',
        };
        out.emit(What::Acquire { mode });
        let mut stop_wait = stop.clone();
        let got = tokio::select! {
            got = tokio::time::timeout(ACQUIRE_TIMEOUT, acquire(&s, &cfg, mode)) => got,
            _ = stop_wait.wait_for(|s| *s) => {
                out.emit(What::AcquireFailed { reason: "stopping".into() });
                session = Some(s);
                break;
            }
        };
        let held = match got {
            Ok(Ok(held)) => held,
            Ok(Err(e)) => {
                out.emit(What::AcquireFailed { reason: reason(&e) });
                session = Some(s);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(_) => {
                out.emit(What::AcquireFailed {
                    reason: "timeout".into(),
                });
                session = Some(s);
                continue;
            }
        };
        let token = held.token().get();
        out.emit(What::Granted { token, mode });
        let lost = held.lost();
        let told = out.clone();
        let watcher = tokio::spawn(async move {
            lost.await;
            told.emit(What::Lost { token });
        });
        if mode != 'r' {
            out.emit(What::WriteInvoked { token });
            let outcome = fenced_increment(&mut conn, &cfg, &mut rng, token).await;
            out.emit(outcome);
        }
        tokio::time::sleep(Duration::from_millis(rng.below(200))).await;
        out.emit(What::Release { token });
        // The release is over once it answers: no `lost` after this point means anything.
        match tokio::time::timeout(Duration::from_secs(10), held.release()).await {
            Ok(Ok(())) => out.emit(What::Released { token }),
            Ok(Err(e)) => out.emit(What::ReleaseFailed {
                token,
                reason: reason(&e),
            }),
            Err(_) => out.emit(What::ReleaseFailed {
                token,
                reason: "timeout".into(),
            }),
        }
        watcher.abort();
        session = Some(s);
        tokio::time::sleep(Duration::from_millis(rng.below(100))).await;
    }
    if let Some(s) = session {
        let _ = tokio::time::timeout(Duration::from_secs(3), s.close()).await;
    }
    out.emit(What::Exit);
    0
}
