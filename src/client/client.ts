/**
 * `IngestClient`: the service's endpoints as typed calls over one undici `Pool` (keep-alive
 * sockets to the service's origin). Every call has a deadline, is paced (see `pacer.ts`),
 * and fails only with a `ClientError` (see `errors.ts`). The client retries nothing by
 * itself; `ingestWithRetry` and `withRetry` (retry.ts) do, on the caller's say.
 */
import { randomUUID } from 'node:crypto';
import { promisify } from 'node:util';
import { gzip as gzipCallback } from 'node:zlib';
import { Pool } from 'undici';
import { readBounded } from '../bounded-body.js';
import { isHeaderValue } from './cli-config.js';
import { CLIENT_DEFAULTS } from './defaults.js';
import { ApiError, ClientError, isRecord } from './errors.js';
import { Pacer } from './pacer.js';
import { withRetry, type RetryPolicy } from './retry.js';
import type {
  CallOptions,
  Catalog,
  IngestClientOptions,
  IngestOptions,
  IngestResult,
  InitializeResult,
  OperationResult,
  StartResult,
  StatusView,
} from './types.js';

export const CLIENT_VERSION = '0.1.0';
export const API_PATH = '/api/v1/uploading';

const gzip = promisify(gzipCallback);
/** Answers of this API are small; a longer one is not the service talking. */
const MAX_ANSWER_BYTES = 4 * 1024 * 1024;

interface Answer {
  status: number;
  body: unknown;
  retryAfter: number | null;
  /** `Idempotent-Replayed: true`: the answer of an earlier request with the same key. */
  replayed: boolean;
}

interface Send {
  method: 'GET' | 'POST';
  path: string;
  body?: string | Uint8Array;
  headers?: Record<string, string>;
  timeoutMs: number;
  signal?: AbortSignal | undefined;
}

export class IngestClient {
  readonly baseUrl: string;
  readonly clientId: string;
  readonly #token: string;
  readonly #pool: Pool;
  readonly #pacer: Pacer;
  readonly #basePath: string;
  readonly #timeoutMs: number;
  readonly #ingestTimeoutMs: number;
  readonly #userAgent: string;

  constructor(opts: IngestClientOptions) {
    let url: URL;
    try {
      url = new URL(opts.baseUrl);
    } catch {
      throw new TypeError(`baseUrl: expected an http(s) URL, got ${JSON.stringify(opts.baseUrl)}`);
    }
    if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new TypeError(`baseUrl: expected an http(s) URL, got ${JSON.stringify(opts.baseUrl)}`);
    if (!opts.clientId) throw new TypeError('clientId: required');
    if (!opts.token) throw new TypeError('token: required');
    if (!isHeaderValue(opts.clientId)) throw new TypeError('clientId: has a character a header cannot carry');
    if (!isHeaderValue(opts.token)) throw new TypeError('token: has a character a header cannot carry');
    for (const key of ['timeoutMs', 'ingestTimeoutMs', 'connectTimeoutMs', 'connections', 'requestsPerSecond'] as const) {
      const v = opts[key];
      if (v !== undefined && !(Number.isFinite(v) && v >= 0)) throw new TypeError(`${key}: expected a number >= 0, got ${String(v)}`);
    }
    this.baseUrl = url.origin + url.pathname.replace(/\/+$/, '');
    this.#basePath = url.pathname.replace(/\/+$/, '') + API_PATH;
    this.clientId = opts.clientId;
    this.#token = opts.token;
    this.#timeoutMs = opts.timeoutMs || CLIENT_DEFAULTS.timeoutMs;
    this.#ingestTimeoutMs = opts.ingestTimeoutMs || CLIENT_DEFAULTS.ingestTimeoutMs;
    this.#userAgent = opts.userAgent ?? `ingest-client/${CLIENT_VERSION}`;
    this.#pacer = new Pacer(opts.requestsPerSecond ?? CLIENT_DEFAULTS.requestsPerSecond);
    this.#pool = new Pool(url.origin, {
      connections: opts.connections || CLIENT_DEFAULTS.connections,
      connect: { timeout: Math.min(opts.connectTimeoutMs || CLIENT_DEFAULTS.connectTimeoutMs, this.#timeoutMs, this.#ingestTimeoutMs) },
    });
  }

