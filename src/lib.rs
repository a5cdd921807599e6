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
//! - **One trait, several backends**: recipes are written against
//!   [`backend::Backend`]; etcd, Redis, ZooKeeper, PostgreSQL (each a cargo feature) and
//!   in-process ([`MemoryBackend`], always there). [`connect`] picks one by the endpoints'
//!   scheme.
//! - **Interoperable**: keys are laid out as in etcd's Go `concurrency` package, so baton,
//!   Go services and `etcdctl lock` share locks; on ZooKeeper, nodes as Curator or kazoo
//!   name them.
//! - **Recipes on the same queue**: a fair [`Semaphore`] (stored limit, lease-bound
//!   permits), a FIFO [`RwLock`], a [`Barrier`] that falls with its holder, a
//!   [`DoubleBarrier`], a deadlock-free [`MultiLock`] and an [`Election`]; `docs/recipes.md`
//!   compares them with Curator's and kazoo's.
//!
//! ```toml
//! [dependencies]
//! baton = { version = "0.4", features = ["etcd"] }  # without features: the in-memory backend
//! ```
//!
//! # Start here
//! 1. **Connect**: [`connect`] (or [`connect_with`] and [`ConnectOptions`]) takes the
//!    endpoints a user gives; the scheme picks the backend: `host:port` or `http(s)://` is
//!    etcd, `redis://`, `zk://`, `postgres://`; `memory://` is a new in-process store.
//! 2. **Session**: [`Session::new`] grants a lease and keeps it alive; it takes what
//!    `connect` returns, a backend, or an `Arc` of one ([`IntoBackend`]).
//! 3. **Recipe**: [`Mutex`], [`Semaphore`], [`RwLock`], [`Election`], [`Barrier`],
//!    [`DoubleBarrier`], [`MultiLock`], each made from the session and a name.
//! 4. **Token**: every guard (and [`Leadership`]) has `fencing_token()`, `lost()`,
//!    `is_owner()` and `release()`.
//! 5. **Fence**: hand the token to what you protect; a [`Fence`] ([`MemoryFence`], and with
//!    their features `EtcdFence`, `PgFence`) refuses writes with a lower token than it has
//!    seen.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
//! use baton::{Mutex, Session};
//!
//! // "127.0.0.1:2379" (etcd), "redis://127.0.0.1:6379", "zk://127.0.0.1:2181" or
//! // "postgres://baton@127.0.0.1/app", with the backend's feature: one line changes.
//! let backend = baton::connect("memory://").await?;
//! let session = Session::new(backend).await?;
//! let mutex = Mutex::new(&session, "reports/daily")?;
//!
//! let guard = mutex.lock().await?;
//! let token = guard.fencing_token();
//! // Hand `token` to the resource you write to; it rejects lower tokens than it has seen.
//! tokio::select! {
//!     reason = guard.lost() => eprintln!("lock lost ({reason}); stop writing"),
//!     () = async { /* protected work */ } => {}
//! }
//! guard.release().await?;
//! # let _ = token;
//! # Ok(()) }
//! ```
//!
//! Errors are one type, [`Error`]; [`Error::kind`] sorts them (retry, give up, stop: the
//! lock is lost).
//!
//! # Modules
//! - [`backend`]: the [`backend::Backend`] trait and the types it speaks in, for
//!   implementers of a backend and for tests that wrap one.
//! - [`token`]: [`FencingToken`] and its 20-digit text form.
//! - [`fence`]: fences that check tokens (also at the root).
//! - [`inspect`]: what a queue holds (holder, waiters, leases), as `baton status` shows it.
//! - [`metrics`]: the metrics baton records.
//!
//! # Features
//! - `etcd` (not default): [`EtcdBackend`] and [`EtcdFence`], with TLS (rustls); building
//!   etcd-client needs `protoc`. Without any feature, the in-memory backend and every recipe
//!   build with the Rust toolchain alone.
//! - `redis` (not default): [`RedisBackend`], on a single Redis 5.0+ primary.
//! - `zookeeper` (not default): [`ZkBackend`], on ZooKeeper 3.6+, with Curator's or kazoo's
//!   node layout.
//! - `postgres` (not default): [`PgBackend`] on PostgreSQL 13+, and [`PgFence`], a fence whose
//!   check can be part of the application's own transaction (`docs/postgres.md`).
//! - `redlock` (not default): [`redlock::Redlock`] over several independent Redis masters, an
//!   efficiency lock without fencing tokens (`docs/redlock.md`).
//! - `serde`: `Serialize`/`Deserialize` for [`FencingToken`] (a plain integer).
//! - `cli`: the `baton` command-line tool, on etcd, Redis, ZooKeeper and PostgreSQL.
//! - `testing`: the [`testing`] module: `testing::FaultyBackend`, a decorator that injects
//!   faults into any backend's calls; with `etcd`, etcd fixtures (single node and
//!   three-member cluster), with `redis`, Redis fixtures, with `zookeeper`, ZooKeeper
//!   fixtures (`ZkNode`, `ZkEnsemble`), with `postgres`, a PostgreSQL fixture (`PgNode`),
//!   started through testcontainers.
//! - `nemesis`: `testing::nemesis`, baton's robustness suite on real servers (client
//!   processes faulted while a seeded schedule faults the server, one history checked); it
//!   brings `testing` and every backend.
//!
//! On docs.rs every feature's items are shown, each labelled with the feature it needs.
//!
//! Metrics (wait and hold times, handoffs, sessions, keep-alives) go through the `metrics`
//! facade to whatever recorder the application installs: see [`metrics`] and
//! `docs/metrics.md`.
//!
//! See `docs/guarantees.md` for what the lock promises and under which assumptions, and
//! `docs/changelog.md` for names that moved.
// Items of a feature this build lacks link to their page on docs.rs, which has them all
// (link definitions, after a blank line: a definition cannot interrupt a paragraph).
#![doc = ""]
#![cfg_attr(feature = "etcd", doc = "[`EtcdBackend`]: crate::EtcdBackend")]
#![cfg_attr(
    not(feature = "etcd"),
    doc = "[`EtcdBackend`]: https://docs.rs/baton/latest/baton/struct.EtcdBackend.html"
)]
#![cfg_attr(feature = "etcd", doc = "[`EtcdFence`]: crate::EtcdFence")]
#![cfg_attr(
    not(feature = "etcd"),
    doc = "[`EtcdFence`]: https://docs.rs/baton/latest/baton/struct.EtcdFence.html"
)]
#![cfg_attr(feature = "redis", doc = "[`RedisBackend`]: crate::RedisBackend")]
#![cfg_attr(
    not(feature = "redis"),
    doc = "[`RedisBackend`]: https://docs.rs/baton/latest/baton/struct.RedisBackend.html"
)]
#![cfg_attr(feature = "zookeeper", doc = "[`ZkBackend`]: crate::ZkBackend")]
#![cfg_attr(
    not(feature = "zookeeper"),
    doc = "[`ZkBackend`]: https://docs.rs/baton/latest/baton/struct.ZkBackend.html"
)]
#![cfg_attr(feature = "postgres", doc = "[`PgBackend`]: crate::PgBackend")]
#![cfg_attr(
    not(feature = "postgres"),
    doc = "[`PgBackend`]: https://docs.rs/baton/latest/baton/struct.PgBackend.html"
)]
#![cfg_attr(feature = "postgres", doc = "[`PgFence`]: crate::PgFence")]
#![cfg_attr(
    not(feature = "postgres"),
    doc = "[`PgFence`]: https://docs.rs/baton/latest/baton/struct.PgFence.html"
)]
#![cfg_attr(
    feature = "redlock",
    doc = "[`redlock::Redlock`]: crate::redlock::Redlock"
)]
#![cfg_attr(
    not(feature = "redlock"),
    doc = "[`redlock::Redlock`]: https://docs.rs/baton/latest/baton/redlock/struct.Redlock.html"
)]
#![cfg_attr(feature = "testing", doc = "[`testing`]: crate::testing")]
#![cfg_attr(
    not(feature = "testing"),
    doc = "[`testing`]: https://docs.rs/baton/latest/baton/testing/index.html"
)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

