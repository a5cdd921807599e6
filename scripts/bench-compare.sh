#!/usr/bin/env bash
# No regression, measured in one run: baton's etcd contended rows (N = 8 and 64) and its Redis
# rows (N = 1, 8, 64) for two commits, BASE and HEAD, run alternately on this machine (PAIRS
# pairs, default 3: A B B A ...; its speed drifts by a third from hour to hour, so runs of one
# commit an hour apart compare nothing). Each run starts its own etcd and Redis (the bench's
# fixtures). Prints every run, the medians and HEAD's change; exits 1 if a median of HEAD is
# more than 5 % below BASE's (a gain is no regression).
#
# Both sides should measure the same servers with the same settings, which the bench harness
# (examples/) chooses: by default both run HEAD's harness, built against each side's library.
# When HEAD's harness does not build against BASE, HARNESS=own runs each side's own, and
# BASE_PATCH=FILE (a patch for `git apply`) may bring BASE's harness to HEAD's settings
# (scripts/bench-compare-aof.patch: Redis with its append-only file, as since 6ef6d47).
#
# Both commits are built in worktrees under target/ that share target/'s release build (only
# the crate itself is compiled twice). Hold the shared build lock for the whole run, so that
# nobody builds meanwhile (docs in /work/helper-common.md).
#
# Usage: scripts/bench-compare.sh BASE HEAD [PAIRS] [SECONDS]   (just bench-compare BASE HEAD)
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: scripts/bench-compare.sh BASE HEAD [PAIRS] [SECONDS]}
head=${2:?usage: scripts/bench-compare.sh BASE HEAD [PAIRS] [SECONDS]}
pairs=${3:-3}
secs=${4:-3}
features=testing,etcd,redis
root=$PWD
out=$(mktemp -d)
trees=()
cleanup() {
  for t in "${trees[@]}"; do git worktree remove --force "$t" >/dev/null 2>&1 || true; done
  rm -rf "$out"
}
trap cleanup EXIT
for side in base head; do
  rev=${!side}
  tree=target/compare-$side
  git worktree remove --force "$tree" >/dev/null 2>&1 || true
  git worktree add --detach "$tree" "$rev" >/dev/null
  trees+=("$tree")
  if [ "$side" = base ]; then
    if [ "${HARNESS:-head}" = head ]; then
      git -C "$tree" checkout "$(git rev-parse "$head")" -- examples
    elif [ -n "${BASE_PATCH:-}" ]; then
      git -C "$tree" apply "$root/$BASE_PATCH"
    fi
  fi
  CARGO_TARGET_DIR="$root/target" cargo build --quiet --release --example bench \
    --features "$features" --manifest-path "$tree/Cargo.toml"
  cp target/release/examples/bench "target/bench-$side"
  echo "built $side = $(git rev-parse --short "$rev")" >&2
done
# Pairs alternate which side runs first (A B, B A, ...): a drift within a pair (the machine,
# the disk's write-back of the run before) then favours neither side.
for i in $(seq 1 "$pairs"); do
  order="base head"
  if [ $((i % 2)) -eq 0 ]; then order="head base"; fi
  for side in $order; do
    echo "run $i: $side" >&2
    (cd "target/compare-$side" && "$root/target/bench-$side" --only contended --n 8,64 \
      --seconds "$secs" --out "$out/$side-etcd-$i.md" >/dev/null 2>&1)
    (cd "target/compare-$side" && "$root/target/bench-$side" --only redis --n 1,8,64 \
      --seconds "$secs" --scale 100 --out "$out/$side-redis-$i.md" >/dev/null 2>&1)
  done
done
# Rows: side, run, row name, cycles/s. The etcd table has `hold ms` before cycles/s.
for side in base head; do
  for i in $(seq 1 "$pairs"); do
    awk -F'|' -v s="$side" -v i="$i" '
      $2 ~ /^ baton $/ && $4 ~ /^ 0 $/ { gsub(/ /, "", $3); gsub(/ /, "", $5); print s, i, "etcd-N" $3, $5 }' \
      "$out/$side-etcd-$i.md"
    awk -F'|' -v s="$side" -v i="$i" '
      $2 ~ /^ baton $/ && $3 ~ /^ [0-9]+ $/ { gsub(/ /, "", $3); gsub(/ /, "", $4); print s, i, "redis-N" $3, $4 }' \
      "$out/$side-redis-$i.md"
  done
done >"$out/rows"
printf '| row | run | base cycles/s | head cycles/s |\n| --- | ---: | ---: | ---: |\n'
awk '{ v[$3 " " $2 " " $1] = $4; rows[$3] = 1; runs[$2] = 1 }
  END { for (r in rows) for (i in runs) printf "| %s | %s | %s | %s |\n", r, i, v[r " " i " base"], v[r " " i " head"] }' \
  "$out/rows" | sort
echo
awk -v limit=5 '
  { vals[$3 " " $1] = vals[$3 " " $1] " " $4; rows[$3] = 1 }
  function median(list,   a, n, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  END {
    bad = 0
    printf "| row | base median | head median | change | verdict |\n| --- | ---: | ---: | ---: | --- |\n"
    for (r in rows) {
      b = median(vals[r " base"]); h = median(vals[r " head"])
      change = b > 0 ? (h - b) * 100 / b : 0
      verdict = change < -limit ? "**slower by more than " limit " %**" : "ok"
      if (change < -limit) bad = 1
      printf "| %s | %.0f | %.0f | %+.1f %% | %s |\n", r, b, h, change, verdict
    }
    exit bad
  }' "$out/rows"
