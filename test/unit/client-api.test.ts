/**
 * `IngestClient` against a scripted HTTP server on loopback: what it sends (paths, headers,
 * bodies, gzip, Idempotency-Key), how answers become typed results or `ClientError`s, the
 * deadline of every call, and `ingestWithRetry` keeping one key across attempts.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { gunzipSync } from 'node:zlib';
import t, { type Test } from 'tap';
import { IngestClient } from '../../src/client/client.js';
import { isApiError, isClientError, type ClientError } from '../../src/client/errors.js';

interface Seen {
  method: string;
  url: string;
  headers: IncomingMessage['headers'];
  body: Buffer;
}

type Script = (seen: Seen, res: ServerResponse, n: number) => void;

async function fake(t: Test, script: Script): Promise<{ url: string; seen: Seen[] }> {
  const seen: Seen[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const s = { method: req.method!, url: req.url!, headers: req.headers, body: Buffer.concat(chunks) };
      seen.push(s);
      script(s, res, seen.length - 1);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => {
    server.closeAllConnections();
    return new Promise<void>((r) => server.close(() => r()));
  });
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, seen };
}

const json = (res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) =>
  res.writeHead(status, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(body));

function client(t: Test, baseUrl: string, over: Partial<ConstructorParameters<typeof IngestClient>[0]> = {}): IngestClient {
  const c = new IngestClient({ baseUrl, clientId: 'acme', token: 'tok', requestsPerSecond: 0, ...over });
  t.teardown(() => c.close());
  return c;
}

async function failure(p: Promise<unknown>): Promise<ClientError> {
  try {
    await p;
  } catch (err) {
    if (isClientError(err)) return err;
    throw err;
  }
  throw new Error('expected a ClientError');
}

t.test('every endpoint: method, path under a base path, credentials, typed answer', async (t) => {
  const uuid = '0b6c5e4e-1111-4c1e-8f00-000000000001';
  const srv = await fake(t, (s, res) => {
    if (s.url.endsWith('/initialize-session')) return json(res, 200, { status: 'created', upload_uuid: uuid, message: 'Upload session created' });
    if (s.url.endsWith('/status')) return json(res, 200, { upload_uuid: uuid, session_status: 'UPLOADING', entities: [], extra: 1 });
    if (s.url.endsWith('/start-upload')) return json(res, 200, { workflow_id: 'wf', status: 'started' });
    if (s.url.endsWith('/terminate') || s.url.endsWith('/delete')) return json(res, 200, { status: 'started', message: 'ok' });
    if (s.url.endsWith('/entities')) return json(res, 200, { entities: [] });
    return json(res, 200, { status: 'success', message: '2 rows', rows_processed: 2 }, { 'idempotent-replayed': 'true' });
  });
  const c = client(t, `${srv.url}/gw/`);
  t.same(await c.initialize(), { status: 'created', upload_uuid: uuid, message: 'Upload session created' });
  t.match(await c.status(uuid), { upload_uuid: uuid, session_status: 'UPLOADING', extra: 1 }, 'extra fields pass through');
  t.same(await c.ingest(uuid, 'receipt lines', '{"columns":["a"],"data":[]}', { idempotencyKey: 'k-1' }), {
    status: 'success',
    message: '2 rows',
    rows_processed: 2,
    replayed: true,
  });
  t.same(await c.start(uuid, { date_from: '2024-01-01', date_to: '2024-01-31' }), { workflow_id: 'wf', status: 'started' });
  t.same(await c.terminate(uuid), { status: 'started', message: 'ok' });
  t.same(await c.delete(uuid), { status: 'started', message: 'ok' });
  t.same(await c.entities(), { entities: [] });
  t.same(
    srv.seen.map((s) => `${s.method} ${s.url}`),
    [
      'POST /gw/api/v1/uploading/initialize-session',
      `GET /gw/api/v1/uploading/${uuid}/status`,
      `POST /gw/api/v1/uploading/${uuid}/receipt%20lines`,
      `POST /gw/api/v1/uploading/${uuid}/start-upload`,
      `POST /gw/api/v1/uploading/${uuid}/terminate`,
      `POST /gw/api/v1/uploading/${uuid}/delete`,
      'GET /gw/api/v1/uploading/entities',
    ],
  );
  for (const s of srv.seen) t.match(s.headers, { authorization: 'tok', 'client-id': 'acme' });
  t.match(srv.seen[2]!.headers, { 'content-type': 'application/json', 'idempotency-key': 'k-1' });
  t.notOk(srv.seen[2]!.headers['content-encoding']);
  t.same(JSON.parse(srv.seen[3]!.body.toString()), { date_from: '2024-01-01', date_to: '2024-01-31' });
});

t.test('gzip: compressed here, or sent as already encoded', async (t) => {
  const srv = await fake(t, (_s, res) => json(res, 200, { status: 'success', message: '', rows_processed: 0 }));
  const c = client(t, srv.url);
  const body = JSON.stringify({ columns: ['a'], data: Array.from({ length: 1000 }, () => ['x']) });
  await c.ingest('u', 'e', body, { gzip: true });
  t.equal(srv.seen[0]!.headers['content-encoding'], 'gzip');
  t.ok(srv.seen[0]!.body.length < body.length / 10, 'compressed on the wire');
  t.equal(gunzipSync(srv.seen[0]!.body).toString(), body);
  await c.ingest('u', 'e', srv.seen[0]!.body, { contentEncoding: 'gzip' });
  t.equal(srv.seen[1]!.headers['content-encoding'], 'gzip');
  t.same(srv.seen[1]!.body, srv.seen[0]!.body, 'sent as is');
});

t.test('error answers: ApiError with status, detail as sent, Retry-After', async (t) => {
  const answers: [number, unknown, Record<string, string>][] = [
    [503, { detail: 'Rate limit exceeded' }, { 'retry-after': '2' }],
    [409, { detail: { message: 'Invalid upload session status', expected: 'UPLOADING', actual: 'DONE' } }, {}],
    [422, { detail: [{ type: 'missing', loc: ['body', 'date_from'], msg: 'Field required', input: {} }] }, {}],
    [502, 'Bad Gateway', {}],
  ];
  const srv = await fake(t, (_s, res, n) => {
    const [status, body, headers] = answers[n]!;
    if (typeof body === 'string') res.writeHead(status, headers).end(body);
    else json(res, status, body, headers);
  });
  const c = client(t, srv.url);
  const e1 = await failure(c.status('u'));
  t.ok(isApiError(e1));
  t.match(e1, { name: 'ApiError', code: 'API_ERROR', status: 503, detail: 'Rate limit exceeded', retryAfter: 2, message: '503 Rate limit exceeded' });
  const e2 = await failure(c.delete('u'));
  t.match(e2, { status: 409, detail: { expected: 'UPLOADING', actual: 'DONE' }, retryAfter: null });
  t.equal(e2.message, '409 Invalid upload session status (expected UPLOADING, actual DONE)');
  const e3 = await failure(c.start('u', { date_from: '', date_to: '' }));
  t.equal(e3.message, '422 body.date_from: Field required');
  const e4 = await failure(c.status('u'));
  t.match(e4, { status: 502, detail: 'Bad Gateway' }, 'a body that is not JSON is kept as text');
});

t.test('initialize: a 409 is a result naming the existing session', async (t) => {
  const srv = await fake(t, (_s, res) =>
    json(res, 409, { status: 'already_exists', session_status: 'UPLOADING', upload_uuid: 'u-1', message: 'Upload session already exists' }),
  );
  t.same(await client(t, srv.url).initialize(), { status: 'already_exists', session_status: 'UPLOADING', upload_uuid: 'u-1', message: 'Upload session already exists' });
});

t.test('transport failures: timeout, refused connection, non-JSON 2xx, abort', async (t) => {
  let statusArrived: () => void = () => {};
  const srv = await fake(t, (s, res) => {
    if (s.url.endsWith('/status')) return statusArrived(); // never answers
    res.writeHead(200, { 'content-type': 'text/html' }).end('<html>proxy</html>');
  });
  const c = client(t, srv.url, { timeoutMs: 300 });
  // The server never answers: only the client's deadline ends the call.
  const slow = await failure(c.status('u'));
  t.match(slow, { code: 'TIMEOUT', status: null }, 'the deadline holds');
  t.match(await failure(c.entities()), { code: 'INVALID_RESPONSE', status: 200 });

  const controller = new AbortController();
  const arrived = new Promise<void>((resolve) => (statusArrived = resolve));
  const pending = failure(c.status('u', { signal: controller.signal, timeoutMs: 10_000 }));
  await arrived; // aborted while the request is in the server's hands
  controller.abort();
  t.match(await pending, { code: 'ABORTED' });

  const dead = await new Promise<string>((resolve) => {
    // a port that was listening and no longer is
    const s = createServer();
    s.listen(0, '127.0.0.1', () => {
      const p = (s.address() as AddressInfo).port;
      s.close(() => resolve(`http://127.0.0.1:${p}`));
    });
  });
  t.match(await failure(client(t, dead).status('u')), { code: 'NETWORK' });
});

t.test('ingestWithRetry: one Idempotency-Key across attempts, gzip done once, stops on a 4xx', async (t) => {
  const srv = await fake(t, (s, res, n) => {
    if (s.url.endsWith('/bad')) return json(res, 422, { detail: 'Unknown column: x' });
    if (n === 0) return json(res, 503, { detail: 'Rate limit exceeded' }, { 'retry-after': '1' });
    if (n === 1) return res.destroy(); // the connection drops without an answer
    if (n === 2) return json(res, 409, { detail: 'A request with this Idempotency-Key is in progress' }, { 'retry-after': '0' });
    return json(res, 200, { status: 'success', message: '1 rows', rows_processed: 1 });
  });
  const c = client(t, srv.url);
  const retries: number[] = [];
  const waited: number[] = [];
  const sleep = async (ms: number) => void waited.push(ms);
  const res = await c.ingestWithRetry('u', 'products', '{"columns":["a"],"data":[[1]]}', { gzip: true }, { baseDelayMs: 10, onRetry: (i) => retries.push(i.delayMs), sleep });
  t.equal(res.rows_processed, 1);
  t.equal(srv.seen.length, 4);
  const keys = new Set(srv.seen.map((s) => s.headers['idempotency-key']));
  t.equal(keys.size, 1, 'the same key on every attempt');
  t.match([...keys][0], /^[\x21-\x7e]{1,255}$/);
  t.equal(new Set(srv.seen.map((s) => s.body.toString('base64'))).size, 1, 'the same bytes on every attempt');
  t.ok(retries[0]! >= 1000, 'the first wait honoured Retry-After: 1');
  t.same(waited, retries, 'each retry waited what it announced');

  srv.seen.length = 0;
  t.match(await failure(c.ingestWithRetry('u', 'bad', '{}', { idempotencyKey: 'mine' }, { baseDelayMs: 1 })), { status: 422 });
  t.equal(srv.seen.length, 1, 'a 422 is final');
  t.equal(srv.seen[0]!.headers['idempotency-key'], 'mine', 'a given key is used');
});

t.test('options are checked at construction', async (t) => {
  t.throws(() => new IngestClient({ baseUrl: 'ftp://x', clientId: 'a', token: 'b' }), /baseUrl/);
  t.throws(() => new IngestClient({ baseUrl: 'nope', clientId: 'a', token: 'b' }), /baseUrl/);
  t.throws(() => new IngestClient({ baseUrl: 'http://x', clientId: '', token: 'b' }), /clientId/);
  t.throws(() => new IngestClient({ baseUrl: 'http://x', clientId: 'a', token: 'b', timeoutMs: -1 }), /timeoutMs/);
});
