#!/usr/bin/env bash
# The tools must be able to fail (issue #37): plants one realistic bug at a time in the queue
# engine, the recipes, the session, the store epochs and the fences, runs the deterministic
# simulation against it (release build, fresh seeds from SEED, no regression seeds, at most SECONDS each), and
# reports which mutants it caught, with the first rule broken and the seed, and which
# survived. Every file is restored after each mutant (git checkout), also on interrupt.
#
# Usage: scripts/mutants.sh [SECONDS] [SEED] [MUTANT...]   (just mutants)
# Writes the table to target/mutants.md (docs/reliability.md quotes it).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
seed="${2:-1000}"
shift $(( $# > 2 ? 2 : $# ))
only=("$@")

# name^file^what the mutant does^exact text^replacement (\n for newlines, \& for &)
mutants=(
  'grant-on-wake^src/queue.rs^grants when the predecessor is seen gone, without re-reading the queue^            if head {\n                return Ok(());\n            }^            let _ = head;\n            return Ok(());'
  'failed-wait-as-gone^src/queue.rs^takes a failed wait for the predecessor as its deletion, and grants^                    failures = failures.saturating_add(1);\n                    continue;\n                }\n            };\n            failures = 0;\n            last_gone^                    let _ = (e, failures);\n                    return Ok(());\n                }\n            };\n            failures = 0;\n            last_gone'
  'deadline-from-answer^src/session/keeper.rs^counts the session deadline from the renewal'"'"'s answer, not from its send^            kept.deadline = sent + granted;^            kept.deadline = Instant::now() + granted;'
  'permits-le-stored-limit^src/queue.rs^a semaphore counts <= instead of < against its stored limit^                    if ahead.len() < limit {^                    if ahead.len() <= limit {'
  'one-permit-over^src/queue.rs^a semaphore grants one permit over its stored limit^                    if ahead.len() < limit {^                    if ahead.len() < limit + 1 {'
  'no-loss-check-before-grant^src/queue.rs^grants to a session whose deadline passed unnoticed^        // Nothing is granted to a lost session, even one whose loss nothing has recorded yet\n        // (its deadline passed while the keep-alive driver did not run).\n        if let Some(reason) = session.loss().check() {^        // Nothing is granted to a lost session, even one whose loss nothing has recorded yet\n        // (its deadline passed while the keep-alive driver did not run).\n        if let Some(reason) = None::<LostReason> {'
  'reader-ignores-writer^src/queue.rs^a read lock ignores a writer ahead of it^        Some(other) => Look::Others(vec![other]),^        Some(_) => Look::Granted(None),'
  'no-restart-grace^src/backend/mod.rs^store epochs without their grace (the code before issue #36)^        self.epochs().and_then(StoreEpochs::grace_left)^        self.epochs().and(None)'
  'sessions-not-told^src/epoch.rs^a new store epoch does not tell the sessions from before^            signal.mark(LostReason::StoreReset);\n            told += 1;^            let _ = signal;\n            told += 1;'
  'tokens-start-over^src/epoch.rs^a new store epoch'"'"'s tokens start over instead of above every earlier one^        Epoch::new(random_u128(), clock_us.max(floor.saturating_add(1)), origin)^        Epoch::new(random_u128(), 1 + 0 * clock_us.max(floor), origin)'
  'epoch-from-clock-alone^src/epoch.rs^a new store epoch'"'"'s tokens start at the wall clock alone, not above every token its client saw^        Epoch::new(random_u128(), clock_us.max(floor.saturating_add(1)), origin)^        Epoch::new(random_u128(), clock_us.max(1 + 0 * floor), origin)'
  'fence-admits-older^src/fence/mod.rs^a fence admits a token older than the highest it accepted^        Some(highest) if ticket.token() < highest =>^        Some(highest) if ticket.token() < highest \&\& false =>'
  'dropped-guard-kept^src/queue.rs^a dropped guard does not release its entry^        if self.state.load(Ordering::Acquire) \& RELEASED == 0 {\n            self.cleanup_in_background("guard dropped");^        if false \&\& self.state.load(Ordering::Acquire) \& RELEASED == 0 {\n            self.cleanup_in_background("guard dropped");'
  'renew-at-deadline^src/session/keeper.rs^renews a lease only at its deadline, not every third of it^            kept.next = Some(sent + granted / 3);^            kept.next = Some(sent + granted);'
  'observer-drops-proclamations^src/backend/mod.rs^an election observer reports a new leader, not a new value of the same one^        let now = head.as_ref().map(|h| (h.token(), h.value().to_vec()));^        let now = head.as_ref().map(|h| (h.token(), Vec::<u8>::new()));'
  'keeps-renewing-a-reset-session^src/session/keeper.rs^goes on renewing a session the store forgot (its entries stay until it ends)^    if session.lost.reason() == Some(LostReason::StoreReset) {^    if session.lost.reason() == Some(LostReason::StoreReset) \&\& false {'
  'grace-grants-on-an-old-count^src/queue.rs^after a restart grace, grants on the count made before it^            if let Turn::Fewer(rule) = turn\n                \&\& matches!(rule.limit, Limit::Stored { .. })^            if let Turn::Fewer(rule) = turn\n                \&\& matches!(rule.limit, Limit::Stored { .. })\n                \&\& false'
  'barrier-wait-watches-once^src/barrier.rs^a barrier'"'"'s wait returns once the oldest holder is gone, without looking again^    while let Some(oldest) = backend.head(queue).await? {\n        if let Err(e) = backend.wait_gone(\&oldest).await {^    if let Some(oldest) = backend.head(queue).await? {\n        if let Err(e) = backend.wait_gone(\&oldest).await {'
  'double-enter-one-short^src/barrier.rs^a double barrier lets members in one short of its count^        if entries.len() >= self.members as usize {^        if entries.len() + 1 >= self.members as usize {'
  'work-outlives-leadership^src/election.rs^run_while_leader lets the work run on after leadership is lost^            reason = lost => {^            reason = async { let _ = lost.await; std::future::pending::<LostReason>().await } => {'
  'multilock-keeps-on-failure^src/multilock.rs^a MultiLock that fails part way keeps the locks it took^                        let _ = release_in_reverse(guards).await;^                        std::mem::forget(guards);'
)

restore() { git checkout -q -- src; }
trap restore EXIT INT TERM

out=target/mutants.md
# When every mutant runs, the table is also the committed one (docs/reliability.md quotes it).
committed=docs/mutants.md
mkdir -p target
{
  echo "| mutant | what it plants | caught | first rule broken (seed) |"
  echo "| --- | --- | --- | --- |"
} >"$out"
caught=0
total=0
for spec in "${mutants[@]}"; do
  IFS='^' read -r name file what from to <<<"$spec"
  if [ ${#only[@]} -gt 0 ] && [[ ! " ${only[*]} " == *" $name "* ]]; then
    continue
  fi
  total=$((total + 1))
  python3 - "$file" "$from" "$to" <<'EOF'
import sys
path, old, new = sys.argv[1], sys.argv[2].replace('\\n', '\n').replace('\\&', '&'), sys.argv[3].replace('\\n', '\n').replace('\\&', '&')
text = open(path).read()
if text.count(old) != 1:
    sys.exit(f"mutant text found {text.count(old)} times in {path}: {old!r}")
open(path, 'w').write(text.replace(old, new))
EOF
  echo "== mutant $name: $what"
  if ! RUSTFLAGS="--cfg tokio_unstable" cargo build --quiet --release --target-dir target/sim --features testing --test simulate 2>target/mutant-build.log; then
    echo "   did not build:"; tail -5 target/mutant-build.log
    echo "| \`$name\` | $what | did not build | |" >>"$out"
    restore
    continue
  fi
  bin=$(ls -t target/sim/release/deps/simulate-* | grep -v '\.d$' | head -1)
  started=$(date +%s)
  if report=$(timeout $((seconds + 120)) "$bin" "$seconds" "$seed" --stop-at-first --fresh-only 2>&1); then
    echo "   SURVIVED ($seconds s of schedules)"
    echo "| \`$name\` | $what | **survived** $seconds s | |" >>"$out"
  else
    rule=$(grep -m1 -o '^  \[[^]]*\]' <<<"$report" | tr -d '[]' | sed 's/^ *//' || true)
    found=$(grep -m1 -o 'VIOLATION with seed [0-9]*' <<<"$report" | grep -o '[0-9]*$' || true)
    echo "   caught in $(( $(date +%s) - started )) s: $rule (seed $found)"
    echo "| \`$name\` | $what | yes | $rule (seed $found) |" >>"$out"
    caught=$((caught + 1))
  fi
  restore
done
echo "mutants: $caught of $total caught; table in $out"
if [ ${#only[@]} -eq 0 ]; then
  {
    echo "Generated by \`just mutants $seconds $seed\` on $(date -u +%F) ($(git rev-parse --short HEAD)):"
    echo "**$caught of $total caught**, each within $seconds s of fresh schedules from seed $seed."
    echo
    cat "$out"
  } >"$committed"
fi
cat "$out"
