/**
 * The listing of a client's sessions in the session service (session/service.ts) on the
 * embedded stores: its index, the sessions of a version that had none (indexed once by
 * housekeeping), index entries of a version that kept their creation time in the value
 * (written again by housekeeping), what a page reads, and summaries that are gone or deleted.
 */
import t from 'tap';
import type { Connector } from '../../src/connector/types.js';
import { SessionService } from '../../src/session/service.js';
import { newSession } from '../../src/session/state.js';
import { clientSessionKey, clientSessionsPrefix, legacyClientSessionKey, sessionKey } from '../../src/store/keys.js';
import type { SessionStore } from '../../src/store/ports.js';
import { embeddedStores } from '../support/embedded-stores.js';

const acme = { id: 'acme', minDate: '2020-01-01' };
const noConnector: Connector = { start: async () => ({}), terminate: async () => {}, close: async () => {} };

t.test('sessions of an earlier version are indexed once; gone and deleted summaries are not listed', async (t) => {
  const { sessions, ledger, queue, objects } = await embeddedStores(t, 'listing-');
  const service = new SessionService({ sessions, ledger, queue, objects, connector: noConnector, objectPrefix: 'p', inFlightLeaseMs: 15_000, callbackUrl: 'http://x' });
  const ids = (page: { sessions: { upload_uuid: string }[] }) => page.sessions.map((s) => s.upload_uuid);

  // Written as a version without the index wrote them: summaries only.
  const older = '11111111-1111-4111-8111-111111111111';
  const oldDeleted = '22222222-2222-4222-8222-222222222222';
  const theirs = '33333333-3333-4333-8333-333333333333';
  await sessions.create(sessionKey(older), { ...newSession(older, acme.id, Date.parse('2026-01-01T00:00:00Z')), status: 'DONE' });
  await sessions.create(sessionKey(oldDeleted), { ...newSession(oldDeleted, acme.id, Date.parse('2026-01-02T00:00:00Z')), deleted: true });
  await sessions.create(sessionKey(theirs), newSession(theirs, 'other', Date.parse('2026-01-03T00:00:00Z')));
  const current = (await service.initialize(acme)).upload_uuid;

  t.same(ids(await service.listSessions(acme, 50, null)), [current], 'before: only what this version indexed');
  t.equal(await service.indexEarlierSessions(), 2, 'the two live sessions of earlier versions');
  t.equal(await service.indexEarlierSessions(), 0, 'once');
  const page = await service.listSessions(acme, 50, null);
  t.same(ids(page), [current, older], 'newest first, the deleted one left out');
  t.same(page.sessions[1], { upload_uuid: older, session_status: 'DONE', created_at: '2026-01-01T00:00:00.000Z', totals: { packages: 0, rows: 0, bytes: 0, stored_packages: 0 } });
  t.same(ids(await service.listSessions({ id: 'other', minDate: '2020-01-01' }, 50, null)), [theirs]);

  // An index entry whose summary is gone (a clean-up half done) is skipped, also across pages.
  const gone = '44444444-4444-4444-8444-444444444444';
  await sessions.create(clientSessionKey(acme.id, gone, '2026-01-01T12:00:00.000Z'), { upload_uuid: gone, created_at: '2026-01-01T12:00:00.000Z' });
  const first = await service.listSessions(acme, 1, null);
  t.same(ids(first), [current]);
  t.ok(first.next);
  const second = await service.listSessions(acme, 1, first.next);
  t.same(ids(second), [older], 'the gone one skipped, the page filled from the next');
  t.equal(second.next, null);
});

