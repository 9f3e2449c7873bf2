import { unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import { mkdirDurable } from '../../durable-file.js';
import { StoreError, type BatchQueue, type CommittedPackage, type PackageMeta, type PackageWriter, type QueueBacklog, type QueueConsumer } from '../ports.js';
import { DamageLog, type OnDamage } from './damage.js';
import { readOldIndex, type CommitRecord, type Location } from './batch-queue/index-format.js';
import { adoptReady } from './batch-queue/ready-dir.js';
import { Segments, type Segment } from './batch-queue/segments.js';
import { FileWriter, type InMemory } from './batch-queue/writer.js';
import { DISK_TIMEOUT_MS, StateDatabase } from './state-db.js';

export interface FileBatchQueueOptions {
  /** First redelivery delay after a handler throws; doubles per attempt, capped at 30 s (default 1000). */
  redeliveryDelayMs?: number;
  /** A segment file is closed for appends past this size (default 16 MiB; a batch is never split). */
  segmentBytes?: number;
  /**
   * Called for each damaged record found (default: an error log line): a batch whose
   * checksum fails (its package is dropped), or a line of an old index file being imported
   * (skipped; the ones after it are kept). A torn tail is not damage.
   */
  onDamage?: OnDamage;
  /**
   * Bytes of committed packages kept in memory until they are acked, so that the consumer
   * gets a small package without reading it back from its segment (default 32 MiB). A
   * package larger than `HELD_PACKAGE_BYTES`, one committed while the budget is spent, and
   * every package after a restart are read from their segment.
   */
  heldBytes?: number;
  /** Told after each delivery is settled (acked or put back for redelivery): what `pending` answers may have changed. */
  onSettled?: () => void;
  /** How long a segment's open, write or fdatasync waits for the disk before its package fails (`STORE_UNAVAILABLE`; default `DISK_TIMEOUT_MS`). */
  diskTimeoutMs?: number;
}

interface Entry extends CommitRecord {
  attempt: number;
  notBefore: number;
  inFlight: boolean;
  purged: boolean;
  /** The batches' bytes, while the package is held in memory (see `heldBytes`). */
  inMemory?: InMemory;
}

const ID = /^[A-Za-z0-9_.=-]+$/;
const MAX_DELAY_MS = 30_000;
/** Rows of the queue's table read at a time at open. */
const RECOVER_PAGE = 5_000;

/**
 * `BatchQueue` on local files for the batches' bytes and the state database (state-db.ts)
 * for its commit index, for one process, group-committed.
 *
 * ```
 * <dir>/segments/<n>.seg     batches of every package, appended as they come
 * state.sqlite, table queue  one row per committed, unacked package (seq, session, record)
 * ```
 * A package's batches are appended to the current segment (no fsync): they are written
 * before the package is known valid, up to 32 MiB, so they stay out of the database. `commit`
 * makes them durable (one fdatasync of the segment for every package committing meanwhile),
 * then inserts the package's row — meta, totals, where each batch lies and its CRC-32 — in the
 * state database's writer thread, where it shares a transaction and one WAL fsync with every
 * other write of the moment, session writes included. The package is visible once that
 * transaction is durable; a failed one (EIO, ENOSPC: `STORE_UNAVAILABLE`, answered 503) fails
 * the commits it carried, and their packages are never seen (unless the writer's fence after it
 * failed too, "outcome unknown": then a restart may find the row, a package its session never
 * recorded, which the service treats as any unrecorded package). Acks and purges delete rows
 * in the same writer, and nothing waits on an ack: one lost in a crash only means the
 * package is delivered once more (at-least-once); a segment goes only once the acks that
 * freed it are durable.
 *
 * Space follows what is live: a segment goes once no package uses it, the one being written
 * included (once every package in it is acked and it holds 1 MiB, or the queue is empty,
 * the next write goes to a fresh one), and one past `segmentBytes` is closed for appends.
 * A failed segment write or fdatasync fails the packages it carried: the next batch goes to
 * a fresh segment.
 *
 * Opening reads the table: committed, unacked packages come back in commit order (seq);
 * batches of packages that never committed are simply never referenced, and their segments
 * go. The database detects its own damage; a batch is checked against its CRC when read from
 * its segment: a damaged one is reported and its package dropped (`QUEUE_BATCH_LOST`), never
 * delivered with other bytes. Delivery attempts are counted in memory only. Layouts of older
 * versions are taken over at open: an index file (`index-<m>.ndjson`) is imported into the
 * table in one transaction and removed once that is durable; a `ready/` directory (a
 * directory per package) is committed anew.
 *
 * Its parts, in `batch-queue/`: `segments.ts` (the segment files), `writer.ts` (a package
 * being written), `index-format.ts` (the records, and the old index file's reader),
 * `ready-dir.ts` (the older layout taken over).
 */
export class FileBatchQueue implements BatchQueue {
  readonly #dir: string;
  readonly #delayMs: number;
  readonly #heldBudget: number;
  readonly #damage: DamageLog;
  /** Bytes of the packages held in memory now (their `inMemory`). */
  #heldBytes = 0;
  /** Committed, not acked, in commit order. Keyed by seq. */
  readonly #entries = new Map<number, Entry>();
  /** Committed, not acked, per session. */
  readonly #perSession = new Map<string, number>();
  readonly #segments: Segments;
  readonly #db: StateDatabase;
  /** Set when the queue opened its database itself (`open` with a path): closing the queue closes it. */
  readonly #ownsDb: boolean;
  /** The last ack or purge sent to the database (rejects if it failed): a segment goes only once it is durable. */
  #lastRemoval: Promise<unknown> = Promise.resolve();
  /** Commits sent to the database and not yet answered. */
  readonly #committing = new Set<Promise<unknown>>();
  readonly #writers = new Set<FileWriter>();
  readonly #consumers = new Set<QueueConsumer>();
  readonly #wakers = new Set<() => void>();
  #seq = 0;
  #closed = false;
  readonly #onSettled: (() => void) | undefined;

  private constructor(dir: string, db: StateDatabase, ownsDb: boolean, opts: FileBatchQueueOptions) {
    this.#dir = dir;
    this.#db = db;
    this.#ownsDb = ownsDb;
    this.#delayMs = opts.redeliveryDelayMs ?? 1000;
    this.#heldBudget = opts.heldBytes ?? 32 * 1024 * 1024;
    this.#damage = new DamageLog(opts.onDamage);
    this.#segments = new Segments(join(dir, 'segments'), opts.segmentBytes ?? 16 * 1024 * 1024, {
      // Every write is durable once it resolves, in order: the last ack's answer covers the ones before it.
      acksDurable: () => this.#lastRemoval.then(() => undefined),
      empty: () => this.#entries.size === 0,
      closed: () => this.#closed,
    }, opts.diskTimeoutMs ?? DISK_TIMEOUT_MS);
    this.#onSettled = opts.onSettled;
  }

  /**
   * Opens the queue of `dir` with its index in `state`: the service's state database (shared
   * with the session store and the ledger), or the path of one the queue opens (and closes)
   * itself (tests, tools).
   */
  static async open(dir: string, state: StateDatabase | string, opts: FileBatchQueueOptions = {}): Promise<FileBatchQueue> {
    const owned = typeof state === 'string';
    const db = owned ? await StateDatabase.open(state, { timeoutMs: opts.diskTimeoutMs }) : state;
    try {
      const q = new FileBatchQueue(dir, db, owned, opts);
      await mkdirDurable(join(dir, 'segments'));
      await q.#recover();
      return q;
    } catch (err) {
      if (owned) await db.close().catch(() => undefined);
      throw err;
    }
  }

  /** Damaged records found so far (each also handed to `onDamage`). */
  get damaged(): number {
    return this.#damage.count;
  }

  async open(meta: PackageMeta): Promise<PackageWriter> {
    this.#check();
    checkId('upload_uuid', meta.upload_uuid);
    checkId('package_id', meta.package_id);
    const writer: FileWriter = new FileWriter({ ...meta, columns: [...meta.columns] }, {
      place: (batch) => this.#place(batch),
      commit: (totals, batches, inMemory) => this.#commit(writer, totals, batches, inMemory),
      room: () => this.#heldBudget - this.#heldBytes,
      release: (segments) => this.#segments.release(segments),
      forget: () => this.#writers.delete(writer),
    });
    this.#writers.add(writer);
    return writer;
  }

  consume(handler: (pkg: CommittedPackage) => Promise<void>): QueueConsumer {
    this.#check();
    const state = { stopped: false };
    const loop = this.#run(state, handler);
    const consumer: QueueConsumer = {
      stop: async () => {
        state.stopped = true;
        this.#wake();
        await loop;
        this.#consumers.delete(consumer);
      },
    };
    this.#consumers.add(consumer);
    return consumer;
  }

  async pending(uploadUuid: string): Promise<number> {
    return this.#perSession.get(uploadUuid) ?? 0;
  }

  async hasPending(uploadUuid: string, opts: { stored?: (packageId: string) => Promise<boolean> } = {}): Promise<boolean> {
    if ((this.#perSession.get(uploadUuid) ?? 0) === 0) return false;
    if (!opts.stored) return true;
    // A package is marked stored a moment before its ack: the session's entries are looked at one by one.
    const ids = [...this.#entries.values()].filter((e) => e.meta.upload_uuid === uploadUuid).map((e) => e.meta.package_id);
    for (const id of ids) if (!(await opts.stored(id))) return true;
    return false;
  }

  async backlog(): Promise<QueueBacklog> {
    // Entries are kept in commit order: the first is the oldest.
    const oldest = this.#entries.values().next();
    return { packages: this.#entries.size, oldestAgeMs: oldest.done ? null : Math.max(0, Date.now() - oldest.value.at) };
  }

  async purge(uploadUuid: string): Promise<void> {
    checkId('upload_uuid', uploadUuid);
    for (const w of this.#writers) if (w.meta.upload_uuid === uploadUuid) w.drop();
    for (const e of [...this.#entries.values()]) {
      if (e.meta.upload_uuid !== uploadUuid) continue;
      e.purged = true;
      this.#remove(e);
    }
    // After any commit of the session already sent: the writer applies them in order.
    await this.#removal({ t: 'queue-purge', upload: uploadUuid });
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await Promise.all([...this.#consumers].map((c) => c.stop()));
    await Promise.all([...this.#writers].map((w) => w.abort()));
    await Promise.allSettled([...this.#committing, this.#lastRemoval]);
    await this.#segments.settled();
    // Every file is closed, whatever fails (a handle left open would fail its close at garbage collection, off any caller).
    const closed = await Promise.allSettled([...this.#segments.closing(), ...(this.#ownsDb ? [this.#db.close()] : [])]);
    const failed = closed.find((r) => r.status === 'rejected');
    if (failed) throw failed.reason;
  }

  /** Appends one batch to the current segment (see `Segments`); the writer holds a reference to it. */
  #place(batch: Uint8Array): { segment: Segment; location: Location; written: Promise<void> } {
    this.#check();
    return this.#segments.place(batch);
  }

  async #commit(
    writer: FileWriter,
    totals: { rows: number; bytes: number },
    batches: { segment: Segment; location: Location }[],
    inMemory: InMemory | null,
  ): Promise<void> {
    // The batches first, then the row that makes them a package.
    for (const segment of new Set(batches.map((b) => b.segment))) {
      try {
        await (await segment.file).sync();
      } catch (err) {
        this.#segments.retire(segment);
        throw err;
      }
    }
    if (writer.dropped) throw new StoreError('QUEUE_PACKAGE_DROPPED', `Package ${writer.meta.package_id} was dropped before its commit completed`);
    // The seq is taken as the row is sent: rows are written, and answered, in seq order, so
    // packages become visible in commit order.
    const rec: CommitRecord = {
      t: 'c',
      seq: ++this.#seq,
      meta: writer.meta,
      rows: totals.rows,
      bytes: totals.bytes,
      at: Date.now(),
      batches: batches.map((b) => b.location),
    };
    const written = this.#db.write({ t: 'queue-commit', seq: rec.seq, upload: rec.meta.upload_uuid, record: recordJson(rec) });
    this.#committing.add(written);
    try {
      // Durable once it resolves (WAL, synchronous=FULL); a failure rejects with STORE_UNAVAILABLE and the row is not there.
      await written;
    } finally {
      this.#committing.delete(written);
    }
    // Purged while its row was being written: the purge's delete comes after the insert, so it stays dropped after a restart too.
    if (!writer.dropped) {
      const entry: Entry = { ...rec, attempt: 0, notBefore: 0, inFlight: false, purged: false };
      // Other packages may have taken the room since the writer copied its batches.
      if (inMemory && this.#heldBytes + inMemory.bytes <= this.#heldBudget) {
        entry.inMemory = inMemory;
        this.#heldBytes += inMemory.bytes;
      }
      this.#add(entry);
      this.#wake();
    }
    if (writer.dropped) throw new StoreError('QUEUE_PACKAGE_DROPPED', `Package ${writer.meta.package_id} was dropped before its commit completed`);
  }

  #add(e: Entry): void {
    this.#entries.set(e.seq, e);
    this.#perSession.set(e.meta.upload_uuid, (this.#perSession.get(e.meta.upload_uuid) ?? 0) + 1);
  }

  /** Forgets an entry (acked or purged) and releases its segments. */
  #remove(e: Entry): void {
    if (!this.#entries.delete(e.seq)) return;
    if (e.inMemory) {
      this.#heldBytes -= e.inMemory.bytes;
      delete e.inMemory;
    }
    const left = (this.#perSession.get(e.meta.upload_uuid) ?? 1) - 1;
    if (left > 0) this.#perSession.set(e.meta.upload_uuid, left);
    else this.#perSession.delete(e.meta.upload_uuid);
    this.#segments.release(new Set(e.batches.map((b) => this.#segments.get(b[0])).filter((s): s is Segment => s !== undefined)));
  }

  /** An ack or purge: sent now, not awaited by the consumer; a segment it frees goes once it is durable. */
  #removal(op: { t: 'queue-ack'; seq: number } | { t: 'queue-purge'; upload: string }): Promise<unknown> {
    const written = this.#db.write(op);
    written.catch(() => undefined); // a lost ack is one more delivery; the segment stays (see `acksDurable`)
    this.#lastRemoval = written;
    return written;
  }

  async #recover(): Promise<void> {
    await this.#importOldIndex();
    // In pages: each read has the disk's deadline, however many packages wait.
    const rows: { seq: number; record: string }[] = [];
    for (;;) {
      const page = await this.#db.read<typeof rows>('queue.page', [rows.at(-1)?.seq ?? -1, RECOVER_PAGE]);
      rows.push(...page);
      if (page.length < RECOVER_PAGE) break;
    }
    const live = rows.map((r) => ({ t: 'c' as const, seq: r.seq, ...(JSON.parse(r.record) as Omit<CommitRecord, 't' | 'seq'>) }));
    let maxSegment = -1;
    const used = new Map<number, number>();
    for (const c of live) {
      for (const b of c.batches) maxSegment = Math.max(maxSegment, b[0]);
      for (const s of new Set(c.batches.map((b) => b[0]))) used.set(s, (used.get(s) ?? 0) + 1);
      this.#seq = Math.max(this.#seq, c.seq);
    }
    await this.#segments.recover(used, maxSegment);
    for (const c of live) {
      // Its bytes are gone with an acked neighbour's segment (a commit whose failure was
      // reported as of unknown outcome, come back): not a package; its row goes.
      if (c.batches.some((b) => !this.#segments.has(b[0]))) {
        void this.#removal({ t: 'queue-ack', seq: c.seq });
        continue;
      }
      this.#add({ ...c, attempt: 0, notBefore: 0, inFlight: false, purged: false });
    }
    await adoptReady(this.#dir, (meta) => this.open(meta));
  }

  /**
   * The index file of an earlier version (`index-<m>.ndjson`), if any: its live packages go
   * into the table in one transaction, which also marks the import done; the files are
   * removed only once it is durable. A crash in between finds the mark and only removes them.
   */
  async #importOldIndex(): Promise<void> {
    const old = await readOldIndex(this.#dir);
    if (old.files.length === 0) return;
    const imported = await this.#db.read('queue.imported', []);
    if (!imported) {
      for (const d of old.damaged) this.#damage.report(old.path, d.offset, d.reason);
      const rows = old.live.map((c) => ({ seq: c.seq, upload: c.meta.upload_uuid, record: recordJson(c) }));
      await this.#db.write({ t: 'queue-import', rows });
    }
    for (const f of old.files) await unlink(f).catch(() => undefined);
  }

  async #run(state: { stopped: boolean }, handler: (pkg: CommittedPackage) => Promise<void>): Promise<void> {
    while (!state.stopped) {
      const e = this.#take();
      if (typeof e === 'number') {
        await this.#sleep(e);
        continue;
      }
      let ok = false;
      const lost = { now: false };
      try {
        await handler(this.#delivery(e, lost));
        ok = true;
      } catch {
        // A throwing handler is the redelivery signal; reporting is the handler's business.
      }
      // Redelivery cannot bring a lost batch back: the package is dropped (reported when found).
      this.#settle(e, ok || lost.now);
      this.#onSettled?.();
    }
  }

  /** Claims the oldest deliverable package; or returns when to look again (Infinity: at the next wake). */
  #take(): Entry | number {
    const now = Date.now();
    let next = Infinity;
    for (const e of this.#entries.values()) {
      if (e.inFlight) continue;
      if (e.notBefore <= now) {
        e.inFlight = true;
        e.attempt++;
        return e;
      }
      next = Math.min(next, e.notBefore);
    }
    return next;
  }

  #settle(e: Entry, ok: boolean): void {
    e.inFlight = false;
    if (e.purged) return;
    if (ok) {
      // The ack is sent before its segments are released: their removal waits for it.
      void this.#removal({ t: 'queue-ack', seq: e.seq });
      this.#remove(e);
    } else {
      e.notBefore = Date.now() + Math.min(this.#delayMs * 2 ** (e.attempt - 1), Math.max(this.#delayMs, MAX_DELAY_MS));
    }
  }

  #delivery(e: Entry, lost: { now: boolean }): CommittedPackage {
    return {
      meta: e.meta,
      rows: e.rows,
      bytes: e.bytes,
      attempt: e.attempt,
      batches: (opts) => (e.inMemory ? fromMemory(e.inMemory) : this.#read(e, opts?.reuse === true, lost)),
    };
  }

  /**
   * With `reuse`, every batch is read into one buffer: a fresh 512 KiB buffer per batch
   * costs the in-process uploader about 3 ms of CPU per MB in page faults, allocation and GC
   * (bench, 4 × 32 MiB). Each batch is checked against its CRC before it is handed out.
   */
  async *#read(e: Entry, reuse: boolean, lost: { now: boolean }): AsyncIterable<Uint8Array> {
    const shared = reuse ? Buffer.allocUnsafe(e.batches.reduce((max, b) => Math.max(max, b[2]), 0)) : null;
    for (const [no, offset, length, crc] of e.batches) {
      // Purged (its session deleted) since the take: its segments may be released already; not damage.
      if (e.purged) throw dropped(e);
      const segment = this.#segments.get(no);
      if (!segment) {
        lost.now = true;
        this.#damage.report(this.#segments.path(no), offset, `the segment of package ${e.meta.package_id} (session ${e.meta.upload_uuid}) is gone; the package is dropped`);
        throw new StoreError('QUEUE_BATCH_LOST', `Segment ${no} of package ${e.meta.package_id} is gone`);
      }
      const buf = shared ? shared.subarray(0, length) : Buffer.allocUnsafe(length);
      try {
        await (await this.#segments.readable(segment)).read(buf, offset);
      } catch (err) {
        if (e.purged) throw dropped(e);
        throw err;
      }
      if (e.purged) throw dropped(e);
      if (crc !== undefined && crc32(buf) !== crc) {
        lost.now = true;
        this.#damage.report(this.#segments.path(no), offset, `a batch of ${length} bytes of package ${e.meta.package_id} (session ${e.meta.upload_uuid}) fails its CRC-32; the package is dropped`);
        throw new StoreError('QUEUE_BATCH_LOST', `A batch of package ${e.meta.package_id} is damaged (${this.#segments.path(no)} at ${offset})`);
      }
      yield buf;
    }
  }

  /** Resolves at the next wake (commit, stop) or at `until` (epoch ms). */
  #sleep(until: number): Promise<void> {
    return new Promise((resolve) => {
      let timer: NodeJS.Timeout | undefined;
      const done = (): void => {
        clearTimeout(timer);
        this.#wakers.delete(done);
        resolve();
      };
      this.#wakers.add(done);
      if (until !== Infinity) timer = setTimeout(done, Math.max(0, until - Date.now()));
    });
  }

  #wake(): void {
    for (const w of [...this.#wakers]) w();
  }

  #check(): void {
    if (this.#closed) throw new StoreError('STORE_CLOSED', 'Batch queue is closed');
  }
}

/** A package's row of `queue`: its record but the seq (a column of its own). */
function recordJson({ meta, rows, bytes, at, batches }: CommitRecord): string {
  return JSON.stringify({ meta, rows, bytes, at, batches });
}

/** A read of a package whose session was purged after the uploader took it: a drop, never a loss. */
function dropped(e: Entry): StoreError {
  return new StoreError('QUEUE_PACKAGE_DROPPED', `Package ${e.meta.package_id} was purged with its session ${e.meta.upload_uuid} while it was being read`);
}

/** A held package's batches, as `#read` would yield them from its segment. */
async function* fromMemory(inMemory: InMemory): AsyncIterable<Uint8Array> {
  yield* inMemory.batches;
}

function checkId(name: string, id: string): void {
  if (!ID.test(id) || id === '.' || id === '..') throw new StoreError('STORE_INVALID_KEY', `Invalid ${name} ${JSON.stringify(id)}: allowed are [A-Za-z0-9_.=-]+`);
}
