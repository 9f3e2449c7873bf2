/**
 * Validation of an ingest body against an entity of the catalog, in the check order of
 * docs/api.md, Ingest payload (the first failing check answers):
 *
 * 1. not JSON: `Invalid JSON format.` (the caller parses; see `INVALID_JSON`)
 * 1b. a repeated top-level `columns` or `data` key: `repeatedKey`, `duplicateKeyMessage`
 * 2. shape of `{columns: string[], data: unknown[][]}`: `bodyIssue`, one Pydantic v2 issue
 * 3–6. the column list: `columnsError`
 * 7. every row, in order: the checker returned by `compileRowCheck`
 *
 * Messages never echo more than 100 characters of one client string, and never a row.
 */
import typia, { type tags } from 'typia';
import type { ValidationIssue } from '../errors.js';
import { ENTITIES, TYPE_LABELS, type ColumnType, type EntitySpec } from './catalog.js';
import { isCalendarDate } from './dates.js';

export const INVALID_JSON = 'Invalid JSON format.';

/** The 422 detail of a repeated top-level `columns` or `data` key (see `repeatedKey`). */
export function duplicateKeyMessage(key: RepeatedKey): string {
  return `Duplicate key in payload: ${key}`;
}

export type RepeatedKey = 'columns' | 'data';

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
/** `\uXXXX` for each of the 7 letters of `columns`: no longer spelling of a key we look for. */
const KEY_TEXT_MAX = 42;
const COLUMNS_TEXT = 'columns';
const DATA_TEXT = 'data';

/**
 * Step 1b, on text that passed step 1 (it is JSON): the first member of the top-level
 * object whose key, escapes decoded, is `columns` or `data` and was already a key of an
 * earlier member, in body order. `JSON.parse` would silently keep the last one; the
 * service refuses the body instead (docs/api.md, API decisions), so that an answer never
 * depends on which of two values a reader keeps. Other repeated keys are not reported;
 * keys of nested objects never count; a body that is not an object has none.
 *
 * Linear: strings are skipped with `indexOf`, a key is decoded only when it is short
 * enough to spell one of the two names. `from` skips a byte order mark.
 */
export function repeatedKey(text: Uint8Array, from = 0): RepeatedKey | null {
  const n = text.length;
  let i = from;
  while (i < n && isJsonSpace(text[i]!)) i++;
  if (text[i] !== 0x7b) return null;
  let columns = false;
  let data = false;
  let depth = 0;
  let keyNext = false;
  for (; i < n; i++) {
    const b = text[i]!;
    if (b === QUOTE) {
      const start = i + 1;
      let end = start;
      for (;;) {
        end = text.indexOf(QUOTE, end);
        if (end < 0) return null; // not JSON after all: step 1 answers
        let slashes = 0;
        while (text[end - 1 - slashes] === BACKSLASH) slashes++;
        if (slashes % 2 === 0) break;
        end++;
      }
      if (keyNext) {
        keyNext = false;
        const key = keyName(text, start, end);
        if (key === COLUMNS_TEXT) {
          if (columns) return 'columns';
          columns = true;
        } else if (key === DATA_TEXT) {
          if (data) return 'data';
          data = true;
        }
      }
      i = end;
    } else if (b === 0x7b || b === 0x5b) {
      depth++;
      keyNext = depth === 1;
    } else if (b === 0x7d || b === 0x5d) {
      depth--;
    } else if (b === 0x2c && depth === 1) {
      keyNext = true;
    }
  }
  return null;
}

/** The key `text[start, end)` (between its quotes) decoded, or null when it cannot be `columns` or `data`. */
function keyName(text: Uint8Array, start: number, end: number): string | null {
  const length = end - start;
  if (length > KEY_TEXT_MAX || length < DATA_TEXT.length) return null;
  let escaped = false;
  let raw = '';
  for (let k = start; k < end; k++) {
    const c = text[k]!;
    if (c === BACKSLASH) escaped = true;
    raw += String.fromCharCode(c);
  }
  if (!escaped) return raw;
  try {
    // Only ASCII decodes to either name; any other byte makes the result something else.
    return JSON.parse(`"${raw}"`) as string;
  } catch {
    return null;
  }
}

