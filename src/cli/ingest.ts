#!/usr/bin/env node
/**
 * `ingest`, the client's command line: push files of one entity into an upload session,
 * follow the session, start, terminate and delete it. Built on the client library in
 * `src/client/`; `--help` lists commands, options, credentials and exit codes.
 */
import { createWriteStream, realpathSync } from 'node:fs';
import { mkdtemp, readdir, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { IngestClient, CLIENT_VERSION } from '../client/client.js';
import { CLI_DEFAULTS, CLIENT_DEFAULTS } from '../client/defaults.js';
import { resolveCredentials, SessionMemory, UsageError, type Credentials } from '../client/cli-config.js';
import { ApiError, ClientError, describeDetail, isApiError, isClientError } from '../client/errors.js';
import { fmtCount, fmtInt, PushProgress, type ProgressMode } from '../client/progress.js';
import { push, type PackageFailure, type PushSummary } from '../client/push.js';
import { withRetry, type RetryPolicy } from '../client/retry.js';
import { formatFromPath, openSource, SOURCE_FORMATS, type RowSource, type SourceFormat, type SourceRow } from '../client/sources.js';
import type { InitializeResult, StatusView } from '../client/types.js';
import { ERROR_CHECKS_MAX, ErrorsFile, errorsFileFormat, writeRefused } from './errors-file.js';

export const EXIT = {
  OK: 0,
  /** The service refused, or could not be reached (retries spent). */
  FAILED: 1,
  USAGE: 2,
  /** push: some packages were accepted, others not. */
  PARTIAL: 3,
  /** push: the file cannot be read as rows of the entity; nothing of it was accepted. */
  INPUT: 4,
  /** A --wait or --watch ran past --wait-timeout. */
  WAIT_TIMEOUT: 5,
  INTERRUPTED: 130,
} as const;

const MIB = 1024 * 1024;
const MAX_PACKAGE_BYTES = 32 * MIB;
const MAX_PARALLEL = 16;
/** The service allows 30 requests/s per IP; leave room for a status poller beside the push. */
const MAX_RATE = 30;

export const HELP = `Usage: ingest <command> [options]

Commands:
  push <file...> --entity E  Send CSV, NDJSON or JSON files of one entity into the session:
                           files, folders (their .csv/.ndjson/.jsonl/.json files, by name)
                           or - (standard input, with --format), one after another
      [--upload UUID | --new]  session: the given one; --new: a new one (fails if one is
                           open); default: the client's open session, else a new one
      [--format csv|ndjson|json]  default from the extension (.csv, .ndjson/.jsonl, .json)
      [--package-size ${CLI_DEFAULTS.packageSize}]  largest package body (B, KiB, MiB, KB, MB; at most 32 MiB)
      [--parallel ${CLI_DEFAULTS.parallel}]       packages in flight at once (1-${MAX_PARALLEL})
      [--rate ${CLI_DEFAULTS.rate}]          requests started per second at most (the service allows 30)
      [--retries ${CLI_DEFAULTS.retries}]        retries of a package on 408/502/503/504, timeouts, network errors
      [--gzip]             compress packages on the wire
      [--keep-going]       send the remaining packages after one failed
      [--dry-run]          check every package without storing it: the service answers
                           what each would get (implies --keep-going); nothing is stored
      [--errors FILE]      write every record not accepted to FILE with its problems, all of
                           them (past the service's first 100 of a package, by dry runs):
                           fix the values there and push FILE. CSV inputs: CSV (*.csv), their
                           header plus _record and a last column _errors ("price: expected
                           number >= 0, got -1; …"). NDJSON and JSON inputs: NDJSON (*.ndjson,
                           *.jsonl), each record plus "_record" and "_errors": [{column,
                           message}]. A refused package's other records too, without errors
                           (a package is stored whole or not at all). Several inputs add
                           _file; CSV and NDJSON/JSON do not mix. Renamed into place at the
                           end; nothing refused: no FILE (an older one removed). Implies
                           --keep-going; with --dry-run: what a real push would not accept
  status [UUID] [--watch [--until STATE]] [--interval ${CLI_DEFAULTS.watchIntervalSeconds}]
                           The session's status; --watch prints each change until the
                           session is DONE, or --until startable (can_start_upload),
                           UPLOADING or STARTED; bounded by --wait-timeout
  start [UUID] --from YYYY-MM-DD [--to YYYY-MM-DD] [--wait]
                           Waits until can_start_upload, then starts the Connector
                           (--to defaults to yesterday, UTC); --wait: until DONE
  terminate [UUID] [--wait]  Stops the workflow; --wait: until the session is UPLOADING
  delete [UUID]            Deletes a session that is still UPLOADING
  init                     Initializes a session and prints its uuid
  entities                 The entity catalog (columns, types, required)

Options of every command:
  --url URL  --client-id ID  --token TOKEN
                           Credentials (else INGEST_URL, INGEST_CLIENT_ID, INGEST_TOKEN,
                           else the config file); a token in the environment or the
                           config file stays out of the process list
  --config FILE            JSON {"url", "client_id", "token"} (else $INGEST_CONFIG, else
                           ~/.config/ingest/config.json)
  --json                   Machine-readable output on stdout (errors too, as {"error": …})
  --quiet, -q              No progress lines
  --timeout SECONDS        Deadline of each call (default ${CLI_DEFAULTS.timeoutSeconds}; ingest calls ${CLIENT_DEFAULTS.ingestTimeoutMs / 1000})
  --wait-timeout SECONDS   Bound of --wait and --watch (default ${CLI_DEFAULTS.waitTimeoutSeconds})
  --help, -h               This help; --version, -V

Without UUID, a command uses the session of the last init or push (per URL and client).

Files:
  CSV     header row = column names; quotes, embedded newlines, BOM and CRLF allowed; values
          typed by the entity's catalog (numbers, integers, booleans true/false/1/0/yes/no);
          an empty field is null in an optional column
  NDJSON  one object per line keyed by column name, or a first line with the column
          names as an array and one array of values per further line
  JSON    {"columns": [...], "data": [[...], ...]} or an array of objects
  Reserved names: columns and keys named _errors, _record or _file (what --errors adds) are
  dropped when a file is read, so a fixed errors file is pushed as it is.
  Re-running the same push of the same file into the same session sends the same
  Idempotency-Key per package, so packages already stored are not stored twice.

Exit codes:
  0 done  1 the service refused or could not be reached  2 usage or configuration
  3 push partly failed (some packages accepted)  4 the file is not valid input
  5 --wait/--watch timed out  70 internal error  130 interrupted
`;

type Values = Record<string, string | boolean | undefined>;

const GLOBAL: ParseArgsConfig['options'] = {
  url: { type: 'string' },
  'client-id': { type: 'string' },
  token: { type: 'string' },
  config: { type: 'string' },
  json: { type: 'boolean' },
  quiet: { type: 'boolean', short: 'q' },
  timeout: { type: 'string' },
  'wait-timeout': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
};

const COMMANDS: Record<string, { options: ParseArgsConfig['options']; positionals: number }> = {
  push: {
    positionals: Infinity,
    options: {
      entity: { type: 'string', short: 'e' },
      upload: { type: 'string' },
      new: { type: 'boolean' },
      'package-size': { type: 'string' },
      parallel: { type: 'string' },
      format: { type: 'string' },
      rate: { type: 'string' },
      retries: { type: 'string' },
      gzip: { type: 'boolean' },
      'keep-going': { type: 'boolean' },
      'dry-run': { type: 'boolean' },
      errors: { type: 'string' },
    },
  },
  status: {
    positionals: 1,
    options: { upload: { type: 'string' }, watch: { type: 'boolean' }, until: { type: 'string' }, interval: { type: 'string' } },
  },
  start: {
    positionals: 1,
    options: { upload: { type: 'string' }, from: { type: 'string' }, to: { type: 'string' }, wait: { type: 'boolean' }, interval: { type: 'string' } },
  },
  terminate: { positionals: 1, options: { upload: { type: 'string' }, wait: { type: 'boolean' }, interval: { type: 'string' } } },
  delete: { positionals: 1, options: { upload: { type: 'string' } } },
  init: { positionals: 0, options: {} },
  entities: { positionals: 0, options: {} },
};

export interface CliIo {
  stdout: { write(text: string): unknown; isTTY?: boolean };
  stderr: { write(text: string): unknown; isTTY?: boolean; columns?: number };
  env: NodeJS.ProcessEnv;
  /** What `push -` reads (default: none, so `-` is a usage error). */
  stdin?: NodeJS.ReadableStream;
  /** Aborted on SIGINT. */
  signal?: AbortSignal;
}

class Cli {
  readonly json: boolean;
  readonly quiet: boolean;
  readonly timeoutMs: number;
  readonly waitTimeoutMs: number;
  #client: IngestClient | null = null;
  #creds: Credentials | null = null;
  readonly memory: SessionMemory;

  constructor(
    readonly io: CliIo,
    readonly values: Values,
    readonly positionals: string[],
  ) {
    this.json = values.json === true;
    this.quiet = values.quiet === true;
    this.timeoutMs = seconds(values.timeout, 'timeout', CLI_DEFAULTS.timeoutSeconds) * 1000;
    this.waitTimeoutMs = seconds(values['wait-timeout'], 'wait-timeout', CLI_DEFAULTS.waitTimeoutSeconds) * 1000;
    this.memory = new SessionMemory(io.env);
  }

  get signal(): AbortSignal | undefined {
    return this.io.signal;
  }

  async client(extra: { connections?: number; requestsPerSecond?: number } = {}): Promise<IngestClient> {
    if (this.#client) return this.#client;
    const creds = await this.creds();
    this.#client = new IngestClient({
      baseUrl: creds.url,
      clientId: creds.clientId,
      token: creds.token,
      timeoutMs: this.timeoutMs,
      ...extra,
    });
    return this.#client;
  }

  /** The credentials, once a command resolved them (for what an error says). */
  get resolved(): Credentials | null {
    return this.#creds;
  }

  async creds(): Promise<Credentials> {
    if (this.#creds) return this.#creds;
    this.#creds = await resolveCredentials(
      { url: str(this.values.url), clientId: str(this.values['client-id']), token: str(this.values.token), config: str(this.values.config) },
      this.io.env,
    );
    if (this.#creds.warning) this.note(`warning: ${this.#creds.warning}`);
    return this.#creds;
  }

  async close(): Promise<void> {
    await this.#client?.close();
  }

  /** The session a command works on: the argument, --upload, or the remembered one. */
  async uploadUuid(): Promise<string> {
    const given = this.positionals[0] ?? str(this.values.upload);
    if (this.positionals[0] !== undefined && this.values.upload !== undefined && this.positionals[0] !== this.values.upload) {
      throw new UsageError('give the upload uuid once (argument or --upload)');
    }
    if (given) return given;
    const creds = await this.creds();
    const remembered = await this.memory.get(creds.url, creds.clientId);
    if (remembered) return remembered;
    // Nothing is remembered for these credentials, which is also what a wrong client id or
    // URL looks like: ask the service first, so that its answer (401, unreachable) is the error.
    const client = await this.client();
    await this.call(() => client.entities(callOpts(this)));
    throw new UsageError(`no upload uuid remembered for client ${creds.clientId} at ${creds.url}: pass one, or run \`ingest init\` or \`ingest push\` first`);
  }

  async remember(uuid: string | null): Promise<void> {
    const creds = await this.creds();
    await this.memory.set(creds.url, creds.clientId, uuid);
  }

  /** The retry policy of single calls (status polls, start, terminate, delete). */
  retry(): RetryPolicy {
    return {
      retries: CLI_DEFAULTS.callRetries,
      ...(this.signal ? { signal: this.signal } : {}),
      onRetry: (info) => this.note(`${info.error.message}; retry ${info.retry} in ${(info.delayMs / 1000).toFixed(1)} s`),
    };
  }

  call<T>(fn: () => Promise<T>): Promise<T> {
    return withRetry(fn, this.retry());
  }

  /** The result: JSON on stdout with --json, else the human text. */
  print(result: unknown, human: string): void {
    this.io.stdout.write(this.json ? `${JSON.stringify(result)}\n` : human.endsWith('\n') ? human : `${human}\n`);
  }

  /** A side remark for people (stderr), not with --quiet. */
  note(text: string): void {
    if (!this.quiet) this.io.stderr.write(`${text}\n`);
  }
}

/** Runs one command line (without `node` and the script); resolves with the exit code. */
export async function main(argv: readonly string[], io: CliIo): Promise<number> {
  const [command, ...rest] = argv;
  if (command === undefined || command === '--help' || command === '-h' || command === 'help') {
    io.stdout.write(HELP);
    return command === undefined ? EXIT.USAGE : EXIT.OK;
  }
  if (command === '--version' || command === '-V') {
    io.stdout.write(`${CLIENT_VERSION}\n`);
    return EXIT.OK;
  }
  const wantsJson = rest.includes('--json');
  const spec = COMMANDS[command];
  if (!spec) return usage(io, wantsJson, `unknown command ${JSON.stringify(command)}`);
  let cli: Cli;
  try {
    const parsed = parseArgs({ args: [...rest], options: { ...GLOBAL, ...spec.options }, allowPositionals: true, strict: true });
    if (parsed.values.help) {
      io.stdout.write(HELP);
      return EXIT.OK;
    }
    if (parsed.positionals.length > spec.positionals) throw new UsageError(`${command}: unexpected argument ${JSON.stringify(parsed.positionals[spec.positionals])}`);
    cli = new Cli(io, parsed.values as Values, parsed.positionals);
  } catch (err) {
    return usage(io, wantsJson, (err as Error).message);
  }
  try {
    switch (command) {
      case 'push':
        return await pushCommand(cli);
      case 'status':
        return await statusCommand(cli);
      case 'start':
        return await startCommand(cli);
      case 'terminate':
        return await terminateCommand(cli);
      case 'delete':
        return await deleteCommand(cli);
      case 'init':
        return await initCommand(cli);
      default:
        return await entitiesCommand(cli);
    }
  } catch (err) {
    return failure(cli, err);
  } finally {
    await cli.close();
  }
}

function usage(io: CliIo, json: boolean, message: string): number {
  if (json) io.stdout.write(`${JSON.stringify({ error: { code: 'USAGE', message } })}\n`);
  else io.stderr.write(`ingest: ${message}\nRun \`ingest --help\` for usage.\n`);
  return EXIT.USAGE;
}

function failure(cli: Cli, err: unknown): number {
  if (err instanceof UsageError) return usage(cli.io, cli.json, err.message);
  if (isClientError(err)) {
    const exit = err.code === 'INPUT' ? EXIT.INPUT : err.code === 'ABORTED' ? EXIT.INTERRUPTED : EXIT.FAILED;
    const message = isApiError(err) ? `${err.status} ${describeDetail(err.body)}${authHint(err, cli.resolved)}` : unreachable(err, cli.resolved) ?? err.message;
    if (cli.json) {
      const error = { code: err.code, status: err.status, message, ...(isApiError(err) ? { detail: err.detail } : {}) };
      cli.io.stdout.write(`${JSON.stringify({ error })}\n`);
    } else cli.io.stderr.write(`ingest: ${message}\n`);
    return exit;
  }
  if (err instanceof WaitTimeout) {
    if (cli.json) cli.io.stdout.write(`${JSON.stringify({ error: { code: 'WAIT_TIMEOUT', message: err.message, status: err.last } })}\n`);
    else cli.io.stderr.write(`ingest: ${err.message}\n`);
    return EXIT.WAIT_TIMEOUT;
  }
  throw err;
}

/** Where a credential came from, as the user would change it. */
function credentialSource(source: string, flag: string): string {
  return source === 'flag' ? flag : source.startsWith('INGEST_') ? `$${source}` : source;
}

/**
 * A 401 says which client id and token were sent, and from where: the service answers a
 * wrong token and an unknown client id alike (it tells neither apart), so both are named.
 */
function authHint(err: ApiError, creds: Credentials | null): string {
  if (err.status !== 401 || !creds) return '';
  return (
    `: client id "${creds.clientId}" (from ${credentialSource(creds.sources.clientId, '--client-id')}) and its token ` +
    `(from ${credentialSource(creds.sources.token, '--token')}) are checked together; the service does not say which one it refused`
  );
}

/** A connection that failed, named by the service URL tried rather than by the call the command made first. */
function unreachable(err: ClientError, creds: Credentials | null): string | null {
  if (err.code !== 'NETWORK' || !creds) return null;
  const cause = err.cause instanceof Error ? err.cause.message : err.message;
  return `cannot reach the service at ${creds.url} (from ${credentialSource(creds.sources.url, '--url')}): ${cause}`;
}

class WaitTimeout extends Error {
  override readonly name = 'WaitTimeout';
  readonly code = 'WAIT_TIMEOUT';
  constructor(
    message: string,
    readonly last: StatusView | null,
  ) {
    super(message);
  }
}

// ----------------------------------------------------------------------------- push

async function pushCommand(cli: Cli): Promise<number> {
  const v = cli.values;
  if (cli.positionals.length === 0) throw new UsageError('push: which file? (ingest push <file...> --entity E)');
  const entityName = str(v.entity);
  if (!entityName) throw new UsageError('push: --entity is required');
  if (v.new && v.upload) throw new UsageError('push: --new and --upload exclude each other');
  const formatFlag = str(v.format) as SourceFormat | undefined;
  if (formatFlag !== undefined && !SOURCE_FORMATS.includes(formatFlag)) throw new UsageError(`--format: expected ${SOURCE_FORMATS.join(', ')}, got ${JSON.stringify(formatFlag)}`);
  const packageBytes = parseSize(str(v['package-size']) ?? CLI_DEFAULTS.packageSize);
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

    // Every header is checked before a session is touched: a wrong file changes nothing.
    const sources: Primed[] = [];
    for (const input of inputs) sources.push(await primed(await openSource(input.path, input.format, entity)));
    if (errorsPath !== undefined) errors = await ErrorsFile.open(errorsPath, errorsFormat!, [...new Set(sources.flatMap((s) => s.columns ?? []))], inputs.length > 1);
    const uploadUuid = await pushSession(cli, client);
    await cli.remember(uploadUuid);

    const mode: ProgressMode = cli.quiet ? 'none' : cli.io.stderr.isTTY ? 'bar' : 'plain';
    const summaries: (PushSummary & { error_records?: number })[] = [];
    const lines: string[] = [];
    const checks = { max: ERROR_CHECKS_MAX, used: 0 };
    let errorsFailed: string | null = null;
    for (const [i, source] of sources.entries()) {
      const name = inputs[i]!.name;
      const progress = new PushProgress(cli.io.stderr, mode, basename(name), source.totalBytes);
      if (mode !== 'none') cli.io.stderr.write(`${dryRun ? 'checking (dry run)' : 'pushing'} ${name} (${entity.name}, ${source.format}) ${dryRun ? 'against' : 'into'} upload ${uploadUuid}\n`);
      let summary: PushSummary;
      try {
        summary = await push({
          client,
          uploadUuid,
          entity: entity.name,
          source,
          packageBytes,
          parallel,
          gzip: v.gzip === true,
          dryRun,
          keepGoing,
          // A push of several inputs keys each package by its input too: two inputs may hold the same package.
          ...(sources.length > 1 ? { keyScope: `${i}:${name}` } : {}),
          retry: { retries },
          ...(cli.signal ? { signal: cli.signal } : {}),
          onEvent: progress.onEvent,
        });
      } finally {
        progress.finish();
      }
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
          lines.push(errorsFileLine(file, outcome, dryRun));
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
    if (written) {
      // errorsFileLine said what to do next.
    } else if (exit === EXIT.PARTIAL && dryRun) lines.push(`  nothing was stored; fix the refused records and check ${them[0]} again, or push ${them[1]}`);
    else if (exit === EXIT.PARTIAL) lines.push('  the accepted packages stay in the session; fix the file and push it again (packages already stored are answered, not stored again), or delete the session');
    if (summaries.length < sources.length) lines.push(`  stopped after ${inputs[summaries.length - 1]!.name}: ${sources.length - summaries.length} more not sent (--keep-going sends them)`);
    cli.print(result, lines.join('\n'));
    return exit;
  } finally {
    await errors?.discard();
    await rm(spool, { recursive: true, force: true });
  }
}

/** What the push did with the errors file, and what to do next. */
function errorsFileLine(file: ErrorsFile, outcome: 'written' | 'none' | 'removed', dryRun: boolean): string {
  if (outcome !== 'written') return `  every record ${dryRun ? 'would be' : 'was'} accepted: no ${file.path} written${outcome === 'removed' ? ' (the older one removed)' : ''}`;
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
  if (summary.input_error) lines.push(`  the file stopped being readable: ${summary.input_error}`);
  if (summary.aborted) lines.push('  interrupted');
  return lines;
}

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
      if (inputs.some((i) => i.name === 'standard input')) throw new UsageError('push: - given twice');
      const path = join(spool, 'stdin');
      await pipeline(cli.io.stdin, createWriteStream(path, { mode: 0o600 }));
      inputs.push({ name: 'standard input', path, format: formatFlag });
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

/** A source whose first rows are read; `columns`: those of its first row when it is an array row (a CSV file's header). */
type Primed = RowSource & { readonly columns: readonly string[] | null };

/** Reads the first rows now, so that a file whose header is wrong fails before any call changes anything. */
async function primed(source: RowSource): Promise<Primed> {
  const rows = source.rows();
  const first = await rows.next();
  const head = first.done ? undefined : first.value[0];
  return {
    path: source.path,
    format: source.format,
    totalBytes: source.totalBytes,
    columns: head?.kind === 'array' ? head.columns : null,
    get bytesRead() {
      return source.bytesRead;
    },
    async *rows(): AsyncGenerator<SourceRow[]> {
      if (first.done) return;
      yield first.value;
      yield* rows;
    },
  };
}

async function pushSession(cli: Cli, client: IngestClient): Promise<string> {
  const given = str(cli.values.upload);
  if (given) {
    const status = await cli.call(() => client.status(given, callOpts(cli)));
    if (status.session_status !== 'UPLOADING') throw new ApiError(409, { detail: `upload ${given} is ${status.session_status}, not UPLOADING` }, null);
    return given;
  }
  const init = await cli.call(() => client.initialize(callOpts(cli)));
  if (init.status === 'created') return init.upload_uuid;
  if (init.status === 'already_exists' && !cli.values.new) {
    cli.note(`using the open upload session ${init.upload_uuid}`);
    return init.upload_uuid;
  }
  throw initConflict(init);
}

/** The initialize-session 409 as an error that names the session in the way. */
function initConflict(init: Exclude<InitializeResult, { status: 'created' }>): ApiError {
  const hint = init.status === 'already_exists' ? 'push with --upload to add to it, or delete it' : 'wait for it, or terminate it';
  return new ApiError(409, { ...init, detail: `${init.message}: upload ${init.upload_uuid} is ${init.session_status} (${hint})` }, null);
}

// --------------------------------------------------------------------- other commands

async function initCommand(cli: Cli): Promise<number> {
  const client = await cli.client();
  const init = await cli.call(() => client.initialize(callOpts(cli)));
  await cli.remember(init.upload_uuid);
  if (init.status === 'created') {
    cli.print(init, init.upload_uuid);
    return EXIT.OK;
  }
  throw initConflict(init);
}

/** The states `status --watch --until` can wait for. */
const UNTIL: Record<string, (s: StatusView) => boolean> = {
  DONE: (s) => s.session_status === 'DONE',
  UPLOADING: (s) => s.session_status === 'UPLOADING',
  STARTED: (s) => s.session_status === 'STARTED',
  startable: (s) => s.can_start_upload,
};

async function statusCommand(cli: Cli): Promise<number> {
  const untilName = str(cli.values.until) ?? 'DONE';
  const until = UNTIL[untilName];
  if (!until) throw new UsageError(`--until: expected ${Object.keys(UNTIL).join(', ')}, got ${JSON.stringify(untilName)}`);
  if (cli.values.until !== undefined && !cli.values.watch) throw new UsageError('--until goes with --watch');
  const client = await cli.client();
  const uuid = await cli.uploadUuid();
  if (!cli.values.watch) {
    const status = await cli.call(() => client.status(uuid, callOpts(cli)));
    cli.print(status, describeStatus(status));
    return EXIT.OK;
  }
  const interval = seconds(cli.values.interval, 'interval', CLI_DEFAULTS.watchIntervalSeconds, 0.2) * 1000;
  let last = '';
  await poll(cli, client, uuid, interval, (status) => {
    const key = JSON.stringify(status);
    if (key !== last) cli.print(status, `${new Date().toISOString()} ${describeStatus(status)}`);
    last = key;
    return until(status);
  });
  return EXIT.OK;
}

async function startCommand(cli: Cli): Promise<number> {
  const from = str(cli.values.from);
  if (!from) throw new UsageError('start: --from YYYY-MM-DD is required');
  const to = str(cli.values.to) ?? new Date(Date.now() - 86_400_000).toISOString().slice(0, 10);
  for (const [name, value] of [['from', from], ['to', to]] as const) {
    if (!/^\d{4}-\d{2}-\d{2}$/.test(value)) throw new UsageError(`--${name}: expected YYYY-MM-DD, got ${JSON.stringify(value)}`);
  }
  const client = await cli.client();
  const uuid = await cli.uploadUuid();
  const interval = seconds(cli.values.interval, 'interval', CLI_DEFAULTS.waitIntervalSeconds, 0.2) * 1000;

  // Wait for can_start_upload; a session that cannot become startable by waiting is sent
  // to start-upload anyway, so that the service says why.
  const ready = await poll(cli, client, uuid, interval, (s) => s.can_start_upload || s.session_status !== 'UPLOADING' || s.entities.length === 0);
  if (!ready.can_start_upload) cli.note(`upload ${uuid} cannot start: ${describeStatus(ready)}`);
  let started: Record<string, unknown>;
  for (;;) {
    try {
      started = await cli.call(() => client.start(uuid, { date_from: from, date_to: to }, callOpts(cli)));
      break;
    } catch (err) {
      // A package committed between our poll and the call: wait again.
      if (!(isApiError(err) && err.status === 409 && err.detail === 'Upload tasks are still in progress')) throw err;
      await poll(cli, client, uuid, interval, (s) => s.can_start_upload || s.session_status !== 'UPLOADING');
    }
  }
  await cli.remember(uuid);
  if (!cli.values.wait) {
    cli.print(started, `started upload ${uuid}: ${JSON.stringify(started)}`);
    return EXIT.OK;
  }
  cli.note(`started upload ${uuid}; waiting for DONE`);
  const end = await poll(cli, client, uuid, interval, (s) => s.session_status !== 'STARTED');
  const ok = end.session_status === 'DONE';
  const outcome = end.last_workflow ? `${end.last_workflow.status}${end.last_workflow.message ? `: ${end.last_workflow.message}` : ''}` : end.session_status;
  cli.print({ start: started, status: end, ok }, ok ? `upload ${uuid} is DONE` : `upload ${uuid} is back to ${end.session_status} (${outcome})`);
  return ok ? EXIT.OK : EXIT.FAILED;
}

async function terminateCommand(cli: Cli): Promise<number> {
  const client = await cli.client();
  const uuid = await cli.uploadUuid();
  const result = await cli.call(() => client.terminate(uuid, callOpts(cli)));
  if (!cli.values.wait) {
    cli.print(result, result.message);
    return EXIT.OK;
  }
  const interval = seconds(cli.values.interval, 'interval', CLI_DEFAULTS.waitIntervalSeconds, 0.2) * 1000;
  const end = await poll(cli, client, uuid, interval, (s) => s.session_status !== 'STARTED');
  cli.print({ terminate: result, status: end }, `upload ${uuid} is ${end.session_status}`);
  return end.session_status === 'UPLOADING' ? EXIT.OK : EXIT.FAILED;
}

async function deleteCommand(cli: Cli): Promise<number> {
  const client = await cli.client();
  const uuid = await cli.uploadUuid();
  const result = await cli.call(() => client.delete(uuid, callOpts(cli)));
  const creds = await cli.creds();
  if ((await cli.memory.get(creds.url, creds.clientId)) === uuid) await cli.remember(null);
  cli.print(result, result.message);
  return EXIT.OK;
}

async function entitiesCommand(cli: Cli): Promise<number> {
  const client = await cli.client();
  const catalog = await cli.call(() => client.entities(callOpts(cli)));
  const human = catalog.entities
    .map((e) => `${e.name}${e.parents.length ? ` (parents: ${e.parents.join(', ')})` : ''}\n${e.columns.map((c) => `  ${c.name}${c.required ? '*' : ''} ${c.type}`).join('\n')}`)
    .join('\n');
  cli.print(catalog, human);
  return EXIT.OK;
}

/** Polls status until `done` holds; bounded by --wait-timeout. Transient failures are retried. */
async function poll(cli: Cli, client: IngestClient, uuid: string, intervalMs: number, done: (s: StatusView) => boolean): Promise<StatusView> {
  const deadline = Date.now() + cli.waitTimeoutMs;
  let status: StatusView | null = null;
  for (;;) {
    status = await cli.call(() => client.status(uuid, callOpts(cli)));
    if (done(status)) return status;
    if (Date.now() + intervalMs > deadline) throw new WaitTimeout(`upload ${uuid}: still ${describeStatus(status)} after ${cli.waitTimeoutMs / 1000} s`, status);
    try {
      await sleep(intervalMs, undefined, cli.signal ? { signal: cli.signal } : undefined);
    } catch (err) {
      throw new ClientError('ABORTED', 'interrupted', { cause: err });
    }
  }
}

function describeStatus(s: StatusView): string {
  const flags = [
    `entities: ${s.entities.length ? s.entities.join(', ') : '–'}`,
    `tasks finished: ${s.upload_tasks_finished ? 'yes' : 'no'}`,
    `can upload: ${s.can_upload_entities ? 'yes' : 'no'}`,
    `can start: ${s.can_start_upload ? 'yes' : 'no'}`,
    `can terminate: ${s.can_terminate ? 'yes' : 'no'}`,
  ];
  const last = s.last_workflow ? ` · last workflow ${s.last_workflow.status}${s.last_workflow.message ? ` (${s.last_workflow.message})` : ''}` : '';
  return `${s.upload_uuid} ${s.session_status} · ${flags.join(' · ')}${last}`;
}

// ----------------------------------------------------------------------- arguments

function callOpts(cli: Cli): { signal?: AbortSignal } {
  return cli.signal ? { signal: cli.signal } : {};
}

function str(v: string | boolean | undefined): string | undefined {
  return typeof v === 'string' ? v : undefined;
}

function number(v: string | boolean | undefined, name: string, fallback: number, min: number, max: number): number {
  if (v === undefined) return fallback;
  const n = typeof v === 'string' && v.trim() !== '' ? Number(v) : NaN;
  if (!Number.isFinite(n) || n < min || n > max) throw new UsageError(`--${name}: expected a number from ${min} to ${max}, got ${JSON.stringify(v)}`);
  return n;
}

function integer(v: string | boolean | undefined, name: string, fallback: number, min: number, max: number): number {
  const n = number(v, name, fallback, min, max);
  if (!Number.isInteger(n)) throw new UsageError(`--${name}: expected a whole number from ${min} to ${max}, got ${JSON.stringify(v)}`);
  return n;
}

function seconds(v: string | boolean | undefined, name: string, fallback: number, min = 0.001): number {
  return number(v, name, fallback, min, 7 * 24 * 3600);
}

const UNITS: Record<string, number> = { '': 1, b: 1, k: 1000, kb: 1000, kib: 1024, m: 1e6, mb: 1e6, mib: MIB };

/** `8MiB`, `512KiB`, `4MB`, `1000000` → bytes; between 1 KiB and 32 MiB. */
export function parseSize(text: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(text);
  const unit = m ? UNITS[m[2]!.toLowerCase()] : undefined;
  if (!m || unit === undefined) throw new UsageError(`--package-size: expected a size like 8MiB, 512KiB or 4MB, got ${JSON.stringify(text)}`);
  const bytes = Math.floor(Number(m[1]) * unit);
  if (bytes < 1024 || bytes > MAX_PACKAGE_BYTES) throw new UsageError(`--package-size: expected 1KiB to 32MiB (the service's limit), got ${JSON.stringify(text)}`);
  return bytes;
}

function isMain(): boolean {
  try {
    return realpathSync(process.argv[1] ?? '') === realpathSync(fileURLToPath(import.meta.url));
  } catch {
    return false;
  }
}

if (isMain()) {
  const controller = new AbortController();
  let interrupts = 0;
  process.on('SIGINT', () => {
    // The first ^C stops sending and reports what was done; the second leaves at once.
    if (++interrupts > 1) process.exit(EXIT.INTERRUPTED);
    controller.abort();
  });
  process.stdout.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code === 'EPIPE') process.exit(EXIT.OK);
  });
  main(process.argv.slice(2), { stdout: process.stdout, stderr: process.stderr, stdin: process.stdin, env: process.env, signal: controller.signal }).then(
    (code) => {
      process.exitCode = code;
    },
    (err: unknown) => {
      process.stderr.write(`ingest: internal error: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
      process.exitCode = 70;
    },
  );
}
