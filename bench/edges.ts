/**
 * `npm run bench:edges`: the two HTTP edges side by side in one run (issue 14). Each figure
 * is taken for uWS and for node:http in turn, in alternating order, on the same bodies:
 *
 * - receive MB/s: the edge alone (`bench/edge-sink.ts`: one streaming route whose sink
 *   drops the bytes), `--concurrency` bodies of `--size` MiB at once, `--rounds` rounds;
 * - the service's own scenarios through the bench driver (`run.js --peers ingest`, with
 *   `BENCH_HTTP_ENGINE`): 4 × 32 MiB concurrent ingest (MB/s, p99, status p99 of the 10 ms
 *   poller, event-loop delay, peak RSS, CPU per MB) and 1 MiB packages × 16 concurrent.
 *
 * Flags: --size MiB (32), --concurrency N (4), --rounds N (3), --duration S (small packages,
 * 5), --out DIR (bench/results). Writes `<out>/edges-<timestamp>.md` and prints it.
 * Where uWS does not load (Node 22, 24), only the node edge is measured.
 */
import { fork, spawn } from 'node:child_process';
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Agent, request } from 'undici';
import { uwsLoads } from '../src/http/engine.js';
import type { EdgeName } from '../src/http/types.js';
import type { Report } from './report.js';

const { values } = parseArgs({
  options: {
    size: { type: 'string', default: '32' },
    concurrency: { type: 'string', default: '4' },
    rounds: { type: 'string', default: '3' },
    duration: { type: 'string', default: '5' },
    out: { type: 'string' },
  },
});
const SIZE = Number(values.size) * 1024 * 1024;
const CONCURRENCY = Number(values.concurrency);
const ROUNDS = Number(values.rounds);
const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const OUT = values.out ? resolve(values.out) : join(ROOT, 'bench', 'results');
const EDGES: EdgeName[] = uwsLoads() ? ['uws', 'node'] : ['node'];

interface Receive {
  mbPerSec: number[];
  cpuMsPerMb: number[];
}

/** One round: a fresh edge process, a warm-up body, then `CONCURRENCY` bodies at once. */
async function receiveRound(edge: EdgeName, body: Buffer): Promise<{ mbPerSec: number; cpuMsPerMb: number }> {
  const child = fork(new URL('./edge-sink.js', import.meta.url), [edge], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const next = <T>(type: string) =>
    new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`edge-sink ${edge}: no ${type} in 60 s`)), 60_000);
      const on = (m: { type: string } & T) => {
        if (m.type !== type) return;
        clearTimeout(timer);
        child.off('message', on);
        resolve(m);
      };
      child.on('message', on);
    });
  const agent = new Agent({ connections: CONCURRENCY });
  try {
    const { url } = await next<{ url: string }>('ready');
    const send = async () => {
      const res = await request(`${url}/sink`, { method: 'POST', body, dispatcher: agent, headersTimeout: 600_000, bodyTimeout: 600_000 });
      const answer = (await res.body.json()) as { bytes: number };
      if (res.statusCode !== 200 || answer.bytes !== body.byteLength) throw new Error(`edge-sink ${edge}: ${res.statusCode} ${JSON.stringify(answer)}`);
    };
    await send();
    child.send({ type: 'cpu' });
    const before = (await next<{ ms: number }>('cpu')).ms;
    const started = performance.now();
    await Promise.all(Array.from({ length: CONCURRENCY }, send));
    const seconds = (performance.now() - started) / 1000;
    child.send({ type: 'cpu' });
    const after = (await next<{ ms: number }>('cpu')).ms;
    const mb = (CONCURRENCY * body.byteLength) / 1e6;
    return { mbPerSec: mb / seconds, cpuMsPerMb: (after - before) / mb };
  } finally {
    await agent.close();
    child.send({ type: 'stop' });
    await new Promise((r) => child.once('exit', r));
  }
}

