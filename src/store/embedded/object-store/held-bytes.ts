/** Objects up to this size are held whole and appended in one write (see the class). */
export const HOLD_BYTES = 4 * 1024 * 1024;

/**
 * Chunks copied into one buffer as they come (grown by doubling), after `room` bytes left for
 * the record's header: one allocation and one write for a small object, not a copy per chunk,
 * a concatenation and a write for the header.
 */
export class HeldBytes {
  readonly #room: number;
  #buf: Buffer;
  size = 0;

  constructor(room: number) {
    this.#room = room;
    this.#buf = Buffer.allocUnsafe(room);
  }

  add(chunk: Uint8Array): void {
    const need = this.#room + this.size + chunk.byteLength;
    if (need > this.#buf.byteLength) {
      const grown = Buffer.allocUnsafe(Math.max(need, Math.min(this.#room + HOLD_BYTES, 2 * this.#buf.byteLength)));
      this.#buf.copy(grown, this.#room, this.#room, this.#room + this.size);
      this.#buf = grown;
    }
    this.#buf.set(chunk, this.#room + this.size);
    this.size += chunk.byteLength;
  }

  /** The object's bytes. */
  bytes(): Buffer {
    return this.#buf.subarray(this.#room, this.#room + this.size);
  }

  /** The whole record: `head` (exactly `room` bytes) and the object's bytes. */
  record(head: Buffer): Buffer {
    head.copy(this.#buf, 0);
    return this.#buf.subarray(0, this.#room + this.size);
  }
}
