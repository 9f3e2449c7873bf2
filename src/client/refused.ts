/**
 * Every error of a refused package, not only the first 100 its 422 lists. The service checks
 * every row and value of a package but describes the first `errors` (100, in row then column
 * order) and counts the rest (`error_count`); the rest are found by dry runs
 * (`?dry_run=true`: nothing is stored) of the package's rows from the last row listed on:
 *
 * - The last row listed is checked again: the cap may have cut its errors (the 100th entry
 *   may be the first of a row's two), and a row's errors come whole from one answer. Only a
 *   row that is itself the first of a check and has more than 100 errors stays cut.
 * - A check sends a window of the rows left, as many as should hold about 100 errors at the
 *   density the last answer found (in its rows not described, when it was cut; twice its rows
 *   when it found none; all the rows left when at most 100 errors are left), with
 *   the package's own columns (object rows: missing keys as `null`, as the packer sent them), so
 *   each row is checked as it was in the package. An answer that lists all its errors moves on
 *   past its window; the checks end when every counted error is described or no row is left.
 *   Each row is sent again about once.
 * - The checks of a push are bounded (`budget`): the rows not checked when it runs out (or when
 *   a check fails for good) are returned as `unchecked`, so a caller can say so.
 *
 * Rows are checked one by one by the service (no error depends on another row), so a row
 * has the same errors in a window as in its package. `row` indices are the package's (0-based).
 */
import type { IngestClient } from './client.js';
import { isApiError, isClientError, isRecord } from './errors.js';
import type { RetryPolicy } from './retry.js';
import type { SourceRow } from './sources.js';

/** One problem of a row: a bad value (`column`), or the row as a whole (`column` null). */
export interface RowProblem {
  column: string | null;
  message: string;
}

export interface RefusedPackageErrors {
  /** Each refused row's problems by its index in the package, in column order. */
  byRow: Map<number, RowProblem[]>;
  /** The problems described (the sum over `byRow`). */
  described: number;
  /** Dry runs made. */
  checks: number;
  /** The first row (package index) whose problems could not be checked (the budget ran out, or a check failed), with why; null when every row was. */
  unchecked: { from: number; reason: string } | null;
}

export interface DescribeOptions {
  client: IngestClient;
  uploadUuid: string;
  entity: string;
  /** The package's rows, in order. */
  rows: readonly SourceRow[];
  /** The 422 of the package: its `errors` (`row` indexing `rows`) and `error_count`. */
  listed: readonly { row: number; column: string | null; message: string }[];
  errorCount: number;
  /** Dry runs this call may make; `used` counts them across calls (one budget for a push). */
  budget: { max: number; used: number };
  gzip?: boolean;
  retry?: RetryPolicy;
  signal?: AbortSignal;
}

/** The service's cap on the errors an answer lists. */
export const LISTED_MAX = 100;

export async function describeRefusedPackage(opts: DescribeOptions): Promise<RefusedPackageErrors> {
  const { rows } = opts;
  const out: RefusedPackageErrors = { byRow: new Map(), described: 0, checks: 0, unchecked: null };
  const columns = packageColumns(rows);
  let listed = opts.listed;
  let counted = opts.errorCount;
  let base = 0; // the package index of the answer's row 0
  let end = rows.length; // the end of the rows the answer stands for
  for (;;) {
    for (const e of listed) {
      const at = base + e.row;
      if (!Number.isSafeInteger(e.row) || e.row < 0 || at >= end) continue;
      const problems = out.byRow.get(at) ?? [];
      if (problems.length === 0) out.byRow.set(at, problems);
      problems.push({ column: e.column, message: e.message });
      out.described++;
    }
    let next = end;
    // Errors of the answer's rows from `next` on that it counted but did not list.
    let unlisted = 0;
    if (listed.length < counted && listed.length > 0) {
      // Cut: resume at the last row listed (its errors may be cut too), unless it opened this answer.
      const last = base + listed[listed.length - 1]!.row;
      if (last > base) {
        out.described -= out.byRow.get(last)?.length ?? 0;
        out.byRow.delete(last);
        next = last;
      } else next = last + 1;
      unlisted = counted - listed.filter((e) => base + e.row < next).length;
    }
    const left = opts.errorCount - out.described;
    if (next >= rows.length || left <= 0) return out;
    if (opts.budget.used >= opts.budget.max) {
      out.unchecked = { from: next, reason: `not checked: a push makes at most ${opts.budget.max} dry runs to find errors` };
      return out;
    }
    // About 100 errors' worth of rows, at the density the last answer found (`sizeOf`).
    const remaining = rows.length - next;
    const size = left <= LISTED_MAX ? remaining : Math.max(1, Math.min(remaining, sizeOf(end - base, counted, end - next, unlisted)));
    opts.budget.used++;
    out.checks++;
    base = next;
    end = next + size;
    try {
      await opts.client.ingestWithRetry(opts.uploadUuid, opts.entity, windowBody(rows, base, end, columns), { dryRun: true, gzip: opts.gzip ?? false, signal: opts.signal }, opts.retry ?? {});
      listed = [];
      counted = 0;
    } catch (err) {
      const body = isApiError(err) && err.status === 422 && isRecord(err.body) ? err.body : null;
      if (!body || !Array.isArray(body.errors) || typeof body.error_count !== 'number') {
        if (!isClientError(err) || err.code === 'ABORTED') throw err;
        out.unchecked = { from: base, reason: `not checked: the dry run of these rows failed: ${err.message}` };
        return out;
      }
      listed = body.errors.filter(isRowError);
      counted = body.error_count;
    }
  }
}

/**
 * The rows of the next check, for about `LISTED_MAX` errors: a cut answer counted `unlisted`
 * errors in its last `tail` rows; a whole one `counted` in its `window` rows (none: twice the rows).
 */
function sizeOf(window: number, counted: number, tail: number, unlisted: number): number {
  if (unlisted > 0) return Math.floor((tail * LISTED_MAX) / unlisted);
  if (counted > 0) return Math.floor((window * LISTED_MAX) / counted);
  return 2 * window;
}

function isRowError(value: unknown): value is { row: number; column: string | null; message: string } {
  return isRecord(value) && Number.isSafeInteger(value.row) && (value.column === null || typeof value.column === 'string') && typeof value.message === 'string';
}

/** The package's columns: an array row's own, or the keys of its object rows in first-seen order (as the packer makes them). */
function packageColumns(rows: readonly SourceRow[]): readonly string[] {
  const first = rows[0];
  if (first === undefined) return [];
  if (first.kind === 'array') return first.columns;
  const seen = new Set<string>();
  for (const row of rows) if (row.kind === 'object') for (const key of Object.keys(row.value)) seen.add(key);
  return [...seen];
}

/** The ingest body of `rows[from, to)` with the package's `columns`: each row as the packer sent it. */
function windowBody(rows: readonly SourceRow[], from: number, to: number, columns: readonly string[]): string {
  const data: string[] = [];
  for (let i = from; i < to; i++) {
    const row = rows[i]!;
    if (row.kind === 'array') data.push(row.json);
    else data.push(`[${columns.map((c) => (Object.hasOwn(row.value, c) ? JSON.stringify(row.value[c]) : 'null')).join(',')}]`);
  }
  return `{"columns":${JSON.stringify(columns)},"data":[${data.join(',')}]}`;
}
