/**
 * The embedded state database (`DATA_DIR/state.sqlite`): its schema, how every connection
 * opens it, the reads the stores make, and the messages between the store (state-db.ts) and
 * its writer and reader threads (state-writer.ts, state-reader.ts).
 *
 * ```
 * kv      (key PRIMARY KEY, revision, value)   session records, idempotent answers, claims
 * ledger  (upload, package_id PRIMARY KEY, entity, rows, bytes, object_bytes)
 * stored  (upload, package_id PRIMARY KEY)   the uploader's markers: packages in object storage
 * stored_count (upload, entity PRIMARY KEY, n)   markers per entity, kept in the markers' transaction
 * queue   (seq INTEGER PRIMARY KEY, upload, record)   the batch queue's committed, unacked packages
 * meta    ('revision': the last revision handed out; 'fence': see state-writer.ts; 'queue_import':
 *          1 once the queue's index file of an earlier version is in `queue`)
 * ```
 * WAL with `synchronous=FULL`: a commit is in the log and synced (fsync) before any reader sees
 * it, and readers never wait for the writer.
 */
import { openSqlite, type SqliteDatabase } from './sqlite.js';
import type { LedgerEntry } from '../ports.js';

/** `PRAGMA user_version` of the schema below. */
const SCHEMA_VERSION = 3;

const SCHEMA = `
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, revision INTEGER NOT NULL, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledger (
  upload TEXT NOT NULL, package_id TEXT NOT NULL, entity TEXT NOT NULL,
  rows INTEGER NOT NULL, bytes INTEGER NOT NULL, object_bytes INTEGER NOT NULL,
  PRIMARY KEY (upload, package_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS stored (upload TEXT NOT NULL, package_id TEXT NOT NULL, PRIMARY KEY (upload, package_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS stored_count (upload TEXT NOT NULL, entity TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (upload, entity)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS queue (seq INTEGER PRIMARY KEY, upload TEXT NOT NULL, record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS queue_upload ON queue (upload);
INSERT OR IGNORE INTO meta (name, value) VALUES ('revision', 0), ('fence', 0);
`;

/**
 * Version 1 counted stored packages in session-store records `stored.<upload_uuid>` (per
 * entity, plus the packages whose marker was being written, already counted): they become
 * rows of `stored_count`, and those packages get their markers, so that a redelivery of one
 * finds it counted.
 */
const FROM_VERSION_1 = `
INSERT OR IGNORE INTO stored (upload, package_id)
  SELECT substr(kv.key, 8), m.key FROM kv, json_each(kv.value, '$.marking') AS m WHERE kv.key GLOB 'stored.*';
INSERT INTO stored_count (upload, entity, n)
  SELECT upload, entity, sum(n) FROM (
    SELECT substr(kv.key, 8) AS upload, e.key AS entity, e.value AS n FROM kv, json_each(kv.value, '$.entities') AS e WHERE kv.key GLOB 'stored.*'
    UNION ALL
    SELECT substr(kv.key, 8), m.value, 1 FROM kv, json_each(kv.value, '$.marking') AS m WHERE kv.key GLOB 'stored.*'
  ) GROUP BY upload, entity;
DELETE FROM kv WHERE key GLOB 'stored.*';
`;

/** Opens (and on first use creates) the database at `path` for writing: WAL, synced commits, the schema in place. */
export function openStateDatabase(path: string): SqliteDatabase {
  const db = openSqlite(path);
  try {
    db.pragma('journal_mode = WAL');
    db.pragma('synchronous = FULL');
    // Another connection's checkpoint or recovery holds the lock only briefly.
    db.pragma('busy_timeout = 5000');
    db.transaction(() => {
      const version = db.pragma('user_version', { simple: true }) as number;
      if (version > SCHEMA_VERSION) {
        throw new Error(`${path} was written by a newer version of the service (schema ${version}; this one knows ${SCHEMA_VERSION})`);
      }
      db.exec(SCHEMA);
      if (version === 1) db.exec(FROM_VERSION_1);
      db.pragma(`user_version = ${SCHEMA_VERSION}`);
    }).immediate();
    return db;
  } catch (err) {
    db.close();
    throw err;
  }
}

