import { ENTITIES, TYPE_LABELS } from '../entities/catalog.js';
import { errors, withHeaders } from '../errors.js';
import type { BodyStream, Reply, Request, StreamingHandler } from '../http/types.js';
import type { IngestSink } from '../validation-pool/index.js';
import { parseIdempotencyKey } from '../session/idempotency.js';
import { ClientGone, type IngestBody } from '../session/ingest.js';
import { authenticate, type ApiDeps } from './context.js';
import {
  clientResponses,
  DRY_RUN,
  error,
  jsonResponse,
  LIMITS,
  MAX_INFLATED,
  NOT_UPLOADING,
  parameter,
  q,
  qe,
  REPLAYED,
  RETRY_AFTER,
  schema,
  sessionAccess,
  typeLegend,
} from './openapi-shared.js';
import { API_BASE, type RouteDeclaration } from './route.js';

/**
 * `POST /{upload_uuid}/{entity_name}`: translates the request into the ingest use case
 * (session/ingest.ts) and its answer back. `Content-Encoding: gzip` bodies are inflated on
 * the way (the edge limits the wire bytes, the pool the inflated ones).
 */
export const ingestEntity =
  (deps: ApiDeps): StreamingHandler =>
  async (req, body, signal) => {
    const client = authenticate(deps, req);
    const idempotencyKey = parseIdempotencyKey(req.headers.get('idempotency-key'));
    const dryRun = dryRunParameter(req.query);
    const run = deps.ingest.run(
      {
        client,
        uploadUuid: req.params.upload_uuid!,
        entityName: req.params.entity_name!,
        // A dry run ignores the key (checked above all the same): nothing is replayed or stored.
        idempotencyKey: dryRun ? null : idempotencyKey,
        contentLength: declaredLength(req),
        encoding: contentEncoding(req.headers.get('content-encoding')),
        signal,
        dryRun,
      },
      ingestBody(body),
    );
    if (dryRun) {
      const answer = await run.catch((err: unknown) => {
        throw withHeaders(err, DRY_RUN_HEADERS);
      });
      return { status: answer.status, body: answer.body, headers: { ...DRY_RUN_HEADERS } };
    }
    const answer = await run;
    // A replayed answer's connection is closed after it: its body was not read.
    const reply: Reply = { status: answer.status, body: answer.body };
    if (answer.replayed) reply.headers = { 'Idempotent-Replayed': 'true' };
    return reply;
  };

/** On every answer the handler gives a dry run, errors included. */
const DRY_RUN_HEADERS: Readonly<Record<string, string>> = { 'Dry-Run': 'true' };

/** Values of `dry_run` as Pydantic v2 reads a boolean (any case); docs/api.md, Dry runs. */
const DRY_RUN_VALUES: ReadonlyMap<string, boolean> = new Map([
  ...['true', '1', 'yes', 'on', 't', 'y'].map((v) => [v, true] as const),
  ...['false', '0', 'no', 'off', 'f', 'n'].map((v) => [v, false] as const),
]);

/**
 * `?dry_run=`: absent or a false value, a package; a true value, a dry run. Anything else,
 * or the parameter given twice, answers 422 with the validation array FastAPI would give
 * (`bool_parsing`; `bool_type` for a repeated one, whose values arrive as a list), before
 * the session checks. Other query parameters are ignored, as everywhere.
 */
function dryRunParameter(query: string): boolean {
  if (query === '') return false;
  const values = new URLSearchParams(query).getAll('dry_run');
  if (values.length === 0) return false;
  if (values.length > 1) {
    throw errors.validationFailed([{ type: 'bool_type', loc: ['query', 'dry_run'], msg: 'Input should be a valid boolean', input: values }]);
  }
  const value = DRY_RUN_VALUES.get(values[0]!.toLowerCase());
  if (value === undefined) {
    throw errors.validationFailed([
      { type: 'bool_parsing', loc: ['query', 'dry_run'], msg: 'Input should be a valid boolean, unable to interpret input', input: values[0] },
    ]);
  }
  return value;
}

