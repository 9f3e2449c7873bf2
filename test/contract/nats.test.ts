import { crc32 } from 'node:zlib';
import t, { type Test } from 'tap';
import { DiscardPolicy, nanos, RetentionPolicy, StorageType, type KvEntry, type RequestOptions, type StreamConfig } from 'nats';
import { connectNats, damagedReads, enableStreamFeatures, isWrongLastSequence, publishOnce, supportedServer, type NatsHandle } from '../../src/store/nats/connection.js';
import { NatsBatchQueue, type NatsBatchQueueOptions } from '../../src/store/nats/batch-queue/index.js';
import { BATCH_MIN, GroupPublisher, MAX_ROUNDS } from '../../src/store/nats/group-publisher.js';
import { encodeCommit, inlineCommitHeaders } from '../../src/store/nats/batch-queue/record.js';
import { packageTail, QueueSubjects } from '../../src/store/nats/batch-queue/subjects.js';
import { ENTRY_ROUNDS, NatsLedger } from '../../src/store/nats/ledger.js';
import { NatsSessionStore } from '../../src/store/nats/session-store.js';
import { LostKeysGuard } from '../../src/store/nats/lost-keys.js';
import { countsKey } from '../../src/store/nats/stored-counts.js';
import { asServiceError } from '../../src/errors.js';
import { isStoreConflict, type BatchQueue, type CommittedPackage, type PackageMeta } from '../../src/store/ports.js';
import { startNats, startNatsCluster } from '../../testbed/nats.js';
import { until } from '../support/drills.js';
import { batchQueueContract } from './batch-queue.contract.js';
import { entry, ledgerContract } from './ledger.contract.js';
import { freezingProxy } from '../support/freezing-proxy.js';
import { sessionStoreContract } from './session-store.contract.js';

const server = await startNats(t);

interface Teardown {
  teardown(fn: () => unknown): void;
}

async function connection(t: Teardown, servers = server.url): Promise<NatsHandle> {
  const h = await connectNats({ servers, name: 'contract-test', requestTimeoutMs: 5000 });
  t.teardown(() => h.close());
  return h;
}

let seq = 0;
const unique = (prefix: string): string => `${prefix}${++seq}_${process.pid}`;

/** Fresh names per call; `reopen` opens a new connection, as a restarted process would. */
sessionStoreContract(t, 'NatsSessionStore', async () => {
  const bucket = unique('sessions');
  const handles: NatsHandle[] = [];
  const open = async () => {
    const h = await connectNats({ servers: server.url, name: 'contract-test', requestTimeoutMs: 5000 });
    handles.push(h);
    return NatsSessionStore.open(h, { bucket, replicas: 1 });
  };
  return {
    store: await open(),
    reopen: open,
    cleanup: async () => {
      await handles[0]?.jsm.streams.delete(`KV_${bucket}`).catch(() => {});
      for (const h of handles) await h.close();
    },
  };
});

ledgerContract(t, 'NatsLedger', async () => {
  const bucket = unique('ledger');
  const handles: NatsHandle[] = [];
  const open = async () => {
    const h = await connectNats({ servers: server.url, name: 'contract-test', requestTimeoutMs: 5000 });
    handles.push(h);
    return NatsLedger.open(h, { bucket, replicas: 1 });
  };
  return {
    ledger: await open(),
    reopen: open,
    cleanup: async () => {
      await handles[0]?.jsm.streams.delete(`KV_${bucket}`).catch(() => {});
      for (const h of handles) await h.close();
    },
  };
});

const queueOpts = (stream: string): NatsBatchQueueOptions => ({
  stream,
  durable: 'uploader',
  replicas: 1,
  redeliveryDelayMs: 5,
  // Long: a redelivery in these tests comes from a nak or a closed consumer, never from the clock.
  ackWaitMs: 300_000,
  sweepIntervalMs: 0,
});

/** The queue stream as versions before the bulk removal made it: a work queue, which removes each message on its ack. */
async function addWorkQueueStream(h: NatsHandle, stream: string): Promise<void> {
  await h.jsm.streams.add({
    name: stream,
    subjects: [`${stream}.b.>`, `${stream}.c.>`],
    retention: RetentionPolicy.Workqueue,
    storage: StorageType.File,
    discard: DiscardPolicy.New,
    duplicate_window: nanos(120_000),
  });
}

for (const kind of ['limits', 'workqueue'] as const) {
  batchQueueContract(t, kind === 'limits' ? 'NatsBatchQueue' : 'NatsBatchQueue on a work-queue stream', async () => {
    const stream = unique('QUEUE');
    const handles: NatsHandle[] = [];
    const open = async () => {
      const h = await connectNats({ servers: server.url, name: 'contract-test', requestTimeoutMs: 5000 });
      handles.push(h);
      if (kind === 'workqueue' && handles.length === 1) await addWorkQueueStream(h, stream);
      return NatsBatchQueue.open(h, queueOpts(stream));
    };
    return {
      store: await open(),
      reopen: open,
      cleanup: async () => {
        await handles[0]?.jsm.streams.delete(stream).catch(() => {});
        for (const h of handles) await h.close();
      },
    };
  });
}

function meta(upload_uuid: string, package_id: string, client_id = 'client-1'): PackageMeta {
  return { package_id, upload_uuid, client_id, entity: 'stores', columns: ['store_id', 'name'] };
}

async function commit(q: BatchQueue, m: PackageMeta, batches: Uint8Array[]): Promise<void> {
  const w = await q.open(m);
  for (const b of batches) await w.append(b);
  await w.commit({ rows: batches.length, bytes: batches.reduce((n, b) => n + b.byteLength, 0) });
}

async function openQueue(t: Test, h: NatsHandle, opts: NatsBatchQueueOptions): Promise<NatsBatchQueue> {
  const q = await NatsBatchQueue.open(h, opts);
  t.teardown(() => q.close());
  return q;
}

/** Moves the `uploader` consumer's ack floor to `seq - 1` (CONSUMER.RESET, nats-server 2.14+): acknowledged up to there, nothing removed. */
async function resetConsumer(t: Test, h: NatsHandle, stream: string, seq: number): Promise<void> {
  const reply = await h.nc.request(`$JS.API.CONSUMER.RESET.${stream}.uploader`, Buffer.from(JSON.stringify({ seq })), { timeout: 5000 });
  t.notOk(reply.json<{ error?: unknown }>().error, 'consumer reset');
}

/** Takes `n` packages off the queue (bounded), reading their batches; acks each. */
async function drain(t: Test, q: BatchQueue, n: number, timeoutMs = 20_000): Promise<{ meta: PackageMeta; attempt: number; data: Buffer }[]> {
  const got: { meta: PackageMeta; attempt: number; data: Buffer }[] = [];
  let done!: () => void;
  const all = new Promise<void>((resolve) => (done = resolve));
  const consumer = q.consume(async (pkg: CommittedPackage) => {
    const chunks: Buffer[] = [];
    for await (const b of pkg.batches()) chunks.push(Buffer.from(b));
    got.push({ meta: pkg.meta, attempt: pkg.attempt, data: Buffer.concat(chunks) });
    if (got.length === n) done();
  });
  t.teardown(() => consumer.stop());
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([all, new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(`only ${got.length} of ${n} packages in ${timeoutMs} ms`)), timeoutMs)))]);
  clearTimeout(timer);
  await consumer.stop();
  return got;
}

/**
 * Read-modify-write increments of one key from `stores`, each retried on conflict until it
 * lands: with a serialised compare-and-set every landed write counts, so the value ends at
 * exactly `n`.
 */
async function increments(stores: NatsSessionStore[], key: string, n: number): Promise<number> {
  await stores[0]!.create(key, { n: 0 }).catch(() => undefined);
  await Promise.all(
    Array.from({ length: n }, async (_, i) => {
      const store = stores[i % stores.length]!;
      for (;;) {
        const cur = (await store.get<{ n: number }>(key))!;
        try {
          await store.update(key, { n: cur.value.n + 1 }, cur.revision);
          return;
        } catch (err) {
          if (!isStoreConflict(err)) throw err;
        }
      }
    }),
  );
  return (await stores[0]!.get<{ n: number }>(key))!.value.n;
}

t.test('NatsSessionStore on a single server: compare-and-set serialised under contention', async (t) => {
  const bucket = unique('single');
  const stores = await Promise.all(Array.from({ length: 4 }, async () => NatsSessionStore.open(await connection(t), { bucket, replicas: 1 })));
  t.equal(await increments(stores, 'counter', 200), 200, 'every landed update counted once');
  const [a, b] = stores as [NatsSessionStore, NatsSessionStore];
  const x = await a.create('session.x', { v: 1 });
  await t.rejects(b.create('session.x', { v: 9 }), { code: 'STORE_CONFLICT' }, 'create of a key that exists');
  await b.update('session.x', { v: 2 }, x);
  await t.rejects(a.update('session.x', { v: 3 }, x), { code: 'STORE_CONFLICT' }, 'a stale revision is a conflict');
  await b.delete('session.x');
  t.equal(await a.get('session.x'), null, 'deleted reads as absent');
  t.ok((await a.create('session.x', { v: 10 })) > 0, 'create over a tombstone');
});

