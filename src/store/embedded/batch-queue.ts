import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import { mkdirDurable } from '../../durable-file.js';
import { StoreError, type BatchQueue, type CommittedPackage, type PackageMeta, type PackageWriter, type QueueBacklog, type QueueConsumer } from '../ports.js';
import { DamageLog, type OnDamage } from './damage.js';
import { IndexLog } from './batch-queue/index-log.js';
import { indexLine, type CommitRecord, type Location } from './batch-queue/index-format.js';
import { adoptReady } from './batch-queue/ready-dir.js';
import { Segments, type Segment } from './batch-queue/segments.js';
import { FileWriter, type InMemory } from './batch-queue/writer.js';

export interface FileBatchQueueOptions {
  /** First redelivery delay after a handler throws; doubles per attempt, capped at 30 s (default 1000). */
  redeliveryDelayMs?: number;
  /** A segment file is closed for appends past this size (default 16 MiB; a batch is never split). */
  segmentBytes?: number;
  /**
   * The index is rewritten with only its live packages once it is past this size and four
   * times what their lines take (default 1 MiB): each line is rewritten at most a third of
   * a time on average, and a backlog of many packages is not rewritten at every step.
   */
  indexCompactBytes?: number;
  /**
   * Called for each damaged record found (default: an error log line): an index line or a
   * batch whose checksum fails. The record is skipped (a batch's package is dropped); the
   * ones after it are kept. A torn tail (the end of a write a crash cut short) is not damage.
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
}

interface Entry extends CommitRecord {
  /** Bytes of its index line. */
  lineBytes: number;
  attempt: number;
  notBefore: number;
  inFlight: boolean;
  purged: boolean;
  /** The batches' bytes, while the package is held in memory (see `heldBytes`). */
  inMemory?: InMemory;
}

const ID = /^[A-Za-z0-9_.=-]+$/;
const MAX_DELAY_MS = 30_000;

/**
 * `BatchQueue` on local files, for one process, group-committed.
 *
 * ```
 * <dir>/segments/<n>.seg     batches of every package, appended as they come
 * <dir>/index-<m>.ndjson     one line per commit, ack and purge
 * ```
 * A package's batches are appended to the current segment (no fsync). `commit` makes them
 * durable (one fdatasync of the segment for every package committing meanwhile), then
 * appends the package's commit line — meta, totals, where each batch lies and its CRC-32 —
 * to the index (one fdatasync for every commit meanwhile, of every session); the package is
 * durable and visible once that line is. So a commit costs two shared fdatasyncs, not a
 * file, a directory and five fsyncs of its own. Acks and purges are index lines too, not
 * synced: an ack lost in a crash only means the package is delivered once more
 * (at-least-once). Every index line starts with the CRC-32 of its JSON.
 *
 * Space follows what is live: a segment goes once no package uses it, the one being written
 * included (once every package in it is acked and it holds 1 MiB, or the queue is empty,
 * the next write goes to a fresh one), and
 * one past `segmentBytes` is closed for appends; the index is rewritten with its live
 * packages only once it is past `indexCompactBytes` and four times what they take.
 *
 * A failed write or fdatasync fails the packages it carried, not the queue: the next
 * batch goes to a fresh segment, the next index line to a fresh index (the live packages
 * rewritten), and a commit is visible only once its line is durable.
 *
 * Opening replays the index: committed, unacked packages come back in commit order;
 * batches of packages that never committed are simply never referenced. A line whose
 * checksum fails with valid lines after it is damage: reported (`onDamage`), skipped, and
 * the index rewritten without it; failing lines at the end are a torn tail, cut off. A batch
 * is checked against its CRC when read from its segment: a damaged one is reported and its
 * package dropped (`QUEUE_BATCH_LOST`), never delivered with other bytes. Delivery attempts
 * are counted in memory only. A `ready/` directory of an older version (a directory per
 * package) is taken over at open.
 *
 * Its parts, in `batch-queue/`: `segments.ts` (the segment files), `index-log.ts` (the index,
 * appended and compacted) and `index-format.ts` (its lines), `writer.ts` (a package being
 * written), `ready-dir.ts` (the older layout taken over).
 */
