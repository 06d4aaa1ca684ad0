// Human gates and inboxes: a worker asks and a person answers, a restarted
// worker gets the recorded answer, and inbox messages reach the worker.
'use strict';

const assert = require('node:assert/strict');
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

async function openQuestions(c, execution) {
  return (await c.questions()).filter((q) => q.execution === execution);
}

test('ask waits for the answer and a restarted worker gets it at once', async (t) => {
  const d = await Daemon.start(t);
  const out = path.join(d.root, 'out');
  const execution = await runWorker(d, d.root, `${PRELUDE}
(async () => {
  const answer = await w.ask('Deploy to prod?', { choices: ['yes', 'no'] });
  fs.writeFileSync(out + '/attempt-' + w.attempt, JSON.stringify(answer) + '\\n');
  // Die after the answer: the next attempt asks again.
  if (w.attempt === 1) process.exit(3);
})();
`);
  const c = d.client();
  await waitFor(async () => (await openQuestions(c, execution)).length === 1, 'the question');
  const [q] = await openQuestions(c, execution);
  assert.deepEqual([q.text, q.choices, q.state, q.key], ['Deploy to prod?', ['yes', 'no'], 'open', 'Deploy to prod?#0']);
  await waitFor(async () => (await c.ps())[0].state === 'waiting', 'the waiting state');
  const waiting = (await c.ps())[0].question;
  assert.deepEqual([waiting.id, waiting.text, waiting.choices], [q.id, 'Deploy to prod?', ['yes', 'no']]);

  await assert.rejects(c.answer(execution, 'maybe'), /maybe/);
  const answered = await c.answer(execution, 'yes');
  assert.deepEqual([answered.id, answered.answer, answered.state], [q.id, 'yes', 'answered']);

  await waitFor(() => read(path.join(out, 'attempt-2')).endsWith('\n'), 'the second attempt');
  assert.equal(read(path.join(out, 'attempt-1')), '"yes"\n');
  assert.equal(read(path.join(out, 'attempt-2')), '"yes"\n');
  const every = (await c.questions({ all: true })).filter((x) => x.execution === execution);
  assert.deepEqual(every.map((x) => [x.id, x.answer, x.state]), [[q.id, 'yes', 'answered']]);
  await assert.rejects(c.answer(execution, 'no', { question: q.id }), /already answered/);
});

test('a question that times out resolves to its default or null', async (t) => {
  const d = await Daemon.start(t);
  const out = path.join(d.root, 'out');
  await runWorker(d, d.root, `${PRELUDE}
(async () => {
  const seen = [
    await w.ask('Proceed?', { choices: ['yes', 'no'], timeout: 0.5, default: 'no' }),
    await w.ask('Anyone?', { timeout: 0.5 }),
  ];
  fs.writeFileSync(out + '/result', JSON.stringify(seen) + '\\n');
})();
`, '--restart', 'never');
  await waitFor(() => read(path.join(out, 'result')).endsWith('\n'), "the worker's result");
  assert.deepEqual(JSON.parse(read(path.join(out, 'result'))), ['no', null]);
  const every = await d.client().questions({ all: true });
  assert.deepEqual(every.map((q) => [q.text, q.answer, q.state, q.answered_by]), [
    ['Proceed?', 'no', 'timed out', 'timeout'],
    ['Anyone?', null, 'timed out', 'timeout'],
  ]);
});

test('messages sent reach the worker in order', async (t) => {
  const d = await Daemon.start(t);
  const out = path.join(d.root, 'out');
  const execution = await runWorker(d, d.root, `${PRELUDE}
(async () => {
  fs.writeFileSync(out + '/ready', 'ready\\n');
  const got = [];
  while (got.length < 3) {
    const m = await w.recv();
    got.push([m.id > 0, m.data.toString('hex'), m.text]);
  }
  got.push(await w.recv({ timeout: 0.2 }));
  fs.writeFileSync(out + '/result', JSON.stringify(got) + '\\n');
})();
`, '--restart', 'never');
  await waitFor(() => read(path.join(out, 'ready')) !== '', 'the worker');
  const c = d.client();
  const ids = [
    await c.send(execution, 'first'),
    await c.send(execution, Buffer.from([0xff, 0x32])),
    await c.send(execution, '3\n'),
  ];
  assert.deepEqual([...ids].sort((a, b) => a - b), ids);
  assert.equal(new Set(ids).size, 3);
  await waitFor(() => read(path.join(out, 'result')).endsWith('\n'), "the worker's result");
  assert.deepEqual(JSON.parse(read(path.join(out, 'result'))), [
    [true, Buffer.from('first').toString('hex'), 'first'],
    [true, 'ff32', '\ufffd2'],
    [true, Buffer.from('3\n').toString('hex'), '3\n'],
    null,
  ]);
  await assert.rejects(c.send('no-such-execution', 'hello'), tether.NotFound);
});
