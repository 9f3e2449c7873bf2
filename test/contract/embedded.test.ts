import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { FileBatchQueue } from '../../src/store/embedded/batch-queue.js';
import { FileObjectStore } from '../../src/store/embedded/object-store.js';
import { FileSessionStore } from '../../src/store/embedded/session-store.js';
import { batchQueueContract } from './batch-queue.contract.js';
import { objectStoreContract } from './object-store.contract.js';
import { sessionStoreContract } from './session-store.contract.js';

const tempDir = (): Promise<string> => mkdtemp(join(tmpdir(), 'ingest-embedded-'));
const remove = (dir: string) => () => rm(dir, { recursive: true, force: true });

sessionStoreContract(t, 'FileSessionStore', async () => {
  const dir = await tempDir();
  return { store: await FileSessionStore.open(dir), reopen: () => FileSessionStore.open(dir), cleanup: remove(dir) };
});

const queueOpts = { redeliveryDelayMs: 5 };
batchQueueContract(t, 'FileBatchQueue', async () => {
  const dir = await tempDir();
  return {
    store: await FileBatchQueue.open(dir, queueOpts),
    reopen: () => FileBatchQueue.open(dir, queueOpts),
    cleanup: remove(dir),
  };
});

objectStoreContract(t, 'FileObjectStore', async () => {
  const dir = await tempDir();
  return { store: await FileObjectStore.open(dir), reopen: () => FileObjectStore.open(dir), cleanup: remove(dir) };
});

t.test('FileObjectStore keeps its promise: each chunk is written before it asks for the next', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const store = await FileObjectStore.open(dir);
  t.teardown(() => store.close());
  t.equal(store.consumesChunksInTurn, true);
  // One buffer, overwritten the moment the store asks for the next chunk.
  const shared = Buffer.alloc(8);
  async function* inTurn(): AsyncIterable<Uint8Array> {
    for (const part of ['aaaaaaaa', 'bbbb', 'cccccccc']) {
      shared.write(part.padEnd(8, '-'));
      yield shared.subarray(0, part.length);
      shared.fill('#');
    }
  }
  await store.put('k/shared', inTurn());
  const body = await store.get('k/shared');
  const parts: Buffer[] = [];
  for await (const chunk of body!) parts.push(Buffer.from(chunk));
  t.equal(Buffer.concat(parts).toString(), 'aaaaaaaabbbbcccccccc');
});

t.test('FileBatchQueue: a commit racing a purge of its session fails and leaves no files', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const q = await FileBatchQueue.open(dir, queueOpts);
  t.teardown(() => q.close());
  const meta = { package_id: 'p1', upload_uuid: 'u1', client_id: 'c', entity: 'stores', columns: ['store_id'] };
  const w = await q.open(meta);
  await w.append(Buffer.from('["s1"]\n'));
  const committing = w.commit({ rows: 1, bytes: 7 }).then(
    () => 'committed',
    () => 'failed',
  );
  await q.purge('u1');
  t.equal(await committing, 'failed');
  t.equal(await q.pending('u1'), 0);
  const w2 = await q.open({ ...meta, package_id: 'p2' });
  await q.purge('u1');
  await t.rejects(w2.append(Buffer.from('["s2"]\n')), /purged/);
  await t.rejects(w2.commit({ rows: 0, bytes: 0 }));
  await w2.abort();
  t.same(await readdir(join(dir, 'incoming')), []);
  t.same(await readdir(join(dir, 'ready', 'u1')).catch(() => []), []);
  t.same(await readdir(join(dir, 'trash')), []);
});

t.test('FileSessionStore: one file per key, no temp files left', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const s = await FileSessionStore.open(dir);
  t.teardown(() => s.close());
  await Promise.allSettled(Array.from({ length: 5 }, () => s.create('Session.1', { n: 1 })));
  await s.create('x', 1);
  await s.delete('x');
  t.same((await readdir(dir)).sort(), ['^session.1.json', 'x.json'], 'a deleted key keeps its tombstone');
});
