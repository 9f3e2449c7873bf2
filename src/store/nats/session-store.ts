import { nuid, type KV, type MsgHdrs, type Subscription } from 'nats';
import { KEY_PREFIX, StoreError, StoreConflictError, type Listed, type SessionStore, type Versioned } from '../ports.js';
import { answerSoon, confirmedRead, deleteMarker, directGet, enableStreamFeatures, isWrongLastSequence, KV_OPERATION, LastRead, openKv, readJson, withRetry, type NatsContext, type StreamFeatures } from './connection.js';
import { GroupPublisher } from './group-publisher.js';

export interface NatsSessionStoreOptions {
  /** KV bucket name (`[A-Za-z0-9_-]+`); the stream is `KV_<bucket>`. Created if missing, else used as it is. */
  bucket: string;
  /** Replicas of a bucket this call creates (1 or 3 in practice; at most the cluster size). */
  replicas: number;
  /** How long one operation keeps re-sending through transient failures such as a leader election (default 10000). */
  retryMs?: number;
  /**
   * How long a deleted key's marker stays in the stream, in seconds (default 3600), where the
   * server has per-message TTLs (2.11+); on 2.10 markers stay for good.
   */
  markerTtlSeconds?: number;
}

const KEY = /^[A-Za-z0-9_.=-]+$/;
/** Port keys whose dot-separated tokens are all non-empty are NATS subjects as they are. */
const SUBJECT_SAFE = /^[A-Za-z0-9_=-]+(\.[A-Za-z0-9_=-]+)*$/;
/** Keys a listing reads at once. */
const LIST_READS = 32;
/** Keys whose last message seen `getRecent` remembers (status of this many sessions never goes back in time). */
const SEEN_KEYS = 4096;
/** How long a key stays contended after another process said it lost a write of it (`lostWrite`). */
const CONTENDED_MS = 1000;
/** A process says that it lost a write of a key at most this often. */
const LOST_WRITE_EVERY_MS = 50;
/** How long a deleted key's marker stays by default: an hour. */
export const MARKER_TTL_SECONDS = 3600;

/**
 * `SessionStore` on a JetStream KV bucket (history 1, file storage). Revisions are stream
 * sequences: `create` publishes with expected last subject sequence 0 (or the tombstone's,
 * after a delete), `update` and conditional `delete` with the caller's revision, and the
 * server's "wrong last sequence" becomes STORE_CONFLICT; on nats-server 2.10 and
 * later (the floor, connection.ts) that check is serialised on clustered streams too. Reads
 * are nats.js's `kv.get`, answered by the stream leader (nats.js is told the bucket has no
 * direct get), so a write acknowledged anywhere is read back everywhere. `getRecent` is a
 * direct get (the stream allows it): any replica answers, so status keeps answering through
 * a leader election. A follower may answer a moment behind the leader, or not yet know a key
 * at all: the newer of its answer and what this instance last wrote or read of the key is
 * returned, so this instance's answers never go back in time. A key is deleted by a marker
 * that the server removes after `markerTtlSeconds` (nats-server 2.11+, `Nats-TTL`; on 2.10 it
 * stays), so the stream does not grow by a message for every key ever written (sessions,
 * listing entries, counts, every `Idempotency-Key`). A replica that finds no message while
 * this instance last saw a value asks the leader: the key may be new to the replica, or
 * deleted by another instance and its marker gone since.
 *
 * Writes are publishes of the KV's own message shape rather than nats.js's `kv.create` /
 * `kv.update`: those set no message id, and a write is re-sent on timeouts within `retryMs`
 * (a leader election costs a delay, not a failed write). Without the id, a re-send of a
 * write that did land would lose its own compare-and-set and read as a conflict; with it,
 * the stream's duplicate window answers with the original acknowledgement. Writes of
 * different keys ready at the same moment share one atomic batch where the server has them
 * (2.12+): one set of syncs for all; a batch in which one compare-and-set loses is stored not
 * at all and its writes go again one by one, each with its own answer.
 */
export class NatsSessionStore implements SessionStore {
  /** Every gateway shares the bucket. */
  readonly capabilities = { singleProcess: false } as const;
  readonly #ctx: NatsContext;
  readonly #bucket: string;
  readonly #stream: string;
  readonly #retryMs: number;
  readonly #kv: KV;
  /** Writes of every session ready at one moment go out together (group-publisher.ts). */
  readonly #writes: GroupPublisher;
  /** Whether `getRecent` may ask any replica (the stream allows direct get); else it reads as `get`. */
  readonly #direct: boolean;
  /** A deletion marker's headers: with a TTL where the stream allows one. */
  readonly #marker: () => MsgHdrs;
  /** What this instance last wrote or read of each key (the most recent `SEEN_KEYS`): `getRecent` never answers older. */
  readonly #seen = new LastRead<Last>(SEEN_KEYS);
  /** This instance, in what it tells the others (`lostWrite`). */
  readonly #instance = nuid.next();
  /** Keys another instance lost a write of, and those this one said it lost (`contended`, `lostWrite`). */
  readonly #contended = new LastRead<true>(SEEN_KEYS);
  readonly #told = new LastRead<true>(SEEN_KEYS);
  /** Where the instances on the bucket say that they lost a write (core NATS: nothing stored). */
  readonly #lostWrites: string;
  readonly #hints: Subscription;
  #closed = false;

