/**
 * The one-shot path: a whole body in one task (a layout the streaming sink does not cut, and
 * the oracle the streaming answers are tested against).
 */
import { Buffer, isUtf8 } from 'node:buffer';
import { findEntity } from '../entities/catalog.js';
import { INVALID_JSON, bodyIssue, columnsError, compileRowErrorCount, compileRowProblem, duplicateKeyMessage } from '../entities/validators.js';
import { ROW_ERRORS_MAX, type RowError } from '../errors.js';
import { encode } from './encode.js';
import { repeatedKey } from './repeated-key.js';
import type { BodyResult } from './tasks.js';

/**
 * The plain path: `JSON.parse` of the whole body, then every check of `validators.ts` in
 * order (a repeated top-level `columns` or `data` key right after JSON validity; every refused
 * row), then the NDJSON lines. The streaming sink must give exactly its answers.
 */
export function validateBody(body: ArrayBuffer, name: string, batchBytes: number): BodyResult {
  const entity = findEntity(name);
  if (!entity) throw new Error(`Unknown entity ${name}`);

  const text = new Uint8Array(body);
  const bom = hasBom(text);
  const parsed = parse(text, bom);
  if (parsed === NOT_JSON) return payload(INVALID_JSON);
  const repeated = repeatedKey(text, bom ? 3 : 0);
  if (repeated) return payload(duplicateKeyMessage(repeated));
  const issue = bodyIssue(parsed);
  if (issue) return { ok: false, kind: 'validation', issues: [issue] };

  const { columns, data } = parsed as { columns: string[]; data: unknown[][] };
  const columnsMessage = columnsError(entity, columns);
  if (columnsMessage) return payload(columnsMessage);
  const problem = compileRowProblem(entity, columns);
  const errorsOf = compileRowErrorCount(entity, columns);
  const refused: RowError[] = [];
  let count = 0;
  for (let i = 0; i < data.length; i++) {
    // Past the errors the answer lists, only counted: no message is made.
    if (count >= ROW_ERRORS_MAX) {
      count += errorsOf(data[i]!);
      continue;
    }
    const found = problem(data[i]!);
    if (found === null) continue;
    for (const fault of found) if (count++ < ROW_ERRORS_MAX) refused.push({ row: i, ...fault });
  }
  if (count > 0) return { ok: false, kind: 'rows', errors: refused, count };

  const { buffer, ends, bytes } = encode(data, batchBytes, null);
  return { ok: true, rows: data.length, bytes, columns, buffer, ends };
}

/**
 * An upper bound of the memory `validateBody` takes to parse a body, from its bytes alone:
 * `JSON.parse` builds far more than its text (each list or object costs some 40 to 100 bytes,
 * its transient frames included, for its 2 bytes of `[]`; each byte of scalars up to 8, the
 * text itself 1 or 2). Brackets inside strings are counted too: only ever more. The sink adds
 * `parseCost` of each chunk it holds for the one-shot task, and waits for its turn to parse
 * with it (`ParseGate` in `validation-pool/memory.ts`).
 */
export function parseCost(bytes: Uint8Array): number {
  let containers = 0;
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i]!;
    if (b === 0x5b || b === 0x7b) containers++;
  }
  return COST_PER_BYTE * bytes.length + COST_PER_CONTAINER * containers;
}

const COST_PER_BYTE = 12;
const COST_PER_CONTAINER = 96;

const NOT_JSON = Symbol('not JSON');

const hasBom = (bytes: Uint8Array) => bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf;

function parse(body: Uint8Array, bom: boolean): unknown {
  if (!isUtf8(body)) return NOT_JSON;
  try {
    return JSON.parse(Buffer.from(body.buffer, body.byteOffset, body.byteLength).toString('utf8', bom ? 3 : 0));
  } catch {
    return NOT_JSON;
  }
}

const payload = (message: string): BodyResult => ({ ok: false, kind: 'payload', message });
