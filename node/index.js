// tether-client: publish to and read tether streams, and write workers that
// survive restarts (checkpoints, memoised steps) and wait for people
// (questions, inbox messages).
//
// Everything that speaks to the daemon is the Rust client library, reached
// through the native addon (tether.node, built by build.js); this file adds
// the error classes, JSON, step memoising and the async iterator of a tail.
'use strict';

const path = require('node:path');

const native = loadNative();

function loadNative() {
  const file = path.join(__dirname, 'tether.node');
  try {
    return require(file);
  } catch (e) {
    throw new Error(
      `tether-client: cannot load its native addon ${file} (${e.message}); ` +
        `build it with \`node build.js\` in ${__dirname}`,
    );
  }
}

/** Base class of every tether error. */
class TetherError extends Error {
  constructor(message) {
    super(message);
    this.name = new.target.name;
  }
}
/** No such stream, execution or checkpoint. */
class NotFound extends TetherError {}
/** The daemon could not be reached within the retry window. */
class Unreachable extends TetherError {}
/** The daemon refused the request. */
class Refused extends TetherError {}
/** The daemon could not store (a full or failing disk). */
class StorageError extends TetherError {}
/** The daemon sent something the protocol does not allow. */
class ProtocolError extends TetherError {}

const CLASSES = {
  Error: TetherError,
  NotFound,
  Unreachable,
  Refused,
  StorageError,
  ProtocolError,
  Argument: TypeError,
};

// The addon tags its errors `tether:CLASS|message` (see node/src/errors.rs).
const TAG = /^tether:(\w+)\|([\s\S]*)$/;

/** The error to throw for `e`, an error from the addon. */
function mapError(e) {
  const m = e instanceof Error ? TAG.exec(e.message) : null;
  if (!m) {
    return e;
  }
  const Class = CLASSES[m[1]] || TetherError;
  return new Class(m[2]);
}

/** `promise`, rejected with the mapped error. */
function mapped(promise) {
  return promise.catch((e) => {
    throw mapError(e);
  });
}

/** Calls `fn`, throwing the mapped error. */
function mappedSync(fn) {
  try {
    return fn();
  } catch (e) {
    throw mapError(e);
  }
}

/** `value` as stored bytes: a Buffer (or other Uint8Array) as it is, anything else as JSON. */
function encode(value) {
  if (Buffer.isBuffer(value)) {
    return value;
  }
  if (value instanceof Uint8Array) {
    return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
  }
  const text = JSON.stringify(value);
  if (text === undefined) {
    // undefined, a function or a symbol: stored as null, as in an array.
    return Buffer.from('null');
  }
  return Buffer.from(text);
}

/** A recorded step result: its JSON value when it parses as JSON, else the Buffer. */
function decodeStep(recorded) {
  try {
    return JSON.parse(recorded.toString('utf8'));
  } catch {
    return recorded;
  }
}

/** A line (string, Buffer or Uint8Array) as a Buffer. */
function lineBytes(line, what) {
  if (typeof line === 'string') {
    return Buffer.from(line);
  }
  if (line instanceof Uint8Array) {
    return Buffer.isBuffer(line) ? line : Buffer.from(line.buffer, line.byteOffset, line.byteLength);
  }
  throw new TypeError(`${what} must be a string or a Buffer, not ${typeof line}`);
}

/** A non-negative whole number, or undefined. */
function count(value, what) {
  if (value === undefined || value === null) {
    return undefined;
  }
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new RangeError(`${what} must be a whole number >= 0, not ${value}`);
  }
  return value;
}

/** A saved checkpoint. */
class Checkpoint {
  constructor(raw) {
    /** The checkpoint's bytes. */
    this.data = raw.data;
    /** Increasing per execution. */
    this.id = raw.id;
    /** The execution stream's last seq when it was saved. */
    this.seq = raw.seq;
    this.schemaVersion = raw.schemaVersion;
    /** When it was saved, milliseconds since the epoch. */
    this.ts = raw.ts;
    /** The metadata saved with it (a key given twice keeps its last value). */
    this.meta = Object.fromEntries(raw.meta);
  }

