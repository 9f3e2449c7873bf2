/**
 * The one table of errors the service answers with. Every HTTP error body is built here
 * and nowhere else: the standard `{detail: string}`, the structured 409
 * `{detail: {message, expected, actual}}`, the flat initialize-session 409 and the
 * Pydantic-style 422 array. Callers match on `code`, never on message text.
 */

export interface ValidationIssue {
  type: string;
  loc: (string | number)[];
  msg: string;
  input?: unknown;
  ctx?: Record<string, unknown>;
}

/** What is wrong with one row: the offending column (null for a row of the wrong length) and the message. */
export interface RowFault {
  column: string | null;
  message: string;
}

/** One entry of a row-level 422's `errors`, one bad value (docs/api.md, "API decisions"); `row` is 0-based, of the whole `data` array. */
export interface RowError extends RowFault {
  row: number;
}

/** A row-level 422 lists at most this many errors (the first, in row then column order); `error_count` counts them all. */
export const ROW_ERRORS_MAX = 100;

/** The 422 detail of a row error: `Invalid data types in payload: row 17, column "price": expected …`. */
export function rowDetail(error: RowError): string {
  return `Invalid data types in payload: row ${error.row}${error.column === null ? '' : `, column "${error.column}"`}: ${error.message}`;
}

export interface InitConflictBody {
  status: 'already_exists' | 'workflow_running';
  session_status: string;
  upload_uuid: string;
  message: string;
}

/**
 * Every code a failure carries across a module boundary. HTTP answers: the code and its
 * status (`ServiceError`; docs/api.md, "Error codes"). Internal failures (status null): a
 * class elsewhere carries the code (`readonly code = 'X' satisfies InternalErrorCode`), and
 * the module that catches it matches on the code; none is ever an HTTP body of its own
 * (docs/operations.md, "Internal error codes").
 */
export const ERROR_CODES = {
  AUTH_REQUIRED: 401,
  CLIENT_ID_MISSING: 400,
  IP_NOT_ALLOWED: 403,
  SESSION_NOT_INITIALIZED: 400,
  INVALID_UPLOAD_UUID: 403,
  SESSION_NOT_FOUND: 404,
  UNKNOWN_ENTITY: 400,
  INVALID_SESSION_STATUS: 409,
  INIT_CONFLICT: 409,
  UPLOAD_TASKS_IN_PROGRESS: 409,
  SESSION_FULL: 409,
  CONNECTOR_REJECTED: 409,
  INVALID_PAYLOAD: 422,
  VALIDATION_FAILED: 422,
  DATE_BEFORE_MINIMUM: 400,
  NO_ENTITIES: 400,
  WORKFLOW_NOT_RUNNING: 404,
  WORKFLOW_STOP_FAILED: 404,
  CONNECTOR_ERROR: 500,
  CONNECTOR_UNREACHABLE: 502,
  WEBHOOK_UNAUTHORIZED: 401,
  INVALID_CONTENT_LENGTH: 400,
  INVALID_TRANSFER_ENCODING: 400,
  CONFLICTING_FRAMING: 400,
  MALFORMED_REQUEST: 400,
  INVALID_HOST: 400,
  DUPLICATE_HEADER: 400,
  INVALID_FORWARDED_FOR: 400,
  HEADERS_TOO_LARGE: 431,
  HTTP_VERSION_NOT_SUPPORTED: 505,
  BODY_TOO_LARGE: 413,
  REQUEST_TIMEOUT: 408,
  RATE_LIMITED: 503,
  ROUTE_NOT_FOUND: 404,
  METHOD_NOT_ALLOWED: 405,
  UNSUPPORTED_MEDIA_TYPE: 415,
  IDEMPOTENCY_KEY_INVALID: 400,
  IDEMPOTENCY_KEY_IN_PROGRESS: 409,
  IDEMPOTENCY_KEY_REUSED: 422,
  NOT_READY: 503,
  STORAGE_UNAVAILABLE: 503,
  INTERNAL: 500,
  // Internal: never an HTTP answer of their own.
  /** `ClientGone` (session/ingest.ts): the client went away, or was answered, before its package was recorded. */
  CLIENT_GONE: null,
  /** `PackageNotRecorded` (uploader): the package's ingest is still under way; the queue hands it out again later. */
  PACKAGE_NOT_RECORDED: null,
  /** `PackMissing` (embedded object store): a delete of an object found its directory removed meanwhile (nothing left to delete); never leaves the store. */
  PACK_MISSING: null,
  /** `OutcomeUnknown` (below): whether a package was recorded is unknown at the answer's deadline; its connection is closed without an answer. */
  OUTCOME_UNKNOWN: null,
  // The store port's (`StoreError`, store/ports.ts: `STORE_ERROR_CODES`).
  /** A store, queue, ledger or file used after its close (the process is stopping). */
  STORE_CLOSED: null,
  /** `StoreConflictError`: a conditional write lost to another writer; the caller re-reads and retries. */
  STORE_CONFLICT: null,
  /** A key or id the store cannot take (a caller's bug). */
  STORE_INVALID_KEY: null,
  /** Bad store options or names at open: wrong stream kind, missing bucket. */
  STORE_MISCONFIGURED: null,
  /** NATS or the object store is down or refusing. */
  STORE_UNAVAILABLE: null,
  /** Stored bytes are not what was written. */
  STORE_CORRUPT: null,
  /** The package was dropped (its session deleted) before its commit completed. */
  QUEUE_PACKAGE_DROPPED: null,
  /** A batch appended to a package after its commit. */
  QUEUE_PACKAGE_COMMITTED: null,
  /** A committed package's batches are gone from the queue. */
  QUEUE_BATCH_LOST: null,
  /** `ConfigError` (config/config.ts): the configuration is invalid; the process prints why and exits 2. */
  CONFIG_INVALID: null,
  /** `EdgeUnavailableError` (http/engine.ts): `http.engine` is `uws` and uWebSockets.js cannot load; exit 2. */
  HTTP_ENGINE_UNAVAILABLE: null,
  /** `ListenError` (app.ts): the address cannot be bound (in use past the retry window); exit 1. */
  LISTEN_FAILED: null,
} as const;

