/**
 * Micro-benchmark of nats-server alone: what `sync_interval: always` costs JetStream's
 * publishes, with nothing of the gateway in the way. Two servers of the test bed (the shipped
 * config/nats/jetstream.conf, `always`; the same with nats-server's default sync), each sent
 * `--messages` publishes of 7 KB (the `many` scenario's package) from one connection, a fixed
 * number in flight, spread round-robin over a number of file streams; every pair of settings
 * runs back to back, `always` first, and the table gives each one's rate, its latency and the
 * ratio. It is the ceiling of the gateway's JetStream writes per second on this machine:
 * `bench:packages` prints the writes a package makes ("JetStream messages + acks per package").
 *
 *   node dist/bench/micro/nats-streams.js [--messages 20000] [--streams 1,4,16] [--in-flight 16,64]
 */
import { parseArgs } from 'node:util';
import { connect, type NatsConnection } from 'nats';
import { startNats } from '../../testbed/nats.js';

const { values } = parseArgs({
  options: {
    messages: { type: 'string', default: '20000' },
    streams: { type: 'string', default: '1,4,16' },
    'in-flight': { type: 'string', default: '16,64' },
  },
});
const messages = Number(values.messages);
const streamCounts = values.streams.split(',').map(Number);
const inFlights = values['in-flight'].split(',').map(Number);
const MESSAGE_BYTES = 7 * 1024;

const teardowns: (() => unknown)[] = [];
const t = { teardown: (fn: () => unknown) => void teardowns.push(fn) };

interface Run {
  rate: number;
  p50: number;
  p99: number;
}

/** `messages` publishes, `inFlight` at a time, round-robin over `streams` fresh streams. */
async function run(nc: NatsConnection, streams: number, inFlight: number): Promise<Run> {
  const jsm = await nc.jetstreamManager();
  const js = nc.jetstream();
  const names = Array.from({ length: streams }, (_, i) => `BENCH${i}`);
  for (const [i, name] of names.entries()) await jsm.streams.add({ name, subjects: [`bench${i}.>`] });
  const data = new Uint8Array(MESSAGE_BYTES);
  const latencies: number[] = [];
  let next = 0;
  const start = performance.now();
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      while (next < messages) {
        const n = next++;
        const at = performance.now();
        await js.publish(`bench${n % streams}.m.${n % 1000}`, data);
        latencies.push(performance.now() - at);
      }
    }),
  );
  const seconds = (performance.now() - start) / 1000;
  for (const name of names) await jsm.streams.delete(name);
  latencies.sort((a, b) => a - b);
  const at = (q: number) => latencies[Math.min(latencies.length - 1, Math.floor(latencies.length * q))]!;
  return { rate: messages / seconds, p50: at(0.5), p99: at(0.99) };
}

try {
  const always = await startNats(t);
  const byDefault = await startNats(t, { syncInterval: '2m' });
  const [ncAlways, ncDefault] = await Promise.all([connect({ servers: always.url }), connect({ servers: byDefault.url })]);
  teardowns.push(() => ncAlways.close(), () => ncDefault.close());
  const fmt = (r: Run) => `${r.rate.toFixed(0)} | ${r.p50.toFixed(1)} | ${r.p99.toFixed(1)}`;
  const rows: string[] = [];
  for (const inFlight of inFlights) {
    for (const streams of streamCounts) {
      const a = await run(ncAlways, streams, inFlight);
      const d = await run(ncDefault, streams, inFlight);
      rows.push(`| ${streams} | ${inFlight} | ${fmt(a)} | ${fmt(d)} | ${(a.rate / d.rate).toFixed(2)} |`);
    }
  }
  console.log(`# nats-server alone: ${messages} publishes of ${MESSAGE_BYTES} bytes per cell\n`);
  console.log('| streams | in flight | `always` msgs/s | p50 ms | p99 ms | default sync msgs/s | p50 ms | p99 ms | ratio |');
  console.log('|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const row of rows) console.log(row);
} finally {
  for (const fn of teardowns.reverse()) await fn();
}
