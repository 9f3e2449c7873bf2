import { findEntity } from '../entities/catalog.js';
import { errors, isServiceError, type ServiceError } from '../errors.js';
import type { Client } from '../http/auth.js';
import type { BodyStream, Reply, Request, StreamingHandler } from '../http/server.js';
import type { IngestResult, IngestSink } from '../ingest/pool.js';
import { parseIdempotencyKey, type Attempt, type RequestFingerprint, type StoredAnswer } from '../session/idempotency.js';
import { authenticate, json, type ApiDeps } from './context.js';

/**
 * `POST /{upload_uuid}/{entity_name}`: every row is validated while the body arrives; the
 * package is committed to the queue (and counted in the session) only after its last row
 * passed, so a failed or abandoned package leaves nothing behind. `Content-Encoding: gzip`
 * bodies are inflated on the way (the edge limits the wire bytes, the pool the inflated ones).
 *
 * With an `Idempotency-Key` (session/idempotency.ts): a finished request's answer is replayed
 * before the session checks, without reading the body; otherwise the key is claimed once the
 * package's lease is taken, and the attempt's definite answer (200, or a 413/422 of the body)
 * is stored for the repeats. Anything else (5xx, an abort) frees the key for a retry.
 */
export const ingestEntity =
  (deps: ApiDeps): StreamingHandler =>
  async (req, body, signal) => {
    const client = authenticate(deps, req);
    const key = parseIdempotencyKey(req.headers.get('idempotency-key'));
    const uploadUuid = req.params.upload_uuid!;
    const entityName = req.params.entity_name!;
    const fingerprint: RequestFingerprint = { upload_uuid: uploadUuid, entity: entityName, content_length: declaredLength(req) };
    if (key !== null) {
      const stored = await deps.idempotency.replay(client, key, fingerprint);
      if (stored) return replayed(body, stored);
    }
    const session = await deps.service.requireActive(client, uploadUuid);
    const entity = findEntity(entityName);
    if (!entity) throw errors.unknownEntity(entityName);
    if (session.value.status !== 'UPLOADING') throw errors.invalidSessionStatus('UPLOADING', session.value.status);
    const encoding = contentEncoding(req.headers.get('content-encoding'));

    const packageId = await deps.service.beginIngest(client, uploadUuid);
    let attempt: Attempt | null = null;
    if (key !== null) {
      // After the lease: an attempt a takeover has settled can never begin again (idempotency.ts).
      const claim = await deps.idempotency.claim(client, key, fingerprint, packageId, signal).catch(async (err: unknown) => {
        await deps.service.releaseIngest(client, uploadUuid, packageId);
        throw err;
      });
      if (claim.kind !== 'run') {
        await deps.service.releaseIngest(client, uploadUuid, packageId);
        if (claim.kind === 'answer') return replayed(body, claim.answer);
        const answer = success(claim.recorded.entity, claim.recorded.rows);
        await claim.attempt.finish(answer, claim.recorded.id);
        return replayed(body, answer);
      }
      attempt = claim.attempt;
    }
    /** How far the package got: a failure in `body` may be a definite answer; one in `record` may have recorded it. */
    let stage: 'body' | 'queue' | 'record' = 'body';
    try {
      const sink = deps.pool.createIngest({
        entity,
        encoding,
        open: (columns) =>
          deps.queue.open({ package_id: packageId, client_id: client.id, upload_uuid: uploadUuid, entity: entity.name, columns }),
      });
      const result = await drain(body, sink);
      stage = 'queue';
      // The server already answered (408) while the rows were checked: that answer stands.
      answered(signal);
      await result.writer.commit({ rows: result.rows, bytes: result.bytes });
      // Committed to the queue but not recorded: once the lease is released, the uploader drops it.
      answered(signal);
      stage = 'record';
      await deps.service.commitIngest(client, uploadUuid, { packageId, entity: entity.name, rows: result.rows, bytes: result.bytes });
      const answer = success(entity.name, result.rows);
      await attempt?.finish(answer);
      return json(answer.body, answer.status);
    } catch (err) {
      await deps.service.releaseIngest(client, uploadUuid, packageId);
      if (attempt) {
        if (stage === 'body' && isDefiniteAnswer(err)) await attempt.finish({ status: err.statusCode, body: err.body });
        // A ServiceError from recording is the decision refusing it (nothing written); anything else may have landed.
        else await attempt.release(stage === 'record' && !isServiceError(err));
      }
      throw (await sessionGone(deps, err, client, uploadUuid)) ?? err;
    }
  };

