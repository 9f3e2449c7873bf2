/**
 * Where the `ingest` command line finds its credentials, and what it remembers.
 *
 * Credentials, each from the first place that has it: the flags (`--url`, `--client-id`,
 * `--token`), the environment (`INGEST_URL`, `INGEST_CLIENT_ID`, `INGEST_TOKEN`), the
 * config file: `--config FILE`, else `$INGEST_CONFIG`, else
 * `$XDG_CONFIG_HOME/ingest/config.json` (default `~/.config/ingest/config.json`), a JSON
 * object `{"url", "client_id", "token"}`. A named config file must exist; the default one may not.
 *
 * The last upload session used per service URL and client is kept in
 * `$XDG_STATE_HOME/ingest/sessions.json` (default `~/.local/state/ingest/sessions.json`), so
 * that `status`, `start`, `terminate` and `delete` need no uuid after `init` or `push`; beside
 * it, the package size each input file was cut with in a session where some of its packages
 * were stored (`push` cuts it the same way again: another cut would store those rows twice).
 */
import { mkdir, readFile, rename, stat, writeFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';
import { isRecord } from './errors.js';

export class UsageError extends Error {
  override readonly name = 'UsageError';
  readonly code = 'USAGE';
}

export interface Credentials {
  url: string;
  clientId: string;
  token: string;
  /** Where each came from, for messages (`flag`, `env`, or the config file's path). */
  sources: { url: string; clientId: string; token: string };
  /** A warning to show (a config file readable by others). */
  warning: string | null;
}

export interface CredentialFlags {
  url?: string | undefined;
  clientId?: string | undefined;
  token?: string | undefined;
  config?: string | undefined;
}

function xdg(env: NodeJS.ProcessEnv, name: 'XDG_CONFIG_HOME' | 'XDG_STATE_HOME', fallback: string[]): string {
  const set = env[name];
  if (set && set.startsWith('/')) return set;
  return join(env.HOME || homedir(), ...fallback);
}

export function defaultConfigPath(env: NodeJS.ProcessEnv): string {
  return join(xdg(env, 'XDG_CONFIG_HOME', ['.config']), 'ingest', 'config.json');
}

export async function resolveCredentials(flags: CredentialFlags, env: NodeJS.ProcessEnv): Promise<Credentials> {
  const named = flags.config ?? env.INGEST_CONFIG;
  const path = named ?? defaultConfigPath(env);
  let file: Record<string, unknown> = {};
  let warning: string | null = null;
  let text: string | null = null;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT' || named !== undefined) {
      throw new UsageError(`config file ${path}: ${(err as Error).message}`);
    }
  }
  if (text !== null) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch (err) {
      throw new UsageError(`config file ${path}: ${(err as Error).message}`);
    }
    if (!isRecord(parsed)) throw new UsageError(`config file ${path}: expected a JSON object {"url", "client_id", "token"}`);
    for (const key of Object.keys(parsed)) {
      if (!['url', 'client_id', 'token'].includes(key)) throw new UsageError(`config file ${path}: unknown key ${JSON.stringify(key)} (expected url, client_id, token)`);
      if (typeof parsed[key] !== 'string') throw new UsageError(`config file ${path}: ${key} must be a string`);
    }
    file = parsed;
    if (typeof file.token === 'string') {
      const mode = (await stat(path)).mode;
      if (mode & 0o077) warning = `config file ${path} holds a token and is readable by others (chmod 600 it)`;
    }
  }
  const pick = (flag: string | undefined, envName: string, key: string, what: string) => {
    if (flag) return { value: flag, source: 'flag' };
    const fromEnv = env[envName];
    if (fromEnv) return { value: fromEnv, source: envName };
    const fromFile = file[key];
    if (typeof fromFile === 'string' && fromFile) return { value: fromFile, source: path };
    throw new UsageError(`no ${what}: pass --${key.replace('_', '-')}, set ${envName}, or put "${key}" in ${path}`);
  };
  const url = pick(flags.url, 'INGEST_URL', 'url', 'service URL');
  const clientId = pick(flags.clientId, 'INGEST_CLIENT_ID', 'client_id', 'client id');
  const token = pick(flags.token, 'INGEST_TOKEN', 'token', 'token');
  // Sent as headers: a line end (a token file's CRLF) would fail every request, as if the service were unreachable.
  for (const [what, got, flag] of [['client id', clientId, '--client-id'], ['token', token, '--token']] as const) {
    if (!isHeaderValue(got.value)) throw new UsageError(`${what} (from ${credentialSource(got.source, flag)}): has a character a header cannot carry (a line end, a control character, or one past U+00FF)`);
  }
  let parsed: URL;
  try {
    parsed = new URL(url.value);
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') throw new Error('not http(s)');
  } catch {
    throw new UsageError(`service URL (${url.source}): expected an http(s) URL, got ${JSON.stringify(maskUserinfo(url.value))}`);
  }
  // Never sent (requests go to the URL's origin, the credentials are the headers), and a
  // password there would be printed with every message that names the URL.
  if (parsed.username || parsed.password) {
    throw new UsageError(`service URL (${url.source}): a user or password in the URL is not sent (the service takes the client id and token): remove it from ${maskUserinfo(url.value)}`);
  }
  return {
    url: url.value,
    clientId: clientId.value,
    token: token.value,
    sources: { url: url.source, clientId: clientId.source, token: token.source },
    warning,
  };
}

