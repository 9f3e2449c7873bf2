/**
 * Configuration: `config/default.json`, then an optional file named by `CONFIG_FILE`, then
 * the environment names of docs/operations.md (Configuration). Validated once (typia) with errors that name the
 * bad key, then frozen and passed down; nothing else reads `process.env`.
 */
import { readFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { availableParallelism } from 'node:os';
import { fileURLToPath } from 'node:url';
import typia, { tags } from 'typia';
import type { InternalErrorCode } from '../errors.js';
import type { LogLevel } from '../log.js';

type Port = number & tags.Type<'uint32'> & tags.Maximum<65535>;
type PositiveInt = number & tags.Type<'uint32'> & tags.Minimum<1>;
type Count = number & tags.Type<'uint32'>;
/** A delay a timer waits: Node's timers take at most 2^31 − 1 ms (about 24.8 days); a longer one fires after 1 ms. */
type TimerMs = Count & tags.Maximum<2147483647>;
type PositiveTimerMs = PositiveInt & tags.Maximum<2147483647>;
type IsoDateOrNull = null | (string & tags.Pattern<'^\\d{4}-\\d{2}-\\d{2}$'>);

export interface Config {
  host: string & tags.MinLength<1>;
  port: Port;
  /** Base URL the Connector calls back on; default `http://<host>:<port>`. */
  publicUrl: null | (string & tags.Format<'uri'>);
  dataDir: string & tags.MinLength<1>;
  /** Clients file; null = the demo clients (embedded default only). */
  clientsFile: null | (string & tags.MinLength<1>);
  /** Peers whose `X-Forwarded-For` is believed (CIDR or single addresses). */
  trustedProxies: string[];
  http: {
    /** The HTTP edge: `auto` (uWS where its native binary loads, else node), `uws` (stop if it cannot load), `node`. */
    engine: 'auto' | 'uws' | 'node';
  };
  limits: {
    ingestBodyBytes: PositiveInt;
    otherBodyBytes: PositiveInt;
    /** Bytes of buffered (non-ingest) bodies held at once, all requests together: past it, 503 (one body alone always fits). */
    bufferedBodyBytes: PositiveInt;
    requestTimeoutMs: PositiveTimerMs;
    /** The window of the minimum body rate: a body that brings less than `minBodyBytesPerSecond` × this in one window: 408. */
    bodyRateWindowMs: PositiveTimerMs;
    /** The minimum body rate while the edge waits for body bytes (a trickle is cut after one window). */
    minBodyBytesPerSecond: PositiveInt;
    /** Per client IP, average rate of `/api/v1/` requests (fractions allowed); 0 = no rate limit. */
    requestsPerSecond: number & tags.Minimum<0>;
    /** Per client IP, `/api/v1/` requests a rested client may send at once. */
    burst: PositiveInt;
    /** Per client IP, requests in flight; 0 = no cap. */
    concurrentPerClient: Count;
    /** Client IPs tracked at once (bounds the limiter's memory). */
    trackedClients: PositiveInt;
    /**
     * The proxy in front (config/nginx/) enforces the per-client rate and connection limits:
     * requests from a `trustedProxies` peer are not counted again; the client's address is
     * read from its `X-Forwarded-For`. Requires `trustedProxies`.
     */
    perIpAtProxy: boolean;
    /** SIGTERM/SIGINT: how long in-flight requests may take to finish before their connections are closed. */
    shutdownGraceMs: TimerMs;
    /** Safety bound of the packages one session may hold (recording costs the same at any count); past it, ingest answers 409. */
    packagesPerSession: PositiveInt;
  };
  ingest: {
    /** Validation worker threads; 0 = one per core. */
    workers: Count;
    /** Steps of niceness the worker threads add to the process's (0: none; Linux, per thread): the event loop keeps priority over validation. */
    workerNice: Count & tags.Maximum<19>;
    /** Ingest requests allowed open beyond one per worker before requests are turned away (503). */
    maxQueue: PositiveInt;
    /** Target size of a piece of rows handed to a worker. */
    pieceBytes: number & tags.Type<'uint32'> & tags.Minimum<4096> & tags.Maximum<67108864>;
    /** Pieces one request may have in flight before its socket is paused. */
    piecesPerRequest: PositiveInt & tags.Maximum<1024>;
    /** Tasks running or queued in the pool, all requests together; 0 = two per worker. */
    poolPieces: Count;
    /** Bound of a `Content-Encoding: gzip` body once inflated (413 past it). */
    maxDecompressedBytes: PositiveInt;
    /** Rows checked by the byte-level scanner (false: `JSON.parse` + typia only, the reference path; for comparison). */
    rowScanner: boolean;
    /** Row tasks of at most this many bytes run on the main thread, without a worker's round trip (the short way of small packages); 0: never. */
    inlineBytes: number & tags.Type<'uint32'> & tags.Maximum<1048576>;
    /** The share of the open ingest requests (`workers + maxQueue`) one client may hold (at least one): no client holds them all. */
    clientShare: number & tags.ExclusiveMinimum<0> & tags.Maximum<1>;
    /** Bytes all ingest requests together may hold whole (inflated; layouts not streamed, long rows, bytes after `data`); past it, 503. */
    memoryBudgetBytes: PositiveInt;
    /** Upper bound of one encoded batch (NATS max_payload is 1 MiB). */
    batchBytes: number & tags.Type<'uint32'> & tags.Minimum<1024> & tags.Maximum<1000000>;
    /**
     * The lease of an ingest in flight, renewed every third of it while the ingest runs: how long
     * a dead instance's ingest still counts against `upload_tasks_finished`.
     */
    inFlightLeaseMs: PositiveTimerMs & tags.Minimum<300>;
  };
  storage: {
    objectPrefix: string;
    inProcessUploader: boolean;
    /** Packages one uploader stores at the same time. */
    uploaderConcurrency: PositiveInt & tags.Maximum<256>;
    /** Every gateway's housekeeping round (expired idempotency records, clean-ups of deleted sessions a stopped instance left): at start and then this often. */
    housekeepingMs: PositiveTimerMs & tags.Minimum<1000>;
    /**
     * The embedded back end: how long a read or write of the state database, or a write or
     * fdatasync of the batch queue's files, waits for the disk before its request is told 503
     * (a frozen or hung device).
     */
    diskTimeoutMs: PositiveTimerMs & tags.Minimum<100>;
  };
  connector: {
    url: null | (string & tags.Format<'uri'>);
    timeoutMs: PositiveTimerMs;
    connectTimeoutMs: PositiveTimerMs;
    webhookSecret: null | (string & tags.MinLength<16>);
    webhookToleranceSeconds: PositiveInt;
    emulatorDelayMs: TimerMs;
  };
  nats: {
    /** Comma-separated server URLs; set: session state and the batch queue live on JetStream. */
    url: null | (string & tags.MinLength<1>);
    kvBucket: string & tags.Pattern<'^[A-Za-z0-9_-]+$'>;
    /** KV bucket of the package ledger (its own stream: ledger writes never touch the session bucket). */
    ledgerBucket: string & tags.Pattern<'^[A-Za-z0-9_-]+$'>;
    stream: string & tags.Pattern<'^[A-Za-z0-9_-]+$'>;
    /** The durable pull consumer all uploaders share. */
    durable: string & tags.Pattern<'^[A-Za-z0-9_-]+$'>;
    /** Replicas of the KV bucket and the stream (3 on a 3-node cluster). */
    replicas: number & tags.Type<'uint32'> & tags.Minimum<1> & tags.Maximum<5>;
    requestTimeoutMs: PositiveTimerMs;
    /** How long an uploader may hold a package without a heartbeat. */
    ackWaitMs: PositiveInt;
  };
  s3: {
    endpoint: null | (string & tags.Format<'uri'>);
    bucket: null | (string & tags.MinLength<1>);
    region: string & tags.MinLength<1>;
    accessKeyId: null | string;
    secretAccessKey: null | string;
    /** Multipart part size (S3's minimum is 5 MiB). */
    partSizeBytes: number & tags.Type<'uint32'> & tags.Minimum<5242880>;
    /** Parts uploaded in parallel per object. */
    queueSize: PositiveInt;
    requestTimeoutMs: PositiveTimerMs;
    /** Create the bucket at start if it is missing (development servers). */
    createBucket: boolean;
    /** Multipart uploads older than this are a crashed uploader's: the uploader aborts them at start. */
    abortIncompleteAfterMs: PositiveInt;
  };
  log: {
    /** Lowest level written: trace, debug, info (one access line per request), warn, error, fatal, silent. */
    level: LogLevel;
  };
  metrics: {
    /** Serve `GET /metrics` and record request, ingest, uploader and Connector metrics. */
    enabled: boolean;
    /** When set, `GET /metrics` requires `Authorization: Bearer <token>` (else 401). */
    token: null | (string & tags.MinLength<16>);
    /** The separate uploader process serves `/metrics` and `/healthz` on this port; null = not at all. */
    uploaderPort: null | Port;
  };
  health: {
    /** Deadline of each readiness check (NATS, S3, storage) behind `GET /readyz`. */
    readyTimeoutMs: PositiveTimerMs;
  };
  /** `Idempotency-Key` on ingest (docs/api.md, Idempotent retries). */
  idempotency: {
    /** How long a finished request's answer is replayed; afterwards the key is free again and its record removed. */
    ttlMs: PositiveInt;
    /** Records one client may hold; at it, its oldest finished ones are removed (down to nine tenths). */
    keysPerClient: PositiveInt & tags.Minimum<10>;
    /** How long a claim outlives a crashed instance (renewed every third of it while its request runs). */
    leaseMs: PositiveTimerMs & tags.Minimum<30>;
    /** How long a repeat waits for the request in progress before answering 409. */
    waitMs: TimerMs;
  };
}

export class ConfigError extends Error {
  override readonly name = 'ConfigError';
  readonly code = 'CONFIG_INVALID' satisfies InternalErrorCode;
}

/** Environment names (docs/operations.md, Configuration) and the key each overrides. */
const ENV: Record<string, { path: string[]; type: 'string' | 'int' | 'bool' | 'list' }> = {
  HOST: { path: ['host'], type: 'string' },
  PORT: { path: ['port'], type: 'int' },
  PUBLIC_URL: { path: ['publicUrl'], type: 'string' },
  DATA_DIR: { path: ['dataDir'], type: 'string' },
  CLIENTS_FILE: { path: ['clientsFile'], type: 'string' },
  TRUSTED_PROXIES: { path: ['trustedProxies'], type: 'list' },
  HTTP_ENGINE: { path: ['http', 'engine'], type: 'string' },
  INGEST_WORKERS: { path: ['ingest', 'workers'], type: 'int' },
  INGEST_WORKER_NICE: { path: ['ingest', 'workerNice'], type: 'int' },
  INGEST_MAX_QUEUE: { path: ['ingest', 'maxQueue'], type: 'int' },
  INGEST_PIECE_BYTES: { path: ['ingest', 'pieceBytes'], type: 'int' },
  INGEST_PIECES_PER_REQUEST: { path: ['ingest', 'piecesPerRequest'], type: 'int' },
  INGEST_POOL_PIECES: { path: ['ingest', 'poolPieces'], type: 'int' },
  CONNECTOR_URL: { path: ['connector', 'url'], type: 'string' },
  CONNECTOR_TIMEOUT_MS: { path: ['connector', 'timeoutMs'], type: 'int' },
  CONNECTOR_WEBHOOK_SECRET: { path: ['connector', 'webhookSecret'], type: 'string' },
  CONNECTOR_EMULATOR_DELAY_MS: { path: ['connector', 'emulatorDelayMs'], type: 'int' },
  NATS_URL: { path: ['nats', 'url'], type: 'string' },
  S3_ENDPOINT: { path: ['s3', 'endpoint'], type: 'string' },
  S3_BUCKET: { path: ['s3', 'bucket'], type: 'string' },
  S3_REGION: { path: ['s3', 'region'], type: 'string' },
  S3_ACCESS_KEY_ID: { path: ['s3', 'accessKeyId'], type: 'string' },
  S3_SECRET_ACCESS_KEY: { path: ['s3', 'secretAccessKey'], type: 'string' },
  NATS_REPLICAS: { path: ['nats', 'replicas'], type: 'int' },
  S3_CREATE_BUCKET: { path: ['s3', 'createBucket'], type: 'bool' },
  IN_PROCESS_UPLOADER: { path: ['storage', 'inProcessUploader'], type: 'bool' },
  UPLOADER_CONCURRENCY: { path: ['storage', 'uploaderConcurrency'], type: 'int' },
  SHUTDOWN_GRACE_MS: { path: ['limits', 'shutdownGraceMs'], type: 'int' },
  PER_IP_AT_PROXY: { path: ['limits', 'perIpAtProxy'], type: 'bool' },
  LOG_LEVEL: { path: ['log', 'level'], type: 'string' },
  METRICS_ENABLED: { path: ['metrics', 'enabled'], type: 'bool' },
  METRICS_TOKEN: { path: ['metrics', 'token'], type: 'string' },
  UPLOADER_METRICS_PORT: { path: ['metrics', 'uploaderPort'], type: 'int' },
  READY_TIMEOUT_MS: { path: ['health', 'readyTimeoutMs'], type: 'int' },
};

/** Keys that are gone, and what replaced them (named in the error). */
const REPLACED: Record<string, string> = {
  'limits.idleTimeoutMs': 'limits.bodyRateWindowMs',
  'limits.idleProgressBytes': 'limits.minBodyBytesPerSecond (bytes per second)',
};

/**
 * Keys a file may give in another unit: `idempotency.ttlHours` is the name the service's API
 * decisions use for the answers' lifetime. Read into the key it stands for; both at once: error.
 */
const IN_OTHER_UNITS: Record<string, { key: string; factor: number }> = {
  'idempotency.ttlHours': { key: 'ttlMs', factor: 3_600_000 },
};

/** Keys whose values are secrets: an error names their length, never their value (it goes to the log). */
const SECRET_KEYS = new Set(['connector.webhookSecret', 'metrics.token', 's3.accessKeyId', 's3.secretAccessKey']);
/** Keys whose values are URLs that may carry credentials (`user:password@`, `token@`): masked in an error. */
const URL_KEYS = new Set(['publicUrl', 'connector.url', 'nats.url', 's3.endpoint']);

export const DEFAULT_CONFIG_PATH = fileURLToPath(new URL('../../../config/default.json', import.meta.url));
export const DEMO_CLIENTS_PATH = fileURLToPath(new URL('../../../config/clients.demo.json', import.meta.url));

/** A fresh copy of the defaults (never a shared live instance). */
export function defaultConfig(): Config {
  return JSON.parse(readFileSync(DEFAULT_CONFIG_PATH, 'utf8')) as Config;
}

const validateConfig = typia.createValidate<Config>();

export function loadConfig(env: NodeJS.ProcessEnv = process.env, overrides: DeepPartial<Config> = {}): Readonly<Config> {
  let raw: Record<string, unknown> = defaultConfig() as unknown as Record<string, unknown>;
  if (env.CONFIG_FILE) {
    let file: unknown;
    try {
      file = JSON.parse(readFileSync(env.CONFIG_FILE, 'utf8'));
    } catch (err) {
      throw new ConfigError(`CONFIG_FILE ${env.CONFIG_FILE}: ${(err as Error).message}`);
    }
    raw = merge(raw, file, []);
  }
  for (const [name, { path, type }] of Object.entries(ENV)) {
    const value = env[name];
    if (value === undefined || value === '') continue;
    setPath(raw, path, parseEnv(name, value, type));
  }
  raw = merge(raw, overrides, []);

  const result = validateConfig(raw);
  if (!result.success) {
    const lines = result.errors.map((e) => {
      const key = e.path.replace(/^\$input\.?/, '') || '(root)';
      return `${key}: expected ${e.expected}, got ${shown(key, e.value)}`;
    });
    throw new ConfigError(`Invalid configuration:\n  ${lines.join('\n  ')}`);
  }
  const config = result.data;
  if ((config.s3.endpoint === null) !== (config.s3.bucket === null)) {
    throw new ConfigError('Invalid configuration:\n  s3.endpoint and s3.bucket (S3_ENDPOINT, S3_BUCKET) are set together');
  }
  if (config.connector.url !== null && config.connector.webhookSecret === null) {
    throw new ConfigError('Invalid configuration:\n  connector.webhookSecret (CONNECTOR_WEBHOOK_SECRET) is required when connector.url is set');
  }
  const badProxy = config.trustedProxies.find((entry) => parseCidr(entry) === null);
  if (badProxy !== undefined) {
    throw new ConfigError(`Invalid configuration:\n  trustedProxies (TRUSTED_PROXIES): not an IP address or CIDR: ${JSON.stringify(badProxy)}`);
  }
  if (config.limits.perIpAtProxy && config.trustedProxies.length === 0) {
    throw new ConfigError(
      "Invalid configuration:\n  limits.perIpAtProxy (PER_IP_AT_PROXY) is true but trustedProxies (TRUSTED_PROXIES) is empty: name the proxy's addresses, the only peers whose X-Forwarded-For is believed",
    );
  }
  if (config.nats.url !== null && config.clientsFile === null) {
    throw new ConfigError('Invalid configuration:\n  clientsFile (CLIENTS_FILE) is required outside the embedded default');
  }
  return deepFreeze(config);
}

/**
 * The gateway's own check beyond `loadConfig` (the uploader and the admin CLI load the same
 * configuration and call no one back): a real Connector (`connector.url`) calls back on
 * `publicUrl`, whose default is `http://<host>:<port>`; on a wildcard `host` (`0.0.0.0`, `::`,
 * the image's) that is no address the Connector can reach, and no webhook would ever land.
 */
export function checkGatewayConfig(config: Readonly<Config>): void {
  if (config.connector.url !== null && config.publicUrl === null && isWildcardHost(config.host)) {
    throw new ConfigError(
      `Invalid configuration:\n  publicUrl (PUBLIC_URL) is required when connector.url is set and host is ${config.host}: the Connector calls back on it, and http://${config.host.includes(':') ? `[${config.host}]` : config.host}:<port> is no address it can reach`,
    );
  }
}

/** An address that means "every interface" when bound, and no host when called. */
function isWildcardHost(host: string): boolean {
  return host === '0.0.0.0' || host === '::' || host === '[::]' || host === '::0' || host === '';
}

/** For the commands' entry points: a bad configuration is printed (naming the key) and exits 2. */
export function loadConfigOrExit(): Readonly<Config> {
  try {
    return loadConfig();
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`${err.message}\n`);
      process.exit(2);
    }
    throw err;
  }
}

