/**
 * `ingest push --errors FILE`: every record of the inputs that the service did not accept,
 * written in the inputs' format with its problems, so that the values can be fixed in FILE and
 * FILE sent as it is (reading drops the reserved columns, `RESERVED_COLUMNS` of sources.ts).
 *
 * - **What:** every record of every package that failed: the refused rows of a 422 with their
 *   problems, every one (past the service's first 100 by dry runs, `describeRefusedPackage`),
 *   and the other records of those packages with none (a package is refused whole, so they
 *   were not stored either); every record of a package that failed otherwise (another status,
 *   retries spent) with that failure. So FILE holds exactly what the session is missing of the
 *   inputs, and sending FILE, fixed, completes it.
 * - **How:** CSV inputs give CSV: the input's header (several CSV inputs: the union of their
 *   headers, in first-seen order; a column an input lacks is left empty, which reads as null),
 *   then `_file` (several inputs only: the input as named), `_record` (the record's number in
 *   that input) and `_errors` last (`price: expected number >= 0, got -1; …`, a row's own
 *   problem without a column). NDJSON and JSON inputs give NDJSON: each record as read, an
 *   object (rows of a header-array layout keyed by their columns), plus `_file`, `_record` and
 *   `_errors: [{column, message}]`. CSV and NDJSON/JSON inputs do not mix in one push with
 *   `--errors` (a usage error, before anything is sent).
 * - **Crash safety:** written to `.FILE.<random>.tmp` beside FILE (opened before the session is
 *   touched, so an unwritable place fails first), fsynced and renamed over FILE at the end. With
 *   no record to write, no FILE is left: an older FILE of that name is removed (it would have
 *   been replaced). Interrupted, FILE is left as it was.
 */
import { randomBytes } from 'node:crypto';
import { realpathSync, statSync } from 'node:fs';
import { open, rename, rm, unlink, type FileHandle } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';
import type { IngestClient } from '../client/client.js';
import { UsageError } from '../client/cli-config.js';
import { InputError } from '../client/errors.js';
import type { PackageFailure } from '../client/push.js';
import { describeRefusedPackage, type RowProblem } from '../client/refused.js';
import type { RetryPolicy } from '../client/retry.js';
import { formatFromPath, openSource, type SourceFormat, type SourceRow } from '../client/sources.js';
import type { CatalogEntity } from '../client/types.js';
import { fsyncDir } from '../durable-file.js';

export type ErrorsFormat = 'csv' | 'ndjson';

/** Dry runs a push makes at most to describe the errors past a 422's first 100 (about 100 more errors each). */
export const ERROR_CHECKS_MAX = 1000;

/** The errors file's format for these inputs, and the checks of its path; usage errors before anything is sent. */
export function errorsFileFormat(path: string, inputs: readonly { name: string; path: string; format: SourceFormat }[]): ErrorsFormat {
  const formats = new Set(inputs.map((i) => (i.format === 'csv' ? 'csv' : 'ndjson')));
  if (formats.size > 1) throw new UsageError('push --errors: the inputs mix CSV with NDJSON/JSON, and one errors file holds one format: push them separately');
  const format: ErrorsFormat = formats.has('csv') ? 'csv' : 'ndjson';
  const named = formatFromPath(path);
  if (format === 'csv' && named !== 'csv') throw new UsageError(`--errors ${path}: CSV inputs give a CSV errors file; name it *.csv, so that \`ingest push\` reads it back`);
  if (format === 'ndjson' && named !== 'ndjson') {
    throw new UsageError(`--errors ${path}: NDJSON and JSON inputs give an NDJSON errors file; name it *.ndjson or *.jsonl, so that \`ingest push\` reads it back`);
  }
  if (statSync(path, { throwIfNoEntry: false })?.isFile() === false) throw new UsageError(`--errors ${path}: not a file`);
  const target = canonical(path);
  for (const input of inputs) {
    if (input.name !== 'standard input' && canonical(input.path) === target) throw new UsageError(`--errors ${path}: that is an input of this push; name another file`);
  }
  return format;
}

