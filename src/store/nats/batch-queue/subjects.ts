/**
 * Subject naming of the batch queue's stream:
 *
 * ```
 * <stream>.b.<client hex>.<upload_uuid>.<entity>.<package_id>   batches, msg id <package_id>:<n>
 * <stream>.c.<client hex>.<upload_uuid>.<entity>.<package_id>   one commit, msg id <package_id>:commit
 * ```
 * Client ids are hex-encoded; other ids are used as they are when they are
 * `[A-Za-z0-9_-]+`, else hex-encoded behind a `=` (which plain tokens never contain).
 */
import { StoreError, type PackageMeta } from '../../ports.js';

/** Stream and consumer names. */
export const NAME = /^[A-Za-z0-9_-]+$/;
const PLAIN_TOKEN = /^[A-Za-z0-9_-]+$/;

export class QueueSubjects {
  constructor(readonly stream: string) {}

  /** Every subject of the stream. */
  get all(): string[] {
    return [`${this.stream}.b.>`, `${this.stream}.c.>`];
  }
  /** Every commit: the consumer's filter. */
  get commits(): string {
    return `${this.stream}.c.>`;
  }
  /** Every batch. */
  get batches(): string {
    return `${this.stream}.b.>`;
  }
  batch(tail: string): string {
    return `${this.stream}.b.${tail}`;
  }
  commit(tail: string): string {
    return `${this.stream}.c.${tail}`;
  }
  /** Batches and commit of one package. */
  package(tail: string): string {
    return `${this.stream}.*.${tail}`;
  }
  /** Batches and commits of one session. */
  session(uploadUuid: string): string {
    return `${this.stream}.*.*.${token(uploadUuid)}.>`;
  }
  /** Commits of one session. */
  sessionCommits(uploadUuid: string): string {
    return `${this.stream}.c.*.${token(uploadUuid)}.>`;
  }
  /** The batch subject of a commit subject (same package). */
  batchOfCommit(commitSubject: string): string {
    return this.batch(this.tailOf(commitSubject));
  }
  /** The commit subject of a batch subject (same package). */
  commitOfBatch(batchSubject: string): string {
    return this.commit(this.tailOf(batchSubject));
  }
  /** The package id of a batch or commit subject. */
  packageIdOf(subject: string): string {
    const last = subject.slice(subject.lastIndexOf('.') + 1);
    return last.startsWith('=') ? Buffer.from(last.slice(1), 'hex').toString('utf8') : last;
  }
  /** `<client hex>.<upload_uuid>.<entity>.<package_id>` of a batch or commit subject. */
  tailOf(subject: string): string {
    return subject.slice(this.stream.length + 3);
  }
}

/** `<client hex>.<upload_uuid>.<entity>.<package_id>`: the subject tail shared by a package's batches and commit. */
export function packageTail(meta: PackageMeta): string {
  if (meta.client_id === '') throw new StoreError('STORE_INVALID_KEY', 'Invalid client_id: empty');
  return `${Buffer.from(meta.client_id, 'utf8').toString('hex')}.${token(meta.upload_uuid)}.${token(meta.entity)}.${token(meta.package_id)}`;
}

export function token(id: string): string {
  if (id === '') throw new StoreError('STORE_INVALID_KEY', 'Invalid id: empty');
  return PLAIN_TOKEN.test(id) ? id : `=${Buffer.from(id, 'utf8').toString('hex')}`;
}
