/** What lands in S3 after a run: exactly the accepted rows, each package once; 32 MiB goes multipart. */
import { CreateMultipartUploadCommand, S3Client } from '@aws-sdk/client-s3';
import t from 'tap';
import { S3ObjectStore } from '../../src/store/s3/object-store.js';
import { clientOf, products, waitForStatus, yesterday } from '../support/harness.js';
import { startNats } from '../../testbed/nats.js';
import { distributed, spawnGateway } from '../../testbed/processes.js';
import { startS3 } from '../../testbed/s3.js';

async function readAll(store: S3ObjectStore, key: string): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of (await store.get(key))!) chunks.push(Buffer.from(c));
  return Buffer.concat(chunks).toString('utf8');
}

t.test('objects hold exactly the accepted rows; a 32 MiB package is a multipart upload', async (t) => {
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  const gw = await spawnGateway(t, { ...distributed(nats.url, s3), s3: { ...distributed(nats.url, s3).s3, partSizeBytes: 5 * 1024 * 1024 } });
  const c = clientOf(gw);
  const uuid = (await c.init()).body.upload_uuid;

  t.equal((await c.ingest(uuid, 'products', products(100, 0))).status, 200);
  t.equal((await c.ingest(uuid, 'products', products(50, 100))).status, 200);
  t.equal((await c.ingest(uuid, 'products', { columns: ['product_id', 'name', 'price'], data: [['x', 'y', -1]] })).status, 422);
  // ~32 MiB of rows.
  const big = products(400_000, 1000);
  big.data.forEach((row) => (row[1] = `${row[1]} ${'x'.repeat(47)}`));
  const size = Buffer.byteLength(JSON.stringify(big));
  t.ok(size > 30 * 1024 * 1024 && size <= 32 * 1024 * 1024, `big body is ${size} bytes`);
  const before = s3.requests.length;
  t.equal((await c.ingest(uuid, 'products', big)).status, 200);
  await waitForStatus(gw, uuid, (s) => s.upload_tasks_finished, undefined, 120_000);

  const parts = s3.requests.slice(before).filter((r) => r.method === 'PUT' && r.query.partNumber !== undefined);
  t.ok(parts.length >= 6, `the 32 MiB package went up in ${parts.length} parts`);

  const store = await S3ObjectStore.open({ endpoint: s3.endpoint, bucket: s3.bucket, region: s3.region, accessKeyId: s3.accessKeyId, secretAccessKey: s3.secretAccessKey });
  t.teardown(() => store.close());
  const objects = await store.list('');
  t.equal(objects.length, 3, 'one object per accepted package, none for the rejected one');
  const ids = new Map<string, number>();
  let rows = 0;
  for (const { key } of objects) {
    t.match(key, new RegExp(`^uploads/demo/${uuid}/products/[0-9a-f-]{36}\\.ndjson$`));
    const lines = (await readAll(store, key)).trimEnd().split('\n');
    const header = JSON.parse(lines[0]!);
    t.equal(header.rows, lines.length - 1, 'header count matches the lines');
    for (const line of lines.slice(1)) {
      const id = JSON.parse(line)[0] as string;
      ids.set(id, (ids.get(id) ?? 0) + 1);
      rows++;
    }
  }
  t.equal(rows, 400_150, 'every accepted row, and only those');
  t.equal(ids.size, 400_150, 'each row once');
  t.equal(ids.get('x'), undefined, 'nothing of the rejected package');
  t.same(await store.listIncompleteUploads(''), [], 'no incomplete multipart upload left');
});

t.test('an object store that cannot list multipart uploads (501): the sweep is skipped with one warning, the gateway serves', async (t) => {
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  s3.refuse((r) => r.method === 'GET' && 'uploads' in r.query, { status: 501, code: 'NotImplemented', message: 'A header you provided implies functionality that is not implemented' });
  const gw = await spawnGateway(t, distributed(nats.url, s3));
  const warnings = gw
    .output()
    .split('\n')
    .filter((l) => l.includes('"level":"warn"'));
  t.equal(warnings.filter((l) => l.includes('skipped the sweep of incomplete multipart uploads')).length, 1, 'one warning');
  t.match(warnings.join('\n'), /NotImplemented/);
  t.notMatch(gw.output(), /Unhandled|at .*node_modules/, 'no raw stack');
  const c = clientOf(gw);
  const uuid = (await c.init()).body.upload_uuid;
  t.equal((await c.ingest(uuid, 'products', products(3))).status, 200);
  await waitForStatus(gw, uuid, (b) => b.upload_tasks_finished);
  const store = await S3ObjectStore.open({ endpoint: s3.endpoint, bucket: s3.bucket, region: s3.region, accessKeyId: s3.accessKeyId, secretAccessKey: s3.secretAccessKey });
  t.teardown(() => store.close());
  t.equal((await store.list('')).length, 1, 'the package is stored');
});

