/**
 * Drill: a keyed flood. One client sends ingests on many lanes, each with a fresh
 * `Idempotency-Key`, half of them refused with a large 422 (150 refused rows: the answer lists
 * 100, about 18 KB, and is stored with the key), the other half small packages answered 200.
 * The gateway is a real process on the embedded default, with a small
 * `idempotency.keysPerClient` (CONFIG_FILE). As it goes the drill samples, driven by request
 * counts (no clock): the gateway's RSS (`VmRSS`), the size of DATA_DIR (`state.sqlite` with
 * its `-wal` and `-shm`, `queue/`, `objects/`), and the client's idempotency records in the
 * state database (read-only, beside the running gateway). It holds that:
 * - the client never holds more records than its budget plus the requests in flight;
 * - RSS and DATA_DIR are flat: the highest sample of the last third of the run (the budget
 *   reached many times over by then) is within a factor (1.3; RSS in the long run 1.05) of
 *   the highest of the second third plus a small absolute slack (the first third is warm-up, not compared: the heap, SQLite's pages
 *   and the WAL grow to their working size there). DATA_DIR is taken without `objects/`: the
 *   accepted packages themselves, about 550 bytes each here, which stay until their session
 *   is started (then they are the Connector's) or deleted; their ledger rows are counted;
 * - the newest keys replay their stored answers byte for byte (`Idempotent-Replayed`), and
 *   the oldest keys, dropped at the budget, run as new requests;
 * - the session's delete takes its records and objects with it.
 * CI: 9,000 requests on one session (about a minute). `DRILL_LONG=1`: a soak of about ten
 * minutes, 45 flood rounds of keyed and unkeyed ingests on a fresh session each, ended by its
 * delete, and between them sessions created, filled a little, started and finished (DONE).
 */
