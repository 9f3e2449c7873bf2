import { headers, nuid, StorageType, type MsgHdrs, type PubAck } from 'nats';
import { StoreError, StoreConflictError, type SessionStore, type Versioned } from '../ports.js';
import { JS_NO_MESSAGE_FOUND, JS_WRONG_LAST_SEQUENCE, jsErrorCode, publishOnce, withRetry, type NatsContext } from './connection.js';

export interface NatsSessionStoreOptions {
  /** KV bucket name (`[A-Za-z0-9_-]+`); the stream is `KV_<bucket>`. Created if missing, else used as it is. */
  bucket: string;
  /** Replicas of a bucket this call creates (1 or 3 in practice; at most the cluster size). */
  replicas: number;
  /** How long one operation keeps re-sending through transient failures such as a leader election (default 10000). */
  retryMs?: number;
  /**
   * How compare-and-set is enforced. `subject`: the server checks the key's last sequence
   * (one round trip). `stream`: the server checks the whole stream's last sequence, after
   * as well as the key's — correct on clustered servers whose subject check is not
   * serialised (nats-server before 2.10: nats-io/nats-server#4320, where concurrent updates
   * of one key can all succeed). The writes of one process are pipelined, each one round
   * trip; a write of another process costs a retry. `auto` (default) picks `stream` only
   * for a clustered server before 2.10: a single server checks the subject under its
   * stream lock on any version.
   */
  casGuard?: 'auto' | 'subject' | 'stream';
}

/** The first nats-server release line whose clustered expected-last-subject-sequence check is serialised. */
const SUBJECT_CAS_SINCE = [2, 10, 0] as const;

export function serverNeedsStreamGuard(version: string | undefined, clustered = true): boolean {
  if (!clustered) return false;
  const parts = (version ?? '0.0.0').split(/[.-]/).map((p) => Number.parseInt(p, 10) || 0);
  for (let i = 0; i < SUBJECT_CAS_SINCE.length; i++) {
    if ((parts[i] ?? 0) !== SUBJECT_CAS_SINCE[i]) return (parts[i] ?? 0) < SUBJECT_CAS_SINCE[i]!;
  }
  return false;
}

/** Guarded writes of one process in flight at once (see `#guardedWrite`). */
const GUARD_PIPELINE = 32;

const KEY = /^[A-Za-z0-9_.=-]+$/;
/** Port keys whose dot-separated tokens are all non-empty are NATS subjects as they are. */
const SUBJECT_SAFE = /^[A-Za-z0-9_=-]+(\.[A-Za-z0-9_=-]+)*$/;
const OPERATION = 'KV-Operation';

/**
 * `SessionStore` on a JetStream KV bucket (history 1, file storage). Revisions are stream
 * sequences: `create` publishes with expected last subject sequence 0 (or the tombstone's,
 * after a delete), `update` and conditional `delete` with the caller's revision, and the
 * server's "wrong last sequence" (10071) becomes STORE_CONFLICT. Reads go to the stream
 * leader (the bucket is made without direct get), so a write acknowledged anywhere is
 * read back everywhere. Writes go out with a message id and are re-sent on timeouts within
 * `retryMs`: a leader election costs a delay, not a failed or doubled write.
 */
