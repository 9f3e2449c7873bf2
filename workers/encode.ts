/**
 * NDJSON encoding of validated rows for storage: `JSON.stringify(row)` + `\n` per row, whole
 * lines per batch, at most `batchBytes` per batch (a single longer line is a batch of its own).
 */
import { transcodeRows } from './ndjson.js';

const encoder = new TextEncoder();
/** Reused across tasks: a worker runs one task at a time and `encode` is synchronous. */
let scratch = new Uint8Array(0);

export function encode(rows: readonly unknown[], batchBytes: number): { batches: ArrayBuffer[]; bytes: number } {
  if (scratch.byteLength !== batchBytes) scratch = new Uint8Array(batchBytes);
  const batches: ArrayBuffer[] = [];
  let bytes = 0;
  let used = 0;
  const flush = () => {
    batches.push(scratch.slice(0, used).buffer);
    bytes += used;
    used = 0;
  };
  for (const row of rows) {
    const line = `${JSON.stringify(row)}\n`;
    // encodeInto never writes half a character; `read` short of the length means no room.
    let { read, written } = encoder.encodeInto(line, scratch.subarray(used));
    if (read < line.length && used > 0) {
      flush();
      ({ read, written } = encoder.encodeInto(line, scratch));
    }
    if (read < line.length) {
      const own = encoder.encode(line);
      batches.push(own.buffer as ArrayBuffer);
      bytes += own.byteLength;
    } else {
      used += written;
    }
  }
  if (used > 0) flush();
  return { batches, bytes };
}

/** Reused like `scratch`: the transcoded lines of one region before they are cut into batches. */
let lines = new Uint8Array(0);

/**
 * `encode` of the validated rows that came in as `source` (their elements' bytes, see
 * `transcodeRows`): the same batches, made from the bytes rather than by `JSON.stringify`.
 * Null when a number does not allow it: then only `encode` of the parsed rows can.
 */
export function encodeFrom(source: Uint8Array, rows: readonly unknown[], batchBytes: number): { batches: ArrayBuffer[]; bytes: number } | null {
  if (rows.length === 0) return { batches: [], bytes: 0 };
  if (lines.byteLength < source.length + 1) lines = new Uint8Array(Math.max(source.length + 1, lines.byteLength * 2));
  const length = transcodeRows(source, lines);
  if (length < 0) return null;
  const batches: ArrayBuffer[] = [];
  let at = 0;
  while (at < length) {
    let end = length;
    if (length - at > batchBytes) {
      // Whole lines up to batchBytes; a longer line is a batch of its own.
      const newline = lines.lastIndexOf(0x0a, at + batchBytes - 1);
      end = newline >= at ? newline + 1 : lines.indexOf(0x0a, at) + 1;
    }
    batches.push(lines.slice(at, end).buffer);
    at = end;
  }
  return { batches, bytes: length };
}
