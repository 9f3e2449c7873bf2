/**
 * Drill 8: a network that fails. Every part of the distributed setup runs on a host of its own
 * (a network namespace, testbed/netns.ts): three NATS nodes (config/nats/cluster.conf, as
 * docker-compose.yml runs them, replicas 3), two gateways, an uploader process, the S3 server
 * and the clients, on three networks: `front` (clients and gateways), `nats` (NATS nodes,
 * gateways, uploader) and `s3` (S3, gateways, uploader). While the clients send packages with
 * ids unique per package and probe each gateway's status, a nemesis cuts and heals:
 * a NATS node cut off (the sessions bucket's leader, then a follower), a gateway cut off from
 * NATS (still reachable from the clients), the uploader cut off from S3, a NATS node paused
 * (SIGSTOP) and one killed, a majority of NATS cut off. Then everything heals, the sessions
 * finish, and the checker holds the service to its contract:
 * - every 200 is stored exactly once, and nothing is stored without a 200 (a request that
 *   got no answer at all is stored only if its session records it); some lanes retry each
 *   package with its `Idempotency-Key` on the other gateway until a 200 (test/support/netns-load.ts),
 *   and every such package ends with one, stored once, whatever its earlier attempts were told;
 * - every answer is a 200 or a 503 with `Retry-After`: `Storage temporarily unavailable` where
 *   the gateway cannot reach a quorum (or `Rate limit exceeded`), never a 500, never a hang
 *   past the gateway's request timeout; a keyed retry may also be told 409 in progress, and an
 *   ingest whose record write the store left unknown gets its connection closed unanswered
 *   (`OUTCOME_UNKNOWN`: docs/api.md, Storage unavailable);
 * - status on a gateway on the majority side answers 200 within 1 s (all but 2 % of the
 *   probes, for a busy machine), also while a NATS leader is elected: its reads are direct
 *   gets any replica answers, and the value last read serves while none does
 *   (docs/reliability.md, "Network faults on NATS"); the drill reports the misses per fault;
 * - start-upload hands the Connector exactly the recorded rows, and the sessions reach DONE.
 * CI: one round of seven faults of 10 s each; DRILL_LONG=1: two rounds of 30 s faults, 30 s apart.
 * The figures go to docs/reliability.md ("Network faults on NATS").
 */
import { writeFile } from 'node:fs/promises';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { connect } from 'nats';
import t from 'tap';
import { manifestKey } from '../../src/store/keys.js';
import { clientOf, tempDir, yesterday } from '../support/harness.js';
import type { LoadLine, LoadPlan } from '../support/netns-load.js';
import { makeTopology, type Topology } from '../../testbed/netns.js';
import { CLUSTER_CONF_PORTS, startNatsNetCluster, type NatsCluster, type NatsServer } from '../../testbed/nats.js';
import { spawnGateway, spawnUploader, type GatewayProc } from '../../testbed/processes.js';
import { startS3Process } from '../../testbed/s3.js';
import { natsRecords, openS3, packageOfRow, readObjects, since, size, until, writeClients, type RecordedSession } from '../support/drills.js';

const FAULT_MS = size(10_000, 30_000);
const SETTLE_MS = size(5_000, 30_000);
const ROUNDS = size(1, 2);
const LANES = size(6, 8);
const PACE_MS = size(200, 500);
const ROWS = size(20, 100);
const CLIENTS = 2;
/**
 * The gateways' own request timeout (600 s by default): a request still unanswered past it (plus
 * a margin) is a hang. Above what a gateway spends on NATS before it gives up, so that its own
 * answer, not its timeout, is what the drill sees: 5 s per request, retried for 10 s, per step;
 * and a package whose record write was cut off mid-way is settled for up to 30 s more before
 * its answer (at 30 s, one sent just before a two-of-three cut was still unanswered after 35).
 */
