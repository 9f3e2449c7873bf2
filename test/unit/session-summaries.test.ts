/**
 * The per-session write queue of the summaries (session/summaries.ts) when the store fails: a
 * write that ran out of its retry budget takes the decisions queued behind it down with it,
 * rather than each waiting a budget of its own; the next decision, once the store is back,
 * is written.
 */
import t from 'tap';
import { Summaries } from '../../src/session/summaries.js';
import { newSession, type SessionRecord } from '../../src/session/state.js';
import { sessionKey } from '../../src/store/keys.js';
import { StoreError, type SessionStore } from '../../src/store/ports.js';
import { embeddedStores } from '../support/embedded-stores.js';

const uuid = '11111111-1111-4111-8111-111111111111';
const acme = { id: 'acme', minDate: '2020-01-01' };

t.test('a write that ran out of its budget fails the decisions that waited behind it; the next one is written', async (t) => {
  const { sessions } = await embeddedStores(t, 'summaries-');
  await sessions.create(sessionKey(uuid), newSession(uuid, acme.id, Date.parse('2026-01-01T00:00:00Z')));
  let updates = 0;
  let fail: ((err: unknown) => void) | null = null;
  // The store as NATS cut off shows it: the first update hangs, then fails as unavailable.
  const flaky = new Proxy(sessions, {
    get(target, prop) {
      if (prop !== 'update') {
        const v = Reflect.get(target, prop, target);
        return typeof v === 'function' ? v.bind(target) : v; // its private fields are the store's own
      }
      return (...args: Parameters<SessionStore['update']>) => {
        updates++;
        if (updates > 1) return target.update(...args);
        return new Promise((_resolve, reject) => (fail = reject));
      };
    },
  }) as SessionStore;
  const summaries = new Summaries({ sessions: flaky });
  const named = (name: string) => (r: SessionRecord) => ({ ok: true as const, next: { ...r, updated_at: name } });

  const first = summaries.mutate(acme, uuid, 'any', named('first'));
  await t.resolveMatch(waitFor(() => fail !== null), true, 'the first write is out');
  const behind = [summaries.mutate(acme, uuid, 'any', named('second')), summaries.mutate(acme, uuid, 'any', named('third'))];
  fail!(new StoreError('STORE_UNAVAILABLE', 'NATS JetStream is unavailable: TIMEOUT'));
  for (const p of [first, ...behind]) await t.rejects(p, { code: 'STORE_UNAVAILABLE' });
  t.equal(updates, 1, 'those that waited were not written: they failed with the write before them');

  const later = await summaries.mutate(acme, uuid, 'any', named('later'));
  t.equal(later.updated_at, 'later', 'a decision after the failure is written');
  t.equal(updates, 2);
  t.equal((await sessions.get<SessionRecord>(sessionKey(uuid)))?.value.updated_at, 'later');
});

/** Resolves with true once `cond` holds, checking after each turn of the event loop. */
async function waitFor(cond: () => boolean): Promise<boolean> {
  while (!cond()) await new Promise((r) => setImmediate(r));
  return true;
}
