import sys

import pytest

import tether
from conftest import wait_for


def lines(frames):
    return [(f.seq, f.kind, f.payload, f.text) for f in frames]


def test_publish_then_tail_gives_the_exact_lines(daemon):
    c = daemon.client()
    c.publish("s", ["alpha", "beta", b"\xffraw"], producer="p1")
    assert lines(c.tail("s")) == [
        (1, "data", b"alpha", "alpha"),
        (2, "data", b"beta", "beta"),
        (3, "data", b"\xffraw", "\ufffdraw"),
    ]
    f = next(iter(c.tail("s", last=1)))
    assert (f.stream, f.seq, f.text) == ("s", 3, "\ufffdraw")
    assert f.ts > 1.6e9 and f.ts_micros // 1_000_000 == int(f.ts)
    assert [f.seq for f in c.tail("s", from_seq=2)] == [2, 3]


def test_a_rerun_with_the_same_producer_stores_nothing_twice(daemon):
    daemon.client().publish("s", ["a", "b"], producer="job")
    again = daemon.client()
    again.publish("s", ["a", "b"], producer="job")
    again.publish("s", ["c"], producer="job")
    assert [f.text for f in again.tail("s")] == ["a", "b", "c"]


def test_status_and_streams_are_dicts(daemon):
    c = daemon.client()
    c.publish("one", ["x"])
    status = c.status()
    assert status["socket"] == str(daemon.socket)
    assert status["streams"] == 1
    streams = c.streams()
    assert [(s["name"], s["first_seq"], s["last_seq"], s["frames"]) for s in streams] == [
        ("one", 1, 1, 1)
    ]


def test_tail_with_a_cursor_file_is_exactly_once_across_a_daemon_kill(daemon, tmp_path):
    cursor = tmp_path / "pos"
    c = daemon.client()
    c.publish("s", ["1", "2", "3"], producer="p")
    seen = []
    t = c.tail("s", follow=True, cursor_file=cursor)
    for _ in range(3):
        seen.append(next(t).text)
    daemon.kill9()
    daemon.start()
    daemon.client().publish("s", ["4", "5"], producer="q")
    for _ in range(2):
        seen.append(next(t).text)
    t.close()
    assert seen == ["1", "2", "3", "4", "5"]
    assert cursor.read_text() == "5\n"

    # A later reader carries on from the cursor file, across another crash.
    daemon.kill9()
    daemon.start()
    c = daemon.client()
    assert list(c.tail("s", cursor_file=cursor)) == []
    c.publish("s", ["6"], producer="q2")
    assert [f.text for f in c.tail("s", cursor_file=cursor)] == ["6"]
    assert cursor.read_text() == "6\n"


def test_a_frame_whose_processing_raised_is_read_again(daemon, tmp_path):
    cursor = tmp_path / "pos"
    c = daemon.client()
    c.publish("s", ["a", "b"])
    with pytest.raises(RuntimeError):
        with c.tail("s", cursor_file=cursor) as t:
            for f in t:
                if f.text == "b":
                    raise RuntimeError("failed on b")
    assert [f.text for f in c.tail("s", cursor_file=cursor)] == ["b"]


def test_errors_map_to_exception_classes(daemon, tmp_path):
    c = daemon.client()
    with pytest.raises(tether.NotFound):
        c.tail("missing")
    nobody = tether.Client(socket=tmp_path / "run" / "nobody.sock", connect_timeout=0.3)
    with pytest.raises(tether.Unreachable) as e:
        nobody.status()
    assert "nobody.sock" in str(e.value)
    assert issubclass(tether.Unreachable, tether.Error)
    with pytest.raises(TypeError):
        c.publish("s", "not a list")


