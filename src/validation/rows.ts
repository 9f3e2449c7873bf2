/**
 * One region of `data`'s elements (see `RowsTask`): parse, check, validate, encode.
 *
 * A region of one range (no carry) goes to the byte-level scanner first (`row-scanner.ts`):
 * one pass checks the syntax and every value and writes the lines. What it declines (a
 * nested value, an element that is not a list, a syntax error, a cut in the wrong place)
 * takes the reference path below, which gives the same answers by `JSON.parse` + typia.
 *
 * The reference path trusts the main thread's cut: `JSON.parse('[' + text + ']')`. Its success
 * proves the text is a list of whole elements, whatever the guess was. When it fails, the
 * exact scan of `element-scan.ts` (from the region's start, or from the carried state)
 * finds where the elements really end: the region is parsed up to the last real boundary
 * (or `data`'s `]`), and the unfinished element after it goes back as a carry for the
 * next task to complete. Each byte is scanned once and parsed at most twice (twice more
 * when the piece is redone from UTF-8, below), so a hostile body (many `],[` inside strings,
 * one huge row) costs linear time, never re-parsing.
 *
 * Text for `JSON.parse` is first made by reading the bytes as Latin-1 (a copy, ~10x faster
 * than UTF-8 decoding, and V8 parses the one-byte string it gives faster than the two-byte
 * string non-ASCII UTF-8 decodes to). For bytes that are UTF-8 (checked first), that changes
 * no yes/no answer: JSON's syntax is ASCII, every non-ASCII byte is a legal string character
 * either way (and illegal outside strings either way), and the row checks only test types,
 * emptiness and ASCII shapes (`validators.ts` keeps them so). What Latin-1 gets wrong is
 * string *values*, so anything that would show or store a value the parse made (a row
 * error, a non-list element, `JSON.stringify` encoding) is answered by doing the task again
 * with UTF-8 text: error details and stored bytes are exactly those of the UTF-8 parse.
 */
import { Buffer, isUtf8 } from 'node:buffer';
import { findEntity } from '../entities/catalog.js';
import { cellRules, compileRowErrorCount, compileRowProblem, rowNotListInput, type RowErrorCount, type RowProblem } from '../entities/validators.js';
import { ROW_ERRORS_MAX } from '../errors.js';
import { FRESH, isClean, scanElements } from './element-scan.js';
import { Mode, type LocalRowError, type RowsResult, type RowsTask } from './tasks.js';
import { encode, encodeFrom, room } from './encode.js';
import { compileRowFunction, cutBatches, newRowState, scanRegion, type RowFunction } from './row-scanner.js';

const CLOSE_ARRAY = 0x5d;
const COMMA = Uint8Array.of(0x2c);
const FAIL = Symbol('not JSON');

/** Bytes to text for `JSON.parse`: `latin1` for the first attempt, `utf8` to redo it. */
type Decode = (view: Uint8Array, from: number, to: number) => string;

const latin1: Decode = (view, from, to) => Buffer.from(view.buffer, view.byteOffset + from, to - from).toString('latin1');
const utf8: Decode = (view, from, to) => Buffer.from(view.buffer, view.byteOffset + from, to - from).toString('utf8');

/** The Latin-1 attempt's answer when it has to be made again from UTF-8 text. */
const REDO = Symbol('redo with UTF-8');

/** `scanner` false: the reference path only (the differential test's second answer, the bench's before). */
export function processRows(task: RowsTask, scanner = true): RowsResult {
  const fast = scanner && task.state === null && task.parts.length === 1 ? scanned(task) : null;
  if (fast) return fast;
  const result = attempt(task, latin1);
  return result === REDO ? (attempt(task, utf8) as RowsResult) : result;
}

const state = newRowState();
/** Where a region is scanned when the task writes no lines (it brought no `out`). */
let scratch = new ArrayBuffer(0);

