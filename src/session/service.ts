/**
 * The session service: runs the pure decisions of `state.ts` against the three ports.
 * Every state change is a compare-and-set on the session record, retried on conflict, so
 * any number of gateway instances can serve one client without locks of their own.
 */
import { randomUUID } from 'node:crypto';
import type { Connector, WorkflowStart } from '../connector/types.js';
import { errors, isServiceError, type ValidationIssue } from '../errors.js';
import { activeKey, objectKey, sessionKey, sessionObjectPrefix } from '../store/keys.js';
import { isStoreConflict, type BatchQueue, type ObjectStore, type SessionStore, type Versioned } from '../store/ports.js';
import {
  decideDelete,
  decideIngestBegin,
  decideIngestCommit,
  decideIngestRelease,
  decideInitialize,
  decideStart,
  decideStartFailed,
  decideTerminate,
  decideWebhook,
  entityTotals,
  newSession,
  statusView,
  type ActivePointer,
  type Decision,
  type PackageEntry,
  type SessionRecord,
  type StatusView,
  type WebhookEvent,
} from './state.js';

export interface SessionServiceDeps {
  sessions: SessionStore;
  queue: BatchQueue;
  objects: ObjectStore;
  connector: Connector;
  objectPrefix: string;
  /** How long an in-flight ingest holds `upload_tasks_finished` false if its instance dies. */
  inFlightLeaseMs: number;
  /** Packages (accepted and in flight) one session may hold; past it, ingest answers 409. Default unbounded. */
  maxPackages?: number;
  callbackUrl: string;
  clock?: () => number;
  /** Background failures (clean-up after delete); never client errors. */
  onBackgroundError?: (err: unknown, what: string) => void;
}

export interface ClientRef {
  readonly id: string;
  readonly minDate: string;
}

const MAX_CAS_ATTEMPTS = 32;
/** An upload uuid as `initialize` makes them (docs/api.md, Session rules: random UUID v4, lowercase). */
const UPLOAD_UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

/** After a lost compare-and-set (another instance wrote): a random pause up to 2^attempt ms, at most 100 ms. */
function conflictBackoff(attempt: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, Math.random() * Math.min(100, 2 ** attempt)));
}
/** Background retries of a lease release back off up to this delay (about a minute in all). */
const RELEASE_RETRY_MAX_DELAY_MS = 32_000;

export class SessionService {
  private readonly now: () => number;
  /** Per session: the end of this process's last queued mutation (see `serially`). */
  private readonly chains = new Map<string, Promise<void>>();

  constructor(private readonly deps: SessionServiceDeps) {
    this.now = deps.clock ?? Date.now;
  }

