/**
 * Validation: a body's bytes → checked rows → the NDJSON lines that are stored. What lies
 * outside this folder imports this file only.
 *
 * On the main thread: the head scan (`head.ts`), the row cutter (`cutter.ts`) and the
 * skeleton check (`skeleton.ts`). In the workers (the piscina entry `worker.ts`, loaded by
 * path: `WORKER_FILE`): the rows of a piece (`rows.ts`: the byte-level row scanner
 * `row-scanner.ts`; the reference path, `JSON.parse` + the typia checkers, with the exact
 * rescan of `element-scan.ts`; the encoders `encode.ts` and `ndjson.ts`), the whole body
 * (`body.ts`), the skeleton, and the scan for a repeated key (`repeated-key.ts`). `tasks.ts`:
 * the messages between the two sides.
 */
export { parseCost } from './body.js';
export { PieceCutter, type Buffers } from './cutter.js';
export { HeadScanner } from './head.js';
export { processRows } from './rows.js';
export { SENTINEL, SENTINEL_JSON, checkSkeleton, type SkeletonFacts } from './skeleton.js';
export { Mode, type BodyResult, type Lines, type RowsResult, type RowsTask, type ScanState, type Task, type WorkerData } from './tasks.js';

/** The piscina worker entry (`worker.ts`) as a file URL, next to this file in dist/ as in the sources. */
export const WORKER_FILE = new URL('./worker.js', import.meta.url).href;
