/**
 * A delete's clean-up as durable work (session/clean-up.ts), on the embedded stores (real
 * files) with injected faults: recorded before the answer, retried until every step
 * succeeded, taken up again by another process after a stop, never run for a session
 * whose delete did not happen, and run again once its late pass is due.
 */
import t, { type Test } from 'tap';
import type { Connector } from '../../src/connector/types.js';
import { SessionService } from '../../src/session/service.js';
import { activeKey, cleanUpKey, idempotencyKey, objectKey, sessionKey, sessionObjectPrefix } from '../../src/store/keys.js';
import { StoreError, type ObjectStore, type PackageLedger, type SessionStore } from '../../src/store/ports.js';
import { embeddedStores } from '../support/embedded-stores.js';

const client = { id: 'acme', minDate: '2020-01-01' };
const noConnector: Connector = { start: async () => ({}), terminate: async () => {}, close: async () => {} };
const emfile = () => Object.assign(new Error('EMFILE: too many open files, open'), { code: 'EMFILE' });

/** `fail.n` calls of `fn` fail (EMFILE, as a full file table answers), then it works. */
function failing<A extends unknown[], R>(fn: (...args: A) => Promise<R>, fail: { n: number; calls: number }) {
  return async (...args: A): Promise<R> => {
    fail.calls++;
    if (fail.n > 0) {
      fail.n--;
      throw emfile();
    }
    return fn(...args);
  };
}

/** `target` with some methods replaced; the rest bound to it (its private fields need it as `this`). */
function patched<T extends object>(target: T, patch: Partial<T>): T {
  return new Proxy(target, {
    get: (obj, prop) => {
      if (prop in patch) return patch[prop as keyof T];
      const v = Reflect.get(obj, prop, obj) as unknown;
      return typeof v === 'function' ? v.bind(obj) : v;
    },
  });
}

/** `latePassMs`: 0 unless set (the late pass due at once: the tests of the first pass); `clock`: the wall clock unless set. */
async function rig(t: Test, opts: { latePassMs?: number; clock?: () => number } = {}) {
  const { sessions, ledger, queue, objects } = await embeddedStores(t, 'clean-up-');
  const faults = { deletePrefix: { n: 0, calls: 0 }, drop: { n: 0, calls: 0 }, createCleanUp: { n: 0, calls: 0 } };
  const faultyObjects = patched<ObjectStore>(objects, { deletePrefix: failing((prefix: string) => objects.deletePrefix(prefix), faults.deletePrefix) });
  const faultyLedger = patched<PackageLedger>(ledger, { drop: failing((uuid: string) => ledger.drop(uuid), faults.drop) });
  const createCleanUp = failing(async () => undefined, faults.createCleanUp);
  const faultySessions = patched<SessionStore>(sessions, {
    create: async <T>(key: string, value: T) => {
      if (key.startsWith('cleanup.')) await createCleanUp().catch((err: Error) => Promise.reject(new StoreError('STORE_UNAVAILABLE', err.message)));
      return sessions.create(key, value);
    },
  });
  const errors: string[] = [];
  const service = () => {
    const s = new SessionService({
      sessions: faultySessions,
      ledger: faultyLedger,
      queue,
      objects: faultyObjects,
      connector: noConnector,
      objectPrefix: 'up',
      inFlightLeaseMs: 60_000,
      callbackUrl: 'http://x/cb',
      ledgerLingerMs: 0,
      cleanUpBackoff: { firstMs: 1, maxMs: 4 },
      cleanUpLatePassMs: opts.latePassMs ?? 0,
      ...(opts.clock ? { clock: opts.clock } : {}),
      onBackgroundError: (err) => errors.push((err as Error).message),
    });
    t.teardown(() => s.close());
    return s;
  };

  /** A session with one recorded package: its object stored, its ledger entry written, an idempotency record. */
  const session = async (s: SessionService) => {
    const { upload_uuid: uuid } = await s.initialize(client);
    const id = await s.beginIngest(client, uuid);
    await s.recordIngest(client, uuid, { id, entity: 'stock', rows: 1, bytes: 10, object_bytes: 110 });
    await s.flushLedger();
    await objects.put(objectKey('up', { client_id: client.id, upload_uuid: uuid, entity: 'stock', package_id: id }), (async function* () {
      yield Buffer.from('{"rows":1}\n');
    })());
    await sessions.create(idempotencyKey(client.id, `key-of-${uuid}`), { state: 'done', upload_uuid: uuid, entity: 'stock', content_length: null, status: 200, body: {}, package_id: id, at: 0 });
    return uuid;
  };
  /** What of the session is still stored. */
  const left = async (uuid: string) => {
    const entries = [];
    for await (const e of ledger.list(uuid)) entries.push(e.package_id);
    return {
      objects: (await objects.list(sessionObjectPrefix('up', client.id, uuid))).length,
      ledger: entries.length,
      idempotency: (await sessions.get(idempotencyKey(client.id, `key-of-${uuid}`))) !== null,
      summary: (await sessions.get(sessionKey(uuid))) !== null,
      cleanUp: (await sessions.get(cleanUpKey(uuid))) !== null,
    };
  };
  const nothing = { objects: 0, ledger: 0, idempotency: false, summary: false, cleanUp: false };
  return { sessions, ledger, objects, faults, errors, service, session, left, nothing };
}

