// Worker: steps, checkpoints and output of a real worker under `tether run`.
'use strict';

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { test } = require('node:test');

const tether = require('..');
const { Daemon, PACKAGE, read, runWorker, waitFor } = require('./helpers');

const PRELUDE = `
const fs = require('node:fs');
const { Worker } = require(${JSON.stringify(PACKAGE)});
const out = process.env.OUT;
const w = Worker.fromEnv();
`;

/** Runs `body` (after PRELUDE, in an async function) to its end; resolves to what it wrote to OUT/result. */
async function runToEnd(t, body) {
  const d = await Daemon.start(t);
  const dir = d.root;
  await runWorker(d, dir, `${PRELUDE}\n(async () => {\n${body}\n})();\n`, '--restart', 'never');
  const result = path.join(dir, 'out', 'result');
  await waitFor(() => read(result).endsWith('\n'), "the worker's result");
  return JSON.parse(read(result));
}

test('a step is not run again after the worker is killed', async (t) => {
  const d = await Daemon.start(t);
  const out = path.join(d.root, 'out');
  const execution = await runWorker(d, d.root, `${PRELUDE}
(async () => {
  const value = await w.step('fetch', async () => {
    fs.appendFileSync(out + '/runs', 'ran\\n');
    return { issues: [1, 2] };
  });
  const blob = await w.step('blob', () => Buffer.from([0, 1]));
  const ck = await w.loadCheckpoint({ schemaVersion: 2 });
  // Published before the attempt's file is written, so that the test,
  // which waits for the file, finds the frames of the attempt.
  await w.publish('a line');
  await w.event({ tokens: 1200 });
  const seen = [w.executionId, value, blob.toString('hex'), ck && ck.json(), w.attempt];
  fs.writeFileSync(out + '/attempt-' + Number(w.resumed), JSON.stringify(seen));
  if (ck === null) {
    await w.saveCheckpoint({ turn: 7 }, { schemaVersion: 2 });
    fs.writeFileSync(out + '/pid', String(process.pid));
    setTimeout(() => {}, 600_000);
  }
})();
`);
  await waitFor(() => read(path.join(out, 'pid')) !== '', 'the first attempt');
  process.kill(Number(read(path.join(out, 'pid'))), 'SIGKILL');
  await waitFor(() => read(path.join(out, 'attempt-1')) !== '', 'a resumed attempt');

  assert.equal(read(path.join(out, 'runs')), 'ran\n');
  assert.deepEqual(JSON.parse(read(path.join(out, 'attempt-0'))), [
    execution, { issues: [1, 2] }, '0001', null, 1,
  ]);
  assert.deepEqual(JSON.parse(read(path.join(out, 'attempt-1'))), [
    execution, { issues: [1, 2] }, '0001', { turn: 7 }, 2,
  ]);
  const mine = [];
  for await (const f of d.client().tail(execution)) {
    if (f.kind === 'stdout' || f.text.startsWith('{"tokens')) {
      mine.push([f.kind, f.text]);
    }
  }
  const once = [['stdout', 'a line'], ['user', '{"tokens":1200}']];
  assert.deepEqual(mine, [...once, ...once]);
});

test('a step is not run again across a daemon kill -9', async (t) => {
  const d = await Daemon.start(t);
  const out = path.join(d.root, 'out');
  await runWorker(d, d.root, `${PRELUDE}
(async () => {
  const step = (name) => w.step(name, () => {
    fs.appendFileSync(out + '/runs', name + '\\n');
    return name.toUpperCase();
  });
  const a = await step('a');
  fs.writeFileSync(out + '/a-done', a);
  while (!fs.existsSync(out + '/go')) {
    await new Promise((r) => setTimeout(r, 20));
  }
  const seen = [await step('a'), await step('b'), await step('b')];
  fs.writeFileSync(out + '/result', JSON.stringify(seen) + '\\n');
})();
`, '--restart', 'never');
  await waitFor(() => read(path.join(out, 'a-done')) !== '', 'the first step');
  await d.kill9();
  await d.start();
  fs.writeFileSync(path.join(out, 'go'), '');
  await waitFor(() => read(path.join(out, 'result')).endsWith('\n'), "the worker's result");
  assert.deepEqual(JSON.parse(read(path.join(out, 'result'))), ['A', 'B', 'B']);
  assert.equal(read(path.join(out, 'runs')), 'a\nb\n');
});

