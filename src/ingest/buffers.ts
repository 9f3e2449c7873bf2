/**
 * The pool's piece buffers: one size (a piece plus room for the rest of the row its cut
 * waits for), reused instead of allocated per piece. A running task holds two (its piece
 * and the buffer its lines go to); at most `maxFree` idle ones are kept.
 */
import { Buffer } from 'node:buffer';
import type { Buffers } from './cutter.js';

export class BufferPool implements Buffers {
  readonly bufferBytes: number;
  readonly #maxFree: number;
  readonly #free: ArrayBuffer[] = [];

  constructor(bufferBytes: number, maxFree: number) {
    this.bufferBytes = bufferBytes;
    this.#maxFree = maxFree;
  }

  take(): ArrayBuffer {
    return this.#free.pop() ?? (Buffer.allocUnsafeSlow(this.bufferBytes).buffer as ArrayBuffer);
  }

  give(buffer: ArrayBuffer): void {
    // A transferred (detached) buffer has byteLength 0 and is never kept.
    if (buffer.byteLength === this.bufferBytes && this.#free.length < this.#maxFree) this.#free.push(buffer);
  }
}