t.test('values read back unlike the JSON written are read again, then STORE_UNAVAILABLE (503), never a parse error (500)', async (t) => {
  const h = await connection(t);
  const retryMs = 400;
  const bucket = unique('damaged');
  const sessions = await NatsSessionStore.open(h, { bucket, replicas: 1, retryMs });
  const ledgerBucket = unique('damagedledger');
  const ledger = await NatsLedger.open(h, { bucket: ledgerBucket, replicas: 1, retryMs, sessions });
  t.teardown(() => Promise.all([`KV_${bucket}`, `KV_${ledgerBucket}`].map((s) => h.jsm.streams.delete(s).catch(() => {}))));
  // Bytes as a damaged delivery would hand them over (no server lets us damage one in flight):
  // stored so, each read of them is damaged.
  const damaged = Buffer.from('{"state":"UPLOADING","in_flight":{"p1":');
  await sessions.create('session.good', { ok: true });
  const counted = damagedReads.count;
  await h.js.publish(`$KV.${bucket}.session.bad`, damaged);
  await h.js.publish(`$KV.${ledgerBucket}.u1.p1`, damaged);
  await h.js.publish(`$KV.${ledgerBucket}.${countsKey('u1')}`, damaged);
  const unavailable = (what: string) => ({ code: 'STORE_UNAVAILABLE', message: new RegExp(`${what.replace(/\./g, '\\.')} read back from NATS is not the JSON written \\(${damaged.length} bytes\\)`) });
  await t.rejects(sessions.get('session.bad'), unavailable('Session store key session.bad'));
  t.ok(damagedReads.count > counted, 'counted (ingest_nats_damaged_reads_total)');
  await t.rejects(sessions.getRecent('session.bad'), unavailable('Session store key session.bad'));
  await t.rejects(
    (async () => {
      for await (const _ of sessions.list('session.'));
    })(),
    unavailable('Session store key session.bad'),
  );
  t.same((await sessions.get('session.good'))?.value, { ok: true }, 'other keys read as ever');
  await t.rejects(ledger.get('u1', 'p1'), unavailable('Ledger entry u1.p1'));
  await t.rejects(
    (async () => {
      for await (const _ of ledger.list('u1'));
    })(),
    unavailable('Ledger entry u1.p1'),
  );
  t.ok(ledger.storedCounts, 'the ledger keeps the stored counts (2.12+)');
  await t.rejects(ledger.storedCounts!('u1'), unavailable('Stored counts of u1'));
});

t.test('group commit: ledger entries and queue commits written at one moment share atomic batches, each stored once', async (t) => {
  const h = await connection(t);
  const ledger = await NatsLedger.open(h, { bucket: unique('ledger'), replicas: 1 });
  const entry = (id: string) => ({ package_id: id, entity: 'stores', rows: 1, bytes: 10, object_bytes: 20 });
  // 40 sessions recording at once: one append each, as 40 sessions' ledger writes would.
  await Promise.all(Array.from({ length: 40 }, (_, i) => ledger.append(`u${i}`, [entry(`p${i}`)])));
  t.ok(ledger.publishStats.batches >= 1, `batched: ${JSON.stringify(ledger.publishStats)}`);
  t.equal(ledger.publishStats.batched + ledger.publishStats.single, 40, 'every entry went out once');
  t.ok(ledger.publishStats.single <= ENTRY_ROUNDS, `entries go ${ENTRY_ROUNDS} rounds at a time, the rest wait for one: ${JSON.stringify(ledger.publishStats)}`);
  for (let i = 0; i < 40; i++) t.same(await ledger.get(`u${i}`, `p${i}`), entry(`p${i}`));

  const sessions = await NatsSessionStore.open(h, { bucket: unique('sessions'), replicas: 1 });
  const keys = Array.from({ length: 30 }, (_, i) => `session.g${i}`);
  const revisions = await Promise.all(keys.map((k, i) => sessions.create(k, { i })));
  t.ok(sessions.publishStats.batches >= 1, `batched: ${JSON.stringify(sessions.publishStats)}`);
  t.same(
    await Promise.all(keys.map((k) => sessions.get(k))),
    keys.map((_, i) => ({ value: { i }, revision: revisions[i] })),
    'each write answered with the revision it took',
  );
  // One stale compare-and-set among fresh ones: the batch is refused whole, and only that write fails.
  const outcomes = await Promise.allSettled(keys.map((k, i) => sessions.update(k, { i, v: 2 }, i === 7 ? revisions[i]! - 1 : revisions[i]!)));
  t.same(
    outcomes.map((o) => (o.status === 'fulfilled' ? 'ok' : (o.reason as { code?: string }).code)),
    keys.map((_, i) => (i === 7 ? 'STORE_CONFLICT' : 'ok')),
  );

  const stream = unique('GROUP');
  const q = await openQueue(t, h, queueOpts(stream));
  await Promise.all(Array.from({ length: 30 }, (_, i) => commit(q, meta(`u${i % 3}`, `p${i}`), [Buffer.from(`["${i}"]\n`)])));
  t.ok(q.commitStats.batches >= 1, `batched: ${JSON.stringify(q.commitStats)}`);
  const got = await drain(t, q, 30);
  t.same(got.map((g) => g.meta.package_id).sort(), Array.from({ length: 30 }, (_, i) => `p${i}`).sort(), 'each package delivered once');
  t.same(got.map((g) => g.attempt), got.map(() => 1));
});

t.test('group commit: a batch the server refuses goes out message by message, ids deduping what landed', async (t) => {
  const h = await connection(t);
  const stream = unique('REFUSE');
  await h.jsm.streams.add({ name: stream, subjects: [`${stream}.>`], storage: StorageType.File });
  // The stream has no allow_atomic: the server refuses the batch (10174), the publisher stops batching.
  // Enough at once that some wait while every round is out: those go as a batch.
  const n = MAX_ROUNDS + 2 * BATCH_MIN;
  const off = new GroupPublisher(h, stream, { atomic: true, budgetMs: 5000 });
  await Promise.all(Array.from({ length: n }, (_, i) => off.publish({ subject: `${stream}.a`, data: Buffer.from(`${i}`), msgID: `a${i}` })));
  t.equal(off.atomic, false, 'batching turned off');
  t.equal((await h.jsm.streams.info(stream)).state.messages, n, 'each stored once');
  t.ok((await enableStreamFeatures(h, stream, 5000)).atomic, 'allow_atomic turned on');
  // A re-send of messages that landed: the batch is refused for its duplicate ids, the singles dedupe.
  const on = new GroupPublisher(h, stream, { atomic: true, budgetMs: 5000 });
  await Promise.all(Array.from({ length: n }, (_, i) => on.publish({ subject: `${stream}.a`, data: Buffer.from(`${i}`), msgID: `a${i}` })));
  t.equal((await h.jsm.streams.info(stream)).state.messages, n, 'nothing stored twice');
  t.equal(on.atomic, true, 'batching stays on');
  await Promise.all(Array.from({ length: n }, (_, i) => on.publish({ subject: `${stream}.b`, data: Buffer.from(`${i}`), msgID: `b${i}` })));
  t.equal((await h.jsm.streams.info(stream)).state.messages, 2 * n);
  t.ok(on.stats.batches >= 1, `new ids batched: ${JSON.stringify(on.stats)}`);
});

t.test('group commit: a message fails within its one budget, the wait for a round included (a server that stopped answering)', async (t) => {
  const own = await startNats(t);
  const h = await connection(t, own.url);
  const stream = unique('BUDGET');
  await h.jsm.streams.add({ name: stream, subjects: [`${stream}.>`], storage: StorageType.File });
  t.ok((await enableStreamFeatures(h, stream, 5000)).atomic, 'batches allowed');
  const publisher = new GroupPublisher(h, stream, { atomic: true, budgetMs: 1000 });
  own.pause();
  t.teardown(() => own.resume());
  // Every round goes out with one message and waits for an answer that never comes; the rest
  // wait for a round. By the time one comes back their budget is spent as well: they fail
  // unsent, not as a batch and then one by one, each with a fresh budget.
  const n = MAX_ROUNDS + 2 * BATCH_MIN;
  const outcomes = await Promise.allSettled(Array.from({ length: n }, (_, i) => publisher.publish({ subject: `${stream}.a`, data: Buffer.from(`${i}`), msgID: `a${i}` })));
  t.same(
    outcomes.map((o) => (o.status === 'rejected' ? (o.reason as { code?: string }).code : 'ok')),
    outcomes.map(() => 'STORE_UNAVAILABLE'),
    'each told the store is unavailable',
  );
  t.same(publisher.stats, { batches: 0, batched: 0, single: MAX_ROUNDS }, 'only the first round of each went out');
});

t.test('the supported nats-server floor is 2.10', async (t) => {
  for (const v of ['2.10.0', '2.10.27', '2.11.0', '2.15.1', '3.0.0', '2.15.1-beta.2']) t.ok(supportedServer(v), v);
  for (const v of ['2.9.10', '2.9.99', '1.4.0', '', undefined, 'x']) t.notOk(supportedServer(v), String(v));
  const h = await connection(t);
  t.ok(supportedServer(h.nc.info?.version), `the test bed's nats-server ${h.nc.info?.version} is supported`);
});

t.test('a compare-and-set re-sent after it landed: refused by a single server, looked up, answered as written; another writer there is no answer', async (t) => {
  const h = await connection(t);
  const stream = unique('RESEND');
  await h.jsm.streams.add({ name: stream, subjects: [`${stream}.>`], storage: StorageType.File, duplicate_window: nanos(60_000) });
  const subject = `${stream}.k`;
  const put = (msgID: string, last: number) => h.js.publish(subject, Buffer.from(msgID), { msgID, expect: { streamName: stream, lastSubjectSequence: last } });
  const first = await put('mine', 0);
  // What the server does with the re-send: on a single server the expected sequence is checked before the id.
  const failure = (p: Promise<unknown>) => p.then(() => null, (err: unknown) => err);
  t.ok(isWrongLastSequence(await failure(put('mine', 0))), 'the server itself answers the re-send "wrong last sequence"');
  const again = await publishOnce(h, subject, Buffer.from('mine'), { msgID: 'mine', stream, budgetMs: 5000, lastSubjectSequence: 0, maybeLanded: true });
  t.same({ seq: again.seq, duplicate: again.duplicate }, { seq: first.seq, duplicate: true }, 'an attempt of unknown outcome that landed: its acknowledgement');
  t.ok(
    isWrongLastSequence(await failure(publishOnce(h, subject, Buffer.from('mine'), { msgID: 'mine', stream, budgetMs: 5000, lastSubjectSequence: 0 }))),
    'without an earlier attempt of unknown outcome a lost compare-and-set stays one (no lookup)',
  );
  await put('theirs', first.seq);
  await t.rejects(
    publishOnce(h, subject, Buffer.from('late'), { msgID: 'late', stream, budgetMs: 5000, lastSubjectSequence: first.seq, maybeLanded: true }),
    { code: 'STORE_UNAVAILABLE' },
    "another writer's message after the expected sequence: unknown (ours may have landed and been replaced), never a conflict",
  );
  t.equal((await h.jsm.streams.info(stream)).state.messages, 2, 'nothing written by the lookups');
});

