//! From the command line to a backend and a session: what can be checked before anything is
//! sent (endpoints, TLS files, the command to run), connecting, and the session's start and
//! end.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use baton::{Backend, ConnectOptions, Endpoints, Session, SessionOptions};
use tokio::time::Instant;

use crate::args::{Cli, Command, Layout};
use crate::failure::{Failure, exit};
use crate::supervise::{self, Spec};
use crate::wait::before;

/// What [`validate`] found good: the command to supervise, if any, and the TLS files read.
pub(crate) struct Checked {
    pub(crate) spec: Option<Spec>,
    pub(crate) tls: TlsFiles,
}

/// The contents of --cacert, --cert and --key (no `Debug`: the key is a secret).
pub(crate) struct TlsFiles {
    ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

/// Reads the file given with `flag` (the certificates are checked when connecting, before
/// anything is sent).
fn read_tls_file(flag: &str, path: &Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| {
        Failure::new(
            exit::USAGE,
            format!("{flag} {}: cannot read it: {e}", path.display()),
        )
    })
}

/// --cacert, --cert and --key: for etcd, Redis, ZooKeeper or PostgreSQL, cert and key
/// together, the files readable. (PostgreSQL's URL must ask for TLS: the library says so.)
fn tls_files(cli: &Cli, endpoints: &Endpoints) -> Result<TlsFiles, Failure> {
    let any = cli.cacert.is_some() || cli.cert.is_some() || cli.key.is_some();
    if any && matches!(endpoints, Endpoints::ZooKeeper(spec) if !spec.starts_with("zks://")) {
        return Err(Failure::new(
            exit::USAGE,
            "--cacert, --cert and --key need a zks:// connect string (ZooKeeper's \
             secureClientPort); zk:// is plain text",
        ));
    }
    if matches!(endpoints, Endpoints::ZooKeeper(spec) if spec.starts_with("zks://"))
        && cli.cacert.is_none()
    {
        return Err(Failure::new(
            exit::USAGE,
            "zks:// needs --cacert (or BATON_CACERT): the CA that signed the ZooKeeper servers' \
             certificates",
        ));
    }
    if any
        && matches!(endpoints, Endpoints::Redis(url)
            if !url.starts_with("rediss://") && !url.starts_with("rediss+sentinel://"))
    {
        return Err(Failure::new(
            exit::USAGE,
            "--cacert, --cert and --key need a rediss:// (or rediss+sentinel://) URL; redis:// \
             is plain text",
        ));
    }
    let client = match (&cli.cert, &cli.key) {
        (Some(cert), Some(key)) => {
            Some((read_tls_file("--cert", cert)?, read_tls_file("--key", key)?))
        }
        (Some(_), None) => {
            return Err(Failure::new(
                exit::USAGE,
                "--cert needs --key (or BATON_KEY): the certificate's private key",
            ));
        }
        (None, Some(_)) => {
            return Err(Failure::new(
                exit::USAGE,
                "--key needs --cert (or BATON_CERT): the certificate it belongs to",
            ));
        }
        (None, None) => None,
    };
    let ca = match &cli.cacert {
        Some(path) => Some(read_tls_file("--cacert", path)?),
        None => None,
    };
    Ok(TlsFiles { ca, client })
}

