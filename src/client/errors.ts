/**
 * The client library's one table of errors. Every failure of a call is a `ClientError`
 * with a stable `code`; callers (the CLI, the retry policy, the bench) match on `code`,
 * never on message text. `ApiError` is the service's own answer (any non-2xx status), with
 * its `detail` as sent and its `Retry-After` in seconds.
 */

export const CLIENT_ERROR_CODES = {
  /** The service answered with a non-2xx status (`ApiError`). */
  API_ERROR: 'the service answered with an error status',
  /** No complete answer within the call's deadline. */
  TIMEOUT: 'no answer within the deadline',
  /** Connection refused, reset or closed before a complete answer. */
  NETWORK: 'the connection failed',
  /** A 2xx answer whose body is not the JSON the endpoint promises. */
  INVALID_RESPONSE: 'the answer is not what the endpoint promises',
  /** The caller's signal aborted the call. */
  ABORTED: 'the caller aborted the call',
  /** A file to push does not match its format or the entity (`InputError`). */
  INPUT: 'the input file does not match its format or the entity',
} as const;

export type ClientErrorCode = keyof typeof CLIENT_ERROR_CODES;

export class ClientError extends Error {
  override readonly name: string = 'ClientError';
  readonly code: ClientErrorCode;
  /** The HTTP status when an answer arrived, else null. */
  readonly status: number | null;
  /** Seconds the service asked to wait (`Retry-After`), else null. */
  readonly retryAfter: number | null;

  constructor(code: ClientErrorCode, message: string, opts: { status?: number | null; retryAfter?: number | null; cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.code = code;
    this.status = opts.status ?? null;
    this.retryAfter = opts.retryAfter ?? null;
  }
}

/** A non-2xx answer of the service. `detail` is the body's `detail` as sent (string, object or 422 array). */
export class ApiError extends ClientError {
  override readonly name = 'ApiError';
  declare readonly status: number;
  readonly detail: unknown;
  /** The whole parsed body (the flat initialize-session 409 has no `detail`), or the text when not JSON. */
  readonly body: unknown;

  constructor(status: number, body: unknown, retryAfter: number | null) {
    super('API_ERROR', `${status} ${describeDetail(body)}`, { status, retryAfter });
    this.body = body;
    this.detail = isRecord(body) && 'detail' in body ? body.detail : body;
  }
}

/** A file to push that cannot be read as rows of the entity; `where` names the line or record. */
export class InputError extends ClientError {
  override readonly name = 'InputError';
  readonly where: string | null;

  constructor(message: string, opts: { where?: string; cause?: unknown } = {}) {
    super('INPUT', opts.where ? `${opts.where}: ${message}` : message, { cause: opts.cause });
    this.where = opts.where ?? null;
  }
}

export function isClientError(err: unknown): err is ClientError {
  const code: unknown = err instanceof Error ? (err as { code?: unknown }).code : undefined;
  return typeof code === 'string' && Object.hasOwn(CLIENT_ERROR_CODES, code);
}

export function isApiError(err: unknown): err is ApiError {
  return isClientError(err) && err.code === 'API_ERROR';
}

/** One line of human text for any error body shape of the service. */
export function describeDetail(body: unknown): string {
  if (typeof body === 'string') return body.length > 300 ? `${body.slice(0, 300)}…` : body;
  if (!isRecord(body)) return JSON.stringify(body) ?? String(body);
  const detail = 'detail' in body ? body.detail : body;
  if (typeof detail === 'string') return detail;
  if (Array.isArray(detail)) {
    // The 422 validation array: "body.date_to: Value error, …"
    return detail
      .map((issue) => (isRecord(issue) ? `${Array.isArray(issue.loc) ? issue.loc.join('.') + ': ' : ''}${String(issue.msg ?? '')}` : String(issue)))
      .join('; ');
  }
  if (isRecord(detail)) {
    // The structured 409 (`{message, expected, actual}`) and the flat initialize-session 409 (`{status, message, …}`).
    const message = typeof detail.message === 'string' ? detail.message : JSON.stringify(detail);
    if (typeof detail.expected === 'string' && typeof detail.actual === 'string') return `${message} (expected ${detail.expected}, actual ${detail.actual})`;
    return message;
  }
  return JSON.stringify(detail);
}

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
