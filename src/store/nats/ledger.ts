import { randomUUID } from 'node:crypto';
import type { KV, KvEntry } from 'nats';
import { StoreError, type LedgerEntry, type PackageLedger, type SessionStore } from '../ports.js';
import { confirmedRead, deleteMarker, enableStreamFeatures, isWrongLastSequence, openKv, publishOnce, readJson, unavailable, withRetry, type NatsContext } from './connection.js';
import { GroupPublisher } from './group-publisher.js';
import { NatsStoredCounts } from './stored-counts.js';

export interface NatsLedgerOptions {
  /** KV bucket name (`[A-Za-z0-9_-]+`), its own stream (`KV_<bucket>`): ledger writes never touch the session bucket. */
  bucket: string;
  replicas: number;
  /** How long one operation keeps retrying through transient failures such as a leader election (default 10000). */
  retryMs?: number;
  /**
   * The session store whose summaries `countStored` checks; without it (or on a server without
   * atomic batches) the ledger keeps no count and session/stored-counts.ts counts apart.
   */
  sessions?: SessionStore;
}

const ID = /^[A-Za-z0-9_-]+$/;
/** Rounds of entries in flight at once (group-publisher.ts). */
export const ENTRY_ROUNDS = 2;

/**
 * `PackageLedger` on a JetStream KV bucket: one key `<upload_uuid>.<package_id>` per entry
 * (history 1). Every write is a plain put of a key no other package uses, so writes never
 * conflict and need no compare-and-set: writing the same entry twice (a retry, or two
 * instances completing one recording) stores the same value. Puts of every session that are
 * ready at the same moment go out as one atomic batch where the server has them (2.12+).
 * Reads go to the stream leader (no direct get), so an entry whose put was acknowledged is
 * read back everywhere. `list` is a KV watch of the session's keys, stopped once the initial
 * values are in, each waited for at most `retryMs`. The uploader's markers are keys
 * `<upload_uuid>.<package_id>.stored` in the same bucket: `drop` purges them with the
 * entries, and `list` (keys of two tokens) skips them.
 * With a session store and atomic batches (2.12+) the ledger counts its markers itself, each
 * marker and its session's counts in one batch (stored-counts.ts).
 */
export class NatsLedger implements PackageLedger {
  readonly #ctx: NatsContext;
  readonly #kv: KV;
  readonly #bucket: string;
  readonly #retryMs: number;
  /** Entries of every session written meanwhile go out together (group-publisher.ts). */
  readonly #puts: GroupPublisher;
  #closed = false;
  /** The ledger's own count (`PackageLedger.countStored`), where it keeps one. */
  readonly counts: NatsStoredCounts | undefined;
  readonly countStored?: PackageLedger['countStored'];
  readonly storedCounts?: PackageLedger['storedCounts'];

  private constructor(ctx: NatsContext, kv: KV, bucket: string, retryMs: number, atomic: boolean, counts: NatsStoredCounts | undefined) {
    this.#ctx = ctx;
    this.#kv = kv;
    this.#bucket = bucket;
    this.#retryMs = retryMs;
    // Entries are written after their package's 200, and nobody waits for one: two rounds at
    // a time make bigger batches, fewer syncs of the stream. (Markers go this way too where the
    // ledger keeps no count, before 2.12: there a round sends up to 256 waiting messages at once.)
    this.#puts = new GroupPublisher(ctx, `KV_${bucket}`, { atomic, budgetMs: retryMs, maxRounds: ENTRY_ROUNDS });
    this.counts = counts;
    if (counts) {
      this.countStored = async (uploadUuid, packages, summaryKey) => {
        this.#check(uploadUuid);
        for (const p of packages) this.#key(uploadUuid, p.package_id);
        return counts.count(uploadUuid, packages, summaryKey);
      };
      this.storedCounts = async (uploadUuid) => {
        this.#check(uploadUuid);
        return counts.perEntity(uploadUuid);
      };
    }
  }