  async initialize(client: ClientRef): Promise<{ upload_uuid: string; previous_upload_uuid?: string }> {
    const key = activeKey(client.id);
    for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
      const pointer = await this.deps.sessions.get<ActivePointer>(key);
      const current = pointer ? await this.record(pointer.value.upload_uuid) : null;
      const decision = decideInitialize(current && !current.value.deleted ? current.value : null);
      if (!decision.create) throw decision.error;

      const uploadUuid = randomUUID();
      await this.deps.sessions.create(sessionKey(uploadUuid), newSession(uploadUuid, client.id, this.now(), decision.previous));
      try {
        if (pointer) await this.deps.sessions.update<ActivePointer>(key, { upload_uuid: uploadUuid }, pointer.revision);
        else await this.deps.sessions.create<ActivePointer>(key, { upload_uuid: uploadUuid });
      } catch (err) {
        await this.deps.sessions.delete(sessionKey(uploadUuid)).catch(() => undefined);
        if (isStoreConflict(err)) continue; // another call won: answer against its session
        throw err;
      }
      return { upload_uuid: uploadUuid, ...(decision.previous ? { previous_upload_uuid: decision.previous } : {}) };
    }
    throw errors.internal(new Error('initialize-session: too much contention'));
  }

  /** The session-access checks of path-bound endpoints: 400 no active session, 403 another uuid. */
  async requireActive(client: ClientRef, uploadUuid: string): Promise<Versioned<SessionRecord>> {
    const pointer = await this.deps.sessions.get<ActivePointer>(activeKey(client.id));
    if (!pointer) throw errors.sessionNotInitialized();
    if (pointer.value.upload_uuid !== uploadUuid) throw errors.invalidUploadUuid();
    const record = await this.record(uploadUuid);
    if (!record || record.value.deleted || record.value.client_id !== client.id) throw errors.sessionNotInitialized();
    return record;
  }

  async status(client: ClientRef, uploadUuid: string): Promise<StatusView> {
    const record = await this.record(uploadUuid);
    if (!record || record.value.deleted || record.value.client_id !== client.id) throw errors.sessionNotFound();
    const pending = await this.deps.queue.pending(uploadUuid);
    return statusView(record.value, pending, this.now());
  }

  /** Registers an ingest (its lease keeps `upload_tasks_finished` false) and returns its package id. */
  async beginIngest(client: ClientRef, uploadUuid: string): Promise<string> {
    const packageId = randomUUID();
    try {
      await this.mutate(client, uploadUuid, (r) => decideIngestBegin(r, packageId, this.now(), this.deps.inFlightLeaseMs, this.deps.maxPackages));
    } catch (err) {
      // A store failure leaves it unknown whether the lease was written: take it back.
      if (!isServiceError(err) || err.statusCode >= 500) void this.releaseIngest(client, uploadUuid, packageId);
      throw err;
    }
    return packageId;
  }

  async commitIngest(
    client: ClientRef,
    uploadUuid: string,
    pkg: { packageId: string; entity: string; rows: number; bytes: number },
  ): Promise<void> {
    await this.mutate(client, uploadUuid, (r) => decideIngestCommit(r, pkg, this.now()));
  }

  /**
   * Settles earlier attempts of one idempotent request (see idempotency.ts): the package of
   * the one the session recorded, if any; otherwise none of them is recorded, and all their
   * leases end in the same compare-and-set, so that none can be recorded any more (recording
   * needs the live lease: `decideIngestCommit`), and the uploader drops whatever of them
   * reached the queue.
   */
  async settleAttempts(client: ClientRef, uploadUuid: string, packageIds: readonly string[]): Promise<PackageEntry | null> {
    let recorded: PackageEntry | null = null;
    await this.mutate(
      client,
      uploadUuid,
      (r) => {
        recorded = r.packages.find((p) => packageIds.includes(p.id)) ?? null;
        if (recorded) return { ok: true, next: r };
        let decision: Decision = { ok: true, next: r };
        for (const id of packageIds) if (decision.ok) decision = decideIngestRelease(decision.next, id, this.now());
        return decision;
      },
      { anyState: true },
    );
    return recorded;
  }

  /**
   * Ends a failed ingest's lease. Never throws: when the store is unavailable (a failover,
   * often the very reason the ingest failed) it keeps trying in the background, since the
   * lease would otherwise hold `upload_tasks_finished` false until it expires.
   */
  async releaseIngest(client: ClientRef, uploadUuid: string, packageId: string): Promise<void> {
    const release = () => this.mutate(client, uploadUuid, (r) => decideIngestRelease(r, packageId, this.now()), { anyState: true });
    try {
      await release();
    } catch (first) {
      if (isServiceError(first) && first.statusCode < 500) return; // the session is gone: nothing to release
      void (async () => {
        let lastErr: unknown = first;
        for (let delay = 500; delay <= RELEASE_RETRY_MAX_DELAY_MS; delay *= 2) {
          await new Promise((r) => setTimeout(r, delay).unref());
          try {
            await release();
            return;
          } catch (err) {
            lastErr = err;
          }
        }
        this.deps.onBackgroundError?.(lastErr, 'release ingest lease');
      })();
    }
  }

  async start(
    client: ClientRef,
    uploadUuid: string,
    dates: { date_from: string; date_to: string } | { issues: ValidationIssue[] },
  ): Promise<unknown> {
    const started = await this.mutate(client, uploadUuid, async (r) =>
      decideStart(r, { dates, minDate: client.minDate, pendingBatches: await this.deps.queue.pending(uploadUuid), now: this.now() }),
    );
    const startedAt = started.workflow!.started_at;
    try {
      return await this.deps.connector.start(await this.workflowStart(started));
    } catch (err) {
      await this.mutate(client, uploadUuid, (r) => decideStartFailed(r, startedAt, this.now()), { anyState: true }).catch(
        (rollback: unknown) => this.deps.onBackgroundError?.(rollback, 'roll back a failed start'),
      );
      throw err;
    }
  }

  async terminate(client: ClientRef, uploadUuid: string): Promise<void> {
    await this.mutate(client, uploadUuid, (r) => decideTerminate(r, this.now()));
    await this.deps.connector.terminate(uploadUuid);
  }

  async delete(client: ClientRef, uploadUuid: string): Promise<void> {
    await this.mutate(client, uploadUuid, (r) => decideDelete(r, this.now()));
    const key = activeKey(client.id);
    const pointer = await this.deps.sessions.get<ActivePointer>(key);
    if (pointer?.value.upload_uuid === uploadUuid) {
      await this.deps.sessions.delete(key, pointer.revision).catch((err: unknown) => {
        if (!isStoreConflict(err)) throw err; // a conflict means a new session already replaced it
      });
    }
    void this.cleanUp(client.id, uploadUuid);
  }

  /** Applies the Connector's completion webhook: 'ok' when it changed the session, 'ignored' for a repeat or a late one. */
  async applyWebhook(uploadUuid: string, event: WebhookEvent): Promise<'ok' | 'ignored'> {
    for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
      const record = await this.record(uploadUuid);
      if (!record || record.value.deleted) throw errors.sessionNotFound();
      const { applied, next } = decideWebhook(record.value, event, this.now());
      if (!applied) return 'ignored';
      try {
        await this.deps.sessions.update(sessionKey(uploadUuid), next, record.revision);
        return 'ok';
      } catch (err) {
        if (!isStoreConflict(err)) throw err;
      }
    }
    throw errors.internal(new Error('webhook: too much contention'));
  }

  private async record(uploadUuid: string): Promise<Versioned<SessionRecord> | null> {
    // Only `randomUUID()` names a session: anything else (a path segment with a space, 5,000
    // characters, `../x`) names none, and is no store key either (the stores refuse it).
    if (!UPLOAD_UUID.test(uploadUuid)) return null;
    return this.deps.sessions.get<SessionRecord>(sessionKey(uploadUuid));
  }

  /**
   * Re-reads the active session, applies `decide`, and writes it with compare-and-set until
   * no other writer came between. The access checks run on every attempt, so a session
   * deleted or replaced meanwhile answers as a fresh request would.
   */
  private mutate(
    client: ClientRef,
    uploadUuid: string,
    decide: (r: SessionRecord) => Decision | Promise<Decision>,
    opts: { anyState?: boolean } = {},
  ): Promise<SessionRecord> {
    return this.serially(uploadUuid, async () => {
      for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
        if (attempt > 0) await conflictBackoff(attempt);
        const current = opts.anyState ? await this.record(uploadUuid) : await this.requireActive(client, uploadUuid);
        if (!current || current.value.client_id !== client.id) throw errors.sessionNotFound();
        const decision = await decide(current.value);
        if (!decision.ok) throw decision.error;
        if (decision.next === current.value) return current.value;
        try {
          await this.deps.sessions.update(sessionKey(uploadUuid), decision.next, current.revision);
          return decision.next;
        } catch (err) {
          if (!isStoreConflict(err)) throw err;
        }
      }
      throw errors.internal(new Error('session update: too much contention'));
    });
  }

  /**
   * Runs this process's mutations of one session one after another. Compare-and-set alone
   * stays correct, but 50 concurrent ingests into one session made each write lose to the
   * others until most gave up (500 after 32 attempts); in turn, each read sees the
   * previous write and nothing is wasted. Other instances still meet at the compare-and-set.
   */
  private serially<R>(uploadUuid: string, fn: () => Promise<R>): Promise<R> {
    const previous = this.chains.get(uploadUuid) ?? Promise.resolve();
    const run = previous.then(fn);
    const tail = run.then(
      () => undefined,
      () => undefined,
    );
    this.chains.set(uploadUuid, tail);
    void tail.then(() => {
      if (this.chains.get(uploadUuid) === tail) this.chains.delete(uploadUuid);
    });
    return run;
  }

  private async workflowStart(r: SessionRecord): Promise<WorkflowStart> {
    const prefix = sessionObjectPrefix(this.deps.objectPrefix, r.client_id, r.upload_uuid);
    const sizes = new Map((await this.deps.objects.list(prefix)).map((o) => [o.key, o.size]));
    return {
      upload_uuid: r.upload_uuid,
      client_id: r.client_id,
      date_from: r.workflow!.date_from,
      date_to: r.workflow!.date_to,
      entities: entityTotals(r).map(({ name, packages, rows }) => ({ name, packages, rows })),
      objects: r.packages.map((p) => {
        const key = objectKey(this.deps.objectPrefix, { client_id: r.client_id, upload_uuid: r.upload_uuid, entity: p.entity, package_id: p.id });
        return { entity: p.entity, key, rows: p.rows, bytes: sizes.get(key) ?? p.bytes };
      }),
      callback_url: this.deps.callbackUrl,
    };
  }

  /** After delete: queued batches, stored objects, then the record itself. */
  private async cleanUp(clientId: string, uploadUuid: string): Promise<void> {
    try {
      await this.deps.queue.purge(uploadUuid);
      await this.deps.objects.deletePrefix(sessionObjectPrefix(this.deps.objectPrefix, clientId, uploadUuid));
      await this.deps.sessions.delete(sessionKey(uploadUuid));
    } catch (err) {
      this.deps.onBackgroundError?.(err, 'clean up a deleted session');
    }
  }
}