const isJsonSpace = (b: number) => b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09;

// typia leaves `number` unchecked for Infinity (its `finite` option is off in our
// tsconfig), so finiteness and integrality are tags that expand to the global checks.
type Finite = tags.TagBase<{ target: 'number'; kind: 'finite'; value: undefined; validate: 'Number.isFinite($input)' }>;
type Integer = tags.TagBase<{ target: 'number'; kind: 'integer'; value: undefined; validate: 'Number.isInteger($input)' }>;

/**
 * The TypeScript type of a non-null cell of each column type. `date` and `datetime` are
 * plain strings here and checked by `isCalendarDate`/`isDateTime` afterwards: typia's
 * `Format<"date">` accepts 2024-02-31.
 *
 * Every check must give the same answer for a string parsed from Latin-1 text as from the
 * UTF-8 text of the same bytes (the workers parse Latin-1 first, see `workers/rows.ts`): types,
 * emptiness and patterns of ASCII characters only; no lengths or patterns that count or
 * accept non-ASCII characters (`test/unit/latin1-checks.test.ts` holds them to it).
 */
interface Cell {
  string: string;
  id: string & tags.MinLength<1>;
  number: number & Finite;
  nonNegativeNumber: number & Finite & tags.Minimum<0>;
  integer: number & Integer;
  positiveInteger: number & Integer & tags.Minimum<1>;
  boolean: boolean;
  date: string;
  datetime: string;
}

type Check = (value: unknown) => boolean;

const isString = typia.createIs<Cell['string']>();

const IS: Readonly<Record<ColumnType, Check>> = {
  string: isString,
  id: typia.createIs<Cell['id']>(),
  number: typia.createIs<Cell['number']>(),
  nonNegativeNumber: typia.createIs<Cell['nonNegativeNumber']>(),
  integer: typia.createIs<Cell['integer']>(),
  positiveInteger: typia.createIs<Cell['positiveInteger']>(),
  boolean: typia.createIs<Cell['boolean']>(),
  date: (v) => isString(v) && isCalendarDate(v),
  datetime: (v) => isString(v) && isDateTime(v),
};

/**
 * Whole-row validators for rows in catalog column order, keyed by entity name. They
 * skip the calendar checks of date/datetime columns, which `compileRowCheck` adds.
 * An entity without an entry here is simply validated column by column.
 */
const TUPLES: Readonly<Record<string, Check>> = {
  stores: typia.createIs<[Cell['id'], Cell['string'], Cell['string'] | null, Cell['date'] | null]>(),
  catalogs: typia.createIs<[Cell['id'], Cell['string'], Cell['id'] | null]>(),
  products: typia.createIs<
    [
      Cell['id'],
      Cell['string'],
      Cell['id'] | null,
      Cell['string'] | null,
      Cell['string'] | null,
      Cell['nonNegativeNumber'] | null,
      Cell['boolean'] | null,
    ]
  >(),
  stock: typia.createIs<[Cell['id'], Cell['id'], Cell['date'], Cell['number']]>(),
  receipts: typia.createIs<[Cell['id'], Cell['id'], Cell['datetime'], Cell['number']]>(),
  receipt_lines: typia.createIs<
    [Cell['id'], Cell['positiveInteger'], Cell['id'], Cell['number'], Cell['number'], Cell['number'] | null]
  >(),
};

// Keyed by the catalog's own objects: a look-alike EntitySpec never gets a tuple that
// may not match its columns.
const TUPLE_OF = new Map<EntitySpec, Check>();
for (const entity of ENTITIES) {
  const tuple = TUPLES[entity.name];
  if (tuple) TUPLE_OF.set(entity, tuple);
}

/** A row's 422 detail (`Invalid data types in payload: …`), or null when the row is valid. */
export type RowCheck = (row: readonly unknown[], index: number) => string | null;

/**
 * What is wrong with a row, without its index: the part of the 422 detail after
 * `row <index>` (`: expected 4 values, got 5` or `, column "price": …`), or null when the
 * row is valid. Validation workers see a piece of the rows and report local indexes; the
 * main thread adds the global index with `rowMessage`.
 */
