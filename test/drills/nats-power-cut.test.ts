/**
 * Drill: a power cut of the NATS host. One nats-server whose JetStream store is on faultfs
 * (testbed/faultfs: written data stays volatile until fsync'ed), s3rver on another "host",
 * and the gateway as a process beside nats-server. Clients push packages concurrently; at a
 * random moment (the k-th 200 of the cycle, k drawn at random) the host loses power: the
 * gateway, nats-server and the disk's volatile cache die in the same tick (S3 lives on).
 * Then the disk is mounted again, nats-server and the gateway start, and the next cycle
 * begins. At the end every session is started, and, as in gateway-kill:
 * - every package that got 200 is stored exactly once (its rows, each once);
 * - no package that got an error status is stored;
 * - a package cut off unanswered is stored if and only if its session records it;
 * - nothing is stored that the session does not record, and start-upload hands the
 *   Connector exactly the recorded rows; every session answers its status and reaches DONE.
 * The control runs the same cut with nats-server's default `sync_interval` (2 min) instead
 * of the shipped `always`, and must lose acknowledged data: the layer bites, so the drill
 * can fail. `DRILL_SEED` replays a run's random cut points.
 */
import { writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { manifestKey } from '../../src/store/keys.js';
import type { ObjectHeader } from '../../src/store/object-format.js';
import type { ObjectStore } from '../../src/store/ports.js';
import { clientOf, leasesLapsed, tempDir, waitForStatus, yesterday } from '../support/harness.js';
import { mountFaultFs, type FaultFs } from '../../testbed/faultfs.js';
import { startNats, type NatsServer } from '../../testbed/nats.js';
import { distributed, spawnGateway, type GatewayProc } from '../../testbed/processes.js';
import { startS3 } from '../../testbed/s3.js';
import { checkStored, loadUntilCut, natsRecords, openS3, type DrillSession, type Outcome, type RecordedSession, since, size, writeClients, CYCLE_DEADLINE_MS } from '../support/drills.js';
import { mulberry32 } from '../../testbed/random.js';

const CLIENTS = 4;
/** Concurrent senders, spread over the clients' sessions. */
const LANES = size(32, 64);
const ROWS = size(20, 100);
const CYCLES = size(3, 8);
/** The cut comes at the k-th 200 of a cycle, k uniform in this range. */
const CUT_AFTER = size<[number, number]>([40, 300], [100, 1500]);

const SEED = Number(process.env.DRILL_SEED ?? Math.floor(Math.random() * 2 ** 31));
/** Seeded, so a run's cut points can be replayed. */
const random = mulberry32(SEED);


type Session = DrillSession;

/** The NATS host: the gateway and nats-server share its power and its disk. */
interface Host {
  disk: FaultFs;
  nats: NatsServer;
  gateway: GatewayProc;
  /** When the power was last cut (epoch ms). */
  cutAt?: number;
}

/** The gateway's `ingest.inFlightLeaseMs`. */
const LEASE_MS = 10_000;

/** One tick: each kill sends its SIGKILL before it returns, so the three die at the same instant. */
function cutPower(host: Host): Promise<unknown> {
  return Promise.all([host.gateway.kill(), host.nats.kill(), host.disk.powerCut()]);
}

interface Setup {
  host: Host;
  sessions: Session[];
  /** The gateway's configuration, for its restarts. */
  config: Record<string, unknown>;
  s3: Awaited<ReturnType<typeof startS3>>;
}

async function setUp(t: Test, syncInterval?: string): Promise<Setup> {
  const dir = await tempDir(t, 'drill-power-');
  const disk = await mountFaultFs(t, await tempDir(t, 'drill-power-disk-'));
  const [nats, s3] = await Promise.all([startNats(t, { storeDir: disk.dir, ...(syncInterval ? { syncInterval } : {}) }), startS3(t)]);
  const { file, clients } = await writeClients(dir, CLIENTS);
  const base = distributed(nats.url, s3);
  const config = {
    ...base,
    // A short ack wait: the uploader that died with the host held a package, redelivered after it.
    nats: { ...base.nats, ackWaitMs: 3000 },
    clientsFile: file,
    limits: { requestsPerSecond: 0, concurrentPerClient: 0 },
    ingest: { workers: 2, maxQueue: 256, inFlightLeaseMs: LEASE_MS },
    connector: { webhookSecret: 'drill-webhook-secret-0123456789', emulatorDelayMs: 50 },
  };
  const gateway = await spawnGateway(t, config as never);
  const sessions: Session[] = [];
  for (const client of clients) {
    const res = await clientOf(gateway, client).init();
    t.equal(res.status, 200, `session of ${client.id}`);
    sessions.push({ client, uuid: res.body.upload_uuid });
  }
  return { host: { disk, nats, gateway }, sessions, config, s3 };
}

/** Cycles of load, cut and boot; returns every package's outcome. */
async function cycles(t: Test, { host, sessions, config }: Setup, n: number, name: string): Promise<Map<string, Outcome>> {
  const outcomes = new Map<string, Outcome>();
  for (let cycle = 1; cycle <= n; cycle++) {
    const cutAfter = CUT_AFTER[0] + Math.floor(random() * (CUT_AFTER[1] - CUT_AFTER[0] + 1));
    const c = await loadUntilCut({ gateway: host.gateway, sessions, cycle, cutAfter, lanes: LANES, rows: ROWS, cut: () => cutPower(host) });
    host.cutAt = Date.now();
    for (const [k, v] of c.outcomes) outcomes.set(k, v);
    const t0 = performance.now();
    await host.disk.remount();
    await host.nats.restart();
    host.gateway = await spawnGateway(t, config as never);
    const noAnswer = [...c.outcomes.values()].filter((o) => o === 'no-answer').length;
    t.comment(
      `${name} cycle ${cycle}: power cut at the ${cutAfter}th 200: ${c.sent} sent, ${c.accepted} answered 200, ` +
        `${c.inFlightAtCut} in flight at the cut, ${noAnswer} cut off; boot (disk, nats-server, gateway): ${since(t0)} ms`,
    );
    t.notOk(c.late, `the ${cutAfter}th 200 came within ${CYCLE_DEADLINE_MS} ms`);
    t.ok(c.inFlightAtCut >= LANES - 1, `${c.inFlightAtCut} packages in flight at the cut`);
  }
  return outcomes;
}

interface Stored {
  key: string;
  header: ObjectHeader;
  ids: string[];
  /** What is wrong with the object, or null: a damaged one is kept for a look and named in the output. */
  damaged: string | null;
  keptAt: string | null;
}

/** Every object, read line by line; unlike `readObjects` it reports a line that is not a drill row instead of throwing. */
async function readStored(store: ObjectStore): Promise<Stored[]> {
  const out: Stored[] = [];
  for (const { key } of await store.list('')) {
    const chunks: Buffer[] = [];
    for await (const chunk of (await store.get(key))!) chunks.push(Buffer.from(chunk));
    const body = Buffer.concat(chunks);
    const lines = body.toString('utf8').split('\n').filter((l) => l.trim() !== '');
    const ids: string[] = [];
    let header: ObjectHeader = { entity: '', columns: [], package_id: '', upload_uuid: '', client_id: '', rows: -1 };
    let damaged: string | null = null;
    lines.forEach((line, i) => {
      let v: unknown;
      try {
        v = JSON.parse(line);
      } catch {
        v = undefined;
      }
      if (i === 0 && v && typeof v === 'object' && !Array.isArray(v)) header = v as ObjectHeader;
      else if (i > 0 && Array.isArray(v) && typeof v[0] === 'string') ids.push(v[0]);
      else damaged ??= `line ${i + 1} of ${lines.length} (${body.length} bytes): ${JSON.stringify(line.slice(0, 200))}`;
    });
    let keptAt: string | null = null;
    if (damaged) {
      keptAt = join(tmpdir(), `nats-power-cut-damaged-${key.replaceAll('/', '_')}`);
      await writeFile(keptAt, body);
    }
    out.push({ key, header, ids, damaged, keptAt });
  }
  return out;
}

t.comment(`DRILL_SEED=${SEED}`);

t.test('sync_interval always: every 200 stored exactly once across power cuts of the NATS host', async (t) => {
  const setup = await setUp(t);
  const { sessions } = setup;
  const outcomes = await cycles(t, setup, CYCLES, 'always');
  const gw = setup.host.gateway;
  // The leases of the gateway that died with the host end by lapsing, which no write tells.
  await leasesLapsed(setup.host.cutAt ?? 0, LEASE_MS);

  const records = new Map<string, RecordedSession>();
  const readRecord = await natsRecords(t, setup.host.nats.url);
  for (const s of sessions) {
    const status = await waitForStatus(gw, s.uuid, (b) => b.upload_tasks_finished, s.client, 120_000);
    t.equal(status.session_status, 'UPLOADING', `${s.client.id}: the session answers, still UPLOADING`);
    const record = (await readRecord(s.uuid))!;
    records.set(s.uuid, record);
    const live = Object.values(record.in_flight).filter((until) => until > Date.now());
    t.same(live, [], `${s.client.id}: no live lease left`);
    const start = await clientOf(gw, s.client).start(s.uuid, { date_from: '2024-01-01', date_to: yesterday() });
    t.equal(start.status, 200, `${s.client.id}: start-upload`);
    t.same(start.body.entities, [{ name: 'products', rows: record.packages.length * ROWS }], `${s.client.id}: the Connector counts the recorded rows`);
    await waitForStatus(gw, s.uuid, (b) => b.session_status === 'DONE', s.client, 60_000);
  }
  t.equal(await gw.stop(), 0);

  const store = await openS3(setup.s3);
  t.teardown(() => store.close());
  // A session with many objects hands the Connector a manifest object beside them: not a package.
  const manifests = sessions.map((s) => manifestKey('', s.client.id, s.uuid));
  const objects = (await readStored(store)).filter((o) => !manifests.some((m) => o.key.endsWith(m)));
  const damaged = objects.filter((o) => o.damaged !== null);
  for (const o of damaged) t.comment(`damaged object ${o.key}: ${o.damaged}; kept at ${o.keptAt}`);
  t.equal(damaged.length, 0, 'every object reads as a header and rows of the drill');
  const { statuses, acceptedMissing, cutStored, cutNotStored } = checkStored(t, objects, records, outcomes, ROWS);
  t.comment(
    `always: ${CYCLES} cuts, answers ${JSON.stringify([...statuses])}; lost (200 not stored): ${acceptedMissing}; ` +
      `cut off and stored (recorded before the cut): ${cutStored}, cut off and not stored: ${cutNotStored}`,
  );
});

t.test('control: nats-server\'s default sync_interval loses acknowledged data in the same cut', async (t) => {
  const setup = await setUp(t, '2m');
  const outcomes = await cycles(t, setup, 1, 'default (2m)');
  const gw = setup.host.gateway;
  const readRecord = await natsRecords(t, setup.host.nats.url);
  // Each 200 is one recorded package (a cut-off one may be recorded too): a session that
  // records fewer packages than it answered 200 for has lost at least the difference.
  let sessionsLost = 0;
  let acceptedUnrecorded = 0;
  const statuses: number[] = [];
  for (const s of setup.sessions) {
    const status = await clientOf(gw, s.client).status(s.uuid);
    statuses.push(status.status);
    const record = await readRecord(s.uuid);
    if (status.status === 404 || record === null) sessionsLost++;
    const accepted = [...outcomes].filter(([pkg, o]) => o === 200 && pkg.startsWith(`${s.client.id}~`)).length;
    acceptedUnrecorded += Math.max(0, accepted - (record?.packages.length ?? 0));
  }
  const accepted = [...outcomes.values()].filter((o) => o === 200).length;
  t.comment(`default (2m): ${accepted} answered 200; after the cut ${sessionsLost} of ${CLIENTS} sessions gone (status answers ${statuses.join(', ')}), at least ${acceptedUnrecorded} packages answered 200 no longer recorded`);
  t.ok(sessionsLost + acceptedUnrecorded > 0, 'acknowledged data is lost: the layer bites');
});
