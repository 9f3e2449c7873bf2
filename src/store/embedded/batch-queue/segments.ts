import { readdir, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import { AppendFile } from '../append-file.js';
import type { Location } from './index-format.js';

export interface Segment {
  no: number;
  file: Promise<AppendFile>;
  /** Packages (committed, or being written) with batches in it. */
  refs: number;
  /** Bytes placed in it by this process. */
  bytes: number;
}

/**
 * An emptied segment being written is replaced from this size on (or when the queue is
 * empty): a new file costs an open and a directory fsync (0.6–1.7 ms), too much to pay at
 * every moment the uploader catches up under load.
 */
const REPLACE_EMPTIED_BYTES = 1024 * 1024;
const SEGMENT = /^(\d+)\.seg$/;

export interface SegmentsHooks {
  /** Resolves once the acks and purges sent so far are durable (rejects if one failed): those that freed a segment are, before its bytes go. */
  acksDurable(): Promise<void>;
  /** Whether the queue holds no package. */
  empty(): boolean;
  closed(): boolean;
}

/**
 * The segment files of a queue (`<dir>/<n>.seg`): every package's batches appended to the
 * current one as they come; a segment goes once no package uses it, the one being written
 * included (once it holds `REPLACE_EMPTIED_BYTES`, or the queue is empty, the next batch goes
 * to a fresh one), and one past `segmentBytes` is closed for appends. A failed write, sync or
 * open takes a segment out of service: the next batch goes to a fresh one.
 */
export class Segments {
  readonly #dir: string;
  readonly #segmentBytes: number;
  readonly #hooks: SegmentsHooks;
  readonly #all = new Map<number, Segment>();
  /** The segment batches go to; null after a failure (the next batch opens a fresh one). */
  #current: Segment | null = null;
  /** Number of the next segment: never one used before, so no commit record can name a segment it did not write to. */
  #next = 0;
  /** Segments being removed. */
  readonly #dropping = new Set<Promise<void>>();
  /** Each file's deadline for an open, write or sync (`AppendFile`). */
  readonly #timeoutMs: number | undefined;

  constructor(dir: string, segmentBytes: number, hooks: SegmentsHooks, timeoutMs?: number) {
    this.#dir = dir;
    this.#segmentBytes = segmentBytes;
    this.#hooks = hooks;
    this.#timeoutMs = timeoutMs;
  }

  get(no: number): Segment | undefined {
    return this.#all.get(no);
  }

  has(no: number): boolean {
    return this.#all.has(no);
  }

  /** The file of segment `no`. */
  path(no: number): string {
    return join(this.#dir, `${no}.seg`);
  }

  /**
   * Takes over the segments on disk at open: those the live packages use (`used`: how many
   * per segment) stay, the others go; batches go to a fresh one numbered past every segment
   * seen (`maxUsed`: the highest a commit record names).
   */
  async recover(used: Map<number, number>, maxUsed: number): Promise<void> {
    const onDisk = (await readdir(this.#dir)).map((n) => Number(SEGMENT.exec(n)?.[1] ?? NaN)).filter(Number.isInteger);
    for (const no of onDisk) {
      if (used.has(no)) this.#all.set(no, { no, file: this.#openUsed(no), refs: used.get(no)!, bytes: 0 });
      else await unlink(this.path(no)).catch(() => undefined);
    }
    this.#next = Math.max(maxUsed, ...onDisk) + 1;
    this.#current = this.#open();
  }

  /**
   * The file of a segment for a read of its packages: one taken over at open whose open failed
   * (a disk error) is opened again, so that its packages are delivered once the disk answers.
   */
  readable(s: Segment): Promise<AppendFile> {
    const file = s.file;
    return file.catch(() => {
      if (s.file === file && this.#all.get(s.no) === s && s !== this.#current) s.file = this.#openUsed(s.no);
      return s.file;
    });
  }

  /** Opens a segment that live packages use; a failure is told to the reads of its packages (`readable`), not left unhandled. */
  #openUsed(no: number): Promise<AppendFile> {
    const file = AppendFile.open(this.path(no), { create: false, timeoutMs: this.#timeoutMs });
    file.catch(() => undefined);
    return file;
  }

  /** Appends one batch to the current segment (a new one past `segmentBytes`); the writer holds a reference to it. */
  place(batch: Uint8Array): { segment: Segment; location: Location; written: Promise<void> } {
    const segment = (this.#current ??= this.#open());
    segment.bytes += batch.byteLength;
    const location: Location = [segment.no, 0, batch.byteLength, crc32(batch)];
    const written = segment.file.then((f) => {
      const { offset, written: done } = f.write(batch);
      location[1] = offset;
      if (f.size >= this.#segmentBytes && this.#current === segment) {
        this.#current = this.#open();
        // Its packages may all be gone already: then nothing else releases it.
        if (segment.refs <= 0) this.#drop(segment);
      }
      return done;
    });
    // A failed write leaves the segment's tail unknown: the next batch goes to a fresh one.
    written.catch(() => this.retire(segment));
    return { segment, location, written };
  }

  /** Drops a reference to each (a package acked, purged or aborted): a segment no package uses goes. */
  release(segments: Iterable<Segment>): void {
    for (const s of segments) {
      s.refs--;
      if (s.refs > 0) continue;
      if (s !== this.#current) this.#drop(s);
      // Every package in the segment being written is gone: its space goes too, the next
      // batch starts a fresh one. Under load it empties again and again: it is replaced once
      // it holds `REPLACE_EMPTIED_BYTES`, or once the queue holds nothing at all.
      else if (!this.#hooks.closed() && (s.bytes >= Math.min(REPLACE_EMPTIED_BYTES, this.#segmentBytes) || this.#hooks.empty())) {
        this.#current = this.#open();
        this.#drop(s);
      }
    }
  }

  /** Takes a segment out of service after a failed write, sync or open: no more batches go to it. */
  retire(s: Segment): void {
    if (this.#current !== s) return;
    this.#current = null;
    if (s.refs <= 0) this.#drop(s);
  }

  #drop(s: Segment): void {
    if (!this.#all.delete(s.no)) return;
    const dropping = this.#unlink(s);
    this.#dropping.add(dropping);
    void dropping.finally(() => this.#dropping.delete(dropping));
  }

  async #unlink(s: Segment): Promise<void> {
    const file = await s.file.catch(() => null);
    if (!file) return;
    // The acks that freed it are durable before its bytes go; if they cannot be made so, the
    // file is left for the next open, which removes segments no package uses. Closed either
    // way: a handle left to the garbage collector whose close fails (a disk gone) is an
    // uncaught exception, the end of the process.
    const durable = await this.#hooks.acksDurable().then(
      () => true,
      () => false,
    );
    await file.close().catch(() => undefined);
    if (durable) await unlink(file.path).catch(() => undefined);
  }

  #open(): Segment {
    const no = this.#next++;
    const s: Segment = { no, file: AppendFile.open(this.path(no), { timeoutMs: this.#timeoutMs }), refs: 0, bytes: 0 };
    this.#all.set(no, s);
    // Not made (a full disk, too many files): the next batch tries a fresh one.
    s.file.catch(() => this.retire(s));
    return s;
  }

  /** Waits until the segments being removed are gone. */
  async settled(): Promise<void> {
    await Promise.all([...this.#dropping]);
  }

  /** Closes every segment file (one that never opened counts as closed). */
  closing(): Promise<void>[] {
    return [...this.#all.values()].map((s) => s.file.then((f) => f.close(), () => undefined));
  }
}
