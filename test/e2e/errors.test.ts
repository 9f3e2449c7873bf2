/** Every status code and message of docs/api.md (Status codes and messages), in the decided check order. */
import { createHash } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import t from 'tap';
import { request } from 'undici';
import { API, call, clientOf, DEMO, products, startService, tempDir, waitForStatus, yesterday } from '../support/harness.js';
import { auth, head, RawClient } from '../support/raw-http.js';

const sha = (s: string) => createHash('sha256').update(s).digest('hex');

t.test('authentication, in the check order of docs/api.md', async (t) => {
  const dir = await tempDir(t);
  const clientsFile = join(dir, 'clients.json');
  await writeFile(
    clientsFile,
    JSON.stringify({
      clients: [
        { client_id: 'local', token_sha256: sha('local-token'), allowed_ips: ['127.0.0.1'], min_date: '2023-01-01' },
        { client_id: 'remote', token_sha256: sha('remote-token'), allowed_ips: ['203.0.113.0/24', '2001:db8::/32'], min_date: '2023-01-01' },
      ],
    }),
  );
  const svc = await startService(t, { clientsFile, trustedProxies: ['127.0.0.1'] });
  const path = `${API}/initialize-session`;
  const post = (headers: Record<string, string>) => call(svc.url, 'POST', path, { client: null, headers });

  let res = await post({});
  t.equal(res.status, 401, 'no Authorization, no Client-Id: the token check comes first');
  t.same(res.body, { detail: 'User not authenticated' });
  res = await post({ authorization: 'nope', 'client-id': 'local' });
  t.same([res.status, res.body], [401, { detail: 'User not authenticated' }], 'unknown token');
  res = await post({ authorization: 'local-token' });
  t.same([res.status, res.body], [400, { detail: 'Client-ID header is missing' }]);
  res = await post({ authorization: 'local-token', 'client-id': 'remote' });
  t.same([res.status, res.body], [401, { detail: 'User not authenticated' }], 'token of another client');
  res = await post({ authorization: 'Bearer local-token', 'client-id': 'local' });
  t.equal(res.status, 200, 'Bearer prefix accepted');

  res = await post({ authorization: 'remote-token', 'client-id': 'remote' });
  t.same([res.status, res.body], [403, { detail: 'IP address not allowed' }]);
  res = await post({ authorization: 'remote-token', 'client-id': 'remote', 'x-forwarded-for': '198.51.100.7, 203.0.113.9' });
  t.equal(res.status, 200, 'X-Forwarded-For believed from a trusted proxy');
  res = await post({ authorization: 'local-token', 'client-id': 'local', 'x-forwarded-for': '203.0.113.9' });
  t.equal(res.status, 403, 'the forwarded address is checked, not the proxy');

  const demo = await call(svc.url, 'POST', path, { client: DEMO });
  t.equal(demo.status, 401, 'no demo clients when a clients file is configured');
});

t.test('session access checks on path-bound endpoints', async (t) => {
  const svc = await startService(t);
  const c = clientOf(svc);
  const stranger = '00000000-0000-4000-8000-000000000000';
  for (const res of [await c.ingest(stranger, 'products', products(1)), await c.start(stranger, {}), await c.terminate(stranger), await c.remove(stranger)]) {
    t.same([res.status, res.body], [400, { detail: 'Upload session not initialized' }]);
  }
  const uuid = (await c.init()).body.upload_uuid;
  for (const res of [await c.ingest(stranger, 'products', products(1)), await c.start(stranger, {}), await c.terminate(stranger), await c.remove(stranger)]) {
    t.same([res.status, res.body], [403, { detail: 'Invalid upload UUID' }]);
  }
  const st = await c.status(stranger);
  t.same([st.status, st.body], [404, { detail: 'Upload session not found' }], 'status does not check the active session');
  t.equal((await c.status(uuid)).status, 200);

  const other = clientOf(svc, { id: 'demo-2', token: 'demo-2-token' });
  const otherUuid = (await other.init()).body.upload_uuid;
  t.same((await c.ingest(otherUuid, 'products', products(1))).body, { detail: 'Invalid upload UUID' }, 'another client’s session is never reachable');
  t.equal((await c.status(otherUuid)).status, 404);
});

