/**
 * The Security section of the edge issue, over real HTTP on loopback:
 * - client isolation on every endpoint: another client's uuid answers exactly as an unknown
 *   one, and the owner's session is unchanged afterwards;
 * - hostile JSON (deep nesting, huge numbers and strings, `__proto__`/`constructor` keys,
 *   invalid UTF-8) answers a clear, short 422 and pollutes nothing (each case prints its time: no wall-time assertion here);
 * - tokens (and the webhook secret and signatures) never reach a log line or an error body;
 * - tokens and webhook signatures are compared in constant time;
 * - a signed webhook is applied at most once: a replay answers `ignored` (even after the
 *   session was started again), and one older than the 300 s window answers 401.
 */
import crypto, { createHash, randomUUID } from 'node:crypto';
import { syncBuiltinESMExports } from 'node:module';
import { gzipSync } from 'node:zlib';
import t, { type Test } from 'tap';
import { DEMO_CLIENTS_PATH } from '../../src/config/config.js';
import { signWebhook } from '../../src/connector/webhook.js';
import { ClientRegistry } from '../../src/http/auth.js';
import { listen } from '../../src/http/server.js';
import type { BodyStream } from '../../src/http/types.js';
import { jsonLogger } from '../../src/log.js';
import { OutcomeUnknown } from '../../src/errors.js';
import { API, call, clientOf, DEMO, DEMO2, fakeConnector, products, startService, testEdge, waitForStatus, WEBHOOK_SECRET, yesterday, type Answer } from '../support/harness.js';
import { CRASH_MARKER, FAULTY_WORKER } from '../support/faulty-worker.js';
import { startInProcess } from '../support/in-process.js';

// Worker threads start slowly under tap (its import hooks load in each), and two suites crash one.
t.setTimeout(180_000);

const dates = () => ({ date_from: '2024-01-01', date_to: yesterday() });
/** What a client can learn from an answer: status, body, and which headers came (not their per-request values). */
const seen = (a: Answer) => ({
  status: a.status,
  body: a.body,
  headers: Object.keys(a.headers)
    .filter((h) => h !== 'date' && h !== 'x-request-id')
    .sort(),
});

t.test('client isolation: every endpoint answers another client as if the session did not exist', async (t) => {
  const svc = await startService(t, { connector: { emulatorDelayMs: 60_000 }, limits: { requestsPerSecond: 0, concurrentPerClient: 0 } });
  const a = clientOf(svc, DEMO);
  const b = clientOf(svc, DEMO2);
  const uuid = (await a.init()).body.upload_uuid as string;
  t.equal((await a.ingest(uuid, 'products', products(3))).status, 200);
  await waitForStatus(svc, uuid, (s) => s.can_start_upload);
  const objects = await svc.openObjects();
  t.teardown(() => objects.close());
  const snapshot = async () => ({ status: (await a.status(uuid)).body, objects: (await objects.list('')).map((o) => o.key) });
  const before = await snapshot();

  /** Every endpoint that takes a uuid, as client B. */
  const probes: [string, (u: string) => Promise<Answer>][] = [
    ['status', (u) => b.status(u)],
    ['ingest', (u) => b.ingest(u, 'products', products(2))],
    ['ingest (unknown entity)', (u) => b.ingest(u, 'widgets', products(1))],
    ['ingest (gzip)', (u) => call(svc.url, 'POST', `${API}/${u}/products`, { client: DEMO2, raw: gzipSync(JSON.stringify(products(1))), headers: { 'content-encoding': 'gzip' } })],
    ['start-upload', (u) => b.start(u, dates())],
    ['start-upload (bad body)', (u) => b.start(u, { date_from: 'x' })],
    ['terminate', (u) => b.terminate(u)],
    ['delete', (u) => b.remove(u)],
  ];
  const sameAsUnknown = async (t: Test, state: string) => {
    for (const [name, probe] of probes) {
      const stranger = randomUUID();
      const [theirs, unknown] = [await probe(uuid), await probe(stranger)];
      t.same(seen(theirs), seen(unknown), `${state}: ${name} of A's session answers B exactly as an unknown uuid (${theirs.status})`);
      t.notMatch(theirs.text, uuid, `${state}: ${name}: A's uuid is not in the answer`);
    }
    t.same(await snapshot(), before, `${state}: A's session and objects unchanged`);
  };

  await t.test('B has no session', async (t) => {
    await sameAsUnknown(t, 'B without a session');
    t.same([(await b.status(uuid)).status, (await b.ingest(uuid, 'products', products(1))).body], [404, { detail: 'Upload session not initialized' }]);
  });

  const bUuid = (await b.init()).body.upload_uuid as string;
  await t.test('B has a session of its own', async (t) => {
    await sameAsUnknown(t, 'B with a session');
    t.same((await b.terminate(uuid)).body, { detail: 'Invalid upload UUID' });
    const again = await b.init();
    t.same([again.status, again.body.upload_uuid], [409, bUuid], "B's initialize-session answers B's own session, never A's");
  });

  await t.test("A's session STARTED: B can neither stop nor see it", async (t) => {
    t.equal((await a.start(uuid, dates())).status, 200);
    const started = await snapshot();
    t.equal(started.status.session_status, 'STARTED');
    for (const [name, probe] of probes) {
      const [theirs, unknown] = [await probe(uuid), await probe(randomUUID())];
      t.same(seen(theirs), seen(unknown), `STARTED: ${name} answers B exactly as an unknown uuid`);
    }
    t.same(await snapshot(), started, "A's session is still STARTED and unchanged");
    t.equal((await a.terminate(uuid)).status, 200, 'A itself can terminate it');
  });

  await t.test('no client can pose as another', async (t) => {
    const spoofs: [string, Record<string, string>][] = [
      ["B's token, A's Client-Id", { authorization: DEMO2.token, 'client-id': DEMO.id }],
      ["A's token, B's Client-Id", { authorization: DEMO.token, 'client-id': DEMO2.id }],
      ["A's token hash as the token", { authorization: createHash('sha256').update(DEMO.token).digest('hex'), 'client-id': DEMO.id }],
      ['Client-Id with a trailing space', { authorization: DEMO2.token, 'client-id': `${DEMO2.id} ` }],
      ['two Client-Id values', { authorization: DEMO2.token, 'client-id': `${DEMO2.id}, ${DEMO.id}` }],
    ];
    for (const [name, headers] of spoofs) {
      const res = await call(svc.url, 'GET', `${API}/${uuid}/status`, { client: null, headers });
      t.not(res.status, 200, name);
      t.notMatch(res.text, uuid, `${name}: nothing of A's session`);
    }
  });
});

