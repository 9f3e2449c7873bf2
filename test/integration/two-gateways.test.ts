/** Two gateway processes on one NATS JetStream and one S3 bucket behave as one service. */
import { PassThrough } from 'node:stream';
import t from 'tap';
import { request } from 'undici';
import { API, clientOf, DEMO, products, waitForStatus, yesterday } from '../support/harness.js';
import { startNats } from '../../testbed/nats.js';
import { distributed, spawnGateway } from '../../testbed/processes.js';
import { startS3 } from '../../testbed/s3.js';

t.test('two gateways share sessions through NATS', async (t) => {
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  const config = distributed(nats.url, s3);
  const [a, b] = await Promise.all([spawnGateway(t, config), spawnGateway(t, config)]);

  const inits = await Promise.all(Array.from({ length: 20 }, (_, i) => clientOf(i % 2 ? a : b).init()));
  const created = inits.filter((r) => r.status === 200);
  t.equal(created.length, 1, 'exactly one session for 20 concurrent calls over two gateways');
  const uuid = created[0]!.body.upload_uuid;
  t.ok(inits.every((r) => r.status === 200 || (r.status === 409 && r.body.status === 'already_exists' && r.body.upload_uuid === uuid)));

  t.equal((await clientOf(a).ingest(uuid, 'products', products(10))).status, 200);
  const seen = await waitForStatus(b, uuid, (s) => s.upload_tasks_finished);
  t.same(seen.entities, ['products'], 'ingest on A is visible on B');

  // An ingest held open mid-body on B: start-upload on A must wait for it.
  const body = new PassThrough();
  const held = request(`${b.url}${API}/${uuid}/catalogs`, {
    method: 'POST',
    headers: { authorization: DEMO.token, 'client-id': DEMO.id, 'content-type': 'application/json' },
    body,
  });
  body.write('{"columns":["catalog_id","name"],"data":[["c1","Root"]');
  await waitForStatus(a, uuid, (s) => s.upload_tasks_finished === false);
  const busy = await clientOf(a).start(uuid, { date_from: '2024-01-01', date_to: yesterday() });
  t.same([busy.status, busy.body], [409, { detail: 'Upload tasks are still in progress' }]);
  body.end(']}');
  t.equal((await held).statusCode, 200);

  await waitForStatus(a, uuid, (s) => s.can_start_upload);
  t.equal((await clientOf(a).start(uuid, { date_from: '2024-01-01', date_to: yesterday() })).status, 200);
  const done = await waitForStatus(b, uuid, (s) => s.session_status === 'DONE');
  t.same(done.entities, ['products', 'catalogs']);
});

t.test('a gateway that last saw a session as active answers as a fresh request once another gateway replaced it', async (t) => {
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  const config = distributed(nats.url, s3);
  const [a, b] = await Promise.all([spawnGateway(t, config), spawnGateway(t, config)]);
  const old = (await clientOf(b).init()).body.upload_uuid;
  t.equal((await clientOf(b).ingest(old, 'products', products(2))).status, 200, 'B knows the session as the active one');
  t.equal((await clientOf(a).remove(old)).status, 200, 'A deletes it');
  const fresh = (await clientOf(a).init()).body.upload_uuid;
  const stale = await clientOf(b).ingest(old, 'products', products(2));
  t.same([stale.status, stale.body], [403, { detail: 'Invalid upload UUID' }], 'B answers 403, not the deleted session’s 400');
  const unknown = await clientOf(b).ingest(old, 'no-such-entity', products(1));
  t.same([unknown.status, unknown.body], [403, { detail: 'Invalid upload UUID' }], 'the pointer check still comes before the entity check');
  t.equal((await clientOf(b).ingest(fresh, 'products', products(2))).status, 200, 'and B serves the new session');
});
