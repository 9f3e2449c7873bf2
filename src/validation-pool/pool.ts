/**
 * The validation worker pool and the per-request ingest sink in front of it.
 *
 * A sink streams: body chunks are cut into pieces of whole rows as they arrive and parsed,
 * validated and encoded in the workers (see `stream.ts`); gzip bodies are inflated on the
 * way in (`gzip.ts`). The pool bounds the work in flight: each sink keeps at most
 * `piecesPerRequest` pieces out, the pool runs at most `poolPieces` tasks at once (the
 * rest wait in the scheduler, in order, before any byte is transferred: `scheduler.ts`), and
 * at most `workers + maxQueue` sinks are open at a time (past that, `createIngest` refuses:
 * `admission.ts`). Piece buffers are reused (`buffers.ts`); every sink is counted into the
 * totals by a decorator (`totals.ts`).
 */
import { availableParallelism } from 'node:os';
import { Piscina } from 'piscina';
import { defaultConfig } from '../config/config.js';
import { Admission } from './admission.js';
import { BufferPool } from './buffers.js';
import { GunzipIngest } from './gzip.js';
import { MemoryBudget, ParseGate } from './memory.js';
import { CountedIngest, type IngestTotals } from './totals.js';
import { Scheduler } from './scheduler.js';
import { StreamingIngest } from './stream.js';
import type { Engine, IngestOptions, IngestSink, IngestStats } from './types.js';
import { WORKER_FILE, processRows, type RowsTask, type Task, type WorkerData } from '../validation/index.js';

/** The service's defaults (config/default.json): an option left out takes the value the service runs with. */
const DEFAULTS = defaultConfig();
export const DEFAULT_BATCH_BYTES: number = DEFAULTS.ingest.batchBytes;
export const DEFAULT_PIECE_BYTES: number = DEFAULTS.ingest.pieceBytes;
export const DEFAULT_PIECES_PER_REQUEST: number = DEFAULTS.ingest.piecesPerRequest;
export const DEFAULT_MAX_DECOMPRESSED_BYTES: number = DEFAULTS.ingest.maxDecompressedBytes;
export const DEFAULT_MEMORY_BUDGET_BYTES: number = DEFAULTS.ingest.memoryBudgetBytes;
/** The plain body limit of ingest (`limits.ingestBodyBytes`): a gzip body may hold no more. */
export const DEFAULT_MAX_HELD_BYTES: number = DEFAULTS.limits.ingestBodyBytes;
/** Not an operator's setting (no config key): how long a task of a request gone away may still finish. Tests lower it. */
export const DEFAULT_CANCEL_AFTER_MS = 1000;
/** Heads (bytes before `data`'s elements) longer than this go to the one-shot path. Not a config key: only tests set it. */
const HEAD_BYTES = 64 * 1024;
/** Skeletons (head + tail) up to this size are checked on the main thread. */
const INLINE_SKELETON_BYTES = 64 * 1024;

