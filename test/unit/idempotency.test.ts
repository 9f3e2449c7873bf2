/** The `Idempotency-Key` ledger on a real (file) session store, with a controlled clock and a stub session service. */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { isServiceError } from '../../src/errors.js';
import { forgetSessionRecords, IdempotentIngests, parseIdempotencyKey, type Claim, type IdempotencyOptions, type RequestFingerprint } from '../../src/session/idempotency.js';
import type { PackageEntry } from '../../src/session/state.js';
import { SqliteSessionStore } from '../../src/store/embedded/session-store.js';
import { idempotencyKey, idempotencyPrefix } from '../../src/store/keys.js';
import type { SessionStore } from '../../src/store/ports.js';

const client = { id: 'acme', minDate: '2020-01-01' };
const fp: RequestFingerprint = { upload_uuid: 'u-1', entity: 'products', content_length: 120 };
const ok200 = { status: 200, body: { status: 'success', message: '2 rows of products validated and queued for storage', rows_processed: 2 } };

interface Rig {
  sessions: SessionStore;
  clock: { now: number };
  /** Package ids each settleAttempts call got, and what the next call answers. */
  settled: string[][];
  recorded: PackageEntry | null;
  /** Sessions `sessionDeleted` answers true for. */
  deleted: Set<string>;
  ledger(opts?: Partial<IdempotencyOptions>): IdempotentIngests;
}

