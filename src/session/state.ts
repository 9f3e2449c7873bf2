/**
 * The session state machine as pure functions: (summary, event) → next summary, or the
 * error the client gets. Covers every row of the transition table of docs/api.md plus the
 * decided ones (delete, workflow failure). Nothing here does I/O or reads the clock: the service
 * passes `now` in.
 *
 * A session is a small summary plus a package ledger (store/ports.ts `PackageLedger`). The
 * summary holds what status and start-upload need — state, entity names and totals, the
 * leases of ingests in flight — and never grows with the number of packages: recording a
 * package costs the same at package 1,000,000 as at package 1.
 *
 * How a package is recorded (each arrow a compare-and-set on the summary, shared by every
 * package ready at that moment, see summaries.ts):
 * ```
 *  begin ──> in_flight[id] = lease ──record──> recording[id] = entry ──fold──> totals += entry
 *                 │                         (the 200 goes out here)    (after the ledger holds
 *                 └──release / revoke (lease gone: the package can        the entry durably)
 *                    never be recorded; the uploader drops it)
 * ```
 * `recording` is the fence between the summary and the ledger: an entry leaves it only once
 * the ledger holds it, so a package is recorded exactly when it is in `recording` or in the
 * ledger, and readers that look at the summary first and the ledger second never miss one
 * (`packageFate`). Writing an entry to the ledger is idempotent, so a dead gateway's
 * entries are completed by whoever finds them (start-upload, the embedded restart).
 */
import { errors, type ServiceError, type ValidationIssue } from '../errors.js';

export type SessionStatus = 'UPLOADING' | 'STARTED' | 'DONE';

/** One accepted package; its rows are stored as one object of `object_bytes` bytes. */
export interface PackageEntry {
  id: string;
  entity: string;
  rows: number;
  /** Encoded row bytes (NDJSON) of the package. */
  bytes: number;
  /** Size of the stored object: header line plus rows. */
  object_bytes: number;
}

export interface EntityTotals {
  packages: number;
  rows: number;
  bytes: number;
}

export interface WorkflowOutcome {
  status: 'succeeded' | 'failed' | 'terminated';
  message: string;
  finished_at: string;
}

export interface SessionRecord {
  upload_uuid: string;
  client_id: string;
  status: SessionStatus;
  /** Entity names in order of first recorded package, each once. */
  entities: string[];
  /** Per entity: the packages folded from `recording` (the ledger holds each of them). */
  totals: Record<string, EntityTotals>;
  /** Recorded packages whose ledger entry is not known to be durable yet: package id → entry. */
  recording: Record<string, Omit<PackageEntry, 'id'>>;
  /** Ingest requests under way: package id → lease expiry (epoch ms). Expired leases are dead instances. */
  in_flight: Record<string, number>;
  /**
   * Leases granted ahead, each with a record, to the gateway that wrote it, for its next
   * ingest of the session (package id → expiry, as `in_flight`): an ingest begins on one at
   * once, and `decideIngestTake` moves it to `in_flight`. Status and start-upload do not count them.
   */
  spare_leases?: Record<string, number>;
  created_at: string;
  updated_at: string;
  previous_upload_uuid?: string;
  workflow?: {
    date_from: string;
    date_to: string;
    started_at: string;
    terminate_requested_at?: string;
    /**
     * While start-upload runs (the start body, the Connector's call): until when its gateway
     * holds the start (epoch ms, renewed as an ingest's lease). Gone once the Connector took
     * the start. A start whose gateway died lapses back to UPLOADING (`decideStartLapsed`).
     * Absent in summaries of earlier versions: taken.
     */
    starting_until?: number;
    /** The start-upload call that wrote it (`StartInput.startId`). Absent in summaries of earlier versions. */
    start_id?: string;
  };
  last_workflow?: WorkflowOutcome;
  /**
   * `workflow.started_at` of the start whose workflow `last_workflow` ended: how that start's
   * gateway, answered by the Connector after the webhook, knows it was its own (the two
   * gateways' clocks need not agree). Absent in summaries of earlier versions.
   */
  last_workflow_started_at?: string;
  /**
   * Signed webhooks this session took in, applied or ignored, whose signature still verifies:
   * `id` names the signed request, `until` (epoch ms) is when its timestamp leaves the replay
   * window. A replay of one of them is ignored, also after the session was started again.
   * (The name is older than the ignored ones' place in it; stored summaries keep it.)
   */
  applied_webhooks?: { id: string; until: number }[];
  /** Set by delete: the record only waits for its background clean-up. */
  deleted?: true;
}

