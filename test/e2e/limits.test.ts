/**
 * The Limits of docs/api.md at the edge, over real HTTP on loopback: the per-client-IP token
 * bucket and in-flight cap (503 + Retry-After, before authentication), the idle-body and
 * request timeouts (408, connection closed), and 413 on chunked bodies without reading on.
 * Limits are made small per test; raw sockets are used where the exact bytes matter.
 */
import t from 'tap';
import { API, call, clientOf, DEMO2, fakeConnector, products, startService, waitForStatus, yesterday } from '../support/harness.js';
import { auth, head, parseResponse, RawClient } from '../support/raw-http.js';

const delay = (ms: number) => new Promise((r) => setTimeout(r, ms));

t.test('rate limit: a burst beyond the bucket answers 503 with Retry-After, before authentication', async (t) => {
  // 0.2 tokens/s: the burst of 60 cannot earn a token back, whatever the machine's speed.
  const svc = await startService(t, { trustedProxies: ['127.0.0.1'], limits: { requestsPerSecond: 0.2, burst: 50 } });
  const statuses: number[] = [];
  const limited: { retryAfter: unknown; body: unknown }[] = [];
  for (let i = 0; i < 60; i++) {
    const res = await call(svc.url, 'GET', `${API}/entities`);
    statuses.push(res.status);
    if (res.status === 503) limited.push({ retryAfter: res.headers['retry-after'], body: res.body });
  }
  t.same(statuses.slice(0, 50), Array(50).fill(200), 'the first 50 pass');
  t.same(statuses.slice(50), Array(10).fill(503), 'the other 10 are turned away');
  for (const { retryAfter, body } of limited) {
    t.same(body, { detail: 'Rate limit exceeded' });
    t.match(retryAfter, /^[1-5]$/, 'Retry-After: whole seconds until a token is back (1/0.2 s at most)');
  }

  const anonymous = await call(svc.url, 'GET', `${API}/entities`, { client: null });
  t.equal(anonymous.status, 503, 'checked before authentication (check 1 of docs/api.md, Check order)');
  const unknown = await call(svc.url, 'GET', '/api/v1/nowhere');
  t.equal(unknown.status, 503, 'every /api/v1/ path is rated, even one that does not exist');
  const doc = await call(svc.url, 'GET', '/openapi.json', { client: null });
  t.equal(doc.status, 200, 'requests outside /api/v1/ take no token');

  const proxied = await call(svc.url, 'GET', `${API}/entities`, { client: null, headers: { 'x-forwarded-for': '203.0.113.5' } });
  t.equal(proxied.status, 401, 'another client behind the trusted proxy has its own bucket (and reaches authentication)');
  const proxiedMany = await call(svc.url, 'GET', `${API}/entities`, { client: null, headers: { 'x-forwarded-for': '198.51.100.1, 203.0.113.6' } });
  t.equal(proxiedMany.status, 401, 'the right-most untrusted hop names the client');
  const proxiedSelf = await call(svc.url, 'GET', `${API}/entities`, { client: null, headers: { 'x-forwarded-for': '127.0.0.1' } });
  t.equal(proxiedSelf.status, 503, 'a forwarded loopback address is still the exhausted client');
});

t.test('rate limit: X-Forwarded-For from an untrusted peer is ignored', async (t) => {
  const svc = await startService(t, { limits: { requestsPerSecond: 0.2, burst: 2 } });
  for (let i = 0; i < 2; i++) t.equal((await call(svc.url, 'GET', `${API}/entities`)).status, 200);
  const spoofed = await call(svc.url, 'GET', `${API}/entities`, { headers: { 'x-forwarded-for': '203.0.113.7' } });
  t.equal(spoofed.status, 503, 'a spoofed address neither escapes the bucket nor creates a new one');
});