/** The bench driver on the service alone, on one edge; answers its report. */
async function serviceRun(edge: EdgeName, scenario: string, dir: string): Promise<Report> {
  const out = join(dir, `${edge}-${scenario}`);
  const args = ['--peers', 'ingest', '--scenario', scenario, '--size', String(values.size), '--duration', String(values.duration), '--out', out];
  const child = spawn(process.execPath, [fileURLToPath(new URL('./run.js', import.meta.url)), ...args], {
    env: { ...process.env, BENCH_HTTP_ENGINE: edge },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  const code = await new Promise<number | null>((r) => child.once('exit', r));
  if (code !== 0) throw new Error(`bench run.js on ${edge} (${scenario}) exited with ${code}`);
  const json = (await readdir(out)).find((f) => f.endsWith('.json'));
  if (!json) throw new Error(`bench run.js on ${edge} (${scenario}) wrote no report`);
  return JSON.parse(await readFile(join(out, json), 'utf8')) as Report;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;
const fmt = (v: number | null | undefined, digits = 1) => (v == null || !Number.isFinite(v) ? '—' : v.toFixed(digits));

const startedAt = new Date();
const load0 = loadavg();
const dir = await mkdtemp(join(tmpdir(), 'bench-edges-'));
try {
  const body = Buffer.alloc(SIZE, 0x20);
  const receive: Record<string, Receive> = Object.fromEntries(EDGES.map((e) => [e, { mbPerSec: [], cpuMsPerMb: [] }]));
  for (let round = 0; round < ROUNDS; round++) {
    for (const edge of round % 2 === 0 ? EDGES : [...EDGES].reverse()) {
      const r = await receiveRound(edge, body);
      receive[edge]!.mbPerSec.push(r.mbPerSec);
      receive[edge]!.cpuMsPerMb.push(r.cpuMsPerMb);
      process.stderr.write(`receive ${edge} round ${round + 1}: ${r.mbPerSec.toFixed(0)} MB/s\n`);
    }
  }
  const service: Record<string, Record<string, Report>> = Object.fromEntries(EDGES.map((e) => [e, {}]));
  const scenarios = [`concurrent-${CONCURRENCY}`, 'small'];
  for (const [i, scenario] of scenarios.entries()) {
    for (const edge of i % 2 === 0 ? EDGES : [...EDGES].reverse()) {
      process.stderr.write(`service ${edge}: ${scenario}\n`);
      service[edge]![scenario] = await serviceRun(edge, scenario, dir);
    }
  }

  const lines: string[] = [];
  lines.push(`# HTTP edges side by side · ${startedAt.toISOString()}`, '');
  lines.push(`Node ${process.versions.node} · ${cpus()[0]?.model ?? 'cpu'} · ${cpus().length} cores · load average at start ${load0.map((l) => l.toFixed(2)).join(' ')}, at end ${loadavg().map((l) => l.toFixed(2)).join(' ')}`);
  lines.push(`Edges: ${EDGES.join(', ')}${EDGES.length === 1 ? ' (uWS does not load on this Node)' : ''} · receive: ${CONCURRENCY} × ${values.size} MiB, ${ROUNDS} rounds, median`, '');
  lines.push('| figure | ' + EDGES.join(' | ') + (EDGES.length === 2 ? ' | node ÷ uws |' : ' |'));
  lines.push('|---|' + EDGES.map(() => '---:|').join('') + (EDGES.length === 2 ? '---:|' : ''));
  const row = (name: string, pick: (edge: EdgeName) => number | null | undefined, digits = 1) => {
    const v = EDGES.map((e) => pick(e));
    const ratio = EDGES.length === 2 && v[0] && v[1] != null ? fmt(v[1] / v[0], 2) : null;
    lines.push(`| ${name} | ${v.map((x) => fmt(x, digits)).join(' | ')} |${ratio === null ? '' : ` ${ratio} |`}`);
  };
  row(`receive MB/s (${CONCURRENCY} × ${values.size} MiB, edge only)`, (e) => median(receive[e]!.mbPerSec), 0);
  row('receive: server CPU ms per MB', (e) => median(receive[e]!.cpuMsPerMb), 2);
  const m = (e: EdgeName, scenario: string) => service[e]![scenario]!.measurements.find((x) => x.server === 'ingest');
  for (const scenario of scenarios) {
    const title = service[EDGES[0]!]![scenario]!.scenarios.find((s) => s.id === scenario)?.title ?? scenario;
    row(`${title}: ingest MB/s`, (e) => m(e, scenario)?.load.mbPerSec);
    row(`${title}: ok / requests`, (e) => { const l = m(e, scenario)?.load; return l ? l.ok / l.requests : null; }, 2);
    row(`${title}: p99 ms`, (e) => m(e, scenario)?.load.latencyP99Ms, 0);
    row(`${title}: status p99 ms`, (e) => m(e, scenario)?.status?.p99Ms);
    row(`${title}: event-loop delay max ms`, (e) => m(e, scenario)?.probe?.eldMaxMs, 0);
    row(`${title}: peak RSS MB`, (e) => { const p = m(e, scenario)?.probe?.peakRssBytes; return p == null ? null : p / 1e6; }, 0);
    row(`${title}: server CPU ms per MB`, (e) => { const x = m(e, scenario); return x?.probe && x.load.bytes ? x.probe.cpuMs / (x.load.bytes / 1e6) : null; }, 2);
    row(`${title}: load average at its end`, (e) => m(e, scenario)?.loadAverage, 2);
  }
  lines.push('', 'Each service figure is one run of `run.js --peers ingest` (its own fresh service, warmed); the JSON reports are in the temporary directory while the run lasts. Compare within this table only: the machine is shared.', '');
  const markdown = lines.join('\n');
  await mkdir(OUT, { recursive: true });
  const path = join(OUT, `edges-${startedAt.toISOString().replace(/[:.]/g, '-')}.md`);
  await writeFile(path, markdown);
  process.stdout.write(`${markdown}\nbench:edges: wrote ${path}\n`);
} finally {
  await rm(dir, { recursive: true, force: true });
}