export class NatsSessionStore implements SessionStore {
  /** Every gateway shares the bucket. */
  readonly capabilities = { singleProcess: false } as const;
  readonly #ctx: NatsContext;
  readonly #bucket: string;
  readonly #stream: string;
  readonly #retryMs: number;
  readonly #streamGuard: boolean;
  /**
   * With the stream guard: the pipeline of this process's writes — the stream sequence the
   * next one expects (null: read it once none is in flight), the writes in flight and their
   * keys, a read of the stream under way, and the writes waiting for a place.
   */
  readonly #guard = {
    next: null as number | null,
    inFlight: 0,
    keys: new Set<string>(),
    refresh: null as Promise<void> | null,
    waiting: [] as (() => void)[],
  };
  #closed = false;

  private constructor(ctx: NatsContext, bucket: string, retryMs: number, streamGuard: boolean) {
    this.#ctx = ctx;
    this.#bucket = bucket;
    this.#stream = `KV_${bucket}`;
    this.#retryMs = retryMs;
    this.#streamGuard = streamGuard;
  }

  /** Whether writes are guarded by the stream's last sequence (see `casGuard`). */
  get streamGuard(): boolean {
    return this.#streamGuard;
  }

  static async open(ctx: NatsContext, opts: NatsSessionStoreOptions): Promise<NatsSessionStore> {
    if (!/^[A-Za-z0-9_-]+$/.test(opts.bucket)) throw new StoreError('STORE_MISCONFIGURED', `Invalid KV bucket name ${JSON.stringify(opts.bucket)}`);
    if (!Number.isInteger(opts.replicas) || opts.replicas < 1) throw new StoreError('STORE_MISCONFIGURED', `Invalid replicas ${opts.replicas} for bucket ${opts.bucket}`);
    const retryMs = opts.retryMs ?? 10_000;
    // Without direct get, reads are answered by the leader only: no stale read from a lagging replica.
    await withRetry(ctx, retryMs, () =>
      ctx.js.views.kv(opts.bucket, { history: 1, replicas: opts.replicas, storage: StorageType.File, allow_direct: false }),
    );
    const guard = opts.casGuard ?? 'auto';
    const info = ctx.nc.info;
    const streamGuard = guard === 'stream' || (guard === 'auto' && serverNeedsStreamGuard(info?.version, info?.cluster !== undefined));
    return new NatsSessionStore(ctx, opts.bucket, retryMs, streamGuard);
  }

  async get<T>(key: string): Promise<Versioned<T> | null> {
    const last = await this.#last(key);
    if (!last || last.deleted) return null;
    return { value: JSON.parse(Buffer.from(last.data).toString('utf8')) as T, revision: last.seq };
  }

  async create<T>(key: string, value: T): Promise<number> {
    const data = encode(key, value);
    let expected = 0;
    // Round two runs only if the key turned out to hold a tombstone; a third only if it changed again meanwhile.
    for (let round = 0; round < 3; round++) {
      try {
        return await this.#write(key, data, expected);
      } catch (err) {
        if (!(err instanceof StoreConflictError)) throw err;
        const last = await this.#last(key);
        if (last && !last.deleted) throw err;
        expected = last?.seq ?? 0;
      }
    }
    throw new StoreConflictError(key);
  }

  async update<T>(key: string, value: T, revision: number): Promise<number> {
    const data = encode(key, value);
    if (!Number.isInteger(revision) || revision < 1) throw new StoreConflictError(key);
    return this.#write(key, data, revision);
  }

  async delete(key: string, revision?: number): Promise<void> {
    checkKey(key);
    if (revision !== undefined && (!Number.isInteger(revision) || revision < 1)) throw new StoreConflictError(key);
    await this.#write(key, new Uint8Array(0), revision, () => {
      const h = headers();
      h.set(OPERATION, 'DEL');
      return h;
    });
  }

  async close(): Promise<void> {
    this.#closed = true;
  }

  async #write(key: string, data: Uint8Array, expected: number | undefined, hdrs?: () => MsgHdrs): Promise<number> {
    this.#check();
    const subject = this.#subject(key);
    const publish = { msgID: nuid.next(), stream: this.#stream, budgetMs: this.#retryMs, ...(hdrs ? { headers: hdrs } : {}) };
    if (expected !== undefined && this.#streamGuard) return this.#guardedWrite(key, subject, data, expected, publish);
    try {
      const ack = await publishOnce(this.#ctx, subject, data, {
        ...publish,
        ...(expected === undefined ? {} : { lastSubjectSequence: expected }),
      });
      return ack.seq;
    } catch (err) {
      if (jsErrorCode(err) === JS_WRONG_LAST_SEQUENCE) throw new StoreConflictError(key, { cause: err });
      throw err;
    }
  }

  /**
   * Compare-and-set guarded by the whole stream. The publish expects both the key's revision
   * and the stream's last sequence: the stream check is serialised on every clustered
   * server, counting the writes still in flight, so when it passes no write of any other
   * process came since the last one this process saw, and the key check (not serialised
   * before 2.10) was made with no other write of that key in flight. This process pipelines
   * its guarded writes: each expects the sequence the one before it will take (up to
   * `GUARD_PIPELINE` in flight, never two of one key), so a write costs one round trip and
   * never conflicts with another write of this process. A "wrong last sequence" answer
   * (either check) ends the pipeline: the writes behind it fail the same way; once none is
   * in flight the stream's last sequence is read again, and each failed write reads its
   * key: a key no longer at `expected` is a conflict, otherwise another process wrote
   * meanwhile and the write goes again. The same message id throughout, so a re-send of a
   * publish that landed is answered with its original acknowledgement.
   */
  async #guardedWrite(key: string, subject: string, data: Uint8Array, expected: number, publish: Parameters<typeof publishOnce>[3]): Promise<number> {
    const deadline = Date.now() + this.#retryMs;
    const g = this.#guard;
    for (;;) {
      const lastSequence = await this.#guardSlot(key);
      let ack: PubAck;
      try {
        ack = await publishOnce(this.#ctx, subject, data, { ...publish, lastSequence, lastSubjectSequence: expected });
      } catch (err) {
        g.next = null;
        this.#guardDone(key);
        if (jsErrorCode(err) !== JS_WRONG_LAST_SEQUENCE) throw err;
        const last = await this.#last(key);
        if ((last?.seq ?? 0) !== expected || Date.now() > deadline) throw new StoreConflictError(key, { cause: err });
        continue;
      }
      // A sequence other than the one counted on (a duplicate's original): read the stream again.
      if (ack.seq !== lastSequence + 1) g.next = null;
      this.#guardDone(key);
      return ack.seq;
    }
  }

  /** Waits for a place in the pipeline for `key`; returns the stream sequence its write must expect. */
  async #guardSlot(key: string): Promise<number> {
    const g = this.#guard;
    for (;;) {
      if (!g.keys.has(key) && g.inFlight < GUARD_PIPELINE && g.refresh === null) {
        if (g.next !== null) {
          const expect = g.next++;
          g.inFlight++;
          g.keys.add(key);
          return expect;
        }
        if (g.inFlight === 0) {
          g.refresh = withRetry(this.#ctx, this.#retryMs, () => this.#ctx.jsm.streams.info(this.#stream)).then(
            (info) => void (g.next = info.state.last_seq),
          );
          try {
            await g.refresh;
          } finally {
            g.refresh = null;
            this.#guardWake();
          }
          continue;
        }
      }
      await new Promise<void>((resolve) => g.waiting.push(resolve));
    }
  }

  #guardDone(key: string): void {
    this.#guard.inFlight--;
    this.#guard.keys.delete(key);
    this.#guardWake();
  }

  #guardWake(): void {
    for (const wake of this.#guard.waiting.splice(0)) wake();
  }

  /** The key's last message: its value, or a tombstone; null if the subject holds nothing. */
  async #last(key: string): Promise<{ seq: number; data: Uint8Array; deleted: boolean } | null> {
    this.#check();
    const subject = this.#subject(key);
    try {
      const sm = await withRetry(this.#ctx, this.#retryMs, () => this.#ctx.jsm.streams.getMessage(this.#stream, { last_by_subj: subject }));
      const op = sm.header?.get(OPERATION);
      return { seq: sm.seq, data: sm.data, deleted: op === 'DEL' || op === 'PURGE' };
    } catch (err) {
      if (jsErrorCode(err) === JS_NO_MESSAGE_FOUND) return null;
      throw err;
    }
  }

  #subject(key: string): string {
    checkKey(key);
    // `/` is a NATS key character the port never uses, so encoded keys cannot meet plain ones.
    const token = SUBJECT_SAFE.test(key) ? key : `/${Buffer.from(key, 'utf8').toString('hex')}`;
    return `$KV.${this.#bucket}.${token}`;
  }

  #check(): void {
    if (this.#closed) throw new StoreError('STORE_CLOSED', 'Session store is closed');
  }
}

function checkKey(key: string): string {
  if (!KEY.test(key)) throw new StoreError('STORE_INVALID_KEY', `Invalid session store key ${JSON.stringify(key)}: allowed are [A-Za-z0-9_.=-]+`);
  return key;
}

function encode(key: string, value: unknown): Uint8Array {
  checkKey(key);
  const json = JSON.stringify(value);
  if (json === undefined) throw new TypeError(`Value of ${key} is not JSON`);
  return Buffer.from(json, 'utf8');
}
