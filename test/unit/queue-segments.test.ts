/**
 * The embedded queue's segment files: a segment no package uses goes once the acks that freed
 * it are durable; where they cannot be made so, its file stays on disk for the next open, and
 * is closed all the same (a handle left to the garbage collector whose close fails, a disk
 * gone, is an uncaught exception: the end of the process).
 */
import { mkdtemp, readdir, readlink, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { Segments } from '../../src/store/embedded/batch-queue/segments.js';

/** Files under `dir` this process holds open. */
async function openUnder(dir: string): Promise<string[]> {
  const links = await Promise.all((await readdir('/proc/self/fd')).map((fd) => readlink(`/proc/self/fd/${fd}`).catch(() => '')));
  return links.filter((l) => l.startsWith(`${dir}/`)).sort();
}

for (const durable of [true, false]) {
  t.test(`a segment no package uses: ${durable ? 'acks durable, removed' : 'acks not durable, kept on disk'}, closed`, async (t) => {
    const dir = await mkdtemp(join(tmpdir(), 'segments-'));
    t.teardown(() => rm(dir, { recursive: true, force: true }));
    const segments = new Segments(dir, 64, {
      acksDurable: () => (durable ? Promise.resolve() : Promise.reject(new Error('EIO'))),
      empty: () => false,
      closed: () => false,
    });
    await segments.recover(new Map(), -1);
    // Past the segment size: the next batch goes to a fresh segment, this one waits for its refs.
    const { segment, written } = segments.place(Buffer.alloc(100, 0x61));
    segment.refs++;
    await written;
    // The fresh segment's file opens on its own schedule: wait for it, not for the clock.
    await segments.get(1)?.file;
    t.same(await openUnder(dir), [join(dir, '0.seg'), join(dir, '1.seg')], 'both segments open');
    segments.release([segment]);
    await segments.settled();
    t.same(await openUnder(dir), [join(dir, '1.seg')], 'the released one is closed');
    t.equal((await readdir(dir)).includes('0.seg'), !durable, durable ? 'and removed' : 'and left for the next open');
    await Promise.all(segments.closing());
  });
}
