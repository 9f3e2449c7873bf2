/**
 * Damage on the embedded queue's and object store's files: bit flips in the middle of a file
 * and a torn end, at offsets drawn from a seeded generator (`DAMAGE_SEED` replays a run). A
 * damaged record costs itself only, is reported with its file and offset, and is never read
 * as other bytes; a torn tail is cut without a report.
 */
import { mkdtemp, readFile, readdir, rm, truncate, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { FileBatchQueue } from '../../src/store/embedded/batch-queue.js';
import { FileObjectStore } from '../../src/store/embedded/object-store.js';
import type { PackageMeta } from '../../src/store/ports.js';
import { readText } from '../support/objects.js';
import { seededRandom } from '../support/random.js';
import { toOldLayout } from '../support/old-queue-index.js';

const SEED = Number(process.env.DAMAGE_SEED ?? 19);
const TRIALS = 25;

const random = seededRandom;

async function tempDir(t: Test): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'embedded-damage-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

/** Flips bit `bit` of the byte at `offset`. */
async function flip(file: string, offset: number, bit: number): Promise<void> {
  const bytes = await readFile(file);
  bytes[offset]! ^= 1 << bit;
  await writeFile(file, bytes);
}

/** Start offsets of the lines of a file, and where it ends. */
async function lineStarts(file: string): Promise<{ starts: number[]; size: number }> {
  const bytes = await readFile(file);
  const starts = [0];
  for (let i = bytes.indexOf(0x0a); i >= 0 && i + 1 < bytes.length; i = bytes.indexOf(0x0a, i + 1)) starts.push(i + 1);
  return { starts, size: bytes.length };
}

type Damage = [file: string, offset: number, reason: string];

const meta = (i: number): PackageMeta => ({ package_id: `p${i}`, upload_uuid: 'u1', client_id: 'c', entity: 'stores', columns: ['store_id'] });
const batchOf = (i: number): string => `["store-${i}","${'y'.repeat(i * 7)}"]\n`;

/** Every package the queue delivers, with its bytes, once each (a damaged one is dropped, not redelivered). */
async function drain(q: FileBatchQueue, expected: number): Promise<{ got: Map<string, string>; lost: string[] }> {
  const got = new Map<string, string>();
  const lost: string[] = [];
  let done!: () => void;
  const all = new Promise<void>((resolve) => (done = resolve));
  let left = expected;
  if (left === 0) done();
  const consumer = q.consume(async (pkg) => {
    try {
      const parts: Buffer[] = [];
      for await (const b of pkg.batches()) parts.push(Buffer.from(b));
      got.set(pkg.meta.package_id, Buffer.concat(parts).toString());
    } catch (err) {
      lost.push(`${pkg.meta.package_id}:${(err as { code?: string }).code}`);
      throw err;
    } finally {
      if (--left === 0) done();
    }
  });
  await all;
  await consumer.stop();
  return { got, lost };
}

t.test('queue index of an earlier version, imported: a flipped bit costs its line only, is reported where it starts; a torn last line is cut, unreported', async (t) => {
  const rnd = random(SEED);
  for (let trial = 0; trial < TRIALS; trial++) {
    const dir = await tempDir(t);
    const N = 12;
    const q = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), { redeliveryDelayMs: 5 });
    for (let i = 0; i < N; i++) {
      const w = await q.open(meta(i));
      await w.append(Buffer.from(batchOf(i)));
      await w.commit({ rows: 1, bytes: Buffer.byteLength(batchOf(i)) });
    }
    await q.close();
    // The index as an earlier version kept it, in a file of lines: damage there is found at the import.
    const { index } = await toOldLayout(dir, join(dir, 'state.sqlite'));
    const { starts, size } = await lineStarts(index);
    t.equal(starts.length, N, 'a commit line per package');
    // One or two lines damaged in the middle (never the last), a bit flipped anywhere but in their newline.
    const hit = new Set<number>();
    for (let k = 1 + rnd(2); k > 0; k--) hit.add(rnd(N - 1));
    for (const line of hit) await flip(index, starts[line]! + rnd(starts[line + 1]! - 1 - starts[line]!), rnd(8));
    // Half the trials: the last line torn (a crash in its write).
    const torn = rnd(2) === 1;
    if (torn) await truncate(index, starts[N - 1]! + 1 + rnd(size - starts[N - 1]! - 1));

    const damage: Damage[] = [];
    const again = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), { redeliveryDelayMs: 5, onDamage: (...d) => void damage.push(d) });
    const expected = Array.from({ length: N }, (_, i) => i).filter((i) => !hit.has(i) && !(torn && i === N - 1));
    const what = `trial ${trial}: lines ${[...hit].sort((a, b) => a - b).join(', ')} flipped${torn ? ', the last torn' : ''}`;
    // A damaged line with no valid one after it (the one before a torn last line) is the torn tail's.
    const reported = [...hit].filter((line) => expected.some((i) => i > line)).sort((a, b) => a - b);
    t.same(
      damage.map(([file, offset]) => [file, offset]),
      reported.map((line) => [index, starts[line]]),
      `${what}: each damaged line reported, at its offset`,
    );
    t.equal(again.damaged, reported.length);
    const { got, lost } = await drain(again, expected.length);
    t.same(lost, [], `${what}: no batch lost`);
    t.same(
      [...got.keys()].sort(),
      expected.map((i) => `p${i}`).sort(),
      `${what}: every package whose line is whole comes back, the others do not`,
    );
    for (const [id, body] of got) if (body !== batchOf(Number(id.slice(1)))) t.fail(`${what}: ${id} delivered other bytes`);
    await again.close();
    // The damage went with the index file it was in: a restart finds none, and the same packages in the table.
    t.same((await readdir(dir)).filter((n) => n.startsWith('index-')), [], `${what}: the index file is gone once imported`);
    const third = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), { redeliveryDelayMs: 5, onDamage: (...d) => void damage.push(d) });
    t.equal(third.damaged, 0, `${what}: reported once, not at every restart`);
    await third.close();
  }
});

