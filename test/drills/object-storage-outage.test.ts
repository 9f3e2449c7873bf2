/**
 * Drill 2: object storage unavailable during ingest (NATS + S3; the S3 server is a child
 * process). Two outages: the server killed (connections refused) and the server frozen
 * (SIGSTOP: connections accepted, nothing answers, every request runs into its timeout).
 * While S3 is away ingest goes on answering 200 (the queue is on NATS), the session's
 * `upload_tasks_finished` stays false and start-upload answers 409 `Upload tasks are still in
 * progress`; once S3 is back the queue drains, every accepted package is stored exactly
 * once, no multipart upload is left behind, and the session goes on to DONE.
 * CI: 8 s outages. DRILL_LONG=1: 30 s outages and more senders.
 */
import t, { type Test } from 'tap';
import { clientOf, waitForStatus, yesterday } from '../support/harness.js';
import { startNats } from '../../testbed/nats.js';
import { distributed, spawnGateway } from '../../testbed/processes.js';
import { startS3Process, type S3Process } from '../../testbed/s3.js';
import { drillPackage, openS3, packageOfRow, readObjects, since, size } from '../support/drills.js';

const OUTAGE_MS = size(8_000, 30_000);
const SENDERS = size(4, 16);
const ROWS = size(100, 500);
const dates = { date_from: '2024-01-01', date_to: yesterday() };

async function drill(t: Test, mode: 'kill' | 'pause') {
  const [nats, s3] = await Promise.all([startNats(t), startS3Process(t)]);
  const base = distributed(nats.url, s3);
  // Short S3 request deadlines: a frozen server fails a put in seconds rather than minutes.
  const gw = await spawnGateway(t, { ...base, s3: { ...base.s3, requestTimeoutMs: 2000 }, limits: { requestsPerSecond: 0, concurrentPerClient: 0 } } as never);
  const c = clientOf(gw);
  const uuid = (await c.init()).body.upload_uuid;

  const accepted = new Set<string>();
  const failed: unknown[] = [];
  let n = 0;
  let firstDuring: () => void = () => {};
  const acceptedDuring = new Promise<void>((resolve) => (firstDuring = resolve));
  let nextDuring: () => void = () => {};
  const acceptedNext = () => new Promise<void>((resolve) => (nextDuring = resolve));
  const send = async (tag: string) => {
    const k = n++;
    const res = await c.ingest(uuid, 'products', drillPackage(tag, k, ROWS));
    if (res.status === 200) {
      accepted.add(`${tag}/${k}`);
      if (tag === 'during') {
        firstDuring();
        nextDuring();
      }
    } else {
      failed.push([res.status, res.body]);
    }
  };
  for (let i = 0; i < 5; i++) await send('before');
  await waitForStatus(gw, uuid, (b) => b.can_start_upload, undefined, 30_000);

  const away = (s: S3Process) => (mode === 'kill' ? s.kill() : Promise.resolve(s.pause()));
  const back = (s: S3Process) => (mode === 'kill' ? s.restart() : Promise.resolve(s.resume()));
  await away(s3);
  const t0 = performance.now();
  // Senders keep ingesting through the whole outage; status and start-upload are asked meanwhile.
  let stop = false;
  const senders = Array.from({ length: SENDERS }, async () => {
    while (!stop) await send('during');
  });
  // From the first package accepted without S3 on, the session has work it cannot finish.
  await acceptedDuring;
  let statusChecks = 0;
  let startChecks = 0;
  const problems: string[] = [];
  while (performance.now() - t0 < OUTAGE_MS) {
    const st = await c.status(uuid);
    statusChecks++;
    if (st.body?.upload_tasks_finished !== false || st.body?.can_start_upload !== false) problems.push(`status: ${st.text}`);
    const start = await c.start(uuid, dates);
    startChecks++;
    if (start.status !== 409 || start.body?.detail !== 'Upload tasks are still in progress') problems.push(`start: ${start.status} ${start.text}`);
    await acceptedNext(); // asked again once the session took in one more package without S3
  }
  stop = true;
  await Promise.all(senders);
  const duringOutage = [...accepted].filter((p) => p.startsWith('during/')).length;
  await back(s3);
  const outageMs = since(t0);

  t.same(problems, [], `${statusChecks} status answers said upload_tasks_finished false, ${startChecks} start-upload answered 409`);
  t.same(failed, [], 'every ingest answered 200 while object storage was away');
  t.ok(duringOutage > 0, `${duringOutage} packages accepted during the outage`);

  const t1 = performance.now();
  await waitForStatus(gw, uuid, (b) => b.upload_tasks_finished && b.can_start_upload, undefined, 120_000);
  const drainMs = since(t1);
  t.comment(`${mode}: ${outageMs} ms without S3, ${duringOutage} packages (${ROWS} rows) accepted meanwhile; drained ${drainMs} ms after S3 came back`);

  const store = await openS3(s3);
  t.teardown(() => store.close());
  const objects = await readObjects(store);
  const stored = new Map<string, number>();
  for (const o of objects) for (const p of new Set(o.ids.map(packageOfRow))) stored.set(p, (stored.get(p) ?? 0) + 1);
  t.equal(objects.length, accepted.size, 'one object per accepted package');
  t.ok([...accepted].every((p) => stored.get(p) === 1), 'every accepted package is stored exactly once');
  t.ok(objects.every((o) => o.ids.length === ROWS && new Set(o.ids).size === ROWS), 'each whole, each row once');
  t.same(await store.listIncompleteUploads(''), [], 'no multipart upload left behind');

  const start = await c.start(uuid, dates);
  t.same([start.status, start.body?.entities], [200, [{ name: 'products', rows: accepted.size * ROWS }]], 'start-upload hands over every row', {
    answer: start.text,
    gateway: start.status === 200 ? undefined : gw.output().slice(-4000),
  });
  await waitForStatus(gw, uuid, (b) => b.session_status === 'DONE');
  t.equal(await gw.stop(), 0);
}

t.test('S3 killed during ingest, then restarted on the same data', (t) => drill(t, 'kill'));
t.test('S3 frozen (SIGSTOP) during ingest, then resumed', (t) => drill(t, 'pause'));
