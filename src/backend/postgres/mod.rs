//! The PostgreSQL backend (feature `postgres`): baton's queues in tables of its own schema,
//! every state change one call of a PL/pgSQL function, waits woken by LISTEN/NOTIFY.
//! docs/postgres.md says what it promises and what it needs from the server.

mod burst;
pub(crate) mod conn;
mod epoch;
mod listener;
mod observe;
pub(crate) mod schema;
mod tls;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use md5::{Digest, Md5};
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Connection, Row, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use self::conn::Conn;
use self::epoch::EpochAnswer;
use self::listener::{Heard, Listener};
use super::{Backend, Enqueued, Entry, FencingToken, HeadEvent, Lease, LeaseId, Position, WriteOp};
use crate::epoch::StoreEpochs;
use crate::error::{BoxError, Error, LostReason, Result, Where};
use crate::retry::Retry;

/// The oldest PostgreSQL baton runs on: 13.
const MINIMUM_VERSION: i32 = 130_000;

/// The longest entry key (`<lock name>/<tag>`, in bytes) baton sends: the primary key's
/// B-tree takes index rows of at most 2704 bytes (a third of a page), less when a key does not
/// compress; a longer one is refused before it is sent.
const MAX_KEY_BYTES: usize = 2_000;

/// The isolation every transaction of baton's runs at, whatever the role's or the database's
/// default: its functions were written for READ COMMITTED (a statement's snapshot taken
/// before a lock wait would not see the entry committed by the holder of that lock: under
/// REPEATABLE READ, enqueues that queued behind one another were all granted). Sent on every
/// connection baton opens, as a `SET` (a pooler refuses startup options), which a session-
/// mode pooler resets for the next client.
pub(super) const ISOLATION: &str = "SET default_transaction_isolation = 'read committed'; ";

/// How many times an enqueue refused because another call of its lease gave up (which
/// fences off every stamp handed out until then) is sent again with a new stamp.
const ABANDONED_RETRIES: usize = 8;

/// Options for [`PgBackend::connect`].
///
/// ```
/// # use std::time::Duration;
/// let options = baton::PgOptions::new()
///     .with_schema("billing_locks")
///     .with_request_timeout(Duration::from_secs(2));
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct PgOptions {
    connect_timeout: Duration,
    request_timeout: Duration,
    retry_for: Duration,
    schema: String,
    restart_grace: Duration,
    tls: tls::TlsFiles,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl PgOptions {
    /// Defaults: connect timeout 5 s, request timeout 5 s, retries for up to 10 s, schema
    /// `baton`, restart grace 60 s (the default session TTL).
    pub fn new() -> Self {
        PgOptions {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            retry_for: Duration::from_secs(10),
            schema: "baton".to_owned(),
            restart_grace: crate::SessionOptions::DEFAULT_TTL,
            tls: tls::TlsFiles::default(),
        }
    }

    /// Trusts the CA certificates in `pem` (one or more, PEM-encoded: libpq's `sslrootcert`
    /// file) for the server's certificate, instead of the system's roots. Needs TLS: the
    /// URL's `sslmode` is `verify-full`, `verify-ca` or `require`; with any other, and with
    /// `sslrootcert` in the URL too, the connect is refused ([`Error::InvalidArgument`]).
    ///
    /// Checked at connect: a bundle with no certificate, or one that does not parse, is
    /// [`Error::InvalidArgument`].
    pub fn with_ca_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(pem.into());
        self
    }

    /// Presents the client certificate `cert_pem` (a PEM certificate, or a chain with the
    /// client's certificate first) with its private key `key_pem` (PEM, PKCS#8, PKCS#1 or
    /// SEC1; not encrypted), for a server whose `pg_hba.conf` asks for one (`clientcert=` or
    /// `cert` authentication): libpq's `sslcert` and `sslkey`. Needs TLS, as
    /// [`with_ca_cert`](Self::with_ca_cert).
    ///
    /// Checked at connect: a certificate or key that does not parse, or a key that is not the
    /// certificate's, is [`Error::InvalidArgument`].
    pub fn with_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// The schema baton keeps its tables, sequences and functions in (default `baton`),
    /// created on connect if missing. Clients that share locks must use the same schema. A
    /// plain lowercase identifier (`[a-z_][a-z0-9_]*`, at most 40 characters); anything
    /// else is refused at connect with [`Error::InvalidArgument`]. A URL's `baton_schema=NAME`
    /// overrides it (the CLI's way to choose one).
    ///
    /// A schema of that name that exists and holds someone else's tables, sequences or
    /// functions (and no `schema_version` of baton's) is refused at connect with
    /// [`Error::ForeignSchema`]: nothing is created in it. An empty one is used.
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// How long [`PgBackend::connect`] (and every reconnect) waits for the server to answer.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The limit for one attempt of one request. Waits are not limited by it.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How long a request that fails with a transient error (connection lost, server
    /// restarting, a deadlock detected) is retried, with backoff, before the error is
    /// returned. Keep it well below your session TTL.
    pub fn with_retry_for(mut self, duration: Duration) -> Self {
        self.retry_for = duration;
        self
    }

    /// How long nothing is granted after a new store epoch began (default 60 s, the default
    /// session TTL): after a standby's promotion or a recovery to a point in time (a new WAL
    /// timeline), after a client saw the server go back (restored from an earlier base
    /// backup, a standby that missed commits), and at the first use of a schema created
    /// anew (unless an operator marked it new: [`PgBackend::init_store`]).
    ///
    /// Such a server may lack its last grants (the lock looks free) and renewals (a lease
    /// looks older than it is), while their holders still believe they hold until their
    /// sessions are told lost, up to a session TTL later. So nothing is granted until the
    /// grace has passed since the epoch began (on the server's clock); set it to at least the
    /// longest session TTL of every client of this database. A shorter grace lets a new
    /// holder overlap an old one (a fence still refuses the old holder's writes: tokens of a
    /// new epoch are above every earlier token). Each wait is logged once (`warn`).
    ///
    /// `Duration::ZERO` turns the wait off.
    ///
    /// ## Warning
    /// The grace protects holders from before only: sessions granted before a new epoch are
    /// told at once by every client that sees it ([`LostReason::StoreReset`]).
    pub fn with_restart_grace(mut self, grace: Duration) -> Self {
        self.restart_grace = grace;
        self
    }
}

/// Where the server is and how to reach it: shared by the request connection and the LISTEN
/// connection.
#[derive(Debug)]
struct Target {
    config: tokio_postgres::Config,
    /// `PostgreSQL at postgres://host:port/db`, without credentials.
    endpoint: String,
    connect_timeout: Duration,
    /// The URL without its password, for errors that list endpoints.
    url: String,
    /// Whether request connections set `synchronous_commit = on` (the URL's `options` did
    /// not name it).
    synchronous_commit: bool,
    /// Plain text, or TLS and how the server's certificate is checked.
    tls: tls::Setup,
}

/// A connection's stream: plain, or TLS (tokio-postgres-rustls does not name its type).
type Stream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;

async fn connect_client(
    target: &Target,
) -> std::result::Result<(Client, Connection<Socket, Stream>), tokio_postgres::Error> {
    target.config.connect(target.tls.connector.clone()).await
}

/// Why a request connection could not be opened.
enum OpenFailure {
    /// The driver's error: connecting, or the first statements.
    Pg(tokio_postgres::Error),
    /// Reached, and refused for good (a role or database whose transactions are read-only
    /// by default).
    Refused(Error),
}

/// The role or database defaults a request connection is checked for, and the server's
/// identity, in the round trip that sets the session up.
const SESSION_CHECK: &str = "SELECT (SELECT system_identifier FROM pg_control_system())::text, \
     pg_is_in_recovery()::text, current_setting('default_transaction_read_only'), \
     (SELECT source FROM pg_settings WHERE name = 'default_transaction_read_only')";

