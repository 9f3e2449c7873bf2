/**
 * Piscina worker of the ingest pool: one entry for the three task kinds of
 * `src/ingest/tasks.ts`. Bad input is answered with data, never thrown; a throw
 * here is a bug and reaches the main thread as a failed task.
 */
import { Buffer, isUtf8 } from 'node:buffer';
import { readlinkSync } from 'node:fs';
import { getPriority, setPriority } from 'node:os';
import { move, transferableSymbol, valueSymbol, workerData } from 'piscina';
import { findEntity } from '../src/entities/catalog.js';
import { INVALID_JSON, bodyIssue, columnsError, compileRowErrorCount, compileRowProblem, duplicateKeyMessage, repeatedKey } from '../src/entities/validators.js';
import { ROW_ERRORS_MAX, type RowError } from '../src/errors.js';
import { checkSkeleton, type SkeletonFacts } from '../src/ingest/skeleton.js';
import type { BodyResult, RowsResult, Task, WorkerData } from '../src/ingest/tasks.js';
import { encode } from './encode.js';
import { processRows } from './rows.js';

const { nice = 0, rowScanner = true, tids } = (workerData ?? {}) as Partial<WorkerData>;
if (tids) {
  try {
    // `/proc/thread-self` links to `<pid>/task/<tid>`: this thread's kernel id.
    const tid = Number(readlinkSync('/proc/thread-self').split('/').pop());
    const slot = 1 + (Atomics.add(tids, 0, 1) % (tids.length - 1));
    Atomics.store(tids, slot, tid);
  } catch {
    // Not Linux: no per-thread figures.
  }
}
if (nice > 0) {
  try {
    // Linux applies a process-wide call to the calling thread only: this worker's thread.
    setPriority(0, Math.min(19, getPriority(0) + nice));
  } catch {
    // Not permitted here (a sandbox): the thread keeps the main thread's priority.
  }
}

export default function run(task: Task): BodyResult | RowsResult | SkeletonFacts {
  switch (task.kind) {
    case 'rows': {
      const result = processRows(task, rowScanner);
      return transfer(result, result.out ? [...new Set([...result.parts, result.out])] : [...new Set(result.parts)]);
    }
    case 'skeleton':
      return checkSkeleton(new Uint8Array(task.text), task.sentinel, task.headColumns);
    default: {
      const result = validateBody(task.body, task.entity, task.batchBytes);
      return result.ok ? transfer(result, [result.buffer]) : result;
    }
  }
}

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

/** piscina sends `valueSymbol` and transfers the buffers listed under `transferableSymbol`. */
function transfer<T>(value: T, buffers: ArrayBuffer[]): T {
  return move({ [transferableSymbol]: buffers, [valueSymbol]: value } as never) as unknown as T;
}

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