/** The calling client, as the session rules need it: its id and the earliest `date_from` it may ask for. */
export interface ClientRef {
  readonly id: string;
  readonly minDate: string;
}

/** The client's active-session pointer: its latest session, whatever its state. */
export interface ActivePointer {
  upload_uuid: string;
}

export type Decision<T = SessionRecord> = { ok: true; next: T } | { ok: false; error: ServiceError };

const ok = (next: SessionRecord): Decision => ({ ok: true, next });
const fail = (error: ServiceError): Decision => ({ ok: false, error });
const touch = (r: SessionRecord, now: number, patch: Partial<SessionRecord>): SessionRecord => ({
  ...r,
  ...patch,
  updated_at: new Date(now).toISOString(),
});

export function newSession(uploadUuid: string, clientId: string, now: number, previous?: string): SessionRecord {
  const at = new Date(now).toISOString();
  return {
    upload_uuid: uploadUuid,
    client_id: clientId,
    status: 'UPLOADING',
    entities: [],
    totals: {},
    recording: {},
    in_flight: {},
    created_at: at,
    updated_at: at,
    ...(previous ? { previous_upload_uuid: previous } : {}),
  };
}

/**
 * A summary as read from the store. Records written before the ledger existed list every
 * package in `packages`: those become `recording` entries, which the service writes to the
 * ledger and folds like any other (nothing of an older data directory is lost).
 */
export function fromStored(raw: SessionRecord & { packages?: { id: string; entity: string; rows: number; bytes: number }[] }): SessionRecord {
  if (!raw.packages) return raw;
  const { packages, ...rest } = raw;
  const recording: SessionRecord['recording'] = { ...(raw.recording ?? {}) };
  const entities = [...(raw.entities ?? [])];
  for (const p of packages) {
    // The object's size was not kept: 0 (no stored object is empty) makes start-upload read it from storage.
    recording[p.id] = { entity: p.entity, rows: p.rows, bytes: p.bytes, object_bytes: 0 };
    if (!entities.includes(p.entity)) entities.push(p.entity);
  }
  return { ...rest, entities, totals: raw.totals ?? {}, recording };
}

/** initialize-session against the client's current active session (null: none, or deleted). */
export function decideInitialize(
  current: SessionRecord | null,
): { create: true; previous?: string } | { create: false; error: ServiceError } {
  if (current === null) return { create: true };
  switch (current.status) {
    case 'DONE':
      return { create: true, previous: current.upload_uuid };
    case 'UPLOADING':
      return {
        create: false,
        error: errors.initConflict({
          status: 'already_exists',
          session_status: 'UPLOADING',
          upload_uuid: current.upload_uuid,
          message: 'Upload session already exists',
        }),
      };
    case 'STARTED':
      return {
        create: false,
        error: errors.initConflict({
          status: 'workflow_running',
          session_status: 'STARTED',
          upload_uuid: current.upload_uuid,
          message: 'Connector workflow is running for the current upload session',
        }),
      };
  }
}

function requireUploading(r: SessionRecord): ServiceError | null {
  return r.status === 'UPLOADING' ? null : errors.invalidSessionStatus('UPLOADING', r.status);
}

/** Per-entity totals of every recorded package (folded and still recording), in order of first upload. */
export function entityTotals(r: SessionRecord): ({ name: string } & EntityTotals)[] {
  const totals = new Map(r.entities.map((name) => [name, { name, packages: 0, rows: 0, bytes: 0, ...r.totals[name] }]));
  for (const p of Object.values(r.recording)) {
    const t = totals.get(p.entity) ?? { name: p.entity, packages: 0, rows: 0, bytes: 0 };
    t.packages += 1;
    t.rows += p.rows;
    t.bytes += p.bytes;
    totals.set(p.entity, t);
  }
  return [...totals.values()];
}

/** Recorded packages, folded or not. */
export function packageCount(r: SessionRecord): number {
  let n = Object.keys(r.recording).length;
  for (const t of Object.values(r.totals)) n += t.packages;
  return n;
}

/** Live in-flight ingests, ignoring leases of instances that died (and spare leases). */
export function liveInFlight(r: SessionRecord, now: number): number {
  return liveLeases(r.in_flight, now);
}

