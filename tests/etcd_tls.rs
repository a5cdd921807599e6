//! etcd over TLS: a real etcd serving TLS with certificates made at test time
//! (`baton::testing::EtcdTls`), one node shared by the tests of this binary, each test with its
//! own key prefix. What works (a lock, an election, a session kept alive, all with a client
//! certificate) and what is refused: each refused certificate gives a typed error that says
//! what is wrong, within 2 s (not after the connect timeout), and never a panic.

#[path = "support/connecting.rs"]
mod connecting;

use std::error::Error as _;
use std::time::{Duration, Instant, SystemTime};

use baton::testing::{EtcdNode, EtcdTls, TestCa};
use baton::{
    Election, Error, EtcdBackend, EtcdOptions, LeaderEvent, Mutex, Session, SessionOptions,
};
use connecting::chain;
use futures::StreamExt;

/// Every certificate refusal must be reported within this, far below the connect timeout.
const QUICKLY: Duration = Duration::from_secs(2);

/// The connect timeout of the refusal tests: a classification that retried would take this
/// long, and fail the [`QUICKLY`] check.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

fn node() -> &'static EtcdNode {
    EtcdNode::shared_tls()
}

fn name(test: &str) -> String {
    format!("etcd-tls-{}/{test}", std::process::id())
}

fn ca() -> &'static TestCa {
    node()
        .tls()
        .and_then(|tls| tls.ca())
        .expect("the shared TLS node's certificates were generated")
}

fn ca_pem() -> String {
    node().tls().expect("a TLS node").ca_pem().to_owned()
}