pub mod backend;
mod barrier;
mod connect;
mod election;
mod epoch;
mod error;
pub mod fence;
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
pub mod token;

#[doc(inline)]
pub use backend::MemoryBackend;
#[cfg(feature = "etcd")]
#[doc(inline)]
pub use backend::{EtcdBackend, EtcdLayout, EtcdOptions};
#[cfg(feature = "postgres")]
#[doc(inline)]
pub use backend::{PgBackend, PgOptions};
#[cfg(feature = "redis")]
#[doc(inline)]
pub use backend::{RedisBackend, RedisOptions};
#[cfg(feature = "zookeeper")]
#[doc(inline)]
pub use backend::{ZkBackend, ZkLayout, ZkOptions};
pub use barrier::{Barrier, BarrierGuard, DoubleBarrier, DoubleBarrierGuard};
pub use connect::{ConnectOptions, Endpoints, connect, connect_with};
pub use election::{Election, Leader, LeaderEvent, Leadership};
pub use error::{BoxError, Error, ErrorKind, LostReason, Result, Where};
/// The etcd client baton is built on, re-exported so that code using
/// [`EtcdBackend::client`] names the same version.
#[cfg(feature = "etcd")]
pub use etcd_client;
#[cfg(feature = "etcd")]
#[doc(inline)]
pub use fence::EtcdFence;
#[cfg(feature = "postgres")]
#[doc(inline)]
pub use fence::PgFence;
#[doc(inline)]
pub use fence::{Fence, MemoryFence, Ticket};
pub use multilock::{MultiLock, MultiLockGuard};
pub use mutex::{Mutex, MutexGuard};
pub use rwlock::{RwLock, RwLockReadGuard, RwLockWriteGuard};
pub use semaphore::{Semaphore, SemaphorePermit};
pub use session::{IntoBackend, Session, SessionOptions};
#[doc(inline)]
pub use token::FencingToken;
/// The PostgreSQL client baton is built on, re-exported so that code using
/// [`PgFence::claim_in`] names the same `Transaction` type.
#[cfg(feature = "postgres")]
pub use tokio_postgres;

// Where these were before 0.4 (docs/changelog.md): kept for one release, off the root's page.
#[doc(hidden)]
pub use backend::{
    Backend, Enqueued, Entry, HeadEvent, Lease, LeaseId, MemorySnapshot, Position, StoreEpochs,
    WriteOp,
};
#[doc(hidden)]
#[allow(deprecated)]
pub use barrier::Entered;
#[doc(hidden)]
pub use fence::admit;
#[doc(hidden)]
pub use token::{decode_token, encode_token};

/// The README's Rust example, compiled as a doc test: it must build as written.
#[cfg(all(doctest, feature = "etcd"))]
#[doc = include_str!("../README.md")]
struct ReadmeExample;
