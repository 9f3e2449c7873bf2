/**
 * The session service: runs the pure decisions of `state.ts` against the ports. Every change
 * of a session summary is a compare-and-set, retried on conflict, so any number of gateway
 * instances can serve one client without locks of their own.
 *
 * Group commit: the decisions waiting for one session in this process are applied together,
 * in arrival order, and written with one compare-and-set — fifty concurrent ingests of a
 * session cost a handful of writes, not a hundred. Each decision succeeds or fails on its
 * own. The last summary this process wrote is cached, so a write usually needs no read
 * first; another instance's write shows up as a conflict, and the summary is read again.
 */
import { randomUUID } from 'node:crypto';
import type { Connector, WorkflowStart } from '../connector/types.js';
import { errors, isServiceError, isStorageUnavailable, type ServiceError, type ValidationIssue } from '../errors.js';
import { activeKey, clientSessionKey, clientSessionsPrefix, manifestKey, objectKey, sessionKey, sessionObjectPrefix } from '../store/keys.js';
import { isStoreConflict, isStoreError, readForAnswer, type BatchQueue, type LedgerEntry, type ObjectStore, type PackageLedger, type SessionStore, type Versioned } from '../store/ports.js';
import { SessionCleanUps, type CleanUpDeps } from './clean-up.js';
import type { ClientSessionEntry, SessionCounts, SessionStatus } from './state.js';
import { storedCounter, type StoredCounter } from './stored-counts.js';
import {
  decideDelete,
  decideFold,
  decideIngestBegin,
  decideIngestRecord,
  decideIngestRelease,
  decideIngestRenew,
  decideInitialize,
  decideStart,
  decideStartFailed,
  decideTerminate,
  decideWebhook,
  entityTotals,
  fromStored,
  newSession,
  packageCount,
  sessionCounts,
  statusView,
  type ActivePointer,
  type ClientRef,
  type Decision,
  type PackageEntry,
  type SessionRecord,
  type StatusView,
  type WebhookEvent,
} from './state.js';

export interface SessionServiceDeps {
  sessions: SessionStore;
  ledger: PackageLedger;
  queue: BatchQueue;
  objects: ObjectStore;
  connector: Connector;
  objectPrefix: string;
  /**
   * The lease of an ingest in flight: renewed every third of it while the ingest runs in this
   * process, so it ends this long after its instance died (or stopped renewing).
   */
  inFlightLeaseMs: number;
  /** Packages (accepted and in flight) one session may hold; past it, ingest answers 409. Default unbounded. */
  maxPackages?: number;
  /** Past this many objects the Connector start body names a manifest object instead of listing them (default 1000). */
  inlineObjects?: number;
  /**
   * How long recorded packages wait to be written to the ledger together (default 10 ms):
   * one ledger write (one fdatasync of the session's ledger file on the embedded default)
   * and one fold for every package of the session recorded meanwhile. It delays nothing a
   * client waits for.
   */
  ledgerLingerMs?: number;
  callbackUrl: string;
  clock?: () => number;
  /** The retry pauses of a delete's clean-up (clean-up.ts; default 500 ms doubling to 60 s). */
  cleanUpBackoff?: CleanUpDeps['backoff'];
  /** Background failures (ledger writes, clean-up after delete); never client errors. */
  onBackgroundError?: (err: unknown, what: string) => void;
}

const MAX_CAS_ATTEMPTS = 32;
/** Sessions whose last written summary is kept in memory. */
const CACHED_SESSIONS = 10_000;
/** An upload uuid as `initialize` makes them (docs/api.md, Session rules: random UUID v4, lowercase). */
const UPLOAD_UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
/** Set once the sessions of versions without the listing's index are indexed (`indexEarlierSessions`). */
const LISTING_INDEXED = 'listing.indexed';

/** Where a page of `listSessions` ended: the next one starts after it. */
export interface SessionPosition {
  created_at: string;
  upload_uuid: string;
}

/** One session of `GET /api/v1/uploading/sessions`. */
export interface SessionListItem {
  upload_uuid: string;
  session_status: SessionStatus;
  created_at: string;
  totals: SessionCounts;
}

/** Newest first: `created_at` descending, then `upload_uuid` descending (negative: `a` comes first). */
function newestFirst(a: SessionPosition, b: SessionPosition): number {
  if (a.created_at !== b.created_at) return a.created_at > b.created_at ? -1 : 1;
  return a.upload_uuid === b.upload_uuid ? 0 : a.upload_uuid > b.upload_uuid ? -1 : 1;
}

