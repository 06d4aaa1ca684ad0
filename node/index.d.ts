// TypeScript definitions of tether-client; they match index.js.

/// <reference types="node" />

/** Base class of every tether error. */
export class TetherError extends Error {}
/** No such stream, execution or checkpoint. */
export class NotFound extends TetherError {}
/** The daemon could not be reached within the retry window. */
export class Unreachable extends TetherError {}
/** The daemon refused the request. */
export class Refused extends TetherError {}
/** The daemon could not store (a full or failing disk). */
export class StorageError extends TetherError {}
/** The daemon sent something the protocol does not allow. */
export class ProtocolError extends TetherError {}

/** The addon's version. */
export const version: string;

/** Anything `JSON.stringify` takes. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** A saved checkpoint. */
export class Checkpoint {
  private constructor();
  /** The checkpoint's bytes. */
  readonly data: Buffer;
  /** Increasing per execution. */
  readonly id: number;
  /** The execution stream's last seq when it was saved. */
  readonly seq: number;
  readonly schemaVersion: number;
  /** When it was saved, milliseconds since the epoch. */
  readonly ts: number;
  /** The metadata saved with it. */
  readonly meta: Record<string, string>;
  /** The data decoded as JSON. */
  json<T = any>(): T;
}

export interface SaveCheckpointOptions {
  /** Default 0. */
  schemaVersion?: number;
  /** String keys and values kept beside the checkpoint. */
  meta?: Record<string, string>;
}

export interface StepOptions {
  /** Resolve to the recorded bytes, never to parsed JSON. */
  raw?: boolean;
}

/** A program run by `tether run`. Get one with `Worker.fromEnv()`. */
export class Worker {
  private constructor();
  /** The worker this process runs as; throws `TetherError` outside `tether run`. */
  static fromEnv(): Worker;
  readonly executionId: string;
  /** True when this attempt was started from a checkpoint. */
  readonly resumed: boolean;
  /** The attempt number (`TETHER_ATTEMPT`), or null when the daemon did not say. */
  readonly attempt: number | null;
  /** The newest checkpoint (of exactly `schemaVersion` when given), or null. */
  loadCheckpoint(options?: { schemaVersion?: number }): Promise<Checkpoint | null>;
  /** Saves `value` (a Buffer as it is, anything else as JSON); resolves to its id once durable. */
  saveCheckpoint(value: Buffer | Uint8Array | Json, options?: SaveCheckpointOptions): Promise<number>;
  /**
   * Runs `fn` until one run is recorded for this execution; then resolves to
   * the recorded result without running it. The first result recorded wins.
   */
  step(name: string, fn: () => Buffer | Uint8Array | Json | Promise<Buffer | Uint8Array | Json>, options: StepOptions & { raw: true }): Promise<Buffer>;
  step<T extends Json | Buffer = any>(name: string, fn: () => T | Promise<T>, options?: StepOptions): Promise<T>;
  /** Forgets the recorded result of step `name`. */
  clearStep(name: string): Promise<void>;
  /** Appends one line (kind `stdout`) to the execution's stream; resolves once durable. */
  publish(line: string | Buffer | Uint8Array): Promise<void>;
  /** Appends `obj` as one JSON frame of kind `user`; resolves once durable. */
  event(obj: Json): Promise<void>;
  /**
   * Asks a person `text`; resolves to the answer, or null when `timeout`
   * passed with no `default`. A restarted attempt asking again (same key)
   * gets the recorded answer at once.
   */
  ask(text: string, options?: AskOptions): Promise<string | null>;
  /**
   * The next inbox message, waiting up to `timeout` seconds (default:
   * forever); null when none came. Removed from the inbox when the next
   * `recv` is made (at least once).
   */
  recv(options?: { timeout?: number }): Promise<Message | null>;
}

export interface AskOptions {
  /** The answers allowed (default: any text). */
  choices?: string[];
  /** Seconds until the question closes (default: never). */
  timeout?: number;
  /** The answer recorded when the timeout passes (one of the choices). */
  default?: string;
  /** Names the decision (default: the text and how many times this attempt asked it). */
  key?: string;
}

/** A message from the execution's inbox. */
export class Message {
  private constructor();
  /** Unique in the daemon, rising in the order messages were sent. */
  readonly id: number;
  readonly data: Buffer;
  /** The data as UTF-8 text. */
  readonly text: string;
  /** When it was sent, milliseconds since the epoch. */
  readonly ts: number;
  /** The uid of the sender. */
  readonly senderUid: number;
}

/** A question as `questions()` and `answer()` give it (the fields of `tether questions --json`). */
export interface QuestionInfo {
  id: number;
  execution: string;
  key: string;
  text: string;
  choices: string[];
  default: string | null;
  asked_micros: number;
  deadline_micros: number | null;
  attempt: number;
  seq: number;
  answer: string | null;
  answered_by: { uid: number; user: string | null } | 'timeout' | null;
  answered_micros: number | null;
  state: 'open' | 'answered' | 'timed out';
}

