import type { BodyStream, Reply, Request, StreamingHandler } from '../http/types.js';
import type { IngestSink } from '../ingest/types.js';
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
    const answer = await deps.ingest.run(
      {
        client,
        uploadUuid: req.params.upload_uuid!,
        entityName: req.params.entity_name!,
        idempotencyKey: parseIdempotencyKey(req.headers.get('idempotency-key')),
        contentLength: declaredLength(req),
        encoding: contentEncoding(req.headers.get('content-encoding')),
        signal,
      },
      ingestBody(body),
    );
    // A replayed answer's connection is closed after it: its body was not read.
    const reply: Reply = { status: answer.status, body: answer.body };
    if (answer.replayed) reply.headers = { 'Idempotent-Replayed': 'true' };
    return reply;
  };

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
