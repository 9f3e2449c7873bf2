/**
 * The contracts of ingest: what a request's body is fed into (`IngestSink`, also the HTTP
 * edge's body sink), what opens one (`IngestOptions`), what it gives back (`IngestResult`), and what the pool lends each sink
 * (`Engine`). Types only: the pool (`pool.ts`) and the sinks (`stream.ts`, `gzip.ts`)
 * import them from here, never from each other.
 */
import type { EntitySpec } from '../entities/catalog.js';
import type { PackageWriter } from '../store/ports.js';
import type { Buffers, Task } from '../validation/index.js';
import type { MemoryAccount } from './memory.js';

export interface IngestResult {
  rows: number;
  /** Encoded bytes appended to the writer. */
  bytes: number;
  columns: string[];
  writer: PackageWriter;
}

/**
 * Where a body's chunks go: an ingest's sink, and what the HTTP edge pipes a streaming
 * body into (`BodyStream.pipe` in `http/types.ts`), with no adapter between. The edge stops
 * reading from the socket while `write` returns false, until the sink calls back
 * `onDrain`; it calls `end()` once the body is complete and `abort()` when it never will be
 * (the client went away, or the edge answered first: a limit, a timeout). `R` is what
 * `end()` resolves with: an ingest's `IngestResult` (the edge only waits for it to settle).
 */
export interface IngestSink<R = IngestResult> {
  /** A body chunk; copy it if kept past the call (uWS reuses the memory). false = caller should pause until onDrain fires. */
  write(chunk: Uint8Array): boolean;
  onDrain(cb: () => void): void;
  /** The answer is an error already decided (not JSON, too large, out of memory, aborted): more bytes change nothing. */
  readonly decided: boolean;
  /**
   * Body complete. Resolves when every row passed and every batch was appended to the
   * writer (NOT committed: the caller commits). Rejects with a ServiceError:
   * INVALID_PAYLOAD or VALIDATION_FAILED (422), BODY_TOO_LARGE past the bytes one request
   * may hold whole or the inflated bound of a gzip body (the wire bytes are the HTTP
   * edge's to limit), RATE_LIMITED (503) when the process's memory budget refused what it
   * had to hold, whatever ServiceError `open` or the writer threw, else INTERNAL (worker
   * crash, store failure, `abort()`; `cause` says which). On any rejection the writer, if
   * opened, has been aborted. Calling it again returns the same promise. The writer is
   * opened with the first batch, so it may be open (and then aborted) even when the answer
   * is a 422; nothing is committed either way.
   */
  end(): Promise<R>;
  /**
   * Client went away: release buffered chunks, cancel the tasks (AbortSignal to piscina),
   * abort the writer. Later writes are ignored. A no-op once `end()` has resolved: the
   * writer is then the caller's.
   */
  abort(): void;
}

export interface IngestOptions {
  entity: EntitySpec;
  /** Opens the package with the client's columns, when the first batch is ready (or at the end). */
  open: (columns: string[]) => Promise<PackageWriter>;
  /** The body's `Content-Encoding` (already checked: only these two are served). */
  encoding?: 'identity' | 'gzip';
  /** Whose request it is (the client id): admission gives one client at most its share of the pool. */
  client?: string;
  /** The body's declared length (`Content-Length`), when known: a small body is cut into a small buffer. */
  declaredBytes?: number | null;
  /** A dry run (docs/api.md, Dry runs): checked like any package, not counted in the pool's totals. */
  dryRun?: boolean;
}

/** Counters of the pool, cheap to keep: tests and the tuning notes of docs/operations.md read them. */
export interface IngestStats {
  /** Row tasks run, continuations included. */
  pieces: number;
  /** Row tasks that completed an element a wrong cut had split (the slower path). */
  continuations: number;
  /** Row tasks the byte-level scanner answered (the others took `JSON.parse` + typia). */
  scanned: number;
  /** Bodies validated in one task (layouts the sink does not stream). */
  oneShots: number;
  /** Skeletons too large to check on the main thread. */
  skeletonTasks: number;
  /** Row tasks small enough to run on the main thread (`inlineBytes`), without a worker's round trip. */
  inline: number;
}

/** What the pool lends one sink. */
export interface Engine {
  /**
   * Runs a task when the pool has room for it (priority: before waiting pieces), transferring
   * `transfer`. With a `cost` (`parseCost` of what the task parses whole: a body, a long row,
   * a skeleton), it first waits its turn in the pool's `ParseGate` (see `memory.ts`).
   */
  run<R>(task: Task, transfer: ArrayBuffer[], signal: AbortSignal, priority: boolean, cost?: number): Promise<R>;
  readonly buffers: Buffers;
  /** What the sink holds whole (see `memory.ts`); released by `release()`. */
  readonly memory: MemoryAccount;
  readonly stats: IngestStats;
  readonly pieceBytes: number;
  readonly piecesPerRequest: number;
  readonly batchBytes: number;
  readonly headBytes: number;
  /** Skeletons up to this size are checked on the main thread. */
  readonly inlineSkeletonBytes: number;
  /** Gives back the sink's admission; called once, when the sink is done. */
  release(): void;
}
