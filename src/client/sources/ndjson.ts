/**
 * NDJSON files (see sources.ts): one JSON value per line, objects, or a header line of column
 * names and arrays of values.
 */
import { InputError, isRecord } from '../errors.js';
import type { CatalogEntity } from '../types.js';
import { checkArray, checkColumns, checkObject, knownKeys, MAX_RECORD_BYTES, parseJson, reservedAt, type FileReader, type SourceRow } from './rows.js';

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

export async function* ndjsonRows(reader: FileReader, entity: CatalogEntity): AsyncGenerator<SourceRow[]> {
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
