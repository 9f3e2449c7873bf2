/**
 * Failure drill 5: clients that abort mid-request, at every stage.
 *
 * Raw TCP clients send an ingest request and go away (FIN or RST) at a random point:
 * inside the headers, right after them (while the service authenticates and checks the
 * session), at any offset of a one-piece or a many-piece body (plain and gzip), one byte
 * before the end, while a piece of theirs is in a worker, and while a piece waits for a
 * worker slot. Afterwards: nothing stored (no object, no committed or half-written queue
 * package, no entity), the session's in-flight leases back to zero
 * (`upload_tasks_finished`), the pool idle (no sink open, no task running, waiting or
 * queued, every worker thread alive), memory back within a bound after a full GC, and the
 * service still answers a real package.
 *
 * CI runs 1,000 aborts; `DRILL_LONG=1` runs 5,000 (the issue asks for 1,000; CI may lower
 * it with DRILL_ABORTS, at least 200).
 */
import { once } from 'node:events';
import { connect, type Socket } from 'node:net';
import { gzipSync } from 'node:zlib';
import t, { type Test } from 'tap';
import { API, clientOf, DEMO, products, waitForStatus, whenChanged } from '../support/harness.js';
import { FAULTY_WORKER, HOLD_MARKER, holdChannel } from '../support/faulty-worker.js';
import { capturingLogger, eventually, MiB, settledMemory, startInProcess, type InProcess } from '../support/in-process.js';
import { mulberry32 } from '../../testbed/random.js';

const LONG = process.env.DRILL_LONG === '1';
const TOTAL = Math.max(200, Number(process.env.DRILL_ABORTS ?? (LONG ? 5_000 : 1_000)));
const CONCURRENCY = 8;
const PIECE = 16 * 1024;
/** Of TOTAL, aborts made at a latch (a piece held in a worker; a piece waiting for a slot): each takes a few ms of setup. */
const LATCHED = 4 * Math.min(10, Math.floor(TOTAL / 40));

// A fixed seed: a failure names the abort that caused it, and the run can be repeated.
const random = mulberry32(0x5eed_ab07);
const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)]!;
const between = (lo: number, hi: number) => lo + Math.floor(random() * (hi - lo));

function json(body: unknown): Buffer {
  return Buffer.from(JSON.stringify(body));
}

/** A raw client: connects, writes exactly `bytes`, then goes away the way it is told. */
async function sendAndVanish(svc: InProcess, bytes: Buffer, how: 'fin' | 'rst', lingerMs = 0): Promise<void> {
  const { hostname, port } = new URL(svc.url);
  const sock: Socket = connect(Number(port), hostname);
  sock.on('error', () => {});
  await once(sock, 'connect');
  sock.setNoDelay(true);
  if (bytes.length) await new Promise<void>((resolve) => sock.write(bytes, () => resolve()));
  if (lingerMs) await new Promise((r) => setTimeout(r, lingerMs));
  if (how === 'rst') sock.resetAndDestroy();
  else sock.destroy();
}

function head(uuid: string, length: number, extra = ''): string {
  return (
    `POST ${API}/${uuid}/products HTTP/1.1\r\nHost: drill\r\nAuthorization: ${DEMO.token}\r\nClient-Id: ${DEMO.id}\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${length}\r\n${extra}\r\n`
  );
}

t.setTimeout((LONG ? 1_200 : 300) * 1000);

