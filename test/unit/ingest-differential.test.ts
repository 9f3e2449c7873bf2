/**
 * Three answers to every body must agree: the streaming sink with the byte-level row scanner
 * (the fast path), the streaming sink with `JSON.parse` + typia only (the reference path,
 * `rowScanner: false`), and `validateBody` (`JSON.parse` of the whole body, then typia),
 * and all three the answer of the reference here: JSON validity and the repeated-key rule
 * written apart from the code under test, then `validateBody` for the rest. Thousands of
 * generated bodies (valid and invalid, every entity, catalog and other column orders, odd
 * layouts, repeated keys, adversarial strings, whitespace, escapes, number forms at the
 * integer and float limits, non-ASCII look-alikes of digits, signs, spaces and literals,
 * packages with more refused rows than an answer lists) go in random chunks through pools
 * with tiny pieces (so most bodies are cut many times, often at the wrong place).
 * "Agree" means the same status, rows, error body (`detail`, `errors`, `error_count`) and
 * stored values: the fast path stores the rows' own bytes (`1e3` stays `1e3`), the others
 * `JSON.stringify`'s, so each stored line is compared parsed (and must parse).
 *
 * Deterministic: body `i` (its bytes, chunking and gzip choices) comes from a generator of
 * its own, seeded from (DIFF_SEED, i), whatever order the concurrent runners take bodies
 * in. A failure names the seed and index; `DIFF_SEED=<seed> DIFF_ONLY=<i>[,<j>…]` reruns
 * just those bodies (with every detail printed).
 */
import { Buffer, isUtf8 } from 'node:buffer';
import { gunzipSync, gzipSync } from 'node:zlib';
import t, { type Test } from 'tap';
import { ENTITIES, type ColumnType, type EntitySpec } from '../../src/entities/catalog.js';
import { errors, isServiceError } from '../../src/errors.js';
import { ValidationPool } from '../../src/validation-pool/pool.js';
import type { IngestSink } from '../../src/validation-pool/types.js';
import type { PackageWriter } from '../../src/store/ports.js';
import { validateBody } from '../../src/validation/body.js';
import { mulberry32 } from '../../testbed/random.js';

const BATCH_BYTES = 200;
const SEED = Number(process.env.DIFF_SEED || 20240611);
const BODIES = Number(process.env.DIFF_BODIES || 3000);
/** Body indexes to run alone (the rest are skipped), from a failure message. */
const ONLY = process.env.DIFF_ONLY ? process.env.DIFF_ONLY.split(',').map((x) => Number(x.trim())) : null;
if (!Number.isSafeInteger(SEED) || (ONLY && !ONLY.every((i) => Number.isSafeInteger(i) && i >= 0))) {
  throw new Error(`DIFF_SEED must be an integer, DIFF_ONLY integers >= 0 separated by commas (got ${process.env.DIFF_SEED}, ${process.env.DIFF_ONLY})`);
}
// About 30 s on 2 cores, at tap's default per-file timeout: give a busy machine room
// (never less than the runner was told, e.g. `npm test`'s 300 s; 0 means none).
const runnerTimeout = Number(process.env.TAP_TIMEOUT ?? 30);
if (runnerTimeout !== 0 && runnerTimeout < 120) t.setTimeout(120_000);

/** One generator stream per test: the plain bodies and the gzip bodies of one index differ. */
const enum Stream {
  Plain = 1,
  Gzip = 2,
}

/** A 32-bit seed from the run's seed, the stream and a body index (murmur3's finaliser over each word). */
function bodySeed(seed: number, stream: Stream, index: number): number {
  let h = 0x9e3779b9;
  for (const word of [seed % 0x100000000, Math.floor(seed / 0x100000000), stream, index]) {
    h = Math.imul(h ^ (word >>> 0), 0xcc9e2d51);
    h ^= h >>> 15;
    h = Math.imul(h, 0x85ebca6b);
    h ^= h >>> 13;
    h = Math.imul(h, 0xc2b2ae35);
    h ^= h >>> 16;
  }
  return h >>> 0;
}

class Gen {
  constructor(readonly rnd: () => number) {}
  int(n: number): number {
    return Math.floor(this.rnd() * n);
  }
  chance(p: number): boolean {
    return this.rnd() < p;
  }
  pick<T>(items: readonly T[]): T {
    return items[this.int(items.length)]!;
  }
  shuffle<T>(items: readonly T[]): T[] {
    const out = [...items];
    for (let i = out.length - 1; i > 0; i--) {
      const j = this.int(i + 1);
      [out[i], out[j]] = [out[j]!, out[i]!];
    }
    return out;
  }
}

