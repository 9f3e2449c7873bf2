/**
 * The deployment as shipped: nginx on config/nginx/ (testbed/nginx.ts) in front of a gateway
 * process with `limits.perIpAtProxy` and the proxy as its trusted proxy, on the uWS edge
 * where it loads (the edge that needs the proxy most; test/matrix.ts runs it on node too). What the proxy answers itself (no
 * `X-Request-Id`: the gateway sets one on every answer) comes in the service's JSON shape.
 */
import { createHash } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import t, { type Test } from 'tap';
import type { Config, DeepPartial } from '../../src/config/config.js';
import { uwsLoads } from '../../src/http/engine.js';
import { HTTP_ENGINE } from '../../testbed/env.js';
import { freePorts } from '../../testbed/nats.js';
import { startProxy } from '../../testbed/nginx.js';
import { spawnGateway } from '../../testbed/processes.js';
import { API, call, clientOf, products, tempDir, waitForStatus } from '../support/harness.js';
import { auth, head, parseResponses, RawClient } from '../support/raw-http.js';

/** `TEST_HTTP_ENGINE` (test/matrix.ts runs this file on node), else uWS where it loads. */
const ENGINE = HTTP_ENGINE ?? (uwsLoads() ? 'uws' : 'node');
const json = (text: string) => (text ? (JSON.parse(text) as unknown) : null);
const MiB = 1024 * 1024;

async function deployed(t: Test, config: DeepPartial<Config> = {}) {
  const gw = await spawnGateway(t, {
    http: { engine: ENGINE },
    trustedProxies: ['127.0.0.1'],
    ...config,
    limits: { perIpAtProxy: true, ...config.limits },
    connector: { emulatorDelayMs: 50 },
  });
  const proxy = await startProxy(t, gw.url);
  return { gw, proxy };
}

/** The gateway's `ingest_requests_open` (asked of the gateway itself, not through the proxy). */
async function openIngests(gatewayUrl: string): Promise<number> {
  const res = await call(gatewayUrl, 'GET', '/metrics', { client: null });
  return Number(/^ingest_requests_open (\d+)/m.exec(res.text)?.[1] ?? NaN);
}

/** Requests the gateway has answered, but those of /metrics (asked of the gateway itself). */
async function gatewayRequests(gatewayUrl: string): Promise<number> {
  const res = await call(gatewayUrl, 'GET', '/metrics', { client: null });
  let n = 0;
  for (const m of res.text.matchAll(/^ingest_http_requests_total\{([^}]*)\} (\d+)/gm)) if (!m[1]!.includes('/metrics')) n += Number(m[2]);
  return n;
}

/**
 * Waits, polling the gateway's metrics, until `n` ingest requests are open there: requests
 * opening (a gauge) are no state write of the gateway, which no `change` tells.
 */
