/**
 * The embedded state database (src/store/embedded/state-db.ts): the session store and the
 * ledger on it pass their port contracts, and a write that fails for want of disk fails only
 * itself: memory and disk keep the old value, and the next write after the fault clears
 * succeeds without a reopen.
 */
import { execFileSync } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { SqliteLedger } from '../../src/store/embedded/ledger.js';
import { SqliteSessionStore } from '../../src/store/embedded/session-store.js';
import { StateDatabase } from '../../src/store/embedded/state-db.js';
import { isStoreError } from '../../src/store/ports.js';
import { entry, ledgerContract } from './ledger.contract.js';
import { sessionStoreContract } from './session-store.contract.js';

const tempDir = (): Promise<string> => mkdtemp(join(tmpdir(), 'ingest-state-'));
const remove = (dir: string) => () => rm(dir, { recursive: true, force: true });

sessionStoreContract(t, 'SqliteSessionStore', async () => {
  const dir = await tempDir();
  const path = join(dir, 'state.sqlite');
  return { store: await SqliteSessionStore.open(path), reopen: () => SqliteSessionStore.open(path), cleanup: remove(dir) };
});

ledgerContract(t, 'SqliteLedger', async () => {
  const dir = await tempDir();
  const path = join(dir, 'state.sqlite');
  return { ledger: await SqliteLedger.open(path), reopen: () => SqliteLedger.open(path), cleanup: remove(dir) };
});

const U = '11111111-1111-4111-8111-111111111111';

t.test('SqliteLedger: a session of more entries than one page lists each once', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const ledger = await SqliteLedger.open(join(dir, 'state.sqlite'));
  t.teardown(() => ledger.close());
  const ids = Array.from({ length: 2500 }, (_, i) => `p-${i}`);
  await Promise.all(ids.map((id) => ledger.append(U, [entry(id)])));
  const listed: string[] = [];
  for await (const e of ledger.list(U)) listed.push(e.package_id);
  t.same(listed.sort(), [...ids].sort());
  t.same(SqliteLedger.peek(join(dir, 'state.sqlite'), U).length, 2500, 'peek reads them without the ledger');
});

t.test('concurrent writes of one tick share one commit, and each gets its own answer', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const store = await SqliteSessionStore.open(join(dir, 'state.sqlite'));
  t.teardown(() => store.close());
  await store.create('k', 0);
  const results = await Promise.allSettled([store.create('k', 1), store.create('a', 1), store.update('k', 2, 1), store.update('k', 3, 1)]);
  t.same(
    results.map((r) => (r.status === 'fulfilled' ? 'ok' : (r.reason as { code: string }).code)),
    ['STORE_CONFLICT', 'ok', 'ok', 'STORE_CONFLICT'],
    'compare-and-set is decided in call order inside the shared transaction',
  );
  t.same((await store.get('k'))?.value, 2);
});

/** Root can mount a tmpfs of its own; the suite runs as root (its prerequisites install packages). */
function mountTmpfs(dir: string, size: string): void {
  execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${size}`, 'tmpfs', dir]);
}

t.test('a full disk fails the writes that needed it, keeps the old values, and the next write after space is freed succeeds', async (t) => {
  const dir = await tempDir();
  mountTmpfs(dir, '1m');
  t.teardown(async () => {
    execFileSync('umount', ['-l', dir]);
    await remove(dir)();
  });
  const path = join(dir, 'state.sqlite');
  const db = await StateDatabase.open(path);
  t.teardown(() => db.close());
  const sessions = new SqliteSessionStore(db);
  const ledger = new SqliteLedger(db);
  const rev = await sessions.create('s', { n: 0 });
  // New keys until the disk is full (an update in place would reuse the log's space).
  const big = 'x'.repeat(64 * 1024);
  let failure: unknown = null;
  for (let n = 1; n < 100 && !failure; n++) {
    try {
      await sessions.create(`big-${n}`, big);
    } catch (err) {
      failure = err;
    }
  }
  t.ok(isStoreError(failure, 'STORE_UNAVAILABLE'), `the write that found the disk full: ${(failure as Error).message}`);
  const kept = await sessions.get<{ n: number }>('s');
  t.equal(kept?.revision, rev, 'memory keeps the last durable value');
  await t.rejects(sessions.update('s', { n: 1, big }, rev), { code: 'STORE_UNAVAILABLE' });
  t.same(await sessions.get('s'), { value: { n: 0 }, revision: rev }, 'a failed update leaves the old value');
  t.same(SqliteSessionStore.peek<{ n: number }>(path, 's')?.revision, rev, 'and so does the disk');

  execFileSync('mount', ['-o', 'remount,size=64m', dir]);
  const next = await sessions.update('s', { n: -1 }, rev);
  t.ok(next > rev, 'the first write after space is freed succeeds, without a reopen');
  await ledger.append(U, [entry('p-1')]);
  t.same(await ledger.get(U, 'p-1'), entry('p-1'));
  await db.close();
  const again = await SqliteSessionStore.open(path);
  t.same(await again.get('s'), { value: { n: -1 }, revision: next }, 'and it is what a restart reads');
  await again.close();
});
