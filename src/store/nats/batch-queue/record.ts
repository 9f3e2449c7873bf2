/** The commit message: what a consumer needs of a package, written by writer.ts, read by consumer.ts. */
import { headers, type MsgHdrs } from 'nats';
import { StoreError, type PackageMeta } from '../../ports.js';

/** Everything a consumer needs, batches named by stream sequence in append order. */
export interface CommitRecord {
  meta: PackageMeta;
  rows: number;
  bytes: number;
  batches: number[];
  /**
   * CRC-32 (zlib's) of the package's batches in append order: the consumer checks what it read
   * against it before the package is stored. Commits written before it carry none.
   */
  crc?: number;
}

/**
 * Header of a commit message that carries its package's only batch as its data (the commit
 * record, base64url JSON, is in the header then). A package of one batch up to
 * `INLINE_BATCH_BYTES` costs one publish instead of two; packages written before this existed
 * still work.
 */
export const INLINE_COMMIT = 'Ingest-Commit';
export const INLINE_BATCH_BYTES = 256 * 1024;

/** A commit record as the header of an inline commit carries it (base64url JSON). */
export function encodeCommit(rec: CommitRecord): string {
  return Buffer.from(JSON.stringify(rec)).toString('base64url');
}

/** The headers of an inline commit whose record `encodeCommit` gave. */
export function inlineCommitHeaders(encoded: string): MsgHdrs {
  const h = headers();
  h.set(INLINE_COMMIT, encoded);
  return h;
}

/** The bytes `inlineCommitHeaders` adds to a message, beside the room every message keeps. */
export function inlineHeaderBytes(encoded: string): number {
  return INLINE_COMMIT.length + encoded.length + 4;
}

/** The record of a commit message and, when it carries it, the package's only batch. Throws on anything else. */
export function readCommit(msg: { data: Uint8Array; headers?: MsgHdrs | undefined }): { rec: CommitRecord; inline: Uint8Array | null } {
  const header = msg.headers?.get(INLINE_COMMIT);
  if (header) return { rec: parseCommit(Buffer.from(header, 'base64url')), inline: msg.data };
  return { rec: parseCommit(msg.data), inline: null };
}

function parseCommit(data: Uint8Array): CommitRecord {
  let rec: CommitRecord | null;
  try {
    rec = JSON.parse(Buffer.from(data).toString('utf8')) as CommitRecord;
  } catch {
    rec = null; // not the parser's message: it quotes the bytes, which may be clients' rows
  }
  const m = rec?.meta;
  if (
    !rec ||
    !m ||
    typeof m.package_id !== 'string' ||
    typeof m.upload_uuid !== 'string' ||
    typeof m.client_id !== 'string' ||
    typeof m.entity !== 'string' ||
    !Array.isArray(m.columns) ||
    typeof rec.rows !== 'number' ||
    typeof rec.bytes !== 'number' ||
    !Array.isArray(rec.batches) ||
    !rec.batches.every((s) => Number.isInteger(s) && s > 0) ||
    (rec.crc !== undefined && !(Number.isInteger(rec.crc) && rec.crc >= 0))
  ) {
    throw new StoreError('STORE_CORRUPT', 'Commit message does not describe a package');
  }
  return rec;
}
