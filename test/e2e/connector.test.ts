/** start-upload and terminate against a scripted fake Connector: the error mapping of docs/api.md, The Connector. */
import t from 'tap';
import { clientOf, fakeConnector, products, sendWebhook, startService, waitForStatus, yesterday } from '../support/harness.js';

const dates = { date_from: '2024-01-01', date_to: yesterday() };

async function readySession(t: { teardown(fn: () => unknown): void; equal: (a: unknown, b: unknown) => void }, connectorUrl: string, timeoutMs = 10_000) {
  const svc = await startService(t, { connector: { url: connectorUrl, timeoutMs } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  t.equal((await c.ingest(uuid, 'products', products(4))).status, 200);
  await waitForStatus(svc, uuid, (b) => b.can_start_upload);
  return { svc, c, uuid };
}

t.test('start: 2xx JSON passes through unchanged; the request carries the session', async (t) => {
  const fake = await fakeConnector(t);
  // Byte for byte: an id past 2^53, `1.0`, `1e3` and the spacing would not survive a parse and a serialisation.
  const answer = '{"workflow_id": 12345678901234567890, "ratio": 1.0, "extra": {"n": 1e3}}';
  fake.script((_req, _body, res) => res.writeHead(201, { 'content-type': 'application/json' }).end(answer));
  const { svc, c, uuid } = await readySession(t, fake.url);
  const res = await c.start(uuid, dates);
  t.equal(res.status, 200);
  t.equal(res.text, answer);
  t.match(res.headers['content-type'], /^application\/json/);
  const sent = fake.requests.at(-1)!;
  t.equal(sent.method, 'POST');
  t.equal(sent.url, '/workflows');
  t.match(sent.body, {
    upload_uuid: uuid,
    client_id: 'demo',
    date_from: dates.date_from,
    date_to: dates.date_to,
    entities: [{ name: 'products', packages: 1, rows: 4 }],
    callback_url: `${svc.url}/api/v1/uploading/webhooks/upload-finished`,
  });
  t.equal(sent.body.objects.length, 1);
  t.match(sent.body.objects[0], { entity: 'products', rows: 4, key: /products\/.+\.ndjson$/ });
  t.equal((await c.status(uuid)).body.session_status, 'STARTED');

  const hook = await sendWebhook(svc.url, { upload_uuid: uuid, is_terminated: false });
  t.same(hook.body, { status: 'ok' });
  t.equal((await c.status(uuid)).body.session_status, 'DONE');
});

t.test('start: a PUBLIC_URL with a trailing slash still gives a callback_url the gateway serves (no `//`)', async (t) => {
  const fake = await fakeConnector(t);
  const svc = await startService(t, { publicUrl: 'http://127.0.0.1:1/', connector: { url: fake.url } });
  svc.url = `http://127.0.0.1:${svc.app.port}`;
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  await c.ingest(uuid, 'products', products(1));
  await waitForStatus(svc, uuid, (b) => b.can_start_upload);
  t.equal((await c.start(uuid, dates)).status, 200);
  const callback = fake.requests.at(-1)!.body.callback_url as string;
  // `http://127.0.0.1:1//api/…` before: a path with an empty segment, which the gateway answers 404
  // (docs/api.md, API decisions), so no completion webhook could ever reach the session.
  t.equal(callback, 'http://127.0.0.1:1/api/v1/uploading/webhooks/upload-finished');
});

const startCases: [string, number, string, number, unknown][] = [
  ['409 with detail', 409, '{"detail":"Dates overlap a running import"}', 409, { detail: 'Dates overlap a running import' }],
  ['409 with message', 409, '{"message":"Quota exceeded"}', 409, { detail: 'Quota exceeded' }],
  ['409 plain text', 409, 'busy', 409, { detail: 'busy' }],
  ['409 empty', 409, '', 409, { detail: 'Connector rejected the upload start, please contact support' }],
  ['500 forwarded', 500, '{"detail":"boom"}', 500, { detail: 'boom' }],
  ['503 forwarded', 503, 'down for maintenance', 503, { detail: 'down for maintenance' }],
];

for (const [name, code, text, status, body] of startCases) {
  t.test(`start: Connector ${name} → ${status}, session stays UPLOADING`, async (t) => {
    const fake = await fakeConnector(t);
    fake.script((_req, _body, res) => res.writeHead(code, { 'content-type': 'application/json' }).end(text));
    const { c, uuid } = await readySession(t, fake.url);
    const res = await c.start(uuid, dates);
    t.same([res.status, res.body], [status, body]);
    if (status === 503) t.equal(res.headers['retry-after'], '5', 'a 503 says when to come back, as every 503 of the service');
    const st = (await c.status(uuid)).body;
    t.equal(st.session_status, 'UPLOADING');
    t.equal(st.can_start_upload, true);
  });
}

t.test('start: Connector unreachable or too slow → 502, session unchanged, a later start succeeds', async (t) => {
  const fake = await fakeConnector(t);
  let mode: 'hang' | 'ok' = 'hang';
  fake.script((_req, _body, res) => {
    if (mode === 'ok') res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}');
  });
  const { c, uuid } = await readySession(t, fake.url, 300);
  const slow = await c.start(uuid, dates);
  t.same([slow.status, slow.body], [502, { detail: 'Failed to connect to Connector service' }]);
  t.equal((await c.status(uuid)).body.session_status, 'UPLOADING');
  mode = 'ok';
  const later = await c.start(uuid, dates);
  t.same([later.status, later.body], [200, { ok: true }]);

  const { c: c2, uuid: uuid2 } = await readySession(t, 'http://127.0.0.1:9');
  const refused = await c2.start(uuid2, dates);
  t.same([refused.status, refused.body], [502, { detail: 'Failed to connect to Connector service' }]);
});

const terminateCases: [number, number, string][] = [
  [200, 200, ''],
  [404, 404, 'Failed to stop workflow'],
  [409, 409, 'Failed to stop workflow'],
  [500, 500, 'Failed to stop workflow'],
];
for (const [code, status, detail] of terminateCases) {
  t.test(`terminate: Connector ${code} → ${status}`, async (t) => {
    const fake = await fakeConnector(t);
    const { c, uuid } = await readySession(t, fake.url);
    t.equal((await c.start(uuid, dates)).status, 200);
    fake.script((_req, _body, res) => res.writeHead(code, { 'content-type': 'application/json' }).end('{}'));
    const res = await c.terminate(uuid);
    t.equal(res.status, status);
    if (detail) t.same(res.body, { detail });
    else t.equal(res.body.status, 'started');
    t.equal(fake.requests.at(-1)!.url, `/workflows/${uuid}/terminate`);
    t.equal((await c.status(uuid)).body.session_status, 'STARTED', 'only the webhook moves the session');
  });
}
