/**
 * `Idempotency-Key` on ingest over real HTTP: a retried package answers what the first
 * attempt answered and is stored once, also when the first attempt's gateway died after
 * the package was queued or recorded. Runs on NATS + S3 too (test/matrix.ts).
 */
import { PassThrough } from 'node:stream';
import t from 'tap';
import { request } from 'undici';
import { startApp } from '../../src/app.js';
import type { Config } from '../../src/config/config.js';
import { silentLogger } from '../../src/log.js';
import type { SessionRecord } from '../../src/session/state.js';
import { openEngines, type Engines } from '../../src/store/engines.js';
import { idempotencyKey, sessionKey, sessionObjectPrefix } from '../../src/store/keys.js';
import { countRows } from '../../src/store/object-format.js';
import type { SessionStore } from '../../src/store/ports.js';
import { API, call, clientOf, DEMO, products, type Service, startService, waitForStatus, whenChanged } from '../support/harness.js';

const ingest = (svc: Service, uuid: string, entity: string, body: unknown, key?: string) =>
  call(svc.url, 'POST', `${API}/${uuid}/${entity}`, { body, ...(key === undefined ? {} : { headers: { 'idempotency-key': key } }) });

/** The session's stored objects, read back: each one's package id and row count. */
async function stored(svc: Service, uuid: string): Promise<{ package_id: string; rows: number }[]> {
  const objects = await svc.openObjects();
  try {
    const out: { package_id: string; rows: number }[] = [];
    for (const { key } of await objects.list(sessionObjectPrefix(svc.config.storage.objectPrefix, DEMO.id, uuid))) {
      const { header, rows } = await countRows((await objects.get(key))!);
      out.push({ package_id: header.package_id, rows });
    }
    return out;
  } finally {
    await objects.close();
  }
}

/** Every write of the session done (recorded packages stored, dropped ones gone), then what is stored. */
async function settled(svc: Service, uuid: string) {
  const status = await waitForStatus(svc, uuid, (s) => s.upload_tasks_finished);
  return { entities: status.entities as string[], objects: await stored(svc, uuid) };
}

/**
 * The gateway "dies": it is closed, `edit` changes what it left in the session store (as a
 * crash at some step would have left it), and a new instance starts on the same stores.
 */
async function crashAndEdit(svc: Service, edit: (engines: Engines) => Promise<void>, patch: Partial<Config> = {}): Promise<void> {
  await svc.app.close();
  const engines = await openEngines(svc.config, silentLogger, 'idempotency-test');
  try {
    await edit(engines);
  } finally {
    await engines.close();
  }
  svc.app = await startApp({ ...svc.config, port: 0, ...patch }, svc.appOptions);
  svc.url = svc.app.url;
}

async function rewrite<T>(sessions: SessionStore, key: string, change: (value: T) => T): Promise<void> {
  const cur = await sessions.get<T>(key);
  if (!cur) throw new Error(`${key} is not stored`);
  await sessions.update(key, change(cur.value), cur.revision);
}

t.test('the same key twice: the second answer is the first one, the package is stored once', async (t) => {
  const svc = await startService(t);
  const uuid = (await clientOf(svc).init()).body.upload_uuid;
  const first = await ingest(svc, uuid, 'products', products(3), 'pkg-1');
  t.same([first.status, first.body], [200, { status: 'success', message: '3 rows of products validated and queued for storage', rows_processed: 3 }]);
  t.equal(first.headers['idempotent-replayed'], undefined, 'the first answer is not a replay');

  const again = await ingest(svc, uuid, 'products', products(3), 'pkg-1');
  t.same([again.status, again.text], [first.status, first.text], 'the same status and body, byte for byte');
  t.equal(again.headers['idempotent-replayed'], 'true');

  t.equal((await ingest(svc, uuid, 'products', products(3), 'pkg-2')).headers['idempotent-replayed'], undefined, 'another key is another package');
  t.equal((await ingest(svc, uuid, 'products', products(3))).status, 200, 'no key: no idempotency');
  const { entities, objects } = await settled(svc, uuid);
  t.same(entities, ['products']);
  t.same(objects.map((o) => o.rows), [3, 3, 3], 'three packages stored: pkg-1 once, pkg-2, the unkeyed one');
});

