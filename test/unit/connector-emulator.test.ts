import { on } from 'node:events';
import { watch } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
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
    // Keeps every chunk of the body until the end.
    capabilities: { consumesChunksInTurn: false },
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
  /** The body as sent. */
  raw: string;
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
        raw: raw.toString(),
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

async function emulator(t: Test, objects: ObjectStore, over: Partial<EmulatedConnectorOptions> = {}): Promise<EmulatedConnector> {
  const c = await EmulatedConnector.open({ objects, secret: SECRET, delayMs: 50, timeoutMs: 2000, countRows, retryDelaysMs: [10, 10], ...over });
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
  const c = await emulator(t, store(), { delayMs: 100 });

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
  const c = await emulator(t, store());
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
  const c = await emulator(t, store(), { delayMs: 60_000 });
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

t.test('two workflows of one upload never send the same webhook body (the gateway would ignore the second as a replay)', async (t) => {
  const hook = await webhookReceiver(t);
  const c = await emulator(t, store(), { delayMs: 60_000 });
  await c.start(startRequest(hook.url));
  await c.terminate('u-1');
  const first = await hook.next();
  await c.start(startRequest(hook.url));
  await c.terminate('u-1');
  const second = await hook.next();
  t.strictSame(second.payload, first.payload, 'the same confirmation');
  // Sent within one second, identical bodies would share the replay id (the timestamp and body):
  // the second confirmation ignored, the session left STARTED with no workflow.
  t.not(second.raw, first.raw, 'each body names its workflow');
});

t.test('terminate after completion answers 404', async (t) => {
  const hook = await webhookReceiver(t);
  const c = await emulator(t, store());
  await c.start(startRequest(hook.url));
  await hook.next();
  t.match(await failure(c.terminate('u-1')), { code: 'WORKFLOW_STOP_FAILED', statusCode: 404 });
});

t.test('counts that differ from the request complete as failed', async (t) => {
  const hook = await webhookReceiver(t);
  const objects = memoryStore({ 'acme/u-1/stores/1': ndjson(3), 'acme/u-1/stores/2': ndjson(1) });
  const c = await emulator(t, objects);

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
  const c = await emulator(t, broken, { log: (msg) => logged.push(msg) });
  t.match(await failure(c.start(startRequest(hook.url))), { code: 'CONNECTOR_ERROR', statusCode: 500 });
  t.equal(logged.length, 1);
  t.match(await failure(c.start(startRequest(hook.url))), { code: 'CONNECTOR_ERROR' }, 'not "already running"');
});

t.test('storage that fails for now (EIO) is the storage error itself, a 503 at the edge, not a Connector 500', async (t) => {
  const hook = await webhookReceiver(t);
  const eio = Object.assign(new Error('EIO: i/o error, read'), { code: 'EIO' });
  const failing = { ...store(), get: async () => Promise.reject(eio) } as ObjectStore;
  const c = await emulator(t, failing, { log: () => {} });
  for (const attempt of ['first', 'again (not "already running")']) {
    t.equal(await c.start(startRequest(hook.url)).catch((err: unknown) => err), eio, attempt);
  }
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
  const c = await emulator(t, store(), { log: sink.log });
  await c.start(startRequest(hook.url));
  t.strictSame([(await hook.next()).status, (await hook.next()).status, (await hook.next()).status], [503, 500, 200]);
  t.equal(sink.entries.length, 0);

  const refused = sink.next();
  await c.start(startRequest(hook.url));
  t.strictSame(await refused, { msg: 'connector emulator: webhook refused', data: { upload_uuid: 'u-1', status: 401 } });
  await c.close();
  t.equal(hook.count(), 4, 'no retry after 401');
});

t.test('a webhook answered 503 past the retry delays (a storage outage) is logged once and sent again until delivered', { timeout: 20_000 }, async (t) => {
  const hook = await webhookReceiver(t, [503, 503, 503, 503, 503]);
  const sink = logSink();
  const c = await emulator(t, store(), { log: sink.log });
  const undelivered = sink.next();
  await c.start(startRequest(hook.url));
  t.match(await undelivered, { msg: 'connector emulator: webhook undelivered', data: { upload_uuid: 'u-1', attempts: 3, failure: 503, retry_every_ms: 10 } });
  const statuses: number[] = [];
  for (let r = await hook.next(); ; r = await hook.next()) {
    statuses.push(r.status);
    if (r.status === 200) break;
  }
  t.strictSame(statuses, [503, 503, 503, 503, 503, 200], 'not given up: the session would stay STARTED for good');
  t.equal(sink.entries.length, 1, 'logged once');
  await c.close();
});

t.test('close cancels pending completions', async (t) => {
  const hook = await webhookReceiver(t);
  const c = await emulator(t, store(), { delayMs: 60_000 });
  await c.start(startRequest(hook.url));
  await c.close();
  t.match(await failure(c.start(startRequest(hook.url, { upload_uuid: 'u-3' }))), { code: 'CONNECTOR_UNREACHABLE' });
  t.equal(hook.count(), 0);
});

// --- Restart: the state file -------------------------------------------------------------

interface SavedState {
  version: number;
  workflows: { upload_uuid: string; workflow_id: string; callback_url: string; due_at: number; phase: string; outcome: WebhookPayload }[];
}

const readState = async (file: string): Promise<SavedState> => JSON.parse(await readFile(file, 'utf8')) as SavedState;

type Saved = SavedState['workflows'];

/** A fresh directory, removed after the test. */
async function tempDir(t: Test): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'connector-emulator-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

/**
 * The saved workflows once `until` holds (default: none left), or as they are after 5 s. The
 * receiver sees a webhook before the emulator sees its answer, and a close in between would
 * abort it: each write of the state file (a rename into its directory) is the event to read at.
 */
async function settledWorkflows(file: string, until = (w: Saved) => w.length === 0): Promise<Saved> {
  const watcher = watch(dirname(file)); // before the first read: no write can slip between
  const changes = on(watcher, 'change', { signal: AbortSignal.timeout(5000) });
  let workflows: Saved = [];
  try {
    ({ workflows } = await readState(file));
    if (until(workflows)) return workflows;
    for await (const _ of changes) {
      ({ workflows } = await readState(file));
      if (until(workflows)) return workflows;
    }
  } catch (err) {
    if ((err as Error).name !== 'AbortError') throw err;
  } finally {
    watcher.close();
  }
  return workflows;
}

t.test('a started workflow survives close and reopen: the completion webhook still arrives at its due time', async (t) => {
  const hook = await webhookReceiver(t);
  const stateFile = join(await tempDir(t), 'connector-emulator.json');
  const first = await emulator(t, store(), { stateFile, delayMs: 400 });
  const began = Date.now();
  const answer = await first.start(startRequest(hook.url));

  const saved = await readState(stateFile);
  t.equal(saved.version, 1);
  t.equal(saved.workflows.length, 1);
  t.match(saved.workflows[0], {
    upload_uuid: 'u-1',
    workflow_id: answer.workflow_id,
    callback_url: hook.url,
    phase: 'running',
    outcome: { upload_uuid: 'u-1', is_terminated: false, status: 'succeeded', message: 'Processed 6 rows' },
  });
  t.ok(Math.abs(saved.workflows[0]!.due_at - (began + 400)) < 200, 'due time saved as epoch ms');
  t.strictSame(await readdir(dirname(stateFile)), ['connector-emulator.json'], 'no temp file left');

  await first.close();
  const second = await emulator(t, store(), { stateFile, delayMs: 60_000 });
  t.match(await failure(second.start(startRequest(hook.url))), { code: 'CONNECTOR_REJECTED', message: 'Workflow already running' }, 'restored as running');

  const done = await hook.next();
  t.ok(done.at - began >= 390, 'at the saved due time, not the new delay');
  t.ok(done.at - began < 5000, 'not the new delay either');
  t.ok(done.signed);
  t.strictSame(done.payload, { upload_uuid: 'u-1', is_terminated: false, status: 'succeeded', message: 'Processed 6 rows' });

  t.strictSame(await settledWorkflows(stateFile), [], 'forgotten once delivered');
  await second.close();
  t.equal(hook.count(), 1, 'sent once');
});

t.test('a workflow that fell due while closed completes soon after reopen', async (t) => {
  const hook = await webhookReceiver(t);
  const stateFile = join(await tempDir(t), 'state.json');
  const first = await emulator(t, store(), { stateFile, delayMs: 50 });
  await first.start(startRequest(hook.url));
  await first.close();
  // Its due time passes while it is closed: moved into the past in the saved state.
  const saved = await readState(stateFile);
  t.equal(saved.workflows.length, 1);
  for (const wf of saved.workflows) wf.due_at = Date.now() - 1000;
  await writeFile(stateFile, JSON.stringify(saved));
  t.equal(hook.count(), 0, 'nothing sent while closed');

  const opened = Date.now();
  await emulator(t, store(), { stateFile });
  const done = await hook.next();
  t.ok(done.at - opened < 1000, `completed ${done.at - opened} ms after open`);
  t.equal(done.payload.status, 'succeeded');
});

t.test('terminate works after reopen', async (t) => {
  const hook = await webhookReceiver(t);
  const stateFile = join(await tempDir(t), 'state.json');
  const first = await emulator(t, store(), { stateFile, delayMs: 60_000 });
  await first.start(startRequest(hook.url));
  await first.close();

  const second = await emulator(t, store(), { stateFile, delayMs: 60_000 });
  await second.terminate('u-1');
  t.equal((await readState(stateFile)).workflows[0]?.phase, 'terminating', 'saved before terminate answers');
  const stopped = await hook.next();
  t.ok(stopped.signed);
  t.strictSame(stopped.payload, { upload_uuid: 'u-1', is_terminated: true, status: 'terminated', message: 'Workflow terminated' });
  t.match(await failure(second.terminate('u-1')), { code: 'WORKFLOW_STOP_FAILED', statusCode: 404 });

  const again = await second.start(startRequest(hook.url));
  t.pass('may start again');
  const saved = await settledWorkflows(stateFile, (w) => w.length === 1);
  t.match(saved, [{ upload_uuid: 'u-1', workflow_id: again.workflow_id, phase: 'running' }], 'only the new workflow is saved');
  await second.close();
  t.equal(hook.count(), 1, 'no completion for the terminated workflow');
});

t.test('a terminate confirmation cut off by close is sent after reopen', async (t) => {
  const hook = await webhookReceiver(t);
  const stateFile = join(await tempDir(t), 'state.json');
  const first = await emulator(t, store(), { stateFile, delayMs: 60_000 });
  await first.start(startRequest(hook.url));
  await first.terminate('u-1');
  await first.close(); // within the ack delay: nothing sent yet
  t.equal(hook.count(), 0);

  const second = await emulator(t, store(), { stateFile, delayMs: 60_000 });
  t.match((await hook.next()).payload, { upload_uuid: 'u-1', is_terminated: true, status: 'terminated' });
  t.match(await failure(second.terminate('u-1')), { code: 'WORKFLOW_STOP_FAILED', statusCode: 404 }, 'no longer running');
  t.strictSame(await settledWorkflows(stateFile), []);
});

t.test('a webhook given up is forgotten too', async (t) => {
  const hook = await webhookReceiver(t, [401]);
  const stateFile = join(await tempDir(t), 'state.json');
  const sink = logSink();
  const c = await emulator(t, store(), { stateFile, log: sink.log });
  const refused = sink.next();
  await c.start(startRequest(hook.url));
  t.match(await refused, { msg: 'connector emulator: webhook refused' });
  t.strictSame(await settledWorkflows(stateFile), []);
});

t.test('a missing or corrupt state file starts empty, logged; a corrupt one is kept aside', async (t) => {
  const hook = await webhookReceiver(t);
  const dir = await tempDir(t);
  const stateFile = join(dir, 'state.json');

  const missing = logSink();
  const fresh = await emulator(t, store(), { stateFile, log: missing.log });
  t.match(missing.entries, [{ msg: 'connector emulator: no state file, starting empty', data: { file: stateFile } }]);
  await fresh.close();

  await writeFile(stateFile, '{"version":1,"workflows":[{"upload_uu');
  const corrupt = logSink();
  const c = await emulator(t, store(), { stateFile, log: corrupt.log });
  t.match(corrupt.entries[0], { msg: 'connector emulator: corrupt state file, starting empty', data: { file: stateFile, kept_as: String } });
  const keptAs = corrupt.entries[0]!.data.kept_as as string;
  t.equal(await readFile(keptAs, 'utf8'), '{"version":1,"workflows":[{"upload_uu', 'kept aside');

  t.match(await failure(c.terminate('u-1')), { code: 'WORKFLOW_STOP_FAILED', statusCode: 404 });
  await c.start(startRequest(hook.url));
  t.equal((await hook.next()).payload.status, 'succeeded', 'works from empty');
});

t.test('invalid saved workflows are dropped, valid ones restored', async (t) => {
  const hook = await webhookReceiver(t);
  const stateFile = join(await tempDir(t), 'state.json');
  const valid = {
    upload_uuid: 'u-2',
    workflow_id: 'w-2',
    callback_url: hook.url,
    due_at: Date.now() - 1000,
    phase: 'running',
    outcome: { upload_uuid: 'u-2', is_terminated: false, status: 'succeeded', message: 'Processed 1 rows' },
  };
  await writeFile(stateFile, JSON.stringify({ version: 1, workflows: [{ ...valid, upload_uuid: 42 }, { nonsense: true }, valid] }));
  const sink = logSink();
  const c = await emulator(t, store(), { stateFile, log: sink.log });
  t.equal(sink.entries.filter((e) => e.msg === 'connector emulator: invalid saved workflow dropped').length, 2);
  t.match(sink.entries.at(-1), { msg: 'connector emulator: workflows restored', data: { count: 1 } });
  t.strictSame((await hook.next()).payload, valid.outcome);
  t.strictSame(await settledWorkflows(stateFile), []);
  await c.close();
});

t.test('a start whose state cannot be saved fails and frees the upload', async (t) => {
  const hook = await webhookReceiver(t);
  const stateFile = join(await tempDir(t), 'state.json');
  const sink = logSink();
  const c = await emulator(t, store(), { stateFile, log: sink.log });
  await mkdir(stateFile); // the state file cannot be replaced
  t.match(await failure(c.start(startRequest(hook.url))), { code: 'CONNECTOR_ERROR', statusCode: 500, message: 'Connector could not record the workflow' });
  t.match(sink.entries.at(-1), { msg: 'connector emulator: cannot save state', data: { upload_uuid: 'u-1' } });
  t.match(await failure(c.terminate('u-1')), { code: 'WORKFLOW_STOP_FAILED', statusCode: 404 }, 'not running');

  await rm(stateFile, { recursive: true });
  await c.start(startRequest(hook.url));
  t.equal((await hook.next()).payload.status, 'succeeded', 'not "already running"');
});

t.test('restored workflows send to callbackUrl() when given (the gateway may listen elsewhere now)', async (t) => {
  const before = await webhookReceiver(t);
  const now = await webhookReceiver(t, [503, 503, 503, 503]);
  const stateFile = join(await tempDir(t), 'state.json');
  const first = await emulator(t, store(), { stateFile, delayMs: 50 });
  await first.start(startRequest(before.url));
  await first.close();

  const second = await emulator(t, store(), { stateFile, callbackUrl: () => now.url });
  const statuses: number[] = [];
  for (let r = await now.next(); ; r = await now.next()) {
    statuses.push(r.status);
    if (r.status === 200) {
      t.strictSame(r.payload, { upload_uuid: 'u-1', is_terminated: false, status: 'succeeded', message: 'Processed 6 rows' });
      break;
    }
  }
  t.strictSame(statuses, [503, 503, 503, 503, 200], 'a restored webhook retries past retryDelaysMs');

  await second.start(startRequest(before.url, { upload_uuid: 'u-2' }));
  t.equal((await before.next()).payload.upload_uuid, 'u-2', 'a new workflow uses its own callback_url');
  t.equal(before.count(), 1);
});
