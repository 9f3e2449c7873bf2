import * as fsp from 'node:fs/promises';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { AppendFile } from '../../src/store/embedded/append-file.js';

async function tempFile(t: Test): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'append-file-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  return join(dir, 'log');
}

const line = (i: number) => Buffer.from(`line ${i} ${'x'.repeat(i % 17)}\n`);

t.test('writes asked for while one runs go out together, in order, at the offsets handed out', async (t) => {
  const path = await tempFile(t);
  const file = await AppendFile.open(path);
  t.teardown(() => file.close());
  const lines = Array.from({ length: 200 }, (_, i) => line(i));
  const offsets: number[] = [];
  const writes = lines.map((l) => {
    const { offset, written } = file.write(l);
    offsets.push(offset);
    return written;
  });
  await Promise.all(writes);
  const expected = Buffer.concat(lines);
  t.same(offsets, lines.map((_, i) => Buffer.concat(lines.slice(0, i)).length), 'offsets are contiguous, in call order');
  t.equal(file.size, expected.length);
  t.ok((await readFile(path)).equals(expected), 'the file holds every write in order');
  // The first goes out alone; the 199 asked for while it ran go out in one writev.
  t.equal(file.fileWrites, 2, `200 writes took ${file.fileWrites} calls to the file`);

  // Later writes, one at a time, each its own call; sync makes everything durable.
  const more = [line(200), line(201)];
  for (const l of more) await file.write(l).written;
  t.equal(file.fileWrites, 4);
  await file.sync();
  t.ok((await readFile(path)).equals(Buffer.concat([expected, ...more])));
});

t.test('append resolves with its offset once durable; concurrent appends share the writes and the syncs', async (t) => {
  const path = await tempFile(t);
  const file = await AppendFile.open(path);
  t.teardown(() => file.close());
  const lines = Array.from({ length: 50 }, (_, i) => line(i));
  const offsets = await Promise.all(lines.map((l) => file.append(l)));
  t.same(offsets, lines.map((_, i) => Buffer.concat(lines.slice(0, i)).length));
  t.ok(file.fileWrites <= 3, `${file.fileWrites} calls to the file for 50 appends`);
  t.ok((await readFile(path)).equals(Buffer.concat(lines)));
});

t.test('open cuts a torn tail past the size asked for and appends from there', async (t) => {
  const path = await tempFile(t);
  await writeFile(path, 'kept\ntorn');
  const file = await AppendFile.open(path, { size: 5 });
  await file.append(Buffer.from('next\n'));
  await file.close();
  t.equal(await readFile(path, 'utf8'), 'kept\nnext\n');
});

t.test('a closed file refuses writes', async (t) => {
  const file = await AppendFile.open(await tempFile(t));
  await file.close();
  t.throws(() => file.write(Buffer.from('late')), /is closed/);
});

t.test('writeAt overwrites bytes already appended, after the writes before it; never past the end', async (t) => {
  const path = await tempFile(t);
  const file = await AppendFile.open(path);
  t.teardown(() => file.close());
  file.write(Buffer.from('head:????\n'));
  file.write(Buffer.from('body\n'));
  await file.writeAt(Buffer.from('DONE'), 5);
  await file.sync();
  t.equal(await readFile(path, 'utf8'), 'head:DONE\nbody\n');
  await t.rejects(file.writeAt(Buffer.from('xx'), file.size - 1), RangeError);
});

t.test('a failed fdatasync breaks the file: what reached the disk is unknown, so every later call fails', async (t) => {
  const path = await tempFile(t);
  const failing = async (...args: Parameters<typeof fsp.open>) => {
    const fh = await fsp.open(...args);
    return new Proxy(fh, {
      get(target, prop) {
        if (prop === 'datasync') return async () => Promise.reject(Object.assign(new Error('EIO: i/o error, fdatasync'), { code: 'EIO' }));
        const value = Reflect.get(target, prop) as unknown;
        return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(target) : value;
      },
    });
  };
  // The module as built beside this test (a relative name would resolve against the source map's file).
  const built = new URL('../../src/store/embedded/append-file.js', import.meta.url).href;
  const { AppendFile: Mocked } = await t.mockImport<typeof import('../../src/store/embedded/append-file.js')>(built, {
    'node:fs/promises': { ...fsp, open: failing },
  });
  const file = await Mocked.open(path);
  t.teardown(() => file.close());
  await t.rejects(file.append(Buffer.from('a\n')), { code: 'EIO' });
  t.throws(() => file.write(Buffer.from('b\n')), { code: 'EIO' }, 'a later write is refused');
  await t.rejects(file.writeAt(Buffer.from('x'), 0), { code: 'EIO' }, 'and an overwrite');
});

t.test('durableSize is where the last successful fdatasync ended; failed names the error that broke the file', async (t) => {
  const path = await tempFile(t);
  let syncs = 0;
  const failing = async (...args: Parameters<typeof fsp.open>) => {
    const fh = await fsp.open(...args);
    return new Proxy(fh, {
      get(target, prop) {
        if (prop === 'datasync') {
          return async () => (++syncs === 2 ? Promise.reject(Object.assign(new Error('EIO: i/o error, fdatasync'), { code: 'EIO' })) : target.datasync());
        }
        const value = Reflect.get(target, prop) as unknown;
        return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(target) : value;
      },
    });
  };
  const built = new URL('../../src/store/embedded/append-file.js', import.meta.url).href;
  const { AppendFile: Mocked } = await t.mockImport<typeof import('../../src/store/embedded/append-file.js')>(built, {
    'node:fs/promises': { ...fsp, open: failing },
  });
  const file = await Mocked.open(path);
  t.teardown(() => file.close());
  await file.append(Buffer.from('kept\n'));
  t.equal(file.durableSize, 5);
  t.equal(file.failed, null);
  file.write(Buffer.from('overwritten later\n'));
  await t.rejects(file.writeAt(Buffer.from('O'), 5).then(() => file.sync()), { code: 'EIO' });
  t.equal(file.durableSize, 5, 'what came after the last good sync is not vouched for');
  t.match(file.failed, { code: 'EIO' });
  t.equal(file.size, 23);
});
