/**
 * Drill 6: SIGTERM. The gateway stops accepting (new connections are refused), lets the
 * ingests in flight finish (each answered 200, with `Connection: close`), closes the pool, the
 * uploader and the stores in that order, and exits 0; after a restart every one of those
 * packages is stored exactly once. An ingest that outlasts `limits.shutdownGraceMs` is cut
 * (no answer, nothing stored) and the exit is still 0.
 * CI: 50 ingests held mid-body per backend. DRILL_LONG=1: 200, with bigger bodies.
 */
import { connect } from 'node:net';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import t, { type Test } from 'tap';
import { request } from 'undici';
import { FileObjectStore } from '../../src/store/embedded/object-store.js';
import type { ObjectStore } from '../../src/store/ports.js';
import { API, clientOf, tempDir, waitForStatus, whenChanged, yesterday } from '../support/harness.js';
import { startNats } from '../../testbed/nats.js';
import { distributed, spawnGateway, type GatewayProc } from '../../testbed/processes.js';
import { startS3 } from '../../testbed/s3.js';
import {
  drillPackage,
  embeddedRecord,
  type RecordedSession,
  natsRecords,
  openS3,
  packageOfRow,
  readObjects,
  since,
  size,
  until,
  writeClients,
  type DrillClient,
} from '../support/drills.js';

const CLIENTS = 4;
const IN_FLIGHT = size(50, 200);
const ROWS = size(200, 2000);

interface Held {
  pkg: string;
  /** Sends the rest of the body. */
  finish(): void;
  answer: Promise<{ status: number; connection: string | undefined; body: any } | 'no-answer'>;
}

/** An ingest whose body stops half-way until `finish()`: the gateway has it in flight. */
function heldIngest(url: string, client: DrillClient, uuid: string, tag: string, n: number): Held {
  const text = JSON.stringify(drillPackage(tag, n, ROWS));
  const cut = Math.floor(text.length / 2);
  const body = new PassThrough();
  body.write(text.slice(0, cut));
  const answer = request(`${url}${API}/${uuid}/products`, {
    method: 'POST',
    headers: { authorization: client.token, 'client-id': client.id, 'content-type': 'application/json' },
    body,
  }).then(
    async (res) => ({ status: res.statusCode, connection: res.headers.connection as string | undefined, body: await res.body.json() }),
    () => 'no-answer' as const,
  );
  return { pkg: `${tag}/${n}`, finish: () => body.end(text.slice(cut)), answer };
}

/** Resolves with the error code of a fresh TCP connection attempt ('connected' if it got through). */
function tryConnect(port: number): Promise<string> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    socket.once('connect', () => {
      socket.destroy();
      resolve('connected');
    });
    socket.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
  });
}

interface Backend {
  name: string;
  config: Record<string, unknown>;
  records: (uuid: string) => Promise<RecordedSession | null>;
  objects: () => Promise<ObjectStore>;
}

async function openSessions(gw: GatewayProc, clients: DrillClient[]) {
  const sessions: { client: DrillClient; uuid: string }[] = [];
  for (const client of clients) sessions.push({ client, uuid: (await clientOf(gw, client).init()).body.upload_uuid });
  return sessions;
}

async function drill(t: Test, backend: Backend, dir: string) {
  const { file, clients } = await writeClients(dir, CLIENTS);
  const config = {
    ...backend.config,
    clientsFile: file,
    limits: { requestsPerSecond: 0, concurrentPerClient: 0, shutdownGraceMs: 60_000 },
    ingest: { workers: 2, maxQueue: 256 },
    connector: { webhookSecret: 'drill-webhook-secret-0123456789', emulatorDelayMs: 50 },
  };
  const gw = await spawnGateway(t, config as never);
  const port = Number(new URL(gw.url).port);
  const sessions = await openSessions(gw, clients);

  const held = Array.from({ length: IN_FLIGHT }, (_, i) => {
    const s = sessions[i % sessions.length]!;
    return { ...heldIngest(gw.url, s.client, s.uuid, `${s.client.id}~${i}`, i), session: s };
  });
  // Every one of them is past its session checks and holds its lease: in flight.
  let inFlight = 0;
  await whenChanged(
    gw,
    async () => {
      inFlight = 0;
      for (const s of sessions) inFlight += Object.keys((await backend.records(s.uuid))?.in_flight ?? {}).length;
      return inFlight === IN_FLIGHT;
    },
    () => `ingests in flight: ${inFlight} of ${IN_FLIGHT}`,
    30_000,
  );

  const t0 = performance.now();
  const exited = gw.stop();
  await until('the gateway to take the signal', async () => gw.output(), (out) => out.includes('"gateway stopping"'), 10_000, 10);
  t.equal(await tryConnect(port), 'ECONNREFUSED', 'a new connection is refused once SIGTERM arrived');
  t.equal(gw.child.exitCode, null, 'the gateway waits for its in-flight ingests');

  for (const h of held) h.finish();
  const answers = await Promise.all(held.map((h) => h.answer));
  const ok = answers.filter((a) => a !== 'no-answer' && a.status === 200 && a.body.rows_processed === ROWS);
  t.equal(ok.length, IN_FLIGHT, `all ${IN_FLIGHT} ingests in flight at SIGTERM answered 200`);
  t.ok(
    answers.every((a) => a !== 'no-answer' && a.connection === 'close'),
    'each answered with Connection: close',
  );
  t.equal(await exited, 0, 'exit code 0');
  const stopMs = since(t0);
  t.comment(`${backend.name}: SIGTERM with ${IN_FLIGHT} ingests in flight (${ROWS} rows each): exit 0 after ${stopMs} ms`);

  // A new process on the same data: every package is there, once, and the flow goes on.
  const again = await spawnGateway(t, config as never);
  for (const s of sessions) {
    await waitForStatus(again, s.uuid, (b) => b.upload_tasks_finished, s.client, 60_000);
    const record = (await backend.records(s.uuid))!;
    const sent = held.filter((h) => h.session === s).length;
    t.equal(record.packages.length, sent, `${s.client.id}: every package recorded`);
    t.same(record.in_flight, {}, `${s.client.id}: no lease left`);
    const start = await clientOf(again, s.client).start(s.uuid, { date_from: '2024-01-01', date_to: yesterday() });
    t.same(start.body.entities, [{ name: 'products', rows: sent * ROWS }], `${s.client.id}: start-upload counts every row`);
    await waitForStatus(again, s.uuid, (b) => b.session_status === 'DONE', s.client);
  }
  t.equal(await again.stop(), 0);

  const store = await backend.objects();
  t.teardown(() => store.close());
  const objects = await readObjects(store);
  const stored = new Map<string, number>();
  for (const o of objects) for (const p of new Set(o.ids.map(packageOfRow))) stored.set(p, (stored.get(p) ?? 0) + 1);
  t.equal(objects.length, IN_FLIGHT, 'one object per package');
  t.ok(
    held.every((h) => stored.get(h.pkg) === 1),
    'every package in flight at SIGTERM is stored exactly once',
  );
  t.ok(
    objects.every((o) => o.ids.length === ROWS && new Set(o.ids).size === ROWS),
    'each whole, each row once',
  );
}