/// A request connection: connected, driven on the current runtime, committing
/// synchronously, at READ COMMITTED ([`ISOLATION`]), and checked not to be read-only by a
/// role's or database's default.
///
/// A grant, a release and a lease are facts others act on once committed, so a commit must
/// survive a crash of the server: with `synchronous_commit = off` (a server may default to it
/// for speed) an immediate shutdown loses the last ~0.6 s of acknowledged commits, a released
/// entry comes back, and its token is granted a second time (the nemesis showed it). `on`
/// also waits for synchronous standbys. Set per session, for baton's own connections only,
/// unless the URL's `options` say otherwise; with `SET` rather than in the startup options,
/// which a pooler (PgBouncer) refuses or drops.
///
/// `default_transaction_read_only = on` as a role's or a database's default (`pg_settings.source`
/// `user`, `database`, `database user`, or the URL's own options: `client`) on a server that
/// is not in recovery is a configuration baton cannot work with: refused at once
/// ([`Error::Misconfigured`]). The same setting from the server's configuration is an
/// operator's fence of a primary (docs/postgres.md): it is not overridden, and a write it
/// refuses is retried as on a standby.
async fn open_request_connection(target: &Target) -> std::result::Result<Conn, OpenFailure> {
    let (client, connection) = connect_client(target).await.map_err(OpenFailure::Pg)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut sql = String::new();
    if target.synchronous_commit {
        sql.push_str("SET synchronous_commit = on; ");
    }
    sql.push_str(ISOLATION);
    sql.push_str(SESSION_CHECK);
    let messages = client.simple_query(&sql).await.map_err(OpenFailure::Pg)?;
    let row = messages.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    });
    let value = |i: usize| row.and_then(|r| r.get(i)).unwrap_or_default();
    let system_id = value(0).parse().unwrap_or(0);
    let (in_recovery, read_only, source) = (value(1) == "true", value(2) == "on", value(3));
    if read_only
        && !in_recovery
        && matches!(source, "user" | "database" | "database user" | "client")
    {
        let whose = match source {
            "user" => "the role's",
            "database" => "the database's",
            "database user" => "the role's in this database",
            _ => "the URL's `options`'",
        };
        return Err(OpenFailure::Refused(Error::Misconfigured {
            endpoints: vec![target.url.clone()],
            source: format!(
                "default_transaction_read_only is on as {whose} default (pg_settings.source \
                 `{source}`): every transaction of this role is read-only, and baton writes. \
                 Connect as a role that may write, or ALTER ROLE ... SET \
                 default_transaction_read_only = off (or RESET it)"
            )
            .into(),
        }));
    }
    Ok(Conn::new(client, system_id))
}

/// The SQL of every request, rendered for one schema.
#[derive(Debug)]
struct Sql {
    schema: String,
    grant: String,
    renew: String,
    revoke: String,
    lease_ttl: String,
    enqueue: String,
    enqueue_burst: String,
    find: String,
    abandon: String,
    ahead: String,
    alive: String,
    head: String,
    entries: String,
    delete: String,
    update: String,
    guarded: String,
    read: String,
    swap: String,
    snapshot: String,
    reap: String,
    epoch_state: String,
    begin_epoch: String,
}

impl Sql {
    fn new(s: &str) -> Sql {
        let r = |sql: &str| schema::render(sql, s);
        let live = "JOIN {s}.leases l ON l.id = e.lease AND l.deadline > clock_timestamp()";
        let range = r#"e.key >= $1 COLLATE "C" AND e.key < $2 COLLATE "C""#;
        Sql {
            schema: s.to_owned(),
            // With the store's epoch and position: a session registers in the epoch its
            // lease was granted in, and a renewal confirms it (epoch.rs).
            grant: r("SELECT * FROM {s}.grant_lease_v8($1)"),
            renew: r("SELECT * FROM {s}.renew_v8($1)"),
            revoke: r("DELETE FROM {s}.leases WHERE id = $1"),
            lease_ttl: r("SELECT {s}.ms_left(deadline) FROM {s}.leases \
                 WHERE id = $1 AND deadline > clock_timestamp()"),
            // With the store's epoch and position: the grant decision and the epoch it was
            // made in, read in one call.
            enqueue: r("SELECT * FROM {s}.enqueue_v8($1, $2, $3, $4, $5)"),
            // Enqueues that arrived while one was in flight, in one transaction (burst.rs).
            enqueue_burst: r("SELECT * FROM {s}.enqueue_burst_v10($1, $2, $3, $4, $5)"),
            find: r(&format!(
                "SELECT e.key::text, e.token, e.lease, e.value FROM {{s}}.entries e {live} \
                 WHERE e.key = $1"
            )),
            abandon: r("SELECT * FROM {s}.abandon($1, $2, $3)"),
            // Through the (parent, token) index (schema version 9): the same answer at any
            // queue length, whatever the planner's statistics.
            ahead: r("SELECT * FROM {s}.ahead_v9($1, $2, $3, $4)"),
            alive: r("SELECT {s}.alive($1, $2)"),
            // The head's token computed once (a volatile function in WHERE would be called
            // for every row), then its row through the token's index.
            head: r("SELECT e.key::text, e.token, e.lease, e.value \
                 FROM (SELECT {s}.head_token($1) AS t) h JOIN {s}.entries e ON e.token = h.t"),
            entries: r(&format!(
                "SELECT e.key::text, e.token, e.lease, e.value FROM {{s}}.entries e {live} \
                 WHERE {range} ORDER BY e.token"
            )),
            delete: r(
                "DELETE FROM {s}.entries e USING {s}.leases l WHERE e.key = $1 AND e.token = $2 \
                 AND l.id = e.lease AND l.deadline > clock_timestamp()",
            ),
            update: r(
                "UPDATE {s}.entries e SET value = $3 FROM {s}.leases l WHERE e.key = $1 \
                 AND e.token = $2 AND l.id = e.lease AND l.deadline > clock_timestamp()",
            ),
            guarded: r("SELECT {s}.guarded($1, $2, $3, $4, $5)"),
            read: r("SELECT value FROM {s}.kv WHERE key = $1"),
            swap: r("SELECT {s}.swap($1, $2, $3)"),
            snapshot: r("SELECT * FROM {s}.snapshot($1, $2)"),
            reap: r("SELECT * FROM {s}.reap($1, $2)"),
            epoch_state: r("SELECT * FROM {s}.epoch_state()"),
            begin_epoch: r("SELECT * FROM {s}.begin_epoch($1, $2, $3)"),
        }
    }

    /// The NOTIFY channel of an entry (`e`), a queue (`q`) or a plain key (`k`), as the
    /// schema's `chan` function names it.
    fn channel(&self, kind: char, name: &str) -> String {
        let mut md5 = Md5::new();
        md5.update(self.schema.as_bytes());
        md5.update(b"|");
        md5.update(name.as_bytes());
        let mut channel = format!("b{kind}");
        for byte in md5.finalize() {
            channel.push_str(&format!("{byte:02x}"));
        }
        channel
    }
}

#[derive(Debug)]
struct Inner {
    target: Arc<Target>,
    client: tokio::sync::Mutex<Option<Arc<Conn>>>,
    listener: Listener,
    sql: Sql,
    request_timeout: Duration,
    retry_for: Duration,
    /// Stamps for enqueue and abandon (see `abandon`).
    stamps: AtomicI64,
    /// Enqueues waiting to be sent together (burst.rs).
    bursts: burst::Bursts,
    /// What this client remembers of the store's epochs (the core's rules: a new one ends
    /// every session from before, and holds grants back for its grace). See `epoch.rs`.
    epochs: StoreEpochs,
    /// The highest token this client has seen: a new epoch's tokens start above it.
    top_token: AtomicU64,
    /// When the postmaster of the latest answer started (µs; 0: none yet): a deletion's
    /// notice from another is not taken at its word.
    postmaster: AtomicI64,
}