/** The file a path names (its folder's links resolved when the file is not there yet). */
function canonical(path: string): string {
  try {
    return realpathSync(path);
  } catch {
    try {
      return join(realpathSync(dirname(path)), basename(path));
    } catch {
      return resolve(path);
    }
  }
}

export class ErrorsFile {
  /** Records written. */
  records = 0;
  /** Records written with problems of their own. */
  withProblems = 0;
  /** Records written whose problems were not checked (the budget of dry runs ran out, or one failed). */
  unchecked = 0;
  #fh: FileHandle | null;
  #out: string[] = [];
  #outChars = 0;
  /** CSV: where each input's columns go in the header (by the input's columns array). */
  readonly #slots = new WeakMap<readonly string[], number[]>();

  private constructor(
    readonly path: string,
    readonly format: ErrorsFormat,
    private readonly tmp: string,
    fh: FileHandle,
    private readonly header: readonly string[],
    private readonly withFile: boolean,
  ) {
    this.#fh = fh;
  }

  /** Creates the temp file beside `path`. `columns`: the CSV header (the union of the inputs' columns); `withFile`: several inputs (a `_file` column). */
  static async open(path: string, format: ErrorsFormat, columns: readonly string[], withFile: boolean): Promise<ErrorsFile> {
    const tmp = join(dirname(path), `.${basename(path)}.${randomBytes(6).toString('hex')}.tmp`);
    let fh: FileHandle;
    try {
      fh = await open(tmp, 'wx');
    } catch (err) {
      throw new UsageError(`--errors ${path}: cannot write beside it: ${(err as Error).message}`);
    }
    const file = new ErrorsFile(path, format, tmp, fh, columns, withFile);
    if (format === 'csv') file.#push(`${[...columns, ...(withFile ? ['_file'] : []), '_record', '_errors'].map(csvField).join(',')}\n`);
    return file;
  }

  async add(row: SourceRow, problems: readonly RowProblem[], input: string, unchecked = false): Promise<void> {
    this.records++;
    if (problems.length > 0 && !unchecked) this.withProblems++;
    if (unchecked) this.unchecked++;
    if (this.format === 'csv') {
      const cells = new Array<string>(this.header.length).fill('');
      const values = row.kind === 'array' ? (row.fields ?? JSON.parse(row.json).map(csvText)) : this.header.map((c) => csvText(row.value[c]));
      const slots = row.kind === 'array' ? this.#slotsOf(row.columns) : this.header.map((_, i) => i);
      values.forEach((v: string, i: number) => (cells[slots[i]!] = v));
      const text = problems.map((p) => (p.column === null ? p.message : `${p.column}: ${p.message}`)).join('; ');
      const line = [...cells, ...(this.withFile ? [input] : []), String(row.record), text];
      this.#push(`${line.map(csvField).join(',')}\n`);
    } else {
      const value = row.kind === 'object' ? row.value : objectOf(row.columns, JSON.parse(row.json) as unknown[]);
      const extra = { ...(this.withFile ? { _file: input } : {}), _record: row.record, _errors: problems.map((p) => ({ column: p.column, message: p.message })) };
      this.#push(`${JSON.stringify({ ...value, ...extra })}\n`);
    }
    if (this.#outChars >= 1 << 20) await this.#flush();
  }

  /** FILE in place (`written`), or, with no record written, no FILE at all: `removed` when an older one was there. */
  async commit(): Promise<'written' | 'none' | 'removed'> {
    const fh = this.#fh;
    if (!fh) throw new Error('errors file: already closed');
    if (this.records === 0) {
      await this.discard();
      try {
        await unlink(this.path);
        return 'removed';
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') return 'none';
        throw err;
      }
    }
    await this.#flush();
    await fh.sync();
    await fh.close();
    this.#fh = null;
    await rename(this.tmp, this.path);
    await fsyncDir(dirname(this.path));
    return 'written';
  }

  /** Removes the temp file; FILE is left as it was. */
  async discard(): Promise<void> {
    const fh = this.#fh;
    this.#fh = null;
    await fh?.close().catch(() => undefined);
    await rm(this.tmp, { force: true });
  }

  #slotsOf(columns: readonly string[]): number[] {
    let slots = this.#slots.get(columns);
    if (!slots) {
      slots = columns.map((c) => this.header.indexOf(c));
      if (slots.includes(-1)) throw new Error(`errors file: a column missing from the header (${columns.join(', ')})`);
      this.#slots.set(columns, slots);
    }
    return slots;
  }

