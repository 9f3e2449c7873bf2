/**
 * The embedded state database's reader: a worker thread that owns the read connection
 * (state-db.ts is the other side), so that a read the disk does not answer (a frozen or hung
 * device) blocks this thread, never the event loop: the request that waits for it is told
 * 503 at its deadline while `/healthz` and every other answer go on. Reads that arrive
 * together run in turn and are answered in one message.
 */
import { parentPort, workerData } from 'node:worker_threads';
import type { SqliteStatement } from './sqlite.js';
import { openStateReader, READS, type Read, type ReaderRequest, type ReaderResponse, type ReadName, type ReadResult } from './state-schema.js';

const port = parentPort!;
const { path } = workerData as { path: string };

const db = openStateReader(path);
const statements = new Map<ReadName, SqliteStatement>();
for (const [name, { sql }] of Object.entries(READS)) statements.set(name as ReadName, db.prepare(sql));

port.postMessage('ready');

port.on('message', (msg: ReaderRequest | 'close') => {
  if (msg === 'close') {
    db.close();
    port.close();
    return;
  }
  port.postMessage({ id: msg.id, results: msg.items.map(run) } satisfies ReaderResponse);
});

function run({ q, params }: Read): ReadResult {
  try {
    const stmt = statements.get(q)!;
    return { rows: READS[q].all ? stmt.all(...params) : stmt.get(...params) };
  } catch (err) {
    return { error: { message: (err as Error).message, code: (err as { code?: string }).code } };
  }
}
