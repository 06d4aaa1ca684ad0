#!/usr/bin/env bash
# The long crash-loop soak: supervised workers and `tether publish`
# producers write while `tail -f` clients follow, and the daemon is
# `kill -9`'d at random moments (shims now and then). It runs the same
# soak as the CI test `fault_soak`, sized by TETHER_SOAK_* variables, and
# prints its summary line:
#
#   soak: kills=K shim_kills=S frames=F lost=L duplicated=D
#
#   scripts/soak.sh [KILLS]        default 50
#
# Other sizes can be set in the environment: TETHER_SOAK_WORKERS (4),
# TETHER_SOAK_PRODUCERS (2), TETHER_SOAK_TAILERS (4), TETHER_SOAK_LINES
# (6000 per worker and producer), TETHER_SOAK_SHIM_EVERY (a shim is killed
# after every this many daemon kills; 7), TETHER_SOAK_SEED (random kill
# timing; printed in the plan so a run can be repeated). Exits non-zero
# when anything was lost or duplicated.
set -euo pipefail

kills="${1:-50}"
if ! [[ "$kills" =~ ^[1-9][0-9]*$ ]]; then
    echo "soak.sh: KILLS must be a whole number, got '$kills'" >&2
    exit 2
fi

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

export TETHER_SOAK_KILLS="$kills"
export TETHER_SOAK_WORKERS="${TETHER_SOAK_WORKERS:-4}"
export TETHER_SOAK_PRODUCERS="${TETHER_SOAK_PRODUCERS:-2}"
export TETHER_SOAK_TAILERS="${TETHER_SOAK_TAILERS:-4}"
export TETHER_SOAK_LINES="${TETHER_SOAK_LINES:-6000}"
export TETHER_SOAK_SHIM_EVERY="${TETHER_SOAK_SHIM_EVERY:-7}"

# The test binary needs tetherd, tether and tether-shim built beside it.
cargo build --workspace --bins
log="$(mktemp -t tether-soak.XXXXXX)"
status=0
cargo test -p tether-tests --test it -- --exact \
    fault_soak::a_crash_loop_loses_and_duplicates_nothing --nocapture \
    >"$log" 2>&1 || status=$?
grep -E '^soak plan:' "$log" >&2 || true
if ! grep -E '^soak: ' "$log"; then
    echo "soak.sh: the soak ended without a summary (exit $status); its output:" >&2
    tail -n 60 "$log" >&2
fi
echo "soak.sh: full output in $log" >&2
exit "$status"