type Codes = typeof ERROR_CODES;
/** The codes of HTTP answers (`ServiceError`). */
export type ErrorCode = { [K in keyof Codes]: Codes[K] extends number ? K : never }[keyof Codes];
/** The codes of internal failures (status null). */
export type InternalErrorCode = Exclude<keyof Codes, ErrorCode>;

/** The message of each HTTP code whose message never varies: the `detail` string, a contract (docs/api.md). */
export const MESSAGES = {
  AUTH_REQUIRED: 'User not authenticated',
  CLIENT_ID_MISSING: 'Client-ID header is missing',
  IP_NOT_ALLOWED: 'IP address not allowed',
  SESSION_NOT_INITIALIZED: 'Upload session not initialized',
  INVALID_UPLOAD_UUID: 'Invalid upload UUID',
  SESSION_NOT_FOUND: 'Upload session not found',
  INVALID_SESSION_STATUS: 'Invalid upload session status',
  UPLOAD_TASKS_IN_PROGRESS: 'Upload tasks are still in progress',
  NO_ENTITIES: 'No entities were uploaded in this session',
  WORKFLOW_NOT_RUNNING: 'Workflow is not running',
  WORKFLOW_STOP_FAILED: 'Failed to stop workflow',
  /** The Connector refused a start without a text of its own. */
  CONNECTOR_REJECTED: 'Connector rejected the upload start, please contact support',
  /** 502: the Connector answered 2xx with a body that is not its JSON (other statuses forward its text). */
  CONNECTOR_ERROR: 'Invalid response from Connector service',
  CONNECTOR_UNREACHABLE: 'Failed to connect to Connector service',
  WEBHOOK_UNAUTHORIZED: 'Invalid webhook signature',
  INVALID_CONTENT_LENGTH: 'Invalid Content-Length header',
  INVALID_TRANSFER_ENCODING: 'Invalid Transfer-Encoding header: only chunked is accepted',
  CONFLICTING_FRAMING: 'Content-Length and Transfer-Encoding together',
  MALFORMED_REQUEST: 'Malformed HTTP request',
  INVALID_HOST: 'Missing or repeated Host header',
  INVALID_FORWARDED_FOR: 'Invalid X-Forwarded-For header',
  HEADERS_TOO_LARGE: 'Request header fields too large',
  HTTP_VERSION_NOT_SUPPORTED: 'HTTP version not supported',
  REQUEST_TIMEOUT: 'Request timeout',
  RATE_LIMITED: 'Rate limit exceeded',
  ROUTE_NOT_FOUND: 'Not Found',
  METHOD_NOT_ALLOWED: 'Method Not Allowed',
  UNSUPPORTED_MEDIA_TYPE: 'Unsupported Media Type',
  IDEMPOTENCY_KEY_INVALID: 'Invalid Idempotency-Key header: expected 1 to 255 visible ASCII characters',
  IDEMPOTENCY_KEY_IN_PROGRESS: 'A request with this Idempotency-Key is in progress',
  IDEMPOTENCY_KEY_REUSED: 'Idempotency-Key was already used for a different request (another upload_uuid, entity or body length)',
  NOT_READY: 'Not ready',
  STORAGE_UNAVAILABLE: 'Storage temporarily unavailable',
  INTERNAL: 'Internal server error',
} as const satisfies Partial<Record<ErrorCode, string>>;