t.test("a publish no stream takes (deleted under the service): no responders, so not written for sure, as a publish, and as a group whose batch got the same answer", async (t) => {
  const h = await connection(t);
  const stream = unique('GONE');
  await h.jsm.streams.add({ name: stream, subjects: [`${stream}.>`], storage: StorageType.File, allow_atomic: true } as Partial<StreamConfig>);
  await h.jsm.streams.delete(stream);
  const err = await publishOnce(h, `${stream}.k`, Buffer.from('x'), { msgID: 'x', stream, budgetMs: 300, lastSubjectSequence: 0 }).then(
    () => null,
    (e: unknown) => e,
  );
  t.match(err, { code: 'STORE_UNAVAILABLE', notWritten: true }, 'a 503 at once for a record write, never one of unknown outcome (closed unanswered)');
  const group = new GroupPublisher(h, stream, { atomic: true, budgetMs: 1000, maxRounds: 1 });
  const writes = Array.from({ length: BATCH_MIN }, (_, i) => group.publish({ subject: `${stream}.k${i}`, data: Buffer.from('x'), msgID: `g${i}`, lastSubjectSequence: 0 }).then(() => null, (e: unknown) => e));
  for (const e of await Promise.all(writes)) t.match(e, { code: 'STORE_UNAVAILABLE', notWritten: true });
});

t.test('NatsSessionStore: an update whose answer was lost (server paused past the request timeout) is answered as written when the re-send meets it', async (t) => {
  const own = await startNats(t);
  const h = await connectNats({ servers: own.url, name: 'contract-test', requestTimeoutMs: 300 });
  t.teardown(() => h.close());
  // The second attempt of a publish: the first one's request timed out.
  let attempts = 0;
  let resent!: () => void;
  const second = new Promise<void>((resolve) => (resent = resolve));
  const js = Object.create(h.js) as typeof h.js;
  js.publish = (...args: Parameters<typeof h.js.publish>) => {
    if (++attempts === 2) resent();
    return h.js.publish(...args);
  };
  const store = await NatsSessionStore.open({ ...h, js }, { bucket: unique('lost'), replicas: 1, retryMs: 10_000 });
  const created = await store.create('session.y', { v: 1 });
  attempts = 0;
  own.pause();
  t.teardown(() => own.resume());
  const written = store.update('session.y', { v: 2 }, created);
  await second;
  // Both attempts reach the server now: the first lands, the second finds its own write.
  own.resume();
  const revision = await written;
  t.same(await store.get('session.y'), { value: { v: 2 }, revision }, 'answered with the revision it landed at');
  t.ok(attempts >= 2, `sent ${attempts} times`);
});

t.test('NatsSessionStore: 20 concurrent creates from two connections, exactly one winner', async (t) => {
  const bucket = unique('race');
  const [a, b] = [await connection(t), await connection(t)];
  const stores = [await NatsSessionStore.open(a, { bucket, replicas: 1 }), await NatsSessionStore.open(b, { bucket, replicas: 1 })];
  const results = await Promise.allSettled(Array.from({ length: 20 }, (_, i) => stores[i % 2]!.create('active.6163', { i })));
  const won = results.flatMap((r, i) => (r.status === 'fulfilled' ? [{ i, rev: r.value }] : []));
  t.equal(won.length, 1, 'one winner');
  t.ok(results.every((r) => r.status === 'fulfilled' || isStoreConflict(r.reason)), 'the rest STORE_CONFLICT');
  t.same(await stores[1]!.get('active.6163'), { value: { i: won[0]?.i }, revision: won[0]?.rev }, 'the other connection reads the winner');
  const { config } = await a.jsm.streams.info(`KV_${bucket}`);
  t.match(config, { max_msgs_per_subject: 1, storage: 'file', allow_direct: true }, 'history 1, file storage, direct get allowed (for getRecent)');
  const leaderReads: string[] = [];
  const request = b.nc.request.bind(b.nc);
  b.nc.request = ((subject: string, ...rest: never[]) => {
    leaderReads.push(subject);
    return request(subject, ...rest);
  }) as typeof b.nc.request;
  await stores[1]!.get('active.6163');
  t.same(leaderReads, [`$JS.API.STREAM.MSG.GET.KV_${bucket}`], 'get asks the leader, not any replica');
  await a.jsm.streams.delete(`KV_${bucket}`);
});

t.test('NatsSessionStore.getRecent: a direct get any replica may answer, never older than what this instance saw', async (t) => {
  const h = await connection(t);
  const bucket = unique('recent');
  const store = await NatsSessionStore.open(h, { bucket, replicas: 1 });
  t.teardown(() => h.jsm.streams.delete(`KV_${bucket}`).catch(() => {}));
  t.equal((await h.jsm.streams.info(`KV_${bucket}`)).config.allow_direct, true, 'the bucket allows direct get');
  t.equal(await store.getRecent('session.a'), null, 'a key never written');
  const r1 = await store.create('session.a', { v: 1 });
  t.same(await store.getRecent('session.a'), { value: { v: 1 }, revision: r1 });
  const r2 = await store.update('session.a', { v: 2 }, r1);
  t.same(await store.getRecent('session.a'), { value: { v: 2 }, revision: r2 }, 'its own update at once');
  await store.delete('session.a');
  t.equal(await store.getRecent('session.a'), null, 'a deleted key');
  const other = await NatsSessionStore.open(await connection(t), { bucket, replicas: 1 });
  const r3 = await other.create('session.a', { v: 3 });
  t.same(await store.getRecent('session.a'), { value: { v: 3 }, revision: r3 }, "another instance's write");

  // A replica behind what this instance saw: its answer loses to the newer one this instance holds.
  let behind = false;
  const request = h.nc.request.bind(h.nc);
  h.nc.request = (async (subject: string, data?: Uint8Array, opts?: never) => {
    if (!behind || !subject.startsWith('$JS.API.DIRECT.GET.')) return request(subject, data, opts);
    const direct = JSON.parse(Buffer.from(data!).toString()) as { last_by_subj: string };
    t.equal(direct.last_by_subj, `$KV.${bucket}.session.a`);
    return request(subject, Buffer.from(JSON.stringify({ seq: r1 })), opts); // the answer a lagging follower would give
  }) as typeof h.nc.request;
  behind = true;
  t.same(await store.getRecent('session.a'), { value: { v: 3 }, revision: r3 }, 'an older answer does not go back in time');
  behind = false;
});

t.test('NatsSessionStore: a deleted key leaves nothing behind once its marker\'s TTL is over; readers and the lost-keys guard take it as never written', async (t) => {
  const h = await connection(t);
  const bucket = unique('markers');
  const stream = `KV_${bucket}`;
  const store = await LostKeysGuard.open(await NatsSessionStore.open(h, { bucket, replicas: 1, markerTtlSeconds: 1 }), h, bucket);
  const other = await NatsSessionStore.open(await connection(t), { bucket, replicas: 1, markerTtlSeconds: 1 });
  t.teardown(() => h.jsm.streams.delete(stream).catch(() => {}));
  t.equal(((await h.jsm.streams.info(stream)).config as { allow_msg_ttl?: boolean }).allow_msg_ttl, true, 'the bucket allows per-message TTLs');
  const keys = Array.from({ length: 40 }, (_, i) => `idem.ab.${i}`);
  const revisions = await Promise.all(keys.map((k, i) => store.create(k, { i })));
  t.same(await store.getRecent(keys[0]!), { value: { i: 0 }, revision: revisions[0] }, 'this instance saw a value');
  // Another instance deletes them all (some conditionally, as idempotency records go).
  await Promise.all(keys.map((k, i) => other.delete(k, i % 2 ? revisions[i] : undefined)));
  t.equal(await store.getRecent(keys[3]!), null, 'deleted, while its marker is there');
  const emptied = await until('markers removed', () => h.jsm.streams.info(stream), (i) => i.state.messages === 1, 15_000);
  t.equal(emptied.state.messages, 1, 'one message left: the key that is never deleted');
  t.ok(emptied.state.last_seq > keys.length * 2, 'the sequence moved past every write');
  t.equal(await store.getRecent(keys[0]!), null, 'a value this instance saw, deleted elsewhere, its marker gone: not given back');
  t.equal(await store.get(keys[1]!), null, 'the guard reads an emptied key as absent, not as lost');
  t.equal(await store.getRecent(keys[2]!), null, 'nor one this instance wrote');
  const again = await other.create(keys[0]!, { i: 'again' });
  t.same(await store.get(keys[0]!), { value: { i: 'again' }, revision: again }, 'created again, expecting nothing on the key');
  t.same(await store.getRecent(keys[0]!), { value: { i: 'again' }, revision: again });
});

