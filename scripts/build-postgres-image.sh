#!/usr/bin/env bash
# Builds the PostgreSQL image the tests run, with no container registry: a root filesystem holding
# Debian's postgres, initdb, pg_ctl, psql, pg_isready and pg_basebackup, the share files and extension modules
# they load, the shared libraries `ldd` lists, dash as /bin/sh (initdb runs postgres through
# popen) and a small entrypoint, loaded by `docker import`; and Debian's pgbouncer beside it, for
# the tests of baton behind a pooler (started in the container by the fixture, not by the
# entrypoint). Installs Debian's postgresql and pgbouncer packages (with
# --no-install-recommends) if they are missing. Tags it
# local/postgres:<postgres version>-pgbouncer<pgbouncer version>-r<layout revision> and local/postgres:debian. Prints the versioned name (also written to target/postgres-image) on
# stdout.
#
# The image runs a throwaway cluster, as the non-root user postgres, with host networking only:
#   docker run --rm --network host local/postgres:debian PORT [postgres options...]
# (or -e PGPORT=PORT instead of the argument; 5432 if neither is given). It runs initdb in
# /tmp/pgdata (C locale, UTF8, trust authentication, superuser postgres, database postgres), then
# postgres on 127.0.0.1:PORT only, with fsync off, logging to stderr; once it is up the log says
# "database system is ready to accept connections". Connect with
#   psql -h 127.0.0.1 -p PORT -U postgres postgres
# Extra arguments go to postgres, e.g. `-c max_connections=200`. docker stop makes a fast shutdown
# (the entrypoint turns SIGTERM into SIGINT). --tmpfs /tmp keeps the cluster in memory.
# An asynchronous standby of that server (a second container; the log says "ready to accept
# read-only connections"; promote it with `SELECT pg_promote()`):
#   docker run --rm --network host local/postgres:debian PORT2 --standby-of PORT
# The image carries the label baton.layout=<layout revision>, which the test fixture checks.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=image-lib.sh
. scripts/image-lib.sh

missing=()
for package in postgresql pgbouncer; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'ok installed' ||
    missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The metapackage depends on the distribution's supported major version (15 on Debian 12).
