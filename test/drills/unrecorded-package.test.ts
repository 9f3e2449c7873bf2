/**
 * Drill 1, the narrow window made certain: the gateway dies after an ingest committed its
 * package to the queue and before the session recorded it, so no 200 went out. The kill drill
 * (gateway-kill.test.ts) lands there now and then; here the stores are written exactly as the
 * dead gateway left them (a lease, a committed queue package, no record of it), and the
 * uploader must drop the package instead of storing it:
 * - embedded: the restarted gateway releases the dead process's leases at start, so the
 *   package is dropped at once;
 * - NATS + S3: the lease holds the package back until it expires (another gateway might still
 *   record it), then the uploader revokes it and drops the package; a commit that comes after
 *   the revocation is refused.
 * The same holds for an answer the server gave on its own while the handler went on: a 408 at
 * `limits.requestTimeoutMs` that lands after the last row arrived, while the package is being
 * committed, must not be followed by the package being recorded and stored. The request
 * timeout hunts the end of a big gzip package's validation (CI 8 attempts, long 40).
 */
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import t from 'tap';
import { request } from 'undici';
import { recoverLeftovers } from '../../src/session/recovery.js';
import { decideIngestBegin, decideIngestRecord, fromStored, packageFate, type SessionRecord } from '../../src/session/state.js';
import { FileBatchQueue } from '../../src/store/embedded/batch-queue.js';
import { SqliteLedger } from '../../src/store/embedded/ledger.js';
import { FileObjectStore } from '../../src/store/embedded/object-store.js';
import { SqliteSessionStore } from '../../src/store/embedded/session-store.js';
import { STATE_DB } from '../../src/store/engines.js';
import { sessionKey } from '../../src/store/keys.js';
import { NatsBatchQueue } from '../../src/store/nats/batch-queue/index.js';
import { connectNats } from '../../src/store/nats/connection.js';
import { NatsSessionStore } from '../../src/store/nats/session-store.js';
import type { BatchQueue, SessionStore } from '../../src/store/ports.js';
import { API, clientOf, DEMO, products, startService, tempDir, waitForStatus } from '../support/harness.js';
import { startNats } from '../../testbed/nats.js';
import { distributed, spawnGateway } from '../../testbed/processes.js';
import { startS3 } from '../../testbed/s3.js';
import { embeddedRecord, natsRecords, openS3, readObjects, since, size } from '../support/drills.js';

const ORPHAN = '00000000-0000-4000-8000-00000000dead';

/** What a gateway killed between `writer.commit` and `recordIngest` leaves behind. */
async function forgeOrphan(sessions: SessionStore, queue: BatchQueue, uploadUuid: string, leaseMs: number): Promise<void> {
  const current = (await sessions.get<SessionRecord>(sessionKey(uploadUuid)))!;
  const begun = decideIngestBegin(fromStored(current.value), ORPHAN, Date.now(), leaseMs);
  if (!begun.ok) throw begun.error;
  await sessions.update(sessionKey(uploadUuid), begun.next, current.revision);
  const writer = await queue.open({ package_id: ORPHAN, client_id: 'demo', upload_uuid: uploadUuid, entity: 'products', columns: ['product_id', 'name', 'price'] });
  await writer.append(Buffer.from('["orphan-1","Never answered",1]\n["orphan-2","Never answered",2]\n'));
  await writer.commit({ rows: 2, bytes: 64 });
}

