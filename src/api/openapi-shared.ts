/**
 * The pieces of the OpenAPI document that routes share, defined once: the helpers that write
 * a response, the messages of errors.ts as the descriptions quote them, the responses every
 * client operation may give (`components.responses`), the common parameters
 * (`components.parameters`) and the security schemes. A route refers to a shared piece by
 * name (`shared('Unauthorized')`, `parameter('UploadUuid')`), checked at compile time.
 */
import { defaultConfig } from '../config/config.js';
import { ENTITIES } from '../entities/catalog.js';
import { errors, MESSAGES, STORAGE_RETRY_AFTER_SECONDS } from '../errors.js';
import type { Json } from './route.js';

export const schema = (name: string): Json => ({ $ref: `#/components/schemas/${name}` });
export const jsonResponse = (description: string, body: Json, extra: Json = {}): Json => ({
  description,
  content: { 'application/json': { schema: body, ...extra } },
});
/** An error response whose `description` lists the messages it may carry. */
export const error = (messages: string[], name = 'ErrorDetail', extra: Json = {}): Json =>
  jsonResponse(messages.map((m) => `- ${m}`).join('\n'), schema(name), extra);

/** The default body limits, as the 413 messages name them (the served document shows the defaults). */
export const LIMITS: { ingestBodyBytes: number; otherBodyBytes: number } = defaultConfig().limits;
export const MAX_INFLATED: number = defaultConfig().ingest.maxDecompressedBytes;
/** A message of errors.ts as the descriptions quote it: in backticks. */
export const q = (code: keyof typeof MESSAGES): string => `\`${MESSAGES[code]}\``;
/** The message of a factory with a variable part, that part named by a placeholder. */
export const qe = (err: { message: string }): string => `\`${err.message}\``;

export const CLIENT_ID_MISSING = q('CLIENT_ID_MISSING');
export const NOT_INITIALIZED = `${q('SESSION_NOT_INITIALIZED')}: the client has no active session`;
export const IP_NOT_ALLOWED = `${q('IP_NOT_ALLOWED')}: the source address is not in the client's allow-list`;
export const WRONG_UUID = `${q('INVALID_UPLOAD_UUID')}: \`upload_uuid\` is not the client's active session`;
export const NOT_UPLOADING = 'The session is not `UPLOADING` (`expected` is `UPLOADING`)';
export const UNREACHABLE = `${q('CONNECTOR_UNREACHABLE')}: no connection or no answer in time`;
export const BAD_CONTENT_LENGTH = `${q('INVALID_CONTENT_LENGTH')} (checked at the edge, before anything else)`;

export const NO_CACHE: Json = { description: '`no-cache`', schema: { type: 'string' } };
export const RETRY_AFTER: Json = {
  description: 'Whole seconds to wait before retrying: until a token of the rate limit is back, 1 for the in-flight limit.',
  required: true,
  schema: { type: 'integer', minimum: 1 },
};

/** On an ingest answer replayed for a repeated `Idempotency-Key`. */
export const REPLAYED: Json = {
  description: '`true` when this is the stored answer of an earlier request with the same `Idempotency-Key`; absent otherwise.',
  required: false,
  schema: { type: 'string', const: 'true' },
};

/** `Dry-Run: true`: on every answer the ingest operation gives a dry run (docs/api.md, Dry runs). */
export const DRY_RUN: Json = {
  description: '`true` on every answer to a dry run (`dry_run=true`); absent otherwise.',
  required: false,
  schema: { type: 'string', const: 'true' },
};

export const SECURITY_SCHEMES = {
  Authorization: {
    type: 'apiKey',
    in: 'header',
    name: 'Authorization',
    description: 'The access token itself; `Bearer <token>` is accepted too.',
  },
  'Client-Id': { type: 'apiKey', in: 'header', name: 'Client-Id', description: 'The client identifier the token was issued to.' },
  MetricsToken: { type: 'http', scheme: 'bearer', description: '`metrics.token` of the configuration, when set (`GET /metrics` only).' },
};

/** The ingest retry key (rules: session/idempotency.ts and docs/api.md, Idempotent retries). */
const IDEMPOTENCY_KEY: Json = {
  name: 'Idempotency-Key',
  in: 'header',
  required: false,
  description:
    'Optional key the client chooses for one package (e.g. a UUID v4), 1 to 255 visible ASCII characters. A retry ' +
    'of the same package with the same key (after a timeout, a dropped connection, a 5xx) answers what the first ' +
    'attempt answered (a 200, or a 413/422 of its body; header `Idempotent-Replayed: true`) and stores the rows once, ' +
    'on any instance, for 24 h. A repeat while the first attempt runs waits up to 10 s for its answer, then 409. ' +
    'The same key with another `upload_uuid`, entity or `Content-Length` answers 422.',
  schema: { type: 'string', minLength: 1, maxLength: 255, pattern: '^[!-~]+$' },
};

