"""tether for asyncio: the same ``Client`` and ``Worker`` with ``async def``
methods and ``async for`` over ``tail``.

Each call runs the blocking call of the ``tether`` module in a worker thread
(``asyncio.to_thread``); those calls release the GIL, so the event loop
keeps running while they wait on the daemon. A tail fetches frames in
batches, so a thread is used per batch, not per frame.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from os import PathLike
from typing import (
    Any,
    Awaitable,
    Callable,
    Deque,
    List,
    Mapping,
    Optional,
    Sequence,
    TypeVar,
    Union,
)

from . import Checkpoint, Frame, Message, _decode_step, _encode
from . import Client as _SyncClient
from . import Worker as _SyncWorker

__all__ = ["Client", "Tail", "Worker"]

T = TypeVar("T")

#: Frames fetched per thread call.
_BATCH = 4096
#: How long one thread call waits for a first frame before it returns
#: empty-handed, so that a cancelled tail frees its thread soon.
_WAIT = 0.2


class Tail:
    """The async iterator ``Client.tail`` returns. Asking for the next
    frame records the previous one as processed (cursor file, consumer
    ack), as the blocking tail does."""

    def __init__(self, open_native: Callable[[], Any]) -> None:
        # The subscription opens on the first ``__anext__``, so that
        # ``async for f in client.tail(...)`` needs no ``await`` before it.
        self._open_native = open_native
        self._native: Any = None
        self._records = False
        self._frames: Deque[Frame] = deque()
        self._last: Optional[int] = None
        self._pending: Optional[asyncio.Future] = None
        self._ended = False

    def __aiter__(self) -> "Tail":
        return self

    async def __anext__(self) -> Frame:
        self._mark()
        while not self._frames:
            if self._ended:
                raise StopAsyncIteration
            got = await self._fetch()
            if got is None:
                self._ended = True
                raise StopAsyncIteration
            self._frames.extend(got)
        frame = self._frames.popleft()
        self._last = frame.seq
        return frame

    async def _fetch(self) -> Optional[List[Frame]]:
        if self._native is None:
            self._native = await asyncio.to_thread(self._open_native)
            self._records = self._native._records_progress
        # A cancelled caller leaves the fetch running (shielded); its frames
        # are kept for the next call instead of being lost with the thread.
        if self._pending is None:
            self._pending = asyncio.ensure_future(
                asyncio.to_thread(self._native._take, _BATCH, _WAIT)
            )
        try:
            return await asyncio.shield(self._pending)
        finally:
            if self._pending.done():
                self._pending = None

    def _mark(self) -> None:
        if self._last is not None and self._records:
            self._native._mark(self._last)
        self._last = None

    async def aclose(self) -> None:
        """Records the last frame yielded as processed and ends the
        subscription (for a consumer: once its ack is durable)."""
        if self._native is None:
            return
        if self._pending is not None:
            got = await asyncio.shield(self._pending)
            self._pending = None
            if got:
                self._frames.extend(got)
        self._mark()
        self._frames.clear()
        await asyncio.to_thread(self._native.close)

    async def __aenter__(self) -> "Tail":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if exc_type is not None:
            # The frame being processed failed: leave it to be read again.
            self._last = None
        await self.aclose()
        return False


class Client:
    """``tether.Client`` with coroutines; the same arguments."""

    def __init__(
        self,
        socket: Optional[Union[str, PathLike]] = None,
        host: Optional[str] = None,
        connect_timeout: Optional[float] = None,
    ) -> None:
        self._sync = _SyncClient(socket=socket, host=host, connect_timeout=connect_timeout)

    async def publish(self, stream: str, items: Any, producer: Optional[str] = None) -> None:
        items = list(items) if not isinstance(items, (str, bytes)) else items
        await asyncio.to_thread(self._sync.publish, stream, items, producer)

    def tail(
        self,
        stream: str,
        follow: bool = False,
        from_seq: Optional[int] = None,
        last: Optional[int] = None,
        cursor_file: Optional[Union[str, PathLike]] = None,
        consumer: Optional[str] = None,
    ) -> Tail:
        """``async for frame in client.tail(...)``; the arguments of
        ``tether.Client.tail``. It connects on the first frame asked for."""
        return Tail(
            lambda: self._sync.tail(stream, follow, from_seq, last, cursor_file, consumer)
        )

    async def status(self) -> dict:
        return await asyncio.to_thread(self._sync.status)

    async def streams(self) -> list:
        return await asyncio.to_thread(self._sync.streams)

    async def run(self, command: List[str], **options: Any) -> str:
        return await asyncio.to_thread(lambda: self._sync.run(command, **options))

    async def ps(self, all: bool = False) -> list:
        return await asyncio.to_thread(self._sync.ps, all)

    async def stop(self, id: str, timeout: float = 10.0) -> dict:
        return await asyncio.to_thread(self._sync.stop, id, timeout)

    async def resume(self, id: str, checkpoint: int | None = None) -> str:
        return await asyncio.to_thread(self._sync.resume, id, checkpoint)

    async def restart(self, id: str, timeout: float = 10.0) -> str:
        return await asyncio.to_thread(self._sync.restart, id, timeout)

    async def rm(self, ids: List[str], force: bool = False) -> list:
        return await asyncio.to_thread(self._sync.rm, ids, force)

    async def prune(self, older_than: Optional[float] = None) -> list:
        return await asyncio.to_thread(self._sync.prune, older_than)

    async def send(self, id: str, message: Union[str, bytes]) -> int:
        return await asyncio.to_thread(self._sync.send, id, message)

    async def answer(self, id: str, answer: str, question: Optional[int] = None) -> dict:
        return await asyncio.to_thread(self._sync.answer, id, answer, question)

    async def questions(self, all: bool = False, id: Optional[str] = None) -> list:
        return await asyncio.to_thread(self._sync.questions, all, id)


class Worker:
    """``tether.Worker`` with coroutines. Get one with ``Worker.from_env()``."""

    def __init__(self, sync: _SyncWorker) -> None:
        self._sync = sync
        self._native = sync._native

    @classmethod
    def from_env(cls) -> "Worker":
        return cls(_SyncWorker.from_env())

    @property
    def execution_id(self) -> str:
        return self._sync.execution_id

    @property
    def resumed(self) -> bool:
        return self._sync.resumed

    @property
    def attempt(self) -> Optional[int]:
        return self._sync.attempt

    async def load_checkpoint(self, schema_version: Optional[int] = None) -> Optional[Checkpoint]:
        return await asyncio.to_thread(self._sync.load_checkpoint, schema_version)

    async def save_checkpoint(
        self, data: Any, schema_version: int = 0, meta: Optional[Mapping[str, str]] = None
    ) -> int:
        return await asyncio.to_thread(self._sync.save_checkpoint, data, schema_version, meta)

    def step(
        self, name: str, raw: bool = False
    ) -> Callable[[Callable[[], Any]], Callable[[], Awaitable[Any]]]:
        """Decorator for a coroutine function (or a plain one): it runs
        until one run is recorded for this execution; later calls return
        the recorded result. See ``tether.Worker.step``."""

        def decorate(fn: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
            async def run() -> Any:
                recorded = await asyncio.to_thread(self._native.step_get, name)
                if recorded is None:
                    value = fn()
                    if inspect.isawaitable(value):
                        value = await value
                    recorded = await asyncio.to_thread(self._native.step_put, name, _encode(value))
                return recorded if raw else _decode_step(recorded)

            run.__name__ = getattr(fn, "__name__", "step")
            run.__doc__ = fn.__doc__
            return run

        return decorate

    async def clear_step(self, name: str) -> None:
        await asyncio.to_thread(self._sync.clear_step, name)

    async def publish(self, line: Union[str, bytes]) -> None:
        await asyncio.to_thread(self._sync.publish, line)

    async def event(self, data: dict) -> None:
        await asyncio.to_thread(self._sync.event, data)

    async def ask(
        self,
        text: str,
        choices: Optional[Sequence[str]] = None,
        timeout: Optional[float] = None,
        default: Optional[str] = None,
        key: Optional[str] = None,
    ) -> Optional[str]:
        """``tether.Worker.ask``, awaited. The wait holds one thread until
        the question closes, even if the awaiting task is cancelled."""
        return await asyncio.to_thread(self._sync.ask, text, choices, timeout, default, key)

    async def recv(self, timeout: Optional[float] = None) -> Optional[Message]:
        """``tether.Worker.recv``, awaited (at least once, as there)."""
        return await asyncio.to_thread(self._sync.recv, timeout)