/// The PostgreSQL backend: baton's queues in a schema of its own (`baton` by default) on
/// PostgreSQL 13 or newer.
///
/// Layout (docs/postgres.md): a lease is a row with a deadline on the **server's** clock
/// (`clock_timestamp()`), renewed by its session; an entry is a row (key, token, lease,
/// value) bound to its lease (deleted with it), whose token is the server's WAL timeline above
/// a sequence's next value, drawn while the transaction holds an advisory lock on every queue
/// the entry is in, so that tokens of a queue are committed in token order, and a promoted
/// standby (a new timeline) hands out tokens above every token of the old primary; the queue
/// is ordered by token. Every state change is
/// one call of a PL/pgSQL function: one statement, one transaction, retried by the backend on
/// transient failures. An expired lease is ended by whoever meets it (an enqueue into its
/// queue, a waiter of one of its entries, a grant), in the transaction that acts on it: no
/// reaper.
///
/// **Waits wake exactly their waiters.** Each backend keeps one connection that LISTENs on
/// the channels its waits need: a waiter for an entry listens on that entry's channel, and
/// the trigger that sees the entry deleted (release, revoke, expiry, in the same transaction)
/// NOTIFYs it. After a reconnect of that connection every wait looks again. A wait also looks
/// again when the awaited entry's lease could expire, to end it if it did.
///
/// A process uses two connections per backend: one pipelined connection for requests, one
/// for LISTEN; more backends, more connections. Their tasks run on the runtime that uses
/// them: a backend connected on a runtime that is later shut down connects (and LISTENs)
/// again on the runtime that uses it next.
///
/// **When the server forgets** (a failover or a recovery to a point in time: a new WAL
/// timeline; restored from an earlier base backup, or a standby that missed commits, seen by
/// a client whose earlier answers it is now behind; a schema created anew) a new store epoch
/// begins: every session from before is told at once ([`LostReason::StoreReset`]), nothing is
/// granted until the restart grace has passed ([`PgOptions::with_restart_grace`]), and lease
/// ids, keys and tokens never repeat (docs/postgres.md, "When the server forgets"). A new
/// database is marked as baton's with [`init_store`](PgBackend::init_store), so that its first
/// use waits no grace.
///
/// Behind a pooler: a session-mode pool works; a transaction-mode pool is refused at connect
/// (`Error::Misconfigured`), because LISTEN needs a session (docs/postgres.md).
#[derive(Debug, Clone)]
pub struct PgBackend {
    inner: Arc<Inner>,
}

/// What went wrong in one attempt.
enum Failure {
    /// Not applied; worth retrying.
    Transient(BoxError),
    /// May have been applied; worth retrying.
    Unknown(BoxError),
    /// Not applied; retrying cannot help.
    Fatal(Error),
}

fn classify(op: &'static str, e: tokio_postgres::Error) -> Failure {
    let Some(db) = e.as_db_error() else {
        // The connection broke (or was closed) while the request was in flight.
        return Failure::Unknown(e.into());
    };
    let code = db.code();
    if *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::T_R_DEADLOCK_DETECTED
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
        || *code == SqlState::LOCK_NOT_AVAILABLE
        || code.code().starts_with("08")
        // A standby (a reconnect reached one before its promotion, or a primary fenced
        // read-only): the connection is replaced, and the next may reach the primary (an
        // address that moves, or a URL naming every server with target_session_attrs).
        || *code == SqlState::READ_ONLY_SQL_TRANSACTION
        // The same on a standby, met by a WAL function (the timeline, the flush position)
        // before any write.
        || (*code == SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE
            && db.message().starts_with("recovery is in progress"))
        // A statement prepared on this connection whose result type a migration changed:
        // refused before it ran; the connection (and its statements) is replaced.
        || (*code == SqlState::FEATURE_NOT_SUPPORTED
            && db.message().starts_with("cached plan must not change result type"))
    {
        // The transaction was rolled back (or never ran): not applied.
        return Failure::Transient(e.into());
    }
    Failure::Fatal(map_db_error(op, e))
}

/// Whether `e` says baton's schema, or one of its functions or tables, does not exist: the
/// schema was dropped (or the server re-created without it), and every lease with it.
fn schema_gone(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        let code = db.code();
        *code == SqlState::INVALID_SCHEMA_NAME
            || *code == SqlState::UNDEFINED_FUNCTION
            || *code == SqlState::UNDEFINED_TABLE
    })
}

/// A server error that retrying cannot fix, as baton's error.
pub(crate) fn map_db_error(op: &'static str, e: tokio_postgres::Error) -> Error {
    let code = e.as_db_error().map(|db| db.code().clone());
    match code {
        Some(c) if c == SqlState::INSUFFICIENT_PRIVILEGE => Error::Permission { source: e.into() },
        Some(c) if c.code().starts_with("28") => Error::Auth { source: e.into() },
        Some(c)
            if c == SqlState::CHARACTER_NOT_IN_REPERTOIRE
                || c == SqlState::UNTRANSLATABLE_CHARACTER =>
        {
            Error::InvalidArgument("a name or key PostgreSQL cannot store as text (a NUL byte)")
        }
        _ => Error::Backend {
            op,
            at: Where::default(),
            source: e.into(),
        },
    }
}

fn entry_from(row: &Row, key: usize) -> Entry {
    let token: i64 = row.get(key + 1);
    let lease: i64 = row.get(key + 2);
    Entry::new(
        row.get::<_, String>(key),
        row.get::<_, Vec<u8>>(key + 3),
        Position::new(token.unsigned_abs()),
        FencingToken::new(token.unsigned_abs()),
        Some(LeaseId::new(lease)),
    )
}

fn token_of(entry: &Entry) -> i64 {
    i64::try_from(entry.token().get()).unwrap_or(i64::MAX)
}

/// Refuses an entry key longer than the entries' index takes ([`MAX_KEY_BYTES`]) before it
/// is sent, naming the lock (shortened) and the limit.
fn check_key(queue: &str, key: &str) -> Result<()> {
    if key.len() <= MAX_KEY_BYTES {
        return Ok(());
    }
    let shown: String = queue.chars().take(40).collect();
    let more = if shown.len() < queue.len() { "…" } else { "" };
    Err(Error::InvalidInput {
        what: format!(
            "lock name `{shown}{more}` ({} bytes) is too long for PostgreSQL: baton's entry keys \
             (`<name>/<tag>`, {} bytes here) are indexed, and take at most {MAX_KEY_BYTES} bytes",
            queue.len(),
            key.len()
        ),
        source: None,
    })
}

/// The bounds of the key range of `queue`'s entries: `queue/` up to `queue0` (`0` follows
/// `/`), compared byte by byte (`COLLATE "C"`).
fn range(queue: &str) -> (String, String) {
    (format!("{queue}/"), format!("{queue}0"))
}

fn ms(ms: i64) -> Duration {
    Duration::from_millis(ms.unsigned_abs())
}

