/**
 * The listing of a client's sessions in the session service (session/service.ts) on the
 * embedded stores: its index, the sessions of a version that had none (indexed once by
 * housekeeping), and summaries that are gone or deleted.
 */
import t from 'tap';
import type { Connector } from '../../src/connector/types.js';
import { SessionService } from '../../src/session/service.js';
import { newSession } from '../../src/session/state.js';
import { clientSessionKey, sessionKey } from '../../src/store/keys.js';
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
  await sessions.create(clientSessionKey(acme.id, gone), { upload_uuid: gone, created_at: '2026-01-01T12:00:00.000Z' });
  const first = await service.listSessions(acme, 1, null);
  t.same(ids(first), [current]);
  t.ok(first.next);
  const second = await service.listSessions(acme, 1, first.next);
  t.same(ids(second), [older], 'the gone one skipped, the page filled from the next');
  t.equal(second.next, null);
});
