import http from 'node:http';
import type { AddressInfo } from 'node:net';
import t from 'tap';
import { EmulatedConnector, type EmulatedConnectorOptions } from '../../src/connector/emulator.js';
import type { WebhookPayload, WorkflowStart } from '../../src/connector/types.js';
import { parseWebhookPayload, SIGNATURE_HEADER, TIMESTAMP_HEADER, verifyWebhook } from '../../src/connector/webhook.js';
import { isServiceError, type ServiceError } from '../../src/errors.js';
import type { ObjectStore, StoredObject } from '../../src/store/ports.js';

type Test = Pick<typeof t, 'teardown'>;
const SECRET = 'emulator-secret';

/** Objects in memory, each served in two chunks so counting must cope with split lines. */
function memoryStore(objects: Record<string, string>): ObjectStore {
  const data = new Map(Object.entries(objects).map(([k, v]) => [k, Buffer.from(v)]));
  return {
    async put(key: string, body: AsyncIterable<Uint8Array>): Promise<StoredObject> {
      const chunks: Uint8Array[] = [];
      for await (const c of body) chunks.push(c);
      const buf = Buffer.concat(chunks);
      data.set(key, buf);
      return { key, size: buf.length };
    },
    async get(key: string) {
      const buf = data.get(key);
      if (!buf) return null;
      const mid = Math.floor(buf.length / 2);
      return (async function* () {
        yield buf.subarray(0, mid);
        yield buf.subarray(mid);
      })();
    },
    async list(prefix: string) {
      return [...data].filter(([k]) => k.startsWith(prefix)).sort().map(([key, b]) => ({ key, size: b.length }));
    },
    async deletePrefix(prefix: string) {
      for (const k of [...data.keys()]) if (k.startsWith(prefix)) data.delete(k);
    },
    async close() {},
  };
}

/** Stand-in for the uploader's counter: lines after the header. */
async function countRows(body: AsyncIterable<Uint8Array>): Promise<number> {
  const chunks: Uint8Array[] = [];
  for await (const c of body) chunks.push(c);
  const lines = Buffer.concat(chunks).toString().split('\n').filter((l) => l !== '');
  return Math.max(0, lines.length - 1);
}

const ndjson = (rows: number): string =>
  ['{"columns":["store_id","name"]}', ...Array.from({ length: rows }, (_, i) => `["s${i}","Store ${i}"]`)].join('\n') + '\n';

interface Received {
  /** What the receiver answered. */
  status: number;
  payload: WebhookPayload;
  signed: boolean;
  at: number;
}