t.test('queue segments: a flipped bit in a batch drops that package (QUEUE_BATCH_LOST, reported with file and offset); the others arrive whole', async (t) => {
  const rnd = random(SEED + 1);
  for (let trial = 0; trial < TRIALS; trial++) {
    const dir = await tempDir(t);
    const N = 10;
    // Nothing held in memory: every package is read from its segment.
    const q = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), { redeliveryDelayMs: 5, heldBytes: 0 });
    const offsets: number[] = [];
    let at = 0;
    for (let i = 0; i < N; i++) {
      const w = await q.open(meta(i));
      await w.append(Buffer.from(batchOf(i)));
      await w.commit({ rows: 1, bytes: Buffer.byteLength(batchOf(i)) });
      offsets.push(at);
      at += Buffer.byteLength(batchOf(i));
    }
    await q.close();
    const segment = join(dir, 'segments', '0.seg');
    const hit = rnd(N);
    await flip(segment, offsets[hit]! + rnd(Buffer.byteLength(batchOf(hit))), rnd(8));
    const damage: Damage[] = [];
    const again = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), { redeliveryDelayMs: 5, heldBytes: 0, onDamage: (...d) => void damage.push(d) });
    try {
      const { got, lost } = await drain(again, N);
      t.same(lost, [`p${hit}:QUEUE_BATCH_LOST`], `trial ${trial}: package ${hit} lost`);
      t.same(damage.map(([file, offset]) => [file, offset]), [[segment, offsets[hit]]], 'reported at its batch');
      t.equal(got.size, N - 1);
      for (const [id, body] of got) t.equal(body, batchOf(Number(id.slice(1))), `${id} whole`);
      t.equal(await again.pending('u1'), 0, 'the damaged package is not delivered again');
    } finally {
      // Closed trial by trial: 25 queues open at once, two threads each, slowed the file past its timeout under load.
      await again.close();
    }
  }
});