t.test('rate limit: the bucket refills; waiting Retry-After is enough', async (t) => {
  // The service's clock is the test's: time passes only when the test moves it.
  let now = Date.now();
  const svc = await startService(t, { limits: { requestsPerSecond: 1, burst: 2 } }, {}, { clock: () => now });
  t.equal((await call(svc.url, 'GET', `${API}/entities`)).status, 200);
  t.equal((await call(svc.url, 'GET', `${API}/entities`)).status, 200);
  const limited = await call(svc.url, 'GET', `${API}/entities`);
  t.equal(limited.status, 503);
  t.equal(limited.headers['retry-after'], '1', 'under a second to the next token, rounded up to a whole second');
  now += Number(limited.headers['retry-after']) * 1000 - 1;
  t.equal((await call(svc.url, 'GET', `${API}/entities`)).status, 503, 'no token back a millisecond before Retry-After');
  now += 1;
  t.equal((await call(svc.url, 'GET', `${API}/entities`)).status, 200, 'a token is back after Retry-After');
  t.equal((await call(svc.url, 'GET', `${API}/entities`)).status, 503, 'one token, not the whole bucket');
});

t.test('connection limit: the 31st concurrent request of one client IP answers 503', async (t) => {
  // The default of 30 in flight; a bucket (default burst 50) that the 60-odd requests here do not empty.
  const svc = await startService(t, { limits: { burst: 1000 } });
  t.equal(svc.config.limits.concurrentPerClient, 30);
  const held: RawClient[] = [];
  for (let i = 0; i < 30; i++) {
    const c = new RawClient(t, svc.url);
    // Headers complete, body not sent: the request is in flight. uWS answers `100 Continue`
    // right after our route callback ran, so it tells us the slot is taken (a latch, not a sleep).
    await c.write(head('POST', `${API}/initialize-session`, `${auth}Content-Length: 2\r\nExpect: 100-continue\r\n`));
    await c.until(() => c.text.startsWith('HTTP/1.1 100'), '100 Continue');
    held.push(c);
  }
  const over = await call(svc.url, 'GET', `${API}/entities`);
  t.same([over.status, over.body, over.headers['retry-after']], [503, { detail: 'Rate limit exceeded' }, '1']);
  const overAnonymous = await call(svc.url, 'GET', '/openapi.json', { client: null });
  t.equal(overAnonymous.status, 503, 'the cap counts every request, not only /api/v1/');

  const first = held.shift()!;
  await first.write('{}');
  const answered = await first.response();
  t.not(answered.status, 503, 'a held request completes normally');
  const next = await call(svc.url, 'GET', `${API}/entities`);
  t.equal(next.status, 200, 'an answered request frees its slot');

  // Aborted requests free their slots too. The service logs each abort after it released the
  // request's slot: once all 29 are logged, 30 concurrent requests pass.
  let aborted = 0;
  const allAborted = new Promise<void>((resolve) => {
    svc.events.on('response', (fields: { status: unknown }) => {
      if (fields.status === 'aborted' && ++aborted === held.length) resolve();
    });
  });
  for (const c of held) c.sock.destroy();
  await allAborted;
  const again: RawClient[] = [];
  for (let i = 0; i < 30; i++) {
    const c = new RawClient(t, svc.url);
    await c.write(head('POST', `${API}/initialize-session`, `${auth}Content-Length: 2\r\nExpect: 100-continue\r\n`));
    await c.until(() => c.text.startsWith('HTTP/1.1 100'), '100 Continue');
    again.push(c);
  }
  t.equal((await call(svc.url, 'GET', `${API}/entities`)).status, 503, 'with 30 held again, the 31st is turned away');
  // uWS answers `100 Continue` to a refused request too, its 503 right after: the held ones' answers tell.
  const answers: number[] = [];
  for (const c of again) {
    await c.write('{}');
    answers.push((await c.response()).status);
  }
  t.notOk(answers.includes(503), `aborted requests released their slots: 30 were held again (${answers.join(' ')})`);
});

