#!/usr/bin/env bash
# Builds the etcd image the tests run, with no container registry: a root filesystem holding
# Debian's etcd and etcdctl and the shared libraries `ldd` lists, loaded by `docker import`.
# Installs Debian's etcd-server and etcd-client packages if they are missing. Tags it
# local/etcd:<Debian version> and local/etcd:debian (the fixtures' default image; they run
# this script, embedded in the crate, when that image is missing). Prints the versioned name
# (also written to target/etcd-image) on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=image-lib.sh
. scripts/image-lib.sh

for pkg in etcd-server etcd-client; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed'; then
    echo "installing $pkg" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null
  fi
done
version=$(dpkg-query -W -f='${Version}' etcd-server | sed 's/[^A-Za-z0-9_.-]/_/g')
image="local/etcd:${version}"
mkdir -p target
reuse_image "$image" etcd

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/bin" "$root/tmp" "$root/var/lib/etcd" "$root/etc"
chmod 1777 "$root/tmp"
for bin in /usr/bin/etcd /usr/bin/etcdctl; do
  copy_with_libs "$bin" /usr/bin/
done
echo 'root:x:0:0:root:/root:/bin/sh' >"$root/etc/passwd"
tar -C "$root" -c . | docker import \
  -c 'ENTRYPOINT ["/usr/bin/etcd"]' \
  -c 'ENV ETCDCTL_API=3' \
  - "$image" >/dev/null
record_image "$image" etcd