/** `event`: the daemon's lifecycle records; `user`: a worker's `event()`s. */
export type FrameKind = 'data' | 'stdout' | 'stderr' | 'event' | 'user' | 'ask' | 'answer';

/** One stored frame. */
export class Frame {
  private constructor();
  readonly stream: string;
  readonly seq: number;
  /** When it was stored (a worker's line: read), milliseconds since the epoch. */
  readonly ts: number;
  /** The same, in microseconds. */
  readonly tsMicros: number;
  readonly kind: FrameKind;
  readonly payload: Buffer;
  /** The payload as text (invalid UTF-8 replaced). */
  readonly text: string;
}

/**
 * An async iterator of frames, opened on its first `next()` (so errors such
 * as `NotFound` reject that call). Asking for the next frame records the
 * previous one as processed (cursor file, consumer ack); `return()` records
 * the last one and closes.
 */
export class Tail implements AsyncIterableIterator<Frame> {
  private constructor();
  [Symbol.asyncIterator](): Tail;
  next(): Promise<IteratorResult<Frame, undefined>>;
  return(): Promise<IteratorResult<Frame, undefined>>;
  /** The same as `return()`. */
  close(): Promise<void>;
}

export interface ClientOptions {
  /** The daemon's socket (default: the usual path). */
  socket?: string;
  /** `ssh://[user@]host[/socket]`: a daemon on another machine. */
  host?: string;
  /** Seconds to keep retrying an unreachable daemon. */
  connectTimeout?: number;
}

export interface TailOptions {
  /** Wait for new frames instead of ending at the newest. */
  follow?: boolean;
  /** Start at this seq. */
  fromSeq?: number;
  /** Start with the last N frames. */
  last?: number;
  /** A file holding the seq of the last frame processed; read first, written as frames are processed. */
  cursorFile?: string;
  /** A durable consumer: starts after its ack, acks what is processed. */
  consumer?: string;
}

export interface RunOptions {
  name?: string;
  restart?: 'never' | 'on-failure' | 'always';
  maxRestarts?: number;
  /** Seconds the execution may run. */
  deadline?: number;
  cwd?: string;
  env?: Record<string, string>;
  /** The execution's id; an existing one is left alone and its id returned. */
  id?: string;
  labels?: Record<string, string>;
  /** The id of the execution starting this one. */
  parent?: string;
  /** Failed attempts in a row with no checkpoint or step that end it (default 5). */
  maxFailuresWithoutProgress?: number;
}

/** A connection to a tetherd. */
export class Client {
  constructor(options?: ClientOptions);
  /** Appends each item as one frame of kind `data`; resolves once all are durable. */
  publish(stream: string, items: Iterable<string | Buffer | Uint8Array>, options?: { producer?: string }): Promise<void>;
  /** Reads `stream`: `for await (const f of c.tail('s'))`. */
  tail(stream: string, options?: TailOptions): Tail;
  /** The daemon's status (the fields of `tether status --json`). */
  status(): Promise<Record<string, any>>;
  /** The streams (the fields of `tether streams --json`). */
  streams(): Promise<Array<Record<string, any>>>;
  /** Starts `argv` as a supervised worker; resolves to its execution id. */
  run(argv: string[], options?: RunOptions): Promise<string>;
  /** The executions (the fields of `tether ps --json`); `all` adds ended ones. */
  ps(options?: { all?: boolean }): Promise<Array<Record<string, any>>>;
  /** Stops execution `id`: TERM, then KILL after `timeout` seconds. */
  stop(id: string, options?: { timeout?: number }): Promise<Record<string, any>>;
  /** Starts a new attempt of ended execution `id` from its newest (or the named) checkpoint; resolves to its id. */
  resume(id: string, options?: { checkpoint?: number }): Promise<string>;
  /** Stops the running attempt of `id` (TERM, KILL after `timeout` seconds) and starts the next; resolves to its id. */
  restart(id: string, options?: { timeout?: number }): Promise<string>;
  /** Removes ended executions `ids` with their streams; `force` stops live ones first. */
  rm(ids: string[], options?: { force?: boolean }): Promise<string[]>;
  /** Removes ended executions that ended at least `olderThan` seconds ago. */
  prune(options?: { olderThan?: number }): Promise<string[]>;
  /** Queues `message` in the inbox of execution `id`; resolves to its id once durable. */
  send(id: string, message: string | Buffer | Uint8Array): Promise<number>;
  /** Answers a question of execution `id` (its one open question unless `question` names one). */
  answer(id: string, answer: string, options?: { question?: number }): Promise<QuestionInfo>;
  /** The open questions (`all`: every one), of execution `id` when given. */
  questions(options?: { all?: boolean; id?: string }): Promise<QuestionInfo[]>;
}