function liveLeases(leases: Record<string, number> | undefined, now: number): number {
  let n = 0;
  for (const until of Object.values(leases ?? {})) if (until > now) n++;
  return n;
}

function pruneLeases(inFlight: Record<string, number> | undefined, now: number, without?: ReadonlySet<string>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [id, until] of Object.entries(inFlight ?? {})) if (!without?.has(id) && until > now) out[id] = until;
  return out;
}

/** A package's lease, taken with a write (`in_flight`) or spare (`spare_leases`). */
function leaseOf(r: SessionRecord, packageId: string): number | undefined {
  return r.in_flight[packageId] ?? r.spare_leases?.[packageId];
}

/** Both lease maps without `ids` and expired leases (no `spare_leases` key once none is left). */
function withoutLeases(r: SessionRecord, now: number, ids: ReadonlySet<string>): Pick<SessionRecord, 'in_flight' | 'spare_leases'> {
  const spare = pruneLeases(r.spare_leases, now, ids);
  return { in_flight: pruneLeases(r.in_flight, now, ids), spare_leases: Object.keys(spare).length > 0 ? spare : undefined };
}

/** `touch` that leaves no `spare_leases: undefined` behind in the stored summary. */
function touchLeases(r: SessionRecord, now: number, patch: Partial<SessionRecord>): SessionRecord {
  const next = touch(r, now, patch);
  if (next.spare_leases === undefined) delete next.spare_leases;
  return next;
}

/**
 * A new ingest takes a lease; refused once the session's packages and live leases reach
 * `maxPackages` (a safety bound far beyond what a client reaches; default unbounded).
 * Leases count, so concurrent ingests cannot overshoot.
 */
export function decideIngestBegin(r: SessionRecord, packageId: string, now: number, leaseMs: number, maxPackages = Infinity): Decision {
  const bad = requireUploading(r);
  if (bad) return fail(bad);
  if (packageCount(r) + liveInFlight(r, now) + liveLeases(r.spare_leases, now) >= maxPackages) return fail(errors.sessionFull(maxPackages));
  return ok(touch(r, now, { in_flight: { ...pruneLeases(r.in_flight, now), [packageId]: now + leaseMs } }));
}

/** A spare lease granted with a record's write (`decideIngestRecord`). */
export interface SpareLeases {
  grant?: { id: string; until: number };
  /** The bound of `decideIngestBegin`: no spare is granted at it. */
  maxPackages?: number;
}

/**
 * The package's rows are committed to the queue: record it and end its lease. Only while
 * its lease is live: once the lease is gone (released, expired, or revoked by an uploader
 * that found the package unrecorded, see `packageFate`), the package may already have been
 * dropped from the queue, so recording it would answer 200 for rows that are never stored.
 *
 * The same write may grant the gateway a spare lease for its next ingest of the session,
 * which then begins on it at once: the package has its lease before its queue commit, and
 * `decideIngestTake` moves it to `in_flight` meanwhile. An unused spare lease holds
 * nothing, so status and start-upload do not count spare leases, and start-upload ends them.
 *
 * A package already recording is this very write's earlier attempt, landed though its answer
 * said otherwise (a lost compare-and-set reported for a write that was stored: the decision
 * runs again on the summary it made): recorded, nothing more to write. Only the ingest that
 * holds a package id records it.
 */
export function decideIngestRecord(r: SessionRecord, pkg: PackageEntry, now: number, spares: SpareLeases = {}): Decision {
  if (pkg.id in r.recording) return ok(r);
  const bad = requireUploading(r);
  if (bad) return fail(bad);
  const lease = leaseOf(r, pkg.id);
  // 503, not 500: the lease ended because its renewals could not be written in time (or a
  // retry took the request over); nothing of the package is stored, and a retry runs it again.
  if (lease === undefined || lease <= now) return fail(errors.storageUnavailable(new Error(`Ingest lease of package ${pkg.id} is gone`)));
  const { id, ...entry } = pkg;
  const leases = withoutLeases(r, now, new Set([id]));
  const grant = spares.grant;
  const full = packageCount(r) + 1 + liveLeases(leases.in_flight, now) + liveLeases(leases.spare_leases, now) >= (spares.maxPackages ?? Infinity);
  if (grant && !full) leases.spare_leases = { ...leases.spare_leases, [grant.id]: grant.until };
  return ok(
    touchLeases(r, now, {
      entities: r.entities.includes(entry.entity) ? r.entities : [...r.entities, entry.entity],
      recording: { ...r.recording, [id]: entry },
      ...leases,
    }),
  );
}

