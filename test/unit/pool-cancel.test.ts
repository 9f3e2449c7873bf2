/**
 * The pool's answer to a request that goes away while one of its tasks runs: the sink lets
 * go at once, the task may finish (its result dropped) for `cancelAfterMs`, and only a task
 * still running then is cancelled, its worker replaced. Replacing a worker costs far more
 * CPU than a piece takes to finish, so aborted uploads must not churn workers (drill 5).
 */
import t from 'tap';
import { findEntity } from '../../src/entities/catalog.js';
import { ValidationPool } from '../../src/validation-pool/pool.js';
import type { PackageWriter } from '../../src/store/ports.js';
import { FAULTY_WORKER, HOLD_MARKER, holdChannel } from '../support/faulty-worker.js';

const writer: PackageWriter = { append: async () => {}, commit: async () => {}, abort: async () => {} };
const BODY = JSON.stringify({ columns: ['catalog_id', 'name'], data: [['c1', HOLD_MARKER]] });

const pool = new ValidationPool({ workers: 1, maxQueue: 4, cancelAfterMs: 500, filename: FAULTY_WORKER });
t.teardown(() => pool.destroy());
const channel = new BroadcastChannel(holdChannel());
t.teardown(() => channel.close());
let onRunning: () => void = () => {};
channel.onmessage = (e) => {
  if ((e as MessageEvent).data === 'running') onRunning();
};

/** Starts a package whose only piece holds in the worker; resolves once it is running. */
async function heldPackage() {
  const running = new Promise<void>((resolve) => (onRunning = resolve));
  const sink = pool.createIngest({ entity: findEntity('catalogs')!, open: async () => writer });
  sink.write(Buffer.from(BODY));
  const ended = sink.end().then(
    () => null,
    (err: unknown) => err,
  );
  await running;
  return { sink, ended };
}

const idle = async () => {
  for (let i = 0; i < 500; i++) {
    const load = pool.load;
    if (load.open === 0 && load.running === 0 && load.threads === 1) return load;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`pool never idle: ${JSON.stringify(pool.load)}`);
};

t.test('a task that finishes within cancelAfterMs keeps its worker', async (t) => {
  const before = (await idle()).threadIds;
  const { sink, ended } = await heldPackage();
  sink.abort();
  t.match(await ended, { code: 'INTERNAL' }, 'end() rejects');
  // The task holds until released below: end() settled without waiting for it.
  t.match(pool.load, { open: 0, running: 1 }, 'at once: the admission is back while the task still runs');
  channel.postMessage('release');
  t.same((await idle()).threadIds, before, 'the task finished: its worker is still the same thread');
});

t.test('a task still running after cancelAfterMs is cancelled and its worker replaced', async (t) => {
  const before = (await idle()).threadIds;
  const { sink, ended } = await heldPackage();
  sink.abort();
  await ended;
  // Not released: the worker would hold it for 30 s.
  const load = await idle();
  t.equal(load.threadIds.length, 1);
  t.not(load.threadIds[0], before[0], 'cancelled: a new worker thread took its place');
  channel.postMessage('release');
});

t.test('the pool serves normally afterwards', async (t) => {
  const sink = pool.createIngest({ entity: findEntity('catalogs')!, open: async () => writer });
  sink.write(Buffer.from('{"columns":["catalog_id","name"],"data":[["c1","x"],["c2","y"]]}'));
  t.equal((await sink.end()).rows, 2);
});
