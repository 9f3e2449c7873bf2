/**
 * A read of the embedded state database that the disk fails is `STORE_UNAVAILABLE` (503 to a
 * client), never an internal error: shown on a real database whose pages were damaged on disk.
 */
import { mkdtemp, open, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { isStorageUnavailable } from '../../src/errors.js';
import { SqliteLedger } from '../../src/store/embedded/ledger.js';
import { SqliteSessionStore } from '../../src/store/embedded/session-store.js';
import { StateDatabase } from '../../src/store/embedded/state-db.js';

t.test('damaged pages: reads answer STORE_UNAVAILABLE; a query error stays what it is', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'ingest-read-faults-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const path = join(dir, 'state.sqlite');
  const filled = await StateDatabase.open(path);
  const before = new SqliteSessionStore(filled);
  await Promise.all(Array.from({ length: 2_000 }, (_, i) => before.create(`k.${String(i).padStart(5, '0')}`, { i, pad: 'x'.repeat(200) })));
  const entries = Array.from({ length: 2_000 }, (_, i) => ({ package_id: `p-${i}`, entity: 'products', rows: 1, bytes: 100, object_bytes: 120 }));
  await new SqliteLedger(filled).append('u-1', entries);
  await filled.close(); // the last close checkpoints the WAL into the database file

  // Opened first (its writer reads every row at start), then the second half of the file
  // overwritten under it: the schema's pages stay readable, the rows' pages do not.
  const db = await StateDatabase.open(path);
  t.teardown(() => db.close());
  const { size } = await stat(path);
  const from = Math.floor(size / 2 / 4096) * 4096;
  const fh = await open(path, 'r+');
  await fh.write(Buffer.alloc(size - from, 0xa5), 0, size - from, from);
  await fh.close();

  const sessions = new SqliteSessionStore(db);
  const ledger = new SqliteLedger(db);
  const failures = await Promise.all([
    sessions.get('k.01234').catch((e: unknown) => e),
    (async () => {
      for await (const _ of sessions.list('k.')) void _;
    })().catch((e: unknown) => e),
    ledger.get('u-1', 'p-1999').catch((e: unknown) => e),
  ]);
  for (const [i, err] of failures.entries()) {
    t.ok(isStorageUnavailable(err), `read ${i}: storage unavailable (${String(err)})`);
    t.match(String((err as { cause?: { code?: unknown } }).cause?.code), /^SQLITE_(CORRUPT|NOTADB)/, `read ${i}: SQLite's code kept as the cause`);
  }
  const misuse = await db.read('kv.get', []).catch((err: unknown) => err);
  t.ok(misuse instanceof Error, `a wrong query fails (${String(misuse)})`);
  t.notOk(isStorageUnavailable(misuse), 'a wrong query is not a storage failure');
});
