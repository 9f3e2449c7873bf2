#!/usr/bin/env node
/**
 * `ingest-admin`, the operator's commands:
 * - `issue-client` adds a client to the clients file (the format of `http/auth.ts`): a fresh
 *   token, stored only as its SHA-256 and printed once;
 * - `print-config` prints the effective configuration with its secrets masked.
 * Exit codes: 0 done, 1 the operation failed, 2 bad usage.
 */
import { randomBytes } from 'node:crypto';
import { realpathSync } from 'node:fs';
import { chmod, mkdir, open, readFile, rename, stat, unlink } from 'node:fs/promises';
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { loadConfig, type Config } from '../config/config.js';
import { isCalendarDate } from '../entities/dates.js';
import { addressList, ClientRegistry, hashToken, type ClientEntry, type ClientsFile } from '../http/auth.js';
import { writeFileAtomic } from '../durable-file.js';

export const DEFAULT_MIN_DATE = '2020-01-01';
export const DEFAULT_CLIENTS_FILE = './config/clients.json';

export type AdminErrorCode = 'USAGE' | 'INVALID_ARGUMENT' | 'DUPLICATE_CLIENT' | 'UNKNOWN_CLIENT' | 'CLIENTS_FILE_INVALID';

export class AdminError extends Error {
  override readonly name = 'AdminError';
  readonly code: AdminErrorCode;

  constructor(code: AdminErrorCode, message: string, opts: { cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.code = code;
  }
}

export interface IssueClientOptions {
  clientId: string;
  /** Allowed source addresses or CIDRs. Required for a new client; on rotate, replaces the list when non-empty. */
  ips?: readonly string[];
  /** Earliest `date_from` (`YYYY-MM-DD`). New client: default 2020-01-01; on rotate, replaces it when given. */
  minDate?: string;
  /** Replace the token of an existing client instead of refusing the duplicate. */
  rotate?: boolean;
}

export interface IssuedClient {
  client_id: string;
  /** The only copy of the token; the file holds its SHA-256. */
  token: string;
  entry: ClientEntry;
  rotated: boolean;
}

/**
 * Adds (or, with `rotate`, re-keys) a client in `file`, creating the file if absent. The
 * result is validated as the server would load it before it replaces the file, atomically
 * (temp file, fsync, rename) with mode 0600 when new, else the file's own mode (a clients file
 * made readable to the service's user stays so). Read-modify-write without a lock: run one
 * issue at a time per file.
 */
export async function issueClient(file: string, opts: IssueClientOptions): Promise<IssuedClient> {
  // Visible ASCII only: the id travels in the `Client-Id` header, which trims and forbids controls.
  if (!/^[\x21-\x7e]{1,128}$/.test(opts.clientId)) {
    throw new AdminError('INVALID_ARGUMENT', `--id: expected 1 to 128 visible ASCII characters, got ${JSON.stringify(opts.clientId)}`);
  }
  const ips = [...(opts.ips ?? [])];
  try {
    addressList(ips, '--ip');
  } catch (err) {
    throw new AdminError('INVALID_ARGUMENT', (err as Error).message, { cause: err });
  }
  if (opts.minDate !== undefined && !isCalendarDate(opts.minDate)) {
    throw new AdminError('INVALID_ARGUMENT', `--min-date: expected a calendar date YYYY-MM-DD, got ${JSON.stringify(opts.minDate)}`);
  }

  const current = await readClientsFile(file);
  const index = current.clients.findIndex((c) => c.client_id === opts.clientId);
  const existing = current.clients[index];
  if (existing && !opts.rotate) {
    throw new AdminError('DUPLICATE_CLIENT', `client ${JSON.stringify(opts.clientId)} already exists in ${file}; use --rotate to replace its token`);
  }
  if (!existing && opts.rotate) {
    throw new AdminError('UNKNOWN_CLIENT', `--rotate: no client ${JSON.stringify(opts.clientId)} in ${file}`);
  }
  if (!existing && ips.length === 0) {
    throw new AdminError('INVALID_ARGUMENT', '--ip: a new client needs at least one allowed address or CIDR (0.0.0.0/0 and ::/0 allow any)');
  }

  const token = randomBytes(32).toString('base64url');
  const entry: ClientEntry = {
    client_id: opts.clientId,
    token_sha256: hashToken(token),
    allowed_ips: ips.length > 0 ? ips : existing!.allowed_ips,
    min_date: opts.minDate ?? existing?.min_date ?? DEFAULT_MIN_DATE,
  };
  const clients = [...current.clients];
  if (existing) clients[index] = { ...existing, ...entry };
  else clients.push(entry);
  const next: ClientsFile = { ...current, clients };
  try {
    new ClientRegistry(next, file);
  } catch (err) {
    throw new AdminError('CLIENTS_FILE_INVALID', (err as Error).message, { cause: err });
  }
  await mkdir(dirname(file), { recursive: true });
  const mode = await stat(file).then(
    (s) => s.mode & 0o7777,
    () => null,
  );
  await writeFileAtomic(file, `${JSON.stringify(next, null, 2)}\n`, { mode: mode ?? 0o600 });
  // The umask may have taken bits of the file's own mode off the new copy.
  if (mode !== null) await chmod(file, mode);
  return { client_id: opts.clientId, token, entry, rotated: existing !== undefined };
}

async function readClientsFile(file: string): Promise<ClientsFile> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { clients: [] };
    throw new AdminError('CLIENTS_FILE_INVALID', `${file}: ${(err as Error).message}`, { cause: err });
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw new AdminError('CLIENTS_FILE_INVALID', `${file}: ${(err as Error).message}`, { cause: err });
  }
  if (parsed === null || typeof parsed !== 'object' || !Array.isArray((parsed as ClientsFile).clients)) {
    throw new AdminError('CLIENTS_FILE_INVALID', `${file}: expected {"clients": [...]}`);
  }
  return parsed as ClientsFile;
}