major=$(dpkg-query -W -f='${Depends}' postgresql | grep -o 'postgresql-[0-9]\+' | head -n 1)
major=${major#postgresql-}
version=$(dpkg-query -W -f='${Version}' "postgresql-$major" | sed 's/[^A-Za-z0-9_.-]/_/g')
pgbouncer=$(dpkg-query -W -f='${Version}' pgbouncer | sed 's/[^A-Za-z0-9_.-]/_/g')
# The layout's revision: raised when the image gains something (2: pg_basebackup and standbys),
# so that a machine holding an older image builds the new one.
revision=2
image="local/postgres:${version}-pgbouncer${pgbouncer}-r${revision}"
mkdir -p target
reuse_image "$image" postgres

bindir=/usr/lib/postgresql/$major/bin
pkglibdir=/usr/lib/postgresql/$major/lib
sharedir=/usr/share/postgresql/$major
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
# mktemp makes the directory 0700, and the tar stream carries that mode to the image's "/",
# which the postgres user could then not enter.
chmod 755 "$root"
mkdir -p "$root$bindir" "$root$pkglibdir" "$root/usr/share/postgresql" "$root/usr/share/zoneinfo" \
  "$root/usr/local/bin" "$root/usr/bin" "$root/bin" "$root/tmp" "$root/etc"
chmod 1777 "$root/tmp"

for bin in postgres initdb pg_ctl psql pg_isready pg_basebackup; do
  copy_with_libs "$bindir/$bin" "$bindir/$bin"
done
copy_with_libs /usr/sbin/pgbouncer /usr/bin/pgbouncer
# Modules postgres loads at run time: initdb needs plpgsql and dict_snowball, and the encoding
# conversions are loaded on demand; contrib extensions are cheap. llvmjit drags in LLVM (over
# 100 MB), so JIT is left out (the entrypoint sets jit=off); sepgsql needs SELinux.
for mod in "$pkglibdir"/*.so; do
  case "$(basename "$mod")" in llvmjit.so | sepgsql.so) continue ;; esac
  copy_with_libs "$mod" "$pkglibdir/"
done
# postgres.bki and the SQL initdb runs, timezonesets, tsearch_data, extension scripts; not man.
cp -a "$sharedir" "$root/usr/share/postgresql/"
rm -rf "$root$sharedir/man"
# Debian builds PostgreSQL against the system time zone database (4 MB); TZ=UTC selects from it.
cp -a /usr/share/zoneinfo/. "$root/usr/share/zoneinfo/"
copy_with_libs /bin/dash /bin/sh
# initdb runs `locale -a` to import collations, and warns if it finds none; glibc's C.utf8 is
# 400 kB and lets LANG=C.UTF-8 work too.
copy_with_libs /usr/bin/locale /usr/bin/locale
mkdir -p "$root/usr/lib/locale"
cp -a /usr/lib/locale/C.utf8 "$root/usr/lib/locale/"

# postgres refuses to run as root, so the image runs as postgres (uid and gid 999).
printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'postgres:x:999:999:PostgreSQL:/tmp:/bin/sh' \
  >"$root/etc/passwd"
printf '%s\n' 'root:x:0:' 'postgres:x:999:' >"$root/etc/group"

cat >"$root/usr/local/bin/postgres-entrypoint" <<'EOF'
#!/bin/sh
# Entrypoint of the image scripts/build-postgres-image.sh builds: a throwaway cluster on
# 127.0.0.1 only. Usage: [PORT] [--standby-of PRIMARY_PORT] [postgres options...]; PORT
# defaults to $PGPORT, then 5432. With --standby-of, the cluster is an asynchronous streaming
# replica of the server on 127.0.0.1:PRIMARY_PORT (pg_basebackup -R), read-only until promoted.
set -eu
port=${PGPORT:-5432}
case "${1:-}" in
  '' | -*) ;;
  *[!0-9]*) echo "postgres-entrypoint: the port must be a number, not '$1'" >&2; exit 2 ;;
  *) port=$1; shift ;;
esac
primary=
if [ "${1:-}" = --standby-of ]; then
  case "${2:-}" in
    '' | *[!0-9]*) echo "postgres-entrypoint: --standby-of needs the primary's port" >&2; exit 2 ;;
  esac
  primary=$2
  shift 2
fi
PGDATA=${PGDATA:-/tmp/pgdata}
if [ -n "$primary" ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
  # A copy of the primary, streaming from it from then on (standby.signal, primary_conninfo).
  pg_basebackup -h 127.0.0.1 -p "$primary" -U postgres -D "$PGDATA" -R -X stream -c fast \
    --no-sync
  echo "postgres-entrypoint: copied the primary on port $primary; starting a standby on 127.0.0.1:$port" >&2
elif [ ! -s "$PGDATA/PG_VERSION" ]; then
  # The C locale needs no locale data; --no-sync because the cluster is thrown away.
  initdb -D "$PGDATA" --username=postgres --auth=trust --locale=C --encoding=UTF8 \
    --no-sync --no-instructions >/dev/null
  echo "postgres-entrypoint: initialised $PGDATA; starting postgres on 127.0.0.1:$port" >&2
fi
postgres -D "$PGDATA" \
  -c listen_addresses=127.0.0.1 -c port="$port" -c unix_socket_directories=/tmp \
  -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c jit=off \
  -c logging_collector=off -c log_destination=stderr "$@" &
pid=$!
# To postgres SIGTERM means a smart shutdown, which waits for every client to disconnect; make
# docker stop's SIGTERM a fast shutdown (SIGINT) instead. docker import cannot set STOPSIGNAL.
trap 'kill -INT "$pid" 2>/dev/null || true' INT TERM
trap 'kill -QUIT "$pid" 2>/dev/null || true' QUIT
# A trapped signal interrupts wait; wait again until postgres has exited, and exit as it did.
while :; do
  wait "$pid" && status=0 || status=$?
  kill -0 "$pid" 2>/dev/null || break
done
exit "$status"
EOF
chmod 755 "$root/usr/local/bin/postgres-entrypoint"

tar -C "$root" --numeric-owner --owner=0 --group=0 -c . | docker import \
  -c 'ENTRYPOINT ["/usr/local/bin/postgres-entrypoint"]' \
  -c "ENV PATH=$bindir:/usr/local/bin:/usr/bin:/bin" \
  -c 'ENV TZ=UTC PGHOST=/tmp' \
  -c 'USER postgres' \
  -c 'WORKDIR /tmp' \
  -c "LABEL baton.layout=$revision" \
  - "$image" >/dev/null
record_image "$image" postgres
