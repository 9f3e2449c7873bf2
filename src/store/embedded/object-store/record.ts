/**
 * The record format of a pack file (see `FileObjectStore`): each record a header line and, for
 * an object, its bytes. Headers are written here and parsed here; `reader.ts` reads records.
 */
import { crc32 } from 'node:zlib';

/**
 * A record's header line: an object `k` of `n` bytes whose CRC-32 is `c` (its bytes follow the
 * line); `n: -1`: an object still being streamed (or whose put died mid-stream); `c: -1`: `n`
 * bytes of an abandoned put, to be skipped (earlier versions marked a streamed put whose body
 * failed so; now the pack is cut back to where it began); or, with `d: 1`, the removal of
 * `k`. The numbers are padded to a fixed width, so that a streamed object's header is written
 * before its bytes and completed in place after them. Each line ends with `h`, the CRC-32 of
 * the line before `,"h":` (lines of earlier versions have none: they are read until a pack's
 * first checked one).
 */
export type Header = { k: string; n: number; c: number } | { k: string; d: 1 };

/** Width the header's numbers are padded to: `n` up to 2^53, `c` a CRC-32 (or -1). */
const N_WIDTH = 16;
const C_WIDTH = 10;

/** The `c` of a record still streaming (with `n` -1), or of a put that failed (earlier versions): readers skip its `n` bytes. */
export const ABANDONED = -1;

/** A record's header line (see `Header`). */
export function header(key: string, n: number, c: number): Buffer {
  return sealed(`{"k":${JSON.stringify(key)},"n":${String(n).padEnd(N_WIDTH)},"c":${String(c).padEnd(C_WIDTH)}`);
}

/** The header line of the removal of `key`. */
export function deletion(key: string): Buffer {
  return sealed(`{"k":${JSON.stringify(key)},"d":1`);
}

/** A header's fields closed with its own CRC-32 (of the bytes before `,"h":`) and a newline. */
function sealed(fields: string): Buffer {
  const crc = crc32(fields);
  return Buffer.from(`${fields}${H_FIELD}${String(crc).padEnd(C_WIDTH)}}\n`);
}

const H_FIELD = ',"h":';
const H_TAG = Buffer.from(H_FIELD);
const H_VALUE = /^(\d{1,10}) *\}$/;

/** A header line's header (the line without its newline), or why it is none; a line without `h` counts only while `legacy`. */
export function parseHeader(line: Buffer, legacy: boolean): { header: Header; checked: boolean } | string {
  const at = line.lastIndexOf(H_TAG);
  if (at >= 0) {
    const value = H_VALUE.exec(line.subarray(at + H_TAG.length).toString('latin1'));
    if (!value || crc32(line.subarray(0, at)) !== Number(value[1])) return 'record header fails its CRC-32';
    // As written: it parses, and is of a known shape.
    const { k, n, c, d } = JSON.parse(line.toString('utf8')) as { k: string; n?: number; c?: number; d?: 1 };
    return { header: d === 1 ? { k, d } : { k, n: n!, c: c! }, checked: true };
  }
  if (!legacy) return 'record header without its checksum';
  let h: unknown;
  try {
    h = JSON.parse(line.toString('utf8'));
  } catch {
    return 'record header that does not parse';
  }
  return isLegacyHeader(h) ? { header: h, checked: false } : 'record header of no known shape';
}

/** A header as earlier versions wrote it: `{k, n, c}` or `{k, d: 1}`, nothing else. */
function isLegacyHeader(h: unknown): h is Header {
  if (typeof h !== 'object' || h === null || Array.isArray(h) || typeof (h as { k?: unknown }).k !== 'string') return false;
  const keys = Object.keys(h).sort().join();
  const { n, c, d } = h as { n?: unknown; c?: unknown; d?: unknown };
  return (keys === 'd,k' && d === 1) || (keys === 'c,k,n' && Number.isSafeInteger(n) && Number.isSafeInteger(c));
}