async function untilOpenIngests(gatewayUrl: string, n: number, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const open = await openIngests(gatewayUrl);
    if (open === n) return;
    if (Date.now() > deadline) throw new Error(`the gateway has ${open} ingest requests open, never ${n}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** Sends `bytes` on a fresh connection and returns every answer once the server has closed it. */
async function exchange(t: Test, url: string, bytes: string, timeoutMs = 15_000) {
  const c = new RawClient(t, url);
  await c.write(bytes);
  await c.closedByServer(timeoutMs);
  return { answers: parseResponses(c.text).map((r) => ({ status: r.status, body: json(r.body) })), raw: c.text, responses: parseResponses(c.text) };
}

/** A request from the loopback address `localAddress` (127.0.0.0/8 is all this host's). */
function from(url: string, localAddress: string, path: string, headers: Record<string, string>): Promise<{ status: number; headers: Record<string, unknown>; body: unknown }> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: hostname, port, path, localAddress, headers, agent: false }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (text += d));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: json(text) }));
    });
    req.on('error', reject);
    req.end();
  });
}

t.test('limits answered by the proxy: 413 at 1 MiB and 32 MiB, 503 past the rate, in JSON', async (t) => {
  const { gw, proxy } = await deployed(t);
  const uuid = (await clientOf(proxy).init()).body.upload_uuid as string;

  const declare = async (path: string, length: number) => {
    const raw = new RawClient(t, proxy.url);
    await raw.write(head('POST', path, `${auth}Content-Type: application/json\r\nContent-Length: ${length}\r\n`));
    return raw.response();
  };
  const cases: [string, string, number, string][] = [
    ['initialize-session', `${API}/initialize-session`, MiB + 1, 'Request body too large (limit 1 MiB)'],
    ['start-upload', `${API}/${uuid}/start-upload`, MiB + 1, 'Request body too large (limit 1 MiB)'],
    ['webhook', `${API}/webhooks/upload-finished`, MiB + 1, 'Request body too large (limit 1 MiB)'],
    ['ingest', `${API}/${uuid}/products`, 32 * MiB + 1, 'Request body too large (limit 32 MiB)'],
  ];
  for (const [name, path, length, detail] of cases) {
    const res = await declare(path, length);
    t.same([res.status, json(res.body)], [413, { detail }], `${name}, ${length} bytes: 413 ${detail}`);
    t.equal(res.headers['content-type'], 'application/json', `${name}: JSON`);
    t.equal(res.headers['x-request-id'], undefined, `${name}: answered by the proxy`);
  }
  // A chunked ingest body declares no length: streamed to the gateway, and cut by the proxy at 32 MiB.
  const chunked = await new Promise<{ status: number; body: unknown; id: unknown }>((resolve, reject) => {
    const { hostname, port } = new URL(proxy.url);
    const req = httpRequest(
      { host: hostname, port, method: 'POST', path: `${API}/${uuid}/products`, agent: false, headers: { authorization: 'demo-token', 'client-id': 'demo', 'content-type': 'application/json', 'transfer-encoding': 'chunked' } },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => (text += d));
        res.on('end', () => resolve({ status: res.statusCode!, body: json(text), id: res.headers['x-request-id'] }));
      },
    );
    req.on('error', reject);
    const row = `["p-1","${'n'.repeat(80)}",1],`;
    const piece = Buffer.from(row.repeat(Math.floor(MiB / row.length)));
    let sent = 0;
    const pump = (): void => {
      while (sent < 34 * MiB) {
        const chunk = sent === 0 ? Buffer.concat([Buffer.from('{"columns":["product_id","name","price"],"data":['), piece]) : piece;
        sent += chunk.length;
        if (!req.write(chunk)) return void req.once('drain', pump);
      }
      req.end('["p-2","n",1]]}');
    };
    pump();
  });
  t.same(chunked, { status: 413, body: { detail: 'Request body too large (limit 32 MiB)' }, id: undefined }, 'a chunked ingest past 32 MiB: 413 from the proxy, mid-stream');
  await untilOpenIngests(gw.url, 0);
  t.pass('and the request it had streamed to the gateway ended there');

  // At the limits the proxy lets bodies through: the gateway answers them (with its X-Request-Id).
  const atLimit = await call(proxy.url, 'POST', `${API}/${uuid}/start-upload`, { raw: Buffer.alloc(MiB, ' '), headers: { 'content-type': 'application/json' } });
  t.equal(atLimit.status, 422, '1 MiB to start-upload: through to the gateway (422, not JSON)');
  t.type(atLimit.headers['x-request-id'], 'string');
  const ingestOver1 = await call(proxy.url, 'POST', `${API}/${uuid}/products`, { raw: Buffer.alloc(MiB + 1, ' '), headers: { 'content-type': 'application/json' } });
  t.same([ingestOver1.status, ingestOver1.body], [422, { detail: 'Invalid JSON format.' }], 'an ingest of 1 MiB + 1: through to the gateway');

  // The rate: a rested client sends 50 at once (burst) plus its first, then 30 a second.
  const started = performance.now();
  const statuses: number[] = [];
  let limited: Awaited<ReturnType<typeof call>> | undefined;
  for (let i = 0; i < 100; i++) {
    const res = await call(proxy.url, 'GET', `${API}/entities`);
    statuses.push(res.status);
    if (res.status !== 200) limited ??= res;
  }
  const seconds = (performance.now() - started) / 1000;
  const passed = statuses.filter((s) => s === 200).length;
  t.same([...new Set(statuses)].sort(), [200, 503], 'only 200 and 503');
  // Requests before this loop (init, the probes above) took from the same bucket.
  t.ok(passed >= 40 && passed <= 52 + Math.ceil(seconds * 30), `${passed} of 100 passed in ${seconds.toFixed(2)} s: the burst of 50 and 30/s`);
  t.same([limited?.status, limited?.body], [503, { detail: 'Rate limit exceeded' }], '503 Rate limit exceeded');
  t.equal(limited?.headers['retry-after'], '1', 'with Retry-After');
  t.equal(limited?.headers['content-type'], 'application/json', 'JSON, not nginx HTML');
  t.equal(limited?.headers['x-request-id'], undefined, 'answered by the proxy');
});

t.test('30 requests at a time per client: the 31st answers 503 at the proxy', async (t) => {
  const { gw, proxy } = await deployed(t);
  const uuid = (await clientOf(proxy).init()).body.upload_uuid as string;
  const body = JSON.stringify(products(100));
  // 30 ingests whose bodies stop one byte short: each is open at the gateway (the proxy streams).
  for (let i = 0; i < 30; i++) {
    const raw = new RawClient(t, proxy.url);
    await raw.write(head('POST', `${API}/${uuid}/products`, `${auth}Content-Type: application/json\r\nContent-Length: ${body.length}\r\n`) + body.slice(0, -1));
  }
  await untilOpenIngests(gw.url, 30);
  const res = await call(proxy.url, 'GET', `${API}/entities`);
  t.same([res.status, res.body, res.headers['retry-after'], res.headers['x-request-id']], [503, { detail: 'Rate limit exceeded' }, '1', undefined], 'the 31st: 503 from the proxy');
  // Every path counts, as at the gateway: else one client's stalled bodies (buffered here, up to
  // 1 MiB each) to /healthz or /docs would hold as many connections and as much memory as it likes.
  for (const path of ['/healthz', '/docs']) {
    const elsewhere = await call(proxy.url, 'POST', path, { client: null, raw: Buffer.from('{}'), headers: { 'content-type': 'application/json' } });
    t.same([elsewhere.status, elsewhere.body], [503, { detail: 'Rate limit exceeded' }], `the 31st, on ${path}: 503 from the proxy`);
  }
  const other = await from(proxy.url, '127.0.0.9', `${API}/entities`, { authorization: 'demo-token', 'client-id': 'demo' });
  t.equal(other.status, 200, 'another address is not held by it');
});

t.test("hostile input through the proxy: every probe the uWS edge leaves unanswered is held", async (t) => {
  const { gw, proxy } = await deployed(t);
  const c = clientOf(proxy);
  const uuid = (await c.init()).body.upload_uuid as string;
  const status = `GET ${API}/${uuid}/status HTTP/1.1\r\nHost: test\r\n${auth}\r\n`;
  const webhook = (framing: string, body: string) => `POST ${API}/webhooks/upload-finished HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n${framing}\r\n${body}`;
  const malformed = { status: 400, body: { detail: 'Malformed HTTP request' } };
  const chunked = (text: string) => `${text.length.toString(16)}\r\n${text}\r\n0\r\n\r\n`;
  const fields = (n: number) => Array.from({ length: n }, (_, i) => `X-Field-${i}: ${i}\r\n`).join('');
  const held: string[] = [];
  const probe = async (name: string, bytes: string, want: unknown[]) => {
    const { answers } = await exchange(t, proxy.url, bytes);
    if (t.same(answers, want, `${name}: ${JSON.stringify(want)}`)) held.push(name);
  };

  await probe('two different Content-Length, a request smuggled behind', webhook(`Content-Length: 2\r\nContent-Length: ${2 + status.length}\r\n`, `{}${status}`), [malformed]);
  await probe('Content-Length: 2, 2, a request behind', webhook('Content-Length: 2, 2\r\n', `{}${status}`), [malformed]);
  await probe('Transfer-Encoding and Content-Length, a request behind', webhook('Transfer-Encoding: chunked\r\nContent-Length: 7\r\n', chunked('{}') + status), [malformed]);
  await probe('HTTP/1.0 without Host', 'GET /healthz HTTP/1.0\r\n\r\n', [{ status: 200, body: { status: 'ok' } }]);
  await probe('HTTP/1.1 without Host', 'GET /healthz HTTP/1.1\r\n\r\n', [malformed]);
  await probe('60 header fields', `GET ${API}/${uuid}/status HTTP/1.1\r\nHost: test\r\n${auth}Connection: close\r\n${fields(60)}\r\n`, [
    {
      status: 200,
      body: {
        upload_uuid: uuid,
        session_status: 'UPLOADING',
        entities: [],
        upload_tasks_finished: true,
        can_upload_entities: true,
        can_start_upload: false,
        can_terminate: false,
        entity_counts: [],
        totals: { packages: 0, rows: 0, bytes: 0, stored_packages: 0 },
      },
    },
  ]);
  await probe('a 20 KB header line', `GET /healthz HTTP/1.1\r\nHost: test\r\nX-Big: ${'x'.repeat(20_000)}\r\n\r\n`, [{ status: 431, body: { detail: 'Request header fields too large' } }]);
  const ingest = JSON.stringify(products(3));
  await probe(
    'a request pipelined right behind an ingest',
    head('POST', `${API}/${uuid}/products`, `${auth}Content-Type: application/json\r\nContent-Length: ${ingest.length}\r\n`) + ingest + head('GET', '/healthz', 'Connection: close\r\n'),
    [
      { status: 200, body: { status: 'success', message: '3 rows of products validated and queued for storage', rows_processed: 3 } },
      { status: 200, body: { status: 'ok' } },
    ],
  );
  // nginx closes a head not finished in client_header_timeout (10 s) without an answer (its
  // 408 is only logged); the gateway never sees it.
  const before = await gatewayRequests(gw.url);
  const silent = new RawClient(t, proxy.url);
  const startedAt = performance.now();
  await silent.write('GET /healthz HTTP/1.1\r\nHost: test\r\n');
  await silent.closedByServer(20_000);
  const seconds = (performance.now() - startedAt) / 1000;
  const unseen = (await gatewayRequests(gw.url)) === before;
  if (t.ok(silent.text === '' && seconds >= 9 && seconds < 14 && unseen, `a head never finished: closed by the proxy after ${seconds.toFixed(1)} s, never sent to the gateway`)) held.push('a head never finished');
  t.equal(held.length, 9, `${held.length} of 9 held`);

  // Beside the nine: what else the proxy refuses itself, in the same shape.
  const twoAuth = await exchange(t, proxy.url, head('GET', `${API}/${uuid}/status`, `Authorization: demo-token\r\nAuthorization: nope\r\nClient-Id: demo\r\n`));
  t.same(twoAuth.answers, [malformed], 'Authorization twice: 400');
  const te = await exchange(t, proxy.url, webhook('Transfer-Encoding: gzip, chunked\r\n', chunked('{}')));
  t.same(te.answers, [{ status: 400, body: { detail: 'Invalid Transfer-Encoding header: only chunked is accepted' } }], 'Transfer-Encoding: gzip, chunked: 400, as the gateway would say it');
  // Refusals of the request line itself, which has no URI yet to redirect to a named location.
  const lineRefusals: [string, string, unknown][] = [
    ['a bad percent-encoding', `GET ${API}/%zz/status HTTP/1.1\r\nHost: test\r\n\r\n`, malformed],
    ['a URI over 8 KiB (414)', `GET /${'a'.repeat(9000)} HTTP/1.1\r\nHost: test\r\n\r\n`, malformed],
    ['HTTP/2.0 in the request line', 'GET /healthz HTTP/2.0\r\nHost: test\r\n\r\n', { status: 505, body: { detail: 'HTTP version not supported' } }],
  ];
  const lines: { headers: Record<string, string> }[] = [];
  for (const [name, bytes, want] of lineRefusals) {
    const refused = await exchange(t, proxy.url, bytes);
    t.same(refused.answers, [want], `${name}: ${JSON.stringify(want)}, not nginx's 500 page`);
    lines.push(...refused.responses);
  }
  // Methods no route takes: nginx's own 405s (CONNECT, TRACE) and the methods the uWS edge
  // cannot parse (it drops the connection: a 503 `Service temporarily unavailable` here, and a
  // failed gateway to nginx) are answered by the proxy, in JSON.
  for (const method of ['FOO', 'PROPFIND', 'TRACE', 'CONNECT']) {
    const refused = await exchange(t, proxy.url, head(method, '/healthz', 'Connection: close\r\n'));
    t.same(refused.answers, [{ status: 405, body: { detail: 'Method Not Allowed' } }], `${method}: 405`);
    lines.push(...refused.responses);
  }
  // A control character in a header sent on: the uWS edge would hold the head ~10 s unanswered
  // (a 503 here, and a failed gateway to nginx); the proxy refuses it, as the node edge does.
  for (const [name, line] of [
    ['Authorization', 'Authorization: a\x01b\r\n'],
    ['Client-Id', 'Client-Id: a\x1fb\r\n'],
  ]) {
    const refused = await exchange(t, proxy.url, head('GET', `${API}/${uuid}/status`, `${line}Connection: close\r\n`));
    t.same(refused.answers, [malformed], `a control character in ${name}: 400, not a 503`);
    lines.push(...refused.responses);
  }
  const page = await exchange(t, proxy.url, head('GET', '/.proxy-error/malformed', 'Connection: close\r\n'));
  t.same(page.answers, [{ status: 404, body: { detail: 'Not Found' } }], 'an error page asked for from outside: 404');
  for (const r of [...twoAuth.responses, ...te.responses, ...lines, ...page.responses]) t.equal(r.headers['content-type'], 'application/json');
  // Asked through the proxy, told by the gateway behind it.
  const st = await waitForStatus({ url: proxy.url, changes: gw.changes }, uuid, (s) => s.upload_tasks_finished);
  t.same(st.entities, ['products'], 'the pipelined ingest was stored');
});

