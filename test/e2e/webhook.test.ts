/** The completion webhook: HMAC signature, replay window, replays of ignored webhooks, payload checks, unknown sessions. */
import t from 'tap';
import { signWebhook } from '../../src/connector/webhook.js';
import { API, call, clientOf, products, sendWebhook, startService, waitForStatus, yesterday } from '../support/harness.js';

t.test('webhook signature and payload checks', async (t) => {
  const svc = await startService(t, { connector: { emulatorDelayMs: 60_000 } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  await c.ingest(uuid, 'products', products(1));
  await waitForStatus(svc, uuid, (b) => b.can_start_upload);
  await c.start(uuid, { date_from: '2024-01-01', date_to: yesterday() });
  const payload = { upload_uuid: uuid, is_terminated: false };
  const now = Math.floor(Date.now() / 1000);

  for (const [name, opts] of [
    ['wrong secret', { secret: 'another-secret-0123456789' }],
    // A few seconds past the 300 s window: the service's clock reads later than `now` did.
    ['stale timestamp', { timestamp: now - 305 }],
    ['future timestamp', { timestamp: now + 305 }],
    ['garbage signature', { signature: 'sha256=zz' }],
    ['signature of another body', { signature: signWebhook('test-webhook-secret-0123456789', now, '{"upload_uuid":"x","is_terminated":true}') }],
  ] as const) {
    const res = await sendWebhook(svc.url, payload, opts);
    t.equal(res.status, 401, name);
    t.type(res.body.detail, 'string');
  }
  const unsigned = await call(svc.url, 'POST', `${API}/webhooks/upload-finished`, { client: null, body: payload });
  t.equal(unsigned.status, 401, 'no signature headers');
  t.equal((await c.status(uuid)).body.session_status, 'STARTED', 'nothing applied so far');

  const bad = await sendWebhook(svc.url, { upload_uuid: uuid });
  t.equal(bad.status, 422);
  t.match(bad.body.detail[0], { type: 'missing', loc: ['body', 'is_terminated'] });
  const unknown = await sendWebhook(svc.url, { upload_uuid: '00000000-0000-4000-8000-000000000000', is_terminated: false });
  t.same([unknown.status, unknown.body], [404, { detail: 'Upload session not found' }]);

  const applied = await sendWebhook(svc.url, payload);
  t.same([applied.status, applied.body], [200, { status: 'ok' }]);
  t.equal((await c.status(uuid)).body.session_status, 'DONE');
  const late = await sendWebhook(svc.url, { upload_uuid: uuid, is_terminated: true });
  t.same([late.status, late.body], [200, { status: 'ignored' }]);
  t.equal((await c.status(uuid)).body.session_status, 'DONE', 'a late terminate changes nothing');
});

t.test('a signed webhook that was ignored is remembered: replayed after the next start, it is ignored again', async (t) => {
  const svc = await startService(t, { connector: { emulatorDelayMs: 60_000 } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  await c.ingest(uuid, 'products', products(1));
  await waitForStatus(svc, uuid, (b) => b.can_start_upload);
  const state = async () => (await c.status(uuid)).body.session_status;

  // Captured while the session is UPLOADING, then sent again byte for byte (same timestamp and signature).
  const ts = Math.floor(Date.now() / 1000);
  const captured = { upload_uuid: uuid, is_terminated: false, status: 'succeeded' };
  const early = await sendWebhook(svc.url, captured, { timestamp: ts });
  t.same([early.status, early.body], [200, { status: 'ignored' }], 'not STARTED: ignored');
  t.equal(await state(), 'UPLOADING');

  t.equal((await c.start(uuid, { date_from: '2024-01-01', date_to: yesterday() })).status, 200);
  t.equal(await state(), 'STARTED');
  const replay = await sendWebhook(svc.url, captured, { timestamp: ts });
  t.same([replay.status, replay.body], [200, { status: 'ignored' }], 'the replay after the start: ignored');
  t.equal(await state(), 'STARTED', 'the new workflow is not ended by the replay');

  const fresh = await sendWebhook(svc.url, { ...captured, message: 'finished' }, { timestamp: ts });
  t.same([fresh.status, fresh.body], [200, { status: 'ok' }], 'a webhook the session has not seen is applied');
  t.equal(await state(), 'DONE');
});
