/**
 * Chooses the adapters of the three ports from configuration only: `nats.url` puts session
 * state and the batch queue on NATS JetStream, `s3.endpoint` puts objects on S3; unset, the
 * embedded file-backed adapters under `dataDir` serve. Nothing above the ports changes.
 */
import { constants } from 'node:fs';
import { access, mkdir, open, unlink } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import type { Config } from '../config/config.js';
import type { Logger } from '../log.js';
import { FileBatchQueue } from './embedded/batch-queue.js';
import { READINESS_KEY, serviceObjectPrefix } from './keys.js';
import { DataDirLock } from './embedded/data-dir.js';
import { SqliteLedger } from './embedded/ledger.js';
import { FileObjectStore } from './embedded/object-store.js';
import { SqliteSessionStore } from './embedded/session-store.js';
import { StateDatabase } from './embedded/state-db.js';
import { NatsBatchQueue } from './nats/batch-queue/index.js';
import { connectNats, damagedReads, JS_STREAM_NOT_FOUND, jsErrorCode, withRetry, type NatsHandle } from './nats/connection.js';
import { NatsLedger } from './nats/ledger.js';
import { LostKeysGuard } from './nats/lost-keys.js';
import { NatsSessionStore } from './nats/session-store.js';
import { isStoreConflict, StoreError, type BatchQueue, type ObjectStore, type PackageLedger, type SessionStore } from './ports.js';
import { S3ObjectStore } from './s3/object-store.js';

export interface Engines {
  sessions: SessionStore;
  ledger: PackageLedger;
  queue: BatchQueue;
  objects: ObjectStore;
  /** Which adapters serve, for logs and readiness. */
  describe: { sessions: 'nats-kv' | 'file'; queue: 'jetstream' | 'file'; objects: 's3' | 'file' };
  /**
   * Readiness checks by name (`nats`, `s3`, `storage` for the data directory of the embedded
   * adapters); each resolves when its system answers within `timeoutMs`.
   */
  probes: Record<string, (timeoutMs: number) => Promise<void>>;
  /** Aborts multipart uploads a crashed uploader left behind (S3 only; a no-op on files). */
  sweepIncompleteUploads(): Promise<number>;
  /** Damaged records the embedded stores found and skipped (each logged with its file and offset); 0 on NATS and S3. */
  damagedRecords(): number;
  /** Reads from NATS unlike what was written, read or delivered again (`damagedReads`, connection.ts); null without NATS. */
  damagedReads: (() => number) | null;
  close(): Promise<void>;
}

/** What the engines tell as they run (tests wait on it instead of polling). */
export interface EngineHooks {
  /** A delivery of the batch queue was settled by a consumer of this process (`pending` may have changed). */
  onQueueSettled?: () => void;
}

