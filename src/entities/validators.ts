/**
 * Validation of an ingest body against an entity of the catalog, in the check order of
 * docs/api.md, Ingest payload (the first failing check answers):
 *
 * 1. not JSON: `Invalid JSON format.` (the caller parses; see `INVALID_JSON`)
 * 1b. a repeated top-level `columns` or `data` key: `duplicateKeyMessage` (the bytes are scanned
 *     for it by `repeatedKey`, src/validation/repeated-key.ts)
 * 2. shape of `{columns: string[], data: unknown[][]}`: `bodyIssue`, one Pydantic v2 issue
 * 3–6. the column list: `columnsError`
 * 7. every row, in order: the checker returned by `compileRowProblem` (every bad value of
 *    every row is counted, see `ROW_ERRORS_MAX` in errors.ts); `cellRules` gives the byte-level row scanner
 *    (src/validation/row-scanner.ts) the same rules, from typia's schema of the same types
 *
 * Messages never echo more than 100 characters of one client string, and never a row.
 */
import typia, { type tags } from 'typia';
import { rowDetail, type RowFault, type ValidationIssue } from '../errors.js';
import { ENTITIES, TYPE_LABELS, type ColumnType, type EntitySpec } from './catalog.js';
import { isCalendarDate } from './dates.js';

export const INVALID_JSON = 'Invalid JSON format.';

/** The 422 detail of a repeated top-level `columns` or `data` key (see `repeatedKey` in validation/repeated-key.ts). */
export function duplicateKeyMessage(key: RepeatedKey): string {
  return `Duplicate key in payload: ${key}`;
}

export type RepeatedKey = 'columns' | 'data';

// typia leaves `number` unchecked for Infinity (its `finite` option is off in our
// tsconfig), so finiteness and integrality are tags that expand to the global checks. Their
// `schema` is what `typia.json.schemas` says of them: the byte-level row scanner
// (`validation/row-scanner.ts`) is generated from that output (see `CELL_RULES`).
type Finite = tags.TagBase<{ target: 'number'; kind: 'finite'; value: undefined; validate: 'Number.isFinite($input)'; exclusive: false; schema: { 'x-finite': true } }>;
/** docs/api.md, "API decisions": an `integer` is a whole number within ±(2^53 − 1); `9007199254740993` is refused, not rounded. */
type SafeInteger = tags.TagBase<{
  target: 'number';
  kind: 'safeInteger';
  value: undefined;
  validate: 'Number.isSafeInteger($input)';
  exclusive: false;
  schema: { type: 'integer'; minimum: -9007199254740991; maximum: 9007199254740991 };
}>;
/**
 * The calendar checks of `date` and `datetime` are `isCalendarDate`/`isDateTime`, run after
 * the typia check (typia's own `Format<"date">` accepts 2024-02-31): these tags only name the
 * format in the schema, for the scanner.
 */
type CalendarDate = tags.TagBase<{ target: 'string'; kind: 'calendarDate'; value: undefined; validate: 'true'; exclusive: false; schema: { format: 'date' } }>;
type DateTime = tags.TagBase<{ target: 'string'; kind: 'dateTime'; value: undefined; validate: 'true'; exclusive: false; schema: { format: 'date-time' } }>;

/**
 * The TypeScript type of a non-null cell of each column type. `date` and `datetime` are
 * plain strings to typia and checked by `isCalendarDate`/`isDateTime` afterwards.
 *
 * Every check must give the same answer for a string parsed from Latin-1 text as from the
 * UTF-8 text of the same bytes (the reference path parses Latin-1 first, see `validation/rows.ts`):
 * types, emptiness and patterns of ASCII characters only; no lengths or patterns that count or
 * accept non-ASCII characters (`test/unit/latin1-checks.test.ts` holds them to it).
 */