t.test("deleting the session removes its keys' records: a repeat after the delete is checked like a new request", async (t) => {
  const svc = await startService(t);
  const uuid = (await clientOf(svc).init()).body.upload_uuid;
  t.equal((await ingest(svc, uuid, 'products', products(2), 'gone-with-it')).status, 200);
  t.equal((await ingest(svc, uuid, 'products', products(2), 'gone-with-it')).headers['idempotent-replayed'], 'true', 'replayed while the session lives');
  t.equal((await clientOf(svc).remove(uuid)).status, 200);
  // At once: the records go with the delete's clean-up, in the background, but a key of a deleted session is free already.
  const repeat = await ingest(svc, uuid, 'products', products(2), 'gone-with-it');
  t.same([repeat.status, repeat.body], [400, { detail: 'Upload session not initialized' }], 'no replay: the session checks answer');
  t.equal(repeat.headers['idempotent-replayed'], undefined);
  const next = (await clientOf(svc).init()).body.upload_uuid;
  const again = await ingest(svc, next, 'products', products(2), 'gone-with-it');
  t.same([again.status, again.headers['idempotent-replayed']], [200, undefined], 'the key runs again in the next session (not 422 for another request)');
});

t.test('a 422 is replayed and stores nothing; errors before the body do not use up the key', async (t) => {
  const svc = await startService(t);
  const uuid = (await clientOf(svc).init()).body.upload_uuid;
  const bad = { columns: ['product_id', 'name', 'price'], data: [['p1', 'Tea', 'abc']] };
  const detail = {
    detail: 'Invalid data types in payload: row 0, column "price": expected number >= 0, got "abc"',
    errors: [{ row: 0, column: 'price', message: 'expected number >= 0, got "abc"' }],
    error_count: 1,
  };
  const first = await ingest(svc, uuid, 'products', bad, 'bad-1');
  t.same([first.status, first.body], [422, detail]);
  const again = await ingest(svc, uuid, 'products', bad, 'bad-1');
  t.same([again.status, again.body, again.headers['idempotent-replayed']], [422, detail, 'true']);

  const unknown = await ingest(svc, uuid, 'nope', products(1), 'early-1');
  t.same([unknown.status, unknown.body], [400, { detail: 'Unknown entity: nope' }]);
  const reused = await ingest(svc, uuid, 'products', products(1), 'early-1');
  t.same([reused.status, reused.headers['idempotent-replayed']], [200, undefined], 'a 400 before the body claimed nothing');

  const { objects } = await settled(svc, uuid);
  t.same(objects.map((o) => o.rows), [1], 'only the valid package is stored');
});

t.test('concurrent duplicates: one runs, the others answer its answer', async (t) => {
  const svc = await startService(t);
  const uuid = (await clientOf(svc).init()).body.upload_uuid;
  const body = products(20_000);
  const answers = await Promise.all(Array.from({ length: 6 }, () => ingest(svc, uuid, 'products', body, 'burst')));
  t.same(new Set(answers.map((a) => `${a.status} ${a.text}`)).size, 1, 'one answer for all');
  t.equal(answers[0]!.body.rows_processed, 20_000);
  t.equal(answers.filter((a) => a.headers['idempotent-replayed'] === undefined).length, 1, 'exactly one ran');
  const { objects } = await settled(svc, uuid);
  t.same(objects.map((o) => o.rows), [20_000], 'stored once');
});

t.test('the key of another request answers 422; a malformed key 400, after authentication', async (t) => {
  const svc = await startService(t);
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  t.equal((await ingest(svc, uuid, 'products', products(2), 'k')).status, 200);
  const reuse = { detail: 'Idempotency-Key was already used for a different request (another upload_uuid, entity or body length)' };
  const stores = { columns: ['store_id', 'name'], data: [['s1', 'Main']] };
  for (const [what, res] of [
    ['another entity', await ingest(svc, uuid, 'stores', stores, 'k')],
    ['another body length', await ingest(svc, uuid, 'products', products(3), 'k')],
    ['another session', await ingest(svc, '00000000-0000-4000-8000-000000000000', 'products', products(2), 'k')],
  ] as const) {
    t.same([res.status, res.body], [422, reuse], what);
  }
  const malformed = { detail: 'Invalid Idempotency-Key header: expected 1 to 255 visible ASCII characters' };
  for (const key of ['', 'two words', 'x'.repeat(256)]) {
    const res = await ingest(svc, uuid, 'products', products(1), key);
    t.same([res.status, res.body], [400, malformed], JSON.stringify(key).slice(0, 20));
  }
  const anonymous = await call(svc.url, 'POST', `${API}/${uuid}/products`, { client: null, body: products(1), headers: { 'idempotency-key': '' } });
  t.equal(anonymous.status, 401, 'authentication first');
  const { objects } = await settled(svc, uuid);
  t.equal(objects.length, 1, 'none of them stored anything');
});

