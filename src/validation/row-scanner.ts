/**
 * The fast path of a piece of `data`: one pass over its bytes that checks the JSON syntax,
 * every value's type and bounds, and writes the NDJSON line of each valid row, without
 * building a value. The rules of each column come from typia's JSON Schema of the entity's
 * row (`cellRules`); the code that checks one row is generated from them per entity and
 * column order and cached, so every column order runs specialised code.
 *
 * What it accepts is exactly what `JSON.parse('[' + region + ']')` accepts, for regions of
 * flat rows: arrays of strings, numbers, `true`, `false` and `null`. Anything else (an
 * element that is not an array, a nested array or object as a cell, any syntax error, the
 * body ending inside `data`) is declined, and the caller answers with the reference path
 * (`JSON.parse` + the typia checkers), which is also the oracle of the differential test.
 *
 * - The region is first copied into `out` (one native copy); the scan reads `out`, and
 *   a valid row's line is the row's own bytes there: whitespace outside strings is dropped
 *   (moved down in place) and the comma after the row becomes `\n`. Escapes and number
 *   forms stay as the client wrote them (`1e3` stays `1e3`: docs/api.md, "API decisions"). The
 *   piece's own bytes are never written: a declined piece, or one that turns out to lie
 *   after `data`'s end, is read again as it came.
 * - UTF-8 is validated natively for the whole piece before (the caller's `isUtf8`); here
 *   bytes >= 0x80 are plain string content, and raw control characters are refused.
 * - Numbers are decided from their digits when that is certain (no exponent, few digits),
 *   else from `Number(text)` of the token, which is the value `JSON.parse` gives.
 * - A bad row costs the same scan, and no output; each refused value is counted. The
 *   messages (the first 100 errors of a piece) come from the reference: `JSON.parse` of the
 *   row and the typia checker, which must find as many errors as the scan counted.
 * - A date or datetime string with escapes is left to the reference for its row.
 */
import { Buffer } from 'node:buffer';
import type { CellRule } from '../entities/validators.js';

/** What a generated row function leaves behind, besides the index it returns. */
export interface RowState {
  /** Values of the row refused (0: every value passed; the count is the reference's, see `scanRegion`). */
  bad: number;
  /** Values in the row. */
  count: number;
  /** Whitespace outside strings was seen in the row: its line must be compacted. */
  ws: number;
  /** A value only the reference can decide (a date with escapes). */
  slow: number;
  /** Set by `str`: the string had an escape. */
  esc: number;
  /** Set by `num`. */
  neg: number;
  zero: number;
  frac: number;
  exp: number;
  intDigits: number;
  /** Latin-1 view of the bytes being scanned, for `Number(text)` of an unusual number. */
  text: Buffer;
}

/** Scans the row whose `[` is at `i`: the index after its `]`, or -1 to decline the region. */
export type RowFunction = (b: Uint8Array, i: number, x: RowState) => number;

const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/** Index after the closing quote of the string whose content starts at `i`, or -1 when it is not JSON. */
export function str(b: Uint8Array, i: number, x: RowState): number {
  for (;;) {
    const c = b[i]!;
    if (c === QUOTE) return i + 1;
    if (c === BACKSLASH) {
      const e = b[i + 1]!;
      if (e === 0x75) {
        if (!(isHex(b[i + 2]!) && isHex(b[i + 3]!) && isHex(b[i + 4]!) && isHex(b[i + 5]!))) return -1;
        i += 6;
      } else if (e === QUOTE || e === BACKSLASH || e === 0x2f || e === 0x62 || e === 0x66 || e === 0x6e || e === 0x72 || e === 0x74) {
        i += 2;
      } else {
        return -1;
      }
      x.esc = 1;
      continue;
    }
    if (c < 0x20) return -1;
    i++;
  }
}

function isHex(c: number): boolean {
  return (c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x66) || (c >= 0x41 && c <= 0x46);
}

