import type { Test } from 'tap';
import type { LedgerEntry, PackageLedger } from '../../src/store/ports.js';

/**
 * A fresh, empty ledger per call; `reopen` returns a new instance over the same data, as a
 * restarted process sees it. The suite closes every ledger it got, then calls `cleanup`.
 */
export type LedgerFactory = () => Promise<{
  ledger: PackageLedger;
  reopen: () => Promise<PackageLedger>;
  cleanup: () => Promise<void>;
}>;

const U1 = '11111111-1111-4111-8111-111111111111';
const U2 = '22222222-2222-4222-8222-222222222222';

export const entry = (id: string, rows = 1, entity = 'products'): LedgerEntry => ({
  package_id: id,
  entity,
  rows,
  bytes: rows * 10,
  object_bytes: rows * 10 + 120,
});

async function all(it: AsyncIterable<LedgerEntry>): Promise<LedgerEntry[]> {
  const out: LedgerEntry[] = [];
  for await (const e of it) out.push(e);
  return out.sort((a, b) => a.package_id.localeCompare(b.package_id));
}

/** The `PackageLedger` contract: durable entries per session, idempotent appends, each package listed once. */
export function ledgerContract(t: Test, name: string, factory: LedgerFactory): void {
  const setup = async (t: Test) => {
    const f = await factory();
    const opened = new Set([f.ledger]);
    t.teardown(async () => {
      for (const l of opened) await l.close();
      await f.cleanup();
    });
    return {
      ledger: f.ledger,
      reopen: async () => {
        const l = await f.reopen();
        opened.add(l);
        return l;
      },
    };
  };

  t.test(`${name}: append, get, list per session`, async (t) => {
    const { ledger } = await setup(t);
    t.same(await all(ledger.list(U1)), [], 'an unknown session lists nothing');
    t.equal(await ledger.get(U1, 'p-1'), null);
    await ledger.append(U1, [entry('p-1', 3), entry('p-2', 5, 'stock')]);
    await ledger.append(U2, [entry('p-9')]);
    t.same(await ledger.get(U1, 'p-2'), entry('p-2', 5, 'stock'));
    t.equal(await ledger.get(U2, 'p-1'), null, 'sessions are apart');
    t.same(await all(ledger.list(U1)), [entry('p-1', 3), entry('p-2', 5, 'stock')]);
    t.same(await all(ledger.list(U2)), [entry('p-9')]);
  });

  t.test(`${name}: getConfirmed: the entry, or null; what it leaves behind is never listed, and an append afterwards stands`, async (t) => {
    const { ledger, reopen } = await setup(t);
    await ledger.append(U1, [entry('p-1', 3)]);
    t.same(await ledger.getConfirmed(U1, 'p-1'), entry('p-1', 3));
    t.equal(await ledger.getConfirmed(U1, 'p-2'), null, 'never written');
    t.equal(await ledger.getConfirmed(U1, 'p-2'), null, 'and again');
    t.equal(await ledger.get(U1, 'p-2'), null);
    t.same(await all(ledger.list(U1)), [entry('p-1', 3)], 'listed: the entry only');
    await ledger.append(U1, [entry('p-2', 5)]);
    t.same(await (await reopen()).getConfirmed(U1, 'p-2'), entry('p-2', 5), 'written afterwards: read by any instance');
    t.same(await all(ledger.list(U1)), [entry('p-1', 3), entry('p-2', 5)]);
  });

  t.test(`${name}: appending an entry again changes nothing; each package is listed once`, async (t) => {
    const { ledger } = await setup(t);
    await ledger.append(U1, [entry('p-1'), entry('p-2')]);
    await ledger.append(U1, [entry('p-2'), entry('p-3')]);
    await Promise.all([ledger.append(U1, [entry('p-4')]), ledger.append(U1, [entry('p-4')])]);
    t.same((await all(ledger.list(U1))).map((e) => e.package_id), ['p-1', 'p-2', 'p-3', 'p-4']);
  });

  t.test(`${name}: entries are durable: a restarted instance reads them`, async (t) => {
    const { ledger, reopen } = await setup(t);
    await ledger.append(U1, [entry('p-1', 2)]);
    await ledger.close();
    const again = await reopen();
    t.same(await again.get(U1, 'p-1'), entry('p-1', 2));
    t.same(await all(again.list(U1)), [entry('p-1', 2)]);
    await again.append(U1, [entry('p-1', 2), entry('p-2')]);
    t.same((await all(again.list(U1))).map((e) => e.package_id), ['p-1', 'p-2'], 'no duplicate after the restart');
  });

  t.test(`${name}: drop removes one session's entries only`, async (t) => {
    const { ledger } = await setup(t);
    await ledger.append(U1, [entry('p-1')]);
    await ledger.append(U2, [entry('p-2')]);
    await ledger.drop(U1);
    t.equal(await ledger.get(U1, 'p-1'), null);
    t.same(await all(ledger.list(U1)), []);
    t.same(await all(ledger.list(U2)), [entry('p-2')]);
    await ledger.append(U1, [entry('p-3')]);
    t.same(await all(ledger.list(U1)), [entry('p-3')], 'a dropped session can be written again');
  });

  t.test(`${name}: stored markers: idempotent, durable, per session, never listed, dropped with the session`, async (t) => {
    const { ledger, reopen } = await setup(t);
    t.equal(await ledger.isStored(U1, 'p-1'), false);
    await ledger.markStored(U1, ['p-1', 'p-2']);
    await ledger.markStored(U1, ['p-2']);
    await ledger.markStored(U1, []);
    t.equal(await ledger.isStored(U1, 'p-1'), true, 'a marker may come before its entry');
    t.equal(await ledger.isStored(U2, 'p-1'), false, 'sessions are apart');
    t.same(await all(ledger.list(U1)), [], 'markers are not entries');
    await ledger.append(U1, [entry('p-1')]);
    t.same(await all(ledger.list(U1)), [entry('p-1')]);
    t.equal(await ledger.get(U1, 'p-2'), null);
    await ledger.markStored(U2, ['p-9']);
    await ledger.close();
    const again = await reopen();
    t.equal(await again.isStored(U1, 'p-2'), true, 'durable');
    await again.drop(U1);
    t.equal(await again.isStored(U1, 'p-1'), false, 'dropped with its session');
    t.equal(await again.isStored(U1, 'p-2'), false);
    t.equal(await again.isStored(U2, 'p-9'), true, 'another session keeps its markers');
  });

  t.test(`${name}: many concurrent appends to one session, all kept`, async (t) => {
    const { ledger } = await setup(t);
    const ids = Array.from({ length: 300 }, (_, i) => `p-${String(i).padStart(3, '0')}`);
    await Promise.all(ids.map((id) => ledger.append(U1, [entry(id)])));
    const listed = await all(ledger.list(U1));
    t.same(listed.map((e) => e.package_id), ids);
    const got = await Promise.all(ids.map((id) => ledger.get(U1, id)));
    t.equal(got.filter((e) => e === null).length, 0, 'each one readable');
  });

  t.test(`${name}: refuses ids that are not keys`, async (t) => {
    const { ledger } = await setup(t);
    await t.rejects(ledger.append('../x', [entry('p-1')]), { code: 'STORE_INVALID_KEY' });
    await t.rejects(ledger.get('a b', 'p-1'), { code: 'STORE_INVALID_KEY' });
  });
}
