#!/usr/bin/env bash
# Builds the Redis image the tests run, with no container registry: a root filesystem holding
# Debian's redis-server and redis-cli and the shared libraries `ldd` lists, loaded by
# `docker import`. Installs Debian's redis-server package (with --no-install-recommends; it
# brings redis-tools, hence redis-cli) if it is missing. Tags it local/redis:<Debian version,
# without the epoch> and local/redis:debian (the fixtures' default image; they run this script, embedded in the
# crate, when that image is missing).
# Prints the versioned name (also written to target/redis-image) on stdout.
#
# The image's entrypoint is redis-server, with no configuration file: pass everything as
# arguments, and use host networking only, e.g.
#   docker run --rm --network host local/redis:debian --bind 127.0.0.1 --port 16399 --save ''
# Once it is up the log says "Ready to accept connections".
#
# The same image runs Redis Sentinel: Debian's redis-sentinel package installs a symlink to this
# very binary (its mode follows its name, or --sentinel), so nothing more is copied. Run it with a
# configuration file it can rewrite, e.g. `... local/redis:debian /data/sentinel.conf --sentinel`
# (baton::testing::RedisSentinel copies one in); its log says "+monitor master" once it watches.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=image-lib.sh
. scripts/image-lib.sh

if ! dpkg-query -W -f='${Status}' redis-server 2>/dev/null | grep -q 'ok installed'; then
  echo "installing redis-server" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends redis-server >/dev/null
fi
# Debian's version carries an epoch ("5:7.0.15-1~deb12u10"); a tag cannot hold the colon.
version=$(dpkg-query -W -f='${Version}' redis-server)
version=$(echo "${version#*:}" | sed 's/[^A-Za-z0-9_.-]/_/g')
image="local/redis:${version}"
mkdir -p target
reuse_image "$image" redis

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
# mktemp makes the directory 0700, and the tar stream would carry that mode to the image's "/".
chmod 755 "$root"
mkdir -p "$root/usr/bin" "$root/tmp" "$root/data" "$root/etc"
chmod 1777 "$root/tmp"
# /usr/bin/redis-server is a symlink to redis-check-rdb; the binary picks its mode from the
# name it runs under, and copy_with_libs copies the target under the link's name.
for bin in /usr/bin/redis-server /usr/bin/redis-cli; do
  copy_with_libs "$bin" /usr/bin/
done
echo 'root:x:0:0:root:/root:/bin/sh' >"$root/etc/passwd"
printf '%s\n' 'root:x:0:' >"$root/etc/group"
tar -C "$root" --numeric-owner --owner=0 --group=0 -c . | docker import \
  -c 'ENTRYPOINT ["/usr/bin/redis-server"]' \
  -c 'WORKDIR /data' \
  - "$image" >/dev/null
record_image "$image" redis
