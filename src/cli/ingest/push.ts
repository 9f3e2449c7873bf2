/**
 * `ingest push`: files of one entity into a session, and what it did with each.
 */
import { createWriteStream } from 'node:fs';
import { mkdtemp, readdir, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { pipeline } from 'node:stream/promises';
import type { IngestClient } from '../../client/client.js';
import { CLI_DEFAULTS } from '../../client/defaults.js';
import { UsageError } from '../../client/cli-config.js';
import { ApiError, isClientError } from '../../client/errors.js';
import { fmtCount, fmtInt, PushProgress, type ProgressMode } from '../../client/progress.js';
import { push, type PackageFailure, type PushSummary } from '../../client/push.js';
import { formatFromPath, openSource, SOURCE_FORMATS, type RowSource, type SourceFormat } from '../../client/sources.js';
import { ERROR_CHECKS_MAX, ErrorsFile, errorsFileFormat, writeRefused } from '../errors-file.js';
import { formatSize, integer, MAX_PARALLEL, MAX_RATE, number, parseSize, str } from './args.js';
import { initConflict, initialize } from './commands.js';
import { callOpts, EXIT, type Cli } from './context.js';

/** `open`: how an input becomes rows (a test counts the readers open at once). */
export async function pushCommand(cli: Cli, open: typeof openSource = openSource): Promise<number> {
  const v = cli.values;
  if (cli.positionals.length === 0) throw new UsageError('push: which file? (ingest push <file...> --entity E)');
  const entityName = str(v.entity);
  if (!entityName) throw new UsageError('push: --entity is required');
  if (v.new && v.upload) throw new UsageError('push: --new and --upload exclude each other');
  const formatFlag = str(v.format) as SourceFormat | undefined;
  if (formatFlag !== undefined && !SOURCE_FORMATS.includes(formatFlag)) throw new UsageError(`--format: expected ${SOURCE_FORMATS.join(', ')}, got ${JSON.stringify(formatFlag)}`);
  const sizeFlag = str(v['package-size']);
  const packageBytes = parseSize(sizeFlag ?? CLI_DEFAULTS.packageSize);
  const parallel = integer(v.parallel, 'parallel', CLI_DEFAULTS.parallel, 1, MAX_PARALLEL);
  const rate = number(v.rate, 'rate', CLI_DEFAULTS.rate, 0.1, MAX_RATE);
  const retries = integer(v.retries, 'retries', CLI_DEFAULTS.retries, 0, 100);
  const dryRun = v['dry-run'] === true;
  const errorsPath = str(v.errors);
  if (v.errors !== undefined && !errorsPath) throw new UsageError('--errors: which file?');
  // The errors file is what the session lacks of the inputs only when every package was sent.
  const keepGoing = dryRun || v['keep-going'] === true || errorsPath !== undefined;

  const spool = await mkdtemp(join(tmpdir(), 'ingest-stdin-'));
  let errors: ErrorsFile | null = null;
  try {
    const inputs = await pushInputs(cli, formatFlag, spool);
    const errorsFormat = errorsPath === undefined ? null : errorsFileFormat(errorsPath, inputs);
    // One socket per package in flight, and one for the session calls.
    const client = await cli.client({ connections: parallel + 1, requestsPerSecond: rate });
    const catalog = await cli.call(() => client.entities(callOpts(cli)));
    const entity = catalog.entities.find((e) => e.name === entityName);
    if (!entity) throw new UsageError(`--entity: unknown entity ${JSON.stringify(entityName)} (known: ${catalog.entities.map((e) => e.name).join(', ')})`);

    // Every header is checked before a session is touched: a wrong file changes nothing. One
    // input at a time, its reader ended after the check; each is read again from its start
    // when its turn comes, so memory holds one input's rows however many inputs there are.
    const sources: RowSource[] = [];
    const columns = new Set<string>();
    for (const input of inputs) {
      const source = await open(input.path, input.format, entity);
      for (const c of (await checkedColumns(source)) ?? []) columns.add(c);
      sources.push(source);
    }
    if (errorsPath !== undefined) errors = await ErrorsFile.open(errorsPath, errorsFormat!, [...columns], inputs.length > 1);
    const uploadUuid = await pushSession(cli, client);
    await cli.remember(uploadUuid);
    const cuts = await inputCuts(cli, uploadUuid, inputs, { bytes: packageBytes, given: sizeFlag !== undefined }, dryRun);

    const mode: ProgressMode = cli.quiet ? 'none' : cli.io.stderr.isTTY ? 'bar' : 'plain';
    const summaries: (PushSummary & { error_records?: number })[] = [];
    const lines: string[] = [];
    const checks = { max: ERROR_CHECKS_MAX, used: 0 };
    const sentKeys = new Set<string>();
    // A package stored after a refused one: the refused rows fixed in the input, its packages from
    // there on are cut anew (other bodies, other keys), and those stored would be stored again.
    let storedAfterRefused = false;
    let errorsFailed: string | null = null;
    for (const [i, source] of sources.entries()) {
      const name = inputs[i]!.name;
      const progress = new PushProgress(cli.io.stderr, mode, basename(name), source.totalBytes);
      if (mode !== 'none') cli.io.stderr.write(`${dryRun ? 'checking (dry run)' : 'pushing'} ${name} (${entity.name}, ${source.format}) ${dryRun ? 'against' : 'into'} upload ${uploadUuid}\n`);
      let summary: PushSummary;
      const order = { refused: Infinity, accepted: -1 };
      try {
        summary = await push({
          client,
          uploadUuid,
          entity: entity.name,
          source,
          packageBytes: cuts.sizes[i]!,
          parallel,
          gzip: v.gzip === true,
          dryRun,
          keepGoing,
          // Two inputs may hold the same package: the later one's is keyed as a repeat.
          ...(sources.length > 1 ? { sentKeys } : {}),
          retry: { retries },
          ...(cli.signal ? { signal: cli.signal } : {}),
          onEvent: (event) => {
            if (event.type === 'failed' && event.failure.status === 422) order.refused = Math.min(order.refused, event.index);
            if (event.type === 'accepted') order.accepted = Math.max(order.accepted, event.index);
            progress.onEvent(event);
          },
        });
      } finally {
        progress.finish();
      }
      if (!dryRun && order.accepted > order.refused) storedAfterRefused = true;
      if (!dryRun && summary.packages_accepted > 0) await cuts.stored(i);
      let errorRecords = 0;
      if (errors && errorsFailed === null && summary.failures.length > 0 && !summary.aborted) {
        if (mode !== 'none') cli.io.stderr.write(`writing the records of ${name} not accepted to ${errorsPath}\n`);
        try {
          const retry = { retries, ...(cli.signal ? { signal: cli.signal } : {}) };
          errorRecords = await writeRefused({ client, uploadUuid, entity, input: inputs[i]!, failures: summary.failures, file: errors, budget: checks, gzip: v.gzip === true, retry, ...(cli.signal ? { signal: cli.signal } : {}) });
        } catch (err) {
          if (isClientError(err) && err.code === 'ABORTED') summary.aborted = true;
          else errorsFailed = (err as Error).message;
        }
      }
      summaries.push({ ...summary, file: name, ...(errors ? { error_records: errorRecords } : {}) });
      lines.push(...summaryLines(summary, dryRun, sources.length > 1 || name !== source.path ? name : undefined, errorsPath));
      if (summary.aborted || (pushExit(summary) !== EXIT.OK && !keepGoing)) break;
    }
    let errorsResult = {};
    let written = false;
    if (errors) {
      const file = errors;
      errors = null;
      if (errorsFailed !== null || summaries.some((s) => s.aborted)) {
        await file.discard();
        lines.push(errorsFailed !== null ? `  ${file.path} not written: ${errorsFailed}` : `  interrupted: ${file.path} not written`);
      } else {
        try {
          const outcome = await file.commit();
          written = outcome === 'written';
          lines.push(errorsFileLine(file, outcome, dryRun, unreadRecords(summaries, sources.length > 1)));
        } catch (err) {
          await file.discard();
          lines.push(`  ${file.path} not written: ${(err as Error).message}`);
        }
      }
      errorsResult = { errors_file: written ? file.path : null, error_records: written ? file.records : 0 };
    }
    const exit = pushesExit(summaries, sources.length);
    const ok = exit === EXIT.OK;
    const result =
      summaries.length === 1 && sources.length === 1
        ? { ...summaries[0]!, ok, ...(dryRun ? { dry_run: true } : {}), ...errorsResult }
        : { ok, ...(dryRun ? { dry_run: true } : {}), ...errorsResult, files: summaries };
    const them = sources.length > 1 ? ['the files', 'them'] : ['the file', 'it'];
    if (summaries.some((s) => s.input_error !== null) && !dryRun) {
      // What was not sent goes with the fixed file: it cuts the packages before the same, with the same keys.
      const refused = storedAfterRefused
        ? ` (the unreadable records only: packages after a refused one were stored, and a refused record changed would cut new packages that store those again${written ? `; then fix the values of ${errorsPath} and push it` : ''})`
        : written
          ? ` (fix the records of ${errorsPath} in ${them[0]} too, rather than push ${errorsPath})`
          : '';
      lines.push(`  fix ${them[0]} and push ${them[1]} again: packages already stored are answered, not stored again${refused}`);
    } else if (written) {
      // errorsFileLine said what to do next.
    } else if (exit === EXIT.PARTIAL && dryRun) lines.push(`  nothing was stored; fix the refused records and check ${them[0]} again, or push ${them[1]}`);
    else if (exit === EXIT.PARTIAL && storedAfterRefused) {
      lines.push(
        `  the accepted packages stay in the session, some after a refused one: fixed, ${them[0]} would be cut anew from the refused package on, and those would be stored again;` +
          ` push ${them[1]} again unchanged with --errors FILE (packages already stored are answered, not stored again), then fix the values of FILE and push it, or delete the session`,
      );
    } else if (exit === EXIT.PARTIAL) lines.push('  the accepted packages stay in the session; fix the file and push it again (packages already stored are answered, not stored again), or delete the session');
    if (summaries.length < sources.length) lines.push(`  stopped after ${inputs[summaries.length - 1]!.name}: ${sources.length - summaries.length} more not sent (--keep-going sends them)`);
    cli.print(result, lines.join('\n'));
    return exit;
  } finally {
    await errors?.discard();
    await rm(spool, { recursive: true, force: true });
  }
}

/** The records not sent of inputs that stopped being readable ("the records from 12 on"), or null: every input was read to its end. */
function unreadRecords(summaries: readonly PushSummary[], several: boolean): string | null {
  const stopped = summaries.filter((s) => s.input_error !== null);
  if (stopped.length === 0) return null;
  return `the records ${stopped.map((s) => `${several ? `of ${s.file} ` : ''}${unsentFrom(s)}`).join(', ')}`;
}

/** Where an input that stopped being readable stopped being sent: "from 12 on", or "from the unreadable one on". */
const unsentFrom = (s: PushSummary): string => `from ${s.unsent_from === null ? 'the unreadable one' : fmtInt(s.unsent_from)} on`;

/** What the push did with the errors file, and what to do next (`unread`: what inputs that stopped being readable did not give). */
function errorsFileLine(file: ErrorsFile, outcome: 'written' | 'none' | 'removed', dryRun: boolean, unread: string | null): string {
  if (outcome !== 'written') {
    const none = `no ${file.path} written${outcome === 'removed' ? ' (the older one removed)' : ''}`;
    return unread === null
      ? `  every record ${dryRun ? 'would be' : 'was'} accepted: ${none}`
      : `  every record sent ${dryRun ? 'would be' : 'was'} accepted, but ${unread} were not sent: ${none}`;
  }
  const alone = file.records - file.withProblems - file.unchecked;
  const parts = [`${fmtInt(file.withProblems)} with errors`, ...(alone ? [`${fmtInt(alone)} refused only with their package`] : [])];
  if (file.unchecked) parts.push(`${fmtInt(file.unchecked)} not checked (at most ${ERROR_CHECKS_MAX} dry runs per push: push the fixed file to find theirs)`);
  const next = dryRun
    ? 'nothing was stored: fix the inputs (_record is each record\'s number there), or push them and then the fixed file'
    : 'fix the values there and push it (its _errors and _record are dropped when read)';
  return `  wrote ${fmtCount(file.records, 'record')} ${dryRun ? 'that would not be accepted' : 'not accepted'} to ${file.path} (${parts.join(', ')}); ${next}`;
}

/** One pushed input as people read it (`from`: its name, when it needs one): its outcome, then every failed package and its refused rows. */
function summaryLines(summary: PushSummary, dryRun: boolean, from?: string, errorsPath?: string): string[] {
  const exit = pushExit(summary);
  const seconds = summary.elapsed_ms / 1000;
  const outcome = dryRun ? `dry run, nothing stored: ${exit === EXIT.OK ? 'every package would be accepted:' : 'would accept'}` : exit === EXIT.OK ? 'pushed' : 'push incomplete:';
  const lines = [
    `${outcome} ${fmtCount(summary.rows_accepted, 'row')} of ${summary.entity} in ${fmtCount(summary.packages_accepted, 'package')}` +
      ` (${(summary.file_bytes_accepted / 1e6).toFixed(1)} MB of the file, ${(summary.bytes_accepted / 1e6).toFixed(1)} MB of JSON sent, ${seconds.toFixed(1)} s,` +
      ` ${(summary.file_bytes_accepted / 1e6 / Math.max(seconds, 0.001)).toFixed(1)} MB/s of the file` +
      `${summary.retries ? `, ${fmtCount(summary.retries, 'retry', 'retries')}` : ''}` +
      `${summary.packages_replayed ? `, ${fmtCount(summary.packages_replayed, 'package')} already stored` : ''}) ${dryRun ? 'against' : 'into'} upload ${summary.upload_uuid}` +
      `${from === undefined ? '' : ` from ${from}`}`,
  ];
  for (const f of summary.failures) {
    lines.push(`  package ${f.package} (file records ${f.first_record}–${f.first_record + f.rows - 1}) failed: ${f.status ?? f.code} ${f.message}${f.record !== undefined ? ` (file record ${f.record})` : ''}`);
    lines.push(...refusedRowLines(f, errorsPath));
  }
  if (summary.input_error) lines.push(`  the file stopped being readable: ${summary.input_error}; its records ${unsentFrom(summary)} were not sent`);
  if (summary.aborted) lines.push('  interrupted');
  return lines;
}

/** The name of `-` among a push's inputs. */
const STDIN_NAME = 'standard input';

/**
 * The inputs of a push, in order: files as named; a folder's files of a known format
 * (.csv, .ndjson, .jsonl, .json), by name, not its subfolders; `-`, standard input, copied to
 * a private file in `spool` first (JSON is read twice, and a retry may need a package again).
 */
async function pushInputs(cli: Cli, formatFlag: SourceFormat | undefined, spool: string): Promise<{ name: string; path: string; format: SourceFormat }[]> {
  const inputs: { name: string; path: string; format: SourceFormat }[] = [];
  const formatOf = (path: string): SourceFormat => {
    const format = formatFlag ?? formatFromPath(path);
    if (!format) throw new UsageError(`push: cannot tell the format of ${path}; pass --format ${SOURCE_FORMATS.join('|')}`);
    return format;
  };
  for (const name of cli.positionals) {
    if (name === '-') {
      if (!formatFlag) throw new UsageError('push -: standard input needs --format csv|ndjson|json');
      if (!cli.io.stdin) throw new UsageError('push -: no standard input');
      if (inputs.some((i) => i.name === STDIN_NAME)) throw new UsageError('push: - given twice');
      const path = join(spool, 'stdin');
      await pipeline(cli.io.stdin, createWriteStream(path, { mode: 0o600 }));
      inputs.push({ name: STDIN_NAME, path, format: formatFlag });
      continue;
    }
    const info = await stat(name).catch(() => null);
    if (info?.isDirectory()) {
      const files = (await readdir(name, { withFileTypes: true }))
        .filter((e) => e.isFile() && formatFromPath(e.name) !== null)
        .map((e) => e.name)
        .sort();
      if (files.length === 0) throw new UsageError(`push: ${name} holds no .csv, .ndjson, .jsonl or .json file`);
      for (const file of files) inputs.push({ name: join(name, file), path: join(name, file), format: formatFlag ?? formatFromPath(file)! });
      continue;
    }
    // A file, or a path that is not there: opening it says so (exit 4) before anything is sent.
    inputs.push({ name, path: name, format: formatOf(name) });
  }
  return inputs;
}

/**
 * The package size each input is cut with. An input file some of whose packages a push into
 * this session stored (remembered: `SessionMemory.cuts`) is cut as it was then, since another
 * cut makes other packages with other keys and stores those rows again: without
 * --package-size with the size of then (said on standard error), with another --package-size
 * a usage error before anything is sent (a dry run stores nothing: it takes the flag).
 * `stored(i)` records input i's cut once some of its packages are stored. Standard input has
 * no name to remember it by.
 */
async function inputCuts(
  cli: Cli,
  uploadUuid: string,
  inputs: readonly { name: string; path: string }[],
  size: { bytes: number; given: boolean },
  dryRun: boolean,
): Promise<{ sizes: number[]; stored: (i: number) => Promise<void> }> {
  const earlier = await cli.cuts(uploadUuid);
  const files = inputs.map((input) => (input.name === STDIN_NAME ? null : resolve(input.path)));
  const sizes = files.map((file, i) => {
    const then = file === null ? undefined : earlier.get(file);
    if (then === undefined || then === size.bytes || (dryRun && size.given)) return size.bytes;
    if (size.given) {
      throw new UsageError(
        `push: packages of ${inputs[i]!.name} cut with --package-size ${formatSize(then)} were stored in upload ${uploadUuid}; cut with ${formatSize(size.bytes)} its packages` +
          ` would be others and store those rows again: push it with --package-size ${formatSize(then)} (or without the flag), or into another session`,
      );
    }
    cli.note(`${inputs[i]!.name}: cut with --package-size ${formatSize(then)}, as when packages of it were stored in upload ${uploadUuid}`);
    return then;
  });
  return {
    sizes,
    stored: async (i) => {
      const file = files[i];
      if (file !== null && file !== undefined && earlier.get(file) !== sizes[i]) await cli.rememberCut(uploadUuid, file, sizes[i]!);
    },
  };
}

/** The exit code of a push of several inputs: each input's, combined. */
function pushesExit(summaries: readonly PushSummary[], inputs: number): number {
  const exits = summaries.map(pushExit);
  if (exits.includes(EXIT.INTERRUPTED)) return EXIT.INTERRUPTED;
  if (exits.length === inputs && exits.every((e) => e === EXIT.OK)) return EXIT.OK;
  if (exits.length === 1 && inputs === 1) return exits[0]!;
  return summaries.some((s) => s.packages_accepted > 0) ? EXIT.PARTIAL : exits.find((e) => e !== EXIT.OK) ?? EXIT.FAILED;
}

/** Errors a package lists on the terminal when the errors file holds every one of them. */
const SHOWN_WITH_ERRORS_FILE = 10;

function refusedRowLines(f: PackageFailure, errorsPath?: string): string[] {
  if (!f.errors || f.error_count === undefined) return [];
  const lines = [`    ${fmtInt(f.error_count)} ${f.error_count === 1 ? 'error' : 'errors'} in refused rows:`];
  const shown = errorsPath === undefined ? f.errors : f.errors.slice(0, SHOWN_WITH_ERRORS_FILE);
  for (const e of shown) lines.push(`      file record ${e.record}${e.column === null ? '' : `, column "${e.column}"`}: ${e.message}`);
  const more = f.error_count - shown.length;
  if (more > 0) lines.push(errorsPath === undefined ? `      … and ${fmtInt(more)} more (the service lists the first ${f.errors.length})` : `      … and ${fmtInt(more)} more: ${errorsPath} holds every one`);
  return lines;
}

function pushExit(s: PushSummary): number {
  if (s.aborted) return EXIT.INTERRUPTED;
  const failed = s.packages_failed > 0 || s.input_error !== null;
  if (!failed) return EXIT.OK;
  if (s.packages_accepted > 0) return EXIT.PARTIAL;
  return s.input_error !== null && s.packages_failed === 0 ? EXIT.INPUT : EXIT.FAILED;
}

/**
 * Reads the first rows of `source`, so that a file whose header is wrong fails before any call
 * changes anything, then ends the reading (its file closed, the rows dropped). The columns of
 * its first row when it is an array row (a CSV file's header), else null.
 */
async function checkedColumns(source: RowSource): Promise<readonly string[] | null> {
  const rows = source.rows();
  try {
    const first = await rows.next();
    const head = first.done ? undefined : first.value[0];
    return head?.kind === 'array' ? head.columns : null;
  } finally {
    await rows.return(undefined);
  }
}

async function pushSession(cli: Cli, client: IngestClient): Promise<string> {
  const given = str(cli.values.upload);
  if (given) {
    const status = await cli.call(() => client.status(given, callOpts(cli)));
    if (status.session_status !== 'UPLOADING') throw new ApiError(409, { detail: `upload ${given} is ${status.session_status}, not UPLOADING` }, null);
    return given;
  }
  const init = await initialize(cli, client);
  if (init.status === 'created') return init.upload_uuid;
  if (init.status === 'already_exists' && !cli.values.new) {
    cli.note(`using the open upload session ${init.upload_uuid}${init.answer_lost ? " (perhaps the one this push created: an earlier attempt's answer was lost)" : ''}`);
    return init.upload_uuid;
  }
  throw initConflict(init);
}
