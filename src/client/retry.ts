/**
 * The retry policy: which failures are worth another attempt, and how long to wait.
 *
 * Retried: 408, 429, 502, 503 and 504 answers, timeouts and network failures, and a 409 that
 * carries `Retry-After` (the service's "a request with this Idempotency-Key is in progress";
 * its other 409s are about the session and carry none). Nothing else: a 4xx is the caller's
 * to fix, a 500 may be a Connector error that a repeat would not cure.
 * The wait is exponential backoff with full jitter (AWS architecture blog, "Exponential
 * Backoff And Jitter"); when the service sent `Retry-After`, the wait is at least that, plus
 * a little jitter so that parallel callers do not all come back in the same millisecond.
 * A `Retry-After` longer than `maxRetryAfterMs` ends the retries instead of being cut short.
 *
 * An ingest retried through `withRetry` must send the same `Idempotency-Key` on every
 * attempt (`IngestClient.ingestWithRetry` does): an attempt that timed out may have been
 * stored, and only the key lets the service answer the repeat without storing it twice.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { RETRY_DEFAULTS } from './defaults.js';
import { isClientError, type ClientError } from './errors.js';

export interface RetryPolicy {
  /** Attempts after the first (default 6). */
  retries?: number;
  /** Backoff of the first retry, doubled on each next one (default 500 ms). */
  baseDelayMs?: number;
  /** Largest backoff, before any `Retry-After` (default 20 s). */
  maxDelayMs?: number;
  /** A `Retry-After` longer than this is not waited for: the error is thrown (default 120 s). */
  maxRetryAfterMs?: number;
  /** Source of jitter in [0, 1) (default Math.random; tests pass their own). */
  random?: () => number;
  /** Told before each wait. */
  onRetry?: (info: RetryInfo) => void;
  /** Ends the waits (the pending attempt is the caller's to abort with the same signal). */
  signal?: AbortSignal;
  /** Waits `ms`, rejecting when `signal` aborts (default a timer; tests pass their own, as with `random`). */
  sleep?: (ms: number, signal?: AbortSignal) => Promise<void>;
}

const timerSleep = (ms: number, signal?: AbortSignal): Promise<void> => sleep(ms, undefined, signal ? { signal } : undefined);

export interface RetryInfo {
  /** 1 for the first retry. */
  retry: number;
  delayMs: number;
  error: ClientError;
}

const RETRYABLE_STATUS = new Set([408, 429, 502, 503, 504]);
const RETRY_AFTER_JITTER_MS = 250;

export function isRetryable(err: unknown): err is ClientError {
  if (!isClientError(err)) return false;
  switch (err.code) {
    case 'TIMEOUT':
    case 'NETWORK':
      return true;
    case 'API_ERROR':
      return err.status !== null && (RETRYABLE_STATUS.has(err.status) || (err.status === 409 && err.retryAfter !== null));
    default:
      return false;
  }
}

/**
 * The wait before retry number `retry` (1-based) after `err`, or null when the policy says
 * stop (the service asked for a longer wait than `maxRetryAfterMs`).
 */
export function retryDelay(retry: number, err: ClientError, policy: RetryPolicy = {}): number | null {
  const base = policy.baseDelayMs ?? RETRY_DEFAULTS.baseDelayMs;
  const max = policy.maxDelayMs ?? RETRY_DEFAULTS.maxDelayMs;
  const random = policy.random ?? Math.random;
  const ceiling = Math.min(max, base * 2 ** Math.min(retry - 1, 30));
  const backoff = Math.floor(random() * ceiling);
  if (err.retryAfter === null) return backoff;
  const asked = err.retryAfter * 1000;
  if (asked > (policy.maxRetryAfterMs ?? RETRY_DEFAULTS.maxRetryAfterMs)) return null;
  return Math.max(asked + Math.floor(random() * RETRY_AFTER_JITTER_MS), backoff);
}

/**
 * Runs `attempt` until it resolves, fails with an error that is not retryable, or the
 * retries are spent; the last error is thrown. `attempt` gets the 0-based attempt number.
 */
export async function withRetry<T>(attempt: (n: number) => Promise<T>, policy: RetryPolicy = {}): Promise<T> {
  const retries = policy.retries ?? RETRY_DEFAULTS.retries;
  for (let n = 0; ; n++) {
    try {
      return await attempt(n);
    } catch (err) {
      if (n >= retries || !isRetryable(err) || policy.signal?.aborted) throw err;
      const delayMs = retryDelay(n + 1, err, policy);
      if (delayMs === null) throw err;
      policy.onRetry?.({ retry: n + 1, delayMs, error: err });
      try {
        await (policy.sleep ?? timerSleep)(delayMs, policy.signal);
      } catch {
        throw err; // aborted while waiting: the caller sees the failure that made it wait
      }
    }
  }
}
