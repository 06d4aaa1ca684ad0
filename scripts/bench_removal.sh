#!/usr/bin/env bash
# Removal figures for bench/RESULTS.md, on a throwaway daemon:
#  1. the store's files after each of ROUNDS rounds of (an execution writes
#     MIB MiB of output into its stream, `tether rm` it);
#  2. the time of `tether prune --older-than 0s` over EXECUTIONS ended
#     executions.
# Usage: scripts/bench_removal.sh [TARGET_DIR]  (release binaries in it)
set -euo pipefail

bin=${1:-target/release}
rounds=${ROUNDS:-10}
mib=${MIB:-50}
executions=${EXECUTIONS:-10000}
dir=$(mktemp -d)
trap 'kill "$daemon" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
export TETHER_SOCKET=$dir/s TETHER_STATE_DIR=$dir/state
"$bin/tetherd" --socket "$dir/s" --state-dir "$dir/state" 2>"$dir/log" &
daemon=$!
until "$bin/tether" status >/dev/null 2>&1; do sleep 0.1; done

size() { du -b --apparent-size -c "$dir/state"/tether.* | tail -1 | cut -f1; }

echo "round  store bytes (redb + log)"
for round in $(seq 1 "$rounds"); do
  # MIB MiB of 1 KiB lines.
  id=$("$bin/tether" run --restart never -- sh -c \
    "head -c $((mib * 1024 * 1024)) /dev/zero | tr '\\0' x | fold -w 1023")
  "$bin/tether" wait "$id" >/dev/null
  "$bin/tether" rm "$id" >/dev/null
  echo "$round  $(size)"
done

echo "starting $executions executions"
seq 1 "$executions" | xargs -P 16 -I{} "$bin/tether" run --restart never -- true >/dev/null
until [ "$("$bin/tether" ps | wc -l)" -le 1 ]; do sleep 1; done
ended=$("$bin/tether" ps --all --json | wc -l)
start=$(date +%s.%N)
removed=$("$bin/tether" prune --older-than 0s | wc -l)
end=$(date +%s.%N)
echo "prune: $removed of $ended ended executions in $(echo "$end - $start" | bc) s"
echo "store bytes after prune: $(size)"