t.test('the decisions: the uploader stores only what the session records; recording needs the live lease', async (t) => {
  const now = 1_000_000;
  const pkg = { entity: 'products', rows: 1, bytes: 1, object_bytes: 100 };
  const base: SessionRecord = {
    upload_uuid: 'u',
    client_id: 'c',
    status: 'UPLOADING',
    entities: ['products'],
    totals: {},
    recording: { kept: pkg },
    in_flight: { live: now + 1, expired: now - 1 },
    created_at: '',
    updated_at: '',
  };
  t.equal(packageFate(base, 'kept', now), 'store');
  t.equal(packageFate(base, 'live', now), 'wait', 'its ingest may still record it');
  t.equal(packageFate(base, 'expired', now), 'revoke', 'revoked before it is dropped');
  t.equal(packageFate(base, 'gone', now), 'ledger', 'no lease, not recording: folded (in the ledger) or never recorded');
  t.equal(packageFate({ ...base, deleted: true }, 'kept', now), 'drop', 'a deleted session stores nothing');
  t.ok(decideIngestRecord(base, { id: 'live', ...pkg }, now).ok, 'a live lease records');
  for (const id of ['expired', 'gone']) {
    const d = decideIngestRecord(base, { id, ...pkg }, now);
    t.ok(!d.ok && d.error.statusCode >= 500, `${id} lease: recording is refused (5xx), never a 200 for a dropped package`);
  }
});

t.test('embedded: a queue-committed, unrecorded package is dropped after the restart', async (t) => {
  const dir = await tempDir(t, 'drill-orphan-');
  const dataDir = join(dir, 'data');
  const config = { dataDir, connector: { emulatorDelayMs: 50 } };
  const gw = await spawnGateway(t, config as never);
  const c = clientOf(gw);
  const uuid = (await c.init()).body.upload_uuid;
  t.equal((await c.ingest(uuid, 'products', products(3))).status, 200);
  await waitForStatus(gw, uuid, (b) => b.upload_tasks_finished);
  await gw.kill();

  const sessions = await SqliteSessionStore.open(join(dataDir, STATE_DB));
  const queue = await FileBatchQueue.open(join(dataDir, 'queue'), join(dataDir, STATE_DB));
  await forgeOrphan(sessions, queue, uuid, 660_000);
  t.equal(await queue.pending(uuid), 1, 'the orphan is committed to the queue');
  await queue.close();
  await sessions.close();

  const t0 = performance.now();
  const again = await spawnGateway(t, config as never);
  const st = await waitForStatus(again, uuid, (b) => b.upload_tasks_finished, undefined, 30_000);
  t.comment(`embedded: restart to upload_tasks_finished with an orphan in the queue: ${since(t0)} ms (lease ${660_000} ms not waited for)`);
  t.equal(st.can_start_upload, true);
  t.equal(await again.stop(), 0);

  const store = await FileObjectStore.open(join(dataDir, 'objects'));
  t.teardown(() => store.close());
  const objects = await readObjects(store);
  t.same(objects.map((o) => o.ids.length), [3], 'only the package that got 200 is stored');
  t.notOk(objects.some((o) => o.header.package_id === ORPHAN), 'the orphan is not');
  const record = (await embeddedRecord(dataDir, uuid))!;
  t.same([record.packages.length, record.in_flight], [1, {}], 'the session: one package, no lease');
  const reopened = await SqliteSessionStore.open(join(dataDir, STATE_DB));
  t.teardown(() => reopened.close());
  const ledger = await SqliteLedger.open(join(dataDir, STATE_DB));
  t.teardown(() => ledger.close());
  t.equal(await recoverLeftovers(reopened, ledger, ['demo']), 0, 'nothing left to release');
});

