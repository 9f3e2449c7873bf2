/**
 * The session's counts in status (`entity_counts`, `totals`) and the listing of a client's
 * sessions (`GET /sessions`), over real HTTP, against what object storage really holds
 * (docs/api.md, Counts and A client's sessions).
 */
import t from 'tap';
import { sessionObjectPrefix } from '../../src/store/keys.js';
import { API, call, clientOf, DEMO, DEMO2, products, startService, waitForStatus, yesterday, type Service } from '../support/harness.js';
import { readText } from '../support/objects.js';

const dates = () => ({ date_from: '2024-01-01', date_to: yesterday() });

/** Per entity, what the session's stored objects hold: objects, row lines, row bytes (header lines excluded). */
async function storedCounts(svc: Service, clientId: string, uuid: string): Promise<Map<string, { objects: number; rows: number; bytes: number }>> {
  const store = await svc.openObjects();
  try {
    const prefix = sessionObjectPrefix(svc.config.storage.objectPrefix, clientId, uuid);
    const out = new Map<string, { objects: number; rows: number; bytes: number }>();
    for (const o of await store.list(prefix)) {
      const text = (await readText(store, o.key))!;
      const header = JSON.parse(text.slice(0, text.indexOf('\n'))) as { entity: string };
      const rows = text.slice(text.indexOf('\n') + 1);
      const e = out.get(header.entity) ?? { objects: 0, rows: 0, bytes: 0 };
      e.objects += 1;
      e.rows += rows.split('\n').filter(Boolean).length;
      e.bytes += Buffer.byteLength(rows);
      out.set(header.entity, e);
    }
    return out;
  } finally {
    await store.close();
  }
}

t.test('status counts packages, rows, bytes as stored and stored packages, per entity and in total; retries and replays count once', async (t) => {
  const svc = await startService(t);
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;

  const fresh = (await c.status(uuid)).body;
  t.same(fresh.entity_counts, [], 'a new session counts nothing');
  t.same(fresh.totals, { packages: 0, rows: 0, bytes: 0, stored_packages: 0 });

  t.equal((await c.ingest(uuid, 'products', products(3))).status, 200);
  t.equal((await c.ingest(uuid, 'catalogs', { columns: ['catalog_id', 'name'], data: [['c1', 'Root'], ['c2', 'Ä "quoted"']] })).status, 200);
  const keyed = { client: DEMO, body: products(4, 3), headers: { 'idempotency-key': 'counts-1' } };
  const first = await call(svc.url, 'POST', `${API}/${uuid}/products`, keyed);
  t.equal(first.status, 200);
  const replay = await call(svc.url, 'POST', `${API}/${uuid}/products`, keyed);
  t.equal(replay.status, 200);
  t.equal(replay.headers['idempotent-replayed'], 'true', 'the retry was answered from the first attempt');
  t.equal((await c.ingest(uuid, 'stock', { columns: ['store_id', 'product_id', 'date', 'quantity'], data: [] })).status, 200, 'an empty package is a package');
  t.equal((await c.ingest(uuid, 'products', { columns: ['product_id', 'name', 'price'], data: [['p9', 'Bad', 'abc']] })).status, 422, 'a refused package counts nowhere');

  let asked = 0;
  const done = await waitForStatus(svc, uuid, (b) => {
    asked++;
    for (const e of b.entity_counts) if (e.stored_packages > e.packages) throw new Error(`stored_packages above packages: ${JSON.stringify(b)}`);
    return b.totals.stored_packages === b.totals.packages && b.upload_tasks_finished;
  });
  t.ok(asked > 0);
  t.same(done.entities, ['products', 'catalogs', 'stock']);
  t.same(done.entity_counts.map((e: { name: string }) => e.name), done.entities, 'one per entity, in the order of entities');

  const stored = await storedCounts(svc, DEMO.id, uuid);
  const byName = new Map<string, Record<string, number>>(done.entity_counts.map((e: { name: string }) => [e.name, e]));
  t.match(byName.get('products'), { packages: 2, rows: 7, stored_packages: 2 }, 'the replayed package once');
  t.match(byName.get('catalogs'), { packages: 1, rows: 2, stored_packages: 1 });
  t.match(byName.get('stock'), { packages: 1, rows: 0, bytes: 0, stored_packages: 1 });
  for (const [name, counts] of byName) {
    const s = stored.get(name)!;
    t.same({ packages: counts.packages, rows: counts.rows, bytes: counts.bytes }, { packages: s.objects, rows: s.rows, bytes: s.bytes }, `${name}: equal to what is stored`);
  }
  const sum = (k: string) => done.entity_counts.reduce((n: number, e: Record<string, number>) => n + e[k]!, 0);
  t.same(done.totals, { packages: sum('packages'), rows: sum('rows'), bytes: sum('bytes'), stored_packages: sum('stored_packages') });
  t.same(done.totals, { packages: 4, rows: 9, bytes: sum('bytes'), stored_packages: 4 });
  t.ok(done.totals.bytes > 0);

  await svc.restart();
  const again = (await clientOf(svc).status(uuid)).body;
  t.same({ e: again.entity_counts, t: again.totals }, { e: done.entity_counts, t: done.totals }, 'the counts survive a restart, none counted twice');

  t.equal((await clientOf(svc).start(uuid, dates())).status, 200);
  const finished = await waitForStatus(svc, uuid, (b) => b.session_status === 'DONE');
  t.same(finished.totals, done.totals, 'kept after the workflow');
});