interface Cell {
  string: string;
  id: string & tags.MinLength<1>;
  number: number & Finite;
  nonNegativeNumber: number & Finite & tags.Minimum<0>;
  integer: number & SafeInteger;
  positiveInteger: number & SafeInteger & tags.Minimum<1>;
  boolean: boolean;
  date: string & CalendarDate;
  datetime: string & DateTime;
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

/** Rows of each entity in catalog column order: the typia types everything else derives from. */
type StoresRow = [Cell['id'], Cell['string'], Cell['string'] | null, Cell['date'] | null];
type CatalogsRow = [Cell['id'], Cell['string'], Cell['id'] | null];
type ProductsRow = [Cell['id'], Cell['string'], Cell['id'] | null, Cell['string'] | null, Cell['string'] | null, Cell['nonNegativeNumber'] | null, Cell['boolean'] | null];
type StockRow = [Cell['id'], Cell['id'], Cell['date'], Cell['number']];
type ReceiptsRow = [Cell['id'], Cell['id'], Cell['datetime'], Cell['number']];
type ReceiptLinesRow = [Cell['id'], Cell['positiveInteger'], Cell['id'], Cell['number'], Cell['number'], Cell['number'] | null];

/**
 * Whole-row validators for rows in catalog column order, keyed by entity name. They
 * skip the calendar checks of date/datetime columns, which `compileRowCheck` adds.
 * An entity without an entry here is simply validated column by column.
 */
const TUPLES: Readonly<Record<string, Check>> = {
  stores: typia.createIs<StoresRow>(),
  catalogs: typia.createIs<CatalogsRow>(),
  products: typia.createIs<ProductsRow>(),
  stock: typia.createIs<StockRow>(),
  receipts: typia.createIs<ReceiptsRow>(),
  receipt_lines: typia.createIs<ReceiptLinesRow>(),
};

/** The same row types as JSON Schema (typia's output, OpenAPI 3.1: tuples as `prefixItems`), in `SCHEMA_ORDER`. */
const SCHEMAS = typia.json.schemas<[StoresRow, CatalogsRow, ProductsRow, StockRow, ReceiptsRow, ReceiptLinesRow]>();
const SCHEMA_ORDER = ['stores', 'catalogs', 'products', 'stock', 'receipts', 'receipt_lines'];

// Keyed by the catalog's own objects: a look-alike EntitySpec never gets a tuple that
// may not match its columns.
const TUPLE_OF = new Map<EntitySpec, Check>();
for (const entity of ENTITIES) {
  const tuple = TUPLES[entity.name];
  if (tuple) TUPLE_OF.set(entity, tuple);
}

/**
 * What a byte-level scanner must check of one cell, read off typia's JSON Schema of the
 * entity's row (so typia stays the one source of the types): the JSON type, `null` allowed,
 * and the bounds the catalog uses. A schema with anything else gives no rules (see
 * `cellRules`), and the entity is validated on the reference path only.
 */
export interface CellRule {
  type: 'string' | 'number' | 'integer' | 'boolean';
  nullable: boolean;
  /** Strings: 0 or 1 (non-empty). */
  minLength: number;
  /** Strings: a calendar date or an RFC 3339 datetime (checked as `isCalendarDate`/`isDateTime` do). */
  format: 'date' | 'date-time' | null;
  /** Numbers: `Number.isFinite`. Integers are finite by `Number.isSafeInteger`. */
  finite: boolean;
  minimum: number | null;
  maximum: number | null;
}

const RULE_KEYS = new Set(['type', 'minLength', 'format', 'x-finite', 'minimum', 'maximum']);
const CELL_RULES = new Map<EntitySpec, readonly CellRule[] | null>();
for (const entity of ENTITIES) {
  const items = rowSchema(SCHEMA_ORDER.indexOf(entity.name))?.prefixItems;
  const rules = Array.isArray(items) && items.length === entity.columns.length ? items.map(cellRule) : null;
  CELL_RULES.set(entity, rules && rules.every((r): r is CellRule => r !== null) ? rules : null);
}

/** The row schema at `index` of `SCHEMAS`, its `$ref` (named types go to `components`) followed. */
function rowSchema(index: number): { prefixItems?: unknown } | undefined {
  const schema = SCHEMAS.schemas[index] as { $ref?: string; prefixItems?: unknown } | undefined;
  const ref = schema?.$ref;
  if (ref === undefined) return schema;
  const components = SCHEMAS.components.schemas as Record<string, { prefixItems?: unknown }> | undefined;
  return ref.startsWith('#/components/schemas/') ? components?.[ref.slice('#/components/schemas/'.length)] : undefined;
}

/** The rule of each of `columns` (names of the catalog entity), or null when the entity has no byte-level rules. */
export function cellRules(entity: EntitySpec, columns: readonly string[]): CellRule[] | null {
  const rules = CELL_RULES.get(entity);
  if (!rules) return null;
  const out: CellRule[] = [];
  for (const name of columns) {
    const at = entity.columns.findIndex((c) => c.name === name);
    if (at < 0) return null;
    out.push(rules[at]!);
  }
  return out;
}

/** One `prefixItems` entry as a rule, or null for anything the scanner does not know to check. */
function cellRule(item: unknown): CellRule | null {
  let schema = item as Record<string, unknown>;
  let nullable = false;
  if (Array.isArray(schema.oneOf)) {
    const variants = schema.oneOf as Record<string, unknown>[];
    const others = variants.filter((v) => v.type !== 'null');
    if (variants.length !== 2 || others.length !== 1) return null;
    nullable = true;
    schema = others[0]!;
  }
  if (Object.keys(schema).some((k) => !RULE_KEYS.has(k))) return null;
  const { type, minLength = 0, format = null, minimum = null, maximum = null } = schema;
  const rule: CellRule = {
    type: type as CellRule['type'],
    nullable,
    minLength: minLength as number,
    format: format as CellRule['format'],
    finite: schema['x-finite'] === true,
    minimum: minimum as number | null,
    maximum: maximum as number | null,
  };
  if (rule.type === 'string') {
    const plain = rule.minimum === null && rule.maximum === null && !rule.finite;
    return plain && (rule.minLength === 0 || rule.minLength === 1) && (rule.format === null || rule.format === 'date' || rule.format === 'date-time') ? rule : null;
  }
  if (rule.minLength !== 0 || rule.format !== null) return null;
  if (rule.type === 'boolean') return rule.minimum === null && rule.maximum === null && !rule.finite ? rule : null;
  if (rule.type === 'integer') {
    // Only the safe-integer tag makes `integer`: its bounds must still be there.
    const safe = (rule.minimum ?? -Infinity) >= -Number.MAX_SAFE_INTEGER && (rule.maximum ?? Infinity) <= Number.MAX_SAFE_INTEGER;
    return safe && rule.maximum !== null ? rule : null;
  }
  return rule.type === 'number' && rule.finite && rule.maximum === null ? rule : null;
}

/** A row's 422 detail (`Invalid data types in payload: …`), or null when the row is valid. */
export type RowCheck = (row: readonly unknown[], index: number) => string | null;

/**
 * What is wrong with a row, without its index: every bad value, in the client's column order
 * (`{column, message}`, e.g. `expected number >= 0, got "abc"`), or one fault with column
 * null for a row of the wrong length (`expected 4 values, got 5`: its values cannot be
 * matched to columns); null when the row is valid. Validation workers see a piece of the
 * rows and report local indexes; the main thread adds the global index.
 */
export type RowProblem = (row: readonly unknown[]) => RowFault[] | null;

/**
 * Compiles the checker for one request, answering with the row's first fault (the 422's
 * `detail`; see `compileRowProblem` for all of them). `columns` must have passed
 * `columnsError`.
 */
export function compileRowCheck(entity: EntitySpec, columns: readonly string[]): RowCheck {
  const problem = compileRowProblem(entity, columns);
  return (row, index) => {
    const found = problem(row);
    return found === null ? null : rowDetail({ row: index, ...found[0]! });
  };
}

/** `compileRowCheck` without the index: see `RowProblem`. */
export function compileRowProblem(entity: EntitySpec, columns: readonly string[]): RowProblem {
  const { specs, checks, width, valid } = rowChecks(entity, columns);
  const slow: RowProblem = (row) => {
    if (row.length !== width) return [{ column: null, message: `expected ${width} values, got ${row.length}` }];
    let faults: RowFault[] | null = null;
    for (let j = 0; j < width; j++) {
      const value = row[j];
      if (!checks[j]!(value)) {
        const { name, type } = specs[j]!;
        (faults ??= []).push({ column: name, message: `expected ${TYPE_LABELS[type].expected}, got ${show(value)}` });
      }
    }
    return faults;
  };
  return valid === null ? slow : (row) => (valid(row) ? null : slow(row));
}

/** How many errors a row has (0: valid), as `RowProblem` would list them, without making their messages. */
export type RowErrorCount = (row: readonly unknown[]) => number;

/**
 * `compileRowProblem`'s count alone: for the rows past the ones an answer describes (at
 * most `ROW_ERRORS_MAX`), so a refused package costs about what an accepted one does.
 */
export function compileRowErrorCount(entity: EntitySpec, columns: readonly string[]): RowErrorCount {
  const { checks, width, valid } = rowChecks(entity, columns);
  const count: RowErrorCount = (row) => {
    if (row.length !== width) return 1;
    let n = 0;
    for (let j = 0; j < width; j++) if (!checks[j]!(row[j])) n++;
    return n;
  };
  return valid === null ? count : (row) => (valid(row) ? 0 : count(row));
}

/**
 * The per-column checks of `columns` (client order), and, for columns in exactly the catalog
 * order, the typia tuple fast path (`valid`, null otherwise), so the column-by-column path
 * only runs for a rejected row, to name or count every offending cell.
 */
function rowChecks(entity: EntitySpec, columns: readonly string[]) {
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
  const tuple = TUPLE_OF.get(entity);
  let valid: ((row: readonly unknown[]) => boolean) | null = null;
  if (tuple && width === entity.columns.length && specs.every((s, j) => s === entity.columns[j])) {
    const calendar = specs.flatMap((s, j) => (s.type === 'date' || s.type === 'datetime' ? [j] : []));
    valid = calendar.length === 0 ? tuple : (row) => tuple(row) && calendar.every((j) => checks[j]!(row[j]));
  }
  return { specs, checks, width, valid };
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
