/**
 * Operator endpoints over real HTTP: `/metrics` moves after a session, `/healthz`, `/readyz`
 * on the distributed engines (and 503 once NATS is gone), access log lines with a request id
 * and never a token, the uploader process's own endpoints.
 */
import { EventEmitter } from 'node:events';
import t from 'tap';
import { request } from 'undici';
import { startApp } from '../../src/app.js';
import { redactConfig } from '../../src/cli/admin.js';
import { DEMO_CLIENTS_PATH, loadConfig, type Config, type DeepPartial } from '../../src/config/config.js';
import { jsonLogger } from '../../src/log.js';
import { API, call, clientOf, DEMO, edgeConfig, HTTP_ENGINE, mergedChanges, products, tempDir, waitForStatus, WEBHOOK_SECRET, yesterday } from '../support/harness.js';
import { startNats } from '../../testbed/nats.js';
import { distributed, spawnUploader } from '../../testbed/processes.js';
import { startS3 } from '../../testbed/s3.js';

interface Teardown {
  teardown(fn: () => unknown): void;
}

const INGEST_ROUTE = `${API}/:upload_uuid/:entity_name`;

/** A started service whose log lines are captured as parsed JSON. */
async function startLogged(t: Teardown, overrides: DeepPartial<Config> = {}) {
  const dataDir = await tempDir(t);
  const lines: string[] = [];
  const config = loadConfig(
    {},
    {
      port: 0,
      dataDir,
      ingest: { workers: 2 },
      connector: { emulatorDelayMs: 50, webhookSecret: WEBHOOK_SECRET },
      health: { readyTimeoutMs: 1000 },
      ...edgeConfig(),
      ...overrides,
    },
  );
  const changes = new EventEmitter();
  const app = await startApp(config, {
    logger: jsonLogger({ write: (line: string) => lines.push(line) }, {}, { level: 'info' }),
    onStateChange: () => changes.emit('change'),
  });
  t.teardown(() => app.close());
  // Another process's uploader stores what a gateway without its own hands on: no event of this
  // one tells it (`ownChanges` merged with the uploader's `changes` does).
  return { app, url: app.url, changes: config.storage.inProcessUploader ? changes : undefined, ownChanges: changes, lines, logs: () => lines.map((l) => JSON.parse(l) as Record<string, unknown>) };
}

/** The value of one sample of the exposition text (0 when the series is absent). */
function sample(text: string, name: string, labels: Record<string, string> = {}): number {
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || !line.startsWith(name)) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const found: Record<string, string> = {};
    for (const [, k, v] of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) found[k!] = v!;
    if (Object.entries(labels).every(([k, v]) => found[k] === v)) return Number(m[3]);
  }
  return 0;
}

