"""The Python agent example (`examples/python/agent.py`) finishes under
`kill -9` of its worker and then of the daemon: every model call and tool
call ran exactly once, as its side-effect file and token events show, the
restarted attempt carries on after the last turn it checkpointed, and the
output ends with the answer."""

import json
import os
import subprocess
import sys
import time

from conftest import ROOT, bin_dir, wait_for

AGENT = ROOT / "examples" / "python" / "agent.py"
TURNS = 6
# The turn after whose checkpoint the worker is killed, and the one after
# whose checkpoint the daemon is.
WORKER_CRASH_AFTER = 2
DAEMON_CRASH_AFTER = 4
PLAN = f"take a note on each of {TURNS} turns, then sum up"


def ps(daemon, execution: str) -> dict:
    # One JSON object per line.
    rows = map(json.loads, daemon.tether("ps", "--all", "--json").stdout.splitlines())
    return next(row for row in rows if row["id"] == execution)


def checkpointed_turn(daemon, execution: str):
    """The turn the newest checkpoint records, or None when there is none."""
    load = subprocess.run(
        [str(bin_dir() / "tether"), "--socket", str(daemon.socket), "checkpoint", "load",
         "--execution", execution, "--json"],
        capture_output=True,
        timeout=120,
    )
    if load.returncode == 3:
        return None
    assert load.returncode == 0, load.stderr
    return int(json.loads(load.stdout)["meta"]["turn"])


def wait_turn(daemon, execution: str, turn: int):
    """Waits until turn `turn` is published and checkpointed. The agent
    then pauses, and the crashes are aimed at that pause, away from any
    step, so that no step is cut off between its run and its record."""
    line = f"turn {turn}: done: note {turn}"
    wait_for(
        lambda: any(f.text == line for f in daemon.client().tail(execution)),
        f"the line {line!r}",
    )
    wait_for(lambda: checkpointed_turn(daemon, execution) == turn, f"the checkpoint of turn {turn}")


def tokens(step: str, prompt: int, completion: int) -> dict:
    return {"step": step, "prompt_tokens": prompt, "completion_tokens": completion}


def test_the_agent_runs_each_step_once_across_worker_and_daemon_crashes(daemon, tmp_path):
    effects = tmp_path / "effects.log"
    run = daemon.tether(
        "run",
        "--env", f"AGENT_EFFECTS={effects}",
        "--env", f"AGENT_TURNS={TURNS}",
        # Three seconds keep each crash within the pause after a checkpoint
        # on a slow, busy machine.
        "--env", "AGENT_PAUSE=3",
        "--", sys.executable, str(AGENT),
    )
    execution = run.stdout.decode().strip()

    wait_turn(daemon, execution, WORKER_CRASH_AFTER)
    os.kill(ps(daemon, execution)["pid"], 9)

    wait_turn(daemon, execution, DAEMON_CRASH_AFTER)
    worker = ps(daemon, execution)["pid"]
    daemon.kill9()
    os.kill(worker, 0)  # raises if the worker died with the daemon
    time.sleep(0.5)
    daemon.start()

    wait_for(lambda: ps(daemon, execution)["state"] == "completed", "the agent to complete")
    info = ps(daemon, execution)
    # One restart, after the worker's crash; the daemon's crash the worker rode out.
    assert (info["attempt"], info["pid"]) == (2, None), info

    assert effects.read_text() == "".join(
        f"turn {n}: note {n}\n" for n in range(1, TURNS + 1)
    )
    frames = list(daemon.client().tail(execution))
    assert [f.text for f in frames if f.kind == "stdout"] == [
        f"plan: {PLAN}",
        *(f"turn {n}: done: note {n}" for n in range(1, WORKER_CRASH_AFTER + 1)),
        f"resumed after turn {WORKER_CRASH_AFTER}",
        f"plan: {PLAN}",
        *(f"turn {n}: done: note {n}" for n in range(WORKER_CRASH_AFTER + 1, TURNS + 1)),
        "answer: all notes taken",
    ]
    # One token event per model call that ran: a replayed call reports none.
    # The daemon's own lifecycle events are plain text. `w.event` writes kind
    # `event` today; the contract moves SDK events to kind `user`.
    events = [
        json.loads(f.text)
        for f in frames
        if f.kind == "user" and f.text.startswith("{")
    ]
    assert events == [
        tokens("plan", 3, 11),
        *(tokens(f"llm-{n}", 15, 2) for n in range(1, TURNS + 1)),
        tokens("answer", 4, 3),
    ]
    assert [f.text for f in frames if f.kind == "stderr"] == []
