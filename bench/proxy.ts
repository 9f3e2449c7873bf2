/**
 * `npm run bench:proxy`: what the hop through the shipped proxy costs. One gateway process
 * (the embedded default, per-client limits off as in `bench/server.ts`), nginx on
 * config/nginx/ in front of it with its per-client limits dropped (every bench client comes
 * from 127.0.0.1: they would measure the limiter), and the bench's `--target` run twice in
 * one go, straight at the gateway and through nginx: by default the 4 × 32 MiB and the
 * small-package scenarios. Extra flags go to both runs (e.g. `--profile full`);
 * `BENCH_PROXY_ORDER=proxy-first` runs through nginx first.
 */
import { spawn } from 'node:child_process';
import { availableParallelism, cpus } from 'node:os';
import { fileURLToPath } from 'node:url';
import { startNginx } from '../src/proxy/nginx.js';
import { freePorts } from '../testbed/nats.js';
import { AS_IN_PRODUCTION, spawnGateway } from '../testbed/processes.js';

const RUN = fileURLToPath(new URL('./run.js', import.meta.url));
const cleanups: (() => unknown)[] = [];
const t = { teardown: (fn: () => unknown) => void cleanups.push(fn) };
const extra = process.argv.slice(2);
const scenarios = extra.includes('--scenario') ? [] : ['--scenario', 'concurrent-4', '--scenario', 'small'];

function run(label: string, target: string): Promise<string> {
  process.stdout.write(`\n== ${label}: ${target}\n`);
  const child = spawn(process.execPath, [RUN, '--target', target, '--client-id', 'demo', '--token', 'demo-token', ...scenarios, ...extra], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => {
    out += d.toString();
    process.stdout.write(d);
  });
  return new Promise((resolve, reject) => child.once('exit', (code) => (code === 0 ? resolve(out) : reject(new Error(`${label}: bench exited with ${code}`)))));
}

try {
  const gw = await spawnGateway(
    t,
    { limits: { requestsPerSecond: 0, concurrentPerClient: 0 }, log: { level: 'warn' }, ...(process.env.BENCH_HTTP_ENGINE ? { http: { engine: process.env.BENCH_HTTP_ENGINE as 'uws' | 'node' } } : {}) },
    {},
    [],
    [],
    AS_IN_PRODUCTION,
  );
  const [port] = await freePorts(1);
  const nginx = await startNginx({
    NGINX_LISTEN: `127.0.0.1:${port}`,
    GATEWAY_ADDRESS: new URL(gw.url).host,
    edit: (conf) => conf.replace(/^\s*limit_(req|conn) [^\n]*\n/gm, ''),
  });
  cleanups.push(() => nginx.stop());
  process.stdout.write(`bench:proxy on ${cpus()[0]?.model ?? 'unknown CPU'} × ${availableParallelism()}, Node ${process.version}; gateway ${gw.url}, nginx ${`http://127.0.0.1:${port}`} (per-client limits dropped)\n`);
  // BENCH_PROXY_ORDER=proxy-first measures through nginx first (the order's own effect on a busy machine).
  const runs: [string, string][] = [
    ['direct', gw.url],
    ['through nginx', `http://127.0.0.1:${port}`],
  ];
  if (process.env.BENCH_PROXY_ORDER === 'proxy-first') runs.reverse();
  for (const [label, target] of runs) await run(label, target);
  const buffered = /buffered to a temporary file/.test(nginx.output());
  process.stdout.write(`\nnginx buffered a request body to a file: ${buffered ? 'yes' : 'no'}\n`);
} finally {
  for (const fn of cleanups.reverse()) await fn();
}
