/** The pure state machine, exhaustively: every state against every event. */
import t from 'tap';
import {
  decideDelete,
  decideFold,
  decideIngestBegin,
  decideIngestFence,
  decideIngestRecord,
  decideIngestRelease,
  decideIngestRenew,
  decideIngestTake,
  decideInitialize,
  decideReleaseAllLeases,
  decideStart,
  decideStartFailed,
  decideStartLapsed,
  decideStartRenew,
  decideStartTaken,
  decideTerminate,
  decideWebhook,
  entityTotals,
  fromStored,
  newSession,
  packageCount,
  packageFate,
  statusView,
  type SessionRecord,
  type SessionStatus,
} from '../../src/session/state.js';

const NOW = Date.UTC(2026, 0, 10);
const STATES: SessionStatus[] = ['UPLOADING', 'STARTED', 'DONE'];
const dates = { date_from: '2024-01-01', date_to: '2025-12-31' };

function session(status: SessionStatus, extra: Partial<SessionRecord> = {}): SessionRecord {
  const r = newSession('u-1', 'acme', NOW - 1000);
  const started = status === 'STARTED' ? { workflow: { ...dates, started_at: new Date(NOW - 500).toISOString() } } : {};
  return { ...r, status, entities: ['products'], totals: { products: { packages: 1, rows: 3, bytes: 30 } }, ...started, ...extra };
}

/** No package recorded. */
const empty = { entities: [], totals: {}, recording: {} };
const entry = (entity: string, rows = 1) => ({ entity, rows, bytes: rows * 10, object_bytes: rows * 10 + 100 });

t.test('initialize-session', async (t) => {
  t.same(decideInitialize(null), { create: true });
  t.same(decideInitialize(session('DONE')), { create: true, previous: 'u-1' });
  const uploading = decideInitialize(session('UPLOADING'));
  t.equal(uploading.create, false);
  if (!uploading.create) t.match(uploading.error.body, { status: 'already_exists', session_status: 'UPLOADING', upload_uuid: 'u-1' });
  const started = decideInitialize(session('STARTED'));
  if (!started.create) t.match(started.error.body, { status: 'workflow_running', session_status: 'STARTED', upload_uuid: 'u-1' });
  else t.fail('STARTED must conflict');
});

t.test('ingest begin / commit only in UPLOADING; release in any state', async (t) => {
  for (const s of STATES) {
    const begin = decideIngestBegin(session(s), 'p1', NOW, 1000);
    const commit = decideIngestRecord(session(s, { in_flight: { p1: NOW + 1000 } }), { id: 'p1', ...entry('stock', 2) }, NOW);
    if (s === 'UPLOADING') {
      t.ok(begin.ok && begin.next.in_flight.p1 === NOW + 1000, 'lease registered');
      t.ok(commit.ok && commit.next.recording.p1?.entity === 'stock' && commit.next.entities.at(-1) === 'stock', 'package recorded');
    } else {
      for (const d of [begin, commit]) {
        t.notOk(d.ok);
        if (!d.ok) t.same(d.error.body, { detail: { message: 'Invalid upload session status', expected: 'UPLOADING', actual: s } });
      }
    }
    const release = decideIngestRelease(session(s, { in_flight: { p1: NOW + 5 } }), ['p1'], NOW);
    t.ok(release.ok && !('p1' in release.next.in_flight));
  }
});

t.test('begin: packages and live leases count against maxPackages, dead leases do not; state is checked first', async (t) => {
  // One package recorded (see `session`), one live lease, one dead.
  const r = session('UPLOADING', { in_flight: { live: NOW + 100, dead: NOW - 1 } });
  t.ok(decideIngestBegin(r, 'p1', NOW, 1000, 3).ok, '1 package + 1 live lease < 3');
  const full = decideIngestBegin(r, 'p1', NOW, 1000, 2);
  t.ok(!full.ok && full.error.code === 'SESSION_FULL' && full.error.statusCode === 409, '1 + 1 = 2: full');
  t.ok(decideIngestBegin(r, 'p1', NOW + 200, 1000, 2).ok, 'once the lease has expired, there is room again');
  const started = decideIngestBegin(session('STARTED'), 'p1', NOW, 1000, 1);
  t.ok(!started.ok && started.error.code === 'INVALID_SESSION_STATUS', 'a full session that is not UPLOADING answers the state');
});

