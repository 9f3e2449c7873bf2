/**
 * Rows of one entity read from a file, streamed in bounded memory:
 *
 * - **CSV**: the first record is the header (column names). Parsed by csv-parse: quoted
 *   fields, embedded newlines, doubled quotes, a UTF-8 BOM and CRLF line ends are handled;
 *   blank lines are skipped; every record must have as many fields as the header. Values are
 *   typed by the entity catalog: `number`/`integer` columns take JSON numbers, `boolean`
 *   columns `true`/`false`/`1`/`0`/`yes`/`no` (any case); an empty field is `null` in an
 *   optional column (and in a required non-string column, which the service then rejects);
 *   a value that does not convert is sent as the text it is, so that the service's 422 names it.
 * - **NDJSON**: one JSON value per line (blank lines skipped, CRLF and a BOM allowed). Either
 *   every line is an object keyed by column name, or the first line is an array of column
 *   names (the header) and every further line an array of values. Decided by the first line.
 * - **JSON**: an array of objects keyed by column name, or the ingest body itself
 *   `{"columns": […], "data": [[…], …]}` (read in two passes when `data` comes before `columns`).
 *
 * Objects' values are sent as they are (no typing: JSON already has types); missing keys are
 * sent as `null`. Header checks (empty, duplicate, unknown and missing required columns, and
 * unknown object keys) happen here, against the catalog, before anything is sent.
 *
 * The names of `RESERVED_COLUMNS` (what `ingest push --errors` adds to the records it writes)
 * are dropped wherever they appear, CSV and array columns and object keys alike, so that an
 * errors file can be sent as it is.
 */
import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { parse as parseCsv } from 'csv-parse';
import { InputError, isRecord } from './errors.js';
import { JsonScanner } from './json-scan.js';
import type { CatalogColumn, CatalogEntity } from './types.js';

export type SourceFormat = 'csv' | 'ndjson' | 'json';

export const SOURCE_FORMATS: readonly SourceFormat[] = ['csv', 'ndjson', 'json'];

/**
 * Column names and object keys that are never sent: `ingest push --errors` writes them beside a
 * refused record's values (its problems, its record number and input in the file pushed), and
 * reading drops them, so that a fixed errors file goes back as it is. No entity has such a column.
 */
export const RESERVED_COLUMNS: readonly string[] = ['_errors', '_record', '_file'];
const RESERVED = new Set(RESERVED_COLUMNS);

/**
 * One row. `array` rows carry their columns (the same array object for every row of a
 * source) and the row's JSON text; `object` rows carry the parsed object.
 * `record` is the 1-based number of the data record in the file (the header not counted).
 * A CSV row also carries its `fields` as written in the file (aligned with `columns`).
 */
export type SourceRow =
  | { kind: 'array'; columns: readonly string[]; json: string; record: number; fields?: readonly string[] }
  | { kind: 'object'; value: Record<string, unknown>; record: number };

export interface RowSource {
  readonly path: string;
  readonly format: SourceFormat;
  /** Size of the file. */
  readonly totalBytes: number;
  /** Bytes of the file read so far (of the last pass, for a two-pass JSON file). */
  readonly bytesRead: number;
  /** The rows in file order, in batches (about one file chunk each). */
  rows(): AsyncGenerator<SourceRow[]>;
}

/** Longest line (NDJSON), record (CSV) or element (JSON) read: bounds memory on a broken file. */
export const MAX_RECORD_BYTES = 32 * 1024 * 1024;

export function formatFromPath(path: string): SourceFormat | null {
  const lower = path.toLowerCase();
  if (lower.endsWith('.csv')) return 'csv';
  if (lower.endsWith('.ndjson') || lower.endsWith('.jsonl')) return 'ndjson';
  if (lower.endsWith('.json')) return 'json';
  return null;
}

/** Opens `path` as rows of `entity` (the catalog entry, for header checks and CSV typing). */
export async function openSource(path: string, format: SourceFormat, entity: CatalogEntity): Promise<RowSource> {
  let size: number;
  try {
    const info = await stat(path);
    if (!info.isFile()) throw new InputError(`${path} is not a file`);
    size = info.size;
  } catch (err) {
    if (err instanceof InputError) throw err;
    throw new InputError(`cannot read ${path}: ${(err as Error).message}`, { cause: err });
  }
  return new FileSource(path, format, size, entity);
}

class FileSource implements RowSource {
  bytesRead = 0;
  readonly #reader: FileReader;