/** Index after the number token at `i` (JSON's grammar), or -1; its shape goes to `x`. */
export function num(b: Uint8Array, i: number, x: RowState): number {
  let neg = 0;
  if (b[i] === 0x2d) {
    neg = 1;
    i++;
  }
  let c = b[i]!;
  const intStart = i;
  let zero = 1;
  if (c === 0x30) {
    c = b[++i]!;
  } else if (c >= 0x31 && c <= 0x39) {
    zero = 0;
    do c = b[++i]!;
    while (c >= 0x30 && c <= 0x39);
  } else {
    return -1;
  }
  x.intDigits = i - intStart;
  let frac = 0;
  if (c === 0x2e) {
    c = b[++i]!;
    if (!(c >= 0x30 && c <= 0x39)) return -1;
    frac = 1;
    do {
      if (c !== 0x30) zero = 0;
      c = b[++i]!;
    } while (c >= 0x30 && c <= 0x39);
  }
  let exp = 0;
  if (c === 0x65 || c === 0x45) {
    c = b[++i]!;
    if (c === 0x2b || c === 0x2d) c = b[++i]!;
    if (!(c >= 0x30 && c <= 0x39)) return -1;
    exp = 1;
    do c = b[++i]!;
    while (c >= 0x30 && c <= 0x39);
  }
  x.neg = neg;
  x.zero = zero;
  x.frac = frac;
  x.exp = exp;
  return i;
}

/** Index after the scalar at `i` (any JSON value but an array or object), or -1. */
export function scalar(b: Uint8Array, i: number, x: RowState): number {
  const c = b[i]!;
  if (c === QUOTE) return str(b, i + 1, x);
  if (c === 0x2d || (c >= 0x30 && c <= 0x39)) return num(b, i, x);
  if (c === 0x74) return isTrue(b, i) ? i + 4 : -1;
  if (c === 0x66) return isFalse(b, i) ? i + 5 : -1;
  if (c === 0x6e) return isNull(b, i) ? i + 4 : -1;
  return -1;
}

export function isTrue(b: Uint8Array, i: number): boolean {
  return b[i + 1] === 0x72 && b[i + 2] === 0x75 && b[i + 3] === 0x65;
}

export function isFalse(b: Uint8Array, i: number): boolean {
  return b[i + 1] === 0x61 && b[i + 2] === 0x6c && b[i + 3] === 0x73 && b[i + 4] === 0x65;
}

export function isNull(b: Uint8Array, i: number): boolean {
  return b[i + 1] === 0x75 && b[i + 2] === 0x6c && b[i + 3] === 0x6c;
}

/** The value `JSON.parse` gives the number token `[from, to)`. */
function numberValue(x: RowState, from: number, to: number): number {
  return Number(x.text.toString('latin1', from, to));
}

/** A number cell's check against its rule (type `number` or `integer`), from the token `[from, to)` and `num`'s notes. */
type NumberCheck = (b: Uint8Array, from: number, to: number, x: RowState) => boolean;

function numberCheck(rule: CellRule): NumberCheck {
  const min = rule.minimum;
  const max = rule.maximum;
  if (rule.type === 'integer') {
    const lo = min ?? -Number.MAX_SAFE_INTEGER;
    const hi = max ?? Number.MAX_SAFE_INTEGER;
    return (b, from, to, x) => {
      if (x.exp === 0 && x.frac === 0 && x.intDigits <= 15) {
        // At most 15 digits: exact in a double, and a safe integer.
        let v = 0;
        for (let k = from + x.neg; k < to; k++) v = v * 10 + (b[k]! - 0x30);
        if (x.neg === 1) v = -v;
        return v >= lo && v <= hi;
      }
      const v = numberValue(x, from, to);
      return Number.isSafeInteger(v) && v >= lo && v <= hi;
    };
  }
  return (_b, from, to, x) => {
    // Fewer than 309 integer digits and no exponent: below 1e308, so finite.
    if (x.exp === 0 && x.intDigits <= 308) {
      if (min === null) return true;
      if (min === 0) {
        // -0 (however written) is >= 0; any other negative short enough not to round to -0 is not.
        if (x.neg === 0 || x.zero === 1) return true;
        if (to - from < 300) return false;
      }
    }
    const v = numberValue(x, from, to);
    return Number.isFinite(v) && (min === null || v >= min) && (max === null || v <= max);
  };
}

