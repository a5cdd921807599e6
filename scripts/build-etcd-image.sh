#!/usr/bin/env bash
# Builds the etcd image the tests run, with no container registry: a root filesystem holding
# Debian's etcd and etcdctl and the shared libraries `ldd` lists, loaded by `docker import`.
# Tags it local/etcd:<Debian version> and local/etcd:debian (the name .cargo/config.toml gives
# the tests). Prints the versioned name (also written to target/etcd-image) on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(dpkg-query -W -f='${Version}' etcd-server | sed 's/[^A-Za-z0-9_.-]/_/g')
image="local/etcd:${version}"
mkdir -p target
if docker image inspect "$image" >/dev/null 2>&1; then
  docker tag "$image" local/etcd:debian
  echo "$image" | tee target/etcd-image
  exit 0
fi

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/bin" "$root/tmp" "$root/var/lib/etcd" "$root/etc"
chmod 1777 "$root/tmp"
for bin in /usr/bin/etcd /usr/bin/etcdctl; do
  cp -L "$bin" "$root/usr/bin/"
  # ldd prints "name => /path (addr)" or "/path (addr)" for the loader; copy every path.
  for lib in $(ldd "$bin" 2>/dev/null | grep -o '/[^ ]*' || true); do
    mkdir -p "$root$(dirname "$lib")"
    cp -Ln "$lib" "$root$lib"
  done
done
echo 'root:x:0:0:root:/root:/bin/sh' >"$root/etc/passwd"
tar -C "$root" -c . | docker import \
  -c 'ENTRYPOINT ["/usr/bin/etcd"]' \
  -c 'ENV ETCDCTL_API=3' \
  - "$image" >/dev/null
docker tag "$image" local/etcd:debian
echo "built $image" >&2
echo "$image" | tee target/etcd-image