t.test('record ends the lease and prunes dead ones; needs the live lease', async (t) => {
  const r = session('UPLOADING', { in_flight: { p1: NOW + 100, dead: NOW - 1, p2: NOW + 100 } });
  const d = decideIngestRecord(r, { id: 'p1', ...entry('products') }, NOW);
  t.ok(d.ok);
  if (d.ok) t.same(d.next.in_flight, { p2: NOW + 100 });
  for (const [what, inFlight] of [['released', {}], ['expired', { p1: NOW }]] as const) {
    const gone = decideIngestRecord(session('UPLOADING', { in_flight: inFlight }), { id: 'p1', ...entry('products') }, NOW);
    t.ok(!gone.ok && gone.error.code === 'STORAGE_UNAVAILABLE', `a ${what} lease cannot be recorded`);
  }
  if (!d.ok) return;
  // Decided again on the summary its own landed write made (answered as a lost compare-and-set).
  const since: SessionRecord = { ...d.next, status: 'STARTED' };
  const again = decideIngestRecord(since, { id: 'p1', ...entry('products') }, NOW + 1);
  t.ok(again.ok && again.next === since, 'recording already: recorded, nothing to write, whatever the state now');
});

t.test('fence: ends the leases like a release, and is written even when none is held (a read alone may be a deposed leader\'s)', async (t) => {
  const r = session('UPLOADING', { in_flight: { p1: NOW + 100, p2: NOW + 100 } });
  const held = decideIngestFence(r, ['p1'], NOW);
  t.ok(held.ok && held.next.in_flight.p1 === undefined && held.next.in_flight.p2 === NOW + 100, 'a held lease ends, the others stay');
  const none = decideIngestFence(r, ['gone'], NOW + 5);
  t.ok(none.ok && none.next !== r && none.next.updated_at === new Date(NOW + 5).toISOString(), 'nothing held: a new summary to write all the same');
  t.ok(none.ok && none.next.in_flight === r.in_flight);
});

t.test('renew extends live leases only: an expired, released or revoked one stays ended', async (t) => {
  const r = session('UPLOADING', { in_flight: { live: NOW + 100, other: NOW + 50, expired: NOW, dead: NOW - 1 } });
  const d = decideIngestRenew(r, ['live', 'expired', 'gone'], NOW, 15_000);
  if (!t.ok(d.ok) || !d.ok) return;
  t.same(d.next.in_flight, { live: NOW + 15_000, other: NOW + 50 }, 'the live one renewed, another instance’s kept, expired ones pruned, none added');
  const none = decideIngestRenew(r, ['expired', 'gone'], NOW, 15_000);
  t.ok(none.ok && none.next === r, 'nothing live to renew: no write');
  const started = decideIngestRenew(session('STARTED', { in_flight: {} }), ['live'], NOW, 15_000);
  t.ok(started.ok && started.next.in_flight.live === undefined, 'start-upload ended it: not renewed');
  // Renewed, then recorded: the record needs exactly that live lease.
  const recorded = decideIngestRecord(d.next, { id: 'live', ...entry('products') }, NOW + 14_000);
  t.ok(recorded.ok, 'a renewed lease is recorded after the first lease would have ended');
});