import { createHash, randomUUID } from 'node:crypto';
import { lstatSync, readdirSync, readFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import t from 'tap';
import { openStateReader } from '../../src/store/embedded/state-schema.js';
import { STATE_DB } from '../../src/store/engines.js';
import { idempotencyKey, idempotencyPrefix } from '../../src/store/keys.js';
import { API, call, clientOf, tempDir, waitForStatus, yesterday, type Answer } from '../support/harness.js';
import { spawnGateway, type GatewayProc } from '../../testbed/processes.js';
import { drillPackage, embeddedRecord, size, until, writeClients, type DrillClient } from '../support/drills.js';

const KEYS_PER_CLIENT = 500;
/** Concurrent senders: the records a client holds may pass its budget by the creates under way. */
const LANES = 16;
/** Requests of a flood round, on a session of its own; it ends with the session's delete. */
const ROUND = size(9000, 3000);
const ROUNDS = size(1, 45);
/** `DRILL_LONG=1`: every third request of a round is sent without a key. */
const UNKEYED = size(false, true);
/** `DRILL_LONG=1`: after each flood round, a session created, filled with this many packages, started and finished. */
const STARTED_PACKAGES = size(0, 40);
const ACCEPTED_ROWS = 5;
const REFUSED_ROWS = 150;
/** Samples of RSS and DATA_DIR every this many answers; records are counted ten times as often. */
const SAMPLE_EVERY = 100;
/**
 * The flatness bounds: late max ≤ factor × plateau max + slack. A ratio alone would not hold
 * RSS: on a base of 200–300 MiB, a leak that kept every stored answer in memory (620 MiB over
 * the long run, linear) still put the last third within 1.3 × the second (817 against 642
 * MiB); the long run's RSS bound is therefore tight. In CI's 9,000 requests the heap may still
 * be growing to its working size in the last third (one run: 243 MiB, then 286), so CI holds
 * RSS only against gross growth (about 40 KB a request), the long run against about 1 KB a
 * request. DATA_DIR has a small base: 1.3 × and 2 MiB catch about 2 KB a request in CI.
 */
const RSS_BOUND = size({ factor: 1.3, slack: 32 * 2 ** 20 }, { factor: 1.05, slack: 16 * 2 ** 20 });
const DISK_BOUND = { factor: 1.3, slack: 2 * 2 ** 20 };
/** Keys checked at the end: the newest replay, the oldest run again. */
const CHECKED_KEYS = 40;

const MiB = 2 ** 20;
const mib = (n: number) => `${(n / MiB).toFixed(1)} MiB`;

function rssOf(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(/^VmRSS:\s+(\d+) kB$/m.exec(status)![1]) * 1024;
}

/** Bytes of the files under `path` (a file removed during the walk counts nothing); `skip` leaves out a directory by its path. */
function bytesUnder(path: string, skip: (dir: string) => boolean = () => false): number {
  let st;
  try {
    st = lstatSync(path);
  } catch {
    return 0;
  }
  if (!st.isDirectory()) return st.size;
  if (skip(path)) return 0;
  let names: string[];
  try {
    names = readdirSync(path);
  } catch {
    return 0;
  }
  return names.reduce((n, name) => n + bytesUnder(join(path, name), skip), 0);
}

interface Sample {
  answered: number;
  rss: number;
  /** DATA_DIR less `objects/`. */
  disk: number;
  state: number;
  wal: number;
  queue: number;
  objects: number;
}

/** What was sent under a key and answered: enough to send it again and to compare the answer. */
interface Keyed {
  key: string;
  tag: string;
  n: number;
  refused: boolean;
  status: number;
  digest: string;
}

const digest = (text: string) => createHash('sha256').update(text).digest('hex');

function packageOf(k: Pick<Keyed, 'tag' | 'n' | 'refused'>) {
  if (!k.refused) return drillPackage(k.tag, k.n, ACCEPTED_ROWS);
  // Every row's price is refused: 150 errors counted, the first 100 listed in the answer.
  return {
    columns: ['product_id', 'name', 'price'],
    data: Array.from({ length: REFUSED_ROWS }, (_, i) => [`${k.tag}/${k.n}/${i}`, `Product ${i}`, `no price for row ${i} of package ${k.n}, ${'x'.repeat(60)}`]),
  };
}

function ingest(gw: GatewayProc, client: DrillClient, uuid: string, k: Pick<Keyed, 'tag' | 'n' | 'refused'>, key: string | null): Promise<Answer> {
  return call(gw.url, 'POST', `${API}/${uuid}/products`, { client, body: packageOf(k), headers: key ? { 'idempotency-key': key } : {} });
}

t.test(`a keyed flood: the client's records stay within its budget, RSS and DATA_DIR stay flat`, async (t) => {
  const dir = await tempDir(t, 'drill-flood-');
  const dataDir = join(dir, 'data');
  const { file, clients } = await writeClients(dir, 1);
  const client = clients[0]!;
  const config = {
    dataDir,
    clientsFile: file,
    limits: { requestsPerSecond: 0, concurrentPerClient: 0 },
    ingest: { workers: 2, maxQueue: 256 },
    idempotency: { keysPerClient: KEYS_PER_CLIENT },
    connector: { webhookSecret: 'drill-webhook-secret-0123456789', emulatorDelayMs: 50 },
  };
  // The allocator as the image runs it (Dockerfile).
  const gw = await spawnGateway(t, config as never, { MALLOC_MMAP_THRESHOLD_: '131072' });
  const pid = gw.child.pid!;
  const api = clientOf(gw, client);

  const db = openStateReader(join(dataDir, STATE_DB));
  t.teardown(() => db.close());
  const prefix = idempotencyPrefix(client.id);
  const countRecords = db.prepare<[string, string], { n: number }>('SELECT count(*) AS n FROM kv WHERE key > ? AND key < ?');
  const records = () => countRecords.get(prefix, `${prefix.slice(0, -1)}/`)!.n;
  const listRecords = db.prepare<[string, string], { value: string }>('SELECT value FROM kv WHERE key > ? AND key < ?');
  /** The session of each of the client's records. */
  const recordSessions = () => listRecords.all(prefix, `${prefix.slice(0, -1)}/`).map((r) => (JSON.parse(r.value) as { upload_uuid: string }).upload_uuid);
  const hasRecord = db.prepare<[string], { n: number }>('SELECT count(*) AS n FROM kv WHERE key = ?');
  const recorded = (key: string) => hasRecord.get(idempotencyKey(client.id, key))!.n === 1;

  /** Sessions handed to the Connector: their objects are kept. */
  const handedOver = new Set<string>();
  const objectsDir = join(dataDir, 'objects');
  const sample = (answered: number): Sample => {
    const objects = bytesUnder(objectsDir);
    return {
      answered,
      rss: rssOf(pid),
      disk: bytesUnder(dataDir) - objects,
      state: bytesUnder(join(dataDir, STATE_DB)),
      wal: bytesUnder(join(dataDir, `${STATE_DB}-wal`)),
      queue: bytesUnder(join(dataDir, 'queue')),
      objects,
    };
  };

  const samples: Sample[] = [sample(0)];
  let answered = 0;
  let maxRecords = 0;
  const statuses = new Map<number, number>();
  let unexpected: string | null = null;
  let last: { uuid: string; keyed: Keyed[] } | null = null;

  for (let round = 1; round <= ROUNDS; round++) {
    const init = await api.init();
    t.equal(init.status, 200, `round ${round}: a session`);
    const uuid = init.body.upload_uuid as string;
    const keyed: Keyed[] = [];
    let next = 0;
    const lane = async () => {
      for (let n = next++; n < ROUND; n = next++) {
        const refused = n % 2 === 1;
        const key = UNKEYED && n % 3 === 2 ? null : `${randomUUID()}/${round}/${n}`;
        const tag = `flood~${round}`;
        const res = await ingest(gw, client, uuid, { tag, n, refused }, key);
        statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
        if (res.status !== (refused ? 422 : 200)) unexpected ??= `${res.status} ${res.text.slice(0, 300)}`;
        if (key) keyed.push({ key, tag, n, refused, status: res.status, digest: digest(res.text) });
        answered++;
        if (answered % (SAMPLE_EVERY / 10) === 0) maxRecords = Math.max(maxRecords, records());
        if (answered % SAMPLE_EVERY === 0) samples.push(sample(answered));
      }
    };
    await Promise.all(Array.from({ length: LANES }, lane));
    t.equal(unexpected, null, `round ${round}: every answer 200 or 422 as sent`);
    if (round === ROUNDS) {
      last = { uuid, keyed };
      break;
    }
    t.equal((await api.remove(uuid)).status, 200, `round ${round}: delete`);

    if (STARTED_PACKAGES > 0) {
      const s = (await api.init()).body.upload_uuid as string;
      let accepted = 0;
      for (let n = 0; n < STARTED_PACKAGES; n++) {
        const res = await ingest(gw, client, s, { tag: `started~${round}`, n, refused: false }, n % 2 === 0 ? `${randomUUID()}/s` : null);
        if (res.status === 200) accepted++;
      }
      t.equal(accepted, STARTED_PACKAGES, `round ${round}: ${STARTED_PACKAGES} packages for a session to start, each 200`);
      await waitForStatus(gw, s, (b) => b.upload_tasks_finished, client, 60_000);
      t.equal((await api.start(s, { date_from: '2024-01-01', date_to: yesterday() })).status, 200, `round ${round}: start-upload`);
      await waitForStatus(gw, s, (b) => b.session_status === 'DONE', client, 60_000);
      handedOver.add(s);
    }
  }
  samples.push(sample(answered));

  const { uuid, keyed } = last!;
  t.ok(maxRecords <= KEYS_PER_CLIENT + LANES, `the client's records peaked at ${maxRecords}: within its budget ${KEYS_PER_CLIENT} + ${LANES} in flight`);

  // Flatness: the late samples against the plateau that follows the warm-up.
  const third = Math.floor(samples.length / 3);
  const plateau = samples.slice(third, 2 * third);
  const late = samples.slice(2 * third);
  const max = (s: Sample[], f: (x: Sample) => number) => Math.max(...s.map(f));
  const first = samples[0]!;
  const end = samples.at(-1)!;
  for (const [what, f, { factor, slack }] of [
    ['RSS', (s: Sample) => s.rss, RSS_BOUND],
    ['DATA_DIR', (s: Sample) => s.disk, DISK_BOUND],
  ] as const) {
    const bound = factor * max(plateau, f) + slack;
    t.ok(
      max(late, f) <= bound,
      `${what} flat: max of the last third ${mib(max(late, f))} <= ${factor} × max of the second third ${mib(max(plateau, f))} + ${mib(slack)} ` +
        `(start ${mib(f(first))}, end ${mib(f(end))}, peak ${mib(max(samples, f))})`,
    );
  }
  const answerBytes = db.prepare<[string, string], { n: number }>('SELECT max(length(value)) AS n FROM kv WHERE key > ? AND key < ?').get(prefix, `${prefix.slice(0, -1)}/`)!.n;
  t.comment(
    `${answered} requests (largest stored record ${(answerBytes / 1024).toFixed(1)} KiB) ${JSON.stringify([...statuses])}; samples start → end: ` +
      `state.sqlite ${mib(first.state)} → ${mib(end.state)} (peak ${mib(max(samples, (s) => s.state))}), ` +
      `-wal ${mib(first.wal)} → ${mib(end.wal)} (peak ${mib(max(samples, (s) => s.wal))}), ` +
      `queue/ ${mib(first.queue)} → ${mib(end.queue)} (peak ${mib(max(samples, (s) => s.queue))}), ` +
      `objects/ ${mib(first.objects)} → ${mib(end.objects)} (${handedOver.size} sessions handed over)`,
  );

  const tenths = Array.from({ length: 10 }, (_, i) => samples.slice(Math.floor((i * samples.length) / 10), Math.floor(((i + 1) * samples.length) / 10)));
  t.comment(`max per tenth of the run: RSS ${tenths.map((s) => Math.round(max(s, (x) => x.rss) / MiB)).join(' ')} MiB; DATA_DIR ${tenths.map((s) => (max(s, (x) => x.disk) / MiB).toFixed(1)).join(' ')} MiB`);

  // The newest keys replay their answers; the oldest of the round were dropped at the budget and run again.
  const newest = keyed.slice(-CHECKED_KEYS);
  const oldest = keyed.slice(0, CHECKED_KEYS);
  let replayed = 0;
  for (const k of newest) {
    const res = await ingest(gw, client, uuid, k, k.key);
    if (res.headers['idempotent-replayed'] === 'true' && res.status === k.status && digest(res.text) === k.digest) replayed++;
  }
  t.equal(replayed, newest.length, `the newest ${newest.length} keys replay their stored answers byte for byte`);

  t.equal(oldest.filter((k) => recorded(k.key)).length, 0, `the oldest ${oldest.length} keys of the round were dropped at the budget`);
  const packagesBefore = (await embeddedRecord(dataDir, uuid))!.packages.length;
  let ranAgain = 0;
  for (const k of oldest) {
    const res = await ingest(gw, client, uuid, k, k.key);
    if (res.headers['idempotent-replayed'] === undefined && res.status === k.status && recorded(k.key)) ranAgain++;
  }
  t.equal(ranAgain, oldest.length, `the oldest ${oldest.length} keys run as new requests (same status, a new record, not replayed)`);
  const packagesAfter = (await embeddedRecord(dataDir, uuid))!.packages.length;
  t.equal(packagesAfter - packagesBefore, oldest.filter((k) => !k.refused).length, 'each accepted one is recorded as a new package');

  t.equal((await api.remove(uuid)).status, 200, 'the last session deleted');
  // The clean-up runs in the background (api.md, delete): bounded polls until it is done.
  const leftOver = async () => ({
    records: recordSessions().filter((u) => !handedOver.has(u)).length,
    objectBytes: bytesUnder(objectsDir, (d) => handedOver.has(basename(d))),
  });
  const left = await until('the clean-up of the deleted sessions', leftOver, (v) => v.records === 0 && v.objectBytes === 0, 60_000);
  t.same(left, { records: 0, objectBytes: 0 }, 'the deleted sessions left no idempotency record and no object (only the handed-over sessions keep theirs)');
  t.equal(await gw.stop(), 0, 'the gateway stops cleanly');
});
