/**
 * The session service's group commit, on the embedded stores (real files): concurrent
 * decisions of one session share writes and none is lost, also with two services (two
 * gateways) writing the same summary; recorded packages reach the ledger and are folded.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import type { Connector } from '../../src/connector/types.js';
import { packageVerdict, sessionLive, UNSURE_DELIVERIES } from '../../src/session/recovery.js';
import { SessionService } from '../../src/session/service.js';
import { packageCount, type SessionRecord } from '../../src/session/state.js';
import { FileBatchQueue } from '../../src/store/embedded/batch-queue.js';
import { SqliteLedger } from '../../src/store/embedded/ledger.js';
import { FileObjectStore } from '../../src/store/embedded/object-store.js';
import { SqliteSessionStore } from '../../src/store/embedded/session-store.js';
import { sessionKey } from '../../src/store/keys.js';
import { StoreConflictError, StoreError, type BatchQueue, type PackageLedger, type SessionStore, type Versioned } from '../../src/store/ports.js';

const client = { id: 'acme', minDate: '2020-01-01' };
const noConnector: Connector = {
  start: async () => ({}),
  terminate: async () => {},
  close: async () => {},
};

/**
 * A session store that counts the summary writes it is asked for; `failNext` makes the next
 * summary write fail as a NATS timeout does, after it landed or before, or (`landed-conflict`)
 * land and then answer as a lost compare-and-set; `staleNext` answers the next summary read
 * (as a deposed NATS leader does for a moment after a partition heals), `absentNext` as
 * absent (such a leader, for a session created during the cut), `pointerNext` the next read
 * of an active pointer (such a leader's older pointer, or none); `stall` holds summary
 * writes until it resolves; `landed` resolves once the next summary write has (a `late` one: landed or lost). `late`: the
 * write fails at once as a timeout and lands once `stall` resolves, before the writes stalled
 * after it (a publish waiting in the socket of a server that stopped answering), or once
 * `lateGate` does where set, the writes after it going on. `refused`:
 * refused for sure (`notWritten`: JetStream out of storage, a full disk's rolled-back commit).
 */
type Failure = 'landed' | 'lost' | 'landed-conflict' | 'late' | 'refused';
function counting(
  store: SessionStore,
): SessionStore & {
  updates: number;
  failNext: Failure | null;
  staleNext: Versioned<unknown> | null;
  absentNext: boolean;
  pointerNext: Versioned<unknown> | null | undefined;
  stall: Promise<void> | null;
  failNextCreate: boolean;
  lateGate: Promise<void> | null;
  landed: () => Promise<void>;
} {
  const onLanded: (() => void)[] = [];
  const counted = {
    updates: 0,
    failNext: null as Failure | null,
    staleNext: null as Versioned<unknown> | null,
    absentNext: false,
    /** The next read of an active pointer answers this, as a stale read would (undefined: none). */
    pointerNext: undefined as Versioned<unknown> | null | undefined,
    stall: null as Promise<void> | null,
    /** Where set, what a `late` write waits for instead of `stall` (the writes after it go on). */
    lateGate: null as Promise<void> | null,
    /** The next summary create lands, then fails as a timeout. */
    failNextCreate: false,
    landed: () => new Promise<void>((resolve) => onLanded.push(resolve)),
    capabilities: store.capabilities,
    get: async <T>(key: string): Promise<Versioned<T> | null> => {
      if (key.startsWith('active.') && counted.pointerNext !== undefined) {
        const stale = counted.pointerNext as Versioned<T> | null;
        counted.pointerNext = undefined;
        return stale;
      }
      if (key.startsWith('session.') && counted.absentNext) {
        counted.absentNext = false;
        return null;
      }
      const stale = key.startsWith('session.') ? counted.staleNext : null;
      if (stale) counted.staleNext = null;
      return (stale as Versioned<T> | null) ?? store.get<T>(key);
    },
    getConfirmed: store.getConfirmed.bind(store),
    create: async <T>(key: string, value: T) => {
      const fail = key.startsWith('session.') && counted.failNextCreate;
      if (fail) counted.failNextCreate = false;
      const revision = await store.create(key, value);
      if (fail) throw new StoreError('STORE_UNAVAILABLE', 'no answer in time');
      return revision;
    },
    update: async <T>(key: string, value: T, revision: number) => {
      if (key.startsWith('session.')) counted.updates++;
      const fail = key.startsWith('session.') ? counted.failNext : null;
      counted.failNext = null;
      if (fail === 'lost') throw new StoreError('STORE_UNAVAILABLE', 'no answer in time');
      if (fail === 'refused') throw new StoreError('STORE_UNAVAILABLE', 'insufficient storage', { notWritten: true });
      if (fail === 'late') {
        void (counted.lateGate ?? counted.stall ?? Promise.resolve()).then(async () => {
          // Lost to a newer revision (a fence) where one was written meanwhile: answered all the same.
          await store.update(key, value, revision).catch((err: unknown) => {
            if (!(err instanceof StoreConflictError)) throw err;
          });
          for (const resolve of onLanded.splice(0)) resolve();
        });
        throw new StoreError('STORE_UNAVAILABLE', 'no answer in time');
      }
      if (key.startsWith('session.')) await counted.stall;
      const written = await store.update(key, value, revision);
      if (key.startsWith('session.')) for (const resolve of onLanded.splice(0)) resolve();
      if (fail === 'landed') throw new StoreError('STORE_UNAVAILABLE', 'no answer in time');
      if (fail === 'landed-conflict') throw new StoreConflictError(key);
      return written;
    },
    delete: store.delete.bind(store),
    list: store.list.bind(store),
    keys: store.keys.bind(store),
    close: store.close.bind(store),
  };
  return counted;
}