function has(text: string, name: string): boolean {
  return text.split('\n').some((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `));
}

async function scrape(url: string, headers: Record<string, string> = {}): Promise<string> {
  const res = await request(`${url}/metrics`, { headers });
  const text = await res.body.text();
  if (res.statusCode !== 200) throw new Error(`/metrics answered ${res.statusCode}: ${text}`);
  return text;
}

t.test('metrics move after a session; access log lines carry a request id and never the token', async (t) => {
  // Every row task to a worker (no short way for small packages), so the workers' metrics move too.
  const svc = await startLogged(t, { ingest: { workers: 2, inlineBytes: 0 } });
  const before = await scrape(svc.url);
  const ingested = { method: 'POST', route: INGEST_ROUTE, status: '200' };

  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid as string;
  const ingest = await call(svc.url, 'POST', `${API}/${uuid}/products`, { body: products(7), headers: { 'x-request-id': 'obs-test-ingest-1' } });
  t.equal(ingest.status, 200);
  t.equal(ingest.headers['x-request-id'], 'obs-test-ingest-1', 'a sane incoming request id is echoed');
  const bad = await c.ingest(uuid, 'products', { columns: ['product_id', 'name', 'price'], data: [['p', 'x', 'not a price']] });
  t.equal(bad.status, 422);
  await waitForStatus(svc, uuid, (s) => s.can_start_upload);
  t.equal((await c.start(uuid, { date_from: '2024-01-01', date_to: yesterday() })).status, 200);
  await waitForStatus(svc, uuid, (s) => s.session_status === 'DONE');

  const after = await scrape(svc.url);
  t.equal(sample(after, 'ingest_http_requests_total', ingested) - sample(before, 'ingest_http_requests_total', ingested), 1, 'one ingest answered 200, counted under its route pattern');
  t.equal(sample(after, 'ingest_http_requests_total', { method: 'POST', route: INGEST_ROUTE, status: '422' }), 1);
  t.equal(sample(after, 'ingest_http_request_duration_seconds_count', ingested), 1, 'and timed');
  t.notOk(after.includes(uuid), 'no raw path (upload uuid) in any label');
  t.equal(sample(after, 'ingest_http_engine_info', { engine: svc.app.edge }), 1, 'the edge that serves is named');
  t.equal(sample(after, 'ingest_rows_validated_total') - sample(before, 'ingest_rows_validated_total'), 7, 'rows of the accepted package');
  t.ok(sample(after, 'ingest_bytes_validated_total') > 0);
  t.equal(sample(after, 'ingest_packages_total', { outcome: 'accepted' }), 1);
  t.equal(sample(after, 'ingest_packages_total', { outcome: 'rejected' }), 1);
  t.equal(sample(after, 'ingest_connector_calls_total', { operation: 'start', outcome: 'ok' }), 1, 'the Connector start is counted');
  t.equal(sample(after, 'ingest_uploader_packages_total', { outcome: 'stored' }), 1);
  t.equal(sample(after, 'ingest_uploader_errors_total'), 0);
  t.equal(sample(after, 'ingest_storage_damaged_records_total'), 0, 'no damaged record found');
  t.notOk(after.includes('ingest_nats_damaged_reads_total'), 'no NATS, no count of its damaged reads');
  t.ok(after.includes('ingest_queue_pending_packages{backend="file"} 0'), 'nothing pending on the embedded queue');
  t.ok(after.includes('ingest_queue_oldest_pending_age_seconds{backend="file"} 0'));
  t.equal(sample(after, 'ingest_pool_workers'), 2);
  t.equal(sample(after, 'ingest_pool_queue_depth'), 0);
  t.equal(sample(after, 'ingest_requests_open'), 0);
  t.ok(sample(after, 'ingest_pool_busy_seconds_total') > 0, 'the workers did some work');
  t.ok(has(after, 'process_cpu_user_seconds_total') && has(after, 'nodejs_eventloop_lag_seconds'), 'default process metrics');

  // A wrong token, and an id that is not sane.
  const wrong = await call(svc.url, 'GET', `${API}/${uuid}/status`, {
    client: { id: DEMO.id, token: 'wrong-secret-token-0123' },
    headers: { 'x-request-id': 'not sane: spaces and "quotes"' },
  });
  t.equal(wrong.status, 401);
  t.match(wrong.headers['x-request-id'], /^[0-9a-f-]{36}$/, 'an insane incoming id is replaced by a fresh one');

  const logs = svc.logs();
  const access = logs.filter((l) => l.msg === 'request');
  t.ok(access.length >= 8, 'one access line per request');
  t.ok(access.every((l) => typeof l.request_id === 'string' && (l.request_id as string).length > 0), 'every access line has a request id');
  t.ok(access.every((l) => l.level === 'info' && typeof l.duration_ms === 'number' && typeof l.method === 'string'));
  const line = access.find((l) => l.request_id === 'obs-test-ingest-1');
  t.match(line, { method: 'POST', route: INGEST_ROUTE, status: 200, client_id: 'demo' }, 'the ingest line names route, status and client');
  t.match(
    access.find((l) => l.status === 401),
    { route: `${API}/:upload_uuid/status`, request_id: wrong.headers['x-request-id'] },
  );
  t.notOk(access.find((l) => l.status === 401)?.client_id, 'no client id when authentication failed');
  const text = svc.lines.join('');
  t.notOk(text.includes(DEMO.token), 'the token is never logged');
  t.notOk(text.includes('wrong-secret-token-0123'), 'nor a wrong one');
  t.notOk(/authorization/i.test(text), 'nor the Authorization header');
});

t.test('/healthz and /readyz on the embedded engines; both outside the rate limit', async (t) => {
  const svc = await startLogged(t, { limits: { requestsPerSecond: 0.001, burst: 1 } });
  for (let i = 0; i < 5; i++) {
    const health = await call(svc.url, 'GET', '/healthz', { client: null });
    t.same([health.status, health.body], [200, { status: 'ok' }]);
  }
  const ready = await call(svc.url, 'GET', '/readyz', { client: null });
  t.same([ready.status, ready.body], [200, { status: 'ready', checks: { workers: 'ok', storage: 'ok' }, http_engine: svc.app.edge }], 'ready, on the edge that serves');
  if (HTTP_ENGINE === 'node' || HTTP_ENGINE === 'uws') t.equal(svc.app.edge, HTTP_ENGINE, 'the edge asked for');
  t.equal((await call(svc.url, 'GET', `${API}/entities`)).status, 200, 'the one /api/v1/ request of the burst');
  t.equal((await call(svc.url, 'GET', `${API}/entities`)).status, 503, 'the API is rate-limited');
  t.equal((await call(svc.url, 'GET', '/healthz', { client: null })).status, 200, 'the probes are not');
  t.equal((await call(svc.url, 'GET', '/readyz', { client: null })).status, 200);
});

t.test('metrics.token guards /metrics; metrics.enabled false removes it; print-config masks the token', async (t) => {
  const guarded = await startLogged(t, { metrics: { token: 'scrape-token-0123456789' } });
  t.equal((await call(guarded.url, 'GET', '/metrics', { client: null })).status, 401);
  t.equal((await call(guarded.url, 'GET', '/metrics', { client: null, headers: { authorization: 'Bearer nope-nope-nope-nope' } })).status, 401);
  const ok = await call(guarded.url, 'GET', '/metrics', { client: null, headers: { authorization: 'Bearer scrape-token-0123456789' } });
  t.equal(ok.status, 200);
  t.match(ok.headers['content-type'], /^text\/plain/);
  t.notOk(guarded.lines.join('').includes('scrape-token-0123456789'), 'the scrape token is not logged');

  const off = await startLogged(t, { metrics: { enabled: false } });
  t.equal((await call(off.url, 'GET', '/metrics', { client: null })).status, 404);
  t.equal((await call(off.url, 'GET', '/healthz', { client: null })).status, 200);

  const config = loadConfig({ METRICS_TOKEN: 'scrape-token-0123456789', LOG_LEVEL: 'warn', READY_TIMEOUT_MS: '500' });
  t.equal(config.log.level, 'warn');
  t.equal(config.health.readyTimeoutMs, 500);
  t.equal(redactConfig(config).metrics.token, '***');
  t.throws(() => loadConfig({ LOG_LEVEL: 'loud' }), /log\.level/);
});

t.test('readiness over NATS and S3: ready, then 503 once NATS is stopped; the uploader serves its own', async (t) => {
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  const svc = await startLogged(t, {
    clientsFile: DEMO_CLIENTS_PATH,
    nats: { url: nats.url },
    s3: { endpoint: s3.endpoint, bucket: s3.bucket, region: s3.region, accessKeyId: s3.accessKeyId, secretAccessKey: s3.secretAccessKey, createBucket: true },
    storage: { inProcessUploader: false },
  });
  const uploader = await spawnUploader(t, { ...distributed(nats.url, s3), metrics: { uploaderPort: 0 } });
  const uploaderUrl = `http://127.0.0.1:${/metrics on port (\d+)/.exec(uploader.output())![1]}`;

  const ready = await call(svc.url, 'GET', '/readyz', { client: null });
  t.same([ready.status, ready.body], [200, { status: 'ready', checks: { workers: 'ok', nats: 'ok', s3: 'ok' }, http_engine: svc.app.edge }]);
  const uploaderReady = await call(uploaderUrl, 'GET', '/readyz', { client: null });
  t.same([uploaderReady.status, uploaderReady.body], [200, { status: 'ready', checks: { nats: 'ok', s3: 'ok' } }]);

  // A package through the separate uploader: the gateway sees the shared queue drain.
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid as string;
  t.equal((await c.ingest(uuid, 'products', products(3))).status, 200);
  // The uploader process stores it: its writes are told too.
  await waitForStatus({ url: svc.url, changes: mergedChanges(svc.ownChanges, uploader.changes) }, uuid, (s) => s.can_start_upload);
  const gateway = await scrape(svc.url);
  t.ok(gateway.includes('ingest_queue_pending_packages{backend="jetstream"} 0'), 'JetStream backlog read at scrape time');
  t.equal(sample(gateway, 'ingest_rows_validated_total'), 3);
  t.equal(sample(gateway, 'ingest_nats_damaged_reads_total'), 0, 'no damaged read from NATS');
  const up = await scrape(uploaderUrl);
  t.equal(sample(up, 'ingest_uploader_packages_total', { outcome: 'stored' }), 1, 'the uploader process counts what it stored');
  t.ok(up.includes('ingest_queue_pending_packages{backend="jetstream"} 0'));
  t.equal(sample(up, 'ingest_nats_damaged_reads_total'), 0, 'nor in the uploader');

  await nats.stop();
  const down = await call(svc.url, 'GET', '/readyz', { client: null });
  t.equal(down.status, 503);
  t.equal(down.body.detail, 'Not ready');
  t.equal(down.body.checks.workers, 'ok');
  t.equal(down.body.checks.s3, 'ok');
  t.not(down.body.checks.nats, 'ok', `nats check: ${down.body.checks.nats}`);
  t.equal((await call(svc.url, 'GET', '/healthz', { client: null })).status, 200, 'still alive');
  const outage = await scrape(svc.url);
  t.notOk(outage.includes('ingest_queue_pending_packages{'), 'a scrape during the outage answers, without the backlog it cannot read');
  t.equal((await call(uploaderUrl, 'GET', '/readyz', { client: null })).status, 503, 'the uploader is not ready either');
  t.ok(
    svc.logs().some((l) => l.msg === 'readiness check failing' && l.check === 'nats' && l.level === 'warn'),
    'the failing check is logged once, as a warning',
  );
});
