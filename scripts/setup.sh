#!/usr/bin/env bash
# Prepares a machine to build and test baton, the same way on a developer's machine and in CI:
# apt packages, the `just` runner, a Docker daemon, and the local PostgreSQL image.
#
# Usage: scripts/setup.sh            (idempotent; safe to run again)
#        scripts/setup.sh build      only what compiling the crate needs (protoc and the protos
#                                    it imports), so that scripts/test can start the build
#                                    while the rest is installed
# Writes the PID of a Docker daemon it started to target/dockerd.pid, so that the caller
# (.ci/run, or you) can stop exactly that process: kill "$(cat target/dockerd.pid)".
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*" >&2; }

need_apt=()
command -v protoc >/dev/null || need_apt+=(protobuf-compiler)
# etcd-client's protos import google/protobuf/*.proto, which this package ships.
[ -f /usr/include/google/protobuf/descriptor.proto ] || need_apt+=(libprotobuf-dev)
if [ "${1:-}" != build ]; then
  [ -x /usr/bin/etcd ] || need_apt+=(etcd-server)
  [ -x /usr/bin/etcdctl ] || need_apt+=(etcd-client)
  command -v dockerd >/dev/null || need_apt+=(docker.io)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # --no-install-recommends keeps docker.io from pulling in extras we do not use.
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
[ "${1:-}" != build ] || exit 0

if ! command -v just >/dev/null; then
  log "installing just (prebuilt wheel rust-just)"
  python3 -m pip install --quiet --disable-pip-version-check rust-just
fi

mkdir -p target
if ! docker info >/dev/null 2>&1; then
  log "starting dockerd (no bridge, no iptables: no private-range addresses exist)"
  # The daemon outlives this script; its PID goes to a file so it is stopped by PID, not name.
  nohup dockerd --bridge=none --iptables=false --ip-masq=false \
    >target/dockerd.log 2>&1 &
  echo $! >target/dockerd.pid
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { log "dockerd did not come up"; tail -n 30 target/dockerd.log >&2; exit 1; }
fi

# The etcd, Redis and ZooKeeper images (local/<server>:debian) are not built here: the
# fixtures build them on first use, with the same scripts embedded in the crate, as they do for
# a user's crate (so CI on a fresh machine takes that path).
# The ZooKeeper interop tests drive Apache Curator and kazoo (tests/peers/).
scripts/install-peers.sh >/dev/null
# The fence tests run PostgreSQL from an image built the same way from Debian's postgresql
# (the script installs the package if it is missing).
scripts/build-postgres-image.sh >/dev/null
