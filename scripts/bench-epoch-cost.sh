#!/usr/bin/env bash
# What store epochs (issue #36) cost on etcd: the bench's uncontended cycle and its N = 8
# contended cycle (hold 0), for the code before them (95acc96) and for HEAD, run alternately
# on this machine (PAIRS pairs, default 3), each against a fixture etcd of its own. Prints
# requests per cycle, latency and cycles/s per run, and the means. Builds the old code in a
# worktree under target/ (its release build shares target/'s dependencies).
#
# Usage: scripts/bench-epoch-cost.sh [PAIRS]   (just bench-epoch-cost)
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${1:-3}
before=95acc96
old_tree=target/epoch-cost-old
features=testing,etcd,redis
if [ ! -d "$old_tree" ]; then
  git worktree add --detach "$old_tree" "$before" >/dev/null
fi
trap 'git worktree remove --force "$old_tree" >/dev/null 2>&1 || true' EXIT
CARGO_TARGET_DIR="$PWD/target" cargo build --quiet --release --example bench --features "$features" --manifest-path "$old_tree/Cargo.toml"
cp target/release/examples/bench target/bench-before-epochs
cargo build --quiet --release --example bench --features "$features"
cp target/release/examples/bench target/bench-epochs
out=$(mktemp -d)
for i in $(seq 1 "$pairs"); do
  for v in before-epochs epochs; do
    dir=.
    [ "$v" = before-epochs ] && dir=$old_tree
    (cd "$dir" && "$OLDPWD/target/bench-$v" --only contended --n 8 --seconds 5 --out "$out/$v-$i.md" >/dev/null 2>&1)
  done
done
printf '| code | run | uncontended p50 ms | p99 ms | requests/cycle | N = 8 cycles/s | requests/cycle | etcd CPU ms/cycle |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n'
for v in before-epochs epochs; do
  for i in $(seq 1 "$pairs"); do
    f="$out/$v-$i.md"
    read -r p50 p99 req < <(grep -o 'p50 [0-9.]* ms, p99 [0-9.]* ms, \*\*[0-9.]* etcd requests per cycle' "$f" | awk '{print $2, $5, substr($7, 3)}')
    read -r cps rpc cpu < <(grep '^| baton | 8 | 0 ' "$f" | awk -F'|' '{gsub(/ /, ""); print $5, $11, $13}')
    printf '| %s | %d | %s | %s | %s | %s | %s | %s |\n' "$v" "$i" "$p50" "$p99" "$req" "$cps" "$rpc" "$cpu"
  done
done | tee "$out/rows"
awk -F'|' '{ n[$2]++; p50[$2] += $4; cps[$2] += $7 }
  END { for (v in n) printf "%s: mean uncontended p50 %.2f ms, mean N = 8 %.0f cycles/s over %d runs\n", v, p50[v] / n[v], cps[v] / n[v], n[v] }' "$out/rows"
rm -rf "$out"