export async function openEngines(config: Config, log: Logger, name: string, hooks: EngineHooks = {}): Promise<Engines> {
  const closers: (() => Promise<void>)[] = [];
  const close = async () => {
    for (const fn of closers.reverse()) await fn().catch((err: unknown) => log.error('close failed', { err }));
  };
  let damaged = 0;
  const onDamage = (file: string, offset: number, reason: string) => {
    damaged++;
    log.error('damaged record skipped', { file, offset, reason });
  };
  try {
    const dataDir = resolve(config.dataDir);
    let sessions: SessionStore;
    let ledger: PackageLedger;
    let queue: BatchQueue;
    let nats: NatsHandle | undefined;
    /** The JetStream streams the adapters make at open: the session bucket's, the ledger's, the queue. */
    let streams: string[] = [];
    if (config.nats.url) {
      nats = await connectNats({
        servers: config.nats.url,
        name,
        requestTimeoutMs: config.nats.requestTimeoutMs,
        onConnection: (event, server) =>
          event === 'reconnect'
            ? log.info('NATS reconnected', { server })
            : log.warn(event === 'stale' ? 'NATS server stopped answering pings: reconnecting elsewhere' : 'NATS disconnected: reconnecting', { server }),
      });
      const handle = nats;
      closers.push(() => handle.close());
      streams = [`KV_${config.nats.kvBucket}`, `KV_${config.nats.ledgerBucket}`, config.nats.stream];
      reportMissingStreams(await missingStreams(handle, streams, START_RETRY_MS), streams, log);
      // Reads that find nothing are checked against the stream: lost data is never "no session" (lost-keys.ts).
      sessions = await LostKeysGuard.open(await NatsSessionStore.open(nats, { bucket: config.nats.kvBucket, replicas: config.nats.replicas }), nats, config.nats.kvBucket);
      closers.push(() => sessions.close());
      ledger = await NatsLedger.open(nats, { bucket: config.nats.ledgerBucket, replicas: config.nats.replicas, sessions });
      closers.push(() => ledger.close());
      queue = await NatsBatchQueue.open(nats, {
        stream: config.nats.stream,
        replicas: config.nats.replicas,
        durable: config.nats.durable,
        ackWaitMs: config.nats.ackWaitMs,
        onError: (err, what) => log.error(`batch queue: ${what}`, { err }),
        onAcked: hooks.onQueueSettled,
      });
      closers.push(() => queue.close());
    } else {
      const lock = await DataDirLock.acquire(dataDir);
      closers.push(async () => lock.release());
      const state = await StateDatabase.open(join(dataDir, STATE_DB), { timeoutMs: config.storage.diskTimeoutMs }).catch((err: unknown) => {
        throw new StoreError('STORE_MISCONFIGURED', `DATA_DIR ${dataDir}: ${STATE_DB} cannot be opened: ${(err as Error).message}`, { cause: err });
      });
      closers.push(() => state.close());
      sessions = new SqliteSessionStore(state);
      closers.push(() => sessions.close());
      ledger = new SqliteLedger(state);
      closers.push(() => ledger.close());
      queue = await FileBatchQueue.open(join(dataDir, 'queue'), state, {
        onDamage,
        onSettled: hooks.onQueueSettled,
        diskTimeoutMs: config.storage.diskTimeoutMs,
      });
      closers.push(() => queue.close());
    }

    const probes: Engines['probes'] = {};
    const dataDirWritable = () => access(dataDir, constants.W_OK);
    if (nats) {
      const handle = nats;
      probes.nats = async (timeoutMs) => {
        await handle.probe(timeoutMs);
        // JetStream answering is not enough: a server that came back without its data answers too.
        const missing = await missingStreams(handle, streams);
        if (missing.length > 0) throw new StoreError('STORE_UNAVAILABLE', `JetStream stream${missing.length > 1 ? 's' : ''} ${missing.join(', ')} missing: ${LOST}`);
        await writeProbe(sessions);
      };
    } else {
      probes.storage = async () => {
        await dataDirWritable();
        await writeProbe(sessions);
        await batchProbe(dataDir);
      };
    }
    let objects: ObjectStore;
    let sweepIncompleteUploads = async () => 0;
    const { s3 } = config;
    if (s3.endpoint && s3.bucket) {
      const store = await S3ObjectStore.open({
        endpoint: s3.endpoint,
        bucket: s3.bucket,
        region: s3.region,
        accessKeyId: s3.accessKeyId,
        secretAccessKey: s3.secretAccessKey,
        partSizeBytes: s3.partSizeBytes,
        queueSize: s3.queueSize,
        requestTimeoutMs: s3.requestTimeoutMs,
        createBucket: s3.createBucket,
      });
      objects = store;
      probes.s3 = (timeoutMs) => store.probe(timeoutMs);
      sweepIncompleteUploads = async () =>
        (await store.abortIncompleteUploads(serviceObjectPrefix(config.storage.objectPrefix), s3.abortIncompleteAfterMs)).length;
    } else {
      if (nats) {
        // A pack takes one writer (object-store.ts): the directory is this process's, as the embedded default's is.
        const lock = await DataDirLock.acquire(dataDir, { objectsOnly: true });
        closers.push(async () => lock.release());
      }
      await mkdir(dataDir, { recursive: true });
      objects = await FileObjectStore.open(join(dataDir, 'objects'), { onDamage });
      // The embedded stores' check covers the data directory already; with NATS it is the objects' only one.
      probes.storage ??= dataDirWritable;
    }
    closers.push(() => objects.close());

    return {
      sessions,
      ledger,
      queue,
      objects,
      describe: { sessions: nats ? 'nats-kv' : 'file', queue: nats ? 'jetstream' : 'file', objects: s3.endpoint ? 's3' : 'file' },
      probes,
      sweepIncompleteUploads,
      damagedRecords: () => damaged,
      damagedReads: nats ? () => damagedReads.count : null,
      close,
    };
  } catch (err) {
    await close();
    throw err;
  }
}

/**
 * Wraps the engines' writes that may change what status answers (a session store or ledger
 * write, a session's packages purged from the queue) so that `notify` is told after each
 * settles (`AppOptions.onStateChange`; the uploader process's own writes). Queue deliveries
 * settled are told through `EngineHooks.onQueueSettled`.
 */
