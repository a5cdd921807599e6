//! PostgreSQL over TLS: one server in a container serving TLS with certificates made at test
//! time (issued for the name `pg.test`, reached at 127.0.0.1 with `hostaddr`), taking every
//! role but `postgres` over TLS only, and the role `app` only with a client certificate
//! (`PgNode::require_tls`). What works (a lock over TLS with `verify-full`, `verify-ca`,
//! `require`, a client certificate given as options or as libpq's files, the CLI's flags) and
//! what is refused: each refusal is a typed error that says what is wrong.

#[path = "support/connecting.rs"]
mod connecting;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use baton::testing::{PgNode, ServerTls, TestCa};
use baton::{ConnectOptions, Error, PgBackend, PgOptions};
use connecting::{chain, lock_round_trip};

/// The server's certificate names this host only; the tests reach it at 127.0.0.1.
const HOST: &str = "pg.test";

struct Fixture {
    node: PgNode,
    tls: ServerTls,
}

/// The one server of this binary, serving TLS (started on a runtime of its own that outlives
/// every test's).
fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the fixture");
            rt.block_on(async move {
                let ca = TestCa::generate("baton PostgreSQL test CA").expect("a CA");
                let tls = ServerTls::new(ca.cert_pem(), ca.server_cert(&[HOST]).expect("cert"))
                    .with_client_cert(ca.client_cert("app").expect("client cert"))
                    .with_client_cert_auth(true);
                let node = PgNode::start().await.expect("start postgres");
                node.client()
                    .await
                    .expect("client")
                    .batch_execute("CREATE ROLE app LOGIN SUPERUSER")
                    .await
                    .expect("create the role app");
                node.require_tls(&tls).await.expect("serve TLS");
                let _ = tx.send(Fixture { node, tls });
                std::future::pending::<()>().await;
            });
        });
        rx.recv().expect("the fixture starts")
    })
}

/// A URL for `user` at the certificate's name, connecting to 127.0.0.1, with `query` added.
fn url(user: &str, query: &str) -> String {
    let f = fixture();
    format!(
        "postgres://{user}@{HOST}:{}/postgres?hostaddr=127.0.0.1&{query}",
        f.node.port()
    )
}

/// The same at 127.0.0.1 itself (a name the certificate does not carry).
fn url_by_address(user: &str, query: &str) -> String {
    format!(
        "postgres://{user}@127.0.0.1:{}/postgres?{query}",
        fixture().node.port()
    )
}

fn trusting_the_ca() -> PgOptions {
    PgOptions::new()
        .with_ca_cert(fixture().tls.ca_pem())
        .with_connect_timeout(Duration::from_secs(5))
}

/// The fixture's CA and client certificate as files in a directory of their own (`ca.pem`,
/// `app.pem`, `app-key.pem`), as libpq and the CLI take them.
fn pem_files(test: &str) -> std::path::PathBuf {
    let f = fixture();
    let client = f
        .tls
        .client_cert()
        .expect("the fixture's client certificate");
    let dir = std::env::temp_dir().join(format!("baton-pg-tls-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let files = [
        ("ca.pem", f.tls.ca_pem()),
        ("app.pem", client.cert_pem()),
        ("app-key.pem", client.key_pem()),
    ];
    for (name, pem) in files {
        std::fs::write(dir.join(name), pem).expect("write");
    }
    dir
}

/// How many of the connections named `application` use TLS, and how many do not.
async fn connections(application: &str) -> (i64, i64) {
    let row = fixture()
        .node
        .client()
        .await
        .expect("client")
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl) \
             FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = $1",
            &[&application],
        )
        .await
        .expect("pg_stat_ssl");
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn verify_full_connects_over_tls_and_a_lock_works() {
    let backend = PgBackend::connect(
        &url("postgres", "sslmode=verify-full&application_name=tls-full"),
        trusting_the_ca(),
    )
    .await
    .expect("connect over TLS");
    // Both of the backend's connections (requests, LISTEN) are TLS ones.
    assert_eq!(connections("tls-full").await, (2, 0));
    lock_round_trip(Arc::new(backend), "tls/verify-full").await;
}

