/**
 * The NATS ledger's own count of stored packages (store/nats/stored-counts.ts): a marker and
 * its session's counts in one atomic batch, the counts of every session asked for meanwhile
 * in one batch; a package counted once however often it is delivered, by however many
 * uploaders; nothing for a session gone or deleted; an earlier version's session-store count
 * taken over. On a real nats-server (2.12+: atomic batches).
 */
import t, { type Test } from 'tap';
import { newSession } from '../../src/session/state.js';
import { storedCounter, StoredPackages, type StoredCounts } from '../../src/session/stored-counts.js';
import { sessionKey, storedCountKey } from '../../src/store/keys.js';
import { connectNats } from '../../src/store/nats/connection.js';
import { NatsLedger } from '../../src/store/nats/ledger.js';
import { NatsSessionStore } from '../../src/store/nats/session-store.js';
import { startNats } from '../../testbed/nats.js';

const server = await startNats(t);
let seq = 0;

const U = '11111111-1111-4111-8111-111111111111';
const V = '22222222-2222-4222-8222-222222222222';
const pkg = (uploadUuid: string, id: string, entity = 'products') => ({ upload_uuid: uploadUuid, package_id: id, entity });

/** A session store and a ledger on fresh buckets; `another()` opens a second instance on the same buckets (another uploader). */
async function setup(t: Test, sessionsAlive = [U, V]) {
  const names = { sessions: `sessions${++seq}`, ledger: `ledger${seq}` };
  const open = async () => {
    const h = await connectNats({ servers: server.url, name: 'stored-counts-test', requestTimeoutMs: 5000 });
    t.teardown(() => h.close());
    const sessions = await NatsSessionStore.open(h, { bucket: names.sessions, replicas: 1 });
    const ledger = await NatsLedger.open(h, { bucket: names.ledger, replicas: 1, sessions });
    return { sessions, ledger, stored: storedCounter({ sessions, ledger }) };
  };
  const first = await open();
  for (const u of sessionsAlive) await first.sessions.create(sessionKey(u), newSession(u, 'acme', Date.now()));
  return { ...first, another: open };
}

t.test('each package once, marker and count together; the counts of many sessions in few batches', async (t) => {
  const { ledger, stored } = await setup(t);
  t.notOk(stored instanceof StoredPackages, 'the NATS ledger counts its markers itself');
  const ids = Array.from({ length: 60 }, (_, i) => `q-${i}`);
  // Two sessions, 120 packages each counted twice at once: as concurrent deliveries would.
  await Promise.all([...ids, ...ids].flatMap((id) => [stored.count(pkg(U, id, 'stock')), stored.count(pkg(V, id))]));
  await stored.count(pkg(U, 'c-1', 'catalogs'));
  t.same(Object.fromEntries(await stored.perEntity(U)), { stock: 60, catalogs: 1 });
  t.same(Object.fromEntries(await stored.perEntity(V)), { products: 60 });
  t.equal(await ledger.isStored(U, 'q-7'), true, 'the marker is written with the count');
  const { batches } = ledger.counts!.stats;
  t.ok(batches > 0 && batches < 60, `grouped: ${batches} batches for 241 counts`);
  // Delivered again later (a redelivery): counted already.
  await stored.count(pkg(U, 'q-3', 'stock'));
  await stored.count(pkg(V, 'q-59'));
  t.same(Object.fromEntries(await stored.perEntity(U)), { stock: 60, catalogs: 1 });
  t.same(Object.fromEntries(await stored.perEntity(V)), { products: 60 });
  t.ok(ledger.counts!.stats.careful >= 2, 'the redeliveries went the careful way');
  await ledger.drop(U);
  t.same([...(await stored.perEntity(U))], [], 'dropped with the ledger');
  t.same(Object.fromEntries(await stored.perEntity(V)), { products: 60 }, 'the other session keeps its count');
});

t.test('a package marked before (a redelivery) in a batch with other sessions: the others counted, it not again', async (t) => {
  const { ledger, stored } = await setup(t);
  await stored.count(pkg(U, 'p-1'));
  await ledger.markStored(U, ['p-2']); // a marker without a count: a package counted already
  await Promise.all([stored.count(pkg(U, 'p-1')), stored.count(pkg(U, 'p-2')), stored.count(pkg(U, 'p-3')), stored.count(pkg(V, 'v-1'))]);
  t.same(Object.fromEntries(await stored.perEntity(U)), { products: 2 });
  t.same(Object.fromEntries(await stored.perEntity(V)), { products: 1 });
});

t.test('two uploaders counting one session: every package once, the lost compare-and-sets done again', async (t) => {
  const a = await setup(t);
  const b = await a.another();
  const ids = Array.from({ length: 40 }, (_, i) => `p-${i}`);
  await Promise.all(ids.flatMap((id, i) => [a.stored.count(pkg(U, id)), b.stored.count(pkg(U, i % 2 ? id : `b-${id}`))]));
  t.same(Object.fromEntries(await a.stored.perEntity(U)), { products: 60 });
  t.same(Object.fromEntries(await b.stored.perEntity(U)), { products: 60 });
});

t.test('nothing for a session gone or deleted', async (t) => {
  const { sessions, ledger, stored } = await setup(t, [U]);
  await stored.count(pkg(V, 'p-1'));
  t.equal(await ledger.isStored(V, 'p-1'), false, 'no marker for a session that never was');
  t.same([...(await stored.perEntity(V))], []);
  const summary = (await sessions.get(sessionKey(U)))!;
  await sessions.update(sessionKey(U), { ...newSession(U, 'acme', Date.now()), deleted: true }, summary.revision);
  await stored.count(pkg(U, 'p-2'));
  t.equal(await ledger.isStored(U, 'p-2'), false, 'no marker after the delete');
  t.same([...(await stored.perEntity(U))], []);
});

t.test("an earlier version's count in the session store: taken over, its packages in marking counted once and marked", async (t) => {
  const { sessions, ledger, stored } = await setup(t);
  await sessions.create<StoredCounts>(storedCountKey(U), { entities: { products: 3, stock: 2 }, marking: { 'p-9': 'products', 's-9': 'stock', 'c-9': 'catalogs' } });
  t.same(Object.fromEntries(await stored.perEntity(U)), { products: 4, stock: 3, catalogs: 1 }, 'read before any new count');
  // A package that was in marking is delivered again, with a new one.
  await Promise.all([stored.count(pkg(U, 'p-9')), stored.count(pkg(U, 'p-10'))]);
  t.same(Object.fromEntries(await stored.perEntity(U)), { products: 5, stock: 3, catalogs: 1 });
  t.equal(await ledger.isStored(U, 's-9'), true, 'marking packages got their markers');
  await stored.count(pkg(U, 's-9', 'stock'));
  t.same(Object.fromEntries(await stored.perEntity(U)), { products: 5, stock: 3, catalogs: 1 }, 'and are never counted again');
});
