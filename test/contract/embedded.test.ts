import { mkdir, mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import t from 'tap';
import { appendFile, readFile, stat, writeFile } from 'node:fs/promises';
import { FileBatchQueue } from '../../src/store/embedded/batch-queue.js';
import { FileObjectStore } from '../../src/store/embedded/object-store.js';
import { batchQueueContract } from './batch-queue.contract.js';
import { objectStoreContract } from './object-store.contract.js';
import { readText } from '../support/objects.js';

const tempDir = (): Promise<string> => mkdtemp(join(tmpdir(), 'ingest-embedded-'));
const remove = (dir: string) => () => rm(dir, { recursive: true, force: true });
/** A one-line object body. */
async function* oneLine() {
  yield Buffer.from('line\n');
}

const queueOpts = { redeliveryDelayMs: 5 };
batchQueueContract(t, 'FileBatchQueue', async () => {
  const dir = await tempDir();
  return {
    store: await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), queueOpts),
    reopen: () => FileBatchQueue.open(dir, join(dir, 'state.sqlite'), queueOpts),
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
  t.equal(store.capabilities.consumesChunksInTurn, true);
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

t.test('FileBatchQueue: a commit racing a purge of its session fails, and nothing of it comes back', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const q = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), queueOpts);
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
  await t.rejects(w2.append(Buffer.from('["s2"]\n')), { code: 'QUEUE_PACKAGE_DROPPED' });
  await t.rejects(w2.commit({ rows: 0, bytes: 0 }), { code: 'QUEUE_PACKAGE_DROPPED' });
  await w2.abort();
  await q.close();
  const again = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), queueOpts);
  t.teardown(() => again.close());
  t.equal(await again.pending('u1'), 0, 'nothing of the purged session after a restart');
  const segments = await readdir(join(dir, 'segments'));
  t.equal(segments.length, 1, 'the old segment, used by no package, is gone; a new one is open');
  t.not(segments[0], '0.seg', 'under a number never used before');
  t.equal((await stat(join(dir, 'segments', segments[0]!))).size, 0);
});

t.test('FileBatchQueue: a small committed package reaches its consumer from memory; a large one, one past the budget and one after a restart from its segment', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  // Room for one small package (8 bytes): the second is past the budget.
  const damage: [string, number][] = [];
  const q = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), { ...queueOpts, heldBytes: 12, onDamage: (file, offset) => void damage.push([basename(file), offset]) });
  const meta = (id: string) => ({ package_id: id, upload_uuid: 'u1', client_id: 'c', entity: 'stores', columns: ['store_id'] });
  const sent = new Map<string, Buffer>();
  const commit = async (id: string, batch: Buffer): Promise<void> => {
    const w = await q.open(meta(id));
    const reused = Buffer.from(batch);
    await w.append(reused);
    reused.fill('?'); // the caller's memory, reused once the append settled
    await w.commit({ rows: 1, bytes: batch.byteLength });
    sent.set(id, batch);
  };
  await commit('small', Buffer.from('["s-1"]\n'));
  await commit('over-budget', Buffer.from('["s-2"]\n'));
  await commit('large', Buffer.from(`["${'x'.repeat(70 * 1024)}"]\n`));
  // What the segment holds now is not what was written: whatever is read from it fails its checksum.
  const segment = join(dir, 'segments', '0.seg');
  await writeFile(segment, Buffer.alloc((await readFile(segment)).byteLength, '#'));
  const got = new Map<string, string>();
  let left = 3;
  let done!: () => void;
  const all = new Promise<void>((resolve) => (done = resolve));
  const consumer = q.consume(async (pkg) => {
    const parts: Buffer[] = [];
    try {
      for await (const b of pkg.batches({ reuse: true })) parts.push(Buffer.from(b));
      got.set(pkg.meta.package_id, Buffer.concat(parts).toString());
    } catch (err) {
      got.set(pkg.meta.package_id, (err as { code: string }).code);
      throw err;
    } finally {
      if (--left === 0) done();
    }
  });
  await all;
  await consumer.stop();
  t.equal(got.get('small'), sent.get('small')!.toString(), 'the small package, from memory');
  t.equal(got.get('over-budget'), 'QUEUE_BATCH_LOST', 'past the budget: read from the segment, damaged there');
  t.equal(got.get('large'), 'QUEUE_BATCH_LOST', 'past the size held: read from the segment, damaged there');
  t.same(damage, [['0.seg', 8], ['0.seg', 16]], 'each damaged batch reported with its file and offset');
  t.equal(q.damaged, 2);
  t.equal(await q.pending('u1'), 0, 'a package whose batch is damaged is dropped, not delivered again');
  await q.close();

  // After a restart nothing is held: an unacked package is read from its segment.
  const again = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), queueOpts);
  t.teardown(() => again.close());
  const w = await again.open(meta('before-restart'));
  await w.append(Buffer.from('["s-3"]\n'));
  await w.commit({ rows: 1, bytes: 8 });
  await again.close();
  const third = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), queueOpts);
  t.teardown(() => third.close());
  const body = await new Promise<string>((resolve) => {
    const c = third.consume(async (pkg) => {
      const parts: Buffer[] = [];
      for await (const b of pkg.batches()) parts.push(Buffer.from(b));
      resolve(Buffer.concat(parts).toString());
    });
    t.teardown(() => c.stop());
  });
  t.equal(body, '["s-3"]\n', 'read back from the segment after a restart');
});

