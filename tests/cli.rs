//! The `baton` binary against a real etcd (the shared fixture), and side by side with the
//! real `etcdctl`.

#[path = "support/mod.rs"]
mod support;

use std::process::Stdio;
use std::time::Duration;

use baton::testing::EtcdNode;
use baton::{Backend, EtcdBackend, Mutex, Session};
use support::{eventually, within};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

fn name(test: &str) -> String {
    format!("cli-{}/{test}", std::process::id())
}

fn endpoints() -> String {
    EtcdNode::shared().endpoints().join(",")
}

async fn backend() -> EtcdBackend {
    EtcdNode::shared().backend().await.unwrap()
}

fn baton(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_baton"));
    cmd.env("BATON_ENDPOINTS", endpoints())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

struct Running {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Running {
    fn spawn(args: &[&str]) -> Running {
        let mut child = baton(args).spawn().expect("spawn baton");
        let stdout = child.stdout.take().unwrap();
        Running {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    async fn line(&mut self) -> String {
        within(
            "a line of output",
            Duration::from_secs(20),
            self.lines.next_line(),
        )
        .await
        .unwrap()
        .expect("output ends early")
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().unwrap().to_string();
        assert!(
            std::process::Command::new("kill")
                .args([sig, &pid])
                .status()
                .unwrap()
                .success()
        );
    }

    async fn exit_code(mut self) -> (i32, String) {
        let status = within("baton exits", Duration::from_secs(30), self.child.wait())
            .await
            .unwrap();
        let mut stderr = String::new();
        use tokio::io::AsyncReadExt;
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .await
            .unwrap();
        (status.code().unwrap_or(-1), stderr)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_runs_the_command_with_its_environment_and_exit_code() {
    let name = name("exec");
    let out = baton(&[
        "lock",
        &name,
        "--",
        "sh",
        "-c",
        "echo \"$BATON_LOCK_KEY $BATON_FENCING_TOKEN $ETCD_LOCK_KEY $ETCD_LOCK_REV\"; exit 7",
    ])
    .output()
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(7), "the command's exit code");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let mut lines = stdout.lines();
    let key = lines.next().unwrap();
    let token = lines.next().unwrap();
    assert!(key.starts_with(&format!("{name}/")), "{stdout}");
    assert_eq!(
        lines.next().unwrap(),
        format!("{key} {token} {key} {token}")
    );
    assert!(
        backend().await.entries(&name).await.unwrap().is_empty(),
        "released"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runs_never_overlap() {
    let name = name("overlap");
    let dir = std::env::temp_dir().join(format!("baton-overlap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let marker = dir.join("held");
    // mkdir is atomic: it fails if another holder is inside.
    let script = format!(
        "mkdir {m} || exit 99; echo \"$BATON_FENCING_TOKEN\" >> {log}; sleep 0.2; rmdir {m}",
        m = marker.display(),
        log = dir.join("tokens").display()
    );
    let runs: Vec<_> = (0..4)
        .map(|_| baton(&["lock", &name, "--", "sh", "-c", &script]).output())
        .collect();
    for out in futures::future::join_all(runs).await {
        let out = out.unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let tokens: Vec<u64> = std::fs::read_to_string(dir.join("tokens"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(tokens.len(), 4);
    support::assert_strictly_increasing(&tokens);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_passes_the_lock_on_after_its_ttl() {
    let name = name("killed");
    let mut holder = Running::spawn(&["lock", &name, "--ttl", "2"]);
    let key = holder.line().await;
    assert!(key.starts_with(&format!("{name}/")));
    holder.signal("-KILL");
    let started = std::time::Instant::now();
    let out = baton(&["lock", &name, "--timeout", "15", "--", "true"])
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_terminates_the_command() {
    let name = name("lost");
    let dir = std::env::temp_dir().join(format!("baton-lost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let flag = dir.join("terminated");
    let script = format!(
        "trap 'touch {f}; exit 42' TERM; echo started; while :; do sleep 0.1; done",
        f = flag.display()
    );
    let mut holder = Running::spawn(&["lock", &name, "--ttl", "3", "--", "sh", "-c", &script]);
    holder.line().await; // key
    holder.line().await; // token
    assert_eq!(holder.line().await, "started");
    let backend = backend().await;
    let entry = backend.entries(&name).await.unwrap().remove(0);
    backend.revoke_lease(entry.lease().unwrap()).await.unwrap();
    let (code, stderr) = holder.exit_code().await;
    assert_eq!(code, 79, "{stderr}");
    assert!(stderr.contains("lost"), "{stderr}");
    assert!(flag.exists(), "the command got SIGTERM");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_release_the_lock() {
    let name = name("signal");
    let mut holder = Running::spawn(&["lock", &name]);
    holder.line().await;
    holder.signal("-TERM");
    let (code, stderr) = holder.exit_code().await;
    assert_eq!(code, 0, "{stderr}");
    assert!(backend().await.entries(&name).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_has_its_own_exit_code_and_leaves_nothing() {
    let name = name("timeout");
    let backend = backend().await;
    let s = Session::new(backend.clone()).await.unwrap();
    let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    let out = baton(&["lock", &name, "--timeout", "0.5", "--", "true"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(75));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert_eq!(backend.entries(&name).await.unwrap().len(), 1);
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn errors_are_one_line_with_distinct_codes() {
    let unreachable = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args([
            "--endpoints",
            "127.0.0.1:1",
            "--connect-timeout",
            "0.5",
            "status",
            "x",
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(unreachable.status.code(), Some(69));
    assert_eq!(
        String::from_utf8_lossy(&unreachable.stderr).lines().count(),
        1
    );

    let bad = baton(&["lock", "x", "--ttl", "0"]).output().await.unwrap();
    assert_eq!(bad.status.code(), Some(64));
    let missing = baton(&["elect", "x"]).output().await.unwrap();
    assert_eq!(missing.status.code(), Some(64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_holder_then_waiters_in_order() {
    let name = name("status");
    let backend = backend().await;
    let mut sessions = Vec::new();
    let holder_session = Session::new(backend.clone()).await.unwrap();
    let guard = Mutex::new(&holder_session, &name)
        .unwrap()
        .with_owner_info("holder-app")
        .lock()
        .await
        .unwrap();
    for i in 1..=2 {
        let s = Session::new(backend.clone()).await.unwrap();
        let m = Mutex::new(&s, &name)
            .unwrap()
            .with_owner_info(format!("waiter-app-{i}"));
        sessions.push(s);
        tokio::spawn(async move { m.lock().await.map(drop) });
        eventually("queued", || async {
            backend.entries(&name).await.unwrap().len() == i + 1
        })
        .await;
    }
    let out = baton(&["status", &name, "--json"]).output().await.unwrap();
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(lines[0].contains("\"role\":\"holder\"") && lines[0].contains(guard.key()));
    assert!(lines[0].contains("\"owner\":\"holder-app\""));
    assert!(lines[1].contains("waiter-app-1") && lines[2].contains("waiter-app-2"));
    let table = baton(&["status", &name]).output().await.unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert_eq!(table.lines().count(), 4, "header and three rows:\n{table}");
    guard.unlock().await.unwrap();
}

/// Names that nest share a queue (as with etcdctl): `status` shows the keys of a nested name
/// in the parent's queue, marked, so that an operator sees why the parent waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_keys_of_nested_names() {
    let name = name("status-nested");
    let backend = backend().await;
    let s = Session::new(backend.clone()).await.unwrap();
    let inner = Mutex::new(&s, format!("{name}/sub"))
        .unwrap()
        .lock()
        .await
        .unwrap();
    let json = baton(&["status", &name, "--json"]).output().await.unwrap();
    let json = String::from_utf8(json.stdout).unwrap();
    assert!(
        json.contains(&format!("\"name\":\"{name}/sub\"")) && json.contains(inner.key()),
        "{json}"
    );
    let table = baton(&["status", &name]).output().await.unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.contains("holder*"), "{table}");
    assert!(
        table.contains(&format!("nested name {name}/sub")),
        "{table}"
    );
    inner.unlock().await.unwrap();
}

fn have_etcdctl() -> bool {
    let found = std::process::Command::new("etcdctl")
        .arg("version")
        .env("ETCDCTL_API", "3")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(std::env::var("CI").is_err(), "CI must have etcdctl");
        eprintln!("etcdctl not installed; skipping");
    }
    found
}

fn etcdctl(args: &[&str]) -> Command {
    let mut cmd = Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(endpoints())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baton_lock_and_etcdctl_lock_exclude_each_other() {
    if !have_etcdctl() {
        return;
    }
    let name = name("etcdctl-lock");
    let mut theirs = etcdctl(&["lock", &name]).spawn().unwrap();
    let mut out = BufReader::new(theirs.stdout.take().unwrap()).lines();
    within("etcdctl holds", Duration::from_secs(10), out.next_line())
        .await
        .unwrap();
    // status shows the etcdctl holder (its key has no owner description).
    let status = baton(&["status", &name, "--json"]).output().await.unwrap();
    let status = String::from_utf8(status.stdout).unwrap();
    assert_eq!(status.lines().count(), 1, "{status}");
    assert!(
        status.contains("\"role\":\"holder\"") && status.contains("\"owner\":\"\""),
        "{status}"
    );
    let blocked = baton(&["lock", &name, "--timeout", "0.5", "--", "true"])
        .output()
        .await
        .unwrap();
    assert_eq!(
        blocked.status.code(),
        Some(75),
        "baton waits while etcdctl holds"
    );
    let pid = theirs.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    theirs.wait().await.unwrap();
    let ok = baton(&["lock", &name, "--timeout", "10", "--", "true"])
        .output()
        .await
        .unwrap();
    assert_eq!(ok.status.code(), Some(0));

    // And the other way round: etcdctl waits while baton holds.
    let mut ours = Running::spawn(&["lock", &name]);
    ours.line().await;
    let mut theirs = etcdctl(&["lock", &name, "echo", "etcdctl-ran"])
        .spawn()
        .unwrap();
    let backend = backend().await;
    eventually("etcdctl queued", || async {
        backend.entries(&name).await.unwrap().len() == 2
    })
    .await;
    assert!(theirs.try_wait().unwrap().is_none(), "etcdctl waits");
    ours.signal("-TERM");
    assert_eq!(ours.exit_code().await.0, 0);
    let status = within("etcdctl runs", Duration::from_secs(10), theirs.wait())
        .await
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_listen_reports_etcdctl_campaigns() {
    if !have_etcdctl() {
        return;
    }
    let name = name("etcdctl-elect");
    let mut listener = Running::spawn(&["elect", "--listen", &name]);
    assert_eq!(listener.line().await, "(no leader)");
    let mut candidate = etcdctl(&["elect", &name, "from-etcdctl"]).spawn().unwrap();
    assert_eq!(listener.line().await, "from-etcdctl");
    // Signal etcdctl only once it has printed its leadership: signalled earlier (between
    // its campaign and that print) it exits without resigning, and its key would stay
    // until its 60 s lease expires.
    let mut out = BufReader::new(candidate.stdout.take().unwrap()).lines();
    let printed = within(
        "etcdctl reports leadership",
        Duration::from_secs(10),
        out.next_line(),
    )
    .await
    .unwrap();
    assert!(printed.is_some_and(|l| l.starts_with(&format!("{name}/"))));
    let pid = candidate.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    candidate.wait().await.unwrap();
    assert_eq!(listener.line().await, "(no leader)");

    // baton elect leads and is observed the same way.
    let mut leader = Running::spawn(&["elect", &name, "from-baton"]);
    assert!(leader.line().await.starts_with(&format!("{name}/")));
    assert_eq!(listener.line().await, "from-baton");
    leader.signal("-TERM");
    assert_eq!(leader.exit_code().await.0, 0);
    assert_eq!(listener.line().await, "(no leader)");
    listener.signal("-TERM");
    assert_eq!(listener.exit_code().await.0, 0);
}