/** Where a credential came from, as the user would change it. */
export function credentialSource(source: string, flag: string): string {
  return source === 'flag' ? flag : source.startsWith('INGEST_') ? `$${source}` : source;
}

/** A URL as text with what is between `//` and `@` masked. */
function maskUserinfo(url: string): string {
  return url.replace(/\/\/[^/?#]*@/, '//***@');
}

/** What an HTTP header value may hold: tab, visible ASCII and space, and the bytes 0x80–0xFF (undici's rule). */
export function isHeaderValue(value: string): boolean {
  return !/[^\t\x20-\x7e\x80-\xff]/.test(value);
}

/** Sessions whose inputs' cuts are kept: the oldest go first. */
const CUT_SESSIONS = 200;

/** Where a session's cuts are kept in the state file. */
const cutsKey = (url: string, clientId: string, uploadUuid: string): string => `${SessionMemory.key(url, clientId)} ${uploadUuid}`;

/** The remembered upload sessions, keyed by service URL and client id, and the cuts of what was pushed into them. */
export class SessionMemory {
  readonly path: string;

  constructor(env: NodeJS.ProcessEnv) {
    this.path = join(xdg(env, 'XDG_STATE_HOME', ['.local', 'state']), 'ingest', 'sessions.json');
  }

  static key(url: string, clientId: string): string {
    return `${new URL(url).href} ${clientId}`;
  }

  async get(url: string, clientId: string): Promise<string | null> {
    const all = await this.#read();
    const value = all[SessionMemory.key(url, clientId)];
    return typeof value === 'string' ? value : null;
  }

  /** Best effort: a state file that cannot be written costs only the memory. */
  async set(url: string, clientId: string, uploadUuid: string | null): Promise<void> {
    await this.#update((all) => {
      const key = SessionMemory.key(url, clientId);
      if (uploadUuid === null) delete all[key];
      else all[key] = uploadUuid;
    });
  }

  /** The package size (bytes) each input file (by absolute path) was cut with in the session, where some of its packages were stored. */
  async cuts(url: string, clientId: string, uploadUuid: string): Promise<Map<string, number>> {
    const cuts = (await this.#read()).cuts;
    const files = isRecord(cuts) ? cuts[cutsKey(url, clientId, uploadUuid)] : undefined;
    if (!isRecord(files)) return new Map();
    return new Map(Object.entries(files).filter((e): e is [string, number] => Number.isSafeInteger(e[1])));
  }

  /** Records that `file` (an absolute path) was cut with `packageBytes` in the session and some of its packages were stored. Best effort, as `set`. */
  async recordCut(url: string, clientId: string, uploadUuid: string, file: string, packageBytes: number): Promise<void> {
    await this.#update((all) => {
      const cuts = isRecord(all.cuts) ? all.cuts : {};
      const key = cutsKey(url, clientId, uploadUuid);
      const files = isRecord(cuts[key]) ? cuts[key] : {};
      // Re-inserted last: the sessions used longest ago are dropped first.
      delete cuts[key];
      cuts[key] = { ...files, [file]: packageBytes };
      for (const old of Object.keys(cuts).slice(0, -CUT_SESSIONS)) delete cuts[old];
      all.cuts = cuts;
    });
  }

  async #update(change: (all: Record<string, unknown>) => void): Promise<void> {
    try {
      const all = await this.#read();
      change(all);
      await mkdir(dirname(this.path), { recursive: true, mode: 0o700 });
      const tmp = `${this.path}.${process.pid}.tmp`;
      await writeFile(tmp, `${JSON.stringify(all, null, 2)}\n`, { mode: 0o600 });
      await rename(tmp, this.path);
    } catch {
      // see above
    }
  }

  async #read(): Promise<Record<string, unknown>> {
    try {
      const parsed: unknown = JSON.parse(await readFile(this.path, 'utf8'));
      return isRecord(parsed) ? parsed : {};
    } catch {
      return {};
    }
  }
}
