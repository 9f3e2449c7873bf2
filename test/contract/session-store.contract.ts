import type { Test } from 'tap';
import { STORE_CONFLICT, isStoreConflict, type SessionStore } from '../../src/store/ports.js';

/**
 * A fresh, empty store per call. `reopen` (optional) returns a new instance over the same
 * data, as a restarted process sees it (the old instance may still be open, as after a
 * crash). The suite closes every store it got, once, then calls `cleanup`.
 */
export type SessionStoreFactory = () => Promise<{
  store: SessionStore;
  reopen?: () => Promise<SessionStore>;
  cleanup: () => Promise<void>;
}>;

/** The `SessionStore` contract: CAS on revisions, exactly one winner, durable revisions. */
export function sessionStoreContract(t: Test, name: string, factory: SessionStoreFactory): void {
  const setup = async (t: Test) => {
    const f = await factory();
    const opened = new Set([f.store]);
    t.teardown(async () => {
      for (const s of opened) await s.close();
      await f.cleanup();
    });
    const reopen = f.reopen;
    return {
      store: f.store,
      /** Closes `store` and opens it again, as a restart does. */
      restart:
        reopen &&
        (async (store: SessionStore) => {
          opened.delete(store);
          await store.close();
          const s = await reopen();
          opened.add(s);
          return s;
        }),
    };
  };

  /** Callers match on `code`, so that is what the contract checks. */
  const CONFLICT = { code: STORE_CONFLICT };

  t.test(`${name}: create, get, conflict on existing key`, async (t) => {
    const { store } = await setup(t);
    t.equal(await store.get('missing'), null);
    const rev = await store.create('k', { a: 1 });
    t.ok(Number.isInteger(rev) && rev > 0, 'revision is a positive integer');
    t.same(await store.get('k'), { value: { a: 1 }, revision: rev });
    await t.rejects(store.create('k', { a: 2 }), CONFLICT);
    t.same(await store.get('k'), { value: { a: 1 }, revision: rev }, 'loser changed nothing');
  });

  t.test(`${name}: update is compare-and-set`, async (t) => {
    const { store } = await setup(t);
    const r1 = await store.create('k', 1);
    const r2 = await store.update('k', 2, r1);
    t.ok(r2 > r1, 'revision grows');
    await t.rejects(store.update('k', 3, r1), CONFLICT, 'stale revision');
    await t.rejects(store.update('absent', 3, r1), CONFLICT, 'no value to update');
    t.same(await store.get('k'), { value: 2, revision: r2 });
  });

  t.test(`${name}: delete, conditional delete, create again`, async (t) => {
    const { store } = await setup(t);
    const r1 = await store.create('k', 'one');
    const r2 = await store.update('k', 'two', r1);
    await t.rejects(store.delete('k', r1), CONFLICT, 'stale revision');
    t.same((await store.get('k'))?.value, 'two');
    await store.delete('k', r2);
    t.equal(await store.get('k'), null);
    await t.resolves(store.delete('k'), 'unconditional delete of an absent key');
    await t.rejects(store.update('k', 'x', r2), CONFLICT, 'no update of a deleted key');
    const r3 = await store.create('k', 'three');
    t.ok(r3 > r2, 'revisions keep growing after a delete');
    t.same(await store.get('k'), { value: 'three', revision: r3 });
    await store.delete('k');
    t.equal(await store.get('k'), null, 'unconditional delete');
  });

  t.test(`${name}: getConfirmed reads as get; what it leaves is never listed, and create and update afterwards stand`, async (t) => {
    const { store } = await setup(t);
    const r1 = await store.create('active.a', { v: 1 });
    const got = await store.getConfirmed<{ v: number }>('active.a');
    t.same(got?.value, { v: 1 });
    t.same(await store.get('active.a'), got, 'its revision is the current one');
    t.equal(await store.getConfirmed('active.b'), null, 'never written');
    t.equal(await store.getConfirmed('active.b'), null, 'and again');
    t.equal(await store.get('active.b'), null);
    const listed = [];
    for await (const l of store.list('active.')) listed.push(l.key);
    t.same(listed, ['active.a'], 'listed: the value only');
    await store.create('active.b', { v: 2 });
    t.same(await store.getConfirmed('active.b'), await store.get('active.b'), 'created afterwards');
    t.same((await store.get('active.b'))?.value, { v: 2 });
    if (got!.revision !== r1) await t.rejects(store.update('active.a', { v: 3 }, r1), CONFLICT, 'where it wrote a new revision, the one read before is stale');
    await store.update('active.a', { v: 3 }, got!.revision);
    t.same((await store.getConfirmed('active.a'))?.value, { v: 3 }, 'an update at the revision it answered stands');
  });

  t.test(`${name}: 20 concurrent creates, exactly one winner`, async (t) => {
    const { store } = await setup(t);
    const results = await Promise.allSettled(Array.from({ length: 20 }, (_, i) => store.create('race', { i })));
    const won = results.flatMap((r, i) => (r.status === 'fulfilled' ? [{ i, rev: r.value }] : []));
    t.equal(won.length, 1, 'one winner');
    t.ok(results.every((r) => r.status === 'fulfilled' || isStoreConflict(r.reason)), 'the rest STORE_CONFLICT');
    t.same(await store.get('race'), { value: { i: won[0]?.i }, revision: won[0]?.rev });
  });

  t.test(`${name}: concurrent updates of one revision, exactly one winner`, async (t) => {
    const { store } = await setup(t);
    const r1 = await store.create('k', 0);
    const results = await Promise.allSettled(Array.from({ length: 10 }, (_, i) => store.update('k', i, r1)));
    t.equal(results.filter((r) => r.status === 'fulfilled').length, 1);
    t.ok(results.every((r) => r.status === 'fulfilled' || isStoreConflict(r.reason)));
  });

  t.test(`${name}: keys`, async (t) => {
    const { store } = await setup(t);
    const ra = await store.create('Ab', 'upper');
    await store.create('ab', 'lower');
    t.same(await store.get('Ab'), { value: 'upper', revision: ra }, 'keys are case-sensitive');
    await store.create('x_y.z=w-1', 'punctuation');
    t.equal((await store.get('x_y.z=w-1'))?.value, 'punctuation');
    for (const bad of ['', 'a/b', 'a b', 'ä', '*']) {
      await t.rejects(store.create(bad, 1), { code: 'STORE_INVALID_KEY' }, `rejects ${JSON.stringify(bad)}`);
    }
  });

  t.test(`${name}: list(prefix) lists the keys holding a value under whole tokens`, async (t) => {
    const { store } = await setup(t);
    const list = async (prefix: string) => {
      const out: string[] = [];
      for await (const { key } of store.list(prefix)) out.push(key);
      return out.sort();
    };
    t.same(await list('idem.'), [], 'an empty store lists nothing');
    await store.create('idem.aa.k1', 1);
    const r2 = await store.create('idem.aa.k2', 2);
    await store.create('idem.ab.k3', 3);
    await store.create('idem.aab.k4', 4);
    await store.create('idem', 'no token after the prefix');
    await store.create('session.u1', 5);
    const gone = await store.create('idem.aa.gone', 6);
    await store.delete('idem.aa.gone', gone);
    t.same(await list('idem.aa.'), ['idem.aa.k1', 'idem.aa.k2'], 'whole tokens: idem.aab.* is not under idem.aa.; deleted keys are not listed');
    t.same(await list('idem.'), ['idem.aa.k1', 'idem.aa.k2', 'idem.aab.k4', 'idem.ab.k3']);
    t.same(await list(''), ['idem', 'idem.aa.k1', 'idem.aa.k2', 'idem.aab.k4', 'idem.ab.k3', 'session.u1'], "'' lists every key");
    await store.update('idem.aa.k2', 22, r2);
    t.same(await list('idem.aa.'), ['idem.aa.k1', 'idem.aa.k2'], 'an updated key once');
    await store.create('idem.aa.gone', 7);
    t.same(await list('idem.aa.'), ['idem.aa.gone', 'idem.aa.k1', 'idem.aa.k2'], 'a key written again after its delete is listed');
    for (const bad of ['idem', 'idem.aa', '.', 'a..', 'a/b.', '*.', '>']) {
      await t.rejects(list(bad), { code: 'STORE_INVALID_KEY' }, `rejects the prefix ${JSON.stringify(bad)}`);
    }
    const many = Array.from({ length: 300 }, (_, i) => `bulk.k${i}`);
    await Promise.all(many.map((k) => store.create(k, { k })));
    t.same(await list('bulk.'), many.sort(), '300 keys, each once');
    const listed = [];
    for await (const e of store.list<number>('idem.aa.')) listed.push(e);
    t.same(
      listed.sort((a, b) => a.key.localeCompare(b.key)),
      await Promise.all(['idem.aa.gone', 'idem.aa.k1', 'idem.aa.k2'].map(async (key) => ({ key, ...(await store.get(key))! }))),
      'each with its value and revision as get answers them',
    );
    // A reader that takes its time sees every key all the same.
    const slow: string[] = [];
    for await (const { key } of store.list('bulk.')) {
      slow.push(key);
      await new Promise((r) => setImmediate(r));
    }
    t.equal(slow.length, 300, 'a slow reader: every key');
  });

  t.test(`${name}: keys(prefix) names what list(prefix) lists, without values; a deleted key may be among them`, async (t) => {
    const { store } = await setup(t);
    const keys = async (prefix: string) => {
      const out: string[] = [];
      for await (const key of store.keys(prefix)) out.push(key);
      return out.sort();
    };
    t.same(await keys('idem.'), [], 'an empty store names nothing');
    await store.create('idem.aa.k1', 1);
    await store.create('idem.aab.k4', 4);
    await store.create('idem.aa.-.x', 'a key that is not a NATS subject as it is');
    await store.create('idem', 'no token after the prefix');
    const gone = await store.create('idem.aa.gone', 6);
    await store.delete('idem.aa.gone', gone);
    t.same(
      (await keys('idem.aa.')).filter((k) => k !== 'idem.aa.gone'),
      ['idem.aa.-.x', 'idem.aa.k1'],
      'whole tokens, each key once, by its own name',
    );
    t.same((await keys('')).filter((k) => k !== 'idem.aa.gone'), ['idem', 'idem.aa.-.x', 'idem.aa.k1', 'idem.aab.k4'], "'' names every key");
    for (const bad of ['idem', 'idem.aa', '.', '*.', '>']) {
      await t.rejects(keys(bad), { code: 'STORE_INVALID_KEY' }, `rejects the prefix ${JSON.stringify(bad)}`);
    }
    const many = Array.from({ length: 1200 }, (_, i) => `bulk.k${i}`);
    await Promise.all(many.map((k) => store.create(k, { k })));
    t.same(await keys('bulk.'), many.sort(), '1,200 keys (more than a page), each once');
  });

  t.test(`${name}: values are copies`, async (t) => {
    const { store } = await setup(t);
    const value = { list: [1] };
    await store.create('k', value);
    value.list.push(2);
    const got = await store.get<{ list: number[] }>('k');
    t.same(got?.value, { list: [1] }, 'later changes to the written object are not stored');
    got?.value.list.push(3);
    t.same((await store.get('k'))?.value, { list: [1] }, 'changes to a read value are not stored');
  });

  t.test(`${name}: durable across a reopen`, async (t) => {
    const { store, restart } = await setup(t);
    if (!restart) return t.plan(0, 'adapter has no reopen');
    const rk = await store.update('k', { v: 2 }, await store.create('k', { v: 1 }));
    const rd = await store.create('gone', 1);
    await store.delete('gone');
    const again = await restart(store);
    t.same(await again.get('k'), { value: { v: 2 }, revision: rk }, 'same value and revision');
    t.equal(await again.get('gone'), null);
    t.ok((await again.create('gone', 2)) > rd, 'revisions keep growing across a reopen');
    await t.rejects(again.update('k', 3, rk - 1), CONFLICT);
    t.ok((await again.update('k', 3, rk)) > rk);
  });
}
