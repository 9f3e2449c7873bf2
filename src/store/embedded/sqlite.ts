/**
 * The SQLite driver of the embedded stores, by the running Node's major version:
 *
 * - Node 22 and later: better-sqlite3 13 (the `better-sqlite3` dependency), on Node-API, with
 *   its binaries in the package (no build at install, one binary for every Node version).
 *   better-sqlite3 12 cannot serve Node 24: its objects, derived from `node::ObjectWrap`,
 *   remove a cleanup hook in their destructor, which aborts the process when garbage
 *   collection runs without a current environment (WiseLibs/better-sqlite3#1515).
 * - Node 20: better-sqlite3 12 (the optional dependency `better-sqlite3-node20`, built for the
 *   running Node at install), since 13 does not load there (it ends the process with a
 *   segmentation fault when a database opens).
 *
 * The two have the same API for everything the stores use. Loaded at the first open, so a
 * process on the NATS back end never needs it, and one whose driver did not install is told so.
 */
import { createRequire } from 'node:module';
import type BetterSqlite3 from 'better-sqlite3';
import { StoreError } from '../ports.js';

export type SqliteDatabase = BetterSqlite3.Database;
export type SqliteStatement = BetterSqlite3.Statement;

/** The package the running Node loads. */
export const SQLITE_DRIVER: string = Number(process.versions.node.split('.')[0]) >= 22 ? 'better-sqlite3' : 'better-sqlite3-node20';

let driver: typeof BetterSqlite3 | null = null;

/** Opens the SQLite database at `path` (better-sqlite3's options). */
export function openSqlite(path: string, options?: BetterSqlite3.Options): SqliteDatabase {
  driver ??= load();
  return new driver(path, options);
}

function load(): typeof BetterSqlite3 {
  try {
    return createRequire(import.meta.url)(SQLITE_DRIVER) as typeof BetterSqlite3;
  } catch (err) {
    throw new StoreError(
      'STORE_MISCONFIGURED',
      `The embedded back end needs SQLite's driver ${SQLITE_DRIVER} on Node ${process.versions.node}, which cannot be loaded (${(err as Error).message.split('\n')[0]}): run \`npm ci\` again with python3, make and a C++ compiler at hand, or Node 22 or later, or the NATS back end`,
      { cause: err },
    );
  }
}
