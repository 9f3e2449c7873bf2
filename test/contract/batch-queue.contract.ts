import type { Test } from 'tap';
import type { BatchQueue, CommittedPackage, PackageMeta } from '../../src/store/ports.js';

/**
 * As in session-store.contract.ts: a fresh empty queue; `reopen` a second instance over the
 * same data (the first may still be open, as after a crash). Configure a redelivery delay of
 * a few milliseconds: the suite waits for redeliveries.
 */
export type BatchQueueFactory = () => Promise<{
  store: BatchQueue;
  reopen?: () => Promise<BatchQueue>;
  cleanup: () => Promise<void>;
}>;

interface Delivery {
  meta: PackageMeta;
  rows: number;
  bytes: number;
  attempt: number;
  batches: string[];
}

function meta(upload_uuid: string, package_id: string): PackageMeta {
  return { package_id, upload_uuid, client_id: 'client-1', entity: 'stores', columns: ['store_id', 'name'] };
}

function rowsOf(batches: string[]): { rows: number; bytes: number } {
  return {
    rows: batches.join('').split('\n').filter(Boolean).length,
    bytes: batches.reduce((n, b) => n + Buffer.byteLength(b), 0),
  };
}

async function commit(q: BatchQueue, m: PackageMeta, batches: string[]): Promise<void> {
  const w = await q.open(m);
  for (const b of batches) await w.append(Buffer.from(b));
  await w.commit(rowsOf(batches));
}

/** A latch: `wait()` resolves once `open()` is called. */
function latch(): { wait: Promise<void>; open: () => void } {
  let open!: () => void;
  const wait = new Promise<void>((resolve) => (open = resolve));
  return { wait, open };
}

/**
 * Consumes `q`, recording every delivery (with its batches read) before `behave` runs; a
 * throwing `behave` makes the handler throw. `next()` resolves with the deliveries in order.
 */
function record(t: Test, q: BatchQueue, behave?: (d: Delivery, index: number) => unknown) {
  const seen: Delivery[] = [];
  const wanted = new Map<number, (d: Delivery) => void>();
  let taken = 0;
  const consumer = q.consume(async (pkg: CommittedPackage) => {
    const batches: string[] = [];
    for await (const b of pkg.batches()) batches.push(Buffer.from(b).toString('utf8'));
    const d: Delivery = { meta: pkg.meta, rows: pkg.rows, bytes: pkg.bytes, attempt: pkg.attempt, batches };
    const index = seen.push(d) - 1;
    wanted.get(index)?.(d);
    await behave?.(d, index);
  });
  let stopped: Promise<void> | undefined;
  const stop = (): Promise<void> => (stopped ??= consumer.stop());
  t.teardown(stop);
  return {
    seen,
    stop,
    next(): Promise<Delivery> {
      const index = taken++;
      const d = seen[index];
      return d ? Promise.resolve(d) : new Promise((resolve) => wanted.set(index, resolve));
    },
  };
}

