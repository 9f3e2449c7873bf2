/**
 * CSV files (see sources.ts): the header first, parsed by csv-parse; values typed by the
 * entity's catalog (`csvConverter`).
 */
import { parse as parseCsv } from 'csv-parse';
import { InputError } from '../errors.js';
import type { CatalogColumn, CatalogEntity } from '../types.js';
import { checkColumns, MAX_RECORD_BYTES, reservedAt, type FileReader, type SourceRow } from './rows.js';

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

export async function* csvRows(reader: FileReader, entity: CatalogEntity): AsyncGenerator<SourceRow[]> {
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
