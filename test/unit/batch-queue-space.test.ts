/**
 * The embedded queue's files follow what is live: acknowledged packages give their space
 * back as they go, whatever the segment size. (Its index is a table of the state database,
 * beside the queue's directory.)
 */
import { mkdtemp, readdir, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { FileBatchQueue, type FileBatchQueueOptions } from '../../src/store/embedded/batch-queue.js';
import type { PackageMeta } from '../../src/store/ports.js';

/** A queue directory, with the state database beside it (not under it: what is measured is the queue's files). */
async function tempDir(t: Test): Promise<string> {
  const root = await mkdtemp(join(tmpdir(), 'queue-space-'));
  t.teardown(() => rm(root, { recursive: true, force: true }));
  return join(root, 'queue');
}
const stateOf = (dir: string): string => join(dir, '..', 'state.sqlite');

/** Bytes of every file under `dir`. */
async function bytesUnder(dir: string): Promise<number> {
  let total = 0;
  for (const e of await readdir(dir, { withFileTypes: true, recursive: true })) {
    if (e.isFile()) total += (await stat(join(e.parentPath, e.name)).catch(() => ({ size: 0 }))).size;
  }
  return total;
}

const meta = (i: number): PackageMeta => ({ package_id: `p${i}`, upload_uuid: `u${i % 4}`, client_id: 'c', entity: 'stores', columns: ['store_id'] });
/** A package of two batches of `size` bytes each, its number in front. */
const batchesOf = (i: number, size: number): Buffer[] => [0, 1].map((b) => Buffer.from(`["${i}-${b}-`.padEnd(size - 3, 'x') + '"]\n'));

async function push(q: FileBatchQueue, i: number, size: number): Promise<void> {
  const w = await q.open(meta(i));
  for (const b of batchesOf(i, size)) await w.append(b);
  await w.commit({ rows: 2, bytes: 2 * size });
}

/** A consumer that checks each package's bytes and lets the test wait for the n-th delivery. */
function acker(t: Test, q: FileBatchQueue, size: number) {
  let delivered = 0;
  const waiting = new Map<number, () => void>();
  const consumer = q.consume(async (pkg) => {
    const i = Number(pkg.meta.package_id.slice(1));
    const got: Buffer[] = [];
    for await (const b of pkg.batches()) got.push(Buffer.from(b));
    if (!Buffer.concat(got).equals(Buffer.concat(batchesOf(i, size)))) t.fail(`package ${i}: other bytes delivered`);
    delivered++;
    waiting.get(delivered)?.();
  });
  return {
    consumer,
    /** Resolves once `n` packages were delivered in all. */
    until: (n: number) => (delivered >= n ? Promise.resolve() : new Promise<void>((resolve) => waiting.set(n, resolve))),
  };
}

t.test('N packages pushed and acked: the queue gives their space back, down to an empty segment', async (t) => {
  const dir = await tempDir(t);
  const opts: FileBatchQueueOptions = { redeliveryDelayMs: 5, heldBytes: 0 };
  const q = await FileBatchQueue.open(dir, stateOf(dir), opts);
  const N = 300;
  const size = 2048;
  for (let i = 0; i < N; i++) await push(q, i, size);
  const full = await bytesUnder(dir);
  t.ok(full >= N * 2 * size, `${full} bytes while ${N} packages of ${2 * size} bytes wait`);
  const { consumer, until } = acker(t, q, size);
  await until(N);
  await consumer.stop();
  await q.close(); // waits for the segments being removed
  const segments = await readdir(join(dir, 'segments'));
  t.equal(segments.length, 1, `one segment left, the fresh one (${segments.join(', ')})`);
  t.equal((await stat(join(dir, 'segments', segments[0]!))).size, 0, 'and it is empty');
  t.equal(await bytesUnder(dir), 0, 'nothing else left in the queue directory');

  // Reopened, nothing comes back and nothing more is kept.
  const again = await FileBatchQueue.open(dir, stateOf(dir), opts);
  t.teardown(() => again.close());
  t.equal((await again.backlog()).packages, 0);
});

t.test('a long push-and-ack loop: the data directory stays within a bound set by what is live, not by the segment size', async (t) => {
  const dir = await tempDir(t);
  // 16 MiB segments (the default): nothing here comes near a segment's size limit.
  const q = await FileBatchQueue.open(dir, stateOf(dir), { redeliveryDelayMs: 5, heldBytes: 0 });
  t.teardown(() => q.close());
  const size = 8 * 1024;
  const perRound = 8;
  const rounds = 250;
  const { consumer, until } = acker(t, q, size);
  t.teardown(() => consumer.stop());
  const samples: number[] = [];
  let pushed = 0;
  for (let r = 0; r < rounds; r++) {
    for (let k = 0; k < perRound; k++) await push(q, pushed++, size);
    samples.push(await bytesUnder(dir));
    await until(pushed);
    samples.push(await bytesUnder(dir));
  }
  const total = pushed * 2 * size;
  const live = perRound * 2 * size;
  // Live at a sample: at most one round's packages; the segments they emptied may still be
  // in removal (each waits for the acks that freed it to be durable).
  const bound = 4 * live;
  const max = Math.max(...samples);
  t.ok(total > 30 * 1024 * 1024, `${(total / 1048576).toFixed(1)} MiB pushed and acked`);
  t.ok(max <= bound, `the directory peaked at ${max} bytes (bound ${bound}: four rounds of live packages)`);
  const lastTenth = samples.slice(-Math.floor(samples.length / 10));
  t.ok(Math.max(...lastTenth) <= bound, 'and stays there to the end: flat, not growing with what went through');
});
