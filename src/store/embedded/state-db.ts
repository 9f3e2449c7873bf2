/**
 * The embedded state database as the stores use it: reads through the reader thread
 * (state-reader.ts: they see only what is durable: WAL, `synchronous=FULL`), writes through
 * the writer thread (state-writer.ts), which commits every write that arrived meanwhile in one
 * transaction. Calls issued in the same tick travel in one message. Neither kind touches the
 * disk on this thread, and each has a deadline (`timeoutMs`): a disk that does not answer
 * (frozen, hung) costs the requests that need it a 503, not the event loop.
 */
import { defaultConfig } from '../../config/config.js';
import { StoreError } from '../ports.js';
import { WorkerChannel } from './worker-channel.js';
import type { ReadName, ReadResult, Read, WriteOp, WriteOutcome, WriterFailure } from './state-schema.js';

/**
 * SQLite result codes (better-sqlite3's `SqliteError.code`, extended codes included) that say
 * the storage failed, not the query: I/O errors, a full disk, a file that cannot be opened,
 * gone read-only, damaged, or not a database.
 */
const STORAGE_FAILURE = /^SQLITE_(IOERR|FULL|CANTOPEN|READONLY|CORRUPT|NOTADB)/;

/** How long a read or write waits for its thread by default before its caller is told `STORE_UNAVAILABLE` (`storage.diskTimeoutMs`). */
export const DISK_TIMEOUT_MS: number = defaultConfig().storage.diskTimeoutMs;

export interface StateDatabaseOptions {
  /** How long a read or a write may wait for the disk before its caller is told `STORE_UNAVAILABLE` (default `DISK_TIMEOUT_MS`). */
  timeoutMs?: number;
}

type Writer = WorkerChannel<WriteOp, WriteOutcome, WriterFailure>;
type Reader = WorkerChannel<Read, ReadResult, never>;

export class StateDatabase {
  readonly path: string;
  readonly #writer: Writer;
  readonly #reader: Reader;
  #closed = false;

  private constructor(path: string, writer: Writer, reader: Reader) {
    this.path = path;
    this.#writer = writer;
    this.#reader = reader;
  }

  /** Opens (creating on first use) the database at `path`. */
  static async open(path: string, opts: StateDatabaseOptions = {}): Promise<StateDatabase> {
    const timeoutMs = opts.timeoutMs ?? DISK_TIMEOUT_MS;
    const writer = await WorkerChannel.start<WriteOp, WriteOutcome, WriterFailure>({
      url: new URL('./state-writer.js', import.meta.url),
      path,
      timeoutMs,
      failed: (failure, cause, unsent) => {
        const { message, code, unknown } = failure ?? { message: `State database writer ${cause}`, code: undefined, unknown: !unsent };
        const outcome = unknown ? 'its outcome is unknown until the next commit' : 'nothing of it was written';
        return new StoreError('STORE_UNAVAILABLE', `State database write failed (${outcome}): ${message}`, { cause: Object.assign(new Error(message), { code }), notWritten: !unknown });
      },
      blocked: (sent) =>
        new StoreError(
          'STORE_UNAVAILABLE',
          sent
            ? `State database write failed (its outcome is unknown until the next commit): the disk did not answer within ${timeoutMs} ms`
            : `State database write failed (nothing of it was written): an earlier write has waited for the disk more than ${timeoutMs} ms`,
          { notWritten: !sent },
        ),
    });
    // After the writer: it makes the file and its schema, which the reader needs.
    const reader = await WorkerChannel.start<Read, ReadResult, never>({
      url: new URL('./state-reader.js', import.meta.url),
      path,
      timeoutMs,
      failed: (_, cause) => new StoreError('STORE_UNAVAILABLE', `State database read failed: reader ${cause}`),
      blocked: (sent) =>
        new StoreError(
          'STORE_UNAVAILABLE',
          sent ? `State database read failed: the disk did not answer within ${timeoutMs} ms` : `State database read failed: an earlier read has waited for the disk more than ${timeoutMs} ms`,
        ),
    }).catch(async (err: unknown) => {
      await writer.close();
      throw err;
    });
    return new StateDatabase(path, writer, reader);
  }

  /**
   * Runs the read `q` (state-schema.ts, `READS`) with `params`: its rows, or its first row.
   * A read the disk fails (an I/O error, a file gone or damaged under it) or does not answer
   * in time is `STORE_UNAVAILABLE`, as a failed write is: the request that needed it answers
   * 503, and the next read asks the disk again.
   */
  async read<T>(q: ReadName, params: (string | number)[]): Promise<T> {
    if (this.#closed) throw new StoreError('STORE_CLOSED', 'State database is closed');
    const result = await this.#reader.call({ q, params });
    if ('rows' in result) return result.rows as T;
    const { message, code } = result.error;
    const cause = Object.assign(new Error(message), { code });
    if (!STORAGE_FAILURE.test(String(code))) throw cause;
    throw new StoreError('STORE_UNAVAILABLE', `State database read failed: ${message}`, { cause });
  }

  write(op: WriteOp): Promise<WriteOutcome> {
    if (this.#closed) return Promise.reject(new StoreError('STORE_CLOSED', 'State database is closed'));
    return this.#writer.call(op);
  }

  /**
   * Closes both threads, the reader first: the writer, closing last, commits what it holds (every
   * write sent gets its answer, unless the disk does not answer) and checkpoints the WAL into
   * the database file, which only the last connection to close does.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#reader.close();
    await this.#writer.close();
  }
}
