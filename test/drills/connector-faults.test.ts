/**
 * Drill 3: the Connector down (nothing listens), crashing mid-request (connection reset), slow
 * past `connector.timeoutMs`, and answering 500; then back. Each fault answers the client as
 * docs/api.md says (502 `Failed to connect to Connector service`, or the Connector's own 5xx
 * and detail), the session comes out exactly as it went in (while the call runs it is STARTED,
 * so ingests and other starts answer 409), a slow Connector's late 200 and late completion
 * webhook change nothing, and once the Connector is back a start succeeds and the session
 * reaches DONE. Terminate: down → 502 with the session still STARTED, back → terminated.
 * The error mapping itself is test/e2e/connector.test.ts; this is the sequence on one session,
 * on both back ends. CI: one round of faults. DRILL_LONG=1: ten rounds.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import t, { type Test } from 'tap';
import type { Config, DeepPartial } from '../../src/config/config.js';
import { DEMO_CLIENTS_PATH } from '../../src/config/config.js';
import { clientOf, DEMO, DEMO2, products, sendWebhook, startService, waitForStatus, yesterday, type Service } from '../support/harness.js';
import { startNats } from '../../testbed/nats.js';
import { startS3 } from '../../testbed/s3.js';
import { size, until } from '../support/drills.js';

const ROUNDS = size(1, 10);
const TIMEOUT_MS = 500;
const dates = { date_from: '2024-01-01', date_to: yesterday() };
const UNREACHABLE = { detail: 'Failed to connect to Connector service' };

type Mode = 'ok' | 'ok-no-webhook' | 'reset' | 'slow' | '500';

/** A Connector on a fixed loopback port that can go down and come back, and misbehave on demand. */
class FlakyConnector {
  mode: Mode = 'ok';
  port = 0;
  readonly starts: any[] = [];
  readonly terminates: string[] = [];
  /** Late answers and webhooks of slow calls, for the test to wait on. */
  readonly late: Promise<unknown>[] = [];
  #server: Server | null = null;
  #serviceUrl = '';

  constructor(t: Test) {
    t.teardown(() => this.down());
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  set serviceUrl(url: string) {
    this.#serviceUrl = url;
  }

  async up(): Promise<void> {
    const server = createServer((req, res) => this.#handle(req, res));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.port, '127.0.0.1', () => resolve());
    });
    this.port = (server.address() as AddressInfo).port;
    this.#server = server;
  }

  async down(): Promise<void> {
    const server = this.#server;
    this.#server = null;
    if (!server) return;
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }

  #lastTimestamp = 0;

  /** Unix seconds, never the same twice. */
  #nextTimestamp(): number {
    this.#lastTimestamp = Math.max(Math.floor(Date.now() / 1000), this.#lastTimestamp + 1);
    return this.#lastTimestamp;
  }

  #handle(req: IncomingMessage, res: ServerResponse): void {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const text = Buffer.concat(chunks).toString();
      if (req.url?.endsWith('/terminate')) {
        const uuid = req.url.split('/').at(-2)!;
        this.terminates.push(uuid);
        res.writeHead(202, { 'content-type': 'application/json' }).end('{}');
        void sendWebhook(this.#serviceUrl, { upload_uuid: uuid, is_terminated: true });
        return;
      }
      const body = JSON.parse(text);
      this.starts.push(body);
      const ok = () => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ workflow_id: `wf-${this.starts.length}`, status: 'started' }));
      // Each completion is a signed request of its own, as a real Connector's are: the same body
      // signed in the same second would be one request to the service, a replay (docs/api.md).
      const complete = () => sendWebhook(this.#serviceUrl, { upload_uuid: body.upload_uuid, is_terminated: false, status: 'succeeded' }, { timestamp: this.#nextTimestamp() });
      switch (this.mode) {
        case 'ok':
          ok();
          setTimeout(() => void complete(), 50);
          return;
        case 'ok-no-webhook':
          return ok();
        case 'reset':
          req.socket.destroy();
          return;
        case '500':
          res.writeHead(500, { 'content-type': 'application/json' }).end('{"detail":"Connector exploded"}');
          return;
        case 'slow':
          // Answers (and completes the workflow) well after the gateway gave up.
          this.late.push(
            new Promise((resolve) =>
              setTimeout(() => {
                if (!res.destroyed) ok();
                resolve(complete());
              }, TIMEOUT_MS * 3),
            ),
          );
          return;
      }
    });
  }
}

