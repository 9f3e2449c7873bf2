/** The retry policy: what is retried, how long it waits (backoff, jitter, Retry-After), when it stops; and the pacer. */
import t from 'tap';
import { parseRetryAfter } from '../../src/client/client.js';
import { ApiError, ClientError, InputError } from '../../src/client/errors.js';
import { Pacer } from '../../src/client/pacer.js';
import { isRetryable, retryDelay, withRetry, type RetryInfo } from '../../src/client/retry.js';

async function rejection(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (err) {
    return err;
  }
  throw new Error('expected a rejection');
}

const api = (status: number, retryAfter: number | null = null) => new ApiError(status, { detail: `status ${status}` }, retryAfter);

t.test('retried: 408, 429, 502, 503, 504, a 409 with Retry-After, timeouts and network failures; nothing else', async (t) => {
  for (const status of [408, 429, 502, 503, 504]) t.ok(isRetryable(api(status)), `${status}`);
  t.ok(isRetryable(api(409, 1)), '409 with Retry-After: an Idempotency-Key still in progress');
  for (const status of [400, 401, 403, 404, 409, 413, 415, 422, 500]) t.notOk(isRetryable(api(status)), `${status}`);
  t.ok(isRetryable(new ClientError('TIMEOUT', 'slow')));
  t.ok(isRetryable(new ClientError('NETWORK', 'reset')));
  t.notOk(isRetryable(new ClientError('INVALID_RESPONSE', 'html')));
  t.notOk(isRetryable(new ClientError('ABORTED', 'stop')));
  t.notOk(isRetryable(new InputError('bad file')));
  t.notOk(isRetryable(Object.assign(new Error('x'), { code: 'ECONNRESET' })), 'only ClientErrors');
});

t.test('backoff: exponential ceiling, full jitter, capped', async (t) => {
  const policy = { baseDelayMs: 100, maxDelayMs: 1000 };
  const err = new ClientError('NETWORK', 'x');
  t.same(
    [1, 2, 3, 4, 5, 6].map((n) => retryDelay(n, err, { ...policy, random: () => 0.999999 })),
    [99, 199, 399, 799, 999, 999],
  );
  t.same(
    [1, 2, 3].map((n) => retryDelay(n, err, { ...policy, random: () => 0 })),
    [0, 0, 0],
  );
  t.equal(retryDelay(60, err, { random: () => 0.5 }), 10_000, 'large retry numbers do not overflow (default max 20 s)');
});

t.test('Retry-After is honoured: at least the asked seconds plus a little jitter; too long ends the retries', async (t) => {
  t.equal(retryDelay(1, api(503, 2), { random: () => 0 }), 2000);
  t.equal(retryDelay(1, api(503, 2), { random: () => 0.5 }), 2125, 'jitter under 250 ms on top');
  t.equal(retryDelay(8, api(503, 1), { baseDelayMs: 1000, maxDelayMs: 60_000, random: () => 0.5 }), 30_000, 'a longer backoff wins');
  t.equal(retryDelay(1, api(503, 121)), null, 'past maxRetryAfterMs (120 s): stop');
  t.equal(retryDelay(1, api(503, 300), { maxRetryAfterMs: 600_000, random: () => 0 }), 300_000);
});

t.test('withRetry: retries what is retryable, stops on what is not, throws the last error', async (t) => {
  const seen: RetryInfo[] = [];
  let calls = 0;
  const value = await withRetry(
    async (n) => {
      t.equal(n, calls++, 'attempt numbers count from 0');
      if (n < 2) throw n === 0 ? api(503, 0) : new ClientError('TIMEOUT', 'slow');
      return 'ok';
    },
    { baseDelayMs: 1, onRetry: (info) => seen.push(info) },
  );
  t.equal(value, 'ok');
  t.same(
    seen.map((s) => [s.retry, s.error.code]),
    [
      [1, 'API_ERROR'],
      [2, 'TIMEOUT'],
    ],
  );

  calls = 0;
  t.match(
    await rejection(
      withRetry(async () => {
        calls++;
        throw api(422);
      }),
    ),
    { status: 422 },
  );
  t.equal(calls, 1, 'a 422 is not retried');

  calls = 0;
  t.match(
    await rejection(
      withRetry(
        async () => {
          calls++;
          throw api(502);
        },
        { retries: 3, baseDelayMs: 1 },
      ),
    ),
    { status: 502 },
  );
  t.equal(calls, 4, 'the first attempt and 3 retries');

  const controller = new AbortController();
  const ended = rejection(
    withRetry(
      async () => {
        throw api(503, 60);
      },
      // Aborted as the 60 s wait begins.
      { signal: controller.signal, onRetry: () => controller.abort() },
    ),
  );
  // Nothing but the abort can end a 60 s wait before the event loop's next turn.
  const first = await Promise.race([ended, new Promise((resolve) => setImmediate(resolve, 'still waiting'))]);
  t.match(first, { status: 503 }, 'an abort ends the wait at once, with the error that caused it');
});

t.test('Retry-After parsing: delta-seconds or an HTTP date', async (t) => {
  const now = Date.parse('2026-01-01T00:00:00Z');
  t.equal(parseRetryAfter('3', now), 3);
  t.equal(parseRetryAfter([' 7 '], now), 7);
  t.equal(parseRetryAfter('Thu, 01 Jan 2026 00:00:02 GMT', now), 2);
  t.equal(parseRetryAfter('Wed, 31 Dec 2025 00:00:00 GMT', now), 0, 'a date in the past: no wait');
  t.equal(parseRetryAfter('soon', now), null);
  t.equal(parseRetryAfter(undefined, now), null);
});

t.test('Pacer: a burst, then the rate; reservations in call order', async (t) => {
  const clock = { now: 0 };
  const pacer = new Pacer(10, 3, () => clock.now);
  t.same(
    [1, 2, 3, 4, 5].map(() => pacer.reserve()),
    [0, 0, 0, 100, 200],
    'three at once, then one per 100 ms',
  );
  clock.now = 1000;
  t.same(
    [1, 2, 3, 4].map(() => pacer.reserve()),
    [0, 0, 0, 100],
    'a rest refills the burst, no more',
  );
  const off = new Pacer(0);
  t.same(
    [1, 2, 3].map(() => off.reserve()),
    [0, 0, 0],
    '0: no pacing',
  );
});