/** A read connection: sees every commit that was durable when its statement began. */
export function openStateReader(path: string): SqliteDatabase {
  const db = openSqlite(path, { fileMustExist: true });
  db.pragma('busy_timeout = 1000');
  db.pragma('query_only = 1');
  return db;
}

/**
 * Every read the stores make, by name: the reader thread prepares each once. `all`: every row
 * (a page: each has a LIMIT parameter or a small bound); otherwise the first row, or undefined.
 */
export const READS = {
  'kv.get': { sql: 'SELECT revision, value FROM kv WHERE key = ?', all: false },
  'kv.page': { sql: 'SELECT key, revision, value FROM kv WHERE key > ? AND key < ? ORDER BY key LIMIT ?', all: true },
  'kv.keys': { sql: 'SELECT key FROM kv WHERE key > ? AND key < ? ORDER BY key LIMIT ?', all: true },
  'ledger.get': { sql: 'SELECT package_id, entity, rows, bytes, object_bytes FROM ledger WHERE upload = ? AND package_id = ?', all: false },
  'ledger.page': {
    sql: 'SELECT package_id, entity, rows, bytes, object_bytes FROM ledger WHERE upload = ? AND package_id > ? ORDER BY package_id LIMIT ?',
    all: true,
  },
  'ledger.stored': { sql: 'SELECT 1 AS one FROM stored WHERE upload = ? AND package_id = ?', all: false },
  'ledger.counts': { sql: 'SELECT entity, n FROM stored_count WHERE upload = ?', all: true },
  /** At open only: the batch queue's committed, unacked packages, a page at a time. */
  'queue.page': { sql: 'SELECT seq, record FROM queue WHERE seq > ? ORDER BY seq LIMIT ?', all: true },
  'queue.imported': { sql: "SELECT 1 AS one FROM meta WHERE name = 'queue_import'", all: false },
} as const satisfies Record<string, { sql: string; all: boolean }>;

export type ReadName = keyof typeof READS;

export interface Read {
  q: ReadName;
  params: (string | number)[];
}

export interface ReaderRequest {
  id: number;
  items: Read[];
}

/** A read's rows (or row), or its failure as data: SQLite's message and code. */
export type ReadResult = { rows: unknown } | { error: { message: string; code: string | undefined } };

export interface ReaderResponse {
  id: number;
  results: ReadResult[];
}

export type WriteOp =
  | { t: 'create'; key: string; json: string }
  | { t: 'update'; key: string; json: string; revision: number }
  | { t: 'delete'; key: string; revision?: number }
  | { t: 'ledger-append'; upload: string; entries: readonly LedgerEntry[] }
  /** `entities`: count each new marker (`stored_count`); `guard`: only while that key is there and not marked `deleted`. */
  | { t: 'ledger-stored'; upload: string; ids: readonly string[]; entities?: readonly string[]; guard?: string }
  | { t: 'ledger-drop'; upload: string }
  /** A package of the batch queue committed: `record` is its JSON (batch-queue.ts). */
  | { t: 'queue-commit'; seq: number; upload: string; record: string }
  | { t: 'queue-ack'; seq: number }
  | { t: 'queue-purge'; upload: string }
  /** The live packages of the queue's index file of an earlier version, all in one transaction, and the mark that they are in. */
  | { t: 'queue-import'; rows: readonly { seq: number; upload: string; record: string }[] };

/** What one op did: its new revision (create, update), or a lost compare-and-set. */
export interface WriteOutcome {
  revision?: number;
  conflict?: boolean;
}

export interface WriterRequest {
  id: number;
  items: WriteOp[];
}

export interface WriterFailure {
  message: string;
  code: string | undefined;
  /** The failed commit's frames may still come back at a restart (the fence after it failed too). */
  unknown: boolean;
}

export type WriterResponse = { id: number; results: WriteOutcome[] } | { id: number; error: WriterFailure };
