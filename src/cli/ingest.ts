#!/usr/bin/env node
/**
 * `ingest`, the client's command line: push files of one entity into an upload session,
 * follow the session, start, terminate and delete it. Built on the client library in
 * `src/client/`; `--help` lists commands, options, credentials and exit codes.
 */
import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { CLIENT_VERSION } from '../client/client.js';
import { credentialSource, UsageError, type Credentials } from '../client/cli-config.js';
import { ApiError, ClientError, describeDetail, isApiError, isClientError } from '../client/errors.js';
import { deleteCommand, entitiesCommand, initCommand, startCommand, statusCommand, terminateCommand, WaitTimeout } from './ingest/commands.js';
import { Cli, EXIT, type CliIo, type Values } from './ingest/context.js';
import { pushCommand } from './ingest/push.js';
import { COMMANDS, GLOBAL, HELP } from './ingest/syntax.js';

export { parseSize } from './ingest/args.js';
export { EXIT, type CliIo } from './ingest/context.js';
export { HELP } from './ingest/syntax.js';

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
    // The reader went away (`| head`): nothing more is written, a command still running stops
    // as at the first ^C, and the exit code is the command's own (a push that is done keeps its 3).
    if (err.code === 'EPIPE') controller.abort();
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