/** `store`, counting the calls that read values of the client index (`sessions.` keys) and the listings. */
function counting(store: SessionStore) {
  const reads = { indexValues: 0, lists: 0, summaries: 0 };
  const sessions: SessionStore = new Proxy(store, {
    get(target, name, receiver) {
      const value = Reflect.get(target, name, receiver) as unknown;
      if (typeof value !== 'function') return value;
      return (...args: unknown[]) => {
        const key = String(args[0] ?? '');
        if (name === 'list') reads.lists++;
        if ((name === 'get' || name === 'getRecent') && key.startsWith('sessions.')) reads.indexValues++;
        if ((name === 'get' || name === 'getRecent') && key.startsWith('session.')) reads.summaries++;
        return (value as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  });
  return { sessions, reads };
}

const uuidOf = (i: number) => `${i.toString(16).padStart(8, '0')}-0000-4000-8000-000000000000`;

t.test('a page reads the names of the client index and the summaries of its own sessions, no index entry and no other session', async (t) => {
  const stores = await embeddedStores(t, 'listing-page-');
  const { sessions, reads } = counting(stores.sessions);
  const service = new SessionService({ ...stores, sessions, connector: noConnector, objectPrefix: 'p', inFlightLeaseMs: 15_000, callbackUrl: 'http://x' });
  const n = 300;
  for (let i = 0; i < n; i++) {
    const record = newSession(uuidOf(i), acme.id, Date.parse('2026-01-01T00:00:00Z') + i * 1000);
    await stores.sessions.create(sessionKey(uuidOf(i)), record);
    await stores.sessions.create(clientSessionKey(acme.id, uuidOf(i), record.created_at), { upload_uuid: uuidOf(i), created_at: record.created_at });
  }
  const seen: string[] = [];
  let page = await service.listSessions(acme, 25, null);
  for (;;) {
    seen.push(...page.sessions.map((s) => s.upload_uuid));
    if (!page.next) break;
    page = await service.listSessions(acme, 25, page.next);
  }
  t.same(seen, Array.from({ length: n }, (_, i) => uuidOf(n - 1 - i)), 'every session once, newest first, across 12 pages');
  t.equal(reads.indexValues, 0, 'no index entry read');
  t.equal(reads.lists, 0, 'no value listing');
  t.equal(reads.summaries, n, 'one summary read per session listed');
});

t.test("an earlier version's index entries are listed, then written again as ordered keys once; a clean-up removes either kind", async (t) => {
  const stores = await embeddedStores(t, 'listing-legacy-');
  const { sessions } = stores;
  const service = new SessionService({ ...stores, connector: noConnector, objectPrefix: 'p', inFlightLeaseMs: 15_000, callbackUrl: 'http://x' });
  const ids = (page: { sessions: { upload_uuid: string }[] }) => page.sessions.map((s) => s.upload_uuid);
  const legacy = [uuidOf(1), uuidOf(2)];
  for (const [i, u] of legacy.entries()) {
    const record = newSession(u, acme.id, Date.parse('2026-01-01T00:00:00Z') + i * 1000);
    await sessions.create(sessionKey(u), record);
    await sessions.create(legacyClientSessionKey(acme.id, u), { upload_uuid: u, created_at: record.created_at });
  }
  await sessions.create('listing.indexed', { at: '2026-01-01T00:00:00.000Z' }); // that version had indexed its predecessors'
  const current = (await service.initialize(acme)).upload_uuid;
  t.same(ids(await service.listSessions(acme, 50, null)), [current, legacy[1], legacy[0]], 'before: the old entries read, in order');
  t.equal(await service.indexEarlierSessions(), 2, 'written again');
  t.equal(await service.indexEarlierSessions(), 0, 'once');
  const keys: string[] = [];
  for await (const key of sessions.keys(clientSessionsPrefix(acme.id))) keys.push(key);
  t.notOk(keys.includes(legacyClientSessionKey(acme.id, legacy[0]!)), 'the old entry removed');
  t.equal(keys.length, 3);
  const first = await service.listSessions(acme, 2, null);
  t.same(ids(first), [current, legacy[1]]);
  t.same(ids(await service.listSessions(acme, 2, first.next)), [legacy[0]], 'paged by the keys alone');

  // A clean-up removes the ordered entry, and an old one an older gateway may still write.
  await sessions.create(legacyClientSessionKey(acme.id, current), { upload_uuid: current, created_at: new Date().toISOString() });
  await service.delete(acme, current);
  await service.cleanUpsIdle();
  const left: string[] = [];
  for await (const key of sessions.keys(clientSessionsPrefix(acme.id))) left.push(key);
  t.same(left.filter((k) => k.includes(current)), [], 'no entry of the deleted session');
  t.same(ids(await service.listSessions(acme, 50, null)), [legacy[1], legacy[0]]);
});
