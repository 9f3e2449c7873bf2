/**
 * The power-cut drill's file layer itself (testbed/faultfs): data written to a file is
 * volatile until the file is fsync'ed on any of its descriptors; a cut loses exactly that.
 */
import { open, readFile, rename, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { mountFaultFs } from '../../testbed/faultfs.js';
import { tempDir } from '../../testbed/env.js';

const fill = (c: string, n: number): Buffer => Buffer.alloc(n, c);

async function fresh(t: Test) {
  return mountFaultFs(t, await tempDir(t, 'faultfs-backing-'));
}

t.test('written, closed, not synced: gone after the cut', async (t) => {
  const fs = await fresh(t);
  const file = join(fs.dir, 'a');
  await writeFile(file, 'volatile');
  t.equal(await readFile(file, 'utf8'), 'volatile', 'readers see the unsynced bytes');
  t.equal((await stat(file)).size, 8, 'and the size they make');
  t.equal((await stat(join(fs.backingDir, 'a'))).size, 0, 'the disk holds none of them');
  await fs.powerCut();
  await fs.remount();
  // The name is metadata, kept (faultfs treats metadata as synced); the data is not.
  t.equal(await readFile(file, 'utf8'), '', 'the bytes are gone');
});

t.test('written and fsync\'ed (or fdatasync\'ed): survives the cut', async (t) => {
  const fs = await fresh(t);
  for (const [name, sync] of [
    ['s', (h: Awaited<ReturnType<typeof open>>) => h.sync()],
    ['d', (h: Awaited<ReturnType<typeof open>>) => h.datasync()],
  ] as const) {
    const h = await open(join(fs.dir, name), 'w');
    await h.write(fill('a', 10_000), 0, 10_000, 0);
    await sync(h);
    await h.write(fill('b', 100), 0, 100, 10_000); // after the sync: volatile
    await h.close();
  }
  await fs.powerCut();
  await fs.remount();
  for (const name of ['s', 'd']) t.same(await readFile(join(fs.dir, name)), fill('a', 10_000), `${name}: the synced bytes, not the later ones`);
});

t.test('part of a synced file overwritten without a sync: the old bytes come back', async (t) => {
  const fs = await fresh(t);
  const file = join(fs.dir, 'f');
  const old = Buffer.from('0123456789'.repeat(1000)); // 10,000 bytes: three pages
  const h = await open(file, 'w+');
  await h.write(old, 0, old.length, 0);
  await h.sync();
  // Across a page boundary (4096), and a hole past the end.
  await h.write(Buffer.from('XXXXXXXX'), 0, 8, 4092);
  await h.write(Buffer.from('tail'), 0, 4, 20_000);
  const now = Buffer.from(old);
  now.write('XXXXXXXX', 4092);
  const grown = Buffer.concat([now, Buffer.alloc(10_000), Buffer.from('tail')]);
  t.same(await readFile(file), grown, 'reads see the overwrite, zeros in the hole, the tail');
  const mid = Buffer.alloc(20);
  await h.read(mid, 0, 20, 4085); // a read over synced and unsynced bytes of two pages
  t.same(mid, grown.subarray(4085, 4105), 'a read across the overwrite');
  await h.close();
  await fs.powerCut();
  await fs.remount();
  t.same(await readFile(file), old, 'after the cut: the synced file, as it was');
});

t.test('two descriptors of one file share its unsynced data; an fsync on either makes it durable', async (t) => {
  const fs = await fresh(t);
  const file = join(fs.dir, 'two');
  const a = await open(file, 'w+');
  const b = await open(file, 'r+');
  await a.write(Buffer.from('from-a'), 0, 6, 0);
  const seen = Buffer.alloc(6);
  await b.read(seen, 0, 6, 0);
  t.equal(seen.toString(), 'from-a', 'b reads what a wrote');
  await b.write(Buffer.from('+b'), 0, 2, 6);
  await b.datasync(); // syncs a's write too: the file, not the descriptor
  await a.write(Buffer.from('!lost'), 0, 5, 8);
  await a.close();
  await b.close();
  t.equal(await readFile(file, 'utf8'), 'from-a+b!lost', 'before the cut');
  await fs.powerCut();
  await fs.remount();
  t.equal(await readFile(file, 'utf8'), 'from-a+b', 'after: what either descriptor synced');
});

t.test('unsynced data follows its file through a rename; truncate goes straight through', async (t) => {
  const fs = await fresh(t);
  const h = await open(join(fs.dir, 'tmp'), 'w');
  await h.write(Buffer.from('renamed'), 0, 7, 0);
  await h.close();
  await rename(join(fs.dir, 'tmp'), join(fs.dir, 'final'));
  const again = await open(join(fs.dir, 'final'), 'r+');
  await again.sync();
  await again.truncate(3);
  await again.close();
  t.equal(await readFile(join(fs.dir, 'final'), 'utf8'), 'ren');
  await fs.powerCut();
  await fs.remount();
  t.equal(await readFile(join(fs.dir, 'final'), 'utf8'), 'ren', 'synced under its new name, then truncated');
});

t.test('a program using the disk at the cut gets errors, not hangs', async (t) => {
  const fs = await fresh(t);
  const h = await open(join(fs.dir, 'open'), 'w');
  await h.write(Buffer.from('x'), 0, 1, 0);
  await fs.powerCut();
  await t.rejects(h.sync(), 'fsync after the cut fails');
  await h.close().catch(() => undefined);
  await fs.remount();
  t.equal(await readFile(join(fs.dir, 'open'), 'utf8'), '');
});
