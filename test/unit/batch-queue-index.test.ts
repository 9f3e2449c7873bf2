/**
 * The embedded queue's commit index in the state database (`queue` table, batch-queue.ts): a
 * package is visible once its row's transaction is durable and not before; a restart replays
 * the table in commit order; the index file of an earlier version is imported once (its live
 * packages, not the acked or purged ones) and then removed.
 */
import { openSqlite } from '../../src/store/embedded/sqlite.js';
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { FileBatchQueue } from '../../src/store/embedded/batch-queue.js';
import { StateDatabase } from '../../src/store/embedded/state-db.js';
import type { PackageMeta } from '../../src/store/ports.js';
import { oldIndexLine, toOldLayout } from '../support/old-queue-index.js';

async function tempDir(t: Test): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'queue-index-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

const meta = (id: string, upload = 'u1'): PackageMeta => ({ package_id: id, upload_uuid: upload, client_id: 'c', entity: 'stores', columns: ['store_id'] });
const batchOf = (id: string): Buffer => Buffer.from(`["${id}"]\n`);

async function commit(q: FileBatchQueue, id: string, upload = 'u1'): Promise<void> {
  const w = await q.open(meta(id, upload));
  await w.append(batchOf(id));
  await w.commit({ rows: 1, bytes: batchOf(id).length });
}

/** The next `n` packages delivered, in delivery order, each acked after its bytes were checked. */
async function take(t: Test, q: FileBatchQueue, n: number): Promise<string[]> {
  const got: string[] = [];
  if (n === 0) return got;
  await new Promise<void>((resolve) => {
    const consumer = q.consume(async (pkg) => {
      const parts: Buffer[] = [];
      for await (const b of pkg.batches()) parts.push(Buffer.from(b));
      if (!Buffer.concat(parts).equals(batchOf(pkg.meta.package_id))) t.fail(`${pkg.meta.package_id}: other bytes`);
      got.push(pkg.meta.package_id);
      if (got.length === n) void consumer.stop().then(resolve);
    });
  });
  return got;
}

const rowsOf = (state: string): number => {
  const db = openSqlite(state, { readonly: true });
  try {
    return (db.prepare('SELECT count(*) AS n FROM queue').get() as { n: number }).n;
  } finally {
    db.close();
  }
};

t.test('a commit is visible only once its transaction is durable: not pending, not delivered before', async (t) => {
  const dir = await tempDir(t);
  const db = await StateDatabase.open(join(dir, 'state.sqlite'));
  t.teardown(() => db.close());
  // The commit's row is held back on its way to the writer.
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const write = db.write.bind(db);
  db.write = (op) => (op.t === 'queue-commit' ? gate.then(() => write(op)) : write(op));
  const q = await FileBatchQueue.open(dir, db, { redeliveryDelayMs: 5 });
  t.teardown(() => q.close());
  // The consumer holds its ack (which deletes the row) until the end of the test.
  const seen: string[] = [];
  let ack!: () => void;
  const acking = new Promise<void>((resolve) => (ack = resolve));
  let delivered!: () => void;
  const deliveredOnce = new Promise<void>((resolve) => (delivered = resolve));
  const consumer = q.consume(async (pkg) => {
    seen.push(pkg.meta.package_id);
    delivered();
    await acking;
  });
  t.teardown(() => {
    ack();
    return consumer.stop();
  });
  let committed = false;
  const committing = commit(q, 'p1').then(() => (committed = true));
  await new Promise((resolve) => setTimeout(resolve, 100));
  t.equal(committed, false, 'the commit waits for its transaction');
  t.equal(await q.pending('u1'), 0, 'not pending before');
  t.equal((await q.backlog()).packages, 0);
  t.same(seen, [], 'not delivered before');
  t.equal(rowsOf(join(dir, 'state.sqlite')), 0, 'no row yet');
  release();
  await committing;
  t.equal(rowsOf(join(dir, 'state.sqlite')), 1, 'its row is in the database once the commit resolves');
  await deliveredOnce;
  t.same(seen, ['p1'], 'delivered after');
});

t.test('a restart replays the table: the unacked packages come back in commit order, the acked ones do not', async (t) => {
  const dir = await tempDir(t);
  const state = join(dir, 'state.sqlite');
  const q = await FileBatchQueue.open(dir, state, { redeliveryDelayMs: 5, heldBytes: 0 });
  for (const id of ['a', 'b', 'c', 'd', 'e']) await commit(q, id);
  t.same(await take(t, q, 2), ['a', 'b']);
  await q.close();
  t.equal(rowsOf(state), 3, 'a row per unacked package');
  const again = await FileBatchQueue.open(dir, state, { redeliveryDelayMs: 5 });
  t.equal(await again.pending('u1'), 3);
  await commit(again, 'f');
  t.same(await take(t, again, 4), ['c', 'd', 'e', 'f'], 'in commit order, the new one after them');
  await again.close();
  t.equal(rowsOf(state), 0, 'every row acked');
});