impl PgBackend {
    /// Connects to the PostgreSQL at `url` (`postgres://user:password@host:port/db`, or
    /// `postgresql://`, or a `key=value` connection string), checks its version, and
    /// creates or migrates baton's schema.
    ///
    /// Over TLS when the URL's `sslmode` is `verify-full` (the certificate chain and the host
    /// name checked), `verify-ca` or `require` (the chain checked); the CA and a client
    /// certificate come from libpq's `sslrootcert`, `sslcert` and `sslkey`, or from
    /// [`PgOptions::with_ca_cert`] and [`PgOptions::with_client_cert`]; without one of those
    /// modes, plain text (docs/postgres.md, TLS).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a schema name that is not a plain identifier, an unknown
    /// `sslmode`, TLS options without a TLS `sslmode`, a CA or client certificate that does
    /// not parse; [`Error::InvalidInput`] for a URL that does not parse (an option the driver
    /// does not know, a port out of range); [`Error::Connect`] for a server that refuses the
    /// connection, does not answer within the connect timeout, or is out of connections
    /// (`too many clients`, for either of the two connections); [`Error::Auth`] for a wrong
    /// or missing password (or a role that may not log in), or a client certificate the
    /// server refuses; [`Error::Misconfigured`] for a database that does not exist, a server
    /// certificate baton does not trust, TLS asked of a server without it (or plain text of
    /// one that takes the client over TLS only), a certificate file that cannot be read, a
    /// standby, a role or database whose transactions are read-only by default;
    /// [`Error::Permission`] for a role that may not create the schema or use it;
    /// [`Error::ForeignSchema`] for a schema of someone else's;
    /// [`Error::UnsupportedVersion`] below PostgreSQL 13.
    ///
    /// # Cancel safety
    /// Dropping the future closes what it opened; a migration interrupted half-way is rolled
    /// back by the server (it runs in one transaction).
    pub async fn connect(url: &str, mut options: PgOptions) -> Result<PgBackend> {
        // libpq's TLS parameters, which tokio-postgres does not know (or not all of them),
        // and baton's own `baton_schema`.
        let (rest, params) = tls::take_params(url);
        if let Some(schema) = &params.schema {
            options.schema.clone_from(schema);
        }
        if !schema::plain_identifier(&options.schema) {
            return Err(Error::InvalidArgument(
                "the schema name must be a plain lowercase identifier ([a-z_][a-z0-9_]*)",
            ));
        }
        let tls = tls::Setup::new(&params, &options.tls)?;
        // A URL that does not parse (an option the driver does not know, a port out of
        // range) is the caller's to fix: nothing was sent.
        let config: tokio_postgres::Config = rest.parse().map_err(|e| Error::InvalidInput {
            what: format!("the PostgreSQL URL `{}` does not parse", redact(url)),
            source: Some(Box::new(e)),
        })?;
        let mut config = config;
        config.ssl_mode(tls.mode);
        config.connect_timeout(options.connect_timeout);
        if config.get_application_name().is_none() {
            config.application_name("baton");
        }
        let synchronous_commit = !config
            .get_options()
            .unwrap_or_default()
            .contains("synchronous_commit");
        let endpoint = format!("PostgreSQL at {}", redact(url));
        let target = Arc::new(Target {
            config,
            endpoint,
            connect_timeout: options.connect_timeout,
            url: redact(url),
            synchronous_commit,
            tls,
        });
        let endpoints = || vec![redact(url)];
        let mut client =
            match tokio::time::timeout(options.connect_timeout, open_request_connection(&target))
                .await
            {
                Ok(Ok(client)) => client,
                Ok(Err(OpenFailure::Pg(e))) => {
                    return Err(connect_error(endpoints(), e, target.tls.is_plain()));
                }
                Ok(Err(OpenFailure::Refused(e))) => return Err(e),
                Err(_) => {
                    return Err(Error::Connect {
                        endpoints: endpoints(),
                        source: "no answer within the connect timeout".into(),
                    });
                }
            };
        migrate(client.client_mut(), &options.schema)
            .await
            .map_err(|e| e.at_endpoint(&target.endpoint))?;
        let listener = Listener::start(Arc::clone(&target), options.schema.clone());
        hears_notifications(&listener, &client, options.connect_timeout, &target.url)
            .await
            .map_err(|e| e.at_endpoint(&target.endpoint))?;
        let epochs = StoreEpochs::new(target.endpoint.clone(), options.restart_grace);
        Ok(PgBackend {
            inner: Arc::new(Inner {
                target,
                client: tokio::sync::Mutex::new(Some(Arc::new(client))),
                listener,
                sql: Sql::new(&options.schema),
                request_timeout: options.request_timeout,
                retry_for: options.retry_for,
                stamps: AtomicI64::new(1),
                bursts: burst::Bursts::default(),
                epochs,
                top_token: AtomicU64::new(0),
                postmaster: AtomicI64::new(0),
            }),
        })
    }

    /// The schema this backend keeps its state in.
    pub fn schema(&self) -> &str {
        &self.inner.sql.schema
    }

    /// How many waits for an entry's deletion a notification has woken so far, over this
    /// backend's life (all its clones): with one waiter per entry, one per release. The bench
    /// reports it per grant; `MemoryBackend::wakeups` counts the same on the memory backend.
    pub fn wakeups(&self) -> u64 {
        self.inner.listener.woken()
    }

    fn at(&self) -> Where {
        Where {
            lock: None,
            endpoint: Some(self.inner.target.endpoint.clone()),
        }
    }

    /// The request connection, connected if needed.
    async fn client(&self) -> std::result::Result<Arc<Conn>, Failure> {
        let mut slot = self.inner.client.lock().await;
        if let Some(client) = slot.as_ref()
            && !client.is_closed()
        {
            return Ok(Arc::clone(client));
        }
        *slot = None;
        let opened = tokio::time::timeout(
            self.inner.target.connect_timeout,
            open_request_connection(&self.inner.target),
        )
        .await
        .map_err(|_| Failure::Transient("no answer within the connect timeout".into()))?;
        let client = Arc::new(match opened {
            Ok(client) => client,
            Err(OpenFailure::Pg(e)) => return Err(Failure::Transient(e.into())),
            Err(OpenFailure::Refused(e)) => return Err(Failure::Fatal(e)),
        });
        *slot = Some(Arc::clone(&client));
        Ok(client)
    }

    /// Creates baton's schema again (`migrate`) on a new request connection, which then
    /// serves the next requests.
    async fn recreate_schema(&self) -> std::result::Result<(), Failure> {
        let mut slot = self.inner.client.lock().await;
        *slot = None;
        let opened = tokio::time::timeout(
            self.inner.target.connect_timeout,
            open_request_connection(&self.inner.target),
        )
        .await
        .map_err(|_| Failure::Transient("no answer within the connect timeout".into()))?;
        let mut client = match opened {
            Ok(client) => client,
            Err(OpenFailure::Pg(e)) => return Err(Failure::Transient(e.into())),
            Err(OpenFailure::Refused(e)) => return Err(Failure::Fatal(e)),
        };
        migrate(client.client_mut(), &self.inner.sql.schema)
            .await
            .map_err(Failure::Fatal)?;
        tracing::warn!(
            schema = %self.inner.sql.schema,
            "baton's schema was gone (the server re-created, or the schema dropped): created again"
        );
        *slot = Some(Arc::new(client));
        Ok(())
    }

    /// The highest token this client has seen.
    fn top_token(&self) -> u64 {
        self.inner.top_token.load(Ordering::Relaxed)
    }

    /// Records `token` as seen.
    fn saw_token(&self, token: FencingToken) {
        self.inner
            .top_token
            .fetch_max(token.get(), Ordering::Relaxed);
    }

