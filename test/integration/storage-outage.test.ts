/**
 * NATS that does not answer (the server frozen with SIGSTOP: a hung disk, a paused VM) or
 * whose streams are gone: every endpoint that needs its state answers 503 `Storage
 * temporarily unavailable` with `Retry-After` (docs/api.md, Storage unavailable), never
 * 400, 404 or 500, nothing of such a request is stored, and the gateway serves again by
 * itself once NATS answers. An ingest whose record write's outcome NATS leaves unknown gets no
 * answer at all (docs/api.md, Storage unavailable): its write may still land.
 */
import t, { type Test } from 'tap';
import { request } from 'undici';
import { loadConfig } from '../../src/config/config.js';
import { until } from '../support/drills.js';
import { freezingProxy } from '../support/freezing-proxy.js';
import { API, call, clientOf, DEMO2, leasesLapsed, products, waitForStatus, yesterday, type Answer } from '../support/harness.js';
import { startNats } from '../../testbed/nats.js';
import { distributed, spawnGateway } from '../../testbed/processes.js';
import { startS3 } from '../../testbed/s3.js';

const UNAVAILABLE = { detail: 'Storage temporarily unavailable' };

function unavailable(t: Test, what: string, res: Answer): void {
  t.same([res.status, res.body], [503, UNAVAILABLE], `${what}: 503 Storage temporarily unavailable`);
  t.match(res.headers['retry-after'], /^[1-9]\d*$/, `${what}: with Retry-After`);
}

/**
 * Until `probe` answers 200 (bounded: the gateway reconnects by itself). Polled: what ends the
 * wait is nats-server answering again (its reconnection), no write of the gateway.
 */
async function until200(what: string, probe: () => Promise<Answer>, timeoutMs = 30_000): Promise<Answer> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const res = await probe();
    if (res.status === 200) return res;
    if (Date.now() > deadline) throw new Error(`${what} never answered 200: ${res.status} ${res.text}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

t.test('NATS frozen (SIGSTOP): 503 with Retry-After on every endpoint, then 200 again after SIGCONT without a restart', async (t) => {
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  const base = distributed(nats.url, s3);
  const gw = await spawnGateway(t, { ...base, nats: { ...base.nats, requestTimeoutMs: 1000 } });
  const demo = clientOf(gw);
  const other = clientOf(gw, DEMO2);
  const uuid = (await demo.init()).body.upload_uuid as string;
  t.equal((await demo.ingest(uuid, 'products', products(10))).status, 200);
  const otherUuid = (await other.init()).body.upload_uuid as string;

  nats.pause();
  t.teardown(() => nats.resume());
  const t0 = Date.now();
  const [ingest, status, init, start, remove, ready] = await Promise.all([
    // Closed unanswered (no status): a record write of unknown outcome, which may land later.
    demo.ingest(uuid, 'products', products(7, 100)).catch((err: unknown): Answer => ({ status: 0, headers: {}, body: undefined, text: `closed: ${(err as { code?: string }).code}` })),
    demo.status(uuid),
    call(gw.url, 'POST', `${API}/initialize-session`, { client: { id: 'demo-2', token: 'demo-2-token' } }),
    demo.start(uuid, { date_from: '2024-01-01', date_to: yesterday() }),
    other.remove(otherUuid),
    call(gw.url, 'GET', '/readyz', { client: null }),
  ]);
  const answeredAt = Date.now();
  const tookMs = answeredAt - t0;
  // Unanswered only if its queue commit was acknowledged before the freeze (not expected here).
  if (ingest.status === 0) t.comment(`ingest ${ingest.text}: its record's outcome unknown`);
  else unavailable(t, 'ingest', ingest);
  unavailable(t, 'status', status);
  unavailable(t, 'initialize-session', init);
  unavailable(t, 'start-upload', start);
  unavailable(t, 'delete', remove);
  t.equal(ready.status, 503, '/readyz 503 while NATS does not answer');
  t.match(ready.body, { detail: 'Not ready', checks: { nats: /^(failed|timeout)$/ } }, '/readyz names the failing check');
  t.ok(tookMs < 60_000, `answered within the request timeout (${tookMs} ms)`);
  // The log line and the answers come on different pipes: the line is waited for, not read at once.
  const logged503 = /"level":"error"[^\n]*"code":"STORE_UNAVAILABLE"[^\n]*"msg":"storage unavailable: answered 503"/;
  t.match(await until('the 503 logged', async () => gw.output(), (o) => logged503.test(o), 10_000, 20), logged503, 'the cause is logged (once every 10 s at most)');

  nats.resume();
  await until200('status', () => demo.status(uuid));
  t.equal((await until200('ingest', () => demo.ingest(uuid, 'products', products(5, 200)))).status, 200, 'ingest serves again');
  t.equal((await until200('readyz', () => call(gw.url, 'GET', '/readyz', { client: null }))).status, 200, 'ready again');

  // Nothing of the 503 ingest is stored: the Connector counts 10 + 5 rows. Its lease, whose
  // write may land when NATS resumes (after the release was tried), ends by lapsing, which no
  // write tells: waited out first (it was taken before the 503 answer).
  await leasesLapsed(answeredAt, loadConfig({}).ingest.inFlightLeaseMs);
  await waitForStatus(gw, uuid, (s) => s.can_start_upload, undefined, 30_000);
  const started = await demo.start(uuid, { date_from: '2024-01-01', date_to: yesterday() });
  t.equal(started.status, 200, `start-upload: ${started.text}`);
  const counted = (started.body.entities as { rows: number }[] | undefined)?.[0]?.rows;
  const rows =
    ingest.status === 0 && counted === 22
      ? t.pass('the unanswered ingest was recorded after all')
      : t.same(started.body.entities, [{ name: 'products', rows: 15 }], 'the rows of the 200s, and none of the 503');
  // Seen once, under three suites' load at once (22 rows: the 503's 7 stored, the slowest answer
  // 40 s in: the shape of a record of unknown outcome, now closed unanswered, as the next test
  // shows; how the commit before it was acknowledged is not known): the gateway's log, for the next time.
  if (!rows || ingest.status === 0) t.comment(`slowest answer ${tookMs} ms; ingest ${ingest.status} ${ingest.text}; the gateway's log:\n${gw.output().split('\n').slice(-150).join('\n')}`);
});