t.test('bodies pass through: gzip, a slow client, and 32 MiB streamed without a temp file', async (t) => {
  const { gw, proxy } = await deployed(t);
  const c = clientOf(proxy);
  const uuid = (await c.init()).body.upload_uuid as string;

  const gz = await call(proxy.url, 'POST', `${API}/${uuid}/products`, { raw: gzipSync(JSON.stringify(products(500))), headers: { 'content-type': 'application/json', 'content-encoding': 'gzip' } });
  t.same([gz.status, gz.body?.rows_processed], [200, 500], 'a gzip body: inflated by the gateway');

  const slowBody = JSON.stringify(products(40, 1000));
  const slow = new RawClient(t, proxy.url);
  await slow.write(head('POST', `${API}/${uuid}/products`, `${auth}Content-Type: application/json\r\nContent-Length: ${slowBody.length}\r\n`));
  const step = Math.ceil(slowBody.length / 5);
  for (let at = 0; at < slowBody.length; at += step) {
    // A client's pace (what is tested), not a synchronisation.
    if (at > 0) await new Promise((r) => setTimeout(r, 300));
    await slow.write(slowBody.slice(at, at + step));
  }
  const slowAnswer = await slow.response();
  t.same([slowAnswer.status, json(slowAnswer.body)], [200, { status: 'success', message: '40 rows of products validated and queued for storage', rows_processed: 40 }], 'a body sent in five pieces over 1.2 s');

  // Just under 32 MiB of rows.
  const row = (i: number) => `["p-${String(i).padStart(9, '0')}","${'n'.repeat(80)}",${i % 100}]`;
  const rowBytes = row(99).length + 1;
  const rows = Math.floor((32 * MiB - 100) / rowBytes);
  const big = Buffer.from(`{"columns":["product_id","name","price"],"data":[${Array.from({ length: rows }, (_, i) => row(i)).join(',')}]}`);
  t.ok(big.length > 31.9 * MiB && big.length <= 32 * MiB, `${(big.length / MiB).toFixed(2)} MiB`);
  const raw = new RawClient(t, proxy.url);
  await raw.write(head('POST', `${API}/${uuid}/products`, `${auth}Content-Type: application/json\r\nContent-Length: ${big.length}\r\n`));
  for (let at = 0; at < big.length - 1; at += MiB) await raw.write(big.subarray(at, Math.min(at + MiB, big.length - 1)));
  // Every byte but the last sent: a proxy that buffers the body has not called the gateway yet.
  await untilOpenIngests(gw.url, 1);
  t.pass('the gateway has the request before the body has ended');
  await raw.write(big.subarray(big.length - 1));
  const answer = await raw.response(120_000);
  t.same([answer.status, json(answer.body)], [200, { status: 'success', message: `${rows} rows of products validated and queued for storage`, rows_processed: rows }], `32 MiB: ${rows} rows`);
  t.notMatch(proxy.output(), /buffered to a temporary file/, 'nginx never buffered a body to a file (it logs each one it does)');
  t.same(await proxy.bodyTempFiles(), [], 'client_body temp is empty');
});

