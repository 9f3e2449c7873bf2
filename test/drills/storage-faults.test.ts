/**
 * Storage faults that are not crashes, on a running embedded gateway: its DATA_DIR fills up
 * (a tmpfs), then space is freed; the state database's fsync fails with EIO (strace's fault
 * injection on the running process). The checker, as in the kill drill: every 200 stored exactly once,
 * nothing answered otherwise stored; while storage fails the answers are 503 `Storage
 * temporarily unavailable` (never 500) and `/readyz` says not ready naming `storage`; once
 * the fault clears the same process answers 200 again, without a restart.
 */
import { execFileSync } from 'node:child_process';
import { closeSync, openSync, realpathSync, unlinkSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { request } from 'undici';
import { FileObjectStore } from '../../src/store/embedded/object-store.js';
import { manifestKey } from '../../src/store/keys.js';
import { STATE_DB } from '../../src/store/engines.js';
import { readText } from '../support/objects.js';
import { strace } from '../support/strace.js';
import { clientOf, tempDir, waitForStatus, yesterday } from '../support/harness.js';
import { spawnGateway, type GatewayProc } from '../../testbed/processes.js';
import { checkStored, drillPackage, embeddedRecord, readObjects, writeClients, type DrillClient, type Outcome, type RecordedSession } from '../support/drills.js';

const CLIENTS = 4;
const LANES = 32;
const ROWS = 40;

interface Session {
  client: DrillClient;
  uuid: string;
}

/** Senders in `LANES` lanes, one package after the other each, until `done` says stop; every answer is kept. */
function load(gw: GatewayProc, sessions: Session[], phase: string, outcomes: Map<string, Outcome>, done: () => boolean): Promise<void> {
  const sender = async (s: Session, lane: number) => {
    const api = clientOf(gw, s.client);
    for (let k = 0; !done(); k++) {
      const pkg = `${s.client.id}~${phase}~${lane}/${k}`;
      let outcome: Outcome;
      try {
        outcome = (await api.ingest(s.uuid, 'products', drillPackage(pkg.slice(0, pkg.lastIndexOf('/')), k, ROWS))).status;
      } catch {
        outcome = 'no-answer';
      }
      outcomes.set(pkg, outcome);
    }
  };
  return Promise.all(Array.from({ length: LANES }, (_, lane) => sender(sessions[lane % sessions.length]!, lane))).then(() => undefined);
}

const statusCounts = (outcomes: Map<string, Outcome>): Record<string, number> => {
  const counts: Record<string, number> = {};
  for (const o of outcomes.values()) counts[o] = (counts[o] ?? 0) + 1;
  return counts;
};

const count = (outcomes: Map<string, Outcome>, pred: (o: Outcome) => boolean) => [...outcomes.values()].filter(pred).length;

async function readyz(gw: GatewayProc): Promise<{ status: number; body: any }> {
  const res = await request(`${gw.url}/readyz`);
  return { status: res.statusCode, body: await res.body.json() };
}

/** The gateway and a session per client of the load; with `spare`, one more session the load leaves alone. */
async function setup(t: Test, dataDir: string, spare = false) {
  const dir = await tempDir(t, 'drill-storage-');
  const { file, clients } = await writeClients(dir, CLIENTS + (spare ? 1 : 0));
  const config = {
    dataDir,
    clientsFile: file,
    limits: { requestsPerSecond: 0, concurrentPerClient: 0 },
    ingest: { workers: 2, maxQueue: 256 },
    connector: { webhookSecret: 'drill-webhook-secret-0123456789', emulatorDelayMs: 50 },
  };
  const gw = await spawnGateway(t, config as never);
  const sessions: Session[] = [];
  for (const client of clients) sessions.push({ client, uuid: (await clientOf(gw, client).init()).body.upload_uuid });
  return { gw, sessions: sessions.slice(0, CLIENTS), spare: sessions[CLIENTS] };
}

/** Drains, hands every session to the Connector, stops the gateway and checks what was stored against what was answered. */
async function settle(t: Test, gw: GatewayProc, sessions: Session[], dataDir: string, outcomes: Map<string, Outcome>) {
  const records = new Map<string, RecordedSession>();
  for (const s of sessions) {
    await waitForStatus(gw, s.uuid, (b) => b.upload_tasks_finished, s.client, 120_000);
    const record = (await embeddedRecord(dataDir, s.uuid))!;
    records.set(s.uuid, record);
    const start = await clientOf(gw, s.client).start(s.uuid, { date_from: '2024-01-01', date_to: yesterday() });
    t.equal(start.status, 200, `${s.client.id}: start-upload`);
    t.same(start.body.entities, [{ name: 'products', rows: record.packages.length * ROWS }], `${s.client.id}: the Connector counts the recorded rows`);
  }
  t.equal(await gw.stop(), 0);
  const store = await FileObjectStore.open(join(dataDir, 'objects'));
  t.teardown(() => store.close());
  // A session of more than 1,000 objects also holds the manifest the Connector was handed
  // (service.ts): not a package, but the list of the session's package objects.
  const manifests = new Map(sessions.map((s) => [manifestKey('uploads', s.client.id, s.uuid), s.uuid]));
  const all = await readObjects(store);
  const objects = all.filter((o) => !manifests.has(o.key));
  for (const [key, uuid] of manifests) {
    const text = await readText(store, key);
    if (text === null) continue;
    const listed = text.split('\n').filter((l) => l !== '').map((l) => (JSON.parse(l) as { key: string }).key).sort();
    const stored = objects.filter((o) => o.header.upload_uuid === uuid).map((o) => o.key).sort();
    t.same(listed, stored, `${key}: the manifest names exactly the session's ${stored.length} package objects`);
  }
  const { statuses } = checkStored(t, objects, records, outcomes, ROWS);
  t.comment(`answers ${JSON.stringify([...statuses])}`);
  const other = [...statuses.keys()].filter((s) => s !== 200 && s !== 503);
  t.same(other, [], 'every answer is 200 or 503');
}

t.test('disk full, then space freed: 503 while full, readiness tells, 200 again without a restart', async (t) => {
  const dataDir = await tempDir(t, 'drill-full-');
  execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=64m', 'tmpfs', dataDir]);
  t.teardown(() => execFileSync('umount', ['-l', dataDir]));
  const { gw, sessions, spare } = await setup(t, dataDir, true);
  const outcomes = new Map<string, Outcome>();
  await load(gw, sessions, 'before', outcomes, () => count(outcomes, (o) => o === 200) >= 300);
  // A session with a package to hand over, asked to start while the disk is full.
  const handOver = clientOf(gw, spare!.client);
  const spareIngest = await handOver.ingest(spare!.uuid, 'products', drillPackage('spare', 0, ROWS));
  t.equal(spareIngest.status, 200);
  outcomes.set('spare/0', spareIngest.status);
  await waitForStatus(gw, spare!.uuid, (b) => b.upload_tasks_finished, spare!.client, 60_000);

  // Another tenant of the file system takes every byte left.
  const ballast = join(dataDir, 'ballast');
  const fd = openSync(ballast, 'w');
  try {
    for (const chunk = Buffer.alloc(256 * 1024); ; ) writeSync(fd, chunk);
  } catch (err) {
    t.equal((err as NodeJS.ErrnoException).code, 'ENOSPC', 'the file system is full');
  } finally {
    closeSync(fd);
  }
  const full = new Map<string, Outcome>();
  await load(gw, sessions, 'full', full, () => count(full, (o) => o !== 200) >= 100);
  const ready = await readyz(gw);
  t.equal(ready.status, 503, 'not ready while the disk is full');
  t.match(ready.body, { detail: 'Not ready', checks: { storage: 'failed' } });
  t.comment(`while full: ${JSON.stringify(statusCounts(full))}; readiness ${JSON.stringify(ready.body)}`);
  // Whichever write fails first (the session's start, the Connector emulator's state), the answer is the storage's.
  const start = await handOver.start(spare!.uuid, { date_from: '2024-01-01', date_to: yesterday() });
  t.match(start, { status: 503, body: { detail: 'Storage temporarily unavailable' } }, 'start-upload on a full disk');
  t.equal(start.headers['retry-after'], '5');

  unlinkSync(ballast);
  const after = new Map<string, Outcome>();
  await load(gw, sessions, 'freed', after, () => count(after, (o) => o === 200) >= 300 || after.size >= 5000);
  t.ok(count(after, (o) => o === 200) >= 300, `the same process answers 200 again (${JSON.stringify(statusCounts(after))})`);
  t.equal((await readyz(gw)).status, 200, 'ready again');
  for (const m of [full, after]) for (const [k, v] of m) outcomes.set(k, v);
  // The spare session's start failed and was put back: it starts now, with its package.
  await settle(t, gw, [...sessions, spare!], dataDir, outcomes);
});

t.test('the service fills its own disk: every answer true, and 200 again once space is freed', async (t) => {
  const dataDir = await tempDir(t, 'drill-fill-');
  execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=24m', 'tmpfs', dataDir]);
  t.teardown(() => execFileSync('umount', ['-l', dataDir]));
  const { gw, sessions } = await setup(t, dataDir);
  const outcomes = new Map<string, Outcome>();
  await load(gw, sessions, 'fill', outcomes, () => count(outcomes, (o) => o !== 200) >= 50);
  t.comment(`full after ${count(outcomes, (o) => o === 200)} × 200`);
  execFileSync('mount', ['-o', 'remount,size=512m', dataDir]);
  const after = new Map<string, Outcome>();
  await load(gw, sessions, 'freed', after, () => count(after, (o) => o === 200) >= 300 || after.size >= 5000);
  t.ok(count(after, (o) => o === 200) >= 300, `the same process answers 200 again (${JSON.stringify(statusCounts(after))})`);
  for (const [k, v] of after) outcomes.set(k, v);
  await settle(t, gw, sessions, dataDir, outcomes);
});

t.test('the state database fails to sync (EIO): the requests that needed it fail with 503, the next ones succeed', async (t) => {
  const dataDir = join(await tempDir(t, 'drill-eio-'), 'data');
  const { gw, sessions } = await setup(t, dataDir);
  const outcomes = new Map<string, Outcome>();
  await load(gw, sessions, 'before', outcomes, () => count(outcomes, (o) => o === 200) >= 200);

  // From the 20th sync of the state database's write-ahead log after strace has attached to
  // every thread (-P: only calls on that file count), every 10th fails with EIO, 21 in all.
  // SQLite syncs with fsync (fdatasync where built for it): a 200 waits for it. Spread out,
  // since many transactions carry no client's write (the uploader's acks and stored counts,
  // checkpoints, the fence after a failure): a few failures in a row may all land there.
  const wal = realpathSync(join(dataDir, `${STATE_DB}-wal`));
  const fault = await strace(t, gw.child.pid!, ['-P', wal, '-e', 'trace=fsync,fdatasync', '-e', 'inject=fsync,fdatasync:error=EIO:when=20..220+10']);
  const during = new Map<string, Outcome>();
  // Until the failures were answered and 400 packages stored; bounded should they never come.
  await load(gw, sessions, 'eio', during, () => (count(during, (o) => o === 503) > 0 && count(during, (o) => o === 200) >= 400) || during.size >= 20_000);
  await fault.stop();
  t.ok(count(during, (o) => o === 503) > 0, `the injected failures were answered 503 (${count(during, (o) => o === 503)})`);
  t.equal((await readyz(gw)).status, 200, 'ready');
  for (const [k, v] of during) outcomes.set(k, v);
  await settle(t, gw, sessions, dataDir, outcomes);
});
