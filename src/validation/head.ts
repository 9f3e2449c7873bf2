/**
 * The main thread's scan of a body's head: the bytes before the elements of `data`. It reads
 * the top-level keys of the object (string-aware, escapes decoded), keeps the last `columns`
 * value's bytes, and stops right after the `[` that opens `data`, so the elements can be
 * cut and streamed to workers with `columns` already known.
 *
 * It is lax about syntax (values are skipped by bracket depth, not parsed): the skeleton's
 * `JSON.parse` (see `skeleton.ts`) later reads these same bytes and decides validity. Any
 * layout it does not stream is left to the one-shot path: no `{` first, `data` before
 * `columns`, an object without a `data` array, a head longer than the limit.
 *
 * It also notes a `columns` or `data` key seen twice (`repeated`): the body is then refused
 * whatever its rows hold (once the skeleton confirms it is JSON), so they are only parsed.
 */

export type HeadStatus = 'scanning' | 'data' | 'other';

const enum S {
  Bom,
  Start,
  KeyOrClose,
  KeyStart,
  Key,
  Colon,
  Value,
  Nested,
  Primitive,
  After,
}

const enum Key {
  Other,
  Columns,
  Data,
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const KEY_BYTES_MAX = 128;
const DATA = [0x64, 0x61, 0x74, 0x61];
const COLUMNS = [0x63, 0x6f, 0x6c, 0x75, 0x6d, 0x6e, 0x73];
const BOM = [0xef, 0xbb, 0xbf];

const isSpace = (b: number) => b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09;

export class HeadScanner {
  status: HeadStatus = 'scanning';
  /** 3 when the body starts with a UTF-8 byte order mark. */
  bom = 0;
  /** A top-level `columns` or `data` key came twice in the head. */
  repeated = false;
  readonly #limit: number;
  /** Bit 1: `columns` seen; bit 2: `data` seen. */
  #seen = 0;
  #bytes = new Uint8Array(256);
  #length = 0;
  #state = S.Bom;
  #key = Key.Other;
  #keyBytes: number[] = [];
  #keyEscaped = false;
  #escape = false;
  #inString = false;
  #depth = 0;
  #valueStart = 0;
  #columns: [number, number] | null = null;

  constructor(limit: number) {
    this.#limit = limit;
  }

  /** Head bytes so far, BOM included. */
  get bytes(): Uint8Array {
    return this.#bytes.subarray(0, this.#length);
  }

  /**
   * Scans `chunk` from `from` and keeps (copies) what it scanned. Returns where it stopped:
   * right after `data`'s `[` (status `data`), where it gave up (`other`; the byte there is
   * not kept), or `chunk.length`.
   */
  push(chunk: Uint8Array, from: number): number {
    let i = from;
    const end = Math.min(chunk.length, from + this.#limit - this.#length + 1);
    for (; i < end && this.status === 'scanning'; i++) {
      const stop = this.#step(chunk[i]!, this.#length + i - from);
      if (stop === 'other') {
        this.status = 'other';
        break;
      }
      if (stop === 'data') {
        this.status = 'data';
        i++;
        break;
      }
    }
    this.#keep(chunk, from, i);
    if (this.status === 'scanning' && this.#length > this.#limit) this.status = 'other';
    return i;
  }

  /** The last `columns` value, parsed; `undefined` when its bytes are not JSON (so neither is the body). */
  columns(): unknown {
    const range = this.#columns;
    if (!range) return undefined;
    try {
      return JSON.parse(Buffer.from(this.#bytes.buffer, this.#bytes.byteOffset + range[0], range[1] - range[0]).toString('utf8'));
    } catch {
      return undefined;
    }
  }

  #keep(chunk: Uint8Array, from: number, to: number): void {
    const need = this.#length + (to - from);
    if (need > this.#bytes.length) {
      const grown = new Uint8Array(Math.max(need, this.#bytes.length * 2));
      grown.set(this.#bytes.subarray(0, this.#length));
      this.#bytes = grown;
    }
    this.#bytes.set(chunk.subarray(from, to), this.#length);
    this.#length = need;
  }

  /** One byte at head offset `at`: null to go on, or how the scan ends. */
  #step(b: number, at: number): null | 'data' | 'other' {
    switch (this.#state) {
      case S.Bom:
        if (at < 3 && b === BOM[at]) {
          if (at === 2) {
            this.bom = 3;
            this.#state = S.Start;
          }
          return null;
        }
        if (at > 0) return 'other';
        this.#state = S.Start;
        return this.#step(b, at);
      case S.Start:
        if (isSpace(b)) return null;
        if (b !== 0x7b) return 'other';
        this.#state = S.KeyOrClose;
        return null;
      case S.KeyOrClose:
      case S.KeyStart:
        if (isSpace(b)) return null;
        if (b !== QUOTE) return 'other';
        this.#state = S.Key;
        this.#keyBytes = [];
        this.#keyEscaped = false;
        this.#escape = false;
        return null;
      case S.Key:
        if (this.#escape) {
          this.#escape = false;
        } else if (b === BACKSLASH) {
          this.#escape = true;
          this.#keyEscaped = true;
        } else if (b === QUOTE) {
          this.#key = this.#keyName();
          const bit = this.#key === Key.Columns ? 1 : this.#key === Key.Data ? 2 : 0;
          if (this.#seen & bit) this.repeated = true;
          this.#seen |= bit;
          this.#state = S.Colon;
          return null;
        }
        if (this.#keyBytes.length <= KEY_BYTES_MAX) this.#keyBytes.push(b);
        return null;
      case S.Colon:
        if (isSpace(b)) return null;
        if (b !== 0x3a) return 'other';
        this.#state = S.Value;
        return null;
      case S.Value:
        if (isSpace(b)) return null;
        if (this.#key === Key.Data && b === 0x5b) return this.#columns ? 'data' : 'other';
        this.#valueStart = at;
        if (b === QUOTE) {
          this.#state = S.Nested;
          this.#depth = 0;
          this.#inString = true;
          this.#escape = false;
        } else if (b === 0x5b || b === 0x7b) {
          this.#state = S.Nested;
          this.#depth = 1;
          this.#inString = false;
        } else {
          this.#state = S.Primitive;
        }
        return null;
      case S.Nested:
        if (this.#inString) {
          if (this.#escape) this.#escape = false;
          else if (b === BACKSLASH) this.#escape = true;
          else if (b === QUOTE) {
            this.#inString = false;
            if (this.#depth === 0) this.#valueEnd(at + 1);
          }
        } else if (b === QUOTE) {
          this.#inString = true;
        } else if (b === 0x5b || b === 0x7b) {
          this.#depth++;
        } else if (b === 0x5d || b === 0x7d) {
          if (--this.#depth === 0) this.#valueEnd(at + 1);
        }
        return null;
      case S.Primitive:
        if (!isSpace(b) && b !== 0x2c && b !== 0x7d) return null;
        this.#valueEnd(at);
        return this.#step(b, at);
      case S.After:
        if (isSpace(b)) return null;
        if (b === 0x2c) {
          this.#state = S.KeyStart;
          return null;
        }
        // `}` closes an object without a `data` array; anything else is not JSON.
        return 'other';
    }
  }

  #valueEnd(end: number): void {
    if (this.#key === Key.Columns) this.#columns = [this.#valueStart, end];
    this.#state = S.After;
  }

  #keyName(): Key {
    let bytes = this.#keyBytes;
    if (bytes.length > KEY_BYTES_MAX) return Key.Other;
    if (this.#keyEscaped) {
      let name: unknown;
      try {
        name = JSON.parse(`"${Buffer.from(bytes).toString('utf8')}"`);
      } catch {
        return Key.Other;
      }
      if (name !== 'data' && name !== 'columns') return Key.Other;
      bytes = [...Buffer.from(name)];
    }
    if (same(bytes, DATA)) return Key.Data;
    if (same(bytes, COLUMNS)) return Key.Columns;
    return Key.Other;
  }
}

function same(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}
