import { StoreError, type PackageMeta, type PackageWriter } from '../../ports.js';
import type { Location } from './index-format.js';
import type { Segment } from './segments.js';

/** A package up to this size is kept in memory for its consumer (see `FileBatchQueueOptions.heldBytes`). */
export const HELD_PACKAGE_BYTES = 64 * 1024;

/** Copies of a package's batches, kept in memory for its consumer, and their size. */
export interface InMemory {
  batches: Buffer[];
  bytes: number;
}

export interface WriterHooks {
  place(batch: Uint8Array): { segment: Segment; location: Location; written: Promise<void> };
  /** `inMemory`: copies of the batches, for a package small enough to be held in memory; null otherwise. */
  commit(totals: { rows: number; bytes: number }, batches: { segment: Segment; location: Location }[], inMemory: InMemory | null): Promise<void>;
  /** Bytes the queue can still hold in memory. */
  room(): number;
  release(segments: Iterable<Segment>): void;
  forget(): void;
}

/** A package being written: its batches placed in segments as they come, committed or dropped whole. */
export class FileWriter implements PackageWriter {
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