t.test('slow-loris: a body that does not progress is cut off with 408', async (t) => {
  const svc = await startService(t, { limits: { bodyRateWindowMs: 800, minBodyBytesPerSecond: 1280 } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;

  await t.test('nothing after the headers (buffered route)', async (t) => {
    const raw = new RawClient(t, svc.url);
    await raw.write(head('POST', `${API}/initialize-session`, `${auth}Content-Length: 100\r\n`));
    const res = await raw.response();
    t.same([res.status, JSON.parse(res.body)], [408, { detail: 'Request timeout' }], 'cut at the idle timeout (the request timeout is 600 s)');
    await raw.closedByServer();
  });

  await t.test('one byte every 50 ms on ingest (streaming route)', async (t) => {
    const raw = new RawClient(t, svc.url);
    await raw.write(head('POST', `${API}/${uuid}/products`, `${auth}Content-Type: application/json\r\nContent-Length: 100000\r\n`));
    const body = JSON.stringify(products(5000));
    // Real time against the edge's real window timer: 20 B/s, below the 1280 B/s asked for.
    let sent = 0;
    for (; sent < 200 && !raw.closed && !parseResponse(raw.text); sent++) {
      await raw.write(body[sent]!);
      await delay(50);
    }
    const res = await raw.response();
    t.same([res.status, JSON.parse(res.body)], [408, { detail: 'Request timeout' }], 'a trickle is not progress');
    t.ok(sent < 200, `cut while still trickling (after ${sent} bytes), not after the trickle ended`);
    await raw.closedByServer();
  });

  await t.test('a slow body that keeps progressing is not cut off', async (t) => {
    const raw = new RawClient(t, svc.url);
    const body = JSON.stringify(products(400));
    t.ok(body.length > 8 * 1024, 'several idle windows long');
    await raw.write(head('POST', `${API}/${uuid}/products`, `${auth}Content-Type: application/json\r\nContent-Length: ${body.length}\r\n`));
    // 1 KiB every 100 ms: an idle window (800 ms) sees 1 KiB of progress with a wide margin.
    for (let at = 0; at < body.length; at += 1024) {
      await raw.write(body.slice(at, at + 1024));
      if (at + 1024 < body.length) await delay(100);
    }
    const res = await raw.response();
    t.same([res.status, JSON.parse(res.body).rows_processed], [200, 400]);
  });

  const st = await waitForStatus(svc, uuid, (b) => b.upload_tasks_finished);
  t.same(st.entities, ['products'], 'only the complete package counted');
});

t.test('request timeout: 408 while the handler is still running, connection closed', async (t) => {
  const connector = await fakeConnector(t);
  const svc = await startService(t, { connector: { url: connector.url } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  t.equal((await c.ingest(uuid, 'products', products(3))).status, 200);
  await waitForStatus(svc, uuid, (b) => b.can_start_upload);

  // The Connector now never answers; its deadline (1.5 s) is beyond the request timeout (0.3 s).
  connector.script(() => {});
  await svc.restart({ limits: { requestTimeoutMs: 300 }, connector: { timeoutMs: 1500 } });
  const raw = new RawClient(t, svc.url);
  const body = JSON.stringify({ date_from: '2020-01-01', date_to: yesterday() });
  await raw.write(head('POST', `${API}/${uuid}/start-upload`, `${auth}Content-Type: application/json\r\nContent-Length: ${body.length}\r\n`) + body);
  const res = await raw.response();
  t.same([res.status, JSON.parse(res.body)], [408, { detail: 'Request timeout' }], 'answered by the request timeout, not by the Connector deadline (a 502)');
  t.equal(connector.requests.length, 1, 'the handler was waiting on the Connector');
  await raw.closedByServer();
  t.pass('the server closed the connection');
});

t.test('413 on chunked bodies: cut off at the limit, the rest is never read', async (t) => {
  const svc = await startService(t, { limits: { ingestBodyBytes: 64 * 1024, otherBodyBytes: 1024 } });
  const uuid = (await clientOf(svc).init()).body.upload_uuid;
  const chunk = Buffer.alloc(16 * 1024, 0x20);
  const framed = Buffer.concat([Buffer.from(`${chunk.length.toString(16)}\r\n`), chunk, Buffer.from('\r\n')]);
  const offered = 64 * 1024 * 1024;

  for (const [name, path, limit] of [
    ['buffered route (1 KiB limit)', `${API}/${uuid}/start-upload`, '1024 bytes'],
    ['ingest (64 KiB limit)', `${API}/${uuid}/products`, '65536 bytes'],
  ] as const) {
    await t.test(name, async (t) => {
      const raw = new RawClient(t, svc.url);
      await raw.write(head('POST', path, `${auth}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n`));
      let written = 0;
      while (written < offered && !raw.closed) {
        await raw.write(framed);
        written += chunk.length;
      }
      await raw.closedByServer();
      const res = parseResponse(raw.text);
      t.same([res?.status, res && JSON.parse(res.body)], [413, { detail: `Request body too large (limit ${limit})` }]);
      t.ok(written < offered / 4, `the server stopped reading: ${written} of ${offered} bytes went out before the close`);
    });
  }
  const st = await waitForStatus(svc, uuid, (b) => b.upload_tasks_finished);
  t.same(st.entities, [], 'nothing stored');
});

t.test("one client's slow bodies hold at most its share of the pool: another client's ingests go through", async (t) => {
  // 1 worker + 3 queued = 4 open ingests; a client may hold 2 of them.
  const svc = await startService(t, { ingest: { workers: 1, maxQueue: 3, clientShare: 0.5 }, limits: { requestsPerSecond: 0, concurrentPerClient: 0 } });
  const demo = clientOf(svc);
  const other = clientOf(svc, DEMO2);
  const uuid = (await demo.init()).body.upload_uuid as string;
  const otherUuid = (await other.init()).body.upload_uuid as string;
  const openIngests = async () => Number(/^ingest_requests_open(?:\{[^}]*\})? (\d+)$/m.exec((await call(svc.url, 'GET', '/metrics', { client: null })).text)?.[1]);

  // Two bodies that trickle: headers and a few bytes of a declared 100 kB, then nothing.
  const trickles: RawClient[] = [];
  for (let i = 0; i < 2; i++) {
    const raw = new RawClient(t, svc.url);
    await raw.write(head('POST', `${API}/${uuid}/products`, `${auth}Content-Type: application/json\r\nContent-Length: 100000\r\n`));
    await raw.write('{"columns":["product_id","name","unit"],"data":[');
    trickles.push(raw);
  }
  for (let n = await openIngests(); n < 2; n = await openIngests()) await new Promise((resolve) => setImmediate(resolve));

  const third = await demo.ingest(uuid, 'products', products(3));
  t.same([third.status, third.body, third.headers['retry-after']], [503, { detail: 'Rate limit exceeded' }, '1'], "past its share: demo's third ingest is turned away");
  for (let i = 0; i < 3; i++) {
    const res = await other.ingest(otherUuid, 'products', products(3));
    t.equal(res.status, 200, `demo-2's ingest ${i + 1} goes through beside them`);
  }
});


t.test('buffered bodies: all requests together hold at most limits.bufferedBodyBytes; one past it answers 503, and the bytes come back', async (t) => {
  // A start-upload whose Connector call the test holds keeps its 4,000-byte body until answered.
  const fake = await fakeConnector(t);
  let reached: () => void = () => {};
  const atConnector = new Promise<void>((r) => (reached = r));
  let answer: () => void = () => {};
  fake.script((_req, _body, res) => {
    answer = () => res.writeHead(200, { 'content-type': 'application/json' }).end('{"workflow_id":"wf-held"}');
    reached();
  });
  const svc = await startService(t, { connector: { url: fake.url }, limits: { otherBodyBytes: 8192, bufferedBodyBytes: 6000 } });
  t.equal(svc.config.limits.bufferedBodyBytes, 6000);
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid;
  t.equal((await c.ingest(uuid, 'products', products(2))).status, 200);
  await waitForStatus(svc, uuid, (b) => b.can_start_upload);

  const padded = (text: string) => text.padEnd(4000, ' ');
  const start = call(svc.url, 'POST', `${API}/${uuid}/start-upload`, { raw: padded(JSON.stringify({ date_from: '2024-01-01', date_to: yesterday() })) });
  await atConnector;
  // The webhook's body is read before its signature is checked: with the start's body held, it is one too many.
  const webhook = padded(JSON.stringify({ upload_uuid: uuid, is_terminated: false }));
  const over = await call(svc.url, 'POST', `${API}/webhooks/upload-finished`, { client: null, raw: webhook });
  t.same([over.status, over.body, over.headers['retry-after']], [503, { detail: 'Rate limit exceeded' }, '1'], 'turned away, not read whole');
  const small = await call(svc.url, 'POST', `${API}/webhooks/upload-finished`, { client: null, raw: '{}' });
  t.equal(small.status, 401, 'a body within what is left is read and answered');

  answer();
  t.equal((await start).status, 200, 'the held request completes');
  const again = await call(svc.url, 'POST', `${API}/webhooks/upload-finished`, { client: null, raw: webhook });
  t.equal(again.status, 401, 'once answered, its bytes are given back: the same body is read and answered');
});
