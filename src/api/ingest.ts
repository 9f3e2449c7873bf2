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
  MAX_PACKAGES,
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
    let client: ReturnType<typeof authenticate>;
    let idempotencyKey: string | null;
    try {
      client = authenticate(deps, req);
      idempotencyKey = parseIdempotencyKey(req.headers.get('idempotency-key'));
    } catch (err) {
      // Checked before `dry_run` (docs/api.md, Check order), and still an answer to a dry run.
      throw isDryRun(req.query) ? withHeaders(err, DRY_RUN_HEADERS) : err;
    }
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

/** On every answer to a dry run, errors included. */
const DRY_RUN_HEADERS: Readonly<Record<string, string>> = { 'Dry-Run': 'true' };
const NO_HEADERS: Readonly<Record<string, string>> = {};

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

/** `?dry_run=` names a dry run (a true value, once); anything else, a 422 of `dryRunParameter` included, is not one. */
function isDryRun(query: string): boolean {
  try {
    return dryRunParameter(query);
  } catch {
    return false;
  }
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

const INGEST_DESCRIPTION = `Validates one package of rows of \`entity_name\` as the body arrives and queues it for object storage
(\`upload_tasks_finished\` in the status turns \`true\` once stored). All-or-nothing; needs the session in \`UPLOADING\`;
an entity may take many packages. Checks, first failing one answers: unknown entity 400; state 409; session full 409; \`Content-Encoding\` 415;
payload 422. A gzip body's 32 MiB counts the wire bytes; inflated, at most 256 MiB (413).
\`?dry_run=true\`: every check and the answer, with \`Dry-Run: true\`, nothing stored, any state
(docs/api.md#dry-runs). Rules: docs/api.md#ingest-payload.

The catalog (also \`GET ${API_BASE}/entities\`). ${typeLegend}

${catalogTable()}`;

export const ingestRoute: RouteDeclaration<ApiDeps> = {
  method: 'POST',
  pattern: `${API_BASE}/:upload_uuid/:entity_name`,
  body: 'streaming',
  handler: ingestEntity,
  // A dry run's 413 by Content-Length, or while the body streams, is its answer as well (docs/api.md, Dry runs: every answer carries Dry-Run).
  answerHeaders: (query) => (isDryRun(query) ? DRY_RUN_HEADERS : NO_HEADERS),
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
            `- ${qe(errors.sessionFull(MAX_PACKAGES))}: \`limits.packagesPerSession\` reached (not for a dry run)`,
            `- ${q('IDEMPOTENCY_KEY_IN_PROGRESS')}: after a 10 s wait`,
          ].join('\n'),
          { anyOf: [schema('InvalidSessionStatusError'), schema('ErrorDetail')] },
        ),
        headers: { 'Retry-After': { ...RETRY_AFTER, required: false, description: `With ${q('IDEMPOTENCY_KEY_IN_PROGRESS')} only: seconds before asking again.` } },
      },
      '413': {
        ...error([
          `${qe(errors.bodyTooLarge(LIMITS.ingestBodyBytes))}: over \`limits.ingestBodyBytes\` on the wire, or held whole`,
          `${qe(errors.bodyTooLarge(MAX_INFLATED, true))}: a gzip body over \`ingest.maxDecompressedBytes\``,
        ]),
        headers: { 'Idempotent-Replayed': REPLAYED, 'Dry-Run': DRY_RUN },
      },
      '415': {
        ...error([
          `${q('UNSUPPORTED_MEDIA_TYPE')}: another \`Content-Encoding\``,
        ]),
        headers: { 'Dry-Run': DRY_RUN },
      },
      '422': {
        ...jsonResponse(
          [
            'A string `detail`, in check order (docs/api.md#ingest-payload):',
            '- `Invalid JSON format.` (also empty, invalid UTF-8, bad gzip)',
            '- `Duplicate key in payload: <key>`: `columns` or `data` twice',
            '- `The columns array cannot be empty.`',
            '- `Duplicate column: <column>`',
            '- `Unknown column: <column>`',
            '- `Missing required columns: <column list>`',
            '- `Invalid data types in payload: <detail>`, e.g. `row 17, column "price": expected number >= 0, got "abc"`; ' +
              'with `errors` (the first 100) and `error_count`',
            `- ${q('IDEMPOTENCY_KEY_REUSED')}`,
            '',
            'A validation array: the body is not `{columns: string[], data: array[]}` (first issue only), or a bad `dry_run`.',
          ].join('\n'),
          { anyOf: [schema('IngestPayloadError'), schema('ValidationError')] },
        ),
        headers: { 'Idempotent-Replayed': REPLAYED, 'Dry-Run': DRY_RUN },
      },
    }),
  },
};