t.test('NatsSessionStore: keys that are not NATS subjects as they are', async (t) => {
  const h = await connection(t);
  const store = await NatsSessionStore.open(h, { bucket: unique('keys'), replicas: 1 });
  const keys = ['.a', 'a.', 'a..b', '..', '-', '=', 'a.b'];
  for (const [i, k] of keys.entries()) await store.create(k, i);
  for (const [i, k] of keys.entries()) t.equal((await store.get(k))?.value, i, `key ${JSON.stringify(k)}`);
});

t.test('NatsBatchQueue: a package of one small batch is one message, its commit; bigger ones keep their batch messages', async (t) => {
  const h = await connection(t);
  const stream = unique('INLINE');
  const q = await openQueue(t, h, queueOpts(stream));
  t.teardown(() => h.jsm.streams.delete(stream).catch(() => {}));
  const small = Buffer.from('["s1","Store"]\n');
  await commit(q, meta('u-inline', 'one'), [small]);
  t.equal((await h.jsm.streams.info(stream)).state.messages, 1, 'one message: the commit carries the batch');
  const big = Buffer.alloc(300 * 1024, 0x61);
  await commit(q, meta('u-inline', 'big'), [big]);
  await commit(q, meta('u-inline', 'two'), [small, small]);
  t.equal((await h.jsm.streams.info(stream)).state.messages, 1 + 2 + 3, 'a batch past 256 KiB, or two batches, go as batch messages');
  t.equal(await q.pending('u-inline'), 3);
  const got = await drain(t, q, 3);
  t.same(
    got.map((g) => [g.meta.package_id, g.data.byteLength]).sort(),
    [['big', big.byteLength], ['one', small.byteLength], ['two', 2 * small.byteLength]].sort(),
    'every package reads back whole',
  );
  t.equal((await h.jsm.streams.info(stream)).state.messages, 0, 'nothing left after the acks');
});

t.test('NatsBatchQueue: the stream has limits retention (none set) on file storage, with the documented subjects', async (t) => {
  const h = await connection(t);
  const stream = unique('LAYOUT');
  const q = await openQueue(t, h, queueOpts(stream));
  t.teardown(() => h.jsm.streams.delete(stream).catch(() => {}));
  const info = await h.jsm.streams.info(stream);
  t.equal(info.config.retention, 'limits');
  t.equal(q.retention, 'limits');
  t.match(info.config, { storage: 'file', max_age: 0, max_bytes: -1, max_msgs: -1, discard: 'new' }, 'nothing is ever dropped to make room');
  t.same(info.config.subjects, [`${stream}.b.>`, `${stream}.c.>`]);
  const open = await q.open(meta('u-1', 'p-open', 'acme.corp *>'));
  await open.append(Buffer.from('["x"]\n'));
  await open.append(Buffer.from('["y"]\n'));
  await commit(q, meta('u-1', 'p-done', 'acme.corp *>'), [Buffer.from('["a"]\n'), Buffer.from('["b"]\n')]);
  const subjects = (await h.jsm.streams.info(stream, { subjects_filter: '>' })).state.subjects;
  const client = Buffer.from('acme.corp *>').toString('hex');
  t.same(subjects, {
    // The open package's last batch waits for its commit (it may travel with it).
    [`${stream}.b.${client}.u-1.stores.p-open`]: 1,
    [`${stream}.b.${client}.u-1.stores.p-done`]: 2,
    [`${stream}.c.${client}.u-1.stores.p-done`]: 1,
  });
  const consumer = await h.jsm.consumers.info(stream, 'uploader');
  t.equal(consumer.config.filter_subject, `${stream}.c.>`);
  t.equal(consumer.num_pending, 1, 'the consumer sees the commit only');
  await open.abort();
});

t.test('NatsBatchQueue: acknowledged commits leave the stream in bulk; an acked one left there is never delivered again, across a server restart', async (t) => {
  const own = await startNats(t);
  const stream = unique('BULK');
  // A process that acks and dies before its bulk removal: its acked commits stay in the stream.
  const dying = await connectNats({ servers: own.url, name: 'dying', requestTimeoutMs: 5000 });
  const keeping = await NatsBatchQueue.open(dying, { ...queueOpts(stream), removeEveryMs: 3_600_000 });
  const ids = Array.from({ length: 6 }, (_, i) => `p${i}`);
  await Promise.all(ids.map((id, i) => commit(keeping, meta(`u${i % 2}`, id), [Buffer.from(`["${id}"]\n`)])));
  const handled: string[] = [];
  keeping.consume(async (pkg) => void handled.push(pkg.meta.package_id));
  t.teardown(() => keeping.close());
  const h = await connection(t, own.url);
  await until('every package acked', () => h.jsm.consumers.info(stream, 'uploader'), (c) => c.num_pending === 0 && c.num_ack_pending === 0 && c.ack_floor.stream_seq >= ids.length, 10_000, 20);
  await dying.nc.close(); // no stop, no removal: a crash as the server sees it
  t.same([...handled].sort(), ids);
  t.equal((await h.jsm.streams.info(stream)).state.messages, ids.length, 'acked, still in the stream');

  await own.restart();
  const h2 = await connection(t, own.url);
  t.equal((await h2.jsm.consumers.info(stream, 'uploader')).ack_floor.stream_seq, ids.length, 'the ack floor survived the restart');
  const q = await openQueue(t, h2, queueOpts(stream));
  t.same(await Promise.all(['u0', 'u1'].map((u) => q.pending(u))), [0, 0], 'none pending after the restart');
  t.same(await Promise.all(['u0', 'u1'].map((u) => q.hasPending(u))), [false, false]);
  await commit(q, meta('u0', 'marker'), [Buffer.from('["m"]\n')]);
  const after = await drain(t, q, 1);
  t.same(after.map((d) => [d.meta.package_id, d.attempt]), [['marker', 1]], 'only the new package is delivered');
  t.equal((await h2.jsm.streams.info(stream)).state.messages, 0, 'the removal after its ack took the leftovers too: one purge up to the ack floor');
});

/**
 * A queue with p1 (session u-held) and p2 (u-done) committed, p1 held in a handler until
 * `release`: the consumer's ack floor stays below p2. `done`: what the holder finished.
 */
async function heldFloor(t: Test, name: string) {
  const h = await connection(t);
  const stream = unique(name);
  t.teardown(() => h.jsm.streams.delete(stream).catch(() => {}));
  const q = await openQueue(t, h, { ...queueOpts(stream), removeEveryMs: 20 });
  await commit(q, meta('u-held', 'p1'), [Buffer.from('["p1"]\n')]);
  await commit(q, meta('u-done', 'p2'), [Buffer.from('["p2"]\n')]);
  let held!: () => void;
  const inHand = new Promise<void>((resolve) => (held = resolve));
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const done: string[] = [];
  const holder = q.consume(async (pkg) => {
    held();
    await gate;
    done.push(pkg.meta.package_id);
  });
  t.teardown(() => holder.stop());
  await inHand;
  return { h, stream, q, holder, release, done };
}

t.test('NatsBatchQueue: a commit acked above the ack floor is not pending, and leaves the stream while the floor is held', async (t) => {
  const { h, stream, q, holder, release, done } = await heldFloor(t, 'ABOVE');
  const other = await drain(t, q, 1); // p2, acked above the floor
  t.same(other.map((d) => d.meta.package_id), ['p2']);
  const info = await h.jsm.consumers.info(stream, 'uploader');
  t.equal(info.num_ack_pending, 1, 'p1 in hand');
  t.ok(info.ack_floor.stream_seq < (await h.jsm.streams.info(stream)).state.last_seq, 'the floor is below p2');
  t.equal(await q.hasPending('u-done'), false, 'p2 is done');
  t.equal(await q.pending('u-done'), 0);
  t.equal(await q.hasPending('u-held'), true, 'p1 is not');
  // Another process knows only the floor and the stream: p2 must leave the stream on its own.
  const elsewhere = await openQueue(t, await connection(t), queueOpts(stream));
  await until('p2 removed above the floor', () => elsewhere.hasPending('u-done'), (pending) => !pending, 10_000, 20);
  t.equal((await h.jsm.streams.info(stream)).state.messages, 1, 'only p1 is left');
  release();
  await holder.stop();
  t.same(done, ['p1']);
  t.equal((await h.jsm.streams.info(stream)).state.messages, 0, 'p1 removed once its consumer stopped');
  t.same(await Promise.all(['u-held', 'u-done'].map((u) => elsewhere.hasPending(u))), [false, false]);
});

t.test("NatsBatchQueue: a stored package whose ack lands but is answered as lost (a timeout) leaves the stream all the same: its session is not pending while another's package holds the ack floor", async (t) => {
  const { h, stream, q, holder, release } = await heldFloor(t, 'ACKLOST');
  // Every ack reaches the server; its answer is lost, as from a server frozen with the ack in its socket.
  const nc = h.nc as unknown as { request: (subject: string, ...rest: unknown[]) => Promise<unknown> };
  const request = nc.request.bind(h.nc);
  let unanswered = 0;
  nc.request = async (subject: string, ...rest: unknown[]) => {
    if (!subject.startsWith('$JS.ACK.')) return request(subject, ...rest);
    unanswered++;
    await request(subject, ...rest);
    throw Object.assign(new Error('TIMEOUT'), { code: 'TIMEOUT' });
  };
  t.same((await drain(t, q, 1)).map((d) => d.meta.package_id), ['p2']);
  nc.request = request;
  t.equal(unanswered, 3, 'each of its three acks answered as lost');
  const info = await h.jsm.consumers.info(stream, 'uploader');
  t.equal(info.num_ack_pending, 1, 'the server has p2 acked (never delivered again): only p1 in hand');
  t.equal(await q.hasPending('u-done', { forAnswer: true }), false, 'p2 is done (pending before)');
  const elsewhere = await openQueue(t, await connection(t), queueOpts(stream));
  await until('p2 removed above the floor', () => elsewhere.hasPending('u-done', { forAnswer: true }), (pending) => !pending, 10_000, 20);
  t.equal((await h.jsm.streams.info(stream)).state.messages, 1, 'only p1 is left');
  release();
  await holder.stop();
});

