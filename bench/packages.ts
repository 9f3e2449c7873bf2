/**
 * `npm run bench:packages`: the per-package path. Small packages from many sessions, one
 * session grown to many packages, and 1 MiB packages — each against the durable
 * conventional peer (parse, check, append + fdatasync per package), in the same run, on
 * the back ends asked for:
 *
 * - `embedded`: the default, files under a temp DATA_DIR;
 * - `nats`: one nats-server (JetStream) and s3rver;
 * - `nats-cluster`: a 3-node nats-server cluster, every stream R3, and s3rver;
 * - `nats-distant`: one nats-server behind a TCP proxy that holds every chunk 1 ms in each
 *   direction (≈ 2 ms round trip: a cross-zone link), and s3rver.
 *
 * Every nats-server runs the shipped JetStream settings (config/nats/jetstream.conf:
 * `sync_interval: always`); a NATS engine with `:default-sync` appended (`nats:default-sync`)
 * runs nats-server's default instead (an fsync every 2 minutes), to show in one run what
 * syncing before each acknowledgement costs; with `:no-uploader` the service runs no uploader
 * (status while the uploaders are behind). For NATS engines the report also gives, per
 * package, the messages stored in every stream plus acknowledgements and (single server)
 * the server's fsync calls per stream (strace with a seccomp filter), and in `many` the status p99
 * measured during the load, beside the p99 of `/healthz` asked between the status requests (an
 * answer that reads nothing: what the loaded machine alone adds to any answer). With --floors,
 * two more floors are asked in the same turn: `GET /` of an idle Node HTTP server in a process of
 * its own (what the machine's two loaded cores add to an answer from a process with nothing
 * else to do), and, on NATS engines, the same status from a second gateway on the same NATS
 * and S3 that takes no load (what the store's reads cost an answer whose own process is idle).
 *
 * Scenarios: `many` — 16 sessions (one client each), 4 packages of ~7 KB in flight per
 * session (--in-flight), for --duration seconds, the status asked in turn while the clients
 * send (not while the uploads catch up after); `one` — one session, 16 in flight, --grow
 * packages, the rate per tenth of them and the status latency at the end; `mib` — 1 MiB
 * packages, 16 in flight over 16 sessions, for --duration seconds. Reports packages/s, latency
 * p50/p99, and the server's CPU ms per package (all its threads, from /proc); for the service
 * also the rate until the last package was stored (its background uploads finished: the rate
 * it sustains) and the CPU per package until then.
 *
 * Flags: --engine LIST (embedded,nats), --scenario LIST (many,one,mib), --duration S (10),
 * --grow N (20000), --out DIR (bench/results), --no-peer, --inline-bytes LIST (the service once per
 * `ingest.inlineBytes` given: `32768,0` measures the short way of small packages against none),
 * --rounds N (1: every target N times in turn, A B A B, each a fresh service; medians and, for an
 * engine run beside its `:default-sync`, the ratio of each round's pair), --in-flight N (4: packages
 * in flight per session in `many`), --floors (status's two floors above), --pin-nats (a single
 * nats-server on the last core, this bench and everything it starts on the others: a server
 * with a core of its own, which a machine of two shared cores cannot otherwise show). `BENCH_SERVER_FLAGS` adds Node flags to the service (as for
 * `npm run bench`), e.g. `--cpu-prof --cpu-prof-dir=DIR`; `BENCH_NATS_SUBJECTS=FILE` writes
 * every message the NATS server carried, counted by subject shape.
 */
