/**
 * The embedded default's disk frozen (DATA_DIR on faultfs, its daemon stopped: every call on
 * the mount waits, as on a hung device): the process goes on answering (`/healthz` 200, also
 * after the disk's deadline passed), `/readyz` names `storage`, and every request that needs
 * the disk answers 503 `Storage temporarily unavailable` with `Retry-After` at
 * `storage.diskTimeoutMs`, not once the disk comes back (a read the page cache answers
 * answers as before). (Before, a read of the state database
 * on the event loop's thread stopped the whole process, `/healthz` included.) Once the disk
 * answers again the gateway serves without a restart, and what it stored is exactly the 200s.
 */
import t from 'tap';
import { API, call, clientOf, products, tempDir, waitForStatus } from '../support/harness.js';
import { mountFaultFs } from '../../testbed/faultfs.js';
import { spawnGateway } from '../../testbed/processes.js';

t.test("the embedded default's disk frozen: 503s at the deadline, /healthz answers, recovery after", async (t) => {
  const disk = await mountFaultFs(t, await tempDir(t, 'embedded-disk-frozen-'));
  const gw = await spawnGateway(t, { dataDir: disk.dir, storage: { diskTimeoutMs: 500 }, health: { readyTimeoutMs: 500 } });
  const demo = clientOf(gw);
  const uuid = (await demo.init()).body.upload_uuid as string;
  t.equal((await demo.ingest(uuid, 'products', products(3))).status, 200, 'a package before the freeze');

  disk.freeze();
  const healthz = () => call(gw.url, 'GET', '/healthz', { client: null });
  let answers;
  try {
    answers = await Promise.all([
      healthz(),
      call(gw.url, 'GET', '/readyz', { client: null }),
      demo.status(uuid),
      demo.ingest(uuid, 'products', products(4, 10)),
      demo.init(),
    ]);
    // Every deadline has passed: the event loop still turns while the disk stays frozen.
    t.equal((await healthz()).status, 200, '/healthz after the deadlines, the disk still frozen');
  } finally {
    disk.thaw();
  }
  const [live, ready, status, ingest, init] = answers;
  t.same([live.status, live.body], [200, { status: 'ok' }], '/healthz while the disk is frozen');
  t.equal(ready.status, 503, '/readyz: not ready');
  t.equal((ready.body as { checks?: Record<string, string> }).checks?.storage, 'timeout', '/readyz names storage');
  // A read the kernel's page cache answers needs no disk: the answer it gives is true as well.
  const unavailable = (what: string, res: typeof live) => {
    t.same([res.status, res.body], [503, { detail: 'Storage temporarily unavailable' }], `${what}: 503 (${res.text})`);
    t.match(res.headers['retry-after'], /^[1-9]\d*$/, `${what}: with Retry-After`);
  };
  unavailable('ingest', ingest);
  if (status.status === 200) t.equal(status.body.totals.packages, 1, 'status from the cache: as before the freeze');
  else unavailable('status', status);
  if (init.status === 409) t.equal(init.body.upload_uuid, uuid, 'initialize-session from the cache: the session there');
  else unavailable('initialize-session', init);

  // The disk answers again: no restart needed, and nothing of the refused package is stored.
  t.equal((await demo.ingest(uuid, 'products', products(5, 20))).status, 200, 'a package after the thaw');
  const done = await waitForStatus(gw, uuid, (s) => s.upload_tasks_finished === true);
  t.same(
    { packages: done.totals.packages, rows: done.totals.rows, stored: done.totals.stored_packages },
    { packages: 2, rows: 8, stored: 2 },
    'the two 200s, stored; not the 503',
  );
  const readyAgain = await call(gw.url, 'GET', '/readyz', { client: null });
  t.equal(readyAgain.status, 200, `/readyz ready again (${readyAgain.text})`);
});
