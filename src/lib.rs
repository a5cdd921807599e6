//! Fair distributed locks and leader election on etcd, Redis, ZooKeeper or PostgreSQL, with
//! fencing tokens.
//!
//! - **Queue-fair locks without a herd**: contenders queue by creation order; each waiter
//!   watches only its predecessor, so one release wakes exactly one waiter.
//! - **Fencing tokens**: strictly increasing in grant order ([`MutexGuard::fencing_token`]):
//!   on etcd the holder's key create revision, on Redis a counter that never goes backwards,
//!   on ZooKeeper the holder's node czxid (above every token from before the store lost its
//!   data), on PostgreSQL a value of a sequence.
//! - **Leases that end cleanly**: a [`Session`] keeps its lease alive and tells you at once
//!   when it is lost ([`Session::lost`], [`MutexGuard::lost`]).
//! - **One trait, several backends**: recipes are written against [`Backend`]; etcd
//!   (`EtcdBackend`, feature `etcd`), Redis (`RedisBackend`, feature `redis`;
//!   `docs/redis.md`), ZooKeeper (`ZkBackend`, feature `zookeeper`; `docs/zookeeper.md`),
//!   PostgreSQL (`PgBackend`, feature `postgres`; `docs/postgres.md`) and
//!   in-process ([`MemoryBackend`], always there). [`connect`] picks
//!   one by the endpoints' scheme.
//! - **Interoperable**: keys are laid out as in etcd's Go `concurrency` package, so baton,
//!   Go services and `etcdctl lock` share locks.
//! - **Recipes on the same queue**: a fair [`Semaphore`] (stored limit, lease-bound
//!   permits), a FIFO [`RwLock`], a [`Barrier`] that falls with its holder, a
//!   [`DoubleBarrier`], and a deadlock-free [`MultiLock`]; `docs/recipes.md` compares them
//!   with Curator's and kazoo's.
//!
//! ```toml
//! [dependencies]
//! baton = { version = "0.1", features = ["etcd"] }  # without features: the in-memory backend
//! ```
//!
//! # Example
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
//! use baton::{MemoryBackend, Mutex, Session};
//!
//! // With the `etcd` feature, for real:
//! // `EtcdBackend::connect(&["127.0.0.1:2379"], EtcdOptions::new()).await?`.
//! let session = Session::new(MemoryBackend::new()).await?;
//! let mutex = Mutex::new(&session, "reports/daily")?;
//!
//! let guard = mutex.lock().await?;
//! let token = guard.fencing_token();
//! // Hand `token` to the resource you write to; it rejects lower tokens than it has seen.
//! tokio::select! {
//!     reason = guard.lost() => eprintln!("lock lost ({reason}); stop writing"),
//!     () = async { /* protected work */ } => {}
//! }
//! guard.unlock().await?;
//! # let _ = token;
//! # Ok(()) }
//! ```
//!
//! # Features
//! - `etcd` (not default): `EtcdBackend` and `EtcdFence`, with TLS (rustls); building
//!   etcd-client needs `protoc`. Without any feature, the in-memory backend and every recipe build with the Rust
//!   toolchain alone.
//! - `redis` (not default): `RedisBackend`, on a single Redis 5.0+ primary.
//! - `zookeeper` (not default): `ZkBackend`, on ZooKeeper 3.6+, with Curator's or kazoo's
//!   node layout.
//! - `postgres` (not default): `PgBackend` on PostgreSQL 13+, and `PgFence`, a fence whose
//!   check can be part of the application's own transaction (`docs/postgres.md`).
//! - `redlock` (not default): `redlock::Redlock` over several independent Redis masters, an
//!   efficiency lock without fencing tokens (`docs/redlock.md`).
//! - `serde`: `Serialize`/`Deserialize` for [`FencingToken`] (a plain integer).
//! - `cli`: the `baton` command-line tool, on etcd, Redis, ZooKeeper and PostgreSQL.
//! - `testing`: the `testing` module: `testing::FaultyBackend`, a decorator that injects
//!   faults into any backend's calls; with `etcd`, etcd fixtures (single node and
//!   three-member cluster), with `redis`, Redis fixtures, with `zookeeper`, ZooKeeper
//!   fixtures (`ZkNode`, `ZkEnsemble`), with `postgres`, a PostgreSQL fixture (`PgNode`),
//!   started through testcontainers.
//!
//! Metrics (wait and hold times, handoffs, sessions, keep-alives) go through the `metrics`
//! facade to whatever recorder the application installs: see [`metrics`] and
//! `docs/metrics.md`.
//!
//! See `docs/guarantees.md` for what the lock promises and under which assumptions.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

mod backend;
mod barrier;
mod connect;
mod election;
mod epoch;
mod error;
mod fence;
mod guard;
pub mod inspect;
pub mod metrics;
mod multilock;
mod mutex;
mod queue;
#[cfg(feature = "redlock")]
pub mod redlock;
mod retry;
mod rwlock;
mod semaphore;
mod session;
#[cfg(feature = "testing")]
pub mod testing;

pub use backend::{
    Backend, Enqueued, Entry, FencingToken, HeadEvent, Lease, LeaseId, MemoryBackend,
    MemorySnapshot, Position, WriteOp,
};
#[cfg(feature = "etcd")]
pub use backend::{EtcdBackend, EtcdOptions};
#[cfg(feature = "postgres")]
pub use backend::{PgBackend, PgFence, PgOptions};
#[cfg(feature = "redis")]
pub use backend::{RedisBackend, RedisOptions};
#[cfg(feature = "zookeeper")]
pub use backend::{ZkBackend, ZkLayout, ZkOptions};
pub use barrier::{Barrier, BarrierGuard, DoubleBarrier, Entered};
pub use connect::{ConnectOptions, Endpoints, connect, connect_with};
pub use election::{Election, Leader, LeaderEvent, Leadership};
pub use epoch::StoreEpochs;
pub use error::{BoxError, Error, LostReason, Result, Where};
/// The etcd client baton is built on, re-exported so that code using
/// [`EtcdBackend::client`] names the same version.
#[cfg(feature = "etcd")]
pub use etcd_client;
#[cfg(feature = "etcd")]
pub use fence::EtcdFence;
pub use fence::{Fence, MemoryFence, Ticket, admit, decode_token, encode_token};
pub use multilock::{MultiLock, MultiLockGuard};
pub use mutex::{Mutex, MutexGuard};
pub use rwlock::{RwLock, RwLockReadGuard, RwLockWriteGuard};
pub use semaphore::{Semaphore, SemaphorePermit};
/// The PostgreSQL client baton is built on, re-exported so that code using
/// [`PgFence::claim_in`] names the same `Transaction` type.
#[cfg(feature = "postgres")]
pub use tokio_postgres;

/// The README's Rust example, compiled as a doc test: it must build as written.
#[cfg(all(doctest, feature = "etcd"))]
#[doc = include_str!("../README.md")]
struct ReadmeExample;
pub use session::{Session, SessionOptions};
