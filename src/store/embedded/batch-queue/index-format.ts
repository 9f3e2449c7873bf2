/**
 * The queue's commit records, and the index file an earlier version kept them in
 * (`<dir>/index-<m>.ndjson`: one line per commit, ack and purge, each the CRC-32 of its JSON,
 * a space and the JSON). The records now live in the state database's `queue` table
 * (batch-queue.ts); the file is only read, once, to import its live packages (`readOldIndex`).
 */
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import type { PackageMeta } from '../../ports.js';

/** Where one batch lies: segment number, offset, length, CRC-32 of its bytes (none in indexes of earlier versions). */
export type Location = [segment: number, offset: number, length: number, crc?: number];

/** A committed package, as its row of `queue` (and its line of an old index) holds it. */
export interface CommitRecord {
  t: 'c';
  seq: number;
  meta: PackageMeta;
  rows: number;
  bytes: number;
  /** Commit time (epoch ms). */
  at: number;
  batches: Location[];
}

export type IndexRecord = CommitRecord | { t: 'a'; seq: number } | { t: 'p'; upload_uuid: string };

const INDEX = /^index-(\d+)\.ndjson$/;

/**
 * The old index files of `dir` (none: an empty list) and the live packages of the newest
 * one (older ones were left by a crash mid-compaction), replayed in commit order, with the
 * damage found in it.
 */
export async function readOldIndex(dir: string): Promise<{ files: string[]; path: string; live: CommitRecord[]; damaged: { offset: number; reason: string }[] }> {
  const nos = (await readdir(dir))
    .map((n) => Number(INDEX.exec(n)?.[1] ?? NaN))
    .filter(Number.isInteger)
    .sort((a, b) => a - b);
  const files = nos.map((no) => join(dir, `index-${no}.ndjson`));
  const path = files.at(-1) ?? join(dir, 'index-0.ndjson');
  if (files.length === 0) return { files, path, live: [], damaged: [] };
  const { records, damaged } = readIndex(await readFile(path));
  const live = new Map<number, CommitRecord>();
  for (const { rec } of records) {
    if (rec.t === 'c') live.set(rec.seq, rec);
    else if (rec.t === 'a') live.delete(rec.seq);
    else for (const [seq, c] of live) if (c.meta.upload_uuid === rec.upload_uuid) live.delete(seq);
  }
  return { files, path, live: [...live.values()].sort((a, b) => a.seq - b.seq), damaged };
}

const CHECKED_LINE = /^([0-9a-f]{8}) /;

/**
 * The records of an index file, in order. A line that fails its checksum (or does not parse)
 * with a valid line after it is damage; failing lines with none after them, and a last line
 * without its newline, are a torn tail, not damage. Lines without a checksum (an older
 * version's still) count until the first checked one.
 */
export function readIndex(text: Buffer): { records: { rec: IndexRecord }[]; damaged: { offset: number; reason: string }[] } {
  const records: { rec: IndexRecord }[] = [];
  const damaged: { offset: number; reason: string }[] = [];
  let suspects: { offset: number; reason: string }[] = [];
  let checked = false;
  for (let start = 0, nl = text.indexOf(0x0a); nl >= 0; start = nl + 1, nl = text.indexOf(0x0a, start)) {
    const parsed = parseIndexLine(text.subarray(start, nl), checked);
    if (typeof parsed === 'string') {
      suspects.push({ offset: start, reason: parsed });
      continue;
    }
    if (parsed.checked) checked = true;
    damaged.push(...suspects);
    suspects = [];
    records.push({ rec: parsed.rec });
  }
  return { records, damaged };
}

/** An index line's record, or why it is not one. */
function parseIndexLine(line: Buffer, checkedOnly: boolean): { rec: IndexRecord; checked: boolean } | string {
  const head = CHECKED_LINE.exec(line.subarray(0, 9).toString('latin1'));
  if (head) {
    const json = line.subarray(9);
    if (crc32(json) !== parseInt(head[1]!, 16)) return 'index line fails its CRC-32';
    return { rec: JSON.parse(json.toString('utf8')) as IndexRecord, checked: true };
  }
  if (checkedOnly || line[0] !== 0x7b) return 'index line without its checksum';
  try {
    const rec = JSON.parse(line.toString('utf8')) as IndexRecord;
    return rec && typeof rec === 'object' && 't' in rec ? { rec, checked: false } : 'index line of no known record';
  } catch {
    return 'index line that does not parse';
  }
}