t.test('NATS stops answering right after a queue commit was acknowledged: its record write waits in the socket, so the ingest gets no answer (not a 503), and a keyed retry gets the 200 once it landed', async (t) => {
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  // What the gateway sends while frozen waits, as in a stopped server's socket, and lands at the thaw.
  const proxy = await freezingProxy(t, nats.url);
  t.teardown(() => proxy.thaw());
  const base = distributed(proxy.url, s3);
  const gw = await spawnGateway(t, { ...base, nats: { ...base.nats, requestTimeoutMs: 1000 } });
  const demo = clientOf(gw);
  const uuid = (await demo.init()).body.upload_uuid as string;
  t.equal((await demo.ingest(uuid, 'products', products(3))).status, 200);

  proxy.arm(/^INGEST\.c\./); // the package's queue commit
  const keyed = () => call(gw.url, 'POST', `${API}/${uuid}/products`, { body: products(7, 100), headers: { 'idempotency-key': 'record-in-doubt' } });
  const outcome = await keyed().then(
    (res) => `answered ${res.status} ${res.text}`,
    (err: unknown) => `closed: ${(err as { code?: string }).code}`,
  );
  t.match(outcome, /^closed: UND_ERR_SOCKET$/, `no answer: neither 200 nor 503 is known to be true (${outcome})`);

  proxy.thaw();
  // The record write lands at the thaw: a 503 would have been false.
  const landed = await waitForStatus(gw, uuid, (s) => s.totals?.rows === 10, undefined, 30_000);
  t.same([landed.totals.packages, landed.totals.rows], [2, 10], "the doubted package's rows are recorded");
  const retry = await until200('the keyed retry', keyed);
  t.same(retry.body, { status: 'success', message: '7 rows of products validated and queued for storage', rows_processed: 7 }, 'the retry with its key gets the 200');
  const done = await waitForStatus(gw, uuid, (s) => s.upload_tasks_finished === true, undefined, 30_000);
  t.same([done.totals.packages, done.totals.rows, done.totals.stored_packages], [2, 10, 2], 'stored once');
  const loggedUnknown = /"code":"OUTCOME_UNKNOWN"[^\n]*"msg":"outcome unknown: connection closed without an answer"/;
  t.match(gw.output(), loggedUnknown, 'the connection closed unanswered is logged, with its code');
});

t.test('a stream lost under a running gateway: 503, never 400 or 404, and said loudly', async (t) => {
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  const gw = await spawnGateway(t, distributed(nats.url, s3));
  const demo = clientOf(gw);
  const uuid = (await demo.init()).body.upload_uuid as string;
  t.equal((await demo.ingest(uuid, 'products', products(3))).status, 200);

  // What a NATS server that came back without its data, or an operator's mistake, leaves.
  const { connect } = await import('nats');
  const nc = await connect({ servers: nats.url });
  t.teardown(() => nc.close());
  const jsm = await nc.jetstreamManager();
  await jsm.streams.delete('KV_ingest_sessions');

  unavailable(t, 'status', await demo.status(uuid));
  unavailable(t, 'ingest', await demo.ingest(uuid, 'products', products(3)));
  unavailable(t, 'initialize-session', await call(gw.url, 'POST', `${API}/initialize-session`, { client: DEMO2 }));
  const ready = await call(gw.url, 'GET', '/readyz', { client: null });
  t.equal(ready.status, 503, '/readyz 503');
  t.match(ready.body, { detail: 'Not ready', checks: { nats: 'failed' } }, '/readyz names the failing check');
  const loggedMissing = /KV_ingest_sessions missing[^\n]*readiness check failing/;
  t.match(await until('the missing stream logged', async () => gw.output(), (o) => loggedMissing.test(o), 10_000, 20), loggedMissing, 'and the log the missing stream');

  // A gateway started on that server makes the stream again, and says what was lost.
  const again = await spawnGateway(t, distributed(nats.url, s3));
  t.match(again.output(), /"level":"?(error|50)"?[^\n]*KV_ingest_sessions|KV_ingest_sessions[^\n]*"level":"?(error|50)"?/, 'logged as an error, naming the stream');
  const res = await request(`${again.url}/readyz`);
  await res.body.dump();
  t.equal(res.statusCode, 200, 'the new gateway is ready');
});
