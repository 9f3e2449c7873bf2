import { mkdir, mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import t from 'tap';
import { appendFile, readFile, stat, writeFile } from 'node:fs/promises';
import { FileBatchQueue } from '../../src/store/embedded/batch-queue.js';
import { FileLedger } from '../../src/store/embedded/ledger.js';
import { FileObjectStore } from '../../src/store/embedded/object-store.js';
import { FileSessionStore } from '../../src/store/embedded/session-store.js';
import { batchQueueContract } from './batch-queue.contract.js';
import { entry, ledgerContract } from './ledger.contract.js';
import { objectStoreContract } from './object-store.contract.js';
import { sessionStoreContract } from './session-store.contract.js';

const tempDir = (): Promise<string> => mkdtemp(join(tmpdir(), 'ingest-embedded-'));
const remove = (dir: string) => () => rm(dir, { recursive: true, force: true });

sessionStoreContract(t, 'FileSessionStore', async () => {
  const dir = await tempDir();
  return { store: await FileSessionStore.open(dir), reopen: () => FileSessionStore.open(dir), cleanup: remove(dir) };
});

ledgerContract(t, 'FileLedger', async () => {
  const dir = await tempDir();
  return { ledger: await FileLedger.open(dir), reopen: () => FileLedger.open(dir), cleanup: remove(dir) };
});

t.test('FileLedger: beyond its index budget it forgets sessions and reads them again from disk', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const ledger = await FileLedger.open(dir, { maxIndexedIds: 10, maxOpenFiles: 2 });
  t.teardown(() => ledger.close());
  const sessions = Array.from({ length: 5 }, (_, i) => `0000000${i}-0000-4000-8000-000000000000`);
  for (const [i, uuid] of sessions.entries()) await ledger.append(uuid, Array.from({ length: 6 }, (_, j) => entry(`s${i}-p${j}`)));
  for (const [i, uuid] of sessions.entries()) {
    t.same(await ledger.get(uuid, `s${i}-p5`), entry(`s${i}-p5`), `session ${i}: found after being forgotten`);
    await ledger.append(uuid, [entry(`s${i}-p0`)]);
  }
  const lines = (await readFile(join(dir, `${sessions[0]}.ndjson`), 'utf8')).trimEnd().split('\n');
  t.equal(lines.length, 6, 'an entry known from disk is not written again');
});

t.test('FileLedger: a torn last line (an append that never resolved) is not an entry', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const uuid = '00000000-0000-4000-8000-000000000001';
  await writeFile(join(dir, `${uuid}.ndjson`), `${JSON.stringify(entry('p-1'))}\n`);
  await appendFile(join(dir, `${uuid}.ndjson`), JSON.stringify(entry('p-2')).slice(0, 20));
  const ledger = await FileLedger.open(dir);
  t.teardown(() => ledger.close());
  t.equal(await ledger.get(uuid, 'p-2'), null);
  t.same((await ledger.get(uuid, 'p-1'))?.package_id, 'p-1');
});

t.test('FileLedger: a torn last line does not swallow the next entry written after it', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const uuid = '00000000-0000-4000-8000-000000000002';
  await writeFile(join(dir, `${uuid}.ndjson`), `${JSON.stringify(entry('p-1'))}\n${JSON.stringify(entry('p-2')).slice(0, 20)}`);
  const ledger = await FileLedger.open(dir);
  await ledger.append(uuid, [entry('p-3')]);
  await ledger.close();
  const again = await FileLedger.open(dir);
  t.teardown(() => again.close());
  t.same(await again.get(uuid, 'p-3'), entry('p-3'));
  t.same(await again.get(uuid, 'p-1'), entry('p-1'));
});