export interface ValidationPoolOptions {
  /** Worker threads; 0 = one per core. */
  workers: number;
  /** Sinks that may be open beyond one per worker; past `workers + maxQueue`, a new sink fails with RATE_LIMITED (503). */
  maxQueue: number;
  /** Upper bound of one stored batch in bytes (whole NDJSON lines); default `ingest.batchBytes` (512 KiB). */
  batchBytes?: number;
  /** Target size of a piece of rows sent to a worker; default `ingest.pieceBytes` (1 MiB). */
  pieceBytes?: number;
  /** Pieces one request may have in flight (dispatched, not yet stored); default `ingest.piecesPerRequest` (4). */
  piecesPerRequest?: number;
  /** Tasks the pool runs or queues at once, all requests together; 0 = two per worker; default `ingest.poolPieces` (0). */
  poolPieces?: number;
  /** Bound of a gzip body once inflated (413 past it); default `ingest.maxDecompressedBytes` (256 MiB). */
  maxDecompressedBytes?: number;
  /**
   * Bytes all sinks together may hold whole (see `memory.ts`: bodies of a layout that is not
   * streamed, bytes after `data`, rows longer than a piece), inflated bytes counted; a request
   * that needs more answers 503. Default `ingest.memoryBudgetBytes` (256 MiB). Also what the
   * parses of one-shot bodies may build at once (`ParseGate`): past it they wait their turn.
   */
  memoryBudgetBytes?: number;
  /** Bytes one request may hold whole (413 past it): the plain body limit, so gzip gets no more. Default `limits.ingestBodyBytes` (32 MiB). */
  maxHeldBytes?: number;
  /** Heads longer than this are validated in one task; default 64 KiB. Tests lower it. */
  headBytes?: number;
  /**
   * A task whose request went away is cancelled (its worker terminated and replaced) only if
   * it is still running this long after; until then it may finish and its result is dropped.
   * Default 1000 ms.
   */
  cancelAfterMs?: number;
  /**
   * Steps of niceness the worker threads add to their own (Linux: per thread; capped at 19;
   * default 0, unchanged: deliberately not the service's `ingest.workerNice`, so a pool built
   * without it, as in the tests, leaves its threads alone). Above 0, the main thread (HTTP, status polls, the uploader) runs first whenever it has
   * work, and the workers take the rest of the CPU.
   */
  workerNice?: number;
  /**
   * Rows are checked and encoded by the byte-level scanner generated from the entity's
   * schema, with `JSON.parse` + typia for what it declines (default `ingest.rowScanner`, true). false: by
   * `JSON.parse` + typia only, the reference path (tests and the bench compare the two).
   */
  rowScanner?: boolean;
  /**
   * Row tasks of at most this many bytes run on the main thread, without a worker's round
   * trip (the short way of small packages); 0: every task goes to a worker. Default
   * `ingest.inlineBytes`. With another worker module (`filename`), every task goes to it.
   */
  inlineBytes?: number;
  /**
   * The share of the open requests (`workers + maxQueue`) one client may hold, 0 < share ≤ 1
   * (at least one request), and of `memoryBudgetBytes` (at least `maxHeldBytes`). Default
   * `ingest.clientShare`.
   */
  clientShare?: number;
  /** Worker module, as a path or file URL; defaults to the validation module's (`WORKER_FILE`). Tests wrap it. */
  filename?: string;
  /**
   * Worker failures that belong to no task (piscina's pool `error` event). Failures of a
   * task reject that task's `end()` instead.
   */
  onError?: (err: unknown) => void;
}

export class ValidationPool {
  readonly #pool: Piscina<Task, unknown>;
  readonly #batchBytes: number;
  readonly #pieceBytes: number;
  readonly #piecesPerRequest: number;
  readonly #maxDecompressedBytes: number;
  readonly #headBytes: number;
  readonly #cancelAfterMs: number;
  readonly #stats: IngestStats = { pieces: 0, continuations: 0, scanned: 0, oneShots: 0, skeletonTasks: 0, inline: 0 };
  readonly #inlineBytes: number;
  readonly #rowScanner: boolean;
  readonly #totals: IngestTotals = { accepted: 0, rejected: 0, failed: 0, rows: 0, bodyBytes: 0, encodedBytes: 0 };
  #busyMs = 0;
  readonly #admission: Admission;
  readonly #scheduler: Scheduler;
  readonly #buffers: BufferPool;
  readonly #memory: MemoryBudget;
  readonly #parses: ParseGate;
  readonly #tids: Int32Array;

