//! Test support (feature `testing`): a fault-injecting backend decorator for any backend,
//! and etcd, Redis, ZooKeeper or PostgreSQL started for your tests (with the `etcd`, `redis`,
//! `zookeeper` or `postgres` feature too).
//!
//! # Fault injection
//! [`FaultyBackend`] wraps any [`Backend`](crate::Backend) and makes chosen calls fail before
//! they reach it, fail after it applied them (the answer lost), hang until released, or be
//! delayed, scripted per test and deterministic under paused tokio time. baton's own suite
//! steps every public operation through every backend call it makes with each fault; use it
//! to test how your code behaves when the coordination service misbehaves.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
//! use baton::testing::{Call, Fault, FaultyBackend};
//! use baton::{MemoryBackend, Mutex, Session};
//!
//! let faulty = FaultyBackend::new(MemoryBackend::new());
//! let session = Session::with_options(faulty.clone(), Default::default()).await?;
//! // The next create is applied, but its answer is lost.
//! faulty.inject(Call::Enqueue, 1, Fault::FailAfter);
//! assert!(Mutex::new(&session, "jobs/a")?.lock().await.is_err());
//! // The failed call left nothing behind: its cleanup found the key and deleted it.
//! session.settled().await;
//! assert!(faulty.inner().entries("jobs/a").await?.is_empty());
//! # Ok(()) }
//! ```
//!
//! # A starved driver, a stepped clock
//! [`starve_keep_alive`] stops the keep-alive driver of the current runtime for a while (a
//! starved thread, a frozen process); [`step_wall_clock`] steps the wall clock baton reads for
//! new store epochs' tokens. The deterministic simulation draws both.
//!
//! # A partition proxy
//! [`Proxy`] sits between a client and a server on 127.0.0.1 and can cut the client off
//! (`black_hole`), lose only the server's answers (`drop_answers`) and heal: how baton's own
//! fault tests cut a holder off from etcd or Redis.
//!
//! # A nemesis (feature `nemesis`)
//! `testing::nemesis`, behind a feature of its own (it brings this one and every backend),
//! runs client processes on every recipe while a seeded schedule pauses, kills and cuts them
//! off and restarts or rolls back the server (or, on an etcd cluster or a ZooKeeper ensemble,
//! pauses, kills and restarts a follower or the leader), and checks the one history it
//! records (fencing, token order, loss before the successor's grant, progress, leftovers).
//! It is baton's own robustness suite; `testing` alone is what your tests need.
//!
//! # Test dependencies
//! ```toml
//! [dev-dependencies]
//! baton = { version = "0.4", features = ["testing", "etcd"] }   # or "redis", "zookeeper"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "time"] }
//! ```
//!
//! # How fixtures find their server
//! Every fixture below runs its server in a container started through testcontainers, with
//! **host networking**, listening on a free `127.0.0.1` port, and removed when dropped. The
//! rules are the same for each server:
//! - **The image is found or built.** The default image (`local/etcd:debian`,
//!   `local/redis:debian`, `local/zookeeper:debian`) needs no registry: when Docker answers and the image is missing,
//!   the first fixture of the process builds it from Debian's package with the script the
//!   crate embeds (`scripts/build-<server>-image.sh`: the package's binaries and the shared
//!   libraries they load, `docker import`ed; it installs the package with `apt-get` if it is
//!   missing, which needs root), and says so on standard error. A variable naming another
//!   image (`BATON_ETCD_IMAGE`, `BATON_REDIS_IMAGE`, `BATON_ZOOKEEPER_IMAGE`) is used as it
//!   is.
//! - **No silent fallback.** When no container starts (no Docker daemon), the fixture fails
//!   with Docker's error, in a [`FixtureError`] whose message (`Display` and `Debug` alike:
//!   `?` in a test shows it) is one paragraph that names Docker's answer and the way out:
//!   start Docker, or set `BATON_LOCAL_FALLBACK=1` and what that runs. Only with [`LOCAL_FALLBACK_VAR`] (`BATON_LOCAL_FALLBACK=1`) does it
//!   run the server binary from `PATH` instead, and it says so on standard error (not only
//!   through `tracing`: a test has no subscriber); if that fails too, the error
//!   ([`FixtureError::Unavailable`]) carries both causes. `BATON_REQUIRE_DOCKER=1` (CI)
//!   forbids the fallback whatever else is set.
//! - **Nothing outlives the test process.** Each container carries the [`LABEL`]
//!   `baton.fixture=<pid of the test process>`, and a watchdog process (one per test process,
//!   tied to it by a pipe) removes that process's containers when it exits, killed or not; a
//!   local server process is killed by its PID the same way. Other test processes' fixtures
//!   are never touched.
//!
//! # etcd fixtures
//! [`EtcdNode`] is one etcd member, [`EtcdCluster`] three; a node is ready when etcd logs that
//! it serves client requests, a cluster member started again once it is healthy
//! ([`EtcdCluster::wait_healthy`]).
//!
//! Environment:
//! - `BATON_ETCD_ENDPOINTS`: comma-separated endpoints of an etcd you run yourself; no
//!   container is started.
//! - `BATON_ETCD_IMAGE`: the image, `name:tag` (default [`DEFAULT_IMAGE`]). Its `etcd`
//!   binary must be on the image's `PATH`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use baton::testing::EtcdNode;
//! let etcd = EtcdNode::start().await?;
//! let backend = etcd.backend().await?;
//! # let _ = backend; Ok(()) }
//! ```
//!
//! An etcd that serves TLS: [`EtcdNode::start_tls`] with the certificates of an [`EtcdTls`]
//! (or [`EtcdNode::shared_tls`]). [`EtcdTls::generate`] makes them at test time: a CA
//! ([`TestCa`]), a server certificate for `127.0.0.1` and `localhost`, a client certificate;
//! the CA issues more, e.g. an expired client certificate, and a second `TestCa` is one the
//! server does not trust.
//!
//! # Redis fixtures
//! [`RedisNode`] is one `redis-server`, [`RedisNodes`] several independent ones (for
//! algorithms that lock on a majority of servers), each on a free `127.0.0.1` port
//! (`redis://127.0.0.1:<port>`), with persistence off; they are ready when Redis logs that it
//! accepts connections. For fault tests a node can be stopped and started again on the same
//! port ([`RedisNode::restart`]; its data is lost) and, in a container, paused
//! ([`RedisNode::pause`]). A primary with a replica: [`RedisNode::start_replica`] (returns
//! once it is in sync), then [`RedisNode::detach`] (it misses writes from then on) and
//! [`RedisNode::promote`] (a failover). [`RedisNode::start_tls`] starts a server that serves
//! TLS only (`rediss://127.0.0.1:<port>`) with the certificates of a [`RedisTls`] (made at test
//! time by [`RedisTls::generate`]), requiring client certificates or not.
//!
//! Environment:
//! - `BATON_REDIS_URL`: the URL of a Redis you run yourself; [`RedisNode`] starts no server
//!   and cannot stop, restart or pause it. [`RedisNodes`] ignores it.
//! - `BATON_REDIS_IMAGE`: the image, `name:tag` (default [`DEFAULT_REDIS_IMAGE`], which
//!   `scripts/build-redis-image.sh` builds from Debian's `redis-server`). Its `redis-server`
//!   binary must be on the image's `PATH`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use baton::testing::RedisNode;
//! let redis = RedisNode::start().await?;
//! let url = redis.url(); // redis://127.0.0.1:<port>
//! redis.restart().await?; // the same port, no data
//! # let _ = url; Ok(()) }
//! ```
//!
//! # PostgreSQL fixtures
//! [`PgNode`] (features `testing` and `postgres`) is one PostgreSQL server in a container from
//! [`DEFAULT_POSTGRES_IMAGE`] (`local/postgres:debian`, which
//! `scripts/build-postgres-image.sh` builds from Debian's `postgresql` package, found or built
//! as above; `BATON_POSTGRES_IMAGE` names another), with host networking on a free
//! `127.0.0.1` port: user `postgres`, trust authentication, database `postgres`
//! ([`PgNode::url`]). Its data lives in the container, so [`PgNode::stop_fast`] (a fast
//! shutdown) and [`PgNode::stop_immediate`] (an immediate shutdown: the WAL is replayed at the
//! next start, as after a crash) keep it for [`PgNode::start_again`]; [`PgNode::pause`]
//! freezes it; [`PgNode::terminate`] ends the connections of one `application_name` with
//! `pg_terminate_backend`. There is no local-process fallback.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use baton::testing::PgNode;
//! let pg = PgNode::start().await?;
//! let backend = pg.backend().await?;
//! pg.stop_immediate().await?; // a crash of the server
//! pg.start_again().await?;    // the same port, the same data
//! # let _ = backend; Ok(()) }
//! ```
//!
//! # ZooKeeper fixtures
//! [`ZkNode`] is one ZooKeeper server (standalone), [`ZkEnsemble`] three members with a
//! quorum. They run in containers with **host networking**, each server's client port (and a
//! member's quorum and election ports) on free `127.0.0.1` ports; clients connect to
//! [`ZkNode::connect_string`] (`127.0.0.1:<port>`; [`ZkEnsemble::connect_string`] lists the
//! three members, comma-separated) or to the `url()` (`zk://` and the same), or take
//! [`ZkNode::backend`], as with the etcd and Redis nodes. A server is ready
//! when it *serves*: `ruok` answers `imok` and `srvr` reports a mode (`standalone`, or
//! `leader`/`follower` once the ensemble has elected a leader).
//!
//! Every server gets, in zoo.cfg: `clientPortAddress=127.0.0.1`, `tickTime=200` (with
//! `initLimit=25` and `syncLimit=10`: 5 s to join a leader, 2 s of silence before a member is
//! dropped), `minSessionTimeout=1000`, `maxSessionTimeout=60000` (a client gets the session
//! timeout it asks for between those), `maxClientCnxns=0` (all clients come from 127.0.0.1),
//! `forceSync=no`, `admin.enableServer=false` and every four-letter word allowed;
//! [`ZkNode::start_with`] adds lines that override them. [`ZkNode::start_tls`] starts a server
//! with a TLS client port only (`secureClientPort`; `zks://127.0.0.1:<port>`) with the
//! certificates of a [`ZkTls`] (made at test time by [`ZkTls::generate`]), requiring client
//! certificates or not (in a container only); [`ZkNode::start_sasl`] one that authenticates
//! clients with SASL DIGEST-MD5 (the users of a [`ZkSasl`], in a JAAS file; unauthenticated
//! clients refused, or not), [`ZkNode::start_tls_sasl`] both. For fault tests a server can be
//! stopped and started again on the same port ([`ZkNode::restart`]): unlike Redis it keeps its
//! data, so znodes and unexpired sessions survive, as they do when a real server crashes. In a
//! container it can be paused ([`ZkNode::pause`]). An ensemble's members are stopped, started
//! and paused by index ([`ZkEnsemble::stop_member`]); [`ZkEnsemble::leader`] says which one
//! leads and [`ZkEnsemble::wait_for_leader`] waits for an election. [`four_letter`] sends any
//! four-letter word, e.g. `mntr` for `zk_watch_count` and the other metrics.
//!
//! Environment:
//! - `BATON_ZOOKEEPER_CONNECT`: the connect string of a ZooKeeper you run yourself;
//!   [`ZkNode`] starts no server and cannot stop, restart or pause it. [`ZkEnsemble`] ignores
//!   it.
//! - `BATON_ZOOKEEPER_IMAGE`: the image, `name:tag` (default [`DEFAULT_ZOOKEEPER_IMAGE`],
//!   which `scripts/build-zookeeper-image.sh` builds from Debian's `zookeeper`). Its
//!   `zookeeper-entrypoint` must be on the image's `PATH` and take zoo.cfg lines (`key=value`,
//!   and `myid=N`) as arguments, as that script's does.
//! - The local fallback (only with `BATON_LOCAL_FALLBACK=1`) runs `java` from `PATH` on
//!   Debian's ZooKeeper jars (`/usr/share/java/zookeeper.jar`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use baton::testing::{ZkEnsemble, four_letter};
//! let zk = ZkEnsemble::start().await?;
//! let leader = zk.wait_for_leader().await?;
//! zk.stop_member(leader).await?;
//! let next = zk.wait_for_leader().await?; // another member
//! let mntr = four_letter(zk.member(next).port(), "mntr").await?;
//! # let _ = (mntr, zk.connect_string()); Ok(()) }
//! ```