    /// Drops `client` so that the next request reconnects (it timed out or broke: requests
    /// behind it would wait on it).
    async fn forget(&self, client: &Arc<Conn>) {
        let mut slot = self.inner.client.lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, client)) {
            *slot = None;
        }
    }

    /// Runs one request, retrying transient failures for up to `retry_for`. The flag says
    /// whether an earlier attempt may have been applied.
    pub(crate) async fn request<T, F, Fut>(&self, op: &'static str, attempt: F) -> Result<(T, bool)>
    where
        F: Fn(Arc<Conn>) -> Fut,
        Fut: Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    {
        let mut retry = Retry::new(op, self.inner.retry_for);
        loop {
            let failure = match self.client().await {
                Err(failure) => failure,
                Ok(client) => {
                    match tokio::time::timeout(
                        self.inner.request_timeout,
                        attempt(Arc::clone(&client)),
                    )
                    .await
                    {
                        Ok(Ok(value)) => return Ok((value, retry.maybe_applied())),
                        // The server was re-created without baton's schema, or it was
                        // dropped, after this client connected: create it again, as a client
                        // that connects now would (without a marker: its next answer begins
                        // a new epoch), and retry. Before, a client of before never again
                        // made a request that worked (the nemesis: no session after
                        // PostgreSQL was re-created, until the process connected anew).
                        Ok(Err(e)) if schema_gone(&e) => match self.recreate_schema().await {
                            Ok(()) => Failure::Transient(e.into()),
                            Err(failure) => failure,
                        },
                        Ok(Err(e)) => {
                            let failure = classify(op, e);
                            if !matches!(failure, Failure::Fatal(_)) {
                                self.forget(&client).await;
                            }
                            failure
                        }
                        Err(_) => {
                            self.forget(&client).await;
                            Failure::Unknown("no answer within the request timeout".into())
                        }
                    }
                }
            };
            let source = match failure {
                Failure::Fatal(e) => return Err(e.at_endpoint(&self.inner.target.endpoint)),
                Failure::Transient(e) => e,
                Failure::Unknown(e) => {
                    retry.may_have_applied();
                    e
                }
            };
            let endpoint = &self.inner.target.endpoint;
            retry
                .pause(source, endpoint)
                .await
                .map_err(|e| e.at_endpoint(endpoint))?;
        }
    }

    /// A read: whether an earlier attempt was applied does not matter.
    pub(crate) async fn read_request<T, F, Fut>(&self, op: &'static str, attempt: F) -> Result<T>
    where
        F: Fn(Arc<Conn>) -> Fut,
        Fut: Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    {
        match self.request(op, attempt).await {
            Ok((value, _)) => Ok(value),
            Err(Error::OutcomeUnknown { op, at, source }) => Err(Error::Backend { op, at, source }),
            Err(e) => Err(e),
        }
    }

    /// A conditional write: `false` after an attempt that may have been applied is not a
    /// refusal anyone can prove.
    async fn conditional<F, Fut>(&self, op: &'static str, attempt: F) -> Result<bool>
    where
        F: Fn(Arc<Conn>) -> Fut,
        Fut: Future<Output = std::result::Result<bool, tokio_postgres::Error>>,
    {
        match self.request(op, attempt).await? {
            (false, true) => Err(Error::OutcomeUnknown {
                op,
                at: self.at(),
                source: "an earlier attempt may have been applied; the retry found its condition \
                         failed"
                    .into(),
            }),
            (done, _) => Ok(done),
        }
    }

    /// A new enqueue stamp, above every one handed out before.
    fn next_stamp(&self) -> i64 {
        self.inner.stamps.fetch_add(1, Ordering::Relaxed)
    }

    /// Waits on `channel` until `check` says done (`Some`), looking again after every
    /// notification, every reconnect of the LISTEN connection, and after the delay `check`
    /// asks for. A notification whose payload `proves` is done without looking again (a
    /// deletion's NOTIFY names the token it deleted, and is delivered only once committed).
    async fn wait_on<T, F, Fut>(
        &self,
        channel: String,
        check: F,
        proves: impl Fn(&str) -> Option<T>,
    ) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<std::result::Result<T, Option<Duration>>>>,
    {
        let mut subscription = self.inner.listener.subscribe(channel).await?;
        loop {
            // Subscribed before the check: a change committed after it is heard.
            let again = match check().await? {
                Ok(done) => return Ok(done),
                Err(again) => again,
            };
            let sleep = async {
                match again {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            let mut heard = tokio::select! {
                heard = subscription.heard.recv() => match heard {
                    Some(heard) => vec![heard],
                    None => return Err(Error::Unavailable),
                },
                () = sleep => Vec::new(),
            };
            // Everything heard so far: one answer, or one look again for all of it.
            while let Ok(h) = subscription.heard.try_recv() {
                heard.push(h);
            }
            for h in &heard {
                if let Heard::Payload(payload) = h
                    && let Some(done) = proves(payload)
                {
                    return Ok(done);
                }
            }
        }
    }

    /// Waits until `entry` (this incarnation) is gone. Returns the token of the head its
    /// queue had in the deleting transaction, the timeline that transaction ran on and when
    /// its server's postmaster started (schema version 8), when a notification said so.
    async fn await_deletion(&self, entry: &Entry) -> Result<Option<(i64, i32, Option<i64>)>> {
        let sql = &self.inner.sql.alive;
        let key = entry.key();
        let token = token_of(entry);
        let check = || async move {
            let left = self
                .read_request("wait_gone", |c| async move {
                    let rows = c
                        .query(sql, &[(&key, Type::TEXT), (&token, Type::INT8)])
                        .await?;
                    Ok(rows.first().and_then(|r| r.get::<_, Option<i64>>(0)))
                })
                .await?;
            Ok(match left {
                None => Ok(None),
                // Look again just after the lease could have expired, to end it if it did.
                Some(left) => Err(Some(ms(left) + Duration::from_millis(5))),
            })
        };
        // The deleting transaction's NOTIFY carries the token it deleted (that incarnation is
        // gone, no need to read it again), and the head of the queue it left, if any, with
        // the timeline it ran on.
        let token_text = token.to_string();
        self.wait_on(self.inner.sql.channel('e', key), check, |payload| {
            let mut words = payload.split(' ');
            (words.next() == Some(token_text.as_str())).then(|| {
                let head = words.next()?.parse().ok()?;
                let timeline = words.next()?.parse().ok()?;
                Some((head, timeline, words.next().and_then(|w| w.parse().ok())))
            })
        })
        .await
    }
}

/// Checks that the LISTEN connection hears a notification the request connection sends.
/// Behind a transaction-mode pooler it does not (the LISTEN's server connection goes back to
/// the pool once its transaction ends, and a notification for it reaches whichever client
/// holds that connection, or no one): baton's waits would then hang until a lease deadline, so
/// the connect is refused instead.
///
/// A LISTEN connection that cannot connect at all (a server out of connections: `too many
/// clients`) is reported as what it is, with the server's answer, as soon as it is known.
async fn hears_notifications(
    listener: &Listener,
    client: &Conn,
    within: Duration,
    url: &str,
) -> Result<()> {
    static PROBES: AtomicI64 = AtomicI64::new(0);
    let refused = |why: &str| Error::Misconfigured {
        endpoints: vec![url.to_owned()],
        source: format!(
            "the LISTEN connection {why}: is a transaction-mode pooler (PgBouncer's \
             pool_mode = transaction) between baton and PostgreSQL? baton's waits need LISTEN, \
             which needs a session: connect directly, or through a session-mode pool"
        )
        .into(),
    };
    let channel = format!(
        "bp{:x}x{:x}",
        std::process::id(),
        PROBES.fetch_add(1, Ordering::Relaxed)
    );
    let deadline = Instant::now() + within;
    let cannot_connect = |e: tokio_postgres::Error| Error::Connect {
        endpoints: vec![url.to_owned()],
        source: format!(
            "the LISTEN connection (baton's second connection) could not connect: {}",
            e.as_db_error()
                .map_or_else(|| e.to_string(), ToString::to_string)
        )
        .into(),
    };
    let subscribing = listener.subscribe(channel.clone());
    tokio::pin!(subscribing);
    let mut subscription = loop {
        // Looked at every 50 ms: the LISTEN connection retries by itself, and its failure
        // says more than the timeout would.
        let step = (Instant::now() + Duration::from_millis(50)).min(deadline);
        match tokio::time::timeout_at(step, &mut subscribing).await {
            Ok(subscribed) => break subscribed?,
            Err(_) if Instant::now() >= deadline => {
                return Err(match listener.take_failure() {
                    Some(e) => cannot_connect(e),
                    None => refused("did not LISTEN within the connect timeout"),
                });
            }
            Err(_) => {
                if let Some(e) = listener.take_failure()
                    && e.as_db_error().is_some()
                {
                    // The server answered, and said no (out of connections, say): final
                    // for this connect.
                    return Err(cannot_connect(e));
                }
            }
        }
    };
    loop {
        client
            .notify(&channel)
            .await
            .map_err(|e| map_db_error("connect", e))?;
        match tokio::time::timeout_at(deadline, subscription.heard.recv()).await {
            Ok(Some(Heard::Payload(_))) => return Ok(()),
            // Lost and back: notify again.
            Ok(Some(Heard::Reconnected)) => {}
            Ok(None) => return Err(Error::Unavailable),
            Err(_) => {
                return Err(refused(
                    "did not hear a notification sent to it within the connect timeout",
                ));
            }
        }
    }
}

/// The URL without its password.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return if url.contains("password") {
            "(a connection string)".to_owned()
        } else {
            url.to_owned()
        };
    };
    match rest.rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split(':').next().unwrap_or("");
            format!("{scheme}://{user}@{host}")
        }
        None => url.to_owned(),
    }
}

