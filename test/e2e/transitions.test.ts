/** Every row of the state table of docs/api.md (plus delete, workflow failure and dry runs), over real HTTP. */
import { PassThrough } from 'node:stream';
import { gzipSync } from 'node:zlib';
import t from 'tap';
import { request } from 'undici';
import { startApp } from '../../src/app.js';
import { silentLogger } from '../../src/log.js';
import type { SessionRecord } from '../../src/session/state.js';
import { openEngines } from '../../src/store/engines.js';
import { idempotencyKey, sessionKey, sessionObjectPrefix } from '../../src/store/keys.js';
import type { LedgerEntry } from '../../src/store/ports.js';
import { API, call, clientOf, DEMO, DEMO2, fakeConnector, products, sendWebhook, startService, waitForStatus, yesterday } from '../support/harness.js';
import { auth, head, RawClient } from '../support/raw-http.js';

const dates = () => ({ date_from: '2024-01-01', date_to: yesterday() });

t.test('a whole session: UPLOADING → STARTED → DONE through the emulator, then a new session', async (t) => {
  const svc = await startService(t);
  const c = clientOf(svc);

  const init = await c.init();
  t.equal(init.status, 200);
  t.equal(init.body.status, 'created');
  t.match(init.body.upload_uuid, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  t.notOk('previous_upload_uuid' in init.body);
  const uuid = init.body.upload_uuid;

  const fresh = await c.status(uuid);
  t.same(fresh.body, {
    upload_uuid: uuid,
    session_status: 'UPLOADING',
    entities: [],
    upload_tasks_finished: true,
    can_upload_entities: true,
    can_start_upload: false,
    can_terminate: false,
    entity_counts: [],
    totals: { packages: 0, rows: 0, bytes: 0, stored_packages: 0 },
  });

  const first = await c.ingest(uuid, 'products', products(3));
  t.equal(first.status, 200);
  t.same(first.body, { status: 'success', message: first.body.message, rows_processed: 3 });
  t.equal((await c.ingest(uuid, 'catalogs', { columns: ['catalog_id', 'name'], data: [['c1', 'Root']] })).status, 200);
  t.equal((await c.ingest(uuid, 'products', products(2, 3))).status, 200);

  const ready = await waitForStatus(svc, uuid, (b) => b.can_start_upload);
  t.same(ready.entities, ['products', 'catalogs'], 'each entity once, in order of first upload');
  t.equal(ready.upload_tasks_finished, true);

  const started = await c.start(uuid, dates());
  t.equal(started.status, 200);
  t.equal(started.body.status, 'started');
  t.same(started.body.entities, [
    { name: 'products', rows: 5 },
    { name: 'catalogs', rows: 1 },
  ], 'the emulator counted the stored rows');

  const done = await waitForStatus(svc, uuid, (b) => b.session_status === 'DONE');
  t.same(
    { ...done, last_workflow: undefined, entity_counts: undefined, totals: undefined },
    { upload_uuid: uuid, session_status: 'DONE', entities: ['products', 'catalogs'], upload_tasks_finished: true, can_upload_entities: false, can_start_upload: false, can_terminate: false, last_workflow: undefined, entity_counts: undefined, totals: undefined },
  );
  t.match(done.totals, { packages: 3, rows: 6, stored_packages: 3 });
  t.equal(done.last_workflow.status, 'succeeded');

  const next = await c.init();
  t.equal(next.status, 200, 'DONE → initialize-session creates a new session');
  t.equal(next.body.previous_upload_uuid, uuid);
  t.not(next.body.upload_uuid, uuid);
  t.equal((await c.status(uuid)).body.session_status, 'DONE', 'the old session stays readable');
});

t.test('initialize-session conflicts: UPLOADING → already_exists, STARTED → workflow_running', async (t) => {
  const svc = await startService(t, { connector: { emulatorDelayMs: 60_000 } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  const again = await c.init();
  t.equal(again.status, 409);
  t.same(again.body, { status: 'already_exists', session_status: 'UPLOADING', upload_uuid: uuid, message: again.body.message });
  t.type(again.body.message, 'string');

  await c.ingest(uuid, 'products', products(1));
  await waitForStatus(svc, uuid, (b) => b.can_start_upload);
  t.equal((await c.start(uuid, dates())).status, 200);
  const running = await c.init();
  t.equal(running.status, 409);
  t.same(running.body, { status: 'workflow_running', session_status: 'STARTED', upload_uuid: uuid, message: running.body.message });
});

t.test('STARTED: ingest, start and delete answer 409 expected UPLOADING; terminate → webhook → UPLOADING', async (t) => {
  const svc = await startService(t, { connector: { emulatorDelayMs: 60_000 } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  await c.ingest(uuid, 'products', products(2));
  await waitForStatus(svc, uuid, (b) => b.can_start_upload);
  t.equal((await c.start(uuid, dates())).status, 200);

  const st = await c.status(uuid);
  t.match(st.body, { session_status: 'STARTED', can_terminate: true, can_upload_entities: false, can_start_upload: false });

  const wrong = { detail: { message: 'Invalid upload session status', expected: 'UPLOADING', actual: 'STARTED' } };
  const ingest = await c.ingest(uuid, 'products', products(1));
  t.equal(ingest.status, 409);
  t.same(ingest.body, wrong);
  const start = await c.start(uuid, dates());
  t.equal(start.status, 409);
  t.same(start.body, wrong);
  const del = await c.remove(uuid);
  t.equal(del.status, 409);
  t.same(del.body, wrong);

  const term = await c.terminate(uuid);
  t.equal(term.status, 200);
  t.equal(term.body.status, 'started');
  t.match(term.body.message, /UPLOADING/);
  const back = await waitForStatus(svc, uuid, (b) => b.session_status === 'UPLOADING');
  t.equal(back.last_workflow.status, 'terminated');
  t.same(back.entities, ['products'], 'data kept after terminate');
  t.equal((await c.ingest(uuid, 'products', products(1, 10))).status, 200, 'the client may upload again');
});

t.test('terminate outside STARTED: 404 Workflow is not running', async (t) => {
  const svc = await startService(t);
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  const res = await c.terminate(uuid);
  t.equal(res.status, 404);
  t.same(res.body, { detail: 'Workflow is not running' });
});

t.test('workflow failure: webhook status failed → UPLOADING with last_workflow, then a later start succeeds', async (t) => {
  const connector = await fakeConnector(t);
  const svc = await startService(t, { connector: { url: connector.url } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  await c.ingest(uuid, 'products', products(2));
  await waitForStatus(svc, uuid, (b) => b.can_start_upload);
  await c.start(uuid, dates());

  const hook = await sendWebhook(svc.url, { upload_uuid: uuid, is_terminated: false, status: 'failed', message: 'bad prices' });
  t.equal(hook.status, 200);
  t.same(hook.body, { status: 'ok' });
  const st = (await c.status(uuid)).body;
  t.equal(st.session_status, 'UPLOADING');
  t.equal(st.can_start_upload, true);
  t.match(st.last_workflow, { status: 'failed', message: 'bad prices' });
  t.type(st.last_workflow.finished_at, 'string');

  const repeat = await sendWebhook(svc.url, { upload_uuid: uuid, is_terminated: false, status: 'failed' });
  t.same(repeat.body, { status: 'ignored' }, 'a repeat changes nothing');
  t.equal((await c.start(uuid, dates())).status, 200);
});

t.test('delete: UPLOADING → cleared; status 404; path checks 400; next init has no previous_upload_uuid', async (t) => {
  const svc = await startService(t);
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  await c.ingest(uuid, 'products', products(5));
  const del = await c.remove(uuid);
  t.equal(del.status, 200);
  t.same(del.body, { status: 'started', message: 'Upload deletion started' });

  const st = await c.status(uuid);
  t.equal(st.status, 404);
  t.same(st.body, { detail: 'Upload session not found' });
  const ingest = await c.ingest(uuid, 'products', products(1));
  t.equal(ingest.status, 400);
  t.same(ingest.body, { detail: 'Upload session not initialized' });

  const init = await c.init();
  t.equal(init.status, 200);
  t.equal(init.body.status, 'created');
  t.notOk('previous_upload_uuid' in init.body);
});

t.test('delete on DONE answers 409 with actual DONE', async (t) => {
  const svc = await startService(t);
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  await c.ingest(uuid, 'stores', { columns: ['store_id', 'name'], data: [['s1', 'Main']] });
  await waitForStatus(svc, uuid, (b) => b.can_start_upload);
  await c.start(uuid, dates());
  await waitForStatus(svc, uuid, (b) => b.session_status === 'DONE');
  const del = await c.remove(uuid);
  t.equal(del.status, 409);
  t.same(del.body, { detail: { message: 'Invalid upload session status', expected: 'UPLOADING', actual: 'DONE' } });
  const ingest = await c.ingest(uuid, 'stores', { columns: ['store_id', 'name'], data: [] });
  t.equal(ingest.status, 409);
  t.equal(ingest.body.detail.actual, 'DONE');
});

t.test('20 concurrent initialize-session calls create exactly one session', async (t) => {
  const svc = await startService(t);
  const answers = await Promise.all(Array.from({ length: 20 }, () => clientOf(svc).init()));
  const created = answers.filter((a) => a.status === 200);
  t.equal(created.length, 1);
  const uuid = created[0]!.body.upload_uuid;
  for (const a of answers.filter((a) => a.status !== 200)) {
    t.equal(a.status, 409);
    t.equal(a.body.status, 'already_exists');
    t.equal(a.body.upload_uuid, uuid);
  }
});

t.test('empty data is accepted with rows_processed 0 and lists the entity', async (t) => {
  const svc = await startService(t);
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  const res = await c.ingest(uuid, 'stock', { columns: ['store_id', 'product_id', 'date', 'quantity'], data: [] });
  t.equal(res.status, 200);
  t.equal(res.body.rows_processed, 0);
  t.same((await waitForStatus(svc, uuid, (b) => b.upload_tasks_finished)).entities, ['stock']);
});

t.test('status is scoped to the client: another client gets 404 for the same uuid', async (t) => {
  const svc = await startService(t);
  const uuid = (await clientOf(svc).init()).body.upload_uuid;
  const other = await call(svc.url, 'GET', `${API}/${uuid}/status`, { client: { id: 'demo-2', token: 'demo-2-token' } });
  t.equal(other.status, 404);
  t.same(other.body, { detail: 'Upload session not found' });
  t.equal((await call(svc.url, 'GET', `${API}/${uuid}/status`, { client: DEMO })).status, 200);
});

t.test('dry run: a 413 over the body limit carries Dry-Run: true, by Content-Length or while the body streams (a package\'s does not)', async (t) => {
  const svc = await startService(t, { limits: { ingestBodyBytes: 64 * 1024 } });
  const uuid = (await clientOf(svc).init()).body.upload_uuid as string;
  for (const query of ['?dry_run=true', '']) {
    const raw = new RawClient(t, svc.url);
    await raw.write(head('POST', `${API}/${uuid}/products${query}`, `${auth}Content-Type: application/json\r\nContent-Length: ${64 * 1024 + 1}\r\n`));
    const declared = await raw.response();
    t.same([declared.status, declared.headers['dry-run']], [413, query ? 'true' : undefined], `Content-Length over the limit${query ? ', a dry run' : ', a package'}`);
    const body = new PassThrough();
    const streamed = request(`${svc.url}${API}/${uuid}/products${query}`, {
      method: 'POST',
      headers: { authorization: DEMO.token, 'client-id': DEMO.id, 'content-type': 'application/json' },
      body,
    });
    body.end(JSON.stringify(products(5000)));
    const res = await streamed;
    t.same([res.statusCode, res.headers['dry-run'], await res.body.json()], [413, query ? 'true' : undefined, { detail: 'Request body too large (limit 65536 bytes)' }], `chunked past the limit${query ? ', a dry run' : ', a package'}`);
  }
});

t.test('dry run: answers what the package would, with Dry-Run: true; stores and records nothing; session checks, not the state', async (t) => {
  const svc = await startService(t, { ingest: { maxDecompressedBytes: 64 * 1024 }, connector: { emulatorDelayMs: 600_000 } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid as string;
  const post = (entity: string, body: unknown, query = '?dry_run=true', headers: Record<string, string> = {}, to = uuid) =>
    call(svc.url, 'POST', `${API}/${to}/${entity}${query}`, { ...(Buffer.isBuffer(body) ? { raw: body } : { body }), headers });

  const good = await post('products', products(500));
  t.same([good.status, good.headers['dry-run'], good.body], [200, 'true', { status: 'success', message: '500 rows of products validated and queued for storage', rows_processed: 500 }], '200 as the package would get');
  t.equal((await post('catalogs', { columns: ['catalog_id', 'name'], data: [['c1', 'x']] })).status, 200, 'a dry run of another entity');
  const bad = { columns: ['product_id', 'name', 'price'], data: [['p1', 'n', 1], ['', 5, 'abc'], ['p3']] };
  const dryBad = await post('products', bad);
  const realBad = await post('products', bad, '');
  t.same([dryBad.status, dryBad.headers['dry-run']], [422, 'true']);
  t.equal(dryBad.body.error_count, 4, 'every error of the rows');
  t.same(dryBad.body, realBad.body, 'the 422 the package gets');
  t.notOk('dry-run' in realBad.headers, 'no Dry-Run header on a package');
  const bomb = gzipSync(Buffer.from(JSON.stringify(products(5000))));
  const gz = { 'content-type': 'application/json', 'content-encoding': 'gzip' };
  const dryHuge = await post('products', bomb, '?dry_run=true', gz);
  t.same([dryHuge.status, dryHuge.headers['dry-run'], dryHuge.body], [413, 'true', { detail: 'Request body too large (limit 65536 bytes once inflated)' }], 'the 413 the package gets');
  t.same((await post('products', bomb, '', gz)).body, dryHuge.body);

  // Other values: the false ones a package, anything else 422 before the session checks.
  const pkg = await post('products', products(3), '?dry_run=FALSE');
  t.same([pkg.status, pkg.body.rows_processed, pkg.headers['dry-run']], [200, 3, undefined], 'dry_run=FALSE: a package');
  t.equal((await post('products', products(1), '?dry_run=1')).headers['dry-run'], 'true', 'dry_run=1: a dry run');
  const maybe = await post('products', products(1), '?dry_run=maybe', {}, 'not-the-session');
  t.same([maybe.status, maybe.body], [422, { detail: [{ type: 'bool_parsing', loc: ['query', 'dry_run'], msg: 'Input should be a valid boolean, unable to interpret input', input: 'maybe' }] }], 'dry_run=maybe: 422, before the session checks');
  const twice = await post('products', products(1), '?dry_run=true&dry_run=false');
  t.same([twice.status, twice.body], [422, { detail: [{ type: 'bool_type', loc: ['query', 'dry_run'], msg: 'Input should be a valid boolean', input: ['true', 'false'] }] }], 'dry_run twice: 422');

  // An Idempotency-Key is ignored: neither replayed nor stored.
  const key = { 'idempotency-key': 'dry-key-1' };
  t.equal((await post('products', products(2), '?dry_run=true', key)).status, 200);
  const keyed = await post('products', products(2), '', key);
  t.same([keyed.status, keyed.headers['idempotent-replayed']], [200, undefined], 'the key was free: the package runs');
  const dryAfter = await post('products', products(7), '?dry_run=true', key);
  t.same([dryAfter.body.rows_processed, dryAfter.headers['idempotent-replayed'], dryAfter.headers['dry-run']], [7, undefined, 'true'], 'not replayed on a dry run');

  // The session checks: 403 another uuid, 400 a client without a session (with Dry-Run: true, as every answer of the handler).
  const other = await post('products', products(1), '?dry_run=true', {}, '00000000-0000-4000-8000-000000000000');
  t.same([other.status, other.body, other.headers['dry-run']], [403, { detail: 'Invalid upload UUID' }, 'true']);
  const none = await call(svc.url, 'POST', `${API}/${uuid}/products?dry_run=true`, { client: DEMO2, body: products(1) });
  t.same([none.status, none.body], [400, { detail: 'Upload session not initialized' }]);
  t.same((await post('widgets', products(1))).body, { detail: 'Unknown entity: widgets' });
  const br = await post('products', products(1), '?dry_run=true', { 'content-encoding': 'br' });
  t.same([br.status, br.headers['dry-run']], [415, 'true'], 'an unsupported coding: 415, as the package would get');
  const badKey = await post('products', products(1), '?dry_run=true', { 'idempotency-key': 'not visible ascii' });
  t.same(
    [badKey.status, badKey.body.detail, badKey.headers['dry-run']],
    [400, 'Invalid Idempotency-Key header: expected 1 to 255 visible ASCII characters', 'true'],
    'the key is ignored, its syntax still checked (with Dry-Run: true)',
  );
  // Authentication comes before `dry_run` is read: its answers to a dry run carry Dry-Run: true too, a package's not.
  const stranger = await call(svc.url, 'POST', `${API}/${uuid}/products?dry_run=true`, { client: { id: 'demo', token: 'wrong' }, body: products(1) });
  t.same([stranger.status, stranger.body, stranger.headers['dry-run']], [401, { detail: 'User not authenticated' }, 'true'], '401 to a dry run');
  const strangerPkg = await call(svc.url, 'POST', `${API}/${uuid}/products`, { client: { id: 'demo', token: 'wrong' }, body: products(1) });
  t.same([strangerPkg.status, strangerPkg.headers['dry-run']], [401, undefined], '401 to a package: no Dry-Run');

  // Nothing of the dry runs counts: the status shows the two packages only.
  const st = await waitForStatus(svc, uuid, (b) => b.upload_tasks_finished);
  t.same([st.entities, st.can_start_upload], [['products'], true], 'entities: the packages only (no catalogs)');

  // Not the state: a STARTED session takes dry runs (and refuses packages).
  t.equal((await c.start(uuid, dates())).status, 200);
  const started = await post('products', products(4));
  t.same([started.status, started.body.rows_processed], [200, 4], 'STARTED: a dry run answers 200');
  t.equal((await post('products', products(4), '')).status, 409, 'STARTED: a package answers 409');

  // What is stored: the two packages' objects and ledger entries, an idempotency record for the keyed one only, nothing queued or leased.
  await svc.app.close();
  const engines = await openEngines(svc.config, silentLogger, 'dry-run-test');
  try {
    const entries: LedgerEntry[] = [];
    for await (const e of engines.ledger.list(uuid)) entries.push(e);
    t.same(entries.map((e) => e.rows).sort(), [2, 3], 'ledger: the two packages');
    const objects = await engines.objects.list(sessionObjectPrefix(svc.config.storage.objectPrefix, DEMO.id, uuid));
    t.equal(objects.filter((o) => !o.key.endsWith('manifest.ndjson')).length, 2, 'objects: the two packages');
    t.equal(await engines.queue.pending(uuid), 0, 'queue: nothing pending');
    const record = await engines.sessions.get<SessionRecord>(sessionKey(uuid));
    t.same([record?.value.entities, record?.value.in_flight], [['products'], {}], 'session: no lease left, no entity added');
    t.ok(await engines.sessions.get(idempotencyKey(DEMO.id, 'dry-key-1')), 'the key was used by the package');
  } finally {
    await engines.close();
  }
  svc.app = await startApp({ ...svc.config, port: 0 }, svc.appOptions);
  svc.url = svc.app.url;
});
