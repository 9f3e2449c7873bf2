import http from 'node:http';
import type { AddressInfo } from 'node:net';
import t from 'tap';
import { HttpConnector } from '../../src/connector/http-connector.js';
import type { WorkflowStart } from '../../src/connector/types.js';
import { isServiceError, type ServiceError } from '../../src/errors.js';

type Test = Pick<typeof t, 'teardown'>;

interface Seen {
  method: string | undefined;
  url: string | undefined;
  headers: http.IncomingHttpHeaders;
  body: string;
  clientPort: number | undefined;
}

/** What the fake Connector answers; `null` never answers. */
type Answer = { status: number; body?: string; type?: string; headers?: Record<string, string> } | null;

/** A scripted fake Connector: a real HTTP server on port 0 answering each request from `answer`. */
async function fakeConnector(t: Test, answer: (seen: Seen) => Answer): Promise<{ url: string; seen: Seen[] }> {
  const seen: Seen[] = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const s = { method: req.method, url: req.url, headers: req.headers, body: Buffer.concat(chunks).toString(), clientPort: req.socket.remotePort };
      seen.push(s);
      const a = answer(s);
      if (a === null) return;
      res.writeHead(a.status, { ...a.headers, ...(a.type === undefined ? {} : { 'content-type': a.type }) }).end(a.body ?? '');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    server.closeAllConnections();
    server.close();
  });
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, seen };
}

function connector(t: Test, url: string, over: { timeoutMs?: number; maxBodyBytes?: number } = {}): HttpConnector {
  const c = new HttpConnector({ url, timeoutMs: over.timeoutMs ?? 2000, connectTimeoutMs: 1000, maxBodyBytes: over.maxBodyBytes });
  t.teardown(() => c.close());
  return c;
}

async function failure(p: Promise<unknown>): Promise<ServiceError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!isServiceError(err)) throw new Error(`expected a ServiceError, got ${String(err)}`);
  return err;
}

const json = (status: number, body: unknown): Answer => ({ status, body: JSON.stringify(body), type: 'application/json' });

const START: WorkflowStart = {
  upload_uuid: '0f8fad5b-d9cb-469f-a165-70867728950e',
  client_id: 'acme',
  date_from: '2024-01-01',
  date_to: '2024-01-31',
  entities: [{ name: 'stores', packages: 2, rows: 3 }],
  objects: [
    { entity: 'stores', key: 'acme/0f8f/stores/p1.ndjson', rows: 2, bytes: 120 },
    { entity: 'stores', key: 'acme/0f8f/stores/p2.ndjson', rows: 1, bytes: 60 },
  ],
  callback_url: 'http://127.0.0.1:8080/api/v1/uploading/webhooks/upload-finished',
};

t.test('start: POSTs the request as JSON to {url}/workflows and passes a 2xx JSON answer through', async (t) => {
  const answer = { workflow_id: 'wf-1', status: 'started', entities: [{ name: 'stores', rows: 3 }], extra: { n: [1, null] } };
  const fake = await fakeConnector(t, () => json(201, answer));

  t.strictSame(JSON.parse((await connector(t, `${fake.url}/`).start(START)).text), answer);
  t.strictSame(JSON.parse((await connector(t, `${fake.url}/base/`).start(START)).text), answer);

  const [first, second] = fake.seen;
  t.equal(first?.method, 'POST');
  t.equal(first?.url, '/workflows', 'trailing slash does not double');
  t.equal(second?.url, '/base/workflows', 'path prefix kept');
  t.equal(first?.headers['content-type'], 'application/json');
  t.equal(first?.headers.accept, 'application/json');
  t.strictSame(JSON.parse(first?.body ?? ''), START);
});