  #push(text: string): void {
    this.#out.push(text);
    this.#outChars += text.length;
  }

  async #flush(): Promise<void> {
    if (!this.#fh || this.#out.length === 0) return;
    const text = this.#out.join('');
    this.#out = [];
    this.#outChars = 0;
    await this.#fh.write(text);
  }
}

/** A CSV field as written: quoted when it holds a comma, a quote or a line end. */
function csvField(value: string): string {
  return /[",\r\n]/.test(value) ? `"${value.replace(/"/g, '""')}"` : value;
}

/** A JSON value as a CSV field that reads back to it (null: empty). */
function csvText(value: unknown): string {
  if (value === null || value === undefined) return '';
  return typeof value === 'string' ? value : JSON.stringify(value);
}

function objectOf(columns: readonly string[], values: readonly unknown[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  columns.forEach((c, i) => (out[c] = values[i]));
  return out;
}

export interface RefusedInput {
  client: IngestClient;
  uploadUuid: string;
  entity: CatalogEntity;
  input: { name: string; path: string; format: SourceFormat };
  /** The failed packages of the input's push. */
  failures: readonly PackageFailure[];
  file: ErrorsFile;
  /** The dry runs of the whole push. */
  budget: { max: number; used: number };
  gzip?: boolean;
  retry?: RetryPolicy;
  signal?: AbortSignal;
}

/**
 * Reads the input again and writes the records of its failed packages to the errors file,
 * in file order; a 422's errors past its first 100 are found by dry runs. Reading stops after
 * the last failed package. Resolves with the records written.
 */
export async function writeRefused(opts: RefusedInput): Promise<number> {
  const { file, input } = opts;
  const before = file.records;
  const failures = [...opts.failures].sort((a, b) => a.first_record - b.first_record);
  if (failures.length === 0) return 0;
  const source = await openSource(input.path, input.format, opts.entity);
  let at = 0;
  let rows: SourceRow[] = [];
  reading: for await (const batch of source.rows()) {
    for (const row of batch) {
      const failure = failures[at]!;
      if (row.record < failure.first_record) continue;
      rows.push(row);
      if (rows.length < failure.rows) continue;
      await writePackage(opts, failure, rows);
      rows = [];
      if (++at === failures.length) break reading;
    }
  }
  if (at < failures.length) throw new InputError(`${input.name} holds fewer records than when it was pushed (it changed?): record ${failures[at]!.first_record + rows.length} is missing`);
  return file.records - before;
}

async function writePackage(opts: RefusedInput, failure: PackageFailure, rows: readonly SourceRow[]): Promise<void> {
  const { file } = opts;
  const name = opts.input.name;
  if (failure.errors === undefined || failure.error_count === undefined) {
    const problem = { column: null, message: `its package (file records ${failure.first_record}–${failure.first_record + failure.rows - 1}) failed: ${failure.status ?? failure.code} ${failure.message}` };
    for (const row of rows) await file.add(row, [problem], name);
    return;
  }
  const described = await describeRefusedPackage({
    client: opts.client,
    uploadUuid: opts.uploadUuid,
    entity: opts.entity.name,
    rows,
    listed: failure.errors,
    errorCount: failure.error_count,
    budget: opts.budget,
    ...(opts.gzip ? { gzip: true } : {}),
    ...(opts.retry ? { retry: opts.retry } : {}),
    ...(opts.signal ? { signal: opts.signal } : {}),
  });
  const unchecked = described.unchecked;
  for (const [i, row] of rows.entries()) {
    const problems = described.byRow.get(i);
    if (problems) await file.add(row, problems, name);
    else if (unchecked && i >= unchecked.from) await file.add(row, [{ column: null, message: unchecked.reason }], name, true);
    else await file.add(row, [], name);
  }
}
