import { Readable } from 'node:stream';
import {
  AbortMultipartUploadCommand,
  CreateBucketCommand,
  DeleteObjectsCommand,
  GetObjectCommand,
  HeadBucketCommand,
  ListMultipartUploadsCommand,
  PutObjectCommand,
  S3Client,
  paginateListObjectsV2,
  type BucketLocationConstraint,
} from '@aws-sdk/client-s3';
import { Upload } from '@aws-sdk/lib-storage';
import { StoreError, type ObjectStore, type StoredObject } from '../ports.js';
import { describe, errorName, isMissingKey, statusOf } from './sdk-errors.js';
import { checkOptions, type S3ObjectStoreOptions, type Settings } from './options.js';

export { MIN_PART_SIZE_BYTES, type S3ObjectStoreOptions } from './options.js';

/** S3's limit of keys in one ListObjectsV2 page and in one DeleteObjects request. */
const BATCH = 1000;

/** A multipart upload that was created and neither completed nor aborted. */
export interface IncompleteUpload {
  key: string;
  uploadId: string;
  /** When the server says it was created (server clock); null if it did not say. */
  initiated: Date | null;
}

/**
 * `ObjectStore` on an S3 bucket. A body of at most one part (`partSizeBytes`) is one
 * PutObject; a longer one streams through `@aws-sdk/lib-storage` as a multipart upload of
 * `queueSize` parts in parallel, completed only after the last part, so the object appears whole or not at all
 * (S3 semantics). A failed put aborts its multipart upload and rethrows; a process killed
 * mid-put leaves an incomplete upload behind, which `abortIncompleteUploads` sweeps.
 */
export class S3ObjectStore implements ObjectStore {
  /** `put` gathers chunks into parts, several in flight: it may hold a chunk after asking for the next. */
  readonly capabilities = { consumesChunksInTurn: false } as const;
  readonly #settings: Settings;
  readonly #client: S3Client;
  readonly #inFlight = new Set<Promise<unknown>>();
  /** Keys of this store's multipart puts under way (how many each): never swept, whatever the age asked. */
  readonly #putting = new Map<string, number>();
  #closed = false;

