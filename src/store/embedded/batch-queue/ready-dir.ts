import { readdir, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import type { PackageMeta, PackageWriter } from '../../ports.js';

/** Packages an older version left as `ready/<upload_uuid>/<package_id>/{data,commit.json}`: copied into a segment and committed. */
export async function adoptReady(queueDir: string, open: (meta: PackageMeta) => Promise<PackageWriter>): Promise<void> {
  const ready = join(queueDir, 'ready');
  const sessions = await readdir(ready).catch(() => [] as string[]);
  const old = (await Promise.all(
    sessions.map(async (uuid) => (await readdir(join(ready, uuid)).catch(() => [] as string[])).map((pkg) => join(ready, uuid, pkg))),
  )).flat();
  const found: { seq: number; meta: PackageMeta; rows: number; bytes: number; batches: number[]; dir: string }[] = [];
  for (const dir of old) {
    const rec = JSON.parse(await readFile(join(dir, 'commit.json'), 'utf8').catch(() => 'null')) as Omit<(typeof found)[number], 'dir'> | null;
    if (rec) found.push({ ...rec, dir });
  }
  for (const rec of found.sort((a, b) => a.seq - b.seq)) {
    const data = await readFile(join(rec.dir, 'data'));
    const writer = await open(rec.meta);
    let off = 0;
    for (const len of rec.batches) {
      await writer.append(data.subarray(off, off + len));
      off += len;
    }
    await writer.commit({ rows: rec.rows, bytes: rec.bytes });
  }
  for (const d of ['ready', 'incoming', 'trash']) await rm(join(queueDir, d), { recursive: true, force: true });
}
