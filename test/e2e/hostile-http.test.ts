/**
 * Hostile HTTP at the edge (issue 11's framing, header, path and proxy findings), over raw
 * TCP on loopback, run on each edge (test/matrix.ts runs it on `node:http` too):
 * - ambiguous framing (RFC 9112 §6.3) answers 400 and closes the connection, so nothing
 *   smuggled behind the body is ever served;
 * - a head of 49+ fields answers 431, HTTP/1.0 is served, HTTP/1.1 without `Host` is 400;
 * - an empty path segment or a trailing slash is 404, and counted by the rate limit;
 * - a credential or idempotency header sent twice is refused; the `Bearer` scheme is
 *   case-insensitive; `X-Forwarded-For` lines from a trusted proxy are merged, a malformed or
 *   zoned right-most entry refused;
 * - an answer to `HEAD` has no body, so the next answer on the connection is read whole;
 * - a request pipelined behind a body waits for that body's answer (node edge);
 * - a slow body is timed by the edge's body-rate window alone (408), on uWS too.
 * What the uWS build's parser never hands to JavaScript (HTTP/1.0, no `Host`, 49+ fields, a
 * request pipelined behind another) is tried on the node edge only: those are that build's
 * documented limits (docs/reliability.md, "Hostile input").
 */
import { createHash } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { FAULTY_WORKER, HOLD_MARKER, holdChannel } from '../support/faulty-worker.js';
import { API, call, clientOf, DEMO, products, startService, tempDir, waitForStatus } from '../support/harness.js';
import { startInProcess } from '../support/in-process.js';
import { auth, head, parseResponses, RawClient } from '../support/raw-http.js';

const json = (text: string) => JSON.parse(text) as unknown;

/** Sends `bytes` on a fresh connection and returns every answer once the server has closed it. */
async function exchange(t: Test, url: string, bytes: string): Promise<{ answers: { status: number; body: unknown }[]; raw: string }> {
  const c = new RawClient(t, url);
  await c.write(bytes);
  await c.closedByServer(15_000);
  return { answers: parseResponses(c.text).map((r) => ({ status: r.status, body: r.body ? json(r.body) : null })), raw: c.text };
}

t.test('ambiguous framing: 400 and the connection closed; what was smuggled behind is never served', async (t) => {
  const svc = await startService(t);
  const uuid = (await clientOf(svc).init()).body.upload_uuid as string;
  const status = `GET ${API}/${uuid}/status HTTP/1.1\r\nHost: test\r\n${auth}\r\n`;
  const webhook = (framing: string, body: string) => `POST ${API}/webhooks/upload-finished HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n${framing}\r\n${body}`;
  const invalidLength = { detail: 'Invalid Content-Length header' };
  const invalidCoding = { detail: 'Invalid Transfer-Encoding header: only chunked is accepted' };
  const both = { detail: 'Content-Length and Transfer-Encoding together' };
  const chunked = (text: string) => `${text.length.toString(16)}\r\n${text}\r\n0\r\n\r\n`;
  const cases: [string, string, string, unknown][] = [
    // The probe: framed by the first length, the rest ran as an authenticated request.
    ['two different Content-Length', `Content-Length: 2\r\nContent-Length: ${2 + status.length}\r\n`, '{}', invalidLength],
    ['two equal Content-Length', 'Content-Length: 2\r\nContent-Length: 2\r\n', '{}', invalidLength],
    ['Content-Length: 2, 2', 'Content-Length: 2, 2\r\n', '{}', invalidLength],
    ['Transfer-Encoding and Content-Length', 'Transfer-Encoding: chunked\r\nContent-Length: 7\r\n', chunked('{}'), both],
    ...['xchunked', 'gzip', 'identity', 'chunked, identity', 'gzip, chunked', 'chunked, chunked'].map(
      (coding): [string, string, string, unknown] => [`Transfer-Encoding: ${coding}`, `Transfer-Encoding: ${coding}\r\n`, chunked('{}'), invalidCoding],
    ),
    ['Transfer-Encoding on two lines', 'Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n', chunked('{}'), invalidCoding],
  ];
  // uWS's own parser gives up on these after the route callback, and closes without the answer.
  const uwsDrops = new Set(['Content-Length: 2, 2', 'Transfer-Encoding and Content-Length']);
  for (const [name, framing, body, detail] of cases) {
    const alone = await exchange(t, svc.url, webhook(framing, body));
    const dropped = svc.app.edge === 'uws' && uwsDrops.has(name);
    t.same(alone.answers, dropped ? [] : [{ status: 400, body: detail }], `${name}: ${dropped ? 'dropped by uWS' : '400'}, then closed`);
    const smuggling = await exchange(t, svc.url, webhook(framing, body + status));
    t.same(smuggling.answers.filter((a) => a.status !== 400), [], `${name}, a request behind: never served`);
    // uWS parses on past the head before the core can close: it drops the connection unanswered.
    if (svc.app.edge === 'node') t.same(smuggling.answers, [{ status: 400, body: detail }], `${name}, a request behind: 400, then closed`);
  }
  const ok = await exchange(t, svc.url, webhook('Transfer-Encoding: chunked\r\nConnection: close\r\n', chunked('{"upload_uuid":"x","is_terminated":false}')));
  t.same(ok.answers.map((a) => a.status), [401], 'plain chunked is read (the unsigned webhook answers 401)');
});