import { execFileSync, fork, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { mkdir, readdir, readFile, writeFile } from 'node:fs/promises';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { connect as natsConnect } from 'nats';
import { request } from 'undici';
import { findEntity } from '../src/entities/catalog.js';
import { hashToken } from '../src/http/auth.js';
import { startNats, startNatsCluster } from '../testbed/nats.js';
import { AS_IN_PRODUCTION, distributed, spawnGateway } from '../testbed/processes.js';
import { startS3Process } from '../testbed/s3.js';
import { generateBody } from './bodies.js';
import type { PackagesJob, PackagesResult } from './packages-client.js';

const { values } = parseArgs({
  options: {
    engine: { type: 'string', default: 'embedded,nats' },
    scenario: { type: 'string', default: 'many,one,mib' },
    duration: { type: 'string', default: '10' },
    grow: { type: 'string', default: '20000' },
    out: { type: 'string', default: 'bench/results' },
    'no-peer': { type: 'boolean', default: false },
    clients: { type: 'string', default: '2' },
    'inline-bytes': { type: 'string', default: '' },
    rounds: { type: 'string', default: '1' },
    'in-flight': { type: 'string', default: '4' },
    floors: { type: 'boolean', default: false },
    'pin-nats': { type: 'boolean', default: false },
  },
});
const ENGINES = values.engine!.split(',');
const SCENARIOS = values.scenario!.split(',');
const DURATION_MS = Number(values.duration) * 1000;
const GROW = Number(values.grow);
const CLIENT_PROCS = Number(values.clients);
const ROUNDS = Math.max(1, Number(values.rounds));
/**
 * The CPUs this process may run on (`Cpus_allowed_list`: a container's cpuset or a `taskset`
 * around the bench), in order; every CPU of the machine where the list is not to be read.
 */
function allowedCpus(): number[] {
  let list: string | undefined;
  try {
    list = /^Cpus_allowed_list:\s*(\S+)$/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1];
  } catch {
    // not Linux: taskset refuses below
  }
  if (!list) return cpus().map((_, i) => i);
  return list.split(',').flatMap((part) => {
    const [lo = 0, hi = lo] = part.split('-').map(Number);
    return Array.from({ length: hi - lo + 1 }, (_, i) => lo + i);
  });
}
/** --pin-nats: the last CPU allowed, nats-server's alone (a single server: the cluster's three would share it). */
const ALLOWED = values['pin-nats'] ? allowedCpus() : [];
const NATS_CPU = values['pin-nats'] ? ALLOWED.at(-1) : undefined;
if (NATS_CPU !== undefined && (ALLOWED.length < 2 || ENGINES.some((e) => e.startsWith('nats-cluster')))) {
  throw new Error('--pin-nats needs two CPUs or more and a single nats-server (not nats-cluster)');
}
/** --pin-nats: every other CPU allowed, as `taskset -c` takes them. */
const REST_CPUS = ALLOWED.slice(0, -1).join(',');
/** Packages in flight per session in `many`. */
const IN_FLIGHT = Math.max(1, Number(values['in-flight']));
/** `ingest.inlineBytes` of the service, one measurement each (e.g. `32768,0`: the short way against none); empty: the default. */
const INLINE: (number | undefined)[] = values['inline-bytes'] ? values['inline-bytes'].split(',').map(Number) : [undefined];
const SESSIONS = 16;
const API = '/api/v1/uploading';
const CLIENT = fileURLToPath(new URL('./packages-client.js', import.meta.url));
const DURABLE_PEER = fileURLToPath(new URL('./peers/durable.js', import.meta.url));
const CLK_TCK = 100;

const teardowns: (() => unknown)[] = [];
const t = { teardown: (fn: () => unknown) => void teardowns.push(fn) };
async function cleanUp(): Promise<void> {
  for (const fn of teardowns.reverse()) await Promise.resolve(fn()).catch(() => undefined);
  teardowns.length = 0;
}
process.once('SIGINT', () => void cleanUp().then(() => process.exit(130)));

interface Target {
  name: string;
  url: string;
  pid: number;
  /** Makes the sessions the lanes send to; the peer needs none. */
  session(client: BenchClient): Promise<string>;
  status?(client: BenchClient, uuid: string): Promise<void>;
  /** `GET /healthz`: an answer that reads nothing, asked beside status as the machine's floor. */
  health?(): Promise<void>;
  /** --floors, NATS: the same status from a second gateway that takes no load. */
  idleStatus?(client: BenchClient, uuid: string): Promise<void>;
  /** Whether every package the session got is stored (its uploads finished). */
  stored?(client: BenchClient, uuid: string): Promise<boolean>;
  /** On NATS: messages stored in every stream plus acknowledgements so far. */
  jetStreamWrites?(): Promise<number>;
  /** On a single nats-server: its fsync and fdatasync calls so far, per stream. */
  fsyncs?(): Promise<Map<string, number>>;
}

interface BenchClient {
  id: string;
  token: string;
}

const clients: BenchClient[] = Array.from({ length: SESSIONS }, (_, i) => ({ id: `bench-${i}`, token: `bench-token-${i}` }));
/** The client of the one-session scenario: a session of its own, grown from zero. */
const grower: BenchClient = { id: 'bench-one', token: 'bench-token-one' };

/** CPU time of a process (all threads), ms. */
async function cpuMs(pid: number): Promise<number> {
  const fields = (await readFile(`/proc/${pid}/stat`, 'utf8')).split(') ')[1]!.split(' ');
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / CLK_TCK;
}

