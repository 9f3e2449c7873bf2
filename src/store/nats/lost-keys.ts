/**
 * A session-store read that finds nothing, told apart from one whose data the server lost.
 *
 * nats-server answers a read of a message it cannot load from its disk as "no message found"
 * (its message-get API reports every load error so), and a stream whose file store failed a
 * write comes back without its messages while its per-subject index still counts them (seen
 * with the store's disk detached under a running 2.15 server: `messages` 0, `first_seq` past
 * `last_seq`, every key "not found"). A KV read then says "no such key", and the service would
 * answer 400 `Upload session not initialized` or 404, or the uploader would drop a package of
 * a session it could not find. So a read that finds nothing asks the stream once more (only
 * then): a subject the stream still counts messages on but cannot give back, or a stream that
 * holds no message at all although its sequence moved, means lost data: `STORE_UNAVAILABLE`,
 * never "absent". The bucket is never rightly empty once written: a delete writes a marker
 * (removed after its TTL, session-store.ts), and `open` writes `KEPT_KEY`, never deleted.
 */
import { KEPT_KEY } from '../keys.js';
import { readForAnswer, StoreConflictError, StoreError, type Listed, type SessionStore, type Versioned } from '../ports.js';
import { JS_NO_MESSAGE_FOUND, jsErrorCode, KV_OPERATION, LastRead, withRetry, type NatsContext } from './connection.js';
import { kvKey } from './session-store.js';

/** How long the check re-sends through transient failures, as one store operation does. */
const RETRY_MS = 10_000;
/** How long a key found absent by the check stays so for answers (`getRecent`). */
export const ABSENT_REUSE_MS = 1000;
/** Keys whose absence is remembered (the most recently checked). */
const REMEMBERED_ABSENT = 4096;

export class LostKeysGuard implements SessionStore {
  readonly #inner: SessionStore;
  readonly #ctx: NatsContext;
  readonly #bucket: string;
  readonly #stream: string;
  /** Keys the check found absent, for answers. */
  readonly #foundAbsent: LastRead<true>;
  /** Checks under way for answers, by key. */
  readonly #checking = new Map<string, Promise<unknown>>();

  /** `now`: milliseconds, for how long an absence is reused (tests drive their own). */
  constructor(inner: SessionStore, ctx: NatsContext, bucket: string, now: () => number = () => performance.now()) {
    this.#inner = inner;
    this.#ctx = ctx;
    this.#bucket = bucket;
    this.#stream = `KV_${bucket}`;
    this.#foundAbsent = new LastRead<true>(REMEMBERED_ABSENT, now);
  }

  /** The guard, with `KEPT_KEY` written to the bucket if it is not there yet. */
  static async open(inner: SessionStore, ctx: NatsContext, bucket: string): Promise<LostKeysGuard> {
    try {
      if (!(await inner.get(KEPT_KEY))) await inner.create(KEPT_KEY, { kept: 'never deleted: the bucket is never rightly empty' });
    } catch (err) {
      if (!(err instanceof StoreConflictError)) throw err; // another process wrote it meanwhile
    }
    return new LostKeysGuard(inner, ctx, bucket);
  }

  get capabilities() {
    return this.#inner.capabilities;
  }

  async get<T>(key: string): Promise<Versioned<T> | null> {
    return (await this.#inner.get<T>(key)) ?? this.#checkNothing<T>(key);
  }

  /**
   * Nothing found is checked as `get` checks it (on the leader: a found value needs no check),
   * at most once per `ABSENT_REUSE_MS` and key: an answer may be that moment behind, and a
   * status polled while no package of its session is stored yet (its counts key absent, the
   * uploaders behind) would otherwise ask the stream's subject state every time, an API
   * request that queues behind the server's others under load. Concurrent checks share one.
   */
  async getRecent<T>(key: string): Promise<Versioned<T> | null> {
    const found = await readForAnswer<T>(this.#inner, key);
    if (found) return found;
    if (this.#foundAbsent.recent(key, ABSENT_REUSE_MS)) return null;
    let checking = this.#checking.get(key);
    if (!checking) {
      checking = this.#checkNothing<unknown>(key)
        .then((v) => {
          if (v === null) this.#foundAbsent.set(key, true);
          return v;
        })
        .finally(() => this.#checking.delete(key));
      this.#checking.set(key, checking);
    }
    return (await checking) as Versioned<T> | null;
  }

  /** Checked as `get` first: a key whose message is lost is STORE_UNAVAILABLE at once, not after `retryMs` of refused compare-and-sets. */
  async getConfirmed<T>(key: string): Promise<Versioned<T> | null> {
    await this.get(key);
    return this.#inner.getConfirmed<T>(key);
  }

  lostWrite(key: string): void {
    this.#inner.lostWrite?.(key);
  }

  contended(key: string): boolean {
    return this.#inner.contended?.(key) ?? false;
  }

  create<T>(key: string, value: T): Promise<number> {
    return this.#inner.create(key, value);
  }

  update<T>(key: string, value: T, revision: number): Promise<number> {
    return this.#inner.update(key, value, revision);
  }

  delete(key: string, revision?: number): Promise<void> {
    return this.#inner.delete(key, revision);
  }

  /** A listing never says that a key is absent, so it needs no check. */
  list<T>(prefix: string): AsyncIterable<Listed<T>> {
    return this.#inner.list<T>(prefix);
  }

  keys(prefix: string): AsyncIterable<string> {
    return this.#inner.keys(prefix);
  }

  close(): Promise<void> {
    return this.#inner.close();
  }

  /** Written meanwhile (the stream counts it now): read again; still nothing then, it is lost. */
  async #checkNothing<T>(key: string): Promise<Versioned<T> | null> {
    return (await this.#absent(key)) ? null : ((await this.#inner.get<T>(key)) ?? this.#lost(key));
  }

  /** True when the key holds nothing (never written, or its last message is a delete marker); false when it holds a message again; throws when its message is lost. */
  async #absent(key: string): Promise<boolean> {
    const subject = `$KV.${this.#bucket}.${kvKey(key)}`;
    const info = await withRetry(this.#ctx, RETRY_MS, () => this.#ctx.jsm.streams.info(this.#stream, { subjects_filter: subject }));
    if (info.state.messages === 0 && info.state.last_seq > 0) this.#lost(key);
    if ((info.state.subjects?.[subject] ?? 0) === 0) return true;
    // The stream counts a message on the key: a delete marker (absent), a value written since
    // the first read (read again), or one it cannot load (lost).
    try {
      const last = await withRetry(this.#ctx, RETRY_MS, () => this.#ctx.jsm.streams.getMessage(this.#stream, { last_by_subj: subject }));
      const op = last.header?.get(KV_OPERATION);
      return op === 'DEL' || op === 'PURGE';
    } catch (err) {
      if (jsErrorCode(err) === JS_NO_MESSAGE_FOUND) this.#lost(key);
      throw err;
    }
  }

  #lost(key: string): never {
    throw new StoreError(
      'STORE_UNAVAILABLE',
      `KV bucket ${this.#bucket}: the message of ${key} is counted but cannot be read back (the server's storage failed or lost it)`,
    );
  }
}