/** A number written exactly as `text` in the body (JSON.stringify cannot write `1e3` or `1.50`). */
class Raw {
  constructor(readonly text: string) {}
}

const STRINGS = [
  'a',
  'Milk 3.5%',
  'Grüße, 東京 🚀',
  '],[',
  '"],["',
  '[[', ']]', '],', ',[',
  'x"],["y',
  'back\\slash\\',
  'tab\tnew\nline\r',
  'ctrl\u0001\u001f\u007f',
  'sep\u2028\u2029',
  'Box [6],[12] {x}',
  '{"a":[1],"b":"],["}',
  'slash/path',
  'lone \ud800 high',
  'lone \udc00 low',
  '🍎🍏',
  '',
  '],['.repeat(40),
  `long ${'xyz],["'.repeat(60)}`,
];

const NUMBERS: unknown[] = [
  0, 1, -1, 1.5, -2.25, 1234.5678, 0.1, 123456789012, 99999999999999,
  new Raw('-0'), new Raw('0.0'), new Raw('-0.0'), new Raw('1e3'), new Raw('1E3'), new Raw('1.0e+3'), new Raw('2.50'),
  new Raw('1000.000'), new Raw('1e400'), new Raw('-1e400'), new Raw('1e-7'), new Raw('0.0000001'), new Raw('0.000001'),
  new Raw('1234567890123456789'), new Raw('0.1234567890123456789'), new Raw('12345678901234567'), new Raw('5e-324'),
  new Raw('123456789012345'), new Raw('1.00000000000001'), new Raw('1E+2'), new Raw('0.5e1'), new Raw('-12.50'),
];

/** Numbers at the edges of a double: huge, tiny, overflowing, underflowing, negative zeros. */
const EDGE_NUMBERS: unknown[] = [
  new Raw('1e400'), new Raw('-1e400'), new Raw('5e-324'), new Raw('1234567890123456789'), new Raw('-1e-400'), new Raw('1e-400'), new Raw(`-0.${'0'.repeat(330)}1`), new Raw(`0.${'0'.repeat(330)}1`),
  new Raw('1'.repeat(308)), new Raw('1'.repeat(309)), new Raw('9'.repeat(310)), new Raw(`-${'9'.repeat(310)}`), new Raw('1.7976931348623157e308'),
  new Raw('1.7976931348623159e308'), new Raw('-0e5'), new Raw('0e-5'), new Raw('12345678901234567890.5'),
];

const INTEGERS: unknown[] = [0, 7, -3, 40, new Raw('1e3'), new Raw('2.0'), new Raw('-0'), new Raw('1E1'), new Raw('123456789012345')];

/** Integers at and past ±(2^53 − 1), in the forms a client may write them. */
const EDGE_INTEGERS: unknown[] = [
  1.5, new Raw('9007199254740991'), new Raw('-9007199254740991'),
  new Raw('9007199254740992'), new Raw('9007199254740993'), new Raw('-9007199254740993'), new Raw('9007199254740991.0'),
  new Raw('9007199254740991.4'), new Raw('9007199254740990.9'), new Raw('900719925474099.5'), new Raw('123456789012345'),
  new Raw('1234567890123456'), new Raw('9.007199254740991e15'), new Raw('9.007199254740993e15'), new Raw('1e16'), new Raw('1e400'),
  new Raw('1.0000000000000001'), new Raw('0.99999999999999999'), new Raw('-0.0'), new Raw('5e-324'), new Raw('0.0e0'),
];

const DATES = ['2024-02-29', '2023-02-29', '2024-13-01', '2000-01-01', '20240101', '1900-02-29', '2024-04-31', '0000-01-01'];
const DATETIMES = [
  '2024-02-29T23:59:59Z', '2024-01-01T10:20:30.5+05:30', '2024-01-01T24:00:00Z', '2024-01-01', '2024-01-01t10:20:30.123456z',
  '2024-01-01T10:20:30.Z', '2024-01-01T10:20:30+05:60', '2024-06-30T12:00:00-00:00', '2024-01-01T10:20:60Z',
];
/**
 * Look-alikes: non-ASCII characters that resemble what a cell of the column would hold
 * (fullwidth and Arabic-Indic digits, other dashes and colons, fullwidth Z and T). Valid JSON
 * strings; every one is refused by its typed column and accepted by a plain string column.
 */