/** The `BatchQueue` contract: invisible until commit, at-least-once with ack, pending, purge, durability. */
export function batchQueueContract(t: Test, name: string, factory: BatchQueueFactory): void {
  const setup = async (t: Test) => {
    const f = await factory();
    const opened = new Set([f.store]);
    t.teardown(async () => {
      for (const s of opened) await s.close();
      await f.cleanup();
    });
    const reopen = f.reopen;
    return {
      q: f.store,
      /** Another instance over the same data; the old one is left as it is. */
      reopen:
        reopen &&
        (async () => {
          const s = await reopen();
          opened.add(s);
          return s;
        }),
      close: async (q: BatchQueue) => {
        opened.delete(q);
        await q.close();
      },
    };
  };

  t.test(`${name}: a package is invisible until committed; batches keep their order`, async (t) => {
    const { q } = await setup(t);
    const rec = record(t, q);
    const a = await q.open(meta('u1', 'pkg-a'));
    await a.append(Buffer.from('["a1","x"]\n'));
    await a.append(Buffer.from('["a2","x"]\n["a3","x"]\n'));
    t.equal(await q.pending('u1'), 0, 'appended but not committed: not pending');
    t.equal(await q.hasPending('u1'), false, 'nor for hasPending');
    await commit(q, meta('u1', 'pkg-c'), ['["c1","x"]\n']);
    t.equal((await rec.next()).meta.package_id, 'pkg-c', 'the uncommitted older package was not delivered');
    await a.append(Buffer.from('["a4","x"]\n'));
    const batches = ['["a1","x"]\n', '["a2","x"]\n["a3","x"]\n', '["a4","x"]\n'];
    await a.commit(rowsOf(batches));
    t.same(await rec.next(), { meta: meta('u1', 'pkg-a'), ...rowsOf(batches), attempt: 1, batches });
    await commit(q, meta('u1', 'pkg-empty'), []);
    t.same(await rec.next(), { meta: meta('u1', 'pkg-empty'), rows: 0, bytes: 0, attempt: 1, batches: [] }, 'an empty package');
    await rec.stop();
    t.equal(await q.pending('u1'), 0, 'acked');
  });

  t.test(`${name}: a batch of one row longer than a NATS message may be (2.5 MiB) is committed and read back whole`, async (t) => {
    const { q } = await setup(t);
    const rec = record(t, q);
    const batches = ['["a1","x"]\n', `["a2","${'y'.repeat(2.5 * 1024 * 1024)}"]\n`, '["a3","x"]\n'];
    await commit(q, meta('u1', 'pkg-long'), batches);
    const got = await rec.next();
    t.equal(got.meta.package_id, 'pkg-long');
    t.equal(got.batches.join(''), batches.join(''), 'the same bytes, in order');
    await rec.stop();
  });

  t.test(`${name}: batches({ reuse: true }), each chunk read before the next, gives the same bytes`, async (t) => {
    const { q } = await setup(t);
    // Sizes that shrink and grow, so a shared buffer would show any stale or cut bytes.
    const batches = ['["s","x"]\n', `${'["long","y"]\n'.repeat(40)}`, '["m","zz"]\n["n","zz"]\n', '["t","x"]\n'];
    let delivered!: (read: string[]) => void;
    const firstDelivery = new Promise<string[]>((resolve) => (delivered = resolve));
    const consumer = q.consume(async (pkg) => {
      const read: string[] = [];
      for await (const b of pkg.batches({ reuse: true })) read.push(Buffer.from(b).toString('utf8'));
      delivered(read);
    });
    t.teardown(() => consumer.stop());
    await commit(q, meta('u1', 'pkg-r'), batches);
    t.same(await firstDelivery, batches);
  });

  t.test(`${name}: a closed queue refuses new packages`, async (t) => {
    const { q, close } = await setup(t);
    await close(q);
    await t.rejects(q.open(meta('u1', 'pkg-a')), { code: 'STORE_CLOSED' });
  });

  t.test(`${name}: abort leaves nothing`, async (t) => {
    const { q } = await setup(t);
    const w = await q.open(meta('u1', 'pkg-a'));
    await w.append(Buffer.from('["a1"]\n'));
    await w.abort();
    await t.resolves(w.abort(), 'abort twice');
    await t.rejects(w.append(Buffer.from('["a2"]\n')), { code: 'QUEUE_PACKAGE_DROPPED' }, 'no append after abort');
    await t.rejects(w.commit({ rows: 1, bytes: 7 }), { code: 'QUEUE_PACKAGE_DROPPED' }, 'no commit after abort');
    t.equal(await q.pending('u1'), 0);
    await commit(q, meta('u1', 'pkg-b'), ['["b1"]\n']);
    const rec = record(t, q);
    t.equal((await rec.next()).meta.package_id, 'pkg-b');
    await rec.stop();
    t.equal(rec.seen.length, 1, 'only the committed package was delivered');
    t.equal(await q.pending('u1'), 0);
  });

  t.test(`${name}: pending counts committed packages until acked, the one in hand included; hasPending says whether any is`, async (t) => {
    const { q } = await setup(t);
    for (const id of ['p1', 'p2', 'p3']) await commit(q, meta('u1', id), [`["${id}"]\n`]);
    await commit(q, meta('u2', 'q1'), ['["q1"]\n']);
    t.equal(await q.pending('u1'), 3);
    t.equal(await q.pending('u2'), 1);
    t.equal(await q.pending('u3'), 0);
    t.same(await Promise.all(['u1', 'u2', 'u3'].map((u) => q.hasPending(u))), [true, true, false]);
    const gate = latch();
    const rec = record(t, q, (_d, i) => (i === 0 ? gate.wait : undefined));
    t.equal((await rec.next()).meta.package_id, 'p1', 'oldest first');
    t.equal(await q.pending('u1'), 3, 'the package in the handler is still pending');
    t.equal(await q.hasPending('u1'), true);
    gate.open();
    const order = [(await rec.next()).meta.package_id, (await rec.next()).meta.package_id, (await rec.next()).meta.package_id];
    t.same(order, ['p2', 'p3', 'q1'], 'commit order');
    await rec.stop();
    t.equal(await q.pending('u1'), 0);
    t.equal(await q.pending('u2'), 0);
    t.same(await Promise.all(['u1', 'u2'].map((u) => q.hasPending(u))), [false, false], 'none once all are acked');
  });

  t.test(`${name}: hasPending with \`stored\` does not count a package it says is stored, and asks only about packages it would count`, async (t) => {
    const { q } = await setup(t);
    for (const id of ['p1', 'p2']) await commit(q, meta('u1', id), [`["${id}"]\n`]);
    await commit(q, meta('u2', 'q1'), ['["q1"]\n']);
    const asked: string[] = [];
    const storedOnly = (ids: string[]) => async (id: string) => {
      asked.push(id);
      return ids.includes(id);
    };
    t.equal(await q.hasPending('u1', { stored: storedOnly(['p1']) }), true, 'p2 is not stored');
    t.same(asked, ['p1', 'p2'], "asked about the session's packages only, oldest first, until one is not stored");
    asked.length = 0;
    t.equal(await q.hasPending('u1', { stored: storedOnly(['p1', 'p2']) }), false, 'both stored: nothing pending, though neither is acked');
    t.equal(await q.hasPending('u1'), true, 'without `stored` both are');
    t.equal(await q.hasPending('u2', { stored: storedOnly(['p1', 'p2']) }), true, "another session's package is its own");
    asked.length = 0;
    t.equal(await q.hasPending('u3', { stored: storedOnly([]) }), false, 'a session with nothing committed');
    t.same(asked, [], 'is not asked about');
    const rec = record(t, q);
    await rec.next();
    await rec.next();
    await rec.next();
    await rec.stop();
    asked.length = 0;
    t.equal(await q.hasPending('u1', { stored: storedOnly([]) }), false, 'acked: not pending, whatever `stored` would say');
    t.same(asked, [], 'and not asked about');
  });

  t.test(`${name}: backlog counts every session's committed packages until acked, with the oldest one's age`, async (t) => {
    const { q } = await setup(t);
    t.same(await q.backlog(), { packages: 0, oldestAgeMs: null }, 'empty');
    const open = await q.open(meta('u9', 'uncommitted'));
    await open.append(Buffer.from('["x"]\n'));
    t.same(await q.backlog(), { packages: 0, oldestAgeMs: null }, 'an uncommitted package is not backlog');
    await commit(q, meta('u1', 'p1'), ['["p1"]\n']);
    await commit(q, meta('u2', 'q1'), ['["q1"]\n']);
    const two = await q.backlog();
    t.equal(two.packages, 2);
    t.ok(typeof two.oldestAgeMs === 'number' && two.oldestAgeMs >= 0 && two.oldestAgeMs < 60_000, `oldest age ${two.oldestAgeMs} ms`);
    const gate = latch();
    const rec = record(t, q, (_d, i) => (i === 0 ? gate.wait : undefined));
    await rec.next();
    t.equal((await q.backlog()).packages, 2, 'the package in the handler still counts');
    gate.open();
    await rec.next();
    await rec.stop();
    t.same(await q.backlog(), { packages: 0, oldestAgeMs: null }, 'acked');
    await open.abort();
  });

  t.test(`${name}: stop waits for the package in hand`, async (t) => {
    const { q } = await setup(t);
    await commit(q, meta('u1', 'p1'), ['["p1"]\n']);
    const gate = latch();
    let finished = false;
    const rec = record(t, q, async () => {
      await gate.wait;
      finished = true;
    });
    await rec.next();
    const stopping = rec.stop();
    gate.open();
    await stopping;
    t.ok(finished, 'handler finished before stop resolved');
    t.equal(await q.pending('u1'), 0, 'and was acked');
  });

  t.test(`${name}: a throwing handler gets the package again with attempt + 1`, async (t) => {
    const { q } = await setup(t);
    await commit(q, meta('u1', 'flaky'), ['["f1"]\n', '["f2"]\n']);
    await commit(q, meta('u1', 'fine'), ['["ok"]\n']);
    const rec = record(t, q, (d) => {
      if (d.meta.package_id === 'flaky' && d.attempt < 3) throw new Error('upload failed');
    });
    const got = [await rec.next(), await rec.next(), await rec.next(), await rec.next()];
    const flaky = got.filter((d) => d.meta.package_id === 'flaky');
    t.same(flaky.map((d) => d.attempt), [1, 2, 3], 'attempts count up');
    t.ok(flaky.every((d) => d.batches.join('') === '["f1"]\n["f2"]\n'), 'same batches every time');
    t.same(got.filter((d) => d.meta.package_id === 'fine').map((d) => d.attempt), [1], 'others are not held up');
    await rec.stop();
    t.equal(rec.seen.length, 4, 'acked after success, not delivered again');
    t.equal(await q.pending('u1'), 0);
  });

  t.test(`${name}: several consumers share the work, each package once`, async (t) => {
    const { q } = await setup(t);
    const ids = Array.from({ length: 8 }, (_, i) => `p${i}`);
    for (const id of ids) await commit(q, meta('u1', id), [`["${id}"]\n`]);
    const a = record(t, q);
    const b = record(t, q);
    const all: string[] = [];
    await new Promise<void>((resolve) => {
      const take = (r: typeof a): void => {
        void r.next().then((d) => {
          all.push(d.meta.package_id);
          if (all.length === ids.length) resolve();
          else take(r);
        });
      };
      take(a);
      take(b);
    });
    await Promise.all([a.stop(), b.stop()]);
    t.same([...all].sort(), ids, 'every package exactly once');
    t.equal(a.seen.length + b.seen.length, ids.length);
    t.equal(await q.pending('u1'), 0);
  });

  t.test(`${name}: purge drops the session's packages, committed or not`, async (t) => {
    const { q } = await setup(t);
    await commit(q, meta('u1', 'p1'), ['["p1"]\n']);
    await commit(q, meta('u1', 'p2'), ['["p2"]\n']);
    await commit(q, meta('u2', 'q1'), ['["q1"]\n']);
    const open = await q.open(meta('u1', 'p3'));
    await open.append(Buffer.from('["p3"]\n'));
    await q.purge('u1');
    t.equal(await q.pending('u1'), 0);
    t.equal(await q.pending('u2'), 1, 'other sessions keep theirs');
    await open.abort().catch(() => {});
    await t.resolves(q.purge('u-none'), 'purging an unknown session');
    const rec = record(t, q);
    t.equal((await rec.next()).meta.package_id, 'q1');
    await commit(q, meta('u2', 'q2'), ['["q2"]\n']);
    t.equal((await rec.next()).meta.package_id, 'q2');
    await rec.stop();
    t.same(rec.seen.map((d) => d.meta.upload_uuid), ['u2', 'u2'], 'nothing of the purged session delivered');
  });

  t.test(`${name}: a package purged while in the handler is not redelivered`, async (t) => {
    const { q } = await setup(t);
    await commit(q, meta('u1', 'p1'), ['["p1"]\n']);
    const gate = latch();
    const rec = record(t, q, async (d) => {
      if (d.meta.upload_uuid !== 'u1') return;
      await gate.wait;
      throw new Error('the session was deleted under us');
    });
    await rec.next();
    t.equal(await q.pending('u1'), 1);
    await q.purge('u1');
    t.equal(await q.pending('u1'), 0, 'purged at once, even while in hand');
    gate.open();
    await commit(q, meta('u2', 'marker'), ['["m"]\n']);
    t.equal((await rec.next()).meta.package_id, 'marker');
    await rec.stop();
    t.equal(await q.pending('u1'), 0);
    t.equal(rec.seen.filter((d) => d.meta.upload_uuid === 'u1').length, 1, 'delivered once');
  });

  t.test(`${name}: durable across a reopen`, async (t) => {
    const { q, reopen, close } = await setup(t);
    if (!reopen) return t.plan(0, 'adapter has no reopen');
    await commit(q, meta('u1', 'p1'), ['["p1a"]\n', '["p1b"]\n']);
    await commit(q, meta('u1', 'p2'), ['["p2"]\n']);
    const loose = await q.open(meta('u1', 'p3'));
    await loose.append(Buffer.from('["p3"]\n'));
    // No close: a crash leaves the writer as it is.
    const q2 = await reopen();
    t.equal(await q2.pending('u1'), 2, 'committed packages survive, the uncommitted one is gone');
    const rec = record(t, q2);
    t.same(await rec.next(), {
      meta: meta('u1', 'p1'),
      ...rowsOf(['["p1a"]\n', '["p1b"]\n']),
      attempt: 1,
      batches: ['["p1a"]\n', '["p1b"]\n'],
    });
    t.equal((await rec.next()).meta.package_id, 'p2');
    await rec.stop();
    t.equal(await q2.pending('u1'), 0);
    await close(q);
    await close(q2);
    const q3 = await reopen();
    t.equal(await q3.pending('u1'), 0, 'acked packages stay acked');
  });
}