/** The byte-level scanner's answer, or null when it declines the region (see the file comment). */
function scanned(task: RowsTask): RowsResult | null {
  const { ranges, first, last, mode } = task;
  const view = new Uint8Array(task.parts[0]!, ranges[0]!, ranges[1]! - ranges[0]!);
  const result = emptyResult(task);
  if (!isUtf8(view)) return { ...result, ok: false };
  const scanner = scannerOf(task);
  if (scanner === null) return null;
  const length = view.length;
  let buffer: ArrayBuffer;
  if (task.out !== null) buffer = room(task.out, length + 1);
  else buffer = scratch = room(scratch, length + 1);
  const b = new Uint8Array(buffer, 0, length + 1);
  b.set(view);
  b[length] = 0;
  state.text = Buffer.from(buffer, 0, length + 1);
  const validate = mode === Mode.validate;
  const scan = scanRegion(b, length, scanner.row, state, {
    first,
    last,
    width: validate ? task.columns.length : -1,
    encode: task.out !== null,
    keep: Math.min(task.describe, ROW_ERRORS_MAX),
    reference: (start, end) => scanner.count(parseRow(view, start, end)),
  });
  state.text = EMPTY;
  if (scan === null) return null;
  result.scanned = true;
  result.rows = scan.rows;
  if (scan.tail >= 0) result.tail = { part: 0, offset: ranges[0]! + scan.tail };
  if (task.out !== null) result.out = buffer;
  result.errorCount = scan.errorCount;
  const refused = scan.refused;
  const keep = Math.min(task.describe, ROW_ERRORS_MAX);
  for (let k = 0; k < refused.length; k += 4) {
    const found = scanner.problem(parseRow(view, refused[k + 1]!, refused[k + 2]!));
    if (found === null || found.length !== refused[k + 3]) {
      throw new Error(`The row scanner found ${refused[k + 3]} errors in a row where the reference finds ${found?.length ?? 0} (${task.entity}, row ${refused[k]} of a piece)`);
    }
    for (const fault of found) if (result.rowErrors.length < keep) result.rowErrors.push({ index: refused[k]!, ...fault });
  }
  if (scan.length > 0) {
    result.ends = cutBatches(b, scan.length, task.batchBytes);
    result.bytes = scan.length;
  }
  return result;
}

const EMPTY = Buffer.alloc(0);

/** One row's bytes, parsed as the reference parses them. */
function parseRow(view: Uint8Array, start: number, end: number): unknown[] {
  return JSON.parse(utf8(view, start, end)) as unknown[];
}

/** The row function and reference checker of a task's columns (parse-only modes: any row). */
interface Scanner {
  row: RowFunction;
  problem: RowProblem;
  count: RowErrorCount;
}

const ANY: Scanner = { row: compileRowFunction(null), problem: () => null, count: () => 0 };
const scanners = new Map<string, Scanner | null>();

function scannerOf(task: RowsTask): Scanner | null {
  if (task.mode !== Mode.validate) return ANY;
  const key = `${task.entity}\u0000${task.columns.join('\u0000')}`;
  let scanner = scanners.get(key);
  if (scanner === undefined) {
    const entity = findEntity(task.entity);
    if (!entity) throw new Error(`Unknown entity ${task.entity}`);
    const rules = cellRules(entity, task.columns);
    scanner = rules === null ? null : { row: compileRowFunction(rules), ...rowCheckers(task.entity, task.columns) };
    if (scanners.size >= 256) scanners.clear();
    scanners.set(key, scanner);
  }
  return scanner;
}

function emptyResult(task: RowsTask): RowsResult {
  return {
    kind: 'rows',
    ok: true,
    rows: 0,
    scanned: false,
    notList: -1,
    rowErrors: [],
    errorCount: 0,
    out: task.out,
    ends: [],
    bytes: 0,
    parts: task.parts,
    carry: null,
    tail: null,
  };
}

