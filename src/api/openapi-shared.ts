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
export const MAX_PACKAGES: number = defaultConfig().limits.packagesPerSession;
/** A message of errors.ts as the descriptions quote it: in backticks. */
export const q = (code: keyof typeof MESSAGES): string => `\`${MESSAGES[code]}\``;
/** The message of a factory with a variable part, that part named by a placeholder. */
export const qe = (err: { message: string }): string => `\`${err.message}\``;

export const CLIENT_ID_MISSING = q('CLIENT_ID_MISSING');
export const NOT_INITIALIZED = `${q('SESSION_NOT_INITIALIZED')}: no active session`;
export const IP_NOT_ALLOWED = `${q('IP_NOT_ALLOWED')}: source address not allowed`;
export const WRONG_UUID = `${q('INVALID_UPLOAD_UUID')}: not the active session`;
export const NOT_UPLOADING = 'The session is not `UPLOADING` (`expected` is `UPLOADING`)';
export const UNREACHABLE = `${q('CONNECTOR_UNREACHABLE')}: no connection or no answer in time`;
export const BAD_CONTENT_LENGTH = `${q('INVALID_CONTENT_LENGTH')} (checked first)`;

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
    'A key per package (e.g. a UUID v4). A retry with it gets the first answer (200, 413, 422; `Idempotent-Replayed: true`), ' +
    'rows stored once, for 24 h (docs/api.md#idempotent-retries).',
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
    description: 'An entity of the catalog; else 400.',
    schema: { type: 'string', enum: ENTITIES.map((e) => e.name) },
  },
  ContentEncoding: {
    name: 'Content-Encoding',
    in: 'header',
    required: false,
    description: 'Absent or `identity`, or `gzip` (`x-gzip`); else 415.',
    schema: { type: 'string', enum: ['identity', 'gzip', 'x-gzip'] },
  },
  IdempotencyKey: IDEMPOTENCY_KEY,
  DryRun: {
    name: 'dry_run',
    in: 'query',
    required: false,
    description: '`true`, `1`, `yes`, `on`, `t`, `y` (any case): a dry run; `false`, `0`, `no`, `off`, `f`, `n`: a package. Else 422.',
    schema: { type: 'boolean', default: false },
  },
  ConnectorTimestamp: {
    name: 'X-Connector-Timestamp',
    in: 'header',
    required: true,
    description: 'Unix seconds, within 300 s of the server clock.',
    schema: { type: 'string', pattern: '^[0-9]{1,15}$' },
  },
  ConnectorSignature: {
    name: 'X-Connector-Signature',
    in: 'header',
    required: true,
    description: '`sha256=` + hex HMAC-SHA256 of `<timestamp>.<raw body>` (key `CONNECTOR_WEBHOOK_SECRET`).',
    schema: { type: 'string', pattern: '^sha256=[0-9a-fA-F]{64}$' },
  },
};

export const parameter = (name: keyof typeof PARAMETERS): Json => ({ $ref: `#/components/parameters/${name}` });

/** `components.responses`: referenced by `shared(name)`. */
export const RESPONSES = {
  Unauthorized: error([`${q('AUTH_REQUIRED')}: bad or missing token, or not \`Client-Id\`'s`]),
  RequestTimeout: error([`${q('REQUEST_TIMEOUT')}: not complete within 600 s; connection closed`]),
  PayloadTooLarge: error([
    `${qe(errors.bodyTooLarge(LIMITS.otherBodyBytes))}: over \`limits.otherBodyBytes\` (the message names the configured limit)`,
  ]),
  InternalError: error([q('INTERNAL')]),
  RateLimited: {
    ...error([`${q('RATE_LIMITED')}: over the client IP's rate or connection limit`]),
    headers: { 'Retry-After': RETRY_AFTER },
  },
  Unavailable: {
    ...error([
      `${q('RATE_LIMITED')}: over the client IP's rate or connection limit`,
      `${q('STORAGE_UNAVAILABLE')}: state or queue unreadable or unwritable for now; nothing stored (docs/api.md#storage-unavailable)`,
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
  '`date`: `YYYY-MM-DD`; `datetime`: RFC 3339 with offset or `Z`; `number` finite; `integer` within ±(2^53 − 1). ' +
  '`*`: required (not `null`); optional columns may be `null` or absent.';
