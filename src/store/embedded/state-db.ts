/**
 * The embedded state database as the stores use it: reads on a connection of this thread
 * (they see only what is durable: WAL, `synchronous=FULL`), writes through the writer thread
 * (state-writer.ts), which commits every write that arrived meanwhile in one transaction.
 * Writes issued in the same tick travel in one message.
 */
import { Worker } from 'node:worker_threads';
import type Database from 'better-sqlite3';
import { StoreError } from '../ports.js';
import { openStateReader, type WriteOp, type WriteOutcome, type WriterFailure, type WriterResponse } from './state-schema.js';

/**
 * SQLite result codes (better-sqlite3's `SqliteError.code`, extended codes included) that say
 * the storage failed, not the query: I/O errors, a full disk, a file that cannot be opened,
 * gone read-only, damaged, or not a database.
 */
const STORAGE_FAILURE = /^SQLITE_(IOERR|FULL|CANTOPEN|READONLY|CORRUPT|NOTADB)/;

interface Waiter {
  resolve(outcome: WriteOutcome): void;
  reject(err: unknown): void;
}

interface Request {
  ops: WriteOp[];
  waiters: Waiter[];
}

export class StateDatabase {
  readonly path: string;
  /** This thread's read connection. */
  readonly reader: Database.Database;
  #writer: Promise<Worker> | null;
  /** Requests sent to the writer and not yet answered, by id. */
  readonly #inFlight = new Map<number, Request>();
  /** Writes of this tick, sent together at its end. */
  #outbox: Request | null = null;
  #nextId = 1;
  #closed = false;

  private constructor(path: string, writer: Worker) {
    this.path = path;
    this.#writer = Promise.resolve(writer);
    this.reader = openStateReader(path);
  }

  /** Opens (creating on first use) the database at `path`. */
  static async open(path: string): Promise<StateDatabase> {
    const db = new StateDatabase(path, await startWriter(path));
    db.#watch(await db.#writer!);
    return db;
  }

  /**
   * Runs a read on this thread's connection. A read the disk fails (an I/O error, a file gone
   * or damaged under it) throws `STORE_UNAVAILABLE`, as a failed write does: the request that
   * needed it answers 503, and the next read asks the disk again.
   */
  read<T>(query: () => T): T {
    try {
      return query();
    } catch (err) {
      if (!STORAGE_FAILURE.test(String((err as { code?: unknown } | null)?.code))) throw err;
      throw new StoreError('STORE_UNAVAILABLE', `State database read failed: ${(err as Error).message}`, { cause: err });
    }
  }

  write(op: WriteOp): Promise<WriteOutcome> {
    if (this.#closed) return Promise.reject(new StoreError('STORE_CLOSED', 'State database is closed'));
    return new Promise((resolve, reject) => {
      if (!this.#outbox) {
        this.#outbox = { ops: [], waiters: [] };
        queueMicrotask(() => this.#send());
      }
      this.#outbox.ops.push(op);
      this.#outbox.waiters.push({ resolve, reject });
    });
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const writer = await this.#writer?.catch(() => null);
    if (writer) {
      const exited = new Promise((resolve) => writer.once('exit', resolve));
      // The writer commits what it holds before it closes: every write sent gets its answer.
      writer.postMessage('close');
      await exited;
    }
    // Every write sent was answered before the writer exited; none can be left waiting, whatever happened.
    for (const req of this.#inFlight.values()) for (const w of req.waiters) w.reject(new StoreError('STORE_CLOSED', 'State database is closed'));
    this.#inFlight.clear();
    this.reader.close();
  }

  #send(): void {
    const req = this.#outbox!;
    this.#outbox = null;
    const id = this.#nextId++;
    this.#inFlight.set(id, req);
    this.#writer ??= startWriter(this.path).then((w) => this.#watch(w));
    this.#writer.then(
      (w) => w.postMessage({ id, ops: req.ops }),
      (err: unknown) => {
        this.#writer = null; // the next write tries again
        this.#fail(id, { message: `State database writer cannot start: ${(err as Error).message}`, code: (err as { code?: string }).code, unknown: false });
      },
    );
  }

  #watch(worker: Worker): Worker {
    worker.on('message', (msg: WriterResponse) => {
      if ('error' in msg) return this.#fail(msg.id, msg.error);
      const req = this.#inFlight.get(msg.id);
      this.#inFlight.delete(msg.id);
      req?.waiters.forEach((w, i) => w.resolve(msg.outcomes[i]!));
    });
    worker.once('exit', () => {
      if (this.#closed) return;
      // A writer that died (an addon crash, an out-of-memory) took its transaction with it; the next write starts another.
      this.#writer = null;
      for (const id of [...this.#inFlight.keys()]) this.#fail(id, { message: 'State database writer exited', code: undefined, unknown: true });
    });
    return worker;
  }

  #fail(id: number, failure: WriterFailure): void {
    const req = this.#inFlight.get(id);
    this.#inFlight.delete(id);
    if (!req) return;
    const outcome = failure.unknown ? 'its outcome is unknown until the next commit' : 'nothing of it was written';
    const err = new StoreError('STORE_UNAVAILABLE', `State database write failed (${outcome}): ${failure.message}`, {
      cause: Object.assign(new Error(failure.message), { code: failure.code }),
    });
    for (const w of req.waiters) w.reject(err);
  }
}

function startWriter(path: string): Promise<Worker> {
  return new Promise((resolve, reject) => {
    const worker = new Worker(new URL('./state-writer.js', import.meta.url), { workerData: { path } });
    // An error thrown in the worker arrives as a copy, not always an Error: its message and code are kept.
    const failed = (err: unknown) =>
      reject(
        err instanceof Error
          ? err
          : typeof err === 'number'
            ? new Error(`State database writer exited with code ${err}`)
            : Object.assign(new Error(`State database writer failed: ${String((err as { message?: unknown } | null)?.message ?? err)}`), { code: (err as { code?: unknown } | null)?.code }),
      );
    worker.once('error', failed);
    worker.once('exit', failed);
    worker.once('message', (msg: unknown) => {
      if (msg !== 'ready') return;
      worker.off('error', failed);
      worker.off('exit', failed);
      worker.on('error', () => undefined); // an error after start ends in 'exit', handled by the owner
      resolve(worker);
    });
  });
}