const MASK = '***';

/** A copy of `config` with its secrets, and any credentials inside a URL, replaced by `***` when set. */
export function redactConfig(config: Readonly<Config>): Config {
  const copy = structuredClone(config) as Config;
  const mask = (value: string | null): string | null => (value === null ? null : MASK);
  copy.connector.webhookSecret = mask(copy.connector.webhookSecret);
  copy.s3.accessKeyId = mask(copy.s3.accessKeyId);
  copy.s3.secretAccessKey = mask(copy.s3.secretAccessKey);
  copy.metrics.token = mask(copy.metrics.token);
  copy.connector.url = maskUrlCredentials(copy.connector.url);
  copy.s3.endpoint = maskUrlCredentials(copy.s3.endpoint);
  copy.nats.url = maskUrlCredentials(copy.nats.url);
  return copy;
}

/**
 * `NATS_URL` may list several servers, comma-separated, with or without a scheme, any of them
 * with `user:password@` (the password masked) or `token@` (the token masked), as
 * store/nats/connection.ts reads them.
 */
function maskUrlCredentials(value: string | null): string | null {
  if (value === null) return null;
  return value
    .split(',')
    .map((part) => {
      const raw = part.trim();
      try {
        const url = new URL(/^[a-z]+:\/\//i.test(raw) ? raw : `nats://${raw}`);
        if (url.password) url.password = MASK;
        else if (url.username) url.username = MASK;
        else return part;
        return url.href;
      } catch {
        // Not a URL the gateway would take either: whatever precedes an `@` goes.
        return part.replace(/^(\s*(?:[a-z]+:\/\/)?)[^@/]*@/i, `$1${MASK}@`);
      }
    })
    .join(',');
}

export const USAGE = `Usage: ingest-admin <command> [options]

Commands:
  issue-client --id <client_id> [--ip <cidr>]... [--min-date YYYY-MM-DD]
               [--file <clients.json>] [--rotate] [--json]
      Generate a client token, store its SHA-256 in the clients file and print the
      token once.
        --ip        allowed source address or CIDR, repeatable; required for a new
                    client (0.0.0.0/0 and ::/0 allow any address)
        --min-date  earliest date_from the client may ask for (default ${DEFAULT_MIN_DATE})
        --file      clients file (default: $CLIENTS_FILE, else ${DEFAULT_CLIENTS_FILE})
        --rotate    replace the token of an existing client (and its --ip list and
                    --min-date when given)
        --json      print {"client_id", "token"} as JSON

  print-config
      Print the effective configuration as JSON, secrets masked.

  --help, -h
      Show this help.
`;

export interface AdminIo {
  stdout: (text: string) => void;
  stderr: (text: string) => void;
  env: NodeJS.ProcessEnv;
}

const processIo: AdminIo = {
  stdout: (text) => process.stdout.write(text),
  stderr: (text) => process.stderr.write(text),
  env: process.env,
};

/** Runs one command line (without `node` and the script); resolves with the exit code. */
export async function main(argv: readonly string[], io: AdminIo = processIo): Promise<number> {
  const [command, ...rest] = argv;
  try {
    switch (command) {
      case 'issue-client':
        return await issueClientCommand(rest, io);
      case 'print-config':
        if (help(rest, io)) return 0;
        parseArgs({ args: [...rest], options: {}, strict: true });
        io.stdout(`${JSON.stringify(redactConfig(loadConfig(io.env)), null, 2)}\n`);
        return 0;
      case '--help':
      case '-h':
      case 'help':
        io.stdout(USAGE);
        return 0;
      default:
        throw new AdminError('USAGE', command === undefined ? 'a command is required' : `unknown command: ${command}`);
    }
  } catch (err) {
    const usage = (err instanceof AdminError && err.code === 'USAGE') || isParseArgsError(err);
    io.stderr(`ingest-admin: ${(err as Error).message}\n${usage ? `\n${USAGE}` : ''}`);
    return usage ? 2 : 1;
  }
}

async function issueClientCommand(args: string[], io: AdminIo): Promise<number> {
  if (help(args, io)) return 0;
  const { values } = parseArgs({
    args,
    strict: true,
    options: {
      id: { type: 'string' },
      ip: { type: 'string', multiple: true },
      'min-date': { type: 'string' },
      file: { type: 'string' },
      rotate: { type: 'boolean' },
      json: { type: 'boolean' },
    },
  });
  if (values.id === undefined) throw new AdminError('USAGE', 'issue-client: --id is required');
  if (values.file === '') throw new AdminError('USAGE', 'issue-client: --file names no file');
  const file = values.file ?? (io.env.CLIENTS_FILE || DEFAULT_CLIENTS_FILE);
  const issued = await issueClient(file, {
    clientId: values.id,
    ips: values.ip ?? [],
    ...(values['min-date'] !== undefined ? { minDate: values['min-date'] } : {}),
    rotate: values.rotate ?? false,
  });
  if (values.json) {
    io.stdout(`${JSON.stringify({ client_id: issued.client_id, token: issued.token })}\n`);
  } else {
    const { entry } = issued;
    io.stdout(
      `${issued.rotated ? 'Rotated the token of' : 'Issued'} client ${JSON.stringify(entry.client_id)} in ${file} ` +
        `(allowed IPs: ${entry.allowed_ips.join(', ')}; min date: ${entry.min_date}).\n` +
        `Token: ${issued.token}\n` +
        'This token will not be shown again: only its SHA-256 is stored. Send it as the Authorization header.\n',
    );
  }
  return 0;
}

function help(args: readonly string[], io: AdminIo): boolean {
  if (!args.includes('--help') && !args.includes('-h')) return false;
  io.stdout(USAGE);
  return true;
}

function isParseArgsError(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' && code.startsWith('ERR_PARSE_ARGS_');
}

function invokedDirectly(): boolean {
  try {
    return process.argv[1] !== undefined && realpathSync(process.argv[1]) === fileURLToPath(import.meta.url);
  } catch {
    return false;
  }
}

if (invokedDirectly()) process.exitCode = await main(process.argv.slice(2));
