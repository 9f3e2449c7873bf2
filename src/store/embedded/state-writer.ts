/**
 * The embedded state database's writer: a worker thread that owns the one write connection
 * (state-db.ts is the other side). Every write that arrives while a commit is under way joins
 * the next one, so a group of writes costs one transaction and one fsync, and the fsync
 * never blocks the event loop.
 *
 * A commit that fails (ENOSPC, EIO) fails its group only. Its frames may still be in the
 * write-ahead log, where a restart would find them; so before its callers hear of the
 * failure a fence transaction is committed after it, which overwrites them. Only once the
 * fence is durable is the failure definite ("not written"); while the fence cannot be made
 * durable either, the group's callers are told the outcome is unknown (`unknown: true`).
 */
import { parentPort, workerData } from 'node:worker_threads';
import { openStateDatabase, type WriteOp, type WriteOutcome, type WriterRequest, type WriterResponse } from './state-schema.js';

const port = parentPort!;
const { path } = workerData as { path: string };

const db = openStateDatabase(path);

const stmt = {
  revisionOf: db.prepare<[string], { revision: number }>('SELECT revision FROM kv WHERE key = ?'),
  insert: db.prepare<[string, number, string]>('INSERT INTO kv (key, revision, value) VALUES (?, ?, ?)'),
  update: db.prepare<[string, number, string, number]>('UPDATE kv SET value = ?, revision = ? WHERE key = ? AND revision = ?'),
  deleteAt: db.prepare<[string, number]>('DELETE FROM kv WHERE key = ? AND revision = ?'),
  delete: db.prepare<[string]>('DELETE FROM kv WHERE key = ?'),
  ledgerAdd: db.prepare<[string, string, string, number, number, number]>(
    'INSERT OR IGNORE INTO ledger (upload, package_id, entity, rows, bytes, object_bytes) VALUES (?, ?, ?, ?, ?, ?)',
  ),
  ledgerDrop: db.prepare<[string]>('DELETE FROM ledger WHERE upload = ?'),
  storedAdd: db.prepare<[string, string]>('INSERT OR IGNORE INTO stored (upload, package_id) VALUES (?, ?)'),
  storedDrop: db.prepare<[string]>('DELETE FROM stored WHERE upload = ?'),
  countAdd: db.prepare<[string, string]>('INSERT INTO stored_count (upload, entity, n) VALUES (?, ?, 1) ON CONFLICT DO UPDATE SET n = n + 1'),
  live: db.prepare<[string], { one: number }>("SELECT 1 AS one FROM kv WHERE key = ? AND coalesce(json_extract(value, '$.deleted'), 0) = 0"),
  countDrop: db.prepare<[string]>('DELETE FROM stored_count WHERE upload = ?'),
  saveRevision: db.prepare<[number]>("UPDATE meta SET value = ? WHERE name = 'revision'"),
  queueAdd: db.prepare<[number, string, string]>('INSERT INTO queue (seq, upload, record) VALUES (?, ?, ?)'),
  queueAck: db.prepare<[number]>('DELETE FROM queue WHERE seq = ?'),
  queuePurge: db.prepare<[string]>('DELETE FROM queue WHERE upload = ?'),
  queueImported: db.prepare("INSERT OR REPLACE INTO meta (name, value) VALUES ('queue_import', 1)"),
  fence: db.prepare("UPDATE meta SET value = value + 1 WHERE name = 'fence'"),
};

/** The last revision handed out: revisions grow with every write to any key, and never repeat (a deleted key's too). */
let revision = Math.max(
  (db.prepare("SELECT value FROM meta WHERE name = 'revision'").get() as { value: number }).value,
  (db.prepare('SELECT max(revision) AS r FROM kv').get() as { r: number | null }).r ?? 0,
);

port.postMessage('ready');

let queued: WriterRequest[] = [];
let scheduled = false;

port.on('message', (msg: WriterRequest | 'close') => {
  if (msg === 'close') {
    if (queued.length > 0) run();
    db.close();
    port.close();
    return;
  }
  queued.push(msg);
  if (!scheduled) {
    scheduled = true;
    // Every message already waiting is delivered before this runs: they commit together.
    setImmediate(run);
  }
});

