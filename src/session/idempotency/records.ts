/**
 * The idempotency records (one per client and key, in the SessionStore) and what an attempt
 * that holds a key can do (`Attempt`); see idempotency.ts.
 */

/**
 * What a key promises stays the same on a retry. The body is not known before it is read,
 * and a replay does not read it: the declared `Content-Length` stands in for it.
 */
export interface RequestFingerprint {
  upload_uuid: string;
  entity: string;
  /** Declared body length on the wire; null for a chunked body. Compared only when both requests declare one. */
  content_length: number | null;
}

export interface StoredAnswer {
  status: number;
  body: unknown;
}

export interface PendingRecord extends RequestFingerprint {
  state: 'pending';
  /**
   * Package ids of the attempts the session may have recorded, the current one first. More
   * than one only after a takeover, until the attempt ends.
   */
  attempts: string[];
  /** The current attempt's instance holds the key until then (epoch ms); 0 once released. */
  lease_until: number;
  /** The instance of the current attempt (a random id per process start). */
  owner: string;
  created_at: number;
}

export interface DoneRecord extends RequestFingerprint {
  state: 'done';
  status: number;
  body: unknown;
  /** The package the answer is about (200 only). */
  package_id: string | null;
  at: number;
}

export type IdempotencyRecord = PendingRecord | DoneRecord;

/** One attempt that holds a key: the package it runs, and the two ways it ends. Neither throws. */
export interface Attempt {
  readonly packageId: string;
  /**
   * Stores the attempt's definite answer, replayed to every repeat until it expires.
   * `packageId`: the package a 200 is about (default: this attempt's).
   */
  finish(answer: StoredAnswer, packageId?: string): Promise<void>;
  /**
   * No definite answer (a 5xx, an abort): a retry runs again. `mayBeRecorded` says the
   * session may have recorded the package (recording was attempted and failed in an unknown
   * way): the next retry then settles it before running.
   */
  release(mayBeRecorded: boolean): Promise<void>;
}

/** The same request as far as a key can tell: same session, entity and (when both declare it) body length. */
export function sameRequest(r: IdempotencyRecord, fp: RequestFingerprint): boolean {
  return (
    r.upload_uuid === fp.upload_uuid &&
    r.entity === fp.entity &&
    (r.content_length === null || fp.content_length === null || r.content_length === fp.content_length)
  );
}
