import type { Config } from '../config/config.js';
import type { Logger } from '../log.js';
import type { SessionRecord } from '../session/state.js';
import type { Engines } from '../store/engines.js';
import { objectKey, sessionKey } from '../store/keys.js';
import type { BatchQueue, CommittedPackage, ObjectStore, PackageMeta, QueueConsumer } from '../store/ports.js';

/** First line of every stored object; the rows follow, one JSON array per line. */
export interface ObjectHeader {
  entity: string;
  columns: string[];
  package_id: string;
  upload_uuid: string;
  client_id: string;
  rows: number;
}

export interface UploaderOptions {
  queue: BatchQueue;
  objects: ObjectStore;
  /** Key prefix without trailing `/`; may be empty. */
  prefix: string;
  /** Told about every failed delivery before the package goes back for redelivery. */
  onError?: (err: unknown, pkg: PackageMeta) => void;
  /**
   * True when the package's session is gone (deleted while the package was in flight on
   * some gateway): the package is dropped instead of re-creating objects under a deleted
   * session's prefix.
   */
  isAbandoned?: (pkg: PackageMeta) => Promise<boolean>;
}

/**
 * The uploader as the gateway and the uploader process run it: sweeps the multipart uploads
 * a crashed uploader left behind, then consumes committed packages (several uploaders share
 * the queue's one durable consumer).
 */
export async function runUploader(
  engines: Pick<Engines, 'queue' | 'objects' | 'sessions' | 'sweepIncompleteUploads'>,
  config: Pick<Config, 'storage'>,
  log: Logger,
): Promise<QueueConsumer> {
  const swept = await engines.sweepIncompleteUploads();
  if (swept > 0) log.warn('aborted incomplete multipart uploads left by a crashed uploader', { count: swept });
  return startUploader({
    queue: engines.queue,
    objects: engines.objects,
    prefix: config.storage.objectPrefix,
    isAbandoned: async (meta) => {
      const session = await engines.sessions.get<SessionRecord>(sessionKey(meta.upload_uuid));
      return session === null || session.value.deleted === true;
    },
    onError: (err, pkg) => log.error('upload failed; will retry', { err, package_id: pkg.package_id, upload_uuid: pkg.upload_uuid }),
  });
}

/**
 * Moves committed packages from the queue into object storage, one object per package:
 * the header line, then the batches' bytes unchanged. A failed put throws, so the queue
 * delivers the package again.
 */
export function startUploader(opts: UploaderOptions): QueueConsumer {
  const { objects, prefix, onError, isAbandoned } = opts;
  return opts.queue.consume(async (pkg) => {
    try {
      if (await isAbandoned?.(pkg.meta)) return; // acked unstored: its session was deleted
      await objects.put(objectKey(prefix, pkg.meta), objectBody(pkg));
    } catch (err) {
      onError?.(err, pkg.meta);
      throw err;
    }
  });
}

async function* objectBody(pkg: CommittedPackage): AsyncIterable<Uint8Array> {
  const { entity, columns, package_id, upload_uuid, client_id } = pkg.meta;
  const header: ObjectHeader = { entity, columns, package_id, upload_uuid, client_id, rows: pkg.rows };
  yield Buffer.from(`${JSON.stringify(header)}\n`);
  yield* pkg.batches();
}

/** Reads a stored object: its header and the number of non-empty row lines after it. */
export async function countRows(body: AsyncIterable<Uint8Array>): Promise<{ header: ObjectHeader; rows: number }> {
  const headChunks: Uint8Array[] = [];
  let header: ObjectHeader | undefined;
  let rows = 0;
  let lineHasContent = false;
  for await (const chunk of body) {
    let i = 0;
    if (!header) {
      const nl = chunk.indexOf(0x0a);
      if (nl < 0) {
        headChunks.push(chunk);
        continue;
      }
      headChunks.push(chunk.subarray(0, nl));
      header = JSON.parse(Buffer.concat(headChunks).toString('utf8')) as ObjectHeader;
      i = nl + 1;
    }
    for (; i < chunk.length; i++) {
      const b = chunk[i];
      if (b === 0x0a) {
        if (lineHasContent) rows++;
        lineHasContent = false;
      } else if (b !== 0x20 && b !== 0x09 && b !== 0x0d) {
        lineHasContent = true;
      }
    }
  }
  if (!header) {
    if (headChunks.length === 0) throw new Error('Object is empty: no header line');
    header = JSON.parse(Buffer.concat(headChunks).toString('utf8')) as ObjectHeader;
  }
  return { header, rows: rows + (lineHasContent ? 1 : 0) };
}
