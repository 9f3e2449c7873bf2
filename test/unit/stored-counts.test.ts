/**
 * The uploader's count of stored packages (session/stored-counts.ts): a package is counted
 * once however often it is delivered, whatever step a crash or a failure interrupted, and not
 * at all for a session that is gone. Both ways: `StoredPackages` (three steps on the session
 * store and the ledger, as on NATS servers without atomic batches; run here on the embedded
 * stores; the NATS ledger's own count: test/contract/nats-stored-counts.test.ts) and the embedded
 * ledger's own count (marker and count in one transaction), and the move of version 1's
 * counts into the latter.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { newSession } from '../../src/session/state.js';
import { openSqlite } from '../../src/store/embedded/sqlite.js';
import { StoredPackages, storedCounter, type StoredCounts } from '../../src/session/stored-counts.js';
import { SqliteLedger } from '../../src/store/embedded/ledger.js';
import { SqliteSessionStore } from '../../src/store/embedded/session-store.js';
import { sessionKey, storedCountKey } from '../../src/store/keys.js';
import type { PackageLedger } from '../../src/store/ports.js';

const U = '11111111-1111-4111-8111-111111111111';
const pkg = (id: string, entity = 'products') => ({ upload_uuid: U, package_id: id, entity });

/** `target[prop]`, a method bound to `target` (a proxy's pass-through). */
function bound(target: object, prop: string | symbol): unknown {
  const value: unknown = Reflect.get(target, prop);
  return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(target) : value;
}

/** One delivery counted by an instance of its own, its writes done. */
async function countOnce(deps: ConstructorParameters<typeof StoredPackages>[0], p: ReturnType<typeof pkg>): Promise<void> {
  const stored = new StoredPackages(deps);
  await stored.count(p);
  await stored.flush();
}

async function setup(t: Test) {
  const dir = await mkdtemp(join(tmpdir(), 'stored-counts-'));
  const sessions = await SqliteSessionStore.open(join(dir, 'state.sqlite'));
  const ledger = await SqliteLedger.open(join(dir, 'state.sqlite'));
  t.teardown(async () => {
    await sessions.close();
    await ledger.close();
    await rm(dir, { recursive: true, force: true });
  });
  await sessions.create(sessionKey(U), newSession(U, 'acme', Date.now()));
  const counts = async () => (await sessions.get<StoredCounts>(storedCountKey(U)))?.value ?? null;
  return { sessions, ledger, counts };
}

t.test('each package once: repeated, concurrent, several entities', async (t) => {
  const { sessions, ledger, counts } = await setup(t);
  const stored = new StoredPackages({ sessions, ledger });
  await stored.count(pkg('p-1'));
  await stored.count(pkg('p-1'));
  await Promise.all([stored.count(pkg('p-2')), stored.count(pkg('p-2')), stored.count(pkg('c-1', 'catalogs'))]);
  const ids = Array.from({ length: 40 }, (_, i) => `q-${i}`);
  await Promise.all(ids.map((id) => stored.count(pkg(id, 'stock'))));
  await Promise.all(ids.map((id) => countOnce({ sessions, ledger }, pkg(id, 'stock'))));
  await stored.flush();
  t.same(await counts(), { entities: { products: 2, catalogs: 1, stock: 40 }, marking: {} }, 'marking empties once every marker is durable');
  t.same([...(await stored.perEntity(U))], [['products', 2], ['catalogs', 1], ['stock', 40]]);
});

t.test('a delivery after a crash at any step counts the package once', async (t) => {
  const { sessions, ledger, counts } = await setup(t);
  // Crash after step 1: in marking, no marker.
  await sessions.create<StoredCounts>(storedCountKey(U), { entities: { products: 3 }, marking: { 'p-1': 'products' } });
  t.same([...(await new StoredPackages({ sessions, ledger }).perEntity(U))], [['products', 4]], 'already counted while marking');
  await countOnce({ sessions, ledger }, pkg('p-1'));
  t.same(await counts(), { entities: { products: 4 }, marking: {} });

  // Crash after step 2: in marking and marked.
  const cur = (await sessions.get<StoredCounts>(storedCountKey(U)))!;
  await sessions.update<StoredCounts>(storedCountKey(U), { entities: { products: 4 }, marking: { 'p-2': 'products' } }, cur.revision);
  await ledger.markStored(U, ['p-2']);
  await countOnce({ sessions, ledger }, pkg('p-2'));
  t.same(await counts(), { entities: { products: 5 }, marking: {} });

  // Crash after step 3 (before the ack): folded and marked, delivered again.
  await countOnce({ sessions, ledger }, pkg('p-2'));
  await countOnce({ sessions, ledger }, pkg('p-1'));
  t.same(await counts(), { entities: { products: 5 }, marking: {} });
});

