// The Node agent example (examples/node/agent.js) finishes under kill -9 of
// its worker and of the daemon: every tool call ran exactly once, as its
// side-effect file shows, a restarted attempt carries on after the last turn
// it checkpointed, and the output ends with the answer.
'use strict';

const assert = require('node:assert/strict');
const path = require('node:path');
const { test } = require('node:test');

const { Daemon, read, sleep, waitFor } = require('./helpers');

const AGENT = path.resolve(__dirname, '..', '..', 'examples', 'node', 'agent.js');
const TURNS = 4;
/** The turn after whose checkpoint the crash comes. */
const CRASH_AFTER = 2;

async function startAgent(d) {
  const effects = path.join(d.root, 'effects.log');
  const id = await d.tether(
    'run', '--restart', 'on-failure',
    '--env', `NODE_AGENT_EFFECTS=${effects}`,
    '--env', `NODE_AGENT_TURNS=${TURNS}`,
    // The crash is aimed at this pause after a turn's checkpoint, away from
    // any step: seconds keep it there on a slow, busy machine.
    '--env', 'NODE_AGENT_PAUSE=2',
    '--', process.execPath, AGENT,
  );
  return { id: id.trim(), effects };
}

/** The execution's line of `tether ps --all --json`. */
async function info(d, id) {
  const lines = (await d.tether('ps', '--all', '--json')).split('\n').filter(Boolean);
  return lines.map((l) => JSON.parse(l)).find((e) => e.id === id);
}

async function waitCheckpoint(d, id, turn) {
  await waitFor(async () => {
    try {
      return JSON.parse(await d.tether('checkpoint', 'load', '--execution', id)).turn === turn;
    } catch {
      return false;
    }
  }, `the checkpoint of turn ${turn}`);
}

async function waitState(d, id, state) {
  let last;
  await waitFor(async () => {
    last = await info(d, id);
    return last !== undefined && last.state === state;
  }, `state ${state}`);
  return last;
}

async function frames(d, id) {
  return (await d.tether('tail', '--json', id))
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l));
}

const payloads = (all, kind) => all.filter((f) => f.kind === kind).map((f) => f.payload);
const tokens = (all) => payloads(all, 'user');

function eachToolCallOnce() {
  let s = '';
  for (let n = 1; n <= TURNS; n++) {
    s += `turn ${n}: note ${n}\n`;
  }
  return s;
}

/** The stdout of one attempt that starts after turn `from`. */
function attemptLines(from, to, last) {
  const lines = [];
  if (from > 0) {
    lines.push(`resumed after turn ${from}`);
  }
  lines.push(`plan: take a note on each of ${TURNS} turns, then sum up`);
  for (let n = from + 1; n <= to; n++) {
    lines.push(`turn ${n}: done: note ${n}`);
  }
  if (last) {
    lines.push('answer: all notes taken');
  }
  return lines;
}

/** One token event per model call that ran: the plan, each turn, the answer. */
function tokenEvents() {
  const event = (prompt, completion) => JSON.stringify({ event: 'tokens', prompt, completion });
  return [event(2, 11), ...Array(TURNS).fill(event(15, 2)), event(4, 3)];
}

test('the node agent runs each tool call once when its worker is killed', async (t) => {
  const d = await Daemon.start(t);
  const { id, effects } = await startAgent(d);
  await waitCheckpoint(d, id, CRASH_AFTER);
  const { pid } = await info(d, id);
  process.kill(pid, 'SIGKILL');
  const done = await waitState(d, id, 'completed');
  assert.equal(done.attempt, 2);

  assert.equal(read(effects), eachToolCallOnce());
  const all = await frames(d, id);
  assert.deepEqual(payloads(all, 'stdout'), [
    ...attemptLines(0, CRASH_AFTER, false),
    ...attemptLines(CRASH_AFTER, TURNS, true),
  ]);
  assert.deepEqual(tokens(all), tokenEvents());
});

test('the node agent runs each tool call once across a daemon kill -9', async (t) => {
  const d = await Daemon.start(t);
  const { id, effects } = await startAgent(d);
  await waitCheckpoint(d, id, CRASH_AFTER);
  const { pid } = await info(d, id);
  await d.kill9();
  process.kill(pid, 0); // the worker outlives the daemon
  await sleep(500);
  await d.start();
  const done = await waitState(d, id, 'completed');
  // The worker rode out the crash: it was never restarted.
  assert.equal(done.attempt, 1);

  assert.equal(read(effects), eachToolCallOnce());
  const all = await frames(d, id);
  assert.deepEqual(payloads(all, 'stdout'), attemptLines(0, TURNS, true));
  assert.deepEqual(tokens(all), tokenEvents());
});
