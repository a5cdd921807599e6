#!/usr/bin/env bash
# Installs the peer libraries baton's ZooKeeper interop tests and benchmark drive, and builds
# the peers (tests/peers/README.md):
#   - Apache Curator 5.4.0 from Debian (libcurator-{client,framework,recipes}-java; apt brings
#     ZooKeeper's client jar, Guava, slf4j, ...) and a JDK with javac (default-jdk-headless,
#     only if javac is missing);
#   - kazoo: Debian's python3-kazoo (2.8.0 on bookworm, with the gevent/eventlet/six it
#     needs), and kazoo 2.11.0 from PyPI (pure Python, no dependencies, pinned by hash) into
#     target/peers/kazoo-2.11.0, which the kazoo peer uses. Why: kazoo < 2.9.0 deadlocks a
#     ReadLock queued between two WriteLocks (python-zk/kazoo#649, fixed by #650 in 2.9.0;
#     seen here, tests/peers/RESULTS.md), and docs/zookeeper-research.md describes 2.11.0.
#     BATON_KAZOO=debian skips the PyPI copy (the peer then runs Debian's 2.8.0).
#   Both run on Debian's /usr/bin/python3, not whichever python3 comes first on PATH.
# Then runs scripts/build-peers.sh: the classpath to target/curator-classpath, CuratorPeer
# compiled into target/peers/, launchers target/peers/curator-peer and target/peers/kazoo-peer.
#
# Usage: scripts/install-peers.sh      (idempotent: installs only what is missing)
# Prints the classpath on stdout (as build-peers.sh does); progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[install-peers] %s\n' "$*" >&2; }

packages=(libcurator-client-java libcurator-framework-java libcurator-recipes-java python3-kazoo)
command -v javac >/dev/null || packages+=(default-jdk-headless)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'ok installed' || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
log "Curator $(dpkg-query -W -f='${Version}' libcurator-recipes-java)," \
  "Debian's kazoo $(dpkg-query -W -f='${Version}' python3-kazoo)"

kazoo_dir=target/peers/kazoo-2.11.0
if [ "${BATON_KAZOO:-pypi}" = debian ]; then
  rm -rf "$kazoo_dir"
elif [ ! -f "$kazoo_dir/kazoo-2.11.0.dist-info/METADATA" ]; then
  log "installing kazoo 2.11.0 from PyPI into $kazoo_dir"
  mkdir -p target/peers
  rm -rf "$kazoo_dir"
  requirements=$(mktemp)
  trap 'rm -f "$requirements"' EXIT
  echo 'kazoo==2.11.0 --hash=sha256:aa6be17159540dae4087661b8d4e24c7b58d4dc26170a2d5b8468b06712d84a9' \
    >"$requirements"
  # Debian's pip (python3-pip) if present, else the first python3's: the wheel is pure Python.
  pip=(/usr/bin/python3 -m pip)
  "${pip[@]}" --version >/dev/null 2>&1 || pip=(python3 -m pip)
  "${pip[@]}" install --quiet --disable-pip-version-check --no-deps --require-hashes \
    --no-compile --target "$kazoo_dir" -r "$requirements" 2>&1 \
    | grep -v "Running pip as the 'root' user" >&2 || true
  [ -f "$kazoo_dir/kazoo-2.11.0.dist-info/METADATA" ] || { log "pip install kazoo==2.11.0 failed"; exit 1; }
fi

exec scripts/build-peers.sh
