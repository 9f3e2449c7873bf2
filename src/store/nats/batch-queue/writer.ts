/** A package being written to the stream: batches as they come, then one commit message. */
import { crc32 } from 'node:zlib';
import { isStoreError, StoreError, type PackageMeta, type PackageWriter } from '../../ports.js';
import { encodeCommit, INLINE_BATCH_BYTES, inlineHeaderBytes, type CommitRecord } from './record.js';

export interface WriterHooks {
  /** Publishes batch number `n`; resolves with its stream sequence. */
  append(batch: Uint8Array, n: number): Promise<number>;
  /** The most bytes one batch message may carry now: below the server's `max_payload`. */
  maxBatchBytes(): number;
  /** Publishes the commit; `inline`: the package's only batch, carried in the commit message itself, and the record encoded for its header. */
  commit(rec: CommitRecord, inline?: { batch: Uint8Array; header: string }): Promise<void>;
  /** Purges whatever the package has in the stream, batches and commit. */
  remove(): Promise<void>;
  forget(): void;
}

export class NatsWriter implements PackageWriter {
  readonly meta: PackageMeta;
  readonly #hooks: WriterHooks;
  readonly #seqs: number[] = [];
  /**
   * The last batch appended, not yet published: if the package ends with no other, it goes
   * inside the commit message (one publish, one round trip, for a small package).
   */
  #held: Uint8Array | null = null;
  /** CRC-32 of the batches appended so far, in order (`CommitRecord.crc`). */
  #crc = 0;
  /** Appends run one after another, in call order, even when the caller does not await. */
  #tail: Promise<void> = Promise.resolve();
  #done = false;
  /** An append failed with NATS unavailable (`abort` does not wait for the removal then). */
  #unavailable = false;
  /** Purged or aborted: whatever the writer does next, the package must not be seen. */
  #dropped = false;

  constructor(meta: PackageMeta, hooks: WriterHooks) {
    this.meta = meta;
    this.#hooks = hooks;
  }

  append(batch: Uint8Array): Promise<void> {
    const run = this.#tail.then(async () => {
      this.#live();
      this.#crc = crc32(batch, this.#crc);
      await this.#publishHeld();
      // A small batch may travel with the commit: kept as a copy (the caller may reuse its memory
      // once this resolves). Never more than one message may carry (a server's `max_payload`
      // set below 256 KiB): the held batch may go out alone.
      if (batch.byteLength <= Math.min(INLINE_BATCH_BYTES, this.#hooks.maxBatchBytes())) this.#held = Uint8Array.prototype.slice.call(batch);
      else {
        // A batch is whole rows, and one row may be longer than a message can be (`max_payload`,
        // 1 MiB by default): it goes out in pieces, which the reader joins back, bytes in order.
        const most = this.#hooks.maxBatchBytes();
        for (let at = 0; at < batch.byteLength; at += most) this.#seqs.push(await this.#hooks.append(batch.subarray(at, at + most), this.#seqs.length));
      }
    });
    this.#tail = run.catch((err: unknown) => {
      if (isStoreError(err, 'STORE_UNAVAILABLE')) this.#unavailable = true;
    });
    return run;
  }

  async commit(totals: { rows: number; bytes: number }): Promise<void> {
    await this.#tail;
    this.#live();
    this.#done = true;
    try {
      const record = (): CommitRecord => ({ meta: this.meta, rows: totals.rows, bytes: totals.bytes, batches: [...this.#seqs], crc: this.#crc });
      // Inline where the batch and the record fit in one message.
      const held = this.#seqs.length === 0 ? this.#held : null;
      const header = held ? encodeCommit(record()) : '';
      const inline = held && held.byteLength + inlineHeaderBytes(header) <= this.#hooks.maxBatchBytes() ? { batch: held, header } : null;
      if (!inline) await this.#publishHeld();
      await this.#hooks.commit(record(), inline ?? undefined);
      if (this.#dropped) throw new StoreError('QUEUE_PACKAGE_DROPPED', `Package ${this.meta.package_id} was purged before its commit completed`);
    } catch (err) {
      // Not committed as far as the caller knows, so it must not be delivered either (nor is
      // it stored if it did land: the session never recorded it).
      await this.#remove(isStoreError(err, 'STORE_UNAVAILABLE')).catch(() => {});
      throw err;
    } finally {
      this.#held = null;
      this.#hooks.forget();
    }
  }

  async abort(): Promise<void> {
    this.#done = true;
    this.drop();
    await this.#tail;
    this.#held = null;
    await this.#remove(this.#unavailable);
  }

  /**
   * Removes what the package put in the stream. With NATS unavailable it goes on in the
   * background: it would wait out a retry budget of its own, and the caller's 503 need not.
   */
  #remove(unavailable: boolean): Promise<void> {
    const removed = this.#hooks.remove();
    if (!unavailable) return removed;
    removed.catch(() => {});
    return Promise.resolve();
  }

  drop(): void {
    this.#dropped = true;
    this.#hooks.forget();
  }

  async #publishHeld(): Promise<void> {
    const held = this.#held;
    if (!held) return;
    this.#held = null;
    this.#seqs.push(await this.#hooks.append(held, this.#seqs.length));
  }

  #live(): void {
    if (this.#dropped) throw new StoreError('QUEUE_PACKAGE_DROPPED', `Package ${this.meta.package_id} was purged or aborted`);
    if (this.#done) throw new StoreError('QUEUE_PACKAGE_COMMITTED', `Package ${this.meta.package_id} is already committed`);
  }
}
