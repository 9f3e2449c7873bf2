/**
 * A streaming scanner for the two JSON file layouts `push` accepts, so that a file of any
 * size is read in bounded memory: an array of rows (`[{…}, {…}]`), or the ingest body
 * itself (`{"columns": […], "data": [[…], …]}`). It reports each element of the root array,
 * or of the root object's `data` array, as its exact source text, one at a time, and every
 * other member of the root object parsed. It checks the structure it walks through (brackets,
 * commas, colons, string escapes); the caller `JSON.parse`s each element it keeps.
 */
import { InputError } from './errors.js';

export type ScanEvent =
  /** A member of the root object other than a streamed `data` array. */
  | { type: 'member'; key: string; value: unknown }
  /** The text of one element of the root array or of the root object's `data` array. */
  | { type: 'element'; text: string };

const enum S {
  Start,
  ArrayFirst,
  ArrayElement,
  ArrayNext,
  ObjectFirst,
  ObjectKey,
  Colon,
  Value,
  ObjectNext,
  Capture,
  End,
}

const enum Target {
  Element,
  Key,
  Member,
}

const QUOTE = 0x22;
const BOM = [0xef, 0xbb, 0xbf];
const BACKSLASH = 0x5c;

function isSpace(b: number): boolean {
  return b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09;
}

export class JsonScanner {
  /** `array` or `object` once the root's first byte is seen. */
  shape: 'array' | 'object' | null = null;
  #state = S.Start;
  /** Whether the array being walked is the root's `data` member (else the root array). */
  #inData = false;
  #key = '';
  #offset = 0;
  /** Bytes of a UTF-8 byte order mark seen at the very start. */
  #bom = 0;
  // the value being captured
  #target = Target.Element;
  #segments: Uint8Array[] = [];
  #segmentBytes = 0;
  #captureStart = 0;
  #depth = 0;
  #inString = false;
  #escape = false;
  #scalar = false;

  /** `maxValueBytes`: the longest element or member accepted (bounds memory). */
  constructor(private readonly maxValueBytes = 64 * 1024 * 1024) {}

  push(chunk: Uint8Array): ScanEvent[] {
    const events: ScanEvent[] = [];
    let i = 0;
    const n = chunk.length;
    // A UTF-8 byte order mark at the very start, in however many chunks it comes.
    while (this.#state === S.Start && i < n && this.#offset + i === this.#bom && this.#bom < 3 && chunk[i] === BOM[this.#bom]) {
      this.#bom++;
      i++;
    }
    while (i < n) {
      if (this.#state === S.Capture) {
        i = this.#capture(chunk, i, events);
        continue;
      }
      const b = chunk[i]!;
      if (isSpace(b)) {
        i++;
        continue;
      }
      switch (this.#state) {
        case S.Start:
          if (b === 0x5b) {
            this.shape = 'array';
            this.#state = S.ArrayFirst;
          } else if (b === 0x7b) {
            this.shape = 'object';
            this.#state = S.ObjectFirst;
          } else throw this.#unexpected(b, i, 'expected [ or { at the start of the file');
          i++;
          break;
        case S.ArrayFirst:
          if (b === 0x5d) {
            this.#closeArray();
            i++;
          } else this.#begin(chunk, i, Target.Element);
          break;
        case S.ArrayElement:
          this.#begin(chunk, i, Target.Element);
          break;
        case S.ArrayNext:
          if (b === 0x2c) this.#state = S.ArrayElement;
          else if (b === 0x5d) this.#closeArray();
          else throw this.#unexpected(b, i, 'expected , or ] after an array element');
          i++;
          break;
        case S.ObjectFirst:
        case S.ObjectKey:
          if (b === 0x7d && this.#state === S.ObjectFirst) {
            this.#state = S.End;
            i++;
          } else if (b === QUOTE) this.#begin(chunk, i, Target.Key);
          else throw this.#unexpected(b, i, 'expected a member name');
          break;
        case S.Colon:
          if (b !== 0x3a) throw this.#unexpected(b, i, 'expected :');
          this.#state = S.Value;
          i++;
          break;
        case S.Value:
          if (this.#key === 'data' && b === 0x5b) {
            this.#inData = true;
            this.#state = S.ArrayFirst;
            i++;
          } else this.#begin(chunk, i, Target.Member);
          break;
        case S.ObjectNext:
          if (b === 0x2c) this.#state = S.ObjectKey;
          else if (b === 0x7d) this.#state = S.End;
          else throw this.#unexpected(b, i, 'expected , or } after a member');
          i++;
          break;
        case S.End:
          throw this.#unexpected(b, i, 'expected the end of the file');
      }
    }
    this.#offset += n;
    return events;
  }