t.test("perIpAtProxy: the client's address from the proxy, a client's own X-Forwarded-For never believed", async (t) => {
  const dir = await tempDir(t);
  const clientsFile = join(dir, 'clients.json');
  const sha = (s: string) => createHash('sha256').update(s).digest('hex');
  await writeFile(clientsFile, JSON.stringify({ clients: [{ client_id: 'near', token_sha256: sha('near-token'), allowed_ips: ['127.0.0.5'], min_date: '2023-01-01' }] }));
  const creds = { authorization: 'near-token', 'client-id': 'near' };
  const { gw, proxy } = await deployed(t, { clientsFile, limits: { requestsPerSecond: 1, burst: 2 } });
  const path = `${API}/entities`;

  t.equal((await from(proxy.url, '127.0.0.5', path, creds)).status, 200, 'from the allowed address, through the proxy: 200');
  const other = await from(proxy.url, '127.0.0.6', path, creds);
  t.same([other.status, other.body], [403, { detail: 'IP address not allowed' }], 'from another address: 403');
  const spoofed = await from(proxy.url, '127.0.0.6', path, { ...creds, 'x-forwarded-for': '127.0.0.5' });
  t.same([spoofed.status, spoofed.body], [403, { detail: 'IP address not allowed' }], 'with a forged X-Forwarded-For naming the allowed address: still 403');
  const direct = await from(gw.url, '127.0.0.6', path, { ...creds, 'x-forwarded-for': '127.0.0.5' });
  t.equal(direct.status, 403, 'the same straight to the gateway (not from the proxy): 403');

  // The gateway's own limit is 1/s, burst 2: through the proxy only the proxy's counts.
  const through: number[] = [];
  for (let i = 0; i < 8; i++) through.push((await from(proxy.url, '127.0.0.5', path, creds)).status);
  t.same(through, Array(8).fill(200), 'through the proxy: the gateway does not limit again');
  const bypass: number[] = [];
  for (let i = 0; i < 3; i++) bypass.push((await from(gw.url, '127.0.0.5', path, creds)).status);
  t.same(bypass, [200, 200, 503], 'a client reaching the gateway without the proxy is limited by the gateway');

  // Control: without perIpAtProxy the gateway limits each client behind the proxy itself.
  const { proxy: proxy2 } = await deployed(t, { clientsFile, limits: { requestsPerSecond: 1, burst: 2, perIpAtProxy: false } });
  const limited: { status: number; id: unknown }[] = [];
  for (let i = 0; i < 3; i++) {
    const res = await from(proxy2.url, '127.0.0.5', path, creds);
    limited.push({ status: res.status, id: typeof res.headers['x-request-id'] });
  }
  t.same(limited, [{ status: 200, id: 'string' }, { status: 200, id: 'string' }, { status: 503, id: 'string' }], 'off: the third is limited by the gateway (its X-Request-Id)');
});

t.test('no gateway behind the proxy: 503 Service temporarily unavailable, never a 502', async (t) => {
  const [closed] = await freePorts(1);
  const proxy = await startProxy(t, `http://127.0.0.1:${closed}`);
  for (const path of ['/healthz', `${API}/entities`]) {
    const res = await call(proxy.url, 'GET', path);
    t.same([res.status, res.body, res.headers['retry-after'], res.headers['content-type']], [503, { detail: 'Service temporarily unavailable' }, '1', 'application/json'], `${path}: 503 in JSON, Retry-After`);
  }
});