const REQUEST_TIMEOUT_MS = 60_000;
const HANG_MS = REQUEST_TIMEOUT_MS + 5_000;
const STATUS_WITHIN_MS = 1_000;
/** How long the drill asks start-upload again while it answers 503 with `Retry-After`. */
const START_RETRY_MS = 90_000;
/**
 * Probes that may miss it: the drill shares two cores with the rest of the suite, where a
 * probe can wait on a busy CPU; the code it holds missed it in about a third of the probes.
 */
const STATUS_MISSES_ALLOWED = 0.02;
const UNAVAILABLE = 'Storage temporarily unavailable';
const IN_PROGRESS = 'A request with this Idempotency-Key is in progress';
/** How long a keyed lane may keep retrying its last package once the load stops (everything is healed by then). */
const FINISH_MS = 2 * HANG_MS;
/** `NETWORK_DRILL_FAULTS=<text>`: only the faults whose name holds it (to look closer at one). */
const ONLY = process.env.NETWORK_DRILL_FAULTS ?? '';
const LOAD = fileURLToPath(new URL('../support/netns-load.js', import.meta.url));

/** A gateway's log lines at these levels. */
const logged = (gw: GatewayProc, ...levels: string[]): string[] => gw.output().split('\n').filter((l) => levels.some((level) => l.includes(`"level":"${level}"`)));

interface Fault {
  name: string;
  /** Gateways (0, 1) that cannot reach a NATS quorum while it lasts. */
  minority: number[];
  /** Applies the fault; says what it hit. */
  apply(): Promise<string>;
  heal(): Promise<void>;
}

interface Phase {
  name: string;
  minority: number[];
  from: number;
  /** When the heal began. */
  to: number;
  /** Which node each gateway and the uploader was connected to when the fault began. */
  connected: string;
  /** What the fault hit (a node's name, a link). */
  target: string;
}

const STREAMS = { sessions: 'KV_ingest_sessions', ledger: 'KV_ingest_ledger', queue: 'INGEST' } as const;

/** What each node leads: the sessions bucket, the ledger, the queue, the meta group (JetStream's own). */
async function roles(cluster: NatsCluster): Promise<Map<string, string[]>> {
  return until(
    'stream leaders',
    async () => {
      const out = new Map<string, string[]>(cluster.servers.map((s) => [s.name, []]));
      const nc = await connect({ servers: cluster.urls.split(','), timeout: 2000, reconnect: false }).catch(() => null);
      if (!nc) return null;
      try {
        const jsm = await nc.jetstreamManager({ timeout: 2000 });
        for (const [role, stream] of Object.entries(STREAMS)) {
          const leader = (await jsm.streams.info(stream)).cluster?.leader;
          if (!leader) return null;
          out.get(leader)?.push(role);
        }
      } catch {
        return null;
      } finally {
        await nc.close();
      }
      for (const s of cluster.servers) {
        const jsz = await fetch(`http://${new URL(s.url).hostname}:${CLUSTER_CONF_PORTS.monitor}/jsz`, { signal: AbortSignal.timeout(1000) })
          .then((r) => r.json() as Promise<{ meta_cluster?: { leader?: string } }>)
          .catch(() => null);
        const meta = jsz?.meta_cluster?.leader;
        if (meta) {
          out.get(meta)?.push('meta');
          break;
        }
      }
      return out;
    },
    (m): m is Map<string, string[]> => m !== null,
    30_000,
    250,
  ) as Promise<Map<string, string[]>>;
}

const describe = (name: string, r: Map<string, string[]>): string => `${name} (leads ${r.get(name)?.join(', ') || 'nothing'})`;
const leaderOfSessions = (r: Map<string, string[]>): string => [...r].find(([, roles]) => roles.includes('sessions'))![0];
/** The node that leads the least (never the sessions bucket). */
const follower = (r: Map<string, string[]>): string =>
  [...r].filter(([, roles]) => !roles.includes('sessions')).sort((a, b) => a[1].length - b[1].length)[0]![0];

/**
 * Which NATS node each client process is connected to (the nodes' `/connz`, by client
 * address), e.g. `gw1→n2 gw2→n3 up→n1`: whether a gateway sat on the node a fault cut off.
 */