t.test('an index file of an earlier version is imported: live commits come back, acked and purged ones do not, the file goes', async (t) => {
  const dir = await tempDir(t);
  const state = join(dir, 'state.sqlite');
  const q = await FileBatchQueue.open(dir, state, { redeliveryDelayMs: 5, heldBytes: 0 });
  for (const [id, upload] of [['p0', 'u1'], ['p1', 'u1'], ['p2', 'u2'], ['p3', 'u1'], ['p4', 'u2'], ['p5', 'u1']] as const) await commit(q, id, upload);
  await q.close();
  // As an earlier version left it: p1 acked, session u2 purged (p2, p4), in the index file; no queue table.
  const { index, commits } = await toOldLayout(dir, state);
  const seqOf = (id: string) => commits.find((c) => c.package_id === id)!.seq;
  await writeFile(index, (await readFile(index, 'utf8')) + [{ t: 'a', seq: seqOf('p1') }, { t: 'p', upload_uuid: 'u2' }].map((r) => oldIndexLine(r)).join(''));

  const damage: unknown[] = [];
  const again = await FileBatchQueue.open(dir, state, { redeliveryDelayMs: 5, onDamage: (...d) => void damage.push(d) });
  t.same(damage, [], 'no damage');
  t.same((await readdir(dir)).filter((n) => n.startsWith('index-')), [], 'the index file is removed');
  t.equal(rowsOf(state), 3, 'its live packages are rows of the table');
  t.equal(await again.pending('u1'), 3);
  t.equal(await again.pending('u2'), 0, 'the purged session has none');
  await commit(again, 'p6');
  t.same(await take(t, again, 4), ['p0', 'p3', 'p5', 'p6'], 'the live ones, in their commit order, the new one after them');
  await again.close();

  // A restart after the import: the table, no second import.
  const third = await FileBatchQueue.open(dir, state, { redeliveryDelayMs: 5 });
  t.equal((await third.backlog()).packages, 0);
  await third.close();
});

t.test('a crash between the import and the removal of the file: the file goes, nothing is imported twice', async (t) => {
  const dir = await tempDir(t);
  const state = join(dir, 'state.sqlite');
  const q = await FileBatchQueue.open(dir, state, { redeliveryDelayMs: 5, heldBytes: 0 });
  await commit(q, 'x');
  await commit(q, 'y');
  await q.close();
  const { index } = await toOldLayout(dir, state);
  const text = await readFile(index);
  const again = await FileBatchQueue.open(dir, state, { redeliveryDelayMs: 5 });
  t.same(await take(t, again, 1), ['x']);
  await again.close();
  // The file back as if its removal never reached the disk; x is acked since.
  await writeFile(index, text);
  const third = await FileBatchQueue.open(dir, state, { redeliveryDelayMs: 5 });
  t.same((await readdir(dir)).filter((n) => n.startsWith('index-')), [], 'the file is removed');
  t.equal(await third.pending('u1'), 1, 'only y: the acked x is not brought back by the file');
  t.same(await take(t, third, 1), ['y']);
  await third.close();
});

t.test('the ready/ layout of an older version is taken over: its packages committed anew, rows of the table', async (t) => {
  const dir = await tempDir(t);
  const state = join(dir, 'state.sqlite');
  for (const [seq, id] of [[2, 'r2'], [1, 'r1']] as const) {
    const pkg = join(dir, 'ready', 'u1', id);
    await mkdir(pkg, { recursive: true });
    await writeFile(join(pkg, 'data'), batchOf(id));
    await writeFile(join(pkg, 'commit.json'), JSON.stringify({ seq, meta: meta(id), rows: 1, bytes: batchOf(id).length, batches: [batchOf(id).length] }));
  }
  const q = await FileBatchQueue.open(dir, state, { redeliveryDelayMs: 5 });
  t.same((await readdir(dir)).filter((n) => n === 'ready'), [], 'ready/ is gone');
  t.equal(rowsOf(state), 2);
  await q.close();
  const again = await FileBatchQueue.open(dir, state, { redeliveryDelayMs: 5 });
  t.same(await take(t, again, 2), ['r1', 'r2'], 'in their old commit order, after a restart too');
  await again.close();
});
