/**
 * The per-session write queue of the summaries (session/summaries.ts) when the store fails: a
 * write that ran out of its retry budget takes the decisions queued behind it down with it,
 * rather than each waiting a budget of its own; the next decision, once the store is back,
 * is written.
 */
import t from 'tap';
import { STORAGE_RETRY_AFTER_SECONDS } from '../../src/errors.js';
import { Summaries } from '../../src/session/summaries.js';
import { newSession, type SessionRecord } from '../../src/session/state.js';
import { sessionKey } from '../../src/store/keys.js';
import { StoreConflictError, StoreError, type SessionStore } from '../../src/store/ports.js';
import { embeddedStores } from '../support/embedded-stores.js';

const uuid = '11111111-1111-4111-8111-111111111111';
const acme = { id: 'acme', minDate: '2020-01-01' };

t.test('a write that ran out of its budget fails the decisions that waited behind it; the next one is written', async (t) => {
  const { sessions } = await embeddedStores(t, 'summaries-');
  await sessions.create(sessionKey(uuid), newSession(uuid, acme.id, Date.parse('2026-01-01T00:00:00Z')));
  let updates = 0;
  let fail: ((err: unknown) => void) | null = null;
  // The store as NATS cut off shows it: the first update hangs, then fails as unavailable.
  const flaky = withUpdate(sessions, (...args) => {
    updates++;
    if (updates > 1) return sessions.update(...args);
    return new Promise((_resolve, reject) => (fail = reject));
  });
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

/** The store as seen by an instance that loses its first `losses` updates to another instance's writes (each one lands first). */
function losing(sessions: SessionStore, losses: number): { store: SessionStore; updates: () => number } {
  let updates = 0;
  const store = withUpdate(sessions, async (...args) => {
    if (++updates > losses) return sessions.update(...args);
    const [key] = args;
    const current = await sessions.get<SessionRecord>(key);
    await sessions.update(key, { ...current!.value, updated_at: `other ${updates}` }, current!.revision);
    throw new StoreConflictError(key);
  });
  return { store, updates: () => updates };
}

/** `sessions` with its `update` replaced; everything else is the store's own (bound: its private fields). */
function withUpdate(sessions: SessionStore, update: (...args: Parameters<SessionStore['update']>) => Promise<number>): SessionStore {
  return new Proxy(sessions, {
    get(target, prop) {
      if (prop === 'update') return update;
      const v = Reflect.get(target, prop, target);
      return typeof v === 'function' ? v.bind(target) : v;
    },
  }) as SessionStore;
}

t.test('a write that loses to another instance more than 32 times in a row is decided again until it lands', async (t) => {
  const { sessions } = await embeddedStores(t, 'summaries-');
  await sessions.create(sessionKey(uuid), newSession(uuid, acme.id, Date.parse('2026-01-01T00:00:00Z')));
  const { store, updates } = losing(sessions, 40);
  const summaries = new Summaries({ sessions: store });
  const written = await summaries.mutate(acme, uuid, 'any', (r) => ({ ok: true, next: { ...r, entities: [...r.entities, `after ${r.updated_at}`] } }));
  t.equal(updates(), 41, 'tried until the other instance let it in');
  t.same(written.entities, ['after other 40'], 'decided on what the other instance wrote last');
  t.same((await sessions.get<SessionRecord>(sessionKey(uuid)))?.value.entities, ['after other 40']);
});

t.test('a write that keeps losing past its budget is told 503 Storage temporarily unavailable with Retry-After, not 500', async (t) => {
  const { sessions } = await embeddedStores(t, 'summaries-');
  await sessions.create(sessionKey(uuid), newSession(uuid, acme.id, Date.parse('2026-01-01T00:00:00Z')));
  const { store, updates } = losing(sessions, Infinity);
  const summaries = new Summaries({ sessions: store, conflictBudgetMs: 1 });
  const refused = await summaries.mutate(acme, uuid, 'any', (r) => ({ ok: true, next: { ...r, updated_at: 'mine' } })).then(
    () => null,
    (err: unknown) => err,
  );
  t.match(refused, { code: 'STORAGE_UNAVAILABLE', statusCode: 503, headers: { 'Retry-After': String(STORAGE_RETRY_AFTER_SECONDS) } });
  t.equal(updates(), 32, 'at least 32 attempts, however short the budget');
  t.not((await sessions.get<SessionRecord>(sessionKey(uuid)))?.value.updated_at, 'mine', 'nothing of it written');
});

t.test('two processes on one summary: a lost write is told to the others; told, a writer reads before it writes instead of writing from its cache', async (t) => {
  const { sessions } = await embeddedStores(t, 'summaries-');
  const key = sessionKey(uuid);
  await sessions.create(key, newSession(uuid, acme.id, Date.parse('2026-01-01T00:00:00Z')));
  const told: string[] = [];
  let contended = false;
  let reads = 0;
  const { store } = losing(sessions, 1);
  const hinted = new Proxy(store, {
    get(target, prop) {
      if (prop === 'lostWrite') return (k: string) => told.push(k);
      if (prop === 'contended') return (k: string) => k === key && contended;
      if (prop === 'get') return (k: string) => (reads++, target.get(k));
      return Reflect.get(target, prop, target);
    },
  }) as SessionStore;
  const summaries = new Summaries({ sessions: hinted });
  const named = (name: string) => (r: SessionRecord) => ({ ok: true as const, next: { ...r, updated_at: name } });
  await summaries.mutate(acme, uuid, 'any', named('first'));
  t.same(told, [key], 'its lost compare-and-set told');
  reads = 0;
  await summaries.mutate(acme, uuid, 'any', named('second'));
  t.equal(reads, 0, 'not told: written from the cache');
  contended = true;
  await summaries.mutate(acme, uuid, 'any', named('third'));
  t.equal(reads, 1, 'told: read first');
  t.equal((await sessions.get<SessionRecord>(key))?.value.updated_at, 'third');
  t.same(told, [key], 'a write that landed tells nobody');
});

/** Resolves with true once `cond` holds, checking after each turn of the event loop. */
async function waitFor(cond: () => boolean): Promise<boolean> {
  while (!cond()) await new Promise((r) => setImmediate(r));
  return true;
}