t.test('NatsBatchQueue: a process that stops takes the commits it acked above the ack floor out of the stream on its way (no round of its own comes later)', async (t) => {
  const { h, stream, q, holder, release } = await heldFloor(t, 'STOPS');
  // Another process (an uploader in a rolling restart) acks p2, then stops before its next round.
  const leaving = await NatsBatchQueue.open(await connection(t), { ...queueOpts(stream), removeEveryMs: 3_600_000 });
  t.same((await drain(t, leaving, 1)).map((d) => d.meta.package_id), ['p2']);
  await leaving.close();
  t.equal((await h.jsm.streams.info(stream)).state.messages, 1, 'only p1 is left in the stream');
  t.equal(await q.hasPending('u-done'), false, "p2 holds its session back nowhere (this process did not ack it)");
  release();
  await holder.stop();
});

t.test('NatsBatchQueue: a stream made as a work queue keeps working as one (retention cannot change in place)', async (t) => {
  const h = await connection(t);
  const stream = unique('OLDWQ');
  t.teardown(() => h.jsm.streams.delete(stream).catch(() => {}));
  await addWorkQueueStream(h, stream);
  const q = await openQueue(t, h, { ...queueOpts(stream), removeEveryMs: 3_600_000 });
  t.equal(q.retention, 'workqueue');
  await commit(q, meta('u1', 'p1'), [Buffer.from('["p1"]\n')]);
  await commit(q, meta('u1', 'p2'), [Buffer.from('["a"]\n'), Buffer.from('["b"]\n')]);
  t.equal(await q.pending('u1'), 2);
  const got = await drain(t, q, 2);
  t.same(got.map((d) => d.data.toString()), ['["p1"]\n', '["a"]\n["b"]\n']);
  t.equal((await h.jsm.streams.info(stream)).state.messages, 0, 'each ack removed its commit at once');
  t.equal((await h.jsm.streams.info(stream)).config.retention, 'workqueue', 'the stream is left as it was');
});

t.test('NatsBatchQueue: batches near the batch size limit round-trip byte for byte', async (t) => {
  const h = await connection(t);
  const stream = unique('BIG');
  t.teardown(() => h.jsm.streams.delete(stream).catch(() => {}));
  const q = await openQueue(t, h, queueOpts(stream));
  const batches = [0, 1, 2, 3].map((i) => Buffer.alloc(512 * 1024, 0x30 + i));
  await commit(q, meta('u1', 'big'), batches);
  const [got] = await drain(t, q, 1);
  t.ok(got!.data.equals(Buffer.concat(batches)), '2 MiB in four 512 KiB batches');
  t.equal(await q.pending('u1'), 0);
  t.same((await h.jsm.streams.info(stream)).state.messages, 0, 'nothing left in the stream after the ack');
});

t.test('NatsBatchQueue: a server whose max_payload is below the inline size (64 KiB): packages of one and of several batches are stored, and round-trip', async (t) => {
  const own = await startNats(t, { maxPayload: 64 * 1024 });
  const h = await connection(t, own.url);
  const stream = unique('SMALLPAYLOAD');
  const q = await openQueue(t, h, queueOpts(stream));
  const packages: [string, Buffer[]][] = [
    ['tiny', [Buffer.from('["a"]\n')]],
    ['near', [Buffer.alloc(60 * 1024 - 100, 0x41)]], // fits a message, not beside its commit record
    ['one', [Buffer.alloc(200 * 1024, 0x31)]], // one batch: once inline, over max_payload
    ['two', [Buffer.alloc(100 * 1024, 0x32), Buffer.alloc(50 * 1024, 0x33)]], // the first held, then published alone
  ];
  for (const [id, batches] of packages) await commit(q, meta('u1', id), batches);
  const got = await drain(t, q, packages.length);
  t.same(
    got.map((p) => [p.meta.package_id, p.data.length]).sort(),
    packages.map(([id, batches]) => [id, Buffer.concat(batches).length]).sort(),
  );
  for (const [id, batches] of packages) t.ok(got.find((p) => p.meta.package_id === id)!.data.equals(Buffer.concat(batches)), `${id}: byte for byte`);
});

t.test('NatsBatchQueue: a package in the hands of a crashed process is delivered again after the ack wait', async (t) => {
  const stream = unique('CRASH');
  const opts = { ...queueOpts(stream), ackWaitMs: 1000 };
  const crashing = await connectNats({ servers: server.url, name: 'crashing', requestTimeoutMs: 5000 });
  const q1 = await NatsBatchQueue.open(crashing, opts);
  await commit(q1, meta('u1', 'p1'), [Buffer.from('["p1"]\n')]);
  let taken!: () => void;
  let release!: () => void;
  const inHand = new Promise<void>((resolve) => (taken = resolve));
  q1.consume(() => {
    taken();
    return new Promise<void>((resolve) => (release = resolve)); // finishes only after the "crash"
  });
  t.teardown(async () => {
    release();
    await q1.close();
  });
  await inHand;
  await crashing.nc.close(); // no ack, no drain: a crash as the server sees it
  const h = await connection(t);
  t.teardown(() => h.jsm.streams.delete(stream).catch(() => {}));
  const q2 = await openQueue(t, h, opts);
  t.equal(await q2.pending('u1'), 1, 'still pending while nobody acked it');
  const started = Date.now();
  const [got] = await drain(t, q2, 1);
  t.equal(got!.attempt, 2, 'second delivery');
  t.ok(Date.now() - started < 5000, 'after about the ack wait');
  t.equal(got!.data.toString(), '["p1"]\n');
  t.equal(await q2.pending('u1'), 0);
});

t.test('NatsBatchQueue: sweep removes batches of dead writers only', async (t) => {
  const h = await connection(t);
  const stream = unique('SWEEP');
  t.teardown(() => h.jsm.streams.delete(stream).catch(() => {}));
  const orphanAfterMs = 60_000;
  const q = await openQueue(t, h, { ...queueOpts(stream), orphanAfterMs });
  const dead = await q.open(meta('u1', 'dead'));
  await dead.append(Buffer.from('["d1"]\n'));
  await dead.append(Buffer.from('["d2"]\n'));
  await commit(q, meta('u1', 'committed'), [Buffer.from('["c1"]\n')]);
  t.equal(await q.sweep(), 0, 'nothing is old yet');
  const live = await q.open(meta('u1', 'live'));
  t.equal(await q.sweep(Date.now() + orphanAfterMs + 1000), 1, 'the dead package, later');
  await live.append(Buffer.from('["l1"]\n'));
  await live.commit({ rows: 1, bytes: 7 });
  const got = await drain(t, q, 2);
  t.same(got.map((d) => [d.meta.package_id, d.data.toString()]), [
    ['committed', '["c1"]\n'],
    ['live', '["l1"]\n'],
  ]);
  t.equal((await h.jsm.streams.info(stream)).state.messages, 0, 'no batch of the dead writer is left');
});

for (const kind of ['limits', 'workqueue'] as const) {
t.test(`NatsBatchQueue (${kind} stream): packages acknowledged but left in the stream are not pending; the sweep removes them`, async (t) => {
  const h = await connection(t);
  const stream = unique('LEFTOVER');
  t.teardown(() => h.jsm.streams.delete(stream).catch(() => {}));
  if (kind === 'workqueue') await addWorkQueueStream(h, stream);
  const q = await openQueue(t, h, queueOpts(stream));
  t.equal(q.retention, kind);
  await commit(q, meta('u-left', 'p1'), [Buffer.from('["a"]\n'), Buffer.from('["b"]\n')]);
  await commit(q, meta('u-left', 'p2'), [Buffer.from('["c"]\n')]);
  await commit(q, meta('u-live', 'p3'), [Buffer.from('["d"]\n')]);
  t.equal(await q.hasPending('u-left'), true, 'pending while nobody acked them');

  // The consumer's ack floor past u-left's commits, the messages still in the stream: on a
  // limits stream what a process that acked them and died before the bulk removal leaves; on
  // a work queue, which removes a message when it is acked, what a power cut between the two
  // left. The consumer reset of nats-server 2.14+ moves the floor without removing anything.
  const commitOf = (uuid: string, id: string) => `${stream}.c.${Buffer.from('client-1').toString('hex')}.${uuid}.stores.${id}`;
  const p2 = await h.jsm.streams.getMessage(stream, { last_by_subj: commitOf('u-left', 'p2') });
  await resetConsumer(t, h, stream, p2.seq + 1);
  t.equal((await h.jsm.consumers.info(stream, 'uploader')).ack_floor.stream_seq, p2.seq, 'acknowledged up to p2');
  t.equal((await h.jsm.streams.info(stream)).state.messages, 5, 'every message still in the stream (p1: two batches and its commit)');

  // Another process (no ack floor read yet) asks what status and start-upload ask.
  const other = await openQueue(t, h, queueOpts(stream));
  t.equal(await other.hasPending('u-left'), false, 'acknowledged packages left in the stream are not pending');
  t.equal(await other.pending('u-left'), 0);
  t.equal(await other.hasPending('u-live'), true, 'the package above the floor still is');
  t.equal(await other.pending('u-live'), 1);

  t.equal(await other.sweep(), 2, 'the sweep removes the two leftovers');
  t.equal((await h.jsm.streams.info(stream)).state.messages, 1, 'with their batches; the live package stays');
  const got = await drain(t, other, 1);
  t.same(got.map((d) => [d.meta.package_id, d.data.toString()]), [['p3', '["d"]\n']], 'and is delivered');
});
}