  constructor(options: ValidationPoolOptions) {
    const {
      workers,
      maxQueue,
      batchBytes = DEFAULT_BATCH_BYTES,
      pieceBytes = DEFAULT_PIECE_BYTES,
      piecesPerRequest = DEFAULT_PIECES_PER_REQUEST,
      poolPieces = DEFAULTS.ingest.poolPieces,
      maxDecompressedBytes = DEFAULT_MAX_DECOMPRESSED_BYTES,
      memoryBudgetBytes = DEFAULT_MEMORY_BUDGET_BYTES,
      maxHeldBytes = DEFAULT_MAX_HELD_BYTES,
      headBytes = HEAD_BYTES,
      cancelAfterMs = DEFAULT_CANCEL_AFTER_MS,
      workerNice = 0,
      rowScanner = DEFAULTS.ingest.rowScanner,
      inlineBytes = DEFAULTS.ingest.inlineBytes,
      clientShare = DEFAULTS.ingest.clientShare,
      filename = WORKER_FILE,
      onError = () => {},
    } = options;
    requireInteger('workers', workers, 0);
    requireInteger('maxQueue', maxQueue, 0);
    requireInteger('batchBytes', batchBytes, 1);
    requireInteger('pieceBytes', pieceBytes, 1);
    requireInteger('piecesPerRequest', piecesPerRequest, 1);
    requireInteger('poolPieces', poolPieces, 0);
    requireInteger('maxDecompressedBytes', maxDecompressedBytes, 1);
    requireInteger('memoryBudgetBytes', memoryBudgetBytes, 1);
    requireInteger('maxHeldBytes', maxHeldBytes, 1);
    requireInteger('headBytes', headBytes, 1);
    requireInteger('cancelAfterMs', cancelAfterMs, 0);
    requireInteger('workerNice', workerNice, 0);
    requireInteger('inlineBytes', inlineBytes, 0);
    if (!(clientShare > 0 && clientShare <= 1)) throw new TypeError(`clientShare must be in (0, 1], got ${clientShare}`);
    // The short way runs the built-in row code: with another worker module, every task goes to it.
    this.#inlineBytes = options.filename === undefined ? inlineBytes : 0;
    this.#rowScanner = rowScanner;
    const threads = workers === 0 ? availableParallelism() : workers;
    const tasks = poolPieces === 0 ? 2 * threads : poolPieces;
    this.#batchBytes = batchBytes;
    this.#pieceBytes = pieceBytes;
    this.#piecesPerRequest = piecesPerRequest;
    this.#maxDecompressedBytes = maxDecompressedBytes;
    this.#memory = new MemoryBudget(memoryBudgetBytes, maxHeldBytes, clientShare);
    this.#parses = new ParseGate(memoryBudgetBytes);
    this.#headBytes = headBytes;
    this.#cancelAfterMs = cancelAfterMs;
    this.#admission = new Admission(threads + maxQueue, clientShare);
    this.#scheduler = new Scheduler(tasks);
    // Room past the target for the rest of the row the cut waits for; a running task holds
    // two buffers (its piece and the one its lines go to).
    this.#buffers = new BufferPool(pieceBytes + Math.min(pieceBytes, 64 * 1024), 4 * tasks + 8);
    this.#tids = new Int32Array(new SharedArrayBuffer(4 * (1 + 4 * threads + 64)));
    const workerData: WorkerData = { nice: workerNice, rowScanner, tids: this.#tids };
    this.#pool = new Piscina({ filename, minThreads: threads, maxThreads: threads, workerData });
    this.#pool.on('error', onError);
  }

  /**
   * A sink for one request's body. Throws RATE_LIMITED (503) when `workers + maxQueue`
   * sinks are open already, so the request is answered before its body is read.
   */
  createIngest(options: IngestOptions): IngestSink {
    const leave = this.#admission.admit(options.client);
    const memory = this.#memory.account(options.client);
    const engine: Engine = {
      run: (task, transfer, signal, priority, cost) => this.#run(task, transfer, signal, priority, cost),
      buffers: this.#buffers,
      memory,
      stats: this.#stats,
      pieceBytes: this.#pieceBytes,
      piecesPerRequest: this.#piecesPerRequest,
      batchBytes: this.#batchBytes,
      headBytes: this.#headBytes,
      inlineSkeletonBytes: INLINE_SKELETON_BYTES,
      release: () => {
        memory.release();
        leave();
      },
    };
    const sink = new StreamingIngest(options, engine);
    const inflating = options.encoding === 'gzip' ? new GunzipIngest(sink, this.#maxDecompressedBytes) : sink;
    // A dry run is no package: it stays out of the ingest totals.
    return options.dryRun ? inflating : new CountedIngest(inflating, this.#totals);
  }

  /** Packages, rows and bytes since the pool started, counted once per package (a live object: read, do not keep). */
  get totals(): Readonly<IngestTotals> {
    return this.#totals;
  }

  /** The bounds: worker threads, ingest requests open at once, tasks running or queued at once. */
  get capacity(): { workers: number; requests: number; tasks: number } {
    return { workers: this.#pool.maxThreads, requests: this.#admission.capacity, tasks: this.#scheduler.slots };
  }

  /**
   * Milliseconds the worker threads have spent running tasks since the pool started, from
   * piscina's own run-time record (its `utilization` is that total over duration × threads).
   * Never decreases between reads.
   */
  get busyMs(): number {
    const pool = this.#pool;
    this.#busyMs = Math.max(this.#busyMs, pool.utilization * pool.duration * pool.maxThreads);
    return this.#busyMs;
  }

  /** The memory budget for bytes held whole: limit, reserved now, the most ever reserved, refusals (a fresh snapshot). */
  get memory(): { limit: number; perRequest: number; used: number; peak: number; refusals: number } {
    const m = this.#memory;
    return { limit: m.limit, perRequest: m.perRequest, used: m.used, peak: m.peak, refusals: m.refusals };
  }

  /** What one-shot tasks may build parsing their bodies (see `memory.ts`): limit, entered now, the most ever entered, waiting (a fresh snapshot). */
  get parses(): { limit: number; used: number; peak: number; waiting: number } {
    const g = this.#parses;
    return { limit: g.limit, used: g.used, peak: g.peak, waiting: g.waiting };
  }

  /** Counters since the pool started (a live object: read, do not keep). */
  get stats(): Readonly<IngestStats> {
    return this.#stats;
  }

  /** What the pool holds right now (a fresh snapshot): all zero and `threads` full when idle. */
  get load(): PoolLoad {
    return {
      open: this.#admission.open,
      running: this.#scheduler.running,
      waiting: this.#scheduler.waiting,
      queued: this.#pool.queueSize,
      threads: this.#pool.threads.length,
      threadIds: this.#pool.threads.map((w) => w.threadId),
      threadTids: [...new Set(this.#tids.subarray(1, 1 + Math.min(Atomics.load(this.#tids, 0), this.#tids.length - 1)))].filter((tid) => tid > 0),
    };
  }

  /** Stops every worker; tasks in flight reject. */
  destroy(): Promise<void> {
    return this.#pool.destroy();
  }

  async #run<R>(task: Task, transfer: ArrayBuffer[], signal: AbortSignal, priority: boolean, cost = 0): Promise<R> {
    signal.throwIfAborted();
    if (task.kind === 'rows' && rowsBytes(task) <= this.#inlineBytes) {
      // The short way: a small package's rows cost less to scan here than a worker's round
      // trip costs the main thread (posting, waking the worker, taking the answer back).
      this.#stats.inline++;
      return processRows(task, this.#rowScanner) as R;
    }
    if (cost === 0) return this.#runTask(task, transfer, signal, priority);
    // Its parse waits until the memory of the ones running leaves room for it.
    const leave = await this.#parses.enter(cost, signal);
    try {
      return await this.#runTask<R>(task, transfer, signal, priority);
    } finally {
      leave();
    }
  }

  async #runTask<R>(task: Task, transfer: ArrayBuffer[], signal: AbortSignal, priority: boolean): Promise<R> {
    if (!this.#scheduler.tryAcquire()) await this.#scheduler.acquire(signal, priority);
    // A task handed to piscina is not cancelled the moment its request goes away: piscina
    // cancels a running task by terminating its worker thread, and starting a new one costs
    // ~200 ms of CPU (more than a 1 MiB piece takes to finish), so a client aborting its
    // uploads could keep the pool restarting workers. The task finishes and its result is
    // dropped; only one still running `cancelAfterMs` later (a one-shot body of many MiB,
    // a stuck worker) is cancelled.
    const cancel = new AbortController();
    let timer: NodeJS.Timeout | undefined;
    const onAbort = () => {
      timer = setTimeout(() => cancel.abort(signal.reason), this.#cancelAfterMs);
    };
    signal.addEventListener('abort', onAbort, { once: true });
    try {
      return (await this.#pool.run(task, { transferList: transfer, signal: cancel.signal })) as R;
    } finally {
      signal.removeEventListener('abort', onAbort);
      clearTimeout(timer);
      this.#scheduler.release();
    }
  }
}

export interface PoolLoad {
  /** Ingest sinks open (admitted requests not yet settled). */
  open: number;
  /** Tasks handed to piscina and not yet settled (running or in its queue). */
  running: number;
  /** Tasks waiting in the scheduler for a slot, before any byte was transferred. */
  waiting: number;
  /** Of `running`, those still in piscina's queue. */
  queued: number;
  /** Worker threads alive. */
  threads: number;
  /** The worker threads' ids (never reused in a process): a changed id is a worker replaced (crashed or cancelled). */
  threadIds: number[];
  /** Kernel thread ids of the worker threads started so far, replaced ones included (Linux; empty elsewhere): for CPU time per thread. */
  threadTids: number[];
}

function requireInteger(key: string, value: unknown, min: number): void {
  if (!Number.isSafeInteger(value) || (value as number) < min) {
    throw new TypeError(`ValidationPool option ${key} must be an integer >= ${min}, got ${String(value)}`);
  }
}

/** The bytes a row task scans. */
function rowsBytes(task: RowsTask): number {
  let bytes = 0;
  for (let i = 0; i < task.ranges.length; i += 2) bytes += task.ranges[i + 1]! - task.ranges[i]!;
  return bytes;
}