export class ServiceError extends Error {
  override readonly name = 'ServiceError';
  readonly code: ErrorCode;
  readonly statusCode: number;
  /** The response body, exactly as sent. */
  readonly body: unknown;
  readonly headers: Readonly<Record<string, string>>;

  constructor(
    code: ErrorCode,
    message: string,
    opts: { statusCode?: number; body?: unknown; headers?: Record<string, string>; cause?: unknown } = {},
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.code = code;
    this.statusCode = opts.statusCode ?? ERROR_CODES[code];
    this.body = opts.body ?? { detail: message };
    this.headers = opts.headers ?? {};
  }
}

export const INVALID_SESSION_STATUS_MESSAGE = MESSAGES.INVALID_SESSION_STATUS;

/** A `ServiceError` of a code with a fixed message. */
const fixed = (code: keyof typeof MESSAGES, opts?: ConstructorParameters<typeof ServiceError>[2]) => new ServiceError(code, MESSAGES[code], opts);

/** Factories, one per code, so call sites never spell a message twice. */
export const errors = {
  authRequired: () => fixed('AUTH_REQUIRED'),
  clientIdMissing: () => fixed('CLIENT_ID_MISSING'),
  ipNotAllowed: () => fixed('IP_NOT_ALLOWED'),
  sessionNotInitialized: () => fixed('SESSION_NOT_INITIALIZED'),
  invalidUploadUuid: () => fixed('INVALID_UPLOAD_UUID'),
  sessionNotFound: () => fixed('SESSION_NOT_FOUND'),
  unknownEntity: (name: string) => new ServiceError('UNKNOWN_ENTITY', `Unknown entity: ${name}`),
  invalidSessionStatus: (expected: string, actual: string | undefined) =>
    fixed('INVALID_SESSION_STATUS', {
      body: { detail: { message: MESSAGES.INVALID_SESSION_STATUS, expected, actual: actual ?? 'UNKNOWN' } },
    }),
  initConflict: (body: InitConflictBody) => new ServiceError('INIT_CONFLICT', body.message, { body }),
  uploadTasksInProgress: () => fixed('UPLOAD_TASKS_IN_PROGRESS'),
  sessionFull: (max: number) =>
    new ServiceError('SESSION_FULL', `Upload session is full: it holds ${max} packages, the most one session can; start the upload, then send the rest in a new session`),
  connectorRejected: (text: string) => new ServiceError('CONNECTOR_REJECTED', text),
  invalidPayload: (message: string) => new ServiceError('INVALID_PAYLOAD', message),
  /** Refused rows: `detail` is the first error's, `errors` the first `ROW_ERRORS_MAX` bad values in row then column order, `error_count` all of them. */
  rowsRefused: (rows: readonly RowError[], count: number) => {
    const detail = rowDetail(rows[0]!);
    const shown = rows.slice(0, ROW_ERRORS_MAX).map(({ row, column, message }) => ({ row, column, message }));
    return new ServiceError('INVALID_PAYLOAD', detail, { body: { detail, errors: shown, error_count: count } });
  },
  validationFailed: (issues: ValidationIssue[]) =>
    new ServiceError('VALIDATION_FAILED', issues[0]?.msg ?? 'Validation failed', {
      body: { detail: issues.map((i) => ('input' in i && nestedDeeper(i.input, INPUT_DEPTH_MAX) ? { ...i, input: null } : i)) },
    }),
  dateBeforeMinimum: (minDate: string) =>
    new ServiceError('DATE_BEFORE_MINIMUM', `date_from cannot be earlier than ${minDate}`),
  noEntities: () => fixed('NO_ENTITIES'),
  workflowNotRunning: () => fixed('WORKFLOW_NOT_RUNNING'),
  workflowStopFailed: (statusCode: 404 | 409 | 500) => fixed('WORKFLOW_STOP_FAILED', { statusCode }),
  /** The Connector's error status forwarded, with its `Retry-After` when there is one. */
  connectorError: (statusCode: number, text: string, retryAfterSeconds: number | null = null) =>
    new ServiceError('CONNECTOR_ERROR', text, {
      statusCode,
      headers: retryAfterSeconds === null ? {} : { 'Retry-After': String(retryAfterSeconds) },
    }),
  connectorUnreachable: (cause?: unknown) => fixed('CONNECTOR_UNREACHABLE', { cause }),
  webhookUnauthorized: () => fixed('WEBHOOK_UNAUTHORIZED'),
  invalidContentLength: () => fixed('INVALID_CONTENT_LENGTH'),
  invalidTransferEncoding: () => fixed('INVALID_TRANSFER_ENCODING'),
  conflictingFraming: () => fixed('CONFLICTING_FRAMING'),
  malformedRequest: () => fixed('MALFORMED_REQUEST'),
  invalidHost: () => fixed('INVALID_HOST'),
  duplicateHeader: (name: string) => new ServiceError('DUPLICATE_HEADER', `Duplicate ${name} header`),
  invalidForwardedFor: () => fixed('INVALID_FORWARDED_FOR'),
  headersTooLarge: () => fixed('HEADERS_TOO_LARGE'),
  httpVersionNotSupported: () => fixed('HTTP_VERSION_NOT_SUPPORTED'),
  /** 413 naming the limit passed: `Request body too large (limit 32 MiB)`; `inflated` for the bound of a gzip body once inflated. */
  bodyTooLarge: (limitBytes: number, inflated = false) =>
    new ServiceError('BODY_TOO_LARGE', `Request body too large (limit ${limitText(limitBytes)}${inflated ? ' once inflated' : ''})`),
  requestTimeout: () => fixed('REQUEST_TIMEOUT'),
  rateLimited: (retryAfterSeconds: number) => fixed('RATE_LIMITED', { headers: { 'Retry-After': String(retryAfterSeconds) } }),
  routeNotFound: () => fixed('ROUTE_NOT_FOUND'),
  /** 405 with `Allow`, the methods the path takes (RFC 9110 §15.5.6). */
  methodNotAllowed: (allowed: readonly string[]) => fixed('METHOD_NOT_ALLOWED', { headers: { Allow: allowed.join(', ') } }),
  unsupportedMediaType: () => fixed('UNSUPPORTED_MEDIA_TYPE'),
  idempotencyKeyInvalid: () => fixed('IDEMPOTENCY_KEY_INVALID'),
  idempotencyKeyInProgress: () => fixed('IDEMPOTENCY_KEY_IN_PROGRESS', { headers: { 'Retry-After': '1' } }),
  idempotencyKeyReused: () => fixed('IDEMPOTENCY_KEY_REUSED'),
  /** `GET /readyz` 503 (gateway and uploader): `{detail: "Not ready", checks, ...extra}`. */
  notReady: (checks: Readonly<Record<string, string>>, extra: Readonly<Record<string, unknown>> = {}) =>
    fixed('NOT_READY', { body: { detail: MESSAGES.NOT_READY, checks, ...extra } }),
  /**
   * The service cannot read or write its own state or queue (NATS unreachable or not answering
   * in time, a stream gone, a disk full or failing): 503 with `Retry-After`, never 500.
   */
  storageUnavailable: (cause?: unknown) =>
    fixed('STORAGE_UNAVAILABLE', { cause, headers: { 'Retry-After': String(STORAGE_RETRY_AFTER_SECONDS) } }),
  internal: (cause?: unknown) => fixed('INTERNAL', { cause }),
};

