/**
 * The bench driver (`npm run bench -- [flags]`). Generates the bodies once, measures the
 * parse ceiling and the row-check micro-benchmark, then for every scenario and every
 * server (the service and its HTTP peers) starts that server fresh in its own process,
 * warms it, drives it over real HTTP from separate client processes while a poller times
 * `GET …/status`, reads the server's probe, and stops it. Writes
 * `<out>/<timestamp>.{md,json}` and `<out>/latest.md`, and prints the Markdown.
 *
 * Every loop is bounded in count and time, everything started here listens on loopback
 * only, and every child process is ended at the close of the run, on error and on SIGINT.
 */
import { execFileSync } from 'node:child_process';
import { gzipSync } from 'node:zlib';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { availableParallelism, cpus, loadavg, tmpdir, totalmem } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { findEntity, type EntitySpec } from '../src/entities/catalog.js';
import { generateBody } from './bodies.js';
import { ChildSet, Mailbox } from './children.js';
import { renderCharts } from './charts.js';
import type { RowCheckResult } from './micro/row-check.js';
import type { RowScanResult } from './micro/row-scan.js';
import type { CeilingArgs, CeilingResult } from './peers/ceiling.js';
import type { BodyRef, ClientCommand, ClientEvent, IngestJob, PollJob, ProbeSample, RequestSamples, ServerEvent } from './protocol.js';
import {
  checkTargets,
  DEFAULT_SERVERS,
  ratiosFor,
  renderMarkdown,
  SERVERS,
  type Measurement,
  type Meta,
  type Report,
  type ScenarioInfo,
  type ServerName,
} from './report.js';
import { initSession, PEER_UPLOAD, retireSession, waitUntilServing, type BenchSession, type Credentials } from './session-api.js';
import { summariseLoad, summarisePolls } from './stats.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const MIB = 1024 * 1024;
const CLIENT_PROCESSES = 4;
const DEMO: Credentials[] = [
  { id: 'demo', token: 'demo-token' },
  { id: 'demo-2', token: 'demo-2-token' },
];
const SERVER_EXEC_ARGV = ['--max-old-space-size=8192', ...(process.env.BENCH_SERVER_FLAGS?.split(' ').filter(Boolean) ?? [])];
const READY_TIMEOUT_MS = 60_000;
const REQUEST_TIMEOUT_MS = 600_000;
const POLL_INTERVAL_MS = 10;
const SMALL_MIB = 1;

const HELP = `npm run bench -- [flags]

  --profile quick|full   quick (default): < 2 min on a quiet machine, one round per big
                         scenario, peers only where a target needs them or they are cheap;
                         full: every scenario and peer, up to 3 rounds per client loop
  --size MiB             big package size (default 32)
  --concurrency N[,N…]   concurrent big packages scenarios (default 4,8)
  --duration S           seconds a scenario keeps starting requests (quick 3, full 20)
  --entity NAME          entity of the bodies (default products)
  --workers N            service validation workers (default 0: one per core)
  --out DIR              results directory (default bench/results)
  --scenario ID          only these scenarios (repeatable): single, concurrent-N, small, gzip
  --peers LIST           servers to measure, comma-separated (default ingest,ingest-reference,
                         stream-json,conventional; ingest-reference is the service with
                         ingest.rowScanner false: the row scanner's before, in the same run)
  --repeat N             measure the service N times in the 4-concurrent scenario (default 1;
                         the latency targets hold in every run)
  --target URL           a running deployment: no local service and no HTTP peers
  --client-id ID --token TOKEN   credentials for --target
                         (or BENCH_TARGET, BENCH_CLIENT_ID, BENCH_TOKEN: a token in the
                         environment stays out of the process list)
`;

interface Profile {
  maxBigRequests: number;
  durationS: number;
  ceilingSeconds: number;
  microSeconds: number;
  /** Servers left out of a scenario, by scenario kind. */
  skip: Partial<Record<'single' | 'concurrent-high' | 'small' | 'gzip', ServerName[]>>;
}