/** `components.parameters`: referenced by `parameter(name)`. */
export const PARAMETERS = {
  UploadUuid: {
    name: 'upload_uuid',
    in: 'path',
    required: true,
    description: 'The session, as returned by initialize-session.',
    schema: { type: 'string' },
  },
  EntityName: {
    name: 'entity_name',
    in: 'path',
    required: true,
    description: 'An entity of the catalog; any other name answers 400 `Unknown entity: <entity_name>`.',
    schema: { type: 'string', enum: ENTITIES.map((e) => e.name) },
  },
  ContentEncoding: {
    name: 'Content-Encoding',
    in: 'header',
    required: false,
    description:
      'The body\'s coding: absent or `identity` (plain JSON), or `gzip` (`x-gzip`, its old name). Any other ' +
      'value answers 415 before the body is read.',
    schema: { type: 'string', enum: ['identity', 'gzip', 'x-gzip'] },
  },
  IdempotencyKey: IDEMPOTENCY_KEY,
  DryRun: {
    name: 'dry_run',
    in: 'query',
    required: false,
    description:
      '`true` (also `1`, `yes`, `on`, `t`, `y`, any case): a dry run, every check and the answer the package would get, ' +
      'with `Dry-Run: true`, nothing stored or recorded; not an upload for the status. `false` (also `0`, `no`, `off`, ' +
      '`f`, `n`) or absent: a package. Any other value, or the parameter twice: 422.',
    schema: { type: 'boolean', default: false },
  },
  ConnectorTimestamp: {
    name: 'X-Connector-Timestamp',
    in: 'header',
    required: true,
    description: 'Unix seconds; at most 300 s (configurable) from the server clock either way.',
    schema: { type: 'string', pattern: '^[0-9]{1,15}$' },
  },
  ConnectorSignature: {
    name: 'X-Connector-Signature',
    in: 'header',
    required: true,
    description: '`sha256=` and the hex HMAC-SHA256 of `<timestamp>.<raw body>` under the shared secret (`CONNECTOR_WEBHOOK_SECRET`).',
    schema: { type: 'string', pattern: '^sha256=[0-9a-fA-F]{64}$' },
  },
};

export const parameter = (name: keyof typeof PARAMETERS): Json => ({ $ref: `#/components/parameters/${name}` });

/** `components.responses`: referenced by `shared(name)`. */
export const RESPONSES = {
  Unauthorized: error([`${q('AUTH_REQUIRED')}: \`Authorization\` missing or unknown, or not issued to \`Client-Id\``]),
  RequestTimeout: error([`${q('REQUEST_TIMEOUT')}: the request was not complete within 600 s; the connection is closed`]),
  PayloadTooLarge: error([
    `${qe(errors.bodyTooLarge(LIMITS.otherBodyBytes))}: over the body limit of requests other than ingest (\`limits.otherBodyBytes\`, ` +
      '1 MiB by default; the message names the configured limit, in bytes when it is not a whole number of MiB)',
  ]),
  InternalError: error([q('INTERNAL')]),
  RateLimited: {
    ...error([`${q('RATE_LIMITED')}: over the request rate or the concurrent connections of the client IP`]),
    headers: { 'Retry-After': RETRY_AFTER },
  },
  Unavailable: {
    ...error([
      `${q('RATE_LIMITED')}: over the request rate or the concurrent connections of the client IP`,
      `${q('STORAGE_UNAVAILABLE')}: the service cannot read or write its session state or queue for now (NATS ` +
        'unreachable or not answering in time, a stream of the service gone, a disk full or failing); nothing of the ' +
        'request is stored, and the service recovers by itself once its storage works again',
    ]),
    headers: {
      'Retry-After': {
        ...RETRY_AFTER,
        description: `${RETRY_AFTER.description} ${STORAGE_RETRY_AFTER_SECONDS} with ${q('STORAGE_UNAVAILABLE')}.`,
      },
    },
  },
};

export const shared = (name: keyof typeof RESPONSES): Json => ({ $ref: `#/components/responses/${name}` });

/**
 * Answers every client operation may give: authentication, limits, internal errors; and,
 * unless `stateless` (the catalog), the storage being unavailable.
 */
export const clientResponses = (own: Json, stateless = false): Json => ({
  '401': shared('Unauthorized'),
  '408': shared('RequestTimeout'),
  '413': shared('PayloadTooLarge'),
  '500': shared('InternalError'),
  '503': shared(stateless ? 'RateLimited' : 'Unavailable'),
  ...own,
});

/** The path-bound operations' session-access checks (all but status). */
export const sessionAccess = (more400: string[] = []): Json => ({
  '400': error([BAD_CONTENT_LENGTH, CLIENT_ID_MISSING, NOT_INITIALIZED, ...more400]),
  '403': error([IP_NOT_ALLOWED, WRONG_UUID]),
});

export const typeLegend =
  'Types: `string` (non-empty for ids), `number` (finite), `integer`, `boolean`, `date` (`YYYY-MM-DD`, a real ' +
  'calendar date), `datetime` (RFC 3339 with offset or `Z`). Optional columns may be `null` or absent; required ' +
  'ones may not be `null`. `*` marks a required column.';