export function resolvedWorkers(config: Config): number {
  return config.ingest.workers === 0 ? availableParallelism() : config.ingest.workers;
}

/** An IP address or CIDR (`203.0.113.0/24`, `::1`) as its parts; null for anything else, an IPv6 zone id (`fe80::1%eth0`) included. */
export function parseCidr(entry: string): { address: string; prefix: number; family: 4 | 6 } | null {
  const [address = '', bits, ...rest] = entry.split('/');
  const family = address.includes('%') ? 0 : isIP(address);
  // A prefix is decimal digits: `Number` reads '' and ' ' as 0 (any address), '0x8' as 8.
  if (family === 0 || rest.length || (bits !== undefined && !/^\d{1,3}$/.test(bits))) return null;
  const prefix = bits === undefined ? (family === 6 ? 128 : 32) : Number(bits);
  if (!Number.isInteger(prefix) || prefix < 0 || prefix > (family === 6 ? 128 : 32)) return null;
  return { address, prefix, family: family as 4 | 6 };
}

export type DeepPartial<T> = { [K in keyof T]?: T[K] extends object ? (T[K] extends unknown[] ? T[K] : DeepPartial<T[K]>) : T[K] };

function parseEnv(name: string, value: string, type: 'string' | 'int' | 'bool' | 'list'): unknown {
  switch (type) {
    case 'string':
      return value;
    case 'list':
      return value.split(',').map((s) => s.trim()).filter(Boolean);
    case 'bool':
      if (value === 'true' || value === '1') return true;
      if (value === 'false' || value === '0') return false;
      throw new ConfigError(`Invalid configuration:\n  ${name}: expected true or false, got ${JSON.stringify(value)}`);
    case 'int':
      if (!/^\d+$/.test(value)) {
        throw new ConfigError(`Invalid configuration:\n  ${name}: expected a whole number, got ${JSON.stringify(value)}`);
      }
      return Number(value);
  }
}