t.test('ingest: 400 unknown entity before 409 state before 422 payload', async (t) => {
  const svc = await startService(t);
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  const unknown = await c.ingest(uuid, 'widgets', { nonsense: true });
  t.same([unknown.status, unknown.body], [400, { detail: 'Unknown entity: widgets' }]);

  const cases: [unknown, string][] = [
    [{ columns: [], data: [] }, 'The columns array cannot be empty.'],
    [{ columns: ['product_id', 'name', 'colour'], data: [] }, 'Unknown column: colour'],
    [{ columns: ['price'], data: [] }, 'Missing required columns: product_id, name'],
    [{ columns: ['product_id', 'name', 'product_id'], data: [] }, 'Duplicate column: product_id'],
  ];
  for (const [body, detail] of cases) {
    const res = await c.ingest(uuid, 'products', body);
    t.same([res.status, res.body], [422, { detail }], detail);
  }
  // Refused rows: `detail` is the first; `errors` lists them (the first 100) and `error_count` counts them all.
  const rows = await c.ingest(uuid, 'products', { columns: ['product_id', 'name', 'price'], data: [['a', 'b', 1], ['c', 'd', 'abc'], ['e'], ['f', '', -2]] });
  t.same([rows.status, rows.body], [
    422,
    {
      detail: 'Invalid data types in payload: row 1, column "price": expected number >= 0, got "abc"',
      errors: [
        { row: 1, column: 'price', message: 'expected number >= 0, got "abc"' },
        { row: 2, column: null, message: 'expected 3 values, got 1' },
        { row: 3, column: 'price', message: 'expected number >= 0, got -2' },
      ],
      error_count: 3,
    },
  ], 'every refused row at once');
  const many = await c.ingest(uuid, 'products', { columns: ['product_id', 'name'], data: Array.from({ length: 250 }, (_, i) => [`p${i}`, i]) });
  t.equal(many.status, 422);
  t.equal(many.body.error_count, 250, 'error_count: all of them');
  t.equal(many.body.errors.length, 100, 'errors: the first 100');
  t.same(many.body.errors[99], { row: 99, column: 'name', message: 'expected string, got 99' }, 'in row order');
  // An integer is bounded to ±(2^53 − 1): 9007199254740993 is refused, never stored rounded.
  const big = await call(svc.url, 'POST', `${API}/${uuid}/receipt_lines`, {
    raw: '{"columns":["receipt_id","line_no","product_id","quantity","price"],"data":[["r",9007199254740991,"p",1,1],["r",9007199254740993,"p",1,1]]}',
    headers: { 'content-type': 'application/json' },
  });
  t.same([big.status, big.body.errors], [422, [{ row: 1, column: 'line_no', message: 'expected integer >= 1, got 9007199254740992' }]], 'line_no 9007199254740993: 422');
  const broken = await call(svc.url, 'POST', `${API}/${uuid}/products`, { raw: '{"columns": [', headers: { 'content-type': 'application/json' } });
  t.same([broken.status, broken.body], [422, { detail: 'Invalid JSON format.' }]);
  const missing = await c.ingest(uuid, 'products', { data: [] });
  t.equal(missing.status, 422);
  t.match(missing.body.detail[0], { type: 'missing', loc: ['body', 'columns'], msg: 'Field required' });

  const st = await waitForStatus(svc, uuid, (b) => b.upload_tasks_finished);
  t.same(st.entities, [], 'no rejected package was counted');
});