t.test('FileBatchQueue: a restart takes back every unacked package, past one page of its table', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const q = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), queueOpts);
  // More than one page of the table (5,000 rows a read at open).
  const ids = Array.from({ length: 5_002 }, (_, i) => `p-${i}`);
  await Promise.all(
    ids.map(async (id) => {
      const w = await q.open({ package_id: id, upload_uuid: 'u1', client_id: 'c', entity: 'stores', columns: ['store_id'] });
      await w.append(Buffer.from(`["${id}"]\n`));
      await w.commit({ rows: 1, bytes: id.length + 5 });
    }),
  );
  await q.close();
  const again = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), queueOpts);
  t.teardown(() => again.close());
  t.equal(await again.pending('u1'), ids.length, 'every package pending after the restart');
  const order: string[] = [];
  await new Promise<void>((resolve) => {
    const c = again.consume(async (pkg) => {
      order.push(pkg.meta.package_id);
      if (order.length === ids.length) resolve();
    });
    t.teardown(() => c.stop());
  });
  t.same([...order].sort(), [...ids].sort(), 'each delivered once');
});

t.test('FileBatchQueue: segments roll over, and go once their packages are acked', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const q = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), { ...queueOpts, segmentBytes: 64 });
  const meta = (i: number) => ({ package_id: `p${i}`, upload_uuid: 'u1', client_id: 'c', entity: 'stores', columns: ['store_id'] });
  for (let i = 0; i < 20; i++) {
    const w = await q.open(meta(i));
    await w.append(Buffer.from(`["store-${String(i).padStart(3, '0')}","${'x'.repeat(20)}"]\n`));
    await w.commit({ rows: 1, bytes: 36 });
  }
  t.ok((await readdir(join(dir, 'segments'))).length >= 5, 'rolled over at 64 bytes');
  let seen = 0;
  let done!: () => void;
  const all = new Promise<void>((resolve) => (done = resolve));
  const consumer = q.consume(async (pkg) => {
    for await (const b of pkg.batches()) t.match(Buffer.from(b).toString(), new RegExp(`^\\["store-${pkg.meta.package_id.slice(1).padStart(3, '0')}"`));
    if (++seen === 20) done();
  });
  await all;
  await consumer.stop();
  t.equal(await q.pending('u1'), 0);
  await q.close();
  const segments = await readdir(join(dir, 'segments'));
  t.ok(segments.length <= 2, `acked segments removed (${segments.join(', ')})`);
  t.same((await readdir(dir)).filter((n) => n.startsWith('index-')), [], 'no index file: the index is the state database');
});

const readAll = readText;

async function* pieces(text: string, size = 65536): AsyncIterable<Uint8Array> {
  for (let i = 0; i < text.length; i += size) yield Buffer.from(text.slice(i, i + size));
}

t.test('FileObjectStore packs a directory: one file, whatever the number of objects', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const store = await FileObjectStore.open(dir);
  t.teardown(() => store.close());
  await Promise.all(Array.from({ length: 50 }, (_, i) => store.put(`u/c/s/products/p${i}.ndjson`, pieces(`row ${i}\n`))));
  t.same(await readdir(join(dir, 'objects', 'u', 'c', 's', 'products')), ['~pack']);
  t.equal((await store.list('u/c/s/')).length, 50);
  t.equal(await readAll(store, 'u/c/s/products/p7.ndjson'), 'row 7\n');
});

