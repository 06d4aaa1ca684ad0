// A real tetherd on a temporary socket and state directory, for the tests.
//
// The binaries come from $TETHER_BIN_DIR, else $CARGO_TARGET_DIR/debug, else
// the workspace's target/debug (build them with `cargo build --workspace`).
'use strict';

const { spawn, execFile } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { promisify } = require('node:util');

const ROOT = path.resolve(__dirname, '..', '..');
/** The package itself, as a worker script requires it. */
const PACKAGE = path.resolve(__dirname, '..');

function binDir() {
  if (process.env.TETHER_BIN_DIR) {
    return process.env.TETHER_BIN_DIR;
  }
  if (process.env.CARGO_TARGET_DIR) {
    return path.join(process.env.CARGO_TARGET_DIR, 'debug');
  }
  return path.join(ROOT, 'target', 'debug');
}

/** A new temporary directory, removed when the test ends. */
function tempDir(t) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-node-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `predicate` until it is true; a generous deadline, not a timing assertion. */
async function waitFor(predicate, what, deadlineMs = 120_000) {
  const end = Date.now() + deadlineMs;
  while (Date.now() < end) {
    if (await predicate()) {
      return;
    }
    await sleep(50);
  }
  throw new Error(`timed out waiting for ${what}`);
}

/** The text of `file`, or '' when it does not exist yet. */
function read(file) {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch {
    return '';
  }
}

class Daemon {
  constructor(root) {
    this.root = root;
    this.socket = path.join(root, 'run', 'tether.sock');
    this.state = path.join(root, 'state');
    fs.mkdirSync(path.dirname(this.socket), { mode: 0o700 });
    this.proc = null;
    this.exited = null;
    this.incarnation = 0;
  }

  /** A daemon in `t`'s temporary directory, stopped when the test ends. */
  static async start(t) {
    const d = new Daemon(tempDir(t));
    t.after(() => d.stop());
    await d.start();
    return d;
  }

  async start() {
    this.incarnation += 1;
    const log = fs.openSync(path.join(this.root, `tetherd.${this.incarnation}.log`), 'w');
    this.proc = spawn(
      path.join(binDir(), 'tetherd'),
      ['--socket', this.socket, '--state-dir', this.state],
      { stdio: ['ignore', log, log] },
    );
    fs.closeSync(log);
    const proc = this.proc;
    this.exited = new Promise((resolve) => proc.once('exit', resolve));
    // The CLI retries within its window until the daemon serves.
    await this.tether('status');
  }

  async kill9() {
    this.proc.kill('SIGKILL');
    await this.exited;
  }

  async stop() {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill('SIGTERM');
      await this.exited;
    }
  }

  /** A client of this daemon. */
  client(connectTimeout = 60) {
    const { Client } = require(PACKAGE);
    return new Client({ socket: this.socket, connectTimeout });
  }

  /** Runs `tether --socket S ...args`; resolves to its stdout. */
  async tether(...args) {
    const { stdout } = await promisify(execFile)(
      path.join(binDir(), 'tether'),
      ['--socket', this.socket, ...args],
      { timeout: 120_000, maxBuffer: 64 << 20 },
    );
    return stdout;
  }
}

/**
 * Runs `body` (a script, which can require PACKAGE) as a worker with
 * `tether run`, `OUT` naming `out`; resolves to the execution id.
 */
async function runWorker(daemon, dir, body, ...runArgs) {
  const script = path.join(dir, `worker-${Math.random().toString(36).slice(2)}.js`);
  fs.writeFileSync(script, body);
  const out = path.join(dir, 'out');
  fs.mkdirSync(out, { recursive: true });
  const id = await daemon.tether(
    'run', '--name', 'agent', '--env', `OUT=${out}`, ...runArgs, '--', process.execPath, script,
  );
  return id.trim();
}

module.exports = { Daemon, PACKAGE, binDir, read, runWorker, sleep, tempDir, waitFor };
