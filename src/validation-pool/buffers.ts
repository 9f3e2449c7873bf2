/**
 * The pool's piece buffers, reused instead of allocated per piece: the standard size (a piece
 * plus room for the rest of the row its cut waits for) and a small one for small packages,
 * whose whole body and lines fit in it. A running task holds two (its piece and the buffer
 * its lines go to); at most `maxFree` idle standard ones and `SMALL_FREE` small ones are kept.
 */
import { Buffer } from 'node:buffer';
import type { Buffers } from '../validation/index.js';

/** Bytes of a small buffer. */
export const SMALL_BUFFER_BYTES = 64 * 1024;
/** Idle small buffers kept: 16 MiB, enough for hundreds of small packages in flight. */
const SMALL_FREE = 256;

export class BufferPool implements Buffers {
  readonly bufferBytes: number;
  readonly #maxFree: number;
  readonly #free: ArrayBuffer[] = [];
  readonly #small: ArrayBuffer[] = [];

  constructor(bufferBytes: number, maxFree: number) {
    this.bufferBytes = bufferBytes;
    this.#maxFree = maxFree;
  }

  take(atLeast?: number): ArrayBuffer {
    if (atLeast !== undefined && atLeast <= SMALL_BUFFER_BYTES && SMALL_BUFFER_BYTES < this.bufferBytes) {
      return this.#small.pop() ?? (Buffer.allocUnsafeSlow(SMALL_BUFFER_BYTES).buffer as ArrayBuffer);
    }
    return this.#free.pop() ?? (Buffer.allocUnsafeSlow(this.bufferBytes).buffer as ArrayBuffer);
  }

  give(buffer: ArrayBuffer): void {
    // A transferred (detached) buffer has byteLength 0 and is never kept.
    if (buffer.byteLength === this.bufferBytes) {
      if (this.#free.length < this.#maxFree) this.#free.push(buffer);
    } else if (buffer.byteLength === SMALL_BUFFER_BYTES && this.#small.length < SMALL_FREE) this.#small.push(buffer);
  }
}