/**
 * The ledger holds these packages durably: move them from `recording` into the totals.
 * Allowed in any state (the sum of both never changes); ids no longer recording are skipped.
 */
export function decideFold(r: SessionRecord, packageIds: Iterable<string>, now: number): Decision {
  let recording: SessionRecord['recording'] | null = null;
  let totals: SessionRecord['totals'] | null = null;
  for (const id of packageIds) {
    const entry = (recording ?? r.recording)[id];
    if (!entry) continue;
    recording ??= { ...r.recording };
    totals ??= { ...r.totals };
    delete recording[id];
    const t = totals[entry.entity] ?? { packages: 0, rows: 0, bytes: 0 };
    totals[entry.entity] = { packages: t.packages + 1, rows: t.rows + entry.rows, bytes: t.bytes + entry.bytes };
  }
  if (!recording || !totals) return ok(r);
  return ok(touch(r, now, { recording, totals }));
}

/**
 * What an uploader does with a package it took from the queue. The queue commit comes
 * before the session records the package (and the 200 goes out), so a gateway that dies
 * between the two leaves a committed package that no client was told about:
 * - `store`: the summary records it (`recording`);
 * - `wait`: its lease is live, the ingest may still record it: deliver it again later;
 * - `revoke`: its lease has expired but is still in the summary: remove it with a
 *   compare-and-set first (so a gateway whose clock is behind cannot still record), then
 *   judge again;
 * - `ledger`: the summary neither records it nor holds a lease for it: it was recorded and
 *   folded (then the ledger, read after this summary, holds it: store) or it can never be
 *   recorded (drop);
 * - `drop`: the session is deleted (one that reads as absent: recovery.ts `absentSession`).
 */
export type PackageFate = 'store' | 'drop' | 'wait' | 'revoke' | 'ledger';

export function packageFate(r: SessionRecord, packageId: string, now: number): PackageFate {
  if (r.deleted) return 'drop';
  if (packageId in r.recording) return 'store';
  const lease = leaseOf(r, packageId);
  if (lease === undefined) return 'ledger';
  return lease > now ? 'wait' : 'revoke';
}

/** A restarted embedded instance: every lease in the summary belongs to the dead process. */
export function decideReleaseAllLeases(r: SessionRecord, now: number): Decision {
  if (!holdsLeases(r)) return ok(r);
  return ok(touchLeases(r, now, { in_flight: {}, spare_leases: undefined }));
}

/** Whether the summary holds any lease, live or expired, spare or not. */
export function holdsLeases(r: SessionRecord): boolean {
  return Object.keys(r.in_flight).length > 0 || r.spare_leases !== undefined;
}

/**
 * An ingest began on a spare lease: it becomes an ingest in flight like any other (status and
 * start-upload count it from now on). Only while the session is UPLOADING and the spare lease
 * live: otherwise the ingest's record will be refused as well (409, or 503 for the lease).
 */
export function decideIngestTake(r: SessionRecord, packageId: string, now: number, leaseMs: number): Decision {
  const bad = requireUploading(r);
  if (bad) return fail(bad);
  const lease = r.spare_leases?.[packageId];
  if (lease === undefined || lease <= now) return fail(errors.storageUnavailable(new Error(`Spare lease ${packageId} is gone`)));
  const leases = withoutLeases(r, now, new Set([packageId]));
  return ok(touchLeases(r, now, { ...leases, in_flight: { ...leases.in_flight, [packageId]: now + leaseMs } }));
}

/**
 * The heartbeat of ingests still running in one instance: their leases, while still live,
 * last `leaseMs` from now. A lease that expired or is gone (released, revoked by an uploader,
 * ended by start-upload or a takeover) stays so: its package may already have been dropped,
 * and renewing it would let it be recorded. Allowed in any state; expired leases are pruned.
 */