async function connections(net: Topology, cluster: NatsCluster): Promise<string> {
  const byAddr = new Map<string, string>();
  for (const name of ['gw1', 'gw2', 'up']) byAddr.set(net.hosts[name]!.addr('nats'), name);
  const seen: string[] = [];
  for (const s of cluster.servers) {
    const host = new URL(s.url).hostname;
    const res = await fetch(`http://${host}:${CLUSTER_CONF_PORTS.monitor}/connz`, { signal: AbortSignal.timeout(1000) }).catch(() => null);
    const body = res?.ok ? ((await res.json()) as { connections?: { ip: string }[] }) : null;
    for (const c of body?.connections ?? []) if (byAddr.has(c.ip)) seen.push(`${byAddr.get(c.ip)}→${s.name}`);
  }
  return seen.sort().join(' ') || '(no answer)';
}

function faults(net: Topology, cluster: NatsCluster): Fault[] {
  const node = (name: string): NatsServer => cluster.servers.find((s) => s.name === name)!;
  let target = '';
  let targets: string[] = [];
  return [
    {
      name: 'NATS leader (sessions bucket) cut off',
      minority: [],
      apply: async () => {
        const r = await roles(cluster);
        await net.cut((target = leaderOfSessions(r)));
        return describe(target, r);
      },
      heal: () => net.heal(target),
    },
    {
      name: 'NATS follower cut off',
      minority: [],
      apply: async () => {
        const r = await roles(cluster);
        await net.cut((target = follower(r)));
        return describe(target, r);
      },
      heal: () => net.heal(target),
    },
    {
      name: 'gateway 1 cut off from NATS (clients still reach it)',
      minority: [0],
      apply: async () => (await net.cut('gw1', 'nats'), 'gw1/nats'),
      heal: () => net.heal('gw1', 'nats'),
    },
    {
      name: 'uploader cut off from S3',
      minority: [],
      apply: async () => (await net.cut('up', 's3'), 'up/s3'),
      heal: () => net.heal('up', 's3'),
    },
    {
      name: 'NATS leader paused (SIGSTOP), then SIGCONT',
      minority: [],
      apply: async () => {
        const r = await roles(cluster);
        node((target = leaderOfSessions(r))).pause();
        return describe(target, r);
      },
      heal: async () => node(target).resume(),
    },
    {
      name: 'NATS leader killed (SIGKILL), then restarted',
      minority: [],
      apply: async () => {
        const r = await roles(cluster);
        await node((target = leaderOfSessions(r))).kill();
        return describe(target, r);
      },
      heal: () => node(target).restart(),
    },
    {
      name: 'two NATS nodes of three cut off (no quorum anywhere)',
      minority: [0, 1],
      apply: async () => {
        const r = await roles(cluster);
        targets = [leaderOfSessions(r), follower(r)];
        for (const n of targets) await net.cut(n);
        return targets.map((n) => describe(n, r)).join(' + ');
      },
      heal: async () => {
        for (const n of targets) await net.heal(n);
      },
    },
  ];
}

