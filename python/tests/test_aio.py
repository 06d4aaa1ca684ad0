import asyncio
import os
import sys
import textwrap

import pytest

import tether
import tether.aio
from conftest import wait_for


def test_async_publish_then_async_for_gives_the_exact_frames(daemon):
    async def main():
        c = tether.aio.Client(socket=daemon.socket, connect_timeout=60)
        await c.publish("s", ["alpha", b"\xffraw"], producer="p1")
        got = [(f.seq, f.kind, f.payload) async for f in c.tail("s")]
        streams = await c.streams()
        return got, [(s["name"], s["last_seq"]) for s in streams]

    got, streams = asyncio.run(main())
    assert got == [(1, "data", b"alpha"), (2, "data", b"\xffraw")]
    assert streams == [("s", 2)]


def test_async_tail_with_a_cursor_file_is_exactly_once_across_a_daemon_kill(daemon, tmp_path):
    cursor = tmp_path / "pos"
    daemon.client().publish("s", ["1", "2", "3"], producer="p")

    async def main():
        c = tether.aio.Client(socket=daemon.socket, connect_timeout=60)
        seen = []
        t = c.tail("s", follow=True, cursor_file=cursor)
        for _ in range(3):
            seen.append((await t.__anext__()).text)
        await asyncio.to_thread(daemon.kill9)
        await asyncio.to_thread(daemon.start)
        await c.publish("s", ["4", "5"], producer="q")
        async for f in t:
            seen.append(f.text)
            if f.text == "5":
                break
        await t.aclose()
        return seen

    assert asyncio.run(main()) == ["1", "2", "3", "4", "5"]
    assert cursor.read_text() == "5\n"


def test_async_tail_as_a_consumer_acks_what_it_read(daemon):
    daemon.client().publish("s", ["a", "b", "c"], producer="p")

    async def main():
        c = tether.aio.Client(socket=daemon.socket, connect_timeout=60)
        async with c.tail("s", consumer="reader") as t:
            async for f in t:
                if f.text == "b":
                    break
        return [f.text async for f in c.tail("s", consumer="reader")]

    assert asyncio.run(main()) == ["c"]
    consumers = daemon.client().streams()[0]["consumers"]
    assert consumers == [{"name": "reader", "acked_through": 3}]


def test_async_errors_are_the_same_classes(daemon, tmp_path):
    async def main():
        c = tether.aio.Client(socket=daemon.socket, connect_timeout=60)
        with pytest.raises(tether.NotFound):
            async for _ in c.tail("missing"):
                pass
        nobody = tether.aio.Client(socket=tmp_path / "run" / "nobody.sock", connect_timeout=0.3)
        with pytest.raises(tether.Unreachable):
            await nobody.status()

    asyncio.run(main())


WORKER = textwrap.dedent(
    """
    import asyncio, os
    import tether.aio

    async def main():
        out = os.environ["OUT"]
        w = tether.aio.Worker.from_env()

        @w.step("fetch")
        async def fetch():
            with open(out + "/runs", "a") as f:
                f.write("ran\\n")
            await asyncio.sleep(0)
            return {"n": 1}

        value = await fetch()
        ck = await w.load_checkpoint(schema_version=3)
        await w.publish("line " + str(w.attempt))
        with open(out + "/attempt-" + str(int(w.resumed)), "w") as f:
            f.write(repr((value, ck and ck.json(), ck and ck.meta)))
        if ck is None:
            await w.save_checkpoint({"turn": 1}, schema_version=3, meta={"phase": "plan"})
            with open(out + "/pid", "w") as f:
                f.write(str(os.getpid()))
            await asyncio.sleep(600)

    asyncio.run(main())
    """
)


def test_an_async_step_is_not_run_again_after_the_worker_is_killed(daemon, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    run = daemon.tether("run", "--env", f"OUT={out}", "--", sys.executable, str(script))
    execution = run.stdout.decode().strip()
    wait_for(lambda: (out / "pid").exists() and (out / "pid").read_text(), "the first attempt")
    os.kill(int((out / "pid").read_text()), 9)
    wait_for(lambda: (out / "attempt-1").exists() and (out / "attempt-1").read_text(), "a resumed attempt")
    assert (out / "runs").read_text() == "ran\n"
    assert (out / "attempt-0").read_text() == repr(({"n": 1}, None, None))
    assert (out / "attempt-1").read_text() == repr(({"n": 1}, {"turn": 1}, {"phase": "plan"}))
    lines = [f.text for f in daemon.client().tail(execution) if f.kind == "stdout"]
    assert lines == ["line 1", "line 2"]