export function decideIngestRenew(r: SessionRecord, packageIds: Iterable<string>, now: number, leaseMs: number): Decision {
  let leases: Pick<SessionRecord, 'in_flight' | 'spare_leases'> | null = null;
  for (const id of packageIds) {
    const lease = leaseOf(r, id);
    if (lease === undefined || lease <= now) continue;
    leases ??= withoutLeases(r, now, new Set());
    if (id in r.in_flight) leases.in_flight[id] = now + leaseMs;
    else leases.spare_leases = { ...leases.spare_leases, [id]: now + leaseMs };
  }
  return leases ? ok(touchLeases(r, now, leases)) : ok(r);
}

/** Packages failed or were abandoned, or spare leases unused: only their leases end. Allowed in any state. */
export function decideIngestRelease(r: SessionRecord, packageIds: readonly string[], now: number): Decision {
  if (!packageIds.some((id) => leaseOf(r, id) !== undefined)) return ok(r);
  return ok(touchLeases(r, now, withoutLeases(r, now, new Set(packageIds))));
}

/**
 * `decideIngestRelease` that is written even when none of the leases is held: "neither
 * recording nor leased, so never to be recorded" holds only of the stored summary, and on NATS
 * a read alone does not prove it is that one (for a moment after a partition heals, a deposed
 * leader still answers reads with what it had). The compare-and-set of this write does: it
 * lands only on the summary the record write would have to follow.
 */
export function decideIngestFence(r: SessionRecord, packageIds: readonly string[], now: number): Decision {
  return asFence(r, decideIngestRelease(r, packageIds, now), now);
}

/**
 * `decision` on `r`, written even where it changes nothing: a compare-and-set that a write still
 * in doubt, expecting `r`'s revision, can never land after.
 */
function asFence(r: SessionRecord, decision: Decision, now: number): Decision {
  return decision.ok && decision.next === r ? ok(touch(r, now, {})) : decision;
}

export interface StartInput {
  /** How long the start holds the session before its gateway must renew it (`decideStartRenew`). */
  leaseMs: number;
  /** The body's dates once they passed format validation, or the 422 issues. */
  dates: { date_from: string; date_to: string } | { issues: ValidationIssue[] };
  minDate: string;
  /** Batches of the session not yet durably in object storage. */
  pendingBatches: number;
  /** The session's packages (`packageCount`) read before the pending check: more now were recorded since, maybe unseen by it. */
  packagesSeen: number;
  now: number;
  /**
   * Random, one per start-upload call: a write of this start that landed but was answered as a
   * lost compare-and-set is decided again on its own summary, which is told apart from another
   * start's by this (started, not 409).
   */
  startId: string;
}

/** start-upload, in the check order of docs/api.md. On success the session is STARTED before the Connector is called. */
export function decideStart(r: SessionRecord, input: StartInput): Decision {
  if (r.status === 'STARTED' && r.workflow?.start_id === input.startId) return ok(r);
  const bad = requireUploading(r);
  if (bad) return fail(bad);
  if ('issues' in input.dates) return fail(errors.validationFailed(input.dates.issues));
  const { date_from, date_to } = input.dates;
  if (date_from < input.minDate) return fail(errors.dateBeforeMinimum(input.minDate));
  if (packageCount(r) === 0) return fail(errors.noEntities());
  if (liveInFlight(r, input.now) > 0 || input.pendingBatches > 0 || packageCount(r) > input.packagesSeen) return fail(errors.uploadTasksInProgress());
  return ok(
    touchLeases(r, input.now, {
      status: 'STARTED',
      // Dead instances' leases and spare ones can never be recorded any more (recording needs UPLOADING).
      in_flight: {},
      spare_leases: undefined,
      workflow: { date_from, date_to, started_at: new Date(input.now).toISOString(), starting_until: input.now + input.leaseMs, start_id: input.startId },
    }),
  );
}

/** The start's gateway still works on it (the start body, the Connector's call): its hold renewed. */
export function decideStartRenew(r: SessionRecord, startedAt: string, now: number, leaseMs: number): Decision {
  if (!startHeld(r, startedAt)) return ok(r);
  return ok(touch(r, now, { workflow: { ...r.workflow!, starting_until: now + leaseMs } }));
}

/**
 * The Connector took the start: the session stays STARTED until its webhook. Refused (503) when
 * the start is no longer this one's (its hold lapsed meanwhile, and it went back to UPLOADING):
 * the client is told to retry, which the Connector treats as the same workflow.
 */