t.test('start: 409 becomes CONNECTOR_REJECTED with the Connector text', async (t) => {
  const cases: [string, Answer, string][] = [
    ['detail', json(409, { detail: 'Already running', message: 'ignored' }), 'Already running'],
    ['message', json(409, { message: 'Quota exceeded' }), 'Quota exceeded'],
    ['plain text', { status: 409, body: '  busy, try later \n', type: 'text/plain' }, 'busy, try later'],
    ['non-string detail', json(409, { detail: { x: 1 } }), '{"detail":{"x":1}}'],
    ['empty body', { status: 409 }, 'Connector rejected the upload start, please contact support'],
    ['blank body', { status: 409, body: ' \n' }, 'Connector rejected the upload start, please contact support'],
  ];
  for (const [name, answer, text] of cases) {
    const fake = await fakeConnector(t, () => answer);
    const err = await failure(connector(t, fake.url).start(START));
    t.match(err, { code: 'CONNECTOR_REJECTED', statusCode: 409, message: text }, name);
    t.strictSame(err.body, { detail: text }, `${name}: body`);
  }
});

t.test('start: other statuses >= 400 are forwarded with a string detail', async (t) => {
  const cases: [Answer, number, string][] = [
    [json(500, { detail: 'boom' }), 500, 'boom'],
    [{ status: 503, body: 'Service Unavailable', type: 'text/plain' }, 503, 'Service Unavailable'],
    [json(400, { detail: [{ loc: ['x'] }] }), 400, '{"detail":[{"loc":["x"]}]}'],
    [{ status: 502 }, 502, 'Connector error'],
  ];
  for (const [answer, status, text] of cases) {
    const fake = await fakeConnector(t, () => answer);
    const err = await failure(connector(t, fake.url).start(START));
    t.match(err, { code: 'CONNECTOR_ERROR', statusCode: status, message: text }, `status ${status}`);
    t.strictSame(err.body, { detail: text });
  }
});

t.test('start: a forwarded 503 says when to come back (the Connector\'s Retry-After, else 5 s); others only pass its own on', async (t) => {
  const cases: [Answer, Record<string, string>][] = [
    [{ status: 503, body: 'busy' }, { 'Retry-After': '5' }],
    [{ status: 503, body: 'busy', headers: { 'retry-after': '30' } }, { 'Retry-After': '30' }],
    [{ status: 503, body: 'busy', headers: { 'retry-after': 'Wed, 21 Oct 2015 07:28:00 GMT' } }, { 'Retry-After': '5' }],
    [{ status: 429, body: 'slow down', headers: { 'retry-after': '2' } }, { 'Retry-After': '2' }],
    [{ status: 500, body: 'boom' }, {}],
  ];
  for (const [answer, headers] of cases) {
    const fake = await fakeConnector(t, () => answer);
    const err = await failure(connector(t, fake.url).start(START));
    t.strictSame([err.statusCode, err.headers], [answer!.status, headers], `${answer!.status} ${JSON.stringify(answer!.headers ?? {})}`);
  }
});

t.test('start: an answer that is not 2xx JSON nor an error status is a 502', async (t) => {
  const cases: [string, Answer][] = [
    ['2xx not JSON', { status: 200, body: '<html>ok</html>', type: 'text/html' }],
    ['2xx empty', { status: 204 }],
    ['redirect', { status: 302, body: '' }],
  ];
  for (const [name, answer] of cases) {
    const fake = await fakeConnector(t, () => answer);
    const err = await failure(connector(t, fake.url).start(START));
    t.match(err, { code: 'CONNECTOR_ERROR', statusCode: 502, message: 'Invalid response from Connector service' }, name);
  }
});

t.test('start: bodies past the read limit are not trusted', async (t) => {
  const big = JSON.stringify({ detail: 'x'.repeat(200) });
  const ok = await fakeConnector(t, () => ({ status: 200, body: big }));
  t.match(await failure(connector(t, ok.url, { maxBodyBytes: 100 }).start(START)), { code: 'CONNECTOR_ERROR', statusCode: 502 });
  const bad = await fakeConnector(t, () => ({ status: 500, body: big }));
  t.match(await failure(connector(t, bad.url, { maxBodyBytes: 100 }).start(START)), {
    code: 'CONNECTOR_ERROR',
    statusCode: 500,
    message: 'Connector error',
  });
});

async function closedPortUrl(): Promise<string> {
  const server = http.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return `http://127.0.0.1:${port}`;
}