function apply(op: WriteOp): WriteOutcome {
  switch (op.t) {
    case 'create': {
      if (stmt.revisionOf.get(op.key)) return { conflict: true };
      stmt.insert.run(op.key, ++revision, op.json);
      return { revision };
    }
    case 'update': {
      const next = revision + 1;
      if (stmt.update.run(op.json, next, op.key, op.revision).changes === 0) return { conflict: true };
      revision = next;
      return { revision };
    }
    case 'delete':
      if (op.revision === undefined) stmt.delete.run(op.key);
      else if (stmt.deleteAt.run(op.key, op.revision).changes === 0) return { conflict: true };
      return {};
    case 'ledger-append':
      for (const e of op.entries) stmt.ledgerAdd.run(op.upload, e.package_id, e.entity, e.rows, e.bytes, e.object_bytes);
      return {};
    case 'ledger-stored':
      // Not for a session gone or deleted: its clean-up may have dropped its markers already.
      if (op.guard !== undefined && stmt.live.get(op.guard) === undefined) return {};
      // A marker counts once, in its own transaction: a package marked again is not counted again.
      op.ids.forEach((id, i) => {
        if (stmt.storedAdd.run(op.upload, id).changes === 1 && op.entities) stmt.countAdd.run(op.upload, op.entities[i]!);
      });
      return {};
    case 'ledger-drop':
      stmt.ledgerDrop.run(op.upload);
      stmt.storedDrop.run(op.upload);
      stmt.countDrop.run(op.upload);
      return {};
    // The queue's commits share the group's transaction (and fsync) with the session writes
    // around them; acks and purges too, though nothing waits on them (a lost ack is one more
    // delivery), so they cost no fsync of their own once the queue is busy.
    case 'queue-commit':
      stmt.queueAdd.run(op.seq, op.upload, op.record);
      return {};
    case 'queue-ack':
      stmt.queueAck.run(op.seq);
      return {};
    case 'queue-purge':
      stmt.queuePurge.run(op.upload);
      return {};
    case 'queue-import':
      for (const r of op.rows) stmt.queueAdd.run(r.seq, r.upload, r.record);
      stmt.queueImported.run();
      return {};
  }
}

function run(): void {
  scheduled = false;
  const group = queued;
  queued = [];
  if (group.length === 0) return; // a close ran it already
  const before = revision;
  let outcomes: WriteOutcome[][];
  try {
    db.exec('BEGIN IMMEDIATE');
    outcomes = group.map((req) => req.items.map(apply));
    if (revision !== before) stmt.saveRevision.run(revision);
    db.exec('COMMIT');
  } catch (err) {
    rollback();
    // A commit refused for want of space (SQLITE_FULL: a write of its frames failed) never wrote
    // its commit frame, the last write before the log's fsync: nothing of it can come back at
    // a restart, fenced or not (on a full disk the fence fails too). An fsync that failed
    // (SQLITE_IOERR_FSYNC) may leave every frame there: then only the fence makes it definite.
    const unknown = !fence() && (err as { code?: string }).code !== 'SQLITE_FULL';
    const failure = { message: (err as Error).message, code: (err as { code?: string }).code, unknown };
    for (const req of group) port.postMessage({ id: req.id, error: failure } satisfies WriterResponse);
    return;
  }
  group.forEach((req, i) => port.postMessage({ id: req.id, results: outcomes[i]! } satisfies WriterResponse));
}

function rollback(): void {
  try {
    if (db.inTransaction) db.exec('ROLLBACK');
  } catch {
    // A rollback that fails leaves the transaction to SQLite's own recovery; the fence decides.
  }
}

/** Commits a write after a failed one, so that nothing of the failed one can come back at a restart. True once durable. */
function fence(): boolean {
  try {
    db.transaction(() => stmt.fence.run()).immediate();
    return true;
  } catch {
    rollback();
    return false;
  }
}