  /** How the entries went out: atomic batches and the entries in them, single puts. */
  get publishStats(): GroupPublisher['stats'] {
    return this.#puts.stats;
  }

  static async open(ctx: NatsContext, opts: NatsLedgerOptions): Promise<NatsLedger> {
    if (!ID.test(opts.bucket)) throw new StoreError('STORE_MISCONFIGURED', `Invalid KV bucket name ${JSON.stringify(opts.bucket)}`);
    const retryMs = opts.retryMs ?? 10_000;
    const kv = await openKv(ctx, opts.bucket, opts.replicas, retryMs);
    const { atomic, direct } = await enableStreamFeatures(ctx, `KV_${opts.bucket}`, retryMs);
    const counts =
      atomic && opts.sessions
        ? new NatsStoredCounts(ctx, {
            kv,
            bucket: opts.bucket,
            sessions: opts.sessions,
            retryMs,
            // Answers (status) read the counts from any replica; decisions read the leader (`kv` is told no direct get).
            direct,
          })
        : undefined;
    return new NatsLedger(ctx, kv, opts.bucket, retryMs, atomic, counts);
  }

  async append(uploadUuid: string, entries: readonly LedgerEntry[]): Promise<void> {
    this.#check(uploadUuid);
    // Plain puts of the KV's own message shape (`$KV.<bucket>.<key>`, no headers), published
    // through the group publisher so that the entries of every session written meanwhile share
    // one atomic batch: one set of syncs instead of one per entry.
    await Promise.all(
      entries.map((e) => this.#puts.publish({ subject: `$KV.${this.#bucket}.${this.#key(uploadUuid, e.package_id)}`, data: Buffer.from(JSON.stringify(e)) })),
    );
  }

  async get(uploadUuid: string, packageId: string): Promise<LedgerEntry | null> {
    this.#check(uploadUuid);
    const key = this.#key(uploadUuid, packageId);
    return withRetry(this.#ctx, this.#retryMs, async () => {
      const entry = await this.#kv.get(key);
      return entry && entry.operation === 'PUT' ? readJson<LedgerEntry>(entry.value, `Ledger entry ${key}`) : null;
    });
  }

