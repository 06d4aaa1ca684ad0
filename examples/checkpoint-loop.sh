#!/bin/sh
# A shell agent that resumes: it counts to a target, saving its position as
# a checkpoint after each number. Started again after a crash (by tether's
# restart policy), it carries on from the last number it saved.
#
#   tether run --restart on-failure -- examples/checkpoint-loop.sh 20
#
# It needs nothing but `tether checkpoint save` and `tether checkpoint load`;
# tether sets TETHER_EXECUTION_ID and TETHER_SOCKET for the worker.
set -eu

target=${1:-10}
tether=${TETHER:-tether}

# `load` exits 3 when there is no checkpoint yet: then start from 0.
if state=$("$tether" checkpoint load); then
    n=$state
    echo "resumed at $n"
else
    status=$?
    [ "$status" -eq 3 ] || exit "$status"
    n=0
fi

while [ "$n" -lt "$target" ]; do
    n=$((n + 1))
    echo "count $n"
    sleep "${CHECKPOINT_LOOP_PAUSE:-0.2}"
    printf '%s' "$n" | "$tether" checkpoint save
done
echo "done at $n"