t.test('a client that aborts mid-body and retries with the same key: stored once', async (t) => {
  // No rate limit: the test probes the key in a loop.
  const svc = await startService(t, { idempotency: { waitMs: 1000 }, limits: { requestsPerSecond: 0 } });
  const uuid = (await clientOf(svc).init()).body.upload_uuid;
  const text = JSON.stringify(products(500));
  const body = new PassThrough();
  const abort = new AbortController();
  const first = request(`${svc.url}${API}/${uuid}/products`, {
    method: 'POST',
    headers: { authorization: DEMO.token, 'client-id': DEMO.id, 'content-type': 'application/json', 'idempotency-key': 'flaky' },
    body,
    signal: abort.signal,
  });
  first.catch(() => {});
  body.write(text.slice(0, 2000));
  // The key is held once a probe for another entity under it answers 422 (an unknown entity, so the probe claims nothing).
  const probe = await whenChanged(
    svc,
    async () => {
      const res = await ingest(svc, uuid, 'nope', products(1), 'flaky');
      return res.status !== 400 && res;
    },
    () => 'the key was never held',
    10_000,
  );
  t.equal(probe.status, 422, 'the first attempt holds the key');
  const duplicate = await ingest(svc, uuid, 'products', JSON.parse(text), 'flaky');
  t.same(
    [duplicate.status, duplicate.body, duplicate.headers['retry-after']],
    [409, { detail: 'A request with this Idempotency-Key is in progress' }, '1'],
    'a repeat waits idempotency.waitMs for the attempt in progress, then 409',
  );
  abort.abort();
  await t.rejects(first);

  const retry = await ingest(svc, uuid, 'products', JSON.parse(text), 'flaky');
  t.same([retry.status, retry.body.rows_processed], [200, 500]);
  t.equal(retry.headers['idempotent-replayed'], undefined, 'the aborted attempt had no answer: the retry ran');
  t.same((await ingest(svc, uuid, 'products', JSON.parse(text), 'flaky')).headers['idempotent-replayed'], 'true');
  const { objects } = await settled(svc, uuid);
  t.same(objects.map((o) => o.rows), [500], 'stored once');
});

t.test('the first attempt was recorded but its gateway died before answering: the retry answers it', async (t) => {
  const svc = await startService(t);
  const uuid = (await clientOf(svc).init()).body.upload_uuid;
  const first = await ingest(svc, uuid, 'products', products(7), 'lost-answer');
  t.equal(first.status, 200);
  await settled(svc, uuid);
  // As a kill between recording the package and storing the answer leaves it: the claim still pending.
  await crashAndEdit(svc, ({ sessions }) =>
    rewrite<any>(sessions, idempotencyKey(DEMO.id, 'lost-answer'), (done) => ({
      state: 'pending',
      upload_uuid: done.upload_uuid,
      entity: done.entity,
      content_length: done.content_length,
      attempts: [done.package_id],
      lease_until: Date.now() - 1,
      owner: 'the-dead-instance',
      created_at: done.at,
    })),
  );
  const retry = await ingest(svc, uuid, 'products', products(7), 'lost-answer');
  t.same([retry.status, retry.text, retry.headers['idempotent-replayed']], [200, first.text, 'true'], 'the same rows_processed, from the session record');
  const { objects } = await settled(svc, uuid);
  t.same(objects.map((o) => o.rows), [7], 'not stored again');
});

t.test('the first attempt reached the queue but was never recorded: the retry stores the package once', async (t) => {
  const svc = await startService(t, { storage: { inProcessUploader: false } });
  const uuid = (await clientOf(svc).init()).body.upload_uuid;
  const dead = '00000000-0000-4000-8000-00000000dead';
  // As a kill between the queue commit and recording leaves it: queued, not recorded, its lease live, the claim pending.
  await crashAndEdit(
    svc,
    async ({ sessions, queue }) => {
      await rewrite<SessionRecord>(sessions, sessionKey(uuid), (r) => ({ ...r, in_flight: { ...r.in_flight, [dead]: Date.now() + 600_000 } }));
      const writer = await queue.open({ package_id: dead, client_id: DEMO.id, upload_uuid: uuid, entity: 'products', columns: ['product_id', 'name', 'price'] });
      await writer.append(Buffer.from('["d-1","Never answered",1]\n'));
      await writer.commit({ rows: 1, bytes: 27 });
      await sessions.create(idempotencyKey(DEMO.id, 'unrecorded'), {
        state: 'pending',
        upload_uuid: uuid,
        entity: 'products',
        content_length: null,
        attempts: [dead],
        lease_until: Date.now() - 1,
        owner: 'the-dead-instance',
        created_at: Date.now() - 1000,
      });
    },
    { storage: { ...svc.config.storage, inProcessUploader: true } },
  );
  const retry = await ingest(svc, uuid, 'products', products(9), 'unrecorded');
  t.same([retry.status, retry.body?.rows_processed], [200, 9]);
  const { entities, objects } = await settled(svc, uuid);
  t.same(entities, ['products']);
  t.equal(objects.length, 1, 'stored once');
  t.equal(objects[0]?.rows, 9);
  t.not(objects[0]?.package_id, dead, "the dead attempt's queued package was dropped, the retry's stored");
});
