#!/usr/bin/env python3
"""Supervision figures: run-to-first-line latency, reattach time, RSS.

Usage: scripts/bench_supervise.py [--bin target/release] [--runs 20] [--workers 100]

Starts its own tetherd in a temp dir and prints one line per figure:
  run_to_first_line_ms p50/p90 over --runs runs
  reattach_ms: kill -9 the daemon with --workers workers running, start it
    again, time until its log shows every shim reattached
  rss: the daemon's VmRSS with the workers running, and one shim's VmRSS
"""
import argparse, json, os, signal, statistics, subprocess, sys, tempfile, time


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Daemon:
    def __init__(self, bindir, root):
        self.bindir, self.root = bindir, root
        self.sock = os.path.join(root, "s.sock")
        self.log_path = os.path.join(root, "daemon.log")

    def start(self):
        self.log = open(self.log_path, "a")
        started = time.monotonic()
        self.proc = subprocess.Popen(
            [os.path.join(self.bindir, "tetherd"), "--socket", self.sock,
             "--state-dir", os.path.join(self.root, "state")],
            stdout=subprocess.DEVNULL, stderr=self.log)
        self.cli("status")
        return started

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def cli(self, *args, timeout=60):
        return subprocess.run(
            [os.path.join(self.bindir, "tether"), "--socket", self.sock,
             "--connect-timeout", "20s", *args],
            check=True, capture_output=True, text=True, timeout=timeout).stdout


def first_line_latency(d):
    t0 = time.monotonic()
    ex = d.cli("run", "--restart", "never", "--", "sh", "-c", "echo ready; sleep 60").strip()
    tail = subprocess.Popen(
        [os.path.join(d.bindir, "tether"), "--socket", d.sock, "tail", "-f", "--json", ex],
        stdout=subprocess.PIPE, text=True)
    for line in tail.stdout:
        if json.loads(line)["kind"] == "stdout":
            break
    elapsed = (time.monotonic() - t0) * 1000
    tail.kill()
    tail.wait()
    d.cli("stop", "--timeout", "1s", ex)
    return elapsed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--workers", type=int, default=100)
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="tsb", dir="/tmp")
    d = Daemon(os.path.abspath(a.bin), root)
    d.start()
    lat = sorted(first_line_latency(d) for _ in range(a.runs))
    print(f"run_to_first_line_ms p50={statistics.median(lat):.1f} "
          f"p90={lat[int(len(lat) * 0.9) - 1]:.1f} (runs={a.runs})")

    ids = [d.cli("run", "--", "sh", "-c", "while :; do sleep 1; done").strip()
           for _ in range(a.workers)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = [json.loads(l) for l in d.cli("ps", "--json").splitlines()]
        running = [r for r in rows if r["id"] in ids and r["state"] == "running"]
        if len(running) == len(ids):
            break
        time.sleep(0.2)
    worker = running[0]["pid"]
    with open(f"/proc/{worker}/stat") as f:
        shim = int(f.read().rsplit(")", 1)[1].split()[1])
    print(f"rss daemon={rss_kib(d.proc.pid) / 1024:.1f}MiB with {a.workers} workers, "
          f"shim={rss_kib(shim) / 1024:.1f}MiB")

    d.kill9()
    before = open(d.log_path).read().count("reattached")
    t0 = d.start()
    while True:
        n = open(d.log_path).read().count("reattached") - before
        if n >= a.workers:
            break
        if time.monotonic() - t0 > 60:
            print(f"reattach: only {n} of {a.workers} after 60s", file=sys.stderr)
            break
        time.sleep(0.01)
    print(f"reattach_ms={(time.monotonic() - t0) * 1000:.0f} for {a.workers} shims "
          f"(daemon start to last reattach)")
    for ex in ids:
        d.cli("stop", "--timeout", "1s", ex)
    d.proc.send_signal(signal.SIGTERM)
    d.proc.wait()


if __name__ == "__main__":
    main()
