//! Choosing a backend from the endpoints a user gives: the scheme decides.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::Backend;
use crate::error::{Error, Result};

/// Where a backend lives, as parsed from an endpoint list by [`Endpoints::parse`]: bare
/// `host:port` or `http(s)://host:port` (comma-separated) is etcd, `redis://` (or
/// `rediss://`) is Redis, `redis+sentinel://` (or `rediss+sentinel://`) is Redis under
/// Sentinel, `zk://` (or `zks://`, over TLS) is ZooKeeper, `postgres://` (or `postgresql://`) is
/// PostgreSQL, `memory://` a new in-process store.
///
/// Its `Debug` leaves credentials out: a URL's `user:password@` shows as `***@`, and a query's
/// `password=`, `sentinel_password=` (any parameter whose name ends in `password`) value as
/// `***`.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Endpoints {
    /// etcd endpoints, `host:port` or `http(s)://host:port`.
    Etcd(Vec<String>),
    /// One Redis URL, `redis://[user:password@]host:port[/db]`, or the Sentinels of one,
    /// `redis+sentinel://[user:password@]host:port[,host:port...]/<service>[/db]`.
    Redis(String),
    /// A ZooKeeper connect string, `zk://[user:password@]host:port[,host:port][/chroot]`, or
    /// `zks://...` for TLS to every server (`user:password@`: SASL DIGEST-MD5).
    ZooKeeper(String),
    /// One PostgreSQL URL, `postgres://[user[:password]@]host[:port][/db][?options]` (or
    /// `postgresql://`), as libpq takes it.
    Postgres(String),
    /// `memory://`: a new in-process store ([`MemoryBackend`](crate::MemoryBackend)), for
    /// examples, demos and tests; each connect makes its own.
    Memory,
}

impl std::fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoints::Etcd(endpoints) => f.debug_tuple("Etcd").field(endpoints).finish(),
            Endpoints::Redis(url) => f.debug_tuple("Redis").field(&redacted(url)).finish(),
            Endpoints::ZooKeeper(connect) => f
                .debug_tuple("ZooKeeper")
                .field(&redacted(connect))
                .finish(),
            Endpoints::Postgres(url) => f.debug_tuple("Postgres").field(&redacted(url)).finish(),
            Endpoints::Memory => f.write_str("Memory"),
        }
    }
}