const MIB = 1024 * 1024;

/**
 * A byte limit as a 413 names it (docs/api.md, Limits): a whole number of MiB as `32 MiB`,
 * any other value as its exact byte count (`1000000 bytes`), never rounded: a client may
 * send exactly the number it reads.
 */
export function limitText(bytes: number): string {
  return bytes % MIB === 0 ? `${bytes / MIB} MiB` : `${bytes} bytes`;
}

/** `Retry-After` of a 503 `Storage temporarily unavailable`: outages seen last seconds (a leader election, a restart). */
export const STORAGE_RETRY_AFTER_SECONDS = 5;

/**
 * OS error codes of a disk that cannot take or give back data for now (docs/api.md, Storage
 * unavailable): full, an I/O error, gone read-only, or a file system whose backend went away
 * under its open files (a FUSE daemon gone: `ENOTCONN`; an NFS server that lost them: `ESTALE`).
 */
const STORAGE_ERRNO: ReadonlySet<string> = new Set(['ENOSPC', 'EDQUOT', 'EIO', 'EROFS', 'ENOTCONN', 'ESTALE']);

/**
 * An ingest whose record write may still land: the store gave no answer that settles it
 * (recorded, or its lease ended) within the time the service waits (session/service.ts,
 * `resolveRecord`; the request timeout's grace, http/exchange.ts). Every answer would be a
 * claim the service cannot make — a 200 for a package maybe never recorded, a 503 ("nothing
 * stored") for one that may be — so the edge closes the connection without one, as a crash
 * would: a retry with the same `Idempotency-Key` gets the settled answer (docs/api.md,
 * Storage unavailable).
 */
