#!/usr/bin/env bash
# Fuzzes fencegate with cargo-fuzz (libFuzzer): each target in fuzz/ for SECONDS (default 600),
# one at a time on one core, starting from the committed seed corpus (new inputs go to a scratch
# copy, so the committed corpus only changes by hand). Prints each target's final libFuzzer stats.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (not part of .ci/run; see fuzz/README.md)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
seconds=${1:-600}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(fence_token config_load route_match key_template canonical_path)
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "installing cargo-fuzz from crates.io"
  cargo install cargo-fuzz --locked
fi
# cargo-fuzz passes nightly-only flags (-Zsanitizer); the stable toolchain accepts them with this.
export RUSTC_BOOTSTRAP=1
nice -n 19 cargo fuzz build -O 2>&1 | tail -n 3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for target in "${targets[@]}"; do
  mkdir -p "$work/$target" fuzz/artifacts/"$target"
  dict=()
  if [ -f "fuzz/$target.dict" ]; then dict=(-dict="fuzz/$target.dict"); fi
  log="$work/$target.log"
  echo "== $target: ${seconds}s"
  # One in-process fuzzer (libFuzzer's default: one core). `-jobs=N` would fork N workers that
  # log to ./fuzz-N.log instead. New inputs go to the scratch directory, the first one given.
  if ! nice -n 19 cargo fuzz run -O "$target" "$work/$target" fuzz/corpus/"$target" -- \
      -max_total_time="$seconds" -print_final_stats=1 "${dict[@]}" \
      -artifact_prefix=fuzz/artifacts/"$target"/ >"$log" 2>&1; then
    status=1
    echo "$target FAILED; crash input under fuzz/artifacts/$target/; last lines:"
    tail -n 30 "$log"
  fi
  grep -E '^#[0-9]+.*DONE|^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$log" || true
  grep -E '^#[0-9]+' "$log" | tail -n 1 || true
done
exit "$status"
