/** `kill -9` of an uploader in the middle of a multipart upload: stored once, nothing incomplete left. */
import t, { type Test } from 'tap';
import { S3ObjectStore } from '../../src/store/s3/object-store.js';
import { clientOf, products, waitForStatus } from '../support/harness.js';
import { startNats } from '../../testbed/nats.js';
import { distributed, spawnGateway, spawnUploader } from '../../testbed/processes.js';
import { startS3 } from '../../testbed/s3.js';

/**
 * A gateway and NATS and S3, one 30 MB package stored (200) and queued, and an uploader that
 * has begun its multipart upload (a part PUT seen).
 */
async function midMultipart(t: Test) {
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  const base = distributed(nats.url, s3);
  const config = {
    ...base,
    storage: { inProcessUploader: false },
    nats: { ...base.nats, ackWaitMs: 3000 },
    s3: { ...base.s3, partSizeBytes: 5 * 1024 * 1024, queueSize: 1 },
  };
  const gw = await spawnGateway(t, config);
  const c = clientOf(gw);
  const uuid = (await c.init()).body.upload_uuid;
  const big = products(300_000);
  big.data.forEach((row) => (row[1] = `${row[1]} ${'y'.repeat(60)}`));
  t.equal((await c.ingest(uuid, 'products', big)).status, 200);
  t.equal((await c.status(uuid)).body.upload_tasks_finished, false, 'queued, no uploader yet');

  const first = await spawnUploader(t, config);
  let noPart: NodeJS.Timeout | undefined;
  await Promise.race([
    s3.seen((r) => r.method === 'PUT' && r.query.partNumber !== undefined),
    new Promise((_, reject) => (noPart = setTimeout(() => reject(new Error(`no part upload within 60 s:\n${first.output()}`)), 60_000))),
  ]).finally(() => clearTimeout(noPart));
  const store = await S3ObjectStore.open({ endpoint: s3.endpoint, bucket: s3.bucket, region: s3.region, accessKeyId: s3.accessKeyId, secretAccessKey: s3.secretAccessKey });
  t.teardown(() => store.close());
  return { gw, config, uuid, first, store };
}

t.test('an uploader killed mid-multipart: after restart the package is stored exactly once', async (t) => {
  const { gw, config, uuid, first, store } = await midMultipart(t);
  await first.kill();

  t.same(await store.list(''), [], 'nothing stored by the killed uploader');
  t.ok((await store.listIncompleteUploads('')).length >= 1, 'it left an incomplete multipart upload');

  await spawnUploader(t, { ...config, s3: { ...config.s3, abortIncompleteAfterMs: 1 } });
  await waitForStatus(gw, uuid, (s) => s.upload_tasks_finished, undefined, 60_000);
  const objects = await store.list('');
  t.equal(objects.length, 1, 'stored exactly once');
  const chunks: Buffer[] = [];
  for await (const chunk of (await store.get(objects[0]!.key))!) chunks.push(Buffer.from(chunk));
  t.equal(Buffer.concat(chunks).toString('utf8').trimEnd().split('\n').length, 300_001, 'header and every row');
  t.same(await store.listIncompleteUploads(''), [], 'no incomplete upload left');
});

t.test('a second SIGTERM while the package in hand uploads: the uploader exits at once (code 1); restarted, it stores the package once', async (t) => {
  const { gw, config, uuid, first, store } = await midMultipart(t);
  const exited = new Promise<number | null>((resolve) => first.child.once('exit', (code) => resolve(code)));
  const stopping = new Promise<void>((resolve) => {
    const onData = (chunk: Buffer) => {
      if (!chunk.toString().includes('uploader stopping')) return;
      first.child.stderr?.off('data', onData);
      resolve();
    };
    first.child.stderr?.on('data', onData);
  });
  first.child.kill('SIGTERM');
  await stopping;
  t.equal(first.child.exitCode, null, 'the first signal waits for the package in hand');
  first.child.kill('SIGTERM');
  t.equal(await exited, 1, 'the second exits at once, code 1');

  await spawnUploader(t, { ...config, s3: { ...config.s3, abortIncompleteAfterMs: 1 } });
  await waitForStatus(gw, uuid, (s) => s.upload_tasks_finished, undefined, 60_000);
  t.equal((await store.list('')).length, 1, 'stored exactly once');
});
