/**
 * Object keys as file names (see `FileObjectStore`): every segment escaped to `[a-z0-9._-]`
 * plus `%xx`; and the files of the one-file-per-object layout of earlier versions, `<name>~`.
 */
import type { Dirent } from 'node:fs';
import { join } from 'node:path';

export function escapeSegment(segment: string): string {
  if (PLAIN_SEGMENT.test(segment)) return segment;
  let out = '';
  for (const byte of Buffer.from(segment, 'utf8')) {
    const c = String.fromCharCode(byte);
    out += /[a-z0-9._-]/.test(c) ? c : `%${byte.toString(16).padStart(2, '0')}`;
  }
  return out;
}

/** A segment that escapes to itself. */
const PLAIN_SEGMENT = /^[a-z0-9._-]*$/;

export function unescapeSegment(name: string): string {
  return Buffer.from(name.replace(/%([0-9a-f]{2})/g, (_, h: string) => String.fromCharCode(parseInt(h, 16))), 'latin1').toString('utf8');
}

/** The file a key's object had in the one-file-per-object layout: `<name>~` in its directory. */
export function legacyFile(dir: string, name: string): string {
  return join(dir, `${escapeSegment(name)}~`);
}

/** The key of a file of the one-file-per-object layout in the directory of `keyDir`; null for any other entry (no escaped name starts with `~`, the pack does). */
export function legacyKey(e: Dirent, keyDir: string): string | null {
  return e.isFile() && e.name.endsWith('~') && !e.name.startsWith('~') ? keyDir + unescapeSegment(e.name.slice(0, -1)) : null;
}