const LOOKALIKE_STRINGS = [
  '２０２４-01-01', '2024-01-0١', '2024‐01‐01', '2024-01-01T10:20:30Ｚ', '2024-01-01Ｔ10:20:30Z', '2024-01-01T10∶20∶30Z',
  '１', '−1', 'ｔｒｕｅ', '\u00a0', '2024-01-01T10:20:30Z\u00a0', '\u2007', 'nuｌl',
];
/**
 * Look-alikes written as bare values (outside quotes): not JSON at all, so the body is
 * `Invalid JSON format.` on every path.
 */
const LOOKALIKE_RAW = ['１', '−1', '٣', 'ｔｒｕｅ', 'ｎｕｌｌ', '1\u00a0', '\u00a01', '+1', '01', '.5', '1.', '1e', '-', 'NaN', 'Infinity', 'tru', 'nul', 'True'];

function cell(g: Gen, type: ColumnType, required: boolean, valid: boolean, flat: boolean): unknown {
  if (!required && g.chance(0.1)) return null;
  if (!valid) {
    if (g.chance(0.3)) return g.pick(LOOKALIKE_STRINGS);
    const nested = flat ? [] : [[1, 2], { a: 1 }, [], [['],[']]];
    return g.pick<unknown>([null, '', 'abc', -1, 0, 1.5, true, false, new Raw('1e400'), new Raw('-0'), '2023-02-29', ...nested, ...EDGE_INTEGERS, ...DATES, ...DATETIMES]);
  }
  switch (type) {
    case 'string':
      return g.pick(STRINGS);
    case 'id':
      return g.pick(STRINGS.filter((s) => s !== '')) + (g.chance(0.5) ? String(g.int(1000)) : '');
    case 'number':
      return g.pick(g.chance(0.05) ? EDGE_NUMBERS : NUMBERS);
    case 'nonNegativeNumber':
      return g.pick(g.chance(0.05) ? EDGE_NUMBERS : NUMBERS.filter((n) => typeof n !== 'number' || n >= 0));
    case 'integer':
      return g.pick(g.chance(0.05) ? EDGE_INTEGERS : INTEGERS);
    case 'positiveInteger':
      return g.pick<unknown>(g.chance(0.05) ? EDGE_INTEGERS : [1, 2, 40, new Raw('1e1'), new Raw('3.0'), new Raw('9007199254740991')]);
    case 'boolean':
      return g.chance(0.5);
    case 'date':
      return g.pick(DATES);
    case 'datetime':
      return g.pick(DATETIMES);
  }
}

interface Style {
  ws: () => string;
  escapeNonAscii: boolean;
  escapeSlash: boolean;
  upperHex: boolean;
  /** Some ASCII characters written as `\u00XX` (a date with an escape is still a date). */
  escapeAscii: (() => boolean) | null;
}

function writeString(s: string, style: Style): string {
  let out = JSON.stringify(s);
  const escapeAscii = style.escapeAscii;
  if (escapeAscii) out = `"${out.slice(1, -1).replace(/[0-9A-Za-z:.+-]/g, (c) => (escapeAscii() ? `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}` : c))}"`;
  if (style.escapeNonAscii) out = out.replace(/[^\x00-\x7f]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
  if (style.escapeSlash) out = out.replaceAll('/', '\\/');
  if (style.upperHex) out = out.replace(/\\u([0-9a-f]{4})/g, (_m, h: string) => `\\u${h.toUpperCase()}`);
  return out;
}

function write(v: unknown, style: Style): string {
  if (v instanceof Raw) return v.text;
  if (typeof v === 'string') return writeString(v, style);
  if (Array.isArray(v)) {
    if (v.length === 0) return `[${style.ws()}]`;
    return `[${style.ws()}${v.map((x) => write(x, style)).join(`${style.ws()},${style.ws()}`)}${style.ws()}]`;
  }
  if (v !== null && typeof v === 'object') {
    const entries = Object.entries(v).map(([k, x]) => `${writeString(k, style)}${style.ws()}:${style.ws()}${write(x, style)}`);
    return `{${style.ws()}${entries.join(`${style.ws()},${style.ws()}`)}${style.ws()}}`;
  }
  return JSON.stringify(v) ?? 'null';
}