t.test('spare leases: granted with a record, recorded like a lease, invisible to status and start-upload, ended by start', async (t) => {
  const r = session('UPLOADING', { in_flight: { p1: NOW + 100, p2: NOW + 100 } });
  const d = decideIngestRecord(r, { id: 'p1', ...entry('products') }, NOW, { grant: { id: 's1', until: NOW + 100 } });
  if (!t.ok(d.ok) || !d.ok) return;
  t.same(d.next.spare_leases, { s1: NOW + 100 }, 'granted in the record\'s write');
  t.same(d.next.in_flight, { p2: NOW + 100 });
  t.equal(packageFate(d.next, 's1', NOW), 'wait', 'a package under a live spare lease may still be recorded');
  t.equal(packageFate(d.next, 's1', NOW + 100), 'revoke');
  // p2 records: nothing else is under way, so the status counts no ingest in flight.
  const p2 = decideIngestRecord(d.next, { id: 'p2', ...entry('products') }, NOW);
  if (!t.ok(p2.ok) || !p2.ok) return;
  t.equal(statusView(p2.next, 0, NOW).upload_tasks_finished, true, 'an unused spare lease holds nothing: upload tasks finished');
  const started = decideStart(p2.next, { dates, minDate: '2020-01-01', pendingBatches: 0, packagesSeen: packageCount(p2.next), now: NOW, leaseMs: 1000, startId: 's' });
  t.ok(started.ok && !('spare_leases' in started.next), 'start-upload is not held back by a spare lease, and ends it');
  // Taken by an ingest, the spare lease is recorded like any lease; renewed and released alike.
  const renewed = decideIngestRenew(p2.next, ['s1'], NOW + 50, 1000);
  t.ok(renewed.ok && renewed.next.spare_leases?.s1 === NOW + 1050, 'renewed where it is');
  const rec = decideIngestRecord(p2.next, { id: 's1', ...entry('stock', 2) }, NOW);
  t.ok(rec.ok && rec.next.recording.s1?.rows === 2 && !('spare_leases' in rec.next), 'recorded under its spare lease, which ends');
  const released = decideIngestRelease(p2.next, ['s1'], NOW);
  t.ok(released.ok && !('spare_leases' in released.next), 'released');
  const all = decideReleaseAllLeases(p2.next, NOW);
  t.ok(all.ok && !('spare_leases' in all.next), 'a restarted embedded instance ends them');
  // An ingest on it counts as in flight once taken; not after a start, nor once it expired.
  const taken = decideIngestTake(p2.next, 's1', NOW + 10, 1000);
  t.ok(taken.ok && taken.next.in_flight.s1 === NOW + 1010 && !('spare_leases' in taken.next), 'taken: an ingest in flight');
  t.equal(taken.ok && statusView(taken.next, 0, NOW + 10).upload_tasks_finished, false, 'which status counts');
  const afterStart = started.ok ? decideIngestTake(started.next, 's1', NOW, 1000) : null;
  t.match(afterStart, { ok: false, error: { code: 'INVALID_SESSION_STATUS' } }, 'start-upload came first: 409');
  t.match(decideIngestTake(p2.next, 's1', NOW + 100, 1000), { ok: false, error: { code: 'STORAGE_UNAVAILABLE' } }, 'expired: gone');
  // None is granted at maxPackages. One package recorded before (`session`), p1 now: p2's lease and a spare would make 4.
  const full = decideIngestRecord(r, { id: 'p1', ...entry('products') }, NOW, { grant: { id: 's1', until: NOW + 100 }, maxPackages: 3 });
  t.ok(full.ok && !('spare_leases' in full.next), 'no spare lease past maxPackages');
  const room = decideIngestRecord(r, { id: 'p1', ...entry('products') }, NOW, { grant: { id: 's1', until: NOW + 100 }, maxPackages: 4 });
  t.ok(room.ok && room.next.spare_leases?.s1 === NOW + 100, 'one below maxPackages: granted');
  t.notOk(decideIngestBegin(room.ok ? room.next : r, 'p9', NOW, 1000, 4).ok, 'spare leases count against maxPackages at begin');
});

t.test('fold moves recorded packages into the totals, once; the sum never changes', async (t) => {
  let r = session('UPLOADING', { in_flight: { a: NOW + 9, b: NOW + 9, c: NOW + 9 } });
  for (const [id, e] of [['a', entry('stock', 2)], ['b', entry('products', 3)], ['c', entry('stock', 4)]] as const) {
    const d = decideIngestRecord(r, { id, ...e }, NOW);
    if (!d.ok) throw d.error;
    r = d.next;
  }
  const before = entityTotals(r);
  t.same(before, [
    { name: 'products', packages: 2, rows: 6, bytes: 60 },
    { name: 'stock', packages: 2, rows: 6, bytes: 60 },
  ]);
  t.equal(packageCount(r), 4);
  for (const s of STATES) {
    const folded = decideFold({ ...r, status: s }, ['a', 'c', 'unknown'], NOW);
    t.ok(folded.ok, `${s}: fold is allowed`);
    if (!folded.ok) continue;
    t.same(Object.keys(folded.next.recording), ['b']);
    t.same(folded.next.totals.stock, { packages: 2, rows: 6, bytes: 60 });
    t.same(entityTotals(folded.next), before, 'totals unchanged by folding');
    const again = decideFold(folded.next, ['a', 'c'], NOW);
    t.ok(again.ok && again.next === folded.next, 'folding twice changes nothing');
  }
});

