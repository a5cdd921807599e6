//! ZooKeeper with SASL DIGEST-MD5: one server that requires it (`enforce.auth.enabled`,
//! users `baton` and `other` in its JAAS file), shared by the tests
//! (`baton::testing::ZkNode::shared_sasl`). What works (a lock taken and released as
//! `baton`, with the credentials in the URL or in `ZkOptions`, from the library and the CLI),
//! what the nodes baton creates allow (everything to `baton`, reading to anyone: `other`
//! cannot delete or overwrite them), and what is refused: a wrong password, an unknown user
//! and no credentials at all are a typed error ([`Error::Auth`]) within 2 s, and the
//! password is printed nowhere. Over TLS, on a server of its own, a lock is also held across
//! a restart of the server with its data: the client logs in again on its new connection.

#[path = "support/connecting.rs"]
mod connecting;

use std::time::Duration;

use baton::testing::{ZkNode, ZkTls};
use baton::{ConnectOptions, Error, Mutex, Session, SessionOptions, ZkBackend, ZkOptions};
use connecting::{chain, lock_round_trip, refused};
use zookeeper_client::{Acl, Client, Permission, SaslOptions, TlsOptions};

/// Every refusal must be reported within this, far below the connect timeout.
const QUICKLY: Duration = Duration::from_secs(2);

/// The connect timeout of the refusal tests: a refusal that waited for it would fail the
/// [`QUICKLY`] check.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(8);

fn name(test: &str) -> String {
    format!("zk-sasl-{}/{test}", std::process::id())
}

/// `zk://user:password@127.0.0.1:<port>`.
fn url(node: &ZkNode, user: &str, password: &str) -> String {
    format!("zk://{user}:{password}@{}", node.connect_string())
}

/// A zookeeper-client connector that authenticates as `user`.
fn as_user(user: &str, password: &str) -> zookeeper_client::Connector {
    Client::connector().with_sasl(SaslOptions::digest_md5(
        user.to_owned(),
        password.to_owned(),
    ))
}

/// A zookeeper-client session of our own, authenticated as `user`: another client of the
/// same ensemble, as an operator's tool would be.
async fn raw(node: &ZkNode, user: &str, password: &str) -> Client {
    as_user(user, password)
        .connect(&node.connect_string())
        .await
        .expect("a raw SASL session")
}

/// [`raw`] over TLS, trusting `tls`'s CA.
async fn raw_tls(node: &ZkNode, tls: &ZkTls, user: &str, password: &str) -> Client {
    let trust = TlsOptions::new()
        .with_pem_ca(tls.ca_pem())
        .expect("the fixture's CA");
    as_user(user, password)
        .with_tls(trust)
        .secure_connect(&node.connect_string())
        .await
        .expect("a raw SASL session over TLS")
}

