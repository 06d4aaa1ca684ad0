import os
import subprocess
import sys
import textwrap

import pytest

import tether
from conftest import wait_for

WORKER = textwrap.dedent(
    """
    import os, sys, time
    import tether

    out = os.environ["OUT"]
    w = tether.Worker.from_env()

    @w.step("fetch")
    def fetch():
        with open(out + "/runs", "a") as f:
            f.write("ran\\n")
        return {"issues": [1, 2]}

    @w.step("blob")
    def blob():
        return b"\\x00\\x01"

    value = fetch()
    ck = w.load_checkpoint(schema_version=2)
    # Published before the attempt's file is written, so that the test,
    # which waits for the file, finds the frames of the attempt.
    w.publish("a line")
    w.event({"tokens": 1200})
    with open(out + "/attempt-" + str(int(w.resumed)), "w") as f:
        f.write(repr((w.execution_id, value, blob(), ck and ck.json())))
    if ck is None:
        w.save_checkpoint({"turn": 7}, schema_version=2)
        with open(out + "/pid", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)
    """
)


def test_a_step_is_not_run_again_after_the_worker_is_killed(daemon, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    run = daemon.tether(
        "run", "--name", "agent", "--env", f"OUT={out}", "--", sys.executable, str(script)
    )
    execution = run.stdout.decode().strip()
    wait_for(lambda: (out / "pid").exists() and (out / "pid").read_text(), "the first attempt")
    os.kill(int((out / "pid").read_text()), 9)
    wait_for(lambda: (out / "attempt-1").exists() and (out / "attempt-1").read_text(), "a resumed attempt")

    assert (out / "runs").read_text() == "ran\n"
    first = (out / "attempt-0").read_text()
    assert first == repr((execution, {"issues": [1, 2]}, b"\x00\x01", None))
    assert (out / "attempt-1").read_text() == repr(
        (execution, {"issues": [1, 2]}, b"\x00\x01", {"turn": 7})
    )
    mine = [
        (f.kind, f.text)
        for f in daemon.client().tail(execution)
        if f.kind == "stdout" or f.text.startswith("{\"tokens")
    ]
    assert mine == [("stdout", "a line"), ("user", '{"tokens":1200}')] * 2


def test_outside_a_worker_from_env_says_so(monkeypatch):
    monkeypatch.delenv("TETHER_EXECUTION_ID", raising=False)
    with pytest.raises(tether.Error, match="TETHER_EXECUTION_ID is not set"):
        tether.Worker.from_env()


def run_worker(daemon, tmp_path, body: str) -> str:
    """Runs `body` as a worker to its end; returns what it wrote to OUT/result."""
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(body))
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    daemon.tether(
        "run", "--name", "agent", "--restart", "never", "--env", f"OUT={out}", "--",
        sys.executable, str(script),
    )
    result = out / "result"
    wait_for(lambda: result.exists() and result.read_text().endswith("\n"), "the worker's result")
    return result.read_text()


def test_a_checkpoint_keeps_its_meta_and_loads_by_exact_schema_version(daemon, tmp_path):
    got = run_worker(
        daemon,
        tmp_path,
        """
        import os
        import tether

        w = tether.Worker.from_env()
        before = w.load_checkpoint(schema_version=2)
        w.save_checkpoint({"turn": 1}, schema_version=2, meta={"phase": "plan", "k": "a=b"})
        w.save_checkpoint({"turn": 2}, schema_version=3)
        two = w.load_checkpoint(schema_version=2)
        three = w.load_checkpoint(schema_version=3)
        newest = w.load_checkpoint()
        absent = w.load_checkpoint(schema_version=4)
        seen = [
            before,
            (two.json(), two.schema_version, two.meta),
            (three.json(), three.schema_version, three.meta),
            (newest.json(), newest.id == three.id),
            absent,
        ]
        with open(os.environ["OUT"] + "/result", "w") as f:
            f.write(repr(seen) + "\\n")
        """,
    )
    assert got == repr(
        [
            None,
            ({"turn": 1}, 2, {"phase": "plan", "k": "a=b"}),
            ({"turn": 2}, 3, {}),
            ({"turn": 2}, True),
            None,
        ]
    ) + "\n"


def test_a_cleared_step_runs_again(daemon, tmp_path):
    got = run_worker(
        daemon,
        tmp_path,
        """
        import os
        import tether

        w = tether.Worker.from_env()
        runs = []

        @w.step("fetch")
        def fetch():
            runs.append(len(runs) + 1)
            return {"run": len(runs)}

        seen = [fetch(), fetch()]
        w.clear_step("fetch")
        w.clear_step("never-recorded")
        seen += [fetch(), fetch(), runs]
        with open(os.environ["OUT"] + "/result", "w") as f:
            f.write(repr(seen) + "\\n")
        """,
    )
    assert got == repr([{"run": 1}, {"run": 1}, {"run": 2}, {"run": 2}, [1, 2]]) + "\n"


def test_events_are_kind_user_and_the_daemons_kind_is_refused(daemon, tmp_path):
    got = run_worker(
        daemon,
        tmp_path,
        """
        import os
        import tether

        w = tether.Worker.from_env()
        w.event({"tokens": 3})
        try:
            w._native.emit("event", b"{}")
            refused = None
        except tether.Refused as e:
            refused = str(e)
        with open(os.environ["OUT"] + "/result", "w") as f:
            f.write(repr(refused) + "\\n")
        """,
    )
    assert got == repr(
        "frames of kind event are written only by tetherd (lifecycle events, "
        "questions and answers); a worker's own events are kind user (invalid_request)"
    ) + "\n"
    execution = daemon.client().ps(all=True)[0]["id"]
    kinds = [(f.kind, f.text) for f in daemon.client().tail(execution) if f.kind != "event"]
    assert kinds == [("user", '{"tokens":3}')]