/** A body as text or bytes, from a random entity, columns, rows, layout and corruption. */
function makeBody(g: Gen): { entity: EntitySpec; bytes: Buffer } {
  const entity = g.pick(ENTITIES);
  const names = entity.columns.map((c) => c.name);
  const required = entity.columns.filter((c) => c.required).map((c) => c.name);
  let columns: unknown;
  const columnsKind = g.rnd();
  if (columnsKind < 0.45) columns = names;
  else if (columnsKind < 0.75) columns = g.shuffle([...required, ...names.filter((n) => !required.includes(n) && g.chance(0.5))]);
  else if (columnsKind < 0.8) columns = [...names, 'bogus'];
  else if (columnsKind < 0.84) columns = [...required, required[0]];
  else if (columnsKind < 0.87) columns = [];
  else if (columnsKind < 0.9) columns = names.filter((n) => !required.includes(n));
  else if (columnsKind < 0.93) columns = [names[0], 5];
  else if (columnsKind < 0.95) columns = g.pick<unknown>(['a', null, { a: 1 }, 7]);
  else columns = names;
  const specs = Array.isArray(columns)
    ? columns.map((n) => entity.columns.find((c) => c.name === n) ?? { name: String(n), type: 'string' as ColumnType, required: false })
    : entity.columns;

  // Now and then more refused rows than an answer lists (ROW_ERRORS_MAX).
  const many = columnsKind < 0.75 && g.chance(0.03);
  const rowCount = many ? 90 + g.int(200) : g.pick([0, 1, 2, 3, 5, 8, 13, 30, 60]);
  const badRate = many ? g.pick([0.5, 0.9, 1]) : g.pick([0, 0, 0, 0.01, 0.05, 0.3]);
  const data: unknown[] = [];
  for (let i = 0; i < rowCount; i++) {
    if (!many && g.chance(badRate / 4)) {
      data.push(g.pick<unknown>([null, 5, 'row', { a: [1] }, true]));
      continue;
    }
    const row = specs.map((s) => cell(g, s.type, s.required, !g.chance(badRate), many));
    if (g.chance(badRate / 3)) row.push('extra');
    if (g.chance(badRate / 3)) row.pop();
    data.push(row);
  }
  // A look-alike written bare (not JSON) in one cell, now and then.
  if (!many && data.length > 0 && g.chance(0.03)) {
    const row = data[g.int(data.length)];
    if (Array.isArray(row) && row.length > 0) row[g.int(row.length)] = new Raw(g.pick(LOOKALIKE_RAW));
  }

  const pretty = g.rnd();
  const style: Style = {
    ws: pretty < 0.5 ? () => '' : pretty < 0.8 ? () => (g.chance(0.3) ? ' ' : '') : () => g.pick(['', ' ', '\n', '\n    ', '\t', ' \r\n ']),
    escapeNonAscii: g.chance(0.2),
    escapeSlash: g.chance(0.1),
    upperHex: g.chance(0.1),
    escapeAscii: g.chance(0.05) ? () => g.chance(0.2) : null,
  };
  const ws = style.ws;
  const key = (k: string) => (g.chance(0.1) ? `"${[...k].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`).join('')}"` : `"${k}"`);
  const field = (k: string, v: unknown) => `${ws()}${key(k)}${ws()}:${ws()}${write(v, style)}${ws()}`;
  const extra = () => field(g.pick(['meta', 'note', 'x']), g.pick<unknown>([null, 'data', { a: [[1], [2]], s: '],[' }, [['],['], [1]], 'columns']));

  const fields: string[] = [];
  const dataFirst = g.chance(0.1);
  if (g.chance(0.1)) fields.push(extra());
  // A repeated `columns` or `data` key is refused (422 `Duplicate key in payload: <key>`)
  // on every path: a few fixed layouts here, random ones below.
  if (!dataFirst && g.chance(0.03)) fields.push(field('columns', ['nope']));
  if (g.chance(0.03)) fields.push(field('data', 'not yet'));
  const hasColumns = !g.chance(0.02);
  const hasData = !g.chance(0.02);
  if (!dataFirst && hasColumns) fields.push(field('columns', columns));
  if (g.chance(0.1)) fields.push(extra());
  if (hasData) fields.push(field('data', data));
  if (dataFirst && hasColumns) fields.push(field('columns', columns));
  if (g.chance(0.15)) fields.push(extra());
  if (!dataFirst && hasColumns && g.chance(0.03)) fields.push(field('columns', columns));
  // Repeats anywhere (before, between, after `data`): the same value, or another one (a
  // misspelt column, other rows, not a list…); now and then both keys, or one three times.
  const repeats = g.chance(0.05) ? g.pick([1, 1, 1, 2, 2, 3]) : 0;
  for (let r = 0; r < repeats; r++) {
    const k = g.pick(['columns', 'data'] as const);
    const same = g.chance(0.4);
    const value = k === 'columns' ? (same ? columns : otherColumns(g, columns)) : same ? data : otherData(g, data);
    fields.splice(g.int(fields.length + 1), 0, field(k, value));
  }
  // Other repeated keys are ignored.
  if (g.chance(0.05)) {
    const k = g.pick(['meta', 'note', 'x']);
    for (let r = 0; r < 2; r++) fields.splice(g.int(fields.length + 1), 0, field(k, g.pick<unknown>([null, 1, 'columns', [['],['], [1]]])));
  }
  let text = `${ws()}{${fields.join(',')}}${ws()}`;
  if (hasData && data.length === 0 && g.chance(0.3)) text = text.replace(/}\s*$/, `,"data":${write(g.chance(0.5) ? [] : [[1]], style)}}`);
  if (g.chance(0.03)) text = write(g.pick<unknown>([[data], null, 'x', 5]), style);

  let bytes = Buffer.from(text);
  if (g.chance(0.05)) bytes = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), bytes]);
  const corrupt = g.rnd();
  if (corrupt < 0.04) bytes = bytes.subarray(0, g.int(bytes.length));
  else if (corrupt < 0.07) bytes = Buffer.concat([bytes, Buffer.from(g.pick(['x', '}', ',', ' ]', '{}', '\n\n', '\u00a0']))]);
  else if (corrupt < 0.1) {
    const at = g.int(bytes.length + 1);
    bytes = Buffer.concat([bytes.subarray(0, at), Buffer.from(g.pick(['"', '\\', ',', ']', '[', '{', 'x', ' ', '\u0000'])), bytes.subarray(at)]);
  } else if (corrupt < 0.12) {
    const at = g.int(bytes.length);
    bytes = Buffer.concat([bytes.subarray(0, at), bytes.subarray(at + 1)]);
  } else if (corrupt < 0.13) {
    bytes = Buffer.from(bytes);
    bytes[g.int(bytes.length)] = g.pick([0xff, 0xc3, 0xed]);
  }
  return { entity, bytes };
}