t.test('a delete whose clean-up fails (EMFILE) a few times: recorded before the answer, retried until everything is gone', async (t) => {
  const r = await rig(t);
  const s = r.service();
  const uuid = await r.session(s);
  const other = await (async () => {
    // Another session's idempotency record of the same client stays.
    await r.sessions.create(idempotencyKey(client.id, 'kept'), { state: 'done', upload_uuid: 'another', entity: 'stock', content_length: null, status: 200, body: {}, package_id: 'p', at: 0 });
    return idempotencyKey(client.id, 'kept');
  })();
  t.match(await r.left(uuid), { objects: 1, ledger: 1, idempotency: true, summary: true, cleanUp: false }, 'before');
  r.faults.deletePrefix.n = 3;
  r.faults.drop.n = 2;
  await s.delete(client, uuid);
  t.equal(await r.sessions.get(activeKey(client.id)), null, 'answered: the active pointer is gone');
  t.match((await r.sessions.get(cleanUpKey(uuid)))?.value, { client_id: client.id, upload_uuid: uuid }, 'the clean-up is recorded before the answer');
  await s.cleanUpsIdle();
  t.same(await r.left(uuid), r.nothing, 'objects, ledger, idempotency records, summary and the record itself: gone');
  t.equal(r.errors.length, 5, 'five rounds failed (three on the objects, two on the ledger), each reported, and the sixth did it');
  t.equal(r.faults.deletePrefix.calls, 6, 'every round runs every step again (each changes nothing once done)');
  t.equal(r.faults.drop.calls, 3);
  t.match(r.errors[0], /EMFILE/);
  t.ok(await r.sessions.get(other), "another session's idempotency record stays");
  t.same((await s.initialize(client)).previous_upload_uuid, undefined, 'the client starts afresh');
});

t.test('a clean-up not done when its process stops is taken up by the next one', async (t) => {
  const r = await rig(t);
  const first = r.service();
  const uuid = await r.session(first);
  r.faults.deletePrefix.n = Infinity;
  await first.delete(client, uuid);
  await first.close(); // the process stops while the object store still refuses
  t.match(await r.left(uuid), { objects: 1, summary: true, cleanUp: true }, 'the work is still recorded');
  r.faults.deletePrefix.n = 0;
  const next = r.service();
  t.equal(await next.resumeCleanUps(), 1, 'the next process finds one clean-up to do');
  await next.cleanUpsIdle();
  t.same(await r.left(uuid), r.nothing);
  t.equal(await next.resumeCleanUps(), 0, 'and nothing once it is done');
});

