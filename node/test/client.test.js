// Client: publish, tail (exactly once across daemon kill -9), status,
// streams, run, ps, stop, rm and prune against a real daemon.
'use strict';

const assert = require('node:assert/strict');
const path = require('node:path');
const { test } = require('node:test');

const tether = require('..');
const { Daemon, read, waitFor } = require('./helpers');

/** Takes `n` frames from a tail's iterator. */
async function take(tail, n) {
  const out = [];
  for (let i = 0; i < n; i++) {
    const { done, value } = await tail.next();
    assert.equal(done, false);
    out.push(value.text);
  }
  return out;
}

/** Every frame of a tail that ends, as texts. */
async function texts(tail) {
  const out = [];
  for await (const f of tail) {
    out.push(f.text);
  }
  return out;
}

test('publish then tail gives the exact lines', async (t) => {
  const d = await Daemon.start(t);
  const c = d.client();
  await c.publish('s', ['alpha', Buffer.from('beta'), Buffer.from([0xff, 0x72, 0x61, 0x77])], { producer: 'p1' });
  const got = [];
  for await (const f of c.tail('s')) {
    got.push([f.stream, f.seq, f.kind, f.payload.toString('hex'), f.text]);
  }
  assert.deepEqual(got, [
    ['s', 1, 'data', '616c706861', 'alpha'],
    ['s', 2, 'data', '62657461', 'beta'],
    ['s', 3, 'data', 'ff726177', '\ufffdraw'],
  ]);
  const last = [];
  for await (const f of c.tail('s', { last: 1 })) {
    last.push(f);
  }
  assert.equal(last.length, 1);
  assert.equal(last[0].seq, 3);
  assert.ok(last[0].ts > 1.6e12 && Math.floor(last[0].tsMicros / 1000) === Math.floor(last[0].ts));
  const from = [];
  for await (const f of c.tail('s', { fromSeq: 2 })) {
    from.push(f.seq);
  }
  assert.deepEqual(from, [2, 3]);
});

test('a rerun with the same producer stores nothing twice', async (t) => {
  const d = await Daemon.start(t);
  await d.client().publish('s', ['a', 'b'], { producer: 'job' });
  const again = d.client();
  await again.publish('s', ['a', 'b'], { producer: 'job' });
  await again.publish('s', ['c'], { producer: 'job' });
  assert.deepEqual(await texts(again.tail('s')), ['a', 'b', 'c']);
});

test('status and streams are objects', async (t) => {
  const d = await Daemon.start(t);
  const c = d.client();
  await c.publish('one', ['x']);
  const status = await c.status();
  assert.equal(status.socket, d.socket);
  assert.equal(status.streams, 1);
  const streams = await c.streams();
  assert.deepEqual(
    streams.map((s) => [s.name, s.first_seq, s.last_seq, s.frames]),
    [['one', 1, 1, 1]],
  );
});

test('tail with a cursor file is exactly once across a daemon kill -9', async (t) => {
  const d = await Daemon.start(t);
  const cursor = path.join(d.root, 'pos');
  await d.client().publish('s', ['1', '2', '3'], { producer: 'p' });
  const tail = d.client().tail('s', { follow: true, cursorFile: cursor });
  const seen = await take(tail, 3);
  await d.kill9();
  await d.start();
  await d.client().publish('s', ['4', '5'], { producer: 'q' });
  seen.push(...(await take(tail, 2)));
  await tail.return();
  assert.deepEqual(seen, ['1', '2', '3', '4', '5']);
  assert.equal(read(cursor), '5\n');

  // A later reader carries on from the cursor file, across another crash.
  await d.kill9();
  await d.start();
  const c = d.client();
  assert.deepEqual(await texts(c.tail('s', { cursorFile: cursor })), []);
  await c.publish('s', ['6'], { producer: 'q2' });
  assert.deepEqual(await texts(c.tail('s', { cursorFile: cursor })), ['6']);
  assert.equal(read(cursor), '6\n');
});

test('a durable consumer reads exactly once across a daemon kill -9', async (t) => {
  const d = await Daemon.start(t);
  await d.client().publish('s', ['1', '2', '3'], { producer: 'p' });
  const tail = d.client().tail('s', { follow: true, consumer: 'c1' });
  const seen = await take(tail, 2);
  await d.kill9();
  await d.start();
  await d.client().publish('s', ['4'], { producer: 'q' });
  seen.push(...(await take(tail, 2)));
  await tail.close();
  assert.deepEqual(seen, ['1', '2', '3', '4']);

  // The ack of 4 is durable: after another crash the consumer goes on at 5.
  await d.kill9();
  await d.start();
  const c = d.client();
  await c.publish('s', ['5'], { producer: 'q2' });
  assert.deepEqual(await texts(c.tail('s', { consumer: 'c1' })), ['5']);
});

test('break records the frame in hand; the next reader starts after it', async (t) => {
  const d = await Daemon.start(t);
  const cursor = path.join(d.root, 'pos');
  const c = d.client();
  await c.publish('s', ['a', 'b', 'c']);
  for await (const f of c.tail('s', { cursorFile: cursor })) {
    if (f.text === 'b') {
      break;
    }
  }
  assert.equal(read(cursor), '2\n');
  assert.deepEqual(await texts(c.tail('s', { cursorFile: cursor })), ['c']);
});

test('return() ends a follower that waits for frames', async (t) => {
  const d = await Daemon.start(t);
  const c = d.client();
  await c.publish('s', ['a']);
  const tail = c.tail('s', { follow: true });
  assert.deepEqual(await take(tail, 1), ['a']);
  const waiting = tail.next();
  await tail.return();
  assert.deepEqual(await waiting, { done: true, value: undefined });
  assert.deepEqual(await tail.next(), { done: true, value: undefined });
});