const isDigit = (c: number) => c >= 0x30 && c <= 0x39;

function digits2(b: Uint8Array, at: number): number {
  const h = b[at]!;
  const l = b[at + 1]!;
  return isDigit(h) && isDigit(l) ? (h - 0x30) * 10 + (l - 0x30) : -1;
}

/** `isCalendarDate` on the bytes `[from, to)` (a string's content without escapes). */
export function isDateBytes(b: Uint8Array, from: number, to: number): boolean {
  if (to - from !== 10 || b[from + 4] !== 0x2d || b[from + 7] !== 0x2d) return false;
  const century = digits2(b, from);
  const years = digits2(b, from + 2);
  const month = digits2(b, from + 5);
  const day = digits2(b, from + 8);
  if (century < 0 || years < 0 || month < 1 || month > 12 || day < 1) return false;
  const year = century * 100 + years;
  const leap = year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0);
  const last = month === 2 ? (leap ? 29 : 28) : month === 4 || month === 6 || month === 9 || month === 11 ? 30 : 31;
  return day <= last;
}

function isTimeBytes(b: Uint8Array, at: number): boolean {
  const hour = digits2(b, at);
  const minute = digits2(b, at + 3);
  return b[at + 2] === 0x3a && hour >= 0 && hour <= 23 && minute >= 0 && minute <= 59;
}

/** `isDateTime` on the bytes `[from, to)` (a string's content without escapes). */
export function isDateTimeBytes(b: Uint8Array, from: number, to: number): boolean {
  if (to - from < 20) return false;
  const t = b[from + 10];
  if ((t !== 0x54 && t !== 0x74) || !isDateBytes(b, from, from + 10) || !isTimeBytes(b, from + 11)) return false;
  const second = digits2(b, from + 17);
  if (b[from + 16] !== 0x3a || second < 0 || second > 59) return false;
  let i = from + 19;
  if (b[i] === 0x2e) {
    const start = ++i;
    while (i < to && isDigit(b[i]!)) i++;
    if (i === start) return false;
  }
  if (i === to - 1) return b[i] === 0x5a || b[i] === 0x7a;
  return i === to - 6 && (b[i] === 0x2b || b[i] === 0x2d) && isTimeBytes(b, i + 1);
}

/** What the generated code calls; passed in, never looked up by name. */
interface Helpers {
  str: typeof str;
  num: typeof num;
  scalar: typeof scalar;
  isTrue: typeof isTrue;
  isFalse: typeof isFalse;
  isNull: typeof isNull;
  isDateBytes: typeof isDateBytes;
  isDateTimeBytes: typeof isDateTimeBytes;
  checks: (NumberCheck | null)[];
}

const WS = '(c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09)';
/** After it, `c` holds the first byte that is not JSON whitespace; a control byte declines. */
const SKIP_WS = `if (c <= 0x20) { if (!${WS}) return -1; ws = 1; do c = b[++i]; while (${WS}); }`;
/** A refused value of the row: counted (only the bad branches pay). */
const WRONG = 'bad++;';

