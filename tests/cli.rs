//! The `baton` binary against a real etcd (the shared fixture), and side by side with the
//! real `etcdctl`.

#[path = "support/mod.rs"]
mod support;

use std::process::Stdio;
use std::time::Duration;

use baton::testing::{EtcdNode, PgNode, RedisNode, ZkNode};
use baton::{
    Backend, EtcdBackend, EtcdLayout, EtcdOptions, Mutex, Session, ZkBackend, ZkLayout, ZkOptions,
};
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

/// Asserts that a finished `baton` exited with `code`, showing its stderr if not.
fn assert_exit(out: &std::process::Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Asserts that less than `bound` passed since `since`.
fn assert_within(since: std::time::Instant, bound: Duration) {
    assert!(since.elapsed() < bound, "{:?}", since.elapsed());
}

/// Returns once `name`'s queue holds exactly one entry: a `baton` started meanwhile holds it.
async fn until_held(backend: &EtcdBackend, name: &str) {
    eventually("baton holds", || async {
        backend.entries(name).await.unwrap().len() == 1
    })
    .await;
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
    // With a command, stdout is the command's: key and token come in its environment.
    let stdout = String::from_utf8(out.stdout).unwrap();
    let fields: Vec<&str> = stdout.split_whitespace().collect();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let [key, token, etcd_key, etcd_rev] = fields[..] else {
        panic!("{stdout}")
    };
    assert!(key.starts_with(&format!("{name}/")), "{stdout}");
    assert!(token.parse::<u64>().is_ok_and(|t| t > 0), "{stdout}");
    // etcdctl's variables: the key, and its create revision (the token carries the store
    // epoch above it, issue #36).
    assert_eq!(etcd_key, key);
    let rev: u64 = etcd_rev.parse().unwrap();
    assert!(rev > 0 && rev < token.parse::<u64>().unwrap(), "{stdout}");
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
        assert_exit(&out, 0);
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
    assert_exit(&out, 0);
    assert_within(started, Duration::from_secs(8));
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
    assert_exit(&out, 75);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert_eq!(backend.entries(&name).await.unwrap().len(), 1);
    guard.release().await.unwrap();
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
    assert_exit(&unreachable, 69);
    assert_eq!(
        String::from_utf8_lossy(&unreachable.stderr).lines().count(),
        1
    );

    let bad = baton(&["lock", "x", "--ttl", "0"]).output().await.unwrap();
    assert_exit(&bad, 64);
    let missing = baton(&["elect", "x"]).output().await.unwrap();
    assert_exit(&missing, 64);
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
    assert_exit(&out, 0);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(lines[0].contains("\"role\":\"holder\"") && lines[0].contains(guard.key()));
    assert!(lines[0].contains("\"owner\":\"holder-app\""));
    assert!(lines[1].contains("waiter-app-1") && lines[2].contains("waiter-app-2"));
    let table = baton(&["status", &name]).output().await.unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert_eq!(table.lines().count(), 4, "header and three rows:\n{table}");
    guard.release().await.unwrap();
}

/// `--endpoints redis://` runs the same commands on Redis: `baton lock` queues behind a Rust
/// holder, `status` lists both, and the command runs once the holder releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_status_on_redis() {
    let url = RedisNode::shared().url();
    let backend = RedisNode::shared().backend().await.unwrap();
    // A server started for this run: no holder predates it.
    queues_lists_and_runs(&url, backend, &name("redis"), &["--restart-grace", "0"]).await;
}

/// `baton --endpoints URL lock` (with `options` before the command) queues behind a Rust
/// holder on `backend`, `status` lists both, and the command runs once the holder releases,
/// leaving nothing behind.
async fn queues_lists_and_runs<B: Backend + Clone>(
    url: &str,
    backend: B,
    name: &str,
    options: &[&str],
) {
    let (url, name) = (url.to_owned(), name.to_owned());
    let s = Session::new(backend.clone()).await.unwrap();
    let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    let mut args = vec!["--endpoints", url.as_str()];
    args.extend_from_slice(options);
    args.extend_from_slice(&["lock", &name, "--", "sh", "-c", "echo ran"]);
    let mut waiter = Running::spawn(&args);
    eventually("baton queues", || async {
        backend.entries(&name).await.unwrap().len() == 2
    })
    .await;
    let table = baton(&["--endpoints", &url, "status", &name])
        .output()
        .await
        .unwrap();
    assert_exit(&table, 0);
    let table = String::from_utf8(table.stdout).unwrap();
    assert_eq!(table.lines().count(), 3, "header, holder, waiter:\n{table}");
    assert!(table.contains(guard.key()), "{table}");
    guard.release().await.unwrap();
    assert_eq!(waiter.line().await, "ran");
    let (code, stderr) = waiter.exit_code().await;
    assert_eq!(code, 0, "{stderr}");
    assert!(backend.entries(&name).await.unwrap().is_empty());
}

/// `--endpoints postgres://` runs the same commands on PostgreSQL: `baton lock` queues behind
/// a Rust holder, `status` lists both, the command runs once the holder releases; a server
/// that refuses the connection is "unreachable" (69) at once, in one line, and a database
/// that does not exist is "the configuration is wrong" (78).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_status_on_postgres() {
    let url = PgNode::shared().url();
    let backend = PgNode::shared().backend().await.unwrap();
    queues_lists_and_runs(&url, backend, &name("postgres"), &[]).await;

    let port = PgNode::shared().port();
    for (args, code) in [
        (
            vec!["--endpoints", "postgres://postgres@127.0.0.1:1/postgres"],
            69,
        ),
        (
            vec![
                "--endpoints",
                &*format!("postgresql://postgres@127.0.0.1:{port}/nosuchdb"),
            ],
            78,
        ),
    ] {
        let started = std::time::Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_baton"))
            .args(&args)
            .args(["--connect-timeout", "20", "status", "x"])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(started.elapsed() < Duration::from_secs(5), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
}

/// `--endpoints zk://` runs the same commands on ZooKeeper, with the layout `--layout` names:
/// `baton lock --layout kazoo` queues behind a Rust holder of that layout (its node is named
/// as kazoo names them), `status` lists both, and the command runs once the holder releases.
/// Names are relative to the chroot, and the leading `/` ZooKeeper users write is dropped:
/// the Rust holder's `/<name>`, the command's `<name>` and `status /<name>` are one lock.
/// (Before: `/<name>` was refused, "a ZooKeeper name may not start or end with `/`".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_status_on_zookeeper_with_a_layout() {
    let url = format!("zk://{}", ZkNode::shared().connect_string());
    let options = ZkOptions::new().with_layout(ZkLayout::Kazoo);
    let backend = ZkBackend::connect(&ZkNode::shared().connect_string(), options)
        .await
        .unwrap();
    let name = name("zookeeper");
    let slashed = format!("/{name}");
    let s = Session::new(backend.clone()).await.unwrap();
    let guard = Mutex::new(&s, &slashed).unwrap().lock().await.unwrap();
    assert!(
        guard.key().starts_with(&format!("{name}/")),
        "{}",
        guard.key()
    );
    let mut waiter = Running::spawn(&[
        "--endpoints",
        &url,
        "--layout",
        "kazoo",
        "lock",
        &name,
        "--",
        "sh",
        "-c",
        "echo ran",
    ]);
    eventually("baton queues", || async {
        backend.entries(&name).await.unwrap().len() == 2
    })
    .await;
    let entries = backend.entries(&name).await.unwrap();
    assert!(
        entries[1].key().contains("__lock__"),
        "kazoo's node name: {}",
        entries[1].key()
    );
    let table = baton(&["--endpoints", &url, "--layout", "kazoo", "status", &slashed])
        .output()
        .await
        .unwrap();
    assert_exit(&table, 0);
    let table = String::from_utf8(table.stdout).unwrap();
    assert_eq!(table.lines().count(), 3, "header, holder, waiter:\n{table}");
    // Node names with `_` were once taken for a barrier's: every waiter showed as a holder
    // (issue #38). And a ZooKeeper client cannot read another's remaining session time: the
    // CLI's entry says its session's TTL.
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert!(
        rows[0].starts_with("holder") && rows[1].starts_with("waiter1"),
        "{table}"
    );
    assert!(rows[1].contains("≤10s"), "{table}");
    guard.release().await.unwrap();
    assert_eq!(waiter.line().await, "ran");
    let (code, stderr) = waiter.exit_code().await;
    assert_eq!(code, 0, "{stderr}");
    // Nothing left, as the fixture's own backend (Curator's layout) sees it too.
    let plain = ZkNode::shared().backend().await.unwrap();
    assert!(
        plain
            .entries(plain.recipe_name(&slashed))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(backend.entries(&name).await.unwrap().is_empty());
}

/// `--layout indexed` on etcd (#39): `baton lock` queues behind a Rust holder of the indexed
/// layout, its entry in that layout's queue (`<name>/_q/...`), `status` lists both, and the
/// command runs once the holder releases. (Before: `--layout` was refused with etcd
/// endpoints, so the CLI could not share a lock with an application using that layout.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_status_on_etcd_with_the_indexed_layout() {
    let options = EtcdOptions::new().with_layout(EtcdLayout::Indexed);
    let indexed = EtcdBackend::connect(EtcdNode::shared().endpoints(), options)
        .await
        .unwrap();
    let name = name("etcd-indexed");
    let s = Session::new(indexed.clone()).await.unwrap();
    let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    assert!(guard.key().contains("/_q/"), "{}", guard.key());
    let mut waiter = Running::spawn(&[
        "--layout", "indexed", "lock", &name, "--", "sh", "-c", "echo ran",
    ]);
    eventually("baton queues", || async {
        indexed.entries(&name).await.unwrap().len() == 2
    })
    .await;
    let entries = indexed.entries(&name).await.unwrap();
    assert!(entries[1].key().contains("/_q/"), "{}", entries[1].key());
    let table = baton(&["--layout", "indexed", "status", &name])
        .output()
        .await
        .unwrap();
    assert_exit(&table, 0);
    let table = String::from_utf8(table.stdout).unwrap();
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "holder, waiter:\n{table}");
    assert!(
        rows[0].starts_with("holder") && rows[1].starts_with("waiter1"),
        "{table}"
    );
    // `ls` groups the entries under the lock's name, not under `<name>/_q`.
    let ls = baton(&["--layout", "indexed", "ls", &name, "--json"])
        .output()
        .await
        .unwrap();
    assert_exit(&ls, 0);
    let ls = String::from_utf8(ls.stdout).unwrap();
    assert_eq!(ls.lines().count(), 1, "{ls}");
    assert!(ls.contains(&format!("\"name\":\"{name}\"")), "{ls}");
    assert!(ls.contains("\"waiters\":1"), "{ls}");
    guard.release().await.unwrap();
    assert_eq!(waiter.line().await, "ran");
    let (code, stderr) = waiter.exit_code().await;
    assert_eq!(code, 0, "{stderr}");
    assert!(indexed.entries(&name).await.unwrap().is_empty());
}

