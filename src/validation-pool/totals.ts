/**
 * The pool's ingest totals, kept by a decorator around each request's sink: a package is
 * counted once, when it settles (accepted, rejected or failed), with its rows and bytes
 * when accepted. Counters, not per-row work; `observability/metrics.ts` reads them at scrape
 * time (`ingest_packages_total`, `ingest_rows_validated_total`, the byte counters).
 */
import { isServiceError } from '../errors.js';
import type { IngestResult, IngestSink } from './types.js';

export interface IngestTotals {
  /** Packages whose every row passed. */
  accepted: number;
  /** Packages answered 422 or 413 (a bad row, not JSON, too large). */
  rejected: number;
  /** Packages that ended otherwise: client gone, worker or store failure. */
  failed: number;
  /** Rows of accepted packages. */
  rows: number;
  /** Request body bytes of accepted packages, as received (compressed when gzip). */
  bodyBytes: number;
  /** NDJSON bytes of accepted packages appended to the queue. */
  encodedBytes: number;
}

/** Counts a sink's package into the pool's totals once, when it settles: counters, not per-row work. */
export class CountedIngest implements IngestSink {
  readonly #inner: IngestSink;
  readonly #totals: IngestTotals;
  #bodyBytes = 0;
  #counted = false;
  #ended: Promise<IngestResult> | null = null;

  constructor(inner: IngestSink, totals: IngestTotals) {
    this.#inner = inner;
    this.#totals = totals;
  }

  write(chunk: Uint8Array): boolean {
    this.#bodyBytes += chunk.byteLength;
    return this.#inner.write(chunk);
  }

  onDrain(cb: () => void): void {
    this.#inner.onDrain(cb);
  }

  get decided(): boolean {
    return this.#inner.decided;
  }

  end(): Promise<IngestResult> {
    return (this.#ended ??= this.#inner.end().then(
      (result) => {
        if (this.#count('accepted')) {
          this.#totals.rows += result.rows;
          this.#totals.bodyBytes += this.#bodyBytes;
          this.#totals.encodedBytes += result.bytes;
        }
        return result;
      },
      (err: unknown) => {
        const code = isServiceError(err) ? err.code : null;
        this.#count(code === 'INVALID_PAYLOAD' || code === 'VALIDATION_FAILED' || code === 'BODY_TOO_LARGE' ? 'rejected' : 'failed');
        throw err;
      },
    ));
  }

  abort(): void {
    this.#inner.abort();
    if (!this.#ended) this.#count('failed');
  }

  #count(outcome: 'accepted' | 'rejected' | 'failed'): boolean {
    if (this.#counted) return false;
    this.#counted = true;
    this.#totals[outcome]++;
    return true;
  }
}
