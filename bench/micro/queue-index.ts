/**
 * Micro-benchmark: the embedded queue's commit index as it is (the `queue` table of the state
 * database, written through `StateDatabase`'s writer thread: state-db.ts) against the same
 * records in a bare SQLite thread (WAL, `synchronous=FULL`, the operations waiting meanwhile
 * in one transaction), the variant this bench first measured against the hand-written index
 * log the table replaced (10–11 against 15–16 µs CPU per package at 64 in flight, 31–41
 * against 32–34 at 16, 96–102 against 70–79 at 4: CHANGELOG). The workload is the queue's per
 * package: a durable commit (a 7 KB package's record: meta, totals, one batch location), then
 * an ack, `--in-flight` packages at a time. Reported per package: wall time, and CPU of the
 * main thread and of the process (the SQLite thread included), each variant `--rounds` times,
 * alternating.
 *
 *   node dist/bench/micro/queue-index.js [--packages 20000] [--in-flight 64] [--rounds 3]
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { isMainThread, parentPort, Worker } from 'node:worker_threads';
import { openSqlite } from '../../src/store/embedded/sqlite.js';
import type { CommitRecord } from '../../src/store/embedded/batch-queue/index-format.js';
import { StateDatabase } from '../../src/store/embedded/state-db.js';

type OpIn = { t: 'c'; seq: number; json: string } | { t: 'a'; seq: number };
type Op = OpIn & { id: number };

if (!isMainThread) {
  // The SQLite side: ops that arrive while a transaction commits go together in the next one.
  const db = openSqlite(process.env.QUEUE_INDEX_DB!);
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = FULL');
  db.exec('CREATE TABLE IF NOT EXISTS queue (seq INTEGER PRIMARY KEY, record TEXT NOT NULL)');
  const insert = db.prepare('INSERT INTO queue (seq, record) VALUES (?, ?)');
  const remove = db.prepare('DELETE FROM queue WHERE seq = ?');
  let waiting: Op[] = [];
  let scheduled = false;
  const run = db.transaction((ops: Op[]) => {
    for (const op of ops) {
      if (op.t === 'c') insert.run(op.seq, op.json);
      else remove.run(op.seq);
    }
  });
  parentPort!.on('message', (op: Op) => {
    waiting.push(op);
    if (scheduled) return;
    scheduled = true;
    setImmediate(() => {
      scheduled = false;
      const ops = waiting;
      waiting = [];
      run(ops);
      parentPort!.postMessage(ops.map((o) => o.id));
    });
  });
} else {
  const { values } = parseArgs({
    options: { packages: { type: 'string', default: '20000' }, 'in-flight': { type: 'string', default: '64' }, rounds: { type: 'string', default: '3' } },
  });
  const packages = Number(values.packages);
  const inFlight = Number(values['in-flight']);
  const rounds = Number(values.rounds);

  const record = (seq: number): CommitRecord => ({
    t: 'c',
    seq,
    meta: { package_id: `pkg${seq.toString(36).padStart(20, '0')}`, client_id: 'bench-3', upload_uuid: '11111111-1111-4111-8111-111111111111', entity: 'products', columns: ['product_id', 'name', 'price'] },
    rows: 200,
    bytes: 7168,
    at: Date.now(),
    batches: [[seq >> 11, (seq & 2047) * 7168, 7168, 0x1234abcd]],
  });

  /** Runs `one` for every package, `inFlight` at a time; wall and CPU per package. */
  async function measure(one: (seq: number) => Promise<void>, cpuOf: () => number) {
    const cpu0 = process.cpuUsage();
    const other0 = cpuOf();
    const t0 = performance.now();
    let next = 0;
    await Promise.all(
      Array.from({ length: inFlight }, async () => {
        while (next < packages) await one(next++);
      }),
    );
    const wall = performance.now() - t0;
    const cpu = process.cpuUsage(cpu0);
    return { wallUs: (wall * 1000) / packages, mainUs: (cpu.user + cpu.system) / packages, otherUs: ((cpuOf() - other0) * 1000) / packages };
  }

  /** As the queue writes: the commit awaited, the ack not (it is awaited here only to keep `inFlight` packages in flight). */
  async function stateDb(dir: string) {
    const db = await StateDatabase.open(join(dir, 'state.sqlite'));
    const r = await measure(async (seq) => {
      const { meta, rows, bytes, at, batches } = record(seq);
      await db.write({ t: 'queue-commit', seq, upload: meta.upload_uuid, record: JSON.stringify({ meta, rows, bytes, at, batches }) });
      await db.write({ t: 'queue-ack', seq });
    }, () => 0);
    await db.close();
    return r;
  }

  async function sqlite(dir: string) {
    const worker = new Worker(new URL(import.meta.url), { env: { ...process.env, QUEUE_INDEX_DB: join(dir, 'queue.sqlite') } });
    await new Promise((resolve) => worker.once('online', resolve));
    const pending = new Map<number, () => void>();
    worker.on('message', (ids: number[]) => {
      for (const id of ids) pending.get(id)?.();
    });
    let id = 0;
    const send = (op: OpIn) =>
      new Promise<void>((resolve) => {
        const n = id++;
        pending.set(n, () => {
          pending.delete(n);
          resolve();
        });
        worker.postMessage({ ...op, id: n });
      });
    const threadMs = () => worker.performance.eventLoopUtilization().active;
    const r = await measure(async (seq) => {
      await send({ t: 'c', seq, json: JSON.stringify(record(seq)) });
      await send({ t: 'a', seq });
    }, threadMs);
    await worker.terminate();
    return r;
  }

  const fmt = (r: { wallUs: number; mainUs: number; otherUs: number }) => `wall ${r.wallUs.toFixed(1)} µs, process CPU ${r.mainUs.toFixed(1)} µs (SQLite thread busy ${r.otherUs.toFixed(1)} µs)`;
  console.log(`# queue index: ${packages} packages (commit synced, then ack), ${inFlight} in flight, per package`);
  for (let round = 1; round <= rounds; round++) {
    for (const [name, run] of [
      ['state db', stateDb],
      ['sqlite', sqlite],
    ] as const) {
      const dir = await mkdtemp(join(tmpdir(), 'queue-index-'));
      try {
        console.log(`round ${round} ${name}: ${fmt(await run(dir))}`);
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    }
  }
}
