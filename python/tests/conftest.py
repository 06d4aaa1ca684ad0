"""A real tetherd on a temporary socket and state directory.

The binaries come from $TETHER_BIN_DIR, else $CARGO_TARGET_DIR/debug, else
the workspace's target/debug (build them with `cargo build --workspace`).
"""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import tether

ROOT = Path(__file__).resolve().parents[2]


def bin_dir() -> Path:
    if os.environ.get("TETHER_BIN_DIR"):
        return Path(os.environ["TETHER_BIN_DIR"])
    if os.environ.get("CARGO_TARGET_DIR"):
        return Path(os.environ["CARGO_TARGET_DIR"]) / "debug"
    return ROOT / "target" / "debug"


class Daemon:
    def __init__(self, root: Path):
        self.root = root
        self.socket = root / "run" / "tether.sock"
        self.state = root / "state"
        self.socket.parent.mkdir(mode=0o700)
        self.proc = None
        self.incarnation = 0
        self.start()

    def start(self):
        self.incarnation += 1
        log = open(self.root / f"tetherd.{self.incarnation}.log", "wb")
        self.proc = subprocess.Popen(
            [str(bin_dir() / "tetherd"), "--socket", str(self.socket), "--state-dir", str(self.state)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        # The client retries within its window until the daemon serves.
        self.client(connect_timeout=60).status()

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def client(self, connect_timeout=60) -> tether.Client:
        return tether.Client(socket=self.socket, connect_timeout=connect_timeout)

    def tether(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(bin_dir() / "tether"), "--socket", str(self.socket), *args],
            capture_output=True,
            check=True,
            timeout=120,
            **kw,
        )


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path)
    yield d
    d.stop()


def wait_for(predicate, what: str, deadline: float = 120.0):
    """Polls `predicate` until it is true; a generous deadline, not a timing assertion."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