t.test('NATS + S3: the orphan waits for its lease, is revoked and dropped; a late commit is refused', async (t) => {
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  const base = distributed(nats.url, s3);
  const leaseMs = 3000;
  const gw = await spawnGateway(t, { ...base, nats: { ...base.nats, ackWaitMs: 30_000 }, ingest: { inFlightLeaseMs: leaseMs } } as never);
  const c = clientOf(gw);
  const uuid = (await c.init()).body.upload_uuid;
  t.equal((await c.ingest(uuid, 'products', products(3))).status, 200);
  await waitForStatus(gw, uuid, (b) => b.upload_tasks_finished);

  const handle = await connectNats({ servers: nats.url, name: 'drill-forger', requestTimeoutMs: 5000 });
  t.teardown(() => handle.close());
  const sessions = await NatsSessionStore.open(handle, { bucket: 'ingest_sessions', replicas: 1 });
  const queue = await NatsBatchQueue.open(handle, { stream: 'INGEST', durable: 'uploader', replicas: 1, ackWaitMs: 30_000, sweepIntervalMs: 0 });
  t.teardown(() => queue.close());
  const t0 = performance.now();
  await forgeOrphan(sessions, queue, uuid, leaseMs);
  const held = (await c.status(uuid)).body;
  t.equal(held.upload_tasks_finished, false, 'while the lease lives, the session waits');

  await waitForStatus(gw, uuid, (b) => b.upload_tasks_finished, undefined, 60_000);
  const drainedMs = since(t0);
  t.ok(drainedMs >= leaseMs - 100, `dropped only after the lease expired (${drainedMs} ms, lease ${leaseMs} ms)`);
  const record = (await (await natsRecords(t, nats.url))(uuid))!;
  t.same([record.packages.length, record.in_flight], [1, {}], 'the uploader revoked the expired lease');
  const late = decideIngestRecord(record, { id: ORPHAN, entity: 'products', rows: 2, bytes: 64, object_bytes: 200 }, Date.now());
  t.notOk(late.ok, 'recording the orphan after the revocation is refused');

  const store = await openS3(s3);
  t.teardown(() => store.close());
  const objects = await readObjects(store);
  t.same(objects.map((o) => o.ids.length), [3], 'only the package that got 200 is stored');
  t.notOk(objects.some((o) => o.header.package_id === ORPHAN), 'the orphan is not');
  t.equal(await gw.stop(), 0);
});

t.test('a 408 sent while the package is being committed: not recorded, not stored', async (t) => {
  // ~35 MB of rows behind 4 MB of gzip: the wire body is in at once, the validation takes a while.
  const rows = Array.from({ length: 900_000 }, (_, i) => `["r-${i}","Product name ${i}",${i % 100}]`).join(',');
  const body = gzipSync(Buffer.from(`{"columns":["product_id","name","price"],"data":[${rows}]}`));
  const send = async (timeoutMs: number) => {
    const svc = await startService(t, { limits: { requestTimeoutMs: timeoutMs } });
    const uuid = (await clientOf(svc).init()).body.upload_uuid;
    const t0 = performance.now();
    const res = await request(`${svc.url}${API}/${uuid}/products`, {
      method: 'POST',
      headers: { authorization: DEMO.token, 'client-id': DEMO.id, 'content-type': 'application/json', 'content-encoding': 'gzip' },
      body,
    });
    await res.body.text();
    const ms = performance.now() - t0;
    const st = await waitForStatus(svc, uuid, (b) => b.upload_tasks_finished, undefined, 60_000);
    const objects = await svc.openObjects();
    const stored = (await objects.list('')).length;
    await objects.close();
    await svc.stop();
    return { status: res.statusCode, ms, recorded: st.entities.length, stored };
  };
  const full = await send(600_000);
  t.same([full.status, full.recorded, full.stored], [200, 1, 1], `without a timeout: 200 in ${Math.round(full.ms)} ms`);
  const attempts = size(8, 40);
  const seen = new Map<number, number>();
  // The deadline hunts the end of the validation, where the commit is: later after a 408,
  // earlier after a 200 (the machine's speed drifts, so a fixed sweep would miss it).
  let deadline = full.ms * 0.9;
  for (let i = 0; i < attempts; i++) {
    const r = await send(Math.round(deadline));
    deadline *= r.status === 200 ? 0.93 : 1.07;
    seen.set(r.status, (seen.get(r.status) ?? 0) + 1);
    if (r.status === 200) t.same([r.recorded, r.stored], [1, 1], `${Math.round(r.ms)} ms: 200, recorded and stored`);
    else t.same([r.status, r.recorded, r.stored], [408, 0, 0], `${Math.round(r.ms)} ms: ${r.status}, nothing recorded or stored`);
  }
  t.comment(`answers racing the request timeout: ${JSON.stringify([...seen])}`);
});
