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
 *
 * Each format's reader is in sources/ (csv.ts, ndjson.ts, json.ts); rows.ts holds what they
 * share: the row, the file's chunks, the header and value checks.
 */
import { stat } from 'node:fs/promises';
import { InputError } from './errors.js';
import { csvRows } from './sources/csv.js';
import { jsonRows } from './sources/json.js';
import { ndjsonRows } from './sources/ndjson.js';
import { FileReader, type SourceRow } from './sources/rows.js';
import type { CatalogEntity } from './types.js';

export { csvConverter } from './sources/csv.js';
export { checkColumns, MAX_RECORD_BYTES, RESERVED_COLUMNS, type SourceRow } from './sources/rows.js';

export type SourceFormat = 'csv' | 'ndjson' | 'json';

export const SOURCE_FORMATS: readonly SourceFormat[] = ['csv', 'ndjson', 'json'];

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
