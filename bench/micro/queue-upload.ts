/**
 * Micro-benchmark of the embedded default's background path of small packages: 7 KB
 * packages of 16 sessions committed to the `FileBatchQueue` (64 at a time), taken by the
 * uploader (8 consumers, no session check) and stored in the `FileObjectStore`. Reports the
 * process's CPU per package (user + system, every thread: libuv's file calls included) until
 * the last one is stored. Run two builds one after another, alternating, to compare them.
 *
 *   node dist/bench/micro/queue-upload.js [--packages 6000]
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { FileBatchQueue } from '../../src/store/embedded/batch-queue.js';
import { FileObjectStore } from '../../src/store/embedded/object-store.js';
import { startUploader } from '../../src/uploader/uploader.js';

const { values } = parseArgs({ options: { packages: { type: 'string', default: '6000' } } });
const total = Number(values.packages);
const dir = await mkdtemp(join(tmpdir(), 'queue-upload-'));
try {
  const queue = await FileBatchQueue.open(join(dir, 'queue'), join(dir, 'state.sqlite'));
  const objects = await FileObjectStore.open(join(dir, 'objects'));
  const batch = Buffer.from('["p-000001","Product name é",12.5,"c-1"]\n'.repeat(160));
  let stored = 0;
  let allStored!: () => void;
  const done = new Promise<void>((resolve) => (allStored = resolve));
  const uploader = startUploader({
    queue,
    objects,
    prefix: 'uploads',
    concurrency: 8,
    observer: { stored: () => void (++stored === total && allStored()), abandoned: () => {}, failed: () => {} },
  });
  const cpu0 = process.cpuUsage();
  const wall0 = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: 64 }, async () => {
      while (next < total) {
        const i = next++;
        const writer = await queue.open({ package_id: `p${i}`, upload_uuid: `u${i % 16}`, client_id: 'c', entity: 'products', columns: ['product_id', 'name', 'price', 'catalog_id'] });
        const bytes = Buffer.from(batch);
        await writer.append(bytes);
        await writer.commit({ rows: 160, bytes: bytes.byteLength });
      }
    }),
  );
  await done;
  const cpu = process.cpuUsage(cpu0);
  const seconds = (performance.now() - wall0) / 1000;
  console.log(
    `${total} packages of ${batch.byteLength} bytes: ${((cpu.user + cpu.system) / total).toFixed(0)} µs of CPU per package stored ` +
      `(user ${(cpu.user / total).toFixed(0)}, system ${(cpu.system / total).toFixed(0)}), ${(total / seconds).toFixed(0)} packages/s`,
  );
  await uploader.stop();
  await queue.close();
  await objects.close();
} finally {
  await rm(dir, { recursive: true, force: true });
}