test('errors map to their classes', async (t) => {
  const d = await Daemon.start(t);
  const c = d.client();
  // Closing a tail that never opened has nothing to do.
  assert.deepEqual(await c.tail('missing').return(), { done: true, value: undefined });
  await assert.rejects(c.tail('missing').next(), (e) => {
    assert.ok(e instanceof tether.NotFound && e instanceof tether.TetherError);
    assert.equal(e.name, 'NotFound');
    return true;
  });
  const nobody = new tether.Client({ socket: path.join(d.root, 'run', 'nobody.sock'), connectTimeout: 0.3 });
  await assert.rejects(nobody.status(), (e) => {
    assert.ok(e instanceof tether.Unreachable);
    assert.match(e.message, /nobody\.sock/);
    return true;
  });
  await assert.rejects(c.publish('s', 'not an array'), TypeError);
  await assert.rejects(c.run(['x'], { restart: 'sometimes' }), TypeError);
  await assert.rejects(c.run(['x'], { env: { 'A=B': 'x' } }), {
    name: 'TypeError',
    message: 'environment variable name "A=B" contains \'=\'',
  });
  assert.throws(() => c.tail('s', { fromSeq: 1.5 }), RangeError);
  assert.throws(() => new tether.Client({ socket: 'a', host: 'ssh://b' }), TypeError);
  await assert.rejects(c.stop('no-such-execution'), tether.NotFound);
});

test('run, ps and stop a worker', async (t) => {
  const d = await Daemon.start(t);
  const c = d.client();
  const marker = path.join(d.root, 'started');
  const id = await c.run(['sh', '-c', 'echo "$GREETING" > started; exec sleep 600'], {
    name: 'sleeper',
    restart: 'never',
    cwd: d.root,
    env: { GREETING: 'hello' },
  });
  await waitFor(() => read(marker) === 'hello\n', 'the worker to start');
  let live;
  await waitFor(async () => {
    live = await c.ps();
    return live.length === 1 && live[0].state === 'running';
  }, 'the execution to be running');
  assert.deepEqual(live.map((e) => [e.id, e.name, e.state, e.restart]), [[id, 'sleeper', 'running', 'never']]);
  const stopped = await c.stop(id, { timeout: 5 });
  assert.equal(stopped.id, id);
  assert.deepEqual(await c.ps(), []);
  const all = await c.ps({ all: true });
  assert.deepEqual(all.map((e) => [e.id, e.state]), [[id, stopped.state]]);
  assert.notEqual(stopped.state, 'running');
});

test('run by id with labels and a parent', async (t) => {
  const d = await Daemon.start(t);
  const c = d.client();
  const sleep = ['sh', '-c', 'exec sleep 600'];
  const parent = await c.run(sleep, { id: 'js-parent', labels: { team: 'a' }, maxFailuresWithoutProgress: 2 });
  assert.equal(parent, 'js-parent');
  assert.equal(await c.run(['true'], { id: 'js-parent' }), 'js-parent');
  const child = await c.run(sleep, { id: 'js-child', parent: 'js-parent' });
  const rows = Object.fromEntries((await c.ps()).map((e) => [e.id, e]));
  assert.deepEqual(Object.keys(rows).sort(), ['js-child', 'js-parent']);
  assert.deepEqual(rows['js-parent'].labels, { team: 'a' });
  assert.deepEqual(rows['js-parent'].children, ['js-child']);
  assert.equal(rows[child].parent, 'js-parent');
  await assert.rejects(c.run(['true'], { parent: 'no-such-parent' }), tether.NotFound);
  await c.stop(child, { timeout: 5 });
  await c.stop(parent, { timeout: 5 });
});

test('restart and resume a worker', async (t) => {
  const d = await Daemon.start(t);
  const c = d.client();
  const id = await c.run(['sh', '-c', 'exec sleep 600'], { restart: 'never', cwd: d.root });
  const only = async (attempt, state) => {
    const live = await c.ps();
    return live.length === 1 && live[0].attempt === attempt && live[0].state === state;
  };
  await waitFor(() => only(1, 'running'), 'the first attempt to run');
  assert.equal(await c.restart(id, { timeout: 5 }), id);
  await waitFor(() => only(2, 'running'), 'the second attempt to run');
  await c.stop(id, { timeout: 5 });
  assert.equal(await c.resume(id), id);
  await waitFor(() => only(3, 'running'), 'the resumed attempt to run');
  await assert.rejects(c.resume(id), tether.Refused);
  await assert.rejects(c.restart('no-such-execution'), tether.NotFound);
  await c.stop(id, { timeout: 5 });
});

test('rm and prune remove ended executions', async (t) => {
  const d = await Daemon.start(t);
  const c = d.client();
  const first = await c.run(['true'], { restart: 'never', cwd: d.root });
  const second = await c.run(['true'], { restart: 'never', cwd: d.root });
  await waitFor(async () => {
    const all = await c.ps({ all: true });
    return all.length === 2 && (await c.ps()).length === 0;
  }, 'both executions to end');
  assert.deepEqual(await c.rm([first]), [first]);
  await assert.rejects(c.rm([first]), tether.NotFound);
  assert.deepEqual(await c.prune({ olderThan: 3600 }), []);
  assert.deepEqual(await c.prune({ olderThan: 0 }), [second]);
  assert.deepEqual(await c.ps({ all: true }), []);
});
