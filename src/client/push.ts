/**
 * `push`: a file's rows into one session, as packages under a size, `parallel` at a time.
 *
 * - Memory is bounded: the source is read only when a send slot is free, so at most
 *   `parallel` packages are in flight and one is being filled.
 * - Every package is sent with `ingestWithRetry` and an `Idempotency-Key` derived from the
 *   session, the entity, the package's index and the SHA-256 of its body: a retry, and a
 *   re-run of the same push of the same file (same content, same package size) into the same
 *   session, repeat the key, so the service answers instead of storing the rows again. The
 *   path does not enter the key; a changed file makes changed packages and new keys.
 * - A package that fails for good (a 4xx, or retries spent) stops the reading of new
 *   packages unless `keepGoing`; the packages in flight finish either way.
 * - A file that stops being readable (an `INPUT` error: a broken record, a row too large for
 *   a package) ends the reading. The rows since the last package sealed are not sent
 *   (`unsent_from`): the fixed file cuts the same packages before them, with the same keys, so
 *   pushing it again stores every row once (sent as a package of their own, they would come
 *   again inside a longer one).
 */
import { createHash } from 'node:crypto';
import type { IngestClient } from './client.js';
import { RETRY_DEFAULTS } from './defaults.js';
import { describeDetail, isApiError, isClientError, isRecord, type ClientError } from './errors.js';
import { Packer, type Package } from './packer.js';
import { isRetryable, type RetryPolicy } from './retry.js';
import type { RowSource } from './sources.js';

export interface PushOptions {
  client: IngestClient;
  uploadUuid: string;
  entity: string;
  source: RowSource;
  /** Largest body in bytes (uncompressed JSON). */
  packageBytes: number;
  /** Packages in flight at once. */
  parallel: number;
  gzip?: boolean;
  /** Check every package (`?dry_run=true`): the answers are real, nothing is stored. */
  dryRun?: boolean;
  /**
   * Part of every package's `Idempotency-Key`: packages of two pushes with different scopes
   * are two packages even when equal. Without it, keys are those of earlier versions, so a
   * re-run of a one-file push still finds its stored packages (`ingest push` sets none).
   */
  keyScope?: string;
  /**
   * The keys sent by the earlier pushes of one run of several inputs, added to as packages
   * are sent: a package whose key is there (an equal package of an earlier input) takes the
   * key of its repeat instead, so that the two are two packages. Nothing else of the run enters
   * a key: an input pushed again alone, from another folder or in another place among other
   * inputs repeats its keys, and the packages it had stored are answered, not stored again.
   */
  sentKeys?: Set<string>;
  keepGoing?: boolean;
  retry?: RetryPolicy;
  signal?: AbortSignal;
  onEvent?: (event: PushEvent) => void;
}

export type PushEvent =
  | { type: 'sent'; index: number; rows: number; bytes: number }
  | { type: 'retry'; index: number; retry: number; delayMs: number; error: ClientError }
  | { type: 'accepted'; index: number; rows: number; bytes: number; sourceBytes: number; replayed: boolean }
  | { type: 'failed'; index: number; failure: PackageFailure };

export interface PackageFailure {
  package: number;
  /** 1-based number in the file of the package's first row, and of the offending row when the service named one. */
  first_record: number;
  rows: number;
  record?: number;
  code: string;
  status: number | null;
  detail: unknown;
  message: string;
  /** The errors the service listed (its first 100, one per bad value, in row then column order), each with its record in the file. */
  errors?: RefusedRow[];
  /** How many errors the service found in the package (may exceed `errors.length`). */
  error_count?: number;
}

/** One error of a 422 (a bad value of a refused row): `row` is its index in the package, `record` its 1-based number in the file. */
export interface RefusedRow {
  row: number;
  record: number;
  column: string | null;
  message: string;
}