/// Checks what can be checked before connecting: nothing is sent for bad input.
pub(crate) fn validate(cli: &Cli) -> Result<Checked, Failure> {
    let endpoints = Endpoints::parse(&cli.endpoints.join(","))
        .map_err(|e| Failure::new(exit::USAGE, format!("--endpoints: {e}")))?;
    if endpoints == Endpoints::Memory {
        return Err(Failure::new(
            exit::USAGE,
            "--endpoints: memory:// is an in-process store; no other process would see its locks",
        ));
    }
    match (cli.layout, &endpoints) {
        (None, _)
        | (Some(Layout::Curator | Layout::Kazoo), Endpoints::ZooKeeper(_))
        | (Some(Layout::Go | Layout::Indexed), Endpoints::Etcd(_)) => {}
        (Some(Layout::Curator | Layout::Kazoo), _) => {
            return Err(Failure::new(
                exit::USAGE,
                "--layout curator and kazoo are for ZooKeeper endpoints (zk://) only",
            ));
        }
        (Some(Layout::Go | Layout::Indexed), _) => {
            return Err(Failure::new(
                exit::USAGE,
                "--layout go and indexed are for etcd endpoints (host:port, http(s)://) only",
            ));
        }
    }
    if cli.user.is_some() && !matches!(endpoints, Endpoints::Etcd(_)) {
        return Err(Failure::new(
            exit::USAGE,
            "--user and --password are for etcd; Redis, ZooKeeper and PostgreSQL take credentials in their URL (redis://user:password@host:port, zk://user:password@host:port, postgres://user:password@host/db)",
        ));
    }
    let tls = tls_files(cli, &endpoints)?;
    match (&cli.user, &cli.password) {
        (Some(_), None) => {
            return Err(Failure::new(
                exit::USAGE,
                "--user needs --password (or BATON_PASSWORD)",
            ));
        }
        (None, Some(_)) => {
            return Err(Failure::new(
                exit::USAGE,
                "--password needs --user (or BATON_USER)",
            ));
        }
        _ => {}
    }
    let (name, command) = match &cli.command {
        Command::Lock { name, command, .. } | Command::Elect { name, command, .. } => {
            (name, command.as_slice())
        }
        Command::Status { name, .. } | Command::Break { name, .. } => (name, &[][..]),
        Command::Ls { .. } | Command::Init { .. } => return Ok(Checked { spec: None, tls }),
    };
    if name.is_empty() {
        return Err(Failure::new(exit::USAGE, "the name must not be empty"));
    }
    let Some((program, args)) = command.split_first() else {
        return Ok(Checked { spec: None, tls });
    };
    supervise::check_runnable(program)?;
    Ok(Checked {
        spec: Some(Spec {
            program: program.clone(),
            args: args.to_vec(),
            env: Vec::new(),
        }),
        tls,
    })
}

pub(crate) async fn connect(
    cli: &Cli,
    tls: TlsFiles,
    deadline: Option<Instant>,
) -> Result<Arc<dyn Backend>, Failure> {
    let endpoints = cli.endpoints.join(",");
    let mut options = ConnectOptions::new()
        .with_connect_timeout(cli.connect_timeout)
        .with_restart_grace(cli.restart_grace);
    if let (Some(user), Some(password)) = (&cli.user, &cli.password) {
        options = options.with_user(user, password);
    }
    if let Some(ca) = tls.ca {
        options = options.with_ca_cert(ca);
    }
    if let Some((cert, key)) = tls.client {
        options = options.with_client_cert(cert, key);
    }
    // `validate` matched the layout with the endpoints' backend.
    options = match cli.layout {
        None => options,
        Some(Layout::Curator) => options.with_zk_layout(baton::ZkLayout::Curator),
        Some(Layout::Kazoo) => options.with_zk_layout(baton::ZkLayout::Kazoo),
        Some(Layout::Go) => options.with_etcd_layout(baton::EtcdLayout::Go),
        Some(Layout::Indexed) => options.with_etcd_layout(baton::EtcdLayout::Indexed),
    };
    let what = match Endpoints::parse(&endpoints) {
        Ok(parsed) => format!("connecting to {}", parsed.backend_name()),
        Err(_) => "connecting".to_owned(),
    };
    // A --timeout that ends while connecting means the server could not be reached in the
    // time given, not that the lock is busy: exit 69, as the connect timeout does.
    before(deadline, exit::UNAVAILABLE, &what, async {
        Ok(baton::connect_with(&endpoints, options).await?)
    })
    .await
}

pub(crate) async fn session(
    backend: Arc<dyn Backend>,
    ttl: Duration,
    deadline: Option<Instant>,
) -> Result<Session, Failure> {
    before(deadline, exit::UNAVAILABLE, "starting a session", async {
        Ok(Session::with_options(backend, SessionOptions::new().with_ttl(ttl)).await?)
    })
    .await
}

/// Ends the session: revokes the lease (so no key of ours outlives this process), within a
/// bound. After a loss nothing is waited for: the server may not answer, and the lease ends
/// on its own.
pub(crate) async fn finish(session: &Session, result: &Result<u8, Failure>) {
    let lost = matches!(result, Err(f) if f.code == exit::LOST) || session.is_lost();
    let bound = if lost {
        Duration::from_millis(200)
    } else {
        Duration::from_secs(2)
    };
    if tokio::time::timeout(bound, session.close()).await.is_err() {
        eprintln!("baton: could not revoke the session in time; its lease ends after its TTL");
    }
}