/** The 422 of one refused row, from its `detail` (the body also lists it in `errors`, docs/api.md). */
function refusedRow(detail: string): unknown {
  const [, row, column, message] = /^Invalid data types in payload: row (\d+)(?:, column "([^"]+)")?: (.*)$/s.exec(detail)!;
  return { detail, errors: [{ row: Number(row), column: column ?? null, message }], error_count: 1 };
}

t.test('hostile JSON: clear 422s with short answers, nothing polluted', async (t) => {
  const connector = await fakeConnector(t);
  // About 80 requests in a second or two: past the per-IP burst (50) plus 30/s on a fast
  // machine, and the rate limit is not what this test is about.
  const svc = await startService(t, { connector: { url: connector.url }, limits: { requestsPerSecond: 0 } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid as string;
  // Both workers up first (under tap a worker thread takes a second or more to start).
  const warm = await Promise.all([1, 2].map(() => c.ingest(uuid, 'products', { columns: ['product_id', 'name'], data: [['p', 1]] })));
  t.same(warm.map((r) => r.status), [422, 422]);
  const deep = (n: number, inner = '') => '['.repeat(n) + inner + ']'.repeat(n);
  const huge = 'x'.repeat(10 * 1024 * 1024);
  const ingestCases: [string, string | Buffer, unknown][] = [
    ['100k unclosed [', '['.repeat(100_000), { detail: 'Invalid JSON format.' }],
    ['100k unclosed [ inside data', `{"columns":["product_id","name"],"data":[${'['.repeat(100_000)}`, { detail: 'Invalid JSON format.' }],
    ['100k-deep row cell', `{"columns":["product_id","name"],"data":[["p",${deep(100_000)}]]}`, refusedRow('Invalid data types in payload: row 0, column "name": expected string, got array')],
    ['100k-deep data', `{"columns":["product_id","name"],"data":${deep(100_000)}}`, refusedRow('Invalid data types in payload: row 0: expected 2 values, got 1')],
    ['100k-deep columns', `{"columns":${deep(100_000)},"data":[]}`, { detail: [{ type: 'string_type', loc: ['body', 'columns', 0], msg: 'Input should be a valid string', input: null }] }],
    ['100k-deep body', deep(100_000), { detail: [{ type: 'model_attributes_type', loc: ['body'], msg: 'Input should be a valid dictionary or object to extract fields from', input: null }] }],
    ['100k-deep unknown key before columns', `{"x":${deep(100_000)},"columns":["product_id"],"data":[]}`, { detail: 'Missing required columns: name' }],
    ['1e999999', '{"columns":["product_id","name","price"],"data":[["p","n",1e999999]]}', refusedRow('Invalid data types in payload: row 0, column "price": expected number >= 0, got Infinity')],
    ['-1e999999', '{"columns":["product_id","name","price"],"data":[["p","n",-1e999999]]}', refusedRow('Invalid data types in payload: row 0, column "price": expected number >= 0, got -Infinity')],
    ['a number of 200,000 digits', `{"columns":["product_id","name","price"],"data":[["p","n",${'9'.repeat(200_000)}]]}`, refusedRow('Invalid data types in payload: row 0, column "price": expected number >= 0, got Infinity')],
    ['10 MB string in a number column', `{"columns":["product_id","name","price"],"data":[["p","n","${huge}"]]}`, refusedRow(`Invalid data types in payload: row 0, column "price": expected number >= 0, got "${'x'.repeat(100)}…"`)],
    ['10 MB column name', `{"columns":["product_id","name","${huge}"],"data":[]}`, { detail: `Unknown column: ${'x'.repeat(100)}…` }],
    ['10 MB object key', `{"${huge}":1,"columns":["product_id","name"],"data":[["p",1]]}`, refusedRow('Invalid data types in payload: row 0, column "name": expected string, got 1')],
    ['__proto__ in a row', '{"columns":["product_id","name"],"data":[["p",{"__proto__":{"polluted":true},"constructor":{"prototype":{"polluted":true}}}]]}', refusedRow('Invalid data types in payload: row 0, column "name": expected string, got {"__proto__":{"polluted":true},"constructor":{"prototype":{"polluted":true}}}')],
    ['__proto__ as columns', '{"__proto__":{"columns":["product_id","name"],"data":[]}}', { detail: [{ type: 'missing', loc: ['body', 'columns'], msg: 'Field required', input: null }] }],
    ['__proto__ array data', '{"columns":["product_id","name"],"__proto__":[["p","n"]]}', { detail: [{ type: 'missing', loc: ['body', 'data'], msg: 'Field required', input: null }] }],
    ['invalid UTF-8', Buffer.concat([Buffer.from('{"columns":["product_id","name"],"data":[["p","'), Buffer.from([0xc3, 0x28]), Buffer.from('"]]}')]), { detail: 'Invalid JSON format.' }],
    ['overlong UTF-8 quote', Buffer.concat([Buffer.from('{"columns":["product_id","name"],"data":[["p","'), Buffer.from([0xc0, 0xa2]), Buffer.from('"]]}')]), { detail: 'Invalid JSON format.' }],
    ['NUL bytes', '{"columns":["product_id","name"],"data":[["p","\u0000"]]}', { detail: 'Invalid JSON format.' }],
  ];
  for (const [name, raw, expected] of ingestCases) {
    const started = Date.now();
    const res = await call(svc.url, 'POST', `${API}/${uuid}/products`, { raw, headers: { 'content-type': 'application/json' } });
    const ms = Date.now() - started;
    t.same([res.status, res.body], [422, expected], `ingest, ${name}: 422 in ${ms} ms`);
    t.ok(res.text.length < 2_048, `ingest, ${name}: a short answer (${res.text.length} bytes)`);
  }

  // Found by the fuzz drill: a head just under 64 KiB streams, but its skeleton (head plus a
  // placeholder) is checked in a worker, and the head's parsed `columns` was cloned to it:
  // 32,000 arrays deep overflowed structured cloning (500). Every size around that edge:
  const edge: number[] = [];
  for (let n = 32_740; n <= 32_775; n++) {
    const res = await call(svc.url, 'POST', `${API}/${uuid}/products`, { raw: `{"columns":${deep(n)},"data":[]}`, headers: { 'content-type': 'application/json' } });
    if (res.status !== 422 || res.body?.detail?.[0]?.type !== 'string_type') edge.push(n);
  }
  t.same(edge, [], 'a deep `columns` at the inline-skeleton edge: 422 string_type at every size');

  const startCases: [string, string, number, unknown][] = [
    ['500k unclosed [', '['.repeat(500_000), 422, [{ type: 'json_invalid', loc: ['body', 0], msg: 'JSON decode error', input: {}, ctx: { error: 'Nesting deeper than 64 levels' } }]],
    ['60 unclosed [', '['.repeat(60), 422, [{ type: 'json_invalid', loc: ['body', 0], msg: 'JSON decode error', input: {}, ctx: { error: 'Unexpected end of JSON input' } }]],
    ['400k-deep body', deep(400_000), 422, [{ type: 'json_invalid', loc: ['body', 0], msg: 'JSON decode error', input: {}, ctx: { error: 'Nesting deeper than 64 levels' } }]],
    ['400k-deep date_from', `{"date_from":${deep(400_000)},"date_to":"2024-01-02"}`, 422, [{ type: 'json_invalid', loc: ['body', 0], msg: 'JSON decode error', input: {}, ctx: { error: 'Nesting deeper than 64 levels' } }]],
    ['60-deep date_from (parsed)', `{"date_from":${deep(60)},"date_to":"2024-01-02"}`, 422, [{ type: 'date_type', loc: ['body', 'date_from'], msg: 'Input should be a valid date', input: null }]],
    ['60-deep extra field (parsed)', `{"x":${deep(60)}}`, 422, [
      { type: 'missing', loc: ['body', 'date_from'], msg: 'Field required', input: null },
      { type: 'missing', loc: ['body', 'date_to'], msg: 'Field required', input: null },
    ]],
    ['brackets inside strings do not count', `{"date_from":"${'['.repeat(1000)}","date_to":"2024-01-02"}`, 422, [{ type: 'date_from_datetime_parsing', loc: ['body', 'date_from'], msg: 'Input should be a valid date or datetime, invalid date format, expected YYYY-MM-DD', input: '['.repeat(1000), ctx: { error: 'invalid date format, expected YYYY-MM-DD' } }]],
    ['1e999999', '{"date_from":1e999999,"date_to":"2024-01-02"}', 422, [{ type: 'date_type', loc: ['body', 'date_from'], msg: 'Input should be a valid date', input: null }]],
    ['__proto__ dates', '{"__proto__":{"date_from":"2024-01-01","date_to":"2024-01-02"}}', 422, [
      { type: 'missing', loc: ['body', 'date_from'], msg: 'Field required', input: { ['__proto__']: { date_from: '2024-01-01', date_to: '2024-01-02' } } },
      { type: 'missing', loc: ['body', 'date_to'], msg: 'Field required', input: { ['__proto__']: { date_from: '2024-01-01', date_to: '2024-01-02' } } },
    ]],
    ['10 MB string', `{"date_from":"${huge}"}`, 413, 'Request body too large (limit 1 MiB)'],
  ];
  for (const [name, raw, status, detail] of startCases) {
    const started = Date.now();
    const res = await call(svc.url, 'POST', `${API}/${uuid}/start-upload`, { raw, headers: { 'content-type': 'application/json' } });
    const ms = Date.now() - started;
    t.equal(res.status, status, `start-upload, ${name}: ${status} in ${ms} ms`);
    t.same(res.body, { detail }, `start-upload, ${name}: the answer`);
  }

  await t.test('a session id that no session can have: 404, as any unknown one', async (t) => {
    for (const id of ['x%20y', 'u'.repeat(4000), '..%2F..%2Fetc', 'ABC', uuid.toUpperCase(), `${uuid}%00`]) {
      const res = await c.status(id);
      t.same([res.status, res.body], [404, { detail: 'Upload session not found' }], `status of ${id.slice(0, 40)}`);
    }
    const now = Math.floor(Date.now() / 1000);
    for (const id of ['../x', 'x y', 'u'.repeat(4000)]) {
      const raw = JSON.stringify({ upload_uuid: id, is_terminated: false });
      const res = await call(svc.url, 'POST', `${API}/webhooks/upload-finished`, {
        client: null,
        raw,
        headers: { 'content-type': 'application/json', 'x-connector-timestamp': String(now), 'x-connector-signature': signWebhook(WEBHOOK_SECRET, now, raw) },
      });
      t.same([res.status, res.body], [404, { detail: 'Upload session not found' }], `webhook for ${id.slice(0, 40)}`);
    }
  });

  await t.test('the service lived through all of it, and nothing was polluted', async (t) => {
    const probe: Record<string, unknown> = {};
    t.equal(probe.polluted, undefined, 'Object.prototype of the service process is clean');
    t.equal(({} as Record<string, unknown>).constructor, Object);
    const res = await c.ingest(uuid, 'products', { columns: ['product_id', 'name'], data: [['p1', 'Milk']] });
    t.same([res.status, res.body?.rows_processed], [200, 1], 'the workers still validate normally');
    const fine = await call(svc.url, 'POST', `${API}/${uuid}/products`, {
      raw: '{"__proto__":{"polluted":true},"constructor":{"prototype":{"polluted":true}},"columns":["product_id","name"],"data":[["p2","Tea"]]}',
      headers: { 'content-type': 'application/json' },
    });
    t.same([fine.status, fine.body?.rows_processed], [200, 1], 'unknown top-level keys, __proto__ included, are ignored');
    t.equal(({} as Record<string, unknown>).polluted, undefined, 'still clean');
    const st = await waitForStatus(svc, uuid, (s) => s.can_start_upload);
    t.same(st.entities, ['products'], 'only the two good packages counted');
    const objects = await svc.openObjects();
    t.teardown(() => objects.close());
    const stored = await objects.list('');
    t.equal(stored.length, 2);
    for (const o of stored) {
      const chunks: Uint8Array[] = [];
      for await (const chunk of (await objects.get(o.key))!) chunks.push(chunk);
      const text = Buffer.concat(chunks).toString();
      const [header, ...rows] = text.trim().split('\n');
      t.same(Object.keys(JSON.parse(header!)), ['entity', 'columns', 'package_id', 'upload_uuid', 'client_id', 'rows'], 'the stored header has only its own keys');
      t.notMatch(text, 'polluted', 'nothing of the hostile keys stored');
      t.equal(rows.length, 1);
    }
  });
});

t.test('tokens, the webhook secret and signatures never reach a log line or an error body', async (t) => {
  const lines: string[] = [];
  const logger = jsonLogger({ write: (line: string) => lines.push(line) }, {}, { level: 'debug' });
  const connector = await fakeConnector(t);
  const svc = await startInProcess(
    t,
    { connector: { url: connector.url }, limits: { requestsPerSecond: 0, concurrentPerClient: 0 } },
    { logger, validationWorker: FAULTY_WORKER },
  );
  const secrets = [DEMO.token, DEMO2.token, WEBHOOK_SECRET];
  const badTokens = Array.from({ length: 6 }, () => `tok_${crypto.randomBytes(12).toString('hex')}`);
  secrets.push(...badTokens, ...[DEMO.token, ...badTokens].map((s) => createHash('sha256').update(s).digest('hex')));
  const bodies: string[] = [];
  const send = async (...args: Parameters<typeof call>) => {
    const res = await call(...args);
    bodies.push(res.text, JSON.stringify(res.headers));
    return res;
  };
  const uuid = (await send(svc.url, 'POST', `${API}/initialize-session`)).body.upload_uuid as string;

  // The valid client through every outcome: 200, 422, 409, 500 (a worker crash), Connector errors.
  const c = { client: DEMO };
  await send(svc.url, 'POST', `${API}/${uuid}/products`, { ...c, body: products(2) });
  await send(svc.url, 'POST', `${API}/${uuid}/products`, { ...c, raw: `{"columns":["product_id","name"],"data":[["p","${CRASH_MARKER}"]]}` });
  await waitForStatus(svc, uuid, (s) => s.can_start_upload);
  connector.script((_req, _body, res) => res.writeHead(500, { 'content-type': 'application/json' }).end(JSON.stringify({ detail: 'boom' })));
  await send(svc.url, 'POST', `${API}/${uuid}/start-upload`, { ...c, body: dates() });
  connector.script((req) => req.socket.destroy());
  await send(svc.url, 'POST', `${API}/${uuid}/start-upload`, { ...c, body: dates() });
  connector.script((_req, _body, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"workflow_id":"wf"}'));
  const tokenHeaders: Record<string, string>[] = [
    ...badTokens.map((tok) => ({ authorization: tok, 'client-id': DEMO.id })),
    { authorization: `Bearer ${badTokens[0]}`, 'client-id': DEMO.id },
    { authorization: badTokens[1]! },
    { authorization: DEMO.token, 'client-id': DEMO2.id },
    { authorization: DEMO2.token, 'client-id': DEMO.id },
    { authorization: DEMO.token },
    { authorization: `Bearer ${DEMO.token}`, 'client-id': 'nobody' },
    { authorization: DEMO.token, 'client-id': DEMO.id, 'x-forwarded-for': '203.0.113.9' },
    { authorization: `${DEMO.token}\t`, 'client-id': DEMO.id },
  ];
  const paths: [string, string, string | Buffer | undefined][] = [
    ['GET', `${API}/entities`, undefined],
    ['POST', `${API}/initialize-session`, undefined],
    ['GET', `${API}/${uuid}/status`, undefined],
    ['POST', `${API}/${uuid}/products`, JSON.stringify(products(2))],
    ['POST', `${API}/${uuid}/products`, `{"columns":["product_id","name"],"data":[["p","${CRASH_MARKER}"]]}`],
    ['POST', `${API}/${uuid}/products`, '{"columns":["product_id","name"],"data":[["p",1]]}'],
    ['POST', `${API}/${uuid}/start-upload`, JSON.stringify(dates())],
    ['POST', `${API}/${uuid}/terminate`, undefined],
    ['POST', `${API}/${uuid}/delete`, '{"x":1}'],
    ['GET', `${API}/${uuid}/nowhere`, undefined],
    ['DELETE', `${API}/initialize-session`, undefined],
    ['POST', `${API}/webhooks/upload-finished`, JSON.stringify({ upload_uuid: uuid, is_terminated: false })],
    ['GET', '/metrics', undefined],
    ['GET', '/readyz', undefined],
  ];
  for (const headers of tokenHeaders) {
    for (const [method, path, raw] of paths) await send(svc.url, method, path, { client: null, headers: { ...headers, 'content-type': 'application/json' }, raw });
  }
  // Webhooks: wrong, stale and valid signatures.
  const raw = JSON.stringify({ upload_uuid: uuid, is_terminated: false });
  const now = Math.floor(Date.now() / 1000);
  const signatures = [signWebhook(WEBHOOK_SECRET, now, raw), signWebhook(WEBHOOK_SECRET, now - 1_000, raw), signWebhook('another-secret-0123456789', now, raw)];
  for (const [i, signature] of signatures.entries()) {
    await send(svc.url, 'POST', `${API}/webhooks/upload-finished`, {
      client: null,
      raw,
      headers: { 'content-type': 'application/json', 'x-connector-timestamp': String(i === 1 ? now - 1_000 : now), 'x-connector-signature': signature },
    });
  }
  secrets.push(...signatures.map((s) => s.slice('sha256='.length)));

  t.ok(lines.length > 0, `${lines.length} log lines written`);
  t.ok(lines.some((l) => /exited with code/.test(l)), 'internal errors are logged (with their cause)');
  for (const secret of secrets) {
    t.notOk(lines.some((l) => l.includes(secret)), `no log line holds ${secret.slice(0, 8)}…`);
    t.notOk(bodies.some((b) => b.includes(secret)), `no answer holds ${secret.slice(0, 8)}…`);
  }
});

t.test('tokens and webhook signatures are compared in constant time', async (t) => {
  const registry = ClientRegistry.fromFile(DEMO_CLIENTS_PATH);
  const real = crypto.timingSafeEqual;
  const calls: [number, number][] = [];
  // The CommonJS export object of node:crypto is writable; its ESM namespace is not.
  const exports = crypto as unknown as { timingSafeEqual: typeof crypto.timingSafeEqual };
  exports.timingSafeEqual = ((a: NodeJS.ArrayBufferView, b: NodeJS.ArrayBufferView) => {
    calls.push([a.byteLength, b.byteLength]);
    return real(a, b);
  }) as typeof crypto.timingSafeEqual;
  // `import { timingSafeEqual } from 'node:crypto'` bindings follow the CommonJS export only after this.
  syncBuiltinESMExports();
  t.teardown(() => {
    exports.timingSafeEqual = real;
    syncBuiltinESMExports();
  });

  t.match(registry.authenticate(DEMO.token, DEMO.id, '127.0.0.1'), { id: DEMO.id });
  t.same(calls, [[32, 32]], 'a known token: its SHA-256 is confirmed with timingSafeEqual, 32 bytes against 32');
  calls.length = 0;
  t.throws(() => registry.authenticate(`${DEMO.token}x`, DEMO.id, '127.0.0.1'), { code: 'AUTH_REQUIRED' });
  t.same(calls, [], 'an unknown token: only a lookup by its SHA-256, which says nothing about the stored hashes');

  const { verifyWebhook } = await import('../../src/connector/webhook.js');
  const now = Math.floor(Date.now() / 1000);
  t.ok(verifyWebhook({ secret: WEBHOOK_SECRET, timestampHeader: String(now), signatureHeader: signWebhook(WEBHOOK_SECRET, now, '{}'), rawBody: '{}' }));
  t.notOk(verifyWebhook({ secret: WEBHOOK_SECRET, timestampHeader: String(now), signatureHeader: `sha256=${'0'.repeat(64)}`, rawBody: '{}' }));
  t.same(calls, [[32, 32], [32, 32]], 'webhook signatures: timingSafeEqual on the 32-byte HMACs');
});

t.test('a reply the server cannot serialise answers 500; the process lives on', async (t) => {
  const errors: unknown[] = [];
  const deep: unknown[] = [];
  let cursor = deep;
  for (let i = 0; i < 200_000; i++) cursor = (cursor[0] = []) as unknown[];
  const server = await listen({
    edge: await testEdge(),
    host: '127.0.0.1',
    port: 0,
    routes: [{ method: 'GET', pattern: '/deep', body: 'buffered', handler: async () => ({ status: 422, body: { detail: deep } }) }],
    limits: { ingestBodyBytes: 1024, otherBodyBytes: 1024, requestTimeoutMs: 5_000, bodyRateWindowMs: 5_000, minBodyBytesPerSecond: 1, requestsPerSecond: 0, burst: 1, concurrentPerClient: 0, trackedClients: 10 },
    onInternalError: (err) => errors.push(err),
  });
  t.teardown(() => server.close());
  const res = await call(`http://127.0.0.1:${server.port}`, 'GET', '/deep', { client: null });
  t.same([res.status, res.body], [500, { detail: 'Internal server error' }]);
  t.match(errors, [{ name: 'RangeError' }], 'logged as an internal error');
  t.equal((await call(`http://127.0.0.1:${server.port}`, 'GET', '/nowhere', { client: null })).status, 404, 'still serving');
});

t.test('a request timeout waits for a handler past its point of no return (an ingest recording its package), and only for it', async (t) => {
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  let started!: () => void;
  const heldStarted = new Promise<void>((resolve) => (started = resolve));
  const holds: Record<string, boolean> = {};
  const route = (pattern: string, hold: 'before' | 'after' | 'never') => ({
    method: 'POST',
    pattern,
    body: 'streaming' as const,
    handler: async (_req: unknown, body: BodyStream) => {
      body.discard();
      if (hold === 'before') {
        holds[pattern] = body.hold();
        started();
      }
      await released;
      if (hold === 'after') holds[pattern] = body.hold();
      return { status: 200, body: { status: 'success' } };
    },
  });
  const server = await listen({
    edge: await testEdge(),
    host: '127.0.0.1',
    port: 0,
    routes: [route('/held', 'before'), route('/plain', 'never'), route('/late', 'after')],
    limits: { ingestBodyBytes: 1024, otherBodyBytes: 1024, requestTimeoutMs: 300, bodyRateWindowMs: 5_000, minBodyBytesPerSecond: 1, requestsPerSecond: 0, burst: 1, concurrentPerClient: 0, trackedClients: 10 },
    onInternalError: () => undefined,
  });
  t.teardown(() => server.close());
  const base = `http://127.0.0.1:${server.port}`;
  const held = call(base, 'POST', '/held', { client: null, raw: '' });
  await heldStarted; // its timer runs from here, before the others'
  const late = call(base, 'POST', '/late', { client: null, raw: '' });
  const plain = await call(base, 'POST', '/plain', { client: null, raw: '' });
  t.equal(plain.status, 408, 'a handler that did not hold: 408 at the timeout');
  t.equal((await late).status, 408, 'likewise the one that holds only later');
  release();
  const answer = await held;
  t.same([answer.status, answer.body], [200, { status: 'success' }], 'the held handler answers after its timeout passed');
  t.same(holds, { '/held': true, '/late': false }, 'hold: true before an answer, false after one (the handler must not go on)');
});

t.test('an outcome nobody knows gets no answer: the connection is closed, as a crash would, whether the handler says so or its hold outlives the grace', async (t) => {
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  const unanswered: string[] = [];
  const route = (pattern: string, handler: (body: BodyStream) => Promise<{ status: number; body: unknown }>) => ({
    method: 'POST',
    pattern,
    body: 'streaming' as const,
    handler: async (_req: unknown, body: BodyStream) => {
      body.discard();
      return handler(body);
    },
  });
  const server = await listen({
    edge: await testEdge(),
    host: '127.0.0.1',
    port: 0,
    routes: [
      // A record write the store never settled (session/service.ts, resolveRecord).
      route('/unknown', async () => {
        throw new OutcomeUnknown('the record write may still land');
      }),
      // Past its point of no return, and still recording past the timeout and the grace.
      route('/held', async (body) => {
        body.hold();
        await released;
        return { status: 200, body: { status: 'success' } };
      }),
      route('/ok', async () => ({ status: 200, body: { status: 'success' } })),
    ],
    limits: { ingestBodyBytes: 1024, otherBodyBytes: 1024, requestTimeoutMs: 300, bodyRateWindowMs: 5_000, minBodyBytesPerSecond: 1, requestsPerSecond: 0, burst: 1, concurrentPerClient: 0, trackedClients: 10 },
    holdGraceMs: 200,
    onInternalError: () => undefined,
    onUnanswered: (err) => void unanswered.push((err as Error).message),
  });
  t.teardown(() => server.close());
  const base = `http://127.0.0.1:${server.port}`;
  for (const path of ['/unknown', '/held']) {
    const outcome = await call(base, 'POST', path, { client: null, raw: '' }).then(
      (res) => `answered ${res.status}`,
      (err: unknown) => `closed: ${(err as { code?: string }).code}`,
    );
    t.match(outcome, /^closed: UND_ERR_SOCKET$/, `${path}: no answer, the connection closed (${outcome})`);
  }
  release();
  t.equal((await call(base, 'POST', '/ok', { client: null, raw: '' })).status, 200, 'still serving');
  t.match(unanswered, [/may still land/, /Past the request timeout and 200 ms more/], 'each said once, with why');
  t.equal(unanswered.length, 2);
});

t.test('webhook replay: applied once; a replay is ignored, even after a new start; past 300 s it is refused', async (t) => {
  const connector = await fakeConnector(t);
  let skewMs = 0;
  const svc = await startInProcess(t, { connector: { url: connector.url } }, { clock: () => Date.now() + skewMs });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid as string;
  t.equal((await c.ingest(uuid, 'products', products(2))).status, 200);
  await waitForStatus(svc, uuid, (s) => s.can_start_upload);

  /** A webhook exactly as the Connector signs it, kept to be sent again byte for byte. */
  const capture = (payload: object) => {
    const raw = JSON.stringify(payload);
    const ts = Math.floor(Date.now() / 1000);
    return {
      send: () =>
        call(svc.url, 'POST', `${API}/webhooks/upload-finished`, {
          client: null,
          raw,
          headers: { 'content-type': 'application/json', 'x-connector-timestamp': String(ts), 'x-connector-signature': signWebhook(WEBHOOK_SECRET, ts, raw) },
        }),
    };
  };
  const state = async () => (await c.status(uuid)).body.session_status as string;

  t.equal((await c.start(uuid, dates())).status, 200);
  t.equal((await c.terminate(uuid)).status, 200);
  const terminated = capture({ upload_uuid: uuid, is_terminated: true, status: 'terminated' });
  t.same((await terminated.send()).body, { status: 'ok' }, 'the terminate confirmation is applied');
  t.equal(await state(), 'UPLOADING');
  t.same((await terminated.send()).body, { status: 'ignored' }, 'replayed at once: ignored');

  t.equal((await c.start(uuid, dates())).status, 200, 'the client starts again');
  t.equal(await state(), 'STARTED');
  const replay = await terminated.send();
  t.same([replay.status, replay.body], [200, { status: 'ignored' }], 'the old confirmation replayed during the new workflow: ignored');
  t.equal(await state(), 'STARTED', 'the new workflow is not cut short by a replay');

  const finished = capture({ upload_uuid: uuid, is_terminated: false, status: 'succeeded' });
  t.same((await finished.send()).body, { status: 'ok' });
  t.equal(await state(), 'DONE');
  t.same((await finished.send()).body, { status: 'ignored' }, 'the completion replayed: ignored');
  t.equal(await state(), 'DONE');

  skewMs = 301_000;
  const stale = await finished.send();
  t.same([stale.status, stale.body], [401, { detail: 'Invalid webhook signature' }], 'replayed more than 300 s later: 401');
  t.equal(await state(), 'DONE', 'nothing changed');
});