  /** Call at the end of the file: throws when the document is incomplete. */
  end(): void {
    if (this.#state !== S.End) throw new InputError('unexpected end of the file', { where: `byte ${this.#offset}` });
  }

  #closeArray(): void {
    if (this.#inData) {
      this.#inData = false;
      this.#state = S.ObjectNext;
    } else this.#state = S.End;
  }

  #begin(chunk: Uint8Array, i: number, target: Target): void {
    const b = chunk[i]!;
    this.#target = target;
    this.#state = S.Capture;
    this.#segments = [];
    this.#segmentBytes = 0;
    this.#captureStart = this.#offset + i;
    // the capture loop sees the opening quote or bracket itself
    this.#escape = false;
    this.#inString = false;
    this.#depth = 0;
    this.#scalar = b !== QUOTE && b !== 0x5b && b !== 0x7b;
    if (this.#scalar && !/[-0-9tfn]/.test(String.fromCharCode(b))) throw this.#unexpected(b, i, 'expected a value');
  }

  /** Advances the capture through `chunk` from `i`; returns where scanning goes on. */
  #capture(chunk: Uint8Array, i: number, events: ScanEvent[]): number {
    const from = i;
    const n = chunk.length;
    let end = -1; // exclusive end of the value in this chunk
    if (this.#scalar) {
      for (; i < n; i++) {
        const b = chunk[i]!;
        if (b === 0x2c || b === 0x5d || b === 0x7d || isSpace(b)) {
          end = i;
          break;
        }
      }
    } else {
      let depth = this.#depth;
      let inString = this.#inString;
      let escape = this.#escape;
      for (; i < n; i++) {
        const b = chunk[i]!;
        if (inString) {
          if (escape) escape = false;
          else if (b === BACKSLASH) escape = true;
          else if (b === QUOTE) {
            inString = false;
            if (depth === 0) {
              end = i + 1;
              break;
            }
          }
        } else if (b === QUOTE) inString = true;
        else if (b === 0x5b || b === 0x7b) depth++;
        else if (b === 0x5d || b === 0x7d) {
          depth--;
          if (depth === 0) {
            end = i + 1;
            break;
          }
        }
      }
      this.#depth = depth;
      this.#inString = inString;
      this.#escape = escape;
    }
    if (end < 0) {
      this.#keep(chunk.subarray(from, n));
      return n;
    }
    this.#keep(chunk.subarray(from, end));
    const text = Buffer.concat(this.#segments, this.#segmentBytes).toString('utf8');
    this.#segments = [];
    this.#segmentBytes = 0;
    this.#finish(text, events);
    return end;
  }

  #keep(part: Uint8Array): void {
    if (part.length === 0) return;
    this.#segmentBytes += part.length;
    if (this.#segmentBytes > this.maxValueBytes) {
      throw new InputError(`a value longer than ${this.maxValueBytes} bytes`, { where: `byte ${this.#captureStart}` });
    }
    this.#segments.push(part);
  }

  #finish(text: string, events: ScanEvent[]): void {
    switch (this.#target) {
      case Target.Element:
        events.push({ type: 'element', text });
        this.#state = S.ArrayNext;
        return;
      case Target.Key:
        this.#key = this.#parse(text) as string;
        this.#state = S.Colon;
        return;
      case Target.Member:
        events.push({ type: 'member', key: this.#key, value: this.#parse(text) });
        this.#state = S.ObjectNext;
        return;
    }
  }

  #parse(text: string): unknown {
    try {
      return JSON.parse(text);
    } catch (err) {
      throw new InputError(`invalid JSON value: ${(err as Error).message}`, { where: `byte ${this.#captureStart}`, cause: err });
    }
  }

  #unexpected(b: number, i: number, expected: string): InputError {
    return new InputError(`${expected}, got ${JSON.stringify(String.fromCharCode(b))}`, { where: `byte ${this.#offset + i}` });
  }
}
