/**
 * What the readers of every format share (see sources.ts): the row they yield, the file read
 * in chunks, the reserved names dropped, and the checks of headers and values against the
 * entity's catalog entry.
 */
import { createReadStream } from 'node:fs';
import { InputError } from '../errors.js';
import type { CatalogEntity } from '../types.js';

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

/** Longest line (NDJSON), record (CSV) or element (JSON) read: bounds memory on a broken file. */
export const MAX_RECORD_BYTES = 32 * 1024 * 1024;

/** Reads the file's chunks, reporting the bytes read; each `chunks()` is a new pass. */
export class FileReader {
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

export function parseJson(text: string, where: string): unknown {
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new InputError(`invalid JSON: ${(err as Error).message}`, { where, cause: err });
  }
}

export function knownKeys(entity: CatalogEntity): Set<string> {
  return new Set(entity.columns.map((c) => c.name));
}

/** A header without its reserved names (`RESERVED_COLUMNS`), and where they were (null: nowhere). */
export function reservedAt(names: readonly unknown[]): { columns: unknown[]; drop: Set<number> | null } {
  if (!names.some((c) => typeof c === 'string' && RESERVED.has(c))) return { columns: [...names], drop: null };
  const drop = new Set<number>();
  names.forEach((c, i) => typeof c === 'string' && RESERVED.has(c) && drop.add(i));
  return { columns: names.filter((_, i) => !drop.has(i)), drop };
}

/**
 * A row given as an array: its own text is sent (exactly as written), after a length check;
 * with reserved columns in the header (`drop`), its values without theirs, written anew.
 */
export function checkArray(value: unknown, text: string, columns: readonly string[], where: string, drop: Set<number> | null = null): string {
  if (!Array.isArray(value)) throw new InputError('expected an array of values', { where });
  const width = columns.length + (drop?.size ?? 0);
  if (value.length !== width) throw new InputError(`expected ${width} values, got ${value.length}`, { where });
  if (drop === null) return text.trim();
  for (const v of value) if (typeof v === 'number' && !Number.isFinite(v)) throw new InputError('number out of range', { where });
  return JSON.stringify(value.filter((_, i) => !drop.has(i)));
}

export function checkObject(value: Record<string, unknown>, keys: Set<string>, entity: CatalogEntity, where: string): Record<string, unknown> {
  for (const key of RESERVED_COLUMNS) if (Object.hasOwn(value, key)) delete value[key];
  for (const key in value) {
    if (!keys.has(key)) throw new InputError(`unknown column of ${entity.name}: ${JSON.stringify(key)}`, { where });
    const v = value[key];
    // JSON.parse reads 1e400 as Infinity, which JSON.stringify would send as null
    if (typeof v === 'number' && !Number.isFinite(v)) throw new InputError(`column ${key}: number out of range`, { where });
  }
  return value;
}
