import { setTimeout as sleep } from 'node:timers/promises';
import type { Config } from '../config/config.js';
import type { InternalErrorCode } from '../errors.js';
import type { Logger } from '../log.js';
import { packageVerdict, sessionLive } from '../session/recovery.js';
import { storedCounter } from '../session/stored-counts.js';
import type { Engines } from '../store/engines.js';
import { objectKey } from '../store/keys.js';
import { objectBody } from '../store/object-format.js';
import type { BatchQueue, ObjectStore, PackageMeta, QueueConsumer } from '../store/ports.js';

/** Told about each delivery's fate (metrics); at most one hook per delivery. */
export interface UploaderObserver {
  /** The package is stored; `durationMs` of the put. */
  stored(durationMs: number): void;
  /** The package was acked unstored (see `verdict`). */
  abandoned(): void;
  /** The put (or the session check) failed; the package goes back for redelivery. */
  failed(): void;
}

export interface UploaderOptions {
  queue: BatchQueue;
  objects: ObjectStore;
  /** Key prefix without trailing `/`; may be empty. */
  prefix: string;
  /** Told about every failed delivery before the package goes back for redelivery. */
  onError?: (err: unknown, pkg: PackageMeta) => void;
  /**
   * Whether the session accepted the package (see `packageVerdict`): `store` it; `drop` it
   * unstored (its session was deleted, or its gateway died before recording it, so no client
   * got a 200 for it); or `wait`: its ingest may still record it. Unset: store everything.
   */
  verdict?: (pkg: PackageMeta, delivery: number) => Promise<'store' | 'drop' | 'wait'>;
  /**
   * After the put, before the count: whether the package's session is still there (see
   * `sessionLive`). A delete meanwhile may have had its clean-up list the session's objects
   * before this one was there: `gone`, and the object is deleted again and the package acked
   * unstored; `unsure`: delivered again later, the object kept. Unset: always `live`.
   */
  live?: (pkg: PackageMeta, delivery: number) => Promise<'live' | 'gone' | 'unsure'>;
  observer?: UploaderObserver;
  /**
   * Counts a stored package in its session (session/stored-counts.ts), after the put and
   * before the ack; idempotent, so a redelivered package is counted once. A failure sends the
   * package back for redelivery. Unset: nothing is counted.
   */
  counted?: (pkg: PackageMeta) => Promise<void>;
  /** Packages stored at the same time (default 1). */
  concurrency?: number;
}

/**
 * Re-asks after a `wait` before giving the package back to the queue: the session records a
 * package a few milliseconds after its queue commit, and the uploader often takes it in
 * between. Past these, redelivery (1 s, doubling) does the waiting without holding the
 * consumer.
 */
const RECORD_WAITS_MS = [5, 20, 80, 200];