const PROFILES: Record<'quick' | 'full', Profile> = {
  // stream-json parses 5-8 MB/s (a 32 MiB package takes 5 s, 8 of them 45 s) and the
  // conventional server stalls for seconds at 8 packages: in the quick profile a peer runs
  // only where a target compares against it (4 concurrent) or where it costs a few seconds.
  quick: {
    maxBigRequests: 1,
    durationS: 3,
    ceilingSeconds: 1,
    microSeconds: 0.5,
    skip: {
      single: ['stream-json'],
      'concurrent-high': ['stream-json', 'conventional'],
      small: ['stream-json'],
      gzip: ['stream-json'],
    },
  },
  full: { maxBigRequests: 3, durationS: 20, ceilingSeconds: 5, microSeconds: 2, skip: {} },
};

interface Scenario extends Omit<ScenarioInfo, 'skipped'> {
  body: 'big' | 'small';
  maxRequests: number;
  durationMs: number;
  servers: ServerName[];
}

interface Options {
  profileName: 'quick' | 'full';
  profile: Profile;
  sizeMiB: number;
  concurrency: number[];
  durationS: number;
  entity: EntitySpec;
  workers: number;
  out: string;
  only: string[];
  servers: ServerName[];
  target: string | null;
  credentials: Credentials[];
  repeat: number;
}

class UsageError extends Error {
  override readonly name = 'UsageError';
  readonly code = 'BENCH_USAGE';
}

