"""p50 of save_checkpoint (1 KiB) and load_checkpoint from Python.

Run as a worker: tether run -- python3 python/bench/checkpoint.py [N]
It prints the figures to its stream (see `tether tail ID`) and exits 0.
"""

import statistics
import sys
import time

import tether

n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
w = tether.Worker.from_env()
data = b"x" * 1024
saves, loads = [], []
for _ in range(n):
    t = time.perf_counter()
    w.save_checkpoint(data, schema_version=1)
    saves.append(time.perf_counter() - t)
for _ in range(n):
    t = time.perf_counter()
    w.load_checkpoint()
    loads.append(time.perf_counter() - t)
print(
    f"n={n} save_checkpoint 1KiB p50 {statistics.median(saves) * 1e3:.3f} ms, "
    f"load_checkpoint p50 {statistics.median(loads) * 1e3:.3f} ms"
)