t.test('a failed marker write rejects (the package is delivered again) and the retry counts it once', async (t) => {
  const { sessions, ledger, counts } = await setup(t);
  let fail = 1;
  const flaky: PackageLedger = Object.assign(Object.create(ledger) as PackageLedger, {
    markStored: async (u: string, ids: readonly string[]) => {
      if (fail-- > 0) throw Object.assign(new Error('EIO'), { code: 'EIO' });
      return ledger.markStored(u, ids);
    },
    isStored: (u: string, id: string) => ledger.isStored(u, id),
  });
  const stored = new StoredPackages({ sessions, ledger: flaky });
  await t.rejects(stored.count(pkg('p-1')), { code: 'EIO' });
  t.same(await counts(), { entities: {}, marking: { 'p-1': 'products' } }, 'counted, its marker not yet written');
  await stored.count(pkg('p-1'));
  await stored.flush();
  t.same(await counts(), { entities: { products: 1 }, marking: {} });
});

t.test('the record as this instance wrote it saves the reads; a write by another instance in between is read and kept', async (t) => {
  const { sessions, ledger, counts } = await setup(t);
  let reads = 0;
  const get = <T>(key: string) => {
    if (key === storedCountKey(U)) reads++;
    return sessions.get<T>(key);
  };
  const counted = new Proxy(sessions, {
    get: (target, prop) => (prop === 'get' ? get : bound(target, prop)),
  });
  const stored = new StoredPackages({ sessions: counted, ledger });
  await stored.count(pkg('p-1'));
  t.equal(reads, 1, 'the first count reads the record once (it is not there yet)');
  await stored.count(pkg('p-2'));
  await stored.count(pkg('p-3', 'stock'));
  t.equal(reads, 1, 'later counts start from the record as written');
  await countOnce({ sessions, ledger }, pkg('p-4'));
  await stored.count(pkg('p-5'));
  t.equal(reads, 2, "another instance's write: the compare-and-set from the remembered record lost, the record was read");
  await stored.count(pkg('p-4'));
  await stored.flush();
  t.same(await counts(), { entities: { products: 4, stock: 1 }, marking: {} }, 'each package once, the other instance\'s included');
});

t.test('counts that follow each other fold the earlier packages in their own write: one write per count, one more when they pause', async (t) => {
  const { sessions, ledger, counts } = await setup(t);
  const writes: StoredCounts[] = [];
  const update = <T>(key: string, value: T, revision: number) => {
    if (key === storedCountKey(U)) writes.push(value as StoredCounts);
    return sessions.update(key, value, revision);
  };
  const create = <T>(key: string, value: T) => {
    if (key === storedCountKey(U)) writes.push(value as StoredCounts);
    return sessions.create(key, value);
  };
  const counted = new Proxy(sessions, {
    get: (target, prop) =>
      prop === 'update' ? update : prop === 'create' ? create : bound(target, prop),
  });
  const stored = new StoredPackages({ sessions: counted, ledger });
  for (const id of ['p-1', 'p-2', 'p-3']) await stored.count(pkg(id));
  t.same(writes, [
    { entities: {}, marking: { 'p-1': 'products' } },
    { entities: { products: 1 }, marking: { 'p-2': 'products' } },
    { entities: { products: 2 }, marking: { 'p-3': 'products' } },
  ], 'each count moves the packages counted before it out of marking');
  t.same([...(await stored.perEntity(U))], [['products', 3]], 'a package in marking is counted');
  await stored.flush();
  t.equal(writes.length, 4, 'the pause: one write of its own');
  t.same(await counts(), { entities: { products: 3 }, marking: {} });
});

t.test('a session that is gone (or deleted) gets no count', async (t) => {
  const { sessions, ledger, counts } = await setup(t);
  const gone = '22222222-2222-4222-8222-222222222222';
  await countOnce({ sessions, ledger }, { upload_uuid: gone, package_id: 'p-1', entity: 'products' });
  t.equal(await sessions.get(storedCountKey(gone)), null);
  t.equal(await ledger.isStored(gone, 'p-1'), false);
  const summary = (await sessions.get(sessionKey(U)))!;
  await sessions.update(sessionKey(U), { ...newSession(U, 'acme', Date.now()), deleted: true }, summary.revision);
  await countOnce({ sessions, ledger }, pkg('p-1'));
  t.equal(await counts(), null);
});

