"""Publish and tail throughput from Python, and a tail's peak memory.

    python3 python/bench/stream.py [--socket PATH] [--frames N] [--batch B]

Against a running tetherd: publishes N lines of 256 bytes in calls of B
lines each (one stream per run), then iterates them with
``Client.tail`` into Frame objects, then prints lines/s, frames/s and the
process's peak RSS (which the tail of N frames must keep flat: frames are
fetched in batches and dropped once the loop has them).
"""

import argparse
import resource
import time
import uuid

import tether

parser = argparse.ArgumentParser()
parser.add_argument("--socket")
parser.add_argument("--frames", type=int, default=1_000_000)
parser.add_argument("--batch", type=int, default=10_000)
parser.add_argument("--skip-publish-stream")
args = parser.parse_args()

c = tether.Client(socket=args.socket)
line = b"x" * 256

if args.skip_publish_stream:
    stream = args.skip_publish_stream
else:
    stream = "bench-" + uuid.uuid4().hex[:8]
    batch = [line] * args.batch
    start = time.perf_counter()
    sent = 0
    while sent < args.frames:
        c.publish(stream, batch[: min(args.batch, args.frames - sent)], producer="bench")
        sent += min(args.batch, args.frames - sent)
    took = time.perf_counter() - start
    print(f"publish: {sent} lines of 256 B in {took:.2f} s = {sent / took:,.0f} lines/s")

rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
n = 0
total = 0
for f in c.tail(stream):
    n += 1
    total += len(f.payload)
took = time.perf_counter() - start
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(f"tail: {n} frames ({total} bytes) in {took:.2f} s = {n / took:,.0f} frames/s")
print(f"peak RSS: {rss / 1024:.1f} MiB (before the tail: {rss_before / 1024:.1f} MiB)")
