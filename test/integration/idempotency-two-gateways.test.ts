/**
 * `Idempotency-Key` across gateway processes on one NATS JetStream and one S3 bucket: the
 * first attempt on A, the retry on B, answers once and stores once — also when A is killed
 * while it holds the key.
 */
import { PassThrough } from 'node:stream';
import t, { type Test } from 'tap';
import { request } from 'undici';
import { S3ObjectStore } from '../../src/store/s3/object-store.js';
import { countRows } from '../../src/store/object-format.js';
import { API, call, clientOf, DEMO, products, waitForStatus, whenChanged } from '../support/harness.js';
import { startNats } from '../../testbed/nats.js';
import { distributed, spawnGateway, type GatewayProc } from '../../testbed/processes.js';
import { startS3, type S3Endpoint } from '../../testbed/s3.js';

const ingest = (gw: { url: string }, uuid: string, entity: string, body: unknown, key: string) =>
  call(gw.url, 'POST', `${API}/${uuid}/${entity}`, { body, headers: { 'idempotency-key': key } });

/** Row counts of the stored objects of one session's entity, once its writes are done. */
async function storedRows(gw: { url: string }, s3: S3Endpoint, uuid: string, entity: string): Promise<number[]> {
  await waitForStatus(gw, uuid, (s) => s.upload_tasks_finished);
  const store = await S3ObjectStore.open({ endpoint: s3.endpoint, bucket: s3.bucket, region: s3.region, accessKeyId: s3.accessKeyId, secretAccessKey: s3.secretAccessKey });
  try {
    const rows: number[] = [];
    for (const { key } of await store.list(`uploads/${DEMO.id}/${uuid}/${entity}/`)) rows.push((await countRows((await store.get(key))!)).rows);
    return rows;
  } finally {
    await store.close();
  }
}

/** A keyed ingest on `gw` whose body stops after `head`: it holds the key until it ends or its gateway dies. */
async function holdKey(t: Test, gw: GatewayProc, uuid: string, key: string, head: string) {
  const body = new PassThrough();
  const abort = new AbortController();
  const pending = request(`${gw.url}${API}/${uuid}/products`, {
    method: 'POST',
    headers: { authorization: DEMO.token, 'client-id': DEMO.id, 'content-type': 'application/json', 'idempotency-key': key },
    body,
    signal: abort.signal,
  });
  pending.catch(() => {});
  t.teardown(() => abort.abort());
  body.write(head);
  // Held once a probe for another entity under the key answers 422 (an unknown entity: the
  // probe claims nothing), asked again after each write (the claim is the gateway's).
  let last = '';
  await whenChanged(
    gw,
    async () => {
      const probe = await ingest(gw, uuid, 'nope', products(1), key);
      last = `${probe.status} ${probe.text}`;
      if (probe.status !== 422 && probe.status !== 400) throw new Error(`the key was never held: ${last}`);
      return probe.status === 422;
    },
    () => `the key was never held: ${last}`,
    10_000,
  );
  return { body, abort, pending };
}

t.test('two gateways: a retry on B of an attempt on A answers once and stores once', async (t) => {
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  const config = {
    ...distributed(nats.url, s3),
    limits: { requestsPerSecond: 0 },
    // A short lease, so that the crash case below is taken over within the retry's wait.
    idempotency: { leaseMs: 1500, waitMs: 8000 },
  };
  const [a, b] = await Promise.all([spawnGateway(t, config), spawnGateway(t, config)]);
  const uuid = (await clientOf(a).init()).body.upload_uuid;

  await t.test('answered on A, retried on B', async (t) => {
    const first = await ingest(a, uuid, 'products', products(40), 'answered');
    t.equal(first.status, 200);
    const retry = await ingest(b, uuid, 'products', products(40), 'answered');
    t.same([retry.status, retry.text, retry.headers['idempotent-replayed']], [200, first.text, 'true']);
    const bad = { columns: ['product_id', 'name', 'price'], data: [['p', 'n', -1]] };
    const rejected = await ingest(a, uuid, 'products', bad, 'rejected');
    t.equal(rejected.status, 422);
    t.same([(await ingest(b, uuid, 'products', bad, 'rejected')).text], [rejected.text], 'a 422 too');
  });

  await t.test('the connection to A dropped after the whole body; the retry on B', async (t) => {
    const text = JSON.stringify(products(3000, 1000));
    const { body, abort, pending } = await holdKey(t, a, uuid, 'dropped', text.slice(0, 100));
    body.end(text.slice(100));
    abort.abort(); // the answer, if any, never arrives
    await t.rejects(pending);
    const retry = await ingest(b, uuid, 'products', JSON.parse(text), 'dropped');
    t.same([retry.status, retry.body?.rows_processed], [200, 3000], 'answered, whether A finished it or it ran again');
  });

  await t.test('A is killed while it holds the key; the retry on B takes it over after the lease', async (t) => {
    // Nothing left in A's uploader first: a package it holds when killed waits out the queue's ack wait (30 s).
    await waitForStatus(b, uuid, (s) => s.upload_tasks_finished);
    const text = JSON.stringify(products(500, 5000));
    await holdKey(t, a, uuid, 'killed', text.slice(0, 2000));
    await a.kill();
    const retry = await ingest(b, uuid, 'products', JSON.parse(text), 'killed');
    t.same([retry.status, retry.body?.rows_processed, retry.headers['idempotent-replayed']], [200, 500, undefined], 'B ran it');
    t.equal((await ingest(b, uuid, 'products', JSON.parse(text), 'killed')).headers['idempotent-replayed'], 'true');
  });

  const rows = await storedRows(b, s3, uuid, 'products');
  t.same(rows.sort((x, y) => x - y), [40, 500, 3000], 'each package stored once, nothing of the 422');
});
