import { open, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { DamageLog, type OnDamage } from '../damage.js';
import { RecordReader } from './reader.js';
import { ABANDONED } from './record.js';

/** A directory's pack file; no escaped segment starts with `~`, so it never meets a key's name. */
export const PACK = '~pack';

export interface Located {
  /** Offset of its bytes. */
  o: number;
  n: number;
  /** CRC-32 of its bytes. */
  c: number;
}

/**
 * A directory's index as read so far: every key's last entry, where the last whole record
 * ends, whether a checked header was read (older headers are refused after it), and the
 * reads in turn.
 */
export interface DirIndex {
  entries: Map<string, Located>;
  readTo: number;
  checked: boolean;
  reading: Promise<void>;
}

/**
 * The indexes of a store's packs as read so far, one per directory: each pack's records read
 * once, in order, and what they say kept in memory, least recently used directories
 * forgotten (and read again when asked) past `maxIndexed` entries in all. A pack whose write
 * failed is cut back to its last durable byte before it is read again; damage found is
 * reported once per file and offset.
 */
export class PackIndexes {
  readonly #maxIndexed: number;
  /** Indexes read per directory, least recently used first. */
  readonly #indexes = new Map<string, DirIndex>();
  #indexed = 0;
  /** Packs to cut back to this size before they are read or written again (a write or fdatasync of theirs failed). */
  readonly #cuts = new Map<string, number>();
  readonly #damage: DamageLog;
  /** Damage reported, by file and offset: a directory read again is not reported again. */
  readonly #reported = new Set<string>();

  constructor(maxIndexed: number, onDamage: OnDamage | undefined) {
    this.#maxIndexed = maxIndexed;
    this.#damage = new DamageLog(onDamage);
  }

  /** Damaged records found so far (each also handed to `onDamage`). */
  get damaged(): number {
    return this.#damage.count;
  }

  /** The directories indexed now. */
  dirs(): string[] {
    return [...this.#indexes.keys()];
  }

  /** Marks a pack whose write or fdatasync failed to be cut back to `size` (its last durable byte) before it is read or written again. */
  cutBackTo(dir: string, size: number): void {
    this.#cuts.set(dir, Math.min(this.#cuts.get(dir) ?? Infinity, size));
    this.forget(dir);
  }

  /** The directory's index, brought up to what its file holds now (reads of one directory go in turn). */
  async index(dir: string): Promise<DirIndex> {
    // No byte of a failed put is read.
    if (this.#cuts.has(dir)) await this.#cutBack(dir);
    let index = this.#indexes.get(dir);
    if (index) this.#indexes.delete(dir); // most recently used last
    else index = { entries: new Map(), readTo: 0, checked: false, reading: Promise.resolve() };
    this.#indexes.set(dir, index);
    const mine = index.reading.then(() => this.#readMore(dir, index));
    index.reading = mine.catch(() => undefined);
    await mine;
    return index;
  }

  /**
   * Reads the records appended since the last read, up to the end of the last valid one:
   * records not whole or failing their checks with none valid after them (still being
   * written, or torn by a crash) wait for the next read, or are cut off when the writer opens
   * the pack. One that fails with a valid record after it is read once more (a header being
   * completed in place may have been read half old, half new), then reported and skipped.
   */
  async #readMore(dir: string, index: DirIndex): Promise<void> {
    let fh;
    try {
      fh = await open(join(dir, PACK), 'r');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      // Gone (deleted), or never made: nothing is there.
      this.forget(dir);
      index.entries.clear();
      index.readTo = 0;
      return;
    }
    try {
      const size = (await fh.stat()).size;
      const before = index.entries.size;
      if (size < index.readTo) {
        // Cut back (a failed put of another instance): read again from the start.
        index.entries.clear();
        index.readTo = 0;
        index.checked = false;
      }
      if (size <= index.readTo) return;
      const reader = new RecordReader(fh, index.readTo, size, index.checked);
      let suspects: { at: number; reason: string }[] = [];
      let rechecked = -1;
      for (;;) {
        const step = await reader.next();
        if (!step) break;
        if ('reason' in step) {
          suspects.push(step);
          if (!(await reader.skip(step, (f) => suspects.push(f)))) break;
          continue;
        }
        if (suspects.length > 0) {
          if (rechecked !== suspects[0]!.at) {
            rechecked = suspects[0]!.at;
            reader.restart(rechecked);
            suspects = [];
            continue;
          }
          for (const d of suspects) this.reportDamage(join(dir, PACK), d.at, d.reason);
          suspects = [];
        }
        const h = step.header;
        if ('d' in h) index.entries.delete(h.k);
        else if (h.c !== ABANDONED) index.entries.set(h.k, { o: step.offset, n: h.n, c: h.c });
        index.readTo = step.end;
        index.checked ||= step.checked;
      }
      if (this.#indexes.get(dir) === index) {
        this.#indexed += index.entries.size - before;
        this.#evict(dir);
      }
    } finally {
      await fh.close();
    }
  }

  /**
   * A record this store just made durable joins the directory's index when it is the next one
   * a scan would read, so that the writer never reads its own records back; otherwise the
   * next scan finds it.
   */
  learn(dir: string, key: string, at: number, headerBytes: number, n: number, c: number): void {
    const index = this.#indexes.get(dir);
    if (!index || index.readTo !== at) return;
    const had = index.entries.has(key);
    index.entries.set(key, { o: at + headerBytes, n, c });
    index.readTo = at + headerBytes + n;
    index.checked = true;
    if (!had) {
      this.#indexed++;
      this.#evict(dir);
    }
  }

  forget(dir: string): void {
    const index = this.#indexes.get(dir);
    if (!index) return;
    this.#indexed -= index.entries.size;
    this.#indexes.delete(dir);
  }

  /** Forgets least recently used directories (never `keep`) until the indexes fit. */
  #evict(keep: string): void {
    for (const dir of this.#indexes.keys()) {
      if (this.#indexed <= this.#maxIndexed) return;
      if (dir !== keep) this.forget(dir);
    }
  }

  /** Cuts a pack whose write failed back to its last durable byte (see `FileObjectStore`'s `#withPack`); it stays marked until that succeeds. */
  async #cutBack(dir: string): Promise<void> {
    const size = this.#cuts.get(dir);
    if (size === undefined) return;
    let fh: FileHandle;
    try {
      fh = await open(join(dir, PACK), 'r+');
    } catch (err) {
      // Gone with its directory: nothing left to cut.
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      this.#cuts.delete(dir);
      return;
    }
    try {
      if ((await fh.stat()).size > size) await fh.truncate(size);
      await fh.datasync();
    } finally {
      await fh.close();
    }
    this.#cuts.delete(dir);
    this.forget(dir);
  }

  reportDamage(file: string, offset: number, reason: string): void {
    const at = `${file}:${offset}`;
    if (this.#reported.has(at)) return;
    this.#reported.add(at);
    this.#damage.report(file, offset, reason);
  }
}
