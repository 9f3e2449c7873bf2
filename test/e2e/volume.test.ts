/**
 * Sessions at volume: past 1,000 objects the Connector start body names a manifest object
 * instead of listing them, and stays small; the manifest lists every stored object with its
 * real size and rows; the emulator reads it. Object sizes in the start body are the stored
 * objects' sizes.
 */
import t from 'tap';
import { countRows } from '../../src/store/object-format.js';
import { clientOf, fakeConnector, products, startService, waitForStatus, yesterday, type Service } from '../support/harness.js';

const dates = { date_from: '2024-01-01', date_to: yesterday() };
const PACKAGES = 1001;

/** `n` packages of one row each, alternately catalogs and products: the first alone (so catalogs is the first entity), then 16 at a time. */
async function fill(svc: Service, uuid: string, n: number): Promise<void> {
  const c = clientOf(svc);
  const send = async (i: number) => {
    const res = await c.ingest(uuid, i % 2 ? 'products' : 'catalogs', i % 2 ? products(1, i) : { columns: ['catalog_id', 'name'], data: [[`c-${i}`, 'C']] });
    if (res.status !== 200) throw new Error(`package ${i}: ${res.status} ${res.text}`);
  };
  await send(0);
  let next = 1;
  const lane = async () => {
    while (next < n) await send(next++);
  };
  await Promise.all(Array.from({ length: 16 }, lane));
}

async function objectSizes(svc: Service): Promise<Map<string, number>> {
  const store = await svc.openObjects();
  try {
    return new Map((await store.list('')).map((o) => [o.key, o.size]));
  } finally {
    await store.close();
  }
}

t.test(`a session of ${PACKAGES} packages: the start body names a manifest with every object`, async (t) => {
  const fake = await fakeConnector(t);
  const svc = await startService(t, { connector: { url: fake.url }, limits: { requestsPerSecond: 0, concurrentPerClient: 0 } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  await fill(svc, uuid, PACKAGES);
  const st = await waitForStatus(svc, uuid, (b) => b.can_start_upload, undefined, 60_000);
  t.same(st.entities, ['catalogs', 'products']);
  t.equal((await c.start(uuid, dates)).status, 200);

  const sent = fake.requests.at(-1)!;
  const text = JSON.stringify(sent.body);
  t.ok(text.length < 2000, `the start body stays small (${text.length} bytes)`);
  t.same(sent.body.objects, [], 'no inline objects');
  t.same(sent.body.entities, [
    { name: 'catalogs', packages: 501, rows: 501 },
    { name: 'products', packages: 500, rows: 500 },
  ]);
  const manifest = sent.body.manifest as { key: string; objects: number; bytes: number };
  t.equal(manifest.objects, PACKAGES);
  t.match(manifest.key, new RegExp(`/${uuid}/manifest\\.ndjson$`));

  const sizes = await objectSizes(svc);
  t.equal(sizes.get(manifest.key), manifest.bytes, 'the manifest object has the declared size');
  const store = await svc.openObjects();
  t.teardown(() => store.close());
  const chunks: Buffer[] = [];
  for await (const chunk of (await store.get(manifest.key))!) chunks.push(Buffer.from(chunk));
  const lines = Buffer.concat(chunks).toString('utf8').trimEnd().split('\n');
  t.equal(lines.length, PACKAGES, 'one line per object');
  const objects = lines.map((l) => JSON.parse(l) as { entity: string; key: string; rows: number; bytes: number });
  t.equal(new Set(objects.map((o) => o.key)).size, PACKAGES, 'each object once');
  const wrong = objects.filter((o) => sizes.get(o.key) !== o.bytes || o.rows !== 1 || !o.key.includes(`/${o.entity}/`));
  t.same(wrong, [], 'every line names a stored object with its real size, entity and rows');
});

t.test(`the emulator reads the manifest of a ${PACKAGES}-package session and completes it`, async (t) => {
  const svc = await startService(t, { limits: { requestsPerSecond: 0, concurrentPerClient: 0 } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  await fill(svc, uuid, PACKAGES);
  await waitForStatus(svc, uuid, (b) => b.can_start_upload, undefined, 60_000);
  const start = await c.start(uuid, dates);
  t.equal(start.status, 200);
  t.same(start.body.entities, [
    { name: 'catalogs', rows: 501 },
    { name: 'products', rows: 500 },
  ], 'the rows the emulator counted in storage');
  const done = await waitForStatus(svc, uuid, (b) => b.session_status !== 'STARTED', undefined, 60_000);
  t.match(done, { session_status: 'DONE', last_workflow: { status: 'succeeded', message: `Processed ${PACKAGES} rows` } });
});

t.test('inline objects carry the stored objects’ sizes', async (t) => {
  const fake = await fakeConnector(t);
  const svc = await startService(t, { connector: { url: fake.url } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  for (const n of [1, 5, 50]) t.equal((await c.ingest(uuid, 'products', products(n))).status, 200);
  await waitForStatus(svc, uuid, (b) => b.can_start_upload);
  t.equal((await c.start(uuid, dates)).status, 200);
  const sent = fake.requests.at(-1)!.body as { objects: { key: string; rows: number; bytes: number }[]; manifest?: unknown };
  t.notOk('manifest' in sent);
  const sizes = await objectSizes(svc);
  const store = await svc.openObjects();
  t.teardown(() => store.close());
  for (const o of sent.objects) {
    t.equal(o.bytes, sizes.get(o.key), `${o.rows} rows: size as stored`);
    t.equal((await countRows((await store.get(o.key))!)).rows, o.rows);
  }
  t.same(sent.objects.map((o) => o.rows).sort((a, b) => a - b), [1, 5, 50]);
});

t.test('a row of 2 MiB (longer than a NATS message may be) is accepted, stored whole and counted by the Connector', async (t) => {
  const svc = await startService(t);
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  const name = 'n'.repeat(2 * 1024 * 1024);
  const res = await c.ingest(uuid, 'catalogs', { columns: ['catalog_id', 'name'], data: [['c-0', 'C'], ['c-1', name], ['c-2', 'C']] });
  t.equal(res.status, 200, res.text.slice(0, 200));
  await waitForStatus(svc, uuid, (s) => s.can_start_upload);
  t.same((await objectSizes(svc)).size, 1, 'one object');
  t.equal((await c.start(uuid, dates)).status, 200);
  const done = await waitForStatus(svc, uuid, (s) => s.session_status !== 'STARTED');
  t.match(done, { session_status: 'DONE', last_workflow: { message: 'Processed 3 rows' } }, 'every row read back');
});