t.test('NATS + S3 on hosts of their own: cuts, pauses and kills, healed; every 200 stored once, 503 where no quorum', async (t) => {
  const t0 = performance.now();
  const net = await makeTopology(t, {
    networks: ['front', 'nats', 's3'],
    hosts: {
      n1: ['nats'],
      n2: ['nats'],
      n3: ['nats'],
      s3: ['s3'],
      gw1: ['front', 'nats', 's3'],
      gw2: ['front', 'nats', 's3'],
      up: ['nats', 's3'],
      clients: ['front'],
    },
    observer: ['front', 'nats', 's3'],
  });
  const h = net.hosts;
  const [cluster, s3] = await Promise.all([
    startNatsNetCluster(
      t,
      ['n1', 'n2', 'n3'].map((n) => ({ name: n, address: h[n]!.addr('nats'), wrap: h[n]!.wrap })),
    ),
    startS3Process(t, { host: h.s3!.addr('s3'), wrap: h.s3!.wrap }),
  ]);
  const dir = await tempDir(t, 'drill-net-');
  const { file, clients } = await writeClients(dir, CLIENTS, ['10.0.0.0/8']);
  const base = {
    clientsFile: file,
    nats: { url: cluster.urls, replicas: 3, ackWaitMs: 10_000 },
    s3: { endpoint: s3.endpoint, bucket: s3.bucket, region: s3.region, accessKeyId: s3.accessKeyId, secretAccessKey: s3.secretAccessKey, createBucket: true, requestTimeoutMs: 10_000 },
    storage: { inProcessUploader: false },
    limits: { requestsPerSecond: 0, concurrentPerClient: 0, requestTimeoutMs: REQUEST_TIMEOUT_MS },
    // A lease outlives the request timeout, as the defaults have it (600 s and 660 s).
    ingest: { workers: 1, inFlightLeaseMs: REQUEST_TIMEOUT_MS + 10_000 },
    connector: { webhookSecret: 'drill-webhook-secret-0123456789', emulatorDelayMs: 50 },
  };
  const gateways: GatewayProc[] = [];
  for (const name of ['gw1', 'gw2']) {
    gateways.push(await spawnGateway(t, { ...base, host: h[name]!.addr('front'), port: 8080 } as never, {}, [], h[name]!.wrap));
  }
  const uploader = await spawnUploader(t, base as never, h.up!.wrap);
  const sessions = [];
  for (const client of clients) {
    const res = await clientOf(gateways[0]!, client).init();
    t.equal(res.status, 200, `session of ${client.id}`);
    sessions.push({ client, uuid: res.body.upload_uuid as string });
  }
  t.comment(`topology, 3 NATS nodes, S3, 2 gateways, uploader and ${CLIENTS} sessions up in ${since(t0)} ms`);

  // The clients, on their own host.
  const load = h.clients!.spawn(process.execPath, [LOAD], { stdio: ['pipe', 'pipe', 'inherit'] });
  t.teardown(() => void load.kill('SIGKILL'));
  const lines: LoadLine[] = [];
  let done!: () => void;
  const finished = new Promise<void>((resolve) => (done = resolve));
  createInterface({ input: load.stdout! }).on('line', (line) => {
    const parsed = JSON.parse(line) as LoadLine | { t: 'done' };
    if (parsed.t === 'done') done();
    else lines.push(parsed);
  });
  const plan: LoadPlan = {
    gateways: gateways.map((g) => g.url),
    sessions,
    lanes: LANES,
    rows: ROWS,
    paceMs: PACE_MS,
    timeoutMs: HANG_MS,
    statusEveryMs: 250,
    finishMs: FINISH_MS,
  };
  load.stdin!.write(`${JSON.stringify(plan)}\n`);
  await until('first answers', async () => lines.filter((l) => l.t === 'i' && l.status === 200).length, (n) => n >= LANES, 30_000);

  // The nemesis: each fault lasts FAULT_MS, then heals; SETTLE_MS between faults (the schedule, not a wait for an outcome).
  const phases: Phase[] = [];
  const pause = (ms: number) => new Promise((r) => setTimeout(r, ms));
  await pause(SETTLE_MS);
  for (let round = 1; round <= ROUNDS; round++) {
    for (const f of faults(net, cluster).filter((f) => !ONLY || f.name.includes(ONLY))) {
      const connected = await connections(net, cluster);
      const target = await f.apply();
      const from = Date.now();
      await pause(FAULT_MS);
      const to = Date.now();
      await f.heal();
      phases.push({ name: f.name, minority: f.minority, from, to, connected, target });
      t.comment(`${f.name} (${target}; ${connected}): ${to - from} ms, healed in ${Date.now() - to} ms`);
      await pause(SETTLE_MS);
    }
  }
  load.stdin!.end();
  await finished;
  const loadEnd = Date.now();

  const ingests = lines.filter((l) => l.t === 'i');
  const probes = lines.filter((l) => l.t === 's');
  // A request belongs to every fault it was in flight during (sent before the heal, answered after the fault began).
  const during = (l: LoadLine, p: Phase): boolean => l.at < p.to && l.at + l.ms >= p.from;
  const phasesOf = (l: LoadLine): Phase[] => phases.filter((p) => during(l, p));
  const onMinority = (l: LoadLine): boolean => phasesOf(l).some((p) => p.minority.includes(l.gw));
  const kind = (l: LoadLine): string => {
    if (l.status === 200) return '200';
    if (l.status === 503 && l.retryAfter && /^\d+$/.test(l.retryAfter)) {
      const detail = (() => {
        try {
          return (JSON.parse(l.body ?? '') as { detail?: unknown }).detail;
        } catch {
          return undefined;
        }
      })();
      if (detail === UNAVAILABLE) return '503 unavailable';
      if (detail === 'Rate limit exceeded') return '503 rate limit';
    }
    if (l.key && l.status === 409 && l.retryAfter && l.body?.includes(IN_PROGRESS)) return '409 in progress';
    return typeof l.status === 'number' ? `${l.status} ${String(l.body).slice(0, 80)}` : String(l.status);
  };
  const allowed = new Set(['200', '503 unavailable', '503 rate limit', '409 in progress']);

  // Per phase: answers, and how the majority side's status answered.
  const report: string[] = [];
  const rows = [{ name: 'no fault (before, between and after)', minority: [] as number[], from: 0, to: 0, connected: '', target: '' }, ...phases];
  for (const p of rows) {
    const mine = (l: LoadLine) => (p.from === 0 ? phasesOf(l).length === 0 : during(l, p));
    const answers = new Map<string, number>();
    for (const l of ingests.filter(mine)) answers.set(kind(l), (answers.get(kind(l)) ?? 0) + 1);
    const majority = probes.filter((l) => mine(l) && !p.minority.includes(l.gw));
    const minority = probes.filter((l) => mine(l) && p.minority.includes(l.gw));
    const slow = majority.filter((l) => l.status !== 200 || l.ms > STATUS_WITHIN_MS);
    const worst = (ls: LoadLine[]) => (ls.length ? Math.max(...ls.map((l) => l.ms)) : 0);
    // After the heal: until when the service was not yet itself again (a status probe not 200 within 1 s, an ingest not 200).
    const next = phases.find((q) => q.from > p.to)?.from ?? Infinity;
    const after = lines.filter((l) => p.from !== 0 && l.at >= p.to && l.at + l.ms < next);
    const bad = after.filter((l) => l.status !== 200 || (l.t === 's' && l.ms > STATUS_WITHIN_MS));
    const recovered = bad.length ? Math.max(...bad.map((l) => l.at + l.ms)) - p.to : 0;
    report.push(
      `${p.name}: ingest ${JSON.stringify(Object.fromEntries(answers))}; status on the majority side: ${majority.length} probes, ` +
        `${slow.length} not 200 within ${STATUS_WITHIN_MS} ms, slowest ${worst(majority)} ms` +
        (minority.length ? `; on the cut-off side: ${JSON.stringify(Object.fromEntries(count(minority.map(kind))))}, slowest ${worst(minority)} ms` : '') +
        (p.from !== 0 ? `; ${p.target}, connected ${p.connected}; back to 200s (status within 1 s) ${recovered} ms after the heal` : ''),
    );
  }
  for (const line of report) t.comment(line);

  if (process.env.NETWORK_DRILL_DUMP) {
    // Everything the drill saw, for a closer look: NETWORK_DRILL_DUMP=<file>.
    await writeFile(process.env.NETWORK_DRILL_DUMP, JSON.stringify({ phases, lines, gateways: gateways.map((g) => g.output()), uploader: uploader.output() }));
  }

  // Heal is done: every session drains, then finishes.
  const observer = gateways[1]!;
  const tDrain = performance.now();
  for (const s of sessions) {
    await until(
      `${s.client.id}: upload_tasks_finished`,
      async () => (await clientOf(observer, s.client).status(s.uuid)).body,
      (b) => b?.upload_tasks_finished === true,
      180_000,
      250,
    );
  }
  const drainMs = since(tDrain);
  const records = await natsRecords(t, cluster.urls, 3);
  const recorded = new Map<string, RecordedSession>();
  for (const s of sessions) {
    const record = (await records(s.uuid))!;
    recorded.set(s.uuid, record);
    // As a client does: a 503 with Retry-After is asked again (NATS elects its leaders for up to
    // about 25 s after a majority comes back, docs/reliability.md), for up to START_RETRY_MS.
    const startAt = performance.now();
    const refused: string[] = [];
    let start = await clientOf(observer, s.client).start(s.uuid, { date_from: '2024-01-01', date_to: yesterday() });
    while (start.status === 503 && start.headers['retry-after'] && since(startAt) < START_RETRY_MS) {
      refused.push(`${since(startAt)} ms: ${JSON.stringify(start.body)}`);
      await pause(Number(start.headers['retry-after']) * 1000);
      start = await clientOf(observer, s.client).start(s.uuid, { date_from: '2024-01-01', date_to: yesterday() });
    }
    if (refused.length) t.comment(`${s.client.id}: start-upload answered 503 first (${refused.join('; ')}), then ${start.status}`);
    t.equal(start.status, 200, `${s.client.id}: start-upload (503s retried as Retry-After says)`);
    if (start.status !== 200) {
      // What the gateway logged of it (the dump above was written before this step).
      t.comment(`start-upload answered ${start.status} ${JSON.stringify(start.body)}; the observer's last warnings and errors:\n${logged(observer, 'warn', 'error').slice(-5).join('\n')}`);
      for (const n of cluster.servers) t.comment(`${n.name}'s last log lines:\n${n.logTail(10).join('\n')}`);
    }
    t.same(start.body.entities, [{ name: 'products', rows: record.packages.length * ROWS }], `${s.client.id}: the Connector counts the recorded rows`);
    await until(`${s.client.id}: DONE`, async () => (await clientOf(observer, s.client).status(s.uuid)).body, (b) => b?.session_status === 'DONE', 60_000, 250);
  }

  // What was stored, package by package.
  const recordedIds = new Map([...recorded].map(([uuid, r]) => [uuid, new Set(r.packages.map((p) => p.id))]));
  const store = await openS3(s3);
  t.teardown(() => store.close());
  // A session of more than 1,000 objects also holds the manifest the Connector was handed (service.ts): not a package.
  const manifests = new Set(sessions.map((s) => manifestKey('uploads', s.client.id, s.uuid)));
  const objects = (await readObjects(store)).filter((o) => !manifests.has(o.key));
  const stored = new Map<string, number>();
  const rowSeen = new Map<string, number>();
  let notWhole = 0;
  let unrecorded = 0;
  const broken: string[] = [];
  for (const o of objects) {
    const pkgs = new Set(o.ids.map(packageOfRow));
    if (pkgs.size !== 1 || o.ids.length !== ROWS || o.header.rows !== ROWS || o.malformed.length > 0) {
      notWhole++;
      broken.push(
        `${o.key}: header ${JSON.stringify(o.header)}, ${o.ids.length} rows of ${[...pkgs].join(', ')}` +
          (o.malformed.length ? `, ${o.malformed.length} lines not rows, first: ${o.malformed[0]!.slice(0, 300)}` : ''),
      );
    }
    for (const p of pkgs) stored.set(p, (stored.get(p) ?? 0) + 1);
    for (const id of o.ids) rowSeen.set(id, (rowSeen.get(id) ?? 0) + 1);
    if (!recordedIds.get(o.header.upload_uuid)?.has(o.header.package_id)) unrecorded++;
  }
  const recordedTotal = [...recorded.values()].reduce((n, r) => n + r.packages.length, 0);
  if (broken.length) {
    t.comment(`objects that are not one whole package (${broken.length}):\n${broken.slice(0, 10).join('\n')}`);
    if (process.env.NETWORK_DRILL_DUMP) await writeFile(`${process.env.NETWORK_DRILL_DUMP}.broken.txt`, broken.join('\n'));
  }

  let acceptedMissing = 0;
  let acceptedTwice = 0;
  let refusedStored = 0;
  let hungStored = 0;
  let hungUnrecorded = 0;
  const refusedStoredList: string[] = [];
  /** When each of those was asked and answered, give or take a second: the gateways' log lines then are printed. */
  const refusedStoredAt: { from: number; to: number }[] = [];
  // A keyed package is judged whole: its 200, whichever attempt got it, is what the client keeps.
  const keyed = new Map<string, LoadLine[]>();
  for (const l of ingests) if (l.key) keyed.set(l.pkg!, [...(keyed.get(l.pkg!) ?? []), l]);
  let keyedUnfinished = 0;
  for (const [pkg, attempts] of keyed) {
    const n = stored.get(pkg) ?? 0;
    if (!attempts.some((l) => l.status === 200)) keyedUnfinished++;
    else if (n === 0) acceptedMissing++;
    else if (n > 1) acceptedTwice++;
  }
  for (const l of ingests.filter((l) => !l.key)) {
    const n = stored.get(l.pkg!) ?? 0;
    if (l.status === 200) {
      if (n === 0) acceptedMissing++;
      if (n > 1) acceptedTwice++;
    } else if (typeof l.status === 'number') {
      if (n > 0) {
        refusedStored++;
        refusedStoredList.push(`${l.pkg} ${kind(l)} after ${l.ms} ms at ${new Date(l.at).toISOString()}`);
        refusedStoredAt.push({ from: l.at - 1000, to: l.at + l.ms + 1000 });
      }
    } else if (n > 0) hungStored++;
    else hungUnrecorded++;
  }
  // An ingest of unknown outcome is closed unanswered by the gateway (not a hang: at once).
  const outside = ingests.filter((l) => !allowed.has(kind(l)) && kind(l) !== 'error:UND_ERR_SOCKET');
  const majorityUnanswered = probes.filter((l) => !onMinority(l) && (!allowed.has(kind(l)) || l.ms > HANG_MS));
  const minorityUnanswered = probes.filter((l) => onMinority(l) && !allowed.has(kind(l)));
  t.comment(
    `${new Set(ingests.map((l) => l.pkg)).size} packages sent in ${ingests.length} requests over ${Math.round((loadEnd - phases[0]!.from) / 1000)} s of faults, ${ingests.filter((l) => l.status === 200).length} answered 200, ` +
      `${recordedTotal} recorded, ${objects.length} objects stored; no answer: ${hungStored} stored, ${hungUnrecorded} not; drained ${drainMs} ms after the load stopped; whole drill ${since(t0)} ms`,
  );
  if (refusedStoredList.length) t.comment(`stored although refused:\n${refusedStoredList.slice(0, 20).join('\n')}`);
  const retried = [...keyed.values()].filter((a) => a.length > 1);
  t.comment(
    `keyed: ${keyed.size} packages in ${ingests.filter((l) => l.key).length} attempts; ${retried.length} retried, ` +
      `${retried.filter((a) => a.at(-1)!.replayed).length} of them answered Idempotent-Replayed; ${keyedUnfinished} without a 200`,
  );

  t.equal(acceptedMissing, 0, 'every package that got 200 is stored');
  t.equal(acceptedTwice, 0, '... exactly once');
  t.ok([...rowSeen.values()].every((n) => n === 1), 'no row is stored twice');
  t.equal(notWhole, 0, 'every object holds one whole package');
  t.equal(refusedStored, 0, 'nothing is stored without a 200 (no refused package stored)');
  t.equal(keyedUnfinished, 0, 'every package retried with its Idempotency-Key ends with a 200');
  t.equal(unrecorded, 0, 'nothing is stored that its session does not record');
  t.equal(objects.length, recordedTotal, 'every recorded package is stored');
  const sent = new Set(ingests.map((l) => l.pkg));
  t.ok([...stored.keys()].every((p) => sent.has(p)), 'every stored package was sent');
  t.same(summary(outside), {}, `every answer is 200 or 503 with Retry-After, none hangs past ${HANG_MS} ms`);
  const closedUnanswered = ingests.filter((l) => kind(l) === 'error:UND_ERR_SOCKET').length;
  const unknownLogged = gateways.reduce((n, gw) => n + logged(gw, 'error').filter((l) => l.includes('outcome unknown')).length, 0);
  t.ok(closedUnanswered <= unknownLogged, `an ingest closed unanswered is one the gateway logged as of unknown outcome (${closedUnanswered} closed, ${unknownLogged} logged)`);
  // What the gateways logged of their internal errors, so a 500 names its cause in the test's output.
  if (outside.length > 0) {
    for (const [i, gw] of gateways.entries()) {
      const failed = logged(gw, 'error');
      // The first ones name what went wrong first (a 500's stack); the last ones what it ended in.
      const shown = failed.length > 6 ? [...failed.slice(0, 3), '…', ...failed.slice(-3)] : failed;
      if (failed.length > 0) t.comment(`gw${i + 1} logged ${failed.length} error(s), the first and last ones:\n${shown.join('\n')}`);
    }
  }
  // A refused package that was stored: what the gateways logged (warnings and errors) while it was asked, for its cause.
  for (const { from, to } of refusedStoredAt.slice(0, 3)) {
    for (const [i, gw] of gateways.entries()) {
      const then = logged(gw, 'warn', 'error').filter((line) => {
        const time = logTime(line);
        return time !== null && time >= from && time <= to;
      });
      if (then.length > 0) t.comment(`gw${i + 1} logged from ${new Date(from).toISOString()} to ${new Date(to).toISOString()}:\n${then.slice(0, 20).join('\n')}`);
    }
  }
  t.same(summary(minorityUnanswered), {}, 'status on a gateway without a quorum answers (200 or 503), no hang');
  t.ok(probes.some((l) => !onMinority(l)), 'status was probed on the majority side');
  t.same(summary(majorityUnanswered), {}, `status on the majority side answers (200 or 503), none hangs past ${HANG_MS} ms`);
  const majorityProbes = probes.filter((l) => !onMinority(l));
  const slowMajority = majorityProbes.filter((l) => l.status !== 200 || l.ms > STATUS_WITHIN_MS);
  t.ok(
    slowMajority.length <= Math.floor(majorityProbes.length * STATUS_MISSES_ALLOWED),
    `status on the majority side: 200 within ${STATUS_WITHIN_MS} ms, but for at most ${STATUS_MISSES_ALLOWED * 100} % of probes (${slowMajority.length} of ${majorityProbes.length} missed)`,
  );
});