fn other_user(node: &ZkNode) -> (String, String) {
    let sasl = node.sasl().expect("a SASL node");
    let (user, password) = sasl.users().nth(1).expect("a second user");
    (user.to_owned(), password.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_taken_and_released_authenticated() {
    let node = ZkNode::shared_sasl();
    let sasl = node.sasl().unwrap();
    let backend = baton::connect_with(
        &url(node, sasl.user(), sasl.password()),
        ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT),
    )
    .await
    .expect("connect with the credentials in the URL");
    lock_round_trip(backend, &name("url")).await;
    // The library's own options say the same; the password shows nowhere in its Debug.
    let options = ZkOptions::new().with_sasl_digest(sasl.user(), sasl.password());
    assert!(!format!("{options:?}").contains(sasl.password()));
    let backend = ZkBackend::connect(&node.url(), options)
        .await
        .expect("ZkBackend::connect with with_sasl_digest");
    assert!(!format!("{backend:?}").contains(sasl.password()));
    lock_round_trip(std::sync::Arc::new(backend), &name("zk-options")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nodes_baton_creates_are_the_users_and_another_identity_cannot_delete_them() {
    let node = ZkNode::shared_sasl();
    let sasl = node.sasl().unwrap();
    let session = Session::new(node.backend().await.unwrap()).await.unwrap();
    let lock = name("acl");
    let guard = Mutex::new(&session, &lock)
        .unwrap()
        .lock()
        .await
        .expect("lock");
    let entry = format!("/{}", guard.key());
    let queue = format!("/{lock}");
    let top = format!("/{}", lock.split('/').next().unwrap());
    let owner = [
        Acl::new(
            Permission::ALL,
            zookeeper_client::AuthId::new("sasl", sasl.user()),
        ),
        Acl::new(Permission::READ, zookeeper_client::AuthId::anyone()),
    ];
    let (other, other_password) = other_user(node);
    let intruder = raw(node, &other, &other_password).await;
    // The entry, the queue node and its parent (both created by baton), and the epoch
    // marker: the user's, read by anyone.
    for path in [&entry, &queue, &top, "/_baton-epoch"] {
        let (acl, _) = intruder
            .get_acl(path)
            .await
            .unwrap_or_else(|e| panic!("getACL {path}: {e}"));
        assert_eq!(acl, owner, "the ACL of {path}");
        intruder
            .get_data(path)
            .await
            .unwrap_or_else(|e| panic!("{other} reads {path}: {e}"));
    }
    // Another identity can neither delete the entry (the queue node's ACL decides) nor
    // overwrite it, nor create an entry of its own in the queue.
    assert_eq!(
        intruder.delete(&entry, None).await,
        Err(zookeeper_client::Error::NoAuth),
        "{other} deletes {entry}"
    );
    assert_eq!(
        intruder.set_data(&entry, b"mine", None).await.map(|_| ()),
        Err(zookeeper_client::Error::NoAuth),
        "{other} overwrites {entry}"
    );
    assert!(guard.is_owner().await.expect("is_owner"), "still the owner");
    // A baton client authenticated as that other user gets no lease: the node its session's
    // fence goes under is the user's. A permission error, not a failed authentication.
    let options = ZkOptions::new().with_sasl_digest(&other, &other_password);
    let theirs = ZkBackend::connect(&node.url(), options).await.unwrap();
    let Err(e) = Session::new(std::sync::Arc::new(theirs)).await else {
        panic!("another identity was granted a lease");
    };
    assert!(matches!(e, Error::Permission { .. }), "{}", chain(&e));
    guard.release().await.expect("unlock");
    // Released: the entry is gone (the owner could delete it).
    assert_eq!(intruder.check_stat(&entry).await.unwrap(), None);
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_an_unknown_user_or_none_is_refused_quickly_as_auth() {
    let node = ZkNode::shared_sasl();
    let sasl = node.sasl().unwrap();
    let options = || ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT);
    for (user, password) in [(sasl.user(), "not-the-password"), ("nobody", "whatever")] {
        let (e, took) = refused(&url(node, user, password), options()).await;
        assert!(took < QUICKLY, "refused after {took:?}: {}", chain(&e));
        assert!(matches!(e, Error::Auth { .. }), "{}", chain(&e));
        assert!(
            chain(&e).contains("refused the SASL DIGEST-MD5 credentials"),
            "{}",
            chain(&e)
        );
        assert!(!chain(&e).contains(password), "{}", chain(&e));
        assert!(!format!("{e:?}").contains(password), "{e:?}");
    }
    // No credentials, where the server requires SASL.
    let (e, took) = refused(&node.url(), options()).await;
    assert!(took < QUICKLY, "refused after {took:?}: {}", chain(&e));
    assert!(matches!(e, Error::Auth { .. }), "{}", chain(&e));
    assert!(chain(&e).contains("requires SASL"), "{}", chain(&e));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_given_twice_or_malformed_are_refused_before_connecting() {
    let node = ZkNode::shared_sasl();
    let sasl = node.sasl().unwrap();
    let twice = ZkOptions::new().with_sasl_digest(sasl.user(), sasl.password());
    let e = ZkBackend::connect(&url(node, sasl.user(), sasl.password()), twice)
        .await
        .expect_err("credentials twice");
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("twice")),
        "{e:?}"
    );
    let e = ZkBackend::connect(
        &format!("zk://{}@{}", sasl.user(), node.connect_string()),
        ZkOptions::new(),
    )
    .await
    .expect_err("a user without a password");
    assert!(matches!(&e, Error::InvalidArgument(_)), "{e:?}");
}

/// The `baton` command with `zk://user:password@...`, and the exit code of a refusal.
#[cfg(feature = "cli")]
mod cli {
    use std::process::{Command, Output};
    use std::time::{Duration, Instant};

    use baton::testing::ZkNode;

    use super::{name, url};

    /// Runs `baton` with a connect timeout of 8 s; its output and how long it took.
    async fn baton(url: String, args: Vec<String>) -> (Output, Duration) {
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let output = Command::new(env!("CARGO_BIN_EXE_baton"))
                .args(["--endpoints", &url, "--connect-timeout", "8"])
                .args(&args)
                .env_remove("BATON_ENDPOINTS")
                .env_remove("BATON_USER")
                .env_remove("BATON_PASSWORD")
                .output()
                .expect("run baton");
            (output, started.elapsed())
        })
        .await
        .unwrap()
    }

    fn lock_args(lock: &str) -> Vec<String> {
        ["lock", lock, "--", "true"].map(str::to_owned).to_vec()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn baton_lock_with_credentials_in_the_url_and_a_wrong_password_exits_77() {
        let node = ZkNode::shared_sasl();
        let sasl = node.sasl().unwrap();
        let lock = name("cli");
        let (output, _) = baton(url(node, sasl.user(), sasl.password()), lock_args(&lock)).await;
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(0), "{stderr}");

        // A wrong password: authentication (77), in one line, quickly, the password unsaid.
        let wrong = "wrong-password-123";
        let (output, took) = baton(url(node, sasl.user(), wrong), lock_args(&lock)).await;
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(77), "{stderr}");
        assert!(stderr.contains("refused the SASL"), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(!stderr.contains(wrong), "{stderr}");
        assert!(took < Duration::from_secs(4), "took {took:?}: {stderr}");

        // No credentials on a server that requires them: authentication (77) too.
        let (output, took) = baton(node.url(), lock_args(&lock)).await;
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(77), "{stderr}");
        assert!(stderr.contains("requires SASL"), "{stderr}");
        assert!(took < Duration::from_secs(4), "took {took:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_for_a_server_without_sasl_are_refused_quickly_as_misconfigured() {
    // The plain shared server has no SASL provider: it answers the exchange and
    // authenticates nobody.
    let node = ZkNode::shared();
    let options = ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT);
    let (e, took) = refused(&url(node, "baton", "a-password"), options).await;
    assert!(took < QUICKLY, "refused after {took:?}: {}", chain(&e));
    assert!(matches!(e, Error::Misconfigured { .. }), "{}", chain(&e));
    assert!(
        chain(&e).contains("did not authenticate the session with SASL"),
        "{}",
        chain(&e)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_over_tls_takes_a_lock_and_refuses_a_wrong_password() {
    // A server of its own: TLS only (no client certificate asked for) and SASL required.
    let tls = ZkTls::generate().unwrap().with_client_cert_auth(false);
    let sasl = baton::testing::ZkSasl::new();
    let node = ZkNode::start_tls_sasl(&tls, &sasl).await.unwrap();
    let secure =
        |password: &str| format!("zks://{}:{password}@{}", sasl.user(), node.connect_string());
    let options = || {
        ConnectOptions::new()
            .with_ca_cert(tls.ca_pem())
            .with_connect_timeout(CONNECT_TIMEOUT)
    };
    let backend = baton::connect_with(&secure(sasl.password()), options())
        .await
        .expect("connect over TLS with SASL");
    lock_round_trip(backend.clone(), &name("zks")).await;
    let (e, took) = refused(&secure("not-the-password"), options()).await;
    assert!(took < QUICKLY, "refused after {took:?}: {}", chain(&e));
    assert!(matches!(e, Error::Auth { .. }), "{}", chain(&e));

    // The server killed and started again with its data, a lock held across it. ZooKeeper
    // keeps no authentication across connections: the client must log in again on the new
    // one, or the release (a delete the queue node's ACL allows the user only) is refused
    // and the lock stays held until the session expires.
    let session = Session::with_options(
        backend,
        SessionOptions::new().with_ttl(Duration::from_secs(30)),
    )
    .await
    .expect("a session");
    let lock = name("zks-restart");
    let guard = Mutex::new(&session, &lock)
        .unwrap()
        .lock()
        .await
        .expect("lock");
    let before = guard.fencing_token();
    node.restart().await.unwrap();
    guard
        .release()
        .await
        .expect("released after the restart: authenticated again");
    let again = Mutex::new(&session, &lock)
        .unwrap()
        .lock()
        .await
        .expect("locked again after the restart");
    assert!(again.fencing_token() > before);
    // Its entry is the user's, as before the restart.
    let (other, other_password) = other_user(&node);
    let intruder = raw_tls(&node, &tls, &other, &other_password).await;
    assert_eq!(
        intruder.delete(&format!("/{}", again.key()), None).await,
        Err(zookeeper_client::Error::NoAuth),
        "another identity deletes the entry made after the restart"
    );
    again.release().await.expect("unlock");
    session.close().await.expect("close");
}