/** A bad value as an error shows it: secrets by their length only, URLs without credentials. */
function shown(key: string, value: unknown): string {
  if (typeof value === 'string' && SECRET_KEYS.has(key)) return `a string of ${value.length} characters (not shown)`;
  if (typeof value === 'string' && URL_KEYS.has(key)) return JSON.stringify(value.replace(/[^,/@]*@/g, '***@'));
  return JSON.stringify(value);
}

function setPath(target: Record<string, unknown>, path: string[], value: unknown): void {
  let node = target;
  for (const key of path.slice(0, -1)) node = node[key] as Record<string, unknown>;
  node[path[path.length - 1]!] = value;
}

/** Merges `patch` into `base`; a key `base` does not know is an error that names it. */
function merge(base: Record<string, unknown>, patch: unknown, at: string[]): Record<string, unknown> {
  if (patch === null || typeof patch !== 'object' || Array.isArray(patch)) {
    throw new ConfigError(`Invalid configuration:\n  ${at.join('.') || '(root)'}: expected an object`);
  }
  const out: Record<string, unknown> = { ...base };
  for (const [key, value] of Object.entries(patch)) {
    if (value === undefined) continue;
    const unit = IN_OTHER_UNITS[[...at, key].join('.')];
    if (unit && !(key in base)) {
      const name = [...at, key].join('.');
      if ((patch as Record<string, unknown>)[unit.key] !== undefined) {
        throw new ConfigError(`Invalid configuration:\n  ${name}: give it or ${[...at, unit.key].join('.')}, not both`);
      }
      if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0) {
        throw new ConfigError(`Invalid configuration:\n  ${name}: expected a number > 0, got ${JSON.stringify(value)}`);
      }
      out[unit.key] = Math.round(value * unit.factor);
      continue;
    }
    if (!(key in base)) {
      const name = [...at, key].join('.');
      const replacement = REPLACED[name];
      throw new ConfigError(`Invalid configuration:\n  ${name}: unknown key${replacement ? ` (replaced by ${replacement})` : ''}`);
    }
    const current = base[key];
    out[key] =
      current !== null && typeof current === 'object' && !Array.isArray(current)
        ? merge(current as Record<string, unknown>, value, [...at, key])
        : value;
  }
  return out;
}

function deepFreeze<T>(value: T): T {
  if (value !== null && typeof value === 'object') {
    for (const v of Object.values(value)) deepFreeze(v);
    Object.freeze(value);
  }
  return value;
}
