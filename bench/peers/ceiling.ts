/**
 * Peer 3, the ceiling: how fast this machine can `JSON.parse` the bench body when nothing
 * else is in the way. The body's `data` is cut into ~1 MiB pieces of whole rows (each a
 * JSON array), the pieces are spread over one worker thread per core and made resident
 * there, and each worker parses its pieces round after round for a fixed time. No HTTP,
 * no validation, no copies in the timed loop.
 *
 * Two figures: `parse` (pieces resident as strings: pure parsing, the ceiling the targets
 * use) and `decodeParse` (pieces resident as UTF-8 bytes, decoded then parsed: what any
 * server receiving bytes must at least do).
 *
 * Forked by the driver with argv[2] = JSON `CeilingArgs`; answers one `CeilingResult`.
 */
import { readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { performance } from 'node:perf_hooks';
import { isMainThread, parentPort, Worker, workerData } from 'node:worker_threads';

export interface CeilingArgs {
  bodyFile: string;
  /** Worker threads; default one per core. */
  threads?: number;
  /** Timed seconds per mode. */
  seconds: number;
  /** Bound on rounds over the pieces per worker, whatever the time. */
  maxRounds: number;
}

export interface CeilingFigure {
  /**
   * Each worker's median round (one pass over its pieces), summed over the workers: on a
   * shared machine a burst of someone else's load moves the median less than the mean.
   */
  mbPerSec: number;
  rowsPerSec: number;
  /** All bytes over the longest worker's time. */
  meanMbPerSec: number;
  seconds: number;
  rounds: number;
}

export interface CeilingResult {
  threads: number;
  pieces: number;
  pieceBytes: number;
  parse: CeilingFigure;
  decodeParse: CeilingFigure;
}

type Mode = 'parse' | 'decodeParse';
interface WorkerInput {
  pieces: string[];
  mode: Mode;
  ms: number;
  maxRounds: number;
}
interface WorkerReport {
  /** Bytes and rows of one round. */
  bytes: number;
  rows: number;
  roundMs: number[];
}

const PIECE_BYTES = 1024 * 1024;

if (isMainThread) {
  main().then(
    (result) => {
      process.send?.({ type: 'result', result });
      if (process.connected) process.disconnect();
    },
    (err: unknown) => {
      process.send?.({ type: 'failed', message: err instanceof Error ? err.stack ?? err.message : String(err) });
      process.exitCode = 1;
      if (process.connected) process.disconnect();
    },
  );
} else {
  runWorker(workerData as WorkerInput);
}

async function main(): Promise<CeilingResult> {
  const args = JSON.parse(process.argv[2] ?? '{}') as CeilingArgs;
  const threads = args.threads ?? availableParallelism();
  const pieces = split(readFileSync(args.bodyFile, 'utf8'));
  // The split leaves the whole parsed body as garbage: collect it now, or this thread's GC
  // competes with the first mode's workers for the cores (forked with --expose-gc).
  const collect = (globalThis as { gc?: () => void }).gc ?? (() => {});
  collect();
  const parse = await measure(pieces, threads, 'parse', args);
  collect();
  const decodeParse = await measure(pieces, threads, 'decodeParse', args);
  return {
    threads,
    pieces: pieces.length,
    pieceBytes: Math.round(pieces.reduce((n, p) => n + Buffer.byteLength(p), 0) / pieces.length),
    parse,
    decodeParse,
  };
}

/** The rows of `data`, regrouped into JSON arrays of about PIECE_BYTES each (untimed). */
function split(text: string): string[] {
  const { data } = JSON.parse(text) as { data: unknown[] };
  const pieces: string[] = [];
  let group: string[] = [];
  let size = 2;
  for (const row of data) {
    const json = JSON.stringify(row);
    group.push(json);
    size += Buffer.byteLength(json) + 1;
    if (size >= PIECE_BYTES) {
      pieces.push(`[${group.join(',')}]`);
      group = [];
      size = 2;
    }
  }
  if (group.length) pieces.push(`[${group.join(',')}]`);
  return pieces;
}

async function measure(pieces: string[], threads: number, mode: Mode, args: CeilingArgs): Promise<CeilingFigure> {
  const shares = Array.from({ length: threads }, (_, t) => pieces.filter((_p, i) => i % threads === t));
  const workers = shares.map(
    (share) =>
      new Worker(new URL(import.meta.url), {
        workerData: { pieces: share, mode, ms: args.seconds * 1000, maxRounds: args.maxRounds } satisfies WorkerInput,
      }),
  );
  try {
    // Every worker has its pieces resident and parsed once (warm) before any clock starts.
    await Promise.all(workers.map((w) => once<'ready'>(w)));
    for (const w of workers) w.postMessage('go');
    const reports = await Promise.all(workers.map((w) => once<WorkerReport>(w)));
    const sum = (f: (r: WorkerReport) => number) => reports.reduce((n, r) => n + f(r), 0);
    const ms = Math.max(...reports.map((r) => r.roundMs.reduce((a, b) => a + b, 0)));
    return {
      mbPerSec: sum((r) => r.bytes / 1e3 / median(r.roundMs)),
      rowsPerSec: sum((r) => (r.rows * 1e3) / median(r.roundMs)),
      meanMbPerSec: sum((r) => r.bytes * r.roundMs.length) / 1e6 / (ms / 1000),
      seconds: ms / 1000,
      rounds: Math.min(...reports.map((r) => r.roundMs.length)),
    };
  } finally {
    await Promise.all(workers.map((w) => w.terminate()));
  }
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

function once<T>(worker: Worker): Promise<T> {
  return new Promise((resolve, reject) => {
    const onError = (err: Error) => reject(err);
    worker.once('error', onError);
    worker.once('message', (msg: T) => {
      worker.off('error', onError);
      resolve(msg);
    });
  });
}

function runWorker({ pieces, mode, ms, maxRounds }: WorkerInput): void {
  const port = parentPort!;
  const texts = pieces;
  const bytes = pieces.map((p) => Buffer.from(p, 'utf8'));
  const sizes = bytes.map((b) => b.byteLength);
  const parseOne = mode === 'parse' ? (i: number) => JSON.parse(texts[i]!) : (i: number) => JSON.parse(bytes[i]!.toString('utf8'));
  for (let i = 0; i < pieces.length; i++) parseOne(i);
  port.once('message', () => {
    let rows = 0;
    const roundMs: number[] = [];
    const t0 = performance.now();
    for (let round = 0; round < maxRounds && (round === 0 || performance.now() - t0 < ms); round++) {
      const start = performance.now();
      rows = 0;
      for (let i = 0; i < pieces.length; i++) rows += (parseOne(i) as unknown[]).length;
      roundMs.push(performance.now() - start);
    }
    port.postMessage({ bytes: sizes.reduce((a, b) => a + b, 0), rows, roundMs } satisfies WorkerReport);
  });
  port.postMessage('ready');
}
