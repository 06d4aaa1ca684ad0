#!/usr/bin/env node
// Publishes N short frames (default 1,000,000) to a fresh daemon, then times
// reading them back with `for await` over `Client.tail`.
//
//   cargo build --release -p tetherd -p tether -p tether-node
//   TETHER_NODE_PROFILE=release node node/build.js
//   node node/bench/tail.js [N]
//
// The daemon comes from $TETHER_BIN_DIR, else $CARGO_TARGET_DIR/release,
// else target/release; the addon is the package's tether.node, so build
// both with the same profile.
'use strict';

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const { Client } = require('..');

const N = Number(process.argv[2] || 1_000_000);
/** Frames per publish call. */
const CHUNK = 10_000;

function binDir() {
  if (process.env.TETHER_BIN_DIR) {
    return process.env.TETHER_BIN_DIR;
  }
  const target = process.env.CARGO_TARGET_DIR || path.resolve(__dirname, '..', '..', 'target');
  return path.join(target, 'release');
}

async function main() {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-bench-'));
  const socket = path.join(root, 'run', 'tether.sock');
  fs.mkdirSync(path.dirname(socket), { mode: 0o700 });
  const log = fs.openSync(path.join(root, 'tetherd.log'), 'w');
  const daemon = spawn(
    path.join(binDir(), 'tetherd'),
    ['--socket', socket, '--state-dir', path.join(root, 'state')],
    { stdio: ['ignore', log, log] },
  );
  const exited = new Promise((resolve) => daemon.once('exit', resolve));
  try {
    const c = new Client({ socket, connectTimeout: 60 });
    await c.status();

    let t0 = process.hrtime.bigint();
    for (let start = 0; start < N; start += CHUNK) {
      const items = [];
      for (let i = start; i < Math.min(N, start + CHUNK); i++) {
        items.push(`frame ${i}`);
      }
      await c.publish('bench', items, { producer: 'bench' });
    }
    const publishSecs = Number(process.hrtime.bigint() - t0) / 1e9;

    t0 = process.hrtime.bigint();
    let count = 0;
    let bytes = 0;
    for await (const f of c.tail('bench')) {
      count += 1;
      bytes += f.payload.length;
    }
    const tailSecs = Number(process.hrtime.bigint() - t0) / 1e9;
    if (count !== N) {
      throw new Error(`read ${count} frames, published ${N}`);
    }
    const rate = (n, secs) => Math.round(n / secs).toLocaleString('en-US');
    console.log(`machine: ${os.cpus().length} x ${os.cpus()[0].model}, node ${process.version}`);
    console.log(`publish: ${N} frames in ${publishSecs.toFixed(2)} s, ${rate(N, publishSecs)} frames/s`);
    console.log(`tail:    ${count} frames (${bytes} payload bytes) in ${tailSecs.toFixed(2)} s, ${rate(count, tailSecs)} frames/s`);
  } finally {
    daemon.kill('SIGTERM');
    await exited;
    fs.rmSync(root, { recursive: true, force: true });
  }
}

main().catch((e) => {
  console.error(e);
  process.exitCode = 1;
});
