/**
 * A 3-node JetStream cluster with R3 KV and stream loses a node in the middle of a
 * 500-package run: requests during failover may fail with a 5xx, never with a wrong
 * answer, and every package that got 200 is in S3 exactly once.
 */
import t from 'tap';
import { S3ObjectStore } from '../../src/store/s3/object-store.js';
import { clientOf, waitForStatus } from '../support/harness.js';
import { startNatsCluster } from '../../testbed/nats.js';
import { distributed, spawnGateway } from '../../testbed/processes.js';
import { startS3 } from '../../testbed/s3.js';

const PACKAGES = 500;
const ROWS = 20;

t.test('a node dies mid-run; every 200 is stored exactly once', async (t) => {
  const [cluster, s3] = await Promise.all([startNatsCluster(t, 3), startS3(t)]);
  const base = distributed(cluster.urls, s3);
  const gw = await spawnGateway(t, { ...base, nats: { ...base.nats, replicas: 3, ackWaitMs: 10_000 }, limits: { requestsPerSecond: 0, concurrentPerClient: 0 } } as never);
  const c = clientOf(gw);
  const uuid = (await c.init()).body.upload_uuid;

  const accepted = new Set<number>();
  const failures = new Map<number, number>();
  let next = 0;
  let killed = false;
  const worker = async () => {
    for (let n = next++; n < PACKAGES; n = next++) {
      if (n === 150 && !killed) {
        killed = true;
        await cluster.servers[0]!.kill();
      }
      const body = { columns: ['product_id', 'name'], data: Array.from({ length: ROWS }, (_, i) => [`p-${n}-${i}`, `n${i}`]) };
      const res = await c.ingest(uuid, 'products', body);
      if (res.status === 200) {
        t.equal(res.body.rows_processed, ROWS);
        accepted.add(n);
      } else {
        failures.set(res.status, (failures.get(res.status) ?? 0) + 1);
      }
    }
  };
  await Promise.all(Array.from({ length: 8 }, worker));
  t.ok(killed);
  for (const status of failures.keys()) t.ok(status >= 500, `a failed request answered ${status}, a 5xx`);
  t.ok(accepted.size >= PACKAGES * 0.8, `${accepted.size} of ${PACKAGES} accepted (failures: ${JSON.stringify([...failures])})`);

  // Polled (no `changes`): status reads any replica (direct get), and a follower catching up
  // after the last write was told, or a lease of a failed request lapsing, is no write of ours.
  await waitForStatus({ url: gw.url }, uuid, (s) => s.upload_tasks_finished, undefined, 120_000).catch(async (err: Error) => {
    // Say what is holding the session up: leases left in its record, or batches in the queue.
    const { connect } = await import('nats');
    const nc = await connect({ servers: cluster.urls.split(',').slice(1) });
    const record = await (await nc.jetstream().views.kv('ingest_sessions')).get(`session.${uuid}`);
    const value = record ? JSON.parse(Buffer.from(record.value).toString()) : null;
    const stream = await (await nc.jetstreamManager()).streams.info('INGEST');
    await nc.close();
    err.message += `\nleases: ${JSON.stringify(value?.in_flight)}\npackages: ${value?.packages.length}\nqueue: ${JSON.stringify(stream.state)}\ngateway log tail: ${gw.output().slice(-2000)}`;
    throw err;
  });
  const store = await S3ObjectStore.open({ endpoint: s3.endpoint, bucket: s3.bucket, region: s3.region, accessKeyId: s3.accessKeyId, secretAccessKey: s3.secretAccessKey });
  t.teardown(() => store.close());
  const seen = new Map<string, number>();
  for (const { key } of await store.list('')) {
    const chunks: Buffer[] = [];
    for await (const chunk of (await store.get(key))!) chunks.push(Buffer.from(chunk));
    for (const line of Buffer.concat(chunks).toString('utf8').trimEnd().split('\n').slice(1)) {
      const id = JSON.parse(line)[0] as string;
      seen.set(id, (seen.get(id) ?? 0) + 1);
    }
  }
  let missing = 0;
  for (const n of accepted) for (let i = 0; i < ROWS; i++) if (seen.get(`p-${n}-${i}`) !== 1) missing++;
  t.equal(missing, 0, 'every row of every accepted package is stored exactly once');
  t.ok([...seen.values()].every((count) => count === 1), 'no row stored twice');
});