  /** The data decoded as JSON. */
  json() {
    return JSON.parse(this.data.toString('utf8'));
  }
}

/** A message from the execution's inbox. */
class Message {
  constructor(raw) {
    /** Unique in the daemon, rising in the order messages were sent. */
    this.id = raw.id;
    /** The message's bytes. */
    this.data = raw.data;
    /** When it was sent, milliseconds since the epoch. */
    this.ts = raw.ts;
    /** The uid of the sender. */
    this.senderUid = raw.senderUid;
  }

  /** The data as text (UTF-8). */
  get text() {
    return this.data.toString('utf8');
  }
}

/**
 * A program run by `tether run`: its execution, checkpoints, steps and
 * stream. Get one with `Worker.fromEnv()`.
 */
class Worker {
  #native;
  /** Step runs in flight in this process, by name: concurrent calls share one. */
  #running = new Map();

  constructor(nativeWorker) {
    this.#native = nativeWorker;
  }

  /** The worker this process runs as; throws `TetherError` outside `tether run`. */
  static fromEnv() {
    return new Worker(mappedSync(() => native.NativeWorker.fromEnv()));
  }

  get executionId() {
    return this.#native.executionId;
  }

  /** True when this attempt was started from a checkpoint. */
  get resumed() {
    return this.#native.resumed;
  }

  /** The attempt number (`TETHER_ATTEMPT`), or null when the daemon did not say. */
  get attempt() {
    return this.#native.attempt ?? null;
  }