export function decideStartTaken(r: SessionRecord, startedAt: string, now: number): Decision {
  if (r.status === 'STARTED' && r.workflow?.started_at === startedAt) {
    if (r.workflow.starting_until === undefined) return ok(r);
    const { starting_until: _held, ...workflow } = r.workflow;
    return ok(touch(r, now, { workflow }));
  }
  // The webhook came first: the workflow ran, nothing to mark. (By its time only when an earlier
  // version applied it: written on another gateway, whose clock may be behind this one's.)
  if (r.last_workflow_started_at === startedAt) return ok(r);
  if (r.last_workflow && r.last_workflow_started_at === undefined && r.last_workflow.finished_at >= startedAt) return ok(r);
  return fail(errors.storageUnavailable(new Error(`The start of ${r.upload_uuid} lapsed before the Connector's answer was recorded`)));
}

/**
 * A start whose gateway stopped holding it (it died during the Connector's call): back to
 * UPLOADING, as a failed start. `everyHold`: also one still held (its holder is known dead).
 */
export function decideStartLapsed(r: SessionRecord, now: number, everyHold = false): Decision {
  if (!startLapsed(r, now, everyHold)) return ok(r);
  return decideStartFailed(r, r.workflow!.started_at, now);
}

/** Whether a start-upload's gateway stopped holding it before the Connector took it (`decideStartLapsed` then applies). */
export function startLapsed(r: SessionRecord, now: number, everyHold = false): boolean {
  const until = r.status === 'STARTED' ? r.workflow?.starting_until : undefined;
  return until !== undefined && (everyHold || until <= now);
}

function startHeld(r: SessionRecord, startedAt: string): boolean {
  return r.status === 'STARTED' && r.workflow?.started_at === startedAt && r.workflow.starting_until !== undefined;
}

/** The Connector refused or could not be reached: back to UPLOADING as if start had not happened. */
export function decideStartFailed(r: SessionRecord, startedAt: string, now: number): Decision {
  if (r.status !== 'STARTED' || r.workflow?.started_at !== startedAt) return ok(r);
  const { workflow: _dropped, ...rest } = r;
  return ok(touch(rest, now, { status: 'UPLOADING' }));
}

/**
 * A start whose own write's outcome was unknown (its answer a 503): put back if it landed, by
 * its `startId` (no Connector was called for it), before a retry meets it as 409.
 */
export function decideStartAbandoned(r: SessionRecord, startId: string, now: number): Decision {
  // Not there (yet): written anyway, so the write in doubt can never land after.
  return asFence(r, r.workflow?.start_id === startId ? decideStartFailed(r, r.workflow.started_at, now) : ok(r), now);
}

export function decideTerminate(r: SessionRecord, now: number): Decision {
  if (r.status !== 'STARTED' || !r.workflow) return fail(errors.workflowNotRunning());
  return ok(touch(r, now, { workflow: { ...r.workflow, terminate_requested_at: new Date(now).toISOString() } }));
}

export interface WebhookEvent {
  is_terminated: boolean;
  status?: 'succeeded' | 'failed' | 'terminated';
  message?: string;
  /** The signed request (`id`, the same for a byte-identical replay) and until when (epoch ms) its signature verifies. */
  replay?: { id: string; until: number };
}

/**
 * The Connector's completion webhook. Only a STARTED session changes: terminated or failed
 * → UPLOADING (data kept), otherwise DONE. Anything else is a repeat or a late call: ignored,
 * but its signed request is remembered all the same (`next` then differs from `r` only in
 * that), so that a replay of it cannot end a workflow started later.
 */
export function decideWebhook(r: SessionRecord, event: WebhookEvent, now: number): { applied: boolean; next: SessionRecord } {
  if (r.deleted) return { applied: false, next: r };
  const replay = event.replay;
  // A captured webhook replayed: while a later workflow runs, it must not end it.
  if (replay && r.applied_webhooks?.some((w) => w.id === replay.id)) return { applied: false, next: r };
  const seen = replay ? { applied_webhooks: [...(r.applied_webhooks ?? []).filter((w) => w.until >= now), replay] } : {};
  if (r.status !== 'STARTED') return { applied: false, next: replay ? touch(r, now, seen) : r };
  const finished_at = new Date(now).toISOString();
  const status = event.is_terminated || event.status === 'terminated' ? 'terminated' : event.status === 'failed' ? 'failed' : 'succeeded';
  const message =
    boundedMessage(event.message) ??
    { terminated: 'Workflow terminated', failed: 'Workflow failed', succeeded: 'Workflow finished' }[status];
  const { workflow: ended, last_workflow_started_at: _earlier, ...rest } = r;
  return {
    applied: true,
    next: touch(rest, now, {
      status: status === 'succeeded' ? 'DONE' : 'UPLOADING',
      last_workflow: { status, message, finished_at },
      ...(ended ? { last_workflow_started_at: ended.started_at } : {}),
      ...seen,
    }),
  };
}