  /** Creates the client's session; a 409 is returned (not thrown) with the existing session's uuid. */
  async initialize(opts: CallOptions = {}): Promise<InitializeResult> {
    try {
      const body = await this.#json({ method: 'POST', path: '/initialize-session', ...this.#deadline(opts) });
      return expectShape<InitializeResult>(body, 'initialize-session', { upload_uuid: 'string', status: 'string' });
    } catch (err) {
      const body = err instanceof ApiError && err.status === 409 ? err.body : undefined;
      if (isRecord(body) && typeof body.upload_uuid === 'string' && (body.status === 'already_exists' || body.status === 'workflow_running')) {
        return body as InitializeResult;
      }
      throw err;
    }
  }

  async status(uploadUuid: string, opts: CallOptions = {}): Promise<StatusView> {
    const body = await this.#json({ method: 'GET', path: `/${seg(uploadUuid)}/status`, ...this.#deadline(opts) });
    return expectShape<StatusView>(body, 'status', { upload_uuid: 'string', session_status: 'string' });
  }

  /**
   * Sends one package: `body` is the JSON `{columns, data}` (the caller keeps it under the
   * service's 32 MiB limit, counted on the wire).
   */
  async ingest(uploadUuid: string, entity: string, body: Uint8Array | string, opts: IngestOptions = {}): Promise<IngestResult> {
    const wire = opts.gzip ? await gzip(body) : body;
    return this.#ingestWire(uploadUuid, entity, wire, opts.gzip || opts.contentEncoding === 'gzip', opts);
  }