/** Another value for a repeated `columns` key: the list with a name misspelt, reordered, cut, or no list at all. */
function otherColumns(g: Gen, columns: unknown): unknown {
  const list = Array.isArray(columns) ? [...(columns as unknown[])] : ['catalog_id', 'name'];
  const kind = g.int(5);
  if (kind === 0 && list.length > 0) {
    const at = g.int(list.length);
    const name = String(list[at]);
    const cut = g.int(Math.max(name.length, 1));
    list[at] = name.slice(0, cut) + name.slice(cut + 1); // `sold_at` → `sod_at`
    return list;
  }
  if (kind === 1) return g.shuffle(list);
  if (kind === 2) return list.slice(0, g.int(list.length + 1));
  if (kind === 3) return g.pick<unknown>([['nope'], [], 'columns', null, [1]]);
  return [...list, g.pick(['bogus', 'name', String(list[0])])];
}

/** Another value for a repeated `data` key: fewer or other rows, empty, or no list. */
function otherData(g: Gen, data: unknown[]): unknown {
  const kind = g.int(4);
  if (kind === 0) return data.slice(g.int(data.length + 1));
  if (kind === 1) return [];
  if (kind === 2) return g.pick<unknown>([[[1]], [['a', 'b']], 'not yet', null, [5]]);
  return [...data, ...data.slice(0, 2)];
}

interface Outcome {
  status: number;
  body?: unknown;
  rows?: number;
  stored?: string;
}

const INVALID_JSON: Outcome = { status: 422, body: { detail: 'Invalid JSON format.' } };

/** The stored NDJSON as the values of its lines: each line must be one JSON array on one line. */
function storedValues(bytes: Buffer): string {
  if (!isUtf8(bytes)) return 'stored bytes are not UTF-8';
  const text = bytes.toString('utf8');
  if (text !== '' && !text.endsWith('\n')) return `stored text does not end with a newline: ${JSON.stringify(text.slice(-40))}`;
  const lines = text === '' ? [] : text.slice(0, -1).split('\n');
  return lines
    .map((line) => {
      try {
        const value: unknown = JSON.parse(line);
        return Array.isArray(value) ? JSON.stringify(value) : `not a row: ${line}`;
      } catch {
        return `not JSON: ${line}`;
      }
    })
    .join('\n');
}