t.test('FileObjectStore: a large put streams alone while small puts of its directory wait; every object reads back whole', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const store = await FileObjectStore.open(dir);
  t.teardown(() => store.close());
  const big = 'B'.repeat(5 * 1024 * 1024 + 7);
  const puts = [store.put('d/big', pieces(big)), ...Array.from({ length: 20 }, (_, i) => store.put(`d/small-${i}`, pieces(`small ${i}`.repeat(100), 50)))];
  await Promise.all(puts);
  t.equal(await readAll(store, 'd/big'), big);
  for (let i = 0; i < 20; i++) t.equal(await readAll(store, `d/small-${i}`), `small ${i}`.repeat(100), `small-${i}`);
});

t.test('FileObjectStore: a record a crash left unfinished is no object; the writer cuts it off and the next object is found after it', async (t) => {
  const torn = {
    'its bytes cut short': '{"k":"x/two","n":100             ,"c":12345     }\ntwo',
    'its bytes not matching its CRC': '{"k":"x/two","n":3               ,"c":12345     }\ntwo',
    'a stream cut mid-way': '{"k":"x/two","n":-1              ,"c":-1        }\ntwo, and more',
    'its header cut short': '{"k":"x/two","n":3     ',
  };
  for (const [what, tail] of Object.entries(torn)) {
    await t.test(what, async (t) => {
      const dir = await tempDir();
      t.teardown(remove(dir));
      const pack = join(dir, 'objects', 'x', '~pack');
      const first = await FileObjectStore.open(dir);
      await first.put('x/one', pieces('one'));
      await first.close();
      const whole = (await readFile(pack)).byteLength;
      await appendFile(pack, tail);
      const reader = await FileObjectStore.open(dir);
      t.same((await reader.list('x/')).map((o) => o.key), ['x/one'], 'a reader sees the whole records only');
      await reader.close();
      const writer = await FileObjectStore.open(dir);
      await writer.put('x/three', pieces('three'));
      await writer.close();
      const again = await FileObjectStore.open(dir);
      t.teardown(() => again.close());
      t.same((await again.list('x/')).map((o) => o.key), ['x/one', 'x/three']);
      t.equal(await readAll(again, 'x/one'), 'one');
      t.equal(await readAll(again, 'x/three'), 'three');
      // The record of x/three is that of x/one with a key two bytes longer and two more bytes.
      t.equal((await readFile(pack)).byteLength, whole + whole + 2 + 2, 'the torn record was cut off: the file is the two records alone');
    });
  }
});

t.test('FileObjectStore: a streamed put whose body fails is no object, leaves none of its bytes, and its directory goes on', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const store = await FileObjectStore.open(dir);
  await store.put('y/before', pieces('before'));
  const pack = join(dir, 'objects', 'y', '~pack');
  const packed = (await stat(pack)).size;
  const big = Buffer.alloc(3 * 1024 * 1024, 'b');
  async function* failing(): AsyncIterable<Uint8Array> {
    yield big;
    yield big; // past what is held: it streams
    throw new Error('the body broke');
  }
  await t.rejects(store.put('y/broken', failing()), { message: 'the body broke' });
  t.equal((await stat(pack)).size, packed, 'the pack is cut back to where the failed put began');
  await store.put('y/after', pieces('after'));
  t.same((await store.list('y/')).map((o) => o.key), ['y/after', 'y/before']);
  await store.close();
  const again = await FileObjectStore.open(dir);
  t.teardown(() => again.close());
  t.same((await again.list('y/')).map((o) => o.key), ['y/after', 'y/before'], 'and after a restart');
  t.equal(await readAll(again, 'y/after'), 'after');
});

t.test('FileObjectStore reads the one-file-per-object layout of earlier versions; a put shadows it, a delete removes it', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  await mkdir(join(dir, 'objects', 'old', 'p'), { recursive: true });
  await writeFile(join(dir, 'objects', 'old', 'p', 'a.ndjson~'), 'legacy a');
  await writeFile(join(dir, 'objects', 'old', 'p', 'b.ndjson~'), 'legacy b');
  const store = await FileObjectStore.open(dir);
  t.teardown(() => store.close());
  t.same(await store.list('old/'), [
    { key: 'old/p/a.ndjson', size: 8 },
    { key: 'old/p/b.ndjson', size: 8 },
  ]);
  t.equal(await readAll(store, 'old/p/a.ndjson'), 'legacy a');
  await store.put('old/p/a.ndjson', pieces('new a!'));
  t.equal(await readAll(store, 'old/p/a.ndjson'), 'new a!');
  t.same(await store.list('old/p/a'), [{ key: 'old/p/a.ndjson', size: 6 }], 'listed once, as the put left it');
  await store.deletePrefix('old/p/b');
  t.equal(await store.get('old/p/b.ndjson'), null);
  t.same((await store.list('old/')).map((o) => o.key), ['old/p/a.ndjson']);
});