/**
 * A delete of the session while its package was in flight purges the queue under the
 * writer, whose store calls then fail: that is no internal error but the session's own
 * answer, given as to a request arriving now (400/403, or 409 when no longer UPLOADING).
 */
async function sessionGone(deps: ApiDeps, err: unknown, client: Client, uploadUuid: string): Promise<ServiceError | null> {
  if ((isServiceError(err) && err.code !== 'INTERNAL') || (err as { code?: unknown }).code === 'CLIENT_GONE') return null;
  try {
    const session = await deps.service.requireActive(client, uploadUuid);
    return session.value.status === 'UPLOADING' ? null : errors.invalidSessionStatus('UPLOADING', session.value.status);
  } catch (gone) {
    return isServiceError(gone) && gone.statusCode < 500 ? gone : null;
  }
}

function success(entity: string, rows: number): StoredAnswer {
  return {
    status: 200,
    body: { status: 'success', message: `${rows} rows of ${entity} validated and queued for storage`, rows_processed: rows },
  };
}

/**
 * Answers of the body that a retry of the same body would get again: stored for repeats.
 * Errors before the body (session, entity, encoding) are not stored: a retry is checked
 * afresh. 5xx answers and aborts are not definite: a retry runs the package again.
 */
function isDefiniteAnswer(err: unknown): err is { statusCode: number; body: unknown } {
  return isServiceError(err) && (err.statusCode === 413 || err.statusCode === 422);
}

/** A stored answer, sent again without reading the repeat's body (its connection is closed after the answer). */
function replayed(body: BodyStream, answer: StoredAnswer): Reply {
  body.discard();
  return { status: answer.status, body: answer.body, headers: { 'Idempotent-Replayed': 'true' } };
}

/** The body length the client declared; null for a chunked body (the edge has checked the syntax). */
function declaredLength(req: Request): number | null {
  const declared = req.headers.get('content-length');
  return declared === undefined ? null : Number(declared);
}

/**
 * The body's coding: none (`identity`, or no header) or gzip (`x-gzip` is its old name,
 * RFC 9110). Anything else, stacked codings included, answers 415 before a byte is read.
 */
function contentEncoding(header: string | undefined): 'identity' | 'gzip' {
  const coding = (header ?? '').trim().toLowerCase();
  if (coding === '' || coding === 'identity') return 'identity';
  if (coding === 'gzip' || coding === 'x-gzip') return 'gzip';
  throw errors.unsupportedMediaType();
}

class ClientGone extends Error {
  override readonly name = 'ClientGone';
  readonly code = 'CLIENT_GONE';
}

/**
 * Throws once the request was answered without this handler (a request timeout) or its client
 * left: a package must not be recorded after its client was told something else than 200.
 */
function answered(signal: AbortSignal): void {
  if (signal.aborted) throw new ClientGone('The request was answered or abandoned before its package was recorded');
}

/** Feeds the request body into the validation sink; resolves when every row passed. */
function drain(body: BodyStream, sink: IngestSink): Promise<IngestResult> {
  return new Promise((resolve, reject) => {
    body.pipe({
      write: (chunk) => sink.write(chunk),
      onDrain: (cb) => sink.onDrain(cb),
      finish: (complete) => {
        if (complete) {
          sink.end().then(resolve, reject);
        } else {
          sink.abort();
          reject(new ClientGone('Client went away before the body ended'));
        }
      },
    });
  });
}
