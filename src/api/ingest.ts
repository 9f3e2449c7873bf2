import { errors, withHeaders } from '../errors.js';
import type { BodyStream, Reply, Request, StreamingHandler } from '../http/types.js';
import type { IngestSink } from '../validation-pool/index.js';
import { parseIdempotencyKey } from '../session/idempotency.js';
import { ClientGone, type IngestBody } from '../session/ingest.js';
import { authenticate, type ApiDeps } from './context.js';

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