t.test('FileLedger: an acknowledged entry is in the write-ahead log until its session file is synced; a crash replays it', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const [u1, u2] = ['00000000-0000-4000-8000-000000000003', '00000000-0000-4000-8000-000000000004'];
  const crashed = await FileLedger.open(dir);
  t.teardown(() => crashed.close());
  await Promise.all([crashed.append(u1, [entry('a-1'), entry('a-2')]), crashed.append(u2, [entry('b-1')])]);
  await crashed.append(u2, [entry('b-2')]);
  await crashed.drop(u2);
  t.same((await readdir(dir)).filter((n) => n.startsWith('wal-')), ['wal-1.log'], 'one log, shared by the sessions');
  // Power lost before the session file reached the disk: its lines are gone, a torn one is left.
  await writeFile(join(dir, `${u1}.ndjson`), JSON.stringify(entry('a-1')).slice(0, 15));
  const again = await FileLedger.open(dir);
  t.teardown(() => again.close());
  t.notOk((await readdir(dir)).includes('wal-1.log'), 'the replayed log is gone (the new instance writes wal-2.log)');
  t.same(await again.get(u1, 'a-1'), entry('a-1'));
  t.same(await again.get(u1, 'a-2'), entry('a-2'));
  t.equal(await again.get(u2, 'b-1'), null, 'a dropped session stays dropped');
  t.notOk((await readdir(dir)).includes(`${u2}.ndjson`));
  t.same((await again.sessions()).sort(), [u1]);
});

t.test('FileLedger: appended lines wait for their session file until it is read, and a crash before that replays them from the log', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const uuid = '00000000-0000-4000-8000-000000000006';
  const file = join(dir, `${uuid}.ndjson`);
  const lines = async () => (await readFile(file, 'utf8').catch(() => '')).split('\n').filter(Boolean).length;
  const crashed = await FileLedger.open(dir);
  t.teardown(() => crashed.close());
  for (let i = 0; i < 10; i++) await crashed.append(uuid, [entry(`p-${i}`)]);
  t.equal(await lines(), 0, 'ten acknowledged appends, none written to the session file yet (the log holds them)');
  t.same(await crashed.get(uuid, 'p-9'), entry('p-9'), 'known at once');
  const listed: string[] = [];
  for await (const e of crashed.list(uuid)) listed.push(e.package_id);
  t.equal(listed.length, 10, 'list sees every one');
  t.equal(await lines(), 10, 'reading the session wrote its waiting lines, in one go');
  for (let i = 10; i < 15; i++) await crashed.append(uuid, [entry(`p-${i}`)]);
  t.equal(await lines(), 10, 'the next ones wait again');
  t.same((await FileLedger.peek(dir, uuid)).map((e) => e.package_id).sort(), Array.from({ length: 15 }, (_, i) => `p-${i}`).sort(), 'peek reads them from the log');
  // A crash now: the process is gone, its waiting lines with it; the log replays them.
  const again = await FileLedger.open(dir);
  t.teardown(() => again.close());
  for (let i = 0; i < 15; i++) t.same(await again.get(uuid, `p-${i}`), entry(`p-${i}`), `p-${i} after the crash`);
  const relisted: string[] = [];
  for await (const e of again.list(uuid)) relisted.push(e.package_id);
  t.equal(relisted.length, 15, 'listed once each');
});

t.test('FileLedger: past walBytes the log is checkpointed (session files synced, the old log removed), and at a clean close', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const uuid = '00000000-0000-4000-8000-000000000005';
  const ledger = await FileLedger.open(dir, { walBytes: 300 });
  for (let i = 0; i < 20; i++) await ledger.append(uuid, [entry(`p-${i}`)]);
  const during = (await readdir(dir)).filter((n) => n.startsWith('wal-')).map((n) => Number(n.slice(4, -4)));
  t.ok(Math.max(...during) > 1, `the log was replaced as it grew (${during.join(', ')})`);
  await ledger.close();
  t.same((await readdir(dir)).filter((n) => n.startsWith('wal-')), [], 'a clean close leaves no log to replay');
  // Without the logs, the session file alone holds every entry.
  const again = await FileLedger.open(dir);
  t.teardown(() => again.close());
  for (let i = 0; i < 20; i++) t.same(await again.get(uuid, `p-${i}`), entry(`p-${i}`), `p-${i}`);
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
  const q = await FileBatchQueue.open(dir, queueOpts);
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
  const again = await FileBatchQueue.open(dir, queueOpts);
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
  const q = await FileBatchQueue.open(dir, { ...queueOpts, heldBytes: 12, onDamage: (file, offset) => void damage.push([basename(file), offset]) });
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
  const again = await FileBatchQueue.open(dir, queueOpts);
  t.teardown(() => again.close());
  const w = await again.open(meta('before-restart'));
  await w.append(Buffer.from('["s-3"]\n'));
  await w.commit({ rows: 1, bytes: 8 });
  await again.close();
  const third = await FileBatchQueue.open(dir, queueOpts);
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

t.test('FileBatchQueue: segments roll over, and go once their packages are acked', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const q = await FileBatchQueue.open(dir, { ...queueOpts, segmentBytes: 64, indexCompactBytes: 512 });
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
  const index = (await readdir(dir)).filter((n) => n.startsWith('index-'));
  t.equal(index.length, 1, 'one index file');
});