/// `url` without its credentials: the userinfo before the hosts (`scheme://user:pw@`) as
/// `***@`, and the value of every query parameter whose name ends in `password` as `***`.
pub(crate) fn redacted(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let (scheme, rest) = url.split_at(scheme_end);
    // The hosts end at the first `/` or `?`; a userinfo is what comes before their last `@`.
    let hosts_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let rest = match rest[..hosts_end].rfind('@') {
        Some(at) => format!("***@{}", &rest[at + 1..]),
        None => rest.to_owned(),
    };
    let Some((path, query)) = rest.split_once('?') else {
        return format!("{scheme}{rest}");
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if name.to_ascii_lowercase().ends_with("password") => {
                format!("{name}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    format!("{scheme}{path}?{}", query.join("&"))
}

impl Endpoints {
    /// Parses a comma-separated endpoint list. Nothing is contacted.
    ///
    /// ```
    /// use baton::Endpoints;
    /// assert_eq!(
    ///     Endpoints::parse("127.0.0.1:2379,http://10.0.0.2:2379")?,
    ///     Endpoints::Etcd(vec!["127.0.0.1:2379".into(), "http://10.0.0.2:2379".into()])
    /// );
    /// assert!(matches!(Endpoints::parse("redis://127.0.0.1:6379")?, Endpoints::Redis(_)));
    /// assert!(Endpoints::parse("ftp://host:21").is_err());
    /// # Ok::<(), baton::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty list, an unknown scheme, a known scheme without
    /// its `//` (`redis:/host`), schemes mixed in one list, more than one Redis URL, or an
    /// etcd endpoint without a host or a valid port.
    pub fn parse(spec: &str) -> Result<Endpoints> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err(Error::InvalidArgument("no endpoint given"));
        }
        if spec == "memory://" {
            return Ok(Endpoints::Memory);
        }
        if spec.starts_with("memory:") {
            return Err(Error::InvalidArgument(
                "the in-process store is `memory://`, with nothing after it",
            ));
        }
        if spec.starts_with("zk://") || spec.starts_with("zks://") {
            return Ok(Endpoints::ZooKeeper(spec.to_owned()));
        }
        if spec.starts_with("redis+sentinel://") || spec.starts_with("rediss+sentinel://") {
            // One URL: its Sentinels' list is inside it.
            return Ok(Endpoints::Redis(spec.to_owned()));
        }
        if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
            // One URL: libpq's own multi-host form (`host1:5432,host2:5432`) is inside it.
            return Ok(Endpoints::Postgres(spec.to_owned()));
        }
        let parts: Vec<&str> = spec.split(',').map(str::trim).collect();
        if let Some(typo) = parts.iter().find_map(|p| scheme_typo(p)) {
            return Err(Error::InvalidArgument(typo));
        }
        let redis = |p: &&str| p.starts_with("redis://") || p.starts_with("rediss://");
        if parts.iter().any(redis) {
            return match parts.as_slice() {
                [url] => Ok(Endpoints::Redis((*url).to_owned())),
                _ if parts.iter().all(redis) => Err(Error::InvalidArgument(
                    "give one Redis URL: baton runs on a single Redis primary",
                )),
                _ => Err(Error::InvalidArgument(
                    "endpoints mix redis:// with other schemes",
                )),
            };
        }
        parts.iter().try_for_each(|p| check_etcd(p))?;
        Ok(Endpoints::Etcd(
            parts.into_iter().map(str::to_owned).collect(),
        ))
    }

    /// The backend's name: `etcd`, `Redis`, `ZooKeeper` or `PostgreSQL`.
    pub fn backend_name(&self) -> &'static str {
        match self {
            Endpoints::Etcd(_) => "etcd",
            Endpoints::Redis(_) => "Redis",
            Endpoints::ZooKeeper(_) => "ZooKeeper",
            Endpoints::Postgres(_) => "PostgreSQL",
            Endpoints::Memory => "memory",
        }
    }
}

/// A known scheme written without its `//` (`redis:/host`, `zk:host:2181`): a typo, refused
/// at once rather than taken for an etcd host named `redis` (which fails only when the name
/// is looked up, after the connect timeout). `redis:6379` stays an etcd endpoint: a host
/// named `redis`, with a port.
fn scheme_typo(endpoint: &str) -> Option<&'static str> {
    let (scheme, rest) = endpoint.split_once(':')?;
    if rest.starts_with("//") || (!rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    Some(match scheme.to_ascii_lowercase().as_str() {
        "redis" | "rediss" => {
            "a scheme is followed by `//`: a Redis URL is redis://host:port (rediss:// over TLS), not redis:/host"
        }
        "redis+sentinel" | "rediss+sentinel" => {
            "a scheme is followed by `//`: a Sentinel URL is redis+sentinel://host:port[,host:port...]/<service>"
        }
        "zk" | "zks" => {
            "a scheme is followed by `//`: a ZooKeeper connect string is zk://host:port[,host:port...] (zks:// over TLS), not zk:/host"
        }
        "postgres" | "postgresql" => {
            "a scheme is followed by `//`: a PostgreSQL URL is postgres://[user@]host[:port]/db, not postgres:/host"
        }
        "http" | "https" => {
            "a scheme is followed by `//`: an etcd endpoint is host:port or http(s)://host:port, not http:/host"
        }
        _ => return None,
    })
}