/** After a lost compare-and-set (another instance wrote): a random pause up to 2^attempt ms, at most 100 ms. */
function conflictBackoff(attempt: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, Math.random() * Math.min(100, 2 ** attempt)));
}
/** How long a record write of unknown outcome is resolved before its ingest answers anyway (`resolveRecord`). */
const RESOLVE_RECORD_MS = 30_000;
/** Background retries (a lease release, a ledger write) back off up to this delay (about a minute in all). */
const RETRY_MAX_DELAY_MS = 32_000;

/**
 * Who may apply a decision: `active` the client's session while it is not deleted (400
 * otherwise, as a fresh request would get); `any` the client's session in any state;
 * `system` any existing session (the service's own bookkeeping: folding ledger entries).
 */
type Access = 'active' | 'any' | 'system';

interface PendingDecision {
  client: ClientRef | null;
  access: Access;
  decide: (r: SessionRecord) => Decision;
  resolve: (r: SessionRecord) => void;
  reject: (err: unknown) => void;
}

export class SessionService {
  private readonly now: () => number;
  /** Per session: decisions waiting for the next write, and whether a write is under way. */
  private readonly writers = new Map<string, { waiting: PendingDecision[]; running: boolean }>();
  /** Per client: the active session this process last saw (see `knownActive`). */
  private readonly activeHints = new Map<string, string>();
  /** Per session: the summary as this process last wrote or read it (least recently used first). */
  private readonly cache = new Map<string, Versioned<SessionRecord>>();
  /** Per session: recorded packages waiting for their ledger write, and whether one is under way. */
  private readonly ledgerQueues = new Map<string, { waiting: PackageEntry[]; run: Promise<void> | null }>();
  /** Per session: the leases of the ingests running in this process, renewed by `renewLeases`. */
  private readonly held = new Map<string, { client: ClientRef; ids: Set<string> }>();
  /** Runs `renewLeases` every third of the lease while this process holds any. */
  private heartbeat: NodeJS.Timeout | undefined;

  /** What deletes left to remove, durable and retried until done (clean-up.ts). */
  private readonly cleanUps: SessionCleanUps;
  /** The uploader's count of stored packages, read by status and the listing. */
  private readonly stored: StoredCounter;

  constructor(private readonly deps: SessionServiceDeps) {
    this.now = deps.clock ?? Date.now;
    const { sessions, ledger, queue, objects, objectPrefix, onBackgroundError } = deps;
    this.stored = storedCounter({ sessions, ledger });
    this.cleanUps = new SessionCleanUps({
      sessions,
      ledger,
      queue,
      objects,
      objectPrefix,
      clock: this.now,
      ...(deps.cleanUpBackoff ? { backoff: deps.cleanUpBackoff } : {}),
      ...(onBackgroundError ? { onError: onBackgroundError } : {}),
    });
  }

