/**
 * `npm run bench:engines`: end-to-end throughput of the two back ends in one run — from the
 * first byte of the first package in to the last object stored (the session's
 * `upload_tasks_finished` turning true) — for the embedded default and for NATS JetStream +
 * S3 (a local nats-server and the s3rver test server). Each runs as a real gateway process
 * with its in-process uploader; the same packages, the same concurrency.
 *
 * Flags: --packages N (default 12), --size MiB (default 8), --concurrency C (default 4),
 * --out DIR (default bench/results).
 */
import { execFileSync } from 'node:child_process';
import { mkdir, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { request } from 'undici';
import { findEntity } from '../src/entities/catalog.js';
import { startNats } from '../testbed/nats.js';
import { AS_IN_PRODUCTION, distributed, spawnGateway, type GatewayProc } from '../testbed/processes.js';
import { startS3Process } from '../testbed/s3.js';
import { generateBody } from './bodies.js';

const { values } = parseArgs({
  options: {
    packages: { type: 'string', default: '12' },
    size: { type: 'string', default: '8' },
    concurrency: { type: 'string', default: '4' },
    out: { type: 'string', default: 'bench/results' },
  },
});
const PACKAGES = Number(values.packages);
const SIZE = Number(values.size) * 1024 * 1024;
const CONCURRENCY = Number(values.concurrency);
const API = '/api/v1/uploading';
const HEADERS = { authorization: 'demo-token', 'client-id': 'demo', 'content-type': 'application/json' };

const teardowns: (() => unknown)[] = [];
const t = { teardown: (fn: () => unknown) => void teardowns.push(fn) };
const cleanUp = async () => {
  for (const fn of teardowns.reverse()) await Promise.resolve(fn()).catch(() => undefined);
  teardowns.length = 0;
};
process.once('SIGINT', () => void cleanUp().then(() => process.exit(130)));

async function json(url: string, method: 'GET' | 'POST', body?: Buffer): Promise<{ status: number; body: any }> {
  const res = await request(url, { method, headers: HEADERS, body, headersTimeout: 600_000, bodyTimeout: 600_000 });
  return { status: res.statusCode, body: await res.body.json() };
}

/** Pushes every package, then waits until the last one is stored. Milliseconds from first byte to stored. */
async function run(gw: GatewayProc, body: Buffer): Promise<number> {
  const init = await json(`${gw.url}${API}/initialize-session`, 'POST');
  if (init.status !== 200) throw new Error(`initialize-session: ${init.status} ${JSON.stringify(init.body)}`);
  const uuid = init.body.upload_uuid as string;
  const started = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < PACKAGES) {
        next++;
        const res = await json(`${gw.url}${API}/${uuid}/products`, 'POST', body);
        if (res.status !== 200) throw new Error(`ingest: ${res.status} ${JSON.stringify(res.body)}`);
      }
    }),
  );
  for (const deadline = Date.now() + 600_000; ; ) {
    const st = await json(`${gw.url}${API}/${uuid}/status`, 'GET');
    if (st.body.upload_tasks_finished) break;
    if (Date.now() > deadline) throw new Error('packages were never all stored');
    await new Promise((r) => setTimeout(r, 20));
  }
  return performance.now() - started;
}

try {
  const body = generateBody(findEntity('products')!, SIZE).json;
  const relaxed = { limits: { requestsPerSecond: 0, concurrentPerClient: 0 } };
  const results: { engine: string; ms: number }[] = [];

  const embedded = await spawnGateway(t, { ...relaxed, clientsFile: null, connector: { webhookSecret: null } } as never, {}, [], [], AS_IN_PRODUCTION);
  results.push({ engine: 'embedded (files)', ms: await run(embedded, body) });
  await embedded.stop();

  const [nats, s3] = await Promise.all([startNats(t), startS3Process(t)]);
  const gw = await spawnGateway(t, { ...distributed(nats.url, s3), ...relaxed } as never, {}, [], [], AS_IN_PRODUCTION);
  results.push({ engine: 'NATS JetStream + S3 (s3rver)', ms: await run(gw, body) });

  const totalMiB = (PACKAGES * body.length) / 1024 / 1024;
  const rows = results.map(({ engine, ms }) => `| ${engine} | ${PACKAGES} × ${(body.length / 1024 / 1024).toFixed(1)} MiB | ${(ms / 1000).toFixed(2)} | ${(totalMiB / (ms / 1000)).toFixed(1)} |`);
  const ratio = results[0]!.ms / results[1]!.ms;
  let commit = 'unknown';
  try {
    commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
  } catch {
    // not a checkout
  }
  const report = [
    `# Back ends end to end (first byte in → last object stored)`,
    '',
    `Node ${process.version}, ${cpus()[0]?.model ?? 'unknown CPU'} × ${cpus().length}, commit ${commit}, concurrency ${CONCURRENCY}, ${new Date().toISOString()}`,
    '',
    '| engine | packages | seconds | MiB/s |',
    '|---|---|---:|---:|',
    ...rows,
    '',
    `NATS + S3 throughput ÷ embedded: ${ratio.toFixed(2)}`,
    '',
  ].join('\n');
  process.stdout.write(report);
  await mkdir(values.out!, { recursive: true });
  await writeFile(join(values.out!, `engines-${new Date().toISOString().replace(/[:.]/g, '-')}.md`), report);
} finally {
  await cleanUp();
}
