/**
 * The session state machine as pure functions: (record, event) → next record and effects,
 * or the error the client gets. Covers every row of the transition table of docs/api.md plus the
 * decided ones (delete, workflow failure). Nothing here does I/O or reads the clock: the
 * service passes `now` in.
 */
import { errors, type ServiceError, type ValidationIssue } from '../errors.js';

export type SessionStatus = 'UPLOADING' | 'STARTED' | 'DONE';

/** One accepted package; its rows are stored as one object. */
export interface PackageEntry {
  id: string;
  entity: string;
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
  /** Accepted packages in commit order; `entities` is derived from them. */
  packages: PackageEntry[];
  /** Ingest requests under way: package id → lease expiry (epoch ms). Expired leases are dead instances. */
  in_flight: Record<string, number>;
  created_at: string;
  updated_at: string;
  previous_upload_uuid?: string;
  workflow?: { date_from: string; date_to: string; started_at: string; terminate_requested_at?: string };
  last_workflow?: WorkflowOutcome;
  /**
   * Signed webhooks applied to this session whose signature still verifies: `id` names the
   * signed request, `until` (epoch ms) is when its timestamp leaves the replay window. A
   * replay of one of them is ignored, also after the session was started again.
   */
  applied_webhooks?: { id: string; until: number }[];
  /** Set by delete: the record only waits for its background clean-up. */
  deleted?: true;
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
    packages: [],
    in_flight: {},
    created_at: at,
    updated_at: at,
    ...(previous ? { previous_upload_uuid: previous } : {}),
  };
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

/** Entity names in order of first upload, each once. */
export function entityNames(r: SessionRecord): string[] {
  return [...new Set(r.packages.map((p) => p.entity))];
}

/** Per-entity totals, in order of first upload. */
export function entityTotals(r: SessionRecord): { name: string; packages: number; rows: number; bytes: number }[] {
  const totals = new Map<string, { name: string; packages: number; rows: number; bytes: number }>();
  for (const p of r.packages) {
    const t = totals.get(p.entity) ?? { name: p.entity, packages: 0, rows: 0, bytes: 0 };
    t.packages += 1;
    t.rows += p.rows;
    t.bytes += p.bytes;
    totals.set(p.entity, t);
  }
  return [...totals.values()];
}

/** Live in-flight ingests, ignoring leases of instances that died. */
export function liveInFlight(r: SessionRecord, now: number): number {
  let n = 0;
  for (const until of Object.values(r.in_flight)) if (until > now) n++;
  return n;
}

function pruneLeases(inFlight: Record<string, number>, now: number, without?: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [id, until] of Object.entries(inFlight)) if (id !== without && until > now) out[id] = until;
  return out;
}

/**
 * A new ingest takes a lease; refused once the session's packages and live leases reach
 * `maxPackages` (the record lists every package and must stay within what the store holds:
 * NATS `max_payload`). Leases count, so concurrent ingests cannot overshoot.
 */
export function decideIngestBegin(r: SessionRecord, packageId: string, now: number, leaseMs: number, maxPackages = Infinity): Decision {
  const bad = requireUploading(r);
  if (bad) return fail(bad);
  if (r.packages.length + liveInFlight(r, now) >= maxPackages) return fail(errors.sessionFull(maxPackages));
  return ok(touch(r, now, { in_flight: { ...pruneLeases(r.in_flight, now), [packageId]: now + leaseMs } }));
}

/**
 * The package's rows are committed to the queue: count them and end its lease. Only while
 * its lease is live: once the lease is gone (released, expired, or revoked by an uploader
 * that found the package unrecorded, see `packageFate`), the package may already have been
 * dropped from the queue, so counting it would answer 200 for rows that are never stored.
 */
export function decideIngestCommit(
  r: SessionRecord,
  pkg: { packageId: string; entity: string; rows: number; bytes: number },
  now: number,
): Decision {
  const bad = requireUploading(r);
  if (bad) return fail(bad);
  const lease = r.in_flight[pkg.packageId];
  if (lease === undefined || lease <= now) return fail(errors.internal(new Error(`Ingest lease of package ${pkg.packageId} is gone`)));
  const entry: PackageEntry = { id: pkg.packageId, entity: pkg.entity, rows: pkg.rows, bytes: pkg.bytes };
  return ok(touch(r, now, { packages: [...r.packages, entry], in_flight: pruneLeases(r.in_flight, now, pkg.packageId) }));
}

/**
 * What an uploader does with a package it took from the queue. The queue commit comes
 * before the session records the package (and the 200 goes out), so a gateway that dies
 * between the two leaves a committed package that no client was told about:
 * - `store`: the session records it;
 * - `drop`: the session is gone, or neither records the package nor holds a lease for it,
 *   so no commit can record it any more (`decideIngestCommit` needs the live lease): ack
 *   it unstored;
 * - `wait`: its lease is live, the ingest may still record it: deliver it again later;
 * - `revoke`: its lease has expired but is still in the record: remove it with a
 *   compare-and-set first (so a gateway whose clock is behind cannot still commit), then
 *   judge again.
 */