fn check_etcd(endpoint: &str) -> Result<()> {
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .unwrap_or(endpoint);
    if rest.contains("://") {
        return Err(Error::InvalidArgument(
            "unknown scheme: use host:port or http(s):// (etcd), redis://, zk:// or postgres://",
        ));
    }
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err(Error::InvalidArgument("an etcd endpoint is host:port"));
    };
    if host.is_empty() {
        return Err(Error::InvalidArgument("an endpoint has no host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(Error::InvalidArgument(
            "an endpoint's port must be a number in 1..=65535",
        )),
    }
}

/// Options for [`connect_with`], common to every backend.
///
/// TLS (a CA, a client certificate) is for etcd (`https://`), Redis (`rediss://`),
/// ZooKeeper (`zks://`) and PostgreSQL (a URL with `sslmode=verify-full`, `verify-ca` or
/// `require`), as `EtcdOptions`, `RedisOptions`, `ZkOptions` and `PgOptions` take it; a TLS
/// server name is for etcd only.
#[derive(Clone)]
#[must_use]
pub struct ConnectOptions {
    connect_timeout: Duration,
    user: Option<(String, String)>,
    restart_grace: Option<Duration>,
    ca_cert: Option<Vec<u8>>,
    client_cert: Option<(Vec<u8>, Vec<u8>)>,
    tls_server_name: Option<String>,
    request_timeout: Option<Duration>,
    retry_for: Option<Duration>,
    redis_prefix: Option<String>,
    pg_schema: Option<String>,
    zk_session_timeout: Option<Duration>,
    #[cfg(feature = "zookeeper")]
    zk_layout: Option<crate::ZkLayout>,
    #[cfg(feature = "etcd")]
    etcd_layout: Option<crate::EtcdLayout>,
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("connect_timeout", &self.connect_timeout)
            // Never print the password, nor the client's private key.
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("restart_grace", &self.restart_grace)
            .field("ca_cert", &self.ca_cert.is_some())
            .field("client_cert", &self.client_cert.is_some())
            .field("tls_server_name", &self.tls_server_name)
            .field("request_timeout", &self.request_timeout)
            .field("retry_for", &self.retry_for)
            .field("redis_prefix", &self.redis_prefix)
            .field("pg_schema", &self.pg_schema)
            .field("zk_session_timeout", &self.zk_session_timeout)
            .finish_non_exhaustive()
    }
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl ConnectOptions {
    /// Defaults: connect timeout 5 s, no credentials; everything else as each backend's
    /// options default it.
    pub fn new() -> Self {
        ConnectOptions {
            connect_timeout: Duration::from_secs(5),
            user: None,
            restart_grace: None,
            ca_cert: None,
            client_cert: None,
            tls_server_name: None,
            request_timeout: None,
            retry_for: None,
            redis_prefix: None,
            pg_schema: None,
            zk_session_timeout: None,
            #[cfg(feature = "zookeeper")]
            zk_layout: None,
            #[cfg(feature = "etcd")]
            etcd_layout: None,
        }
    }

    /// etcd: where the lock entries live (`EtcdOptions::with_layout`: the Go layout by
    /// default, shared with `etcdctl lock`; or the indexed layout, for queues thousands deep;
    /// docs/etcd.md says which to pick). Refused with other endpoints.
    #[cfg(feature = "etcd")]
    pub fn with_etcd_layout(mut self, layout: crate::EtcdLayout) -> Self {
        self.etcd_layout = Some(layout);
        self
    }

    /// ZooKeeper: whose node names the lock entries take (`ZkOptions::with_layout`: Curator's
    /// by default, or kazoo's), to share locks with applications using that library. Refused
    /// with etcd or Redis endpoints.
    #[cfg(feature = "zookeeper")]
    pub fn with_zk_layout(mut self, layout: crate::ZkLayout) -> Self {
        self.zk_layout = Some(layout);
        self
    }

    /// How long to wait for the server to answer.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The limit for one attempt of one request; waits are not limited by it (every
    /// backend's `with_request_timeout`).
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// How long a request that fails with a transient error is retried, with backoff,
    /// before the error is returned (every backend's `with_retry_for`). Keep it well below
    /// the session TTL.
    pub fn with_retry_for(mut self, duration: Duration) -> Self {
        self.retry_for = Some(duration);
        self
    }

    /// Redis: the prefix of every key baton writes (`RedisOptions::with_prefix`, default
    /// `baton:`). Refused with other endpoints.
    pub fn with_redis_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.redis_prefix = Some(prefix.into());
        self
    }

    /// PostgreSQL: the schema baton's tables live in (`PgOptions::with_schema`, default
    /// `baton`). Refused with other endpoints.
    pub fn with_pg_schema(mut self, schema: impl Into<String>) -> Self {
        self.pg_schema = Some(schema.into());
        self
    }

    /// ZooKeeper: the session timeout of the backend's own connection
    /// (`ZkOptions::with_session_timeout`, default 10 s). Refused with other endpoints.
    pub fn with_zk_session_timeout(mut self, timeout: Duration) -> Self {
        self.zk_session_timeout = Some(timeout);
        self
    }

    /// The options given that only `backend` (`Endpoints::backend_name`) takes, if the
    /// endpoints name another.
    fn check_backend_only(&self, parsed: &Endpoints) -> Result<()> {
        let is = |name: &str| parsed.backend_name() == name;
        if self.redis_prefix.is_some() && !is("Redis") {
            return Err(Error::InvalidArgument(
                "a key prefix is for Redis (redis://) endpoints only",
            ));
        }
        if self.pg_schema.is_some() && !is("PostgreSQL") {
            return Err(Error::InvalidArgument(
                "a schema is for PostgreSQL (postgres://) endpoints only",
            ));
        }
        #[cfg(feature = "zookeeper")]
        let layout = self.zk_layout.is_some();
        #[cfg(not(feature = "zookeeper"))]
        let layout = false;
        #[cfg(feature = "etcd")]
        if self.etcd_layout.is_some() && !is("etcd") {
            return Err(Error::InvalidArgument(
                "an etcd layout is for etcd endpoints only",
            ));
        }
        if (self.zk_session_timeout.is_some() || layout) && !is("ZooKeeper") {
            return Err(Error::InvalidArgument(
                "a node layout and a ZooKeeper session timeout are for ZooKeeper (zk://) endpoints only",
            ));
        }
        Ok(())
    }

    /// The restart grace after the store lost or rolled back its state (a new store epoch:
    /// `EtcdOptions::with_restart_grace`, `RedisOptions::with_restart_grace`,
    /// `ZkOptions::with_restart_grace`, `PgOptions::with_restart_grace`; 60 s, the default
    /// session TTL, when not set). At least the longest session TTL of every client of the
    /// store.
    pub fn with_restart_grace(mut self, grace: Duration) -> Self {
        self.restart_grace = Some(grace);
        self
    }

    /// Credentials: etcd's user and password. (Redis takes them in its URL.)
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }

    /// etcd, Redis or PostgreSQL over TLS: trust the CA certificates in `pem` (PEM) for the
    /// servers' certificates (see `EtcdOptions::with_ca_cert`, `RedisOptions::with_ca_cert`,
    /// `PgOptions::with_ca_cert`).
    pub fn with_ca_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_cert = Some(pem.into());
        self
    }

    /// etcd, Redis or PostgreSQL over TLS: present this client certificate and key (PEM; see
    /// `EtcdOptions::with_client_cert`, `RedisOptions::with_client_cert`,
    /// `PgOptions::with_client_cert`).
    pub fn with_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.client_cert = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// etcd over TLS: check the servers' certificates against `name` (see
    /// `EtcdOptions::with_tls_server_name`). Refused with a Redis URL (Redis checks the
    /// certificate against the URL's host) and a PostgreSQL one (name the host in the URL,
    /// its address as `hostaddr=`).
    pub fn with_tls_server_name(mut self, name: impl Into<String>) -> Self {
        self.tls_server_name = Some(name.into());
        self
    }

    /// The ZooKeeper backend's options these carry.
    #[cfg(feature = "zookeeper")]
    fn zk_options(self) -> crate::ZkOptions {
        let mut zk = crate::ZkOptions::new().with_connect_timeout(self.connect_timeout);
        if let Some(layout) = self.zk_layout {
            zk = zk.with_layout(layout);
        }
        if let Some(grace) = self.restart_grace {
            zk = zk.with_restart_grace(grace);
        }
        if let Some(timeout) = self.request_timeout {
            zk = zk.with_request_timeout(timeout);
        }
        if let Some(retry) = self.retry_for {
            zk = zk.with_retry_for(retry);
        }
        if let Some(timeout) = self.zk_session_timeout {
            zk = zk.with_session_timeout(timeout);
        }
        if let Some(ca) = self.ca_cert {
            zk = zk.with_ca_cert(ca);
        }
        if let Some((cert, key)) = self.client_cert {
            zk = zk.with_client_cert(cert, key);
        }
        zk
    }
}

