/**
 * The piscina worker entry of the validation pool: one entry for the three task kinds of
 * `tasks.ts`, loaded by path (`WORKER_FILE` in `index.ts`). Bad input is answered with data,
 * never thrown; a throw here is a bug and reaches the main thread as a failed task.
 */
import { readlinkSync } from 'node:fs';
import { getPriority, setPriority } from 'node:os';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { move, transferableSymbol, valueSymbol, workerData } from 'piscina';
import { validateBody } from './body.js';
import { checkSkeleton, type SkeletonFacts } from './skeleton.js';
import type { BodyResult, RowsResult, Task, WorkerData } from './tasks.js';
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
      // Rows of 1 MiB or more on average, parsed (a piece of many rows is not collected after).
      if (!result.scanned && result.rows > 0) {
        let bytes = 0;
        for (let k = 0; k < task.ranges.length; k += 2) bytes += task.ranges[k + 1]! - task.ranges[k]!;
        collectAfter(bytes / result.rows);
      }
      return transfer(result, result.out ? [...new Set([...result.parts, result.out])] : [...new Set(result.parts)]);
    }
    case 'skeleton': {
      const facts = checkSkeleton(new Uint8Array(task.text), task.sentinel, task.headColumns);
      collectAfter(task.text.byteLength);
      return facts;
    }
    default: {
      const result = validateBody(task.body, task.entity, task.batchBytes);
      collectAfter(task.body.byteLength);
      return result.ok ? transfer(result, [result.buffer]) : result;
    }
  }
}

/**
 * After a task that parsed `bytes` whole (a body, a long row, a skeleton): what the parse
 * built is garbage now, but a thread's heap keeps its pages until its next full collection,
 * which a worker that then only gets pieces may not need for long. From 1 MiB on they are
 * given back now (a few ms; the parse took more), or every worker would keep the most its
 * parses ever built.
 */
function collectAfter(bytes: number): void {
  if (bytes < COLLECT_AFTER_BYTES) return;
  if (!collect) {
    setFlagsFromString('--expose-gc');
    collect = runInNewContext('gc') as () => void;
  }
  collect();
}

const COLLECT_AFTER_BYTES = 1 << 20;

/**
 * V8's full collection, from a context created after the flag (this thread's own `gc` is not
 * defined): made at the first collection, not as the worker loads. A worker terminated while
 * it makes that context (a pool destroyed as it starts: a gateway whose listen failed) has
 * Node 22 print V8's bootstrap failure, a page of its `vm` source, on the process's output.
 */
let collect: (() => void) | undefined;

/** piscina sends `valueSymbol` and transfers the buffers listed under `transferableSymbol`. */
function transfer<T>(value: T, buffers: ArrayBuffer[]): T {
  return move({ [transferableSymbol]: buffers, [valueSymbol]: value } as never) as unknown as T;
}