export type PackageFate = 'store' | 'drop' | 'wait' | 'revoke';

export function packageFate(r: SessionRecord | null, packageId: string, now: number): PackageFate {
  if (r === null || r.deleted) return 'drop';
  if (r.packages.some((p) => p.id === packageId)) return 'store';
  const lease = r.in_flight[packageId];
  if (lease === undefined) return 'drop';
  return lease > now ? 'wait' : 'revoke';
}

/** A restarted embedded instance: every lease in the record belongs to the dead process. */
export function decideReleaseAllLeases(r: SessionRecord, now: number): Decision {
  if (Object.keys(r.in_flight).length === 0) return ok(r);
  return ok(touch(r, now, { in_flight: {} }));
}

/** A package failed or was abandoned: only its lease ends. Allowed in any state. */
export function decideIngestRelease(r: SessionRecord, packageId: string, now: number): Decision {
  if (!(packageId in r.in_flight)) return ok(r);
  return ok(touch(r, now, { in_flight: pruneLeases(r.in_flight, now, packageId) }));
}

export interface StartInput {
  /** The body's dates once they passed format validation, or the 422 issues. */
  dates: { date_from: string; date_to: string } | { issues: ValidationIssue[] };
  minDate: string;
  /** Batches of the session not yet durably in object storage. */
  pendingBatches: number;
  now: number;
}

/** start-upload, in the check order of docs/api.md. On success the session is STARTED before the Connector is called. */
export function decideStart(r: SessionRecord, input: StartInput): Decision {
  const bad = requireUploading(r);
  if (bad) return fail(bad);
  if ('issues' in input.dates) return fail(errors.validationFailed(input.dates.issues));
  const { date_from, date_to } = input.dates;
  if (date_from < input.minDate) return fail(errors.dateBeforeMinimum(input.minDate));
  if (r.packages.length === 0) return fail(errors.noEntities());
  if (liveInFlight(r, input.now) > 0 || input.pendingBatches > 0) return fail(errors.uploadTasksInProgress());
  return ok(
    touch(r, input.now, {
      status: 'STARTED',
      workflow: { date_from, date_to, started_at: new Date(input.now).toISOString() },
    }),
  );
}

/** The Connector refused or could not be reached: back to UPLOADING as if start had not happened. */
export function decideStartFailed(r: SessionRecord, startedAt: string, now: number): Decision {
  if (r.status !== 'STARTED' || r.workflow?.started_at !== startedAt) return ok(r);
  const { workflow: _dropped, ...rest } = r;
  return ok(touch(rest, now, { status: 'UPLOADING' }));
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
 * → UPLOADING (data kept), otherwise DONE. Anything else is a repeat or a late call: ignored.
 */
export function decideWebhook(r: SessionRecord, event: WebhookEvent, now: number): { applied: boolean; next: SessionRecord } {
  if (r.status !== 'STARTED' || r.deleted) return { applied: false, next: r };
  // A captured confirmation of an earlier workflow, replayed while a later one runs.
  const replay = event.replay;
  if (replay && r.applied_webhooks?.some((w) => w.id === replay.id)) return { applied: false, next: r };
  const finished_at = new Date(now).toISOString();
  const status = event.is_terminated || event.status === 'terminated' ? 'terminated' : event.status === 'failed' ? 'failed' : 'succeeded';
  const message =
    event.message ??
    { terminated: 'Workflow terminated', failed: 'Workflow failed', succeeded: 'Workflow finished' }[status];
  const { workflow: _ended, ...rest } = r;
  return {
    applied: true,
    next: touch(rest, now, {
      status: status === 'succeeded' ? 'DONE' : 'UPLOADING',
      last_workflow: { status, message, finished_at },
      ...(replay ? { applied_webhooks: [...(r.applied_webhooks ?? []).filter((w) => w.until >= now), replay] } : {}),
    }),
  };
}

export function decideDelete(r: SessionRecord, now: number): Decision {
  const bad = requireUploading(r);
  if (bad) return fail(bad);
  return ok(touch(r, now, { deleted: true }));
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
}

/** The status body; flags as docs/api.md (Session rules) defines them, from real state only. */
export function statusView(r: SessionRecord, pendingBatches: number, now: number): StatusView {
  const finished = liveInFlight(r, now) === 0 && pendingBatches === 0;
  return {
    upload_uuid: r.upload_uuid,
    session_status: r.status,
    entities: entityNames(r),
    upload_tasks_finished: finished,
    can_upload_entities: r.status === 'UPLOADING',
    can_start_upload: r.status === 'UPLOADING' && r.packages.length > 0 && finished,
    can_terminate: r.status === 'STARTED',
    ...(r.last_workflow ? { last_workflow: r.last_workflow } : {}),
  };
}
