/**
 * The body without `data`'s elements: the head (through `data`'s `[`), one placeholder
 * element, `]`, and the tail (everything after `data`'s `]`). Its parse answers what the
 * rows cannot: is the body outside `data` JSON, which `columns` does `JSON.parse` of the
 * whole body keep (the last of repeated keys wins), and did a later `data` key replace the
 * array that was streamed. The main thread runs it when the text is small, a worker when not.
 */
import { randomBytes } from 'node:crypto';
import { isUtf8 } from 'node:buffer';
import type { ValidationIssue } from '../errors.js';
import { bodyIssue } from '../entities/validators.js';

/** The placeholder element's value: no client can guess it. */
export const SENTINEL = `\u0000${randomBytes(16).toString('hex')}`;
/** The placeholder as JSON text, followed by the `]` that closes `data`. */
export const SENTINEL_JSON = `${JSON.stringify(SENTINEL)}]`;

export type SkeletonFacts =
  | { json: false }
  | {
      json: true;
      /** A `data` key after the streamed array replaced it: `JSON.parse` of the body keeps that one. */
      dataReplaced: boolean;
      /** Pydantic's step 2 for `columns` (missing, not a list, an element not a string). */
      columnsIssue: ValidationIssue | null;
      /** The columns `JSON.parse` keeps, when they have no issue. */
      columns: string[] | null;
      /** Those columns are exactly the head's (what the rows were validated against). */
      sameColumns: boolean;
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
  const fields = body as Record<string, unknown>;
  const data = fields.data;
  const dataReplaced = !(Array.isArray(data) && data.length === 1 && data[0] === sentinel);
  const columnsIssue = bodyIssue(Object.hasOwn(fields, 'columns') ? { columns: fields.columns, data: [] } : { data: [] });
  const columns = columnsIssue === null ? (fields.columns as string[]) : null;
  return { json: true, dataReplaced, columnsIssue, columns, sameColumns: columns !== null && sameStrings(columns, headColumns) };
}

function sameStrings(a: readonly string[], b: unknown): boolean {
  if (!Array.isArray(b) || a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
