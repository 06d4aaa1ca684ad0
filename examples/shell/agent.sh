#!/bin/sh
# An agent loop in plain sh that survives `kill -9` of itself or of the
# daemon: it asks a model for a plan, then for each turn asks the model
# which tool to call and calls it. Every model call and tool call is a
# durable step (`tether step run`), so after a crash a finished call is
# replayed from its recorded result instead of running again; a checkpoint
# per turn lets a restarted attempt skip the turns already done.
#
#   tether run --restart on-failure \
#       --env SHELL_AGENT_EFFECTS=$PWD/effects.log -- examples/shell/agent.sh
#
# Settings (environment):
#   SHELL_AGENT_TURNS    number of turns (default 5)
#   SHELL_AGENT_EFFECTS  file each tool call appends one line to (required):
#                        the side effect a crash must not repeat
#   SHELL_AGENT_LLM      command run as `CMD PROMPT` that prints the model's
#                        reply (default: the fake model below)
#   SHELL_AGENT_PAUSE    seconds to think between turns (default 0.2)
#   TETHER               the tether command (default: tether on PATH)
#
# Model calls report their token counts as one JSON line on stderr, from
# inside the step, so a replayed call does not count its tokens again.
# Globbing is off (-f): prompts are split into words, never file names.
set -euf

tether=${TETHER:-tether}
self=$0

# A stand-in for a model: the reply follows from the prompt's first words.
fake_llm() {
    set -- $1
    case $1 in
    plan) echo "take a note on each of $2 turns, then sum up" ;;
    turn) echo "note $2" ;;
    *) echo "all notes taken" ;;
    esac
}

# The number of words in $1, as a rough token count.
words() {
    set -- $1
    echo $#
}

# Called back through `tether step run` (below), as `agent.sh llm PROMPT`
# and `agent.sh tool TURN ARGS`: what a step prints on stdout is its result.
case ${1:-} in
llm)
    prompt=$2
    reply=$(${SHELL_AGENT_LLM:-fake_llm} "$prompt")
    printf '{"event":"tokens","prompt":%s,"completion":%s}\n' \
        "$(words "$prompt")" "$(words "$reply")" >&2
    printf '%s\n' "$reply"
    exit 0
    ;;
tool)
    # The side effect: one line per call, appended.
    printf 'turn %s: %s\n' "$2" "$3" >>"$SHELL_AGENT_EFFECTS"
    echo "done: $3"
    exit 0
    ;;
esac

turns=${SHELL_AGENT_TURNS:-5}
: "${SHELL_AGENT_EFFECTS:?set SHELL_AGENT_EFFECTS to the file tool calls append to}"

# `checkpoint load` exits 3 when there is none yet: then start at turn 0.
if saved=$("$tether" checkpoint load); then
    turn=$saved
    echo "resumed after turn $turn"
else
    status=$?
    [ "$status" -eq 3 ] || exit "$status"
    turn=0
fi

# After a crash this prints the plan recorded the first time.
plan=$("$tether" step run plan -- sh "$self" llm "plan $turns")
echo "plan: $plan"

while [ "$turn" -lt "$turns" ]; do
    turn=$((turn + 1))
    call=$("$tether" step run "llm-$turn" -- sh "$self" llm "turn $turn of $turns: $plan")
    result=$("$tether" step run "tool-$turn" -- sh "$self" tool "$turn" "$call")
    echo "turn $turn: $result"
    printf '%s' "$turn" | "$tether" checkpoint save --meta "turn=$turn"
    sleep "${SHELL_AGENT_PAUSE:-0.2}"
done

answer=$("$tether" step run answer -- sh "$self" llm "sum up $turns turns")
echo "answer: $answer"