  /**
   * A read from the leader, and where it finds no entry a deletion marker published expecting
   * the key's revision as read (0: never written), as `confirmedRead` does.
   */
  async getConfirmed(uploadUuid: string, packageId: string): Promise<LedgerEntry | null> {
    this.#check(uploadUuid);
    const key = this.#key(uploadUuid, packageId);
    return confirmedRead(`Ledger entry ${key}`, this.#retryMs, isWrongLastSequence, async (deadline) => {
      const read = await withRetry(this.#ctx, this.#retryMs, () => this.#kv.get(key));
      if (read?.operation === 'PUT') return readJson<LedgerEntry>(read.value, `Ledger entry ${key}`);
      await publishOnce(this.#ctx, `$KV.${this.#bucket}.${key}`, new Uint8Array(), {
        stream: `KV_${this.#bucket}`,
        msgID: randomUUID(),
        budgetMs: Math.max(1, deadline - Date.now()),
        lastSubjectSequence: read?.revision ?? 0,
        headers: deleteMarker,
      });
      return null;
    });
  }

  async *list(uploadUuid: string): AsyncIterable<LedgerEntry> {
    this.#check(uploadUuid);
    let initialized = false;
    let wake!: () => void;
    const ready = new Promise<'initialized'>((resolve) => (wake = () => resolve('initialized')));
    const watch = await withRetry(this.#ctx, this.#retryMs, () =>
      this.#kv.watch({
        // Entries only: a marker (`<upload_uuid>.<package_id>.stored`) has a third token.
        key: `${uploadUuid}.*`,
        // Deletion markers (`getConfirmed`) are yielded and skipped below: ignored by nats.js,
        // they still count in `getReceived`, and the listing would wait for them forever.
        ignoreDeletes: false,
        initializedFn: () => {
          initialized = true;
          wake();
        },
      }),
    );
    // nats.js calls `initializedFn` either at once, in `watch`, when every initial value is
    // already queued (then they are the first `getReceived()` entries), or from the iterator,
    // in order, once every initial value before it was yielded.
    const it = watch[Symbol.asyncIterator]();
    // Once made, the watch's consumer waits for NATS without a deadline of its own (nats.js
    // makes it again after a reconnect, re-sending without end): each wait for the next entry
    // is bounded here, and whatever ends the watch is the storage's failure, not a 500.
    const next = async (): Promise<IteratorResult<KvEntry>> => {
      let timer: NodeJS.Timeout | undefined;
      const silent = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new StoreError('STORE_UNAVAILABLE', `NATS gave no entry of the ledger's listing of ${uploadUuid} for ${this.#retryMs} ms`)), this.#retryMs);
      });
      try {
        return await Promise.race([it.next(), silent]);
      } catch (err) {
        throw err instanceof StoreError ? err : new StoreError('STORE_UNAVAILABLE', `The ledger's listing of ${uploadUuid} failed: ${(err as Error)?.message ?? String(err)}`, { cause: err });
      } finally {
        clearTimeout(timer);
      }
    };
    try {
      if (initialized) {
        for (let n = watch.getReceived(); n > 0; n--) {
          const got = await next();
          if (got.done) return;
          if (got.value.operation === 'PUT') yield entryOf(got.value);
        }
        return;
      }
      for (;;) {
        const got = await Promise.race([next(), ready]);
        if (got === 'initialized' || got.done) return;
        if (got.value.operation === 'PUT') yield entryOf(got.value);
      }
    } finally {
      watch.stop();
    }
  }

  async markStored(uploadUuid: string, packageIds: readonly string[]): Promise<void> {
    this.#check(uploadUuid);
    await Promise.all(
      packageIds.map((id) => this.#puts.publish({ subject: `$KV.${this.#bucket}.${this.#key(uploadUuid, id)}.stored`, data: Buffer.from('1') })),
    );
  }

  async isStored(uploadUuid: string, packageId: string): Promise<boolean> {
    this.#check(uploadUuid);
    const entry = await withRetry(this.#ctx, this.#retryMs, () => this.#kv.get(`${this.#key(uploadUuid, packageId)}.stored`));
    return entry !== null && entry.operation === 'PUT';
  }

  async drop(uploadUuid: string): Promise<void> {
    this.#check(uploadUuid);
    await withRetry(this.#ctx, this.#retryMs, () =>
      this.#ctx.jsm.streams.purge(`KV_${this.#bucket}`, { filter: `$KV.${this.#bucket}.${uploadUuid}.>` }),
    );
    this.counts?.forget(uploadUuid);
  }

  async close(): Promise<void> {
    this.#closed = true;
  }

  #key(uploadUuid: string, packageId: string): string {
    if (!ID.test(packageId)) throw new StoreError('STORE_INVALID_KEY', `Invalid package_id ${JSON.stringify(packageId)}`);
    return `${uploadUuid}.${packageId}`;
  }

  #check(uploadUuid: string): void {
    if (this.#closed) throw new StoreError('STORE_CLOSED', 'Ledger is closed');
    if (!ID.test(uploadUuid)) throw new StoreError('STORE_INVALID_KEY', `Invalid upload_uuid ${JSON.stringify(uploadUuid)}`);
  }
}

/** A ledger entry as a listing reads it; damaged bytes end the listing with `STORE_UNAVAILABLE` (a watch is not read again). */
function entryOf(e: KvEntry): LedgerEntry {
  try {
    return readJson<LedgerEntry>(e.value, `Ledger entry ${e.key}`);
  } catch (err) {
    throw unavailable(err);
  }
}
