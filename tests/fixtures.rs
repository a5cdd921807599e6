//! The rules the server fixtures follow in a user's tests (`baton::testing`): the default image
//! is found or built, the fallback to a binary on `PATH` is opt-in and loud and keeps both
//! causes when it fails, and a killed test process leaves no container behind.
//!
//! Each case runs this binary again as a child process (the ignored test `child`), with the
//! environment it needs (a Docker host that does not answer, a `PATH` without the server):
//! the container client and the environment are process-wide, and a killed process is the
//! point of one case. Redis is the server: its image builds in seconds.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use baton::testing::{DEFAULT_REDIS_IMAGE, RedisNode};

/// A Docker endpoint nothing listens on.
const NO_DOCKER: &str = "unix:///nonexistent/baton-test-docker.sock";

/// Run by the other tests as a child process, never by itself: starts a Redis node and prints
/// what happened on one line; with `BATON_CHILD_HOLD=1` it then holds the node until killed.
/// With `BATON_CHILD_DEBUG=1` an error is printed with `{:?}`, as `?` in a test or a `main`
/// shows it; with `BATON_CHILD_SERVER=zookeeper` the node is ZooKeeper's.
#[tokio::test]
#[ignore = "a child process of the other tests in this file"]
async fn child() {
    #[cfg(feature = "zookeeper")]
    if std::env::var("BATON_CHILD_SERVER").as_deref() == Ok("zookeeper") {
        match baton::testing::ZkNode::start().await {
            Ok(node) => println!("result: ok container={}", node.is_container()),
            Err(e) => println!("result: err {e}"),
        }
        return;
    }
    let node = RedisNode::start().await;
    match &node {
        Ok(node) => println!("result: ok container={}", node.is_container()),
        Err(e) if std::env::var("BATON_CHILD_DEBUG").is_ok() => {
            println!("result: err {}", format!("{e:?}").replace('\n', "\\n"))
        }
        Err(e) => println!("result: err {e}"),
    }
    if std::env::var("BATON_CHILD_HOLD").is_ok() {
        std::future::pending::<()>().await;
    }
}