/// Issue #25 (2): `lock -n 3 NAME` is not let in beside a plain `lock NAME` holder (whose
/// entry used to count as one permit), and the reverse order excludes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_and_a_plain_lock_on_one_name_exclude_each_other() {
    let name = name("kinds");
    let mut plain = Running::spawn(&["lock", &name]);
    plain.line().await;
    let out = baton(&["lock", "-n", "3", "--try", &name])
        .output()
        .await
        .unwrap();
    assert_exit(&out, 75);
    plain.signal("-TERM");
    assert_eq!(plain.exit_code().await.0, 0);
    let mut permit = Running::spawn(&["lock", "-n", "3", &name]);
    permit.line().await;
    let out = baton(&["lock", "--try", &name]).output().await.unwrap();
    assert_exit(&out, 75);
    permit.signal("-TERM");
    assert_eq!(permit.exit_code().await.0, 0);
}

/// `lock -n N` holds one of N permits: N holders at once, the next waits (`--try` exits 75,
/// another N is refused with 64), `status` shows the holders and the waiter, and a release
/// admits the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_with_permits_admits_n_holders() {
    let name = name("permits");
    let backend = backend().await;
    let mut first = Running::spawn(&["lock", "-n", "2", &name]);
    let (first_key, first_token) = (first.line().await, first.line().await);
    let mut second = Running::spawn(&["lock", "-n", "2", &name]);
    let (second_key, second_token) = (second.line().await, second.line().await);
    assert_ne!(first_key, second_key);
    assert!(first_token.parse::<u64>().unwrap() < second_token.parse::<u64>().unwrap());
    assert_exit(
        &baton(&["lock", "-n", "2", "--try", &name])
            .output()
            .await
            .unwrap(),
        75,
    );
    let mismatch = baton(&["lock", "-n", "3", "--try", &name])
        .output()
        .await
        .unwrap();
    assert_exit(&mismatch, 64);
    assert!(String::from_utf8_lossy(&mismatch.stderr).contains("has limit 2 stored, not 3"));
    assert_exit(
        &baton(&["lock", "-n", "0", &name]).output().await.unwrap(),
        64,
    );

    let mut third = Running::spawn(&["lock", "-n", "2", &name]);
    eventually("the third waits", || async {
        backend.entries(&name).await.unwrap().len() == 3
    })
    .await;
    let status = baton(&["status", &name, "--json"]).output().await.unwrap();
    assert_exit(&status, 0);
    let status = String::from_utf8(status.stdout).unwrap();
    let roles: Vec<&str> = status
        .lines()
        .map(|l| {
            l.split("\"role\":\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
        })
        .collect();
    assert_eq!(roles, ["holder", "holder", "waiter1"], "{status}");

    first.signal("-TERM");
    assert_eq!(first.exit_code().await.0, 0);
    third.line().await; // its key: it holds
    for holder in [&second, &third] {
        holder.signal("-TERM");
    }
    assert_eq!(second.exit_code().await.0, 0);
    assert_eq!(third.exit_code().await.0, 0);
    assert!(backend.entries(&name).await.unwrap().is_empty());
}

/// `status` on a read-write lock: readers ahead of the first writer hold, the rest wait; on
/// a barrier, every holder is in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_a_read_write_lock_and_a_barrier() {
    let name = name("status-rw");
    let backend = backend().await;
    let s = Session::new(backend.clone()).await.unwrap();
    let r = baton::RwLock::new(&s, &name).unwrap().read().await.unwrap();
    let w = tokio::spawn({
        let lock = baton::RwLock::new(&s, &name).unwrap();
        async move { lock.write().await.map(drop) }
    });
    eventually("the writer waits", || async {
        backend.entries(&name).await.unwrap().len() == 2
    })
    .await;
    let table = baton(&["status", &name]).output().await.unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.contains("holder(read)") && table.contains("waiter1(write)"),
        "{table}"
    );
    assert!(!table.contains("nested"), "{table}");
    r.release().await.unwrap();
    within("the writer", Duration::from_secs(10), w)
        .await
        .unwrap()
        .unwrap();

    // A barrier's holders are all in.
    let gate = baton::Barrier::new(&s, format!("{name}-gate")).unwrap();
    let (a, b) = (gate.hold().await.unwrap(), gate.hold().await.unwrap());
    let table = baton(&["status", &format!("{name}-gate")])
        .output()
        .await
        .unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert_eq!(table.matches("holder").count(), 2, "{table}");
    a.release().await.unwrap();
    b.release().await.unwrap();
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
    inner.release().await.unwrap();
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
    assert_exit(&ok, 0);

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

/// The lines of `log`, once it has `n` of them.
async fn log_lines(log: &std::path::Path, n: usize) -> Vec<String> {
    let mut lines = Vec::new();
    eventually("the log is written", || {
        lines = std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect();
        let done = lines.len() >= n;
        async move { done }
    })
    .await;
    lines
}

/// Issue #38 (5): `lock --shared` holders share the lock (like `flock -s`: the library's
/// RwLock read side), and a plain `lock` on the same name excludes them, both ways: it is
/// refused (`--try`) and waits while they hold, and they wait while it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_holders_share_and_a_plain_lock_excludes_them() {
    let name = name("shared");
    let dir = scratch("shared");
    let log = dir.join("log");
    let backend = backend().await;
    // A holder that logs when it starts and, on SIGTERM, when it ends.
    let holding = |what: &str| {
        format!(
            "trap 'echo \"{what} end\" >> {l}; exit 0' TERM; echo \"{what} start $BATON_LOCK_KEY\" >> {l}; \
             echo ready; while :; do sleep 0.05; done",
            l = log.display()
        )
    };
    let read = holding("read");
    let mut r1 = Running::spawn(&["lock", "--shared", &name, "--", "sh", "-c", &read]);
    assert_eq!(r1.line().await, "ready");
    // The second reader holds while the first does.
    let mut r2 = Running::spawn(&["lock", "--shared", &name, "--", "sh", "-c", &read]);
    assert_eq!(r2.line().await, "ready");
    let out = baton(&["lock", "--try", &name]).output().await.unwrap();
    assert_exit(&out, 75);
    let write = format!("echo 'write ran' >> {}", log.display());
    let w = Running::spawn(&["lock", &name, "--", "sh", "-c", &write]);
    eventually("the plain lock waits", || async {
        backend.entries(&name).await.unwrap().len() == 3
    })
    .await;
    for reader in [r1, r2] {
        reader.signal("-TERM");
        assert_eq!(reader.exit_code().await.0, 0);
    }
    let (code, stderr) = w.exit_code().await;
    assert_eq!(code, 0, "{stderr}");
    let lines = log_lines(&log, 5).await;
    assert!(
        lines[..2]
            .iter()
            .all(|l| l.starts_with(&format!("read start {name}/read/"))),
        "{lines:?}"
    );
    assert_eq!(
        lines[2..],
        ["read end", "read end", "write ran"],
        "{lines:?}"
    );

    // The other way round: readers wait for a plain holder.
    std::fs::remove_file(&log).unwrap();
    let write = holding("write");
    let mut w = Running::spawn(&["lock", &name, "--", "sh", "-c", &write]);
    assert_eq!(w.line().await, "ready");
    let out = baton(&["lock", "--shared", "--try", &name])
        .output()
        .await
        .unwrap();
    assert_exit(&out, 75);
    let read = format!("echo 'read ran' >> {}", log.display());
    let r = Running::spawn(&["lock", "--shared", &name, "--", "sh", "-c", &read]);
    eventually("the reader waits", || async {
        backend.entries(&name).await.unwrap().len() == 2
    })
    .await;
    w.signal("-TERM");
    assert_eq!(w.exit_code().await.0, 0);
    assert_eq!(r.exit_code().await.0, 0);
    let lines = log_lines(&log, 3).await;
    assert_eq!(lines[1..], ["write end", "read ran"], "{lines:?}");
    assert!(backend.entries(&name).await.unwrap().is_empty());
}