export type RowProblem = (row: readonly unknown[]) => string | null;

const TYPES_PREFIX = 'Invalid data types in payload: ';

/** The 422 detail of the row at `index` (0-based, of the whole `data` array). */
export function rowMessage(index: number, problem: string): string {
  return `${TYPES_PREFIX}row ${index}${problem}`;
}

/**
 * Compiles the checker for one request. `columns` must have passed `columnsError`.
 * Columns in exactly the catalog order take the typia tuple fast path; the column-by-column
 * path then only runs for a rejected row, to name the offending cell.
 */
export function compileRowCheck(entity: EntitySpec, columns: readonly string[]): RowCheck {
  const problem = compileRowProblem(entity, columns);
  return (row, index) => {
    const found = problem(row);
    return found === null ? null : rowMessage(index, found);
  };
}

/** `compileRowCheck` without the index: see `RowProblem`. */
export function compileRowProblem(entity: EntitySpec, columns: readonly string[]): RowProblem {
  const specs = columns.map((name) => {
    const spec = entity.columns.find((c) => c.name === name);
    if (!spec) throw new TypeError(`Column ${name} is not in entity ${entity.name}`);
    return spec;
  });
  const checks = specs.map(({ type, required }): Check => {
    const is = IS[type];
    return required ? is : (v) => v === null || is(v);
  });
  const width = columns.length;

  const slow: RowProblem = (row) => {
    if (row.length !== width) return `: expected ${width} values, got ${row.length}`;
    for (let j = 0; j < width; j++) {
      const value = row[j];
      if (!checks[j]!(value)) {
        const { name, type } = specs[j]!;
        return `, column "${name}": expected ${TYPE_LABELS[type].expected}, got ${show(value)}`;
      }
    }
    return null;
  };

  const tuple = TUPLE_OF.get(entity);
  if (!tuple || width !== entity.columns.length || specs.some((s, j) => s !== entity.columns[j])) return slow;
  const calendar = specs.flatMap((s, j) => (s.type === 'date' || s.type === 'datetime' ? [j] : []));
  if (calendar.length === 0) return (row) => (tuple(row) ? null : slow(row));
  return (row) => (tuple(row) && calendar.every((j) => checks[j]!(row[j])) ? null : slow(row));
}

/**
 * Step 2: the first structural problem of a parsed body, as Pydantic v2 reports it for
 * `{columns: list[str], data: list[list[Any]]}` (fields in that order, whatever the key
 * order of the body). `input` is the offending value only when it is a scalar.
 */
export function bodyIssue(body: unknown): ValidationIssue | null {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    return issue('model_attributes_type', ['body'], 'Input should be a valid dictionary or object to extract fields from', body);
  }
  const fields = body as Record<string, unknown>;
  if (!Object.hasOwn(fields, 'columns')) return issue('missing', ['body', 'columns'], 'Field required', null);
  const { columns } = fields;
  if (!Array.isArray(columns)) return listIssue(['body', 'columns'], columns);
  for (let i = 0; i < columns.length; i++) {
    if (typeof columns[i] !== 'string') {
      return issue('string_type', ['body', 'columns', i], 'Input should be a valid string', columns[i]);
    }
  }
  if (!Object.hasOwn(fields, 'data')) return issue('missing', ['body', 'data'], 'Field required', null);
  const { data } = fields;
  if (!Array.isArray(data)) return listIssue(['body', 'data'], data);
  for (let i = 0; i < data.length; i++) {
    if (!Array.isArray(data[i])) return listIssue(['body', 'data', i], data[i]);
  }
  return null;
}

/**
 * Steps 3–6, on a column list that passed `bodyIssue`: empty, duplicate (the first name
 * seen twice), unknown (the first in the client's order), missing required (catalog order).
 */
