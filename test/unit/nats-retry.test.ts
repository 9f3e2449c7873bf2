/** withRetry (store/nats/connection.ts): which NATS failures are asked again, and what a spent budget reports. */
import t from 'tap';
import { isServiceError } from '../../src/errors.js';
import { JS_DUPLICATE_IN_PROCESS, withRetry, type NatsContext } from '../../src/store/nats/connection.js';
import { StoreError } from '../../src/store/ports.js';

const ctx = { nc: { isClosed: () => false }, requestTimeoutMs: 1_000 } as unknown as NatsContext;
/** A NatsError as nats.js rejects a JetStream API answer with. */
const jsError = (code: number, errCode: number, description: string) =>
  Object.assign(new Error(description), { code: String(code), api_error: { code, err_code: errCode, description } });

t.test('"duplicate message id is in process" is asked again, and the re-send gets its acknowledgement', async (t) => {
  let calls = 0;
  const ack = await withRetry(ctx, 5_000, async () => {
    calls++;
    if (calls < 3) throw jsError(409, JS_DUPLICATE_IN_PROCESS, 'duplicate message id is in process');
    return { seq: 7, duplicate: true };
  });
  t.same(ack, { seq: 7, duplicate: true });
  t.equal(calls, 3);
});

t.test('still in process when the budget is spent: storage unavailable (503), never an internal error', async (t) => {
  const err = await withRetry(ctx, 150, async () => {
    throw jsError(409, JS_DUPLICATE_IN_PROCESS, 'duplicate message id is in process');
  }).catch((e: unknown) => e);
  t.ok(err instanceof StoreError && err.code === 'STORE_UNAVAILABLE', `STORE_UNAVAILABLE (got ${String(err)})`);
  t.notOk(isServiceError(err));
});

t.test('a lost compare-and-set is not asked again: it comes back as it came', async (t) => {
  let calls = 0;
  const lost = jsError(400, 10071, 'wrong last sequence: 5');
  const err = await withRetry(ctx, 5_000, async () => {
    calls++;
    throw lost;
  }).catch((e: unknown) => e);
  t.equal(err, lost);
  t.equal(calls, 1);
});

t.test('JetStream out of storage is not asked again: STORE_UNAVAILABLE (503) at once, not after the whole budget', async (t) => {
  for (const [code, errCode, description] of [
    [503, 10047, 'insufficient storage resources available'],
    [503, 10023, 'insufficient resources'],
    [400, 10002, 'resource limits exceeded for account'],
    [500, 10077, 'jetstream store failed'],
  ] as const) {
    let calls = 0;
    const err = await withRetry(ctx, 5_000, async () => {
      calls++;
      throw jsError(code, errCode, description);
    }).catch((e: unknown) => e);
    t.ok(err instanceof StoreError && err.code === 'STORE_UNAVAILABLE', `${errCode}: STORE_UNAVAILABLE (got ${String(err)})`);
    t.equal(calls, 1, `${errCode}: one attempt`);
  }
});

t.test('a 503 that is not about storage (a leader election, no responders) is still asked again', async (t) => {
  let calls = 0;
  const got = await withRetry(ctx, 5_000, async () => {
    if (++calls < 3) throw jsError(503, 10008, 'JetStream system temporarily unavailable');
    return 'ok';
  });
  t.equal(got, 'ok');
  t.equal(calls, 3);
});