/// The JSON objects among `text`'s lines (other lines are baton's text messages).
fn json_events(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

/// The `event` field of each of `events`.
fn kinds(events: &[serde_json::Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect()
}

/// Issue #38 (5): `--json` reports each event of `lock` and `elect` as one JSON object per
/// line: on standard output without a command, on standard error with one (standard output
/// stays the command's); a loss says why, and the last line gives the exit code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_elect_report_their_events_in_json() {
    let name = name("json");
    let backend = backend().await;

    // No command: the events are the output.
    let mut holder = Running::spawn(&["lock", "--json", &name]);
    let waiting: serde_json::Value = serde_json::from_str(&holder.line().await).unwrap();
    assert_eq!(waiting["event"], "waiting");
    assert_eq!(waiting["name"], name.as_str());
    let acquired: serde_json::Value = serde_json::from_str(&holder.line().await).unwrap();
    assert_eq!(acquired["event"], "acquired");
    let entry = backend.entries(&name).await.unwrap().remove(0);
    assert_eq!(acquired["key"], entry.key());
    assert_eq!(acquired["token"], entry.token().get());
    holder.signal("-TERM");
    let released: serde_json::Value = serde_json::from_str(&holder.line().await).unwrap();
    assert_eq!(released["event"], "released");
    let exit: serde_json::Value = serde_json::from_str(&holder.line().await).unwrap();
    assert_eq!((&exit["event"], &exit["code"]), (&"exit".into(), &0.into()));
    assert_eq!(holder.exit_code().await.0, 0);

    // With a command: standard output is the command's, the events are on standard error.
    let out = baton(&[
        "lock",
        "--json",
        &name,
        "--",
        "sh",
        "-c",
        "echo from-the-command; exit 3",
    ])
    .output()
    .await
    .unwrap();
    assert_exit(&out, 3);
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "from-the-command\n");
    let events = json_events(&String::from_utf8_lossy(&out.stderr));
    assert_eq!(kinds(&events), ["waiting", "acquired", "released", "exit"]);
    assert_eq!(events[3]["code"], 3);

    // A loss says why, and exits 79.
    let mut holder = Running::spawn(&[
        "lock",
        "--json",
        "--ttl",
        "3",
        &name,
        "--",
        "sh",
        "-c",
        "trap 'exit 3' TERM; echo ready; while :; do sleep 0.05; done",
    ]);
    assert_eq!(holder.line().await, "ready");
    let entry = backend.entries(&name).await.unwrap().remove(0);
    backend.revoke_lease(entry.lease().unwrap()).await.unwrap();
    let (code, stderr) = holder.exit_code().await;
    assert_eq!(code, 79, "{stderr}");
    let events = json_events(&stderr);
    assert_eq!(
        kinds(&events),
        ["waiting", "acquired", "lost", "exit"],
        "{stderr}"
    );
    assert!(
        events[2]["reason"].as_str().unwrap().contains("lease"),
        "{stderr}"
    );
    assert_eq!(events[3]["code"], 79);
    assert!(
        events[3]["message"].as_str().unwrap().contains("lost"),
        "{stderr}"
    );

    // `elect`: the leadership's value too.
    let mut leader = Running::spawn(&["elect", "--json", &name, "node-a"]);
    let events: Vec<serde_json::Value> = vec![
        serde_json::from_str(&leader.line().await).unwrap(),
        serde_json::from_str(&leader.line().await).unwrap(),
    ];
    assert_eq!(kinds(&events), ["waiting", "acquired"]);
    assert_eq!(events[1]["value"], "node-a");
    assert!(events[1]["token"].as_u64().is_some());
    leader.signal("-TERM");
    let released: serde_json::Value = serde_json::from_str(&leader.line().await).unwrap();
    assert_eq!(released["event"], "released");
    assert_eq!(leader.exit_code().await.0, 0);
}

// ---- Supervision: the command runs only while the lock is held (issue #14). ----

/// A directory of the test's own.
fn scratch(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("baton-cli-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Whether any process of group `pgid` is left.
fn group_alive(pgid: i32) -> bool {
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), None).is_ok()
}

/// Whether any process of group `pgid` still runs. A zombie does not: it is dead, waiting
/// only for its parent to reap it (which a stopped baton does not).
fn group_running(pgid: i32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return group_alive(pgid);
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .any(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // `pid (name) state ppid pgrp ...`; the name may hold spaces and parentheses.
            let tail = stat.rsplit_once(')').map_or("", |(_, tail)| tail);
            let fields: Vec<&str> = tail.split_whitespace().take(3).collect();
            fields.len() == 3 && fields[2] == pgid.to_string() && fields[0] != "Z"
        })
}

/// The number a command wrote to `file` (`echo $$ > file`), once it has.
async fn written_pid(file: &std::path::Path) -> i32 {
    let mut pid = 0;
    eventually("the command wrote its pid", || {
        let read = std::fs::read_to_string(file).ok();
        pid = read.and_then(|s| s.trim().parse().ok()).unwrap_or(0);
        async move { pid > 0 }
    })
    .await;
    pid
}

/// On loss, every process the command started is stopped before baton exits, not only the
/// command itself. (Before: only the direct child; a background loop went on writing after
/// the successor was granted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_stops_the_whole_group() {
    let name = name("lost-group");
    let dir = scratch("lost-group");
    let pgid_file = dir.join("pgid");
    let script = format!(
        "echo $$ > {p}; (while :; do echo x >> {log}; sleep 0.05; done) & wait",
        p = pgid_file.display(),
        log = dir.join("log").display()
    );
    let holder = Running::spawn(&[
        "lock",
        &name,
        "--ttl",
        "3",
        "--kill-after",
        "1",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let pgid = written_pid(&pgid_file).await;
    assert!(group_alive(pgid));
    let backend = backend().await;
    let entry = backend.entries(&name).await.unwrap().remove(0);
    backend.revoke_lease(entry.lease().unwrap()).await.unwrap();
    let (code, stderr) = holder.exit_code().await;
    assert_eq!(code, 79, "{stderr}");
    assert!(
        !group_alive(pgid),
        "a process of the group outlived the lock"
    );
}

/// On a normal exit the lock is released only once the background jobs the command left are
/// gone too. (Before: as soon as the direct child exited.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_is_held_until_the_whole_group_is_gone() {
    let name = name("bg-jobs");
    let dir = scratch("bg-jobs");
    let done = dir.join("done");
    let script = format!("(sleep 0.5; echo done > {f}) & exit 0", f = done.display());
    let run = tokio::spawn(baton(&["lock", &name, "--", "sh", "-c", &script]).output());
    let backend = backend().await;
    until_held(&backend, &name).await;
    let s = Session::new(backend.clone()).await.unwrap();
    let next = within(
        "the next holder",
        Duration::from_secs(20),
        Mutex::new(&s, &name).unwrap().lock(),
    )
    .await
    .unwrap();
    assert!(
        done.exists(),
        "granted while a job of the previous holder still ran"
    );
    next.release().await.unwrap();
    assert_eq!(run.await.unwrap().unwrap().status.code(), Some(0));
}

/// `kill -9` of baton (the OOM killer, `timeout -k`, systemd) takes the command's whole group
/// with it. (Before: the command went on without the lock.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_baton_kills_the_command_group() {
    let name = name("kill9");
    let dir = scratch("kill9");
    let pgid_file = dir.join("pgid");
    let script = format!(
        "echo $$ > {p}; sleep 100 & sleep 100",
        p = pgid_file.display()
    );
    let holder = Running::spawn(&[
        "lock",
        &name,
        "--kill-after",
        "1",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let pgid = written_pid(&pgid_file).await;
    holder.signal("-KILL");
    eventually("the group is gone", || async move { !group_alive(pgid) }).await;
}

/// Once leadership is lost (here etcd is cut off), baton exits promptly: it does not wait for
/// a revoke the server cannot answer. (Before: 10-15 s after the loss, two "leaders".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_loss_baton_exits_without_waiting_for_etcd() {
    let proxy = support::proxy::Proxy::start(&EtcdNode::shared().endpoints()[0]).await;
    let name = name("loss-exit");
    let mut leader = Running::spawn(&[
        "--endpoints",
        &proxy.endpoint(),
        "elect",
        &name,
        "v",
        "--ttl",
        "2",
    ]);
    leader.line().await; // key
    leader.line().await; // value
    leader.line().await; // token
    proxy.black_hole();
    let cut = std::time::Instant::now();
    let (code, stderr) = leader.exit_code().await;
    assert_eq!(code, 79, "{stderr}");
    // The lease deadline (2 s), plus a bounded cleanup.
    assert_within(cut, Duration::from_secs(5));
}