t.test('start-upload while object storage refuses reads (the Connector emulator counts the objects): 503 Storage temporarily unavailable, session UPLOADING; 200 once it serves', async (t) => {
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  const gw = await spawnGateway(t, distributed(nats.url, s3));
  const c = clientOf(gw);
  const uuid = (await c.init()).body.upload_uuid;
  t.equal((await c.ingest(uuid, 'products', products(3))).status, 200);
  await waitForStatus(gw, uuid, (b) => b.can_start_upload);
  const allow = s3.refuse((r) => r.method === 'GET' && r.key.startsWith(`uploads/demo/${uuid}/`));
  const dates = { date_from: '2024-01-01', date_to: yesterday() };
  const refused = await c.start(uuid, dates);
  t.equal(refused.status, 503, 'storage unavailable, not a 500');
  t.same(refused.body, { detail: 'Storage temporarily unavailable' });
  t.ok(refused.headers['retry-after'], 'with Retry-After');
  t.equal((await c.status(uuid)).body.session_status, 'UPLOADING', 'the start put back');
  allow();
  t.equal((await c.start(uuid, dates)).status, 200, 'started once object storage serves again');
});

t.test('the start-up sweep aborts incomplete uploads under storage.objectPrefix only, not under a longer prefix in the same bucket', async (t) => {
  const s3 = await startS3(t);
  const { endpoint, bucket, region, accessKeyId, secretAccessKey } = s3;
  const client = new S3Client({ endpoint, region, forcePathStyle: true, credentials: { accessKeyId, secretAccessKey } });
  t.teardown(() => client.destroy());
  for (const Key of ['uploads/demo/left-behind.ndjson', 'uploads-archive/backup.tar']) {
    await client.send(new CreateMultipartUploadCommand({ Bucket: bucket, Key }));
  }
  // The sweep runs before the gateway listens.
  await spawnGateway(t, { storage: { objectPrefix: 'uploads' }, s3: { endpoint, bucket, region, accessKeyId, secretAccessKey, abortIncompleteAfterMs: 1 } });
  const store = await S3ObjectStore.open({ endpoint, bucket, region, accessKeyId, secretAccessKey });
  t.teardown(() => store.close());
  t.same((await store.listIncompleteUploads('')).map((u) => u.key), ['uploads-archive/backup.tar'], "the service's own aborted, another application's kept");
});

t.test('a failed put whose abort failed too leaves an incomplete upload: a running gateway sweeps it every s3.abortIncompleteAfterMs', async (t) => {
  const s3 = await startS3(t);
  const { endpoint, bucket, region, accessKeyId, secretAccessKey } = s3;
  const gw = await spawnGateway(t, { s3: { endpoint, bucket, region, accessKeyId, secretAccessKey, abortIncompleteAfterMs: 1 } });
  const store = await S3ObjectStore.open({ endpoint, bucket, region, accessKeyId, secretAccessKey, partSizeBytes: 5 * 1024 * 1024 });
  t.teardown(() => store.close());
  // What a put leaves when S3 fails its parts and its abort: a part stored, the upload never completed.
  const refused = s3.refuse((r) => r.method === 'PUT' && r.query.partNumber === '2');
  const unabortable = s3.refuse((r) => r.method === 'DELETE' && r.query.uploadId !== undefined);
  const body = async function* () {
    for (let i = 0; i < 12; i++) yield Buffer.alloc(1024 * 1024, 0x61);
  };
  await t.rejects(store.put('uploads/demo/failed-put.ndjson', body()));
  refused();
  unabortable();
  t.equal((await store.listIncompleteUploads('')).length, 1, 'the failed put left its upload behind');
  // The gateway's uploader sweeps again on its own, its age (1 ms) long past: no restart needed.
  const said = 'aborted incomplete multipart uploads left behind';
  await new Promise<void>((resolve) => {
    if (gw.output().includes(said)) return resolve();
    const onData = (chunk: Buffer) => {
      if (!chunk.toString().includes(said)) return;
      gw.child.stderr?.off('data', onData);
      resolve();
    };
    gw.child.stderr?.on('data', onData);
  });
  t.same(await store.listIncompleteUploads(''), [], 'swept by the running gateway, and said');
});
