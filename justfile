# baton's tasks. `just --list` shows them.

# Run every test: unit, doc, the conformance suite on memory and on etcd (testcontainers),
# the CLI beside etcdctl, and the examples on the in-memory backend (each checks its outcome).
test: _clean-containers
    cargo test --all-features
    just _clean-containers
    just examples

# Run every example on the in-memory backend; each exits non-zero if its outcome is wrong.
examples:
    #!/usr/bin/env bash
    set -euo pipefail
    for example in fair_lock leader payment inventory bank_transfer sql_fence semaphore rwlock barriers multilock prometheus; do
      echo "== example $example"
      cargo run --quiet --all-features --example "$example"
    done
    # A mistyped option is refused, not ignored (which would run on the in-memory backend).
    if out=$(cargo run --quiet --all-features --example payment -- --endpoint 127.0.0.1:2379 2>&1); then
      echo "payment ran with an unknown option: $out"; exit 1
    fi
    grep -q "unknown option \`--endpoint\`" <<<"$out" || { echo "payment: $out"; exit 1; }

# Benchmarks against a fixture etcd (beside etcd's own Lock API), a fixture Redis (beside the
# hand-written SET NX PX pattern and rslock) and a fixture ZooKeeper (beside kazoo and Curator:
# the peers of tests/peers, which scripts/install-peers.sh builds; skipped if missing);
# and a fixture PostgreSQL (beside pg_advisory_lock and pg_try_advisory_lock polling);
# rewrites docs/performance.md.
bench:
    cargo run --quiet --release --features testing,etcd,redis,zookeeper,postgres --example bench
    cargo bench --bench memory

# What store epochs cost on etcd (issue #36): the uncontended and N = 8 cycles of the code
# before them (95acc96) and of HEAD, alternately, PAIRS times; prints both and the means.
bench-epoch-cost pairs="3":
    scripts/bench-epoch-cost.sh {{pairs}}

# No regression (issue #39): baton's etcd N = 8/64 and Redis rows of BASE and HEAD, run
# alternately PAIRS times in one run; prints the medians, fails if HEAD's is > 5 % below.
bench-compare base head="HEAD" pairs="3":
    scripts/bench-compare.sh {{base}} {{head}} {{pairs}}

# Soak: contenders on a three-member cluster while members restart (profile: release or dev).
soak seconds="60" profile="release":
    cargo run --quiet --profile {{profile}} --all-features --example soak -- --seconds {{seconds}}

# Run the fault-injection suite and regenerate docs/reliability.md from its output.
reliability runs="1":
    scripts/reliability.sh {{runs}}

# Formatting and lints, as CI runs them.
lint:
    cargo fmt --check
    cargo clippy --all-targets --all-features -- -D warnings
    # The default build (no feature: the in-memory backend alone) stays clean too.
    cargo clippy --all-targets -- -D warnings
    RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --all-features --quiet
    RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet

# Each feature builds on its own: the library with no feature and with each feature alone,
# and the CLI binary with `cli`. Code behind a `cfg` that only ever builds beside other
# features (a type of `testing` that exists only with a backend) breaks a user who asks for
# that feature alone, and nothing else would notice. `cargo check`, to keep it fast. The
# library with no feature is checked by `just lint` (clippy without features), and with
# `cli` alone by the CLI binary's check below: not twice (CI's 30-minute budget, #37).
features:
    #!/usr/bin/env bash
    set -euo pipefail
    # As a crate that depends on baton builds it: without this repository's
    # `--cfg tokio_unstable` (.cargo/config.toml), which an empty RUSTFLAGS overrides.
    export RUSTFLAGS=""
    for feature in etcd redis zookeeper postgres redlock serde testing nemesis; do
      echo "== feature $feature alone"
      cargo check --quiet --lib --no-default-features --features "$feature"
    done
    echo "== the CLI binary (feature cli alone)"
    cargo check --quiet --bin baton --no-default-features --features cli

# The crate as it would be published: packaged (what `include` ships) and built from the
# package, then a dry run of the upload.
package:
    cargo package --allow-dirty
    cargo publish --dry-run --allow-dirty

# The demo: several workers on the in-memory backend, no server needed.
demo:
    cargo run --example fair_lock

# Install what the tests need (apt packages, just, a Docker daemon, the etcd image).
# `scripts/test` does this and then runs the tests: the README's test command.
setup:
    scripts/setup.sh

