/**
 * The ingest use case: one package from the session checks to the answer. It owns the
 * steps and their order — lease, idempotency claim, package writer, validation, queue
 * commit, record, settle — and what a failure at each step leaves behind; the HTTP handler
 * (api/ingest.ts) only translates the request in and the answer out.
 *
 * Every row is validated while the body arrives; the package is committed to the queue (and
 * recorded in the session) only after its last row passed, so a failed or abandoned package
 * leaves nothing behind. With an `Idempotency-Key` (idempotency.ts) a finished request's
 * answer is replayed before the session checks, without reading the body; otherwise the key
 * is claimed once the package's lease is taken, and the attempt's definite answer (200, or a
 * 413/422 of the body) is stored for the repeats. Anything else (5xx, an abort) frees the key
 * for a retry.
 *
 * A dry run (`dryRun`) takes the body steps alone, through the same sink and pool, with a
 * writer that drops the batches: no lease, claim, commit or record, so it leaves nothing.
 */
import { findEntity } from '../entities/catalog.js';
import { errors, isOutcomeUnknown, isServiceError, isStorageUnavailable, type InternalErrorCode, type ServiceError } from '../errors.js';
import { objectHeaderLine } from '../store/object-format.js';
import type { BatchQueue, PackageMeta, PackageWriter } from '../store/ports.js';
import type { IngestResult, IngestSink, ValidationPool } from '../validation-pool/index.js';
import type { Attempt, IdempotentIngests, RequestFingerprint, StoredAnswer } from './idempotency.js';
import type { SessionService } from './service.js';
import type { ClientRef } from './state.js';

export interface IngestDeps {
  service: SessionService;
  idempotency: IdempotentIngests;
  pool: ValidationPool;
  queue: BatchQueue;
}

/** One ingest request, as the edge read it. */
export interface IngestRequest {
  client: ClientRef;
  uploadUuid: string;
  entityName: string;
  /** The request's `Idempotency-Key` (already checked for syntax), or null. */
  idempotencyKey: string | null;
  /** The body's declared length on the wire; null for a chunked body. */
  contentLength: number | null;
  /** The body's coding; null: one the service does not take (415, after the session checks). */
  encoding: 'identity' | 'gzip' | null;
  /** Aborts once the request was answered without this use case (a timeout) or its client left. */
  signal: AbortSignal;
  /** A dry run (`?dry_run=true`): every check of the package, nothing stored or recorded (`PackageIngest.dryRun`). */
  dryRun?: boolean;
}

/** The request body as the use case reads it. */
export interface IngestBody {
  /** Feeds the whole body into `sink`; resolves when every row passed, rejects with CLIENT_GONE when the body never ends. */
  feed(sink: IngestSink): Promise<IngestResult>;
  /** The body will not be read (a replayed answer). */
  discard(): void;
  /** The point of no return, before the package is recorded: false when the request was already answered (a timeout) or abandoned; once true, the server waits for this answer. */
  hold(): boolean;
}

/** The answer: a fresh one, or one replayed from an earlier attempt of the same key. */
export interface IngestAnswer extends StoredAnswer {
  replayed: boolean;
}

/** Code of the failure when the client went away, or was answered otherwise, before its package was recorded. */
export const CLIENT_GONE = 'CLIENT_GONE' satisfies InternalErrorCode;

export class ClientGone extends Error {
  override readonly name = 'ClientGone';
  readonly code = CLIENT_GONE;
}

export class PackageIngest {
  constructor(private readonly deps: IngestDeps) {}

