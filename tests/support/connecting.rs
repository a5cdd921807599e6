//! What the TLS and SASL tests of every backend share: an error's whole chain as the CLI
//! prints it, a connect that must be refused (and how long the refusal took), and a lock
//! taken twice over a secured connection.
#![allow(dead_code, unreachable_pub)]

use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use baton::{Backend, ConnectOptions, Error, Mutex, Session};
use tokio::time::Instant;

/// The error and its causes, as the CLI prints them.
pub fn chain(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Connects to `url` with `options`; the error, and how long it took to come.
pub async fn refused(url: &str, options: ConnectOptions) -> (Error, Duration) {
    let started = Instant::now();
    let result = baton::connect_with(url, options).await;
    let took = started.elapsed();
    match result {
        Ok(_) => panic!("connected to {url}, but it should have been refused"),
        Err(e) => (e, took),
    }
}

/// Takes and releases `lock` twice through `backend`, on one session: the second token is
/// above the first.
pub async fn lock_round_trip(backend: Arc<dyn Backend>, lock: &str) {
    let session = Session::new(backend).await.expect("a session");
    let guard = Mutex::new(&session, lock)
        .unwrap()
        .lock()
        .await
        .expect("lock");
    let first = guard.fencing_token();
    guard.release().await.expect("unlock");
    let guard = Mutex::new(&session, lock)
        .unwrap()
        .lock()
        .await
        .expect("lock again");
    assert!(guard.fencing_token() > first);
    guard.release().await.expect("unlock again");
    session.close().await.expect("close");
}