#[cfg(feature = "etcd")]
mod etcd;
mod faults;
#[cfg(any(
    feature = "etcd",
    feature = "redis",
    feature = "zookeeper",
    feature = "postgres"
))]
mod fixture;
pub(crate) mod hooks;
#[cfg(feature = "nemesis")]
pub mod nemesis;
#[cfg(feature = "postgres")]
mod postgres;
mod proxy;
#[cfg(feature = "redis")]
mod redis;
#[cfg(any(
    feature = "etcd",
    feature = "redis",
    feature = "postgres",
    feature = "zookeeper"
))]
mod tls;
#[cfg(feature = "zookeeper")]
mod zookeeper;

#[cfg(feature = "etcd")]
pub use etcd::{DEFAULT_IMAGE, EtcdCluster, EtcdNode, EtcdTls};
pub use faults::{Call, Fault, FaultyBackend};
#[cfg(any(
    feature = "etcd",
    feature = "redis",
    feature = "zookeeper",
    feature = "postgres"
))]
pub use fixture::{FixtureError, LABEL, LOCAL_FALLBACK_VAR};
#[cfg(feature = "etcd")]
pub use hooks::{IndexedPage, ValueWatchEnd, on_indexed_page, on_value_watch_end};
pub use hooks::{reset_wall_clock, starve_keep_alive, step_wall_clock};
#[cfg(feature = "postgres")]
pub use postgres::{DEFAULT_POSTGRES_IMAGE, PgNode};
pub use proxy::Proxy;
#[cfg(feature = "redis")]
pub use redis::{
    DEFAULT_REDIS_IMAGE, RedisNode, RedisNodes, RedisSentinel, RedisTls, SENTINEL_DOWN_AFTER,
    SENTINEL_FAILOVER_TIMEOUT, SentinelSwitches,
};
#[cfg(any(
    feature = "etcd",
    feature = "redis",
    feature = "postgres",
    feature = "zookeeper"
))]
pub use tls::{CertPem, ServerTls, TestCa};
#[cfg(feature = "zookeeper")]
pub use zookeeper::{DEFAULT_ZOOKEEPER_IMAGE, ZkEnsemble, ZkNode, ZkSasl, ZkTls, four_letter};
