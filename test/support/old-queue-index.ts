/**
 * The embedded queue as versions before the state database's `queue` table left it: its
 * commit index in `<dir>/index-0.ndjson` (one line per commit, ack and purge, each the CRC-32
 * of its JSON, a space, the JSON). Made from a queue of today: its rows become commit lines,
 * `after` follows them, and the state database goes (an older version's had no queue table).
 */
import { openSqlite } from '../../src/store/embedded/sqlite.js';
import { rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';

type Line = { t: 'a'; seq: number } | { t: 'p'; upload_uuid: string } | Record<string, unknown>;

/** An index line as the old versions wrote it (`checked: false`: the JSON alone, as the oldest did). */
export function oldIndexLine(rec: Line, checked = true): string {
  const json = JSON.stringify(rec);
  return checked ? `${crc32(json).toString(16).padStart(8, '0')} ${json}\n` : `${json}\n`;
}

/** Turns the closed queue of `dir` (its index in `statePath`) into the old layout; returns the index file and the commit records written. */
export async function toOldLayout(
  dir: string,
  statePath: string,
  opts: { after?: Line[]; checked?: boolean; map?: (rec: Record<string, unknown>) => Record<string, unknown> } = {},
): Promise<{ index: string; commits: { seq: number; package_id: string }[] }> {
  const db = openSqlite(statePath, { readonly: true });
  const rows = db.prepare<[], { seq: number; record: string }>('SELECT seq, record FROM queue ORDER BY seq').all();
  db.close();
  const commits = rows.map((r) => ({ t: 'c', seq: r.seq, ...(JSON.parse(r.record) as { meta: { package_id: string } } & Record<string, unknown>) }));
  const lines = [...commits.map((c) => opts.map?.(c) ?? c), ...(opts.after ?? [])].map((rec) => oldIndexLine(rec, opts.checked ?? true));
  const index = join(dir, 'index-0.ndjson');
  await writeFile(index, lines.join(''));
  for (const suffix of ['', '-wal', '-shm']) await rm(statePath + suffix, { force: true });
  return { index, commits: commits.map((c) => ({ seq: c.seq, package_id: c.meta.package_id })) };
}
