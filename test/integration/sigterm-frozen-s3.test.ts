/**
 * SIGTERM while object storage is frozen (s3rver SIGSTOPped) and the in-process uploader has a
 * package in hand: the gateway is gone 5 s past `limits.shutdownGraceMs` (stop-signals.ts)
 * instead of waiting for the put's requests to run out (`s3.requestTimeoutMs`, three attempts:
 * minutes; before, the stop waited for them). Leaving is safe: after a restart with S3 back,
 * the package answered 200 is stored, once.
 */
import t from 'tap';
import { clientOf, products, waitForStatus } from '../support/harness.js';
import { startNats } from '../../testbed/nats.js';
import { distributed, spawnGateway } from '../../testbed/processes.js';
import { startS3Process } from '../../testbed/s3.js';

t.test('SIGTERM with S3 frozen under a put: gone past the grace, the 200 stored once after', async (t) => {
  const [nats, s3] = await Promise.all([startNats(t), startS3Process(t)]);
  const config = { ...distributed(nats.url, s3), limits: { shutdownGraceMs: 500 } };
  const gw = await spawnGateway(t, config);
  const demo = clientOf(gw);
  const uuid = (await demo.init()).body.upload_uuid as string;

  s3.pause();
  try {
    t.equal((await demo.ingest(uuid, 'products', products(3))).status, 200, 'a package, its put stuck on the frozen S3');
    await gw.stop();
  } finally {
    s3.resume();
  }
  t.equal(gw.child.signalCode, 'SIGKILL', 'ended by its own SIGKILL, without waiting for the put');
  t.match(gw.output(), /gateway did not stop in time/, 'and said why');

  const again = await spawnGateway(t, config);
  const status = await waitForStatus(again, uuid, (s) => s.upload_tasks_finished === true, undefined, 60_000);
  t.same([status.totals.packages, status.totals.stored_packages], [1, 1], 'the 200, stored once');
});