t.test('FileObjectStore: another instance over the same files sees what was put after it read; a small index budget only costs reads', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const writer = await FileObjectStore.open(dir);
  t.teardown(() => writer.close());
  const reader = await FileObjectStore.open(dir, { maxIndexedObjects: 3 });
  t.teardown(() => reader.close());
  for (let i = 0; i < 4; i++) await writer.put(`r/a/k${i}`, pieces(`a${i}`));
  t.equal((await reader.list('r/a/')).length, 4);
  for (let i = 0; i < 4; i++) await writer.put(`r/b/k${i}`, pieces(`b${i}`));
  await writer.put('r/a/k9', pieces('a9'));
  t.equal(await readAll(reader, 'r/a/k9'), 'a9', 'a later put is found');
  for (let i = 0; i < 4; i++) t.equal(await readAll(reader, `r/b/k${i}`), `b${i}`);
  for (let i = 0; i < 4; i++) t.equal(await readAll(reader, `r/a/k${i}`), `a${i}`, 'read again after being forgotten');
});

t.test('FileObjectStore: concurrent reads of one directory each see every object put before them', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const writer = await FileObjectStore.open(dir);
  t.teardown(() => writer.close());
  const reader = await FileObjectStore.open(dir);
  t.teardown(() => reader.close());
  for (let i = 0; i < 50; i++) await writer.put(`q/k${i}`, pieces(`v${i}`));
  const lists = await Promise.all(Array.from({ length: 20 }, () => reader.list('q/')));
  t.same(
    lists.map((l) => l.length),
    lists.map(() => 50),
    'every concurrent list sees all 50',
  );
  for (let i = 50; i < 60; i++) await writer.put(`q/k${i}`, pieces(`v${i}`));
  const later = await Promise.all(Array.from({ length: 10 }, (_, i) => readAll(reader, `q/k${50 + i}`)));
  t.same(later, Array.from({ length: 10 }, (_, i) => `v${50 + i}`), 'and the objects put after them');
});

t.test('FileObjectStore: puts racing deletes of their own prefix never fail on the directories a delete removed', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const store = await FileObjectStore.open(dir);
  t.teardown(() => store.close());
  // Deletes of the session run while its puts rename and fsync the directories they made
  // (a session deleted while its packages are uploaded): before, the fsync of a directory a
  // delete had just removed threw ENOENT and the upload failed.
  const failures: unknown[] = [];
  const deleteFailures: unknown[] = [];
  for (let round = 0; round < 150; round++) {
    const prefix = `c/s${round % 4}/`;
    const put = (i: number) => store.put(`${prefix}e${i % 4}/p${round}-${i}.ndjson`, oneLine()).catch((err: unknown) => void failures.push(err));
    // Puts begun before the deletes, and puts that make the directories again while a delete removes them.
    const before = Array.from({ length: 8 }, (_, i) => put(i));
    const deletes = Array.from({ length: 4 }, () => store.deletePrefix(prefix).catch((err: unknown) => void deleteFailures.push(err)));
    const after = Array.from({ length: 8 }, (_, i) => put(8 + i));
    await Promise.all([...before, ...deletes, ...after]);
  }
  t.same(failures.map((e) => (e as NodeJS.ErrnoException).code), [], 'no put failed');
  t.same(deleteFailures.map((e) => (e as NodeJS.ErrnoException).code), [], 'no delete failed');
});

t.test('FileObjectStore: a delete of one object racing the delete of its directory whole leaves nothing behind', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const store = await FileObjectStore.open(dir);
  t.teardown(() => store.close());
  // The uploader deletes a package it put into a session deleted meanwhile while the
  // session's delete removes the session's directories: before, the first found the key in
  // the directory's index, the second removed the directory, then the first made the
  // directory and its pack again to append the deletion (a pack of one deletion record).
  for (let round = 0; round < 200; round++) {
    const session = `c/s${round}/`;
    await Promise.all(Array.from({ length: 4 }, (_, i) => store.put(`${session}e${i % 2}/p${i}.ndjson`, oneLine())));
    await Promise.all([
      ...Array.from({ length: 4 }, (_, i) => store.deletePrefix(`${session}e${i % 2}/p${i}.ndjson`)),
      store.deletePrefix(session),
    ]);
  }
  const left = await readdir(join(dir, 'objects', 'c')).catch((err: NodeJS.ErrnoException) => (err.code === 'ENOENT' ? [] : Promise.reject(err)));
  t.same(left, [], 'no directory of a deleted session is left');
  t.same(await store.list('c/'), [], 'no object is left');
});