async function rig(t: Test): Promise<Rig> {
  const dir = await mkdtemp(join(tmpdir(), 'ingest-idem-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const sessions = await SqliteSessionStore.open(join(dir, 'state.sqlite'));
  t.teardown(() => sessions.close());
  const r: Rig = {
    sessions,
    clock: { now: 1_700_000_000_000 },
    settled: [],
    recorded: null,
    deleted: new Set(),
    ledger: (opts = {}) =>
      new IdempotentIngests({
        sessions,
        service: {
          settleAttempts: async (_client, _uuid, ids) => {
            r.settled.push([...ids]);
            return r.recorded;
          },
          sessionDeleted: async (uuid) => r.deleted.has(uuid),
        },
        ttlMs: 86_400_000,
        leaseMs: 60_000,
        waitMs: 0,
        clock: () => r.clock.now,
        ...opts,
      }),
  };
  return r;
}

function run(t: Test, claim: Claim) {
  if (claim.kind !== 'run') throw new Error(`expected to run, got ${claim.kind}`);
  t.teardown(() => claim.attempt.release(false)); // stops the renewal timer of a claim a test leaves held
  return claim.attempt;
}

const code = (err: unknown) => (isServiceError(err) ? err.code : err);

t.test('the header: 1 to 255 visible ASCII characters', async (t) => {
  t.equal(parseIdempotencyKey(undefined), null, 'absent: no key');
  for (const good of ['a', '0f8c1d6e-0d1b-4b8e-9f1e-3c0b5a6d7e8f', '!~'.repeat(127) + 'x', 'pkg:2024/01#7']) t.equal(parseIdempotencyKey(good), good);
  for (const bad of ['', 'a b', 'x'.repeat(256), 'é', 'a\tb', '\x7f']) {
    t.throws(() => parseIdempotencyKey(bad), { code: 'IDEMPOTENCY_KEY_INVALID', statusCode: 400 }, JSON.stringify(bad));
  }
});

t.test('a finished request is replayed; a different request under the key is refused', async (t) => {
  const r = await rig(t);
  const ledger = r.ledger();
  t.equal(await ledger.replay(client, 'k1', fp), null, 'nothing yet');
  const attempt = run(t, await ledger.claim(client, 'k1', fp, 'p-1'));
  t.equal(attempt.packageId, 'p-1');
  t.equal(await ledger.replay(client, 'k1', fp), null, 'in progress: no answer to replay');
  await attempt.finish(ok200);
  t.same(await ledger.replay(client, 'k1', fp), ok200);
  t.same(await ledger.replay(client, 'k1', { ...fp, content_length: null }), ok200, 'a chunked repeat matches');
  t.same(await ledger.claim(client, 'k1', fp, 'p-2'), { kind: 'answer', answer: ok200 });
  for (const other of [{ ...fp, entity: 'stores' }, { ...fp, upload_uuid: 'u-2' }, { ...fp, content_length: 121 }]) {
    await t.rejects(ledger.replay(client, 'k1', other), { code: 'IDEMPOTENCY_KEY_REUSED', statusCode: 422 });
    await t.rejects(ledger.claim(client, 'k1', other, 'p-3'), { code: 'IDEMPOTENCY_KEY_REUSED' });
  }
  t.equal(await ledger.replay({ ...client, id: 'other' }, 'k1', fp), null, 'keys are per client');
  const rec = await r.sessions.get<any>(idempotencyKey('acme', 'k1'));
  t.match(rec?.value, { state: 'done', status: 200, package_id: 'p-1', upload_uuid: 'u-1', entity: 'products', content_length: 120 });
});

t.test("a key of a deleted session is free while its record waits for the delete's clean-up: not replayed, claimed again for another session", async (t) => {
  const r = await rig(t);
  const ledger = r.ledger();
  await run(t, await ledger.claim(client, 'k1', fp, 'p-1')).finish(ok200);
  const next = { ...fp, upload_uuid: 'u-2' };
  await t.rejects(ledger.claim(client, 'k1', next, 'p-2'), { code: 'IDEMPOTENCY_KEY_REUSED' }, 'while u-1 lives: another request');
  r.deleted.add('u-1');
  t.equal(await ledger.replay(client, 'k1', fp), null, 'the same request: checked as new (its session checks answer)');
  t.equal(await ledger.replay(client, 'k1', next), null, 'in the next session: no replay, no reuse refusal');
  const attempt = run(t, await ledger.claim(client, 'k1', next, 'p-2'));
  t.equal(attempt.packageId, 'p-2', 'claimed for the new session');
  t.same(r.settled, [], 'nothing of the deleted session is settled');
  await attempt.finish(ok200);
  t.match((await r.sessions.get<any>(idempotencyKey('acme', 'k1')))?.value, { state: 'done', upload_uuid: 'u-2', package_id: 'p-2' });
});

t.test('answers expire after ttlMs; the key then runs again', async (t) => {
  const r = await rig(t);
  const ledger = r.ledger({ ttlMs: 1000 });
  await run(t, await ledger.claim(client, 'k', fp, 'p-1')).finish({ status: 422, body: { detail: 'Invalid JSON format.' } });
  r.clock.now += 999;
  t.same(await ledger.replay(client, 'k', fp), { status: 422, body: { detail: 'Invalid JSON format.' } });
  r.clock.now += 1;
  t.equal(await ledger.replay(client, 'k', { ...fp, entity: 'stores' }), null, 'expired: neither replayed nor compared');
  const again = run(t, await ledger.claim(client, 'k', { ...fp, entity: 'stores' }, 'p-2'));
  t.equal(again.packageId, 'p-2', 'the expired record is overwritten');
});

t.test('a repeat waits for the attempt in progress, up to waitMs', async (t) => {
  const r = await rig(t);
  const first = run(t, await r.ledger().claim(client, 'k', fp, 'p-1'));
  const err = await r.ledger({ waitMs: 30 }).claim(client, 'k', fp, 'p-2').catch((e: unknown) => e);
  t.equal(code(err), 'IDEMPOTENCY_KEY_IN_PROGRESS');
  t.same(isServiceError(err) && [err.statusCode, err.body, err.headers], [409, { detail: 'A request with this Idempotency-Key is in progress' }, { 'Retry-After': '1' }]);

  const gone = new AbortController();
  const abandoned = r.ledger({ waitMs: 10_000 }).claim(client, 'k', fp, 'p-4', gone.signal);
  gone.abort();
  await t.rejects(abandoned, { name: 'AbortError' }, 'a repeat whose client went away stops waiting');

  const waiting = r.ledger({ waitMs: 10_000 }).claim(client, 'k', fp, 'p-3');
  await first.finish(ok200);
  t.same(await waiting, { kind: 'answer', answer: ok200 }, 'the waiter gets the first answer');
});

t.test('release without a recorded package frees the key; a waiter then runs', async (t) => {
  const r = await rig(t);
  const first = run(t, await r.ledger().claim(client, 'k', fp, 'p-1'));
  const waiting = r.ledger({ waitMs: 10_000 }).claim(client, 'k', fp, 'p-2');
  await first.release(false);
  const second = run(t, await waiting);
  t.equal(second.packageId, 'p-2');
  t.same(r.settled, [], 'nothing to settle: the first attempt was never recorded');
});

t.test('release with a package that may be recorded: the retry settles it first', async (t) => {
  const r = await rig(t);
  const ledger = r.ledger();
  await run(t, await ledger.claim(client, 'k', fp, 'p-1')).release(true);
  t.match((await r.sessions.get<any>(idempotencyKey('acme', 'k')))?.value, { state: 'pending', attempts: ['p-1'], lease_until: 0 });

  r.recorded = { id: 'p-1', entity: 'products', rows: 2, bytes: 40, object_bytes: 140 };
  const claim = await ledger.claim(client, 'k', fp, 'p-2');
  t.same(r.settled, [['p-1']]);
  if (claim.kind !== 'recovered') throw new Error(`expected recovered, got ${claim.kind}`);
  t.same(claim.recorded, r.recorded, 'the recorded package is the answer');
  await claim.attempt.finish(ok200, claim.recorded.id);
  t.match((await r.sessions.get<any>(idempotencyKey('acme', 'k')))?.value, { state: 'done', package_id: 'p-1' });
});

t.test('a crashed instance: its claim is taken over after the lease; the zombie writes nothing', async (t) => {
  const r = await rig(t);
  const dead = run(t, await r.ledger().claim(client, 'k', fp, 'p-1'));
  const other = r.ledger({ waitMs: 0 });
  await t.rejects(other.claim(client, 'k', fp, 'p-2'), { code: 'IDEMPOTENCY_KEY_IN_PROGRESS' }, 'lease live');
  r.clock.now += 60_001;
  const taker = run(t, await other.claim(client, 'k', fp, 'p-2'));
  t.same(r.settled, [['p-1']], 'the dead attempt is settled (fenced) before the retry runs');
  t.match((await r.sessions.get<any>(idempotencyKey('acme', 'k')))?.value, { attempts: ['p-2', 'p-1'] });
  await dead.finish(ok200);
  t.match((await r.sessions.get<any>(idempotencyKey('acme', 'k')))?.value, { state: 'pending', attempts: ['p-2', 'p-1'] }, 'the zombie lost the key');
  await taker.release(false);
  t.equal(await r.sessions.get(idempotencyKey('acme', 'k')), null, 'settled and not recorded: nothing left to remember');
});

t.test('a takeover that cannot settle keeps the earlier attempts for the next retry', async (t) => {
  const r = await rig(t);
  await run(t, await r.ledger().claim(client, 'k', fp, 'p-1')).release(true);
  const failing = new IdempotentIngests({
    sessions: r.sessions,
    service: { settleAttempts: async () => Promise.reject(new Error('store down')), sessionDeleted: async () => false },
    ttlMs: 86_400_000,
    leaseMs: 60_000,
    waitMs: 0,
    clock: () => r.clock.now,
  });
  await t.rejects(failing.claim(client, 'k', fp, 'p-2'), /store down/);
  t.match((await r.sessions.get<any>(idempotencyKey('acme', 'k')))?.value, { state: 'pending', attempts: ['p-1'], lease_until: 0 });
});

t.test('single instance (embedded): a claim of a previous process is taken over at once', async (t) => {
  const r = await rig(t);
  run(t, await r.ledger({ singleInstance: true }).claim(client, 'k', fp, 'p-1'));
  const restarted = r.ledger({ singleInstance: true });
  const taker = run(t, await restarted.claim(client, 'k', fp, 'p-2'));
  t.equal(taker.packageId, 'p-2');
  t.same(r.settled, [['p-1']]);
});

t.test('a running attempt renews its lease', async (t) => {
  const r = await rig(t);
  const key = idempotencyKey('acme', 'k');
  // The store, telling of each write of the claim once it is done: a renewal is one.
  let written: () => void = () => {};
  const store = r.sessions;
  const sessions: SessionStore = {
    capabilities: store.capabilities,
    get: (k) => store.get(k),
    getConfirmed: (k) => store.getConfirmed(k),
    create: (k, value) => store.create(k, value),
    delete: (k, revision) => store.delete(k, revision),
    list: (prefix) => store.list(prefix),
    keys: (prefix) => store.keys(prefix),
    close: () => store.close(),
    update: async (k, value, revision) => {
      const next = await store.update(k, value, revision);
      if (k === key) written();
      return next;
    },
  };
  // The renewal timer is unref'd: the deadline's timer keeps the process up meanwhile.
  const nextWrite = () =>
    new Promise<void>((resolve, reject) => {
      const deadline = setTimeout(() => reject(new Error('no renewal within 5 s')), 5000);
      written = () => {
        clearTimeout(deadline);
        resolve();
      };
    });
  const ledger = r.ledger({ sessions, leaseMs: 60, clock: () => Date.now() });
  run(t, await ledger.claim(client, 'k', fp, 'p-1'));
  const first = (await r.sessions.get<any>(key))!;
  await nextWrite(); // two renewals (every leaseMs / 3)
  await nextWrite();
  const cur = (await r.sessions.get<any>(key))!;
  t.ok(cur.revision >= first.revision + 2, 'renewed');
  t.ok(cur.value.lease_until > first.value.lease_until, 'the lease moved forward');
});

/** The records the store holds for a client (listed, as housekeeping sees them). */
async function records(sessions: SessionStore, clientId = 'acme'): Promise<string[]> {
  const keys: string[] = [];
  for await (const { key } of sessions.list(idempotencyPrefix(clientId))) keys.push(key);
  return keys.sort();
}

t.test('expired records are removed, not only ignored: done ones ttlMs after the answer, abandoned claims ttlMs after their lease (injected clock)', async (t) => {
  const r = await rig(t);
  const ledger = r.ledger({ ttlMs: 1000, leaseMs: 60_000 });
  await run(t, await ledger.claim(client, 'done', fp, 'p-1')).finish(ok200);
  await run(t, await ledger.claim(client, 'released', fp, 'p-2')).release(true); // kept for its retry to settle
  run(t, await ledger.claim(client, 'running', fp, 'p-3'));
  await run(t, await ledger.claim({ ...client, id: 'other' }, 'done', fp, 'p-4')).finish(ok200);
  const all = ['done', 'released', 'running'].map((k) => idempotencyKey('acme', k)).sort();
  t.same(await records(r.sessions), all);

  r.clock.now += 999;
  t.equal(await ledger.sweep(['acme', 'other']), 0, 'nothing expired yet');
  t.same(await ledger.replay(client, 'done', fp), ok200);
  r.clock.now += 1;
  t.equal(await ledger.sweep(['acme']), 2, 'the answer and the abandoned claim expired');
  t.same(await records(r.sessions), [idempotencyKey('acme', 'running')], 'removed from the store; the running claim stays');
  t.equal(await ledger.replay(client, 'done', fp), null, 'the key is free again');
  t.same(await records(r.sessions, 'other'), [idempotencyKey('other', 'done')], 'only the clients swept');
  r.clock.now += 60_000;
  t.equal(await ledger.sweep(['acme', 'other']), 2, "a claim ttlMs after its lease lapsed (its instance died long ago), and the other client's answer");
  t.same([...(await records(r.sessions)), ...(await records(r.sessions, 'other'))], []);
});

t.test("a session's records go with it; other sessions' stay", async (t) => {
  const r = await rig(t);
  const ledger = r.ledger();
  await run(t, await ledger.claim(client, 'a', fp, 'p-1')).finish(ok200);
  await run(t, await ledger.claim(client, 'b', fp, 'p-2')).release(true);
  await run(t, await ledger.claim(client, 'c', { ...fp, upload_uuid: 'u-2' }, 'p-3')).finish(ok200);
  await forgetSessionRecords(r.sessions, 'acme', 'u-1');
  t.same(await records(r.sessions), [idempotencyKey('acme', 'c')]);
  t.equal(await ledger.replay(client, 'a', fp), null);
});

t.test('a concurrent flood of fresh keys never takes a client past its budget, not even while a trim runs', async (t) => {
  const r = await rig(t);
  const budget = 50;
  const width = 8;
  const ledger = r.ledger({ keysPerClient: budget });
  let most = 0;
  for (let round = 0; round < 40; round++) {
    r.clock.now += 1;
    await Promise.all(
      Array.from({ length: width }, async (_, j) => {
        const i = round * width + j;
        await run(t, await ledger.claim(client, `k${i}`, fp, `p-${i}`)).finish({ status: 422, body: { detail: 'x'.repeat(2_000) } });
      }),
    );
    most = Math.max(most, (await records(r.sessions)).length); // no idle(): what a client holds right now
  }
  t.ok(most <= budget + width, `at most the budget plus the creates under way (${budget} + ${width}); most seen: ${most}`);
  t.ok(most >= budget, `the budget is reached before any record is dropped (most seen: ${most})`);
});

t.test('a flood of fresh keys: the records of the client stay within its budget, the newest answers kept', async (t) => {
  const r = await rig(t);
  const budget = 50;
  const ledger = r.ledger({ keysPerClient: budget });
  const live = run(t, await ledger.claim(client, 'live', fp, 'p-live')); // a running claim is never dropped
  let most = 0;
  for (let i = 0; i < 1000; i++) {
    r.clock.now += 1;
    await run(t, await ledger.claim(client, `k${i}`, fp, `p-${i}`)).finish({ status: 422, body: { detail: `Invalid JSON format. ${i}` } });
    if (i % 25 === 24) {
      await ledger.idle(); // the background trim, if one started
      most = Math.max(most, (await records(r.sessions)).length);
    }
  }
  await ledger.idle();
  const left = await records(r.sessions);
  t.ok(most <= budget, `at most ${budget} records at any check (most seen: ${most})`);
  t.ok(left.length <= budget && left.length >= Math.floor(budget * 0.9) - 1, `${left.length} records left of 1001 keys`);
  t.ok(left.includes(idempotencyKey('acme', 'live')), 'the running claim stays');
  t.same(await ledger.replay(client, 'k999', fp), { status: 422, body: { detail: 'Invalid JSON format. 999' } }, 'the newest answer is replayed');
  t.equal(await ledger.replay(client, 'k0', fp), null, 'the oldest was dropped: its key is free again');
  const kept = left.filter((k) => k !== idempotencyKey('acme', 'live'));
  const newest = Array.from({ length: kept.length }, (_, i) => idempotencyKey('acme', `k${999 - i}`)).sort();
  t.same(kept, newest, 'the records dropped are the oldest ones');
  await live.finish(ok200);
});
