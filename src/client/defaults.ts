/**
 * Every default of the client library and the `ingest` command line, in one place. The
 * service's own defaults live in `config/default.json`; the client cannot read that file
 * (it runs elsewhere), so where a client default follows a service default, the comment
 * names the key.
 */

/** `IngestClient` options. */
export const CLIENT_DEFAULTS = {
  /** Deadline of every call except ingest. */
  timeoutMs: 30_000,
  /** Deadline of one ingest call: the service's `limits.requestTimeoutMs`. */
  ingestTimeoutMs: 600_000,
  /** TCP connect timeout (never more than the call's deadline). */
  connectTimeoutMs: 10_000,
  /** Sockets of the pool; well below the service's `limits.concurrentPerClient` (30). */
  connections: 8,
  /** Requests started per second; below the service's `limits.requestsPerSecond` (30). */
  requestsPerSecond: 20,
} as const;

/** `RetryPolicy` (`withRetry`, `retryDelay`). */
export const RETRY_DEFAULTS = {
  /** Attempts after the first. */
  retries: 6,
  /** Backoff of the first retry, doubled on each next one. */
  baseDelayMs: 500,
  /** Largest backoff, before any `Retry-After`. */
  maxDelayMs: 20_000,
  /** A `Retry-After` longer than this is not waited for. */
  maxRetryAfterMs: 120_000,
} as const;

/** The `ingest` command line. */
export const CLI_DEFAULTS = {
  /** `--timeout`, seconds. */
  timeoutSeconds: CLIENT_DEFAULTS.timeoutMs / 1000,
  /** `--wait-timeout`, seconds. */
  waitTimeoutSeconds: 3600,
  /** `push --package-size`. */
  packageSize: '8MiB',
  /** `push --parallel`. */
  parallel: 2,
  /** `push --rate`. */
  rate: CLIENT_DEFAULTS.requestsPerSecond,
  /** `push --retries`. */
  retries: RETRY_DEFAULTS.retries,
  /** Retries of the single calls (status polls, start, terminate, delete). */
  callRetries: 4,
  /** `status --watch --interval`, seconds. */
  watchIntervalSeconds: 2,
  /** `--interval` of `start --wait` and `terminate --wait`, seconds. */
  waitIntervalSeconds: 1,
} as const;