def test_run_ps_and_stop_a_worker(daemon, tmp_path):
    c = daemon.client()
    execution = c.run(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
        name="sleeper",
        restart="never",
        cwd=tmp_path,
        env={"A": "1"},
    )
    live = c.ps()
    assert [(e["id"], e["name"], e["restart"]) for e in live] == [(execution, "sleeper", "never")]
    wait_for(lambda: c.ps()[0]["state"] == "running", "the worker to run")
    stopped = c.stop(execution, timeout=5)
    assert (stopped["id"], stopped["state"]) == (execution, "cancelled")
    assert c.ps() == []
    assert [e["state"] for e in c.ps(all=True)] == ["cancelled"]
    with pytest.raises(tether.NotFound):
        c.stop("no-such-execution")
    with pytest.raises(ValueError, match="restart must be"):
        c.run(["true"], restart="sometimes")


def test_run_by_id_with_labels_and_a_parent(daemon):
    c = daemon.client()
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    parent = c.run(sleep, id="py-parent", labels={"team": "a"}, max_failures_without_progress=2)
    assert parent == "py-parent"
    assert c.run(["true"], id="py-parent") == "py-parent"
    child = c.run(sleep, id="py-child", parent="py-parent")
    rows = {e["id"]: e for e in c.ps()}
    assert sorted(rows) == ["py-child", "py-parent"]
    assert rows["py-parent"]["labels"] == {"team": "a"}
    assert rows["py-parent"]["children"] == ["py-child"]
    assert rows[child]["parent"] == "py-parent"
    with pytest.raises(tether.NotFound):
        c.run(["true"], parent="no-such-parent")
    with pytest.raises(tether.Error, match="1 to 128"):
        c.run(["true"], id="not valid")
    c.stop(child, timeout=5)
    c.stop(parent, timeout=5)


def test_resume_and_restart_a_worker(daemon, tmp_path):
    c = daemon.client()
    script = (
        "import os, time; print('attempt', os.environ['TETHER_ATTEMPT'], "
        "os.environ.get('TETHER_RESUMED', '-'), flush=True); time.sleep(600)"
    )
    execution = c.run([sys.executable, "-c", script], restart="never", cwd=tmp_path)
    wait_for(lambda: c.ps()[0]["state"] == "running", "the worker to run")
    assert c.restart(execution, timeout=5) == execution
    wait_for(
        lambda: (c.ps()[0]["attempt"], c.ps()[0]["state"]) == (2, "running"),
        "the second attempt to run",
    )
    assert c.stop(execution, timeout=5)["state"] == "cancelled"
    assert c.resume(execution) == execution
    wait_for(
        lambda: [(e["attempt"], e["state"]) for e in c.ps()] == [(3, "running")],
        "the resumed attempt to run",
    )
    with pytest.raises(tether.Refused, match="not ended"):
        c.resume(execution)
    with pytest.raises(tether.NotFound):
        c.restart("no-such-execution")
    c.stop(execution, timeout=5)


def test_rm_and_prune_remove_ended_executions(daemon, tmp_path):
    c = daemon.client()
    first = c.run(["true"], restart="never", cwd=tmp_path)
    second = c.run(["true"], restart="never", cwd=tmp_path)
    wait_for(lambda: len(c.ps(all=True)) == 2 and c.ps() == [], "both to end")
    assert c.rm([first]) == [first]
    with pytest.raises(tether.NotFound):
        c.rm([first])
    assert c.prune(older_than=3600) == []
    assert c.prune(older_than=0) == [second]
    assert c.ps(all=True) == []


def test_a_durable_consumer_reads_exactly_once_across_a_daemon_kill(daemon):
    c = daemon.client()
    c.publish("s", ["1", "2", "3"], producer="p")
    seen = []
    t = c.tail("s", follow=True, consumer="reader")
    for _ in range(3):
        seen.append(next(t).text)
    daemon.kill9()
    daemon.start()
    daemon.client().publish("s", ["4", "5"], producer="q")
    for _ in range(2):
        seen.append(next(t).text)
    t.close()
    assert seen == ["1", "2", "3", "4", "5"]
    assert daemon.client().streams()[0]["consumers"] == [{"name": "reader", "acked_through": 5}]

    # The consumer carries on after its ack, across another crash.
    daemon.kill9()
    daemon.start()
    c = daemon.client()
    c.publish("s", ["6"], producer="q2")
    assert [f.text for f in c.tail("s", consumer="reader")] == ["6"]