t.test('GET /sessions: own sessions newest first, paged by cursor, deleted ones absent, other clients apart', async (t) => {
  const svc = await startService(t);
  const c = clientOf(svc);
  const other = clientOf(svc, DEMO2);
  const list = (query: string, client: { id: string; token: string } | null = DEMO) => call(svc.url, 'GET', `${API}/sessions${query}`, { client });

  t.same((await list('')).body, { sessions: [], next_cursor: null }, 'no session yet');

  const finishedSession = async (rows: number) => {
    const uuid = (await c.init()).body.upload_uuid as string;
    t.equal((await c.ingest(uuid, 'products', products(rows))).status, 200);
    await waitForStatus(svc, uuid, (b) => b.can_start_upload);
    t.equal((await c.start(uuid, dates())).status, 200);
    await waitForStatus(svc, uuid, (b) => b.session_status === 'DONE');
    return uuid;
  };
  const s1 = await finishedSession(2);
  const deleted = (await c.init()).body.upload_uuid as string;
  t.equal((await c.remove(deleted)).status, 200);
  const s3 = await finishedSession(5);
  const s4 = (await c.init()).body.upload_uuid as string;
  const theirs = (await other.init()).body.upload_uuid as string;

  const all = await list('');
  t.equal(all.status, 200);
  t.same(all.body.sessions.map((s: { upload_uuid: string }) => s.upload_uuid), [s4, s3, s1], 'newest first; the deleted one and the other client\'s are absent');
  t.equal(all.body.next_cursor, null);
  t.same(all.body.sessions.map((s: { session_status: string }) => s.session_status), ['UPLOADING', 'DONE', 'DONE']);
  t.same(all.body.sessions[1].totals, { packages: 1, rows: 5, bytes: all.body.sessions[1].totals.bytes, stored_packages: 1 });
  t.same(all.body.sessions[1].totals, (await c.status(s3)).body.totals, 'the totals of the status');
  t.same(all.body.sessions[0].totals, { packages: 0, rows: 0, bytes: 0, stored_packages: 0 });
  for (const s of all.body.sessions) t.same(Object.keys(s), ['upload_uuid', 'session_status', 'created_at', 'totals']);
  const created = all.body.sessions.map((s: { created_at: string }) => s.created_at);
  t.same([...created].sort().reverse(), created, 'created_at descending');

  const seen: string[] = [];
  let cursor: string | null = null;
  let pages = 0;
  do {
    const page: { status: number; body: { sessions: { upload_uuid: string }[]; next_cursor: string | null } } = await list(`?limit=1${cursor ? `&cursor=${cursor}` : ''}`);
    t.equal(page.status, 200);
    t.equal(page.body.sessions.length, 1);
    seen.push(...page.body.sessions.map((s) => s.upload_uuid));
    cursor = page.body.next_cursor;
    pages++;
  } while (cursor !== null && pages < 10);
  t.same(seen, [s4, s3, s1], 'pages of one, in order, each once');
  t.equal(pages, 3);
  const two = await list('?limit=2');
  t.same(two.body.sessions.map((s: { upload_uuid: string }) => s.upload_uuid), [s4, s3]);
  t.type(two.body.next_cursor, 'string');
  const rest = await list(`?limit=2&cursor=${encodeURIComponent(two.body.next_cursor)}`);
  t.same(rest.body, { sessions: [all.body.sessions[2]], next_cursor: null });

  t.same((await list('', DEMO2)).body.sessions.map((s: { upload_uuid: string }) => s.upload_uuid), [theirs], 'the other client sees its own only');
  const foreign = await list(`?cursor=${two.body.next_cursor}`, DEMO2);
  t.same(foreign.body, { sessions: [], next_cursor: null }, "another client's cursor shows nothing of the first");

  t.equal((await list('', null)).status, 401, 'authenticated like every client endpoint');
  const bad = async (query: string) => (await list(query)).body;
  t.same(await bad('?limit=0'), { detail: [{ type: 'greater_than_equal', loc: ['query', 'limit'], msg: 'Input should be greater than or equal to 1', input: '0', ctx: { ge: 1 } }] });
  t.same(await bad('?limit=201'), { detail: [{ type: 'less_than_equal', loc: ['query', 'limit'], msg: 'Input should be less than or equal to 200', input: '201', ctx: { le: 200 } }] });
  t.same(await bad('?limit=ten'), { detail: [{ type: 'int_parsing', loc: ['query', 'limit'], msg: 'Input should be a valid integer, unable to parse string as an integer', input: 'ten' }] });
  t.same(await bad('?cursor=nope'), { detail: [{ type: 'value_error', loc: ['query', 'cursor'], msg: 'Value error, Invalid cursor', input: 'nope', ctx: { error: 'Invalid cursor' } }] });
  t.equal((await list('?limit=200')).status, 200, 'the largest limit');

  // `sessions` is no upload uuid: the status route with it is an unknown session, not the listing.
  const statusOfSessions = await call(svc.url, 'GET', `${API}/sessions/status`);
  t.same({ status: statusOfSessions.status, body: statusOfSessions.body }, { status: 404, body: { detail: 'Upload session not found' } });
  t.equal((await call(svc.url, 'POST', `${API}/sessions`)).status, 405);
});
