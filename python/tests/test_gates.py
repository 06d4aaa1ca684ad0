"""Human gates and inboxes from Python: a worker asks and a person answers,
the answer survives a restart of the worker, and messages sent to a worker's
inbox reach it in order."""

import asyncio
import sys
import textwrap

import pytest

import tether
import tether.aio
from conftest import wait_for


def start_worker(daemon, tmp_path, body: str) -> tuple[str, object]:
    """Starts `body` as a worker (restarted on failure); returns its id and
    its OUT directory."""
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(body))
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    run = daemon.tether(
        "run", "--name", "agent", "--env", f"OUT={out}", "--", sys.executable, str(script)
    )
    return run.stdout.decode().strip(), out


def open_questions(client, execution):
    return [q for q in client.questions() if q["execution"] == execution]


ASKER = """
    import os
    import tether

    out = os.environ["OUT"]
    w = tether.Worker.from_env()
    answer = w.ask("Deploy to prod?", choices=["yes", "no"])
    with open(out + "/attempt-" + str(w.attempt), "w") as f:
        f.write(repr(answer) + "\\n")
    if w.attempt == 1:
        # Die after the answer: the next attempt asks again and must get
        # the recorded answer without a second question.
        os._exit(3)
"""


def test_ask_waits_for_the_answer_and_a_restarted_worker_gets_it_at_once(daemon, tmp_path):
    execution, out = start_worker(daemon, tmp_path, ASKER)
    c = daemon.client()
    wait_for(lambda: open_questions(c, execution), "the question")
    [q] = open_questions(c, execution)
    assert (q["text"], q["choices"], q["state"], q["key"]) == (
        "Deploy to prod?",
        ["yes", "no"],
        "open",
        "Deploy to prod?#0",
    )
    wait_for(lambda: c.ps()[0]["state"] == "waiting", "the waiting state")
    waiting = c.ps()[0]["question"]
    assert (waiting["id"], waiting["text"], waiting["choices"]) == (
        q["id"],
        "Deploy to prod?",
        ["yes", "no"],
    )

    with pytest.raises(tether.Error, match="maybe"):
        c.answer(execution, "maybe")
    answered = c.answer(execution, "yes")
    assert (answered["id"], answered["answer"], answered["state"]) == (q["id"], "yes", "answered")

    second = out / "attempt-2"
    wait_for(lambda: second.exists() and second.read_text().endswith("\n"), "the second attempt")
    assert (out / "attempt-1").read_text() == "'yes'\n"
    assert second.read_text() == "'yes'\n"
    every = [x for x in c.questions(all=True) if x["execution"] == execution]
    assert [(x["id"], x["answer"], x["state"]) for x in every] == [(q["id"], "yes", "answered")]
    with pytest.raises(tether.Error, match="already answered"):
        c.answer(execution, "no", question=q["id"])


def test_a_question_that_times_out_gives_its_default_or_none(daemon, tmp_path):
    execution, out = start_worker(
        daemon,
        tmp_path,
        """
        import os
        import tether

        w = tether.Worker.from_env()
        seen = [
            w.ask("Proceed?", choices=["yes", "no"], timeout=0.5, default="no"),
            w.ask("Anyone?", timeout=0.5),
        ]
        with open(os.environ["OUT"] + "/result", "w") as f:
            f.write(repr(seen) + "\\n")
        """,
    )
    result = out / "result"
    wait_for(lambda: result.exists() and result.read_text().endswith("\n"), "the worker's result")
    assert result.read_text() == repr(["no", None]) + "\n"
    every = daemon.client().questions(all=True)
    assert [(q["text"], q["answer"], q["state"], q["answered_by"]) for q in every] == [
        ("Proceed?", "no", "timed out", "timeout"),
        ("Anyone?", None, "timed out", "timeout"),
    ]


def test_a_default_outside_the_choices_is_refused_before_asking(monkeypatch, tmp_path):
    monkeypatch.setenv("TETHER_EXECUTION_ID", "job-1")
    monkeypatch.setenv("TETHER_SOCKET", str(tmp_path / "absent.sock"))
    w = tether.Worker.from_env()
    with pytest.raises(ValueError, match="not one of the choices"):
        w.ask("Deploy?", choices=["yes", "no"], default="maybe")


RECEIVER = """
    import os
    import tether

    out = os.environ["OUT"]
    w = tether.Worker.from_env()
    with open(out + "/ready", "w") as f:
        f.write("ready\\n")
    got = []
    while len(got) < 3:
        m = w.recv()
        got.append((m.id > 0, m.data, m.text))
    got.append(w.recv(timeout=0.2))
    with open(out + "/result", "w") as f:
        f.write(repr(got) + "\\n")
"""


def test_messages_sent_reach_the_worker_in_order_as_bytes_and_text(daemon, tmp_path):
    execution, out = start_worker(daemon, tmp_path, RECEIVER)
    wait_for(lambda: (out / "ready").exists(), "the worker")
    c = daemon.client()
    ids = [c.send(execution, "first"), c.send(execution, b"\xffsecond"), c.send(execution, "3\n")]
    assert ids == sorted(ids) and len(set(ids)) == 3
    result = out / "result"
    wait_for(lambda: result.exists() and result.read_text().endswith("\n"), "the worker's result")
    assert result.read_text() == repr(
        [
            (True, b"first", "first"),
            (True, b"\xffsecond", "\ufffdsecond"),
            (True, b"3\n", "3\n"),
            None,
        ]
    ) + "\n"
    with pytest.raises(tether.NotFound):
        c.send("no-such-execution", "hello")


def test_the_async_client_sends_answers_and_lists(daemon, tmp_path):
    execution, out = start_worker(daemon, tmp_path, ASKER)

    async def main():
        c = tether.aio.Client(socket=daemon.socket, connect_timeout=60)
        for _ in range(2400):
            if [q for q in await c.questions() if q["execution"] == execution]:
                break
            await asyncio.sleep(0.05)
        answered = await c.answer(execution, "no")
        every = await c.questions(all=True)
        return answered["answer"], [q["state"] for q in every]

    assert asyncio.run(main()) == ("no", ["answered"])
    first = out / "attempt-1"
    wait_for(lambda: first.exists() and first.read_text().endswith("\n"), "the answer")
    assert first.read_text() == "'no'\n"