t.test('package fate: recording stores, a live lease waits, an expired one is revoked, anything else asks the ledger', async (t) => {
  const r = session('UPLOADING', { recording: { rec: entry('stock') }, in_flight: { live: NOW + 1, dead: NOW } });
  t.equal(packageFate(r, 'rec', NOW), 'store');
  t.equal(packageFate(r, 'live', NOW), 'wait');
  t.equal(packageFate(r, 'dead', NOW), 'revoke');
  t.equal(packageFate(r, 'other', NOW), 'ledger');
  t.equal(packageFate({ ...r, deleted: true }, 'rec', NOW), 'drop');
});

t.test('a record of an older version (every package listed) reads as recording entries', async (t) => {
  const legacy = {
    ...newSession('u-1', 'acme', NOW),
    entities: undefined,
    totals: undefined,
    recording: undefined,
    packages: [
      { id: 'a', entity: 'stock', rows: 2, bytes: 20 },
      { id: 'b', entity: 'products', rows: 1, bytes: 5 },
    ],
  } as unknown as SessionRecord;
  const r = fromStored(legacy);
  t.notOk('packages' in r);
  t.same(r.entities, ['stock', 'products']);
  t.same(r.recording, { a: { entity: 'stock', rows: 2, bytes: 20, object_bytes: 0 }, b: { entity: 'products', rows: 1, bytes: 5, object_bytes: 0 } });
  t.same(r.totals, {});
  const current = session('UPLOADING');
  t.equal(fromStored(current), current, 'a current record is returned as it is');
});

t.test('start-upload check order', async (t) => {
  const base = { dates, minDate: '2020-01-01', pendingBatches: 0, packagesSeen: packageCount(session('UPLOADING')), now: NOW, leaseMs: 1000, startId: 'start-1' };
  for (const s of ['STARTED', 'DONE'] as const) {
    const d = decideStart(session(s), { ...base, dates: { issues: [] } });
    t.ok(!d.ok && d.error.code === 'INVALID_SESSION_STATUS', `${s}: state first`);
  }
  const issues = [{ type: 'missing', loc: ['body', 'date_from'], msg: 'Field required' }];
  let d = decideStart(session('UPLOADING', empty), { ...base, dates: { issues }, pendingBatches: 3 });
  t.ok(!d.ok && d.error.code === 'VALIDATION_FAILED', 'body before the rest');
  d = decideStart(session('UPLOADING', empty), { ...base, minDate: '2024-06-01', pendingBatches: 3 });
  t.ok(!d.ok && d.error.code === 'DATE_BEFORE_MINIMUM' && (d.error.body as any).detail === 'date_from cannot be earlier than 2024-06-01');
  d = decideStart(session('UPLOADING', empty), { ...base, pendingBatches: 3 });
  t.ok(!d.ok && d.error.code === 'NO_ENTITIES');
  d = decideStart(session('UPLOADING'), { ...base, pendingBatches: 1 });
  t.ok(!d.ok && d.error.code === 'UPLOAD_TASKS_IN_PROGRESS', 'pending batches');
  d = decideStart(session('UPLOADING'), { ...base, packagesSeen: base.packagesSeen - 1 });
  t.ok(!d.ok && d.error.code === 'UPLOAD_TASKS_IN_PROGRESS', 'a package recorded since the pending check was made (its lease gone with it)');
  d = decideStart(session('UPLOADING', { in_flight: { p: NOW + 1 } }), base);
  t.ok(!d.ok && d.error.code === 'UPLOAD_TASKS_IN_PROGRESS', 'in-flight ingest');
  d = decideStart(session('UPLOADING', { in_flight: { p: NOW - 1 } }), base);
  t.ok(d.ok, 'an expired lease (dead instance) does not block');
  if (d.ok) {
    t.equal(d.next.status, 'STARTED');
    t.same({ ...d.next.workflow, started_at: undefined }, { ...dates, started_at: undefined, starting_until: NOW + 1000, start_id: 'start-1' }, 'held by its gateway for the lease');
    const again = decideStart(d.next, { ...base, now: NOW + 5 });
    t.ok(again.ok && again.next === d.next, 'decided again on its own write (landed, answered as a lost compare-and-set): started, nothing to write');
    const other = decideStart(d.next, { ...base, startId: 'start-2' });
    t.ok(!other.ok && other.error.code === 'INVALID_SESSION_STATUS', "another start's: 409");
  }
});

t.test('a failed start rolls back only its own start', async (t) => {
  const r = session('STARTED');
  const mine = decideStartFailed(r, r.workflow!.started_at, NOW);
  t.ok(mine.ok && mine.next.status === 'UPLOADING' && !mine.next.workflow);
  const other = decideStartFailed(r, 'another start', NOW);
  t.ok(other.ok && other.next === r, 'someone else’s start is left alone');
});