  constructor(options: S3ObjectStoreOptions) {
    this.#settings = checkOptions(options);
    const s = this.#settings;
    this.#client = new S3Client({
      endpoint: s.endpoint,
      region: s.region,
      forcePathStyle: s.forcePathStyle,
      maxAttempts: s.maxAttempts,
      ...(s.accessKeyId !== null && s.secretAccessKey !== null
        ? { credentials: { accessKeyId: s.accessKeyId, secretAccessKey: s.secretAccessKey } }
        : {}),
      requestHandler: {
        connectionTimeout: Math.min(5_000, s.requestTimeoutMs),
        requestTimeout: s.requestTimeoutMs,
        // Without it the SDK only logs a warning when requestTimeout passes.
        throwOnRequestTimeout: true,
        socketTimeout: s.requestTimeoutMs,
      },
      // The SDK's default CRC32 checksums (extra headers, aws-chunked trailers) are not understood
      // by every S3-compatible server; operations that require one (DeleteObjects) still send it.
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
      // The middleware stack resolved once per command class, not on every send: it was 4 % of
      // the gateway's main thread with the uploader in it (CPU profile of bench:packages `many`),
      // and a 7 KB PutObject costs the client 1.0–1.1 ms of CPU instead of 1.3–1.4. Nothing
      // here changes a middleware stack after the client is made, which is what it requires.
      cacheMiddleware: true,
    });
  }

  /**
   * A store whose bucket answered HeadBucket. With `createBucket` a missing bucket is created
   * (tests, the embedded dev setup); otherwise a missing or unreachable bucket is an error.
   */
  static async open(options: S3ObjectStoreOptions & { createBucket?: boolean }): Promise<S3ObjectStore> {
    const { createBucket = false, ...rest } = options;
    const store = new S3ObjectStore(rest);
    try {
      await store.#ensureBucket(createBucket);
    } catch (err) {
      await store.close();
      throw err;
    }
    return store;
  }

  put(key: string, body: AsyncIterable<Uint8Array>): Promise<StoredObject> {
    return this.#track(async () => {
      checkKey(key);
      // A body of at most one part is held and sent as one PutObject: lib-storage would hold
      // it as well, and its stream and chunker cost a third more CPU per small object.
      const it = body[Symbol.asyncIterator]();
      const held: Uint8Array[] = [];
      let size = 0;
      let next = await it.next();
      while (!next.done && size + next.value.byteLength <= this.#settings.partSizeBytes) {
        held.push(next.value);
        size += next.value.byteLength;
        next = await it.next();
      }
      if (next.done) {
        await this.#client.send(new PutObjectCommand({ Bucket: this.#settings.bucket, Key: key, Body: Buffer.concat(held, size), ContentLength: size })).catch(this.#unusable);
        return { key, size };
      }
      let bodyFailure: { error: unknown } | undefined;
      // Only errors of the caller's iterator count as body failures: when lib-storage gives up
      // it destroys the stream, which throws an AbortError in here at the `yield`.
      const first = next.value;
      async function* counted(): AsyncGenerator<Uint8Array> {
        let finished = false;
        try {
          yield* held;
          yield first;
          size += first.byteLength;
          for (;;) {
            let step: IteratorResult<Uint8Array>;
            try {
              step = await it.next();
            } catch (error) {
              finished = true;
              bodyFailure = { error };
              throw error;
            }
            if (step.done) {
              finished = true;
              return;
            }
            size += step.value.byteLength;
            yield step.value;
          }
        } finally {
          if (!finished) await it.return?.();
        }
      }
      const stream = Readable.from(counted());
      const upload = new Upload({
        client: this.#client,
        params: { Bucket: this.#settings.bucket, Key: key, Body: stream },
        partSize: this.#settings.partSizeBytes,
        queueSize: this.#settings.queueSize,
        leavePartsOnError: false,
      });
      this.#putting.set(key, (this.#putting.get(key) ?? 0) + 1);
      try {
        await upload.done();
      } catch (err) {
        // lib-storage throws the abort's error instead when the abort fails too; the caller
        // should see why its put failed. (An upload left behind is for the sweep.)
        if (bodyFailure) throw bodyFailure.error;
        return this.#unusable(err);
      } finally {
        // On failure lib-storage stops reading: end the caller's iterator too.
        stream.destroy();
        const n = this.#putting.get(key)! - 1;
        if (n === 0) this.#putting.delete(key);
        else this.#putting.set(key, n);
      }
      return { key, size };
    });
  }

  get(key: string): Promise<AsyncIterable<Uint8Array> | null> {
    return this.#track(async () => {
      checkKey(key);
      try {
        const res = await this.#client.send(new GetObjectCommand({ Bucket: this.#settings.bucket, Key: key }));
        const body = res.Body as Readable | undefined;
        return body ? this.#reading(body) : Readable.from([]);
      } catch (err) {
        if (isMissingKey(err)) return null;
        return this.#unusable(err);
      }
    });
  }

  list(prefix: string): Promise<StoredObject[]> {
    return this.#track(async () => {
      const found: StoredObject[] = [];
      try {
        for await (const page of this.#pages(prefix)) {
          for (const o of page) found.push(o);
        }
      } catch (err) {
        return this.#unusable(err);
      }
      // S3 lists in UTF-8 byte order already; not every S3-compatible server does (s3rver
      // walks its directories and lists `a/b/1` before `a/b`).
      return found.sort((a, b) => Buffer.compare(Buffer.from(a.key), Buffer.from(b.key)));
    });
  }

  deletePrefix(prefix: string): Promise<void> {
    return this.#track(() => this.#deletePrefix(prefix).catch(this.#unusable));
  }

  async #deletePrefix(prefix: string): Promise<void> {
    for await (const page of this.#pages(prefix)) {
      if (page.length === 0) continue;
      const res = await this.#client.send(
        new DeleteObjectsCommand({
          Bucket: this.#settings.bucket,
          Delete: { Objects: page.map((o) => ({ Key: o.key })), Quiet: true },
        }),
      );
      const failed = res.Errors ?? [];
      if (failed.length > 0) {
        const first = failed[0];
        throw new StoreError('STORE_UNAVAILABLE',
          `Could not delete ${failed.length} of ${page.length} objects under ${JSON.stringify(prefix)}; ` +
            `first ${JSON.stringify(first?.Key)}: ${first?.Code} ${first?.Message}`,
        );
      }
    }
  }

  /**
   * Multipart uploads under `prefix` that were started and neither completed nor aborted,
   * in key order. Their parts are stored (and billed) but no `list` or `get` shows them.
   */
  listIncompleteUploads(prefix: string): Promise<IncompleteUpload[]> {
    return this.#track(() => this.#incompleteUploads(prefix));
  }

  /**
   * The sweep. A put aborts its own multipart upload when it fails, but an uploader killed
   * mid-put (crash, SIGKILL, lost node) cannot, nor can a put whose abort fails too (S3 gone
   * mid-upload): the upload stays incomplete, its parts stored and billed. Call this when an
   * uploader starts and every so often, for the storage prefix, with an age
   * well above the longest put (minutes: a put's requests each have `requestTimeoutMs` and
   * `maxAttempts`), e.g. 1 h. Uploads of other uploaders still running are younger and kept;
   * if one is cut off anyway, its put fails and the queue delivers the package again. This
   * store's own puts under way are never aborted.
   * Ages compare the server's `Initiated` with this machine's clock, so allow for skew.
   * Production buckets should also have a lifecycle rule (AbortIncompleteMultipartUpload) as
   * the backstop. Returns the uploads it aborted.
   */
  abortIncompleteUploads(prefix: string, olderThanMs: number): Promise<IncompleteUpload[]> {
    if (!Number.isFinite(olderThanMs) || olderThanMs < 0) {
      return Promise.reject(new RangeError(`olderThanMs: expected a number >= 0, got ${String(olderThanMs)}`));
    }
    return this.#track(async () => {
      const cutoff = Date.now() - olderThanMs;
      const aborted: IncompleteUpload[] = [];
      for (const u of await this.#incompleteUploads(prefix)) {
        const old = u.initiated ? u.initiated.getTime() <= cutoff : olderThanMs === 0;
        if (!old || this.#putting.has(u.key)) continue;
        try {
          await this.#client.send(
            new AbortMultipartUploadCommand({ Bucket: this.#settings.bucket, Key: u.key, UploadId: u.uploadId }),
          );
          aborted.push(u);
        } catch (err) {
          // Completed or aborted meanwhile (by its own uploader or a concurrent sweep).
          if (errorName(err) !== 'NoSuchUpload') throw err;
        }
      }
      return aborted;
    });
  }

  /** Readiness: HeadBucket answers within `timeoutMs` (one attempt's worth of the SDK's retries, cut at the deadline). */
  async probe(timeoutMs: number): Promise<void> {
    if (this.#closed) throw new StoreError('STORE_CLOSED', 'Object store is closed');
    await this.#client.send(new HeadBucketCommand({ Bucket: this.#settings.bucket }), { abortSignal: AbortSignal.timeout(timeoutMs) });
  }

  /** Waits for the operations under way (each bounded by the request deadlines), then closes the connections. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    while (this.#inFlight.size > 0) await Promise.allSettled([...this.#inFlight]);
    this.#client.destroy();
  }

  /**
   * An SDK failure (refused, timed out, unanswered, an S3 error) as the port names it: object
   * storage not usable for now (STORE_UNAVAILABLE, 503 where a request needs it, docs/api.md),
   * as a bucket that does not answer at open is. The SDK's error is the cause.
   */
  readonly #unusable = (err: unknown): Promise<never> => Promise.reject(this.#asUnusable(err));

  #asUnusable(err: unknown): unknown {
    return err instanceof StoreError ? err : new StoreError('STORE_UNAVAILABLE', `Object storage at ${this.#settings.endpoint} is not usable: ${describe(err)}`, { cause: err });
  }

  /** An object's body as it arrives; a connection that fails or stalls under it (`requestTimeoutMs`) is object storage not usable too. */
  async *#reading(body: Readable): AsyncIterable<Uint8Array> {
    try {
      yield* body;
    } catch (err) {
      throw this.#asUnusable(err);
    }
  }

  #track<T>(op: () => Promise<T>): Promise<T> {
    if (this.#closed) return Promise.reject(new StoreError('STORE_CLOSED', 'Object store is closed'));
    const p = op();
    this.#inFlight.add(p);
    const done = () => this.#inFlight.delete(p);
    p.then(done, done);
    return p;
  }

  async #incompleteUploads(prefix: string): Promise<IncompleteUpload[]> {
    const found: IncompleteUpload[] = [];
    let KeyMarker: string | undefined;
    let UploadIdMarker: string | undefined;
    for (;;) {
      const page = await this.#client.send(
        new ListMultipartUploadsCommand({
          Bucket: this.#settings.bucket,
          Prefix: prefix || undefined,
          KeyMarker,
          UploadIdMarker,
          MaxUploads: BATCH,
        }),
      );
      for (const u of page.Uploads ?? []) {
        if (u.Key !== undefined && u.UploadId !== undefined) {
          found.push({ key: u.Key, uploadId: u.UploadId, initiated: u.Initiated ?? null });
        }
      }
      if (!page.IsTruncated || (!page.NextKeyMarker && !page.NextUploadIdMarker)) return found;
      KeyMarker = page.NextKeyMarker;
      UploadIdMarker = page.NextUploadIdMarker;
    }
  }

  async *#pages(prefix: string): AsyncIterable<StoredObject[]> {
    const pages = paginateListObjectsV2(
      { client: this.#client, pageSize: BATCH },
      { Bucket: this.#settings.bucket, Prefix: prefix || undefined },
    );
    for await (const page of pages) {
      const objects: StoredObject[] = [];
      for (const o of page.Contents ?? []) {
        if (o.Key !== undefined) objects.push({ key: o.Key, size: o.Size ?? 0 });
      }
      yield objects;
    }
  }

  async #ensureBucket(create: boolean): Promise<void> {
    const { bucket, endpoint, region } = this.#settings;
    const head = async (): Promise<boolean> => {
      try {
        await this.#client.send(new HeadBucketCommand({ Bucket: bucket }));
        return true;
      } catch (err) {
        if (statusOf(err) === 404) return false;
        throw new StoreError('STORE_UNAVAILABLE', `Object storage at ${endpoint} is not usable (HeadBucket ${bucket}): ${describe(err)}`, { cause: err });
      }
    };
    if (await head()) return;
    if (!create) throw new StoreError('STORE_MISCONFIGURED', `Bucket ${JSON.stringify(bucket)} does not exist at ${endpoint}`);
    try {
      await this.#client.send(
        new CreateBucketCommand({
          Bucket: bucket,
          // us-east-1 is the default location and must not be named.
          ...(region === 'us-east-1'
            ? {}
            : { CreateBucketConfiguration: { LocationConstraint: region as BucketLocationConstraint } }),
        }),
      );
    } catch (err) {
      // Another process may have created it first (BucketAlreadyExists / AlreadyOwnedByYou).
      if (await head()) return;
      throw new StoreError('STORE_UNAVAILABLE', `Could not create bucket ${JSON.stringify(bucket)} at ${endpoint}: ${describe(err)}`, { cause: err });
    }
  }
}

/**
 * The same keys as the embedded store accepts, so both adapters agree: S3 would store `a//b`
 * or `../x`, a file system (and the file-backed S3 servers used in tests) would not.
 */
function checkKey(key: string): void {
  const segments = key.split('/');
  if (segments.some((s) => s === '' || s === '.' || s === '..')) {
    throw new StoreError('STORE_INVALID_KEY', `Invalid object key ${JSON.stringify(key)}: no empty, "." or ".." segments, no leading or trailing "/"`);
  }
}
