/**
 * Cuts the bytes of `data`'s elements into pieces of about `target` bytes as they arrive,
 * with one copy per byte (from the caller's chunk into the piece's buffer) and no scan of
 * the bytes before `target`: from there it looks for the next `]`, `,`, `[` (whitespace
 * allowed between) with `indexOf`, and cuts at the comma, which neither piece keeps.
 *
 * The cut is a guess: the comma may sit inside a string or a nested array. The worker's
 * parse finds out (see `rows.ts`). A piece that found no such pattern by twice the
 * target is cut at the next comma of any kind. Cuts fall only on ASCII commas, so no piece
 * splits a UTF-8 sequence whatever the chunk boundaries were.
 */

const CLOSE = 0x5d;
const COMMA = 0x2c;
const OPEN = 0x5b;

const enum Look {
  Close,
  Comma,
  Open,
}

const isSpace = (b: number) => b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09;

export interface Buffers {
  /**
   * A buffer to fill and transfer: of the standard capacity, or, when the caller knows it
   * needs at most `atLeast` bytes and that is small, of a small one (a 7 KB package should not
   * cost a megabyte's allocation and its collection).
   */
  take(atLeast?: number): ArrayBuffer;
  /** Hands back a buffer nothing references any more. */
  give(buffer: ArrayBuffer): void;
}

export class PieceCutter {
  /** Pieces cut so far: the current bytes follow a cut comma when this is > 0. */
  cuts = 0;
  /** `grow` refused a larger buffer: the cutter took no more bytes (and takes none from now on). */
  refused = false;
  readonly #target: number;
  readonly #buffers: Buffers;
  readonly #onPiece: (buffer: ArrayBuffer, length: number) => void;
  readonly #grow: (capacity: number) => boolean;
  readonly #maxCapacity: number;
  #bytes: Uint8Array;
  #length = 0;
  #seeking = false;
  #look = Look.Close;
  #comma = -1;
  #anyComma = false;

  /**
   * `grow` is asked before the current piece's buffer is replaced by a larger one (a row
   * longer than the standard buffer, no place to cut yet) with its new capacity: false
   * refuses it, and the cutter stops.
   */
  /**
   * `expectedBytes`: what the body is declared to hold, when known: the first buffer need hold no more (it grows if the body lied).
   * `maxCapacity`: a growing buffer doubles up to it, no further (a piece up to that many bytes
   * never asks for twice what it needs); only a piece that needs more asks for more.
   */
  constructor(
    target: number,
    buffers: Buffers,
    onPiece: (buffer: ArrayBuffer, length: number) => void,
    grow: (capacity: number) => boolean = () => true,
    expectedBytes?: number,
    maxCapacity = Infinity,
  ) {
    this.#target = target;
    this.#buffers = buffers;
    this.#onPiece = onPiece;
    this.#grow = grow;
    this.#maxCapacity = maxCapacity;
    this.#bytes = new Uint8Array(buffers.take(expectedBytes));
  }

  /** Bytes of the current piece's buffer (larger than the standard one while a long row waits for a cut). */
  get capacity(): number {
    return this.#bytes.length;
  }

  push(chunk: Uint8Array, from: number): void {
    let at = from;
    const n = chunk.length;
    while (at < n && !this.refused) {
      if (!this.#seeking) {
        const k = Math.min(this.#target - this.#length, n - at);
        this.#append(chunk, at, at + k);
        at += k;
        if (this.#length >= this.#target) {
          this.#seeking = true;
          this.#look = Look.Close;
        }
        continue;
      }
      if (this.#look === Look.Close) {
        if (!this.#anyComma && this.#length >= 2 * this.#target) this.#anyComma = true;
        if (this.#anyComma) {
          const comma = chunk.indexOf(COMMA, at);
          if (comma < 0) {
            this.#append(chunk, at, n);
            return;
          }
          this.#append(chunk, at, comma);
          at = comma + 1;
          this.#cut(this.#length, this.#length);
          continue;
        }
        const close = chunk.indexOf(CLOSE, at);
        if (close < 0) {
          this.#append(chunk, at, n);
          return;
        }
        this.#append(chunk, at, close + 1);
        at = close + 1;
        this.#look = Look.Comma;
        continue;
      }
      const b = chunk[at]!;
      if (isSpace(b)) {
        this.#append(chunk, at, at + 1);
        at++;
      } else if (this.#look === Look.Comma && b === COMMA) {
        this.#comma = this.#length;
        this.#append(chunk, at, at + 1);
        at++;
        this.#look = Look.Open;
      } else if (this.#look === Look.Open && b === OPEN) {
        // The `[` opens the next piece: it is appended after the cut.
        this.#cut(this.#comma, this.#comma + 1);
      } else {
        this.#look = Look.Close;
      }
    }
  }

  /** The bytes after the last cut, given up: the cutter is not used after this. */
  flush(): { buffer: ArrayBuffer; length: number } {
    const out = { buffer: this.#bytes.buffer as ArrayBuffer, length: this.#length };
    this.#bytes = new Uint8Array(0);
    this.#length = 0;
    return out;
  }

  /** Emits bytes [0, end) as a piece; bytes [restFrom, length) start the next one. */
  #cut(end: number, restFrom: number): void {
    const full = this.#bytes;
    const fullLength = this.#length;
    this.#bytes = new Uint8Array(this.#buffers.take());
    this.#length = 0;
    if (fullLength > restFrom) this.#append(full, restFrom, fullLength);
    this.#seeking = false;
    this.#anyComma = false;
    this.cuts++;
    this.#onPiece(full.buffer as ArrayBuffer, end);
  }

  #append(src: Uint8Array, from: number, to: number): void {
    if (this.refused) return;
    const need = this.#length + (to - from);
    if (need > this.#bytes.length) {
      const capacity = Math.max(need, Math.min(this.#bytes.length * 2, this.#maxCapacity));
      if (!this.#grow(capacity)) {
        this.refused = true;
        return;
      }
      const grown = new Uint8Array(new ArrayBuffer(capacity));
      grown.set(this.#bytes.subarray(0, this.#length));
      this.#buffers.give(this.#bytes.buffer as ArrayBuffer);
      this.#bytes = grown;
    }
    this.#bytes.set(src.subarray(from, to), this.#length);
    this.#length = need;
  }
}
