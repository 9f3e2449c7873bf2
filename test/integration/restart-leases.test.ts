/**
 * Leftovers of a gateway that died heal themselves on NATS (docs/reliability.md, Leftovers
 * after a restart heal themselves): the lease of an ingest in flight lasts
 * `ingest.inFlightLeaseMs` (15 s) past its last renewal, and renewals run only while the
 * ingest does, so a killed gateway's sessions are ready to start seconds after the kill
 * (before: 660 s), and its claimed Idempotency-Keys are taken over as fast. A live ingest
 * outlasting many leases keeps its own.
 */
import { PassThrough } from 'node:stream';
import t from 'tap';
import { request } from 'undici';
import { loadConfig } from '../../src/config/config.js';
import { API, clientOf, DEMO, DEMO2, leasesLapsed, products, waitForStatus, yesterday } from '../support/harness.js';
import { startNats } from '../../testbed/nats.js';
import { distributed, spawnGateway, type GatewayProc } from '../../testbed/processes.js';
import { startS3 } from '../../testbed/s3.js';

/** An ingest whose body stops half way: its lease is taken, its package never complete. */
function heldIngest(gw: GatewayProc, uuid: string, client: { id: string; token: string }, headers: Record<string, string> = {}) {
  const body = new PassThrough();
  const answer = request(`${gw.url}${API}/${uuid}/catalogs`, {
    method: 'POST',
    headers: { authorization: client.token, 'client-id': client.id, 'content-type': 'application/json', ...headers },
    body,
  }).then(
    async (res) => ({ status: res.statusCode, body: await res.body.json() }),
    (err: unknown) => ({ status: 0, body: err }),
  );
  body.write('{"columns":["catalog_id","name"],"data":[["c1","Root"]');
  return { answer, end: () => body.end(',["c2","Leaf"]]}') };
}

const dates = { date_from: '2024-01-01', date_to: yesterday() };

t.test('a gateway killed with ingests in flight: on the default lease its sessions can start again within seconds, and a retry of its keyed ingest runs', async (t) => {
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  const config = distributed(nats.url, s3);
  const a = await spawnGateway(t, config);
  const uuid = (await clientOf(a).init()).body.upload_uuid as string;
  t.equal((await clientOf(a).ingest(uuid, 'products', products(4))).status, 200);
  // Stored and acked first: a package in the uploader's hands when its process dies comes back after `nats.ackWaitMs`.
  await waitForStatus(a, uuid, (s) => s.can_start_upload);
  const keyed = (await clientOf(a, DEMO2).init()).body.upload_uuid as string;

  const plain = heldIngest(a, uuid, DEMO);
  const key = heldIngest(a, keyed, DEMO2, { 'idempotency-key': 'retry-me' });
  await waitForStatus(a, uuid, (s) => s.upload_tasks_finished === false);
  await waitForStatus(a, keyed, (s) => s.upload_tasks_finished === false, DEMO2);
  await a.kill();
  const killedAt = Date.now();
  t.equal((await plain.answer).status, 0, 'the in-flight ingest was cut unanswered');
  await key.answer;

  const b = await spawnGateway(t, config);
  // The default lease, not the clock, is the subject: a short one (before: 660 s), after which
  // the session is ready with no write of any gateway (the cut package was never committed).
  const leaseMs = loadConfig({}).ingest.inFlightLeaseMs;
  t.ok(leaseMs <= 15_000, `the default ingest.inFlightLeaseMs is seconds (${leaseMs} ms)`);
  await leasesLapsed(killedAt, leaseMs);
  const healed = (await clientOf(b).status(uuid)).body;
  t.ok(healed.upload_tasks_finished && healed.can_start_upload, `ready again once the dead gateway's lease lapsed: ${JSON.stringify(healed)}`);
  t.same(healed.entities, ['products'], 'the cut package was never recorded');
  const started = await clientOf(b).start(uuid, dates);
  t.equal(started.status, 200, `start-upload: ${started.text}`);
  t.same(started.body.entities, [{ name: 'products', rows: 4 }]);

  // The keyed retry waits for the dead claim (409 with Retry-After while it lasts), then runs.
  let retried: Awaited<ReturnType<typeof request>>;
  for (;;) {
    retried = await request(`${b.url}${API}/${keyed}/catalogs`, {
      method: 'POST',
      headers: { authorization: DEMO2.token, 'client-id': DEMO2.id, 'content-type': 'application/json', 'idempotency-key': 'retry-me' },
      body: '{"columns":["catalog_id","name"],"data":[["c1","Root"],["c2","Leaf"]]}',
    });
    const text = await retried.body.text();
    if (retried.statusCode === 200 || Date.now() - killedAt > 30_000) {
      t.equal(retried.statusCode, 200, `the retry ran: ${text}`);
      break;
    }
    t.equal(retried.statusCode, 409, `in progress while the dead claim lasts: ${text}`);
    await new Promise((r) => setTimeout(r, Number(retried.headers['retry-after'] ?? 1) * 1000));
  }
  t.ok(Date.now() - killedAt < 30_000, `the dead instance's claim was taken over ${Date.now() - killedAt} ms after the kill (before: idempotency.leaseMs, 30 s)`);
  const done = await waitForStatus(b, keyed, (s) => s.can_start_upload, DEMO2);
  t.same(done.entities, ['catalogs']);
  const keyedStart = await clientOf(b, DEMO2).start(keyed, dates);
  t.same(keyedStart.body.entities, [{ name: 'catalogs', rows: 2 }], 'stored once');
});

t.test('a live ingest outlasting many leases keeps its own: renewed while it runs, then recorded', async (t) => {
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  const leaseMs = 1000;
  const gw = await spawnGateway(t, { ...distributed(nats.url, s3), ingest: { inFlightLeaseMs: leaseMs } });
  const uuid = (await clientOf(gw).init()).body.upload_uuid as string;
  t.equal((await clientOf(gw).ingest(uuid, 'products', products(3))).status, 200);
  const held = heldIngest(gw, uuid, DEMO);
  await waitForStatus(gw, uuid, (s) => s.upload_tasks_finished === false);
  // Time is the subject: the body stays open for four leases.
  await new Promise((r) => setTimeout(r, 4 * leaseMs));
  const during = await clientOf(gw).status(uuid);
  t.equal(during.body.upload_tasks_finished, false, 'still in flight after four leases');
  const busy = await clientOf(gw).start(uuid, dates);
  t.same([busy.status, busy.body], [409, { detail: 'Upload tasks are still in progress' }]);
  held.end();
  const answer = await held.answer;
  t.equal(answer.status, 200, `recorded: ${JSON.stringify(answer.body)}`);
  await waitForStatus(gw, uuid, (s) => s.can_start_upload);
  const started = await clientOf(gw).start(uuid, dates);
  t.same(started.body.entities, [{ name: 'products', rows: 3 }, { name: 'catalogs', rows: 2 }], 'and stored');
});