/**
 * `h` with KV buckets whose `get` answers `stale(key)` where it gives an answer (not
 * undefined), as a stream leader deposed by a partition does for a moment after the heal.
 */
function staleReads(h: NatsHandle, stale: (key: string) => KvEntry | null | undefined): NatsHandle {
  const views = h.js.views;
  const kv = views.kv.bind(views);
  const staleViews = Object.assign(Object.create(views) as typeof views, {
    kv: async (...args: Parameters<typeof kv>) => {
      const opened = await kv(...args);
      const get = opened.get.bind(opened);
      return Object.assign(Object.create(opened) as typeof opened, {
        get: async (key: string, opts?: Parameters<typeof get>[1]) => {
          const answer = stale(key);
          return answer === undefined ? get(key, opts) : answer;
        },
      });
    },
  });
  return { ...h, js: Object.create(h.js, { views: { value: staleViews } }) as typeof h.js } as NatsHandle;
}

t.test('NatsLedger: getConfirmed does not take a read without an entry for its absence (a deposed leader around a heal): the compare-and-set after it finds the entry', async (t) => {
  const bucket = unique('ledger');
  const h = await connection(t);
  t.teardown(() => h.jsm.streams.delete(`KV_${bucket}`).catch(() => {}));
  const U = '33333333-3333-4333-8333-333333333333';
  // The first read of p-1 answers as a leader that missed the entry would: nothing there.
  let stale = 1;
  const ledger = await NatsLedger.open(
    staleReads(h, (key) => (key === `${U}.p-1` && stale-- > 0 ? null : undefined)),
    { bucket, replicas: 1 },
  );
  t.teardown(() => ledger.close());
  const e = { package_id: 'p-1', entity: 'stock', rows: 1, bytes: 10, object_bytes: 130 };
  await ledger.append(U, [e]);
  t.same(await ledger.getConfirmed(U, 'p-1'), e, 'found on the read after the refused compare-and-set');
  t.equal(stale, -1, 'read again after the refusal');
  t.same(await ledger.get(U, 'p-1'), e, 'the entry is untouched');
});

t.test('NatsSessionStore: getConfirmed takes neither an older value nor none from a stale read (a deposed leader around a heal): the compare-and-set after it finds the key as it is', async (t) => {
  const bucket = unique('sessions');
  const h = await connection(t);
  t.teardown(() => h.jsm.streams.delete(`KV_${bucket}`).catch(() => {}));
  let next: KvEntry | null | undefined;
  const store = await NatsSessionStore.open(
    staleReads(h, (key) => {
      const answer = key === 'active.a' ? next : undefined;
      if (key === 'active.a') next = undefined;
      return answer;
    }),
    { bucket, replicas: 1 },
  );
  t.teardown(() => store.close());
  const first = await store.create('active.a', { upload_uuid: 'u1' });
  const current = await store.update('active.a', { upload_uuid: 'u2' }, first);
  const older = { key: 'active.a', revision: first, value: Buffer.from(JSON.stringify({ upload_uuid: 'u1' })), operation: 'PUT' } as unknown as KvEntry;
  next = older;
  t.same((await store.get('active.a'))?.value, { upload_uuid: 'u1' }, 'the stale read as get answers it');
  next = older;
  const got = await store.getConfirmed<{ upload_uuid: string }>('active.a');
  t.same(got?.value, { upload_uuid: 'u2' }, 'an older value: the value written since');
  t.ok(got!.revision > current, 'at the revision its confirming write made');
  next = null;
  t.same((await store.getConfirmed('active.a'))?.value, { upload_uuid: 'u2' }, 'none: the value there');
  t.equal(next, undefined, 'the stale read was taken');
  t.same((await store.get('active.a'))?.value, { upload_uuid: 'u2' }, 'the value is untouched');
});

t.test('NatsSessionStore: a lost write one instance tells makes the key contended for the other instances on the bucket, not for itself nor on another bucket', async (t) => {
  const bucket = unique('sessions');
  const [ha, hb, hc] = [await connection(t), await connection(t), await connection(t)];
  t.teardown(() => ha.jsm.streams.delete(`KV_${bucket}`).catch(() => {}));
  t.teardown(() => ha.jsm.streams.delete(`KV_${bucket}x`).catch(() => {}));
  const [a, b, other] = [await NatsSessionStore.open(ha, { bucket, replicas: 1 }), await NatsSessionStore.open(hb, { bucket, replicas: 1 }), await NatsSessionStore.open(hc, { bucket: `${bucket}x`, replicas: 1 })];
  t.teardown(() => Promise.all([a.close(), b.close(), other.close()]));
  // Each connection's subscription is registered with the server once a round trip has passed.
  await Promise.all([ha.nc.flush(), hb.nc.flush(), hc.nc.flush()]);
  t.equal(b.contended('session.x'), false);
  a.lostWrite('session.x');
  // The server has the message once a's flush returns, and has queued it to b before it
  // answers b's flush: b's callback has run by then.
  await ha.nc.flush();
  await hb.nc.flush();
  t.equal(b.contended('session.x'), true, 'b is told');
  t.equal(a.contended('session.x'), false, 'not the one that lost');
  t.equal(b.contended('session.y'), false, 'that key only');
  await hc.nc.flush();
  t.equal(other.contended('session.x'), false, 'not another bucket');
});

t.test('NatsBatchQueue: a lower ack floor read later from the same consumer does not make acknowledged packages pending again; the sweep deletes by the floor as read', async (t) => {
  const h = await connection(t);
  const stream = unique('BACKFLOOR');
  t.teardown(() => h.jsm.streams.delete(stream).catch(() => {}));
  const q = await openQueue(t, h, queueOpts(stream));
  await commit(q, meta('u-b', 'p1'), [Buffer.from('["a"]\n')]);
  await commit(q, meta('u-b', 'p2'), [Buffer.from('["b"]\n')]);
  const commitOf = (id: string) => `${stream}.c.${Buffer.from('client-1').toString('hex')}.u-b.stores.${id}`;
  const [p1, p2] = await Promise.all(['p1', 'p2'].map((id) => h.jsm.streams.getMessage(stream, { last_by_subj: commitOf(id) })));
  let now = 0;
  const other = await openQueue(t, h, { ...queueOpts(stream), clock: () => now });
  await resetConsumer(t, h, stream, p2!.seq + 1);
  t.equal(await other.hasPending('u-b'), false, 'the floor read past both');
  // The same consumer answers a lower floor: what a consumer leader deposed around a heal, or
  // elected and not caught up, answered once (start-upload 409 after status said finished).
  await resetConsumer(t, h, stream, p1!.seq);
  now += 1001;
  t.equal((await h.jsm.consumers.info(stream, 'uploader')).ack_floor.stream_seq, p1!.seq - 1, 'the consumer now answers a floor below both');
  t.equal(await other.hasPending('u-b'), false, 'a decision: still not pending');
  t.equal(await other.hasPending('u-b', { forAnswer: true }), false, 'an answer: nor');
  t.equal(await other.sweep(), 0, 'the sweep removes nothing the consumer does not say is acknowledged now');
  t.equal(await (await openQueue(t, h, queueOpts(stream))).hasPending('u-b'), true, 'a process that never read the higher floor counts both');
});

t.test('NatsBatchQueue: a decision that reads an ack floor below the acks ("consumer not found": 0) counts acknowledged packages, unless `stored` says they are stored', async (t) => {
  const h = await connection(t);
  const stream = unique('LOWFLOOR');
  t.teardown(() => h.jsm.streams.delete(stream).catch(() => {}));
  const q = await openQueue(t, h, queueOpts(stream));
  await commit(q, meta('u-g', 'p1'), [Buffer.from('["a"]\n')]);
  await commit(q, meta('u-g', 'p2'), [Buffer.from('["b"]\n')]);
  // Both acknowledged and still in the stream (as in the test above), then the consumer's info
  // answers "not found": what a start-upload met once around a partition's heal, when status
  // had just read the floor past both.
  const p2 = await h.jsm.streams.getMessage(stream, { last_by_subj: `${stream}.c.${Buffer.from('client-1').toString('hex')}.u-g.stores.p2` });
  await resetConsumer(t, h, stream, p2.seq + 1);
  let now = 0;
  const other = await openQueue(t, h, { ...queueOpts(stream), clock: () => now });
  t.equal(await other.hasPending('u-g'), false, 'the floor read past both: not pending');
  await h.jsm.consumers.delete(stream, 'uploader');
  now += 1001; // the floor read is old: the next decision reads it again
  t.equal(await other.hasPending('u-g'), true, 'no consumer: the floor reads as 0 and both count');
  const asked: string[] = [];
  const stored = async (id: string) => (asked.push(id), true);
  t.equal(await other.hasPending('u-g', { stored }), false, 'both stored: not pending');
  t.same(asked, ['p1', 'p2'], 'asked about each by its package id');
  t.equal(await other.hasPending('u-g', { stored: async (id) => id === 'p1' }), true, 'one not stored is pending');
  const subjects = new QueueSubjects(stream);
  for (const id of ['p1', 'a.b=c ü']) t.equal(subjects.packageIdOf(subjects.commit(packageTail(meta('u-g', id)))), id, `package id ${JSON.stringify(id)} read back from its subject`);
});