  /**
   * `ingest` under `withRetry(policy)`, every attempt with the same `Idempotency-Key`
   * (`opts.idempotencyKey`, else a random one made here), compressing at most once.
   */
  async ingestWithRetry(
    uploadUuid: string,
    entity: string,
    body: Uint8Array | string,
    opts: IngestOptions = {},
    policy: RetryPolicy = {},
  ): Promise<IngestResult> {
    const key = opts.idempotencyKey ?? randomUUID();
    const wire = opts.gzip ? await gzip(body) : body;
    const encoded = opts.gzip || opts.contentEncoding === 'gzip';
    return withRetry(() => this.#ingestWire(uploadUuid, entity, wire, encoded, { ...opts, idempotencyKey: key }), {
      ...policy,
      signal: policy.signal ?? opts.signal,
    });
  }

  /** `start-upload` with `YYYY-MM-DD` dates; answers the Connector's JSON. */
  async start(uploadUuid: string, dates: { date_from: string; date_to: string }, opts: CallOptions = {}): Promise<StartResult> {
    const body = await this.#json({
      method: 'POST',
      path: `/${seg(uploadUuid)}/start-upload`,
      body: JSON.stringify({ date_from: dates.date_from, date_to: dates.date_to }),
      headers: { 'content-type': 'application/json' },
      ...this.#deadline(opts),
    });
    if (!isRecord(body)) throw invalid('start-upload', body);
    return body;
  }

  async terminate(uploadUuid: string, opts: CallOptions = {}): Promise<OperationResult> {
    const body = await this.#json({ method: 'POST', path: `/${seg(uploadUuid)}/terminate`, ...this.#deadline(opts) });
    return expectShape<OperationResult>(body, 'terminate', { status: 'string' });
  }

  async delete(uploadUuid: string, opts: CallOptions = {}): Promise<OperationResult> {
    const body = await this.#json({ method: 'POST', path: `/${seg(uploadUuid)}/delete`, ...this.#deadline(opts) });
    return expectShape<OperationResult>(body, 'delete', { status: 'string' });
  }

  /** The entity catalog: names, columns, types, required flags, parents. */
  async entities(opts: CallOptions = {}): Promise<Catalog> {
    const body = await this.#json({ method: 'GET', path: '/entities', ...this.#deadline(opts) });
    const catalog = expectShape<Catalog>(body, 'entities', {});
    if (!Array.isArray(catalog.entities)) throw invalid('entities', body);
    return catalog;
  }

  /** Closes the pool's sockets once the calls under way have ended. */
  async close(): Promise<void> {
    await this.#pool.close();
  }

  async #ingestWire(uploadUuid: string, entity: string, wire: Uint8Array | string, gzipped: boolean, opts: IngestOptions): Promise<IngestResult> {
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    if (gzipped) headers['content-encoding'] = 'gzip';
    if (opts.idempotencyKey !== undefined) headers['idempotency-key'] = opts.idempotencyKey;
    const answer = await this.#answer({
      method: 'POST',
      path: `/${seg(uploadUuid)}/${seg(entity)}${opts.dryRun ? '?dry_run=true' : ''}`,
      body: wire,
      headers,
      timeoutMs: opts.timeoutMs ?? this.#ingestTimeoutMs,
      signal: opts.signal,
    });
    const result = expectShape<IngestResult>(answer.body, 'ingest', { rows_processed: 'number' });
    return { ...result, replayed: answer.replayed };
  }

  #deadline(opts: CallOptions): { timeoutMs: number; signal: AbortSignal | undefined } {
    return { timeoutMs: opts.timeoutMs ?? this.#timeoutMs, signal: opts.signal };
  }

  /** One request: the parsed JSON of a 2xx answer, else an `ApiError`; transport failures as `ClientError`. */
  async #json(send: Send): Promise<unknown> {
    return (await this.#answer(send)).body;
  }

  async #answer(send: Send): Promise<Answer> {
    const answer = await this.#send(send);
    if (answer.status >= 200 && answer.status < 300) return answer;
    throw new ApiError(answer.status, answer.body, answer.retryAfter);
  }

  async #send(send: Send): Promise<Answer> {
    if (send.signal?.aborted) throw new ClientError('ABORTED', 'aborted before sending', { cause: send.signal.reason });
    try {
      await this.#pacer.acquire(send.signal);
    } catch (err) {
      throw new ClientError('ABORTED', 'aborted before sending', { cause: err });
    }
    const deadline = AbortSignal.timeout(send.timeoutMs);
    const signal = send.signal ? AbortSignal.any([send.signal, deadline]) : deadline;
    const what = `${send.method} ${send.path}`;
    try {
      const res = await this.#pool.request({
        method: send.method,
        path: this.#basePath + send.path,
        headers: {
          accept: 'application/json',
          'user-agent': this.#userAgent,
          authorization: this.#token,
          'client-id': this.clientId,
          ...send.headers,
        },
        body: send.body ?? null,
        // undici checks these on a coarse clock; the signal keeps the deadline exact
        headersTimeout: send.timeoutMs,
        bodyTimeout: send.timeoutMs,
        signal,
      });
      const text = await readBounded(res.body, MAX_ANSWER_BYTES);
      if (text === undefined) throw new ClientError('INVALID_RESPONSE', `${what}: answer longer than ${MAX_ANSWER_BYTES} bytes`, { status: res.statusCode });
      let body: unknown = text;
      try {
        body = text.trim() ? JSON.parse(text) : null;
      } catch {
        if (res.statusCode >= 200 && res.statusCode < 300) throw new ClientError('INVALID_RESPONSE', `${what}: answer is not JSON`, { status: res.statusCode });
      }
      return {
        status: res.statusCode,
        body,
        retryAfter: parseRetryAfter(res.headers['retry-after']),
        replayed: String(res.headers['idempotent-replayed']).toLowerCase() === 'true',
      };
    } catch (err) {
      if (err instanceof ClientError) throw err;
      if (send.signal?.aborted) throw new ClientError('ABORTED', `${what}: aborted`, { cause: err });
      if (deadline.aborted) throw new ClientError('TIMEOUT', `${what}: no answer within ${send.timeoutMs} ms`, { cause: err });
      const code = (err as { code?: unknown }).code;
      if (code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT' || code === 'UND_ERR_CONNECT_TIMEOUT') {
        throw new ClientError('TIMEOUT', `${what}: ${(err as Error).message}`, { cause: err });
      }
      throw new ClientError('NETWORK', `${what}: ${(err as Error).message ?? String(err)}`, { cause: err });
    }
  }
}

/** `Retry-After` as whole seconds (delta-seconds or an HTTP date), else null. */
export function parseRetryAfter(value: string | string[] | undefined, now = Date.now()): number | null {
  const v = Array.isArray(value) ? value[0] : value;
  if (v === undefined) return null;
  const trimmed = v.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed);
  const at = Date.parse(trimmed);
  if (Number.isNaN(at)) return null;
  return Math.max(0, Math.ceil((at - now) / 1000));
}

function seg(value: string): string {
  if (!value) throw new TypeError('path segment must not be empty');
  return encodeURIComponent(value);
}

function invalid(endpoint: string, body: unknown): ClientError {
  return new ClientError('INVALID_RESPONSE', `${endpoint}: unexpected answer ${JSON.stringify(body)?.slice(0, 200)}`, { status: 200 });
}

/** Checks the few fields a caller relies on; the rest is the service's to add to. */
function expectShape<T>(body: unknown, endpoint: string, fields: Record<string, 'string' | 'number'>): T {
  if (!isRecord(body)) throw invalid(endpoint, body);
  for (const [key, type] of Object.entries(fields)) if (typeof body[key] !== type) throw invalid(endpoint, body);
  return body as T;
}