t.test('header count, Host, version', async (t) => {
  const svc = await startService(t);
  const fields = (n: number) => Array.from({ length: n }, (_, i) => `X-Field-${i}: ${i}\r\n`).join('');
  // With Host and Connection, 46 more make 48 fields: the most a request may carry.
  const most = await exchange(t, svc.url, `GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n${fields(46)}\r\n`);
  t.same(most.answers, [{ status: 200, body: { status: 'ok' } }], '48 header fields are served');
  const twoHosts = await exchange(t, svc.url, 'GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n');
  t.same(twoHosts.answers, [{ status: 400, body: { detail: 'Missing or repeated Host header' } }], 'two Host lines: 400');

  if (svc.app.edge !== 'node') return;
  const many = await exchange(t, svc.url, `GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n${fields(47)}\r\n`);
  t.same(many.answers, [{ status: 431, body: { detail: 'Request header fields too large' } }], '49 header fields: 431');
  const huge = await exchange(t, svc.url, `GET /healthz HTTP/1.1\r\nHost: test\r\nX-Big: ${'x'.repeat(20_000)}\r\n\r\n`);
  t.same(huge.answers, [{ status: 431, body: { detail: 'Request header fields too large' } }], 'a 20 KB header: 431');
  const noHost = await exchange(t, svc.url, 'GET /healthz HTTP/1.1\r\n\r\n');
  t.same(noHost.answers, [{ status: 400, body: { detail: 'Missing or repeated Host header' } }], 'HTTP/1.1 without Host: 400');
  const old = await exchange(t, svc.url, 'GET /healthz HTTP/1.0\r\n\r\n');
  t.same(old.answers, [{ status: 200, body: { status: 'ok' } }], 'HTTP/1.0 without Host: served, then closed');
  t.match(old.raw, /^HTTP\/1\.1 200 /, 'answered as HTTP/1.1 (RFC 9110 §2.5)');
  const oldChunked = await exchange(t, svc.url, `POST ${API}/webhooks/upload-finished HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n`);
  t.same(oldChunked.answers.map((a) => a.status), [400], 'HTTP/1.0 with Transfer-Encoding: 400');
  for (const [name, line] of [
    ['a bare LF', 'GET /healthz HTTP/1.1\nHost: test\n\n'],
    ['a space after the version', 'GET /healthz HTTP/1.1 \r\nHost: test\r\n\r\n'],
  ]) {
    const malformed = await exchange(t, svc.url, line!);
    t.same(malformed.answers, [{ status: 400, body: { detail: 'Malformed HTTP request' } }], `an HTTP/1.1 request line ended by ${name}: 400, not 505`);
  }
  const future = await exchange(t, svc.url, 'GET /healthz HTTP/1.7\r\nHost: test\r\n\r\n');
  t.equal(future.answers.length, 1, 'an unknown version is answered');
  t.ok([400, 505].includes(future.answers[0]?.status ?? 0), `an unknown version: ${future.answers[0]?.status}`);
  const silent = new RawClient(t, svc.url);
  await silent.write('GET /healthz HTTP/1.1\r\nHost: test\r\n');
  const timedOut = await silent.response(20_000);
  t.same([timedOut.status, json(timedOut.body)], [408, { detail: 'Request timeout' }], 'a head never finished: 408 (not a silent close)');
  await silent.closedByServer();
});