/** The shortest interval of the periodic sweep of incomplete multipart uploads, whatever their age. */
const SWEEP_MIN_MS = 1000;
/** Node's timers go no further (about 24.8 days). */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * The uploader as the gateway and the uploader process run it: sweeps the multipart uploads
 * a crashed uploader left behind, then consumes committed packages (several uploaders share
 * the queue's one durable consumer).
 */
export async function runUploader(
  engines: Pick<Engines, 'queue' | 'objects' | 'sessions' | 'ledger' | 'sweepIncompleteUploads'>,
  config: Pick<Config, 'storage'> & { s3: Pick<Config['s3'], 'abortIncompleteAfterMs'> },
  log: Logger,
  observer?: UploaderObserver,
): Promise<QueueConsumer> {
  // Housekeeping: a store that cannot list or abort multipart uploads (s3rver answers 501) still serves puts.
  const sweep = async (): Promise<void> => {
    try {
      const swept = await engines.sweepIncompleteUploads();
      if (swept > 0) log.warn('aborted incomplete multipart uploads left behind (a crashed uploader, or a failed put whose abort failed too)', { count: swept });
    } catch (err) {
      log.warn('skipped the sweep of incomplete multipart uploads: the object store refused it (set an AbortIncompleteMultipartUpload lifecycle rule instead)', {
        reason: err instanceof Error ? `${err.name}: ${err.message}` : String(err),
      });
    }
  };
  await sweep();
  // Again every `s3.abortIncompleteAfterMs`: a put whose abort failed too (S3 gone mid-upload) leaves
  // its parts behind, which a long-running uploader would otherwise keep until its next start.
  let sweeping: Promise<void> | null = null;
  const sweeps = setInterval(() => {
    sweeping ??= sweep().finally(() => (sweeping = null));
  }, Math.max(SWEEP_MIN_MS, Math.min(config.s3.abortIncompleteAfterMs, MAX_TIMER_MS)));
  sweeps.unref();
  const stored = storedCounter({ sessions: engines.sessions, ledger: engines.ledger });
  const uploader = startUploader({
    queue: engines.queue,
    objects: engines.objects,
    prefix: config.storage.objectPrefix,
    concurrency: config.storage.uploaderConcurrency,
    verdict: (meta, delivery) => packageVerdict(engines.sessions, engines.ledger, meta.upload_uuid, meta.package_id, { delivery }),
    live: (meta, delivery) => sessionLive(engines.sessions, meta.upload_uuid, delivery),
    counted: (meta) => stored.count(meta),
    onError: (err, pkg) => log.error('upload failed; will retry', { err, package_id: pkg.package_id, upload_uuid: pkg.upload_uuid }),
    ...(observer ? { observer } : {}),
  });
  return {
    stop: async () => {
      clearInterval(sweeps);
      await sweeping;
      await uploader.stop();
      await stored.flush();
    },
  };
}

/**
 * Moves committed packages from the queue into object storage, one object per package:
 * the header line, then the batches' bytes unchanged. A failed put throws, so the queue
 * delivers the package again.
 */
export function startUploader(opts: UploaderOptions): QueueConsumer {
  const consumers = Array.from({ length: Math.max(1, opts.concurrency ?? 1) }, () => consumeOne(opts));
  return { stop: async () => void (await Promise.all(consumers.map((c) => c.stop()))) };
}

function consumeOne(opts: UploaderOptions): QueueConsumer {
  const { objects, prefix, onError, verdict, live, observer, counted } = opts;
  return opts.queue.consume(async (pkg) => {
    let decided: 'store' | 'drop' | 'wait' = 'store';
    let put = false;
    const key = objectKey(prefix, pkg.meta);
    try {
      if (verdict) {
        decided = await verdict(pkg.meta, pkg.attempt);
        for (const ms of RECORD_WAITS_MS) {
          if (decided !== 'wait') break;
          await sleep(ms);
          decided = await verdict(pkg.meta, pkg.attempt);
        }
      }
      if (decided === 'store') {
        const started = performance.now();
        await objects.put(key, objectBody(pkg, objects.capabilities.consumesChunksInTurn));
        put = true;
        const durationMs = performance.now() - started;
        const session = live ? await live(pkg.meta, pkg.attempt) : 'live';
        if (session === 'live') {
          await counted?.(pkg.meta);
          observer?.stored(durationMs);
        } else decided = session === 'gone' ? 'drop' : 'wait';
      }
      if (decided === 'drop') await abandon();
    } catch (err) {
      if (await deletedMeanwhile()) return;
      observer?.failed();
      onError?.(err, pkg.meta);
      throw err;
    }
    // Not an error: the ingest is still under way (or its gateway died and its lease has yet to
    // expire), or its session read as absent with no delete recorded (`sessionLive`: unsure).
    if (decided === 'wait') throw new PackageNotRecorded(pkg.meta.package_id);
    // 'drop': acked unstored.

    async function abandon(): Promise<void> {
      // Stored just now for a session deleted meanwhile, or perhaps by an earlier delivery (the key is the whole name).
      if (put || pkg.attempt > 1) await objects.deletePrefix(key);
      observer?.abandoned();
    }

    /**
     * After a failure: whether the session was deleted meanwhile (its purge ends the read of
     * the package's batches: QUEUE_PACKAGE_DROPPED on the embedded queue, gone on NATS); the
     * package is then acked unstored, not failed.
     */
    async function deletedMeanwhile(): Promise<boolean> {
      if (!live || (await live(pkg.meta, pkg.attempt).catch(() => 'live')) !== 'gone') return false;
      return abandon().then(
        () => true,
        () => false,
      );
    }
  });
}

class PackageNotRecorded extends Error {
  override readonly name = 'PackageNotRecorded';
  readonly code = 'PACKAGE_NOT_RECORDED' satisfies InternalErrorCode;
  constructor(packageId: string) {
    super(`Package ${packageId} is not recorded in its session yet`);
  }
}
