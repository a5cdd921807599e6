#!/usr/bin/env bash
# Builds the ZooKeeper image the tests run, with no container registry: a root filesystem
# holding Debian's ZooKeeper jars (the `zookeeper` package, and every jar their manifests'
# Class-Path names, recursively), slf4j-simple (so that the server logs to stderr), the
# headless Java runtime Debian's default-java points at (without its tools, man pages, legal
# texts, desktop libraries and the symbol tables only javac reads) with the shared libraries
# `ldd` lists, dash as /bin/sh, mkdir and a small entrypoint, loaded by `docker import`.
# Installs Debian's zookeeper package (with --no-install-recommends; it brings the Java
# runtime) if it is missing. Tags it local/zookeeper:<Debian version> and
# local/zookeeper:debian (the fixtures' default image; they run this script, embedded in the
# crate, when that image is missing). Prints the versioned
# name (also written to target/zookeeper-image) on stdout. About 185 MB, most of it the JVM's
# class library (lib/modules); the JRE's own files are taken as they are, not jlinked.
#
# The entrypoint writes /tmp/zookeeper/zoo.cfg from its arguments and runs
# `java -cp <the jars> org.apache.zookeeper.server.quorum.QuorumPeerMain` on it, as Debian's
# zkServer.sh start-foreground does (without JMX). Use host networking only:
#   docker run --rm --network host local/zookeeper:debian clientPort=12181 tickTime=200
# Arguments:
#   key=value  a line of zoo.cfg; it comes after the image's defaults
#              (dataDir=/tmp/zookeeper/data, clientPort=2181, clientPortAddress=127.0.0.1,
#              admin.enableServer=false, 4lw.commands.whitelist=*, tickTime=2000,
#              initLimit=10, syncLimit=5), so it overrides them. A key ZooKeeper does not
#              know becomes the Java system property zookeeper.<key> (e.g. forceSync=no).
#              With secureClientPort=N among them, the defaults clientPort and
#              clientPortAddress are left out: a server with a TLS client port only.
#   myid=N     for a member of an ensemble (server.N=127.0.0.1:<quorum port>:<election port>
#              lines): written to the data directory's myid file, not to zoo.cfg.
#   -...       a JVM option, after the image's (-Xmx512m, -XX:+ExitOnOutOfMemoryError).
# The server logs to stderr; `echo ruok | nc 127.0.0.1 PORT` answers imok once the process
# listens, and `srvr` reports "Mode: standalone|leader|follower" once it serves. A container
# stopped and started again keeps its data directory, hence its data and sessions.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=image-lib.sh
. scripts/image-lib.sh

if ! dpkg-query -W -f='${Status}' zookeeper 2>/dev/null | grep -q 'ok installed'; then
  echo "installing zookeeper" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends zookeeper >/dev/null
fi
version=$(dpkg-query -W -f='${Version}' zookeeper)
version=$(echo "${version#*:}" | sed 's/[^A-Za-z0-9_.-]/_/g')
# The layout's revision: raised when the image gains something (2: the Netty jars and the
# entrypoint's secure-port-only mode, for TLS). The image carries it as the label
# baton.layout, which the test fixture checks.
revision=2
image="local/zookeeper:${version}-r${revision}"
mkdir -p target
reuse_image "$image" zookeeper

# The runtime the package's default-jre dependency installed (not whichever `java` is first on
# PATH), and the package that owns it, whose file list says what a headless runtime is.
java_home=$(readlink -f /usr/lib/jvm/default-java)
jre_package=$(dpkg-query -S "$java_home/lib/server/libjvm.so" | cut -d: -f1)

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
# mktemp makes the directory 0700, and the tar stream would carry that mode to the image's "/".
chmod 755 "$root"
mkdir -p "$root/usr/local/bin" "$root/bin" "$root/tmp" "$root/etc"
chmod 1777 "$root/tmp"

# The runtime: bin/java, lib/ and conf/ (their links into /etc/java-*-openjdk resolved). Left
# out: the other tools, ct.sym (javac's), the archive for heaps over 32 GB, man pages, legal
# texts, and the native parts of AWT, fonts, images, sound and smart cards (with the X, font
# and sound libraries they would bring), which a server never loads.
while read -r file; do
  [ -d "$file" ] && continue
  case "${file#"$java_home"/}" in
    bin/java | lib/* | conf/* | release) ;;
    *) continue ;;
  esac
  case "${file##*/}" in
    ct.sym | classes_nocoops.jsa | src.zip) continue ;;
    libawt*.so | libfontmanager.so | libjavajpeg.so | libjsound.so | liblcms.so) continue ;;
    libmlib_image.so | libsplashscreen.so | libj2pcsc.so) continue ;;
  esac
  # A link whose target is missing (cacerts, when ca-certificates-java is absent) is skipped.
  [ -e "$file" ] || continue
  mkdir -p "$root$(dirname "$file")"
  cp -L "$file" "$root$file"
  case "$file" in
    */bin/java | *.so) copy_with_libs "$file" "$file" ;;
  esac
