/**
 * What every command works with: the exit codes, the process's streams, and the parsed command line (`Cli`).
 */
import { IngestClient } from '../../client/client.js';
import { CLI_DEFAULTS } from '../../client/defaults.js';
import { resolveCredentials, SessionMemory, UsageError, type Credentials } from '../../client/cli-config.js';
import { isApiError, isClientError, type ApiError } from '../../client/errors.js';
import { withRetry, type RetryPolicy } from '../../client/retry.js';
import { seconds, str } from './args.js';

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

export type Values = Record<string, string | boolean | undefined>;

/** What the last attempt of a call got: the call's value, or the service's refusal. */
export type Answer<T> = { value: T } | { error: ApiError };

export interface CliIo {
  stdout: { write(text: string): unknown; isTTY?: boolean };
  stderr: { write(text: string): unknown; isTTY?: boolean; columns?: number };
  env: NodeJS.ProcessEnv;
  /** What `push -` reads (default: none, so `-` is a usage error). */
  stdin?: NodeJS.ReadableStream;
  /** Aborted on SIGINT. */
  signal?: AbortSignal;
}

export class Cli {
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

  /** The package size each input file was cut with in the session where some of its packages were stored (`SessionMemory.cuts`). */
  async cuts(uuid: string): Promise<Map<string, number>> {
    const creds = await this.creds();
    return this.memory.cuts(creds.url, creds.clientId, uuid);
  }

  async rememberCut(uuid: string, file: string, packageBytes: number): Promise<void> {
    const creds = await this.creds();
    await this.memory.recordCut(creds.url, creds.clientId, uuid, file, packageBytes);
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

  /**
   * `call` for a change that is not idempotent (init, start, delete). An attempt that ended
   * without an answer (TIMEOUT, NETWORK) may have been carried out all the same, and then a
   * later attempt meets its effect instead of the state the call began in (start: 409
   * `actual` STARTED; delete: the session gone; init: 409 naming the session it made).
   * After such an attempt only, `settle` gets what the last attempt got and returns what the
   * call did; undefined leaves that answer as it is.
   */
  async change<T>(fn: () => Promise<T>, settle: (last: Answer<T>) => Promise<T | undefined>): Promise<T> {
    let unanswered = false;
    let value: T;
    try {
      value = await this.call(async () => {
        try {
          return await fn();
        } catch (err) {
          if (isClientError(err) && (err.code === 'TIMEOUT' || err.code === 'NETWORK')) unanswered = true;
          throw err;
        }
      });
    } catch (err) {
      if (!unanswered || !isApiError(err)) throw err;
      const settled = await settle({ error: err });
      if (settled === undefined) throw err;
      return settled;
    }
    return unanswered ? ((await settle({ value })) ?? value) : value;
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

export function callOpts(cli: Cli): { signal?: AbortSignal } {
  return cli.signal ? { signal: cli.signal } : {};
}