fn connect_error(endpoints: Vec<String>, e: tokio_postgres::Error, plain: bool) -> Error {
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        if plain && code.code().starts_with("28") && db.message().contains("no encryption") {
            // pg_hba.conf takes this client over TLS only (`hostssl`).
            return Error::Misconfigured {
                endpoints,
                source: format!(
                    "{}: the server takes this connection over TLS only (add \
                     sslmode=verify-full, verify-ca or require to the URL)",
                    db.message()
                )
                .into(),
            };
        }
        if code.code().starts_with("28") {
            return Error::Auth { source: e.into() };
        }
        if *code == SqlState::INVALID_CATALOG_NAME {
            return Error::Misconfigured {
                endpoints,
                source: e.into(),
            };
        }
        if *code == SqlState::INSUFFICIENT_PRIVILEGE {
            return Error::Permission { source: e.into() };
        }
    } else if std::error::Error::source(&e).is_some_and(|c| c.to_string() == "password missing") {
        // The server asked for a password and none was given.
        return Error::Auth { source: e.into() };
    }
    if let Some(refused) = tls::refused(&e, endpoints.clone()) {
        return refused;
    }
    Error::Connect {
        endpoints,
        source: e.into(),
    }
}

/// The highest migration applied to `schema` (its `schema_version` table must exist).
async fn schema_version(client: &impl tokio_postgres::GenericClient, schema: &str) -> Result<i32> {
    Ok(client
        .query_one(
            &schema::render(
                "SELECT coalesce(max(version), 0) FROM {s}.schema_version",
                schema,
            ),
            &[],
        )
        .await
        .map_err(|e| map_db_error("migrate", e))?
        .get(0))
}

/// Creates or migrates the schema, in one transaction under an advisory lock (concurrent
/// first connects wait for each other), after checking the server's version.
async fn migrate(client: &mut Client, schema: &str) -> Result<()> {
    let fail = |op| move |e: tokio_postgres::Error| map_db_error(op, e);
    let row = client
        .query_one(
            "SELECT current_setting('server_version_num')::int, pg_is_in_recovery()",
            &[],
        )
        .await
        .map_err(fail("server version"))?;
    let version: i32 = row.get(0);
    if version < MINIMUM_VERSION {
        return Err(Error::UnsupportedVersion {
            server: "PostgreSQL",
            version: version.to_string(),
            minimum: "13",
        });
    }
    // A standby can neither write nor NOTIFY: say so, rather than fail on the first write.
    if row.get::<_, bool>(1) {
        return Err(Error::Misconfigured {
            endpoints: Vec::new(),
            source: "the server is a standby (in recovery, read-only): baton needs the \
                     primary. Name it, or name every server of the cluster with \
                     target_session_attrs=read-write in the URL"
                .into(),
        });
    }
    let known = i32::try_from(schema::MIGRATIONS).unwrap_or(i32::MAX);
    // Up to date: nothing to create, so a role that may only use the schema connects too.
    let installed = client
        .query_one(
            &schema::render(
                "SELECT CASE WHEN to_regclass('{s}.schema_version') IS NULL THEN 0 \
                 ELSE -1 END",
                schema,
            ),
            &[],
        )
        .await
        .map_err(fail("migrate"))?
        .get::<_, i32>(0);
    if installed != 0 && schema_version(&*client, schema).await? == known {
        return Ok(());
    }
    // READ COMMITTED whatever the defaults (the session's is set already; said again here,
    // where it matters most): a client that waited for the lock below must see what the
    // client before it created, or it creates it again ("relation already exists").
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::ReadCommitted)
        .start()
        .await
        .map_err(fail("migrate"))?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        &[&schema::LOCK_CLASS, &format!("{schema}|migrate")],
    )
    .await
    .map_err(fail("migrate"))?;
    // A schema of that name with someone else's objects in it and none of baton's: not
    // taken over (baton would mix its tables with the application's, or fail on a name both
    // use).
    let foreign: bool = tx
        .query_one(
            &schema::render(
                "SELECT to_regclass('{s}.schema_version') IS NULL AND ( \
                   EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n \
                           ON n.oid = c.relnamespace WHERE n.nspname = $1) \
                   OR EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n \
                              ON n.oid = p.pronamespace WHERE n.nspname = $1))",
                schema,
            ),
            &[&schema],
        )
        .await
        .map_err(fail("migrate"))?
        .get(0);
    if foreign {
        return Err(Error::ForeignSchema {
            schema: schema.to_owned(),
        });
    }
    tx.batch_execute(&schema::render(
        "CREATE SCHEMA IF NOT EXISTS {s}; \
         CREATE TABLE IF NOT EXISTS {s}.schema_version ( \
             version integer PRIMARY KEY, \
             applied timestamptz NOT NULL DEFAULT now())",
        schema,
    ))
    .await
    .map_err(fail("migrate"))?;
    let current = schema_version(&tx, schema).await?;
    if current > known {
        return Err(Error::Misconfigured {
            endpoints: Vec::new(),
            source: format!(
                "schema `{schema}` is at version {current}, newer than this baton knows \
                 ({known}): upgrade baton"
            )
            .into(),
        });
    }
    let next = current.unsigned_abs() as usize + 1;
    for (step, sql) in (next..).map_while(|step| Some(step).zip(schema::migration(step, schema))) {
        tx.batch_execute(&sql).await.map_err(fail("migrate"))?;
        let version = i32::try_from(step).unwrap_or(i32::MAX);
        tx.execute(
            &schema::render(
                "INSERT INTO {s}.schema_version (version) VALUES ($1)",
                schema,
            ),
            &[&version],
        )
        .await
        .map_err(fail("migrate"))?;
        tracing::info!(schema, version, "migrated baton's schema");
    }
    if current == 0 {
        // Created just now: for clients of versions 4 to 7, no state of before can have been
        // lost on this timeline. For this version's, a schema created anew has no epoch: its
        // first use begins one, with a grace (the server may have lost a schema that holders
        // still believe in), unless an operator marks the store new first (init_store).
        tx.batch_execute(&schema::render(
            "UPDATE {s}.timelines SET began = '-infinity' WHERE timeline = {s}.timeline(); \
             UPDATE {s}.store SET epoch = NULL",
            schema,
        ))
        .await
        .map_err(fail("migrate"))?;
    }
    tx.commit().await.map_err(fail("migrate"))?;
    Ok(())
}

