/**
 * The options of `S3ObjectStore`, checked once (`checkOptions`) into the frozen settings it runs with.
 */
import { StoreError } from '../ports.js';

const MiB = 1024 * 1024;
/** S3's smallest part (every part but the last). */
export const MIN_PART_SIZE_BYTES = 5 * MiB;

export interface S3ObjectStoreOptions {
  /** `http(s)://host[:port]` of the S3 API (AWS or any S3-compatible server). */
  endpoint: string;
  bucket: string;
  region: string;
  /**
   * Static credentials. Leave both unset (or null) to use the SDK's default credential chain
   * (environment, shared config, instance or pod role).
   */
  accessKeyId?: string | null;
  secretAccessKey?: string | null;
  /** `https://host/bucket/key` instead of `https://bucket.host/key`. Default true: what S3-compatible servers expect. */
  forcePathStyle?: boolean;
  /** Part size of a multipart put; a body of at most one part is sent as a single PUT. Default 8 MiB, min 5 MiB. */
  partSizeBytes?: number;
  /** Parts of one put uploaded in parallel. Default 4. Memory per put is about `partSizeBytes × (queueSize + 1)`. */
  queueSize?: number;
  /**
   * Deadline of one HTTP request, from connect until the response headers (a part upload
   * included), and the longest a response body may stall. Default 60 s. The connect phase
   * alone has min(5 s, this).
   */
  requestTimeoutMs?: number;
  /** Attempts per request, retries included (SDK standard retry with backoff). Default 3. */
  maxAttempts?: number;
}

export type Settings = Readonly<Required<Omit<S3ObjectStoreOptions, 'accessKeyId' | 'secretAccessKey'>>> & {
  readonly accessKeyId: string | null;
  readonly secretAccessKey: string | null;
};

const defaults = () => ({
  forcePathStyle: true,
  partSizeBytes: 8 * MiB,
  queueSize: 4,
  requestTimeoutMs: 60_000,
  maxAttempts: 3,
});

export function checkOptions(options: S3ObjectStoreOptions): Settings {
  if (typeof options !== 'object' || options === null) throw new StoreError('STORE_MISCONFIGURED', 'S3ObjectStore options: expected an object');
  const known = new Set([
    'endpoint',
    'bucket',
    'region',
    'accessKeyId',
    'secretAccessKey',
    'forcePathStyle',
    'partSizeBytes',
    'queueSize',
    'requestTimeoutMs',
    'maxAttempts',
  ]);
  for (const k of Object.keys(options)) {
    if (!known.has(k)) throw new StoreError('STORE_MISCONFIGURED', `S3ObjectStore option ${k}: unknown option`);
  }
  const merged = { ...defaults(), ...stripUndefined(options) };
  const fail = (key: string, expected: string, got: unknown): never => {
    const shown = key === 'secretAccessKey' ? typeof got : JSON.stringify(got);
    throw new StoreError('STORE_MISCONFIGURED', `S3ObjectStore option ${key}: expected ${expected}, got ${shown}`);
  };
  const nonEmpty = (key: 'endpoint' | 'bucket' | 'region'): string => {
    const v = merged[key];
    return typeof v === 'string' && v.length > 0 ? v : fail(key, 'a non-empty string', v);
  };
  const endpoint = nonEmpty('endpoint');
  let url: URL | undefined;
  try {
    url = new URL(endpoint);
  } catch {
    url = undefined;
  }
  if (!url || (url.protocol !== 'http:' && url.protocol !== 'https:')) fail('endpoint', 'an http(s) URL', endpoint);
  const int = (key: 'partSizeBytes' | 'queueSize' | 'requestTimeoutMs' | 'maxAttempts', min: number): number => {
    const v = merged[key];
    return Number.isSafeInteger(v) && v >= min ? v : fail(key, `an integer >= ${min}`, v);
  };
  const credential = (key: 'accessKeyId' | 'secretAccessKey'): string | null => {
    const v = merged[key] ?? null;
    return v === null || (typeof v === 'string' && v.length > 0) ? v : fail(key, 'a non-empty string or null', v);
  };
  const accessKeyId = credential('accessKeyId');
  const secretAccessKey = credential('secretAccessKey');
  if ((accessKeyId === null) !== (secretAccessKey === null)) {
    fail(accessKeyId === null ? 'accessKeyId' : 'secretAccessKey', 'to be set together with the other credential', null);
  }
  if (typeof merged.forcePathStyle !== 'boolean') fail('forcePathStyle', 'a boolean', merged.forcePathStyle);
  return Object.freeze({
    endpoint,
    bucket: nonEmpty('bucket'),
    region: nonEmpty('region'),
    accessKeyId,
    secretAccessKey,
    forcePathStyle: merged.forcePathStyle,
    partSizeBytes: int('partSizeBytes', MIN_PART_SIZE_BYTES),
    queueSize: int('queueSize', 1),
    requestTimeoutMs: int('requestTimeoutMs', 1),
    maxAttempts: int('maxAttempts', 1),
  });
}

function stripUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}