/// This binary, run as the child with `env` on top of this process's environment (with the
/// variables that would change its course removed).
fn child_command(env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--ignored",
            "--exact",
            "child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env_remove("BATON_REQUIRE_DOCKER")
        .env_remove("BATON_LOCAL_FALLBACK")
        .env_remove("BATON_REDIS_URL")
        .env_remove("BATON_REDIS_IMAGE")
        .env_remove("BATON_ZOOKEEPER_CONNECT")
        .env_remove("BATON_ZOOKEEPER_IMAGE")
        .env_remove("BATON_CHILD_DEBUG")
        .stdin(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    command
}

/// The child's `result:` line, and its standard error.
fn run_child(env: &[(&str, &str)]) -> (String, String) {
    let Output { stdout, stderr, .. } = child_command(env).output().unwrap();
    let stdout = String::from_utf8_lossy(&stdout);
    let result = stdout
        .lines()
        // The harness prints "test child ... " before it, on the same line.
        .find_map(|l| l.split_once("result: ").map(|(_, result)| result))
        .unwrap_or_else(|| panic!("the child printed no result: {stdout}"))
        .to_owned();
    (result, String::from_utf8_lossy(&stderr).into_owned())
}

/// A directory for a `PATH` of our own, holding `files` (name, shell script).
fn bin_dir(test: &str, files: &[(&str, &str)]) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("baton-fixtures-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, script) in files {
        let path = dir.join(name);
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir
}

fn docker(args: &[&str]) -> Output {
    Command::new("docker").args(args).output().unwrap()
}

fn image_exists(image: &str) -> bool {
    docker(&["image", "inspect", image]).status.success()
}

/// Polls `done` every 100 ms until it holds or `limit` passes.
fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn without_docker_there_is_no_silent_fallback() {
    // A redis-server on PATH that would leave a trace if it were run.
    let marker = std::env::temp_dir().join(format!("baton-fixtures-{}-ran", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let dir = bin_dir(
        "silent",
        &[(
            "redis-server",
            &format!("#!/bin/sh\ntouch '{}'\nexit 1\n", marker.display()),
        )],
    );
    let path = format!("{}:/usr/bin:/bin", dir.display());
    let (result, _) = run_child(&[("DOCKER_HOST", NO_DOCKER), ("PATH", &path)]);
    assert!(
        result.starts_with("err could not start redis in a container"),
        "{result}"
    );
    assert!(!marker.exists(), "the fallback ran without being asked for");
    let _ = std::fs::remove_dir_all(dir);
}

/// Without Docker, the error a test gets back, shown with `?` (that is, `{:?}`), is one
/// readable paragraph: what failed, Docker's answer, and the two ways out (start Docker, or
/// `BATON_LOCAL_FALLBACK=1` and what it runs). (Before: `Container { server: "redis", ...,
/// source: Client(Init(SocketNotFoundError(...))) }`, no word of the fallback.)
#[test]
fn a_fixture_error_shown_with_question_mark_says_what_failed_and_how_to_fall_back() {
    for debug in ["1", ""] {
        let mut env = vec![("DOCKER_HOST", NO_DOCKER)];
        if !debug.is_empty() {
            env.push(("BATON_CHILD_DEBUG", debug));
        }
        let (result, _) = run_child(&env);
        assert!(
            result.starts_with("err could not start redis in a container (image ")
                && result.contains("Socket not found: /nonexistent/baton-test-docker.sock")
                && result.contains("Is a Docker daemon running")
                && result.contains("set BATON_LOCAL_FALLBACK=1 to run `redis-server` from PATH")
                && !result.contains("\\n")
                && !result.contains("SocketNotFoundError")
                && !result.contains("Container {"),
            "{result}"
        );
    }
    // CI forbids the fallback: then the message does not offer it.
    let (result, _) = run_child(&[("DOCKER_HOST", NO_DOCKER), ("BATON_REQUIRE_DOCKER", "1")]);
    assert!(
        result.starts_with("err could not start redis in a container")
            && !result.contains("BATON_LOCAL_FALLBACK"),
        "{result}"
    );
}

/// The ZooKeeper fallback says what it runs: `java` on Debian's jars, not the image's
/// `zookeeper-entrypoint`. (Before: "running `zookeeper-entrypoint` from PATH instead", then it
/// ran java.)
#[cfg(feature = "zookeeper")]
#[test]
fn the_zookeeper_fallback_says_it_runs_java() {
    let dir = bin_dir("zk-fallback", &[]);
    std::os::unix::fs::symlink("/bin/sh", dir.join("sh")).unwrap();
    let path = dir.display().to_string();
    let (result, stderr) = run_child(&[
        ("DOCKER_HOST", NO_DOCKER),
        ("BATON_LOCAL_FALLBACK", "1"),
        ("BATON_CHILD_SERVER", "zookeeper"),
        ("PATH", &path),
    ]);
    assert!(
        result.starts_with("err could not start zookeeper"),
        "{result}"
    );
    assert!(
        stderr.contains("BATON_LOCAL_FALLBACK is set: running `java` on Debian's ZooKeeper jars")
            && !stderr.contains("zookeeper-entrypoint"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_failed_fallback_keeps_the_docker_error_too() {
    let dir = bin_dir("failed", &[]);
    // No redis-server (nor docker) on this PATH: only `sh`, for the watchdog. (/bin is
    // /usr/bin on Debian, so it cannot be on the PATH.)
    std::os::unix::fs::symlink("/bin/sh", dir.join("sh")).unwrap();
    let path = dir.display().to_string();
    let (result, stderr) = run_child(&[
        ("DOCKER_HOST", NO_DOCKER),
        ("BATON_LOCAL_FALLBACK", "1"),
        ("PATH", &path),
    ]);
    assert!(
        result.starts_with("err could not start redis: no container ("),
        "{result}"
    );
    assert!(
        result.contains("and the local fallback failed too (could not spawn the redis binary"),
        "{result}"
    );
    // The announcement reached standard error, past the test harness's capture.
    assert!(
        stderr.contains("baton::testing: no container for redis"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_allowed_fallback_runs_the_local_binary_and_says_so() {
    if !Path::new("/usr/bin/redis-server").exists() {
        panic!("this test needs Debian's redis-server installed (scripts/setup.sh does it)");
    }
    let (result, stderr) = run_child(&[("DOCKER_HOST", NO_DOCKER), ("BATON_LOCAL_FALLBACK", "1")]);
    assert_eq!(result, "ok container=false");
    assert!(
        stderr.contains("BATON_LOCAL_FALLBACK is set: running `redis-server` from PATH"),
        "{stderr}"
    );
}

#[test]
fn a_missing_default_image_is_built_and_a_killed_process_leaves_no_container() {
    // Remove the default image (every tag of it), so that the child has to build it.
    let id = String::from_utf8(
        docker(&["image", "inspect", "-f", "{{.Id}}", DEFAULT_REDIS_IMAGE]).stdout,
    )
    .unwrap();
    if !id.trim().is_empty() {
        let removed = docker(&["image", "rm", "-f", id.trim()]);
        assert!(removed.status.success(), "{removed:?}");
    }
    assert!(!image_exists(DEFAULT_REDIS_IMAGE));

    let mut child = child_command(&[("BATON_CHILD_HOLD", "1")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = std::io::BufRead::lines(std::io::BufReader::new(stdout))
        .map_while(Result::ok)
        .find_map(|l| {
            l.split_once("result: ")
                .map(|(_, result)| result.to_owned())
        })
        .unwrap_or_default();
    assert_eq!(line, "ok container=true");
    assert!(image_exists(DEFAULT_REDIS_IMAGE), "the image was not built");

    // The child's container carries its PID.
    let label = format!("label=baton.fixture={}", child.id());
    let ids = || String::from_utf8(docker(&["ps", "-aq", "--filter", &label]).stdout).unwrap();
    assert_eq!(ids().lines().count(), 1, "the child's container");

    // Killed, it runs no destructor; its watchdog removes the container.
    child.kill().unwrap();
    child.wait().unwrap();
    wait_for(
        "the killed child's container removed",
        Duration::from_secs(30),
        || ids().trim().is_empty(),
    );
    let stderr = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
    assert!(
        stderr.contains("baton::testing: the image local/redis:debian is missing: building it"),
        "{stderr}"
    );
}
