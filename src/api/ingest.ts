import { findEntity } from '../entities/catalog.js';
import { errors } from '../errors.js';
import type { BodyStream, StreamingHandler } from '../http/server.js';
import type { IngestResult, IngestSink } from '../ingest/pool.js';
import { authenticate, json, type ApiDeps } from './context.js';

/**
 * `POST /{upload_uuid}/{entity_name}`: every row is validated while the body arrives; the
 * package is committed to the queue (and counted in the session) only after its last row
 * passed, so a failed or abandoned package leaves nothing behind. `Content-Encoding: gzip`
 * bodies are inflated on the way (the edge limits the wire bytes, the pool the inflated ones).
 */
export const ingestEntity =
  (deps: ApiDeps): StreamingHandler =>
  async (req, body) => {
    const client = authenticate(deps, req);
    const uploadUuid = req.params.upload_uuid!;
    const entityName = req.params.entity_name!;
    const session = await deps.service.requireActive(client, uploadUuid);
    const entity = findEntity(entityName);
    if (!entity) throw errors.unknownEntity(entityName);
    if (session.value.status !== 'UPLOADING') throw errors.invalidSessionStatus('UPLOADING', session.value.status);
    const encoding = contentEncoding(req.headers.get('content-encoding'));

    const packageId = await deps.service.beginIngest(client, uploadUuid);
    try {
      const sink = deps.pool.createIngest({
        entity,
        encoding,
        open: (columns) =>
          deps.queue.open({ package_id: packageId, client_id: client.id, upload_uuid: uploadUuid, entity: entity.name, columns }),
      });
      const result = await drain(body, sink);
      await result.writer.commit({ rows: result.rows, bytes: result.bytes });
      await deps.service.commitIngest(client, uploadUuid, { packageId, entity: entity.name, rows: result.rows, bytes: result.bytes });
      return json({
        status: 'success',
        message: `${result.rows} rows of ${entity.name} validated and queued for storage`,
        rows_processed: result.rows,
      });
    } catch (err) {
      await deps.service.releaseIngest(client, uploadUuid, packageId);
      throw err;
    }
  };

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
