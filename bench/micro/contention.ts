/**
 * Two gateways writing one session: how fairly the session's compare-and-set writes are
 * shared. Two `Summaries` (session/summaries.ts), each on its own connection to a 3-node
 * cluster of the test bed (an R3 session bucket), `--writers` decisions in flight each, all
 * changing one session for `--seconds`; then the writes each instance landed, its p99 and
 * slowest write, and its 503s. A fair share is near 1:1; the loser of a share far from it
 * waits seconds and may be told 503 `Storage temporarily unavailable`.
 *
 *   node dist/bench/micro/contention.js [--seconds 15] [--writers 8] [--runs 3]
 */
import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';
import { isServiceError } from '../../src/errors.js';
import { newSession } from '../../src/session/state.js';
import { Summaries } from '../../src/session/summaries.js';
import { sessionKey } from '../../src/store/keys.js';
import { connectNats } from '../../src/store/nats/connection.js';
import { NatsSessionStore } from '../../src/store/nats/session-store.js';
import { startNatsCluster } from '../../testbed/nats.js';

const { values } = parseArgs({
  options: {
    seconds: { type: 'string', default: '15' },
    writers: { type: 'string', default: '8' },
    runs: { type: 'string', default: '3' },
  },
});
const seconds = Number(values.seconds);
const writers = Number(values.writers);
const runs = Number(values.runs);

const teardowns: (() => unknown)[] = [];
const t = { teardown: (fn: () => unknown) => void teardowns.push(fn) };

interface Share {
  writes: number;
  unavailable: number;
  p99: number;
  slowest: number;
}

async function instance(urls: string, bucket: string, uploadUuid: string, until: number): Promise<Share> {
  const nats = await connectNats({ servers: urls, name: 'contention', requestTimeoutMs: 5000 });
  const sessions = await NatsSessionStore.open(nats, { bucket, replicas: 3 });
  const summaries = new Summaries({ sessions });
  const latencies: number[] = [];
  let unavailable = 0;
  await Promise.all(
    Array.from({ length: writers }, async () => {
      while (performance.now() < until) {
        const at = performance.now();
        try {
          await summaries.mutate(null, uploadUuid, 'system', (r) => ({ ok: true, next: { ...r, updated_at: new Date().toISOString() } }));
          latencies.push(performance.now() - at);
        } catch (err) {
          if (!isServiceError(err) || err.statusCode !== 503) throw err;
          unavailable++;
        }
      }
    }),
  );
  await nats.close();
  latencies.sort((a, b) => a - b);
  return { writes: latencies.length, unavailable, p99: latencies[Math.floor(latencies.length * 0.99)] ?? 0, slowest: latencies.at(-1) ?? 0 };
}

try {
  const cluster = await startNatsCluster(t);
  console.log(`| run | writes A | writes B | smaller ÷ larger | p99 ms A / B | slowest ms A / B | 503 A / B |`);
  console.log(`|---|---:|---:|---:|---|---|---|`);
  for (let run = 1; run <= runs; run++) {
    const bucket = `contention${run}`;
    const uploadUuid = randomUUID();
    const setup = await connectNats({ servers: cluster.urls, name: 'contention-setup', requestTimeoutMs: 5000 });
    const store = await NatsSessionStore.open(setup, { bucket, replicas: 3 });
    await store.create(sessionKey(uploadUuid), newSession(uploadUuid, 'bench', Date.now()));
    const until = performance.now() + seconds * 1000;
    const [a, b] = await Promise.all([instance(cluster.urls, bucket, uploadUuid, until), instance(cluster.urls, bucket, uploadUuid, until)]);
    await setup.jsm.streams.delete(`KV_${bucket}`);
    await setup.close();
    const share = Math.min(a!.writes, b!.writes) / Math.max(a!.writes, b!.writes, 1);
    const ms = (v: number) => v.toFixed(0);
    console.log(
      `| ${run} | ${a!.writes} | ${b!.writes} | ${share.toFixed(2)} | ${ms(a!.p99)} / ${ms(b!.p99)} | ${ms(a!.slowest)} / ${ms(b!.slowest)} | ${a!.unavailable} / ${b!.unavailable} |`,
    );
  }
} finally {
  for (const fn of teardowns.reverse()) await fn();
}