export function columnsError(entity: EntitySpec, columns: readonly string[]): string | null {
  if (columns.length === 0) return 'The columns array cannot be empty.';
  const seen = new Set<string>();
  for (const name of columns) {
    if (seen.has(name)) return `Duplicate column: ${clip(name)}`;
    seen.add(name);
  }
  const known = new Set(entity.columns.map((c) => c.name));
  for (const name of columns) if (!known.has(name)) return `Unknown column: ${clip(name)}`;
  const missing = entity.columns.filter((c) => c.required && !seen.has(c.name)).map((c) => c.name);
  return missing.length > 0 ? `Missing required columns: ${missing.join(', ')}` : null;
}

/**
 * RFC 3339 `date-time`: `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`, `T`/`Z` in either case,
 * a real calendar date and time of day. Leap seconds (`:60`) are refused: neither JS
 * `Date` nor most stores downstream can hold them.
 */
export function isDateTime(s: string): boolean {
  if (s.length < 20 || (s[10] !== 'T' && s[10] !== 't') || !isCalendarDate(s.slice(0, 10)) || !isTimeAt(s, 11)) {
    return false;
  }
  const second = num(s, 17, 2);
  if (s[16] !== ':' || second < 0 || second > 59) return false;
  let i = 19;
  if (s[i] === '.') {
    const start = ++i;
    while (i < s.length && isDigit(s.charCodeAt(i))) i++;
    if (i === start) return false;
  }
  if (i === s.length - 1) return s[i] === 'Z' || s[i] === 'z';
  return i === s.length - 6 && (s[i] === '+' || s[i] === '-') && isTimeAt(s, i + 1);
}

/** `HH:MM` at `at`, a valid hour and minute. */
function isTimeAt(s: string, at: number): boolean {
  const hour = num(s, at, 2);
  const minute = num(s, at + 3, 2);
  return s[at + 2] === ':' && hour >= 0 && hour <= 23 && minute >= 0 && minute <= 59;
}

/** The decimal value of `length` ASCII digits at `at`, or -1 (never a valid field) otherwise. */
function num(s: string, at: number, length: number): number {
  let value = 0;
  for (let i = at; i < at + length; i++) {
    const code = s.charCodeAt(i); // NaN past the end
    if (!isDigit(code)) return -1;
    value = value * 10 + code - 48;
  }
  return value;
}

const isDigit = (code: number) => code >= 48 && code <= 57;

const CLIP = 100;

/** At most 100 UTF-16 units of `s` (never half a surrogate pair), `…` when cut. */
function clip(s: string): string {
  if (s.length <= CLIP) return s;
  const end = s.charCodeAt(CLIP - 1) >= 0xd800 && s.charCodeAt(CLIP - 1) <= 0xdbff ? CLIP - 1 : CLIP;
  return `${s.slice(0, end)}…`;
}

/** A cell value as shown after `got` in a 422 detail. */
function show(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(clip(value));
  // JSON.stringify would print Infinity (from e.g. 1e400) as null and -0 as 0.
  if (typeof value === 'number') return Object.is(value, -0) ? '-0' : String(value);
  if (typeof value !== 'object' || value === null) return String(value);
  let json: string;
  try {
    json = JSON.stringify(value);
  } catch {
    return Array.isArray(value) ? 'array' : 'object';
  }
  return clip(json);
}

function issue(type: string, loc: (string | number)[], msg: string, input: unknown): ValidationIssue {
  return { type, loc, msg, input: scalarInput(input) };
}

/**
 * Step 2 for one element of `data` that is not a list, as `bodyIssue` reports it. A worker
 * that found it passes `rowNotListInput(value)` (never the value itself: it may be large),
 * the main thread the global index.
 */
export function rowNotListIssue(index: number, input: unknown): ValidationIssue {
  return { type: 'list_type', loc: ['body', 'data', index], msg: 'Input should be a valid list', input };
}

/** The `input` of `rowNotListIssue` for a `data` element. */
export function rowNotListInput(value: unknown): unknown {
  return scalarInput(value);
}

function listIssue(loc: (string | number)[], input: unknown): ValidationIssue {
  return issue('list_type', loc, 'Input should be a valid list', input);
}

function scalarInput(value: unknown): unknown {
  if (typeof value === 'string') return clip(value);
  return typeof value === 'object' ? null : value;
}
