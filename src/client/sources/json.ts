/**
 * JSON files (see sources.ts): an array of objects, or `{"columns": […], "data": […]}`, read
 * as a stream (`JsonScanner`), in two passes when `data` comes before `columns`.
 */
import { InputError, isRecord } from '../errors.js';
import { JsonScanner } from '../json-scan.js';
import type { CatalogEntity } from '../types.js';
import { checkArray, checkColumns, checkObject, knownKeys, MAX_RECORD_BYTES, parseJson, reservedAt, type FileReader, type SourceRow } from './rows.js';

export async function* jsonRows(reader: FileReader, entity: CatalogEntity): AsyncGenerator<SourceRow[]> {
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