t.test('ingest 422: every bad value of every row, in row then column order, the first 100 listed, error_count all of them; on every path', async (t) => {
  // Small pieces and no inline tasks: the rows go through the workers in many pieces.
  const svc = await startService(t, { ingest: { pieceBytes: 4096, inlineBytes: 0 } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid as string;
  const columns = ['product_id', 'name', 'price', 'is_active'];
  const rows = [['a', 'b', 1, true], ['', 'd', 'abc', 'yes'], ['e'], ['f', 7, -2, null]];
  const expected = {
    detail: 'Invalid data types in payload: row 1, column "product_id": expected non-empty string, got ""',
    errors: [
      { row: 1, column: 'product_id', message: 'expected non-empty string, got ""' },
      { row: 1, column: 'price', message: 'expected number >= 0, got "abc"' },
      { row: 1, column: 'is_active', message: 'expected boolean, got "yes"' },
      { row: 2, column: null, message: 'expected 4 values, got 1' },
      { row: 3, column: 'name', message: 'expected string, got 7' },
      { row: 3, column: 'price', message: 'expected number >= 0, got -2' },
    ],
    error_count: 6,
  };
  const bodies: [string, string][] = [
    ['streamed (row scanner)', JSON.stringify({ columns, data: rows })],
    ['one task (data before columns)', JSON.stringify({ data: rows, columns })],
    ['reference path (a nested cell elsewhere in the piece)', JSON.stringify({ columns, data: [...rows, ['g', ['nested'], 1, true]] })],
  ];
  for (const [name, raw] of bodies) {
    const res = await call(svc.url, 'POST', `${API}/${uuid}/products`, { raw, headers: { 'content-type': 'application/json' } });
    const want = name.startsWith('reference')
      ? { ...expected, errors: [...expected.errors, { row: 4, column: 'name', message: 'expected string, got ["nested"]' }], error_count: 7 }
      : expected;
    t.same([res.status, res.body], [422, want], `${name}: several bad values of a row, each listed`);
  }

  // 3,000 rows of two bad values each, across many pieces: 6,000 errors; the cap cuts row 49's pair after its second value.
  const many = await c.ingest(uuid, 'products', { columns: ['product_id', 'name', 'price'], data: Array.from({ length: 3000 }, (_, i) => [`p${i}`, i, 'x']) });
  t.equal(many.status, 422);
  t.equal(many.body.error_count, 6000, 'error_count: every bad value');
  t.equal(many.body.errors.length, 100, 'errors: the first 100');
  t.same(many.body.errors.slice(0, 2), [
    { row: 0, column: 'name', message: 'expected string, got 0' },
    { row: 0, column: 'price', message: 'expected number >= 0, got "x"' },
  ], 'row then column order');
  t.same(many.body.errors[99], { row: 49, column: 'price', message: 'expected number >= 0, got "x"' }, 'the 100th: row 49, its second value');
  t.equal(many.body.detail, 'Invalid data types in payload: row 0, column "name": expected string, got 0', 'detail: the first error, as before');
  const odd = await c.ingest(uuid, 'products', { columns: ['product_id', 'name', 'price'], data: [...Array.from({ length: 33 }, (_, i) => [`p${i}`, i, 'x']), ['', 1, 'y']] });
  t.same([odd.body.error_count, odd.body.errors.length, odd.body.errors.slice(-3)], [69, 69, [
    { row: 33, column: 'product_id', message: 'expected non-empty string, got ""' },
    { row: 33, column: 'name', message: 'expected string, got 1' },
    { row: 33, column: 'price', message: 'expected number >= 0, got "y"' },
  ]], 'three bad values in the last row');

  const st = await waitForStatus(svc, uuid, (b) => b.upload_tasks_finished);
  t.same(st.entities, [], 'no refused package was counted');
});

t.test('ingest: 409 once the session holds limits.packagesPerSession packages; the session still starts', async (t) => {
  const svc = await startService(t, { limits: { packagesPerSession: 3 } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  // Two at once, then one: leases count, so concurrent ingests cannot overshoot either.
  const first = await Promise.all([c.ingest(uuid, 'products', products(2)), c.ingest(uuid, 'products', products(3))]);
  t.same(first.map((r) => r.status), [200, 200]);
  t.equal((await c.ingest(uuid, 'products', products(1))).status, 200, 'the third package fits');
  const full = await c.ingest(uuid, 'products', products(1));
  const detail = 'Upload session is full: it holds 3 packages, the most one session can; start the upload, then send the rest in a new session';
  t.same([full.status, full.body], [409, { detail }]);
  const st = await waitForStatus(svc, uuid, (b) => b.upload_tasks_finished);
  t.same([st.entities, st.can_start_upload], [['products'], true], 'the refused package left nothing behind');
  const started = await c.start(uuid, { date_from: '2024-01-01', date_to: yesterday() });
  t.equal(started.status, 200);
  t.same(started.body.entities, [{ name: 'products', rows: 6 }], 'the three accepted packages, 2 + 3 + 1 rows');
});

t.test('start-upload: check order and every message', async (t) => {
  const svc = await startService(t);
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;

  const missing = await c.start(uuid, {});
  t.equal(missing.status, 422);
  t.same(missing.body.detail.map((d: any) => [d.type, d.loc, d.msg]), [
    ['missing', ['body', 'date_from'], 'Field required'],
    ['missing', ['body', 'date_to'], 'Field required'],
  ]);
  const noBody = await call(svc.url, 'POST', `${API}/${uuid}/start-upload`);
  t.same([noBody.status, noBody.body], [422, { detail: [{ type: 'missing', loc: ['body'], msg: 'Field required', input: null }] }], 'no body: missing, as Pydantic says it');
  const badDate = await c.start(uuid, { date_from: '2024-02-30', date_to: '2024-03-01' });
  t.equal(badDate.status, 422);
  t.match(badDate.body.detail[0], { loc: ['body', 'date_from'], input: '2024-02-30' });
  const reversed = await c.start(uuid, { date_from: '2024-03-02', date_to: '2024-03-01' });
  t.equal(reversed.status, 422);
  t.match(reversed.body.detail[0], { type: 'value_error', loc: ['body', 'date_to'], msg: /^Value error, / });
  const today = new Date().toISOString().slice(0, 10);
  const notPast = await c.start(uuid, { date_from: '2024-03-02', date_to: today });
  t.equal(notPast.status, 422);
  t.match(notPast.body.detail[0], { type: 'value_error', loc: ['body', 'date_to'], msg: /^Value error, / });

  const early = await c.start(uuid, { date_from: '2019-12-31', date_to: yesterday() });
  t.same([early.status, early.body], [400, { detail: 'date_from cannot be earlier than 2020-01-01' }]);
  const none = await c.start(uuid, { date_from: '2020-01-01', date_to: yesterday() });
  t.same([none.status, none.body], [400, { detail: 'No entities were uploaded in this session' }]);

  // An ingest held open mid-body keeps upload_tasks_finished false.
  t.equal((await c.ingest(uuid, 'products', products(1))).status, 200);
  await waitForStatus(svc, uuid, (b) => b.can_start_upload);
  const body = new PassThrough();
  const held = request(`${svc.url}${API}/${uuid}/products`, {
    method: 'POST',
    headers: { authorization: DEMO.token, 'client-id': DEMO.id, 'content-type': 'application/json' },
    body,
  });
  body.write('{"columns":["product_id","name"],"data":[["x","y"]');
  await waitForStatus(svc, uuid, (b) => b.upload_tasks_finished === false && b.can_start_upload === false);
  const busy = await c.start(uuid, { date_from: '2020-01-01', date_to: yesterday() });
  t.same([busy.status, busy.body], [409, { detail: 'Upload tasks are still in progress' }]);
  body.end(']}');
  const finished = await held;
  t.equal(finished.statusCode, 200);
  t.equal((await finished.body.json() as any).rows_processed, 1);
  await waitForStatus(svc, uuid, (b) => b.can_start_upload);
  t.equal((await c.start(uuid, { date_from: '2020-01-01', date_to: yesterday() })).status, 200);
});

t.test('413 names the configured limit in MiB: 32 MiB on ingest, 1 MiB elsewhere (the defaults), by Content-Length before a byte is read', async (t) => {
  const svc = await startService(t);
  const uuid = (await clientOf(svc).init()).body.upload_uuid as string;
  for (const [path, declared, limit] of [
    [`${API}/${uuid}/products`, 32 * 1024 * 1024 + 1, '32 MiB'],
    [`${API}/${uuid}/start-upload`, 1024 * 1024 + 1, '1 MiB'],
  ] as const) {
    const raw = new RawClient(t, svc.url);
    await raw.write(head('POST', path, `${auth}Content-Type: application/json\r\nContent-Length: ${declared}\r\n`));
    const res = await raw.response();
    t.same([res.status, JSON.parse(res.body)], [413, { detail: `Request body too large (limit ${limit})` }], `${path.split('/').pop()}: ${limit}`);
  }
  const big = await call(svc.url, 'POST', `${API}/${uuid}/start-upload`, { raw: 'x'.repeat(1024 * 1024 + 1) });
  t.same([big.status, big.body], [413, { detail: 'Request body too large (limit 1 MiB)' }], 'a body over 1 MiB sent');
});

t.test('limits: 413 on Content-Length and while streaming; 404 and 405 for unknown routes', async (t) => {
  const svc = await startService(t, { limits: { ingestBodyBytes: 64 * 1024, otherBodyBytes: 1024 } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  const big = await call(svc.url, 'POST', `${API}/${uuid}/start-upload`, { raw: 'x'.repeat(2048) });
  t.same([big.status, big.body], [413, { detail: 'Request body too large (limit 1024 bytes)' }], 'a limit that is not a whole MiB is named in bytes');
  const bigIngest = await c.ingest(uuid, 'products', products(5000));
  t.same([bigIngest.status, bigIngest.body], [413, { detail: 'Request body too large (limit 65536 bytes)' }]);

  const body = new PassThrough();
  const chunked = request(`${svc.url}${API}/${uuid}/products`, {
    method: 'POST',
    headers: { authorization: DEMO.token, 'client-id': DEMO.id },
    body,
  });
  body.write('{"columns":["product_id","name"],"data":[');
  for (let i = 0; i < 8000; i++) body.write(`["p${i}","n"],`);
  body.end('["last","n"]]}');
  const res = await chunked;
  t.equal(res.statusCode, 413, 'a chunked body is cut off at the limit');
  t.same(await res.body.json(), { detail: 'Request body too large (limit 65536 bytes)' });
  t.same((await waitForStatus(svc, uuid, (b) => b.upload_tasks_finished)).entities, []);

  const nowhere = await call(svc.url, 'GET', '/api/v1/nowhere');
  t.same([nowhere.status, nowhere.body], [404, { detail: 'Not Found' }]);
  const wrongMethod = await call(svc.url, 'GET', `${API}/initialize-session`);
  t.same([wrongMethod.status, wrongMethod.body], [405, { detail: 'Method Not Allowed' }]);
  t.equal(wrongMethod.headers.allow, 'POST', 'a 405 names the methods the path takes (RFC 9110)');
  const entity = await call(svc.url, 'GET', `${API}/${uuid}/products`);
  t.same([entity.status, entity.headers.allow], [405, 'POST'], 'also on a path with parameters');
});

t.test('GET /entities lists the catalog; GET /openapi.json serves version 0.1.0', async (t) => {
  const svc = await startService(t);
  const res = await call(svc.url, 'GET', `${API}/entities`);
  t.equal(res.status, 200);
  t.same(res.body.entities.map((e: any) => e.name), ['stores', 'catalogs', 'products', 'stock', 'receipts', 'receipt_lines']);
  t.match(res.body.entities.find((e: any) => e.name === 'stock'), { required: ['store_id', 'product_id', 'date', 'quantity'], parents: ['stores', 'products'] });
  t.equal((await call(svc.url, 'GET', `${API}/entities`, { client: null })).status, 401);
  const doc = await call(svc.url, 'GET', '/openapi.json', { client: null });
  t.equal(doc.status, 200);
  t.equal(doc.body.info.version, '0.1.0');
  t.match(doc.body.openapi, /^3\.1/);
});
