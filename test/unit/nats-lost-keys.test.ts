/**
 * The lost-keys guard (store/nats/lost-keys.ts) in front of a session store whose reads find
 * nothing: a decision's read asks the stream every time; an answer's read reuses an absence
 * the check found for `ABSENT_REUSE_MS` (on a clock the test drives), and concurrent answers
 * share one check. A key the stream counts but cannot give back is lost, never remembered.
 */
import t from 'tap';
import type { NatsContext } from '../../src/store/nats/connection.js';
import { ABSENT_REUSE_MS, LostKeysGuard } from '../../src/store/nats/lost-keys.js';
import type { SessionStore } from '../../src/store/ports.js';

function guarded(counted: Record<string, number> = {}) {
  let now = 0;
  const asked: string[] = [];
  const nothing = async () => null;
  const confirmed: string[] = [];
  const inner = { get: nothing, getRecent: nothing, getConfirmed: async (key: string) => (confirmed.push(key), null) } as unknown as SessionStore;
  const ctx = {
    requestTimeoutMs: 1000,
    nc: { isClosed: () => false },
    jsm: {
      streams: {
        info: async (_stream: string, opts: { subjects_filter: string }) => {
          asked.push(opts.subjects_filter);
          const n = counted[opts.subjects_filter] ?? 0;
          return { state: { messages: 5, last_seq: 5, subjects: n > 0 ? { [opts.subjects_filter]: n } : {} } };
        },
        getMessage: async () => {
          throw Object.assign(new Error('no message found'), { api_error: { err_code: 10037, code: 404, description: 'no message found' } });
        },
      },
    },
  } as unknown as NatsContext;
  const guard = new LostKeysGuard(inner, ctx, 'sessions', () => now);
  return { guard, asked, confirmed, advance: (ms: number) => (now += ms) };
}

t.test('an answer reuses the absence the check found, for ABSENT_REUSE_MS', async (t) => {
  const { guard, asked, advance } = guarded();
  t.equal(await guard.getRecent('counts.a'), null);
  t.equal(asked.length, 1, 'the first read that finds nothing asks the stream');
  advance(ABSENT_REUSE_MS);
  t.equal(await guard.getRecent('counts.a'), null);
  t.equal(asked.length, 1, 'within ABSENT_REUSE_MS the absence serves');
  t.equal(await guard.getRecent('counts.b'), null);
  t.equal(asked.length, 2, 'another key is checked on its own');
  advance(1);
  t.equal(await guard.getRecent('counts.a'), null);
  t.equal(asked.length, 3, 'past it the stream is asked again');
});

t.test('concurrent answers share one check', async (t) => {
  const { guard, asked } = guarded();
  t.same(await Promise.all([guard.getRecent('k'), guard.getRecent('k'), guard.getRecent('k')]), [null, null, null]);
  t.equal(asked.length, 1);
});

t.test("a decision's read asks the stream every time", async (t) => {
  const { guard, asked } = guarded();
  await guard.getRecent('k');
  t.equal(await guard.get('k'), null);
  t.equal(await guard.get('k'), null);
  t.equal(asked.length, 3);
});

t.test('a key the stream counts but cannot give back is lost, and stays checked', async (t) => {
  const { guard, asked } = guarded({ '$KV.sessions.k': 1 });
  await t.rejects(guard.getRecent('k'), { code: 'STORE_UNAVAILABLE' });
  await t.rejects(guard.getRecent('k'), { code: 'STORE_UNAVAILABLE' });
  t.equal(asked.length, 2, 'a lost key is never remembered as absent');
});

t.test("a confirmed read is checked as a decision's first: a lost key is STORE_UNAVAILABLE at once, an absent one confirmed", async (t) => {
  const lost = guarded({ '$KV.sessions.k': 1 });
  await t.rejects(lost.guard.getConfirmed('k'), { code: 'STORE_UNAVAILABLE' });
  t.same(lost.confirmed, [], 'no compare-and-set tried on a key whose message is lost');
  const absent = guarded();
  t.equal(await absent.guard.getConfirmed('k'), null);
  t.same(absent.confirmed, ['k'], 'absent: confirmed by the store');
});