t.test('a session purged after one of its packages was taken: its read ends with QUEUE_PACKAGE_DROPPED, no damage is reported', async (t) => {
  const dir = await tempDir(t);
  const damage: Damage[] = [];
  // Nothing held in memory: the delivery reads its segment, the only one, released by the purge.
  const q = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), { redeliveryDelayMs: 5, heldBytes: 0, onDamage: (...d) => void damage.push(d) });
  t.teardown(() => q.close());
  const w = await q.open(meta(1));
  await w.append(Buffer.from(batchOf(1)));
  await w.commit({ rows: 1, bytes: Buffer.byteLength(batchOf(1)) });
  let taken!: () => void;
  const inHandler = new Promise<void>((resolve) => (taken = resolve));
  let purgedNow!: () => void;
  const purged = new Promise<void>((resolve) => (purgedNow = resolve));
  let settled!: (r: { body?: string; err?: string }) => void;
  const outcome = new Promise<{ body?: string; err?: string }>((resolve) => (settled = resolve));
  const consumer = q.consume(async (pkg) => {
    taken();
    await purged;
    try {
      const parts: Buffer[] = [];
      for await (const b of pkg.batches()) parts.push(Buffer.from(b));
      settled({ body: Buffer.concat(parts).toString() });
    } catch (err) {
      settled({ err: (err as { code?: string }).code ?? String(err) });
    }
  });
  t.teardown(() => consumer.stop());
  await inHandler;
  await q.purge('u1');
  purgedNow();
  t.same(await outcome, { err: 'QUEUE_PACKAGE_DROPPED' }, 'the read ends: nothing of a purged package is handed out');
  await consumer.stop();
  t.same(damage, [], 'no damage reported');
  t.equal(await q.pending('u1'), 0, 'the package is gone from the queue');
  await q.close();
  t.notOk((await readdir(join(dir, 'segments'))).includes('0.seg'), 'and so is its segment');
});

const readAll = readText;

async function* bytes(text: string): AsyncIterable<Uint8Array> {
  yield Buffer.from(text);
}

/** Object i: some lines of text, and for every third one no newline at its end (the next header does not start a line). */
const objectOf = (i: number): string => `${`{"row":${i}}\n`.repeat(1 + (i % 5))}${i % 3 === 0 ? 'tail' : ''}`;

t.test('object packs: a flipped bit in a record (header or bytes) costs that object only, reported where its record starts; a torn end is cut', async (t) => {
  const rnd = random(SEED + 2);
  for (let trial = 0; trial < TRIALS; trial++) {
    const dir = await tempDir(t);
    const N = 12;
    const store = await FileObjectStore.open(dir);
    const starts: number[] = [];
    for (let i = 0; i < N; i++) {
      starts.push((await readFile(join(dir, 'objects', 'd', '~pack')).catch(() => Buffer.alloc(0))).length);
      await store.put(`d/k${i}`, bytes(objectOf(i)));
    }
    await store.close();
    const pack = join(dir, 'objects', 'd', '~pack');
    const size = (await readFile(pack)).length;
    const ends = [...starts.slice(1), size];
    // One or two records, not side by side: a record whose header is damaged is skipped by
    // finding the next header, and one right after it with its header start damaged as well
    // is not found (see the adjacent case below).
    const hit = new Set<number>([rnd(N - 1)]);
    const second = rnd(N - 1);
    if (rnd(2) === 1 && [...hit].every((r) => Math.abs(r - second) > 1)) hit.add(second);
    for (const r of hit) await flip(pack, starts[r]! + rnd(ends[r]! - starts[r]!), rnd(8));
    const torn = rnd(2) === 1;
    if (torn) await truncate(pack, starts[N - 1]! + 1 + rnd(size - starts[N - 1]! - 1));

    const damage: Damage[] = [];
    const again = await FileObjectStore.open(dir, { onDamage: (...d) => void damage.push(d) });
    const expected = Array.from({ length: N }, (_, i) => i).filter((i) => !hit.has(i) && !(torn && i === N - 1));
    const what = `trial ${trial}: records ${[...hit].sort((a, b) => a - b).join(', ')} flipped${torn ? ', the last torn' : ''}`;
    t.same((await again.list('d/')).map((o) => o.key), expected.map((i) => `d/k${i}`).sort(), `${what}: the whole records are listed, the others not`);
    const reported = [...hit].filter((r) => expected.some((i) => i > r)).sort((a, b) => a - b);
    t.same(
      damage.map(([file, offset]) => [file, offset]),
      reported.map((r) => [pack, starts[r]]),
      `${what}: each damaged record reported, at its offset`,
    );
    for (const i of expected) t.equal(await readAll(again, `d/k${i}`), objectOf(i), `${what}: k${i} whole`);
    for (const i of hit) t.equal(await again.get(`d/k${i}`), null, `${what}: k${i} is absent, not other bytes`);
    // The writer cuts the torn end only: a new object lands after the last valid record, damage kept in place.
    await again.put('d/after', bytes('after'));
    await again.close();
    const third = await FileObjectStore.open(dir, { onDamage: () => {} });
    t.same((await third.list('d/')).map((o) => o.key), [...expected.map((i) => `d/k${i}`), 'd/after'].sort(), `${what}: and after a put and a restart`);
    t.equal(await readAll(third, 'd/after'), 'after');
    await third.close();
  }
});