/// The command's exit code is baton's, whatever the release meets: here etcd is unreachable
/// when the command ends. (Before: exit 69 after 22 s for a command that exited 0.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commands_exit_code_survives_an_unreachable_etcd() {
    let proxy = support::proxy::Proxy::start(&EtcdNode::shared().endpoints()[0]).await;
    let name = name("exit-unreachable");
    let dir = scratch("exit-unreachable");
    let go = dir.join("go");
    let script = format!(
        "echo started; while [ ! -e {f} ]; do sleep 0.05; done; exit 0",
        f = go.display()
    );
    let mut holder = Running::spawn(&[
        "--endpoints",
        &proxy.endpoint(),
        "lock",
        &name,
        "--ttl",
        "30",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    // The command runs: baton has its answer to the enqueue. (Waiting for the entry to show
    // on the server instead raced that answer: cut off in flight, it made this exit 1, then 69.)
    assert_eq!(holder.line().await, "started");
    proxy.black_hole();
    std::fs::write(&go, "").unwrap();
    let ended = std::time::Instant::now();
    let (code, stderr) = holder.exit_code().await;
    assert_eq!(code, 0, "{stderr}");
    assert_within(ended, Duration::from_secs(5));
}

/// `--timeout` bounds connecting too: an etcd that does not answer ends in time, with 69 (the
/// server cannot be reached), not 75 (the lock is busy): a cron script must tell "etcd down"
/// from "someone holds it". (Before: 75.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_bounds_connecting() {
    let proxy = support::proxy::Proxy::start(&EtcdNode::shared().endpoints()[0]).await;
    proxy.black_hole();
    let started = std::time::Instant::now();
    let out = baton(&[
        "--endpoints",
        &proxy.endpoint(),
        "lock",
        "x",
        "--timeout",
        "1",
        "--",
        "true",
    ])
    .output()
    .await
    .unwrap();
    assert_exit(&out, 69);
    assert_within(started, Duration::from_secs(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.lines().count() == 1 && stderr.contains("--timeout"),
        "{stderr}"
    );
}

/// A connect that cannot succeed ends at once, not after `--connect-timeout` (20 s here), with
/// one line that says what failed and no transport dump, and with the code of its kind:
/// refused on every endpoint and an unknown host are "unreachable" (69); `https://` to an etcd
/// without TLS, and a user and password for an etcd without authentication, are "the
/// configuration is wrong" (78), as is a ZooKeeper chroot that does not exist (it is named;
/// before: 69, "node not exists"). On ZooKeeper and Redis too. (Before: each 69, after the whole
/// timeout but the last (and Redis's), with tonic's `status: Unavailable, ... MetadataMap`
/// text, or ZooKeeper's "deadline has elapsed".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitive_connect_failures_end_at_once_with_the_code_of_their_kind() {
    let etcd = EtcdNode::shared().endpoints()[0].clone();
    let https = format!("https://{}", etcd.trim_start_matches("http://"));
    let no_chroot = format!("zk://{}/no-such-chroot", ZkNode::shared().connect_string());
    let cases: [(&str, Vec<&str>, i32, &str); 10] = [
        (
            "refused",
            vec!["--endpoints", "127.0.0.1:1"],
            69,
            "127.0.0.1:1: connection refused",
        ),
        (
            "ZooKeeper refused",
            vec!["--endpoints", "zk://127.0.0.1:1"],
            69,
            "zk://127.0.0.1:1: connection refused",
        ),
        (
            "ZooKeeper at an unknown host",
            vec!["--endpoints", "zk://no-such-host.invalid:2181/app"],
            69,
            "no such host",
        ),
        (
            "ZooKeeper with a chroot that does not exist",
            vec!["--endpoints", &no_chroot],
            78,
            "the chroot `/no-such-chroot` does not exist",
        ),
        (
            "Redis refused",
            vec!["--endpoints", "redis://127.0.0.1:1"],
            69,
            "Connection refused",
        ),
        (
            "Redis at an unknown host",
            vec!["--endpoints", "redis://no-such-host.invalid:6379"],
            69,
            "Name or service not known",
        ),
        (
            "refused on every endpoint",
            vec!["--endpoints", "127.0.0.1:1,localhost:1"],
            69,
            "127.0.0.1:1: connection refused; localhost:1: connection refused",
        ),
        (
            "an unknown host",
            vec!["--endpoints", "no-such-host.invalid:2379"],
            69,
            "no such host",
        ),
        (
            "https:// to an etcd without TLS",
            vec!["--endpoints", &https],
            78,
            "does not answer in TLS",
        ),
        (
            "a user for an etcd without authentication",
            vec!["--endpoints", &etcd, "--user", "root", "--password", "pw"],
            78,
            "authentication turned off, and a user and password were given (--user and --password)",
        ),
    ];
    for (case, args, code, says) in cases {
        let started = std::time::Instant::now();
        let out = within(
            case,
            Duration::from_secs(30),
            Command::new(env!("CARGO_BIN_EXE_baton"))
                .args(&args)
                .args(["--connect-timeout", "20", "status", "x"])
                .env_remove("BATON_USER")
                .env_remove("BATON_PASSWORD")
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap();
        let took = started.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{case}: {stderr}");
        assert!(
            took < Duration::from_secs(5),
            "{case}: took {took:?}: {stderr}"
        );
        assert!(
            stderr.lines().count() == 1
                && stderr.contains(says)
                && !stderr.contains("status:")
                && !stderr.contains("Metadata")
                && !stderr.contains("with_"),
            "{case}: {stderr}"
        );
    }
}

/// Issue #38 (4): a Redis that accepts connections and answers nothing is named with what it
/// did not answer and within what. (Before: "could not connect to redis://...: deadline has
/// elapsed".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_redis_is_named_with_what_it_did_not_answer() {
    let proxy =
        support::proxy::Proxy::start(&format!("127.0.0.1:{}", RedisNode::shared().port())).await;
    proxy.black_hole();
    let url = format!("redis://{}", proxy.addr());
    let out = baton(&["--endpoints", &url, "--connect-timeout", "1", "status", "x"])
        .output()
        .await
        .unwrap();
    assert_exit(&out, 69);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    for said in [url.as_str(), "no answer", "1s", "--connect-timeout"] {
        assert!(stderr.contains(said), "`{said}` missing: {stderr}");
    }
    assert!(!stderr.contains("deadline has elapsed"), "{stderr}");
}

/// Leadership whose key is deleted from outside (an operator's `etcdctl del`) is lost: baton
/// elect exits 79. (Before: it went on as a second leader.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_ends_when_its_key_is_deleted() {
    let name = name("elect-deleted");
    let mut leader = Running::spawn(&["elect", &name, "v"]);
    let key = leader.line().await;
    let backend = backend().await;
    let entry = backend.entries(&name).await.unwrap().remove(0);
    assert_eq!(entry.key(), key);
    assert!(backend.delete_entry(&entry).await.unwrap());
    let (code, stderr) = leader.exit_code().await;
    assert_eq!(code, 79, "{stderr}");
}

/// `baton elect <name> <value> -- <command>`: the command runs while leading, with the same
/// rules as under a lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_runs_a_command_while_leading() {
    let name = name("elect-command");
    let out = baton(&[
        "elect",
        &name,
        "node-a",
        "--",
        "sh",
        "-c",
        "echo \"$BATON_FENCING_TOKEN\"; exit 5",
    ])
    .output()
    .await
    .unwrap();
    assert_exit(&out, 5);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.trim().parse::<u64>().is_ok(),
        "only the command's output: {stdout}"
    );
    assert!(
        backend().await.entries(&name).await.unwrap().is_empty(),
        "resigned"
    );
}

/// Issue #25 (10): a Redis restart grace is not waited out in silence. The shared server's
/// state began with this test run, so with a grace of 600 s every lock waits: `--try` gives
/// up without calling the (free) lock held, and standard error says that it waits, why, for
/// how long and which option changes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_grace_is_said_on_standard_error() {
    let url = RedisNode::shared().url();
    let name = name("grace");
    let out = baton(&[
        "--endpoints",
        &url,
        "--restart-grace",
        "600",
        "lock",
        &name,
        "--try",
    ])
    .output()
    .await
    .unwrap();
    assert_exit(&out, 75);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("held or contended"),
        "--try calls a lock that may be free busy:\n{stderr}"
    );
    for said in [
        "restart grace",
        "nothing is granted for",
        "--restart-grace",
        "TTL",
        "cannot be granted for",
    ] {
        assert!(stderr.contains(said), "`{said}` missing from:\n{stderr}");
    }
}

/// `elect` on Redis: a command runs while leading, with the fencing token in its
/// environment, and the leadership ends with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_runs_a_command_on_redis() {
    let url = RedisNode::shared().url();
    let name = name("elect-redis");
    let out = baton(&[
        "--endpoints",
        &url,
        "--restart-grace",
        "0",
        "elect",
        &name,
        "node-a",
        "--",
        "sh",
        "-c",
        "echo \"$BATON_FENCING_TOKEN\"; exit 5",
    ])
    .output()
    .await
    .unwrap();
    assert_exit(&out, 5);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.trim().parse::<u64>().is_ok(), "{stdout}");
    let backend = RedisNode::shared().backend().await.unwrap();
    assert!(backend.entries(&name).await.unwrap().is_empty(), "resigned");
}

/// One dead endpoint listed first does not fail the connect (as with etcdctl). (Before: 10 of
/// 10 runs failed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_first_is_skipped() {
    let endpoints = format!("127.0.0.1:1,{}", endpoints());
    for _ in 0..5 {
        let out = baton(&["--endpoints", &endpoints, "status", "x"])
            .output()
            .await
            .unwrap();
        assert_exit(&out, 0);
    }
}

