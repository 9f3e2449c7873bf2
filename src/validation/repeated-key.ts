/**
 * The scan for a repeated top-level `columns` or `data` key in a body's bytes (step 1b of
 * the checks of entities/validators.ts, whose `duplicateKeyMessage` answers it).
 */
import type { RepeatedKey } from '../entities/validators.js';

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
/** `\uXXXX` for each of the 7 letters of `columns`: no longer spelling of a key we look for. */
const KEY_TEXT_MAX = 42;
const COLUMNS_TEXT = 'columns';
const DATA_TEXT = 'data';

/**
 * Step 1b, on text that passed step 1 (it is JSON): the first member of the top-level
 * object whose key, escapes decoded, is `columns` or `data` and was already a key of an
 * earlier member, in body order. `JSON.parse` would silently keep the last one; the
 * service refuses the body instead (docs/api.md, API decisions), so that an answer never
 * depends on which of two values a reader keeps. Other repeated keys are not reported;
 * keys of nested objects never count; a body that is not an object has none.
 *
 * Linear: strings are skipped with `indexOf`, a key is decoded only when it is short
 * enough to spell one of the two names. `from` skips a byte order mark.
 */
export function repeatedKey(text: Uint8Array, from = 0): RepeatedKey | null {
  const n = text.length;
  let i = from;
  while (i < n && isJsonSpace(text[i]!)) i++;
  if (text[i] !== 0x7b) return null;
  let columns = false;
  let data = false;
  let depth = 0;
  let keyNext = false;
  for (; i < n; i++) {
    const b = text[i]!;
    if (b === QUOTE) {
      const start = i + 1;
      let end = start;
      for (;;) {
        end = text.indexOf(QUOTE, end);
        if (end < 0) return null; // not JSON after all: step 1 answers
        let slashes = 0;
        while (text[end - 1 - slashes] === BACKSLASH) slashes++;
        if (slashes % 2 === 0) break;
        end++;
      }
      if (keyNext) {
        keyNext = false;
        const key = keyName(text, start, end);
        if (key === COLUMNS_TEXT) {
          if (columns) return 'columns';
          columns = true;
        } else if (key === DATA_TEXT) {
          if (data) return 'data';
          data = true;
        }
      }
      i = end;
    } else if (b === 0x7b || b === 0x5b) {
      depth++;
      keyNext = depth === 1;
    } else if (b === 0x7d || b === 0x5d) {
      depth--;
    } else if (b === 0x2c && depth === 1) {
      keyNext = true;
    }
  }
  return null;
}

/** The key `text[start, end)` (between its quotes) decoded, or null when it cannot be `columns` or `data`. */
function keyName(text: Uint8Array, start: number, end: number): string | null {
  const length = end - start;
  if (length > KEY_TEXT_MAX || length < DATA_TEXT.length) return null;
  let escaped = false;
  let raw = '';
  for (let k = start; k < end; k++) {
    const c = text[k]!;
    if (c === BACKSLASH) escaped = true;
    raw += String.fromCharCode(c);
  }
  if (!escaped) return raw;
  try {
    // Only ASCII decodes to either name; any other byte makes the result something else.
    return JSON.parse(`"${raw}"`) as string;
  } catch {
    return null;
  }
}

const isJsonSpace = (b: number) => b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09;
