/**
 * A failed write or fdatasync (ENOSPC, EIO) of the embedded queue or object store fails the
 * calls it carried and nothing after it: the next write goes to a fresh file (or to the
 * pack cut back to its last durable byte), and what failed is never seen, now or after a
 * restart. Faults are injected by a file handle that fails the next call on a matching path;
 * the queue's index (the state database's `queue` table) by a row put in the way of the next
 * commit, which fails that commit's transaction in the writer thread as an EIO or ENOSPC would
 * (state-writer.ts).
 */
import { openSqlite } from '../../src/store/embedded/sqlite.js';
import * as fsp from 'node:fs/promises';
import { mkdtemp, readdir, readFile, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { isStorageUnavailable } from '../../src/errors.js';
import { FileBatchQueue } from '../../src/store/embedded/batch-queue.js';
import { FileObjectStore } from '../../src/store/embedded/object-store.js';
import type { PackageMeta } from '../../src/store/ports.js';

type Call = 'open' | 'datasync' | 'write' | 'sync' | 'truncate';

/** Faults to inject: each fails the next call of its kind on a file whose path matches, once. */
const faults: { call: Call; path: RegExp; code: 'EIO' | 'ENOSPC' | 'SHORT'; bytes?: number }[] = [];
/** Directories fsynced (opened read-only, then `sync`). */
const dirSyncs: string[] = [];

function take(call: Call, path: string): Error | number | null {
  const i = faults.findIndex((f) => f.call === call && f.path.test(path));
  if (i < 0) return null;
  const [f] = faults.splice(i, 1);
  // A short write (a disk that fills up mid-write): only the first `bytes` go out.
  if (f!.code === 'SHORT') return f!.bytes ?? 1;
  return Object.assign(new Error(`${f!.code}: injected, ${call} ${path}`), { code: f!.code });
}

async function faultyOpen(...args: Parameters<typeof fsp.open>): Promise<fsp.FileHandle> {
  const path = String(args[0]);
  const failed = take('open', path);
  if (failed instanceof Error) throw failed;
  const fh = await fsp.open(...args);
  return new Proxy(fh, {
    get(target, prop) {
      if (prop === 'truncate') {
        return async (len?: number) => {
          const err = take('truncate', path);
          if (err instanceof Error) throw err;
          return target.truncate(len);
        };
      }
      if (prop === 'datasync' || prop === 'sync') {
        return async () => {
          const err = take(prop, path);
          if (err instanceof Error) throw err;
          if (prop === 'sync' && (await target.stat()).isDirectory()) dirSyncs.push(path);
          return target[prop]();
        };
      }
      if (prop === 'write' || prop === 'writev') {
        const real = (target[prop] as (...a: unknown[]) => Promise<unknown>).bind(target);
        return async (...a: unknown[]) => {
          const err = take('write', path);
          if (err instanceof Error) throw err;
          if (typeof err === 'number') {
            // write(buffer, offset, length, position) or writev(buffers, position): the first `err` bytes, then the count.
            const [data, position] = prop === 'write' ? [Buffer.from(a[0] as Uint8Array).subarray(a[1] as number, (a[1] as number) + (a[2] as number)), a[3] as number] : [Buffer.concat(a[0] as Uint8Array[]), a[1] as number];
            const part = data.subarray(0, Math.min(err, data.byteLength - 1));
            const { bytesWritten } = await target.write(part, 0, part.byteLength, position);
            return prop === 'write' ? { bytesWritten, buffer: a[0] } : { bytesWritten, buffers: a[0] };
          }
          return real(...a);
        };
      }
      const value = Reflect.get(target, prop) as unknown;
      return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
}

/** The modules as built beside this test (a relative name would resolve against the source map's file), with the faulty `open` under them. */
async function mocked(t: Test) {
  const fs = { 'node:fs/promises': { ...fsp, open: faultyOpen } };
  const url = (m: string) => new URL(`../../src/${m}`, import.meta.url).href;
  const { FileBatchQueue: Queue } = await t.mockImport<typeof import('../../src/store/embedded/batch-queue.js')>(url('store/embedded/batch-queue.js'), fs);
  const { FileObjectStore: Objects } = await t.mockImport<typeof import('../../src/store/embedded/object-store.js')>(url('store/embedded/object-store.js'), fs);
  const { mkdirDurable } = await t.mockImport<typeof import('../../src/durable-file.js')>(url('durable-file.js'), fs);
  return { Queue, Objects, mkdirDurable };
}

async function tempDir(t: Test): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'write-faults-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

const meta = (id: string): PackageMeta => ({ package_id: id, upload_uuid: 'u1', client_id: 'c', entity: 'stores', columns: ['store_id'] });
const batchOf = (id: string): Buffer => Buffer.from(`["${id}"]\n`);

async function commit(q: FileBatchQueue, id: string): Promise<void> {
  const w = await q.open(meta(id));
  try {
    await w.append(batchOf(id));
    await w.commit({ rows: 1, bytes: batchOf(id).length });
  } catch (err) {
    await w.abort();
    throw err;
  }
}

/** The packages a queue holds, delivered and read back, by id. */
async function delivered(q: FileBatchQueue): Promise<Map<string, string>> {
  const got = new Map<string, string>();
  const n = (await q.backlog()).packages;
  if (n === 0) return got;
  await new Promise<void>((resolve) => {
    const consumer = q.consume(async (pkg) => {
      const parts: Buffer[] = [];
      for await (const b of pkg.batches()) parts.push(Buffer.from(b));
      got.set(pkg.meta.package_id, Buffer.concat(parts).toString());
      if (got.size === n) void consumer.stop().then(resolve);
    });
  });
  return got;
}

t.beforeEach(() => {
  faults.length = 0;
});

for (const [what, fault] of [
  ['a segment fdatasync fails (EIO)', { call: 'datasync', path: /\.seg$/, code: 'EIO' }],
  ['a segment write fails (ENOSPC)', { call: 'write', path: /\.seg$/, code: 'ENOSPC' }],
] as const) {
  t.test(`queue: ${what}: that commit fails as storage unavailable and is never seen; the next one goes through, to a fresh file`, async (t) => {
    const { Queue } = await mocked(t);
    const dir = await tempDir(t);
    const q = await Queue.open(dir, join(dir, 'state.sqlite'), { redeliveryDelayMs: 5, heldBytes: 0 });
    await commit(q, 'before');
    const filesBefore = [...(await readdir(dir)), ...(await readdir(join(dir, 'segments')))];
    faults.push({ ...fault });
    const failed = await commit(q, 'failed').then(
      () => null,
      (err: unknown) => err,
    );
    t.match(failed, { code: fault.code }, 'the commit fails with the disk error');
    t.ok(isStorageUnavailable(failed), 'which the service answers 503 Storage temporarily unavailable');
    t.equal(faults.length, 0, 'the fault was met');
    t.equal(await q.pending('u1'), 1, 'the failed package is not pending');
    await commit(q, 'after');
    const filesAfter = [...(await readdir(dir)), ...(await readdir(join(dir, 'segments')))];
    t.ok(filesAfter.some((f) => !filesBefore.includes(f)), `the next write went to a fresh file (${filesBefore.join(', ')} → ${filesAfter.join(', ')})`);
    t.same([...(await delivered(q))].sort(), [['after', '["after"]\n'], ['before', '["before"]\n']], 'the consumer sees the two others, whole');
    await q.close();

    // Nothing of it after a restart either; the two others are acked, so nothing at all.
    const again = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), { redeliveryDelayMs: 5 });
    t.equal((await again.backlog()).packages, 0);
    await commit(again, 'later');
    t.same([...(await delivered(again))], [['later', '["later"]\n']]);
    await again.close();
  });
}

/**
 * Makes the state database refuse the queue's next commit: a row in the way of its seq (the
 * queue's highest + 1), written by another connection. Returns its removal.
 */
function refuseNextCommit(statePath: string): () => void {
  const db = openSqlite(statePath);
  const seq = ((db.prepare('SELECT max(seq) AS m FROM queue').get() as { m: number | null }).m ?? 0) + 1;
  db.prepare('INSERT INTO queue (seq, upload, record) VALUES (?, ?, ?)').run(seq, 'in-the-way', '{}');
  return () => {
    db.prepare('DELETE FROM queue WHERE seq = ?').run(seq);
    db.close();
  };
}

t.test('queue: the transaction of a commit fails: that commit fails as storage unavailable and is never seen, now or after a restart; the others and the next go through', async (t) => {
  const dir = await tempDir(t);
  const state = join(dir, 'state.sqlite');
  const q = await FileBatchQueue.open(dir, state, { redeliveryDelayMs: 5, heldBytes: 0 });
  await commit(q, 'before');
  const clear = refuseNextCommit(state);
  const failed = await commit(q, 'failed').then(
    () => null,
    (err: unknown) => err,
  );
  clear();
  t.match(failed, { code: 'STORE_UNAVAILABLE' }, 'the commit fails');
  t.ok(isStorageUnavailable(failed), 'which the service answers 503 Storage temporarily unavailable');
  t.equal(await q.pending('u1'), 1, 'the failed package is not pending');
  await commit(q, 'after');
  t.same([...(await delivered(q))].sort(), [['after', '["after"]\n'], ['before', '["before"]\n']], 'the consumer sees the two others, whole, and nothing of the failed one');
  await q.close();
  const again = await FileBatchQueue.open(dir, state, { redeliveryDelayMs: 5 });
  t.equal((await again.backlog()).packages, 0, 'after a restart: nothing (the two others were acked)');
  await again.close();
});

t.test('queue: a segment of an unacked package that fails to open at start (EIO) is opened again when read: no unhandled rejection, the package is delivered', async (t) => {
  const { Queue } = await mocked(t);
  const dir = await tempDir(t);
  const before = await Queue.open(join(dir, 'queue'), join(dir, 'state.sqlite'));
  await commit(before, 'kept');
  await before.close();
  const [segment] = await readdir(join(dir, 'queue', 'segments'));
  faults.push({ call: 'open', path: new RegExp(`/${segment!.replace('.', '\\.')}$`), code: 'EIO' });
  const q = await Queue.open(join(dir, 'queue'), join(dir, 'state.sqlite'));
  t.teardown(() => q.close());
  t.equal(faults.length, 0, 'the open of its segment at start failed');
  t.same(await delivered(q), new Map([['kept', batchOf('kept').toString()]]), 'its package is read from it');
});

t.test('queue: unacked packages survive a failed write of a later one, across a restart', async (t) => {
  const { Queue } = await mocked(t);
  const dir = await tempDir(t);
  const q = await Queue.open(dir, join(dir, 'state.sqlite'), { redeliveryDelayMs: 5, heldBytes: 0 });
  await commit(q, 'a');
  faults.push({ call: 'datasync', path: /\.seg$/, code: 'EIO' });
  await t.rejects(commit(q, 'b'), { code: 'EIO' });
  const clear = refuseNextCommit(join(dir, 'state.sqlite'));
  await t.rejects(commit(q, 'c'), { code: 'STORE_UNAVAILABLE' });
  clear();
  await commit(q, 'd');
  await q.close();
  const again = await FileBatchQueue.open(dir, join(dir, 'state.sqlite'), { redeliveryDelayMs: 5 });
  t.teardown(() => again.close());
  t.same([...(await delivered(again))].sort(), [['a', '["a"]\n'], ['d', '["d"]\n']]);
});

for (const [what, fault] of [
  ['a pack fdatasync fails (EIO)', { call: 'datasync', path: /~pack$/, code: 'EIO' }],
  ['a pack write fails (ENOSPC)', { call: 'write', path: /~pack$/, code: 'ENOSPC' }],
] as const) {
  t.test(`object store: ${what}: that put fails and its object is never listed; the pack is cut back and the next put goes through`, async (t) => {
    const { Objects } = await mocked(t);
    const dir = await tempDir(t);
    const store = await Objects.open(dir);
    const body = async function* (text: string) {
      yield Buffer.from(text);
    };
    await store.put('s/one', body('one'));
    const pack = join(dir, 'objects', 's', '~pack');
    const oneRecord = (await stat(pack)).size;
    faults.push({ ...fault });
    const failed = await store.put('s/two', body('two')).then(
      () => null,
      (err: unknown) => err,
    );
    t.match(failed, { code: fault.code });
    t.ok(isStorageUnavailable(failed));
    t.same((await store.list('s/')).map((o) => o.key), ['s/one'], 'not listed');
    t.equal(await store.get('s/two'), null, 'not found');
    t.equal((await stat(pack)).size, oneRecord, 'the pack is cut back to its last durable byte');
    await store.put('s/three', body('three'));
    await store.close();
    const again = await FileObjectStore.open(dir);
    t.teardown(() => again.close());
    t.same((await again.list('s/')).map((o) => o.key), ['s/one', 's/three'], 'after a restart too');
    const three = await again.get('s/three');
    const parts: Buffer[] = [];
    for await (const c of three!) parts.push(Buffer.from(c));
    t.equal(Buffer.concat(parts).toString(), 'three');
  });
}

t.test('object store: a put whose write runs short and then fails with ENOSPC is no object, and takes no later put with it', async (t) => {
  const { Objects } = await mocked(t);
  const dir = await tempDir(t);
  const store = await Objects.open(dir);
  const body = async function* (text: string) {
    yield Buffer.from(text);
  };
  await store.put('s/one', body('one'));
  const pack = join(dir, 'objects', 's', '~pack');
  const oneRecord = (await stat(pack)).size;
  // Its header and 3 bytes reach the file, then the disk is full.
  faults.push({ call: 'write', path: /~pack$/, code: 'SHORT', bytes: 80 }, { call: 'write', path: /~pack$/, code: 'ENOSPC' });
  const [two, three] = await Promise.allSettled([store.put('s/two', body('two-'.repeat(20))), store.put('s/three', body('three'))]);
  t.match(two, { status: 'rejected', reason: { code: 'ENOSPC' } });
  t.match(three, { status: 'rejected' }, 'the put that waited behind it fails too');
  t.same((await store.list('s/')).map((o) => o.key), ['s/one'], 'not listed');
  t.equal(await store.get('s/two'), null, 'not found');
  t.equal((await stat(pack)).size, oneRecord, 'the pack is cut back to its last durable byte');
  await store.put('s/four', body('four'));
  await store.put('s/five', body('five'));
  await store.close();
  const again = await FileObjectStore.open(dir);
  t.teardown(() => again.close());
  t.same((await again.list('s/')).map((o) => ({ key: o.key, size: o.size })), [{ key: 's/five', size: 4 }, { key: 's/four', size: 4 }, { key: 's/one', size: 3 }], 'after a restart too, each of its own size');
  for (const [key, text] of [['s/one', 'one'], ['s/four', 'four'], ['s/five', 'five']] as const) {
    const parts: Buffer[] = [];
    for await (const c of (await again.get(key))!) parts.push(Buffer.from(c));
    t.equal(Buffer.concat(parts).toString(), text, `${key} holds its own bytes`);
  }
});

t.test('object store: a streamed put whose fdatasync fails leaves no object; the next put of the directory goes through', async (t) => {
  const { Objects } = await mocked(t);
  const dir = await tempDir(t);
  const store = await Objects.open(dir);
  t.teardown(() => store.close());
  const big = Buffer.alloc(5 * 1024 * 1024, 'b');
  async function* streamed() {
    yield big.subarray(0, 3 * 1024 * 1024);
    yield big.subarray(3 * 1024 * 1024);
  }
  faults.push({ call: 'datasync', path: /~pack$/, code: 'EIO' });
  await t.rejects(store.put('b/big', streamed()), { code: 'EIO' });
  t.same(await store.list('b/'), []);
  t.equal((await stat(join(dir, 'objects', 'b', '~pack'))).size, 0, 'cut back to nothing');
  await store.put('b/small', (async function* () {
    yield Buffer.from('small');
  })());
  t.same((await store.list('b/')).map((o) => o.key), ['b/small']);
});

t.test('object store: a streamed put whose body fails and whose cut back fails leaves no object; the next put of the directory goes through', async (t) => {
  const { Objects } = await mocked(t);
  const dir = await tempDir(t);
  const store = await Objects.open(dir);
  t.teardown(() => store.close());
  await store.put('c/before', (async function* () {
    yield Buffer.from('before');
  })());
  const packed = (await stat(join(dir, 'objects', 'c', '~pack'))).size;
  async function* failing() {
    yield Buffer.alloc(3 * 1024 * 1024, 'b');
    yield Buffer.alloc(3 * 1024 * 1024, 'b'); // past what is held: it streams
    throw new Error('the body broke');
  }
  faults.push({ call: 'truncate', path: /~pack$/, code: 'EIO' });
  await t.rejects(store.put('c/broken', failing()), { code: 'EIO' });
  t.equal(faults.length, 0, 'the cut back was tried');
  t.same((await store.list('c/')).map((o) => o.key), ['c/before']);
  await store.put('c/after', (async function* () {
    yield Buffer.from('after');
  })());
  t.same((await store.list('c/')).map((o) => o.key), ['c/after', 'c/before']);
  const again = await Objects.open(dir);
  t.teardown(() => again.close());
  t.same((await again.list('c/')).map((o) => o.key), ['c/after', 'c/before'], 'and after a restart');
  t.ok((await stat(join(dir, 'objects', 'c', '~pack'))).size < packed + 1024, 'none of the failed put is left: the pack was cut back when opened again');
});

t.test('new directories are made durable: the parent of each one made is fsynced', async (t) => {
  const { Queue, Objects, mkdirDurable } = await mocked(t);
  const dir = await tempDir(t);
  dirSyncs.length = 0;
  await mkdirDurable(join(dir, 'a', 'b', 'c'));
  t.same(dirSyncs.sort(), [dir, join(dir, 'a'), join(dir, 'a', 'b')]);
  dirSyncs.length = 0;
  await mkdirDurable(join(dir, 'a', 'b', 'c'));
  t.same(dirSyncs, [], 'nothing made, nothing synced');

  dirSyncs.length = 0;
  const q = await Queue.open(join(dir, 'queue'), join(dir, 'state.sqlite'));
  await commit(q, 'p');
  await q.close();
  t.ok([dir, join(dir, 'queue'), join(dir, 'queue', 'segments')].every((d) => dirSyncs.includes(d)), `the queue's directories and its first segment's entry (${dirSyncs.join(', ')})`);

  dirSyncs.length = 0;
  const store = await Objects.open(join(dir, 'data'));
  await store.put('x/y/z', (async function* () {
    yield Buffer.from('z');
  })());
  await store.close();
  const objects = join(dir, 'data', 'objects');
  t.ok([dir, join(dir, 'data'), objects, join(objects, 'x'), join(objects, 'x', 'y')].every((d) => dirSyncs.includes(d)), `the store's directories and its pack's entry (${dirSyncs.join(', ')})`);
  t.equal(await readFile(join(objects, 'x', 'y', '~pack')).then((b) => b.length > 0), true);
});

t.test('a new directory or pack whose entry failed to be made durable is made durable at its next use, not taken as durable', async (t) => {
  const { Objects, mkdirDurable } = await mocked(t);
  const dir = await tempDir(t);
  const exact = (p: string) => new RegExp(`^${p.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}$`);
  faults.push({ call: 'sync', path: exact(join(dir, 'a')), code: 'EIO' });
  await t.rejects(mkdirDurable(join(dir, 'a', 'b', 'c')), { code: 'EIO' }, "the fsync of b's parent fails");
  dirSyncs.length = 0;
  await mkdirDurable(join(dir, 'a', 'b', 'c'));
  t.same(dirSyncs.sort(), [dir, join(dir, 'a')], 'the next call syncs the parents of a and of b, which it did not make');
  dirSyncs.length = 0;
  await mkdirDurable(join(dir, 'a', 'b', 'c'));
  t.same(dirSyncs, [], 'then nothing more');

  const store = await Objects.open(join(dir, 'data'));
  t.teardown(() => store.close());
  const pack = join(dir, 'data', 'objects', 'x');
  const body = (s: string) =>
    (async function* () {
      yield Buffer.from(s);
    })();
  faults.push({ call: 'sync', path: exact(pack), code: 'EIO' });
  await t.rejects(store.put('x/one', body('1')), { code: 'EIO' }, "the fsync of the new pack's directory fails");
  dirSyncs.length = 0;
  await store.put('x/two', body('2'));
  t.ok(dirSyncs.includes(pack), `the next put makes the pack's entry durable (${dirSyncs.join(', ')})`);
  t.same((await store.list('x/')).map((o) => o.key), ['x/two']);
});