function options(): Options | null {
  const { values } = parseArgs({
    options: {
      profile: { type: 'string', default: 'quick' },
      size: { type: 'string', default: '32' },
      concurrency: { type: 'string', default: '4,8' },
      duration: { type: 'string' },
      entity: { type: 'string', default: 'products' },
      workers: { type: 'string', default: '0' },
      out: { type: 'string' },
      scenario: { type: 'string', multiple: true },
      peers: { type: 'string', default: DEFAULT_SERVERS.join(',') },
      repeat: { type: 'string', default: '1' },
      target: { type: 'string' },
      'client-id': { type: 'string' },
      token: { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
  });
  if (values.help) {
    process.stdout.write(HELP);
    return null;
  }
  const bad = (flag: string, expected: string, got: unknown): never => {
    throw new UsageError(`--${flag}: expected ${expected}, got ${JSON.stringify(got)}`);
  };
  if (values.profile !== 'quick' && values.profile !== 'full') bad('profile', 'quick or full', values.profile);
  const profile = PROFILES[values.profile as 'quick' | 'full'];
  const sizeMiB = Number(values.size);
  if (!(sizeMiB > 0 && sizeMiB <= 1024)) bad('size', 'MiB in (0, 1024]', values.size);
  const concurrency = values.concurrency.split(',').map((s) => Number(s.trim()));
  if (!concurrency.every((n) => Number.isInteger(n) && n >= 1 && n <= 256)) bad('concurrency', 'integers in [1, 256]', values.concurrency);
  const durationS = values.duration === undefined ? profile.durationS : Number(values.duration);
  if (!(durationS >= 0 && durationS <= 3600)) bad('duration', 'seconds in [0, 3600]', values.duration);
  const entity = findEntity(values.entity);
  if (!entity) bad('entity', 'an entity of the catalog', values.entity);
  const workers = Number(values.workers);
  if (!Number.isInteger(workers) || workers < 0 || workers > 64) bad('workers', 'an integer in [0, 64]', values.workers);
  const servers = values.peers.split(',').map((s) => s.trim()) as ServerName[];
  if (!servers.every((s) => SERVERS.includes(s))) bad('peers', SERVERS.join(','), values.peers);
  const repeat = Number(values.repeat);
  if (!Number.isInteger(repeat) || repeat < 1 || repeat > 20) bad('repeat', 'an integer in [1, 20]', values.repeat);

  values.target ??= process.env.BENCH_TARGET || undefined;
  values['client-id'] ??= process.env.BENCH_CLIENT_ID || undefined;
  values.token ??= process.env.BENCH_TOKEN || undefined;
  let target: string | null = null;
  let credentials = DEMO;
  if (values.target !== undefined) {
    let url: URL;
    try {
      url = new URL(values.target);
    } catch {
      return bad('target', 'an http(s) URL', values.target);
    }
    if (url.protocol !== 'http:' && url.protocol !== 'https:') bad('target', 'an http(s) URL', values.target);
    if (!values['client-id'] || !values.token) throw new UsageError('--target needs --client-id and --token');
    target = url.origin;
    credentials = [{ id: values['client-id'], token: values.token }];
  } else if (values['client-id'] || values.token) {
    throw new UsageError('--client-id and --token go with --target (the local service uses the demo clients)');
  }
  return {
    profileName: values.profile as 'quick' | 'full',
    profile,
    sizeMiB,
    concurrency: [...new Set(concurrency)],
    durationS,
    entity: entity!,
    workers,
    out: values.out ? resolve(values.out) : join(ROOT, 'bench', 'results'),
    only: values.scenario ?? [],
    // A remote deployment has no peers next to it: only the service is driven.
    servers: target ? ['ingest'] : servers,
    target,
    credentials,
    repeat,
  };
}

function scenarios(o: Options): Scenario[] {
  const durationMs = o.durationS * 1000;
  const big = { body: 'big' as const, bodyMiB: o.sizeMiB, maxRequests: o.profile.maxBigRequests, durationMs };
  const keep = (servers: ServerName[], skip: ServerName[] = []) => servers.filter((s) => !skip.includes(s));
  const list: Scenario[] = [
    { id: 'single', title: `1 × ${o.sizeMiB} MiB`, concurrency: 1, gzip: false, ...big, servers: keep(o.servers, o.profile.skip.single) },
    ...o.concurrency.map((n) => ({
      id: `concurrent-${n}`,
      title: `${n} × ${o.sizeMiB} MiB concurrent`,
      concurrency: n,
      gzip: false,
      ...big,
      servers: keep(o.servers, n > 4 ? o.profile.skip['concurrent-high'] : []),
    })),
    {
      id: 'small',
      title: `${SMALL_MIB} MiB × 16 concurrent, ${o.durationS} s`,
      concurrency: 16,
      gzip: false,
      body: 'small',
      bodyMiB: SMALL_MIB,
      maxRequests: 10_000,
      durationMs,
      servers: keep(o.servers, o.profile.skip.small),
    },
    { id: 'gzip', title: `4 × ${o.sizeMiB} MiB gzip concurrent`, concurrency: 4, gzip: true, ...big, servers: keep(o.servers, o.profile.skip.gzip) },
  ];
  return list.filter((s) => o.only.length === 0 || o.only.includes(s.id));
}

interface BodyFile {
  name: string;
  path: string;
  bytes: number;
  wireBytes: number;
  rows: number;
}

async function writeBodies(dir: string, o: Options): Promise<Record<'big' | 'small' | 'bigGz' | 'smallGz', BodyFile>> {
  const out = {} as Record<'big' | 'small' | 'bigGz' | 'smallGz', BodyFile>;
  for (const [key, mib] of [['big', o.sizeMiB], ['small', SMALL_MIB]] as const) {
    const { json, rows } = generateBody(o.entity, Math.floor(mib * MIB), 1);
    const gz = gzipSync(json, { level: 6 });
    const path = join(dir, `${o.entity.name}-${key}.json`);
    await writeFile(path, json);
    await writeFile(`${path}.gz`, gz);
    out[key] = { name: key, path, bytes: json.byteLength, wireBytes: json.byteLength, rows };
    out[`${key}Gz`] = { name: `${key}Gz`, path: `${path}.gz`, bytes: json.byteLength, wireBytes: gz.byteLength, rows };
  }
  return out;
}

/** A server under test: the local service, an HTTP peer, or (null child) the `--target`. */
interface ServerHandle {
  origin: string;
  mailbox: Mailbox<ServerEvent> | null;
}

const SERVER_MODULES: Record<ServerName, URL> = {
  ingest: new URL('./server.js', import.meta.url),
  'ingest-reference': new URL('./server.js', import.meta.url),
  'stream-json': new URL('./peers/stream-json.js', import.meta.url),
  conventional: new URL('./peers/conventional.js', import.meta.url),
};

class Bench {
  readonly children = new ChildSet();
  readonly clients: Mailbox<ClientEvent>[] = [];
  poller!: Mailbox<ClientEvent>;
  readonly warnings: string[] = [];
  /** What the service process changed from its defaults (the same for every start). */
  serviceOverrides: Record<string, unknown> | null = null;
  runDir = '';
  #starts = 0;

  constructor(readonly o: Options) {}

  async startClients(bodies: BodyRef[]): Promise<void> {
    const module = new URL('./client.js', import.meta.url);
    for (let i = 0; i < CLIENT_PROCESSES; i++) this.clients.push(new Mailbox(this.children.fork(module), `client ${i}`));
    this.poller = new Mailbox(this.children.fork(module), 'status poller');
    for (const c of [...this.clients, this.poller]) c.send({ type: 'load', bodies } satisfies ClientCommand);
    await Promise.all([...this.clients, this.poller].map((c) => c.expect('loaded', 60_000)));
  }

  async startServer(server: ServerName): Promise<ServerHandle> {
    if (this.o.target) {
      await waitUntilServing(this.o.target, this.o.credentials[0]!, 'entities', READY_TIMEOUT_MS);
      return { origin: this.o.target, mailbox: null };
    }
    const service = server === 'ingest' || server === 'ingest-reference';
    const args = service
      ? [JSON.stringify({ workers: this.o.workers, dataDir: join(this.runDir, `data-${++this.#starts}`), ...(server === 'ingest-reference' ? { rowScanner: false } : {}) })]
      : [];
    const mailbox = new Mailbox<ServerEvent>(this.children.fork(SERVER_MODULES[server], args, SERVER_EXEC_ARGV), server);
    const { url, overrides } = await mailbox.expect('ready', READY_TIMEOUT_MS);
    if (server === 'ingest') this.serviceOverrides = overrides ?? {};
    await waitUntilServing(url, DEMO[0]!, service ? 'entities' : 'status', READY_TIMEOUT_MS);
    return { origin: url, mailbox };
  }

  async stopServer(handle: ServerHandle): Promise<void> {
    if (!handle.mailbox) return;
    const exited = new Promise<void>((resolve) => handle.mailbox!.child.once('exit', () => resolve()));
    try {
      handle.mailbox.send({ type: 'stop' });
    } catch {
      return; // already gone
    }
    const late = await Promise.race([exited.then(() => false), new Promise<boolean>((r) => setTimeout(r, 15_000, true).unref())]);
    if (late) {
      this.warnings.push('a server did not stop within 15 s and was killed');
      await this.children.end(handle.mailbox.child, 1_000);
    }
  }

  /**
   * Runs the ingest jobs on their clients at once, with the poller alongside; resolves with
   * every client's samples. The poller is stopped whatever happens to the ingest jobs.
   */
  async drive(clients: { mailbox: Mailbox<ClientEvent>; job: IngestJob }[], poll: PollJob | null, timeoutMs: number) {
    const all = [...clients, ...(poll ? [{ mailbox: this.poller, job: poll }] : [])];
    for (const c of all) c.mailbox.send({ type: 'arm', job: c.job } satisfies ClientCommand);
    await Promise.all(all.map((c) => c.mailbox.expect('armed', 10_000, (m) => m.id === c.job.id)));
    if (poll) this.poller.send({ type: 'go' } satisfies ClientCommand);
    let results: RequestSamples[];
    try {
      for (const c of clients) c.mailbox.send({ type: 'go' } satisfies ClientCommand);
      results = (await Promise.all(clients.map((c) => c.mailbox.expect('result', timeoutMs, (m) => m.id === c.job.id)))).map((r) => r.samples);
    } finally {
      if (poll) this.poller.send({ type: 'stop' } satisfies ClientCommand);
    }
    const polls = poll ? (await this.poller.expect('result', 30_000, (m) => m.id === poll.id)).samples : null;
    return { samples: results, polls };
  }

  async probe(handle: ServerHandle, what: 'probe-reset' | 'probe-read'): Promise<ProbeSample | null> {
    if (!handle.mailbox) return null;
    handle.mailbox.send({ type: what });
    if (what === 'probe-reset') return null;
    return (await handle.mailbox.expect('probe', 10_000)).sample;
  }

  async measure(s: Scenario, server: ServerName, files: Record<string, BodyFile>, round: number): Promise<Measurement> {
    const notes: string[] = [];
    const handle = await this.startServer(server);
    const sessions: BenchSession[] = [];
    try {
      const useSessions = server === 'ingest' || server === 'ingest-reference';
      if (useSessions) {
        for (const c of this.o.credentials) {
          const session = await initSession(handle.origin, c);
          if (!session.created) notes.push(`client ${c.id} already had session ${session.uuid}; the run reused it`);
          sessions.push(session);
        }
      }
      const target = (i: number) => ({
        credentials: this.o.credentials[i % this.o.credentials.length]!,
        uploadUuid: useSessions ? sessions[i % sessions.length]!.uuid : PEER_UPLOAD,
        entity: this.o.entity.name,
        gzip: s.gzip,
      });
      const body = files[`${s.body}${s.gzip ? 'Gz' : ''}`]!;
      const warmBody = files[`small${s.gzip ? 'Gz' : ''}`]!;

      // Warm-up: four 1 MiB packages, two at a time, so every worker thread has run the code.
      const warm = await this.drive(
        [{ mailbox: this.clients[0]!, job: ingestJob(handle.origin, target(0), warmBody.name, 2, 2, 60_000) }],
        null,
        120_000,
      );
      const warmFailures = warm.samples.flatMap((x) => x.failures);
      if (warmFailures.length) notes.push(`warm-up failed: ${warmFailures[0]}`);

      const procs = Math.min(s.concurrency, CLIENT_PROCESSES);
      const jobs = Array.from({ length: procs }, (_, i) => ({
        mailbox: this.clients[i]!,
        job: ingestJob(
          handle.origin,
          target(i),
          body.name,
          Math.floor(s.concurrency / procs) + (i < s.concurrency % procs ? 1 : 0),
          s.maxRequests,
          s.durationMs,
        ),
      }));
      const poll: PollJob = {
        kind: 'poll',
        origin: handle.origin,
        credentials: this.o.credentials[0]!,
        uploadUuid: useSessions ? sessions[0]!.uuid : PEER_UPLOAD,
        intervalMs: POLL_INTERVAL_MS,
        maxMs: jobBoundMs(s),
        id: nextJobId++,
      };
      await this.probe(handle, 'probe-reset');
      const run = await this.drive(jobs, poll, jobBoundMs(s) + 30_000);
      const probe = await this.probe(handle, 'probe-read');
      const load = summariseLoad(run.samples, body.bytes, body.wireBytes);
      const status = run.polls ? summarisePolls(run.polls, load.windowStart, load.windowEnd) : null;
      if (probe && probe.peakSource === 'sampled') notes.push('peak RSS sampled every 20 ms (no VmHWM reset here)');
      // A fast path that answers 200 with the wrong count is wrong, however fast.
      if (load.rows !== load.ok * body.rows) notes.push(`rows_processed summed to ${load.rows}, expected ${load.ok} × ${body.rows}`);
      if (status && status.failed > 0) notes.push(`${status.failed} of ${status.polls} status polls did not answer 200`);
      return { scenario: s.id, server, round, load, status, probe, loadAverage: loadavg()[0]!, notes };
    } finally {
      if (this.o.target) {
        for (const session of sessions) {
          const problem = await retireSession(handle.origin, session, 120_000).catch((err: Error) => err.message);
          if (problem) notes.push(problem);
        }
      }
      await this.stopServer(handle);
    }
  }

  async forkForResult<T>(module: URL, args: string[], name: string, timeoutMs: number, execArgv: string[] = []): Promise<T> {
    const mailbox = new Mailbox<{ type: 'result'; result: T }>(this.children.fork(module, args, execArgv), name);
    return (await mailbox.expect('result', timeoutMs)).result;
  }
}

/**
 * The longest a scenario's load can last: a client loop starts no request after the
 * scenario's duration, and every request ends within REQUEST_TIMEOUT_MS.
 */
function jobBoundMs(s: Scenario): number {
  return s.durationMs + REQUEST_TIMEOUT_MS;
}

let nextJobId = 1;

function ingestJob(
  origin: string,
  target: Pick<IngestJob, 'credentials' | 'uploadUuid' | 'entity' | 'gzip'>,
  body: string,
  slots: number,
  maxRequests: number,
  durationMs: number,
): IngestJob {
  return { kind: 'ingest', id: nextJobId++, origin, ...target, body, slots, maxRequests, durationMs, requestTimeoutMs: REQUEST_TIMEOUT_MS };
}

function gitInfo(): Meta['git'] {
  try {
    const git = (args: string[]) => execFileSync('git', args, { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
    const commit = git(['rev-parse', 'HEAD']).trim();
    const dirty = git(['status', '--porcelain']).split('\n').filter(Boolean).length;
    return { commit, dirtyFiles: dirty };
  } catch {
    return { commit: null, dirtyFiles: null };
  }
}

function line(m: Measurement): string {
  const l = m.load;
  const parts = [
    `${l.ok}/${l.requests} ok`,
    `${l.mbPerSec.toFixed(1)} MB/s`,
    `p99 ${l.latencyP99Ms.toFixed(0)} ms`,
    m.status ? `status p99 ${m.status.p99Ms.toFixed(1)} ms` : null,
    m.probe ? `ELD max ${m.probe.eldMaxMs.toFixed(0)} ms` : null,
    m.probe ? `peak RSS ${(m.probe.peakRssBytes / 1e6).toFixed(0)} MB` : null,
  ];
  return parts.filter(Boolean).join(' · ');
}

let interrupted = false;

async function main(): Promise<void> {
  const o = options();
  if (!o) return;
  const started = new Date();
  const bench = new Bench(o);
  // Everything on disk the run makes lives under one directory, removed at the end: the
  // bodies and every service start's DATA_DIR (a crashed server cannot clean its own).
  let runDir: string | null = null;
  const onSignal = () => {
    if (interrupted) return;
    interrupted = true;
    console.error('\nbench: interrupted; stopping every child process');
    void bench.children.endAll(2_000).finally(async () => {
      if (runDir) await rm(runDir, { recursive: true, force: true });
      process.exit(130);
    });
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  try {
    const list = scenarios(o);
    const roundsOf = (s: Scenario, server: ServerName) => (s.id === 'concurrent-4' && server === 'ingest' ? o.repeat : 1);
    const total = list.reduce((n, s) => n + s.servers.reduce((k, server) => k + roundsOf(s, server), 0), 0);
    const log = (msg: string) => process.stderr.write(`[${((Date.now() - started.getTime()) / 1000).toFixed(1).padStart(5)} s] ${msg}\n`);
    log(`bench: profile ${o.profileName}, ${list.length} scenarios, ${total} measurements${o.target ? `, target ${o.target}` : ''}`);

    runDir = await mkdtemp(join(tmpdir(), 'ingest-bench-'));
    bench.runDir = runDir;
    const files = await writeBodies(runDir, o);
    log(`bench: bodies ${Object.values(files).map((f) => `${f.name} ${(f.wireBytes / MIB).toFixed(1)} MiB`).join(', ')}; ${files.big.rows} rows per big body`);
    await bench.startClients(Object.values(files).map(({ name, path }) => ({ name, path })));

    const ceiling = {
      ...(await bench.forkForResult<CeilingResult>(
        new URL('./peers/ceiling.js', import.meta.url),
        [JSON.stringify({ bodyFile: files.big.path, seconds: o.profile.ceilingSeconds, maxRounds: 1_000 } satisfies CeilingArgs)],
        'ceiling',
        120_000,
        ['--expose-gc'],
      )),
      loadAverage: loadavg()[0]!,
    };
    log(`bench: ceiling ${ceiling.parse.mbPerSec.toFixed(1)} MB/s (JSON.parse of strings, ${ceiling.threads} threads); ${ceiling.decodeParse.mbPerSec.toFixed(1)} MB/s with UTF-8 decoding`);
    const micro = await bench.forkForResult<RowCheckResult>(
      new URL('./micro/row-check.js', import.meta.url),
      ['--entity', o.entity.name, '--seconds', String(o.profile.microSeconds)],
      'row-check micro-benchmark',
      120_000,
    );

    const scanMicro: RowScanResult[] = [];
    for (const order of ['catalog', 'reversed']) {
      scanMicro.push(
        await bench.forkForResult<RowScanResult>(
          new URL('./micro/row-scan.js', import.meta.url),
          ['--entity', o.entity.name, '--mib', String(Math.min(o.sizeMiB, 32)), '--rounds', o.profileName === 'full' ? '7' : '3', '--order', order],
          'row-scan micro-benchmark',
          300_000,
        ),
      );
    }
    for (const r of scanMicro) log(`bench: worker task, ${r.order} order: ${r.figures.map((f) => `${f.cpuMsPerMb.toFixed(2)} ms/MB`).join(' · ')} (parse · reference · scanner)`);

    const measurements: Measurement[] = [];
    let n = 0;
    for (const s of list) {
      for (const server of s.servers) {
        for (let round = 1; round <= roundsOf(s, server); round++) {
          n++;
          try {
            const m = await bench.measure(s, server, files, round);
            measurements.push(m);
            log(`bench: [${n}/${total}] ${s.title}${round > 1 ? ` (run ${round})` : ''} · ${server}: ${line(m)}`);
          } catch (err) {
            // One failed measurement (a crashed server, say) is reported; the run goes on.
            if (interrupted) throw err;
            const message = err instanceof Error ? err.message : String(err);
            bench.warnings.push(`${s.title} · ${server}: not measured: ${message}`);
            log(`bench: [${n}/${total}] ${s.title} · ${server}: FAILED: ${message}`);
          }
        }
      }
    }

    const ratios = list.filter((s) => s.servers.includes('ingest')).map((s) => ratiosFor(s.id, measurements, ceiling));
    const finished = new Date();
    const report: Report = {
      meta: {
        startedAt: started.toISOString(),
        finishedAt: finished.toISOString(),
        durationSeconds: (finished.getTime() - started.getTime()) / 1000,
        node: process.version,
        v8: process.versions.v8,
        platform: `${process.platform} ${process.arch}`,
        cpuModel: cpus()[0]?.model ?? 'unknown',
        cores: cpus().length,
        availableParallelism: availableParallelism(),
        totalMemoryBytes: totalmem(),
        loadAverageAtStart: loadavg(),
        git: gitInfo(),
        settings: {
          profile: o.profileName,
          sizeMiB: o.sizeMiB,
          concurrency: o.concurrency,
          durationS: o.durationS,
          entity: o.entity.name,
          workers: o.workers,
          target: o.target ?? 'local',
          servers: o.servers,
          skippedByProfile: o.profile.skip,
          serviceConfigOverrides: bench.serviceOverrides,
          clientProcesses: CLIENT_PROCESSES,
          pollIntervalMs: POLL_INTERVAL_MS,
          serverExecArgv: SERVER_EXEC_ARGV,
          repeat: o.repeat,
          mallocMmapThreshold: process.env.MALLOC_MMAP_THRESHOLD_ ?? null,
        },
        bodies: Object.values(files).map((f) => ({ name: f.name, bytes: f.bytes, rows: f.rows, wireBytes: f.wireBytes })),
      },
      scenarios: list.map(({ id, title, concurrency, bodyMiB, gzip, servers }) => ({
        id,
        title,
        concurrency,
        bodyMiB,
        gzip,
        skipped: o.servers.filter((x) => !servers.includes(x)),
      })),
      ceiling,
      micro,
      scanMicro,
      measurements,
      charts: [],
      ratios,
      targets: checkTargets(measurements, ratios, o.sizeMiB, ceiling),
      warnings: [
        ...bench.warnings,
        ...(o.target
          ? [
              '--target: the ceiling and micro-benchmark ran on this machine, not on the target; server-side ELD and RSS are not measured',
              `--target: the status poller sends ${1000 / POLL_INTERVAL_MS} requests/s from this machine; a per-client rate limit on the target answers some of them (and ingest requests) 503`,
            ]
          : []),
      ],
    };
    await mkdir(o.out, { recursive: true });
    const stamp = started.toISOString().replace(/[:.]/g, '-');
    try {
      for (const [name, text] of Object.entries(await renderCharts(report))) {
        await writeFile(join(o.out, `${stamp}-${name}`), text);
        report.charts.push(`${stamp}-${name}`);
      }
    } catch (err) {
      report.warnings.push(`charts not drawn: ${err instanceof Error ? err.message : String(err)}`);
    }
    const markdown = renderMarkdown(report);
    await writeFile(join(o.out, `${stamp}.md`), markdown);
    await writeFile(join(o.out, `${stamp}.json`), `${JSON.stringify(report, null, 2)}\n`);
    await writeFile(join(o.out, 'latest.md'), markdown);
    process.stdout.write(`${markdown}\n`);
    for (const t of report.targets) process.stdout.write(`${t.verdict.padEnd(4)}  ${t.target}: ${t.measured === null ? '—' : t.measured.toFixed(2)} (${t.bound})${t.why ? ` — ${t.why}` : ''}\n`);
    process.stdout.write(`\nbench: wrote ${join(o.out, `${stamp}.md`)}, ${stamp}.json and latest.md\n`);
  } finally {
    await bench.children.endAll(5_000);
    if (runDir) await rm(runDir, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  if (interrupted) return; // children ended on purpose; their exits are not the news
  if ((err as { code?: unknown }).code === 'BENCH_USAGE' || (err as { code?: unknown }).code === 'ERR_PARSE_ARGS_UNKNOWN_OPTION') {
    console.error(`bench: ${(err as Error).message}\n\n${HELP}`);
    process.exitCode = 2;
    return;
  }
  console.error(`bench: ${err instanceof Error ? err.stack ?? err.message : String(err)}`);
  process.exitCode = 1;
});