#[async_trait]
impl Backend for PgBackend {
    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        if ttl.is_zero() {
            return Err(Error::InvalidArgument(
                "lease TTL must be greater than zero",
            ));
        }
        let ttl_ms = i64::try_from(ttl.as_millis().max(1)).unwrap_or(i64::MAX);
        let sql = &self.inner.sql.grant;
        let sent = Instant::now();
        let (answer, _) = self
            .request("grant_lease", |c| async move {
                let rows = c.query(sql, &[(&ttl_ms, Type::INT8)]).await?;
                Ok(rows.first().map(|r| {
                    (
                        r.get::<_, i64>(0),
                        EpochAnswer::from_row(r, 1),
                        c.system_id(),
                    )
                }))
            })
            .await?;
        let (id, epoch, system_id) = answer.ok_or_else(|| Error::Backend {
            op: "grant_lease",
            at: self.at(),
            source: "no lease id returned".into(),
        })?;
        // The session registers in the epoch its lease was granted in: this client takes it
        // in first (and learns of a grace before it is granted anything).
        self.epoch_answered("grant_lease", system_id, &epoch, sent)
            .await?;
        Ok(Lease::new(LeaseId::new(id), ms(ttl_ms)))
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>> {
        let sql = &self.inner.sql.renew;
        let id = lease.get();
        let sent = Instant::now();
        let answer = self
            .read_request("keep_alive", |c| async move {
                match c.query(sql, &[(&id, Type::INT8)]).await {
                    Ok(rows) => Ok(rows.first().map(|r| {
                        (
                            r.get::<_, Option<i64>>(0),
                            EpochAnswer::from_row(r, 1),
                            c.system_id(),
                        )
                    })),
                    // No schema, no lease: told now rather than at the session's deadline.
                    Err(e) if schema_gone(&e) => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .await?;
        let Some((ttl, epoch, system_id)) = answer else {
            return Ok(None);
        };
        // A lease that a restore brought back renews like any other: only the epoch and the
        // position tell its holder that the store went back (its sessions are then lost,
        // this one with them).
        self.epoch_answered("keep_alive", system_id, &epoch, sent)
            .await?;
        Ok(ttl.map(ms))
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        let sql = &self.inner.sql.revoke;
        let id = lease.get();
        self.read_request("revoke_lease", |c| async move {
            c.execute(sql, &[(&id, Type::INT8)]).await.map(drop)
        })
        .await
    }

    async fn enqueue(
        &self,
        queue: &str,
        tag: &str,
        lease: LeaseId,
        value: &[u8],
    ) -> Result<Enqueued> {
        let sql = &self.inner.sql.enqueue;
        let abandon = &self.inner.sql.abandon;
        let id = lease.get();
        let key = format!("{queue}/{tag}");
        check_key(queue, &key)?;
        let mut refused = 0;
        let sent_at = Instant::now();
        // The first attempt goes in a burst with whatever other enqueues wait (burst.rs).
        let stamp = self.next_stamp();
        let mut in_burst = self
            .enqueue_in_burst(|answer| burst::Pending {
                queue: queue.to_owned(),
                tag: tag.to_owned(),
                lease: id,
                value: value.to_vec(),
                stamp,
                answer,
            })
            .await;
        // Unanswered: the burst may or may not have been applied; the next attempt gives its
        // stamp up first.
        let mut given_up = in_burst.is_none().then_some(stamp);
        let row = loop {
            // The stamp of the last attempt sent (0: none yet).
            let sent = AtomicI64::new(given_up.take().unwrap_or(0));
            let row = match in_burst.take() {
                Some(answered) => Some(answered),
                None => {
                    self.request("enqueue", |c| {
                        let stamp = self.next_stamp();
                        let earlier = sent.swap(stamp, Ordering::SeqCst);
                        let key = &key;
                        async move {
                            if earlier != 0 {
                                // An earlier attempt may be on its way still (held up on the
                                // connection this one replaced): from now on no enqueue of the
                                // lease stamped at or below it creates anything. If it was
                                // applied, this attempt finds its entry.
                                c.query(
                                    abandon,
                                    &[(key, Type::TEXT), (&id, Type::INT8), (&earlier, Type::INT8)],
                                )
                                .await?;
                            }
                            let rows = c
                                .query(
                                    sql,
                                    &[
                                        (&queue, Type::TEXT),
                                        (&tag, Type::TEXT),
                                        (&id, Type::INT8),
                                        (&value, Type::BYTEA),
                                        (&stamp, Type::INT8),
                                    ],
                                )
                                .await?;
                            Ok(rows.into_iter().next().map(|r| (r, c.system_id())))
                        }
                    })
                    .await
                    .map_err(|e| e.in_lock(queue))?
                    .0
                }
            };
            let (row, system_id) = row.ok_or_else(|| Error::Backend {
                op: "enqueue",
                at: self.at(),
                source: "no answer row".into(),
            })?;
            match row.get::<_, &str>(0) {
                "ok" => break (row, system_id),
                "lost" => return Err(Error::SessionLost(LostReason::Revoked)),
                // Refused by a give-up of another call of this lease (it fences off every
                // stamp this process had handed out): nothing was created, and this call has
                // not given up. Again, with a new stamp.
                _ if refused < ABANDONED_RETRIES => refused += 1,
                _ => {
                    return Err(Error::Backend {
                        op: "enqueue",
                        at: self.at(),
                        source: "refused again and again as given up (other calls of this \
                                 lease kept giving up theirs); nothing was created"
                            .into(),
                    });
                }
            }
        };
        let (row, system_id) = row;
        let token: i64 = row.get(1);
        let entry = Entry::new(
            key,
            row.get::<_, Vec<u8>>(3),
            Position::new(token.unsigned_abs()),
            FencingToken::new(token.unsigned_abs()),
            Some(LeaseId::new(row.get(2))),
        );
        let predecessor = row.get::<_, Option<String>>(4).map(|pkey| {
            let ptoken: i64 = row.get(5);
            Entry::new(
                pkey,
                row.get::<_, Vec<u8>>(7),
                Position::new(ptoken.unsigned_abs()),
                FencingToken::new(ptoken.unsigned_abs()),
                Some(LeaseId::new(row.get(6))),
            )
        });
        self.saw_token(entry.token());
        // The epoch the grant was decided in: a new one ends this client's sessions from
        // before (this one, if it is one of them), and the queue engine waits its grace out
        // before it grants.
        self.epoch_answered(
            "enqueue",
            system_id,
            &EpochAnswer::from_row(&row, 8),
            sent_at,
        )
        .await?;
        Ok(Enqueued::new(entry, predecessor.is_none(), predecessor))
    }

    fn epochs(&self) -> Option<&StoreEpochs> {
        Some(&self.inner.epochs)
    }

    async fn find_entry(&self, queue: &str, tag: &str) -> Result<Option<Entry>> {
        let sql = &self.inner.sql.find;
        let key = format!("{queue}/{tag}");
        let key = &key;
        self.read_request("find_entry", |c| async move {
            let rows = c.query(sql, &[(key, Type::TEXT)]).await?;
            Ok(rows.first().map(|r| entry_from(r, 0)))
        })
        .await
    }

    async fn abandon(&self, queue: &str, tag: &str, lease: LeaseId) -> Result<Option<Entry>> {
        let sql = &self.inner.sql.abandon;
        let key = format!("{queue}/{tag}");
        let key = &key;
        let id = lease.get();
        // Above every stamp an enqueue of this process sent before now.
        let stamp = self.next_stamp();
        self.read_request("abandon", |c| async move {
            let rows = c
                .query(
                    sql,
                    &[(key, Type::TEXT), (&id, Type::INT8), (&stamp, Type::INT8)],
                )
                .await?;
            Ok(rows.first().and_then(|r| {
                let token: Option<i64> = r.get(0);
                token.map(|token| {
                    Entry::new(
                        key.clone(),
                        r.get::<_, Vec<u8>>(2),
                        Position::new(token.unsigned_abs()),
                        FencingToken::new(token.unsigned_abs()),
                        Some(LeaseId::new(r.get(1))),
                    )
                })
            }))
        })
        .await
    }

    async fn predecessor(&self, mine: &Entry) -> Result<Option<Entry>> {
        let queue = super::queue_of(mine.key());
        Ok(self.ahead(queue, mine, 1).await?.into_iter().next())
    }

    async fn ahead(&self, queue: &str, mine: &Entry, limit: usize) -> Result<Vec<Entry>> {
        let sql = &self.inner.sql.ahead;
        let key = mine.key();
        let token = token_of(mine);
        let most = i64::try_from(limit).unwrap_or(i64::MAX);
        let sent = Instant::now();
        let (rows, system_id) = self
            .read_request("ahead", |c| async move {
                let rows = c
                    .query(
                        sql,
                        &[
                            (&queue, Type::TEXT),
                            (&key, Type::TEXT),
                            (&token, Type::INT8),
                            (&most, Type::INT8),
                        ],
                    )
                    .await?;
                Ok((rows, c.system_id()))
            })
            .await?;
        let Some(first) = rows.first().filter(|r| r.get::<_, bool>(0)) else {
            return Err(Error::EntryGone {
                key: mine.key().to_owned(),
            });
        };
        self.epoch_answered("ahead", system_id, &EpochAnswer::from_row(first, 5), sent)
            .await?;
        let ahead: Vec<Entry> = rows
            .iter()
            .filter(|r| r.get::<_, Option<String>>(1).is_some())
            .map(|r| entry_from(r, 1))
            .collect();
        if let Some(newest) = ahead.first() {
            self.saw_token(newest.token());
        }
        Ok(ahead)
    }

    async fn was_head(&self, mine: &Entry) -> Result<bool> {
        // One primary, always current: the exact answer.
        super::present_without_predecessor(self, mine).await
    }

    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        self.await_deletion(entry).await.map(drop)
    }

    async fn wait_gone_then_head(&self, predecessor: &Entry, mine: &Entry) -> Result<bool> {
        // The deleting transaction's notice names the head it left behind: no read needed
        // when that is `mine` (present, live, nothing older, in the state that deletion
        // committed), sent by the server (postmaster, timeline) this client's answers come
        // from (a read compares the position; a notice from a restored server must not skip
        // it), outside a restart grace.
        if let Some((head, timeline, started)) = self.await_deletion(predecessor).await?
            && head == token_of(mine)
            && self.grants_nothing_for().is_none()
            && epoch::notice_is_current(
                self.inner.epochs.highest_seen().as_deref(),
                Some(self.inner.postmaster.load(Ordering::Relaxed)).filter(|&p| p != 0),
                timeline,
                started,
            )
        {
            return Ok(true);
        }
        Ok(self.was_head(mine).await.unwrap_or(false))
    }

    async fn head(&self, queue: &str) -> Result<Option<Entry>> {
        let sql = &self.inner.sql.head;
        self.read_request("head", |c| async move {
            let rows = c.query(sql, &[(&queue, Type::TEXT)]).await?;
            Ok(rows.first().map(|r| entry_from(r, 0)))
        })
        .await
    }

    async fn entries(&self, queue: &str) -> Result<Vec<Entry>> {
        let sql = &self.inner.sql.entries;
        let (lo, hi) = range(queue);
        let (lo, hi) = (&lo, &hi);
        self.read_request("entries", |c| async move {
            let rows = c.query(sql, &[(lo, Type::TEXT), (hi, Type::TEXT)]).await?;
            Ok(rows.iter().map(|r| entry_from(r, 0)).collect())
        })
        .await
    }

    async fn init_store(&self) -> Result<bool> {
        PgBackend::init_store(self).await
    }

    async fn delete_entry(&self, entry: &Entry) -> Result<bool> {
        let sql = &self.inner.sql.delete;
        let key = entry.key();
        let token = token_of(entry);
        self.conditional("delete_entry", |c| async move {
            let n = c
                .execute(sql, &[(&key, Type::TEXT), (&token, Type::INT8)])
                .await?;
            Ok(n == 1)
        })
        .await
    }

    async fn update_entry(&self, entry: &Entry, value: &[u8]) -> Result<bool> {
        let sql = &self.inner.sql.update;
        let key = entry.key();
        let token = token_of(entry);
        self.conditional("update_entry", |c| async move {
            let n = c
                .execute(
                    sql,
                    &[
                        (&key, Type::TEXT),
                        (&token, Type::INT8),
                        (&value, Type::BYTEA),
                    ],
                )
                .await?;
            Ok(n == 1)
        })
        .await
    }

    async fn guarded(&self, entry: &Entry, ops: &[WriteOp]) -> Result<bool> {
        let sql = &self.inner.sql.guarded;
        let key = entry.key();
        let token = token_of(entry);
        let mut kinds: Vec<&str> = Vec::with_capacity(ops.len());
        let mut keys: Vec<&str> = Vec::with_capacity(ops.len());
        let mut values: Vec<&[u8]> = Vec::with_capacity(ops.len());
        for op in ops {
            match op {
                WriteOp::Put { key, value } => {
                    kinds.push("p");
                    keys.push(key);
                    values.push(value);
                }
                WriteOp::Delete { key } => {
                    kinds.push("d");
                    keys.push(key);
                    values.push(&[]);
                }
            }
        }
        let (kinds, keys, values) = (&kinds, &keys, &values);
        self.conditional("guarded", |c| async move {
            let rows = c
                .query(
                    sql,
                    &[
                        (&key, Type::TEXT),
                        (&token, Type::INT8),
                        (kinds, Type::TEXT_ARRAY),
                        (keys, Type::TEXT_ARRAY),
                        (values, Type::BYTEA_ARRAY),
                    ],
                )
                .await?;
            Ok(rows.first().is_some_and(|r| r.get::<_, bool>(0)))
        })
        .await
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let sql = &self.inner.sql.read;
        self.read_request("read", |c| async move {
            let rows = c.query(sql, &[(&key, Type::TEXT)]).await?;
            Ok(rows.first().map(|r| r.get::<_, Vec<u8>>(0)))
        })
        .await
    }

    async fn swap(&self, key: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<bool> {
        let sql = &self.inner.sql.swap;
        self.conditional("swap", |c| async move {
            let rows = c
                .query(
                    sql,
                    &[
                        (&key, Type::TEXT),
                        (&expected, Type::BYTEA),
                        (&new, Type::BYTEA),
                    ],
                )
                .await?;
            Ok(rows.first().is_some_and(|r| r.get::<_, bool>(0)))
        })
        .await
    }

    async fn wait_value(&self, key: &str, seen: Option<&[u8]>) -> Result<Option<Vec<u8>>> {
        let check = || async move {
            let now = self.read(key).await?;
            Ok(if now.as_deref() == seen {
                Err(None)
            } else {
                Ok(now)
            })
        };
        self.wait_on(self.inner.sql.channel('k', key), check, |_| None)
            .await
    }

    async fn lease_ttl(&self, lease: LeaseId) -> Result<Option<Duration>> {
        let sql = &self.inner.sql.lease_ttl;
        let id = lease.get();
        self.read_request("lease_ttl", |c| async move {
            let rows = c.query(sql, &[(&id, Type::INT8)]).await?;
            Ok(rows.first().map(|r| ms(r.get::<_, i64>(0))))
        })
        .await
    }

    fn observe_head(&self, queue: &str) -> BoxStream<'static, Result<HeadEvent>> {
        observe::observe(self.clone(), queue.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_password() {
        assert_eq!(
            redact("postgres://app:secret@db:5432/x"),
            "postgres://app@db:5432/x"
        );
        assert_eq!(redact("postgres://db/x"), "postgres://db/x");
        assert_eq!(redact("host=db password=secret"), "(a connection string)");
    }

    #[test]
    fn channels_match_the_schema_function() {
        // 'b' || kind || md5('baton|q'), as PostgreSQL computes it (md5sum agrees).
        let sql = Sql::new("baton");
        assert_eq!(sql.channel('q', "q"), "bq9b4df76deef95937e858b24df8b9a4b0");
        assert_eq!(sql.channel('q', "q").len(), 34, "under PostgreSQL's 63");
    }
}
