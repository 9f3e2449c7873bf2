/**
 * What the main thread and the validation workers (`worker.ts`) send each other.
 * Buffers travel transferred, never copied: a task's byte parts go to the worker and come
 * back with the result, so the sink can reuse them or still owns them when a cut was wrong;
 * the buffer a task's NDJSON lines are written to goes out from the pool's free list and
 * comes back holding them, and returns to the list once they are stored.
 */
import type { RowError, RowFault, ValidationIssue } from '../errors.js';

/** How much a worker does with the rows of a piece. Each level includes the ones below. */
export const Mode = {
  /** JSON validity only: an earlier structural issue already decides the answer. */
  parse: 0,
  /** Plus the first element of `data` that is not a list (Pydantic's step 2). */
  check: 1,
  /** Plus every row against the columns (every refused row counted), and the NDJSON lines when all passed and `out` was given. */
  validate: 2,
} as const;
export type Mode = (typeof Mode)[keyof typeof Mode];

/** The whole body in one task: parse, validate, encode (the plain path; also the fallback). */
export interface BodyTask {
  kind: 'body';
  /** The request body, transferred. */
  body: ArrayBuffer;
  /** A catalog entity name. */
  entity: string;
  /** Upper bound of one batch, in bytes; a single longer line is a batch of its own. */
  batchBytes: number;
}

/**
 * NDJSON lines in `buffer[0, ends[ends.length - 1])`, cut into batches at `ends`: whole
 * lines, at most the batch size each, a longer line a batch of its own.
 */
export interface Lines {
  buffer: ArrayBuffer;
  ends: number[];
}

export type BodyResult =
  | {
      ok: true;
      rows: number;
      /** Total encoded bytes: `buffer[0, bytes)`. */
      bytes: number;
      columns: string[];
      /** NDJSON (`JSON.stringify(row)` + `\n` per row, the client's column order), in row order. Transferred. */
      buffer: ArrayBuffer;
      /** Where each batch of whole lines ends in `buffer` (see `Lines`). */
      ends: number[];
    }
  /** 422 with a string detail. */
  | { ok: false; kind: 'payload'; message: string }
  /** 422 of refused rows: the first `ROW_ERRORS_MAX` in row order, and how many there are. */
  | { ok: false; kind: 'rows'; errors: RowError[]; count: number }
  /** 422 with a Pydantic-style array. */
  | { ok: false; kind: 'validation'; issues: ValidationIssue[] };

/**
 * Scanner state at the end of bytes that stop inside an element of `data`:
 * `[inString 0|1, escape 0|1, depth]`, depth counted from the inside of `data`'s array.
 */
export type ScanState = [number, number, number];

/**
 * A region of `data`'s elements. The byte ranges are consecutive pieces of the body that
 * the main thread cut at commas, the commas left out: the text is the parts joined by `,`.
 *
 * Without `state`, the region starts right after `data`'s `[` or after a comma the main
 * thread guessed to separate two elements (a speculative start: the result counts only
 * if that guess held). With `state`, every part but the last is a carry: the bytes of an
 * unfinished element (and `state` the scanner's state at their end) that a previous task
 * could not complete, so only the last part needs scanning.
 */
export interface RowsTask {
  kind: 'rows';
  entity: string;
  /** The head's columns; only read in `Mode.validate`. */
  columns: string[];
  mode: Mode;
  /**
   * Where the lines go (`Mode.validate`): a free buffer of the pool, transferred, that comes
   * back in the result. Null: validate without writing lines (a row was refused already).
   */
  out: ArrayBuffer | null;
  /** How many errors (bad values) to describe at most (the answer lists the first `ROW_ERRORS_MAX`; the rest are only counted). */
  describe: number;
  parts: ArrayBuffer[];
  /** `[start0, end0, start1, end1, …]`: the bytes of each part. */
  ranges: number[];
  state: ScanState | null;
  /** The region starts right after `data`'s `[` (so it may be empty if the array is). */
  first: boolean;
  /** The region runs to the end of the body: `data`'s `]` and what follows are in it. */
  last: boolean;
  batchBytes: number;
}

export interface RowsResult {
  kind: 'rows';
  /**
   * false: the text is not JSON, assuming the region's start is right (and always when a
   * part is not UTF-8). A wrong start makes any result of this task meaningless.
   */
  ok: boolean;
  /** Elements completed by this task. */
  rows: number;
  /** The byte-level scanner answered (it did not decline the region). */
  scanned: boolean;
  /** Local index of the first element that is not a list (`Mode.check` and up), else -1. */
  notList: number;
  /** `rowNotListInput` of that element. */
  notListInput?: unknown;
  /** The first errors, one per bad value in row then column order (`Mode.validate`, only when every element was a list), at most `describe`, by local index. */
  rowErrors: LocalRowError[];
  /** Every error of the task: each bad value, a row of the wrong length one. */
  errorCount: number;
  /**
   * The task's `out` handed back (or a larger buffer in its place), transferred; it holds the
   * completed rows' NDJSON lines when `bytes` > 0 (only in `Mode.validate`, every row passed).
   */
  out: ArrayBuffer | null;
  /** Batch ends in `out` (see `Lines`). */
  ends: number[];
  bytes: number;
  /** The task's parts, handed back (transferred). */
  parts: ArrayBuffer[];
  /**
   * The region ended inside an element: its bytes run from `offset` in part `part` to the
   * end of the last part, and `state` is the scanner's state after them. Null when the
   * region ended on an element boundary (or at `data`'s end).
   */
  carry: { part: number; offset: number; state: ScanState } | null;
  /** `data`'s array ended inside the region: the rest of the body starts at `offset` in part `part` (after the `]`). */
  tail: { part: number; offset: number } | null;
}

/** The body without `data`'s elements, for the checks that need the whole object (see `skeleton.ts`). */
export interface SkeletonTask {
  kind: 'skeleton';
  /** UTF-8 of the head (through `data`'s `[`, no BOM), then the placeholder element and `]`, then the tail. Transferred. */
  text: ArrayBuffer;
  sentinel: string;
  headColumns: unknown;
}

/** An error of a refused row of a task: its index within the task's completed elements. */
export interface LocalRowError extends RowFault {
  index: number;
}

export type Task = BodyTask | RowsTask | SkeletonTask;

/** The pool's `workerData`: set up once per worker thread. */
export interface WorkerData {
  /** Steps of niceness the thread adds to its own (see `ValidationPoolOptions.workerNice`). */
  nice: number;
  /** Rows go through the byte-level scanner first (see `ValidationPoolOptions.rowScanner`). */
  rowScanner: boolean;
  /**
   * Shared memory where each worker thread notes its kernel thread id (Linux): `[count, tid…]`,
   * so that the CPU time of the workers can be told from the rest of the process's (`PoolLoad.threadTids`).
   */
  tids: Int32Array;
}