t.test('NatsBatchQueue: an answer serves the last ack floor read and never waits for a fresh one; a decision does', async (t) => {
  const h = await connection(t);
  const stream = unique('FLOOR');
  t.teardown(() => h.jsm.streams.delete(stream).catch(() => {}));
  await commit(await openQueue(t, h, queueOpts(stream)), meta('u-f', 'p1'), [Buffer.from('["a"]\n')]);
  let now = 0;
  const reader = await connection(t);
  const q = await openQueue(t, reader, { ...queueOpts(stream), clock: () => now });
  t.equal(await q.hasPending('u-f', { forAnswer: true }), true, 'pending: nobody acked it (the first answer reads the floor)');

  // The floor moves past p1 (acked by another process, still in the stream: nats-server 2.14+'s reset).
  const p1 = await h.jsm.streams.getMessage(stream, { last_by_subj: `${stream}.c.${Buffer.from('client-1').toString('hex')}.u-f.stores.p1` });
  await resetConsumer(t, h, stream, p1.seq + 1);
  t.equal(await q.hasPending('u-f', { forAnswer: true }), true, 'within the reuse time the floor read before serves');

  now += 1001; // the floor read is old now
  t.equal(await q.hasPending('u-f', { forAnswer: true }), true, 'an answer does not wait for the consumer info: the last floor serves, and a fresh read starts');
  t.equal(await q.hasPending('u-f'), false, 'a decision (start-upload) waits for the fresh floor: acknowledged, not pending');
  t.equal(await q.hasPending('u-f', { forAnswer: true }), false, 'and the answers after it read it');
});

t.test('NatsBatchQueue: a delivered package whose batches vanished is dropped, not redelivered forever', async (t) => {
  const h = await connection(t);
  const stream = unique('LOST');
  t.teardown(() => h.jsm.streams.delete(stream).catch(() => {}));
  const errors: string[] = [];
  let lost: unknown;
  let dropped!: () => void;
  const drop = new Promise<void>((resolve) => (dropped = resolve));
  const q = await openQueue(t, h, {
    ...queueOpts(stream),
    onError: (err, what) => {
      errors.push(what);
      if (what.startsWith('drop package')) {
        lost = err;
        dropped();
      }
    },
  });
  // Two batches: a package of one small batch travels inside its commit message.
  await commit(q, meta('u1', 'p1'), [Buffer.from('["p1"]\n'), Buffer.from('["p1b"]\n')]);
  const batch = await h.jsm.streams.getMessage(stream, { last_by_subj: `${stream}.b.${Buffer.from('client-1').toString('hex')}.u1.stores.p1` });
  await h.jsm.streams.deleteMessage(stream, batch.seq, false);
  let attempts = 0;
  const consumer = q.consume(async (pkg) => {
    attempts++;
    for await (const _ of pkg.batches());
  });
  t.teardown(() => consumer.stop());
  await drop;
  await consumer.stop(); // waits for the package in hand, whose ack follows the report
  t.equal(await q.pending('u1'), 0, 'dropped');
  t.equal(attempts, 1, 'once');
  t.match(errors, [/drop package p1 of session u1: its batches are gone/]);
  t.match(lost, { code: 'QUEUE_BATCH_LOST' });
});

t.test('NatsBatchQueue: a batch whose direct get answers on another subject is asked of the leader, not judged lost', async (t) => {
  const h = await connection(t);
  const stream = unique('MISLABELLED');
  t.teardown(() => h.jsm.streams.delete(stream).catch(() => {}));
  // Every direct get of a batch by sequence is answered as a damaged answer would be: the
  // right bytes under another subject (no server lets us damage one in flight). The stream's
  // leader (STREAM.MSG.GET, through `jsm`, not this connection) answers as it should.
  let mislabelled = 0;
  const request = h.nc.request.bind(h.nc);
  const nc = new Proxy(h.nc, {
    get(target, prop) {
      if (prop !== 'request') {
        const v = Reflect.get(target, prop, target) as unknown;
        return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
      }
      return async (subject: string, data?: Uint8Array, opts?: RequestOptions) => {
        const answer = await request(subject, data, opts);
        if (subject !== `$JS.API.DIRECT.GET.${stream}` || !answer.headers?.get('Nats-Subject')) return answer;
        mislabelled++;
        const real = answer.headers;
        return { data: answer.data, headers: { code: real.code, get: (k: string) => (k === 'Nats-Subject' ? `${stream}.b.damaged` : real.get(k)) } };
      };
    },
  });
  const errors: string[] = [];
  const q = await openQueue(t, { ...h, nc }, { ...queueOpts(stream), onError: (_err, what) => errors.push(what) });
  const counted = damagedReads.count;
  await commit(q, meta('u1', 'p1'), [Buffer.from('["p1"]\n'), Buffer.from('["p1b"]\n')]);
  const got = await drain(t, q, 1);
  t.equal(got.length, 1);
  t.equal(got[0]?.data.toString(), '["p1"]\n["p1b"]\n', 'read whole, from the leader');
  t.equal(got[0]?.attempt, 1, 'at the first delivery');
  t.ok(mislabelled >= 2, `the direct gets answered on another subject (${mislabelled})`);
  t.same(errors, [], 'nothing dropped or reported');
  t.equal(damagedReads.count - counted, mislabelled, 'each counted (ingest_nats_damaged_reads_total)');
  t.equal(await q.pending('u1'), 0);
});

t.test('NatsBatchQueue: a package read back unlike its commit (CRC-32) fails the read and is delivered again, not taken', async (t) => {
  const h = await connection(t);
  const stream = unique('GARBLED');
  t.teardown(() => h.jsm.streams.delete(stream).catch(() => {}));
  const q = await openQueue(t, h, queueOpts(stream));
  // A commit whose bytes are not those its checksum was taken of, as a transport that cut a
  // delivery short would hand it over: published as the writer would, but for its data.
  const m = meta('u1', 'p1');
  const rec = { meta: m, rows: 1, bytes: 7, batches: [], crc: crc32(Buffer.from('["p1"]\n')) };
  await h.js.publish(new QueueSubjects(stream).commit(packageTail(m)), Buffer.from('["p1"'), { headers: inlineCommitHeaders(encodeCommit(rec)), msgID: 'p1:commit' });
  const reads: { attempt: number; error: unknown }[] = [];
  const counted = damagedReads.count;
  let twice!: () => void;
  const again = new Promise<void>((resolve) => (twice = resolve));
  const consumer = q.consume(async (pkg) => {
    try {
      for await (const _ of pkg.batches());
      reads.push({ attempt: pkg.attempt, error: null });
    } catch (error) {
      reads.push({ attempt: pkg.attempt, error });
      throw error;
    } finally {
      if (reads.length === 2) twice();
    }
  });
  t.teardown(() => consumer.stop());
  await again;
  await consumer.stop();
  t.match(reads, [
    { attempt: 1, error: { code: 'STORE_CORRUPT', message: /Package p1 read back does not match its commit/ } },
    { attempt: 2, error: { code: 'STORE_CORRUPT' } },
  ]);
  t.equal(await q.pending('u1'), 1, 'still pending: never taken as read');
  t.equal(damagedReads.count - counted, reads.filter((r) => r.error).length, 'each read counted (ingest_nats_damaged_reads_total)');
});

t.test('NatsBatchQueue: a commit message that does not read as one is delivered again, and dropped only after ten deliveries', async (t) => {
  const h = await connection(t);
  const stream = unique('UNREADABLE');
  t.teardown(() => h.jsm.streams.delete(stream).catch(() => {}));
  const reports: { err: unknown; what: string }[] = [];
  let dropped!: () => void;
  const drop = new Promise<void>((resolve) => (dropped = resolve));
  const q = await openQueue(t, h, {
    ...queueOpts(stream),
    onError: (err, what) => {
      reports.push({ err, what });
      if (what.startsWith('drop')) dropped();
    },
  });
  // Bytes that are no commit, as a delivery damaged on its way would hand them over.
  await h.js.publish(new QueueSubjects(stream).commit(packageTail(meta('u1', 'p1'))), Buffer.from('{"meta":{"package_id":"p1"'), { msgID: 'p1:commit' });
  const counted = damagedReads.count;
  const handled: string[] = [];
  const consumer = q.consume(async (pkg) => {
    handled.push(pkg.meta.package_id);
  });
  t.teardown(() => consumer.stop());
  t.equal(await q.pending('u1'), 1, 'pending while it is delivered again');
  await drop;
  await consumer.stop();
  t.same(handled, [], 'never handed to the uploader');
  t.same(
    reports.map((r) => r.what.replace(/ [^ ]*UNREADABLE[^ ]* /, ' <subject> ')),
    [
      ...Array.from({ length: 9 }, (_, i) => `unreadable commit message <subject> (delivery ${i + 1}): delivered again`),
      'drop unreadable commit message <subject> after 10 deliveries',
    ],
  );
  t.equal(await q.pending('u1'), 0, 'dropped: pending no more');
  t.equal(damagedReads.count - counted, 10, 'each delivery counted (ingest_nats_damaged_reads_total)');
});

