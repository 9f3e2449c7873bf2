/**
 * What the main thread and the validation workers (`workers/validate.ts`) send each other.
 * Buffers travel transferred, never copied: a task's byte parts go to the worker and come
 * back with the result, so the sink can reuse them or still owns them when a cut was wrong.
 */
import type { ValidationIssue } from '../errors.js';

/** How much a worker does with the rows of a piece. Each level includes the ones below. */
export const Mode = {
  /** JSON validity only: an earlier structural issue already decides the answer. */
  parse: 0,
  /** Plus the first element of `data` that is not a list (Pydantic's step 2). */
  check: 1,
  /** Plus every row against the columns, and NDJSON batches when all passed. */
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

export type BodyResult =
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
  /** Local index of the first element that is not a list (`Mode.check` and up), else -1. */
  notList: number;
  /** `rowNotListInput` of that element. */
  notListInput?: unknown;
  /** The first row that failed (`Mode.validate`, only when every element was a list). */
  rowError: { index: number; problem: string } | null;
  /** NDJSON batches of the completed rows, in order: only in `Mode.validate` when every row passed. Transferred. */
  batches: ArrayBuffer[];
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

export type Task = BodyTask | RowsTask | SkeletonTask;

/** The pool's `workerData`: set up once per worker thread. */
export interface WorkerData {
  /** Steps of niceness the thread adds to its own (see `ValidationPoolOptions.workerNice`). */
  nice: number;
}
