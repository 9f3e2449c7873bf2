/**
 * Power cuts under the embedded queue and object store: both on faultfs (a disk that loses
 * whatever was not fsync'ed), packages committed on many lanes while an uploader stores and
 * acks them, the power cut at a random acknowledged commit (`DRILL_SEED` replays a run). After
 * each cut, what a crash left must read as a torn tail, never as damage; and at the end every
 * acknowledged package is stored, with its own bytes.
 */
import { join } from 'node:path';
import t from 'tap';
import { FileBatchQueue } from '../../src/store/embedded/batch-queue.js';
import { FileObjectStore } from '../../src/store/embedded/object-store.js';
import type { QueueConsumer } from '../../src/store/ports.js';
import { tempDir } from '../../testbed/env.js';
import { mountFaultFs } from '../../testbed/faultfs.js';
import { seededRandom } from '../support/random.js';

const SEED = Number(process.env.DRILL_SEED ?? 7);
const CUTS = 3;
const LANES = 12;

const random = seededRandom;

/** A package's two batches: its id in every row, sizes varying with it. */
const batchesOf = (id: string): Buffer[] => [1, 2].map((b) => Buffer.from(`["${id}","${'r'.repeat((id.length * 37 * b) % 3000)}"]\n`.repeat(1 + b)));
const bodyOf = (id: string): string => Buffer.concat(batchesOf(id)).toString();

async function* chunks(pkgBatches: AsyncIterable<Uint8Array>): AsyncIterable<Uint8Array> {
  for await (const b of pkgBatches) yield b;
}

t.test('power cuts under the embedded queue and object store: no damage reported, every acknowledged package stored whole', async (t) => {
  const rnd = random(SEED);
  const disk = await mountFaultFs(t, await tempDir(t, 'embedded-power-'));
  const damage: string[] = [];
  const onDamage = (file: string, offset: number, reason: string): void => void damage.push(`${file}@${offset}: ${reason}`);
  const open = async () => ({
    queue: await FileBatchQueue.open(join(disk.dir, 'queue'), join(disk.dir, 'state.sqlite'), { redeliveryDelayMs: 5, heldBytes: 0, segmentBytes: 256 * 1024, onDamage }),
    objects: await FileObjectStore.open(join(disk.dir, 'data'), { onDamage }),
  });
  const uploader = (queue: FileBatchQueue, objects: FileObjectStore, stored: (id: string) => void): QueueConsumer[] =>
    Array.from({ length: 3 }, () =>
      queue.consume(async (pkg) => {
        await objects.put(`o/${pkg.meta.upload_uuid}/${pkg.meta.package_id}`, chunks(pkg.batches()));
        stored(pkg.meta.package_id);
      }),
    );
  const acknowledged = new Set<string>();

  for (let cut = 0; cut < CUTS; cut++) {
    const { queue, objects } = await open();
    const consumers = uploader(queue, objects, () => {});
    const at = 40 + rnd(160);
    let acked = 0;
    let powerOff: Promise<void> | null = null;
    await Promise.all(
      Array.from({ length: LANES }, async (_, lane) => {
        for (let n = 0; powerOff === null; n++) {
          const id = `c${cut}-l${lane}-${n}`;
          try {
            const w = await queue.open({ package_id: id, upload_uuid: `u${lane % 4}`, client_id: 'c', entity: 'stores', columns: ['store_id', 'name'] });
            for (const b of batchesOf(id)) await w.append(b);
            await w.commit({ rows: 5, bytes: batchesOf(id).reduce((s, b) => s + b.length, 0) });
          } catch {
            return; // the power is gone
          }
          acknowledged.add(id);
          // In the tick of the acknowledgement: the other lanes' writes are mid-way.
          if (++acked === at) powerOff = disk.powerCut();
        }
      }),
    );
    await powerOff;
    await Promise.allSettled(consumers.map((c) => c.stop()));
    await queue.close().catch(() => {});
    await objects.close().catch(() => {});
    await disk.remount();
    // Recovery reads what the cut left: a torn tail at most, never damage.
    const again = await open();
    t.same(damage, [], `cut ${cut} at the ${at}th acknowledgement: no damage reported on reopening`);
    await again.queue.close();
    await again.objects.close();
  }

  // Everything left in the queue is stored now.
  const { queue, objects } = await open();
  t.teardown(() => objects.close());
  const left = (await queue.backlog()).packages;
  let done = 0;
  let drained!: () => void;
  const all = new Promise<void>((resolve) => (drained = resolve));
  if (left === 0) drained();
  const consumers = uploader(queue, objects, () => void (++done === left && drained()));
  await all;
  await Promise.all(consumers.map((c) => c.stop()));
  await queue.close();

  const stored = new Map((await objects.list('o/')).map((o) => [o.key.split('/')[2]!, o.key]));
  const missing = [...acknowledged].filter((id) => !stored.has(id));
  t.same(missing, [], `every one of the ${acknowledged.size} acknowledged packages is stored`);
  let wrong = 0;
  for (const [id, key] of stored) {
    const parts: Buffer[] = [];
    for await (const c of (await objects.get(key))!) parts.push(Buffer.from(c));
    if (Buffer.concat(parts).toString() !== bodyOf(id)) wrong++;
  }
  t.equal(wrong, 0, `each of the ${stored.size} stored objects holds its own package's bytes`);
  t.same(damage, [], 'no damage reported at all');
});
