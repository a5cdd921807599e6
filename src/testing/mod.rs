//! Test support (feature `testing`): a fault-injecting backend decorator for any backend,
//! and etcd started for your tests (with the `etcd` feature too).
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
//! let session = Session::from_shared(faulty.clone(), Default::default()).await?;
//! // The next create is applied, but its answer is lost.
//! faulty.inject(Call::Enqueue, 1, Fault::FailAfter);
//! assert!(Mutex::new(&session, "jobs/a")?.lock().await.is_err());
//! // The failed call left nothing behind: its cleanup found the key and deleted it.
//! session.settled().await;
//! assert!(faulty.inner().entries("jobs/a").await?.is_empty());
//! # Ok(()) }
//! ```
//!
//! # etcd fixtures
//! [`EtcdNode`] is one etcd member, [`EtcdCluster`] three. By default they run in containers
//! started through testcontainers, with **host networking**, each member listening on free
//! `127.0.0.1` ports; they are ready when etcd logs that it serves client requests and are
//! removed when dropped (or, for [`EtcdNode::shared`], when the test process exits).
//!
//! Environment:
//! - `BATON_ETCD_ENDPOINTS`: comma-separated endpoints of an etcd you run yourself; no
//!   container is started.
//! - `BATON_ETCD_IMAGE`: the image, `name:tag` (default [`DEFAULT_IMAGE`]). Its `etcd`
//!   binary must be on the image's `PATH`.
//! - `BATON_REQUIRE_DOCKER=1`: fail instead of falling back to an `etcd` binary on `PATH`
//!   when no Docker daemon answers. CI sets it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use baton::testing::EtcdNode;
//! let etcd = EtcdNode::start().await?;
//! let backend = etcd.backend().await?;
//! # let _ = backend; Ok(()) }
//! ```

#[cfg(feature = "etcd")]
mod etcd;
mod faults;

#[cfg(feature = "etcd")]
pub use etcd::{DEFAULT_IMAGE, EtcdCluster, EtcdNode, FixtureError, LABEL};
pub use faults::{Call, Fault, FaultyBackend};
