"""tether: publish to and read tether streams, and write workers that survive
restarts (checkpoints, memoised steps) and wait for people (questions,
inbox messages).

Everything that speaks to the daemon is the Rust client library, reached
through the ``tether._native`` extension; this module adds JSON encoding and
the ``step`` decorator.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar, Union

from ._native import (
    Checkpoint,
    Client,
    Error,
    Frame,
    Message,
    NotFound,
    ProtocolError,
    Refused,
    StorageError,
    Tail,
    Unreachable,
    __version__,
)
from ._native import Worker as _NativeWorker

__all__ = [
    "Checkpoint",
    "Client",
    "Error",
    "Frame",
    "Message",
    "NotFound",
    "ProtocolError",
    "Refused",
    "StorageError",
    "Tail",
    "Unreachable",
    "Worker",
    "__version__",
]

T = TypeVar("T")


def _encode(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return json.dumps(value, separators=(",", ":")).encode()


class Worker:
    """A program run by ``tether run``: its execution, checkpoints, steps
    and stream. Get one with ``Worker.from_env()``."""

    def __init__(self, native: _NativeWorker) -> None:
        self._native = native

    @classmethod
    def from_env(cls) -> "Worker":
        """The worker this process runs as; ``tether.Error`` when it was
        not started by ``tether run``."""
        return cls(_NativeWorker.from_env())

    @property
    def execution_id(self) -> str:
        return self._native.execution_id

    @property
    def resumed(self) -> bool:
        """True when this attempt was started from a checkpoint."""
        return self._native.resumed

    @property
    def attempt(self) -> Optional[int]:
        """The attempt number, when the daemon says it (``TETHER_ATTEMPT``)."""
        return self._native.attempt

    def load_checkpoint(self, schema_version: Optional[int] = None) -> Optional[Checkpoint]:
        """The newest checkpoint, or None when there is none. With
        ``schema_version``, the newest checkpoint of exactly that version
        (None when there is none), whatever newer ones of other versions
        there are. Its metadata is ``ck.meta`` (a dict)."""
        return self._native.load_checkpoint(schema_version)

    def save_checkpoint(
        self, data: Any, schema_version: int = 0, meta: Optional[Mapping[str, str]] = None
    ) -> int:
        """Saves ``data`` (bytes as they are, anything else as JSON) as the
        newest checkpoint, with ``meta`` (string keys and values) kept
        beside it. Returns its id once it is durable."""
        pairs = list((meta or {}).items())
        return self._native.save_checkpoint(_encode(data), schema_version, pairs)

    def step(self, name: str, raw: bool = False) -> Callable[[Callable[[], T]], Callable[[], T]]:
        """Decorator: the function runs until one run of it is recorded for
        this execution; after that, calls return the recorded result.

        The result is recorded as JSON, or as it is when it is bytes. It is
        read back as JSON when it parses as JSON and as bytes otherwise;
        ``raw=True`` always reads it back as bytes. Every call returns the
        result that was recorded (the first one recorded wins), so the
        first run and later replays return the same thing.
        """

        def decorate(fn: Callable[[], T]) -> Callable[[], T]:
            @functools.wraps(fn)
            def run() -> Any:
                recorded = self._native.step_get(name)
                if recorded is None:
                    recorded = self._native.step_put(name, _encode(fn()))
                return recorded if raw else _decode_step(recorded)

            return run

        return decorate

    def clear_step(self, name: str) -> None:
        """Forgets the recorded result of step ``name``, so that the next
        call runs the function again. Nothing happens when none is
        recorded."""
        self._native.step_clear(name)

    def publish(self, line: Union[str, bytes]) -> None:
        """Appends one line (kind ``stdout``) to the execution's stream;
        durable when this returns."""
        self._native.emit("stdout", line.encode() if isinstance(line, str) else bytes(line))

    def event(self, data: dict) -> None:
        """Appends ``data`` as one JSON frame of kind ``user``."""
        self._native.emit("user", _encode(data))

    def ask(
        self,
        text: str,
        choices: Optional[Sequence[str]] = None,
        timeout: Optional[float] = None,
        default: Optional[str] = None,
        key: Optional[str] = None,
    ) -> Optional[str]:
        """Asks a person ``text`` and blocks until it is answered; returns
        the answer. ``choices`` limits the answers; after ``timeout``
        seconds ``default`` becomes the answer, or without one this returns
        None. The execution is ``waiting`` meanwhile (``tether ps``), and
        ``tether answer ID ANSWER`` answers it.

        Asked again by a restarted attempt, the same question (same
        ``key``; by default the text and how many times this attempt asked
        it before) returns the recorded answer at once: a person is never
        asked twice for one decision. Ctrl-C interrupts the wait."""
        return self._native.ask(text, list(choices or []), timeout, default, key)

    def recv(self, timeout: Optional[float] = None) -> Optional[Message]:
        """The next message sent to this execution (``tether send ID``),
        waiting up to ``timeout`` seconds (None: forever); None when none
        came. ``msg.id``, ``msg.data`` (bytes), ``msg.text``.

        At least once: a message is removed from the inbox when the next
        ``recv`` is made, so one that this worker was handling when it died
        is handed to its next attempt again (compare ``msg.id`` with the
        last one handled to skip it)."""
        return self._native.recv(timeout)


def _decode_step(recorded: bytes) -> Any:
    try:
        return json.loads(recorded)
    except ValueError:
        return recorded