  constructor(
    readonly path: string,
    readonly format: SourceFormat,
    readonly totalBytes: number,
    private readonly entity: CatalogEntity,
  ) {
    this.#reader = new FileReader(path, (n) => (this.bytesRead = n));
  }

  rows(): AsyncGenerator<SourceRow[]> {
    switch (this.format) {
      case 'csv':
        return csvRows(this.#reader, this.entity);
      case 'ndjson':
        return ndjsonRows(this.#reader, this.entity);
      case 'json':
        return jsonRows(this.#reader, this.entity);
    }
  }
}

/** Reads the file's chunks, reporting the bytes read; each `chunks()` is a new pass. */
class FileReader {
  constructor(
    readonly path: string,
    private readonly progress: (bytesRead: number) => void,
  ) {}

  async *chunks(): AsyncGenerator<Buffer> {
    const stream = createReadStream(this.path, { highWaterMark: 256 * 1024 });
    let read = 0;
    try {
      for await (const chunk of stream as AsyncIterable<Buffer>) {
        read += chunk.length;
        this.progress(read);
        yield chunk;
      }
    } catch (err) {
      throw new InputError(`cannot read ${this.path}: ${(err as Error).message}`, { cause: err });
    } finally {
      stream.destroy();
    }
  }
}

/** The header checks the service would make, done before a byte is sent. */
export function checkColumns(columns: readonly unknown[], entity: CatalogEntity, where: string): asserts columns is string[] {
  if (columns.length === 0) throw new InputError('no columns', { where });
  const known = new Set(entity.columns.map((c) => c.name));
  const seen = new Set<string>();
  for (const c of columns) {
    if (typeof c !== 'string') throw new InputError(`column names must be strings, got ${JSON.stringify(c)}`, { where });
    if (seen.has(c)) throw new InputError(`duplicate column: ${c}`, { where });
    seen.add(c);
    if (!known.has(c)) throw new InputError(`unknown column of ${entity.name}: ${JSON.stringify(c)} (columns: ${[...known].join(', ')})`, { where });
  }
  const missing = entity.columns.filter((c) => c.required && !seen.has(c.name)).map((c) => c.name);
  if (missing.length) throw new InputError(`missing required columns of ${entity.name}: ${missing.join(', ')}`, { where });
}

// ---------------------------------------------------------------------------------- CSV

const NUMBER = /^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$/;
const TRUE = new Set(['true', '1', 'yes']);
const FALSE = new Set(['false', '0', 'no']);

/** How a CSV field becomes a JSON value in a column of this catalog type. */
export function csvConverter(column: CatalogColumn): (field: string) => unknown {
  const empty = (field: string) => field === '';
  switch (column.type) {
    case 'number':
    case 'integer':
      return (field) => {
        if (empty(field)) return null;
        const t = field.trim();
        if (!NUMBER.test(t)) return field;
        const n = Number(t);
        // 1e400 stays text: JSON would turn Infinity into null, the service must see and refuse it.
        // So does an integer past ±(2^53 − 1): as a number it would be sent rounded (…993 as …992).
        if (column.type === 'integer' && Number.isInteger(n) && !Number.isSafeInteger(n)) return field;
        return Number.isFinite(n) ? n : field;
      };
    case 'boolean':
      return (field) => {
        if (empty(field)) return null;
        const t = field.trim().toLowerCase();
        if (TRUE.has(t)) return true;
        if (FALSE.has(t)) return false;
        return field;
      };
    case 'string':
      // An empty required string stays "": it is a value (the service decides whether it may be empty).
      return column.required ? (field) => field : (field) => (empty(field) ? null : field);
    default:
      return (field) => (empty(field) ? null : field);
  }
}

async function* csvRows(reader: FileReader, entity: CatalogEntity): AsyncGenerator<SourceRow[]> {
  const parser = parseCsv({ bom: true, skip_empty_lines: true, max_record_size: MAX_RECORD_BYTES });
  // Records are taken in batches as the parser emits them, one file chunk at a time: the
  // file is read only as fast as the rows are consumed, without an await per record.
  let records: string[][] = [];
  let failure: Error | null = null;
  parser.on('data', (fields: string[]) => records.push(fields));
  parser.on('error', (err: Error) => (failure ??= err));
  const ended = new Promise<void>((resolve) => parser.once('end', resolve).once('close', resolve));
  let columns: string[] | null = null;
  let convert: ((field: string) => unknown)[] = [];
  // The positions of the header's reserved columns, dropped from every record (null: none).
  let drop: Set<number> | null = null;
  let record = 0;
  const take = (): SourceRow[] => {
    if (failure) {
      const line = (failure as { lines?: unknown }).lines;
      throw new InputError(`invalid CSV: ${failure.message}`, { where: typeof line === 'number' ? `line ${line}` : `record ${record + 1}`, cause: failure });
    }
    const batch: SourceRow[] = [];
    for (const all of records) {
      if (columns === null) {
        const header = reservedAt(all);
        drop = header.drop;
        checkColumns(header.columns, entity, 'CSV header');
        columns = header.columns;
        const byName = new Map(entity.columns.map((c) => [c.name, c]));
        convert = columns.map((name) => csvConverter(byName.get(name)!));
        continue;
      }
      record++;
      const fields = drop === null ? all : all.filter((_, i) => !drop!.has(i));
      const values = new Array<unknown>(fields.length);
      for (let i = 0; i < fields.length; i++) values[i] = convert[i]!(fields[i]!);
      batch.push({ kind: 'array', columns, json: JSON.stringify(values), record, fields });
    }
    records = [];
    return batch;
  };
  try {
    for await (const chunk of reader.chunks()) {
      parser.write(chunk);
      const batch = take();
      if (batch.length) yield batch;
    }
    parser.end();
    await ended;
    const batch = take();
    if (batch.length) yield batch;
  } finally {
    parser.destroy();
  }
  if (columns === null) throw new InputError('the CSV file has no header');
}

// ------------------------------------------------------------------------------- NDJSON

/** The lines of the file as text, without their line ends, a chunk's worth at a time; a BOM at the start dropped. */
async function* lines(reader: FileReader): AsyncGenerator<string[]> {
  let carry: Buffer[] = [];
  let carryBytes = 0;
  let first = true;
  for await (const chunk of reader.chunks()) {
    const out: string[] = [];
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(0x0a, start);
      if (nl < 0) break;
      let line = chunk.subarray(start, nl);
      if (carryBytes > 0) {
        line = Buffer.concat([...carry, line], carryBytes + line.length);
        carry = [];
        carryBytes = 0;
      }
      out.push(text(line, first));
      first = false;
      start = nl + 1;
    }
    if (out.length) yield out;
    if (start < chunk.length) {
      carryBytes += chunk.length - start;
      if (carryBytes > MAX_RECORD_BYTES) throw new InputError(`a line longer than ${MAX_RECORD_BYTES} bytes`);
      // a copy: the chunk may be a pooled buffer
      carry.push(Buffer.from(chunk.subarray(start)));
    }
  }
  if (carryBytes > 0) yield [text(Buffer.concat(carry, carryBytes), first)];
}

function text(line: Buffer, first: boolean): string {
  let end = line.length;
  if (end > 0 && line[end - 1] === 0x0d) end--;
  const begin = first && line[0] === 0xef && line[1] === 0xbb && line[2] === 0xbf ? 3 : 0;
  return line.toString('utf8', begin, end);
}

async function* ndjsonRows(reader: FileReader, entity: CatalogEntity): AsyncGenerator<SourceRow[]> {
  let lineNo = 0;
  let record = 0;
  let columns: string[] | null = null;
  let drop: Set<number> | null = null;
  let objects: boolean | null = null;
  const keys = knownKeys(entity);
  for await (const chunkLines of lines(reader)) {
    const batch: SourceRow[] = [];
    for (const line of chunkLines) {
      lineNo++;
      if (line.trim() === '') continue;
      const where = `line ${lineNo}`;
      const value = parseJson(line, where);
      if (objects === null) {
        if (Array.isArray(value)) {
          const header = reservedAt(value);
          checkColumns(header.columns, entity, `${where} (header)`);
          columns = header.columns;
          drop = header.drop;
          objects = false;
          continue;
        }
        if (!isRecord(value)) throw new InputError('expected an object, or an array of column names as the header line', { where });
        objects = true;
      }
      record++;
      if (objects) {
        if (!isRecord(value)) throw new InputError('expected an object (the first line was one)', { where });
        batch.push({ kind: 'object', value: checkObject(value, keys, entity, where), record });
      } else {
        batch.push({ kind: 'array', columns: columns!, json: checkArray(value, line, columns!, where, drop), record });
      }
    }
    if (batch.length) yield batch;
  }
}

// --------------------------------------------------------------------------------- JSON

async function* jsonRows(reader: FileReader, entity: CatalogEntity): AsyncGenerator<SourceRow[]> {
  const keys = knownKeys(entity);
  let columns: string[] | null = null;
  let drop: Set<number> | null = null;
  let deferred = false;
  let record = 0;
  let shape: 'array' | 'object' | null = null;
  const scanner = new JsonScanner(MAX_RECORD_BYTES);
  for await (const chunk of reader.chunks()) {
    const batch: SourceRow[] = [];
    for (const event of scanner.push(chunk)) {
      shape = scanner.shape;
      if (event.type === 'member') {
        if (event.key === 'columns') {
          if (columns !== null) throw new InputError('"columns" appears twice');
          if (!Array.isArray(event.value)) throw new InputError('"columns" must be an array of column names');
          const header = reservedAt(event.value);
          checkColumns(header.columns, entity, '"columns"');
          columns = header.columns;
          drop = header.drop;
        } else if (event.key === 'data') {
          throw new InputError('"data" must be an array of rows');
        }
        continue;
      }
      record++;
      const where = `${shape === 'array' ? 'element' : 'data row'} ${record - 1}`;
      if (shape === 'array') {
        const value = parseJson(event.text, where);
        if (!isRecord(value)) throw new InputError('expected an object keyed by column name (or use the {"columns", "data"} layout)', { where });
        batch.push({ kind: 'object', value: checkObject(value, keys, entity, where), record });
        continue;
      }
      if (columns === null) {
        deferred = true; // rows before "columns": taken in a second pass
        continue;
      }
      batch.push({ kind: 'array', columns, json: checkArray(parseJson(event.text, where), event.text, columns, where, drop), record });
    }
    if (batch.length) yield batch;
  }
  scanner.end();
  if (shape === 'object' && columns === null) throw new InputError('the file has no "columns" (expected {"columns": […], "data": […]})');
  if (!deferred || columns === null) return;
  const known: readonly string[] = columns;
  // Second pass: the rows of `data` only, now that the columns are known.
  const again = new JsonScanner(MAX_RECORD_BYTES);
  record = 0;
  for await (const chunk of reader.chunks()) {
    const batch: SourceRow[] = [];
    for (const event of again.push(chunk)) {
      if (event.type !== 'element') continue;
      record++;
      const where = `data row ${record - 1}`;
      batch.push({ kind: 'array', columns: known, json: checkArray(parseJson(event.text, where), event.text, known, where, drop), record });
    }
    if (batch.length) yield batch;
  }
  again.end();
}

// ------------------------------------------------------------------------------ shared

function parseJson(text: string, where: string): unknown {
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new InputError(`invalid JSON: ${(err as Error).message}`, { where, cause: err });
  }
}

function knownKeys(entity: CatalogEntity): Set<string> {
  return new Set(entity.columns.map((c) => c.name));
}

/** A header without its reserved names (`RESERVED_COLUMNS`), and where they were (null: nowhere). */
function reservedAt(names: readonly unknown[]): { columns: unknown[]; drop: Set<number> | null } {
  if (!names.some((c) => typeof c === 'string' && RESERVED.has(c))) return { columns: [...names], drop: null };
  const drop = new Set<number>();
  names.forEach((c, i) => typeof c === 'string' && RESERVED.has(c) && drop.add(i));
  return { columns: names.filter((_, i) => !drop.has(i)), drop };
}

/**
 * A row given as an array: its own text is sent (exactly as written), after a length check;
 * with reserved columns in the header (`drop`), its values without theirs, written anew.
 */
function checkArray(value: unknown, text: string, columns: readonly string[], where: string, drop: Set<number> | null = null): string {
  if (!Array.isArray(value)) throw new InputError('expected an array of values', { where });
  const width = columns.length + (drop?.size ?? 0);
  if (value.length !== width) throw new InputError(`expected ${width} values, got ${value.length}`, { where });
  if (drop === null) return text.trim();
  for (const v of value) if (typeof v === 'number' && !Number.isFinite(v)) throw new InputError('number out of range', { where });
  return JSON.stringify(value.filter((_, i) => !drop.has(i)));
}

function checkObject(value: Record<string, unknown>, keys: Set<string>, entity: CatalogEntity, where: string): Record<string, unknown> {
  for (const key of RESERVED_COLUMNS) if (Object.hasOwn(value, key)) delete value[key];
  for (const key in value) {
    if (!keys.has(key)) throw new InputError(`unknown column of ${entity.name}: ${JSON.stringify(key)}`, { where });
    const v = value[key];
    // JSON.parse reads 1e400 as Infinity, which JSON.stringify would send as null
    if (typeof v === 'number' && !Number.isFinite(v)) throw new InputError(`column ${key}: number out of range`, { where });
  }
  return value;
}