/** The plain path: `validateBody` on a copy of the bytes. */
function plain(entity: EntitySpec, bytes: Buffer): Outcome {
  const copy = Buffer.allocUnsafeSlow(bytes.length);
  copy.set(bytes);
  const result = validateBody(copy.buffer as ArrayBuffer, entity.name, BATCH_BYTES);
  if (!result.ok) {
    if (result.kind === 'rows') return { status: 422, body: errors.rowsRefused(result.errors, result.count).body };
    return { status: 422, body: { detail: result.kind === 'payload' ? result.message : result.issues } };
  }
  return { status: 200, rows: result.rows, stored: storedValues(Buffer.from(result.buffer, 0, result.bytes)) };
}

/**
 * The expected answer: steps 1 (JSON) and 1b (a repeated top-level `columns` or `data`
 * key, the first repetition in body order) decided here, with a tokenizer of its own, the
 * later steps by the plain path, which must then not refuse the body for either reason.
 */
function reference(entity: EntitySpec, bytes: Buffer, plainOutcome: Outcome): Outcome {
  if (!isUtf8(bytes)) return INVALID_JSON;
  const text = bytes.toString('utf8', bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf ? 3 : 0);
  try {
    JSON.parse(text);
  } catch {
    return INVALID_JSON;
  }
  const seen = new Set<string>();
  for (const key of topLevelKeys(text)) {
    if (key !== 'columns' && key !== 'data') continue;
    if (seen.has(key)) return { status: 422, body: { detail: `Duplicate key in payload: ${key}` } };
    seen.add(key);
  }
  const detail = (plainOutcome.body as { detail?: unknown } | undefined)?.detail;
  if (typeof detail === 'string' && (detail === 'Invalid JSON format.' || detail.startsWith('Duplicate key'))) {
    return { status: 0, body: { detail: `JSON without a repeated columns or data key must not answer ${detail}` } };
  }
  return plainOutcome;
}

const TOKEN = /[ \t\n\r]*(?:("(?:[^"\\]|\\[^])*")|([{}[\],:])|([^ \t\n\r{}[\],:"]+))/y;

/** The keys of the top-level object of JSON `text`, decoded, in order (none when it is not an object). */
function topLevelKeys(text: string): string[] {
  const keys: string[] = [];
  let depth = 0;
  let previous = '';
  TOKEN.lastIndex = 0;
  for (let m = TOKEN.exec(text); m !== null && m[0] !== ''; m = TOKEN.exec(text)) {
    const [, string, punct] = m;
    if (previous === '' && punct !== '{') return [];
    if (string !== undefined && depth === 1 && (previous === '{' || previous === ',')) keys.push(JSON.parse(string) as string);
    if (punct === '{' || punct === '[') depth++;
    else if (punct === '}' || punct === ']') depth--;
    previous = punct ?? 'value';
  }
  return keys;
}

class MemoryWriter implements PackageWriter {
  readonly batches: Uint8Array[] = [];
  aborted = false;
  async append(batch: Uint8Array): Promise<void> {
    if (batch.byteLength > BATCH_BYTES && Buffer.from(batch).indexOf(0x0a) !== batch.byteLength - 1) throw new Error('batch over batchBytes');
    this.batches.push(batch.slice());
  }
  async commit(): Promise<void> {}
  async abort(): Promise<void> {
    this.aborted = true;
  }
}

/** Feeds `bytes` in random chunks from one reused buffer (as uWS does), mostly honouring back-pressure. */
async function feed(g: Gen, sink: IngestSink, bytes: Buffer): Promise<void> {
  const maxChunk = g.pick([1, 3, 7, 16, 64, 1000, 1 << 20]);
  const reused = new Uint8Array(Math.min(maxChunk, Math.max(bytes.length, 1)));
  let resume: (() => void) | null = null;
  sink.onDrain(() => resume?.());
  const honour = g.chance(0.9);
  for (let at = 0; at < bytes.length; ) {
    const n = Math.min(1 + g.int(maxChunk), bytes.length - at, reused.length);
    reused.set(bytes.subarray(at, at + n));
    at += n;
    const more = sink.write(reused.subarray(0, n));
    reused.fill(0x7b); // uWS reuses the memory: a sink that kept the view sees garbage
    if (!more && honour) await new Promise<void>((r) => (resume = r));
    resume = null;
  }
}