export interface PushSummary {
  upload_uuid: string;
  entity: string;
  file: string;
  format: string;
  packages_sent: number;
  packages_accepted: number;
  packages_failed: number;
  /** Accepted packages the service had already stored (a re-run): answered from their key, not stored again. */
  packages_replayed: number;
  /** Rows taken into packages, in file order (a row too large for any package is not one of them). */
  rows_read: number;
  rows_sent: number;
  rows_accepted: number;
  /** Bytes of the bodies accepted (their JSON, uncompressed: what the service counts against its limits). */
  bytes_accepted: number;
  /** Bytes of the file whose rows were accepted (the unit of the progress bar). */
  file_bytes_accepted: number;
  file_bytes: number;
  retries: number;
  elapsed_ms: number;
  failures: PackageFailure[];
  /** The file stopped being readable as rows (nothing from `unsent_from` on was sent). */
  input_error: string | null;
  /** With `input_error`: the file record from which on nothing was sent (the open package's first), or null when that is the bad record itself. */
  unsent_from: number | null;
  aborted: boolean;
}

/** The 422 of a key already used for another request (docs/api.md, Idempotency-Key). */
const isKeyReused = (err: unknown): boolean => isApiError(err) && err.status === 422 && typeof err.detail === 'string' && err.detail.startsWith('Idempotency-Key was already used');

/** The `Idempotency-Key` of one package. */
export function packageKey(uploadUuid: string, entity: string, index: number, body: Uint8Array, scope?: string): string {
  const bodyHash = createHash('sha256').update(body).digest('hex');
  const parts = ['ingest-push/1', uploadUuid, entity, index, bodyHash, ...(scope === undefined ? [] : [scope])];
  const key = createHash('sha256').update(JSON.stringify(parts)).digest('base64url');
  return `push-${key.slice(0, 40)}`;
}

export async function push(opts: PushOptions): Promise<PushSummary> {
  const started = performance.now();
  const summary: PushSummary = {
    upload_uuid: opts.uploadUuid,
    entity: opts.entity,
    file: opts.source.path,
    format: opts.source.format,
    packages_sent: 0,
    packages_accepted: 0,
    packages_failed: 0,
    packages_replayed: 0,
    rows_read: 0,
    rows_sent: 0,
    rows_accepted: 0,
    bytes_accepted: 0,
    file_bytes_accepted: 0,
    file_bytes: opts.source.totalBytes,
    retries: 0,
    elapsed_ms: 0,
    failures: [],
    input_error: null,
    unsent_from: null,
    aborted: false,
  };
  const emit = opts.onEvent ?? (() => {});
  const inFlight = new Set<Promise<void>>();
  let stop = false;
  let sourceMark = 0;

  const send = async (pkg: Package, sourceBytes: number): Promise<void> => {
    summary.packages_sent++;
    summary.rows_sent += pkg.rows;
    emit({ type: 'sent', index: pkg.index, rows: pkg.rows, bytes: pkg.body.length });
    let key = packageKey(opts.uploadUuid, opts.entity, pkg.index, pkg.body, opts.keyScope);
    if (opts.sentKeys) {
      for (let repeat = 1; opts.sentKeys.has(key); repeat++) key = packageKey(opts.uploadUuid, opts.entity, pkg.index, pkg.body, `${opts.keyScope ?? ''}#repeat ${repeat}`);
      opts.sentKeys.add(key);
    }
    const ingest = (gzip: boolean) =>
      opts.client.ingestWithRetry(
        opts.uploadUuid,
        opts.entity,
        pkg.body,
        { idempotencyKey: key, gzip, dryRun: opts.dryRun ?? false, signal: opts.signal },
        {
          ...opts.retry,
          onRetry: (info) => {
            summary.retries++;
            emit({ type: 'retry', index: pkg.index, retry: info.retry, delayMs: info.delayMs, error: info.error });
            opts.retry?.onRetry?.(info);
          },
        },
      );
    try {
      const gzip = opts.gzip ?? false;
      // The key names the package's rows, but the service binds it to the body's length on the
      // wire as well: a package sent before in the other coding (a re-run with --gzip added or
      // dropped) is refused as another request. Sent in that coding, it is answered from its key.
      const res = await ingest(gzip).catch((err: unknown) => {
        if (isKeyReused(err)) return ingest(!gzip);
        throw err;
      });
      summary.packages_accepted++;
      if (res.replayed) summary.packages_replayed++;
      summary.rows_accepted += res.rows_processed;
      summary.bytes_accepted += pkg.body.length;
      summary.file_bytes_accepted += sourceBytes;
      emit({ type: 'accepted', index: pkg.index, rows: res.rows_processed, bytes: pkg.body.length, sourceBytes, replayed: res.replayed });
    } catch (err) {
      summary.packages_failed++;
      const failure = describeFailure(pkg, err, opts.retry?.maxRetryAfterMs ?? RETRY_DEFAULTS.maxRetryAfterMs);
      summary.failures.push(failure);
      emit({ type: 'failed', index: pkg.index, failure });
      if (!opts.keepGoing) stop = true;
    }
  };

  const dispatch = async (pkg: Package) => {
    while (inFlight.size >= opts.parallel) await Promise.race(inFlight);
    if (stop || opts.signal?.aborted) return false;
    // The file bytes this package stands for, for progress (read-ahead makes it approximate).
    const sourceBytes = Math.max(0, opts.source.bytesRead - sourceMark);
    sourceMark = opts.source.bytesRead;
    const p = send(pkg, sourceBytes).finally(() => inFlight.delete(p));
    inFlight.add(p);
    return true;
  };

  const packer = new Packer(opts.packageBytes);
  try {
    reading: {
      for await (const batch of opts.source.rows()) {
        for (const row of batch) {
          if (stop || opts.signal?.aborted) break reading;
          const sealed = packer.add(row);
          summary.rows_read++;
          if (sealed && !(await dispatch(sealed))) break reading;
        }
      }
      const last = packer.flush();
      if (last && !stop && !opts.signal?.aborted) await dispatch(last);
    }
  } catch (err) {
    if (!isClientError(err) || err.code !== 'INPUT') throw err;
    summary.input_error = err.message;
    summary.unsent_from = packer.flush()?.firstRecord ?? null;
  } finally {
    await Promise.all(inFlight);
  }
  summary.aborted = opts.signal?.aborted ?? false;
  summary.elapsed_ms = Math.round(performance.now() - started);
  return summary;
}