done < <(dpkg-query -L "$jre_package" | grep "^$java_home/")

# The jars: the server's, every jar their manifests' Class-Path names (absolute paths in
# Debian's jars, kept so that the manifests still resolve), and a logging provider; and the
# Netty jars the TLS server (NettyServerCnxnFactory) loads that no manifest names: netty-handler's
# SslHandler is a netty-codec decoder, netty-transport resolves addresses with netty-resolver,
# and the epoll transport needs netty-transport-native-unix-common.
mapfile -t jars < <(python3 - /usr/share/java/zookeeper.jar /usr/share/java/slf4j-simple.jar \
  /usr/share/java/netty-codec.jar /usr/share/java/netty-resolver.jar \
  /usr/share/java/netty-transport-native-unix-common.jar <<'EOF'
import os, sys, zipfile

seen, todo = [], list(sys.argv[1:])
while todo:
    jar = todo.pop(0)
    if jar in seen or not os.path.isfile(jar):
        continue
    seen.append(jar)
    try:
        manifest = zipfile.ZipFile(jar).read("META-INF/MANIFEST.MF").decode("utf-8", "replace")
    except KeyError:
        continue
    # A manifest line longer than 72 bytes continues on lines that start with one space.
    for line in manifest.replace("\r\n", "\n").replace("\n ", "").split("\n"):
        if line.startswith("Class-Path:"):
            for entry in line[len("Class-Path:"):].split():
                todo.append(os.path.join(os.path.dirname(jar), entry))
print("\n".join(seen))
EOF
)
for jar in "${jars[@]}"; do
  mkdir -p "$root$(dirname "$jar")"
  cp -L "$jar" "$root$jar"
done
classpath=$(IFS=:; echo "${jars[*]}")

copy_with_libs /bin/dash /bin/sh
copy_with_libs /bin/mkdir /bin/mkdir
echo 'root:x:0:0:root:/root:/bin/sh' >"$root/etc/passwd"
printf '%s\n' 'root:x:0:' >"$root/etc/group"

cat >"$root/usr/local/bin/zookeeper-entrypoint" <<'EOF'
#!/bin/sh
# Entrypoint of the image scripts/build-zookeeper-image.sh builds: writes zoo.cfg from the
# arguments (key=value lines; myid=N to the data directory; -... to the JVM) and runs the server
# as zkServer.sh start-foreground would, with the image's $CLASSPATH.
set -eu
dir=/tmp/zookeeper
data=$dir/data
myid=
mkdir -p "$dir"
# printf is a dash builtin; the image has no cat.
# With a secureClientPort argument the server has no plain client port: the defaults
# clientPort and clientPortAddress are left out (zoo.cfg cannot unset them later).
plain='clientPort=2181 clientPortAddress=127.0.0.1'
for arg; do
  case $arg in secureClientPort=*) plain= ;; esac
done
# $plain is split on purpose: two lines, or none.
# shellcheck disable=SC2086
printf '%s\n' "dataDir=$data" $plain \
  admin.enableServer=false '4lw.commands.whitelist=*' tickTime=2000 initLimit=10 syncLimit=5 \
  >"$dir/zoo.cfg"
# The arguments are walked once: JVM options are appended to "$@", the originals shifted off.
n=$#
for arg; do
  case $arg in
    -*) set -- "$@" "$arg" ;;
    myid=*) myid=${arg#myid=} ;;
    dataDir=*) data=${arg#dataDir=}; echo "$arg" >>"$dir/zoo.cfg" ;;
    *=*) echo "$arg" >>"$dir/zoo.cfg" ;;
    *) echo "zookeeper-entrypoint: expected key=value or -jvm-option, not '$arg'" >&2; exit 2 ;;
  esac
done
shift "$n"
mkdir -p "$data"
[ -z "$myid" ] || echo "$myid" >"$data/myid"
exec java -Xmx512m -XX:+ExitOnOutOfMemoryError \
  -Dorg.slf4j.simpleLogger.showDateTime=true -Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS \
  "$@" -cp "$CLASSPATH" org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg"
EOF
chmod 755 "$root/usr/local/bin/zookeeper-entrypoint"

tar -C "$root" --numeric-owner --owner=0 --group=0 -c . | docker import \
  -c 'ENTRYPOINT ["/usr/local/bin/zookeeper-entrypoint"]' \
  -c "ENV PATH=$java_home/bin:/usr/local/bin:/usr/bin:/bin" \
  -c "ENV CLASSPATH=$classpath" \
  -c 'WORKDIR /tmp' \
  -c "LABEL baton.layout=$revision" \
  - "$image" >/dev/null
record_image "$image" zookeeper