  private constructor(ctx: NatsContext, kv: KV, bucket: string, retryMs: number, features: StreamFeatures, markerTtlSeconds: number) {
    this.#ctx = ctx;
    this.#kv = kv;
    this.#bucket = bucket;
    this.#stream = `KV_${bucket}`;
    this.#retryMs = retryMs;
    this.#writes = new GroupPublisher(ctx, this.#stream, { atomic: features.atomic, budgetMs: retryMs });
    this.#direct = features.direct;
    this.#marker = features.ttl ? () => deleteMarker(markerTtlSeconds) : () => deleteMarker();
    this.#lostWrites = `_INGEST.lost-write.${bucket}`;
    this.#hints = ctx.nc.subscribe(this.#lostWrites, {
      callback: (err, msg) => {
        if (err) return; // a subscription refused (permissions): fairness is lost, nothing else
        const [from, key] = msg.string().split(' ');
        if (from !== this.#instance && key) this.#contended.set(key, true);
      },
    });
  }

  /** How the writes went out: atomic batches and the writes in them, single publishes. */
  get publishStats(): GroupPublisher['stats'] {
    return this.#writes.stats;
  }

  static async open(ctx: NatsContext, opts: NatsSessionStoreOptions): Promise<NatsSessionStore> {
    if (!/^[A-Za-z0-9_-]+$/.test(opts.bucket)) throw new StoreError('STORE_MISCONFIGURED', `Invalid KV bucket name ${JSON.stringify(opts.bucket)}`);
    if (!Number.isInteger(opts.replicas) || opts.replicas < 1) throw new StoreError('STORE_MISCONFIGURED', `Invalid replicas ${opts.replicas} for bucket ${opts.bucket}`);
    const retryMs = opts.retryMs ?? 10_000;
    const markerTtlSeconds = opts.markerTtlSeconds ?? MARKER_TTL_SECONDS;
    if (!Number.isInteger(markerTtlSeconds) || markerTtlSeconds < 1) throw new StoreError('STORE_MISCONFIGURED', `Invalid marker TTL ${markerTtlSeconds} s for bucket ${opts.bucket}`);
    // `kv.get` stays on the leader: no stale read from a lagging replica where a decision rests on it.
    const kv = await openKv(ctx, opts.bucket, opts.replicas, retryMs);
    const features = await enableStreamFeatures(ctx, `KV_${opts.bucket}`, retryMs);
    return new NatsSessionStore(ctx, kv, opts.bucket, retryMs, features, markerTtlSeconds);
  }

  async get<T>(key: string): Promise<Versioned<T> | null> {
    // Read again while what arrives does not parse (`readJson`); `#last` has its own retries.
    return withRetry(this.#ctx, this.#retryMs, async () => this.#value<T>(key, await this.#last(key)));
  }

  async getRecent<T>(key: string): Promise<Versioned<T> | null> {
    if (!this.#direct) return this.get<T>(key);
    this.#check();
    return withRetry(this.#ctx, this.#retryMs, async () => {
      const fresh = directGet(this.#ctx, this.#stream, { last_by_subj: this.#subject(key) }, this.#retryMs).then(async (msg) => {
        const operation = msg?.headers?.get(KV_OPERATION);
        const seen = this.#seen.peek(key);
        if (msg && (!seen || msg.seq >= seen.seq)) return this.#saw(key, { seq: msg.seq, data: msg.data, deleted: operation === 'DEL' || operation === 'PURGE' });
        if (msg || !seen || seen.deleted) return seen ?? null;
        // Nothing where this instance saw a value: new to this replica, or deleted and its marker gone since.
        const last = await this.#last(key);
        if (!last) this.#seen.delete(key);
        return last;
      });
      return this.#value<T>(key, await answerSoon(fresh, () => this.#seen.recent(key)));
    });
  }

  /**
   * A read from the leader, then the value read written again expecting its revision, or
   * where the key holds none a deletion marker expecting the revision read (0: never
   * written), as `confirmedRead` does.
   */
  getConfirmed<T>(key: string): Promise<Versioned<T> | null> {
    return confirmedRead(`Session store key ${key}`, this.#retryMs, (err) => err instanceof StoreConflictError, async () => {
      const { last, read } = await withRetry(this.#ctx, this.#retryMs, async () => {
        const last = await this.#last(key);
        return { last, read: this.#value<T>(key, last) };
      });
      if (read && last) return { value: read.value, revision: await this.#write(key, last.data, last.seq) };
      await this.#write(key, new Uint8Array(0), last?.seq ?? 0, this.#marker);
      return null;
    });
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
    await this.#write(key, new Uint8Array(0), revision, this.#marker);
  }

  /**
   * The bucket's subjects under the prefix from the stream's info (`subjects_filter`, paged by
   * nats.js; a deleted key's marker is counted there too), then each key's last message, read
   * as `get` reads it. Not nats.js's `kv.keys`: its iterator drops keys that arrive while the
   * reader is busy and the listing ends meanwhile (nats.js 2.29, `QueuedIteratorImpl` breaks
   * on `done` before the keys pushed since), which a slow reader here always is.
   */
  async *list<T>(prefix: string): AsyncIterable<Listed<T>> {
    const keys = await this.#keys(prefix);
    for (let i = 0; i < keys.length; i += LIST_READS) {
      const read = await Promise.all(keys.slice(i, i + LIST_READS).map(async (key) => ({ key, got: await this.get<T>(key) })));
      for (const { key, got } of read) {
        if (got) yield { key, ...got };
      }
    }
  }

  /** The subjects of `list`, without reading a message: a deleted key is among them while its marker is in the stream. */
  async *keys(prefix: string): AsyncIterable<string> {
    yield* await this.#keys(prefix);
  }

  async #keys(prefix: string): Promise<string[]> {
    if (!KEY_PREFIX.test(prefix)) throw new StoreError('STORE_INVALID_KEY', `Invalid session store key prefix ${JSON.stringify(prefix)}`);
    this.#check();
    const head = `$KV.${this.#bucket}.`;
    const info = await withRetry(this.#ctx, this.#retryMs, () => this.#ctx.jsm.streams.info(this.#stream, { subjects_filter: `${head}${prefix}>` }));
    return Object.keys(info.state.subjects ?? {})
      .map((subject) => subject.slice(head.length))
      .map((token) => (token.startsWith('/') ? Buffer.from(token.slice(1), 'hex').toString('utf8') : token))
      .filter((key) => key.startsWith(prefix) && KEY.test(key));
  }

  lostWrite(key: string): void {
    if (this.#closed || this.#told.recent(key, LOST_WRITE_EVERY_MS)) return;
    this.#told.set(key, true);
    try {
      this.#ctx.nc.publish(this.#lostWrites, `${this.#instance} ${key}`);
    } catch {
      // A closed or draining connection: nobody to tell.
    }
  }

  contended(key: string): boolean {
    return this.#contended.recent(key, CONTENDED_MS) !== undefined;
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#hints.unsubscribe();
  }

  async #write(key: string, data: Uint8Array, expected: number | undefined, hdrs?: () => MsgHdrs): Promise<number> {
    this.#check();
    try {
      const seq = await this.#writes.publish({
        subject: this.#subject(key),
        data,
        msgID: nuid.next(),
        ...(hdrs ? { headers: hdrs } : {}),
        ...(expected === undefined ? {} : { lastSubjectSequence: expected }),
      });
      this.#saw(key, { seq, data, deleted: hdrs !== undefined });
      return seq;
    } catch (err) {
      if (isWrongLastSequence(err)) throw new StoreConflictError(key, { cause: err });
      throw err;
    }
  }

  /** The key's last message: its value, or a tombstone; null if the subject holds nothing. */
  async #last(key: string): Promise<Last | null> {
    this.#check();
    const entry = await withRetry(this.#ctx, this.#retryMs, () => this.#kv.get(this.#token(key)));
    if (!entry) return null;
    return this.#saw(key, { seq: entry.revision, data: entry.value, deleted: entry.operation !== 'PUT' });
  }

  /** A key's last message as the port answers it: null for none or a tombstone. Damaged bytes are not kept for answers. */
  #value<T>(key: string, last: Last | null): Versioned<T> | null {
    if (!last || last.deleted) return null;
    try {
      return { value: readJson<T>(last.data, `Session store key ${key}`), revision: last.seq };
    } catch (err) {
      if (this.#seen.peek(key) === last) this.#seen.delete(key);
      throw err;
    }
  }

  /** Remembers `last` as what this instance saw of `key`, unless it saw a later message. */
  #saw(key: string, last: Last): Last {
    if (!this.#direct) return last;
    const seen = this.#seen.peek(key);
    if (seen && seen.seq > last.seq) return last;
    this.#seen.set(key, last);
    return last;
  }

  #subject(key: string): string {
    return `$KV.${this.#bucket}.${this.#token(key)}`;
  }

  #token(key: string): string {
    return kvKey(key);
  }

  #check(): void {
    if (this.#closed) throw new StoreError('STORE_CLOSED', 'Session store is closed');
  }
}

/** A key's last message: its value, or a tombstone. */
interface Last {
  seq: number;
  data: Uint8Array;
  deleted: boolean;
}

/** The KV key (subject token) of a port key. */
export function kvKey(key: string): string {
  checkKey(key);
  // `/` is a NATS key character the port never uses, so encoded keys cannot meet plain ones.
  return SUBJECT_SAFE.test(key) ? key : `/${Buffer.from(key, 'utf8').toString('hex')}`;
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