/** The body length the client declared; null for a chunked body (the edge has checked the syntax). */
function declaredLength(req: Request): number | null {
  const declared = req.headers.get('content-length');
  return declared === undefined ? null : Number(declared);
}

/**
 * The body's coding: none (`identity`, or no header) or gzip (`x-gzip` is its old name,
 * RFC 9110); null for anything else, stacked codings included (415 after the session checks,
 * before a byte is read).
 */
function contentEncoding(header: string | undefined): 'identity' | 'gzip' | null {
  const coding = (header ?? '').trim().toLowerCase();
  if (coding === '' || coding === 'identity') return 'identity';
  if (coding === 'gzip' || coding === 'x-gzip') return 'gzip';
  return null;
}

/** The edge's body stream as the use case reads it: the sink is piped into the edge as it is. */
function ingestBody(body: BodyStream): IngestBody {
  return {
    discard: () => body.discard(),
    hold: () => body.hold(),
    feed: async (sink: IngestSink) => {
      if (!(await body.pipe(sink))) throw new ClientGone('Client went away before the body ended');
      return sink.end();
    },
  };
}

/** The catalog as the ingest operation's description shows it: one row per entity. */
function catalogTable(): string {
  const rows = ENTITIES.map((e) => {
    const columns = e.columns.map((c) => `\`${c.name}\`${c.required ? '*' : ''} ${TYPE_LABELS[c.type].expected}`);
    return `| \`${e.name}\` | ${columns.join(', ')} | ${e.parents.map((p) => `\`${p}\``).join(', ')} |`;
  });
  return ['| entity | columns | parents |', '|---|---|---|', ...rows].join('\n');
}

const INGEST_DESCRIPTION = `Validates one package of rows of \`entity_name\` while the body arrives (synchronously) and
queues it for object storage (asynchronously; \`upload_tasks_finished\` in the status turns \`true\` when every
write is done). A package is all-or-nothing. An entity may be uploaded in many packages: send large datasets as
several sequential packages rather than one maximum-size body (32 MiB). Requires the session in \`UPLOADING\`.

Checks, first failing one answers: unknown entity 400; session not \`UPLOADING\` 409; \`Content-Encoding\` 415; payload 422.

The body may be sent gzip-compressed (\`Content-Encoding: gzip\`): the 32 MiB limit counts the compressed bytes
on the wire, the inflated body is bounded by 256 MiB (413 past it), and a body that is not gzip or is cut short
answers 422 \`Invalid JSON format.\`.

**Dry run** (\`?dry_run=true\`): every check of the package, at full speed, and the answer the package would get
(200 with \`rows_processed\`, or its 413/422), with the header \`Dry-Run: true\`; nothing is stored or recorded, and the
session's status does not change. It needs the session checks (400/403) but not \`UPLOADING\`; an
\`Idempotency-Key\` is ignored (neither replayed nor stored). \`dry_run\` takes \`true\`, \`1\`, \`yes\`, \`on\`, \`t\`, \`y\`
(a dry run) or \`false\`, \`0\`, \`no\`, \`off\`, \`f\`, \`n\` (a package), in any case; any other value, or the parameter
given twice, answers 422 (validation array) right after authentication.

The entity catalog (also served by \`GET ${API_BASE}/entities\`). ${typeLegend}

${catalogTable()}`;

export const ingestRoute: RouteDeclaration<ApiDeps> = {
  method: 'POST',
  pattern: `${API_BASE}/:upload_uuid/:entity_name`,
  body: 'streaming',
  handler: ingestEntity,
  schema: {
    operationId: 'uploadEntity',
    tags: ['uploading'],
    summary: 'Upload a package of entity rows',
    description: INGEST_DESCRIPTION,
    parameters: [
      parameter('UploadUuid'),
      parameter('EntityName'),
      parameter('ContentEncoding'),
      parameter('IdempotencyKey'),
      parameter('DryRun'),
    ],
    requestBody: {
      required: true,
      content: {
        'application/json': {
          schema: schema('IngestRequest'),
          examples: {
            products: {
              summary: 'products: two rows',
              value: { columns: ['product_id', 'name', 'catalog_id', 'price'], data: [['p1', 'Water', 'c1', 0.5], ['p2', 'Juice', null, 1.9]] },
            },
            receipts: {
              summary: 'receipts: one row',
              value: { columns: ['receipt_id', 'store_id', 'sold_at', 'total'], data: [['r1', 's1', '2024-01-31T18:05:00+01:00', 12.4]] },
            },
          },
        },
      },
    },
    responses: clientResponses({
      '200': {
        ...jsonResponse('Every row validated and queued (a dry run: validated, nothing stored).', schema('IngestResponse')),
        headers: { 'Idempotent-Replayed': REPLAYED, 'Dry-Run': DRY_RUN },
      },
      ...sessionAccess([
        qe(errors.unknownEntity('<entity_name>')),
        `${q('IDEMPOTENCY_KEY_INVALID')} (right after authentication)`,
      ]),
      '409': {
        ...jsonResponse(
          [
            `- ${NOT_UPLOADING}: structured \`detail\``,
            `- ${q('IDEMPOTENCY_KEY_IN_PROGRESS')}: still running after a 10 s wait; \`Retry-After\` says when to ask again`,
          ].join('\n'),
          { anyOf: [schema('InvalidSessionStatusError'), schema('ErrorDetail')] },
        ),
        headers: { 'Retry-After': { ...RETRY_AFTER, required: false, description: `With ${q('IDEMPOTENCY_KEY_IN_PROGRESS')} only: seconds before asking again.` } },
      },
      '413': {
        ...error([
          `${qe(errors.bodyTooLarge(LIMITS.ingestBodyBytes))}: over the ingest limit on the wire (\`limits.ingestBodyBytes\`, 32 MiB by default; ` +
            'the message names the configured limit, in bytes when it is not a whole number of MiB), or more than that held whole',
          `${qe(errors.bodyTooLarge(MAX_INFLATED, true))}: a gzip body over \`ingest.maxDecompressedBytes\` (256 MiB by default) once inflated`,
        ]),
        headers: { 'Idempotent-Replayed': REPLAYED, 'Dry-Run': DRY_RUN },
      },
      '415': {
        ...error([
          `${q('UNSUPPORTED_MEDIA_TYPE')}: a \`Content-Encoding\` other than \`identity\`, \`gzip\` or \`x-gzip\` (stacked codings included)`,
        ]),
        headers: { 'Dry-Run': DRY_RUN },
      },
      '422': {
        ...jsonResponse(
          [
            'A string `detail` for the payload checks, in the order they run:',
            '- `Invalid JSON format.` (also an empty body, invalid UTF-8, or a gzip body that is not gzip or is cut short)',
            '- `Duplicate key in payload: <key>`: the top-level object repeats `columns` or `data` (checked right after JSON validity)',
            '- `The columns array cannot be empty.`',
            '- `Duplicate column: <column>`',
            '- `Unknown column: <column>`',
            '- `Missing required columns: <column list>`',
            '- `Invalid data types in payload: <detail>`, e.g. `row 17, column "price": expected number >= 0, got "abc"`: ' +
              'the first bad value; every value of every row is checked, and the body also carries `errors` (one entry per bad ' +
              'value, the first 100 in row then column order, each `{row, column, message}`; a row of the wrong length is one ' +
              'entry with `column` null) and `error_count` (all of them). An `integer` is a whole number within ±(2^53 − 1); a ' +
              '`number` must be finite.',
            `- ${q('IDEMPOTENCY_KEY_REUSED')}`,
            '',
            'A validation array (Pydantic v2) when the body is not `{columns: string[], data: array[]}`: the first ' +
              'structural issue only (`model_attributes_type`, `missing`, `list_type`, `string_type`); or for a `dry_run` ' +
              'value that is not a boolean (`bool_parsing`, `loc` `["query","dry_run"]`) or given twice (`bool_type`).',
          ].join('\n'),
          { anyOf: [schema('IngestPayloadError'), schema('ValidationError')] },
        ),
        headers: { 'Idempotent-Replayed': REPLAYED, 'Dry-Run': DRY_RUN },
      },
    }),
  },
};
