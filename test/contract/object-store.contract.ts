import type { Test } from 'tap';
import type { ObjectStore } from '../../src/store/ports.js';

/** As in session-store.contract.ts: a fresh empty store; `reopen` a second instance over the same data. */
export type ObjectStoreFactory = () => Promise<{
  store: ObjectStore;
  reopen?: () => Promise<ObjectStore>;
  cleanup: () => Promise<void>;
}>;

async function* chunks(...parts: string[]): AsyncIterable<Uint8Array> {
  for (const p of parts) yield Buffer.from(p);
}

async function* failing(after: string): AsyncIterable<Uint8Array> {
  yield Buffer.from(after);
  throw new Error('body failed');
}

async function read(store: ObjectStore, key: string): Promise<string | null> {
  const body = await store.get(key);
  if (!body) return null;
  const parts: Uint8Array[] = [];
  for await (const c of body) parts.push(c);
  return Buffer.concat(parts).toString('utf8');
}

/** The `ObjectStore` contract: atomic replacing puts, prefix listing in key order, prefix deletes. */
export function objectStoreContract(t: Test, name: string, factory: ObjectStoreFactory): void {
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
      restart:
        reopen &&
        (async (store: ObjectStore) => {
          opened.delete(store);
          await store.close();
          const s = await reopen();
          opened.add(s);
          return s;
        }),
    };
  };

  t.test(`${name}: put and get`, async (t) => {
    const { store } = await setup(t);
    t.same(await store.put('a/b/c.ndjson', chunks('hello ', 'wörld', '')), { key: 'a/b/c.ndjson', size: 12 });
    t.equal(await read(store, 'a/b/c.ndjson'), 'hello wörld');
    t.equal(await store.get('a/b/missing'), null);
    t.same(await store.put('empty', chunks()), { key: 'empty', size: 0 });
    t.equal(await read(store, 'empty'), '');
    const big = 'x'.repeat(3 * 1024 * 1024);
    t.equal((await store.put('big', chunks(big, big))).size, big.length * 2);
    t.equal((await read(store, 'big'))?.length, big.length * 2);
  });

  t.test(`${name}: put replaces atomically`, async (t) => {
    const { store } = await setup(t);
    await store.put('k/obj', chunks('version one'));
    await store.put('k/obj', chunks('v2'));
    t.equal(await read(store, 'k/obj'), 'v2', 'replaced, no tail of the longer old object');
    await t.rejects(store.put('k/obj', failing('partial')), /body failed/);
    t.equal(await read(store, 'k/obj'), 'v2', 'a failed put leaves the old object');
    await t.rejects(store.put('k/new', failing('partial')), /body failed/);
    t.equal(await store.get('k/new'), null, 'a failed put of a new key leaves nothing');
    t.same(await store.list('k/'), [{ key: 'k/obj', size: 2 }]);
  });

  t.test(`${name}: keys`, async (t) => {
    const { store } = await setup(t);
    await store.put('x/y', chunks('leaf'));
    await store.put('x/y/z', chunks('below'));
    t.equal(await read(store, 'x/y'), 'leaf', 'a key may also be a prefix of other keys');
    t.equal(await read(store, 'x/y/z'), 'below');
    await store.put('Case/K', chunks('upper'));
    await store.put('case/k', chunks('lower'));
    t.equal(await read(store, 'Case/K'), 'upper', 'keys are case-sensitive');
    await store.put('odd/a%20b~c d+é', chunks('odd'));
    t.same(await store.list('odd/'), [{ key: 'odd/a%20b~c d+é', size: 3 }]);
    for (const bad of ['', '/abs', 'a//b', 'a/', '../up', 'a/../b', 'a/./b', '..']) {
      await t.rejects(store.put(bad, chunks('x')), { code: 'STORE_INVALID_KEY' }, `rejects ${JSON.stringify(bad)}`);
    }
  });

  t.test(`${name}: list is by string prefix, in key order`, async (t) => {
    const { store } = await setup(t);
    const keys = ['b/1', 'a/bc/1', 'a/b/2', 'a/b', 'a/b/1', 'a/b/sub/3', 'ab'];
    for (const k of keys) await store.put(k, chunks(k));
    const list = async (p: string) => (await store.list(p)).map((o) => o.key);
    t.same(await list('a/b/'), ['a/b/1', 'a/b/2', 'a/b/sub/3'], 'a trailing "/" is a directory boundary');
    t.same(await list('a/b'), ['a/b', 'a/b/1', 'a/b/2', 'a/b/sub/3', 'a/bc/1'], 'without it, any key starting so');
    t.same(await list('a'), ['a/b', 'a/b/1', 'a/b/2', 'a/b/sub/3', 'a/bc/1', 'ab']);
    t.same(await list(''), [...keys].sort());
    t.same(await list('zzz/'), []);
    t.same(await list('../'), []);
    t.same((await store.list('a/b/1'))[0], { key: 'a/b/1', size: 5 }, 'sizes');
  });

  t.test(`${name}: deletePrefix`, async (t) => {
    const { store } = await setup(t);
    for (const k of ['a/b/1', 'a/b/2/x', 'a/b', 'a/bc/1', 'b/1']) await store.put(k, chunks(k));
    await store.deletePrefix('a/b/');
    t.same((await store.list('')).map((o) => o.key), ['a/b', 'a/bc/1', 'b/1'], 'a/bc and a/b itself stay');
    await store.deletePrefix('a/b');
    t.same((await store.list('')).map((o) => o.key), ['b/1']);
    await t.resolves(store.deletePrefix('nothing/'), 'deleting nothing');
    await store.put('a/b/1', chunks('again'));
    t.equal(await read(store, 'a/b/1'), 'again', 'a deleted prefix can be written again');
  });

  t.test(`${name}: durable across a reopen`, async (t) => {
    const { store, restart } = await setup(t);
    if (!restart) return t.plan(0, 'adapter has no reopen');
    await store.put('s/1', chunks('one'));
    await store.put('s/2', chunks('two'));
    await store.deletePrefix('s/2');
    const again = await restart(store);
    t.same(await again.list('s/'), [{ key: 's/1', size: 3 }]);
    t.equal(await read(again, 's/1'), 'one');
  });
}
