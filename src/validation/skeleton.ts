/**
 * The body without `data`'s elements: the head (through `data`'s `[`), one placeholder
 * element, `]`, and the tail (everything after `data`'s `]`). Its parse answers what the
 * rows cannot: is the body outside `data` JSON, and does it repeat a top-level `columns` or
 * `data` key (refused: docs/api.md, API decisions). Every top-level key of the body is in it,
 * in body order, so `repeatedKey` finds the same key here as on the whole body. The main
 * thread runs it when the text is small, a worker when not.
 */
import { randomBytes } from 'node:crypto';
import { isUtf8 } from 'node:buffer';
import type { ValidationIssue } from '../errors.js';
import { bodyIssue, type RepeatedKey } from '../entities/validators.js';
import { repeatedKey } from './repeated-key.js';

/** The placeholder element's value: no client can guess it. */
export const SENTINEL = `\u0000${randomBytes(16).toString('hex')}`;
/** The placeholder as JSON text, followed by the `]` that closes `data`. */
export const SENTINEL_JSON = `${JSON.stringify(SENTINEL)}]`;

export type SkeletonFacts =
  | { json: false }
  | {
      json: true;
      /** The first repeated top-level `columns` or `data` key, in body order. */
      repeated: RepeatedKey | null;
      /** Pydantic's step 2 for `columns` (missing, not a list, an element not a string); null when repeated. */
      columnsIssue: ValidationIssue | null;
      /** The body's columns when they have no issue (the head's: no key is repeated). */
      columns: string[] | null;
    };

const decoder = new TextDecoder('utf-8', { fatal: false });

export function checkSkeleton(text: Uint8Array, sentinel: string, headColumns: unknown): SkeletonFacts {
  if (!isUtf8(text)) return { json: false };
  let body: unknown;
  try {
    body = JSON.parse(decoder.decode(text));
  } catch {
    return { json: false };
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    // The head scanner only streams bodies that open with `{`; a parse that disagrees is a bug.
    throw new Error('Skeleton parsed to a non-object');
  }
  const repeated = repeatedKey(text);
  if (repeated) return { json: true, repeated, columnsIssue: null, columns: null };
  const fields = body as Record<string, unknown>;
  const { data } = fields;
  const columnsIssue = bodyIssue(Object.hasOwn(fields, 'columns') ? { columns: fields.columns, data: [] } : { data: [] });
  const columns = columnsIssue === null ? (fields.columns as string[]) : null;
  // With no key repeated, `data` is the streamed array and `columns` the head's: anything else is a bug.
  if (!(Array.isArray(data) && data.length === 1 && data[0] === sentinel) || (columns !== null && !sameStrings(columns, headColumns))) {
    throw new Error('Skeleton disagrees with the head scan');
  }
  return { json: true, repeated: null, columnsIssue, columns };
}

function sameStrings(a: readonly string[], b: unknown): boolean {
  if (!Array.isArray(b) || a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
