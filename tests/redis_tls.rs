//! Redis over TLS: real `redis-server` processes serving TLS only (`--port 0 --tls-port`), with
//! certificates made at test time (`baton::testing::RedisTls`), each test on its own server.
//! What works (a lock taken and released with a CA, with a client certificate, from the CLI)
//! and what is refused: each refusal is a typed error that says what is wrong, in one line,
//! within 2 s (not after the connect timeout).

#[path = "support/connecting.rs"]
mod connecting;

use std::time::{Duration, Instant};

use baton::testing::{RedisNode, RedisTls, TestCa};
use baton::{ConnectOptions, Error, RedisBackend, RedisOptions};
use connecting::{chain, lock_round_trip, refused};

/// Every refusal must be reported within this, far below the connect timeout.
const QUICKLY: Duration = Duration::from_secs(2);

/// The connect timeout of the refusal tests: a refusal that waited for it would fail the
/// [`QUICKLY`] check.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

fn name(test: &str) -> String {
    format!("redis-tls-{}/{test}", std::process::id())
}

/// A server with `tls`'s certificates.
async fn start(tls: &RedisTls) -> RedisNode {
    RedisNode::start_tls(tls).await.expect("start a TLS redis")
}

/// Options for a client of a server started for this test (no restart grace: no holder
/// predates it), trusting `ca_pem`.
fn options(ca_pem: &str) -> ConnectOptions {
    ConnectOptions::new()
        .with_ca_cert(ca_pem)
        .with_restart_grace(Duration::ZERO)
        .with_connect_timeout(CONNECT_TIMEOUT)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_taken_and_released_over_tls_with_a_ca() {
    let tls = RedisTls::generate().unwrap().with_client_cert_auth(false);
    let node = start(&tls).await;
    assert!(
        node.url().starts_with("rediss://127.0.0.1:"),
        "{}",
        node.url()
    );
    let backend = baton::connect_with(&node.url(), options(tls.ca_pem()))
        .await
        .expect("connect over TLS with the CA");
    lock_round_trip(backend, &name("ca")).await;
    // The library's own options say the same.
    let backend = RedisBackend::connect(
        &node.url(),
        RedisOptions::new()
            .with_ca_cert(tls.ca_pem())
            .with_restart_grace(Duration::ZERO),
    )
    .await
    .expect("RedisBackend::connect over TLS");
    lock_round_trip(std::sync::Arc::new(backend), &name("ca-options")).await;
    // And the fixture's own clients.
    node.command::<()>("PING", &[])
        .await
        .expect("PING over TLS");
    lock_round_trip(
        std::sync::Arc::new(node.backend().await.unwrap()),
        &name("fixture"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_presented_and_their_absence_is_refused() {
    let tls = RedisTls::generate().unwrap();
    assert!(tls.client_cert_auth());
    let node = start(&tls).await;
    let client = tls
        .client_cert()
        .expect("generated with a client certificate");
    let backend = baton::connect_with(
        &node.url(),
        options(tls.ca_pem()).with_client_cert(client.cert_pem(), client.key_pem()),
    )
    .await
    .expect("connect with a client certificate");
    lock_round_trip(backend, &name("mtls")).await;

    // None given; one from a CA the server does not trust.
    let stranger = TestCa::generate("stranger CA").unwrap();
    let foreign = stranger.client_cert("intruder").unwrap();
    let cases = [
        ("no client certificate", options(tls.ca_pem())),
        (
            "a client certificate of another CA",
            options(tls.ca_pem()).with_client_cert(foreign.cert_pem(), foreign.key_pem()),
        ),
    ];
    for (case, options) in cases {
        let (e, took) = refused(&node.url(), options).await;
        assert!(took < QUICKLY, "{case}: refused after {took:?}");
        assert!(matches!(e, Error::Auth { .. }), "{case}: {e:?}");
        let text = chain(&e);
        assert!(
            text.contains("the server refused the client certificate"),
            "{case}: {text}"
        );
        assert!(!text.contains('\n'), "{case}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_we_do_not_trust_is_refused() {
    let tls = RedisTls::generate().unwrap().with_client_cert_auth(false);
    let node = start(&tls).await;
    let stranger = TestCa::generate("stranger CA").unwrap();
    let (e, took) = refused(&node.url(), options(&stranger.cert_pem())).await;
    assert!(took < QUICKLY, "refused after {took:?}");
    assert!(matches!(e, Error::Misconfigured { .. }), "{e:?}");
    let text = chain(&e);
    assert!(
        text.contains("not signed by a trusted CA"),
        "wrong CA: {text}"
    );

    // Signed by the CA given, but for another host.
    let ca = tls.ca().expect("generated");
    let elsewhere = RedisTls::new(
        tls.ca_pem(),
        ca.server_cert(&["redis.example.com"]).unwrap(),
    );
    let node = start(&elsewhere).await;
    let (e, took) = refused(&node.url(), options(tls.ca_pem())).await;
    assert!(took < QUICKLY, "refused after {took:?}");
    assert!(matches!(e, Error::Misconfigured { .. }), "{e:?}");
    let text = chain(&e);
    assert!(
        text.contains("not issued for the host"),
        "wrong host name: {text}"
    );
}

/// A `rediss://` URL that names a server speaking plain text is refused at once, whatever the
/// random bytes of the TLS greeting (a plain-text Redis waits for a newline that a greeting
/// may not hold): several attempts, each within [`QUICKLY`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_to_a_plain_text_server_is_refused_at_once() {
    let plain = RedisNode::start().await.expect("a plain-text redis");
    let url = plain.url().replace("redis://", "rediss://");
    let ca = TestCa::generate("some CA").unwrap();
    for attempt in 0..6 {
        let (e, took) = refused(&url, options(&ca.cert_pem())).await;
        assert!(took < QUICKLY, "attempt {attempt}: refused after {took:?}");
        assert!(matches!(e, Error::Misconfigured { .. }), "{e:?}");
        let text = chain(&e);
        assert!(
            text.contains("does not answer in TLS"),
            "attempt {attempt}: {text}"
        );
    }
    // And the other way round: redis:// to a server that serves TLS only.
    let tls = RedisTls::generate().unwrap().with_client_cert_auth(false);
    let node = start(&tls).await;
    let url = node.url().replace("rediss://", "redis://");
    let (e, took) = refused(
        &url,
        ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT),
    )
    .await;
    assert!(took < QUICKLY, "refused after {took:?}");
    assert!(matches!(e, Error::Misconfigured { .. }), "{e:?}");
    let text = chain(&e);
    assert!(text.contains("answers in TLS"), "{text}");
}

/// TLS options with a plain-text URL, and PEMs that are not certificates, are refused before
/// anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_options_are_refused_before_connecting() {
    let ca = TestCa::generate("some CA").unwrap();
    let client = ca.client_cert("app").unwrap();
    let other = ca.client_cert("other").unwrap();
    // Nobody listens on port 1: a refusal that tried to connect would say so instead.
    let cases = [
        (
            "redis://127.0.0.1:1",
            ConnectOptions::new().with_ca_cert(ca.cert_pem()),
            "rediss://",
        ),
        (
            "rediss://127.0.0.1:1",
            ConnectOptions::new().with_ca_cert("not a certificate"),
            "holds no PEM certificate",
        ),
        (
            "rediss://127.0.0.1:1",
            ConnectOptions::new().with_client_cert(client.cert_pem(), other.key_pem()),
            "not the client certificate's key",
        ),
        (
            "rediss://127.0.0.1:1/#insecure",
            ConnectOptions::new().with_ca_cert(ca.cert_pem()),
            "#insecure",
        ),
    ];
    for (url, options, says) in cases {
        let started = Instant::now();
        let result = baton::connect_with(url, options).await;
        assert!(started.elapsed() < QUICKLY, "{url}: not refused at once");
        match result {
            Err(e @ Error::InvalidArgument(_)) => {
                assert!(e.to_string().contains(says), "{url}: {e}");
            }
            other => panic!("{url}: expected InvalidArgument, got {:?}", other.err()),
        }
    }
}

/// The `baton` command: `--endpoints rediss://...` with `--cacert`, `--cert` and `--key`.
#[cfg(feature = "cli")]
mod cli {
    use std::path::PathBuf;
    use std::process::{Command, Output};

    use baton::testing::RedisTls;

    use super::{name, start};

    /// A directory of PEM files for one test, removed when dropped.
    struct Files(PathBuf);

    impl Files {
        fn new(test: &str) -> Files {
            let dir =
                std::env::temp_dir().join(format!("baton-redis-tls-{}-{test}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Files(dir)
        }

        fn write(&self, file: &str, contents: &str) -> String {
            let path = self.0.join(file);
            std::fs::write(&path, contents).unwrap();
            path.to_string_lossy().into_owned()
        }
    }

    impl Drop for Files {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn baton(url: &str, args: &[String]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_baton"))
            .args([
                "--endpoints",
                url,
                "--connect-timeout",
                "5",
                "--restart-grace",
                "0",
            ])
            .args(args)
            .env_remove("BATON_CACERT")
            .env_remove("BATON_CERT")
            .env_remove("BATON_KEY")
            .env_remove("BATON_ENDPOINTS")
            .output()
            .expect("run baton")
    }

    fn stderr(output: &Output) -> String {
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn baton_lock_over_rediss_with_cacert_cert_and_key() {
        let files = Files::new("lock");
        let tls = RedisTls::generate().unwrap();
        let node = start(&tls).await;
        let client = tls.client_cert().unwrap();
        let ca = files.write("ca.pem", tls.ca_pem());
        let cert = files.write("client.pem", client.cert_pem());
        let key = files.write("client-key.pem", client.key_pem());
        let lock = name("cli");

        let with_client = [
            "--cacert".to_owned(),
            ca.clone(),
            "--cert".to_owned(),
            cert,
            "--key".to_owned(),
            key,
            "lock".to_owned(),
            lock.clone(),
            "--".to_owned(),
            "true".to_owned(),
        ];
        let url = node.url();
        let output = tokio::task::spawn_blocking(move || baton(&url, &with_client))
            .await
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));

        // The server wants a client certificate: --cacert alone is refused as
        // authentication (77), in one line.
        let ca_only = [
            "--cacert".to_owned(),
            ca,
            "lock".to_owned(),
            lock,
            "--".to_owned(),
            "true".to_owned(),
        ];
        let url = node.url();
        let output = tokio::task::spawn_blocking(move || baton(&url, &ca_only))
            .await
            .unwrap();
        assert_eq!(output.status.code(), Some(77), "{}", stderr(&output));
        let text = stderr(&output);
        assert!(text.contains("refused the client certificate"), "{text}");
        assert_eq!(text.trim_end().lines().count(), 1, "{text}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn baton_lock_over_rediss_with_cacert() {
        let files = Files::new("lock-ca");
        let tls = RedisTls::generate().unwrap().with_client_cert_auth(false);
        let node = start(&tls).await;
        let args = [
            "--cacert".to_owned(),
            files.write("ca.pem", tls.ca_pem()),
            "lock".to_owned(),
            name("cli-ca"),
            "--".to_owned(),
            "true".to_owned(),
        ];
        let url = node.url();
        let output = tokio::task::spawn_blocking(move || baton(&url, &args))
            .await
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
}