async function readySession(t: Test, svc: Service, creds: { id: string; token: string } = DEMO) {
  const client = clientOf(svc, creds);
  const uuid = (await client.init()).body.upload_uuid;
  for (let i = 0; i < 2; i++) t.equal((await client.ingest(uuid, 'products', products(10, i * 10))).status, 200, `package ${i} of ${creds.id}`);
  await waitForStatus(svc, uuid, (b) => b.can_start_upload, creds);
  return uuid;
}

async function drill(t: Test, backend: DeepPartial<Config>) {
  const connector = new FlakyConnector(t);
  await connector.up();
  const svc = await startService(t, { ...backend, connector: { url: connector.url, timeoutMs: TIMEOUT_MS, connectTimeoutMs: TIMEOUT_MS } });
  connector.serviceUrl = svc.url;
  const c = clientOf(svc);
  const uuid = await readySession(t, svc);
  const before = (await c.status(uuid)).body;
  const unchanged = async (what: string) => t.same((await c.status(uuid)).body, before, `${what}: session unchanged`);

  for (let round = 1; round <= ROUNDS; round++) {
    await connector.down();
    const down = await c.start(uuid, dates);
    t.same([down.status, down.body], [502, UNREACHABLE], `round ${round}: Connector down → 502`);
    await unchanged('down');
    await connector.up();

    connector.mode = 'reset';
    const reset = await c.start(uuid, dates);
    t.same([reset.status, reset.body], [502, UNREACHABLE], `round ${round}: connection reset mid-call → 502`);
    await unchanged('reset');

    connector.mode = 'slow';
    const asked = connector.starts.length;
    const slow = c.start(uuid, dates);
    await until('the slow call to reach the Connector', async () => connector.starts.length, (n) => n > asked, 10_000, 5);
    // The session is STARTED while the call runs: nothing slips in between.
    const during = await c.ingest(uuid, 'products', products(1, 999));
    t.same([during.status, during.body?.detail?.actual], [409, 'STARTED'], 'an ingest during the call answers 409');
    const second = await c.start(uuid, dates);
    t.same([second.status, second.body?.detail?.actual], [409, 'STARTED'], 'a second start during the call answers 409');
    const slowAnswer = await slow;
    t.same([slowAnswer.status, slowAnswer.body], [502, UNREACHABLE], `round ${round}: slower than ${TIMEOUT_MS} ms → 502`);
    await unchanged('slow');
    await Promise.all(connector.late.splice(0));
    await unchanged('the slow Connector answered and completed late');

    connector.mode = '500';
    const err = await c.start(uuid, dates);
    t.same([err.status, err.body], [500, { detail: 'Connector exploded' }], `round ${round}: Connector 500 → 500 with its detail`);
    await unchanged('500');
  }

  t.equal((await c.ingest(uuid, 'products', products(5, 100))).status, 200, 'still UPLOADING: ingest goes on');
  await waitForStatus(svc, uuid, (b) => b.can_start_upload);
  connector.mode = 'ok';
  const ok = await c.start(uuid, dates);
  t.same([ok.status, ok.body.status], [200, 'started'], 'the Connector is back: start succeeds');
  t.same(connector.starts.at(-1).entities, [{ name: 'products', packages: 3, rows: 25 }], 'it is handed every package');
  await waitForStatus(svc, uuid, (b) => b.session_status === 'DONE');
  t.comment(`${ROUNDS} round(s): ${connector.starts.length} start calls reached the Connector, the last one succeeded`);

  // Terminate while the Connector is down: 502, still STARTED; once back, terminated.
  const c2 = clientOf(svc, DEMO2);
  const uuid2 = await readySession(t, svc, DEMO2);
  connector.mode = 'ok-no-webhook';
  t.equal((await c2.start(uuid2, dates)).status, 200);
  await connector.down();
  const stop = await c2.terminate(uuid2);
  t.same([stop.status, stop.body], [502, UNREACHABLE], 'terminate with the Connector down → 502');
  t.equal((await c2.status(uuid2)).body.session_status, 'STARTED', 'still STARTED');
  await connector.up();
  t.equal((await c2.terminate(uuid2)).status, 200, 'terminate once the Connector is back');
  const after = await waitForStatus(svc, uuid2, (b) => b.session_status === 'UPLOADING', DEMO2);
  t.equal(after.last_workflow?.status, 'terminated');
}

t.test('embedded: Connector faults, then a start that succeeds', (t) => drill(t, {}));

t.test('NATS + S3: Connector faults, then a start that succeeds', async (t) => {
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  await drill(t, {
    clientsFile: DEMO_CLIENTS_PATH,
    nats: { url: nats.url },
    s3: { endpoint: s3.endpoint, bucket: s3.bucket, region: s3.region, accessKeyId: s3.accessKeyId, secretAccessKey: s3.secretAccessKey, createBucket: true },
  });
});
