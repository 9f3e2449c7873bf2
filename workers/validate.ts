/**
 * Piscina worker: validates one whole ingest body and encodes its rows for storage.
 * Bad input is answered with data, never thrown (STYLE.md); a throw here is a bug and
 * reaches the main thread as a failed task.
 */
import { Buffer, isUtf8 } from 'node:buffer';
import { move, transferableSymbol, valueSymbol } from 'piscina';
import type { ValidationIssue } from '../src/errors.js';
import { findEntity } from '../src/entities/catalog.js';
import { INVALID_JSON, bodyIssue, columnsError, compileRowCheck } from '../src/entities/validators.js';

export interface ValidateTask {
  /** The request body, transferred. */
  body: ArrayBuffer;
  /** A catalog entity name. */
  entity: string;
  /** Upper bound of one batch, in bytes; a single longer line is a batch of its own. */
  batchBytes: number;
}

export type ValidateResult =
  | {
      ok: true;
      rows: number;
      /** Total encoded bytes, the sum of the batch sizes. */
      bytes: number;
      columns: string[];
      /** NDJSON (`JSON.stringify(row)` + `\n` per row, the client's column order), whole lines per batch, in row order. Transferred. */
      batches: ArrayBuffer[];
    }
  /** 422 with a string detail. */
  | { ok: false; kind: 'payload'; message: string }
  /** 422 with a Pydantic-style array. */
  | { ok: false; kind: 'validation'; issues: ValidationIssue[] };

export default function validate({ body, entity: name, batchBytes }: ValidateTask): ValidateResult {
  const entity = findEntity(name);
  if (!entity) throw new Error(`Unknown entity ${name}`);

  const parsed = parse(body);
  if (parsed === NOT_JSON) return payload(INVALID_JSON);
  const issue = bodyIssue(parsed);
  if (issue) return { ok: false, kind: 'validation', issues: [issue] };

  const { columns, data } = parsed as { columns: string[]; data: unknown[][] };
  const columnsMessage = columnsError(entity, columns);
  if (columnsMessage) return payload(columnsMessage);
  const check = compileRowCheck(entity, columns);
  for (let i = 0; i < data.length; i++) {
    const message = check(data[i]!, i);
    if (message) return payload(message);
  }

  const { batches, bytes } = encode(data, batchBytes);
  const result: ValidateResult = { ok: true, rows: data.length, bytes, columns, batches };
  // piscina sends `valueSymbol` and transfers the buffers listed under `transferableSymbol`.
  return move({ [transferableSymbol]: batches, [valueSymbol]: result }) as unknown as ValidateResult;
}

const NOT_JSON = Symbol('not JSON');

function parse(body: ArrayBuffer): unknown {
  const bytes = Buffer.from(body);
  if (!isUtf8(bytes)) return NOT_JSON;
  const bom = bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf;
  try {
    return JSON.parse(bytes.toString('utf8', bom ? 3 : 0));
  } catch {
    return NOT_JSON;
  }
}

const payload = (message: string): ValidateResult => ({ ok: false, kind: 'payload', message });

const encoder = new TextEncoder();
/** Reused across tasks: a worker runs one task at a time and `encode` is synchronous. */
let scratch = new Uint8Array(0);

function encode(rows: readonly unknown[], batchBytes: number): { batches: ArrayBuffer[]; bytes: number } {
  if (scratch.byteLength !== batchBytes) scratch = new Uint8Array(batchBytes);
  const batches: ArrayBuffer[] = [];
  let bytes = 0;
  let used = 0;
  const flush = () => {
    batches.push(scratch.slice(0, used).buffer);
    bytes += used;
    used = 0;
  };
  for (const row of rows) {
    const line = `${JSON.stringify(row)}\n`;
    // encodeInto never writes half a character; `read` short of the length means no room.
    let { read, written } = encoder.encodeInto(line, scratch.subarray(used));
    if (read < line.length && used > 0) {
      flush();
      ({ read, written } = encoder.encodeInto(line, scratch));
    }
    if (read < line.length) {
      const own = encoder.encode(line);
      batches.push(own.buffer as ArrayBuffer);
      bytes += own.byteLength;
    } else {
      used += written;
    }
  }
  if (used > 0) flush();
  return { batches, bytes };
}
