/**
 * NDJSON encoding of validated rows on the reference path: `JSON.stringify(row)` + `\n` per
 * row (or the same lines transcoded from the rows' bytes, `ndjson.ts`), written into the
 * buffer the task brought (grown when too small) and cut into batches (`cutBatches`).
 */
import { transcodeRows } from './ndjson.js';
import { cutBatches } from './row-scanner.js';
import type { Lines } from './tasks.js';

const encoder = new TextEncoder();

export interface Encoded extends Lines {
  bytes: number;
}

/** `out` when it holds at least `need` bytes, else a larger buffer of its own. */
export function room(out: ArrayBuffer | null, need: number): ArrayBuffer {
  return out !== null && out.byteLength >= need ? out : new ArrayBuffer(Math.max(need, out?.byteLength ?? 0));
}

export function encode(rows: readonly unknown[], batchBytes: number, out: ArrayBuffer | null): Encoded {
  let bytes = new Uint8Array(room(out, 64 * 1024));
  let used = 0;
  for (const row of rows) {
    const line = `${JSON.stringify(row)}\n`;
    // At most 3 bytes of UTF-8 per UTF-16 unit.
    if (bytes.length - used < line.length * 3) {
      const grown = new Uint8Array(Math.max(bytes.length * 2, used + line.length * 3));
      grown.set(bytes.subarray(0, used));
      bytes = grown;
    }
    used += encoder.encodeInto(line, bytes.subarray(used)).written;
  }
  return { buffer: bytes.buffer as ArrayBuffer, ends: cutBatches(bytes, used, batchBytes), bytes: used };
}

/**
 * `encode` of the validated rows that came in as `source` (their elements' bytes, see
 * `transcodeRows`): the same lines, made from the bytes rather than by `JSON.stringify`.
 * Null when a number does not allow it: then only `encode` of the parsed rows can.
 */
export function encodeFrom(source: Uint8Array, rows: readonly unknown[], batchBytes: number, out: ArrayBuffer | null): Encoded | null {
  const buffer = room(out, source.length + 1);
  if (rows.length === 0) return { buffer, ends: [], bytes: 0 };
  const bytes = new Uint8Array(buffer);
  const length = transcodeRows(source, bytes);
  if (length < 0) return null;
  return { buffer, ends: cutBatches(bytes, length, batchBytes), bytes: length };
}