t.test('a delete that failed before it recorded its clean-up: its retry, or the next initialize, completes it', async (t) => {
  const r = await rig(t);
  const s = r.service();
  const uuid = await r.session(s);
  r.faults.createCleanUp.n = 1;
  await t.rejects(s.delete(client, uuid), { code: 'STORE_UNAVAILABLE' }, 'the store failed after the session was marked deleted');
  t.match(await r.left(uuid), { objects: 1, summary: true, cleanUp: false });
  t.ok(await r.sessions.get(activeKey(client.id)), 'the pointer still names it');
  await s.delete(client, uuid);
  await s.cleanUpsIdle();
  t.same(await r.left(uuid), r.nothing, 'the retried delete answers and cleans up');

  const second = await r.session(s);
  r.faults.createCleanUp.n = 1;
  await t.rejects(s.delete(client, second), { code: 'STORE_UNAVAILABLE' });
  const fresh = await s.initialize(client);
  t.not(fresh.upload_uuid, second, 'the client went on with a new session instead');
  await s.cleanUpsIdle();
  t.same(await r.left(second), r.nothing, 'the half-deleted session was cleaned up all the same');
});

t.test('a clean-up record of a session that was not deleted touches nothing', async (t) => {
  const r = await rig(t);
  const s = r.service();
  const uuid = await r.session(s);
  await r.sessions.create(cleanUpKey(uuid), { client_id: client.id, upload_uuid: uuid, since: 0 });
  t.equal(await s.resumeCleanUps(), 1);
  await s.cleanUpsIdle();
  t.same(await r.left(uuid), { objects: 1, ledger: 1, idempotency: true, summary: true, cleanUp: false }, 'only the stale record is gone');
});

t.test('what an uploader that began before the delete stores after the first pass: the late pass removes it, on any instance', async (t) => {
  let now = Date.parse('2026-11-27T12:00:00Z');
  const latePassMs = 15 * 60_000;
  const r = await rig(t, { latePassMs, clock: () => now });
  const s = r.service();
  const uuid = await r.session(s);
  await s.delete(client, uuid);
  await s.cleanUpsIdle();
  t.match(await r.left(uuid), { objects: 0, ledger: 0, idempotency: false, summary: false, cleanUp: true }, 'the first pass removed everything but its record');
  t.match((await r.sessions.get(cleanUpKey(uuid)))?.value, { since: now, swept: now }, 'marked swept');

  // An uploader put a package before the delete and crashed before it read the session again:
  // its put lands now (the purge took its queue message: no redelivery), and a late ledger
  // write with it.
  const id = 'landed-late';
  await r.objects.put(objectKey('up', { client_id: client.id, upload_uuid: uuid, entity: 'stock', package_id: id }), (async function* () {
    yield Buffer.from('{"rows":1}\n');
  })());
  await r.ledger.append(uuid, [{ package_id: id, entity: 'stock', rows: 1, bytes: 10, object_bytes: 110 }]);
  t.equal(await s.resumeCleanUps(), 0, 'a housekeeping round before the late pass is due starts nothing');
  const other = r.service();
  t.equal(await other.resumeCleanUps(), 0, 'nor does another instance run the swept pass again');
  t.match(await r.left(uuid), { objects: 1, ledger: 1, cleanUp: true });

  now += latePassMs - 1;
  t.equal(await other.resumeCleanUps(), 0, 'not due one millisecond early');
  now += 1;
  t.equal(await other.resumeCleanUps(), 1, 'due: the next round on any instance starts the late pass');
  await other.cleanUpsIdle();
  t.same(await r.left(uuid), r.nothing, 'the late object and entry are gone, and the record with them');
  t.equal(await s.resumeCleanUps(), 0);
  t.same(r.errors, []);
});
