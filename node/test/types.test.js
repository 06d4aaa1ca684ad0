// index.d.ts names what index.js exports, and each class's members.
'use strict';

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { test } = require('node:test');

const tether = require('..');

const dts = fs.readFileSync(path.join(__dirname, '..', 'index.d.ts'), 'utf8');

/** The members a class declares in index.d.ts (not its constructor). */
function declared(name) {
  const body = new RegExp(`export class ${name}\\b[^{]*\\{([\\s\\S]*?)\\n\\}`).exec(dts);
  assert.ok(body, `class ${name} in index.d.ts`);
  const members = new Set();
  for (const m of body[1].matchAll(/^ {2}(?:static |readonly |private )*(\[Symbol\.asyncIterator\]|\w+)[(<:?]/gm)) {
    if (m[1] !== 'constructor') {
      members.add(m[1]);
    }
  }
  return [...members].sort();
}

/** The members a class has in index.js: its own methods and getters, its instances' fields. */
function actual(Class, instance) {
  const names = new Set([
    ...Object.getOwnPropertyNames(Class.prototype),
    ...Object.getOwnPropertyNames(Class).filter((n) => !['length', 'name', 'prototype'].includes(n)),
    ...(instance ? Object.keys(instance) : []),
  ]);
  names.delete('constructor');
  if (Class.prototype[Symbol.asyncIterator]) {
    names.add('[Symbol.asyncIterator]');
  }
  return [...names].sort();
}

test('index.d.ts declares exactly what index.js exports', () => {
  const exported = [...dts.matchAll(/^export (?:class|const) (\w+)/gm)].map((m) => m[1]).sort();
  assert.deepEqual(exported, Object.keys(tether).sort());
});

test('index.d.ts declares each class with its members', () => {
  const checkpoint = Reflect.construct(tether.Checkpoint, [
    { data: Buffer.alloc(0), id: 1, seq: 1, schemaVersion: 0, ts: 0, meta: [] },
  ]);
  const frame = Reflect.construct(tether.Frame, ['s', 1, 0, 'data', Buffer.alloc(0)]);
  assert.deepEqual(declared('Checkpoint'), actual(tether.Checkpoint, checkpoint));
  assert.deepEqual(declared('Frame'), actual(tether.Frame, frame));
  const message = Reflect.construct(tether.Message, [
    { id: 1, data: Buffer.alloc(0), ts: 0, senderUid: 0 },
  ]);
  assert.deepEqual(declared('Message'), actual(tether.Message, message));
  assert.deepEqual(declared('Worker'), actual(tether.Worker));
  assert.deepEqual(declared('Tail'), actual(tether.Tail));
  assert.deepEqual(declared('Client'), actual(tether.Client));
});