/** Source of the checks of cell `j` under `rule`, with `c = b[i]` its first byte; leaves `i` after the value. */
function cellSource(j: number, rule: CellRule): string {
  const wrong = WRONG;
  const onString =
    rule.type !== 'string'
      ? `i = H.str(b, i + 1, x); if (i < 0) return -1; ${wrong}`
      : rule.format !== null
        ? `s0 = i; x.esc = 0; i = H.str(b, i + 1, x); if (i < 0) return -1;
           if (x.esc === 1) x.slow = 1; else if (!H.${rule.format === 'date' ? 'isDateBytes' : 'isDateTimeBytes'}(b, s0 + 1, i - 1)) { ${wrong} }`
        : `s0 = i; i = H.str(b, i + 1, x); if (i < 0) return -1;${rule.minLength > 0 ? ` if (i - s0 === 2) { ${wrong} }` : ''}`;
  const isNumber = rule.type === 'number' || rule.type === 'integer';
  const onNumber = isNumber
    ? `s0 = i; i = H.num(b, i, x); if (i < 0) return -1; if (!check${j}(b, s0, i, x)) { ${wrong} }`
    : `i = H.num(b, i, x); if (i < 0) return -1; ${wrong}`;
  const onTrue = `if (!H.isTrue(b, i)) return -1; i += 4;${rule.type === 'boolean' ? '' : ` ${wrong}`}`;
  const onFalse = `if (!H.isFalse(b, i)) return -1; i += 5;${rule.type === 'boolean' ? '' : ` ${wrong}`}`;
  const onNull = `if (!H.isNull(b, i)) return -1; i += 4;${rule.nullable ? '' : ` ${wrong}`}`;
  const branches: [string, string][] = [
    ['c === 0x22', onString],
    ['c === 0x2d || (c >= 0x30 && c <= 0x39)', onNumber],
    ['c === 0x74', onTrue],
    ['c === 0x66', onFalse],
    ['c === 0x6e', onNull],
  ];
  // The column's own type is tested first.
  const first = rule.type === 'string' ? 0 : isNumber ? 1 : rule.type === 'boolean' ? 2 : 0;
  const ordered = [branches[first]!, ...branches.filter((_, k) => k !== first)];
  return `${ordered.map(([test, body], k) => `${k === 0 ? '' : 'else '}if (${test}) { ${body} }`).join('\n')}\nelse return -1;`;
}

/** After a value: `]` ends the row with `count` values; `,` goes on to the next one. */
const separator = (count: string) => `c = b[i]; ${SKIP_WS}
  if (c === 0x5d) { x.count = ${count}; i++; break row; }
  if (c !== 0x2c) return -1;
  c = b[++i]; ${SKIP_WS}`;

/**
 * The row function of a column order: the rules of `columns` (client order), or null for a
 * row of any scalars and any length (JSON syntax only).
 */
export function compileRowFunction(rules: readonly CellRule[] | null): RowFunction {
  const checks = (rules ?? []).map((r) => (r.type === 'number' || r.type === 'integer' ? numberCheck(r) : null));
  const cells = (rules ?? []).map((rule, j) => `${cellSource(j, rule)}\n${separator(String(j + 1))}`);
  const source = `
    ${checks.map((check, j) => (check ? `const check${j} = H.checks[${j}];` : '')).join('\n')}
    return function row(b, i, x) {
      let c, s0 = 0, bad = 0, ws = 0, k = ${cells.length};
      x.slow = 0;
      c = b[++i]; ${SKIP_WS}
      row: {
        if (c === 0x5d) { x.count = 0; i++; break row; }
        ${cells.join('\n')}
        for (;;) {
          i = H.scalar(b, i, x); if (i < 0) return -1; k++;
          ${separator('k')}
        }
      }
      x.bad = bad; x.ws = ws;
      return i;
    };`;
  const helpers: Helpers = { str, num, scalar, isTrue, isFalse, isNull, isDateBytes, isDateTimeBytes, checks };
  // Generated from the catalog's rules and indexes only: no client byte reaches the source.
  // eslint-disable-next-line @typescript-eslint/no-implied-eval -- the point of the module: code per column order
  return new Function('H', source)(helpers) as RowFunction;
}

export function newRowState(): RowState {
  return { bad: 0, count: 0, ws: 0, slow: 0, esc: 0, neg: 0, zero: 0, frac: 0, exp: 0, intDigits: 0, text: Buffer.alloc(0) };
}

/** What one region gave: see `scanRegion`. */
export interface RegionScan {
  rows: number;
  /** Index after `data`'s closing `]` when the region holds it, else -1. */
  tail: number;
  /** Errors: each refused value, a row of the wrong length one. */
  errorCount: number;
  /**
   * The refused rows holding the first errors, up to the caller's limit: `[index, start, end, errors]`
   * for each, flat (`start`/`end` bound the row's bytes, `errors` its count of errors).
   */
  refused: number[];
  /** NDJSON bytes written to the front of the buffer (0 when not encoding, or when a row was refused). */
  length: number;
}

