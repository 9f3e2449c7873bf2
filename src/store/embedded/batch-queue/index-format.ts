/**
 * The queue's index file, as lines (see `FileBatchQueue`): one per commit, ack and purge,
 * each the CRC-32 of its JSON, a space and the JSON. Written by `indexLine`, read back by
 * `readIndex`.
 */
import { crc32 } from 'node:zlib';
import type { PackageMeta } from '../../ports.js';

/** Where one batch lies: segment number, offset, length, CRC-32 of its bytes (none in indexes of earlier versions). */
export type Location = [segment: number, offset: number, length: number, crc?: number];

/** The index line of a committed package. */
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

/** An index line: the CRC-32 of its JSON (8 hex digits), a space, the JSON. */
export function indexLine(rec: IndexRecord): string {
  const json = JSON.stringify(rec);
  return `${crc32(json).toString(16).padStart(8, '0')} ${json}\n`;
}

const CHECKED_LINE = /^([0-9a-f]{8}) /;

/**
 * The records of an index file, in order, with where its valid part ends. A line that fails
 * its checksum (or does not parse) with a valid line after it is damage; failing lines with
 * none after them, and a last line without its newline, are a torn tail: `end` stops before
 * them. Lines without a checksum (an older version's) count until the first checked one.
 */
export function readIndex(text: Buffer): {
  records: { rec: IndexRecord; bytes: number }[];
  end: number;
  damaged: { offset: number; reason: string }[];
  legacy: boolean;
} {
  const records: { rec: IndexRecord; bytes: number }[] = [];
  const damaged: { offset: number; reason: string }[] = [];
  let suspects: { offset: number; reason: string }[] = [];
  let end = 0;
  let legacy = false;
  let checked = false;
  for (let start = 0, nl = text.indexOf(0x0a); nl >= 0; start = nl + 1, nl = text.indexOf(0x0a, start)) {
    const line = text.subarray(start, nl);
    const parsed = parseIndexLine(line, checked);
    if (typeof parsed === 'string') {
      suspects.push({ offset: start, reason: parsed });
      continue;
    }
    if (parsed.checked) checked = true;
    else legacy = true;
    damaged.push(...suspects);
    suspects = [];
    records.push({ rec: parsed.rec, bytes: line.length + 1 });
    end = nl + 1;
  }
  return { records, end, damaged, legacy };
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