t.test('FileSessionStore: a journal; a torn last line is ignored and cut off', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const s = await FileSessionStore.open(dir);
  await Promise.allSettled(Array.from({ length: 5 }, () => s.create('Session.1', { n: 1 })));
  await s.create('x', 1);
  await s.delete('x');
  await s.close();
  t.same((await readdir(dir)).sort(), ['journal-0.ndjson']);
  await appendFile(join(dir, 'journal-0.ndjson'), '{"k":"x","r":3,"v":');
  const again = await FileSessionStore.open(dir);
  t.teardown(() => again.close());
  t.same(await again.get('Session.1'), { value: { n: 1 }, revision: 1 });
  t.equal(await again.get('x'), null, 'the torn write never happened');
  t.equal(await again.create('x', 2), 3, 'the tombstone kept its revision');
  t.notMatch(await readFile(join(dir, 'journal-0.ndjson'), 'utf8'), /"v":\{?$/m, 'the torn tail was cut off');
});

t.test('FileSessionStore: compaction folds the journal into a snapshot and loses nothing', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const s = await FileSessionStore.open(dir, { compactBytes: 2048 });
  const revisions = new Map<string, number>();
  for (let round = 0; round < 40; round++) {
    await Promise.all(
      Array.from({ length: 10 }, async (_, k) => {
        const key = `k${k}`;
        const rev = revisions.get(key);
        revisions.set(key, rev === undefined ? await s.create(key, { round }) : await s.update(key, { round }, rev));
      }),
    );
  }
  await s.delete('k9');
  await s.close();
  const files = (await readdir(dir)).sort();
  t.ok(files.some((f) => f.startsWith('snapshot-')), `compacted (${files.join(', ')})`);
  t.ok(files.length <= 3, 'older journals and snapshots are gone');
  const again = await FileSessionStore.open(dir, { compactBytes: 2048 });
  t.teardown(() => again.close());
  for (let k = 0; k < 9; k++) t.same(await again.get(`k${k}`), { value: { round: 39 }, revision: 40 });
  t.equal(await again.get('k9'), null);
  t.equal(await again.create('k9', 1), 42, 'revisions never repeat');
});

t.test('FileSessionStore: the one-file-per-key layout of an older version is read and folded into a snapshot', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  await writeFile(join(dir, '^session.1.json'), JSON.stringify({ revision: 4, value: { n: 4 } }));
  await writeFile(join(dir, 'x.json'), JSON.stringify({ revision: 2 }));
  const s = await FileSessionStore.open(dir);
  t.teardown(() => s.close());
  t.same(await s.get('Session.1'), { value: { n: 4 }, revision: 4 });
  t.equal(await s.get('x'), null);
  t.equal(await s.create('x', 1), 3);
  t.notOk((await readdir(dir)).some((f) => f.endsWith('.json')), 'the old files are gone');
  t.same(await FileSessionStore.peek(dir, 'Session.1'), { value: { n: 4 }, revision: 4 }, 'peek reads the same without opening');
});

async function readAll(store: FileObjectStore, key: string): Promise<string | null> {
  const body = await store.get(key);
  if (!body) return null;
  const parts: Buffer[] = [];
  for await (const chunk of body) parts.push(Buffer.from(chunk));
  return Buffer.concat(parts).toString();
}

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

t.test('FileObjectStore: a streamed put whose body fails is no object, and its directory goes on', async (t) => {
  const dir = await tempDir();
  t.teardown(remove(dir));
  const store = await FileObjectStore.open(dir);
  await store.put('y/before', pieces('before'));
  const big = Buffer.alloc(3 * 1024 * 1024, 'b');
  async function* failing(): AsyncIterable<Uint8Array> {
    yield big;
    yield big; // past what is held: it streams
    throw new Error('the body broke');
  }
  await t.rejects(store.put('y/broken', failing()), { message: 'the body broke' });
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
  async function* oneLine() {
    yield Buffer.from('line\n');
  }
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