/// At a terminal, one Ctrl-C reaches the command once. (Before: the terminal signalled the
/// foreground group, command included, and baton forwarded a second copy.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_ctrl_c_reaches_the_command_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let name = name("ctrl-c");
    let dir = scratch("ctrl-c");
    let ints = dir.join("ints");
    // Counts SIGINTs. It waits for the first without sleeping (`:` between checks), so the
    // trap runs at once and a second copy is not merged into a still-pending first; then it
    // waits 0.3 s for a duplicate (a forwarded copy arrives within milliseconds), and exits.
    let script = format!(
        "trap 'echo int >> {f}' INT; echo ready; while [ ! -e {f} ]; do :; done; sleep 0.3; exit 0",
        f = ints.display()
    );
    let (mut pty, pts) = pty_process::open().unwrap();
    let mut cmd = pty_process::Command::new(env!("CARGO_BIN_EXE_baton"))
        .env("BATON_ENDPOINTS", endpoints())
        .args(["lock", &name, "--", "sh", "-c", &script]);
    let _ = &mut cmd;
    let mut child = cmd.spawn(pts).unwrap();
    let mut seen = Vec::new();
    within("ready", Duration::from_secs(20), async {
        let mut buf = [0u8; 256];
        while !String::from_utf8_lossy(&seen).contains("ready") {
            let n = pty.read(&mut buf).await.unwrap();
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    pty.write_all(b"\x03").await.unwrap();
    let status = within("baton exits", Duration::from_secs(20), child.wait())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let count = std::fs::read_to_string(&ints).unwrap().lines().count();
    assert_eq!(count, 1, "SIGINT reached the command {count} times");
}

/// Signals baton inherited as ignored (`nohup`) stay ignored, for the command too. (Before:
/// baton installed a handler over SIG_IGN and forwarded SIGHUP: exit 129.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignored_signals_stay_ignored() {
    let name = name("nohup");
    let script = format!(
        "trap '' HUP; exec {baton} lock {name} -- sh -c 'echo ready; sleep 1; echo survived'",
        baton = env!("CARGO_BIN_EXE_baton")
    );
    let mut cmd = Command::new("sh");
    cmd.env("BATON_ENDPOINTS", endpoints())
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(
        within("ready", Duration::from_secs(20), lines.next_line())
            .await
            .unwrap()
            .unwrap(),
        "ready"
    );
    let pid = child.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    assert_eq!(
        within(
            "the command goes on",
            Duration::from_secs(20),
            lines.next_line()
        )
        .await
        .unwrap()
        .as_deref(),
        Some("survived")
    );
    let status = within("baton exits", Duration::from_secs(20), child.wait())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

/// A closed standard output never panics and never leaves a key. (Before: a panic, exit 101,
/// the command never ran, the key stayed for the whole TTL.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_never_panics_nor_leaves_a_key() {
    let backend = backend().await;
    for (test, command) in [("with-command", vec!["--", "true"]), ("without", vec![])] {
        let name = name(&format!("closed-stdout-{test}"));
        let mut args = vec!["lock", name.as_str()];
        args.extend(command.iter().copied());
        let mut child = baton(&args).spawn().unwrap();
        drop(child.stdout.take());
        let status = within("baton exits", Duration::from_secs(20), child.wait())
            .await
            .unwrap();
        assert_ne!(status.code(), Some(101), "{test}: a panic");
        let expected = if command.is_empty() { 141 } else { 0 };
        assert_eq!(status.code(), Some(expected), "{test}");
        assert!(
            backend.entries(&name).await.unwrap().is_empty(),
            "{test}: key left"
        );
    }
}

/// A signal passed on to the command is followed by SIGKILL after `--kill-after` if the
/// group does not end. (Before: the forwarded signal was all, and an ignoring command ran on.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_after_applies_to_forwarded_signals() {
    let name = name("kill-after");
    let mut holder = Running::spawn(&[
        "lock",
        &name,
        "--kill-after",
        "1",
        "--",
        "sh",
        "-c",
        "trap '' TERM; echo ready; while :; do sleep 0.05; done",
    ]);
    assert_eq!(holder.line().await, "ready");
    holder.signal("-TERM");
    let (code, stderr) = holder.exit_code().await;
    assert_eq!(code, 128 + 9, "ended by SIGKILL: {stderr}");
    assert!(backend().await.entries(&name).await.unwrap().is_empty());
}

/// `--try`: take the lock only if it is free, else 75 at once, leaving no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_mode_never_waits() {
    let name = name("try");
    let backend = backend().await;
    let s = Session::new(backend.clone()).await.unwrap();
    let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    let out = baton(&["lock", &name, "--try", "--", "true"])
        .output()
        .await
        .unwrap();
    assert_exit(&out, 75);
    assert_eq!(
        backend.entries(&name).await.unwrap().len(),
        1,
        "no key left"
    );
    guard.release().await.unwrap();
    let out = baton(&["lock", &name, "--try", "--", "true"])
        .output()
        .await
        .unwrap();
    assert_exit(&out, 0);
}

/// Bad input: a distinct code, one line, and nothing sent (the endpoint here answers no one,
/// so reaching it would be 69).
#[tokio::test]
async fn bad_input_is_refused_before_anything_is_sent() {
    let run = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_baton"));
        cmd.env("BATON_ENDPOINTS", "127.0.0.1:1")
            .env_remove("BATON_USER")
            .env_remove("BATON_PASSWORD")
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd.output()
    };
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["lock", "x", "--", "no-such-command-baton"],
            127,
            "not found",
        ),
        (&["lock", "x", "--", "/etc/passwd"], 126, "not executable"),
        (
            &["lock", "x", "--ttl", "1e10", "--", "true"],
            64,
            "longest lease",
        ),
        (&["lock", "x", "--ttl", "-1", "--", "true"], 64, "positive"),
        (&["lock", "", "--", "true"], 64, "name"),
        (
            &["--endpoints", "127.0.0.1:99999", "status", "x"],
            64,
            "port",
        ),
        (&["--password", "p", "status", "x"], 64, "--user"),
        (&["--endpoints", "ftp://h:21", "status", "x"], 64, "scheme"),
        // The library's in-process store: no other process would ever see the lock.
        (
            &["--endpoints", "memory://", "status", "x"],
            64,
            "in-process",
        ),
        (
            &["--endpoints", "redis://a:1,redis://b:1", "status", "x"],
            64,
            "one Redis URL",
        ),
        (
            &[
                "--endpoints",
                "redis://127.0.0.1:1",
                "--user",
                "u",
                "--password",
                "p",
                "status",
                "x",
            ],
            64,
            "in their URL",
        ),
        (&["--layout", "kazoo", "status", "x"], 64, "ZooKeeper"),
        // etcd's layouts are refused with other endpoints, as ZooKeeper's are with etcd's.
        (
            &[
                "--endpoints",
                "zk://127.0.0.1:2181",
                "--layout",
                "indexed",
                "status",
                "x",
            ],
            64,
            "etcd",
        ),
        (
            &[
                "--endpoints",
                "zk://127.0.0.1:2181",
                "--layout",
                "zk",
                "status",
                "x",
            ],
            64,
            "--layout",
        ),
        (&["elect", "x", "v", "--listen"], 64, ""),
        // The missing argument is named (before: "were not provided:" and nothing).
        (&["lock"], 64, "<NAME>"),
        (&["status"], 64, "<NAME>"),
        (&["elect", "x"], 64, "<PROPOSAL>"),
        // A scheme missing a slash is a typo, not an etcd host to look up (before: exit 69,
        // "dns error", after the connect timeout).
        (
            &["--endpoints", "redis:/127.0.0.1:6379", "status", "x"],
            64,
            "redis://",
        ),
        (
            &["--endpoints", "zk:/127.0.0.1:2181", "status", "x"],
            64,
            "zk://",
        ),
    ];
    for (args, code, says) in cases {
        let out = run(args).await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
        assert!(stderr.starts_with("baton: "), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// Each subcommand's help says what happens to the command and lists the exit codes; the
/// usage line shows the options as optional.
#[tokio::test]
async fn subcommand_help_tells_the_rules() {
    let out = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["lock", "--help"])
        .output()
        .await
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(
        help.contains("Usage: baton lock [OPTIONS] <NAME>"),
        "{help}"
    );
    assert!(help.contains("process group"), "{help}");
    assert!(
        help.contains("Exit codes") && help.contains("127"),
        "{help}"
    );
}

/// The command inherits no descriptor of baton's own (not the pipe on which its start step
/// waits until the watchdog guards the group): it has the same descriptors as when the test
/// runs it directly (standard input, output and error, and whatever the test itself passes on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_inherits_no_descriptor_of_batons() {
    let list = "ls /proc/$$/fd";
    let fds = |out: std::process::Output| {
        assert_exit(&out, 0);
        let mut fds: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        fds.sort();
        fds
    };
    let direct = Command::new("sh")
        .args(["-c", list])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .unwrap();
    let name = name("fds");
    let under_baton = baton(&["lock", &name, "--", "sh", "-c", list])
        .output()
        .await
        .unwrap();
    assert_eq!(fds(under_baton), fds(direct), "the command's descriptors");
}

/// The password is baton's, not the command's; it reaches etcd and not the environment of the
/// command. Without a user, the refusal names `--user`. (Uses a node of its own with
/// authentication on.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_password_is_not_passed_to_the_command() {
    let node = EtcdNode::start().await.expect("a node of its own");
    let mut client = node.backend().await.unwrap().client().clone();
    client.user_add("root", "pw", None).await.unwrap();
    client.user_grant_role("root", "root").await.unwrap();
    client.auth_enable().await.unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_baton"))
        .env("BATON_ENDPOINTS", node.endpoints().join(","))
        .env("BATON_USER", "root")
        .env("BATON_PASSWORD", "pw")
        .args([
            "lock",
            "auth/x",
            "--",
            "sh",
            "-c",
            "echo \"${BATON_PASSWORD:-unset}\"",
        ])
        .output()
        .await
        .unwrap();
    assert_exit(&out, 0);
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), "unset");

    // Without --user, the refusal names the flag (before: "authentication failed: user name
    // is empty").
    let out = Command::new(env!("CARGO_BIN_EXE_baton"))
        .env("BATON_ENDPOINTS", node.endpoints().join(","))
        .env_remove("BATON_USER")
        .env_remove("BATON_PASSWORD")
        .args(["lock", "auth/y", "--", "true"])
        .output()
        .await
        .unwrap();
    assert_exit(&out, 77);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.lines().count() == 1 && stderr.contains("--user"),
        "{stderr}"
    );
}

