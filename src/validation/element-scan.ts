/**
 * The exact, string-aware scan of `data`'s elements, for the regions where the main
 * thread's cheap cut guess was wrong. It only tracks strings (quotes and backslash escapes)
 * and bracket depth: on valid JSON that places every element boundary and `data`'s closing
 * `]` exactly, and on invalid JSON the `JSON.parse` of the region it delimits fails, which
 * is all the caller needs (see `rows.ts`). Linear, resumable across pieces.
 */
import type { ScanState } from './tasks.js';

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COMMA = 0x2c;
const OPEN_ARRAY = 0x5b;
const CLOSE_ARRAY = 0x5d;
const OPEN_OBJECT = 0x7b;
const CLOSE_OBJECT = 0x7d;

export const FRESH: ScanState = [0, 0, 0];

export interface ScanOutcome {
  /** Offset of the `]` that closes `data` (depth below 0), or -1. Scanning stops there. */
  end: number;
  /** Offset of the last comma between two elements of `data` before `end` (or the range's end), or -1. */
  boundary: number;
  /** State at `end` (exclusive) or at the range's end. */
  state: ScanState;
}

export function scanElements(bytes: Uint8Array, from: number, to: number, start: ScanState): ScanOutcome {
  let inString = start[0] === 1;
  let escape = start[1] === 1;
  let depth = start[2];
  let boundary = -1;
  let i = from;
  while (i < to) {
    if (inString) {
      const c = bytes[i]!;
      if (escape) escape = false;
      else if (c === BACKSLASH) escape = true;
      else if (c === QUOTE) inString = false;
      i++;
      continue;
    }
    const b = bytes[i]!;
    if (b === QUOTE) {
      inString = true;
    } else if (b === OPEN_ARRAY || b === OPEN_OBJECT) {
      depth++;
    } else if (b === CLOSE_ARRAY || b === CLOSE_OBJECT) {
      if (depth === 0) return { end: i, boundary, state: [0, 0, 0] };
      depth--;
    } else if (b === COMMA && depth === 0) {
      boundary = i;
    }
    i++;
  }
  return { end: -1, boundary, state: [inString ? 1 : 0, escape ? 1 : 0, depth] };
}

/** The state says the scan stopped between two elements (after a complete one, or in whitespace). */
export function isClean(state: ScanState): boolean {
  return state[0] === 0 && state[2] === 0;
}