export interface RegionOptions {
  /** The region starts right after `data`'s `[` (it may then be `]` alone). */
  first: boolean;
  /** The body ends in this region: it must hold `data`'s `]`. */
  last: boolean;
  /** Values a row must have; -1 for any (a row function compiled without rules). */
  width: number;
  /** Write the lines (stops at the first refused row). */
  encode: boolean;
  /** Refused rows are located while fewer errors than this were found before them. */
  keep: number;
  /** The reference's count of errors of the row `[start, end)` (0: valid), for a row with a value only it can decide. */
  reference: (start: number, end: number) => number;
}

const isSpace = (c: number) => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;

/**
 * Scans the region in `b[0, length)` (followed by a 0 byte at `length`: the sentinel every
 * loop stops at) as `data`'s elements, and writes the valid rows' lines to `b[0, …)` in
 * place (each line at or before its row, so nothing is overwritten before it is read).
 * Null when the region is not a list of flat rows (the reference path decides it).
 */
export function scanRegion(b: Uint8Array, length: number, row: RowFunction, x: RowState, opts: RegionOptions): RegionScan | null {
  const result: RegionScan = { rows: 0, tail: -1, errorCount: 0, refused: [], length: 0 };
  const { width, keep } = opts;
  let encode = opts.encode;
  let i = 0;
  let c = b[0]!;
  while (isSpace(c)) c = b[++i]!;
  if (c === 0x5d && i < length) {
    if (!opts.first) return null;
    result.tail = i + 1;
    return result;
  }
  let o = 0;
  let rows = 0;
  for (;;) {
    if (c !== 0x5b || i >= length) return null;
    const start = i;
    const end = row(b, i, x);
    if (end < 0) return null;
    i = end;
    c = b[i]!;
    while (isSpace(c)) c = b[++i]!;
    // 0: the region's end; 1: a comma; 2: `data`'s `]`.
    const next = i >= length ? 0 : c === 0x2c ? 1 : c === 0x5d ? 2 : -1;
    if (next < 0) return null;
    // A row of the wrong length is one error; a value only the reference decides (a date with
    // escapes) leaves the whole row's count to it.
    const errors = width < 0 ? 0 : x.count !== width ? 1 : x.slow === 1 ? opts.reference(start, end) : x.bad;
    if (errors > 0) {
      if (result.errorCount < keep) result.refused.push(rows, start, end, errors);
      result.errorCount += errors;
      encode = false;
    } else if (encode) {
      if (x.ws === 1) o = compact(b, start, end, o);
      else {
        if (o !== start) b.copyWithin(o, start, end);
        o += end - start;
      }
      // At or before the separator just read: nothing unread is overwritten.
      b[o++] = 0x0a;
    }
    rows++;
    if (next === 0) {
      if (opts.last) return null;
      break;
    }
    if (next === 2) {
      result.tail = i + 1;
      break;
    }
    c = b[++i]!;
    while (isSpace(c)) c = b[++i]!;
  }
  result.rows = rows;
  result.length = encode ? o : 0;
  return result;
}

/** Moves the row `[start, end)` to `o`, dropping whitespace outside strings; returns the new end. */
function compact(b: Uint8Array, start: number, end: number, o: number): number {
  let inString = false;
  let escape = false;
  for (let k = start; k < end; k++) {
    const c = b[k]!;
    if (inString) {
      if (escape) escape = false;
      else if (c === BACKSLASH) escape = true;
      else if (c === QUOTE) inString = false;
    } else if (isSpace(c)) {
      continue;
    } else if (c === QUOTE) {
      inString = true;
    }
    b[o++] = c;
  }
  return o;
}

/**
 * Batch ends for the NDJSON lines in `b[0, length)`: whole lines, at most `batchBytes` a
 * batch, a longer line a batch of its own.
 */
export function cutBatches(b: Uint8Array, length: number, batchBytes: number): number[] {
  const ends: number[] = [];
  let at = 0;
  while (at < length) {
    let end = length;
    if (length - at > batchBytes) {
      const newline = b.lastIndexOf(0x0a, at + batchBytes - 1);
      end = newline >= at ? newline + 1 : b.indexOf(0x0a, at) + 1;
    }
    ends.push(end);
    at = end;
  }
  return ends;
}