/** The time (epoch ms) of a gateway's JSON log line, or null. */
function logTime(line: string): number | null {
  try {
    const time = (JSON.parse(line) as { time?: unknown }).time;
    const ms = typeof time === 'number' ? time : Date.parse(String(time));
    return Number.isFinite(ms) ? ms : null;
  } catch {
    return null;
  }
}

function count(keys: string[]): Map<string, number> {
  const m = new Map<string, number>();
  for (const k of keys) m.set(k, (m.get(k) ?? 0) + 1);
  return m;
}

/** Violations by kind and gateway, with the first few instances, for a readable failure. */
function summary(ls: LoadLine[]): Record<string, string> {
  const by = new Map<string, LoadLine[]>();
  for (const l of ls) {
    const key = `gw${l.gw + 1} ${typeof l.status === 'number' ? `${l.status}${l.status === 200 ? ` slower than ${STATUS_WITHIN_MS} ms` : ''}` : l.status}`;
    by.set(key, [...(by.get(key) ?? []), l]);
  }
  return Object.fromEntries(
    [...by].map(([k, v]) => [
      k,
      `${v.length}× e.g. ${v
        .slice(0, 3)
        .map((l) => `${new Date(l.at).toISOString().slice(11, 23)} ${l.ms} ms ${String(l.body ?? '').slice(0, 100)}`)
        .join(' | ')}`,
    ]),
  );
}