t.test("a start held by its gateway: renewed, taken once the Connector took it, lapsed back to UPLOADING if its gateway died", async (t) => {
  const d = decideStart(session('UPLOADING'), { dates, minDate: '2020-01-01', pendingBatches: 0, packagesSeen: packageCount(session('UPLOADING')), now: NOW, leaseMs: 1000, startId: 's' });
  if (!d.ok) return t.fail('started');
  const r = d.next;
  const at = r.workflow!.started_at;
  const renewed = decideStartRenew(r, at, NOW + 500, 1000);
  t.ok(renewed.ok && renewed.next.workflow?.starting_until === NOW + 1500, 'renewed from now');
  const other = decideStartRenew(r, 'another start', NOW + 500, 1000);
  t.ok(other.ok && other.next === r, "another start's hold is left alone");
  const lapsedEarly = decideStartLapsed(r, NOW + 999);
  t.ok(lapsedEarly.ok && lapsedEarly.next === r, 'held: left alone');
  const lapsed = decideStartLapsed(r, NOW + 1000);
  t.ok(lapsed.ok && lapsed.next.status === 'UPLOADING' && !lapsed.next.workflow, 'lapsed: back to UPLOADING, as a failed start');
  const dead = decideStartLapsed(r, NOW, true);
  t.ok(dead.ok && dead.next.status === 'UPLOADING', 'every hold, when its holder is known dead (a restarted embedded instance)');
  const taken = decideStartTaken(r, at, NOW + 10);
  if (!taken.ok) return t.fail('taken');
  t.equal(taken.next.status, 'STARTED');
  t.notOk('starting_until' in taken.next.workflow!, 'taken: no longer held');
  const never = decideStartLapsed(taken.next, NOW + 10 ** 9, true);
  t.ok(never.ok && never.next === taken.next, 'a start the Connector took never lapses (nor one an earlier version wrote, without a hold)');
  const renewTaken = decideStartRenew(taken.next, at, NOW + 20, 1000);
  t.ok(renewTaken.ok && renewTaken.next === taken.next, 'renewing a taken start changes nothing');
  if (!lapsed.ok) return;
  const late = decideStartTaken(lapsed.next, at, NOW + 1001);
  t.ok(!late.ok && late.error.statusCode === 503, 'the Connector took a start that lapsed meanwhile: 503 (a retry starts again)');
  const webhook = decideWebhook(r, { is_terminated: false }, NOW + 20);
  const afterWebhook = decideStartTaken(webhook.next, at, NOW + 30);
  t.ok(afterWebhook.ok && afterWebhook.next === webhook.next, 'its webhook came first: nothing to mark');
});

t.test('terminate only in STARTED', async (t) => {
  for (const s of STATES) {
    const d = decideTerminate(session(s), NOW);
    if (s === 'STARTED') t.ok(d.ok && d.next.status === 'STARTED' && d.next.workflow?.terminate_requested_at, 'STARTED at first');
    else t.ok(!d.ok && d.error.statusCode === 404 && (d.error.body as any).detail === 'Workflow is not running');
  }
});

t.test('webhook: STARTED → DONE / UPLOADING; any other state ignored', async (t) => {
  const cases = [
    [{ is_terminated: false }, 'DONE', 'succeeded'],
    [{ is_terminated: false, status: 'succeeded' as const }, 'DONE', 'succeeded'],
    [{ is_terminated: true }, 'UPLOADING', 'terminated'],
    [{ is_terminated: false, status: 'terminated' as const }, 'UPLOADING', 'terminated'],
    [{ is_terminated: false, status: 'failed' as const, message: 'x' }, 'UPLOADING', 'failed'],
  ] as const;
  for (const [event, next, outcome] of cases) {
    const d = decideWebhook(session('STARTED'), event, NOW);
    t.ok(d.applied);
    t.equal(d.next.status, next);
    t.equal(d.next.last_workflow?.status, outcome);
    t.notOk(d.next.workflow);
    t.same(entityTotals(d.next), entityTotals(session('STARTED')), 'data kept');
  }
  for (const s of ['UPLOADING', 'DONE'] as const) {
    const r = session(s);
    const d = decideWebhook(r, { is_terminated: false }, NOW);
    t.notOk(d.applied);
    t.equal(d.next, r);
  }
});

