import type { FileHandle } from 'node:fs/promises';
import { crc32 } from 'node:zlib';
import { StoreError } from '../../ports.js';
import { ABANDONED, parseHeader, type Header } from './record.js';

/** How every header line starts. */
const HEADER_START = Buffer.from('{"k":');

/** A header line longer than this is no header. */
const MAX_HEADER_BYTES = 1024 * 1024;

/** A record read whole and valid: `offset` of its bytes, `end` of the record, and whether its header carried a checksum. */
export interface ValidRecord {
  header: Header;
  offset: number;
  end: number;
  checked: boolean;
}

/** A record that fails its checks though whole: where it starts, why, and where the next one starts if its header was valid. */
export interface FailedRecord {
  at: number;
  reason: string;
  next: number | null;
}

/** Reads a pack's records in order from `from` up to `size`, checking each one whole against its CRCs. */
export class RecordReader {
  readonly #fh: FileHandle;
  #pos: number;
  readonly #size: number;
  /** A checked header was read: from then on a header without a checksum is damage. */
  #checked: boolean;
  #buf = Buffer.allocUnsafe(64 * 1024);
  /** Bytes of `#buf` read, from file offset `#bufAt`. */
  #bufAt = 0;
  #bufLen = 0;

  constructor(fh: FileHandle, from: number, size: number, checked: boolean) {
    this.#fh = fh;
    this.#pos = from;
    this.#size = size;
    this.#checked = checked;
  }

  /**
   * The next record: valid, failed, or null at the end of the file or at one not whole (its
   * header line or its bytes running past the end, or still being streamed).
   */
  async next(): Promise<ValidRecord | FailedRecord | null> {
    const at = this.#pos;
    const line = await this.#line(at);
    if (line === null) return null;
    if (line === 'long') return { at, reason: 'record header line too long', next: null };
    const parsed = parseHeader(line.bytes, !this.#checked);
    if (typeof parsed === 'string') return { at, reason: parsed, next: null };
    const h = parsed.header;
    let end = line.end;
    if (!('d' in h)) {
      if (h.n < 0 || line.end + h.n > this.#size) return null;
      end = line.end + h.n;
      if (h.c !== ABANDONED && (await this.#crc(line.end, h.n)) !== h.c) return { at, reason: `an object's ${h.n} bytes fail their CRC-32`, next: end };
    }
    this.#pos = end;
    if (parsed.checked) this.#checked = true;
    return { header: h, offset: line.end, end, checked: parsed.checked };
  }

  /**
   * Moves past a failed record: after it if its header was valid, else to the next valid
   * header line (where its `{"k":` starts: the bytes before may not end in a newline); a
   * header start met on the way that fails too goes to `failing`. False: no valid one.
   */
  async skip(failed: FailedRecord, failing: (f: FailedRecord) => void): Promise<boolean> {
    if (failed.next !== null) {
      this.#pos = failed.next;
      return true;
    }
    for (let from = failed.at + 1; ; ) {
      const start = await this.#find(HEADER_START, from);
      if (start === null) return false;
      const line = await this.#line(start);
      if (line === null) return false;
      const parsed = line === 'long' ? 'record header line too long' : parseHeader(line.bytes, !this.#checked);
      if (typeof parsed !== 'string') {
        this.#pos = start;
        return true;
      }
      failing({ at: start, reason: parsed, next: null });
      from = start + 1;
    }
  }

  /** Reads again from `at`, from the file (not what was read before). */
  restart(at: number): void {
    this.#pos = at;
    this.#bufLen = 0;
  }

  async #crc(at: number, n: number): Promise<number> {
    let crc = 0;
    for (let pos = at; pos < at + n; ) {
      const part = await this.#bytes(pos, Math.min(this.#buf.byteLength, at + n - pos));
      crc = crc32(part, crc);
      pos += part.byteLength;
    }
    return crc;
  }

  /** Where `pattern` next occurs at or past `from`, or null if not before the end. */
  async #find(pattern: Buffer, from: number): Promise<number | null> {
    for (let pos = from; pos + pattern.byteLength <= this.#size; ) {
      const chunk = await this.#bytes(pos, Math.min(this.#buf.byteLength, this.#size - pos));
      const found = chunk.indexOf(pattern);
      if (found >= 0) return pos + found;
      // The pattern may straddle this chunk and the next.
      pos += Math.max(1, chunk.byteLength - pattern.byteLength + 1);
    }
    return null;
  }

  /** The line at `at` (its bytes without the newline, valid until the next read), null if it does not end before the file does, 'long' past `MAX_HEADER_BYTES`. */
  async #line(at: number): Promise<{ bytes: Buffer; end: number } | 'long' | null> {
    for (let want = 1024; ; want *= 2) {
      if (at >= this.#size) return null;
      const chunk = await this.#bytes(at, Math.min(want, this.#size - at));
      const nl = chunk.indexOf(0x0a);
      if (nl >= 0) return { bytes: chunk.subarray(0, nl), end: at + nl + 1 };
      if (at + chunk.byteLength >= this.#size) return null;
      if (want > MAX_HEADER_BYTES) return 'long';
    }
  }

  /** Up to `length` bytes at `at` (at least one), through the buffer. */
  async #bytes(at: number, length: number): Promise<Buffer> {
    if (at < this.#bufAt || at + length > this.#bufAt + this.#bufLen) {
      if (length > this.#buf.byteLength) this.#buf = Buffer.allocUnsafe(length);
      const { bytesRead } = await this.#fh.read(this.#buf, 0, Math.max(length, Math.min(this.#buf.byteLength, this.#size - at)), at);
      this.#bufAt = at;
      this.#bufLen = bytesRead;
      if (bytesRead === 0) throw new StoreError('STORE_CORRUPT', 'Pack file shrank while it was read');
    }
    return this.#buf.subarray(at - this.#bufAt, Math.min(at - this.#bufAt + length, this.#bufLen));
  }
}
