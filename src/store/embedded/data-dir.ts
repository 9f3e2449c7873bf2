/**
 * DATA_DIR as the embedded stores take it: usable (it exists or can be made, and takes
 * writes), not of an earlier layout, and owned by this process alone.
 *
 * Ownership is an exclusive lock on `DATA_DIR/lock.sqlite` (SQLite's own file lock, held by
 * its connection in exclusive locking mode until it closes): the kernel drops it when the
 * process ends in any way, so a lock never outlives its holder and a crash never blocks the
 * restart. Who holds it is written beside it, in `DATA_DIR/owner`, for the refusal to name.
 */
import { constants } from 'node:fs';
import { access, mkdir, readFile, stat, writeFile } from 'node:fs/promises';
import { hostname } from 'node:os';
import { dirname, join } from 'node:path';
import { fsyncDir } from '../../durable-file.js';
import { StoreError } from '../ports.js';
import { openSqlite, type SqliteDatabase } from './sqlite.js';

/** Directories of the file layout before the state database, which this version does not read. */
const EARLIER_LAYOUT = ['sessions', 'ledger'];

export class DataDirLock {
  readonly #db: SqliteDatabase;

  private constructor(db: SqliteDatabase) {
    this.#db = db;
  }

  /**
   * Makes `dir` if needed, checks it, and takes it for this process. Throws STORE_MISCONFIGURED,
   * with one line naming the directory and what to do, when it cannot be used or another
   * process holds it. `objectsOnly`: it holds only the object store (NATS without S3), so the
   * earlier layout of the embedded stores is not looked for.
   */
  static async acquire(dir: string, opts: { objectsOnly?: boolean } = {}): Promise<DataDirLock> {
    try {
      await mkdir(dir, { recursive: true }).catch(async (err: unknown) => {
        // A recursive mkdir under a read-only mount says ENOENT: the nearest existing ancestor says why.
        await access(await nearestExisting(dir), constants.W_OK);
        throw err;
      });
      await access(dir, constants.W_OK);
      await fsyncDir(dirname(dir));
    } catch (err) {
      throw unusable(dir, err);
    }
    let db: SqliteDatabase;
    try {
      db = openSqlite(join(dir, 'lock.sqlite'));
      db.pragma('locking_mode = EXCLUSIVE');
      // The first write takes the exclusive lock; in this mode it is kept until the connection closes.
      db.exec('CREATE TABLE IF NOT EXISTS lock (at TEXT); DELETE FROM lock; INSERT INTO lock VALUES (CURRENT_TIMESTAMP)');
    } catch (err) {
      // The driver that would not load says so itself.
      if (err instanceof StoreError) throw err;
      if ((err as { code?: string }).code === 'SQLITE_BUSY') {
        const holder = await readFile(join(dir, 'owner'), 'utf8').then((s) => s.trim(), () => 'unknown');
        throw new StoreError(
          'STORE_MISCONFIGURED',
          `DATA_DIR ${dir} is in use by another process (${holder}): one process owns a data directory; stop that one, or set DATA_DIR to another directory`,
        );
      }
      throw unusable(dir, err);
    }
    try {
      await writeFile(join(dir, 'owner'), `pid ${process.pid} on ${hostname()}, since ${new Date().toISOString()}\n`);
      for (const name of opts.objectsOnly ? [] : EARLIER_LAYOUT) {
        if (await stat(join(dir, name)).then((s) => s.isDirectory(), () => false)) {
          throw new StoreError(
            'STORE_MISCONFIGURED',
            `DATA_DIR ${dir} holds ${EARLIER_LAYOUT.map((n) => `${n}/`).join(' and ')} of an earlier version, which this one does not read: finish or delete its sessions with that version, then remove those directories`,
          );
        }
      }
    } catch (err) {
      db.close();
      throw err instanceof StoreError ? err : unusable(dir, err);
    }
    return new DataDirLock(db);
  }

  release(): void {
    if (this.#db.open) this.#db.close();
  }
}

async function nearestExisting(dir: string): Promise<string> {
  for (let d = dirname(dir); ; d = dirname(d)) {
    if (await stat(d).then(() => true, () => d === dirname(d))) return d;
  }
}

function unusable(dir: string, err: unknown): StoreError {
  const code = (err as { code?: string }).code;
  const why =
    code === 'EROFS' || code === 'SQLITE_READONLY'
      ? 'it is on a read-only file system'
      : code === 'EACCES' || code === 'EPERM'
        ? 'this process may not write to it'
        : code === 'ENOTDIR' || code === 'EEXIST'
          ? 'it is not a directory'
          : code === 'ENOSPC' || code === 'SQLITE_FULL'
            ? 'its file system is full'
            : `${(err as Error).message}`;
  return new StoreError('STORE_MISCONFIGURED', `DATA_DIR ${dir} cannot be used: ${why}; set DATA_DIR to a writable directory`, { cause: err });
}