/// The status table lines up (the token column too), and keys or owners with newlines stay
/// on their row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_table_lines_up_and_stays_one_row_per_entry() {
    let name = name("status-table");
    let backend = backend().await;
    let a = Session::new(backend.clone()).await.unwrap();
    let b = Session::new(backend.clone()).await.unwrap();
    let guard = Mutex::new(&a, &name)
        .unwrap()
        .with_owner_info("two\nlines")
        .lock()
        .await
        .unwrap();
    let _waiter = support::spawn_queued(&backend, &b, &name, 2).await;
    let table = baton(&["status", &name]).output().await.unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "header and two rows:\n{table}");
    let token_end = lines[0].find("TOKEN").unwrap() + "TOKEN".len();
    for (line, token) in lines[1..].iter().zip([guard.fencing_token().get(), 0]) {
        let t = token.to_string();
        if token > 0 {
            assert_eq!(&line[token_end - t.len()..token_end], t, "{table}");
        }
    }
    assert!(table.contains("two\\nlines"), "{table}");
    guard.release().await.unwrap();
}

/// A second SIGTERM (or Ctrl-C) while baton waits for the command to stop is honoured at once:
/// the group gets SIGKILL without waiting out `--kill-after`. (Before: swallowed for 12.6 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_stops_the_command_at_once() {
    let name = name("second-signal");
    let mut holder = Running::spawn(&[
        "lock",
        &name,
        "--kill-after",
        "60",
        "--",
        "sh",
        "-c",
        "trap 'echo term' TERM; echo ready; while :; do sleep 0.05; done",
    ]);
    assert_eq!(holder.line().await, "ready");
    holder.signal("-TERM");
    // The command saw the first one (and ignores it); the second ends it.
    assert_eq!(holder.line().await, "term");
    let second = std::time::Instant::now();
    holder.signal("-TERM");
    let (code, stderr) = holder.exit_code().await;
    assert_eq!(code, 128 + 9, "{stderr}");
    assert_within(second, Duration::from_secs(5));
    assert!(backend().await.entries(&name).await.unwrap().is_empty());
}

// ---- Replacing flock(1), `etcdctl lock` and `consul lock` in scripts and cron (issue #25). ----

fn have_python() -> bool {
    let found = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(std::env::var("CI").is_err(), "CI must have python3");
        eprintln!("python3 not installed; skipping");
    }
    found
}

/// A caller that ignores SIGHUP and SIGINT, leaves SIGPIPE at its default and blocks SIGUSR1,
/// then runs `args`: a `nohup`-ish script, as Python can set it up and sh cannot (a mask).
fn python_caller(args: &[&str]) -> Command {
    let mut cmd = Command::new("python3");
    cmd.env("BATON_ENDPOINTS", endpoints())
        .arg("-c")
        .arg(
            "import os, signal, sys\n\
             signal.signal(signal.SIGHUP, signal.SIG_IGN)\n\
             signal.signal(signal.SIGINT, signal.SIG_IGN)\n\
             signal.signal(signal.SIGPIPE, signal.SIG_DFL)\n\
             signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\n\
             os.execvp(sys.argv[1], sys.argv[1:])",
        )
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// The command starts with the signal dispositions and mask it would have had without baton:
/// what the caller ignored ignored, SIGPIPE at its default, the caller's mask. (Before: SIGPIPE
/// ignored in every command, since Rust's runtime ignores it and that survives `exec`, and the
/// mask emptied: `yes | head -1` exited 1 with "Broken pipe", a shell loop `echo`ing into
/// `head -1` never ended.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_starts_with_the_callers_signals() {
    if !have_python() {
        return;
    }
    let name = name("sigstate");
    let show = ["grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"];
    let direct = python_caller(&show).output().await.unwrap();
    assert!(direct.status.success());
    let mut via_baton = vec![env!("CARGO_BIN_EXE_baton"), "lock", name.as_str(), "--"];
    via_baton.extend(show);
    let baton_run = python_caller(&via_baton).output().await.unwrap();
    assert_exit(&baton_run, 0);
    let direct = String::from_utf8(direct.stdout).unwrap();
    assert!(
        direct.contains("SigBlk:\t0000000000000200"),
        "USR1: {direct}"
    );
    assert_eq!(String::from_utf8(baton_run.stdout).unwrap(), direct);

    // What that means for scripts: the writer into a closed pipe dies of SIGPIPE (141).
    let script = "exec 3>&1; { yes; echo \"yes $?\" >&3; } | head -1 >/dev/null; \
                  while :; do echo y; done | head -1 >/dev/null; echo 'loop ended'";
    let out = within(
        "the pipelines end",
        Duration::from_secs(20),
        baton(&["lock", &name, "--", "sh", "-c", script]).output(),
    )
    .await
    .unwrap();
    assert_exit(&out, 0);
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "yes 141\nloop ended\n"
    );
}

/// A holder whose command's group ignores SIGTERM and writes to a log until killed, held with
/// `--ttl 3 --kill-after 60` (through `endpoints`, if given).
struct Stubborn {
    holder: Running,
    pgid: i32,
    log: std::path::PathBuf,
    name: String,
}

impl Stubborn {
    async fn start(test: &str, endpoints: Option<&str>) -> Stubborn {
        let name = name(test);
        let dir = scratch(test);
        let (pgid_file, log) = (dir.join("pgid"), dir.join("log"));
        let script = format!(
            "echo $$ > {p}; trap '' TERM; while :; do echo first >> {l}; sleep 0.02; done & wait",
            p = pgid_file.display(),
            l = log.display()
        );
        let mut args = Vec::new();
        if let Some(endpoints) = endpoints {
            args.extend(["--endpoints", endpoints]);
        }
        args.extend([
            "lock",
            &name,
            "--ttl",
            "3",
            "--kill-after",
            "60",
            "--",
            "sh",
            "-c",
            &script,
        ]);
        let holder = Running::spawn(&args);
        let pgid = written_pid(&pgid_file).await;
        eventually("the group writes", || {
            let wrote = std::fs::read_to_string(&log).is_ok_and(|l| !l.is_empty());
            async move { wrote }
        })
        .await;
        Stubborn {
            holder,
            pgid,
            log,
            name,
        }
    }

    /// Takes the lock directly, marks the grant in the log, and asserts that the group wrote
    /// nothing after it. Returns the holder process.
    async fn nothing_after_the_next_grant(self) -> Running {
        let backend = backend().await;
        let s = Session::new(backend.clone()).await.unwrap();
        let next = within(
            "the next holder",
            Duration::from_secs(20),
            Mutex::new(&s, &self.name).unwrap().lock(),
        )
        .await
        .unwrap();
        {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&self.log)
                .unwrap();
            writeln!(f, "granted").unwrap();
        }
        // A guard only: the group must be gone already (its processes dead; a stopped baton
        // has not reaped them).
        let pgid = self.pgid;
        eventually("the group is gone", || async move { !group_running(pgid) }).await;
        let log = std::fs::read_to_string(&self.log).unwrap();
        let after: Vec<&str> = log.lines().skip_while(|l| *l != "granted").collect();
        assert_eq!(
            after,
            ["granted"],
            "the first holder's group wrote after the next grant"
        );
        next.release().await.unwrap();
        self.holder
    }
}

/// After `kill -9` of baton, the whole group is gone before the lease can have expired,
/// whatever `--kill-after` says: a process that ignores SIGTERM writes nothing after the next
/// holder is granted. (Before: SIGKILL came `--kill-after` after SIGTERM; with `--ttl 3` and
/// the default 10 s, writes went on about 6.5 s after the next grant.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_the_group_is_gone_before_the_next_grant() {
    let stubborn = Stubborn::start("orphan-grace", None).await;
    stubborn.holder.signal("-KILL");
    stubborn.nothing_after_the_next_grant().await;
}

/// Cut off from etcd, baton stops the command before the lease can have expired, whatever
/// `--kill-after` says: SIGTERM once renewals have failed for a while, SIGKILL at the
/// session's deadline. A process that ignores SIGTERM writes nothing after the next holder is
/// granted. (Before: SIGTERM came only at the loss and SIGKILL `--kill-after` later; the
/// group wrote on after the next grant.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_the_group_is_gone_before_the_next_grant() {
    let proxy = support::proxy::Proxy::start(&EtcdNode::shared().endpoints()[0]).await;
    let stubborn = Stubborn::start("cut-off-grace", Some(&proxy.endpoint())).await;
    proxy.black_hole();
    let holder = stubborn.nothing_after_the_next_grant().await;
    let (code, stderr) = holder.exit_code().await;
    assert_eq!(code, 79, "{stderr}");
    assert!(stderr.contains("before the lease can expire"), "{stderr}");
}