async function streamed(g: Gen, pool: ValidationPool, entity: EntitySpec, bytes: Buffer, gzip = false): Promise<Outcome> {
  const writers: MemoryWriter[] = [];
  const sink = pool.createIngest({
    entity,
    encoding: gzip ? 'gzip' : 'identity',
    open: async () => {
      const w = new MemoryWriter();
      writers.push(w);
      return w;
    },
  });
  await feed(g, sink, bytes);
  try {
    const result = await sink.end();
    if (writers.length !== 1 || result.writer !== writers[0]) throw new Error(`${writers.length} writers opened`);
    return { status: 200, rows: result.rows, stored: storedValues(Buffer.concat(writers[0]!.batches)) };
  } catch (err) {
    if (!isServiceError(err)) throw err;
    if (writers.some((w) => !w.aborted)) throw new Error('a failed ingest left its writer open');
    return { status: err.statusCode, body: err.body };
  }
}

// Tiny pieces so bodies of a few hundred bytes are cut many times; a tiny head limit sends some heads to the one-shot path.
const SHAPES = [
  { workers: 1, maxQueue: 64, batchBytes: BATCH_BYTES, pieceBytes: 8, piecesPerRequest: 3, poolPieces: 4 },
  { workers: 1, maxQueue: 64, batchBytes: BATCH_BYTES, pieceBytes: 64, piecesPerRequest: 1 },
  { workers: 1, maxQueue: 64, batchBytes: BATCH_BYTES, pieceBytes: 300, headBytes: 120 },
  { workers: 1, maxQueue: 64, batchBytes: BATCH_BYTES, pieceBytes: 2048, piecesPerRequest: 2 },
];
/** Each shape twice: with the row scanner (the fast path) and without (the reference path). */
const pools = SHAPES.map((shape) => new ValidationPool(shape));
const referencePools = SHAPES.map((shape) => new ValidationPool({ ...shape, rowScanner: false }));
t.teardown(() => Promise.all([...pools, ...referencePools].map((p) => p.destroy())));

/** What the corpus held, so that a generator change cannot quietly stop covering a case. */
const seen = { catalogOrder: 0, otherOrder: 0, manyRefused: 0, entities: new Set<string>() };

function note(entity: EntitySpec, expected: Outcome, bytes: Buffer): void {
  seen.entities.add(entity.name);
  const body = expected.body as { error_count?: number } | undefined;
  if ((body?.error_count ?? 0) > 100) seen.manyRefused++;
  if (expected.status !== 200) return;
  // The columns of an accepted body, as the reference reads them.
  const columns = (JSON.parse(bytes.toString('utf8').replace(/^\uFEFF/, '')) as { columns: string[] }).columns;
  if (columns.join() === entity.columns.map((c) => c.name).join()) seen.catalogOrder++;
  else seen.otherOrder++;
}