export class OutcomeUnknown extends Error {
  override readonly name = 'OutcomeUnknown';
  readonly code = 'OUTCOME_UNKNOWN' satisfies InternalErrorCode;
}

export function isOutcomeUnknown(err: unknown): err is OutcomeUnknown {
  return typeof err === 'object' && err !== null && (err as { code?: unknown }).code === 'OUTCOME_UNKNOWN';
}

/**
 * Whether a failure means the storage cannot be used for now: a store's `STORE_UNAVAILABLE`
 * (store/ports.ts; the NATS adapters raise it for timeouts, a lost connection, JetStream
 * refusing or a stream gone) or an OS error of the disk. Matched on the code, never the text.
 */
export function isStorageUnavailable(err: unknown): boolean {
  const code = typeof err === 'object' && err !== null ? (err as { code?: unknown }).code : undefined;
  return code === 'STORE_UNAVAILABLE' || (typeof code === 'string' && STORAGE_ERRNO.has(code));
}

/**
 * A failure as the client is told it: a `ServiceError` as it is, storage that cannot be used
 * for now 503 `Storage temporarily unavailable`, anything else 500 `Internal server error`.
 */
export function asServiceError(err: unknown): ServiceError {
  if (isServiceError(err)) return err;
  return isStorageUnavailable(err) ? errors.storageUnavailable(err) : errors.internal(err);
}

/**
 * How deeply an echoed 422 `input` may nest. Pydantic echoes the offending value as is; a
 * hostile body (`[[[[…` 100,000 deep, which `JSON.parse` accepts) would overflow
 * `JSON.stringify`'s stack when the answer is written, so such an `input` is sent as null.
 */
const INPUT_DEPTH_MAX = 32;

/** True when `value` has objects or arrays nested more than `max` deep. Iterative: the value may be deeper than the stack. */
function nestedDeeper(value: unknown, max: number): boolean {
  const pending: [unknown, number][] = [[value, 0]];
  while (pending.length > 0) {
    const [v, depth] = pending.pop()!;
    if (typeof v !== 'object' || v === null) continue;
    if (depth >= max) return true;
    for (const child of Array.isArray(v) ? v : Object.values(v)) pending.push([child, depth + 1]);
  }
  return false;
}

/**
 * The failure as the client is told it (`asServiceError`), with `headers` added to its answer:
 * e.g. `Dry-Run: true` on every answer of a dry run. The original failure stays the `cause`.
 */
export function withHeaders(err: unknown, headers: Readonly<Record<string, string>>): ServiceError {
  const failure = asServiceError(err);
  return new ServiceError(failure.code, failure.message, {
    statusCode: failure.statusCode,
    body: failure.body,
    headers: { ...failure.headers, ...headers },
    cause: failure === err ? (failure.cause ?? undefined) : err,
  });
}

export function isServiceError(err: unknown): err is ServiceError {
  return err instanceof ServiceError;
}