/// Issue #38 (3): SIGSTOP of baton alone (not its command) stops the renewals; the watchdog
/// knows the session's deadline from baton and stops the group by then, so a TERM-ignoring
/// job writes nothing after the next holder is granted. Once baton runs again it finds the
/// lock lost and exits 79. (Before: the command ran on beside the next holder for as long as
/// baton stayed stopped.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_batons_group_is_gone_before_the_next_grant() {
    let stubborn = Stubborn::start("stopped", None).await;
    stubborn.holder.signal("-STOP");
    let holder = stubborn.nothing_after_the_next_grant().await;
    holder.signal("-CONT");
    let (code, stderr) = holder.exit_code().await;
    assert_eq!(code, 79, "{stderr}");
}

/// Issue #38 (1): cut off from etcd, a command that handles the SIGTERM baton sends before
/// the lease can expire and has a background job: baton exits 79 (the lock was lost; the
/// command's own 143 would read as a failed command), and promptly once the group is gone,
/// not after a release etcd cannot answer. (Before: exit 143, 2.2 s after the shell ended.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_a_command_that_handles_sigterm_exits_79_at_once() {
    let proxy = support::proxy::Proxy::start(&EtcdNode::shared().endpoints()[0]).await;
    let name = name("cut-off-trap");
    let mut holder = Running::spawn(&[
        "--endpoints",
        &proxy.endpoint(),
        "lock",
        &name,
        "--ttl",
        "3",
        "--",
        "sh",
        "-c",
        "trap 'echo term; exit 143' TERM; sleep 100 & echo started; wait",
    ]);
    assert_eq!(holder.line().await, "started");
    proxy.black_hole();
    // The shell says it got SIGTERM as its last act; its job dies of the same signal.
    assert_eq!(holder.line().await, "term");
    let ended = std::time::Instant::now();
    let (code, stderr) = holder.exit_code().await;
    let took = ended.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "exited {took:?} after the group: {stderr}"
    );
    assert_eq!(code, 79, "{stderr}");
}

/// The watchdog needs no shell: with no `sh` on `PATH`, `kill -9` of baton still takes the
/// whole group. (Before: the watchdog was `sh`; without it a background job survived.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_needs_no_shell() {
    let name = name("no-sh");
    let dir = scratch("no-sh");
    let pgid_file = dir.join("pgid");
    let script = format!(
        "echo $$ > {p}; /bin/sleep 100 & /bin/sleep 100",
        p = pgid_file.display()
    );
    let mut cmd = baton(&[
        "lock",
        &name,
        "--kill-after",
        "1",
        "--",
        "/bin/sh",
        "-c",
        &script,
    ]);
    cmd.env("PATH", dir.join("empty"));
    let holder = cmd.spawn().unwrap();
    let pgid = written_pid(&pgid_file).await;
    let pid = holder.id().unwrap().to_string();
    assert!(
        std::process::Command::new("/bin/kill")
            .args(["-KILL", &pid])
            .status()
            .unwrap()
            .success()
    );
    eventually("the group is gone", || async move { !group_alive(pgid) }).await;
}

/// Issue #38 (4): the watchdog shows in `ps` as `baton watchdog <baton's pid>` (its command
/// line) and `baton-watchdog` (its name). (Before: `/proc/self/exe __baton-watchdog 3.33`,
/// named `exe`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_says_what_it_is_in_ps() {
    let name = name("watchdog-ps");
    let mut holder = Running::spawn(&["lock", &name, "--", "sh", "-c", "echo ready; sleep 60"]);
    assert_eq!(holder.line().await, "ready");
    let baton = holder.child.id().unwrap();
    // baton's children: the command and the watchdog.
    let children: Vec<(String, String)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == baton).then_some(())?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            Some((cmdline.trim_end().to_owned(), comm.trim_end().to_owned()))
        })
        .collect();
    assert!(
        children.iter().any(
            |(cmdline, comm)| *cmdline == format!("baton watchdog {baton}")
                && comm == "baton-watchdog"
        ),
        "{children:?}"
    );
    holder.signal("-TERM");
    assert_eq!(holder.exit_code().await.0, 143);
}

/// Reads the pseudo-terminal until `text` has appeared in what it printed.
async fn read_pty_until(pty: &mut pty_process::Pty, seen: &mut Vec<u8>, text: &str) {
    use tokio::io::AsyncReadExt;
    within(text, Duration::from_secs(20), async {
        let mut buf = [0u8; 256];
        while !String::from_utf8_lossy(seen).contains(text) {
            let n = pty.read(&mut buf).await.unwrap_or(0);
            assert!(
                n > 0,
                "the terminal closed: {}",
                String::from_utf8_lossy(seen)
            );
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await;
}

/// At a terminal, a Ctrl-C that ends the command but not a background job it left (a
/// non-interactive shell starts those with SIGINT ignored) does not leave the operator stuck:
/// baton says what it waits for, and the next Ctrl-C reaches baton and kills the rest.
/// (Before: baton waited silently; the command's group kept the terminal, so further Ctrl-C
/// went to the job that ignores them, and baton returned when the job ended by itself.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_ctrl_c_at_a_terminal_kills_what_the_command_left() {
    use tokio::io::AsyncWriteExt;
    let name = name("ctrl-c-twice");
    let dir = scratch("ctrl-c-twice");
    let job = dir.join("job");
    // The job writes its pid itself, so once it is there the job ignores SIGINT (set by the
    // shell in the job's process before the `exec`).
    let script = format!(
        "sh -c 'echo $$ > {f}; exec sleep 60' & echo ready; wait",
        f = job.display()
    );
    let (mut pty, pts) = pty_process::open().unwrap();
    let mut child = pty_process::Command::new(env!("CARGO_BIN_EXE_baton"))
        .env("BATON_ENDPOINTS", endpoints())
        .args(["lock", &name, "--", "sh", "-c", &script])
        .spawn(pts)
        .unwrap();
    let mut seen = Vec::new();
    read_pty_until(&mut pty, &mut seen, "ready").await;
    let sleep_pid = written_pid(&job).await;
    pty.write_all(b"\x03").await.unwrap();
    // The whole line: baton says what it waits for, and that the next Ctrl-C kills it.
    read_pty_until(
        &mut pty,
        &mut seen,
        "Ctrl-C or a signal to baton kills them (SIGKILL)",
    )
    .await;
    let said = String::from_utf8_lossy(&seen).into_owned();
    assert!(said.contains(&format!("pid {sleep_pid} (")), "{said}");
    pty.write_all(b"\x03").await.unwrap();
    let status = within("baton exits", Duration::from_secs(10), child.wait())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(130), "the command's status: SIGINT");
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(sleep_pid), None).is_err(),
        "the background job survived"
    );
    assert!(backend().await.entries(&name).await.unwrap().is_empty());
}

/// After a double fork (the command exits at once, its grandchild runs on), baton says on
/// standard error what it waits for, and a signal is passed on to it. (Before: silence for as
/// long as the grandchild ran.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baton_says_what_it_waits_for_after_a_double_fork() {
    let name = name("double-fork");
    let dir = scratch("double-fork");
    let job = dir.join("job");
    let script = format!("(sleep 60 & echo $! > {f}); exit 0", f = job.display());
    let mut child = baton(&["lock", &name, "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let line = within(
        "baton says what it waits for",
        Duration::from_secs(20),
        async {
            loop {
                let line = stderr
                    .next_line()
                    .await
                    .unwrap()
                    .expect("stderr ends early");
                if line.contains("the lock is held until") {
                    return line;
                }
            }
        },
    )
    .await;
    let sleep_pid = written_pid(&job).await;
    assert!(line.contains(&format!("pid {sleep_pid} (sleep)")), "{line}");
    // (Before: "`sh` it exited with 0".)
    assert!(line.contains("baton: `sh` exited with 0; "), "{line}");
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let status = within("baton exits", Duration::from_secs(10), child.wait())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "the command's own status");
    assert!(backend().await.entries(&name).await.unwrap().is_empty());
}

/// A reader that goes away is noticed without waiting for a next write: `baton lock x | head
/// -1` and `baton elect x v | head -1` release and exit 141, `baton elect --listen x | head
/// -1` exits 0. (Before: each ran on until killed, the lock held with nobody reading.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_reader_is_noticed_at_once() {
    let backend = backend().await;
    let lock = name("reader-lock");
    let elect = name("reader-elect");
    let listen = name("reader-listen");
    let cases: [(&[&str], i32, &str); 3] = [
        (&["lock", &lock], 141, &lock),
        (&["elect", &elect, "v"], 141, &elect),
        (&["elect", "--listen", &listen], 0, &listen),
    ];
    for (args, code, name) in cases {
        let mut child = baton(args).spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        within("a first line", Duration::from_secs(20), lines.next_line())
            .await
            .unwrap()
            .expect("a line");
        drop(lines); // `head -1` has what it wanted
        let status = within("baton exits", Duration::from_secs(10), child.wait())
            .await
            .unwrap();
        assert_eq!(status.code(), Some(code), "{args:?}");
        assert!(backend.entries(name).await.unwrap().is_empty(), "{args:?}");
    }
}

async fn next(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    within("a line", Duration::from_secs(20), lines.next_line())
        .await
        .unwrap()
        .expect("a line")
}

