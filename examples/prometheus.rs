//! baton's metrics exported for Prometheus with `metrics-exporter-prometheus`: a few workers
//! contend for a lock on the in-memory backend (no server needed), then the exposition text
//! Prometheus would scrape is printed. With `--listen`, it is also served over HTTP until
//! Ctrl-C, on a loopback address only.
//!
//! Run: `cargo run --example prometheus`
//!      `cargo run --example prometheus -- --listen 127.0.0.1:9000`, then
//!      `curl http://127.0.0.1:9000/metrics`
//!
//! See `docs/metrics.md` for what each metric means and what to alert on.

use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use baton::backend::Backend;
use baton::metrics::{KEEPALIVE_SECONDS, LOCK_HOLD_SECONDS, LOCK_WAIT_SECONDS};
use baton::{Election, MemoryBackend, Mutex, Session, SessionOptions};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

type BoxResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// Buckets for lock waits and holds, from a millisecond to five minutes. Without buckets the
/// exporter renders histograms as summaries, which Prometheus cannot aggregate across
/// instances.
const LOCK_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// Buckets for lease renewals: they should stay far below a third of the session TTL.
const KEEPALIVE_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

#[tokio::main(flavor = "current_thread")]
async fn main() -> BoxResult<()> {
    let listen = listen_address()?;
    let builder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(LOCK_WAIT_SECONDS.into()), LOCK_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(LOCK_HOLD_SECONDS.into()), LOCK_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(KEEPALIVE_SECONDS.into()), KEEPALIVE_BUCKETS)?;
    let handle = match listen {
        // Only a recorder: this program renders the text itself.
        None => builder.install_recorder()?,
        // The recorder and an HTTP endpoint that serves the same text to a scraper.
        Some(addr) => {
            let (recorder, exporter) = builder.with_http_listener(addr).build()?;
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder)?;
            tokio::spawn(exporter);
            handle
        }
    };
    // Units and help texts, shown as `# HELP` lines.
    baton::metrics::describe();
    // The lock names here are few and fixed. With names made of ids, bound the `lock` label
    // before creating any lock:
    // baton::metrics::set_lock_label(baton::metrics::LockLabel::Map(|name| ...));

    workload().await?;

    let text = handle.render();
    print!("{text}");
    // The run's own check: the operations above emit every metric but the keep-alive
    // failures (no renewal failed).
    for name in baton::metrics::NAMES {
        if name != baton::metrics::KEEPALIVE_FAILURES_TOTAL && !text.contains(name) {
            return Err(format!("{name} is missing from the exposition").into());
        }
    }
    if let Some(addr) = listen {
        eprintln!("serving http://{addr}/metrics until Ctrl-C");
        tokio::signal::ctrl_c().await?;
    }
    Ok(())
}

/// `--listen ADDR`, a loopback address, or nothing.
fn listen_address() -> BoxResult<Option<SocketAddr>> {
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next()) {
        (None, _) => Ok(None),
        (Some("--listen"), Some(addr)) => {
            let addr: SocketAddr = addr.parse()?;
            if !addr.ip().is_loopback() {
                return Err(format!("{addr}: listen on a loopback address (127.0.0.1)").into());
            }
            Ok(Some(addr))
        }
        _ => Err("usage: prometheus [--listen 127.0.0.1:9000]".into()),
    }
}

/// Contention, a try that finds the lock held, a timeout, renewals, a leadership handed over,
/// and sessions closed.
async fn workload() -> BoxResult<()> {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    // A short TTL, so that leases are renewed (every third of it) while this runs.
    let options = SessionOptions::new().with_ttl(Duration::from_millis(600));
    let session = || Session::with_options(Arc::clone(&backend), options.clone());

    let mut workers = Vec::new();
    for _ in 0..3 {
        let session = session().await?;
        workers.push(tokio::spawn(async move {
            let mutex = Mutex::new(&session, "reports/daily")?;
            for _ in 0..4 {
                let guard = mutex.lock().await?;
                tokio::time::sleep(Duration::from_millis(20)).await;
                guard.release().await?;
            }
            session.close().await
        }));
    }
    for worker in workers {
        worker.await??;
    }

    let (a, b) = (session().await?, session().await?);
    let held = Mutex::new(&a, "reports/daily")?.lock().await?;
    let other = Mutex::new(&b, "reports/daily")?;
    if other.try_lock().await.is_ok() {
        return Err("try_lock took a held lock".into());
    }
    if tokio::time::timeout(Duration::from_millis(50), other.lock())
        .await
        .is_ok()
    {
        return Err("lock() returned while the lock was held".into());
    }
    // Long enough for a renewal (a third of the TTL).
    tokio::time::sleep(Duration::from_millis(250)).await;
    held.release().await?;

    let leader = Election::new(&a, "services/scheduler")?
        .campaign("node-a")
        .await?;
    let election = Election::new(&b, "services/scheduler")?;
    let (resigned, next) = tokio::join!(
        async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            leader.release().await
        },
        election.campaign("node-b"),
    );
    resigned?;
    next?.release().await?;
    a.close().await?;
    b.close().await?;
    Ok(())
}
