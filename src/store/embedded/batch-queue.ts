import { readFile, readdir, rm, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import { mkdirDurable, writeFileAtomic } from '../../durable-file.js';
import { StoreError, type BatchQueue, type CommittedPackage, type PackageMeta, type PackageWriter, type QueueBacklog, type QueueConsumer } from '../ports.js';
import { AppendFile } from './append-file.js';
import { DamageLog, type OnDamage } from './damage.js';

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

/** A package up to this size is kept in memory for its consumer (see `heldBytes`). */
const HELD_PACKAGE_BYTES = 64 * 1024;

/** Copies of a package's batches, kept in memory for its consumer, and their size. */
interface InMemory {
  batches: Buffer[];
  bytes: number;
}

/** Where one batch lies: segment number, offset, length, CRC-32 of its bytes (none in indexes of earlier versions). */
type Location = [segment: number, offset: number, length: number, crc?: number];

/** The index line of a committed package. */
interface CommitRecord {
  t: 'c';
  seq: number;
  meta: PackageMeta;
  rows: number;
  bytes: number;
  /** Commit time (epoch ms). */
  at: number;
  batches: Location[];
}

type IndexRecord = CommitRecord | { t: 'a'; seq: number } | { t: 'p'; upload_uuid: string };

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

interface Segment {
  no: number;
  file: Promise<AppendFile>;
  /** Packages (committed, or being written) with batches in it. */
  refs: number;
  /** Bytes placed in it by this process. */
  bytes: number;
}

const ID = /^[A-Za-z0-9_.=-]+$/;
/**
 * An emptied segment being written is replaced from this size on (or when the queue is
 * empty): a new file costs an open and a directory fsync (0.6–1.7 ms), too much to pay at
 * every moment the uploader catches up under load.
 */
const REPLACE_EMPTIED_BYTES = 1024 * 1024;
/** The index is compacted at this many times what its live lines take (see `indexCompactBytes`). */
const COMPACT_RATIO = 4;
const MAX_DELAY_MS = 30_000;
const SEGMENT = /^(\d+)\.seg$/;
const INDEX = /^index-(\d+)\.ndjson$/;

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
 */
export class FileBatchQueue implements BatchQueue {
  readonly #dir: string;
  readonly #segmentsDir: string;
  readonly #delayMs: number;
  readonly #segmentBytes: number;
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
  readonly #segments = new Map<number, Segment>();
  /** The segment batches go to; null after a failure (the next batch opens a fresh one). */
  #current: Segment | null = null;
  /** Number of the next segment: never one used before, so no index line can name a segment it did not write to. */
  #nextSegment = 0;
  #index!: AppendFile;
  #indexNo = 0;
  /** A write or fdatasync of the index failed: the next group goes to a fresh index. */
  #indexFailed = false;
  readonly #indexQueue: { line: string; sync: boolean; apply?: () => void; resolve: () => void; reject: (err: unknown) => void }[] = [];
  #indexRun: Promise<void> | null = null;
  /** Segments being removed. */
  readonly #dropping = new Set<Promise<void>>();
  readonly #writers = new Set<FileWriter>();
  readonly #consumers = new Set<QueueConsumer>();
  readonly #wakers = new Set<() => void>();
  #seq = 0;
  #closed = false;
  readonly #onSettled: (() => void) | undefined;

  private constructor(dir: string, opts: FileBatchQueueOptions) {
    this.#dir = dir;
    this.#segmentsDir = join(dir, 'segments');
    this.#delayMs = opts.redeliveryDelayMs ?? 1000;
    this.#segmentBytes = opts.segmentBytes ?? 16 * 1024 * 1024;
    this.#indexCompactBytes = opts.indexCompactBytes ?? 1024 * 1024;
    this.#heldBudget = opts.heldBytes ?? 32 * 1024 * 1024;
    this.#damage = new DamageLog(opts.onDamage);
    this.#onSettled = opts.onSettled;
  }

  static async open(dir: string, opts: FileBatchQueueOptions = {}): Promise<FileBatchQueue> {
    const q = new FileBatchQueue(dir, opts);
    await mkdirDurable(q.#segmentsDir);
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
      release: (segments) => this.#release(segments),
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
    await this.#log({ t: 'p', upload_uuid: uploadUuid }, true);
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await Promise.all([...this.#consumers].map((c) => c.stop()));
    await Promise.all([...this.#writers].map((w) => w.abort()));
    await Promise.all([...this.#dropping]);
    await this.#indexRun;
    // Every file is closed, whatever fails (a handle left open would fail its close at garbage collection, off any caller).
    const closed = await Promise.allSettled([this.#index.close(), ...[...this.#segments.values()].map((s) => s.file.then((f) => f.close(), () => undefined))]);
    const failed = closed.find((r) => r.status === 'rejected');
    if (failed) throw failed.reason;
  }

  /** Appends one batch to the current segment (a new one past `segmentBytes`); the writer holds a reference to it. */
  #place(batch: Uint8Array): { segment: Segment; location: Location; written: Promise<void> } {
    this.#check();
    const segment = (this.#current ??= this.#openSegment());
    segment.bytes += batch.byteLength;
    const location: Location = [segment.no, 0, batch.byteLength, crc32(batch)];
    const written = segment.file.then((f) => {
      const { offset, written: done } = f.write(batch);
      location[1] = offset;
      if (f.size >= this.#segmentBytes && this.#current === segment) {
        this.#current = this.#openSegment();
        // Its packages may all be gone already: then nothing else releases it.
        if (segment.refs <= 0) this.#dropSegment(segment);
      }
      return done;
    });
    // A failed write leaves the segment's tail unknown: the next batch goes to a fresh one.
    written.catch(() => this.#retire(segment));
    return { segment, location, written };
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
        this.#retire(segment);
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
    await this.#log(line, true, () => {
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
    this.#release(new Set(e.batches.map((b) => this.#segments.get(b[0])).filter((s): s is Segment => s !== undefined)));
  }

  #release(segments: Iterable<Segment>): void {
    for (const s of segments) {
      s.refs--;
      if (s.refs > 0) continue;
      if (s !== this.#current) this.#dropSegment(s);
      // Every package in the segment being written is gone: its space goes too, the next
      // batch starts a fresh one. Under load it empties again and again: it is replaced once
      // it holds `REPLACE_EMPTIED_BYTES`, or once the queue holds nothing at all.
      else if (!this.#closed && (s.bytes >= Math.min(REPLACE_EMPTIED_BYTES, this.#segmentBytes) || this.#entries.size === 0)) {
        this.#current = this.#openSegment();
        this.#dropSegment(s);
      }
    }
  }

  /** Takes a segment out of service after a failed write, sync or open: no more batches go to it. */
  #retire(s: Segment): void {
    if (this.#current !== s) return;
    this.#current = null;
    if (s.refs <= 0) this.#dropSegment(s);
  }

  #dropSegment(s: Segment): void {
    if (!this.#segments.delete(s.no)) return;
    const dropping = this.#unlinkSegment(s);
    this.#dropping.add(dropping);
    void dropping.finally(() => this.#dropping.delete(dropping));
  }

  async #unlinkSegment(s: Segment): Promise<void> {
    try {
      const file = await s.file.catch(() => null);
      if (!file) return;
      // The acks that freed it are durable before its bytes go.
      await this.#log(null, true);
      await file.close();
      await unlink(file.path);
    } catch {
      // Left for the next open, which removes segments no package uses.
    }
  }

  #openSegment(): Segment {
    const no = this.#nextSegment++;
    const s: Segment = { no, file: AppendFile.open(join(this.#segmentsDir, `${no}.seg`)), refs: 0, bytes: 0 };
    this.#segments.set(no, s);
    // Not made (a full disk, too many files): the next batch tries a fresh one.
    s.file.catch(() => this.#retire(s));
    return s;
  }

  /**
   * Appends an index line (null: none, only the sync); `apply` runs once it is written (and
   * durable, with `sync`), in line order, before any later line is written.
   */
  #log(line: string | IndexRecord | null, sync: boolean, apply?: () => void): Promise<void> {
    return new Promise((resolve, reject) => {
      this.#indexQueue.push({ line: line === null ? '' : typeof line === 'string' ? line : indexLine(line), sync, ...(apply ? { apply } : {}), resolve, reject });
      this.#indexRun ??= this.#writeIndex().finally(() => (this.#indexRun = null));
    });
  }

  async #writeIndex(): Promise<void> {
    while (this.#indexQueue.length > 0) {
      const group = this.#indexQueue.splice(0);
      try {
        // After a failure the index's tail is unknown: the live packages go to a fresh one first.
        if (this.#indexFailed) await this.#compactIndex();
        const text = group.map((g) => g.line).join('');
        if (text) await this.#index.write(Buffer.from(text)).written;
        if (group.some((g) => g.sync)) await this.#index.sync();
        for (const g of group) g.apply?.();
        for (const g of group) g.resolve();
      } catch (err) {
        if (this.#index.failed) this.#indexFailed = true;
        for (const g of group) g.reject(err);
      }
      if (!this.#indexFailed && this.#index.size >= Math.max(this.#indexCompactBytes, COMPACT_RATIO * this.#liveLineBytes)) await this.#compactIndex().catch(() => undefined);
    }
  }

  /**
   * Rewrites the index with the live packages only (between two groups of lines, so nothing
   * is in between): a new file, made durable and then put in place of the old one.
   */
  async #compactIndex(): Promise<void> {
    const no = this.#indexNo + 1;
    const path = join(this.#dir, `index-${no}.ndjson`);
    const lines = [...this.#entries.values()].map(({ t, seq, meta, rows, bytes, at, batches }) => indexLine({ t, seq, meta, rows, bytes, at, batches }));
    await writeFileAtomic(path, lines.join(''));
    const old = this.#index;
    this.#index = await AppendFile.open(path);
    this.#indexNo = no;
    this.#indexFailed = false;
    await old.close();
    await unlink(old.path).catch(() => undefined);
  }

  async #recover(): Promise<void> {
    const names = await readdir(this.#dir);
    const indexes = names
      .map((n) => Number(INDEX.exec(n)?.[1] ?? NaN))
      .filter(Number.isInteger)
      .sort((a, b) => a - b);
    const newest = indexes.at(-1) ?? 0;
    for (const no of indexes.slice(0, -1)) await unlink(join(this.#dir, `index-${no}.ndjson`)).catch(() => undefined);
    const path = join(this.#dir, `index-${newest}.ndjson`);
    const text = await readFile(path).catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') return Buffer.alloc(0);
      throw err;
    });
    const live = new Map<number, CommitRecord & { lineBytes: number }>();
    const { records, end, damaged, legacy } = readIndex(text);
    let maxSegment = -1;
    for (const { rec, bytes } of records) {
      if (rec.t === 'c') {
        live.set(rec.seq, { ...rec, lineBytes: bytes });
        for (const b of rec.batches) maxSegment = Math.max(maxSegment, b[0]);
      } else if (rec.t === 'a') live.delete(rec.seq);
      else for (const [seq, c] of live) if (c.meta.upload_uuid === rec.upload_uuid) live.delete(seq);
    }
    for (const d of damaged) this.#damage.report(path, d.offset, d.reason);
    this.#indexNo = newest;
    this.#index = await AppendFile.open(path, { size: end });

    const onDisk = (await readdir(this.#segmentsDir)).map((n) => Number(SEGMENT.exec(n)?.[1] ?? NaN)).filter(Number.isInteger);
    const used = new Map<number, number>();
    for (const c of live.values()) for (const s of new Set(c.batches.map((b) => b[0]))) used.set(s, (used.get(s) ?? 0) + 1);
    for (const no of onDisk) {
      if (used.has(no)) this.#segments.set(no, { no, file: AppendFile.open(join(this.#segmentsDir, `${no}.seg`)), refs: used.get(no)!, bytes: 0 });
      else await unlink(join(this.#segmentsDir, `${no}.seg`)).catch(() => undefined);
    }
    this.#nextSegment = Math.max(maxSegment, ...onDisk) + 1;
    this.#current = this.#openSegment();
    for (const c of [...live.values()].sort((a, b) => a.seq - b.seq)) {
      const missing = c.batches.some((b) => !this.#segments.has(b[0]));
      if (missing) continue; // its bytes are gone with an acked neighbour's segment: it was acked too
      this.#add({ ...c, attempt: 0, notBefore: 0, inFlight: false, purged: false });
    }
    for (const seq of live.keys()) this.#seq = Math.max(this.#seq, seq);
    // Damage, once reported, goes with the index it was in; lines of an older version gain their checksums.
    if (damaged.length > 0 || legacy) await this.#compactIndex();
    await this.#adoptLegacy();
  }

  /** Packages an older version left as `ready/<upload_uuid>/<package_id>/{data,commit.json}`: copied into a segment and committed. */
  async #adoptLegacy(): Promise<void> {
    const ready = join(this.#dir, 'ready');
    const sessions = await readdir(ready).catch(() => [] as string[]);
    const old = (await Promise.all(
      sessions.map(async (uuid) => (await readdir(join(ready, uuid)).catch(() => [] as string[])).map((pkg) => join(ready, uuid, pkg))),
    )).flat();
    const found: { seq: number; meta: PackageMeta; rows: number; bytes: number; batches: number[]; dir: string }[] = [];
    for (const dir of old) {
      const rec = JSON.parse(await readFile(join(dir, 'commit.json'), 'utf8').catch(() => 'null')) as Omit<(typeof found)[number], 'dir'> | null;
      if (rec) found.push({ ...rec, dir });
    }
    for (const rec of found.sort((a, b) => a.seq - b.seq)) {
      const data = await readFile(join(rec.dir, 'data'));
      const writer = await this.open(rec.meta);
      let off = 0;
      for (const len of rec.batches) {
        await writer.append(data.subarray(off, off + len));
        off += len;
      }
      await writer.commit({ rows: rec.rows, bytes: rec.bytes });
    }
    for (const d of ['ready', 'incoming', 'trash']) await rm(join(this.#dir, d), { recursive: true, force: true });
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
      void this.#log({ t: 'a', seq: e.seq }, false).catch(() => undefined);
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
        this.#damage.report(join(this.#segmentsDir, `${no}.seg`), offset, `the segment of package ${e.meta.package_id} (session ${e.meta.upload_uuid}) is gone; the package is dropped`);
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

/** An index line: the CRC-32 of its JSON (8 hex digits), a space, the JSON. */
function indexLine(rec: IndexRecord): string {
  const json = JSON.stringify(rec);
  return `${crc32(json).toString(16).padStart(8, '0')} ${json}\n`;
}

const CHECKED_LINE = /^([0-9a-f]{8}) /;

/**
 * The records of an index file, in order, with where its valid part ends. A line that fails
 * its checksum (or does not parse) with a valid line after it is damage; failing lines with
 * none after them, and a last line without its newline, are a torn tail: `end` stops before
 * them. Lines without a checksum (an older version's) count until the first checked one.
 */
function readIndex(text: Buffer): {
  records: { rec: IndexRecord; bytes: number }[];
  end: number;
  damaged: { offset: number; reason: string }[];
  legacy: boolean;
} {
  const records: { rec: IndexRecord; bytes: number }[] = [];
  const damaged: { offset: number; reason: string }[] = [];
  let suspects: { offset: number; reason: string }[] = [];
  let end = 0;
  let legacy = false;
  let checked = false;
  for (let start = 0, nl = text.indexOf(0x0a); nl >= 0; start = nl + 1, nl = text.indexOf(0x0a, start)) {
    const line = text.subarray(start, nl);
    const parsed = parseIndexLine(line, checked);
    if (typeof parsed === 'string') {
      suspects.push({ offset: start, reason: parsed });
      continue;
    }
    if (parsed.checked) checked = true;
    else legacy = true;
    damaged.push(...suspects);
    suspects = [];
    records.push({ rec: parsed.rec, bytes: line.length + 1 });
    end = nl + 1;
  }
  return { records, end, damaged, legacy };
}

/** An index line's record, or why it is not one. */
function parseIndexLine(line: Buffer, checkedOnly: boolean): { rec: IndexRecord; checked: boolean } | string {
  const head = CHECKED_LINE.exec(line.subarray(0, 9).toString('latin1'));
  if (head) {
    const json = line.subarray(9);
    if (crc32(json) !== parseInt(head[1]!, 16)) return 'index line fails its CRC-32';
    return { rec: JSON.parse(json.toString('utf8')) as IndexRecord, checked: true };
  }
  if (checkedOnly || line[0] !== 0x7b) return 'index line without its checksum';
  try {
    const rec = JSON.parse(line.toString('utf8')) as IndexRecord;
    return rec && typeof rec === 'object' && 't' in rec ? { rec, checked: false } : 'index line of no known record';
  } catch {
    return 'index line that does not parse';
  }
}

/** A held package's batches, as `#read` would yield them from its segment. */
async function* fromMemory(inMemory: InMemory): AsyncIterable<Uint8Array> {
  yield* inMemory.batches;
}

interface WriterHooks {
  place(batch: Uint8Array): { segment: Segment; location: Location; written: Promise<void> };
  /** `inMemory`: copies of the batches, for a package small enough to be held in memory; null otherwise. */
  commit(totals: { rows: number; bytes: number }, batches: { segment: Segment; location: Location }[], inMemory: InMemory | null): Promise<void>;
  /** Bytes the queue can still hold in memory. */
  room(): number;
  release(segments: Iterable<Segment>): void;
  forget(): void;
}

class FileWriter implements PackageWriter {
  readonly meta: PackageMeta;
  readonly #hooks: WriterHooks;
  readonly #batches: { segment: Segment; location: Location }[] = [];
  /** Segments this package holds a reference to. */
  readonly #held = new Set<Segment>();
  /** Copies of the batches while the package may be held in memory; null once it cannot. */
  #inMemory: InMemory | null = { batches: [], bytes: 0 };
  /** Appends run one after another, in call order, even when the caller does not await. */
  #tail: Promise<void> = Promise.resolve();
  #done = false;
  /** Purged or aborted: whatever the writer does next, the package must not be seen. */
  dropped = false;

  constructor(meta: PackageMeta, hooks: WriterHooks) {
    this.meta = meta;
    this.#hooks = hooks;
  }

  append(batch: Uint8Array): Promise<void> {
    // Copied now, the caller may reuse the batch's memory once this settles; not at all once
    // the package is too large or the queue's budget is spent (the consumer reads the segment).
    const mem = this.#inMemory;
    if (mem && mem.bytes + batch.byteLength <= Math.min(HELD_PACKAGE_BYTES, this.#hooks.room())) {
      mem.batches.push(Buffer.from(batch));
      mem.bytes += batch.byteLength;
    } else {
      this.#inMemory = null;
    }
    const run = this.#tail.then(async () => {
      this.#live();
      const placed = this.#hooks.place(batch);
      if (!this.#held.has(placed.segment)) {
        this.#held.add(placed.segment);
        placed.segment.refs++;
      }
      this.#batches.push(placed);
      await placed.written;
    });
    this.#tail = run.catch(() => {});
    return run;
  }

  async commit(totals: { rows: number; bytes: number }): Promise<void> {
    await this.#tail;
    this.#live();
    this.#done = true;
    try {
      await this.#hooks.commit(totals, this.#batches, this.#inMemory);
      // The references are the committed package's now.
      this.#held.clear();
    } catch (err) {
      await this.abort();
      throw err;
    } finally {
      this.#hooks.forget();
    }
  }

  async abort(): Promise<void> {
    this.#done = true;
    this.drop();
    await this.#tail;
  }

  drop(): void {
    this.dropped = true;
    this.#hooks.forget();
    const held = [...this.#held];
    this.#held.clear();
    this.#hooks.release(held);
  }

  #live(): void {
    if (this.dropped) throw new StoreError('QUEUE_PACKAGE_DROPPED', `Package ${this.meta.package_id} was purged or aborted`);
    if (this.#done) throw new StoreError('QUEUE_PACKAGE_COMMITTED', `Package ${this.meta.package_id} is already committed`);
  }
}

function checkId(name: string, id: string): void {
  if (!ID.test(id) || id === '.' || id === '..') throw new StoreError('STORE_INVALID_KEY', `Invalid ${name} ${JSON.stringify(id)}: allowed are [A-Za-z0-9_.=-]+`);
}
