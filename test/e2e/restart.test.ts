/** A restart of the embedded default loses no session and no accepted package. */
import t from 'tap';
import { clientOf, type Service, products, startService, waitForStatus, yesterday } from '../support/harness.js';

/** Every stored row, read back through the object store the service wrote. */
async function storedRows(svc: Service): Promise<string[]> {
  const objects = await svc.openObjects();
  try {
    const rows: string[] = [];
    for (const { key } of await objects.list('')) {
      const chunks: Buffer[] = [];
      for await (const chunk of (await objects.get(key))!) chunks.push(Buffer.from(chunk));
      rows.push(...Buffer.concat(chunks).toString('utf8').trim().split('\n').slice(1));
    }
    return rows.sort();
  } finally {
    await objects.close();
  }
}

t.test('sessions, entities and stored rows survive a restart; the flow continues to DONE', async (t) => {
  const svc = await startService(t, { storage: { inProcessUploader: true } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  t.equal((await c.ingest(uuid, 'products', products(50))).status, 200);
  t.equal((await c.ingest(uuid, 'products', products(25, 50))).status, 200);
  t.equal((await c.ingest(uuid, 'stores', { columns: ['store_id', 'name', 'opened_on'], data: [['s1', 'Main', '2024-02-29']] })).status, 200);
  await svc.restart();

  const st = await waitForStatus(svc, uuid, (b) => b.upload_tasks_finished);
  t.same(st.entities, ['products', 'stores']);
  const again = await c.init();
  t.equal(again.status, 409, 'the active session survived');
  t.equal(again.body.upload_uuid, uuid);

  const rows = await storedRows(svc);
  t.equal(rows.length, 76, 'every accepted row is stored, once');
  t.ok(rows.includes('["p-74","Product 74",74]'));

  t.equal((await c.start(uuid, { date_from: '2024-01-01', date_to: yesterday() })).status, 200);
  await svc.restart();
  const done = await waitForStatus(svc, uuid, (b) => b.session_status !== 'STARTED');
  t.equal(done.session_status, 'DONE', 'a workflow started before the restart still completes');
});

t.test('packages committed but not yet uploaded are uploaded after a restart', async (t) => {
  const svc = await startService(t, { storage: { inProcessUploader: false } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  t.equal((await c.ingest(uuid, 'products', products(30))).status, 200);
  const pending = (await c.status(uuid)).body;
  t.equal(pending.upload_tasks_finished, false, 'no uploader: the batch waits in the queue');
  t.equal(pending.can_start_upload, false);
  await svc.restart({ storage: { inProcessUploader: true } });
  await waitForStatus(svc, uuid, (b) => b.can_start_upload);
  t.equal((await storedRows(svc)).length, 30);
});