function attempt(task: RowsTask, decode: Decode): RowsResult | typeof REDO {
  const { parts, ranges, state, first, last } = task;
  const views = parts.map((buffer, k) => new Uint8Array(buffer, ranges[2 * k]!, ranges[2 * k + 1]! - ranges[2 * k]!));
  const result = emptyResult(task);
  const invalid = (): RowsResult => ({ ...result, ok: false });
  // Carried parts were checked by the task that carried them (a carry starts at an ASCII byte).
  if (!isUtf8(views[views.length - 1]!) || (state === null && views.some((v) => !isUtf8(v)))) return invalid();

  // Fast paths: the cut guess held.
  if (state === null) {
    const view = views[0]!;
    if (!last) {
      const rows = parseList(decode(view, 0, view.length));
      if (rows !== FAIL && rows.length > 0) return finish(task, result, rows, view, decode);
    } else {
      const end = view.lastIndexOf(CLOSE_ARRAY);
      if (end >= 0) {
        const rows = parseList(decode(view, 0, end));
        if (rows !== FAIL && (rows.length > 0 || first)) {
          result.tail = { part: 0, offset: ranges[0]! + end + 1 };
          return finish(task, result, rows, view.subarray(0, end), decode);
        }
      }
    }
  }

  // The exact scan of the last part (the others, if any, are a carry scanned before).
  const k = views.length - 1;
  const view = views[k]!;
  let start = FRESH;
  if (state !== null) {
    const join = scanElements(COMMA, 0, 1, state);
    if (join.end >= 0 || join.boundary >= 0) throw new Error('A carry must end inside an element');
    start = join.state;
  }
  const scan = scanElements(view, 0, view.length, start);
  // Only `data`'s own `]` may follow an empty region, and only at its start: `[]`.
  const complete = (upTo: number, atEnd: boolean): unknown[] | typeof FAIL => {
    const rows = parseList(regionText(views, k, upTo, decode));
    return rows !== FAIL && (rows.length > 0 || (atEnd && first && state === null)) ? rows : FAIL;
  };
  // The region's bytes when they are one range (not after a carry).
  const source = (upTo: number) => (k === 0 ? view.subarray(0, upTo) : null);

  if (scan.end >= 0) {
    const rows = complete(scan.end, true);
    if (rows === FAIL) return invalid();
    result.tail = { part: k, offset: ranges[2 * k]! + scan.end + 1 };
    return finish(task, result, rows, source(scan.end), decode);
  }
  // The body ended inside `data`'s array.
  if (last) return invalid();
  if (isClean(scan.state)) {
    // A fresh region that ends clean is exactly the text the fast path failed on.
    if (state === null) return invalid();
    const rows = complete(view.length, false);
    return rows === FAIL ? invalid() : finish(task, result, rows, source(view.length), decode);
  }
  if (scan.boundary < 0) {
    result.carry = { part: 0, offset: ranges[0]!, state: scan.state };
    return result;
  }
  const rows = complete(scan.boundary, false);
  if (rows === FAIL) return invalid();
  result.carry = { part: k, offset: ranges[2 * k]! + scan.boundary + 1, state: scan.state };
  return finish(task, result, rows, source(scan.boundary), decode);
}

/** The region's text: every carried part, then the last part up to `upTo`, joined by the commas the cuts left out. */
function regionText(views: Uint8Array[], k: number, upTo: number, decode: Decode): string {
  let text = '';
  for (let i = 0; i < k; i++) text += `${decode(views[i]!, 0, views[i]!.length)},`;
  return text + decode(views[k]!, 0, upTo);
}

function parseList(text: string): unknown[] | typeof FAIL {
  try {
    return JSON.parse(`[${text}]`) as unknown[];
  } catch {
    return FAIL;
  }
}

function finish(task: RowsTask, result: RowsResult, rows: unknown[], source: Uint8Array | null, decode: Decode): RowsResult | typeof REDO {
  result.rows = rows.length;
  if (task.mode === Mode.parse) return result;
  for (let i = 0; i < rows.length; i++) {
    if (!Array.isArray(rows[i])) {
      if (decode === latin1) return REDO;
      result.notList = i;
      result.notListInput = rowNotListInput(rows[i]);
      return result;
    }
  }
  if (task.mode !== Mode.validate) return result;
  const { problem, count: errorsOf } = rowCheckers(task.entity, task.columns);
  const refused: LocalRowError[] = [];
  let count = 0;
  const keep = Math.min(task.describe, ROW_ERRORS_MAX);
  for (let i = 0; i < rows.length; i++) {
    const row = rows[i] as unknown[];
    // Past the errors the answer describes, only counted: no message is made, and the
    // Latin-1 parse is good enough (the checks answer alike for it, see the file comment).
    if (count >= keep) {
      count += errorsOf(row);
      continue;
    }
    const found = problem(row);
    if (found !== null) {
      if (decode === latin1) return REDO;
      for (const fault of found) if (count++ < keep) refused.push({ index: i, ...fault });
    }
  }
  result.rowErrors = refused;
  result.errorCount = count;
  if (count > 0 || task.out === null) return result;
  const encoded = source ? encodeFrom(source, rows, task.batchBytes, task.out) : null;
  if (encoded === null && decode === latin1) return REDO;
  const { buffer, ends, bytes } = encoded ?? encode(rows, task.batchBytes, task.out);
  result.out = buffer;
  result.ends = ends;
  result.bytes = bytes;
  return result;
}

/** Compiled checkers by entity and columns: every piece of a request asks for the same ones. */
const checkers = new Map<string, { problem: RowProblem; count: RowErrorCount }>();

function rowCheckers(name: string, columns: string[]): { problem: RowProblem; count: RowErrorCount } {
  const key = `${name}\u0000${columns.join('\u0000')}`;
  let found = checkers.get(key);
  if (!found) {
    const entity = findEntity(name);
    if (!entity) throw new Error(`Unknown entity ${name}`);
    if (checkers.size >= 256) checkers.clear();
    found = { problem: compileRowProblem(entity, columns), count: compileRowErrorCount(entity, columns) };
    checkers.set(key, found);
  }
  return found;
}