export function notifyingWrites(engines: Pick<Engines, 'sessions' | 'ledger' | 'queue'>, notify: () => void): void {
  engines.sessions = notifying(engines.sessions, ['create', 'update', 'delete'], notify);
  engines.ledger = notifying(engines.ledger, ['append', 'markStored', 'countStored', 'drop'], notify);
  engines.queue = notifying(engines.queue, ['purge'], notify);
}

/**
 * `target` with `notify` called after each call of the named methods settles (resolved or
 * not); everything else as it is (`notifyingWrites`).
 */
function notifying<T extends object>(target: T, methods: readonly string[], notify: () => void): T {
  return new Proxy(target, {
    get(obj, prop) {
      const value: unknown = Reflect.get(obj, prop, obj);
      if (typeof value !== 'function') return value;
      if (typeof prop !== 'string' || !methods.includes(prop)) return value.bind(obj);
      return (...args: unknown[]) => {
        const settled = () => notify();
        return Promise.resolve(value.apply(obj, args)).finally(settled);
      };
    },
  });
}

/** The embedded state database's file in DATA_DIR (sessions, ledger, idempotent answers). */
export const STATE_DB = 'state.sqlite';

/**
 * A write the session store must make durable, then its removal. Reads alone can pass where
 * writes fail: a NATS server whose disk is gone still answers from its memory, and a data
 * directory detached under the open files still takes new ones.
 */
async function writeProbe(sessions: SessionStore): Promise<void> {
  await sessions.create(READINESS_KEY, { at: new Date().toISOString() }).catch((err: unknown) => {
    if (!isStoreConflict(err)) throw err; // another instance's probe: the delete below still writes
  });
  await sessions.delete(READINESS_KEY);
}

/** What `batchProbe` writes: a batch of rows as the queue writes them (ingest batches are up to about this size). */
const PROBE_BYTES = 1024 * 1024;

/**
 * A batch's worth of bytes written to the data directory and fdatasync'ed, then removed: a
 * disk with room for the session store's small writes but not for a batch (nearly full), or
 * whose writes fail, is not ready.
 */
async function batchProbe(dataDir: string): Promise<void> {
  const path = join(dataDir, '.readiness-probe');
  const file = await open(path, 'w');
  try {
    // A disk that fills up mid-write answers with fewer bytes, not ENOSPC (libuv keeps the count).
    const { bytesWritten } = await file.write(Buffer.alloc(PROBE_BYTES));
    if (bytesWritten < PROBE_BYTES) {
      throw new StoreError('STORE_UNAVAILABLE', `DATA_DIR ${dataDir} has no room for a batch: ${bytesWritten} of ${PROBE_BYTES} bytes written`);
    }
    await file.datasync();
  } finally {
    await file.close();
    await unlink(path).catch(() => undefined);
  }
}

/** How long the start's look at the streams re-sends through transient failures, as the adapters' own opens do. */
const START_RETRY_MS = 10_000;

const LOST = 'the server lost them (its storage was replaced or wiped) or they were deleted; what they held is gone';

/**
 * Which of `names` JetStream does not have: one stream info each, each bounded by the
 * connection's request timeout and, with `retryMs`, re-sent through transient failures (a
 * cluster still electing its leaders at start) for that long.
 */
async function missingStreams(nats: NatsHandle, names: readonly string[], retryMs = 0): Promise<string[]> {
  const found = await Promise.all(
    names.map((name) =>
      withRetry(nats, retryMs, () => nats.jsm.streams.info(name)).then(
        () => true,
        (err: unknown) => {
          if (jsErrorCode(err) === JS_STREAM_NOT_FOUND) return false;
          throw err;
        },
      ),
    ),
  );
  return names.filter((_, i) => !found[i]);
}

/**
 * At start the adapters make whatever stream is missing, empty. Some of them missing while
 * others exist means that data was lost: said as an error, naming them (the gateway still
 * starts, so that the service works again, but never silently). None at all is a first start,
 * or a server that lost everything: said as a warning.
 */
function reportMissingStreams(missing: string[], all: readonly string[], log: Logger): void {
  if (missing.length === 0) return;
  if (missing.length < all.length) {
    log.error(`JetStream streams missing, created empty: ${missing.join(', ')}; ${LOST}`, { missing, existing: all.filter((s) => !missing.includes(s)) });
  } else {
    log.warn(`No JetStream stream of the service exists (${all.join(', ')}): creating them empty. Expected on a first start only; otherwise the server lost its data`, { missing });
  }
}