  /**
   * The newest checkpoint, or null when there is none. With `schemaVersion`,
   * the newest of exactly that version (null when none has it).
   */
  async loadCheckpoint({ schemaVersion } = {}) {
    const version = count(schemaVersion, 'schemaVersion');
    const raw = await mapped(this.#native.loadCheckpoint(version));
    return raw === null || raw === undefined ? null : new Checkpoint(raw);
  }

  /**
   * Saves `value` (a Buffer as it is, anything else as JSON) as the newest
   * checkpoint, with `meta` (string keys and values) kept beside it.
   * Resolves to its id once it is durable.
   */
  async saveCheckpoint(value, { schemaVersion = 0, meta = {} } = {}) {
    const version = count(schemaVersion, 'schemaVersion');
    const pairs = [];
    for (const [key, v] of Object.entries(meta)) {
      if (typeof v !== 'string') {
        throw new TypeError(`meta values must be strings; ${key} is ${typeof v}`);
      }
      pairs.push(key, v);
    }
    return mapped(this.#native.saveCheckpoint(encode(value), version, pairs));
  }

  /**
   * Runs `fn` (which may be async) until one run of it is recorded for this
   * execution; after that, resolves to the recorded result without running
   * it. The first result recorded wins, and every call resolves to it.
   * Results are recorded as JSON, or as they are when they are Buffers; they
   * are read back as JSON when they parse as JSON, else as a Buffer
   * (`{raw: true}`: always a Buffer).
   */
  async step(name, fn, { raw = false } = {}) {
    if (typeof fn !== 'function') {
      throw new TypeError('step(name, fn): fn must be a function');
    }
    let run = this.#running.get(name);
    if (run === undefined) {
      run = this.#runStep(name, fn).finally(() => this.#running.delete(name));
      this.#running.set(name, run);
    }
    const recorded = await run;
    return raw ? recorded : decodeStep(recorded);
  }

  async #runStep(name, fn) {
    const recorded = await mapped(this.#native.stepGet(name));
    if (recorded !== null && recorded !== undefined) {
      return recorded;
    }
    const result = await fn();
    return mapped(this.#native.stepPut(name, encode(result)));
  }

  /** Forgets the recorded result of step `name`, so that the next call runs it again. */
  async clearStep(name) {
    await mapped(this.#native.stepClear(name));
  }

  /** Appends one line (kind `stdout`) to the execution's stream; resolves once durable. */
  async publish(line) {
    await mapped(this.#native.emit('stdout', lineBytes(line, 'line')));
  }

  /** Appends `obj` as one JSON frame of kind `user`; resolves once durable. */
  async event(obj) {
    await mapped(this.#native.emit('user', encode(obj)));
  }

  /**
   * Asks a person `text` and resolves to the answer once there is one.
   * `choices` limits the answers; after `timeout` seconds `default`
   * becomes the answer, or without one this resolves to null. The
   * execution is `waiting` meanwhile, and `tether answer ID ANSWER`
   * answers it. Asked again by a restarted attempt, the same question
   * (same `key`; by default the text and how many times this attempt asked
   * it before) resolves at once to the recorded answer.
   */
  async ask(text, { choices, timeout, default: fallback, key } = {}) {
    if (typeof text !== 'string') {
      throw new TypeError('ask takes the question as a string');
    }
    if (choices != null && (!Array.isArray(choices) || choices.some((c) => typeof c !== 'string'))) {
      throw new TypeError('choices must be an array of strings');
    }
    const options = {
      choices: choices ?? undefined,
      timeout: timeout ?? undefined,
      default: fallback ?? undefined,
      key: key ?? undefined,
    };
    const answer = await mapped(this.#native.ask(text, options));
    return answer ?? null;
  }

  /**
   * The next message sent to this execution (`tether send ID`), waiting up
   * to `timeout` seconds (default: forever); null when none came. At least
   * once: a message is removed from the inbox when the next `recv` is
   * made, so one this worker was handling when it died is handed to its
   * next attempt again (compare `msg.id` to skip it).
   */
  async recv({ timeout } = {}) {
    const raw = await mapped(this.#native.recv(timeout ?? null));
    return raw === null || raw === undefined ? null : new Message(raw);
  }
}

const KINDS = ['data', 'stdout', 'stderr', 'event', 'user', 'ask', 'answer'];

/** One stored frame. */
class Frame {
  constructor(stream, seq, tsMicros, kind, payload) {
    /** The stream it belongs to. */
    this.stream = stream;
    /** Its seq in the stream. */
    this.seq = seq;
    /** When it was stored (a worker's line: read), milliseconds since the epoch. */
    this.ts = tsMicros / 1000;
    /** The same, in microseconds. */
    this.tsMicros = tsMicros;
    /** `data`, `stdout`, `stderr`, `event` (the daemon's) or `user` (a worker's events). */
    this.kind = kind;
    /** The payload as stored. */
    this.payload = payload;
  }

  /** The payload as text (invalid UTF-8 replaced). */
  get text() {
    return this.payload.toString('utf8');
  }
}

/** How many frames one native call hands over at most. */
const BATCH = 4096;

/**
 * What `Client.tail()` returns: an async iterator of `Frame`s. It opens the
 * subscription on the first `next()`, so errors such as `NotFound` reject
 * that call. Asking for the next frame records the previous one as
 * processed (cursor file, consumer ack); `return()` (which `break` in a
 * `for await` calls) records the last one and closes.
 */
class Tail {
  /** Opens the native tail. */
  #open;
  /** The native tail, a promise once opening has begun. */
  #native = null;
  #stream;
  #batch = null;
  #index = 0;
  /**
   * The seq of the frame last handed out. It counts as processed once the
   * caller asks for the next frame; the native side is told with the next
   * batch it is asked for, or on close.
   */
  #pending = null;
  #done = false;

  constructor(open, stream) {
    this.#open = open;
    this.#stream = stream;
  }

  [Symbol.asyncIterator]() {
    return this;
  }

  #nativeTail() {
    if (this.#native === null) {
      this.#native = mapped(this.#open());
    }
    return this.#native;
  }

  async next() {
    for (;;) {
      if (this.#done) {
        return { done: true, value: undefined };
      }
      const b = this.#batch;
      if (b !== null && this.#index < b.seqs.length) {
        const i = this.#index++;
        const start = i === 0 ? 0 : b.ends[i - 1];
        const seq = b.seqs[i];
        this.#pending = seq;
        const payload = b.data.subarray(start, b.ends[i]);
        return { done: false, value: new Frame(this.#stream, seq, b.ts[i], KINDS[b.kinds[i]], payload) };
      }
      if (b !== null && b.ended) {
        await this.#finish();
        return { done: true, value: undefined };
      }
      this.#batch = null;
      const nativeTail = await this.#nativeTail();
      const next = await mapped(nativeTail.nextBatch(BATCH, this.#pending));
      this.#pending = null;
      for (const gap of next.gaps) {
        process.emitWarning(gap, 'TetherGap');
      }
      this.#batch = next;
      this.#index = 0;
    }
  }

  async #finish() {
    if (this.#done) {
      return;
    }
    this.#done = true;
    const processed = this.#pending;
    this.#pending = null;
    this.#batch = null;
    if (this.#native === null) {
      return;
    }
    let nativeTail;
    try {
      nativeTail = await this.#native;
    } catch {
      // It never opened: there is nothing to close (next() reported why).
      return;
    }
    await mapped(nativeTail.close(processed));
  }

  /** Records the last frame handed out as processed and ends the subscription. */
  async return() {
    await this.#finish();
    return { done: true, value: undefined };
  }

  /** The same as `return()`. */
  async close() {
    await this.#finish();
  }
}

/** A connection to a tetherd. */
class Client {
  #native;

  /**
   * `socket`: the daemon's socket (default: the usual path); `host`:
   * `ssh://[user@]host[/socket]` for a daemon on another machine;
   * `connectTimeout`: seconds to keep retrying an unreachable daemon.
   */
  constructor({ socket, host, connectTimeout } = {}) {
    if (connectTimeout !== undefined && !(typeof connectTimeout === 'number' && connectTimeout >= 0)) {
      throw new RangeError('connectTimeout must be a number of seconds >= 0');
    }
    this.#native = mappedSync(
      () => new native.NativeClient(socket ?? null, host ?? null, connectTimeout ?? null),
    );
  }

  /**
   * Appends each item (string or Buffer) as one frame of kind `data`;
   * resolves once all are durable. Producer seqs count what this client
   * published as `producer` to `stream`, from 1: a program run again that
   * publishes the same items as the same producer stores nothing twice.
   */
  async publish(stream, items, { producer } = {}) {
    if (typeof items === 'string' || items instanceof Uint8Array || !items || typeof items[Symbol.iterator] !== 'function') {
      throw new TypeError('publish takes an array of strings or Buffers; wrap a single item in an array');
    }
    const payloads = [];
    for (const item of items) {
      payloads.push(lineBytes(item, 'each item'));
    }
    await mapped(this.#native.publish(stream, producer ?? null, payloads));
  }

  /**
   * Reads `stream`: an async iterator of frames (`for await (const f of
   * c.tail('s'))`), opened on its first `next()`. Where it starts: after
   * the seq in `cursorFile` when it holds one, else at `fromSeq`, else the
   * `last` N frames, else after `consumer`'s ack, else the oldest frame.
   * `follow`: wait for new frames instead of ending at the newest.
   */
  tail(stream, { follow = false, fromSeq, last, cursorFile, consumer } = {}) {
    if (typeof stream !== 'string') {
      throw new TypeError('tail takes the name of a stream');
    }
    const from = count(fromSeq, 'fromSeq');
    const n = count(last, 'last');
    if (from !== undefined && n !== undefined) {
      throw new TypeError('give fromSeq or last, not both');
    }
    const open = () =>
      this.#native.tail(stream, Boolean(follow), from ?? null, n ?? null, cursorFile ?? null, consumer ?? null);
    return new Tail(open, stream);
  }

  /** The daemon's status (the fields of `tether status --json`). */
  async status() {
    return JSON.parse(await mapped(this.#native.status()));
  }

  /** The streams (the fields of `tether streams --json`). */
  async streams() {
    return JSON.parse(await mapped(this.#native.streams()));
  }

  /**
   * Starts `argv` as a supervised worker; resolves to its execution id.
   * `restart`: `never`, `on-failure` (the default) or `always`;
   * `deadline`: seconds; `cwd` is resolved against this process's directory.
   * `id`: the execution's id (an existing one is left alone and its id
   * returned); `labels`: an object of strings; `parent`: the id of the
   * execution starting this one; `maxFailuresWithoutProgress`: failed
   * attempts in a row with no checkpoint or step that end it.
   */
  async run(
    argv,
    { name, restart, maxRestarts, deadline, cwd, env, id, labels, parent, maxFailuresWithoutProgress } = {},
  ) {
    if (!Array.isArray(argv) || argv.length === 0 || argv.some((a) => typeof a !== 'string')) {
      throw new TypeError('run takes a non-empty array of strings');
    }
    const spec = {
      command: argv,
      name: name ?? undefined,
      restart: restart ?? undefined,
      maxRestarts: count(maxRestarts, 'maxRestarts'),
      deadline: deadline ?? undefined,
      cwd: cwd ?? undefined,
      env: env == null ? undefined : Object.entries(env).map(([k, v]) => [k, String(v)]),
      id: id ?? undefined,
      labels: labels == null ? undefined : Object.entries(labels).map(([k, v]) => [k, String(v)]),
      parent: parent ?? undefined,
      maxFailuresWithoutProgress: count(maxFailuresWithoutProgress, 'maxFailuresWithoutProgress'),
    };
    return mapped(this.#native.run(spec));
  }

  /** The executions (the fields of `tether ps --json`); `all` adds ended ones. */
  async ps({ all = false } = {}) {
    return JSON.parse(await mapped(this.#native.ps(Boolean(all))));
  }

  /** Starts a new attempt of ended execution `id` from its newest (or the named) checkpoint. */
  async resume(id, { checkpoint } = {}) {
    return mapped(this.#native.resume(id, checkpoint ?? null));
  }

  /** Stops the running attempt of `id` (TERM, KILL after `timeout` seconds) and starts the next. */
  async restart(id, { timeout } = {}) {
    return mapped(this.#native.restart(id, timeout ?? null));
  }

  /** Stops execution `id`: TERM, then KILL after `timeout` seconds. */
  async stop(id, { timeout } = {}) {
    return JSON.parse(await mapped(this.#native.stop(id, timeout ?? null)));
  }

  /** Removes ended executions `ids` with their streams; `force` stops live ones first. */
  async rm(ids, { force = false } = {}) {
    return mapped(this.#native.rm(ids, Boolean(force)));
  }

  /** Removes ended executions that ended at least `olderThan` seconds ago. */
  async prune({ olderThan } = {}) {
    return mapped(this.#native.prune(olderThan ?? null));
  }

  /** Queues `message` (a string or a Buffer) in the inbox of execution `id`; resolves to its id. */
  async send(id, message) {
    return mapped(this.#native.send(id, lineBytes(message, 'message')));
  }

  /**
   * Answers a question of execution `id` (its one open question unless
   * `question` names one); resolves to the question, closed (the fields of
   * `tether questions --json`).
   */
  async answer(id, answer, { question } = {}) {
    const qid = count(question, 'question');
    return JSON.parse(await mapped(this.#native.answer(id, answer, qid ?? null)));
  }

  /** The open questions (`all`: every one), of execution `id` when given (the fields of `tether questions --json`). */
  async questions({ all = false, id } = {}) {
    return JSON.parse(await mapped(this.#native.questions(Boolean(all), id ?? null)));
  }
}

module.exports = {
  Checkpoint,
  Client,
  Frame,
  Message,
  NotFound,
  ProtocolError,
  Refused,
  StorageError,
  Tail,
  TetherError,
  Unreachable,
  Worker,
  version: native.version(),
};