export class FileBatchQueue implements BatchQueue {
  readonly #dir: string;
  readonly #delayMs: number;
  readonly #indexCompactBytes: number;
  readonly #heldBudget: number;
  readonly #damage: DamageLog;
  /** Bytes of the packages held in memory now (their `inMemory`). */
  #heldBytes = 0;
  /** Committed, not acked, in commit order. Keyed by seq. */
  readonly #entries = new Map<number, Entry>();
  /** Bytes of the live packages' index lines. */
  #liveLineBytes = 0;
  /** Committed, not acked, per session. */
  readonly #perSession = new Map<string, number>();
  readonly #segments: Segments;
  #index!: IndexLog;
  readonly #writers = new Set<FileWriter>();
  readonly #consumers = new Set<QueueConsumer>();
  readonly #wakers = new Set<() => void>();
  #seq = 0;
  #closed = false;
  readonly #onSettled: (() => void) | undefined;

  private constructor(dir: string, opts: FileBatchQueueOptions) {
    this.#dir = dir;
    this.#delayMs = opts.redeliveryDelayMs ?? 1000;
    this.#indexCompactBytes = opts.indexCompactBytes ?? 1024 * 1024;
    this.#heldBudget = opts.heldBytes ?? 32 * 1024 * 1024;
    this.#damage = new DamageLog(opts.onDamage);
    this.#segments = new Segments(join(dir, 'segments'), opts.segmentBytes ?? 16 * 1024 * 1024, {
      syncIndex: () => this.#index.append(null, true),
      empty: () => this.#entries.size === 0,
      closed: () => this.#closed,
    });
    this.#onSettled = opts.onSettled;
  }

  static async open(dir: string, opts: FileBatchQueueOptions = {}): Promise<FileBatchQueue> {
    const q = new FileBatchQueue(dir, opts);
    await mkdirDurable(join(dir, 'segments'));
    await q.#recover();
    return q;
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

  async hasPending(uploadUuid: string): Promise<boolean> {
    return (this.#perSession.get(uploadUuid) ?? 0) > 0;
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
    await this.#index.append({ t: 'p', upload_uuid: uploadUuid }, true);
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await Promise.all([...this.#consumers].map((c) => c.stop()));
    await Promise.all([...this.#writers].map((w) => w.abort()));
    await this.#segments.settled();
    await this.#index.idle();
    // Every file is closed, whatever fails (a handle left open would fail its close at garbage collection, off any caller).
    const closed = await Promise.allSettled([this.#index.close(), ...this.#segments.closing()]);
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
    // The batches first, then the line that makes them a package.
    for (const segment of new Set(batches.map((b) => b.segment))) {
      try {
        await (await segment.file).sync();
      } catch (err) {
        this.#segments.retire(segment);
        throw err;
      }
    }
    if (writer.dropped) throw new StoreError('QUEUE_PACKAGE_DROPPED', `Package ${writer.meta.package_id} was dropped before its commit completed`);
    const rec: CommitRecord = {
      t: 'c',
      seq: ++this.#seq,
      meta: writer.meta,
      rows: totals.rows,
      bytes: totals.bytes,
      at: Date.now(),
      batches: batches.map((b) => b.location),
    };
    const line = indexLine(rec);
    await this.#index.append(line, true, () => {
      // Purged while its line was being written: the purge line comes after it, so it stays dropped after a restart too.
      if (writer.dropped) return;
      const entry: Entry = { ...rec, lineBytes: line.length, attempt: 0, notBefore: 0, inFlight: false, purged: false };
      // Other packages may have taken the room since the writer copied its batches.
      if (inMemory && this.#heldBytes + inMemory.bytes <= this.#heldBudget) {
        entry.inMemory = inMemory;
        this.#heldBytes += inMemory.bytes;
      }
      this.#add(entry);
      this.#wake();
    });
    if (writer.dropped) throw new StoreError('QUEUE_PACKAGE_DROPPED', `Package ${writer.meta.package_id} was dropped before its commit completed`);
  }

  #add(e: Entry): void {
    this.#entries.set(e.seq, e);
    this.#liveLineBytes += e.lineBytes;
    this.#perSession.set(e.meta.upload_uuid, (this.#perSession.get(e.meta.upload_uuid) ?? 0) + 1);
  }

  /** Forgets an entry (acked or purged) and releases its segments. */
  #remove(e: Entry): void {
    if (!this.#entries.delete(e.seq)) return;
    this.#liveLineBytes -= e.lineBytes;
    if (e.inMemory) {
      this.#heldBytes -= e.inMemory.bytes;
      delete e.inMemory;
    }
    const left = (this.#perSession.get(e.meta.upload_uuid) ?? 1) - 1;
    if (left > 0) this.#perSession.set(e.meta.upload_uuid, left);
    else this.#perSession.delete(e.meta.upload_uuid);
    this.#segments.release(new Set(e.batches.map((b) => this.#segments.get(b[0])).filter((s): s is Segment => s !== undefined)));
  }

  async #recover(): Promise<void> {
    const { records, end, damaged, legacy, path, no } = await IndexLog.read(this.#dir);
    const live = new Map<number, CommitRecord & { lineBytes: number }>();
    let maxSegment = -1;
    for (const { rec, bytes } of records) {
      if (rec.t === 'c') {
        live.set(rec.seq, { ...rec, lineBytes: bytes });
        for (const b of rec.batches) maxSegment = Math.max(maxSegment, b[0]);
      } else if (rec.t === 'a') live.delete(rec.seq);
      else for (const [seq, c] of live) if (c.meta.upload_uuid === rec.upload_uuid) live.delete(seq);
    }
    for (const d of damaged) this.#damage.report(path, d.offset, d.reason);
    this.#index = await IndexLog.open(this.#dir, no, end, this.#indexCompactBytes, {
      live: () => this.#entries.values(),
      liveLineBytes: () => this.#liveLineBytes,
    });

    const used = new Map<number, number>();
    for (const c of live.values()) for (const s of new Set(c.batches.map((b) => b[0]))) used.set(s, (used.get(s) ?? 0) + 1);
    await this.#segments.recover(used, maxSegment);
    for (const c of [...live.values()].sort((a, b) => a.seq - b.seq)) {
      const missing = c.batches.some((b) => !this.#segments.has(b[0]));
      if (missing) continue; // its bytes are gone with an acked neighbour's segment: it was acked too
      this.#add({ ...c, attempt: 0, notBefore: 0, inFlight: false, purged: false });
    }
    for (const seq of live.keys()) this.#seq = Math.max(this.#seq, seq);
    // Damage, once reported, goes with the index it was in; lines of an older version gain their checksums.
    if (damaged.length > 0 || legacy) await this.#index.compact();
    await adoptReady(this.#dir, (meta) => this.open(meta));
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
      this.#remove(e);
      void this.#index.append({ t: 'a', seq: e.seq }, false).catch(() => undefined);
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
      const segment = this.#segments.get(no);
      if (!segment) {
        lost.now = true;
        this.#damage.report(this.#segments.path(no), offset, `the segment of package ${e.meta.package_id} (session ${e.meta.upload_uuid}) is gone; the package is dropped`);
        throw new StoreError('QUEUE_BATCH_LOST', `Segment ${no} of package ${e.meta.package_id} is gone`);
      }
      const buf = shared ? shared.subarray(0, length) : Buffer.allocUnsafe(length);
      const file = await segment.file;
      await file.read(buf, offset);
      if (crc !== undefined && crc32(buf) !== crc) {
        lost.now = true;
        this.#damage.report(file.path, offset, `a batch of ${length} bytes of package ${e.meta.package_id} (session ${e.meta.upload_uuid}) fails its CRC-32; the package is dropped`);
        throw new StoreError('QUEUE_BATCH_LOST', `A batch of package ${e.meta.package_id} is damaged (${file.path} at ${offset})`);
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

/** A held package's batches, as `#read` would yield them from its segment. */
async function* fromMemory(inMemory: InMemory): AsyncIterable<Uint8Array> {
  yield* inMemory.batches;
}

function checkId(name: string, id: string): void {
  if (!ID.test(id) || id === '.' || id === '..') throw new StoreError('STORE_INVALID_KEY', `Invalid ${name} ${JSON.stringify(id)}: allowed are [A-Za-z0-9_.=-]+`);
}