  async initialize(client: ClientRef): Promise<{ upload_uuid: string; previous_upload_uuid?: string }> {
    const key = activeKey(client.id);
    for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
      const pointer = await this.deps.sessions.get<ActivePointer>(key);
      const current = pointer ? await this.read(pointer.value.upload_uuid) : null;
      const decision = decideInitialize(current && !current.value.deleted ? current.value : null);
      if (!decision.create) throw decision.error;
      if (current?.value.deleted) {
        // A delete that stopped before it recorded its clean-up: record it before the pointer moves on.
        await this.cleanUps.record(client.id, current.value.upload_uuid);
        void this.cleanUps.run(client.id, current.value.upload_uuid);
      }

      const uploadUuid = randomUUID();
      const record = newSession(uploadUuid, client.id, this.now(), decision.previous);
      const revision = await this.deps.sessions.create(sessionKey(uploadUuid), record);
      const indexed = clientSessionKey(client.id, uploadUuid);
      try {
        // Listed before the pointer names it: a session a client was told about is always listed.
        await this.deps.sessions.create<ClientSessionEntry>(indexed, { upload_uuid: uploadUuid, created_at: record.created_at });
        if (pointer) await this.deps.sessions.update<ActivePointer>(key, { upload_uuid: uploadUuid }, pointer.revision);
        else await this.deps.sessions.create<ActivePointer>(key, { upload_uuid: uploadUuid });
      } catch (err) {
        await this.deps.sessions.delete(indexed).catch(() => undefined);
        await this.deps.sessions.delete(sessionKey(uploadUuid)).catch(() => undefined);
        if (isStoreConflict(err)) continue; // another call won: answer against its session
        throw err;
      }
      this.remember(uploadUuid, { value: record, revision });
      this.rememberActive(client.id, uploadUuid);
      return { upload_uuid: uploadUuid, ...(decision.previous ? { previous_upload_uuid: decision.previous } : {}) };
    }
    throw errors.internal(new Error('initialize-session: too much contention'));
  }

  /** The session-access checks of path-bound endpoints: 400 no active session, 403 another uuid. */
  async requireActive(client: ClientRef, uploadUuid: string): Promise<Versioned<SessionRecord>> {
    await this.requirePointer(client, uploadUuid);
    const record = await this.read(uploadUuid);
    if (!record || record.value.deleted || record.value.client_id !== client.id) throw errors.sessionNotInitialized();
    return record;
  }

  /**
   * The active-session pointer check alone (one read): for ingest, whose lease decision
   * checks the summary itself.
   */
  async requirePointer(client: ClientRef, uploadUuid: string): Promise<void> {
    const pointer = await this.deps.sessions.get<ActivePointer>(activeKey(client.id));
    this.rememberActive(client.id, pointer?.value.upload_uuid ?? null);
    if (!pointer) throw errors.sessionNotInitialized();
    if (pointer.value.upload_uuid !== uploadUuid) throw errors.invalidUploadUuid();
  }

  /**
   * Whether this process last saw `uploadUuid` as the client's active session. Only a hint
   * for ingest, which then skips the pointer read: a client has at most one session that is
   * UPLOADING and not deleted, and the active pointer names it whenever it exists (it moves
   * only when that session is deleted, or DONE and replaced), so a lease granted on such a
   * session proves the pointer still names it. Whatever fails after the hint re-reads the
   * pointer, so that errors keep their precedence (403 before 400 before 409).
   */
  knownActive(client: ClientRef, uploadUuid: string): boolean {
    return this.activeHints.get(client.id) === uploadUuid;
  }

  private rememberActive(clientId: string, uploadUuid: string | null): void {
    if (uploadUuid === null) {
      this.activeHints.delete(clientId);
      return;
    }
    if (this.activeHints.size >= CACHED_SESSIONS && !this.activeHints.has(clientId)) this.activeHints.clear();
    this.activeHints.set(clientId, uploadUuid);
  }

  async status(client: ClientRef, uploadUuid: string): Promise<StatusView> {
    const [record, [pending, stored]] = await Promise.all([
      this.read(uploadUuid, true),
      // The stored count is read once the queue answered: a package is counted before it is
      // acked, so when nothing is pending every package's count is already there to read.
      this.deps.queue.hasPending(uploadUuid, { forAnswer: true }).then(async (p) => [p, UPLOAD_UUID.test(uploadUuid) ? await this.stored.perEntity(uploadUuid) : new Map<string, number>()] as const),
    ]);
    if (!record || record.value.deleted || record.value.client_id !== client.id) throw errors.sessionNotFound();
    // Only whether any package waits for the uploader matters, not how many.
    return statusView(record.value, pending ? 1 : 0, this.now(), stored);
  }

  /**
   * The client's sessions, newest first (`created_at`, then `upload_uuid`, both descending),
   * `limit` of them after `after` (a position a previous page ended at). Deleted sessions are
   * left out. Reads the client's whole index (one key per session it ever created and did not
   * delete), then the summary and stored count of each session on the page.
   */
  async listSessions(client: ClientRef, limit: number, after: SessionPosition | null): Promise<{ sessions: SessionListItem[]; next: SessionPosition | null }> {
    const index: ClientSessionEntry[] = [];
    for await (const { value } of this.deps.sessions.list<ClientSessionEntry>(clientSessionsPrefix(client.id))) index.push(value);
    index.sort(newestFirst);
    let i = after ? index.findIndex((e) => newestFirst(after, e) < 0) : 0;
    if (i < 0) i = index.length;
    const sessions: SessionListItem[] = [];
    let last: SessionPosition | null = null;
    while (sessions.length < limit && i < index.length) {
      const chunk = index.slice(i, i + limit - sessions.length);
      i += chunk.length;
      const read = await Promise.all(
        chunk.map(async (e) => {
          if (!UPLOAD_UUID.test(e.upload_uuid)) return null;
          const [summary, stored] = await Promise.all([
            readForAnswer<SessionRecord>(this.deps.sessions, sessionKey(e.upload_uuid)),
            this.stored.perEntity(e.upload_uuid),
          ]);
          return { e, summary: summary ? fromStored(summary.value) : null, stored };
        }),
      );
      for (const got of read) {
        if (!got) continue;
        const { e, summary, stored } = got;
        if (!summary || summary.deleted || summary.client_id !== client.id) continue;
        sessions.push({
          upload_uuid: summary.upload_uuid,
          session_status: summary.status,
          created_at: summary.created_at,
          totals: sessionCounts(summary, stored).totals,
        });
        last = { created_at: e.created_at, upload_uuid: e.upload_uuid };
      }
    }
    return { sessions, next: sessions.length === limit && i < index.length ? last : null };
  }

  /**
   * Sessions created by a version without the listing's index get their entries: once per
   * store (the `LISTING_INDEXED` key says it was done), by whichever gateway's housekeeping
   * comes first; several at once create the same entries (create-if-absent). Reads every
   * session summary once. Returns how many entries it created.
   */
  async indexEarlierSessions(): Promise<number> {
    const { sessions } = this.deps;
    if (await sessions.get(LISTING_INDEXED)) return 0;
    let created = 0;
    for await (const { value } of sessions.list<SessionRecord>('session.')) {
      if (value.deleted || !UPLOAD_UUID.test(value.upload_uuid)) continue;
      try {
        await sessions.create<ClientSessionEntry>(clientSessionKey(value.client_id, value.upload_uuid), { upload_uuid: value.upload_uuid, created_at: value.created_at });
        created++;
      } catch (err) {
        if (!isStoreConflict(err)) throw err;
      }
    }
    await sessions.create(LISTING_INDEXED, { at: new Date(this.now()).toISOString() }).catch((err: unknown) => {
      if (!isStoreConflict(err)) throw err;
    });
    return created;
  }

  /**
   * Registers an ingest (its lease keeps `upload_tasks_finished` false) and returns its
   * package id. Checks the session's state: 409 when it is not UPLOADING.
   */
  async beginIngest(client: ClientRef, uploadUuid: string): Promise<string> {
    const packageId = randomUUID();
    try {
      await this.mutate(client, uploadUuid, 'active', (r) =>
        decideIngestBegin(r, packageId, this.now(), this.deps.inFlightLeaseMs, this.deps.maxPackages),
      );
    } catch (err) {
      // A store failure leaves it unknown whether the lease was written: take it back.
      if (!isServiceError(err) || err.statusCode >= 500) void this.releaseIngest(client, uploadUuid, packageId);
      throw err;
    }
    this.hold(client, uploadUuid, packageId);
    return packageId;
  }

  /**
   * Renews the leases of the ingests running in this process (`decideIngestRenew`): one
   * compare-and-set per session, shared with whatever else the session's next write carries.
   * Runs every third of `inFlightLeaseMs` while any is held, so a lease outlives two failed
   * renewals, and a dead instance's leases end within `inFlightLeaseMs` (docs/reliability.md,
   * Leftovers after a restart heal themselves).
   */
  async renewLeases(): Promise<void> {
    await Promise.all(
      [...this.held].map(async ([uploadUuid, { client, ids }]) => {
        try {
          await this.mutate(client, uploadUuid, 'any', (r) => decideIngestRenew(r, ids, this.now(), this.deps.inFlightLeaseMs));
        } catch (err) {
          // The session is gone, or the store is out (the next beat tries again; readiness says so).
          if (isServiceError(err) || isStorageUnavailable(err) || isStoreError(err, 'STORE_CLOSED')) return;
          this.deps.onBackgroundError?.(err, 'renew ingest leases');
        }
      }),
    );
  }

  private hold(client: ClientRef, uploadUuid: string, packageId: string): void {
    let session = this.held.get(uploadUuid);
    if (!session) {
      session = { client, ids: new Set() };
      this.held.set(uploadUuid, session);
    }
    session.ids.add(packageId);
    if (!this.heartbeat) {
      this.heartbeat = setInterval(() => void this.renewLeases(), Math.max(1, Math.floor(this.deps.inFlightLeaseMs / 3)));
      this.heartbeat.unref();
    }
  }

  /** The ingest ended (recorded, failed, abandoned): its lease is no longer renewed here. */
  private unhold(uploadUuid: string, packageId: string): void {
    const session = this.held.get(uploadUuid);
    if (!session?.ids.delete(packageId)) return;
    if (session.ids.size === 0) this.held.delete(uploadUuid);
    if (this.held.size === 0) {
      clearInterval(this.heartbeat);
      this.heartbeat = undefined;
    }
  }

  /**
   * Records a package whose rows are committed to the queue; once this resolves the package
   * will be stored. Its ledger entry is written afterwards, in the background, and folded
   * into the summary's totals (see state.ts).
   */
  async recordIngest(client: ClientRef, uploadUuid: string, pkg: PackageEntry): Promise<void> {
    try {
      await this.mutate(client, uploadUuid, 'active', (r) => decideIngestRecord(r, pkg, this.now()));
    } catch (err) {
      // The decision refused (nothing written): the caller releases the lease.
      if (isServiceError(err)) throw err;
      // A store failure (a timeout) may have landed: resolve it before anyone answers.
      if ((await this.resolveRecord(client, uploadUuid, pkg.id, err)) === 'fenced') throw errors.storageUnavailable(err);
    } finally {
      // Recorded (the lease became the record), or failed: no more renewals.
      this.unhold(uploadUuid, pkg.id);
    }
    this.toLedger(uploadUuid, [pkg]);
  }

  /**
   * After a record write of unknown outcome: either it landed (`recorded`: the package will be
   * stored, its client gets 200), or its lease is ended now in one compare-and-set (`fenced`:
   * it can never be recorded, the uploader drops it, its client is told 503 and nothing is
   * stored). Tries for `RESOLVE_RECORD_MS` while the store does not answer; still unknown then,
   * throws `first` (the ingest then keeps the package among its key's attempts, see idempotency.ts).
   */
  private async resolveRecord(client: ClientRef, uploadUuid: string, packageId: string, first: unknown): Promise<'recorded' | 'fenced'> {
    const deadline = Date.now() + RESOLVE_RECORD_MS;
    for (let delay = 100; ; delay = Math.min(delay * 2, 2000)) {
      try {
        return (await this.settleAttempts(client, uploadUuid, [packageId])) ? 'recorded' : 'fenced';
      } catch (err) {
        if (isServiceError(err) && err.statusCode < 500) throw err; // the session is gone
        if (Date.now() + delay >= deadline) throw first;
        await new Promise((resolve) => setTimeout(resolve, delay));
      }
    }
  }

  /**
   * Settles earlier attempts of one idempotent request (see idempotency.ts): the package of
   * the one the session recorded, if any; otherwise none of them is recorded, and all their
   * leases end in the same compare-and-set, so that none can be recorded any more (recording
   * needs the live lease: `decideIngestRecord`), and the uploader drops whatever of them
   * reached the queue.
   */
  async settleAttempts(client: ClientRef, uploadUuid: string, packageIds: readonly string[]): Promise<PackageEntry | null> {
    let recorded: PackageEntry | null = null;
    await this.mutate(client, uploadUuid, 'any', (r) => {
      const id = packageIds.find((p) => p in r.recording);
      recorded = id === undefined ? null : { id, ...r.recording[id]! };
      return recorded ? { ok: true, next: r } : decideIngestRelease(r, packageIds, this.now());
    });
    if (recorded) return recorded;
    // Neither recording nor leased in the summary just written: folded (the ledger holds it) or never recorded.
    for (const id of packageIds) {
      const entry = await this.deps.ledger.get(uploadUuid, id);
      if (entry) return fromLedger(entry);
    }
    return null;
  }

  /**
   * Ends a failed ingest's lease. Never throws: when the store is unavailable (a failover,
   * often the very reason the ingest failed) it keeps trying in the background, since the
   * lease would otherwise hold `upload_tasks_finished` false until it expires.
   */
  async releaseIngest(client: ClientRef, uploadUuid: string, packageId: string): Promise<void> {
    this.unhold(uploadUuid, packageId);
    const release = () => this.mutate(client, uploadUuid, 'any', (r) => decideIngestRelease(r, [packageId], this.now()));
    try {
      await release();
    } catch (first) {
      if (isServiceError(first) && first.statusCode < 500) return; // the session is gone: nothing to release
      void this.retryInBackground(release, first, 'release ingest lease');
    }
  }

  async start(
    client: ClientRef,
    uploadUuid: string,
    dates: { date_from: string; date_to: string } | { issues: ValidationIssue[] },
  ): Promise<unknown> {
    await this.requirePointer(client, uploadUuid);
    const pendingBatches = (await this.deps.queue.hasPending(uploadUuid)) ? 1 : 0;
    const started = await this.mutate(client, uploadUuid, 'active', (r) =>
      decideStart(r, { dates, minDate: client.minDate, pendingBatches, now: this.now() }),
    );
    const startedAt = started.workflow!.started_at;
    try {
      return await this.deps.connector.start(await this.workflowStart(client, started));
    } catch (err) {
      await this.mutate(client, uploadUuid, 'any', (r) => decideStartFailed(r, startedAt, this.now())).catch((rollback: unknown) =>
        this.deps.onBackgroundError?.(rollback, 'roll back a failed start'),
      );
      throw err;
    }
  }

  async terminate(client: ClientRef, uploadUuid: string): Promise<void> {
    await this.requirePointer(client, uploadUuid);
    await this.mutate(client, uploadUuid, 'active', (r) => decideTerminate(r, this.now()));
    await this.deps.connector.terminate(uploadUuid);
  }

  /**
   * Marks the session deleted, records its clean-up and clears the active pointer, each durable
   * before the answer; the clean-up then runs in the background until it is done
   * (clean-up.ts). A retry of a delete that failed half-way (the session marked, the pointer
   * still on it) completes it.
   */
  async delete(client: ClientRef, uploadUuid: string): Promise<void> {
    await this.requirePointer(client, uploadUuid);
    try {
      await this.mutate(client, uploadUuid, 'active', (r) => decideDelete(r, this.now()));
    } catch (err) {
      const marked = isServiceError(err) && err.code === 'SESSION_NOT_INITIALIZED' ? await this.read(uploadUuid) : null;
      if (!(marked?.value.deleted && marked.value.client_id === client.id)) throw err;
    }
    await this.cleanUps.record(client.id, uploadUuid);
    this.rememberActive(client.id, null);
    const key = activeKey(client.id);
    const pointer = await this.deps.sessions.get<ActivePointer>(key);
    if (pointer?.value.upload_uuid === uploadUuid) {
      await this.deps.sessions.delete(key, pointer.revision).catch((err: unknown) => {
        if (!isStoreConflict(err)) throw err; // a conflict means a new session already replaced it
      });
    }
    void this.cleanUps.run(client.id, uploadUuid);
  }

  /**
   * Starts the clean-ups that deletes recorded and no process here runs (those of a stopped
   * instance): at start and at every housekeeping round. Returns how many it started.
   */
  resumeCleanUps(): Promise<number> {
    return this.cleanUps.resume();
  }

  /** Waits until the clean-ups running in this process are done (tests). */
  cleanUpsIdle(): Promise<void> {
    return this.cleanUps.idle();
  }

  /** Stops the background work that would otherwise retry for ever (shutdown, before the stores close). */
  async close(): Promise<void> {
    await this.cleanUps.close();
  }

  /**
   * Applies the Connector's completion webhook: 'ok' when it changed the session's state,
   * 'ignored' for a repeat or a late one (whose signed request the session still remembers).
   */
  async applyWebhook(uploadUuid: string, event: WebhookEvent): Promise<'ok' | 'ignored'> {
    for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
      const record = await this.read(uploadUuid);
      if (!record || record.value.deleted) throw errors.sessionNotFound();
      const { applied, next } = decideWebhook(record.value, event, this.now());
      // Ignored, but new: remembered (written) all the same, so that its replay after the next start is ignored too.
      if (!applied && next === record.value) return 'ignored';
      try {
        this.remember(uploadUuid, { value: next, revision: await this.deps.sessions.update(sessionKey(uploadUuid), next, record.revision) });
        return applied ? 'ok' : 'ignored';
      } catch (err) {
        this.cache.delete(uploadUuid);
        if (!isStoreConflict(err)) throw err;
      }
    }
    throw errors.internal(new Error('webhook: too much contention'));
  }

  /** Waits until every ledger write this process has queued so far is done (tests, shutdown). */
  async flushLedger(): Promise<void> {
    for (const q of [...this.ledgerQueues.values()]) await q.run;
  }

  /** The session's summary; `recent`: as `SessionStore.getRecent` reads it (for answers, never for a decision). */
  private async read(uploadUuid: string, recent = false): Promise<Versioned<SessionRecord> | null> {
    // Only `randomUUID()` names a session: anything else (a path segment with a space, 5,000
    // characters, `../x`) names none, and is no store key either (the stores refuse it).
    if (!UPLOAD_UUID.test(uploadUuid)) return null;
    const { sessions } = this.deps;
    const key = sessionKey(uploadUuid);
    const stored = await (recent ? readForAnswer<SessionRecord>(sessions, key) : sessions.get<SessionRecord>(key));
    if (!stored) {
      this.cache.delete(uploadUuid);
      return null;
    }
    const record = { value: fromStored(stored.value), revision: stored.revision };
    const cached = this.cache.get(uploadUuid);
    if (!cached || cached.revision <= record.revision) this.remember(uploadUuid, record);
    return record;
  }

  private remember(uploadUuid: string, record: Versioned<SessionRecord>): void {
    this.cache.delete(uploadUuid);
    this.cache.set(uploadUuid, record);
    if (this.cache.size > CACHED_SESSIONS) this.cache.delete(this.cache.keys().next().value!);
  }

  /**
   * Queues `decide` for the session's next write and resolves with the summary after it
   * (or rejects with its error). `decide` must be pure: it runs again if the write loses.
   */
  private mutate(client: ClientRef | null, uploadUuid: string, access: Access, decide: (r: SessionRecord) => Decision): Promise<SessionRecord> {
    return new Promise((resolve, reject) => {
      let writer = this.writers.get(uploadUuid);
      if (!writer) {
        writer = { waiting: [], running: false };
        this.writers.set(uploadUuid, writer);
      }
      writer.waiting.push({ client, access, decide, resolve, reject });
      if (!writer.running) void this.write(uploadUuid, writer);
    });
  }

  /** Writes the waiting decisions of one session, a group at a time, until none is left. */
  private async write(uploadUuid: string, writer: { waiting: PendingDecision[]; running: boolean }): Promise<void> {
    writer.running = true;
    try {
      while (writer.waiting.length > 0) {
        const group = writer.waiting.splice(0);
        try {
          await this.writeGroup(uploadUuid, group);
        } catch (err) {
          for (const d of group) d.reject(err);
        }
      }
    } finally {
      writer.running = false;
      if (writer.waiting.length === 0 && this.writers.get(uploadUuid) === writer) this.writers.delete(uploadUuid);
    }
  }

  private async writeGroup(uploadUuid: string, group: PendingDecision[]): Promise<void> {
    let conflicted = false;
    for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
      if (conflicted) await conflictBackoff(attempt);
      conflicted = false;
      const cached = attempt === 0 ? this.cache.get(uploadUuid) : undefined;
      const current = cached ?? (await this.read(uploadUuid));
      let next = current?.value ?? null;
      const outcomes = group.map((d) => {
        const denied = this.denied(d, next);
        if (denied) return { error: denied };
        const decision = d.decide(next!);
        if (!decision.ok) return { error: decision.error };
        next = decision.next;
        return { record: next };
      });
      if (cached && outcomes.some((o) => o.error)) {
        // A refusal is only as good as the summary it read: another instance may have written
        // since this one cached it (a lease this cache does not hold yet). Decide again on the stored one.
        this.cache.delete(uploadUuid);
        continue;
      }
      if (current && next !== current.value) {
        try {
          const revision = await this.deps.sessions.update(sessionKey(uploadUuid), next, current.revision);
          this.remember(uploadUuid, { value: next!, revision });
        } catch (err) {
          this.cache.delete(uploadUuid);
          if (!isStoreConflict(err)) throw err;
          conflicted = true;
          continue;
        }
      }
      group.forEach((d, i) => {
        const outcome = outcomes[i]!;
        if (outcome.error) d.reject(outcome.error);
        else d.resolve(outcome.record);
      });
      return;
    }
    throw errors.internal(new Error('session update: too much contention'));
  }

  private denied(d: PendingDecision, r: SessionRecord | null): ServiceError | null {
    if (d.access === 'active') return !r || r.deleted || r.client_id !== d.client?.id ? errors.sessionNotInitialized() : null;
    if (d.access === 'any') return !r || r.client_id !== d.client?.id ? errors.sessionNotFound() : null;
    return r ? null : errors.sessionNotFound();
  }

  /** Writes recorded packages to the ledger, then folds them into the summary; per session, a group at a time. */
  private toLedger(uploadUuid: string, entries: PackageEntry[]): void {
    let queue = this.ledgerQueues.get(uploadUuid);
    if (!queue) {
      queue = { waiting: [], run: null };
      this.ledgerQueues.set(uploadUuid, queue);
    }
    queue.waiting.push(...entries);
    if (queue.run) return;
    const q = queue;
    const linger = this.deps.ledgerLingerMs ?? 10;
    q.run = (async () => {
      while (q.waiting.length > 0) {
        if (linger > 0) await new Promise((resolve) => setTimeout(resolve, linger));
        const group = q.waiting.splice(0);
        const write = async () => {
          await this.deps.ledger.append(uploadUuid, group.map(toLedger));
          await this.fold(uploadUuid, group);
        };
        await write().catch((err: unknown) => this.retryInBackground(write, err, 'write recorded packages to the ledger'));
      }
      q.run = null;
      if (this.ledgerQueues.get(uploadUuid) === q) this.ledgerQueues.delete(uploadUuid);
    })();
  }

  private async fold(uploadUuid: string, entries: readonly { id: string }[]): Promise<void> {
    const ids = entries.map((e) => e.id);
    try {
      await this.mutate(null, uploadUuid, 'system', (r) => decideFold(r, ids, this.now()));
    } catch (err) {
      if (isServiceError(err) && err.statusCode < 500) return; // the session is gone
      throw err;
    }
  }

  private async retryInBackground(fn: () => Promise<unknown>, first: unknown, what: string): Promise<void> {
    let lastErr: unknown = first;
    for (let delay = 500; delay <= RETRY_MAX_DELAY_MS; delay *= 2) {
      await new Promise((r) => setTimeout(r, delay).unref());
      try {
        await fn();
        return;
      } catch (err) {
        lastErr = err;
      }
    }
    this.deps.onBackgroundError?.(lastErr, what);
  }

  /**
   * The Connector's start body. Recording entries go to the ledger first (idempotent), so the
   * ledger then lists every package; past `inlineObjects` objects the list is written as an
   * NDJSON manifest object beside the session's objects and the body names it instead.
   */
  private async workflowStart(client: ClientRef, r: SessionRecord): Promise<WorkflowStart> {
    const recording = Object.entries(r.recording).map(([id, e]) => ({ id, ...e }));
    if (recording.length > 0) {
      await this.deps.ledger.append(r.upload_uuid, recording.map(toLedger));
      await this.fold(r.upload_uuid, recording).catch((err: unknown) => this.deps.onBackgroundError?.(err, 'fold recorded packages'));
    }
    const prefix = sessionObjectPrefix(this.deps.objectPrefix, r.client_id, r.upload_uuid);
    let sizes: Map<string, number> | null = null;
    const expected = packageCount(r);
    const objects = async function* (this: SessionService): AsyncIterable<WorkflowStart['objects'][number]> {
      let listed = 0;
      for await (const e of this.deps.ledger.list(r.upload_uuid)) {
        listed++;
        const key = objectKey(this.deps.objectPrefix, { client_id: r.client_id, upload_uuid: r.upload_uuid, entity: e.entity, package_id: e.package_id });
        let bytes = e.object_bytes;
        if (bytes === 0) {
          // Recorded by a version that did not keep the object's size: read it from storage.
          sizes ??= new Map((await this.deps.objects.list(prefix)).map((o) => [o.key, o.size]));
          bytes = sizes.get(key) ?? e.bytes;
        }
        yield { entity: e.entity, key, rows: e.rows, bytes };
      }
      if (listed !== expected) throw errors.internal(new Error(`Ledger of ${r.upload_uuid} lists ${listed} packages, the summary ${expected}`));
    }.call(this);
    const base = {
      upload_uuid: r.upload_uuid,
      client_id: client.id,
      date_from: r.workflow!.date_from,
      date_to: r.workflow!.date_to,
      entities: entityTotals(r).map(({ name, packages, rows }) => ({ name, packages, rows })),
      callback_url: this.deps.callbackUrl,
    };
    if (expected <= (this.deps.inlineObjects ?? 1000)) {
      const inline: WorkflowStart['objects'] = [];
      for await (const o of objects) inline.push(o);
      return { ...base, objects: inline };
    }
    const key = manifestKey(this.deps.objectPrefix, r.client_id, r.upload_uuid);
    let count = 0;
    let bytes = 0;
    const lines = async function* (): AsyncIterable<Uint8Array> {
      let chunk = '';
      for await (const o of objects) {
        count++;
        chunk += `${JSON.stringify(o)}\n`;
        if (chunk.length >= 256 * 1024) {
          const buf = Buffer.from(chunk);
          bytes += buf.byteLength;
          chunk = '';
          yield buf;
        }
      }
      const buf = Buffer.from(chunk);
      bytes += buf.byteLength;
      yield buf;
    };
    await this.deps.objects.put(key, lines());
    return { ...base, objects: [], manifest: { key, objects: count, bytes } };
  }
}

function toLedger(p: PackageEntry): LedgerEntry {
  return { package_id: p.id, entity: p.entity, rows: p.rows, bytes: p.bytes, object_bytes: p.object_bytes };
}

function fromLedger(e: LedgerEntry): PackageEntry {
  return { id: e.package_id, entity: e.entity, rows: e.rows, bytes: e.bytes, object_bytes: e.object_bytes };
}