const ROW_IN_DETAIL = /^Invalid data types in payload: row (\d+)\b/;

function describeFailure(pkg: Package, err: unknown, maxRetryAfterMs: number): PackageFailure {
  const failure: PackageFailure = {
    package: pkg.index,
    first_record: pkg.firstRecord,
    rows: pkg.rows,
    code: isClientError(err) ? err.code : 'INTERNAL',
    status: isClientError(err) ? err.status : null,
    detail: isApiError(err) ? err.detail : null,
    message: isApiError(err) ? describeDetail(err.body) : (err as Error).message,
  };
  // A wait the retries do not make: else the answer reads as retried and failed again, or as never retried for no reason.
  if (isRetryable(err) && err.retryAfter !== null && err.retryAfter * 1000 > maxRetryAfterMs) {
    failure.message += ` (the service asked to wait ${err.retryAfter} s, longer than the ${maxRetryAfterMs / 1000} s a retry waits at most)`;
  }
  const row = typeof failure.detail === 'string' ? ROW_IN_DETAIL.exec(failure.detail) : null;
  if (row) failure.record = pkg.firstRecord + Number(row[1]);
  const body = isApiError(err) && isRecord(err.body) ? err.body : null;
  if (body && Array.isArray(body.errors) && typeof body.error_count === 'number') {
    failure.errors = body.errors.filter(isRowError).map((e) => ({ row: e.row, record: pkg.firstRecord + e.row, column: e.column, message: e.message }));
    failure.error_count = body.error_count;
  }
  return failure;
}

function isRowError(value: unknown): value is { row: number; column: string | null; message: string } {
  return isRecord(value) && Number.isSafeInteger(value.row) && (value.column === null || typeof value.column === 'string') && typeof value.message === 'string';
}
