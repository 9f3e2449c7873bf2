/**
 * Drill: a power cut of the embedded default's host. A gateway process whose whole DATA_DIR
 * (`state.sqlite` with its WAL, `lock.sqlite`, `queue/`, `objects/`) is on faultfs (a disk
 * that loses whatever was not fsync'ed); clients push packages on many lanes, and at a
 * random moment (the k-th 200 of the cycle, k drawn from a seeded generator: `DRILL_SEED`
 * replays a run) the gateway and the disk's volatile cache die in the same tick. Then the
 * disk is mounted again, a gateway starts on it and drains; its start must read what the cut
 * left as a torn tail at most, never as damage (no `damaged record skipped`). At the end
 * every session is started and, as in gateway-kill:
 * - every package that got 200 is stored exactly once (its rows, each once);
 * - no package that got an error status is stored;
 * - a package cut off unanswered is stored if and only if its session records it;
 * - nothing is stored that the session does not record, and start-upload hands the
 *   Connector exactly the recorded rows.
 * `lock.sqlite` takes SQLite's fcntl lock on the mount: faultfs implements no lock operation,
 * so the kernel keeps POSIX locks for the mount itself, and a second gateway on the same
 * DATA_DIR is refused there as on a local disk (checked below).
 */
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { FileObjectStore } from '../../src/store/embedded/object-store.js';
import { manifestKey } from '../../src/store/keys.js';
import { clientOf, tempDir, waitForStatus, yesterday } from '../support/harness.js';
import { mountFaultFs, type FaultFs } from '../../testbed/faultfs.js';
import { spawnGateway, type GatewayProc } from '../../testbed/processes.js';
import { checkStored, embeddedRecord, loadUntilCut, readObjects, since, size, writeClients, type DrillSession, type Outcome, type RecordedSession, CYCLE_DEADLINE_MS } from '../support/drills.js';
import { seededRandom } from '../support/random.js';

const CLIENTS = 4;
/** Concurrent senders, spread over the clients' sessions. */
const LANES = 64;
const ROWS = size(20, 100);
const CUTS = size(3, 8);
/** The cut comes at the k-th 200 of a cycle, k uniform in this range. */
const CUT_AFTER = size<[number, number]>([300, 1200], [500, 3000]);

const SEED = Number(process.env.DRILL_SEED ?? Math.floor(Math.random() * 2 ** 31));
const random = seededRandom(SEED);

const DAMAGE = 'damaged record skipped';

type Session = DrillSession;

/** The host: the gateway and its disk share the power. */
interface Host {
  disk: FaultFs;
  gateway: GatewayProc;
}

/** One tick: each kill sends its SIGKILL before it returns, so the gateway and the disk's cache go at the same instant. */
function cutPower(host: Host): Promise<unknown> {
  return Promise.all([host.gateway.kill(), host.disk.powerCut()]);
}

const damageLines = (gw: GatewayProc): string[] => gw.output().split('\n').filter((l) => l.includes(DAMAGE));

t.comment(`DRILL_SEED=${SEED}`);

