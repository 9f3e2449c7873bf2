/**
 * The validation pool: the piscina worker threads that run the validation module
 * (src/validation/), and the per-request sink a body is fed into. What lies outside this
 * folder imports this file only.
 *
 * pool.ts: `ValidationPool`, composed of admission.ts (the requests open at once, a client's
 * share of them), scheduler.ts (task slots behind a TaskQueue), buffers.ts (piece buffers) and
 * memory.ts (the budget of bytes held whole); stream.ts: the streaming sink; gzip.ts: the
 * inflating sink in front of it; totals.ts: the decorator that counts each package into the
 * totals; types.ts: the contracts (`IngestSink`, also the HTTP edge's body sink;
 * `IngestOptions`, `IngestResult`, `Engine`).
 */
export { ValidationPool, type PoolLoad, type ValidationPoolOptions } from './pool.js';
export type { IngestTotals } from './totals.js';
export type { IngestOptions, IngestResult, IngestSink } from './types.js';