t.test("webhook: the summary keeps the Connector's message up to 1,000 characters (every write of the session carries it; NATS takes at most 1 MiB)", async (t) => {
  const long = decideWebhook(session('STARTED'), { is_terminated: false, status: 'failed', message: 'é'.repeat(600_000) }, NOW);
  t.equal(long.next.last_workflow?.message, `${'é'.repeat(1000)}…`, 'cut, marked');
  const pairs = decideWebhook(session('STARTED'), { is_terminated: false, status: 'failed', message: `a${'😀'.repeat(600)}` }, NOW);
  t.equal(pairs.next.last_workflow?.message, `a${'😀'.repeat(499)}…`, 'never between the halves of a surrogate pair');
  const exact = 'x'.repeat(1000);
  t.equal(decideWebhook(session('STARTED'), { is_terminated: false, message: exact }, NOW).next.last_workflow?.message, exact, 'up to the bound: as sent');
});

t.test('webhook: an ignored signed request is remembered, so its replay after the next start is ignored too', async (t) => {
  const replay = { id: 'sig-1', until: NOW + 300_000 };
  const ignored = decideWebhook(session('UPLOADING'), { is_terminated: false, replay }, NOW);
  t.notOk(ignored.applied);
  t.equal(ignored.next.status, 'UPLOADING', 'the state is unchanged');
  t.same(ignored.next.applied_webhooks, [replay], 'its id is remembered');
  t.equal(decideWebhook(ignored.next, { is_terminated: false, replay }, NOW).next, ignored.next, 'seen already: nothing to write');
  const started = { ...ignored.next, status: 'STARTED' as const, workflow: { date_from: '2024-01-01', date_to: '2024-01-31', started_at: 'x' } };
  const replayed = decideWebhook(started, { is_terminated: false, replay }, NOW + 1000);
  t.notOk(replayed.applied, 'replayed after the next start: ignored');
  t.equal(replayed.next.status, 'STARTED');
  const fresh = decideWebhook(started, { is_terminated: false, replay: { id: 'sig-2', until: NOW + 301_000 } }, NOW + 1000);
  t.ok(fresh.applied, 'another signed request is applied');
  t.same(fresh.next.applied_webhooks?.map((w) => w.id), ['sig-1', 'sig-2']);
  const later = decideWebhook(fresh.next, { is_terminated: false, replay: { id: 'sig-3', until: NOW + 900_000 } }, NOW + 300_001);
  t.same(later.next.applied_webhooks?.map((w) => w.id), ['sig-2', 'sig-3'], 'ids past their replay window are dropped');
  const deleted = session('UPLOADING', { deleted: true });
  t.equal(decideWebhook(deleted, { is_terminated: false, replay }, NOW).next, deleted, 'a deleted session: nothing written');
});

t.test('delete only in UPLOADING', async (t) => {
  for (const s of STATES) {
    const d = decideDelete(session(s), NOW);
    if (s === 'UPLOADING') t.ok(d.ok && d.next.deleted === true);
    else t.ok(!d.ok && (d.error.body as any).detail.actual === s);
  }
});

t.test('status flags come from state, packages, leases and pending batches', async (t) => {
  t.match(statusView(session('UPLOADING'), 0, NOW), { upload_tasks_finished: true, can_upload_entities: true, can_start_upload: true, can_terminate: false, entities: ['products'] });
  t.match(statusView(session('UPLOADING'), 2, NOW), { upload_tasks_finished: false, can_start_upload: false });
  t.match(statusView(session('UPLOADING', { in_flight: { a: NOW + 1 } }), 0, NOW), { upload_tasks_finished: false, can_start_upload: false });
  t.match(statusView(session('UPLOADING', empty), 0, NOW), { can_start_upload: false, entities: [] });
  t.match(statusView(session('STARTED'), 0, NOW), { can_upload_entities: false, can_start_upload: false, can_terminate: true });
  t.match(statusView(session('DONE'), 0, NOW), { can_upload_entities: false, can_start_upload: false, can_terminate: false });
  let two = session('UPLOADING', { ...empty, in_flight: { a: NOW + 9, b: NOW + 9, c: NOW + 9 } });
  for (const [id, entity] of [['a', 'stock'], ['b', 'products'], ['c', 'stock']] as const) {
    const d = decideIngestRecord(two, { id, ...entry(entity) }, NOW);
    if (d.ok) two = d.next;
  }
  t.same(statusView(two, 0, NOW).entities, ['stock', 'products'], 'each name once, in order of first upload');
});