/// `baton lock x &` in a script starts with SIGINT ignored (sh does that to background jobs),
/// and `kill -INT` still stops it, as it stops `etcdctl lock`: without a command it releases
/// and exits 130; a command (which keeps SIGINT ignored, as without baton) gets SIGTERM.
/// (Before: SIGINT did nothing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_int_stops_a_background_baton() {
    let name = name("bg-int");
    let dir = scratch("bg-int");
    let pid_file = dir.join("pid");
    let background = |command: &str| {
        let script = format!(
            "{b} lock {name} {command} & echo $! > {p}; wait $!; echo \"exit $?\"",
            b = env!("CARGO_BIN_EXE_baton"),
            p = pid_file.display()
        );
        let _ = std::fs::remove_file(&pid_file);
        let mut cmd = Command::new("sh");
        cmd.env("BATON_ENDPOINTS", endpoints())
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        (child, lines)
    };

    let (_sh, mut lines) = background("");
    assert!(next(&mut lines).await.starts_with(&format!("{name}/")));
    next(&mut lines).await; // the token: held
    let pid = written_pid(&pid_file).await.to_string();
    std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert_eq!(next(&mut lines).await, "exit 0");
    assert!(backend().await.entries(&name).await.unwrap().is_empty());

    let command =
        "-- sh -c 'trap \"echo term; exit 3\" TERM; echo ready; while :; do sleep 0.05; done'";
    let (_sh, mut lines) = background(command);
    assert_eq!(next(&mut lines).await, "ready");
    let pid = written_pid(&pid_file).await.to_string();
    std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert_eq!(next(&mut lines).await, "term");
    assert_eq!(next(&mut lines).await, "exit 3");
    assert!(backend().await.entries(&name).await.unwrap().is_empty());
}

/// `elect NAME VALUE` prints key, value and token on one line each, whatever the value holds:
/// a newline in it is escaped. (Before: printed raw, four lines.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_prints_the_value_on_one_line() {
    let name = name("elect-newline");
    let mut leader = Running::spawn(&["elect", &name, "node-a\nrole=primary"]);
    assert!(leader.line().await.starts_with(&format!("{name}/")));
    assert_eq!(leader.line().await, "node-a\\nrole=primary");
    assert!(leader.line().await.parse::<u64>().is_ok(), "the token");
    leader.signal("-TERM");
    assert_eq!(leader.exit_code().await.0, 0);
}

/// `-h` is short, `--help` tells the rules; a subcommand's own options come before the global
/// ones, under their own heading. (Before: `elect -h` printed the whole supervision text, and
/// `lock --help` mixed `--endpoints` with `--ttl`.)
#[tokio::test]
async fn help_is_short_with_h_and_headed() {
    let help = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_baton"))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    for sub in ["lock", "elect"] {
        let short = help(&[sub, "-h"]);
        assert!(!short.contains("process group"), "{sub} -h: {short}");
        assert!(!short.contains("Exit codes"), "{sub} -h: {short}");
        assert!(
            short.contains("--help"),
            "{sub} -h points to --help: {short}"
        );
        let long = help(&[sub, "--help"]);
        assert!(
            long.contains("process group") && long.contains("Exit codes"),
            "{sub} --help: {long}"
        );
        // --timeout says both of its codes: 75 waiting for the lock, 69 still connecting
        // (before: "exit code 75" only).
        let timeout = short
            .lines()
            .find(|l| l.trim_start().starts_with("--timeout"))
            .expect("--timeout");
        assert!(
            timeout.contains("75") && timeout.contains("69"),
            "{sub}: {timeout}"
        );
        for text in [&short, &long] {
            let own = text.find("--ttl").expect("--ttl");
            let heading = text.find("Global options:").expect("a heading");
            let global = text.find("--endpoints").expect("--endpoints");
            assert!(own < heading && heading < global, "{sub}: {text}");
        }
    }
}

/// `status` says, of each entry, its lease's remaining TTL, the host and process that own it
/// and since when it queued (issue #38); `ls` lists every name under a prefix with its holder
/// and waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_ls_say_who_holds_since_when() {
    let name = name("who");
    let backend = backend().await;
    let mut holder = Running::spawn(&["lock", &name]);
    holder.line().await; // the key: it holds
    let waiter = Running::spawn(&["lock", &name]);
    eventually("the waiter queues", || async {
        backend.entries(&name).await.unwrap().len() == 2
    })
    .await;
    let out = baton(&["status", &name, "--json"]).output().await.unwrap();
    assert_exit(&out, 0);
    let json = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = json.lines().collect();
    assert_eq!(lines.len(), 2, "{json}");
    let pid = holder.child.id().unwrap();
    assert!(lines[0].contains("\"role\":\"holder\""), "{json}");
    assert!(lines[0].contains(&format!("\"pid\":{pid}")), "{json}");
    assert!(
        lines[0].contains(&format!(
            "\"host\":\"{}\"",
            baton::inspect::host_name().unwrap()
        )),
        "{json}"
    );
    assert!(
        !lines[0].contains("\"ttl\":null"),
        "the remaining TTL: {json}"
    );
    assert!(!lines[0].contains("\"since_ms\":null"), "{json}");
    assert!(lines[1].contains("\"role\":\"waiter1\""), "{json}");
    let table = baton(&["status", &name]).output().await.unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.lines().next().unwrap().contains("SINCE"), "{table}");
    assert!(table.contains("s ago"), "{table}");

    // A second name under the same prefix: `ls` shows both, each with its holder.
    let other = format!("{name}-other");
    let mut other_holder = Running::spawn(&["lock", &other]);
    other_holder.line().await;
    let prefix = name.rsplit_once('/').unwrap().0;
    let ls = baton(&["ls", prefix, "--json"]).output().await.unwrap();
    assert_exit(&ls, 0);
    let ls = String::from_utf8(ls.stdout).unwrap();
    let mine = ls
        .lines()
        .find(|l| l.contains(&format!("\"name\":\"{name}\"")))
        .unwrap_or_else(|| panic!("{ls}"));
    assert!(mine.contains("\"waiters\":1"), "{mine}");
    assert!(ls.contains(&format!("\"name\":\"{other}\"")), "{ls}");
    let table = baton(&["ls", prefix]).output().await.unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.contains(&other) && table.contains("HELD BY"),
        "{table}"
    );

    for running in [&holder, &waiter, &other_holder] {
        running.signal("-TERM");
    }
    for running in [holder, waiter, other_holder] {
        let (code, stderr) = running.exit_code().await;
        // A holder released at the signal; the waiter was interrupted while it waited.
        assert!(code == 0 || code == 128 + 15, "{code}: {stderr}");
    }
}

/// `break` refuses to end a live holder's lease without --force; with it, it prints an audit
/// line, the holder is told and its command stopped (exit 79), and the waiter is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_ends_a_stale_holders_lease_only_when_forced() {
    let name = name("break");
    let backend = backend().await;
    let mut holder = Running::spawn(&["lock", &name, "--", "sh", "-c", "echo started; sleep 60"]);
    assert_eq!(holder.line().await, "started");
    let mut waiter = Running::spawn(&["lock", &name, "--", "echo", "next"]);
    eventually("the waiter queues", || async {
        backend.entries(&name).await.unwrap().len() == 2
    })
    .await;
    let refused = baton(&["break", &name]).output().await.unwrap();
    assert_exit(&refused, 75);
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("live lease") && why.contains("--force"),
        "{why}"
    );
    assert_eq!(
        backend.entries(&name).await.unwrap().len(),
        2,
        "nothing broken"
    );

    let broken = baton(&["break", &name, "--force"]).output().await.unwrap();
    assert_exit(&broken, 0);
    let audit = String::from_utf8(broken.stdout).unwrap();
    let pid = holder.child.id().unwrap();
    assert!(
        audit.contains(&format!("broke `{name}`"))
            && audit.contains(&format!("pid {pid}"))
            && audit.contains("token")
            && audit.contains("forced"),
        "{audit}"
    );
    let (code, stderr) = holder.exit_code().await;
    assert_eq!(
        code, 79,
        "the holder is told and its command stopped: {stderr}"
    );
    assert_eq!(waiter.line().await, "next");
    assert_eq!(waiter.exit_code().await.0, 0);
}

/// A store baton has never marked may have lost its state: its first lock waits the restart
/// grace, and `--try` says so (issue #36, #38). `baton init` marks a new store, and the first
/// lock is granted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_never_marked_waits_the_grace_unless_init_marks_it() {
    let node = EtcdNode::start().await.unwrap();
    let endpoints = node.endpoints().join(",");
    let mut client = node.backend().await.unwrap().client().clone();
    // As an etcd baton has never used: no marker.
    let forget = || {
        let mut client = client.clone();
        async move {
            client.delete("_baton-epoch", None).await.unwrap();
            client.delete("_baton-grace", None).await.unwrap();
        }
    };
    forget().await;
    let run = |args: &[&str]| {
        let mut cmd = baton(args);
        cmd.env("BATON_ENDPOINTS", &endpoints);
        cmd
    };
    let init = run(&["init"]).output().await.unwrap();
    assert_exit(&init, 0);
    let said = String::from_utf8(init.stdout).unwrap();
    assert!(
        said.contains("no baton holder from before exists"),
        "{said}"
    );
    let again = run(&["init"]).output().await.unwrap();
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing changed"));
    let first = run(&["lock", "--try", "first", "--", "true"])
        .output()
        .await
        .unwrap();
    assert_exit(&first, 0);

    forget().await;
    client.get("x", None).await.unwrap();
    let waits = run(&["lock", "--try", "first", "--", "true"])
        .output()
        .await
        .unwrap();
    assert_exit(&waits, 75);
    let why = String::from_utf8_lossy(&waits.stderr);
    assert!(
        why.contains("restart grace") && why.contains("baton init"),
        "{why}"
    );
}
