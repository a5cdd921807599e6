//! ZooKeeper over TLS (`zks://`): one server with a TLS client port only (`secureClientPort`,
//! Netty, PEM stores) that requires client certificates, shared by the tests, with
//! certificates made at test time (`baton::testing::ZkTls`); and the plain shared server for
//! the scheme mix-ups. What works (a lock taken and released with the CA and a client
//! certificate, from the library and the CLI) and what is refused: each refusal is a typed
//! error that says what is wrong, within 2 s (not after the connect timeout, nor the session
//! timeout).

#[path = "support/connecting.rs"]
mod connecting;

use std::time::Duration;

use baton::testing::{TestCa, ZkNode};
use baton::{ConnectOptions, Error, ZkBackend, ZkOptions};
use connecting::{chain, lock_round_trip, refused};

/// Every refusal must be reported within this, far below the connect timeout.
const QUICKLY: Duration = Duration::from_secs(2);

/// The connect timeout of the refusal tests: a refusal that waited for it would fail the
/// [`QUICKLY`] check.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(8);

fn name(test: &str) -> String {
    format!("zk-tls-{}/{test}", std::process::id())
}

/// Options trusting the shared TLS server's CA and presenting its client certificate.
fn options(node: &ZkNode) -> ConnectOptions {
    let tls = node.tls().expect("a TLS node");
    let client = tls.client_cert().expect("a client certificate");
    ConnectOptions::new()
        .with_ca_cert(tls.ca_pem())
        .with_client_cert(client.cert_pem(), client.key_pem())
        .with_connect_timeout(CONNECT_TIMEOUT)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_taken_and_released_over_mutual_tls() {
    let node = ZkNode::shared_tls();
    assert!(node.url().starts_with("zks://127.0.0.1:"), "{}", node.url());
    let backend = baton::connect_with(&node.url(), options(node))
        .await
        .expect("connect over TLS with the CA and a client certificate");
    lock_round_trip(backend, &name("connect-with")).await;
    // The library's own options say the same.
    let tls = node.tls().unwrap();
    let backend = ZkBackend::connect(&node.url(), tls.zk_options(ZkOptions::new()))
        .await
        .expect("ZkBackend::connect over TLS");
    lock_round_trip(std::sync::Arc::new(backend), &name("zk-options")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_another_ca_is_refused_quickly() {
    let node = ZkNode::shared_tls();
    let tls = node.tls().unwrap();
    let other = TestCa::generate("not the server's CA").unwrap();
    let client = tls.client_cert().unwrap();
    let options = ConnectOptions::new()
        .with_ca_cert(other.cert_pem())
        .with_client_cert(client.cert_pem(), client.key_pem())
        .with_connect_timeout(CONNECT_TIMEOUT);
    let (e, took) = refused(&node.url(), options).await;
    assert!(took < QUICKLY, "refused after {took:?}: {}", chain(&e));
    assert!(matches!(e, Error::Misconfigured { .. }), "{e:?}");
    assert!(
        chain(&e).contains("not signed by a trusted CA"),
        "{}",
        chain(&e)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_foreign_client_certificate_is_refused_quickly_as_auth() {
    let node = ZkNode::shared_tls();
    let tls = node.tls().unwrap();
    // No client certificate, where the server requires one.
    let options = ConnectOptions::new()
        .with_ca_cert(tls.ca_pem())
        .with_connect_timeout(CONNECT_TIMEOUT);
    let (e, took) = refused(&node.url(), options).await;
    assert!(took < QUICKLY, "refused after {took:?}: {}", chain(&e));
    assert!(matches!(e, Error::Auth { .. }), "{}", chain(&e));
    assert!(
        chain(&e).contains("refused the client certificate"),
        "{}",
        chain(&e)
    );
    // A client certificate of a CA the server does not trust.
    let other = TestCa::generate("a CA the server does not trust").unwrap();
    let foreign = other.client_cert("intruder").unwrap();
    let options = ConnectOptions::new()
        .with_ca_cert(tls.ca_pem())
        .with_client_cert(foreign.cert_pem(), foreign.key_pem())
        .with_connect_timeout(CONNECT_TIMEOUT);
    let (e, took) = refused(&node.url(), options).await;
    assert!(took < QUICKLY, "refused after {took:?}: {}", chain(&e));
    assert!(matches!(e, Error::Auth { .. }), "{}", chain(&e));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wrong_scheme_for_the_port_is_refused_quickly() {
    // zks:// to a plain server.
    let plain = ZkNode::shared();
    let node = ZkNode::shared_tls();
    let url = format!("zks://{}", plain.connect_string());
    let (e, took) = refused(&url, options(node)).await;
    assert!(took < QUICKLY, "refused after {took:?}: {}", chain(&e));
    assert!(matches!(e, Error::Misconfigured { .. }), "{}", chain(&e));
    assert!(
        chain(&e).contains("does not answer in TLS"),
        "{}",
        chain(&e)
    );
    // zk:// to the TLS-only port.
    let url = format!("zk://{}", node.connect_string());
    let options = ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT);
    let (e, took) = refused(&url, options).await;
    assert!(took < QUICKLY, "refused after {took:?}: {}", chain(&e));
    assert!(matches!(e, Error::Misconfigured { .. }), "{}", chain(&e));
    assert!(chain(&e).contains("zks://"), "{}", chain(&e));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_options_and_the_scheme_must_agree() {
    let node = ZkNode::shared_tls();
    let tls = node.tls().unwrap();
    // A CA with zk://: refused before anything is sent.
    let Err(e) = baton::connect_with(
        "zk://127.0.0.1:1",
        ConnectOptions::new().with_ca_cert(tls.ca_pem()),
    )
    .await
    else {
        panic!("a CA with zk:// was taken");
    };
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("zks://")),
        "{e:?}"
    );
    // zks:// without a CA.
    let Err(e) = baton::connect_with("zks://127.0.0.1:1", ConnectOptions::new()).await else {
        panic!("zks:// without a CA was taken");
    };
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("CA")),
        "{e:?}"
    );
}

/// The `baton` command: `--endpoints zks://...` with `--cacert`, `--cert` and `--key`, and
/// the exit codes of its refusals.
#[cfg(feature = "cli")]
mod cli {
    use std::path::PathBuf;
    use std::process::{Command, Output};
    use std::time::{Duration, Instant};

    use baton::testing::{TestCa, ZkNode};

    use super::name;

    /// A directory of PEM files for one test, removed when dropped.
    struct Files(PathBuf);

    impl Files {
        fn new(test: &str) -> Files {
            let dir =
                std::env::temp_dir().join(format!("baton-zk-tls-{}-{test}", std::process::id()));
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

    /// Runs `baton` with a connect timeout of 8 s; its output and how long it took.
    async fn baton(url: String, args: Vec<String>) -> (Output, Duration) {
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let output = Command::new(env!("CARGO_BIN_EXE_baton"))
                .args(["--endpoints", &url, "--connect-timeout", "8"])
                .args(&args)
                .env_remove("BATON_CACERT")
                .env_remove("BATON_CERT")
                .env_remove("BATON_KEY")
                .env_remove("BATON_ENDPOINTS")
                .output()
                .expect("run baton");
            (output, started.elapsed())
        })
        .await
        .unwrap()
    }

    fn stderr(output: &Output) -> String {
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    fn lock_args(tls: &[String], lock: &str) -> Vec<String> {
        let command = ["lock", lock, "--", "true"].map(str::to_owned);
        tls.iter().cloned().chain(command).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn baton_lock_over_zks_and_its_refusals_exit_codes() {
        let node = ZkNode::shared_tls();
        let tls = node.tls().unwrap();
        let files = Files::new("lock");
        let client = tls.client_cert().unwrap();
        let ca = files.write("ca.pem", tls.ca_pem());
        let cert = files.write("client.pem", client.cert_pem());
        let key = files.write("client-key.pem", client.key_pem());
        let lock = name("cli");
        let flags = |ca: &str| ["--cacert", ca, "--cert", &cert, "--key", &key].map(str::to_owned);

        let (output, _) = baton(node.url(), lock_args(&flags(&ca), &lock)).await;
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));

        // --cacert alone, where the server requires a client certificate: authentication
        // (77), in one line, quickly.
        let ca_only = ["--cacert".to_owned(), ca.clone()];
        let (output, took) = baton(node.url(), lock_args(&ca_only, &lock)).await;
        assert_eq!(output.status.code(), Some(77), "{}", stderr(&output));
        let text = stderr(&output);
        assert!(text.contains("refused the client certificate"), "{text}");
        assert_eq!(text.trim_end().lines().count(), 1, "{text}");
        assert!(took < Duration::from_secs(4), "took {took:?}: {text}");

        // A CA that did not sign the server's certificate: configuration (78), quickly.
        let other = TestCa::generate("not the server's CA").unwrap();
        let wrong = files.write("other-ca.pem", &other.cert_pem());
        let (output, took) = baton(node.url(), lock_args(&flags(&wrong), &lock)).await;
        assert_eq!(output.status.code(), Some(78), "{}", stderr(&output));
        let text = stderr(&output);
        assert!(text.contains("not signed by a trusted CA"), "{text}");
        assert!(took < Duration::from_secs(4), "took {took:?}: {text}");

        // TLS flags with zk://, and zks:// without --cacert: usage (64), nothing sent.
        let plain = format!("zk://{}", node.connect_string());
        let (output, _) = baton(plain, lock_args(&flags(&ca), &lock)).await;
        assert_eq!(output.status.code(), Some(64), "{}", stderr(&output));
        assert!(stderr(&output).contains("zks://"), "{}", stderr(&output));
        let (output, _) = baton(node.url(), lock_args(&[], &lock)).await;
        assert_eq!(output.status.code(), Some(64), "{}", stderr(&output));
        assert!(stderr(&output).contains("--cacert"), "{}", stderr(&output));
    }
}