  async run(req: IngestRequest, body: IngestBody): Promise<IngestAnswer> {
    if (req.dryRun) return this.dryRun(req, body);
    const { service, idempotency } = this.deps;
    const { client, uploadUuid, idempotencyKey: key } = req;
    const fingerprint: RequestFingerprint = { upload_uuid: uploadUuid, entity: req.entityName, content_length: req.contentLength };
    if (key !== null) {
      const stored = await idempotency.replay(client, key, fingerprint);
      if (stored) return replayed(body, stored);
    }
    // A session this process knows as the active one skips the pointer read: the lease is
    // granted only on that session while it is UPLOADING, which proves the pointer still
    // names it; any failure re-reads the pointer, whose errors come first (service.knownActive).
    const hinted = service.knownActive(client, uploadUuid);
    if (!hinted) await service.requirePointer(client, uploadUuid);
    const entity = findEntity(req.entityName);
    if (!entity) {
      if (hinted) await service.requirePointer(client, uploadUuid);
      throw errors.unknownEntity(req.entityName);
    }
    // The lease checks the session's state (409 when not UPLOADING).
    const packageId = await service.beginIngest(client, uploadUuid).catch(async (err: unknown) => {
      // With the store unavailable the pointer cannot be read either: answer at once.
      if (hinted && !isStorageUnavailable(err)) await service.requirePointer(client, uploadUuid);
      throw err;
    });
    const release = () => service.releaseIngest(client, uploadUuid, packageId);
    // On a spare lease the session's state is checked while the body is read (service.beginIngest):
    // its refusal, a session error, comes before anything of the body or the record.
    const refused = service.taken(packageId).then(
      () => null,
      (err: unknown) => (isServiceError(err) && err.statusCode < 500 ? err : null),
    );
    if (req.encoding === null) {
      await release();
      throw (await refused) ?? errors.unsupportedMediaType();
    }

    let attempt: Attempt | null = null;
    if (key !== null) {
      // After the lease: an attempt a takeover has settled can never begin again (idempotency.ts).
      const claim = await idempotency.claim(client, key, fingerprint, packageId, req.signal).catch(async (err: unknown) => {
        await release();
        throw err;
      });
      if (claim.kind !== 'run') {
        await release();
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
      let meta: PackageMeta | undefined;
      const sink = this.deps.pool.createIngest({
        entity,
        encoding: req.encoding,
        declaredBytes: req.contentLength,
        client: client.id,
        open: (columns) => {
          meta = { package_id: packageId, client_id: client.id, upload_uuid: uploadUuid, entity: entity.name, columns };
          return this.deps.queue.open(meta);
        },
      });
      const result = await body.feed(sink);
      stage = 'queue';
      // The server already answered (408) while the rows were checked: that answer stands.
      answered(req.signal);
      await result.writer.commit({ rows: result.rows, bytes: result.bytes });
      // Committed to the queue but not recorded: once the lease is released, the uploader drops it.
      // Past this point a request timeout waits for this answer instead of sending 408 while
      // the package is being recorded (a 408 with the package stored after all).
      if (!body.hold()) throw new ClientGone(UNANSWERED);
      stage = 'record';
      const objectBytes = objectHeaderLine(meta!, result.rows).byteLength + result.bytes;
      await service.recordIngest(client, uploadUuid, { id: packageId, entity: entity.name, rows: result.rows, bytes: result.bytes, object_bytes: objectBytes });
      const answer = success(entity.name, result.rows);
      await attempt?.finish(answer);
      return { ...answer, replayed: false };
    } catch (caught) {
      // With the store out, the release goes on in the background (releaseIngest retries it):
      // waiting on the store that just failed would only hold the 503 back. A record of unknown
      // outcome ends unanswered (errors.ts `OutcomeUnknown`); its release can only end the lease
      // of a package not recorded.
      if (isStorageUnavailable(caught) || isOutcomeUnknown(caught)) void release();
      else await release();
      // The take's refusal comes first, and with the pointer unread (`hinted`) the pointer's before it.
      const refusal = await refused;
      if (refusal && hinted) {
        try {
          await service.requirePointer(client, uploadUuid);
        } catch (pointer) {
          await attempt?.release(false);
          throw pointer;
        }
      }
      const err = refusal ?? caught;
      if (attempt) {
        if (stage === 'body' && isDefiniteAnswer(err)) await attempt.finish({ status: err.statusCode, body: err.body });
        // A ServiceError from recording is the decision refusing it (nothing written); anything else may have landed.
        else await attempt.release(stage === 'record' && !isServiceError(err));
      }
      throw (await this.sessionGone(err, client, uploadUuid)) ?? err;
    }
  }

  /**
   * A dry run (docs/api.md, Dry runs): the session-access checks (400/403, not the state),
   * the entity, the coding, then the body through the same sink and worker pool as a package,
   * whose batches go nowhere. No lease, no idempotency record, no queue writer, no record: a
   * failure at any step leaves nothing behind, and the answer is the one the package would
   * get (200 with its rows, or its 413/422).
   */
  private async dryRun(req: IngestRequest, body: IngestBody): Promise<IngestAnswer> {
    await this.deps.service.requirePointer(req.client, req.uploadUuid);
    const entity = findEntity(req.entityName);
    if (!entity) throw errors.unknownEntity(req.entityName);
    if (req.encoding === null) throw errors.unsupportedMediaType();
    const sink = this.deps.pool.createIngest({
      entity,
      encoding: req.encoding,
      declaredBytes: req.contentLength,
      client: req.client.id,
      dryRun: true,
      open: async () => DISCARD,
    });
    const result = await body.feed(sink);
    return { ...success(entity.name, result.rows), replayed: false };
  }

  /**
   * A delete of the session while its package was in flight purges the queue under the
   * writer, whose store calls then fail: that is no internal error but the session's own
   * answer, given as to a request arriving now (400/403, or 409 when no longer UPLOADING).
   */
  private async sessionGone(err: unknown, client: ClientRef, uploadUuid: string): Promise<ServiceError | null> {
    // With the store out the session cannot be read either: the failure is the answer.
    if ((isServiceError(err) && err.code !== 'INTERNAL') || (err as { code?: unknown }).code === CLIENT_GONE || isStorageUnavailable(err) || isOutcomeUnknown(err)) return null;
    try {
      const session = await this.deps.service.requireActive(client, uploadUuid);
      return session.value.status === 'UPLOADING' ? null : errors.invalidSessionStatus('UPLOADING', session.value.status);
    } catch (gone) {
      return isServiceError(gone) && gone.statusCode < 500 ? gone : null;
    }
  }
}

/** The writer of a dry run: batches are checked and encoded as for a package, then dropped. */
const DISCARD: PackageWriter = {
  append: async () => {},
  commit: () => Promise.reject(new Error('A dry run commits nothing')),
  abort: async () => {},
};

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

/** A stored answer, sent again without reading the repeat's body. */
function replayed(body: IngestBody, answer: StoredAnswer): IngestAnswer {
  body.discard();
  return { ...answer, replayed: true };
}

/**
 * Throws once the request was answered without this use case (a request timeout) or its
 * client left: a package must not be recorded after its client was told something else than 200.
 */
function answered(signal: AbortSignal): void {
  if (signal.aborted) throw new ClientGone(UNANSWERED);
}

const UNANSWERED = 'The request was answered or abandoned before its package was recorded';