t.test('embedded: SIGTERM finishes the ingests in flight, refuses new connections, exits 0', async (t) => {
  const dir = await tempDir(t, 'drill-sigterm-');
  const dataDir = join(dir, 'data');
  await drill(
    t,
    {
      name: 'embedded',
      config: { dataDir },
      records: (uuid) => embeddedRecord(dataDir, uuid),
      objects: () => FileObjectStore.open(join(dataDir, 'objects')),
    },
    dir,
  );
});

t.test('NATS + S3: SIGTERM finishes the ingests in flight, refuses new connections, exits 0', async (t) => {
  const dir = await tempDir(t, 'drill-sigterm-');
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  await drill(t, { name: 'nats-s3', config: distributed(nats.url, s3), records: await natsRecords(t, nats.url), objects: () => openS3(s3) }, dir);
});

t.test('embedded: an ingest that outlasts the shutdown grace is cut, nothing of it stored, exit 0', async (t) => {
  const dir = await tempDir(t, 'drill-sigterm-');
  const dataDir = join(dir, 'data');
  const { file, clients } = await writeClients(dir, 1);
  const client = clients[0]!;
  const config = { dataDir, clientsFile: file, limits: { shutdownGraceMs: 4000 }, ingest: { workers: 2 } };
  const gw = await spawnGateway(t, config as never);
  const uuid = (await clientOf(gw, client).init()).body.upload_uuid;
  const done = heldIngest(gw.url, client, uuid, 'finishes', 0);
  const stuck = heldIngest(gw.url, client, uuid, 'stuck', 0);
  let inFlight = 0;
  await whenChanged(
    gw,
    async () => (inFlight = Object.keys((await embeddedRecord(dataDir, uuid))?.in_flight ?? {}).length) === 2,
    () => `ingests in flight: ${inFlight} of 2`,
    10_000,
  );

  const t0 = performance.now();
  const exited = gw.stop();
  await until('the gateway to take the signal', async () => gw.output(), (out) => out.includes('"gateway stopping"'), 10_000, 10);
  done.finish();
  const first = await done.answer;
  t.equal(first !== 'no-answer' && first.status, 200, 'the ingest that finishes in time is answered 200', { first, out: gw.output().slice(-3000) });
  t.equal(await exited, 0, 'exit code 0 after the grace');
  const stopMs = since(t0);
  t.ok(stopMs >= 3900, `exited after the grace (${stopMs} ms)`);
  t.equal(await stuck.answer, 'no-answer', 'the stuck ingest was cut, unanswered');
  t.match(gw.output(), /in-flight requests cut at the end of the shutdown grace/);

  const again = await spawnGateway(t, config as never);
  await waitForStatus(again, uuid, (b) => b.upload_tasks_finished, client, 30_000);
  const record = (await embeddedRecord(dataDir, uuid))!;
  t.equal(record.packages.length, 1, 'only the finished package is recorded');
  t.equal(await again.stop(), 0);
  const store = await FileObjectStore.open(join(dataDir, 'objects'));
  t.teardown(() => store.close());
  const objects = await readObjects(store);
  t.same(
    objects.map((o) => packageOfRow(o.ids[0]!)),
    ['finishes/0'],
    'the finished package is stored, the cut one is not',
  );
});