/**
 * Of the Connector's `message`, the characters the summary keeps (then `…`): every write of the
 * session carries it, and on NATS a summary of over 1 MiB cannot be written at all.
 */
export const MAX_WORKFLOW_MESSAGE = 1000;

function boundedMessage(message: string | undefined): string | undefined {
  if (message === undefined || message.length <= MAX_WORKFLOW_MESSAGE) return message;
  // Never between the two halves of a surrogate pair.
  const code = message.charCodeAt(MAX_WORKFLOW_MESSAGE - 1);
  const end = code >= 0xd800 && code <= 0xdbff ? MAX_WORKFLOW_MESSAGE - 1 : MAX_WORKFLOW_MESSAGE;
  return `${message.slice(0, end)}…`;
}

export function decideDelete(r: SessionRecord, now: number): Decision {
  const bad = requireUploading(r);
  if (bad) return fail(bad);
  return ok(touch(r, now, { deleted: true }));
}

/** A client's session in its index (`sessions.<client hex>.<upload_uuid>`, store/keys.ts), for the listing. */
export interface ClientSessionEntry {
  upload_uuid: string;
  created_at: string;
}

/** What a session (or one entity of it) holds: recorded packages, their rows and row bytes, and how many are in object storage. */
export interface SessionCounts {
  /** Recorded packages (each accepted package once, whatever retries or replays). */
  packages: number;
  rows: number;
  /** Validated row bytes as stored: the NDJSON row lines of the packages' objects, header lines excluded. */
  bytes: number;
  /** Of `packages`, those already in object storage. */
  stored_packages: number;
}

export interface EntityCounts extends SessionCounts {
  name: string;
}

export interface StatusView {
  upload_uuid: string;
  session_status: SessionStatus;
  entities: string[];
  upload_tasks_finished: boolean;
  can_upload_entities: boolean;
  can_start_upload: boolean;
  can_terminate: boolean;
  last_workflow?: WorkflowOutcome;
  /** One per entity, in the order of `entities`. */
  entity_counts: EntityCounts[];
  totals: SessionCounts;
}

/**
 * Per-entity counts in the order of `entities`, and their sum. `stored` (per entity) comes from
 * the uploader's own record, read beside the summary: a package is stored only once recorded,
 * so a count above the recorded packages can only be a read of the summary older than that of
 * the stored record, and is capped to it.
 */
export function sessionCounts(r: SessionRecord, stored: ReadonlyMap<string, number>): { entity_counts: EntityCounts[]; totals: SessionCounts } {
  const totals: SessionCounts = { packages: 0, rows: 0, bytes: 0, stored_packages: 0 };
  const entity_counts = entityTotals(r).map(({ name, packages, rows, bytes }) => {
    const e: EntityCounts = { name, packages, rows, bytes, stored_packages: Math.min(packages, stored.get(name) ?? 0) };
    totals.packages += e.packages;
    totals.rows += e.rows;
    totals.bytes += e.bytes;
    totals.stored_packages += e.stored_packages;
    return e;
  });
  return { entity_counts, totals };
}

/** The status body; flags as docs/api.md (Session rules) defines them, from real state only. */
export function statusView(r: SessionRecord, pendingBatches: number, now: number, stored: ReadonlyMap<string, number> = new Map()): StatusView {
  const finished = liveInFlight(r, now) === 0 && pendingBatches === 0;
  return {
    upload_uuid: r.upload_uuid,
    session_status: r.status,
    entities: [...r.entities],
    upload_tasks_finished: finished,
    can_upload_entities: r.status === 'UPLOADING',
    can_start_upload: r.status === 'UPLOADING' && packageCount(r) > 0 && finished,
    can_terminate: r.status === 'STARTED',
    ...(r.last_workflow ? { last_workflow: r.last_workflow } : {}),
    ...sessionCounts(r, stored),
  };
}