#[tokio::test]
async fn verify_full_refuses_a_certificate_issued_for_another_host() {
    let err = PgBackend::connect(
        &url_by_address("postgres", "sslmode=verify-full"),
        trusting_the_ca(),
    )
    .await
    .expect_err("127.0.0.1 is not pg.test");
    assert!(matches!(err, Error::Misconfigured { .. }), "{err:?}");
    assert!(
        chain(&err).contains("not issued for the host connected to"),
        "{}",
        chain(&err)
    );
    // verify-ca and require check the chain only, as libpq's verify-ca.
    for mode in ["verify-ca", "require"] {
        let application = format!("tls-{mode}");
        let backend = PgBackend::connect(
            &url_by_address(
                "postgres",
                &format!("sslmode={mode}&application_name={application}"),
            ),
            trusting_the_ca(),
        )
        .await
        .unwrap_or_else(|e| panic!("{mode}: {}", chain(&e)));
        assert_eq!(connections(&application).await, (2, 0), "{mode}");
        drop(backend);
    }
}

#[tokio::test]
async fn a_certificate_from_an_untrusted_ca_is_refused_even_with_require() {
    let other = TestCa::generate("another CA").expect("a CA");
    for mode in ["verify-full", "require"] {
        let err = PgBackend::connect(
            &url("postgres", &format!("sslmode={mode}")),
            PgOptions::new().with_ca_cert(other.cert_pem()),
        )
        .await
        .expect_err("not signed by that CA");
        assert!(
            matches!(err, Error::Misconfigured { .. }),
            "{mode}: {err:?}"
        );
        assert!(
            chain(&err).contains("not signed by a trusted CA"),
            "{mode}: {}",
            chain(&err)
        );
    }
}

#[tokio::test]
async fn plain_text_to_a_server_that_takes_only_tls_says_so() {
    for query in ["application_name=plain", "sslmode=prefer"] {
        let err = PgBackend::connect(&url("app", query), PgOptions::new())
            .await
            .expect_err("hostnossl: reject");
        assert!(matches!(err, Error::Misconfigured { .. }), "{err:?}");
        assert!(
            chain(&err).contains("over TLS only"),
            "{query}: {}",
            chain(&err)
        );
    }
}

#[tokio::test]
async fn a_role_that_needs_a_client_certificate_connects_with_one() {
    let f = fixture();
    let err = PgBackend::connect(&url("app", "sslmode=verify-full"), trusting_the_ca())
        .await
        .expect_err("no client certificate");
    assert!(matches!(err, Error::Auth { .. }), "{}", chain(&err));

    let client = f
        .tls
        .client_cert()
        .expect("the fixture's client certificate");
    let backend = PgBackend::connect(
        &url(
            "app",
            "sslmode=verify-full&application_name=tls-client-cert",
        ),
        trusting_the_ca().with_client_cert(client.cert_pem(), client.key_pem()),
    )
    .await
    .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(connections("tls-client-cert").await, (2, 0));
    lock_round_trip(Arc::new(backend), "tls/client-cert").await;

    // libpq's file parameters, as a URL copied from psql's would have them.
    let dir = pem_files("url");
    let d = dir.display();
    let backend = PgBackend::connect(
        &url(
            "app",
            &format!(
                "sslmode=verify-full&sslrootcert={d}/ca.pem&sslcert={d}/app.pem\
                 &sslkey={d}/app-key.pem"
            ),
        ),
        PgOptions::new(),
    )
    .await
    .unwrap_or_else(|e| panic!("{}", chain(&e)));
    lock_round_trip(Arc::new(backend), "tls/libpq-files").await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn connect_takes_the_tls_options_for_postgres() {
    let f = fixture();
    let client = f.tls.client_cert().expect("client certificate");
    let backend = baton::connect_with(
        &url("app", "sslmode=verify-full"),
        ConnectOptions::new()
            .with_ca_cert(f.tls.ca_pem())
            .with_client_cert(client.cert_pem(), client.key_pem()),
    )
    .await
    .unwrap_or_else(|e| panic!("{}", chain(&e)));
    lock_round_trip(backend, "tls/connect").await;
    let Err(err) = baton::connect_with(
        &url("app", "sslmode=verify-full"),
        ConnectOptions::new().with_tls_server_name(HOST),
    )
    .await
    else {
        panic!("a TLS server name is etcd's");
    };
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
}

#[cfg(feature = "cli")]
#[test]
fn the_cli_takes_cacert_cert_and_key_for_postgres() {
    let dir = pem_files("cli");
    let run = |endpoint: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_baton"))
            .args(["--endpoints", endpoint, "--cacert"])
            .arg(dir.join("ca.pem"))
            .arg("--cert")
            .arg(dir.join("app.pem"))
            .arg("--key")
            .arg(dir.join("app-key.pem"))
            .args(["lock", "tls/cli", "--", "true"])
            .output()
            .expect("run baton")
    };
    let out = run(&url("app", "sslmode=verify-full"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Without sslmode the flags have nothing to act on: a usage error, nothing sent.
    let out = run(&url("app", "application_name=cli"));
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs TLS: sslmode=verify-full"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
