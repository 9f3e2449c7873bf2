import { readdir, readFile, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { writeFileAtomic } from '../../../durable-file.js';
import { AppendFile } from '../append-file.js';
import { indexLine, readIndex, type CommitRecord, type IndexRecord } from './index-format.js';

/** The index is compacted at this many times what its live lines take (see `indexCompactBytes`). */
const COMPACT_RATIO = 4;
const INDEX = /^index-(\d+)\.ndjson$/;

export interface IndexLogHooks {
  /** The live packages, in commit order: what a compaction writes. */
  live(): Iterable<CommitRecord>;
  /** Bytes of the live packages' index lines. */
  liveLineBytes(): number;
}

/**
 * The queue's index (`<dir>/index-<m>.ndjson`, see `index-format.ts`): lines appended a group
 * at a time (one write, and one fdatasync if any line of the group asks for it), rewritten
 * with the live packages only once past `compactBytes` and `COMPACT_RATIO` times what their
 * lines take. A failed write or fdatasync fails the lines it carried, not the log: the next
 * group goes to a fresh index, the live packages rewritten first.
 */
export class IndexLog {
  readonly #dir: string;
  readonly #compactBytes: number;
  readonly #hooks: IndexLogHooks;
  #file: AppendFile;
  #no: number;
  /** A write or fdatasync of the index failed: the next group goes to a fresh index. */
  #failed = false;
  readonly #queue: { line: string; sync: boolean; apply?: () => void; resolve: () => void; reject: (err: unknown) => void }[] = [];
  #run: Promise<void> | null = null;

  private constructor(dir: string, compactBytes: number, hooks: IndexLogHooks, file: AppendFile, no: number) {
    this.#dir = dir;
    this.#compactBytes = compactBytes;
    this.#hooks = hooks;
    this.#file = file;
    this.#no = no;
  }

  /** Reads the newest index of `dir` (older ones, left by a crash mid-compaction, go): its records, where its valid part ends, and the damage found. */
  static async read(dir: string): Promise<ReturnType<typeof readIndex> & { path: string; no: number }> {
    const names = await readdir(dir);
    const indexes = names
      .map((n) => Number(INDEX.exec(n)?.[1] ?? NaN))
      .filter(Number.isInteger)
      .sort((a, b) => a - b);
    const newest = indexes.at(-1) ?? 0;
    for (const no of indexes.slice(0, -1)) await unlink(join(dir, `index-${no}.ndjson`)).catch(() => undefined);
    const path = join(dir, `index-${newest}.ndjson`);
    const text = await readFile(path).catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') return Buffer.alloc(0);
      throw err;
    });
    return { ...readIndex(text), path, no: newest };
  }

  /** Opens index `no` of `dir` for appends after its valid part (`end`, from `read`); a torn tail is cut off. */
  static async open(dir: string, no: number, end: number, compactBytes: number, hooks: IndexLogHooks): Promise<IndexLog> {
    return new IndexLog(dir, compactBytes, hooks, await AppendFile.open(join(dir, `index-${no}.ndjson`), { size: end }), no);
  }

  /**
   * Appends an index line (null: none, only the sync); `apply` runs once it is written (and
   * durable, with `sync`), in line order, before any later line is written.
   */
  append(line: string | IndexRecord | null, sync: boolean, apply?: () => void): Promise<void> {
    return new Promise((resolve, reject) => {
      this.#queue.push({ line: line === null ? '' : typeof line === 'string' ? line : indexLine(line), sync, ...(apply ? { apply } : {}), resolve, reject });
      this.#run ??= this.#write().finally(() => (this.#run = null));
    });
  }

  async #write(): Promise<void> {
    while (this.#queue.length > 0) {
      const group = this.#queue.splice(0);
      try {
        // After a failure the index's tail is unknown: the live packages go to a fresh one first.
        if (this.#failed) await this.compact();
        const text = group.map((g) => g.line).join('');
        if (text) await this.#file.write(Buffer.from(text)).written;
        if (group.some((g) => g.sync)) await this.#file.sync();
        for (const g of group) g.apply?.();
        for (const g of group) g.resolve();
      } catch (err) {
        if (this.#file.failed) this.#failed = true;
        for (const g of group) g.reject(err);
      }
      if (!this.#failed && this.#file.size >= Math.max(this.#compactBytes, COMPACT_RATIO * this.#hooks.liveLineBytes())) await this.compact().catch(() => undefined);
    }
  }

  /**
   * Rewrites the index with the live packages only (between two groups of lines, so nothing
   * is in between): a new file, made durable and then put in place of the old one.
   */
  async compact(): Promise<void> {
    const no = this.#no + 1;
    const path = join(this.#dir, `index-${no}.ndjson`);
    const lines = [...this.#hooks.live()].map(({ t, seq, meta, rows, bytes, at, batches }) => indexLine({ t, seq, meta, rows, bytes, at, batches }));
    await writeFileAtomic(path, lines.join(''));
    const old = this.#file;
    this.#file = await AppendFile.open(path);
    this.#no = no;
    this.#failed = false;
    await old.close();
    await unlink(old.path).catch(() => undefined);
  }

  /** Waits until the lines queued so far are written. */
  async idle(): Promise<void> {
    await this.#run;
  }

  close(): Promise<void> {
    return this.#file.close();
  }
}