t.test('paths are matched as sent: empty segments and trailing slashes are 404 and rate-limited', async (t) => {
  const svc = await startService(t, { limits: { requestsPerSecond: 0.2, burst: 5 } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid as string;
  const variants = [`/${API}/${uuid}/status`, `${API}//${uuid}/status`, `${API}/${uuid}/status/`, `/api//v1/uploading/${uuid}/status`];
  for (const path of variants) {
    const res = await call(svc.url, 'GET', path);
    t.same([res.status, res.body], [404, { detail: 'Not Found' }], `${path.replace(uuid, '<uuid>')}: 404`);
  }
  // init + 4 variants took the 5 tokens of the burst: the next ones are limited, whichever spelling.
  for (const path of [`/${API}/${uuid}/status`, `/%61pi/v1/uploading/${uuid}/status`, `${API}/${uuid}/status`]) {
    const res = await call(svc.url, 'GET', path);
    t.same([res.status, res.body], [503, { detail: 'Rate limit exceeded' }], `${path.replace(uuid, '<uuid>')}: counted by the rate limit`);
  }
});

t.test('an answer to HEAD has no body: the next answer on the connection starts right after its head', async (t) => {
  const svc = await startService(t);
  const c = new RawClient(t, svc.url);
  await c.write(head('HEAD', '/healthz') + head('GET', '/healthz', 'Connection: close\r\n'));
  await c.closedByServer(15_000);
  const raw = c.text;
  const end = raw.indexOf('\r\n\r\n') + 4;
  t.match(raw.slice(0, end), /^HTTP\/1\.1 405 Method Not Allowed\r\n/, 'HEAD: the head of a 405 (no route takes HEAD)');
  const next = parseResponses(raw.slice(end));
  t.same(
    next.map((r) => [r.status, json(r.body)]),
    [[200, { status: 'ok' }]],
    'then the GET, nothing between',
  );
});

t.test('an expectation other than 100-continue is served like any request, in the contract\'s shape', async (t) => {
  const svc = await startService(t);
  const { answers, raw } = await exchange(t, svc.url, head('POST', `${API}/webhooks/upload-finished`, 'Expect: something-else\r\nContent-Length: 2\r\nConnection: close\r\n') + '{}');
  t.same(answers, [{ status: 401, body: { detail: 'Invalid webhook signature' } }], 'the webhook answers (401 unsigned), not a bare 417');
  t.match(raw, /\r\nX-Request-Id: /i, 'with an X-Request-Id');
});

t.test('a request that asks for Connection: close is answered, whatever the client sends after it', async (t) => {
  const svc = await startService(t);
  // uWS serves the request behind too and keeps the connection to its idle timeout: a limit of that build.
  if (svc.app.edge !== 'node') return;
  const { answers } = await exchange(t, svc.url, head('GET', '/healthz', 'Connection: close\r\n') + head('GET', '/healthz'));
  t.same(answers, [{ status: 200, body: { status: 'ok' } }], 'the request with close: answered; the one behind it never served (RFC 9112 §9.6)');
});

t.test('a chunked body whose framing breaks mid-way: 400, closed, nothing stored', async (t) => {
  const svc = await startService(t);
  // uWS's parser drops such a connection itself, unanswered.
  if (svc.app.edge !== 'node') return;
  const uuid = (await clientOf(svc).init()).body.upload_uuid as string;
  for (const [name, path, lines] of [
    ['the webhook', `${API}/webhooks/upload-finished`, ''],
    ['an ingest', `${API}/${uuid}/products`, auth],
  ] as const) {
    const { answers } = await exchange(t, svc.url, head('POST', path, `${lines}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n`) + '2\r\n{"\r\nzz\r\n');
    t.same(answers, [{ status: 400, body: { detail: 'Malformed HTTP request' } }], `${name}, a bad chunk size: 400`);
  }
  const st = await waitForStatus(svc, uuid, (b) => b.upload_tasks_finished);
  t.same(st.entities, [], 'nothing stored');
});

t.test('CONNECT is answered like any method no route takes, not dropped', async (t) => {
  const svc = await startService(t);
  const { answers, raw } = await exchange(t, svc.url, head('CONNECT', '/healthz', 'Connection: close\r\n'));
  t.same(answers, [{ status: 405, body: { detail: 'Method Not Allowed' } }], 'CONNECT /healthz: 405, then closed');
  t.match(raw, /\r\nX-Request-Id: /i, 'with an X-Request-Id');
});

t.test('credentials: the Bearer scheme in any case; a header sent twice is refused', async (t) => {
  const svc = await startService(t);
  for (const scheme of ['Bearer', 'bearer', 'BEARER', 'bEaReR']) {
    const res = await call(svc.url, 'GET', `${API}/entities`, { client: null, headers: { authorization: `${scheme} ${DEMO.token}`, 'client-id': DEMO.id } });
    t.equal(res.status, 200, `Authorization: ${scheme} <token>`);
  }
  const uuid = (await clientOf(svc).init()).body.upload_uuid as string;
  const twice: [string, string, string][] = [
    ['Authorization', `Authorization: ${DEMO.token}\r\nAuthorization: nope\r\nClient-Id: ${DEMO.id}\r\n`, 'Duplicate Authorization header'],
    ['Client-Id', `Authorization: ${DEMO.token}\r\nClient-Id: ${DEMO.id}\r\nClient-Id: demo-2\r\n`, 'Duplicate Client-Id header'],
    ['Idempotency-Key', `${auth}Idempotency-Key: a\r\nIdempotency-Key: b\r\n`, 'Duplicate Idempotency-Key header'],
  ];
  for (const [name, lines, detail] of twice) {
    const { answers } = await exchange(t, svc.url, head('GET', `${API}/${uuid}/status`, `${lines}Connection: close\r\n`));
    t.same(answers, [{ status: 400, body: { detail } }], `${name} twice: 400`);
  }
});

t.test('X-Forwarded-For from a trusted proxy: lines merged, a malformed right-most entry refused', async (t) => {
  const dir = await tempDir(t);
  const clientsFile = join(dir, 'clients.json');
  const sha = (s: string) => createHash('sha256').update(s).digest('hex');
  await writeFile(clientsFile, JSON.stringify({ clients: [{ client_id: 'far', token_sha256: sha('far-token'), allowed_ips: ['198.51.100.0/24', 'fe80::/10'], min_date: '2023-01-01' }] }));
  const svc = await startService(t, { clientsFile, trustedProxies: ['127.0.0.1'] });
  const creds = 'Authorization: far-token\r\nClient-Id: far\r\nConnection: close\r\n';
  const ask = async (xff: string) => (await exchange(t, svc.url, head('GET', `${API}/entities`, `${creds}${xff}`))).answers;
  t.same((await ask('X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-For: 198.51.100.7\r\n')).map((a) => a.status), [200], 'two lines: the right-most entry of the last line is the client');
  t.same((await ask('X-Forwarded-For: 198.51.100.7\r\nX-Forwarded-For: 203.0.113.9\r\n')).map((a) => a.status), [403], 'and not the first line');
  const refused = [{ status: 400, body: { detail: 'Invalid X-Forwarded-For header' } }];
  for (const xff of ['198.51.100.7, nonsense', '198.51.100.7, ', 'fe80::1%eth0', '198.51.100.7:443', 'unknown']) {
    t.same(await ask(`X-Forwarded-For: ${xff}\r\n`), refused, `right-most entry ${JSON.stringify(xff)}: refused, not the proxy's address`);
  }
  t.same((await ask('X-Forwarded-For: nonsense, 198.51.100.7\r\n')).map((a) => a.status), [200], 'a malformed entry left of the client is never read');
});

t.test('a request pipelined behind a body waits for that body to be answered', async (t) => {
  const svc = await startInProcess(t, { limits: { requestsPerSecond: 0 } }, { validationWorker: FAULTY_WORKER });
  // The uWS build drops a connection on which a request arrives before the previous answer;
  // holding the socket paused would hide a client that went away (see uws-edge.ts).
  if (svc.app.edge !== 'node') return;
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid as string;
  const channel = new BroadcastChannel(holdChannel());
  t.teardown(() => channel.close());
  const ingest = (rows: unknown[][]) => {
    const body = JSON.stringify({ columns: ['product_id', 'name'], data: rows });
    return head('POST', `${API}/${uuid}/products`, `${auth}Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n`) + body;
  };
  const next = head('GET', '/healthz', 'Connection: close\r\n');

  // The held row's task runs only after the whole body was read: the server is then answering
  // the ingest when the next request arrives.
  const raw = new RawClient(t, svc.url);
  const running = new Promise<void>((resolve) => (channel.onmessage = (e) => (e as MessageEvent).data === 'running' && resolve()));
  await raw.write(ingest([['p1', HOLD_MARKER], ['p2', 'Tea']]));
  await running;
  await raw.write(next);
  channel.postMessage('release');
  await raw.closedByServer();
  t.same(
    parseResponses(raw.text).map((r) => [r.status, json(r.body)]),
    [
      [200, { status: 'success', message: '2 rows of products validated and queued for storage', rows_processed: 2 }],
      [200, { status: 'ok' }],
    ],
    'the ingest answered, then the pipelined request',
  );

  // In the same write as the body's last bytes.
  const same = new RawClient(t, svc.url);
  await same.write(ingest([['p3', 'Milk']]) + next);
  await same.closedByServer();
  t.same(parseResponses(same.text).map((r) => r.status), [200, 200], 'one write: both answered');
  const st = await waitForStatus(svc, uuid, (s) => s.upload_tasks_finished);
  t.same(st.entities, ['products']);
});

t.test("a slow body is timed by the edge's body-rate window alone", async (t) => {
  // 100 B/s is far below what uWS's own timer wants (160 KiB per 10 s), above the configured rate.
  const svc = await startService(t, { limits: { bodyRateWindowMs: 2_000, minBodyBytesPerSecond: 40 } });
  const uuid = (await clientOf(svc).init()).body.upload_uuid as string;
  const body = JSON.stringify(products(60));
  t.ok(body.length > 1_400, `the body (${body.length} bytes) takes more than 14 s at 100 B/s`);
  const raw = new RawClient(t, svc.url);
  await raw.write(head('POST', `${API}/${uuid}/products`, `${auth}Content-Type: application/json\r\nContent-Length: ${body.length}\r\n`));
  for (let at = 0; at < body.length && !raw.closed; at += 50) {
    await raw.write(body.slice(at, at + 50));
    if (at + 50 < body.length) await new Promise((r) => setTimeout(r, 500));
  }
  const res = await raw.response();
  t.same([res.status, json(res.body)], [200, { status: 'success', message: '60 rows of products validated and queued for storage', rows_processed: 60 }], 'a slow body above the configured rate completes');

  // A stalled body: the edge's window (2 s) answers it; the request timeout (600 s) lies far beyond the 5 s `response()` waits.
  const stalled = new RawClient(t, svc.url);
  await stalled.write(head('POST', `${API}/${uuid}/products`, `${auth}Content-Type: application/json\r\nContent-Length: 100000\r\n`) + body.slice(0, 60));
  const cut = await stalled.response();
  t.same([cut.status, json(cut.body)], [408, { detail: 'Request timeout' }], 'a body that stops is answered 408 at the end of the window it fell short in');
  await stalled.closedByServer();
});