async function run(t: Test, count: number, stream: Stream): Promise<void> {
  const gzip = stream === Stream.Gzip;
  const indexes = ONLY ?? Array.from({ length: count }, (_, i) => i);
  let failures = 0;
  let next = 0;
  const statuses = new Map<number, number>();
  const repeated = new Map<string, number>();
  const worker = async () => {
    while (next < indexes.length && failures < 5) {
      const i = indexes[next++]!;
      // Everything random about body i comes from its own generator, in one fixed order.
      const g = new Gen(mulberry32(bodySeed(SEED, stream, i)));
      const body = makeBody(g);
      const pool = pools[i % pools.length]!;
      const referencePool = referencePools[i % pools.length]!;
      let input = body.bytes;
      let inflated: Buffer | null = body.bytes;
      if (gzip) {
        input = gzipSync(body.bytes, { level: 1 });
        if (g.chance(0.1)) input = input.subarray(0, g.int(input.length));
        else if (g.chance(0.05)) input = Buffer.concat([input, Buffer.from('junk')]);
        try {
          inflated = gunzipSync(input);
        } catch {
          inflated = null;
        }
      }
      const plainOutcome = inflated ? plain(body.entity, inflated) : INVALID_JSON;
      const expected = inflated ? reference(body.entity, inflated, plainOutcome) : INVALID_JSON;
      // The reference path's chunks come from a generator of their own: body i's other choices stay as they were.
      const chunks = new Gen(mulberry32(bodySeed(SEED, stream, i) ^ 0x5bd1e995));
      const [actual, referenceOutcome] = await Promise.all([
        streamed(g, pool, body.entity, input, gzip),
        streamed(chunks, referencePool, body.entity, input, gzip),
      ]);
      statuses.set(expected.status, (statuses.get(expected.status) ?? 0) + 1);
      if (inflated && expected.status !== 0) note(body.entity, expected, inflated);
      const detail = (expected.body as { detail?: unknown } | undefined)?.detail;
      if (typeof detail === 'string' && detail.startsWith('Duplicate key')) repeated.set(detail, (repeated.get(detail) ?? 0) + 1);
      const where = `body ${i} (rerun: DIFF_SEED=${SEED} DIFF_ONLY=${i}; ${gzip ? 'gzip, ' : ''}pool ${i % pools.length}, ${body.entity.name})`;
      if (ONLY) {
        t.comment(
          `${where}: ${JSON.stringify(body.bytes.toString('latin1'))}\nexpected  ${JSON.stringify(expected)}\nplain     ${JSON.stringify(plainOutcome)}\n` +
            `fast      ${JSON.stringify(actual)}\nreference ${JSON.stringify(referenceOutcome)}`,
        );
      }
      const shown = JSON.stringify(body.bytes.toString('latin1')).slice(0, 2000);
      if (JSON.stringify(plainOutcome) !== JSON.stringify(expected)) {
        failures++;
        t.same(plainOutcome, expected, `plain path, ${where}: ${shown}`);
      }
      if (JSON.stringify(actual) !== JSON.stringify(expected)) {
        failures++;
        t.same(actual, expected, `fast path, ${where}: ${shown}`);
      }
      if (JSON.stringify(referenceOutcome) !== JSON.stringify(expected)) {
        failures++;
        t.same(referenceOutcome, expected, `reference path, ${where}: ${shown}`);
      }
    }
  };
  await Promise.all(Array.from({ length: 6 }, worker));
  const summary = [...statuses].map(([s, n]) => `${n}×${s}`).join(', ');
  const repeats = [...repeated].map(([d, n]) => `${n}× ${d.slice('Duplicate key in payload: '.length)}`).join(', ');
  t.equal(failures, 0, `${indexes.length} bodies agree (${summary}; repeated keys: ${repeats || 'none'})`);
  if (ONLY) return;
  t.ok((statuses.get(200) ?? 0) > count / 10 && (statuses.get(422) ?? 0) > count / 10, 'both accepted and refused bodies were generated');
  const least = Math.min(repeated.get('Duplicate key in payload: columns') ?? 0, repeated.get('Duplicate key in payload: data') ?? 0);
  t.ok(least > count / 50, 'bodies repeating `columns` and bodies repeating `data` were generated');
}

t.test('streamed answers equal the plain parse-then-validate', (t) => run(t, BODIES, Stream.Plain));

t.test('gzip bodies: the same answers as inflate-then-validate', (t) => run(t, Math.ceil(BODIES / 10), Stream.Gzip));

t.test('the corpus covered every entity, both column orders and packages with over 100 refused rows', { skip: ONLY ? 'DIFF_ONLY runs a few bodies' : false }, async (t) => {
  t.same([...seen.entities].sort(), ENTITIES.map((e) => e.name).sort(), 'every entity');
  t.ok(seen.catalogOrder > BODIES / 50 && seen.otherOrder > BODIES / 50, `accepted bodies in catalog order (${seen.catalogOrder}) and in another (${seen.otherOrder})`);
  t.ok(seen.manyRefused > BODIES / 500, `${seen.manyRefused} packages with more than 100 refused rows`);
});

t.test('the fast path answered most pieces; the reference pools never used it', { skip: ONLY ? 'DIFF_ONLY runs a few bodies' : false }, async (t) => {
  // Pieces of 8 bytes are mostly carries (the reference completes a row a cut split); pieces of 2 KiB mostly whole.
  const share = [0.05, 0.1, 0.15, 0.4];
  for (const [k, pool] of pools.entries()) {
    t.ok(pool.stats.scanned > pool.stats.pieces * share[k]!, `shape ${k}: ${pool.stats.scanned} of ${pool.stats.pieces} pieces by the scanner`);
    t.equal(referencePools[k]!.stats.scanned, 0, `shape ${k}: the reference pool scanned none`);
  }
});

t.test('every pool cut bodies into pieces and repaired wrong cuts', { skip: ONLY ? 'DIFF_ONLY runs a few bodies' : false }, async (t) => {
  for (const pool of [...pools, ...referencePools]) {
    t.ok(pool.stats.pieces > BODIES / 6, `pieces: ${pool.stats.pieces}`);
    t.ok(pool.stats.continuations > 10, `continuations: ${pool.stats.continuations}`);
    t.ok(pool.stats.oneShots > 10, `one-shots: ${pool.stats.oneShots}`);
  }
});
