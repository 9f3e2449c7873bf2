/**
 * Failure drill 4: a validation worker crashes in the middle of a package.
 *
 * The service runs with a validation worker that is the real one except that a task whose
 * rows hold `CRASH_MARKER` makes its thread exit (`test/support/faulty-worker.ts`, loaded
 * through the app's general `validationWorker` option). Expected: that request answers
 * 500 in the contract's shape and stores nothing (no object, no queued or half-written
 * package, no entity counted, the lease released); requests running beside it on the other
 * worker are not disturbed; the pool is back to its full thread count; the next request
 * succeeds and the session completes end to end.
 */
import t, { type Test } from 'tap';
import { API, call, clientOf, products, waitForStatus, whenChanged, yesterday } from '../support/harness.js';
import { CRASH_MARKER, FAULTY_WORKER } from '../support/faulty-worker.js';
import { capturingLogger, eventually, startInProcess } from '../support/in-process.js';

const PIECE = 16 * 1024;

/** A products package of `n` rows whose row `at` carries the crash marker (none when `at` < 0). */
function crashingPackage(n: number, at: number) {
  const body = products(n);
  if (at >= 0) body.data[at] = [`p-${at}`, CRASH_MARKER, 1];
  return body;
}

t.test('drill 4: a worker crash fails that request cleanly; the pool recovers', async (t) => {
  const logger = capturingLogger();
  const svc = await startInProcess(
    t,
    { ingest: { workers: 2, pieceBytes: PIECE, piecesPerRequest: 2 } },
    { validationWorker: FAULTY_WORKER, logger },
  );
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid as string;
  const idle = () => {
    const load = svc.app.ingestLoad();
    return load.open === 0 && load.running === 0 && load.waiting === 0 && load.queued === 0 && load.threads === 2 && load;
  };
  await eventually(idle, 'the pool to start its threads');
  let stored = 0;
  let rows = 0;

  const expectNothingStored = async (t: Test, what: string) => {
    const st = await waitForStatus(svc, uuid, (b) => b.upload_tasks_finished);
    t.same(st.entities, stored ? ['products'] : [], `${what}: no entity counted for the failed package`);
    t.equal((await svc.objects()).length, stored, `${what}: no object stored for it`);
    const files = await svc.queueFiles(uuid);
    t.same(files.incoming, [], `${what}: no half-written package left in the queue`);
    t.same(files.ready, [], `${what}: nothing committed to the queue`);
    t.ok(await eventually(idle, 'the pool to be idle with every thread back'), `${what}: pool idle, ${svc.config.ingest.workers} threads`);
  };
  const nextSucceeds = async (t: Test, what: string, n = 50) => {
    const res = await c.ingest(uuid, 'products', products(n, rows));
    t.same([res.status, res.body?.rows_processed], [200, n], `${what}: the next request succeeds`);
    stored++;
    rows += n;
    await whenChanged(svc, async () => (await svc.objects()).length === stored, () => 'the package was never stored');
  };

  await t.test('crash in a one-piece package', async (t) => {
    const res = await c.ingest(uuid, 'products', crashingPackage(20, 7));
    t.equal(res.status, 500);
    t.same(res.body, { detail: 'Internal server error' }, 'the contract shape: {detail: string}');
    await expectNothingStored(t, 'one piece');
    await nextSucceeds(t, 'one piece');
  });

  await t.test('crash in the last pieces of a long package, after earlier batches were appended', async (t) => {
    const body = crashingPackage(12_000, 11_500);
    const bytes = JSON.stringify(body).length;
    t.ok(bytes > 20 * PIECE, `the package is ${Math.round(bytes / PIECE)} pieces long`);
    const res = await c.ingest(uuid, 'products', body);
    t.same([res.status, res.body], [500, { detail: 'Internal server error' }]);
    await expectNothingStored(t, 'mid-package');
    await nextSucceeds(t, 'mid-package', 5_000);
  });

  await t.test('a gzip package crashing: the same', async (t) => {
    const { gzipSync } = await import('node:zlib');
    const res = await call(svc.url, 'POST', `${API}/${uuid}/products`, {
      raw: gzipSync(JSON.stringify(crashingPackage(3_000, 2_000))),
      headers: { 'content-type': 'application/json', 'content-encoding': 'gzip' },
    });
    t.same([res.status, res.body], [500, { detail: 'Internal server error' }]);
    await expectNothingStored(t, 'gzip');
  });

  await t.test('requests beside the crashing one are not disturbed', async (t) => {
    const good = Array.from({ length: 6 }, (_, i) => c.ingest(uuid, 'products', products(2_000, rows + i * 2_000)));
    const bad = c.ingest(uuid, 'products', crashingPackage(2_000, 1_000));
    const answers = await Promise.all([bad, ...good]);
    t.same(answers[0]!.body, { detail: 'Internal server error' }, 'the crashing request: 500');
    t.same(
      answers.slice(1).map((a) => [a.status, a.body?.rows_processed]),
      Array(6).fill([200, 2_000]),
      'the six others: 200',
    );
    stored += 6;
    rows += 12_000;
    await whenChanged(svc, async () => (await svc.objects()).length === stored, () => 'the six packages were never stored');
    await expectNothingStored(t, 'beside others');
  });

  await t.test('crash after crash: the pool keeps replacing its workers', async (t) => {
    for (let i = 0; i < 4; i++) {
      const res = await c.ingest(uuid, 'products', crashingPackage(100, i * 20));
      t.equal(res.status, 500, `crash ${i + 1}`);
    }
    await expectNothingStored(t, 'four crashes');
    await nextSucceeds(t, 'four crashes');
  });

  await t.test('the crash is logged as an internal error, with its cause', async (t) => {
    const crashes = logger.lines.filter((l) => l.includes('"request failed"'));
    t.ok(crashes.length >= 8, `${crashes.length} internal errors logged`);
    t.match(crashes[0], /exited with code: 3/);
  });

  await t.test('the session completes end to end after the crashes', async (t) => {
    const st = await waitForStatus(svc, uuid, (b) => b.can_start_upload);
    t.same(st.entities, ['products']);
    const started = await c.start(uuid, { date_from: '2024-01-01', date_to: yesterday() });
    t.equal(started.status, 200);
    t.same(started.body.entities, [{ name: 'products', rows }], 'the Connector counts exactly the rows of the successful packages');
    t.equal((await waitForStatus(svc, uuid, (b) => b.session_status === 'DONE')).session_status, 'DONE');
  });
});
