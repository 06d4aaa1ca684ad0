#!/usr/bin/env python3
# The daemon's memory under stalled partial messages: starts a fresh
# tetherd, opens N connections that each send a Hello and then the first
# SENT bytes of an Append declaring 16 MiB, and stops there. Prints the
# daemon's resident memory (and its peak) two seconds later, and how many
# of the connections it still holds open.
#
#   scripts/stalled_rss.py target/release/tetherd 200 16776192
#
# The Hello and the Append's head are written out as bytes (protocol
# version 1, a client named "tether 0.1.0"): this script speaks only as
# much of the protocol as it needs.
import os, socket, subprocess, sys, tempfile, time
tetherd, n, sent = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
d = tempfile.mkdtemp(prefix="stallrss")
sock = os.path.join(d, "s.sock")
env = dict(os.environ, TETHER_MAX_FRAME_LEN=str(32 << 20))
p = subprocess.Popen([tetherd, "--socket", sock, "--state-dir", os.path.join(d, "state")],
                     stdin=subprocess.DEVNULL, stderr=open(os.path.join(d, "log"), "w"), env=env)
for _ in range(600):
    if os.path.exists(sock): break
    time.sleep(0.05)
time.sleep(0.5)
hello = bytes.fromhex("00000010 00 01 01 0c74657468657220302e312e30".replace(" ", ""))
total = 16 << 20
head = total.to_bytes(4, "big") + bytes([1, 4]) + b"jobs" + bytes([2]) + b"p1" + bytes([1, 0])
conns = []
chunk = b"x" * (64 << 10)
for i in range(n):
    c = socket.socket(socket.AF_UNIX); c.connect(sock); c.sendall(hello)
    c.settimeout(10); c.recv(4096)
    try:
        c.sendall(head)
        left = sent - len(head) + 4
        while left > 0:
            k = min(left, len(chunk)); c.sendall(chunk[:k]); left -= k
    except OSError:
        pass
    conns.append(c)
time.sleep(2)
def mem():
    r = {}
    for line in open(f"/proc/{p.pid}/status"):
        if line.startswith(("VmRSS", "VmHWM")):
            k, v = line.split(":"); r[k] = int(v.split()[0]) // 1024
    return r
m = mem()
alive = 0
for c in conns:
    c.setblocking(False)
    try:
        # An error frame or the end of the stream: the daemon let it go.
        c.recv(1)
    except BlockingIOError:
        alive += 1
    except OSError:
        pass
print(f"connections={n} sent_each={sent} rss_mib={m['VmRSS']} peak_mib={m['VmHWM']} still_open={alive}")
p.terminate(); p.wait()
