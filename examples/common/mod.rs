//! What the scenario examples share: the backend and fence chosen from the command line
//! (memory by default; etcd with `--endpoints a,b,c` when built with `--features etcd`; Redis
//! with `--endpoints redis://host:port` when built with `--features redis`).
#![allow(dead_code)]

pub(crate) mod scenarios;
pub(crate) mod sql_fence;

use std::sync::Arc;

use baton::backend::Backend;
use baton::{Fence, MemoryBackend, MemoryFence};

/// What an example says when asked for etcd without the feature that brings it.
pub(crate) const NO_ETCD: &str = "this example was built without etcd: run it with `cargo run --features etcd --example <name> -- --endpoints ...`";

pub(crate) struct Setup {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) fence: Arc<dyn Fence>,
    /// A prefix unique to this run, for lock names on a shared etcd.
    pub(crate) prefix: String,
    pub(crate) on: &'static str,
}

/// Checks the command line against the options an example takes: `valued` are followed by a
/// value (`--flag value`), `switches` are not. An unknown option, or one without its value, is
/// an error naming what the example takes (so a typo does not run the default); `--help`
/// prints them and exits.
pub(crate) fn check_flags(valued: &[&str], switches: &[&str]) -> Result<(), String> {
    let takes = || {
        let valued = valued.iter().map(|f| format!("{f} VALUE"));
        let all: Vec<String> = valued
            .chain(switches.iter().map(|s| (*s).to_owned()))
            .collect();
        if all.is_empty() {
            "this example takes no options".to_owned()
        } else {
            format!("options: {}", all.join(", "))
        }
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--help" || a == "-h" {
            println!("{}", takes());
            std::process::exit(0);
        }
        if valued.contains(&a.as_str()) {
            if args.next().is_none() {
                return Err(format!("{a} needs a value; {}", takes()));
            }
        } else if !switches.contains(&a.as_str()) {
            return Err(format!("unknown option `{a}`; {}", takes()));
        }
    }
    Ok(())
}

/// The value after `flag` on the command line (`--flag value`), if given.
pub(crate) fn flag_value(flag: &str) -> Option<String> {
    let mut args = std::env::args().skip(1);
    args.find(|a| a == flag)?;
    args.next()
}

impl Setup {
    /// A world for one scenario run, with names of its own.
    pub(crate) fn world(&self, run: &str) -> scenarios::World {
        scenarios::World {
            backend: Arc::clone(&self.backend),
            fence: Arc::clone(&self.fence),
            prefix: format!("{}/{run}", self.prefix),
        }
    }
}

pub(crate) async fn from_args() -> Result<Setup, Box<dyn std::error::Error>> {
    check_flags(&["--endpoints"], &[])?;
    let endpoints = flag_value("--endpoints");
    let prefix = format!("examples/{}", std::process::id());
    Ok(match endpoints {
        None => Setup {
            backend: Arc::new(MemoryBackend::new()),
            fence: Arc::new(MemoryFence::new()),
            prefix,
            on: "the in-memory backend",
        },
        Some(endpoints) => match baton::Endpoints::parse(&endpoints)? {
            baton::Endpoints::Etcd(endpoints) => on_etcd(&endpoints, prefix).await?,
            // The resource's own check, in this process: Redis holds the locks, and the fence
            // stands for the database or service the example protects.
            _ => Setup {
                backend: baton::connect(&endpoints).await?,
                fence: Arc::new(MemoryFence::new()),
                prefix,
                on: "Redis",
            },
        },
    })
}

#[cfg(not(feature = "etcd"))]
async fn on_etcd(_: &[String], _: String) -> Result<Setup, Box<dyn std::error::Error>> {
    Err(NO_ETCD.into())
}

#[cfg(feature = "etcd")]
async fn on_etcd(
    endpoints: &[String],
    prefix: String,
) -> Result<Setup, Box<dyn std::error::Error>> {
    use baton::{EtcdBackend, EtcdFence, EtcdOptions};
    let backend = EtcdBackend::connect(endpoints, EtcdOptions::new()).await?;
    Ok(Setup {
        fence: Arc::new(EtcdFence::new(backend.clone(), format!("{prefix}/fence"))?),
        backend: Arc::new(backend),
        prefix,
        on: "etcd",
    })
}
