import { Pool } from 'undici';
import { readBounded } from '../bounded-body.js';
import { errors, MESSAGES } from '../errors.js';
import { ConnectorJson, type Connector, type WorkflowStart } from './types.js';

export interface HttpConnectorOptions {
  /** Base URL (`CONNECTOR_URL`); its origin and path are used, a trailing slash is ignored; `user:password@` is sent as HTTP Basic auth. */
  url: string;
  /** Deadline of one call, from sending the request to the end of the answer's body. */
  timeoutMs: number;
  connectTimeoutMs: number;
  /** Largest response body read (default 1 MiB); a longer one counts as an invalid answer. */
  maxBodyBytes?: number;
}

const REJECTED_FALLBACK = MESSAGES.CONNECTOR_REJECTED;
const ERROR_FALLBACK = 'Connector error';
const INVALID_RESPONSE = MESSAGES.CONNECTOR_ERROR;
/** `Retry-After` of a forwarded 503 whose Connector sent none usable: every 503 of the service says when to come back. */
const UNAVAILABLE_RETRY_AFTER_SECONDS = 5;

interface Answer {
  status: number;
  /** Undefined when the body exceeded the read limit. */
  text: string | undefined;
  /** The Connector's `Retry-After` in whole seconds, when it sent one as a number of seconds. */
  retryAfter: number | null;
}

/** The real Connector over HTTP: one keep-alive pool for its origin. Mapping in `types.ts`. */
export class HttpConnector implements Connector {
  readonly #pool: Pool;
  readonly #basePath: string;
  readonly #timeoutMs: number;
  readonly #maxBodyBytes: number;
  /** `Authorization` of every call: the URL's credentials, which `origin` leaves out. */
  readonly #auth: Record<string, string>;

  constructor(opts: HttpConnectorOptions) {
    const base = new URL(opts.url);
    this.#basePath = base.pathname.replace(/\/+$/, '');
    const credentials = `${decoded(base.username)}:${decoded(base.password)}`;
    this.#auth = base.username || base.password ? { authorization: `Basic ${Buffer.from(credentials, 'utf8').toString('base64')}` } : {};
    this.#timeoutMs = opts.timeoutMs;
    this.#maxBodyBytes = opts.maxBodyBytes ?? 1024 * 1024;
    this.#pool = new Pool(base.origin, {
      connect: { timeout: opts.connectTimeoutMs },
      headersTimeout: opts.timeoutMs,
      bodyTimeout: opts.timeoutMs,
    });
  }

  async start(req: WorkflowStart): Promise<ConnectorJson> {
    const { status, text, retryAfter } = await this.#post('/workflows', JSON.stringify(req), true);
    if (status >= 200 && status < 300) {
      if (text !== undefined) {
        try {
          JSON.parse(text);
          return new ConnectorJson(text);
        } catch {
          // not JSON: answered below as an invalid response
        }
      }
      throw errors.connectorError(502, INVALID_RESPONSE);
    }
    if (status === 409) throw errors.connectorRejected(answerText(text) ?? REJECTED_FALLBACK);
    if (status >= 400 && status <= 599) {
      const wait = status === 503 ? (retryAfter ?? UNAVAILABLE_RETRY_AFTER_SECONDS) : retryAfter;
      throw errors.connectorError(status, answerText(text) ?? ERROR_FALLBACK, wait);
    }
    throw errors.connectorError(502, INVALID_RESPONSE);
  }

  async terminate(uploadUuid: string): Promise<void> {
    const { status } = await this.#post(`/workflows/${encodeURIComponent(uploadUuid)}/terminate`, null, false);
    if (status >= 200 && status < 300) return;
    throw errors.workflowStopFailed(status === 404 || status === 409 ? status : 500);
  }

  async close(): Promise<void> {
    await this.#pool.close();
  }

  async #post(path: string, body: string | null, readBody: boolean): Promise<Answer> {
    try {
      const res = await this.#pool.request({
        method: 'POST',
        path: this.#basePath + path,
        headers: body === null ? { accept: 'application/json', ...this.#auth } : { accept: 'application/json', 'content-type': 'application/json', ...this.#auth },
        body,
        headersTimeout: this.#timeoutMs,
        bodyTimeout: this.#timeoutMs,
        // undici checks its own timeouts on a coarse clock (about ±0.5 s, at least 1 s); this keeps the deadline exact
        signal: AbortSignal.timeout(this.#timeoutMs),
      });
      const retryAfter = secondsOf(res.headers['retry-after']);
      if (!readBody) {
        await res.body.dump();
        return { status: res.statusCode, text: undefined, retryAfter };
      }
      return { status: res.statusCode, text: await readBounded(res.body, this.#maxBodyBytes), retryAfter };
    } catch (err) {
      throw errors.connectorUnreachable(err);
    }
  }
}

/** A URL's percent-encoded credential as written (`new URL` keeps a stray `%` as it is). */
function decoded(part: string): string {
  try {
    return decodeURIComponent(part);
  } catch {
    return part;
  }
}

/** The Connector's own words: JSON `detail` or `message` when a non-blank string, else the body text. */
function answerText(text: string | undefined): string | undefined {
  const trimmed = text?.trim();
  if (!trimmed) return undefined;
  try {
    const parsed = JSON.parse(trimmed) as unknown;
    if (typeof parsed === 'object' && parsed !== null) {
      for (const key of ['detail', 'message'] as const) {
        const value = (parsed as Record<string, unknown>)[key];
        if (typeof value === 'string' && value.trim()) return value.trim();
      }
    }
  } catch {
    // plain text body
  }
  return trimmed;
}

/** A `Retry-After` given as delta-seconds (RFC 9110 §10.2.3), at least 1; null for none, a date or anything else. */
function secondsOf(header: string | string[] | undefined): number | null {
  if (typeof header !== 'string' || !/^\s*\d{1,9}\s*$/.test(header)) return null;
  return Math.max(1, Number(header));
}