t.test('no connection: 502 Failed to connect to Connector service', async (t) => {
  const c = connector(t, await closedPortUrl());
  const err = await failure(c.start(START));
  t.match(err, { code: 'CONNECTOR_UNREACHABLE', statusCode: 502, message: 'Failed to connect to Connector service' });
  t.ok(err.cause, 'keeps the transport error as cause');
  t.match(await failure(c.terminate('u1')), { code: 'CONNECTOR_UNREACHABLE', statusCode: 502 });
});

t.test('no answer within the timeout: 502', async (t) => {
  const fake = await fakeConnector(t, () => null);
  const c = connector(t, fake.url, { timeoutMs: 200 });
  const err = await failure(c.start(START));
  t.match(err, { code: 'CONNECTOR_UNREACHABLE', statusCode: 502 });
  // Which deadline fired: the exact timer's (a TimeoutError), not undici's coarse-clock headers timeout (UND_ERR_HEADERS_TIMEOUT).
  t.equal((err.cause as Error | undefined)?.name, 'TimeoutError', 'gave up on the exact timer, not on undici’s coarse clock');
  t.match(await failure(c.terminate('u1')), { code: 'CONNECTOR_UNREACHABLE', statusCode: 502 });
});

t.test('terminate: POST {url}/workflows/{uuid}/terminate without a body', async (t) => {
  const fake = await fakeConnector(t, () => json(202, { status: 'stopping' }));
  const c = connector(t, `${fake.url}/`);
  await c.terminate('0f8fad5b-d9cb-469f-a165-70867728950e');
  await c.terminate('a/b c');
  t.equal(fake.seen[0]?.method, 'POST');
  t.equal(fake.seen[0]?.url, '/workflows/0f8fad5b-d9cb-469f-a165-70867728950e/terminate');
  t.equal(fake.seen[0]?.body, '');
  t.equal(fake.seen[0]?.headers['content-length'], '0');
  t.equal(fake.seen[0]?.headers['content-type'], undefined);
  t.equal(fake.seen[1]?.url, '/workflows/a%2Fb%20c/terminate', 'uuid is path-encoded');
});

t.test('terminate: Connector errors map to Failed to stop workflow', async (t) => {
  const cases: [number, number][] = [
    [404, 404],
    [409, 409],
    [500, 500],
    [503, 500],
    [400, 500],
    [302, 500],
  ];
  for (const [connectorStatus, status] of cases) {
    const fake = await fakeConnector(t, () => json(connectorStatus, { detail: 'whatever' }));
    const err = await failure(connector(t, fake.url).terminate('u1'));
    t.match(err, { code: 'WORKFLOW_STOP_FAILED', statusCode: status, message: 'Failed to stop workflow' }, `${connectorStatus}`);
    t.strictSame(err.body, { detail: 'Failed to stop workflow' });
  }
});

t.test("the URL's credentials (`user:password@`) go with every call as HTTP Basic auth, not dropped", async (t) => {
  const fake = await fakeConnector(t, () => json(200, { workflow_id: 'w' }));
  const c = connector(t, fake.url.replace('http://', 'http://svc%40ingest:p%3Ass@'));
  await c.start(START);
  await c.terminate(START.upload_uuid);
  t.same(
    fake.seen.map((s) => s.headers.authorization),
    Array(2).fill(`Basic ${Buffer.from('svc@ingest:p:ss').toString('base64')}`),
  );
  const plain = await fakeConnector(t, () => json(200, {}));
  await connector(t, plain.url).start(START);
  t.equal(plain.seen[0]!.headers.authorization, undefined, 'none without credentials');
});

t.test('connections are kept alive and reused', async (t) => {
  const fake = await fakeConnector(t, () => json(200, {}));
  const c = connector(t, fake.url);
  for (let i = 0; i < 3; i++) await c.start(START);
  await c.terminate('u1');
  t.equal(fake.seen.length, 4);
  t.ok(new Set(fake.seen.map((s) => s.clientPort)).size < fake.seen.length, 'fewer connections than calls');
});