/// Connects with `options` (and the refusal tests' connect timeout); the error, and how long
/// it took to come.
async fn refused(options: EtcdOptions) -> (Error, Duration) {
    let started = Instant::now();
    let result = EtcdBackend::connect(
        node().endpoints(),
        options.with_connect_timeout(CONNECT_TIMEOUT),
    )
    .await;
    let took = started.elapsed();
    match result {
        Ok(_) => panic!("connected, but the certificate should have been refused"),
        Err(e) => (e, took),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_taken_and_released_over_tls_with_a_client_certificate() {
    assert!(node().endpoints()[0].starts_with("https://"));
    let backend = node().backend().await.expect("connect over TLS");
    let (a, b) = (
        Session::new(backend.clone()).await.expect("session a"),
        Session::new(backend.clone()).await.expect("session b"),
    );
    let lock = name("lock");
    let guard = Mutex::new(&a, &lock).unwrap().lock().await.expect("lock");
    let first = guard.fencing_token();
    assert!(matches!(
        Mutex::new(&b, &lock).unwrap().try_lock().await,
        Err(Error::Locked { .. })
    ));
    guard.release().await.expect("unlock");
    let next = Mutex::new(&b, &lock)
        .unwrap()
        .try_lock()
        .await
        .expect("free again after the unlock");
    assert!(next.fencing_token() > first);
    next.release().await.expect("unlock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_is_won_and_observed_over_tls() {
    let backend = node().backend().await.expect("connect over TLS");
    let session = Session::new(backend).await.expect("session");
    let election = Election::new(&session, name("election")).unwrap();
    let mut events = election.observe();
    assert!(matches!(events.next().await, Some(Ok(LeaderEvent::Vacant))));
    let leadership = election.campaign("node-a").await.expect("campaign");
    match events.next().await {
        Some(Ok(LeaderEvent::Elected(leader))) => {
            assert_eq!(leader.value(), b"node-a");
            assert_eq!(leader.fencing_token(), leadership.fencing_token());
        }
        other => panic!("expected the new leader, got {other:?}"),
    }
    leadership.release().await.expect("resign");
    assert!(matches!(events.next().await, Some(Ok(LeaderEvent::Vacant))));
}

/// A node started without client-certificate authentication takes clients that present
/// none: the fixture's switch works. (Its own node: the shared one requires certificates.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_client_cert_auth_takes_clients_without_certificates() {
    let tls = EtcdTls::generate().unwrap().with_client_cert_auth(false);
    let etcd = EtcdNode::start_tls(&tls)
        .await
        .expect("start etcd with TLS");
    let backend = EtcdBackend::connect(
        etcd.endpoints(),
        EtcdOptions::new().with_ca_cert(tls.ca_pem()),
    )
    .await
    .expect("a client without a certificate is let in");
    let session = Session::new(backend).await.expect("session");
    let guard = Mutex::new(&session, name("no-client-cert"))
        .unwrap()
        .lock()
        .await
        .expect("lock");
    guard.release().await.expect("unlock");
}

/// A 2 s session lives through 3 TTLs (about nine renewals, one every TTL/3), each renewal a
/// keep-alive over the TLS connection; the server still has the lease afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_kept_alive_over_tls_past_several_renewals() {
    let backend = node().backend().await.expect("connect over TLS");
    let ttl = Duration::from_secs(2);
    let session = Session::with_options(backend.clone(), SessionOptions::new().with_ttl(ttl))
        .await
        .expect("session");
    let sent = backend.requests_sent();
    // Real time on a real server: the lease would expire on the server after one TTL without
    // a renewal.
    tokio::time::sleep(ttl * 3).await;
    assert!(!session.is_lost(), "the session was lost");
    let renewals = backend.requests_sent() - sent;
    assert!(
        renewals >= 5,
        "only {renewals} requests in 3 TTLs: the session was not renewed every TTL/3"
    );
    let left = baton::Backend::lease_ttl(&backend, session.lease_id())
        .await
        .expect("read the lease");
    assert!(left.is_some(), "the server no longer has the lease");
    session.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_an_unknown_ca_is_refused_quickly() {
    let other = TestCa::generate("another CA").unwrap();
    let client = ca().client_cert("baton-test").unwrap();
    let (e, took) = refused(
        EtcdOptions::new()
            .with_ca_cert(other.cert_pem())
            .with_client_cert(client.cert_pem(), client.key_pem()),
    )
    .await;
    let message = chain(&e);
    assert!(matches!(e, Error::Misconfigured { .. }), "{message}");
    assert!(took < QUICKLY, "took {took:?}: {message}");
    assert!(
        message.contains("server's TLS certificate is not signed by a trusted CA")
            && message.contains("UnknownIssuer"),
        "{message}"
    );
}

/// Without a CA, the system's roots are trusted (as etcdctl does), and a private CA's server
/// is refused with a hint to give its CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_ca_the_system_roots_are_used_and_a_private_ca_is_refused_quickly() {
    let client = ca().client_cert("baton-test").unwrap();
    let (e, took) =
        refused(EtcdOptions::new().with_client_cert(client.cert_pem(), client.key_pem())).await;
    let message = chain(&e);
    match &e {
        // A system without roots is told so before anything is sent.
        Error::InvalidArgument(m) => assert!(m.contains("system's roots"), "{message}"),
        other => {
            assert!(matches!(other, Error::Misconfigured { .. }), "{message}");
            assert!(
                message.contains("not signed by a trusted CA") && message.contains("with_ca_cert"),
                "{message}"
            );
        }
    }
    assert!(took < QUICKLY, "took {took:?}: {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_client_certificate_is_refused_quickly() {
    let (e, took) = refused(EtcdOptions::new().with_ca_cert(ca_pem())).await;
    let message = chain(&e);
    assert!(matches!(e, Error::Auth { .. }), "{message}");
    assert!(took < QUICKLY, "took {took:?}: {message}");
    assert!(
        message.contains("the server refused the client certificate"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_client_certificate_is_refused_quickly() {
    let now = SystemTime::now();
    let day = Duration::from_secs(24 * 60 * 60);
    let expired = ca()
        .client_cert_valid("baton-test", now - 30 * day, now - day)
        .unwrap();
    let (e, took) = refused(
        EtcdOptions::new()
            .with_ca_cert(ca_pem())
            .with_client_cert(expired.cert_pem(), expired.key_pem()),
    )
    .await;
    let message = chain(&e);
    assert!(matches!(e, Error::Auth { .. }), "{message}");
    assert!(took < QUICKLY, "took {took:?}: {message}");
    assert!(
        message.contains("the server refused the client certificate")
            && message.contains("expired"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_from_another_ca_is_refused_quickly() {
    let stranger = TestCa::generate("another CA")
        .unwrap()
        .client_cert("baton-test")
        .unwrap();
    let (e, took) = refused(
        EtcdOptions::new()
            .with_ca_cert(ca_pem())
            .with_client_cert(stranger.cert_pem(), stranger.key_pem()),
    )
    .await;
    let message = chain(&e);
    assert!(matches!(e, Error::Auth { .. }), "{message}");
    assert!(took < QUICKLY, "took {took:?}: {message}");
}

/// The server's certificate names 127.0.0.1 and localhost: another name is refused, and the
/// name it has is accepted for an endpoint given by address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_name_is_checked_and_can_be_set() {
    let client = ca().client_cert("baton-test").unwrap();
    let options = || {
        EtcdOptions::new()
            .with_ca_cert(ca_pem())
            .with_client_cert(client.cert_pem(), client.key_pem())
    };
    let (e, took) = refused(options().with_tls_server_name("etcd.example.com")).await;
    let message = chain(&e);
    assert!(matches!(e, Error::Misconfigured { .. }), "{message}");
    assert!(took < QUICKLY, "took {took:?}: {message}");
    assert!(
        message.contains("not issued for the host")
            && message.contains("certificate not valid for name \"etcd.example.com\""),
        "{message}"
    );
    EtcdBackend::connect(
        node().endpoints(),
        options().with_tls_server_name("localhost"),
    )
    .await
    .expect("the name in the certificate is accepted");
}

/// A port that does not answer in TLS (here a plain HTTP server) is reported as such, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_does_not_speak_tls_is_reported_quickly() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut socket, _)) = listener.accept().await {
            let _ = socket
                .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    let started = Instant::now();
    let result = EtcdBackend::connect(
        &[format!("https://127.0.0.1:{port}")],
        EtcdOptions::new()
            .with_ca_cert(ca_pem())
            .with_connect_timeout(CONNECT_TIMEOUT),
    )
    .await;
    let took = started.elapsed();
    server.abort();
    let e = result.expect_err("no TLS server there");
    let message = chain(&e);
    assert!(matches!(e, Error::Misconfigured { .. }), "{message}");
    assert!(took < QUICKLY, "took {took:?}: {message}");
    assert!(message.contains("does not answer in TLS"), "{message}");
}

/// A TLS port reached in plain text closes the connection without a word; baton finds out
/// that it speaks TLS and says so, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_server_reached_in_plain_text_is_reported_quickly() {
    let plain = node().endpoints()[0].replace("https://", "http://");
    let started = Instant::now();
    let result = EtcdBackend::connect(
        &[plain],
        EtcdOptions::new().with_connect_timeout(CONNECT_TIMEOUT),
    )
    .await;
    let took = started.elapsed();
    let e = result.expect_err("plain text to a TLS port");
    let message = chain(&e);
    assert!(matches!(e, Error::Misconfigured { .. }), "{message}");
    assert!(took < QUICKLY, "took {took:?}: {message}");
    assert!(
        message.contains("answers in TLS: reach it at https://"),
        "{message}"
    );
}

/// `https://` to a real etcd that serves plain text: it reads the TLS handshake as the start of
/// an HTTP request and answers nothing, so the handshake alone would wait out the connect
/// timeout. baton asks in plain text and reports it at once, typed as a configuration that
/// does not match. (Before: `Error::Connect` after the whole connect timeout, "deadline has
/// elapsed".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_without_tls_reached_at_https_is_reported_quickly() {
    let plain = EtcdNode::shared().endpoints()[0].clone();
    let https = format!("https://{}", plain.trim_start_matches("http://"));
    let started = Instant::now();
    let result = EtcdBackend::connect(
        &[https],
        EtcdOptions::new()
            .with_ca_cert(ca_pem())
            .with_connect_timeout(CONNECT_TIMEOUT),
    )
    .await;
    let took = started.elapsed();
    let e = result.expect_err("TLS to a plain-text etcd");
    let message = chain(&e);
    assert!(matches!(e, Error::Misconfigured { .. }), "{message}");
    assert!(took < QUICKLY, "took {took:?}: {message}");
    assert!(message.contains("does not answer in TLS"), "{message}");
}

/// Refused on every endpoint, or a host that does not exist: `Error::Connect` at once (not
/// after the connect timeout), saying which in words, with the operating system's error of
/// kind `ConnectionRefused` in its causes. One endpoint that may answer keeps the connect
/// trying. (Before: after the whole connect timeout, with "deadline has elapsed".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_and_unknown_hosts_fail_the_connect_at_once() {
    let connect = |endpoints: Vec<String>| async move {
        let started = Instant::now();
        let result = EtcdBackend::connect(
            &endpoints,
            EtcdOptions::new().with_connect_timeout(CONNECT_TIMEOUT),
        )
        .await;
        (result.expect_err("nothing answers"), started.elapsed())
    };
    let (e, took) = connect(vec!["127.0.0.1:1".into()]).await;
    let message = chain(&e);
    assert!(matches!(e, Error::Connect { .. }), "{message}");
    assert!(took < QUICKLY, "took {took:?}: {message}");
    assert_eq!(
        e.to_string(),
        "could not connect to 127.0.0.1:1",
        "{message}"
    );
    assert_eq!(
        e.source().map(ToString::to_string).as_deref(),
        Some("connection refused")
    );
    let mut cause = e.source();
    let mut refused = false;
    while let Some(c) = cause {
        refused |= c
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused);
        cause = c.source();
    }
    assert!(refused, "{message}");

    let (e, took) = connect(vec!["no-such-host.invalid:2379".into()]).await;
    let message = chain(&e);
    assert!(matches!(e, Error::Connect { .. }), "{message}");
    assert!(took < QUICKLY, "took {took:?}: {message}");
    assert!(message.contains("no such host"), "{message}");

    // A black hole beside the refused endpoint: not final, so the timeout decides.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = listener.local_addr().unwrap().to_string();
    let started = Instant::now();
    let e = EtcdBackend::connect(
        &["127.0.0.1:1".to_owned(), silent],
        EtcdOptions::new().with_connect_timeout(Duration::from_secs(1)),
    )
    .await
    .expect_err("nothing answers");
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(
        chain(&e).contains("no endpoint answered within the connect timeout"),
        "{}",
        chain(&e)
    );
    drop(listener);
}

/// Mistakes in the options are refused before anything is sent.
#[tokio::test]
async fn bad_tls_options_are_refused_before_connecting() {
    let client = ca().client_cert("baton-test").unwrap();
    let other = ca().client_cert("other").unwrap();
    let https = ["https://127.0.0.1:1"];
    let cases: Vec<(&str, &[&str], EtcdOptions, &str)> = vec![
        (
            "a CA over http://",
            &["http://127.0.0.1:1"],
            EtcdOptions::new().with_ca_cert(ca_pem()),
            "need https://",
        ),
        (
            "http:// and https:// mixed",
            &["http://127.0.0.1:1", "https://127.0.0.1:2"],
            EtcdOptions::new(),
            "mix http:// and https://",
        ),
        (
            "a CA that is no PEM",
            &https,
            EtcdOptions::new().with_ca_cert("not a certificate"),
            "CA certificate",
        ),
        (
            "a key that is no PEM",
            &https,
            EtcdOptions::new().with_client_cert(client.cert_pem(), "no key"),
            "client key",
        ),
        (
            "another certificate's key",
            &https,
            EtcdOptions::new().with_client_cert(client.cert_pem(), other.key_pem()),
            "not the client certificate's key",
        ),
        (
            "a server name that is no name",
            &https,
            EtcdOptions::new().with_tls_server_name("not a name!"),
            "server name",
        ),
    ];
    for (case, endpoints, options, says) in cases {
        let started = Instant::now();
        let result = EtcdBackend::connect(endpoints, options).await;
        assert!(started.elapsed() < QUICKLY, "{case}: not refused at once");
        match result {
            Err(e @ Error::InvalidArgument(_)) => {
                assert!(e.to_string().contains(says), "{case}: {e}");
            }
            other => panic!("{case}: expected InvalidArgument, got {other:?}"),
        }
    }
}

/// The `baton` command with etcdctl's flags: `--cacert`, `--cert`, `--key`.
#[cfg(feature = "cli")]
mod cli {
    use std::path::{Path, PathBuf};
    use std::process::{Command, Output};
    use std::time::{Duration, Instant, SystemTime};

    use baton::testing::{CertPem, TestCa};

    use super::{QUICKLY, ca, ca_pem, name, node};

    /// A directory of PEM files for one test, removed when dropped.
    struct Files(PathBuf);

    impl Files {
        fn new(test: &str) -> Files {
            let dir = std::env::temp_dir().join(format!("baton-tls-{}-{test}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Files(dir)
        }

        fn write(&self, file: &str, contents: &str) -> PathBuf {
            let path = self.0.join(file);
            std::fs::write(&path, contents).unwrap();
            path
        }

        /// The CA and a client certificate, as etcdctl's flags take them, in files named
        /// after `case`.
        fn flags(&self, case: &str, ca_pem: &str, client: Option<&CertPem>) -> Vec<String> {
            let file = |what: &str, pem: &str| path(&self.write(&format!("{case}-{what}"), pem));
            let mut flags = vec!["--cacert".to_owned(), file("ca.pem", ca_pem)];
            if let Some(client) = client {
                flags.extend([
                    "--cert".to_owned(),
                    file("client.pem", client.cert_pem()),
                    "--key".to_owned(),
                    file("client-key.pem", client.key_pem()),
                ]);
            }
            flags
        }
    }

    impl Drop for Files {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn path(p: &Path) -> String {
        p.to_string_lossy().into_owned()
    }

    /// Runs `baton` with `args` against the TLS node; its output, and how long it ran.
    fn baton(args: &[String]) -> (Output, Duration) {
        let started = Instant::now();
        let output = Command::new(env!("CARGO_BIN_EXE_baton"))
            .arg("--endpoints")
            .arg(node().endpoints().join(","))
            .args(["--connect-timeout", "5"])
            .args(args)
            .env_remove("BATON_CACERT")
            .env_remove("BATON_CERT")
            .env_remove("BATON_KEY")
            .output()
            .expect("run baton");
        (output, started.elapsed())
    }

    fn stderr(output: &Output) -> String {
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    #[test]
    fn a_lock_is_taken_with_etcdctl_s_tls_flags() {
        let files = Files::new("lock");
        let client = ca().client_cert("baton-test").unwrap();
        let mut args = files.flags("ok", &ca_pem(), Some(&client));
        args.extend(["lock".to_owned(), "--try".to_owned(), name("cli-lock")]);
        args.extend(["--".to_owned(), "true".to_owned()]);
        let (output, _) = baton(&args);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }

    /// Exit 78 (the configuration does not match the server) for a server certificate baton
    /// does not trust, 77 for a client certificate the server refuses (missing or expired),
    /// each at once, with one line that says which and names the flags to change, not the
    /// library's calls. (Before: 69 for the CA, "with_ca_cert, --cacert" in the line.)
    #[test]
    fn refused_certificates_exit_at_once_with_their_codes() {
        let files = Files::new("refused");
        let client = ca().client_cert("baton-test").unwrap();
        let now = SystemTime::now();
        let expired = ca()
            .client_cert_valid(
                "baton-test",
                now - Duration::from_secs(7200),
                now - Duration::from_secs(3600),
            )
            .unwrap();
        let other_ca = TestCa::generate("another CA").unwrap().cert_pem();
        let cases = [
            (
                "an unknown CA",
                files.flags("unknown-ca", &other_ca, Some(&client)),
                78,
                "not signed by a trusted CA (give the CA that signed it: --cacert)",
            ),
            (
                "no client certificate",
                files.flags("no-cert", &ca_pem(), None),
                77,
                "refused the client certificate: none was given (--cert and --key)",
            ),
            (
                "an expired client certificate",
                files.flags("expired", &ca_pem(), Some(&expired)),
                77,
                "refused the client certificate",
            ),
        ];
        for (case, mut args, code, says) in cases {
            args.extend(["status".to_owned(), name("cli-refused")]);
            let (output, took) = baton(&args);
            let err = stderr(&output);
            assert_eq!(output.status.code(), Some(code), "{case}: {err}");
            assert!(took < QUICKLY, "{case}: took {took:?}: {err}");
            assert!(
                err.contains(says) && err.lines().count() == 1 && !err.contains("with_"),
                "{case}: {err}"
            );
        }
    }

    /// Bad flags exit 64 before anything is sent (the endpoint is a closed port).
    #[test]
    fn bad_tls_flags_are_refused_before_connecting() {
        let files = Files::new("flags");
        let ca = files.write("ca.pem", &ca_pem());
        let garbage = files.write("garbage.pem", "not a certificate");
        let missing = files.0.join("missing.pem");
        let etcd = "127.0.0.1:1";
        let cases: [(&str, &str, Vec<String>, &str); 6] = [
            (
                "--cert alone",
                etcd,
                vec!["--cert".into(), path(&ca)],
                "--cert needs --key",
            ),
            (
                "--key alone",
                etcd,
                vec!["--key".into(), path(&ca)],
                "--key needs --cert",
            ),
            (
                "a missing file",
                etcd,
                vec!["--cacert".into(), path(&missing)],
                "cannot read it",
            ),
            (
                "a CA that is no PEM",
                etcd,
                vec!["--cacert".into(), path(&garbage)],
                "the CA certificate (--cacert) holds no PEM certificate",
            ),
            (
                "TLS over http://",
                "http://127.0.0.1:1",
                vec!["--cacert".into(), path(&ca)],
                "need https://",
            ),
            (
                "TLS over redis://",
                "redis://127.0.0.1:1",
                vec!["--cacert".into(), path(&ca)],
                "need a rediss:// (or rediss+sentinel://) URL",
            ),
        ];
        for (case, endpoints, mut args, says) in cases {
            args.extend(["status".to_owned(), "x".to_owned()]);
            let output = Command::new(env!("CARGO_BIN_EXE_baton"))
                .args(["--endpoints", endpoints])
                .args(&args)
                .env_remove("BATON_CACERT")
                .env_remove("BATON_CERT")
                .env_remove("BATON_KEY")
                .output()
                .expect("run baton");
            let err = stderr(&output);
            assert_eq!(output.status.code(), Some(64), "{case}: {err}");
            assert!(
                err.contains(says) && !err.contains("with_"),
                "{case}: {err}"
            );
        }
    }
}