t.test("the embedded ledger's own count: each package once, in the marker's transaction", async (t) => {
  const { sessions, ledger, counts } = await setup(t);
  const stored = storedCounter({ sessions, ledger });
  t.notOk(stored instanceof StoredPackages, 'the embedded ledger counts its markers itself');
  await stored.count(pkg('p-1'));
  await stored.count(pkg('p-1'));
  const ids = Array.from({ length: 40 }, (_, i) => `q-${i}`);
  await Promise.all([...ids, ...ids].map((id) => stored.count(pkg(id, 'stock'))));
  await Promise.all([stored.count(pkg('p-2')), stored.count(pkg('p-2')), stored.count(pkg('c-1', 'catalogs'))]);
  t.same(Object.fromEntries(await stored.perEntity(U)), { products: 2, stock: 40, catalogs: 1 });
  t.equal(await ledger.isStored(U, 'q-7'), true, 'the marker is written with the count');
  t.equal(await counts(), null, 'no session-store record');
  // A marker written without a count (markStored) is a package counted already.
  await ledger.markStored(U, ['p-3']);
  await stored.count(pkg('p-3'));
  t.same(Object.fromEntries(await stored.perEntity(U)), { products: 2, stock: 40, catalogs: 1 });
  await ledger.drop(U);
  t.same([...(await stored.perEntity(U))], [], 'dropped with the ledger');
});

t.test("the embedded ledger's own count: nothing for a session gone or deleted", async (t) => {
  const { sessions, ledger } = await setup(t);
  const stored = storedCounter({ sessions, ledger });
  const gone = '22222222-2222-4222-8222-222222222222';
  await stored.count({ upload_uuid: gone, package_id: 'p-1', entity: 'products' });
  t.equal(await ledger.isStored(gone, 'p-1'), false);
  t.same([...(await stored.perEntity(gone))], []);
  await stored.count(pkg('p-1'));
  const summary = (await sessions.get(sessionKey(U)))!;
  await sessions.update(sessionKey(U), { ...newSession(U, 'acme', Date.now()), deleted: true }, summary.revision);
  await stored.count(pkg('p-2'));
  t.equal(await ledger.isStored(U, 'p-2'), false, 'no marker after the delete');
  t.same(Object.fromEntries(await stored.perEntity(U)), { products: 1 }, 'the count before the delete stays until the clean-up drops it');
});

t.test('a database of version 1: its stored-count records become the ledger\'s counts, their packages in marking get markers', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'stored-counts-v1-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const path = join(dir, 'state.sqlite');
  const V = '33333333-3333-4333-8333-333333333333';
  {
    // What version 1 wrote: the session and its count as session-store records.
    const sessions = await SqliteSessionStore.open(path);
    await sessions.create(sessionKey(U), newSession(U, 'acme', Date.now()));
    await sessions.create(sessionKey(V), newSession(V, 'acme', Date.now()));
    await sessions.create<StoredCounts>(storedCountKey(U), { entities: { products: 3, stock: 2 }, marking: { 'p-9': 'products', 's-9': 'stock', 'c-9': 'catalogs' } });
    await sessions.create<StoredCounts>(storedCountKey(V), { entities: { products: 1 }, marking: {} });
    await sessions.close();
    const db = openSqlite(path);
    db.exec('DROP TABLE stored_count');
    db.pragma('user_version = 1');
    db.close();
  }
  const sessions = await SqliteSessionStore.open(path);
  const ledger = await SqliteLedger.open(path);
  t.teardown(async () => {
    await sessions.close();
    await ledger.close();
  });
  const stored = storedCounter({ sessions, ledger });
  t.same(Object.fromEntries(await stored.perEntity(U)), { products: 4, stock: 3, catalogs: 1 });
  t.same(Object.fromEntries(await stored.perEntity(V)), { products: 1 });
  t.equal(await sessions.get(storedCountKey(U)), null, 'the old records are gone');
  // A package that was in marking is delivered again: counted already.
  await stored.count(pkg('p-9'));
  await stored.count(pkg('p-10'));
  t.same(Object.fromEntries(await stored.perEntity(U)), { products: 5, stock: 3, catalogs: 1 });
});