t.test('embedded DATA_DIR on a disk that loses power: every 200 stored exactly once, each restart clean', async (t: Test) => {
  const dir = await tempDir(t, 'drill-epc-');
  const disk = await mountFaultFs(t, await tempDir(t, 'drill-epc-disk-'));
  const dataDir = disk.dir;
  const { file, clients } = await writeClients(dir, CLIENTS);
  const config = {
    dataDir,
    clientsFile: file,
    limits: { requestsPerSecond: 0, concurrentPerClient: 0 },
    ingest: { workers: 2, maxQueue: 256, inFlightLeaseMs: 10_000 },
    connector: { webhookSecret: 'drill-webhook-secret-0123456789', emulatorDelayMs: 50 },
  };
  const host: Host = { disk, gateway: await spawnGateway(t, config as never) };
  const sessions: Session[] = [];
  for (const client of clients) {
    const res = await clientOf(host.gateway, client).init();
    t.equal(res.status, 200, `session of ${client.id}`);
    sessions.push({ client, uuid: res.body.upload_uuid });
  }

  // SQLite's fcntl lock on lock.sqlite holds on faultfs: a second gateway on the same DATA_DIR is refused.
  const second = await spawnGateway(t, config as never).then(
    async (gw) => (await gw.kill(), 'started'),
    (err: Error) => err.message,
  );
  t.not(second, 'started', 'a second gateway on the same DATA_DIR is refused (the lock holds on faultfs)');

  const outcomes = new Map<string, Outcome>();
  let accepted = 0;
  let cutOff = 0;
  for (let cycle = 1; cycle <= CUTS; cycle++) {
    const cutAfter = CUT_AFTER[0] + random(CUT_AFTER[1] - CUT_AFTER[0] + 1);
    const c = await loadUntilCut({ gateway: host.gateway, sessions, cycle, cutAfter, lanes: LANES, rows: ROWS, cut: () => cutPower(host) });
    for (const [k, v] of c.outcomes) outcomes.set(k, v);
    const t0 = performance.now();
    await disk.remount();
    host.gateway = await spawnGateway(t, config as never);
    const boot = since(t0);
    for (const s of sessions) await waitForStatus(host.gateway, s.uuid, (b) => b.upload_tasks_finished, s.client, 120_000);
    const noAnswer = [...c.outcomes.values()].filter((o) => o === 'no-answer').length;
    const other = [...c.outcomes.values()].filter((o) => o !== 200 && o !== 'no-answer').length;
    accepted += c.accepted;
    cutOff += noAnswer;
    t.comment(
      `cut ${cycle}: power cut at the ${cutAfter}th 200: ${c.sent} sent, ${c.accepted} answered 200, ${other} other answers, ` +
        `${c.inFlightAtCut} in flight at the cut, ${noAnswer} cut off; boot (disk, gateway): ${boot} ms, drained ${since(t0)} ms after the cut`,
    );
    t.notOk(c.late, `the ${cutAfter}th 200 came within ${CYCLE_DEADLINE_MS} ms`);
    t.ok(c.inFlightAtCut >= LANES - 1, `${c.inFlightAtCut} packages in flight at the cut`);
    t.same(damageLines(host.gateway), [], `cut ${cycle}: the restart reads what the cut left as a torn tail at most, no damage`);
  }

  const gw = host.gateway;
  const records = new Map<string, RecordedSession>();
  for (const s of sessions) {
    const record = (await embeddedRecord(dataDir, s.uuid))!;
    records.set(s.uuid, record);
    const live = Object.values(record.in_flight).filter((until) => until > Date.now());
    t.same(live, [], `${s.client.id}: no live lease left`);
    const start = await clientOf(gw, s.client).start(s.uuid, { date_from: '2024-01-01', date_to: yesterday() });
    t.equal(start.status, 200, `${s.client.id}: start-upload`);
    t.same(start.body.entities, [{ name: 'products', rows: record.packages.length * ROWS }], `${s.client.id}: the Connector counts the recorded rows`);
  }
  t.equal(await gw.stop(), 0, 'the last gateway stops cleanly');
  t.same(damageLines(gw), [], 'no damage reported by the last gateway');

  const damage: string[] = [];
  const store = await FileObjectStore.open(join(dataDir, 'objects'), { onDamage: (f, o, r) => void damage.push(`${f}@${o}: ${r}`) });
  t.teardown(() => store.close());
  // A session of more than 1,000 objects also holds the manifest the Connector was handed: not a package.
  const manifests = new Set(sessions.map((s) => manifestKey('uploads', s.client.id, s.uuid)));
  const objects = (await readObjects(store)).filter((o) => !manifests.has(o.key));
  t.same(damage, [], 'the object store opens without damage');
  const { statuses, acceptedMissing, cutStored, cutNotStored } = checkStored(t, objects, records, outcomes, ROWS);
  t.comment(
    `${CUTS} cuts: ${accepted} answered 200, ${cutOff} cut off; answers ${JSON.stringify([...statuses])}; lost (200 not stored): ${acceptedMissing}; ` +
      `cut off and stored (recorded before the cut): ${cutStored}, cut off and not stored: ${cutNotStored}`,
  );
});