/** CPU time (ms) of every process on the machine now, with what it is: to tell who spent the cores during a load. */
async function everyProcessCpu(): Promise<Map<number, { ms: number; what: string }>> {
  const out = new Map<number, { ms: number; what: string }>();
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = await readFile(`/proc/${entry}/stat`, 'utf8');
      const fields = stat.split(') ')[1]!.split(' ');
      const cmd = (await readFile(`/proc/${entry}/cmdline`, 'utf8')).replaceAll('\0', ' ');
      out.set(Number(entry), { ms: ((Number(fields[11]) + Number(fields[12])) * 1000) / CLK_TCK, what: cmd });
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/** CPU ms per package between two snapshots, by part: the gateway, nats-server, the S3 server, the clients, the rest. */
function cpuShares(
  before: Map<number, { ms: number; what: string }>,
  after: Map<number, { ms: number; what: string }>,
  gateway: number,
  clientPids: Set<number>,
  packages: number,
): string {
  const parts: Record<string, number> = { gateway: 0, 'nats-server': 0, s3: 0, clients: 0, rest: 0 };
  for (const [pid, { ms, what }] of after) {
    const spent = ms - (before.get(pid)?.ms ?? 0);
    if (spent <= 0) continue;
    const part =
      pid === gateway ? 'gateway' : what.includes('nats-server') ? 'nats-server' : what.includes('testbed/s3') ? 's3' : clientPids.has(pid) ? 'clients' : 'rest';
    parts[part]! += spent;
  }
  return Object.entries(parts)
    .map(([k, ms]) => `${k} ${(ms / Math.max(1, packages)).toFixed(2)}`)
    .join(', ');
}

function pct(sorted: number[], p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

interface Load {
  packages: number;
  seconds: number;
  perSecond: number;
  p50: number;
  p99: number;
  cpuMsPerPackage: number;
  /** Packages/s until the last one was stored, and CPU ms per package until then (the background uploads included). */
  stored?: { perSecond: number; cpuMsPerPackage: number };
  /** CPU ms per package of each process, from the load's start until the last package was stored (or the load's end). */
  cpuParts: string;
  failures: Record<string, number>;
  /** Packages/s per consecutive block, when asked for. */
  blocks?: number[];
}

/** Sends from `lanes` (split over the client processes) until `count` or `durationMs`. */
async function load(
  target: Target,
  bodyFile: string,
  lanes: PackagesJob['lanes'],
  opts: { count?: number; durationMs?: number; blocks?: number; loaded?: () => void },
): Promise<Load> {
  const procs = Math.min(CLIENT_PROCS, lanes.length);
  const children: ChildProcess[] = [];
  for (let i = 0; i < procs; i++) {
    const child = fork(CLIENT, [], { serialization: 'advanced', stdio: 'inherit' });
    t.teardown(() => child.kill());
    await new Promise<void>((resolve) => child.once('message', () => resolve()));
    children.push(child);
  }
  const every0 = await everyProcessCpu();
  const cpu0 = await cpuMs(target.pid);
  const t0 = Date.now();
  const untilMs = opts.durationMs ? t0 + opts.durationMs : Number.MAX_SAFE_INTEGER;
  const results = await Promise.all(
    children.map(
      (child, i) =>
        new Promise<PackagesResult>((resolve, reject) => {
          const mine = lanes.filter((_, l) => l % procs === i);
          const count = opts.count ? Math.floor(opts.count / procs) + (i < opts.count % procs ? 1 : 0) : 0;
          child.once('message', (m: { type: string; result?: PackagesResult; message?: string }) =>
            m.type === 'result' ? resolve(m.result!) : reject(new Error(m.message)),
          );
          child.send({ url: target.url, bodyFile, entity: 'products', lanes: mine, count, untilMs } satisfies PackagesJob);
        }),
    ),
  );
  const seconds = (Date.now() - t0) / 1000;
  opts.loaded?.();
  const cpu = (await cpuMs(target.pid)) - cpu0;
  let stored: Load['stored'];
  if (target.stored) {
    // The uploads run in the background: what the service sustains is the rate until the last package is stored.
    const sessions = [...new Map(lanes.map((l) => [l.uuid, l])).values()];
    for (const l of sessions) {
      while (!(await target.stored({ id: l.clientId, token: l.token }, l.uuid))) await new Promise((r) => setTimeout(r, 20));
    }
    const packages = results.reduce((n, r) => n + r.end.length, 0);
    stored = { perSecond: packages / ((Date.now() - t0) / 1000), cpuMsPerPackage: ((await cpuMs(target.pid)) - cpu0) / Math.max(1, packages) };
  }
  const cpuParts = cpuShares(every0, await everyProcessCpu(), target.pid, new Set(children.map((c) => c.pid!)), results.reduce((n, r) => n + r.end.length, 0));
  for (const c of children) c.kill();
  const ends = results.flatMap((r) => r.end).sort((a, b) => a - b);
  const latencies = results.flatMap((r) => r.end.map((e, i) => e - r.start[i]!)).sort((a, b) => a - b);
  const failures: Record<string, number> = {};
  for (const r of results) for (const [k, n] of Object.entries(r.failures)) failures[k] = (failures[k] ?? 0) + n;
  const packages = ends.length;
  const out: Load = {
    packages,
    seconds,
    perSecond: packages / seconds,
    p50: pct(latencies, 50),
    p99: pct(latencies, 99),
    cpuMsPerPackage: cpu / Math.max(1, packages),
    ...(stored ? { stored } : {}),
    cpuParts,
    failures,
  };
  if (opts.blocks) {
    const size = Math.floor(packages / opts.blocks);
    out.blocks = [];
    let from = t0;
    for (let b = 1; b <= opts.blocks; b++) {
      const at = ends[b * size - 1]!;
      out.blocks.push(size / ((at - from) / 1000));
      from = at;
    }
  }
  return out;
}

/** One target's result in one scenario of one round. */
interface Measured {
  label: string;
  scenario: 'many' | 'one' | 'mib';
  round: number;
  perSecond: number;
  /** Status p99: during the load (`many`), at the end (`one`). */
  statusMs?: number;
  /** `many`: /healthz p99 during the load. */
  healthMs?: number;
  /** `one`: the last tenth's rate ÷ the first's. */
  lastFirst?: number;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 === 1 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

/**
 * After more than one round, each target's median (min–max) per scenario; and for every engine
 * run beside its `:default-sync`, the ratio of the two in each round (they ran one after the
 * other: the pair shares the machine's speed of the moment) and the median of those.
 */
function summarize(measured: Measured[]): void {
  const range = (xs: number[], digits: number) =>
    `${median(xs).toFixed(digits)}${xs.length > 1 ? ` (${Math.min(...xs).toFixed(digits)}–${Math.max(...xs).toFixed(digits)})` : ''}`;
  /** Each target and scenario measured, once, in the order first measured. */
  const keys = [...new Map(measured.map((m) => [`${m.label} ${m.scenario}`, m])).values()];
  const of = (label: string, scenario: string) => measured.filter((m) => m.label === label && m.scenario === scenario);
  if (ROUNDS > 1) {
    say('');
    say(`Over ${ROUNDS} rounds, median (min–max):`);
    say('');
    say('| target | scenario | packages/s | status p99 ms (`many`: during the load; `one`: at the end) | /healthz p99 ms (`many`) | last ÷ first |');
    say('|---|---|---:|---:|---:|---:|');
    for (const { label, scenario } of keys) {
      const ms = of(label, scenario);
      const status = ms.flatMap((m) => (m.statusMs === undefined ? [] : [m.statusMs]));
      const health = ms.flatMap((m) => (m.healthMs === undefined ? [] : [m.healthMs]));
      const lastFirst = ms.flatMap((m) => (m.lastFirst === undefined ? [] : [m.lastFirst]));
      say(`| ${label} | ${scenario} | ${range(ms.map((m) => m.perSecond), 0)} | ${status.length ? range(status, 1) : ''} | ${health.length ? range(health, 1) : ''} | ${lastFirst.length ? range(lastFirst, 2) : ''} |`);
    }
  }
  const pairs: string[] = [];
  for (const { label, scenario } of keys) {
    const base = label.replace(':default-sync', '');
    if (base === label || !keys.some((k) => k.label === base && k.scenario === scenario)) continue;
    const ratios = of(base, scenario).flatMap((m) => {
      const other = of(label, scenario).find((d) => d.round === m.round);
      return other ? [m.perSecond / other.perSecond] : [];
    });
    pairs.push(`- \`${scenario}\`: ${base} ÷ ${label}, packages/s, per round ${ratios.map((x) => x.toFixed(2)).join(', ')}; median ${median(ratios).toFixed(2)}`);
  }
  if (pairs.length > 0) {
    say('');
    for (const p of pairs) say(p);
  }
}

async function statusP99(target: Target, client: BenchClient, uuid: string, n = 300): Promise<number> {
  const lat: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await target.status!(client, uuid);
    lat.push(performance.now() - t0);
  }
  return pct(lat.sort((a, b) => a - b), 99);
}

async function api(url: string, client: BenchClient, method: 'GET' | 'POST', path: string): Promise<any> {
  const res = await request(`${url}${API}${path}`, { method, headers: { authorization: client.token, 'client-id': client.id } });
  const body = await res.body.json();
  if (res.statusCode !== 200) throw new Error(`${method} ${path}: ${res.statusCode} ${JSON.stringify(body)}`);
  return body;
}

/** A TCP proxy that holds every chunk `delayMs` in each direction, in order. */
async function delayProxy(upstreamPort: number, delayMs: number): Promise<{ url: string; server: Server }> {
  const pipeDelayed = (from: Socket, to: Socket) => {
    let last = 0;
    from.on('data', (chunk) => {
      const due = Math.max(Date.now() + delayMs, last);
      last = due;
      setTimeout(() => to.write(chunk), due - Date.now());
    });
    from.on('close', () => setTimeout(() => to.destroy(), delayMs + 1));
    from.on('error', () => to.destroy());
  };
  const server = createServer((down) => {
    const up = connect(upstreamPort, '127.0.0.1');
    up.setNoDelay(true);
    down.setNoDelay(true);
    pipeDelayed(down, up);
    pipeDelayed(up, down);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => server.close());
  return { url: `nats://127.0.0.1:${(server.address() as { port: number }).port}`, server };
}

/** Messages stored in every stream plus every consumer's acknowledgements: JetStream's writes, each synced under `always`. */
async function jetStreamWrites(natsUrl: string): Promise<number> {
  const nc = await natsConnect({ servers: natsUrl.split(','), timeout: 5000 });
  try {
    const jsm = await nc.jetstreamManager();
    let n = 0;
    for await (const si of jsm.streams.list()) {
      n += si.state.last_seq;
      for await (const ci of jsm.consumers.list(si.config.name)) n += ci.ack_floor.consumer_seq;
    }
    return n;
  } finally {
    await nc.close();
  }
}

async function startService(spec: string, dir: string, inlineBytes?: number): Promise<Target> {
  const [engine, variant] = spec.split(':') as [string, string | undefined];
  if (variant !== undefined && variant !== 'default-sync' && variant !== 'no-uploader') throw new Error(`unknown engine variant ${spec}`);
  const natsOpts = variant === 'default-sync' ? { syncInterval: '2m' } : {};
  const clientsFile = join(dir, 'clients.json');
  await writeFile(
    clientsFile,
    JSON.stringify({ clients: [...clients, grower].map((c) => ({ client_id: c.id, token_sha256: hashToken(c.token), allowed_ips: ['127.0.0.0/8', '::1/128'], min_date: '2020-01-01' })) }),
  );
  const relaxed = {
    clientsFile,
    limits: { requestsPerSecond: 0, concurrentPerClient: 0 },
    log: { level: 'warn' },
    ...(inlineBytes === undefined ? {} : { ingest: { inlineBytes } }),
  };
  let config: Record<string, unknown>;
  let natsUrl: string | undefined;
  let fsyncs: (() => Promise<Map<string, number>>) | undefined;
  if (engine === 'embedded') {
    config = { ...relaxed, connector: { webhookSecret: null } };
  } else {
    const s3 = await startS3Process(t);
    let replicas = 1;
    if (engine === 'nats-cluster') {
      if (variant) throw new Error(`${spec}: the cluster runs the shipped settings only`);
      natsUrl = (await startNatsCluster(t, 3)).urls;
      replicas = 3;
    } else {
      const nats = await startNats(t, { ...natsOpts, countSyncs: true, ...(NATS_CPU === undefined ? {} : { cpus: String(NATS_CPU) }) });
      fsyncs = () => nats.fsyncs();
      natsUrl = engine === 'nats-distant' ? (await delayProxy(Number(new URL(nats.url).port), 1)).url : nats.url;
    }
    if (process.env.BENCH_NATS_SUBJECTS) {
      // Every message through the NATS server by subject shape (ids replaced), written to that file at the end: what a package costs, message by message.
      const nc = await natsConnect({ servers: natsUrl.split(','), timeout: 5000 });
      const counts = new Map<string, number>();
      const sub = nc.subscribe('>');
      void (async () => {
        for await (const m of sub) {
          const k = m.subject.replace(/[0-9a-f]{8}-[0-9a-f-]{27}/g, 'U').replace(/\b[A-Za-z0-9]{22}\b/g, 'N').replace(/\.\d+(\.|$)/g, '.D$1').replace(/_INBOX\..*/, '_INBOX').replace(/\$JS\.ACK\..*/, '$JS.ACK');
          const batch = m.headers?.get('Nats-Batch-Id') ? ' [batch]' : '';
          counts.set(k + batch, (counts.get(k + batch) ?? 0) + 1);
        }
      })();
      t.teardown(async () => {
        await writeFile(process.env.BENCH_NATS_SUBJECTS!, [...counts].sort((a, b) => b[1] - a[1]).map(([k, n]) => `${n} ${k}`).join('\n'));
        await nc.close();
      });
    }
    const base = distributed(natsUrl, s3) as Record<string, any>;
    config = { ...base, ...relaxed, nats: { ...base.nats, replicas }, ...(variant === 'no-uploader' ? { storage: { inProcessUploader: false } } : {}) };
  }
  const flags = process.env.BENCH_SERVER_FLAGS?.split(' ').filter(Boolean) ?? [];
  const gw = await spawnGateway(t, config as never, {}, flags, [], AS_IN_PRODUCTION);
  const idle = values.floors && natsUrl ? await spawnGateway(t, { ...config, storage: { inProcessUploader: false } } as never, {}, [], [], AS_IN_PRODUCTION) : undefined;
  // A CPU profile is written on a clean exit: stop the service (SIGTERM) before the teardown's kill.
  if (flags.length > 0) t.teardown(() => gw.stop());
  return {
    name: `service (${spec}${inlineBytes === undefined ? '' : `, inlineBytes ${inlineBytes}`})`,
    url: gw.url,
    pid: gw.child.pid!,
    session: async (client) => (await api(gw.url, client, 'POST', '/initialize-session')).upload_uuid,
    status: async (client, uuid) => void (await api(gw.url, client, 'GET', `/${uuid}/status`)),
    ...(idle ? { idleStatus: async (client: BenchClient, uuid: string) => void (await api(idle.url, client, 'GET', `/${uuid}/status`)) } : {}),
    health: async () => {
      const res = await request(`${gw.url}/healthz`);
      await res.body.dump();
      if (res.statusCode !== 200) throw new Error(`GET /healthz: ${res.statusCode}`);
    },
    // Without an uploader nothing is ever stored: no stored rate.
    ...(variant === 'no-uploader' ? {} : { stored: async (client: BenchClient, uuid: string) => (await api(gw.url, client, 'GET', `/${uuid}/status`)).upload_tasks_finished === true }),
    ...(natsUrl ? { jetStreamWrites: () => jetStreamWrites(natsUrl!) } : {}),
    ...(fsyncs ? { fsyncs } : {}),
  };
}

async function startPeer(dir: string): Promise<Target> {
  const child = fork(DURABLE_PEER, [dir], { serialization: 'advanced', stdio: 'inherit' });
  t.teardown(() => child.kill());
  const url = await new Promise<string>((resolve) => child.once('message', (m: { url: string }) => resolve(m.url)));
  return { name: 'durable conventional peer', url, pid: child.pid!, session: async () => 'bench' };
}

/**
 * JetStream's messages and acknowledgements, and the server's fsyncs, per package answered,
 * counted from the start of the load until every package is stored (the uploader's own included;
 * with `:no-uploader`, until the clients stop).
 */
function perPackage(packages: number, writes: number | undefined, syncs: Map<string, number> | undefined): string {
  const per = (n: number) => (n / Math.max(1, packages)).toFixed(2);
  const total = syncs && [...syncs.values()].reduce((a, b) => a + b, 0);
  const streams = syncs && [...syncs].sort((a, b) => b[1] - a[1]).map(([stream, n]) => `${stream} ${per(n)}`).join(', ');
  return (writes === undefined ? '' : `; JetStream messages + acks per package ${per(writes)}`) + (syncs === undefined ? '' : `; nats-server fsyncs per package ${per(total!)} (${streams})`);
}

/** Calls since `before`, per stream. */
function syncsSince(before: Map<string, number> | undefined, now: Map<string, number> | undefined): Map<string, number> | undefined {
  if (!before || !now) return undefined;
  return new Map([...now].map(([stream, n]) => [stream, n - (before.get(stream) ?? 0)]));
}

function fmt(l: Load): string {
  const fail = Object.keys(l.failures).length ? ` ⚠ ${JSON.stringify(l.failures).slice(0, 300)}` : '';
  const stored = l.stored ? `${l.stored.perSecond.toFixed(0)} | ${l.stored.cpuMsPerPackage.toFixed(2)}` : '— | —';
  return `${l.perSecond.toFixed(0)} | ${l.p50.toFixed(1)} | ${l.p99.toFixed(1)} | ${l.cpuMsPerPackage.toFixed(2)} | ${stored} | ${l.packages}${fail}`;
}

/** --floors: a Node HTTP server with nothing else to do, in a process of its own, for the whole run. */
async function startIdleProcess(): Promise<{ ask: () => Promise<void> }> {
  // It goes when its stdin ends: when this process exits, however it ends (SIGKILL too).
  const server =
    "process.stdin.on('end', () => process.exit()).resume(); const s = require('node:http').createServer((q, r) => r.end()).listen(0, '127.0.0.1', () => console.log(s.address().port));";
  const child = spawn(process.execPath, ['-e', server], { stdio: ['pipe', 'pipe', 'inherit'] });
  process.once('exit', () => child.kill());
  const [port] = (await once(child.stdout!, 'data')) as [Buffer];
  // neither the child nor its pipes may keep this process alive once the run is done ('exit' kills it)
  child.stdout!.destroy();
  (child.stdin as Socket).unref();
  child.unref();
  const url = `http://127.0.0.1:${Number(String(port))}/`;
  return {
    ask: async () => {
      const res = await request(url);
      await res.body.dump();
    },
  };
}

const lines: string[] = [];
const say = (s: string) => {
  lines.push(s);
  process.stdout.write(`${s}\n`);
};

try {
  const work = join(tmpdir(), `bench-packages-${process.pid}`);
  await mkdir(work, { recursive: true });
  process.once('exit', () => execFileSync('rm', ['-rf', work]));
  if (NATS_CPU !== undefined) execFileSync('taskset', ['-a', '-p', '-c', REST_CPUS, String(process.pid)], { stdio: 'ignore' });
  const idleProcess = values.floors ? await startIdleProcess() : undefined;
  const products = findEntity('products')!;
  const small = join(work, 'small.json');
  const mib = join(work, 'mib.json');
  await writeFile(small, generateBody(products, 7 * 1024).json);
  await writeFile(mib, generateBody(products, 1024 * 1024).json);
  let commit = 'unknown';
  try {
    commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
  } catch {
    // not a checkout
  }
  say(`# Per-package path (bench:packages)`);
  say('');
  say(`Node ${process.version}, ${cpus()[0]?.model ?? 'unknown CPU'} × ${cpus().length}, commit ${commit}, ${new Date().toISOString()}, load ${loadavg()[0]!.toFixed(2)}, ${CLIENT_PROCS} client processes${NATS_CPU === undefined ? '' : `, nats-server alone on CPU ${NATS_CPU}, the rest on CPU${ALLOWED.length === 2 ? '' : 's'} ${REST_CPUS}`}`);
  say('');
  say('| target | scenario | packages/s | p50 ms | p99 ms | server CPU ms/package | stored/s | CPU ms/package until stored | packages |');
  say('|---|---|---:|---:|---:|---:|---:|---:|---:|');
  /** `label`: the engine as `--engine` names it (`:default-sync` pairs are found by it), with its `inlineBytes` if given. */
  const targets: { label: string; make: (round: number) => Promise<Target> }[] = ENGINES.flatMap((e) =>
    INLINE.map((inline) => ({
      label: inline === undefined ? e : `${e} inline ${inline}`,
      make: async (round: number) => {
        const dir = join(work, `${e}-${inline ?? 'default'}-${round}`);
        await mkdir(dir, { recursive: true });
        return startService(e, dir, inline);
      },
    })),
  );
  if (!values['no-peer']) targets.push({ label: 'peer', make: () => startPeer(work) });
  const notes: string[] = [];
  const measured: Measured[] = [];
  for (let round = 1; round <= ROUNDS; round++) for (const { label, make } of targets) {
    const target = await make(round);
    if (ROUNDS > 1) target.name += ` #${round}`;
    const sessions = await Promise.all(clients.map(async (c) => ({ uuid: await target.session(c), clientId: c.id, token: c.token })));
    if (SCENARIOS.includes('many')) {
      const lanes = sessions.flatMap((s) => Array.from({ length: IN_FLIGHT }, () => s));
      const writes0 = await target.jetStreamWrites?.();
      const syncs0 = await target.fsyncs?.();
      // Status of one of the sessions, asked in turn while the clients send (not while the uploads catch up after), and
      // beside it its floors: /healthz (what any answer of this gateway waits for on the loaded machine), with --floors
      // an idle process's answer and an idle gateway's status.
      const s0 = sessions[0]!;
      const c0 = { id: s0.clientId, token: s0.token };
      const probes: { name: string; ask: () => Promise<void>; ms: number[] }[] = [];
      if (target.status) probes.push({ name: 'status', ask: () => target.status!(c0, s0.uuid), ms: [] });
      if (target.health) probes.push({ name: '/healthz', ask: () => target.health!(), ms: [] });
      if (target.idleStatus) probes.push({ name: 'status from an idle gateway', ask: () => target.idleStatus!(c0, s0.uuid), ms: [] });
      if (idleProcess && target.status) probes.push({ name: 'an idle process', ask: () => idleProcess!.ask(), ms: [] });
      let loading = true;
      const poll = (async () => {
        while (loading && probes.length > 0) {
          for (const p of probes) {
            const t0 = performance.now();
            await p.ask();
            p.ms.push(performance.now() - t0);
          }
          await new Promise((r) => setTimeout(r, 10));
        }
      })();
      const r = await load(target, small, lanes, { durationMs: DURATION_MS, loaded: () => (loading = false) });
      await poll;
      say(`| ${target.name} | ${SESSIONS} sessions × ${IN_FLIGHT} in flight, 7 KB | ${fmt(r)} |`);
      const writes = writes0 === undefined ? undefined : (await target.jetStreamWrites!()) - writes0;
      const syncs = syncsSince(syncs0, await target.fsyncs?.());
      for (const p of probes) p.ms.sort((a, b) => a - b);
      const [statusMs, healthMs] = ['status', '/healthz'].map((name) => {
        const ms = probes.find((p) => p.name === name)?.ms;
        return ms && ms.length > 0 ? pct(ms, 99) : undefined;
      });
      const floors = probes.filter((p) => p.name !== 'status' && p.name !== '/healthz').map((p) => `, ${p.name} p99 ${pct(p.ms, 99).toFixed(1)} ms (p50 ${pct(p.ms, 50).toFixed(1)})`);
      measured.push({ label, scenario: 'many', round, perSecond: r.perSecond, ...(statusMs === undefined ? {} : { statusMs }), ...(healthMs === undefined ? {} : { healthMs }) });
      if (target.status || writes !== undefined) {
        notes.push(
          `${target.name}, ${SESSIONS} sessions: status p99 during the load ${statusMs?.toFixed(1)} ms (${probes[0]?.ms.length ?? 0} asked)` +
            (healthMs === undefined ? '' : `, /healthz p99 ${healthMs.toFixed(1)} ms`) +
            floors.join('') +
            perPackage(r.packages, writes, syncs) +
            `; CPU ms per package until stored: ${r.cpuParts}`,
        );
      }
    }
    if (SCENARIOS.includes('one')) {
      const one = { uuid: await target.session(grower), clientId: grower.id, token: grower.token };
      const writes0 = await target.jetStreamWrites?.();
      const syncs0 = await target.fsyncs?.();
      const r = await load(target, small, Array.from({ length: 16 }, () => one), { count: GROW, blocks: 10 });
      const writes = writes0 === undefined ? undefined : (await target.jetStreamWrites!()) - writes0;
      const syncs = syncsSince(syncs0, await target.fsyncs?.());
      const b = r.blocks!;
      say(`| ${target.name} | one session × 16 in flight, ${GROW} × 7 KB | ${fmt(r)} |`);
      const status = target.status ? await statusP99(target, grower, one.uuid) : null;
      measured.push({ label, scenario: 'one', round, perSecond: r.perSecond, lastFirst: b.at(-1)! / b[0]!, ...(status === null ? {} : { statusMs: status }) });
      notes.push(
        `${target.name}, one session: packages/s per tenth ${b.map((x) => x.toFixed(0)).join(', ')}; last ÷ first ${(b.at(-1)! / b[0]!).toFixed(2)}` +
          (status === null ? '' : `; status p99 at ${GROW} packages ${status.toFixed(1)} ms`) +
          perPackage(r.packages, writes, syncs) +
          `; CPU ms per package until stored: ${r.cpuParts}`,
      );
    }
    if (SCENARIOS.includes('mib')) {
      const r = await load(target, mib, sessions, { durationMs: DURATION_MS });
      say(`| ${target.name} | 16 × 1 MiB in flight | ${fmt(r)} (${((r.perSecond * 1024 * 1024) / 1e6).toFixed(0)} MB/s) |`);
      measured.push({ label, scenario: 'mib', round, perSecond: r.perSecond });
    }
    await cleanUp();
  }
  say('');
  for (const n of notes) say(`- ${n}`);
  summarize(measured);
  await mkdir(values.out!, { recursive: true });
  await writeFile(join(values.out!, `packages-${new Date().toISOString().replace(/[:.]/g, '-')}.md`), `${lines.join('\n')}\n`);
} finally {
  await cleanUp();
}