t.test('object packs: two damaged records side by side cost those two only', async (t) => {
  const dir = await tempDir(t);
  const store = await FileObjectStore.open(dir);
  for (let i = 0; i < 4; i++) await store.put(`d/k${i}`, bytes(objectOf(i)));
  await store.close();
  const pack = join(dir, 'objects', 'd', '~pack');
  const text = await readFile(pack);
  const k1 = text.indexOf('{"k":"d/k1"');
  const k2 = text.indexOf('{"k":"d/k2"');
  // k1's key and k2's very first byte: k2 is found neither from k1's size nor by its start.
  await flip(pack, k1 + 8, 0);
  await flip(pack, k2, 1);
  const damage: Damage[] = [];
  const again = await FileObjectStore.open(dir, { onDamage: (...d) => void damage.push(d) });
  t.teardown(() => again.close());
  t.same((await again.list('d/')).map((o) => o.key), ['d/k0', 'd/k3']);
  t.same(damage.map(([, offset]) => offset), [k1], 'reported where the damaged run starts');
  t.equal(await readAll(again, 'd/k3'), objectOf(3));
});

t.test('object packs: bytes damaged after the index was read are never handed out as the object', async (t) => {
  const dir = await tempDir(t);
  const damage: Damage[] = [];
  const store = await FileObjectStore.open(dir, { onDamage: (...d) => void damage.push(d) });
  t.teardown(() => store.close());
  const big = 'B'.repeat(3 * 1024 * 1024 + 5);
  await store.put('e/small', bytes('small object'));
  await store.put('e/big', bytes(big));
  t.equal((await store.list('e/')).length, 2, 'both read into the index');
  const pack = join(dir, 'objects', 'e', '~pack');
  const text = await readFile(pack);
  const smallAt = text.indexOf('small object');
  const bigAt = text.indexOf('BBBB');
  await flip(pack, smallAt + 3, 2);
  await flip(pack, bigAt + 2 * 1024 * 1024, 5);
  for (const [key, at] of [['e/small', smallAt], ['e/big', bigAt]] as const) {
    const parts: Buffer[] = [];
    const body = await store.get(key);
    await t.rejects(
      (async () => {
        for await (const chunk of body!) parts.push(Buffer.from(chunk));
      })(),
      { code: 'STORE_CORRUPT' },
      `${key}: the read fails`,
    );
    t.ok(Buffer.concat(parts).length < (key === 'e/big' ? big.length : 12), `${key}: not all of it was handed out`);
    t.ok(damage.some(([file, offset]) => file === pack && offset === at), `${key}: reported at its bytes`);
  }
  t.equal(store.damaged, 2);
});

t.test('an index of an earliest version (lines without checksums, locations without CRCs) is imported', async (t) => {
  const dir = await tempDir(t);
  const q = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), { redeliveryDelayMs: 5 });
  const w = await q.open(meta(1));
  await w.append(Buffer.from(batchOf(1)));
  await w.commit({ rows: 1, bytes: Buffer.byteLength(batchOf(1)) });
  await q.close();
  // As the earliest version wrote it: the JSON alone, and a location without a CRC.
  await toOldLayout(dir, join(dir, 'state.sqlite'), {
    checked: false,
    map: (rec) => ({ ...rec, batches: (rec.batches as number[][]).map((b) => b.slice(0, 3)) }),
  });
  const again = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), { redeliveryDelayMs: 5 });
  t.equal(again.damaged, 0);
  t.equal(await again.pending('u1'), 1);
  const { got } = await drain(again, 1);
  t.equal(got.get('p1'), batchOf(1));
  await again.close();
  t.same((await readdir(dir)).filter((n) => n.startsWith('index-')), [], 'the index file is gone');
});