/** A new session of `client` on `s` with one package recorded and its ledger entry written (folded). */
async function recordedPackage(s: SessionService): Promise<{ uuid: string; id: string }> {
  const { upload_uuid: uuid } = await s.initialize(client);
  const id = await s.beginIngest(client, uuid);
  await s.recordIngest(client, uuid, { id, entity: 'stock', rows: 1, bytes: 1, object_bytes: 101 });
  await s.flushLedger();
  return { uuid, id };
}

async function rig(t: Test) {
  const dir = await mkdtemp(join(tmpdir(), 'session-service-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const sessions = counting(await SqliteSessionStore.open(join(dir, 'state.sqlite')));
  const ledger = await SqliteLedger.open(join(dir, 'state.sqlite'));
  const queue = await FileBatchQueue.open(join(dir, 'queue'), join(dir, 'state.sqlite'));
  const objects = await FileObjectStore.open(dir);
  t.teardown(async () => {
    await queue.close();
    await ledger.close();
    await objects.close();
    await sessions.close();
  });
  const service = (clock?: () => number, over: { sessions?: SessionStore; queue?: BatchQueue; ledger?: PackageLedger; resolveRecordMs?: number; connector?: Connector } = {}) =>
    new SessionService({ sessions, ledger, queue, objects, connector: noConnector, objectPrefix: 'up', inFlightLeaseMs: 60_000, callbackUrl: 'http://x/cb', ...(clock ? { clock } : {}), ...over });
  return { sessions, ledger, queue, service };
}

t.test('50 concurrent leases and records of one session share writes; none is lost', async (t) => {
  const { sessions, ledger, service } = await rig(t);
  const s = service();
  const { upload_uuid: uuid } = await s.initialize(client);
  const before = sessions.updates;
  const ids = await Promise.all(Array.from({ length: 50 }, () => s.beginIngest(client, uuid)));
  const leaseWrites = sessions.updates - before;
  t.equal(new Set(ids).size, 50);
  t.ok(leaseWrites < 50, `50 leases in ${leaseWrites} writes`);
  await Promise.all(ids.map((id, i) => s.recordIngest(client, uuid, { id, entity: i % 2 ? 'products' : 'stock', rows: i, bytes: 10 * i, object_bytes: 10 * i + 100 })));
  await s.flushLedger();
  const summary = (await sessions.get<SessionRecord>(sessionKey(uuid)))!.value;
  t.same(summary.in_flight, {}, 'every lease ended');
  t.same(summary.recording, {}, 'every recorded package folded once the ledger held it');
  t.equal(packageCount(summary), 50);
  t.same(summary.totals, {
    stock: { packages: 25, rows: 600, bytes: 6000 },
    products: { packages: 25, rows: 625, bytes: 6250 },
  });
  const listed = [];
  for await (const e of ledger.list(uuid)) listed.push(e.package_id);
  t.same(listed.sort(), [...ids].sort(), 'the ledger holds each package once');
});

t.test('two services (two gateways) on one summary: compare-and-set arbitrates, nothing is lost', async (t) => {
  const { sessions, service } = await rig(t);
  const [a, b] = [service(), service()];
  const { upload_uuid: uuid } = await a.initialize(client);
  // Each holds its own cached summary: every write of one makes the other's cache stale.
  const ids = await Promise.all(Array.from({ length: 40 }, (_, i) => (i % 2 ? a : b).beginIngest(client, uuid)));
  const summary = (await sessions.get<SessionRecord>(sessionKey(uuid)))!.value;
  t.same(Object.keys(summary.in_flight).sort(), [...ids].sort(), 'every lease of both is in the summary');
  await Promise.all(ids.map((id, i) => (i % 2 ? b : a).recordIngest(client, uuid, { id, entity: 'stock', rows: 1, bytes: 1, object_bytes: 101 })));
  await Promise.all([a.flushLedger(), b.flushLedger()]);
  const after = (await sessions.get<SessionRecord>(sessionKey(uuid)))!.value;
  t.equal(packageCount(after), 40);
  t.same(after.in_flight, {});
});

t.test('a decision that fails fails alone; the rest of its group is written', async (t) => {
  const { service } = await rig(t);
  const s = service();
  const { upload_uuid: uuid } = await s.initialize(client);
  const id = await s.beginIngest(client, uuid);
  const results = await Promise.allSettled([
    s.recordIngest(client, uuid, { id: 'never-leased', entity: 'stock', rows: 1, bytes: 1, object_bytes: 101 }),
    s.recordIngest(client, uuid, { id, entity: 'stock', rows: 2, bytes: 2, object_bytes: 102 }),
    s.beginIngest(client, uuid),
  ]);
  t.same(results.map((r) => r.status), ['rejected', 'fulfilled', 'fulfilled']);
  t.match((results[0] as PromiseRejectedResult).reason, { code: 'STORAGE_UNAVAILABLE' });
  const st = await s.status(client, uuid);
  t.same(st.entities, ['stock']);
  t.equal(st.upload_tasks_finished, false, 'the third decision’s lease is live');
});

t.test('the leases of running ingests are renewed while they run, and only theirs (injected clock)', async (t) => {
  const { service } = await rig(t);
  let now = Date.UTC(2026, 0, 10);
  const s = service(() => now);
  const { upload_uuid: uuid } = await s.initialize(client);
  const [running, ended] = await Promise.all([s.beginIngest(client, uuid), s.beginIngest(client, uuid)]);
  await s.releaseIngest(client, uuid, ended);
  now += 50_000;
  await s.renewLeases();
  now += 50_000; // 100 s after the lease was taken: past its first 60 s
  t.equal((await s.status(client, uuid)).upload_tasks_finished, false, 'the running ingest still counts');
  await s.recordIngest(client, uuid, { id: running, entity: 'stock', rows: 1, bytes: 1, object_bytes: 101 });
  t.equal((await s.status(client, uuid)).upload_tasks_finished, true, 'recorded: nothing left in flight');
  await s.renewLeases(); // holds nothing any more: writes nothing, adds nothing back
  t.same((await s.status(client, uuid)).entities, ['stock']);

  const dead = await s.beginIngest(client, uuid);
  now += 61_000; // no renewal in between: the instance died, as far as anyone can tell
  t.equal((await s.status(client, uuid)).upload_tasks_finished, true, 'an unrenewed lease ends');
  await s.renewLeases();
  const late = await s.recordIngest(client, uuid, { id: dead, entity: 'stock', rows: 1, bytes: 1, object_bytes: 101 }).catch((err: unknown) => err);
  t.match(late, { code: 'STORAGE_UNAVAILABLE' }, 'an expired lease is not renewed, and its package cannot be recorded');
});

t.test('a record write of unknown outcome is resolved before the ingest answers: landed, it stands; lost, the lease ends', async (t) => {
  const { sessions, service } = await rig(t);
  const s = service();
  const { upload_uuid: uuid } = await s.initialize(client);
  const landed = await s.beginIngest(client, uuid);
  sessions.failNext = 'landed';
  await s.recordIngest(client, uuid, { id: landed, entity: 'stock', rows: 2, bytes: 2, object_bytes: 102 });
  t.same((await s.status(client, uuid)).entities, ['stock'], 'the write landed: recorded, and the ingest answers 200');

  const lost = await s.beginIngest(client, uuid);
  sessions.failNext = 'lost';
  const err = await s.recordIngest(client, uuid, { id: lost, entity: 'receipts', rows: 1, bytes: 1, object_bytes: 101 }).catch((e: unknown) => e);
  t.match(err, { code: 'STORAGE_UNAVAILABLE', statusCode: 503 }, 'not recorded: 503');
  const after = (await sessions.get<SessionRecord>(sessionKey(uuid)))!.value;
  t.notOk(lost in after.in_flight, 'and its lease ended, so it never can be (the uploader drops it)');
  t.notOk(lost in after.recording);
  t.same((await s.status(client, uuid)).entities, ['stock']);
});

t.test('a record write that landed but was answered as a lost compare-and-set is a 200, not a 503 for a lease its own write ended', async (t) => {
  const { sessions, service } = await rig(t);
  const s = service();
  const { upload_uuid: uuid } = await s.initialize(client);
  const id = await s.beginIngest(client, uuid);
  sessions.failNext = 'landed-conflict';
  await s.recordIngest(client, uuid, { id, entity: 'stock', rows: 3, bytes: 3, object_bytes: 103 });
  await s.flushLedger();
  const after = (await sessions.get<SessionRecord>(sessionKey(uuid)))!.value;
  t.equal(packageCount(after), 1, 'recorded once');
  t.same(after.in_flight, {});
  t.same((await s.status(client, uuid)).entities, ['stock']);
});

t.test("a record write of unknown outcome whose settling reads a summary from before its lease (a deposed leader's) is found recorded, not fenced", async (t) => {
  const { sessions, service } = await rig(t);
  const s = service();
  const { upload_uuid: uuid } = await s.initialize(client);
  const beforeLease = (await sessions.get<SessionRecord>(sessionKey(uuid)))!;
  const id = await s.beginIngest(client, uuid);
  sessions.failNext = 'landed';
  sessions.staleNext = beforeLease;
  await s.recordIngest(client, uuid, { id, entity: 'stock', rows: 4, bytes: 4, object_bytes: 104 });
  await s.flushLedger();
  t.equal(sessions.staleNext, null, 'the settling read the stale summary');
  const after = (await sessions.get<SessionRecord>(sessionKey(uuid)))!.value;
  t.equal(packageCount(after), 1, 'recorded once, and answered 200');
});

t.test("the uploader's verdict on a package it reads as neither recording nor leased: dropped only once a write shows that summary is the stored one", async (t) => {
  const { sessions, ledger, service } = await rig(t);
  const s = service();
  const { upload_uuid: uuid } = await s.initialize(client);
  const beforeLease = (await sessions.get<SessionRecord>(sessionKey(uuid)))!;
  const id = await s.beginIngest(client, uuid);
  sessions.staleNext = beforeLease;
  t.equal(await packageVerdict(sessions, ledger, uuid, id), 'wait', "read from before the lease, the write loses: the stored summary's live lease means wait");
  t.equal(sessions.staleNext, null, 'the verdict read the stale summary');
  await s.releaseIngest(client, uuid, id);
  t.equal(await packageVerdict(sessions, ledger, uuid, id), 'drop', 'released: dropped');
});

t.test("the uploader's verdict on a folded package whose ledger reads miss its entry (a deposed leader's): store, by the confirmed read, not drop", async (t) => {
  const { ledger, sessions, service } = await rig(t);
  const s = service();
  const { uuid, id } = await recordedPackage(s);
  t.same((await sessions.get<SessionRecord>(sessionKey(uuid)))!.value.recording, {}, 'folded: the summary no longer names it');
  const stale = overriding(ledger, { get: async () => null });
  t.equal(await packageVerdict(sessions, stale, uuid, id), 'store');
});

t.test("the uploader on a session that reads as absent: wait, and keep the object put, unless its delete's clean-up is recorded or the package came back UNSURE_DELIVERIES times", async (t) => {
  const { sessions, ledger, service } = await rig(t);
  const s = service();
  const { upload_uuid: uuid } = await s.initialize(client);
  const id = await s.beginIngest(client, uuid);
  await s.recordIngest(client, uuid, { id, entity: 'stock', rows: 1, bytes: 1, object_bytes: 101 });
  // Its ledger entry not written yet: the verdict reads the summary.
  const unwritten = overriding(ledger, { get: async () => null });
  sessions.absentNext = true;
  t.equal(await packageVerdict(sessions, unwritten, uuid, id), 'wait', 'a session created during a cut, read on a deposed leader: not dropped');
  t.equal(sessions.absentNext, false, 'the verdict read it absent');
  t.equal(await packageVerdict(sessions, unwritten, uuid, id), 'store', 'read again: recorded');
  sessions.absentNext = true;
  t.equal(await sessionLive(sessions, uuid), 'unsure', 'after the put: the object is not deleted on that read');
  t.equal(await sessionLive(sessions, uuid), 'live');
  sessions.absentNext = true;
  t.equal(await packageVerdict(sessions, unwritten, uuid, id, { delivery: UNSURE_DELIVERIES + 1 }), 'drop', 'absent that many deliveries on: gone');
  sessions.absentNext = true;
  t.equal(await sessionLive(sessions, uuid, UNSURE_DELIVERIES + 1), 'gone');

  await s.delete(client, uuid);
  t.equal(await sessionLive(sessions, uuid), 'gone', 'deleted: gone');
  await s.cleanUpsIdle();
  t.equal(await sessions.get(sessionKey(uuid)), null, 'the clean-up removed the summary');
  t.equal(await packageVerdict(sessions, ledger, uuid, 'another'), 'drop', 'absent with its clean-up recorded: dropped at the first delivery');
  t.equal(await sessionLive(sessions, uuid), 'gone');
});

/**
 * A package whose record write fails as `failure` while the store stalls every later summary
 * write: the ingest's error at the 50 ms deadline, then `thaw` (the stalled writes go on) and
 * the summary once the first of them landed.
 */
async function recordInDoubt(t: Test, failure: Failure) {
  const { sessions, service } = await rig(t);
  const s = service(undefined, { resolveRecordMs: 50 });
  const { upload_uuid: uuid } = await s.initialize(client);
  const id = await s.beginIngest(client, uuid);
  let unstall!: () => void;
  sessions.stall = new Promise((resolve) => (unstall = resolve));
  sessions.failNext = failure;
  const err = await s.recordIngest(client, uuid, { id, entity: 'stock', rows: 1, bytes: 1, object_bytes: 101 }).catch((e: unknown) => e);
  const summary = async () => (await sessions.get<SessionRecord>(sessionKey(uuid)))!.value;
  const thaw = async () => {
    const landed = sessions.landed();
    sessions.stall = null;
    unstall();
    await landed;
    return summary();
  };
  return { id, err, summary, thaw };
}

t.test('a record write of unknown outcome still unsettled at the deadline: no answer then (OUTCOME_UNKNOWN), while the attempt to settle it is still out; that attempt ends the lease afterwards', async (t) => {
  const { id, err, summary, thaw } = await recordInDoubt(t, 'lost');
  t.match(err, { code: 'OUTCOME_UNKNOWN' }, 'ended by the deadline, not when the stalled write comes back: neither 200 nor 503 is known to be true');
  t.ok(id in (await summary()).in_flight, 'the lease still stands: the attempt to settle it is stalled');
  const after = await thaw();
  t.notOk(id in after.in_flight, 'once the store answers, the attempt ends the lease: the package can never be recorded');
  t.notOk(id in after.recording);
});

t.test('a record write that lands after the deadline (sent to a store that stopped answering): the ingest is not told 503, and the package stands recorded', async (t) => {
  const { id, err, thaw } = await recordInDoubt(t, 'late');
  t.match(err, { code: 'OUTCOME_UNKNOWN' }, 'no 503 ("nothing stored"): the write is still out');
  t.ok(id in (await thaw()).recording, 'the write landed ahead of the fence: recorded, as a retry with its key is told (200)');
});

t.test('a record write the store refused for sure (out of storage) is a 503 at once: nothing to settle, the store that said no is not asked again', async (t) => {
  const { sessions, service } = await rig(t);
  const s = service(undefined, { resolveRecordMs: 60_000 });
  const { upload_uuid: uuid } = await s.initialize(client);
  const id = await s.beginIngest(client, uuid);
  const before = sessions.updates;
  sessions.failNext = 'refused';
  const err = await s.recordIngest(client, uuid, { id, entity: 'stock', rows: 1, bytes: 1, object_bytes: 101 }).catch((e: unknown) => e);
  t.match(err, { code: 'STORAGE_UNAVAILABLE', statusCode: 503 }, '503: nothing of it is stored');
  t.equal(sessions.updates - before, 1, 'the refused write alone: no compare-and-set to settle it');
  t.notOk(id in (await sessions.get<SessionRecord>(sessionKey(uuid)))!.value.recording);
});

t.test('an ingest whose lease write is answered as failed and lands only after its 503 leaves no lease behind: the take-back is a fence', async (t) => {
  const { sessions, service } = await rig(t);
  const s = service();
  const { upload_uuid: uuid } = await s.initialize(client);
  let thaw!: () => void;
  sessions.lateGate = new Promise((resolve) => (thaw = resolve));
  sessions.failNext = 'late';
  t.match(await s.beginIngest(client, uuid).catch((e: unknown) => e), { code: 'STORE_UNAVAILABLE' }, '503');
  // The take-back runs in the background; a decision queued behind it (terminate: 404, no write) settles after it.
  t.match(await s.terminate(client, uuid).catch((e: unknown) => e), { statusCode: 404, message: 'Workflow is not running' });
  const landed = sessions.landed();
  thaw();
  await landed;
  const after = (await sessions.get<SessionRecord>(sessionKey(uuid)))!.value;
  t.same(after.in_flight, {}, 'the late lease write lost to the fence (before: a lease no ingest renews, for its 60 s)');
  await t.resolveMatch(s.status(client, uuid), { upload_tasks_finished: true });
});

t.test('an initialize-session whose summary write lands but is answered as failed (a timeout): the summary is taken back, and the retry creates one session', async (t) => {
  const { sessions, service } = await rig(t);
  const s = service();
  sessions.failNextCreate = true;
  t.match(await s.initialize(client).catch((e: unknown) => e), { code: 'STORE_UNAVAILABLE' }, '503');
  const { upload_uuid: uuid } = await s.initialize(client);
  await t.resolveMatch(s.status(client, uuid), { session_status: 'UPLOADING' });
  const summaries: string[] = [];
  for await (const key of sessions.keys('session.')) summaries.push(key);
  t.same(summaries, [sessionKey(uuid)], 'one summary: the one the client was told of (none left that no pointer or listing names)');
});

t.test('a start that fails goes back to UPLOADING before its answer, also when storage fails that write the first time', async (t) => {
  const { sessions, service } = await rig(t);
  const down = new StoreError('STORE_UNAVAILABLE', 'no leader');
  const s = service(undefined, {
    connector: {
      ...noConnector,
      // The start failed on storage; the write that puts the session back fails once too.
      start: async () => {
        sessions.failNext = 'lost';
        throw down;
      },
    },
  });
  const { uuid, id } = await recordedPackage(s);
  const err = await s.start(client, uuid, { date_from: '2024-01-01', date_to: '2024-12-31' }).catch((e: unknown) => e);
  t.equal(err, down, "the start's own failure is the answer");
  const after = (await sessions.get<SessionRecord>(sessionKey(uuid)))!.value;
  t.equal(after.status, 'UPLOADING', 'and by then the session is back to UPLOADING (not left STARTED with no workflow)');
  t.notOk(after.workflow, 'with no workflow');
});

const startInDoubt = {
  landed: 'lands but is answered as failed (a timeout): put back before the answer',
  late: "is answered as failed and lands only after its 503 (a write waiting in a frozen server's socket): the put-back is a fence it cannot land after",
};
for (const [failure, shape] of Object.entries(startInDoubt) as ['landed' | 'late', string][]) {
  t.test(`a start-upload whose own write ${shape}; the session ends UPLOADING and the client's retry starts (409 before)`, async (t) => {
    const { sessions, service } = await rig(t);
    let calls = 0;
    const s = service(undefined, { connector: { ...noConnector, start: async () => (calls++, { workflow: 'w1' }) } });
    const { uuid } = await recordedPackage(s);
    const dates = { date_from: '2024-01-01', date_to: '2024-12-31' };
    let thaw = () => {};
    if (failure === 'late') sessions.lateGate = new Promise((resolve) => (thaw = resolve));
    sessions.failNext = failure;
    t.match(await s.start(client, uuid, dates).catch((e: unknown) => e), { code: 'STORE_UNAVAILABLE' }, '503: its outcome was not known');
    t.equal(calls, 0, 'no Connector call for it');
    if (failure === 'late') {
      const landed = sessions.landed();
      thaw();
      await landed;
    }
    const after = (await sessions.get<SessionRecord>(sessionKey(uuid)))!.value;
    t.equal(after.status, 'UPLOADING');
    t.notOk(after.workflow);
    t.same(await s.start(client, uuid, dates), { workflow: 'w1' }, 'the retry starts');
    t.equal(calls, 1);
  });
}

t.test('start-upload: a committed package not yet acked is pending (409) until its object is marked stored in the ledger; then it starts', async (t) => {
  const { ledger, queue, service } = await rig(t);
  const s = service();
  const { upload_uuid: uuid } = await s.initialize(client);
  const id = await s.beginIngest(client, uuid);
  const w = await queue.open({ package_id: id, upload_uuid: uuid, client_id: client.id, entity: 'stock', columns: ['a'] });
  await w.append(Buffer.from('[1]\n'));
  await w.commit({ rows: 1, bytes: 4 });
  await s.recordIngest(client, uuid, { id, entity: 'stock', rows: 1, bytes: 4, object_bytes: 101 });
  await s.flushLedger();
  const dates = { date_from: '2024-01-01', date_to: '2024-12-31' };
  await t.rejects(s.start(client, uuid, dates), { statusCode: 409, message: 'Upload tasks are still in progress' }, 'committed, not stored: pending');
  // The uploader stored and counted it; its ack has not come (or, on NATS, a read of the ack
  // floor older than the ack does not show it).
  await ledger.countStored!(uuid, [{ package_id: id, entity: 'stock' }], sessionKey(uuid));
  t.equal(await queue.hasPending(uuid), true, 'the queue alone still counts it');
  await t.resolves(s.start(client, uuid, dates), 'stored: not pending, the start goes');
});

t.test('start-upload: a package committed and recorded while the pending check is out (its lease gone by then) holds the start back (409)', async (t) => {
  const { ledger, queue, service } = await rig(t);
  // The queue's answer comes a moment after it was read, as a NATS round trip's does: meanwhile an ingest finishes.
  let meanwhile: (() => Promise<void>) | null = null;
  const slow: BatchQueue = Object.assign(Object.create(queue) as BatchQueue, {
    hasPending: async (uuid: string, opts?: Parameters<BatchQueue['hasPending']>[1]) => {
      const answer = await queue.hasPending(uuid, opts);
      const run = meanwhile;
      meanwhile = null;
      await run?.();
      return answer;
    },
  });
  const s = service(undefined, { queue: slow });
  const { uuid, id } = await recordedPackage(s);
  await ledger.countStored!(uuid, [{ package_id: id, entity: 'stock' }], sessionKey(uuid));
  const next = await s.beginIngest(client, uuid);
  meanwhile = async () => {
    const w = await queue.open({ package_id: next, upload_uuid: uuid, client_id: client.id, entity: 'stock', columns: ['a'] });
    await w.append(Buffer.from('[2]\n'));
    await w.commit({ rows: 1, bytes: 4 });
    await s.recordIngest(client, uuid, { id: next, entity: 'stock', rows: 1, bytes: 4, object_bytes: 101 });
  };
  const dates = { date_from: '2024-01-01', date_to: '2024-12-31' };
  await t.rejects(s.start(client, uuid, dates), { statusCode: 409, message: 'Upload tasks are still in progress' });
  t.equal(meanwhile, null, 'the ingest finished during the check');
  t.equal((await s.status(client, uuid)).session_status, 'UPLOADING');
  await t.rejects(s.start(client, uuid, dates), { statusCode: 409, message: 'Upload tasks are still in progress' }, 'asked again: its package is pending, seen so now');
});

t.test('a start-upload write that lands but is answered as a lost compare-and-set is decided again on its own summary: started, the Connector called once', async (t) => {
  const { sessions, service } = await rig(t);
  let calls = 0;
  const s = service(undefined, { connector: { ...noConnector, start: async () => (calls++, { workflow: 'w1' }) } });
  const { uuid, id } = await recordedPackage(s);
  sessions.failNext = 'landed-conflict';
  t.same(await s.start(client, uuid, { date_from: '2024-01-01', date_to: '2024-12-31' }), { workflow: 'w1' }, "the Connector's answer (409 before)");
  t.equal(calls, 1);
  const after = (await sessions.get<SessionRecord>(sessionKey(uuid)))!.value;
  t.equal(after.status, 'STARTED');
  t.equal(after.workflow?.starting_until, undefined, 'taken: not held by a gateway that will never renew it');
});

t.test("a webhook write that lands but is answered as a lost compare-and-set is answered as applied ('ok'), signed or not", async (t) => {
  const { sessions, service } = await rig(t);
  const s = service(undefined, { connector: { ...noConnector, start: async () => ({ workflow: 'w1' }) } });
  const dates = { date_from: '2024-01-01', date_to: '2024-12-31' };
  const { uuid } = await recordedPackage(s);
  await s.start(client, uuid, dates);
  sessions.failNext = 'landed-conflict';
  t.equal(await s.applyWebhook(uuid, { is_terminated: false, status: 'failed' }), 'ok', "unsigned ('ignored' before)");
  t.equal((await sessions.get<SessionRecord>(sessionKey(uuid)))!.value.status, 'UPLOADING');
  t.equal(await s.applyWebhook(uuid, { is_terminated: false, status: 'failed' }), 'ignored', 'sent again: nothing running to end');
  await s.start(client, uuid, dates);
  sessions.failNext = 'landed-conflict';
  const signed = { is_terminated: false, status: 'succeeded' as const, replay: { id: 'signed-1', until: Date.now() + 60_000 } };
  t.equal(await s.applyWebhook(uuid, signed), 'ok', "signed ('ignored' before: its replay id was there)");
  t.equal((await sessions.get<SessionRecord>(sessionKey(uuid)))!.value.status, 'DONE');
  t.equal(await s.applyWebhook(uuid, signed), 'ignored', 'replayed');
});

t.test("a start whose gateway died during the Connector's call lapses back to UPLOADING after its hold; the Connector's answer after that is a 503 (injected clock)", async (t) => {
  const { sessions, service } = await rig(t);
  let now = Date.UTC(2026, 0, 10);
  const clock = () => now;
  let called!: () => void;
  const inCall = new Promise<void>((resolve) => (called = resolve));
  let answer!: (v: unknown) => void;
  // The first gateway's Connector call hangs: that gateway is as good as dead to the session.
  const dying = service(clock, {
    connector: {
      ...noConnector,
      start: () => {
        called();
        return new Promise((resolve) => (answer = resolve));
      },
    },
  });
  const other = service(clock);
  const { uuid, id } = await recordedPackage(dying);
  const dates = { date_from: '2024-01-01', date_to: '2024-12-31' };
  const first = dying.start(client, uuid, dates).catch((e: unknown) => e);
  await inCall;
  const summary = async () => (await sessions.get<SessionRecord>(sessionKey(uuid)))!.value;
  t.equal((await summary()).workflow?.starting_until, now + 60_000, 'STARTED, held for the ingest lease');
  t.match(await other.start(client, uuid, dates).catch((e: unknown) => e), { statusCode: 409 }, 'held: another start is 409');
  t.equal(await other.settleLapsedStarts([client.id]), 0, 'housekeeping leaves a held start alone');

  now += 60_000;
  t.equal((await other.status(client, uuid)).session_status, 'STARTED', 'status answers what is stored…');
  await until(async () => (await summary()).status === 'UPLOADING');
  t.notOk((await summary()).workflow, '…and puts the lapsed start back to UPLOADING, which the next status shows');
  t.equal((await other.status(client, uuid)).session_status, 'UPLOADING');

  // The dead gateway's Connector answers after all: its client is told to retry, and the retry starts again.
  answer({ workflow_id: 'w1' });
  t.match(await first, { statusCode: 503 }, 'the first start: 503, its hold had lapsed');
  t.same(await other.start(client, uuid, dates), {}, 'a start again succeeds (the Connector treats it as the same workflow)');
  const taken = await summary();
  t.ok(taken.status === 'STARTED' && taken.workflow && !('starting_until' in taken.workflow), 'taken by the Connector: no longer held');
  now += 10 * 60_000;
  t.equal(await other.settleLapsedStarts([client.id]), 0, 'a taken start never lapses');
  t.equal((await summary()).status, 'STARTED');
});

t.test('a start that lapsed is put back by whatever writes the session next, and initialize-session answers against UPLOADING (injected clock)', async (t) => {
  const { sessions, service } = await rig(t);
  let now = Date.UTC(2026, 0, 10);
  const s = service(() => now);
  const { uuid, id } = await recordedPackage(s);
  // A start as a gateway that died left it: STARTED, its hold running out.
  const stored = (await sessions.get<SessionRecord>(sessionKey(uuid)))!;
  const started = { ...stored.value, status: 'STARTED' as const, workflow: { date_from: '2024-01-01', date_to: '2024-12-31', started_at: new Date(now).toISOString(), starting_until: now + 1000 } };
  await sessions.update(sessionKey(uuid), started, stored.revision);
  t.match(await s.initialize(client).catch((e: unknown) => e), { statusCode: 409, body: { session_status: 'STARTED' } }, 'held: the workflow counts as running');
  now += 1000;
  t.match(await s.initialize(client).catch((e: unknown) => e), { statusCode: 409, body: { session_status: 'UPLOADING', upload_uuid: uuid } }, 'lapsed: put back, the session is UPLOADING again');
  const more = await s.beginIngest(client, uuid);
  t.ok(more, 'an ingest is taken again');
});

t.test("a lapsed start not yet written back still ends with its workflow's webhook; once back to UPLOADING a late one is ignored (injected clock)", async (t) => {
  const { sessions, service } = await rig(t);
  let now = Date.UTC(2026, 0, 10);
  const s = service(() => now);
  const lapsedStart = async (uuid: string) => {
    const stored = (await sessions.get<SessionRecord>(sessionKey(uuid)))!;
    const workflow = { date_from: '2024-01-01', date_to: '2024-12-31', started_at: new Date(now).toISOString(), starting_until: now + 1000 };
    await sessions.update(sessionKey(uuid), { ...stored.value, status: 'STARTED' as const, workflow }, stored.revision);
  };
  const first = await recordedPackage(s);
  await lapsedStart(first.uuid);
  now += 1000;
  t.equal(await s.applyWebhook(first.uuid, { is_terminated: false, status: 'succeeded' }), 'ok', 'the workflow ran: its webhook ends the start');
  t.equal((await sessions.get<SessionRecord>(sessionKey(first.uuid)))!.value.status, 'DONE');

  const second = await recordedPackage(s);
  await lapsedStart(second.uuid);
  now += 1000;
  t.equal(await s.settleLapsedStarts([client.id]), 1, 'housekeeping writes the lapse');
  t.equal(await s.applyWebhook(second.uuid, { is_terminated: false, status: 'succeeded' }), 'ignored', 'then a late webhook is ignored');
  t.equal((await sessions.get<SessionRecord>(sessionKey(second.uuid)))!.value.status, 'UPLOADING');
});

t.test('spare leases: an ingest after a record here begins without a write; unused ones hold back neither status nor start-upload, and a beat ends them (injected clock)', async (t) => {
  const { sessions, service } = await rig(t);
  let now = Date.UTC(2026, 0, 10);
  const s = service(() => now);
  const { upload_uuid: uuid } = await s.initialize(client);
  const pkg = (id: string) => ({ id, entity: 'stock', rows: 1, bytes: 1, object_bytes: 101 });
  const summary = async () => (await sessions.get<SessionRecord>(sessionKey(uuid)))!.value;
  const spares = async () => Object.keys((await summary()).spare_leases ?? {});

  const a = await s.beginIngest(client, uuid);
  await s.recordIngest(client, uuid, pkg(a));
  const [spare] = await spares();
  t.ok(spare, 'the record granted a spare lease');
  t.equal((await s.status(client, uuid)).upload_tasks_finished, true, 'an unused spare lease holds nothing');
  let resume!: () => void;
  sessions.stall = new Promise((resolve) => (resume = resolve));
  const b = await s.beginIngest(client, uuid);
  t.equal(b, spare, 'the next ingest began on the spare lease, its write held back');
  const taken = sessions.landed();
  sessions.stall = null;
  resume();
  await taken;
  t.equal((await s.status(client, uuid)).upload_tasks_finished, false, 'which then counts as an ingest in flight');
  t.ok(b in (await summary()).in_flight);
  await s.recordIngest(client, uuid, pkg(b));
  t.equal(packageCount(await summary()), 2, 'recorded under it');
  t.equal((await spares()).length, 1, 'and its record granted the next');

  now += 5_000;
  await s.renewLeases();
  t.equal((await spares()).length, 1, 'a beat keeps a spare lease granted since the last');
  now += 5_000;
  await s.renewLeases();
  t.same(await spares(), [], 'the next ends it, untaken');
  const c = await s.beginIngest(client, uuid);
  t.ok(c in (await summary()).in_flight, 'then an ingest takes its lease with a write');
  await s.recordIngest(client, uuid, pkg(c));
  t.equal((await spares()).length, 1);
  // The fold of c's ledger entry (after the ledger writer's linger) is not counted below.
  await s.flushLedger();
  const writes = sessions.updates;
  const d = await s.beginIngest(client, uuid);
  await s.recordIngest(client, uuid, pkg(d));
  t.equal(sessions.updates - writes, 1, 'a take lingers for company: begun on a spare lease and recorded at once, one write');

  await s.flushLedger();
  await s.start(client, uuid, { date_from: '2024-01-01', date_to: '2024-12-31' });
  t.same(await spares(), [], 'start-upload, right after the last record, ends the spare lease');
  const late = await s.beginIngest(client, uuid).catch((err: unknown) => err);
  t.match(late, { code: 'INVALID_SESSION_STATUS', statusCode: 409 }, 'and no ingest here begins on it afterwards');
});

/** `target` with the members of `over` in place of its own (its methods bound to it). */
function overriding<T extends object>(target: T, over: Partial<T>): T {
  return new Proxy(target, {
    get: (o, k) => (k in over ? over[k as keyof T] : typeof o[k as keyof T] === 'function' ? (o[k as keyof T] as (...a: unknown[]) => unknown).bind(o) : o[k as keyof T]),
  });
}

t.test('initialize-session and the webhook that lose every compare-and-set: 503 after their tries, not 500', async (t) => {
  const { sessions, service } = await rig(t);
  const { upload_uuid: uuid } = await service().initialize({ id: 'other', minDate: '2020-01-01' });
  // Another call of the client wins the pointer every time (a new session's own key never conflicts).
  const contended = overriding(sessions, {
    create: async <T>(key: string, value: T) => {
      if (key.startsWith('session.')) return sessions.create(key, value);
      throw new StoreConflictError(key);
    },
    update: async (key: string) => {
      throw new StoreConflictError(key);
    },
  });
  const s = service(undefined, { sessions: contended });
  await t.rejects(s.initialize(client), { statusCode: 503, message: 'Storage temporarily unavailable' });
  await t.rejects(s.applyWebhook(uuid, { is_terminated: false, status: 'succeeded', replay: { id: 'signed-1', until: Date.now() + 60_000 } }), { statusCode: 503, message: 'Storage temporarily unavailable' });
});

t.test('status: with nothing pending, the stored counts are read after the queue answered (they read at once while anything is)', async (t) => {
  const { ledger, queue, service } = await rig(t);
  const setup = service();
  const { uuid, id } = await recordedPackage(setup);

  // The uploader stores the package, counts it, then acks it, while status asks: a count read
  // that began before the count landed sees nothing, and the queue says not pending once it did.
  let counted = false;
  let pending = true;
  const reads: boolean[] = [];
  const racing = overriding(ledger, {
    storedCounts: async (u: string) => {
      const sawCount = counted;
      reads.push(sawCount);
      const got = await ledger.storedCounts!(u);
      return sawCount ? got : new Map();
    },
  });
  const uploading = overriding(queue, {
    hasPending: async () => {
      if (pending) return true;
      await ledger.countStored!(uuid, [{ package_id: id, entity: 'stock' }], sessionKey(uuid));
      counted = true;
      return false;
    },
  });
  const s = service(undefined, { queue: uploading, ledger: racing });

  const during = await s.status(client, uuid);
  t.equal(during.upload_tasks_finished, false);
  t.equal(during.totals.stored_packages, 0, 'while pending: the count as read');
  t.same(reads, [false], 'read once, beside the other reads');

  pending = false;
  const after = await s.status(client, uuid);
  t.equal(after.upload_tasks_finished, true, 'nothing pending');
  t.equal(after.totals.stored_packages, 1, 'and the package that is no longer pending is counted stored');
  t.equal(reads.at(-1), true, 'by a read after the queue answered');
});

/** Resolves once `cond` holds, asked again after each turn of the event loop (no timer). */
async function until(cond: () => Promise<boolean>): Promise<void> {
  while (!(await cond())) await new Promise((resolve) => setImmediate(resolve));
}

t.test('a client error is concluded from a confirmed read of the pointer: a stale read naming an earlier session, or none, is not answered 403 or 400', async (t) => {
  const { sessions, service } = await rig(t);
  const s = service();
  const { upload_uuid: first } = await s.initialize(client);
  await s.delete(client, first);
  const { upload_uuid: uuid } = await s.initialize(client);
  sessions.pointerNext = { value: { upload_uuid: first }, revision: 1 };
  await s.requirePointer(client, uuid);
  t.equal(sessions.pointerNext, undefined, 'a read naming the deleted session was taken, and confirmed: the pointer names this one');
  sessions.pointerNext = null;
  t.equal((await s.requireActive(client, uuid)).value.upload_uuid, uuid, 'a read finding no pointer: confirmed, the session is there');
  t.equal(sessions.pointerNext, undefined);
  await t.rejects(s.requireActive(client, first), { statusCode: 403, message: 'Invalid upload UUID' }, 'a uuid the pointer does not name is still 403');
  await t.rejects(s.requireActive({ ...client, id: 'other' }, uuid), { statusCode: 400, message: 'Upload session not initialized' }, 'a client without a session is still 400');
});

t.test("a webhook that comes before the Connector's start answer, to a gateway whose clock is behind, still lets the start answer 200 (injected clocks)", async (t) => {
  const { sessions, service } = await rig(t);
  let now = Date.UTC(2026, 0, 10);
  // The gateway that takes the webhook reads 20 ms earlier than the one that starts: clocks of two hosts.
  const behind = service(() => now - 20);
  const starting = service(() => now, {
    connector: {
      ...noConnector,
      start: async () => {
        // A quick Connector: the workflow ends (here refused) before its start is answered.
        t.equal(await behind.applyWebhook(uuid, { is_terminated: false, status: 'failed', message: 'bad dates' }), 'ok');
        return { workflow_id: 'w1' };
      },
    },
  });
  const { uuid } = await recordedPackage(starting);
  now += 5;
  const answer = await starting.start(client, uuid, { date_from: '2024-01-01', date_to: '2024-12-31' }).catch((e: unknown) => e);
  t.same(answer, { workflow_id: 'w1' }, 'the Connector took the start: 200 with its answer, not 503 (a retry would start it again)');
  const summary = (await sessions.get<SessionRecord>(sessionKey(uuid)))!.value;
  t.equal(summary.status, 'UPLOADING', 'the webhook ended it');
  t.equal(summary.last_workflow?.status, 'failed');
});