t.test('3-node cluster, R3: acknowledged writes survive the loss of the leader', async (t) => {
  const startedAt = Date.now();
  const cluster = await startNatsCluster(t, 3);
  t.comment(`cluster with JetStream ready in ${Date.now() - startedAt} ms`);
  const h = await connection(t, cluster.urls);
  const retryMs = 30_000;
  const store = await NatsSessionStore.open(h, { bucket: 'sessions', replicas: 3, retryMs });
  const guarded = await Promise.all(Array.from({ length: 3 }, async () => NatsSessionStore.open(await connection(t, cluster.urls), { bucket: 'sessions', replicas: 3, retryMs })));
  t.equal(await increments(guarded, 'counter', 120), 120, 'concurrent updates of one key on R3: every landed update counted once');
  const q = await openQueue(t, h, { ...queueOpts('INGEST'), replicas: 3, retryMs });
  t.equal((await h.jsm.streams.info('KV_sessions')).config.num_replicas, 3);
  t.equal((await h.jsm.streams.info('INGEST')).config.num_replicas, 3);
  // Unlike a single server (above), a cluster checks a re-sent compare-and-set's id first: the original acknowledgement.
  const resend = () => h.js.publish('$KV.sessions.resend', Buffer.from('x'), { msgID: 'resend-1', expect: { streamName: 'KV_sessions', lastSubjectSequence: 0 } });
  const original = await resend();
  t.match(await resend(), { seq: original.seq, duplicate: true }, 'a re-sent compare-and-set that landed: its duplicate acknowledgement (R3)');

  const revisions = new Map<string, number>();
  let packages = 0;
  /** One write of each kind; a bounded retry on top of the adapters' own while leadership moves. */
  const writeRound = async (i: number): Promise<void> => {
    for (let attempt = 1; ; attempt++) {
      try {
        const key = `session.k${i}`;
        const cur = revisions.get(key);
        const rev = cur === undefined ? await store.create(key, { i, v: 1 }) : await store.update(key, { i, v: 2 }, cur);
        revisions.set(key, rev);
        break;
      } catch (err) {
        if (isStoreConflict(err) || attempt === 3) throw err;
      }
    }
    const n = packages;
    await commit(q, meta('u-cluster', `p${n}`), [Buffer.from(`["${n}a"]\n`), Buffer.from(`["${n}b"]\n`)]);
    packages++;
  };

  for (let i = 0; i < 10; i++) await writeRound(i);
  const leaderOf = async (stream: string) => (await h.jsm.streams.info(stream)).cluster?.leader;
  const kvLeader = await leaderOf('KV_sessions');
  // The stronger case is one node leading both streams: step the queue's leader down (a few times at most) to get there.
  for (let n = 0; n < 6 && (await leaderOf('INGEST')) !== kvLeader; n++) {
    const before = await leaderOf('INGEST');
    await h.nc.request('$JS.API.STREAM.LEADER.STEPDOWN.INGEST', undefined, { timeout: 5000 });
    const deadline = Date.now() + 10_000;
    for (let l = await leaderOf('INGEST').catch(() => undefined); (!l || l === before) && Date.now() < deadline; l = await leaderOf('INGEST').catch(() => undefined)) {
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  const queueLeader = await leaderOf('INGEST');
  const victim = cluster.servers.find((s) => s.name === kvLeader)!;
  t.ok(victim, `KV leader is ${kvLeader}, queue leader ${queueLeader}`);
  await victim.kill();
  const killedAt = Date.now();
  await writeRound(10);
  t.comment(`first round of writes after killing ${victim.name} took ${Date.now() - killedAt} ms`);
  for (let i = 11; i < 20; i++) await writeRound(i);
  t.comment(`10 rounds of writes after killing ${victim.name} took ${Date.now() - killedAt} ms`);
  for (let i = 0; i < 10; i++) await writeRound(i); // updates of the keys written before the kill

  for (let i = 0; i < 20; i++) {
    const got = await store.get<{ i: number; v: number }>(`session.k${i}`);
    t.same(got, { value: { i, v: i < 10 ? 2 : 1 }, revision: revisions.get(`session.k${i}`) }, `k${i}`);
  }
  t.not((await h.jsm.streams.info('KV_sessions')).cluster?.leader, victim.name, 'a new KV leader');
  t.equal(await q.pending('u-cluster'), packages, 'every committed package is pending');
  const drainedAt = Date.now();
  const got = await drain(t, q, packages, 60_000);
  t.comment(`${packages} packages consumed in ${Date.now() - drainedAt} ms`);
  const byId = new Map(got.map((d) => [d.meta.package_id, d.data.toString()]));
  t.equal(byId.size, 30);
  t.ok(
    [...byId].every(([id, data]) => data === `["${id.slice(1)}a"]\n["${id.slice(1)}b"]\n`),
    'every package with its batches, in order',
  );
  t.equal(await q.pending('u-cluster'), 0);
});

/**
 * A process slow between a look at a stream and what it does next: `h`'s JetStream API
 * requests on `api` (`STREAM.CREATE`, `STREAM.UPDATE`) wait until `release` is called; `held`
 * resolves when the first one is waiting.
 */
function holdRequests(h: NatsHandle, api: string): { held: Promise<void>; release: () => void } {
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  let holding!: () => void;
  const held = new Promise<void>((resolve) => (holding = resolve));
  const request = h.nc.request.bind(h.nc);
  h.nc.request = async (subject, data, opts) => {
    if (subject.startsWith(`$JS.API.${api}.`)) {
      holding();
      await gate;
    }
    return request(subject, data, opts);
  };
  return { held, release };
}

const openers = {
  sessions: (h: NatsHandle, name: string) => NatsSessionStore.open(h, { bucket: name, replicas: 1 }),
  ledger: (h: NatsHandle, name: string) => NatsLedger.open(h, { bucket: name, replicas: 1 }),
  queue: (h: NatsHandle, name: string) => NatsBatchQueue.open(h, queueOpts(name)),
};

t.test('a process that found no stream and makes it after another made and changed it opens it', async (t) => {
  // Two gateways started at once on an empty server: CI saw the second refuse to start.
  for (const [what, open] of Object.entries(openers)) {
    const name = unique(`late_${what}`);
    const slow = await connection(t);
    const { held, release } = holdRequests(slow, 'STREAM.CREATE');
    const late = open(slow, name);
    await held;
    await (await open(await connection(t), name)).close();
    release();
    const opened = await late.then(
      (o) => o.close().then(() => 'opened'),
      (err: unknown) => String(err),
    );
    t.equal(opened, 'opened', what);
  }
});

t.test('a change of a stream on a stale read keeps what another process turned on', async (t) => {
  // The uploader opens the ledger without the session store, a gateway with it (and reads it by direct get).
  const sessions = await NatsSessionStore.open(await connection(t), { bucket: unique('stale_sessions'), replicas: 1 });
  t.teardown(() => sessions.close());
  const bucket = unique('stale_ledger');
  const first = await connection(t);
  await (await NatsLedger.open(first, { bucket, replicas: 1 })).close();
  await first.jsm.streams.update(`KV_${bucket}`, { ...(await first.jsm.streams.info(`KV_${bucket}`)).config, allow_direct: false, allow_atomic: false } as StreamConfig);
  const slow = await connection(t);
  const { held, release } = holdRequests(slow, 'STREAM.UPDATE');
  const late = NatsLedger.open(slow, { bucket, replicas: 1 });
  await held;
  const gateway = await NatsLedger.open(await connection(t), { bucket, replicas: 1, sessions });
  release();
  await (await late).close();
  await gateway.close();
  const { config } = await first.jsm.streams.info(`KV_${bucket}`);
  t.ok(config.allow_direct, 'direct get stays on');
  t.ok((config as { allow_atomic?: boolean }).allow_atomic, 'atomic batches stay on');
});

t.test('an account whose JetStream quota is full: a write past it is STORE_UNAVAILABLE (503), never a 500', async (t) => {
  // As a hosted or multi-tenant NATS limits an account (the shipped server limits itself instead, max_file_store).
  const limited = await startNats(t, { accountMaxFile: '3MB' });
  const h = await connection(t, limited.url);
  const q = await openQueue(t, h, queueOpts(unique('QUEUE')));
  const sessions = await NatsSessionStore.open(h, { bucket: unique('sessions'), replicas: 1 });
  t.teardown(() => sessions.close());
  const batch = new Uint8Array(300 * 1024).fill(65);
  let refused: unknown;
  for (let i = 0; i < 20 && refused === undefined; i++) await commit(q, meta('u-1', `p${i}`), [batch, batch]).catch((err: unknown) => (refused = err));
  t.match(refused, { code: 'STORE_UNAVAILABLE', cause: { api_error: { err_code: 10002 } } }, "the queue's write past the quota");
  t.equal(asServiceError(refused).statusCode, 503);
  const write = await sessions.create('k', { pad: 'x'.repeat(200 * 1024) }).catch((err: unknown) => err);
  t.match(write, { code: 'STORE_UNAVAILABLE' }, "the session store's write too");
});

t.test("NatsLedger: a listing whose NATS stops answering once the watch is made ends STORE_UNAVAILABLE (503), it does not wait for NATS", async (t) => {
  const proxy = await freezingProxy(t, server.url);
  const h = await connection(t, proxy.url);
  const bucket = unique('ledger');
  const ledger = await NatsLedger.open(h, { bucket, replicas: 1, retryMs: 1000 });
  // Enough that they do not all pass the proxy ahead of the consumer's reply (seen with 20, once).
  const ENTRIES = 200;
  await ledger.append('u-1', Array.from({ length: ENTRIES }, (_, i) => entry(`p-${i}`)));
  // The watch's consumer is made, then nothing: its entries never come.
  proxy.arm(new RegExp(`^\\$JS\\.API\\.CONSUMER\\.CREATE\\.KV_${bucket}\\b`));
  const listed: string[] = [];
  const ended = await (async () => {
    for await (const e of ledger.list('u-1')) listed.push(e.package_id);
  })().then(
    () => 'listed',
    (err: unknown) => err,
  );
  await proxy.frozen;
  // Entries the server sent ahead of the consumer's reply pass the proxy before it freezes
  // (seen: 9 of 20): the listing still fails rather than end as if complete. Only with every
  // one of them there is it complete.
  if (ended === 'listed') t.equal(listed.length, ENTRIES, 'ended without an error only with every entry');
  else {
    t.match(ended, { code: 'STORE_UNAVAILABLE' });
    t.equal(asServiceError(ended).statusCode, 503);
  }
  t.same(listed, Array.from({ length: listed.length }, (_, i) => `p-${i}`), 'what came before the freeze came in order, once');
});