t.test('drill 5: aborted requests leave nothing behind', async (t) => {
  const logger = capturingLogger();
  const svc = await startInProcess(
    t,
    {
      limits: { requestsPerSecond: 0, concurrentPerClient: 0 },
      // Small pieces: a body of a few hundred KiB has several pieces in workers at once.
      // One task per worker: a held piece fills a worker and the next one waits for a slot.
      ingest: { workers: 2, pieceBytes: PIECE, piecesPerRequest: 2, poolPieces: 2 },
    },
    { validationWorker: FAULTY_WORKER, logger },
  );
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid as string;

  const small = json(products(40));
  const large = json(products(8_000));
  const gzipped = gzipSync(large);
  t.ok(large.length > 10 * PIECE, `the large body is ${(large.length / PIECE).toFixed(1)} pieces`);
  const held = json({ ...products(2_000), data: [['p-held', HOLD_MARKER, 1], ...products(2_000, 1).data] });
  const fin = () => pick(['fin', 'rst'] as const);
  const request = (body: Buffer, cut: number, extra = '') => Buffer.concat([Buffer.from(head(uuid, body.length, extra)), body.subarray(0, cut)]);

  const stages: Record<string, () => Promise<void>> = {
    'inside the headers': () => {
      const h = Buffer.from(head(uuid, small.length));
      return sendAndVanish(svc, h.subarray(0, between(1, h.length - 2)), fin());
    },
    'right after the headers': () => sendAndVanish(svc, request(large, 0), fin(), pick([0, 0, 1, 3])),
    'mid-body, one piece': () => sendAndVanish(svc, request(small, between(1, small.length)), fin()),
    'mid-body, many pieces': () => sendAndVanish(svc, request(large, between(1, large.length)), fin(), pick([0, 2])),
    'mid-body, gzip': () => sendAndVanish(svc, request(gzipped, between(1, gzipped.length), 'Content-Encoding: gzip\r\n'), fin()),
    'one byte before the end': () => {
      const body = pick([small, large]);
      return sendAndVanish(svc, request(body, body.length - 1), 'fin', pick([0, 5]));
    },
  };
  const names = Object.keys(stages);
  const counts: Record<string, number> = {};

  const idle = () => {
    const load = svc.app.ingestLoad();
    return load.open === 0 && load.running === 0 && load.waiting === 0 && load.queued === 0 && load.threads === 2 && load;
  };
  /** Nothing open, running or waiting; every lease released; nothing stored. */
  const leftNothing = async (t: Test, what: string) => {
    await eventually(idle, `the pool to be idle with both threads (${what})`, 60_000);
    const st = await waitForStatus(svc, uuid, (b) => b.upload_tasks_finished, DEMO, 60_000);
    t.same(st.entities, [], `${what}: no entity counted`);
    t.same(await svc.queueFiles(uuid), { incoming: [], ready: [] }, `${what}: no package in the queue, committed or half-written`);
    t.same(await svc.objects(), [], `${what}: no object stored`);
  };
  const memory = async (what: string) => {
    const m = await settledMemory();
    t.comment(`${what}: heap ${(m.heapUsed / MiB).toFixed(1)} MiB, rss ${(m.rss / MiB).toFixed(1)} MiB, worker threads ${svc.app.ingestLoad().threadIds.join(',')}`);
    return m;
  };

  // Warm-up (the pool's buffers, every code path of server and client), then the baseline.
  for (let i = 0; i < 60; i++) await stages[names[i % names.length]!]!();
  await leftNothing(t, 'warm-up');
  const before = await memory('baseline');
  // piscina lists its threads in no fixed order: compared as a set.
  const workerThreads = () => svc.app.ingestLoad().threadIds.toSorted((a, b) => a - b);
  const threadIds = workerThreads();
  const started = Date.now();

  const free = TOTAL - 2 * LATCHED;
  await t.test(`${free} aborts at random stages and offsets, ${CONCURRENCY} clients at a time`, async (t) => {
    let next = 0;
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (next < free) {
          next++;
          const name = pick(names);
          counts[name] = (counts[name] ?? 0) + 1;
          await stages[name]!();
        }
      }),
    );
    t.comment(`sent in ${Date.now() - started} ms`);
    await leftNothing(t, 'after them');
    t.comment(`settled ${Date.now() - started} ms after the first`);
  });
  await memory('after the unlatched aborts');

  // Latches: the faulty worker announces a held piece on a BroadcastChannel and runs it on `release`.
  const channel = new BroadcastChannel(holdChannel());
  t.teardown(() => channel.close());
  let running = 0;
  let wake: () => void = () => {};
  channel.onmessage = (e) => {
    if ((e as MessageEvent).data === 'running') {
      running++;
      wake();
    }
  };
  const runningAtLeast = (n: number) =>
    new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${running} of ${n} held pieces running after 20 s`)), 20_000);
      wake = () => {
        if (running < n) return;
        clearTimeout(timer);
        resolve();
      };
      wake();
    });
  const release = () => channel.postMessage('release');
  const connectAndWrite = async (bytes: Buffer): Promise<Socket> => {
    const { hostname, port } = new URL(svc.url);
    const sock = connect(Number(port), hostname);
    sock.on('error', () => {});
    await once(sock, 'connect');
    sock.setNoDelay(true);
    sock.write(bytes);
    return sock;
  };
  const vanish = (sock: Socket, i: number) => (i % 2 ? sock.resetAndDestroy() : sock.destroy());

  await t.test(`${LATCHED} aborts while a piece of the request is in a worker`, async (t) => {
    let letGo = 0;
    for (let i = 0; i < LATCHED; i++) {
      running = 0;
      // Even rounds: a bit more than one piece, so the socket is still read (not paused) and the
      // service sees the close while the piece is in the worker. Odd rounds: the whole body but
      // one byte, so back-pressure has paused the socket and the close is seen once it drains.
      const reading = i % 4 < 2;
      const sock = await connectAndWrite(request(held, reading ? between(PIECE + 64, PIECE + 4096) : held.length - 1));
      await runningAtLeast(1);
      vanish(sock, i);
      if (reading) {
        // The sink lets go at once (lease released, admission returned); the piece runs on.
        await eventually(() => svc.app.ingestLoad().open === 0, 'the sink to let go while its piece runs', 5_000);
        t.equal(svc.app.ingestLoad().running, 1, 'the held piece is still in its worker');
        letGo++;
      }
      release();
      await eventually(idle, 'the pool to settle after a held abort');
    }
    counts['in a worker'] = LATCHED;
    t.equal(letGo, LATCHED / 2, 'half of them gave up their sink while the piece was still in the worker');
    await leftNothing(t, 'after them');
  });

  await t.test(`${LATCHED} aborts while a piece of the request waits for a worker slot`, async (t) => {
    const holder = request(held, held.length);
    for (let i = 0; i < LATCHED; i++) {
      running = 0;
      // Two requests fill both workers with held pieces and stay connected.
      const holders = await Promise.all([connectAndWrite(holder), connectAndWrite(holder)]);
      await runningAtLeast(2);
      const sock = await connectAndWrite(request(large, between(2 * PIECE + 10, large.length)));
      await eventually(() => svc.app.ingestLoad().waiting > 0, 'a piece waiting for a slot', 5_000);
      vanish(sock, i);
      release();
      for (const h of holders) h.destroy();
      await eventually(idle, 'the pool to settle after a slot abort');
    }
    counts['waiting for a slot'] = LATCHED;
    await leftNothing(t, 'after them');
  });

  const elapsed = Date.now() - started;
  const after = await memory('after the drill');
  t.comment(`aborts by stage: ${JSON.stringify(counts)}: ${TOTAL} in ${elapsed} ms`);
  t.equal(Object.values(counts).reduce((a, b) => a + b, 0), TOTAL, `${TOTAL} aborts made`);
  t.match(svc.app.ingestLoad(), { open: 0, running: 0, waiting: 0, queued: 0, threads: 2 }, 'the pool is idle');
  t.same(workerThreads(), threadIds, 'no worker was lost or replaced: the same two threads as before the drill');
  t.same(logger.lines.filter((l) => l.includes('"level":"error"')), [], 'no internal error logged (no store contention, no failed release)');

  const heapGrowth = after.heapUsed - before.heapUsed;
  const rssGrowth = after.rss - before.rss;
  // A leak of what one abort holds (its sink and chunks, an Exchange, a writer) would be a few
  // KiB at least: over 1,000 aborts, megabytes. The bound leaves room for JIT code and caches.
  t.ok(heapGrowth < 8 * MiB, `heap growth after GC: ${(heapGrowth / MiB).toFixed(2)} MiB < 8 MiB`);
  // RSS also holds the worker threads' heaps, which this process cannot collect on demand.
  t.ok(rssGrowth < 256 * MiB, `RSS growth: ${(rssGrowth / MiB).toFixed(1)} MiB < 256 MiB`);

  await t.test('the service still answers a real package, stored once', async (t) => {
    const res = await c.ingest(uuid, 'products', products(100));
    t.same([res.status, res.body?.rows_processed], [200, 100]);
    const done = await waitForStatus(svc, uuid, (b) => b.can_start_upload);
    t.same(done.entities, ['products']);
    t.equal((await whenChanged(svc, async () => (await svc.objects()).length === 1 && svc.objects(), () => 'the object was never stored')).length, 1);
  });
});