/// Connects to the backend `endpoints` names (see [`Endpoints::parse`]) with default options.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
/// // "redis://127.0.0.1:6379", "zk://127.0.0.1:2181", "127.0.0.1:2379" (etcd), ...
/// let backend = baton::connect("memory://").await?;
/// let session = baton::Session::new(backend).await?;
/// # let _ = session;
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`connect_with`].
///
/// # Cancel safety
/// Cancel safe: nothing is created on the server before it returns.
pub async fn connect(endpoints: &str) -> Result<Arc<dyn Backend>> {
    connect_with(endpoints, ConnectOptions::new()).await
}

/// Connects to the backend `endpoints` names (see [`Endpoints::parse`]).
///
/// # Errors
/// [`Error::InvalidArgument`] for endpoints that do not parse, or that name a backend this
/// build does not include (each network backend is a cargo feature: `etcd`, `redis`,
/// `zookeeper`), TLS options with a `zk://` string (they need `zks://`), or a TLS server name
/// with a Redis, ZooKeeper or PostgreSQL URL; then
/// the errors of that backend's `connect`.
///
/// # Cancel safety
/// Cancel safe: nothing is created on the server before it returns.
pub async fn connect_with(endpoints: &str, options: ConnectOptions) -> Result<Arc<dyn Backend>> {
    // Without a network backend, the options have nothing to configure.
    #[cfg(not(any(
        feature = "etcd",
        feature = "redis",
        feature = "zookeeper",
        feature = "postgres"
    )))]
    let _ = options;
    let parsed = Endpoints::parse(endpoints)?;
    options.check_backend_only(&parsed)?;
    match parsed {
        Endpoints::Memory => Ok(Arc::new(crate::MemoryBackend::new())),
        #[cfg(feature = "etcd")]
        Endpoints::Etcd(endpoints) => {
            let mut etcd = crate::EtcdOptions::new().with_connect_timeout(options.connect_timeout);
            if let Some((user, password)) = options.user {
                etcd = etcd.with_user(user, password);
            }
            if let Some(ca) = options.ca_cert {
                etcd = etcd.with_ca_cert(ca);
            }
            if let Some((cert, key)) = options.client_cert {
                etcd = etcd.with_client_cert(cert, key);
            }
            if let Some(name) = options.tls_server_name {
                etcd = etcd.with_tls_server_name(name);
            }
            if let Some(grace) = options.restart_grace {
                etcd = etcd.with_restart_grace(grace);
            }
            if let Some(timeout) = options.request_timeout {
                etcd = etcd.with_request_timeout(timeout);
            }
            if let Some(retry) = options.retry_for {
                etcd = etcd.with_retry_for(retry);
            }
            if let Some(layout) = options.etcd_layout {
                etcd = etcd.with_layout(layout);
            }
            Ok(Arc::new(
                crate::EtcdBackend::connect(&endpoints, etcd).await?,
            ))
        }
        #[cfg(not(feature = "etcd"))]
        Endpoints::Etcd(_) => Err(Error::InvalidArgument(
            "etcd endpoints need baton's `etcd` feature, which this build does not have",
        )),
        #[cfg(feature = "redis")]
        Endpoints::Redis(url) => {
            if options.user.is_some() {
                return Err(Error::InvalidArgument(
                    "Redis takes its credentials in the URL: redis://user:password@host:port",
                ));
            }
            if options.tls_server_name.is_some() {
                return Err(Error::InvalidArgument(
                    "a TLS server name is for etcd; Redis checks the certificate against the \
                     URL's host",
                ));
            }
            let mut redis =
                crate::RedisOptions::new().with_connect_timeout(options.connect_timeout);
            if let Some(grace) = options.restart_grace {
                redis = redis.with_restart_grace(grace);
            }
            if let Some(ca) = options.ca_cert {
                redis = redis.with_ca_cert(ca);
            }
            if let Some((cert, key)) = options.client_cert {
                redis = redis.with_client_cert(cert, key);
            }
            if let Some(timeout) = options.request_timeout {
                redis = redis.with_request_timeout(timeout);
            }
            if let Some(retry) = options.retry_for {
                redis = redis.with_retry_for(retry);
            }
            if let Some(prefix) = options.redis_prefix {
                redis = redis.with_prefix(prefix);
            }
            Ok(Arc::new(crate::RedisBackend::connect(&url, redis).await?))
        }
        #[cfg(not(feature = "redis"))]
        Endpoints::Redis(_) => Err(Error::InvalidArgument(
            "redis:// needs baton's `redis` feature, which this build does not have",
        )),
        #[cfg(feature = "zookeeper")]
        Endpoints::ZooKeeper(connect) => {
            if options.user.is_some() {
                return Err(Error::InvalidArgument(
                    "ZooKeeper takes its SASL credentials in the connect string: \
                     zk://user:password@host:port",
                ));
            }
            if options.tls_server_name.is_some() {
                return Err(Error::InvalidArgument(
                    "a TLS server name is for etcd; ZooKeeper checks the certificate against \
                     the connect string's hosts",
                ));
            }
            Ok(Arc::new(
                crate::ZkBackend::connect(&connect, options.zk_options()).await?,
            ))
        }
        #[cfg(not(feature = "zookeeper"))]
        Endpoints::ZooKeeper(_) => Err(Error::InvalidArgument(
            "zk:// needs baton's `zookeeper` feature, which this build does not have",
        )),
        #[cfg(feature = "postgres")]
        Endpoints::Postgres(url) => {
            if options.user.is_some() {
                return Err(Error::InvalidArgument(
                    "PostgreSQL takes its credentials in the URL (postgres://user:password@host/db)",
                ));
            }
            if options.tls_server_name.is_some() {
                return Err(Error::InvalidArgument(
                    "a TLS server name is for etcd; PostgreSQL checks the certificate against \
                     the URL's host (give the name as the host and the address as hostaddr=)",
                ));
            }
            let mut pg = crate::PgOptions::new().with_connect_timeout(options.connect_timeout);
            if let Some(pem) = options.ca_cert {
                pg = pg.with_ca_cert(pem);
            }
            if let Some((cert, key)) = options.client_cert {
                pg = pg.with_client_cert(cert, key);
            }
            if let Some(grace) = options.restart_grace {
                pg = pg.with_restart_grace(grace);
            }
            if let Some(timeout) = options.request_timeout {
                pg = pg.with_request_timeout(timeout);
            }
            if let Some(retry) = options.retry_for {
                pg = pg.with_retry_for(retry);
            }
            if let Some(schema) = options.pg_schema {
                pg = pg.with_schema(schema);
            }
            Ok(Arc::new(crate::PgBackend::connect(&url, pg).await?))
        }
        #[cfg(not(feature = "postgres"))]
        Endpoints::Postgres(_) => Err(Error::InvalidArgument(
            "postgres:// needs baton's `postgres` feature, which this build does not have",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Debug` of parsed endpoints shows no password (before: `Endpoints` derived it, and
    /// `zk://user:pw@...`, `redis://user:pw@...` printed the password).
    #[test]
    fn endpoints_debug_leaves_credentials_out() {
        for (spec, shown) in [
            (
                "zk://baton:s3cret@127.0.0.1:2181/app",
                "zk://***@127.0.0.1:2181/app",
            ),
            (
                "zks://u:s3cret@h1:2281,h2:2281",
                "zks://***@h1:2281,h2:2281",
            ),
            (
                "redis://:s3cret@127.0.0.1:6379/0",
                "redis://***@127.0.0.1:6379/0",
            ),
            (
                "redis+sentinel://h:26379/svc?sentinel_password=s3cret&db=1",
                "redis+sentinel://h:26379/svc?sentinel_password=***&db=1",
            ),
            (
                "postgres://app:s3cret@db/x?password=s3cret&sslmode=require",
                "postgres://***@db/x?password=***&sslmode=require",
            ),
            ("zk://127.0.0.1:2181/a@b", "zk://127.0.0.1:2181/a@b"),
        ] {
            let debug = format!("{:?}", Endpoints::parse(spec).unwrap());
            assert!(!debug.contains("s3cret"), "{spec}: {debug}");
            assert!(debug.contains(shown), "{spec}: {debug}");
        }
    }

    /// An etcd layout is refused with other endpoints, as the other backend-only options are.
    #[cfg(feature = "etcd")]
    #[tokio::test]
    async fn an_etcd_layout_is_for_etcd_only() {
        let refused = connect_with(
            "redis://127.0.0.1:1",
            ConnectOptions::new().with_etcd_layout(crate::EtcdLayout::Indexed),
        )
        .await;
        assert!(
            matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("etcd layout")),
            "{refused:?}"
        );
    }

    /// What `ConnectOptions` carries for ZooKeeper reaches `ZkOptions` (no server needed;
    /// the Redis prefix and the PostgreSQL schema are shown on real servers, in their tests).
    #[cfg(feature = "zookeeper")]
    #[test]
    fn zookeeper_options_are_carried() {
        let zk = ConnectOptions::new()
            .with_zk_session_timeout(Duration::from_secs(7))
            .with_request_timeout(Duration::from_millis(1500))
            .with_retry_for(Duration::from_secs(4))
            .with_restart_grace(Duration::from_secs(9))
            .with_zk_layout(crate::ZkLayout::Kazoo)
            .with_ca_cert("ca")
            .with_client_cert("cert", "key")
            .zk_options();
        let shown = format!("{zk:?}");
        for field in [
            "ca: true",
            "client_cert: true",
            "session_timeout: 7s",
            "request_timeout: 1.5s",
            "retry_for: 4s",
            "restart_grace: 9s",
            "Kazoo",
        ] {
            assert!(shown.contains(field), "{field} in {shown}");
        }
    }

    /// `memory://` is a new in-process store each time, ready for a session; options of
    /// one backend are refused for another before anything is contacted.
    #[tokio::test]
    async fn memory_is_a_scheme_and_options_of_another_backend_are_refused() {
        assert_eq!(Endpoints::parse("memory://").unwrap(), Endpoints::Memory);
        assert!(Endpoints::parse("memory://shared").is_err());
        let a = crate::Session::new(connect("memory://").await.unwrap())
            .await
            .unwrap();
        let b = crate::Session::new(connect("memory://").await.unwrap())
            .await
            .unwrap();
        let held = crate::Mutex::new(&a, "x").unwrap().lock().await.unwrap();
        // Another store: the same name is free there.
        let other = crate::Mutex::new(&b, "x")
            .unwrap()
            .try_lock()
            .await
            .unwrap();
        drop((held, other));
        for (options, says) in [
            (ConnectOptions::new().with_redis_prefix("p:"), "Redis"),
            (ConnectOptions::new().with_pg_schema("s"), "PostgreSQL"),
            (
                ConnectOptions::new().with_zk_session_timeout(Duration::from_secs(5)),
                "ZooKeeper",
            ),
        ] {
            let refused = connect_with("memory://", options).await;
            assert!(
                matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains(says)),
                "{says}: {:?}",
                refused.err()
            );
        }
    }

    /// Nothing is sent: the options are refused before connecting.
    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn tls_options_need_rediss_and_a_server_name_is_for_etcd() {
        let refused = connect_with(
            "redis://127.0.0.1:1",
            ConnectOptions::new().with_ca_cert("-----BEGIN CERTIFICATE-----"),
        )
        .await;
        assert!(
            matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("rediss://")),
            "{:?}",
            refused.err()
        );
        let refused = connect_with(
            "rediss://127.0.0.1:1",
            ConnectOptions::new().with_tls_server_name("redis.internal"),
        )
        .await;
        assert!(
            matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("for etcd")),
            "{:?}",
            refused.err()
        );
    }

    #[test]
    fn schemes_pick_the_backend_and_bad_lists_are_refused() {
        assert_eq!(
            Endpoints::parse("a:1, b:2").unwrap(),
            Endpoints::Etcd(vec!["a:1".into(), "b:2".into()])
        );
        assert_eq!(
            Endpoints::parse("rediss://u:p@h:6380/2").unwrap(),
            Endpoints::Redis("rediss://u:p@h:6380/2".into())
        );
        // A Sentinel URL is one URL, its Sentinels' list inside it.
        assert_eq!(
            Endpoints::parse("redis+sentinel://h1:26379,h2:26379/mymaster/1").unwrap(),
            Endpoints::Redis("redis+sentinel://h1:26379,h2:26379/mymaster/1".into())
        );
        assert_eq!(
            Endpoints::parse("rediss+sentinel://u:p@h1:26379/svc").unwrap(),
            Endpoints::Redis("rediss+sentinel://u:p@h1:26379/svc".into())
        );
        assert_eq!(
            Endpoints::parse("postgresql://u:p@h/db").unwrap(),
            Endpoints::Postgres("postgresql://u:p@h/db".into())
        );
        assert!(matches!(
            Endpoints::parse("postgres://h:5432/db").unwrap(),
            Endpoints::Postgres(_)
        ));
        assert_eq!(
            Endpoints::parse("zk://a:2181,b:2181/app").unwrap(),
            Endpoints::ZooKeeper("zk://a:2181,b:2181/app".into())
        );
        assert_eq!(
            Endpoints::parse("zks://a:2281,b:2281/app").unwrap(),
            Endpoints::ZooKeeper("zks://a:2281,b:2281/app".into())
        );
        for bad in [
            "",
            "redis://a:1,redis://b:1",
            "redis://a:1,b:2",
            "ftp://a:1",
            "a",
            ":1",
            "a:0",
            "a:70000",
        ] {
            assert!(
                matches!(Endpoints::parse(bad), Err(Error::InvalidArgument(_))),
                "{bad:?}"
            );
        }
        // A scheme without its `//` is a typo, named as one (before: an etcd host `redis:/h`,
        // looked up after the connect timeout).
        for (typo, says) in [
            ("redis:/h:6379", "redis://"),
            ("rediss:h:6380", "redis://"),
            ("redis+sentinel:/h:26379/svc", "redis+sentinel://"),
            ("zk:/a:2181", "zk://"),
            ("zks:a:2281", "zks://"),
            ("postgres:/h/db", "postgres://"),
            ("a:1,http:/b:2379", "http(s)://"),
        ] {
            assert!(
                matches!(Endpoints::parse(typo), Err(Error::InvalidArgument(m)) if m.contains(says)),
                "{typo:?}"
            );
        }
        // A host named like a scheme, with a port, is a host.
        assert_eq!(
            Endpoints::parse("redis:2379").unwrap(),
            Endpoints::Etcd(vec!["redis:2379".into()])
        );
    }
}