test('a checkpoint keeps its meta and loads by exact schema version', async (t) => {
  const got = await runToEnd(t, `
  const before = await w.loadCheckpoint({ schemaVersion: 2 });
  const id1 = await w.saveCheckpoint({ turn: 1 }, { schemaVersion: 2, meta: { phase: 'plan', k: 'a=b' } });
  const id2 = await w.saveCheckpoint(Buffer.from([0xff, 0]), { schemaVersion: 3 });
  const two = await w.loadCheckpoint({ schemaVersion: 2 });
  const three = await w.loadCheckpoint({ schemaVersion: 3 });
  const newest = await w.loadCheckpoint();
  const absent = await w.loadCheckpoint({ schemaVersion: 4 });
  const seen = [
    before,
    id2 > id1,
    [two.json(), two.schemaVersion, two.meta, two.id === id1, two.ts > 1.6e12],
    [three.data.toString('hex'), three.schemaVersion, three.meta],
    [newest.id === three.id, newest.seq >= two.seq],
    absent,
  ];
  fs.writeFileSync(out + '/result', JSON.stringify(seen) + '\\n');
`);
  assert.deepEqual(got, [
    null,
    true,
    [{ turn: 1 }, 2, { phase: 'plan', k: 'a=b' }, true, true],
    ['ff00', 3, {}],
    [true, true],
    null,
  ]);
});

test('a cleared step runs again, and concurrent calls share one run', async (t) => {
  const got = await runToEnd(t, `
  const runs = [];
  const fetch = () => w.step('fetch', async () => {
    runs.push(runs.length + 1);
    await new Promise((r) => setTimeout(r, 10));
    return { run: runs.length };
  });
  const seen = [await Promise.all([fetch(), fetch()]), await fetch()];
  await w.clearStep('fetch');
  await w.clearStep('never-recorded');
  seen.push(await fetch(), await fetch(), runs);
  seen.push((await w.step('raw', () => 'text', { raw: true })).toString());
  seen.push(await w.step('undefined', () => undefined));
  fs.writeFileSync(out + '/result', JSON.stringify(seen) + '\\n');
`);
  assert.deepEqual(got, [
    [{ run: 1 }, { run: 1 }],
    { run: 1 },
    { run: 2 },
    { run: 2 },
    [1, 2],
    '"text"',
    null,
  ]);
});

test('a failing step records nothing and rejects with its error', async (t) => {
  const got = await runToEnd(t, `
  let error;
  try {
    await w.step('flaky', () => { throw new Error('boom'); });
  } catch (e) {
    error = e.message;
  }
  const second = await w.step('flaky', async () => 'ok');
  fs.writeFileSync(out + '/result', JSON.stringify([error, second]) + '\\n');
`);
  assert.deepEqual(got, ['boom', 'ok']);
});

test('outside a worker fromEnv says so', (t) => {
  const saved = process.env.TETHER_EXECUTION_ID;
  delete process.env.TETHER_EXECUTION_ID;
  t.after(() => {
    if (saved !== undefined) {
      process.env.TETHER_EXECUTION_ID = saved;
    }
  });
  assert.throws(() => tether.Worker.fromEnv(), (e) => {
    assert.ok(e instanceof tether.TetherError);
    assert.equal(e.name, 'TetherError');
    assert.match(e.message, /^TETHER_EXECUTION_ID is not set/);
    return true;
  });
});