/** The gateway's webhook endpoint: answers each request with the next scripted status (then 200); `next` yields every request. */
async function webhookReceiver(t: Test, statuses: number[] = []): Promise<{ url: string; next(): Promise<Received>; count(): number }> {
  const queue: Received[] = [];
  const waiters: ((r: Received) => void)[] = [];
  let count = 0;
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      count++;
      const raw = Buffer.concat(chunks);
      const parsed = parseWebhookPayload(raw);
      if (!parsed.ok) throw new Error(`bad webhook body ${raw.toString()}`);
      const status = statuses.shift() ?? 200;
      const received = {
        status,
        payload: parsed.value,
        at: Date.now(),
        signed: verifyWebhook({
          secret: SECRET,
          timestampHeader: req.headers[TIMESTAMP_HEADER] as string,
          signatureHeader: req.headers[SIGNATURE_HEADER] as string,
          rawBody: raw,
        }),
      };
      res.writeHead(status, { 'content-type': 'application/json' }).end('{"status":"ok"}');
      const waiter = waiters.shift();
      if (waiter) waiter(received);
      else queue.push(received);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    server.closeAllConnections();
    server.close();
  });
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/api/v1/uploading/webhooks/upload-finished`,
    next: () => {
      const r = queue.shift();
      return r ? Promise.resolve(r) : new Promise((resolve) => waiters.push(resolve));
    },
    count: () => count,
  };
}

function emulator(t: Test, objects: ObjectStore, over: Partial<EmulatedConnectorOptions> = {}): EmulatedConnector {
  const c = new EmulatedConnector({ objects, secret: SECRET, delayMs: 50, timeoutMs: 2000, countRows, retryDelaysMs: [10, 10], ...over });
  t.teardown(() => c.close());
  return c;
}

function startRequest(callbackUrl: string, over: Partial<WorkflowStart> = {}): WorkflowStart {
  return {
    upload_uuid: 'u-1',
    client_id: 'acme',
    date_from: '2024-01-01',
    date_to: '2024-01-31',
    entities: [
      { name: 'stores', packages: 2, rows: 5 },
      { name: 'products', packages: 1, rows: 1 },
    ],
    objects: [
      { entity: 'stores', key: 'acme/u-1/stores/1', rows: 3, bytes: 1 },
      { entity: 'stores', key: 'acme/u-1/stores/2', rows: 2, bytes: 1 },
      { entity: 'products', key: 'acme/u-1/products/1', rows: 1, bytes: 1 },
    ],
    callback_url: callbackUrl,
    ...over,
  };
}

const store = (): ObjectStore =>
  memoryStore({ 'acme/u-1/stores/1': ndjson(3), 'acme/u-1/stores/2': ndjson(2), 'acme/u-1/products/1': ndjson(1) });

async function failure(p: Promise<unknown>): Promise<ServiceError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!isServiceError(err)) throw new Error(`expected a ServiceError, got ${String(err)}`);
  return err;
}

t.test('start answers with counted rows, then sends the signed completion webhook after the delay', async (t) => {
  const hook = await webhookReceiver(t);
  const c = emulator(t, store(), { delayMs: 100 });

  const began = Date.now();
  const answer = await c.start(startRequest(hook.url));
  t.match(answer, { workflow_id: String, status: 'started' });
  t.strictSame(answer.entities, [
    { name: 'stores', rows: 5 },
    { name: 'products', rows: 1 },
  ]);
  t.equal(hook.count(), 0, 'not completed yet');

  const done = await hook.next();
  t.ok(done.at - began >= 90, 'after the delay');
  t.ok(done.signed, 'signature verifies');
  t.strictSame(done.payload, { upload_uuid: 'u-1', is_terminated: false, status: 'succeeded', message: 'Processed 6 rows' });
});

t.test('a second start while the workflow runs is rejected; after completion it may start again', async (t) => {
  const hook = await webhookReceiver(t);
  const c = emulator(t, store());
  const first = c.start(startRequest(hook.url));
  const err = await failure(c.start(startRequest(hook.url)));
  t.match(err, { code: 'CONNECTOR_REJECTED', statusCode: 409, message: 'Workflow already running' });
  await first;
  t.match(await failure(c.start(startRequest(hook.url))), { code: 'CONNECTOR_REJECTED' }, 'still running');
  t.equal((await hook.next()).payload.status, 'succeeded');

  await c.start(startRequest(hook.url));
  t.equal((await hook.next()).payload.status, 'succeeded');
});

t.test('terminate cancels the completion and sends is_terminated: true', async (t) => {
  const hook = await webhookReceiver(t);
  const c = emulator(t, store(), { delayMs: 60_000 });
  await c.start(startRequest(hook.url));

  await c.terminate('u-1');
  const stopped = await hook.next();
  t.ok(stopped.signed);
  t.strictSame(stopped.payload, { upload_uuid: 'u-1', is_terminated: true, status: 'terminated', message: 'Workflow terminated' });

  t.match(await failure(c.terminate('u-1')), { code: 'WORKFLOW_STOP_FAILED', statusCode: 404, message: 'Failed to stop workflow' });
  t.match(await failure(c.terminate('unknown')), { code: 'WORKFLOW_STOP_FAILED', statusCode: 404 });
  await c.start(startRequest(hook.url));
  t.pass('may start again after terminate');
});

t.test('terminate after completion answers 404', async (t) => {
  const hook = await webhookReceiver(t);
  const c = emulator(t, store());
  await c.start(startRequest(hook.url));
  await hook.next();
  t.match(await failure(c.terminate('u-1')), { code: 'WORKFLOW_STOP_FAILED', statusCode: 404 });
});

t.test('counts that differ from the request complete as failed', async (t) => {
  const hook = await webhookReceiver(t);
  const objects = memoryStore({ 'acme/u-1/stores/1': ndjson(3), 'acme/u-1/stores/2': ndjson(1) });
  const c = emulator(t, objects);

  const answer = await c.start(startRequest(hook.url));
  t.strictSame(answer.entities, [
    { name: 'stores', rows: 4 },
    { name: 'products', rows: 0 },
  ]);
  const done = await hook.next();
  t.match(done.payload, { upload_uuid: 'u-1', is_terminated: false, status: 'failed' });
  t.equal(
    done.payload.message,
    'Row count mismatch: object acme/u-1/stores/2 declared 2 rows, found 1; object acme/u-1/products/1 is missing; ' +
      'entity stores declared 5 rows, found 4; entity products declared 1 rows, found 0',
  );
});

t.test('an unreadable store fails the start and frees the upload', async (t) => {
  const hook = await webhookReceiver(t);
  const broken = { ...store(), get: async () => Promise.reject(new Error('disk on fire')) } as ObjectStore;
  const logged: string[] = [];
  const c = emulator(t, broken, { log: (msg) => logged.push(msg) });
  t.match(await failure(c.start(startRequest(hook.url))), { code: 'CONNECTOR_ERROR', statusCode: 500 });
  t.equal(logged.length, 1);
  t.match(await failure(c.start(startRequest(hook.url))), { code: 'CONNECTOR_ERROR' }, 'not "already running"');
});

/** Log entries, with a latch on the next one. */
function logSink(): { entries: LogEntry[]; log: (msg: string, data: Record<string, unknown>) => void; next(): Promise<LogEntry> } {
  const entries: LogEntry[] = [];
  const waiters: ((e: LogEntry) => void)[] = [];
  return {
    entries,
    log: (msg, data) => {
      entries.push({ msg, data });
      waiters.shift()?.({ msg, data });
    },
    next: () => new Promise((resolve) => waiters.push(resolve)),
  };
}
type LogEntry = { msg: string; data: Record<string, unknown> };

t.test('webhook delivery retries on 5xx, gives up on 4xx, and logs', async (t) => {
  const hook = await webhookReceiver(t, [503, 500, 200, 401]);
  const sink = logSink();
  const c = emulator(t, store(), { log: sink.log });
  await c.start(startRequest(hook.url));
  t.strictSame([(await hook.next()).status, (await hook.next()).status, (await hook.next()).status], [503, 500, 200]);
  t.equal(sink.entries.length, 0);

  const refused = sink.next();
  await c.start(startRequest(hook.url));
  t.strictSame(await refused, { msg: 'connector emulator: webhook refused', data: { upload_uuid: 'u-1', status: 401 } });
  await c.close();
  t.equal(hook.count(), 4, 'no retry after 401');
});

t.test('undeliverable webhooks are logged after the last retry', async (t) => {
  const hook = await webhookReceiver(t, [503, 503, 503]);
  const sink = logSink();
  const c = emulator(t, store(), { log: sink.log });
  const givenUp = sink.next();
  await c.start(startRequest(hook.url));
  t.match(await givenUp, { msg: 'connector emulator: webhook undelivered', data: { upload_uuid: 'u-1', attempts: 3, failure: 503 } });
  await c.close();
  t.equal(hook.count(), 3, 'one attempt per retry delay, plus the first');
});

t.test('close cancels pending completions', async (t) => {
  const hook = await webhookReceiver(t);
  const c = emulator(t, store(), { delayMs: 60_000 });
  await c.start(startRequest(hook.url));
  await c.close();
  t.match(await failure(c.start(startRequest(hook.url, { upload_uuid: 'u-3' }))), { code: 'CONNECTOR_UNREACHABLE' });
  t.equal(hook.count(), 0);
});
