//! The conformance suite, the fault harness and PostgreSQL-specific tests against a real
//! PostgreSQL in a container (see `baton::testing::PgNode`). One server is shared by the tests
//! of this binary; each test uses its own lock names. Tests that stop or pause the server
//! start one of their own.

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use baton::testing::PgNode;
use baton::{Backend, Error, Mutex, PgBackend, PgOptions, Session, SessionOptions};
use support::{Rig, within};

async fn backend() -> PgBackend {
    PgNode::shared()
        .backend()
        .await
        .expect("connect to the shared PostgreSQL")
}

async fn rig(test: &str) -> Rig {
    Rig {
        backend: Arc::new(backend().await),
        // A second backend: "someone else" really is another client.
        outside: Arc::new(backend().await),
        prefix: format!("pg-{}/{test}", std::process::id()),
    }
}

conformance!(super::rig; flavor = "multi_thread", worker_threads = 2);

fn test_name(test: &str) -> String {
    format!("pg-{}/{test}", std::process::id())
}

/// The fault-injection harness on PostgreSQL, sampled as on etcd and Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_harness_sample() {
    support::harness::run_sample("postgres", |case: String| async move {
        Rig {
            backend: Arc::new(backend().await),
            outside: Arc::new(backend().await),
            prefix: format!("pg-{}/harness/{case}", std::process::id()),
        }
    })
    .await;
}

/// Bad URLs, dead ports, unknown databases, wrong passwords and missing permissions are
/// refused at connect with typed errors, the cause kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_errors_are_typed() {
    let err = PgBackend::connect("postgres://a b c:xx/", PgOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = std::time::Instant::now();
    let err = PgBackend::connect(
        &format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        PgOptions::new().with_connect_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the cause is kept"
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    let node = PgNode::shared();
    let err = PgBackend::connect(
        &format!("postgres://postgres@127.0.0.1:{}/nosuchdb", node.port()),
        PgOptions::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Misconfigured { .. }), "{err:?}");

    let err = PgBackend::connect(&node.url(), PgOptions::new().with_schema("Bad-Name"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
}

/// Wrong and missing passwords are `Auth`; a role that may not create baton's schema is
/// `Permission`. On a server of its own, whose pg_hba.conf asks the role `app` for a password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_and_permission_errors_are_typed() {
    let node = PgNode::start().await.unwrap();
    let admin = node.client().await.unwrap();
    let hba: String = admin.query_one("SHOW hba_file", &[]).await.unwrap().get(0);
    admin
        .batch_execute(&format!(
            "CREATE ROLE app LOGIN PASSWORD 'secret';
             REVOKE CREATE ON DATABASE postgres FROM PUBLIC;
             COPY (SELECT unnest(ARRAY['local all all trust',
                                       'host all app 127.0.0.1/32 scram-sha-256',
                                       'host all all 127.0.0.1/32 trust']))
                 TO '{hba}';
             SELECT pg_reload_conf();"
        ))
        .await
        .unwrap();
    let url = |user: &str| format!("postgres://{user}@127.0.0.1:{}/postgres", node.port());
    let err = PgBackend::connect(&url("app:wrong"), PgOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    let err = PgBackend::connect(&url("app"), PgOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    let err = PgBackend::connect(&url("app:secret"), PgOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Permission { .. }), "{err:?}");
    // Once an owner created the schema and granted its use, the role locks.
    PgBackend::connect(&node.url(), PgOptions::new())
        .await
        .unwrap();
    admin
        .batch_execute(
            "GRANT USAGE ON SCHEMA baton TO app;
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA baton TO app;
             GRANT USAGE ON ALL SEQUENCES IN SCHEMA baton TO app;",
        )
        .await
        .unwrap();
    let backend = PgBackend::connect(&url("app:secret"), PgOptions::new())
        .await
        .unwrap();
    let s = Session::new(backend).await.unwrap();
    let guard = Mutex::new(&s, "as-app").unwrap().lock().await.unwrap();
    guard.unlock().await.unwrap();
}

/// A release wakes exactly the next waiter: with a queue of waiters, one release hands the
/// lock to the next in line and no other waiter runs a request because of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_is_woken_not_polled() {
    let name = test_name("woken");
    let holder = Session::new(backend().await).await.unwrap();
    let guard = Mutex::new(&holder, &name).unwrap().lock().await.unwrap();
    let waiter = Session::from_shared(
        Arc::new(backend().await),
        SessionOptions::new().with_ttl(Duration::from_secs(60)),
    )
    .await
    .unwrap();
    let b = backend().await;
    let m = Mutex::new(&waiter, &name).unwrap();
    let waiting = tokio::spawn(async move { m.lock().await });
    support::eventually("the waiter queued", || {
        let b = b.clone();
        let name = name.clone();
        async move { b.entries(&name).await.unwrap().len() == 2 }
    })
    .await;
    let released = std::time::Instant::now();
    guard.unlock().await.unwrap();
    let next = within("the waiter", Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "woken by the release's NOTIFY, not by a re-check at the lease deadline (60 s)"
    );
    next.unlock().await.unwrap();
}