# Remove fixture containers whose test process no longer runs (the label's value is its PID;
# each test process's watchdog normally does this as it exits). Containers of tests running
# beside this one are left alone.
_clean-containers:
    #!/usr/bin/env bash
    if docker info >/dev/null 2>&1; then
      for id in $(docker ps -aq --filter label=baton.fixture); do
        pid=$(docker inspect -f '{{{{index .Config.Labels "baton.fixture"}}' "$id")
        kill -0 "$pid" 2>/dev/null || docker rm -f "$id" >/dev/null
      done
    fi

# The deterministic simulation (tests/simulate.rs): schedules from SEED (default: fresh, from
# the clock; printed) for SECONDS of wall time, each checked; a violation prints its seed, the
# shortest failing schedule and the command that replays it, and fails the run. A release
# build (about 20 times the schedules a minute of a debug one). Every build here seeds
# tokio's select! (.cargo/config.toml: --cfg tokio_unstable), so a seed replays exactly.
simulate seconds="60" seed="":
    cargo test --quiet --release --features testing --test simulate -- {{seconds}} {{seed}}

# The same in the debug build `just test` makes (all features): nothing to compile after
# it, so CI runs its fresh seeds here. A seed it prints replays with `just simulate-replay
# SEED STEPS dev` (the same binary).
simulate-dev seconds="60" seed="":
    cargo test --quiet --all-features --test simulate -- {{seconds}} {{seed}}

# Replays one schedule of the simulation and prints its history (STEPS: fewer steps per
# client, 0 for all; PROFILE: release, or dev for `just simulate-dev`'s build).
simulate-replay seed steps="0" profile="release":
    #!/usr/bin/env bash
    set -euo pipefail
    if [ "{{profile}}" = dev ]; then
      cargo test --quiet --all-features --test simulate -- replay {{seed}} {{steps}}
    else
      cargo test --quiet --release --features testing --test simulate -- replay {{seed}} {{steps}}
    fi

# Plants realistic bugs one at a time and runs the simulation against each (issue #37):
# which it catches, which survive (target/mutants.md; docs/reliability.md quotes it).
mutants seconds="60" seed="1000":
    scripts/mutants.sh {{seconds}} {{seed}}

# The nemesis (issue #26; feature `nemesis`): client processes on every recipe (CLIENTS per
# recipe, default 3, more than the semaphore's 2 permits; or BATON_NEMESIS_CLIENTS) while a
# seeded schedule pauses, kills and cuts them off and restarts, rolls back or flushes the
# server; a checker reads the history; on Redis it also promotes a replica (in sync or
# behind), on ZooKeeper it expires a client's sessions, on PostgreSQL it crashes the server,
# ends connections and promotes a standby.
# BACKEND: etcd, redis, zookeeper or postgres (one server), etcd-cluster or
# zookeeper-ensemble (three members: a follower or the leader paused, a member or the leader
# killed and restarted with its data), redis-sentinel (a primary, a replica, three Sentinels:
# failed over by SENTINEL FAILOVER, by killing or freezing the primary; clients paused and
# killed, not cut off). The schedule is planned to fill SECONDS and carried out
# whole (a run may take longer: restarts wait for the server), so SEED replays the same faults
# (default seed: the time). BATON_NEMESIS_BUG=admit-lower, read-before-claim or no-grace
# injects a defect the checker must catch.
nemesis backend seconds seed="" clients="":
    BATON_NEMESIS_CLIENTS="{{clients}}" cargo test --features nemesis --test nemesis -- {{backend}} {{seconds}} {{seed}}

# The schedule a run would carry out (each fault, when, which it skips and why; the kinds of
# fault it draws and misses of those the server offers), without starting anything.
nemesis-plan backend seconds seed clients="":
    cargo test --quiet --features nemesis --test nemesis -- plan {{backend}} {{seconds}} {{seed}} {{clients}}

# The first seeds from FROM whose schedules of SECONDS draw every kind of fault BACKEND
# offers, with their planned lengths (how the CI's seeds are chosen).
nemesis-seek backend seconds from="1" clients="":
    BATON_NEMESIS_CLIENTS="{{clients}}" cargo test --quiet --features nemesis --test nemesis -- seek {{backend}} {{seconds}} {{from}}

# Check a history a nemesis run saved (target/nemesis/BACKEND-SEED.history) again, with this
# build's checker.
nemesis-check file:
    cargo test --features nemesis --test nemesis -- check {{file}}
