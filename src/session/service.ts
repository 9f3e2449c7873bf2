/**
 * The session service: runs the pure decisions of `state.ts` against the ports. Every change
 * of a session summary is a compare-and-set, retried on conflict, so any number of gateway
 * instances can serve one client without locks of their own.
 *
 * Its parts: summaries.ts (the group-committed compare-and-set of a session's summary, and
 * the cache of it), listing.ts (a client's sessions), ledger-writer.ts (recorded packages to
 * the ledger, in the background), leases.ts (the ingest leases held here, renewed on a
 * heartbeat), workflow-start.ts (the Connector's start body).
 */
import { randomUUID } from 'node:crypto';
import { isDeepStrictEqual } from 'node:util';
import type { Connector } from '../connector/types.js';
import { errors, isServiceError, isStorageUnavailable, OutcomeUnknown, type ValidationIssue } from '../errors.js';
import { activeKey, clientSessionKey, sessionKey } from '../store/keys.js';
import { isNotWritten, isStoreConflict, isStoreError, type BatchQueue, type ObjectStore, type PackageLedger, type SessionStore, type Versioned } from '../store/ports.js';
import { SessionCleanUps, type CleanUpDeps } from './clean-up.js';
import { HeldLeases } from './leases.js';
import { fromLedger, LedgerWriter, retryInBackground } from './ledger-writer.js';
import { SessionListing, type SessionListItem, type SessionPosition } from './listing.js';
import type { ClientSessionEntry } from './state.js';
import { storedCounter, type StoredCounter } from './stored-counts.js';
import { CACHED_SESSIONS, MAX_CAS_ATTEMPTS, Summaries, UPLOAD_UUID } from './summaries.js';
import { workflowStart } from './workflow-start.js';
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
  decideStart,
  decideStartAbandoned,
  decideStartFailed,
  decideStartLapsed,
  decideStartRenew,
  decideStartTaken,
  decideTerminate,
  decideWebhook,
  newSession,
  packageCount,
  startLapsed,
  statusView,
  type ActivePointer,
  type ClientRef,
  type Decision,
  type PackageEntry,
  type SessionRecord,
  type StatusView,
  type WebhookEvent,
} from './state.js';

export type { SessionListItem, SessionPosition } from './listing.js';

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
  /** How long after a delete its clean-up runs every step again (clean-up.ts; default 15 min). */
  cleanUpLatePassMs?: number;
  /** How long a record write of unknown outcome is resolved before its ingest ends unanswered (`resolveRecord`; default 30 s). */
  resolveRecordMs?: number;
  /** Background failures (ledger writes, clean-up after delete); never client errors. */
  onBackgroundError?: (err: unknown, what: string) => void;
}

const RESOLVE_RECORD_MS = 30_000;

/** A record write whose outcome `resolveRecord` could not settle. */
function unknown(cause: unknown): OutcomeUnknown {
  return new OutcomeUnknown('A package record write of unknown outcome: the store answered neither it nor the compare-and-set that would settle it in time', { cause });
}

/** How long a failed start keeps trying to put its session back to `UPLOADING` before it answers (`rollBackStart`). */
const START_ROLLBACK_MS = 15_000;
/** Spare leases (state.ts `decideIngestRecord`) a process holds per session at most: more than most clients keep in flight. */
const SPARE_LEASES = 8;
/** How long the write that takes a spare lease waits for company: about a round trip to the store under load. */
const TAKE_LINGER_MS = 20;

export class SessionService {
  private readonly now: () => number;
  /** The session summaries: read, cached, and written a group of decisions at a time. */
  private readonly summaries: Summaries;
  /** Per client: the active session this process last saw (see `knownActive`). */
  private readonly activeHints = new Map<string, string>();
  private readonly listing: SessionListing;
  private readonly ledgerWriter: LedgerWriter;
  /** Folds packages the ledger holds into the summary (`fold`), for the ledger writer and the start body. */
  private readonly folder = (uploadUuid: string, entries: readonly { id: string }[]): Promise<void> => this.fold(uploadUuid, entries);
  /** The leases of the ingests running in this process, renewed by `renewLeases`. */
  private readonly leases: HeldLeases;
  /** Per package begun on a spare lease: the write that makes it an ingest in flight (`taken`). */
  private readonly takes = new Map<string, Promise<unknown>>();

  /** What deletes left to remove, durable and retried until done (clean-up.ts). */
  private readonly cleanUps: SessionCleanUps;
  /** The uploader's count of stored packages, read by status and the listing. */
  private readonly stored: StoredCounter;

  constructor(private readonly deps: SessionServiceDeps) {
    this.now = deps.clock ?? Date.now;
    const { sessions, ledger, queue, objects, objectPrefix, onBackgroundError } = deps;
    this.stored = storedCounter({ sessions, ledger });
    this.summaries = new Summaries({
      sessions,
      // Every write of a session puts a start that lapsed back to UPLOADING first: the decision
      // sees it so. Not the webhook's (`applyWebhook` writes as it reads): a lapsed start not yet
      // written back still ends with its workflow's webhook (docs/api.md).
      settle: (r) => {
        const settled = decideStartLapsed(r, this.now());
        return settled.ok ? settled.next : r;
      },
    });
    this.leases = new HeldLeases({ inFlightLeaseMs: deps.inFlightLeaseMs, spareLeases: SPARE_LEASES }, () => void this.renewLeases());
    this.listing = new SessionListing(deps, this.stored, this.now);
    this.ledgerWriter = new LedgerWriter(deps, this.folder);
    this.cleanUps = new SessionCleanUps({
      sessions,
      ledger,
      queue,
      objects,
      objectPrefix,
      clock: this.now,
      ...(deps.cleanUpBackoff ? { backoff: deps.cleanUpBackoff } : {}),
      ...(deps.cleanUpLatePassMs !== undefined ? { latePassMs: deps.cleanUpLatePassMs } : {}),
      ...(onBackgroundError ? { onError: onBackgroundError } : {}),
    });
  }

  async initialize(client: ClientRef): Promise<{ upload_uuid: string; previous_upload_uuid?: string }> {
    const key = activeKey(client.id);
    for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
      const pointer = await this.deps.sessions.get<ActivePointer>(key);
      const current = pointer ? await this.summaries.read(pointer.value.upload_uuid) : null;
      if (current && !current.value.deleted && startLapsed(current.value, this.now())) {
        // Its start's gateway died: written back to UPLOADING, then answered as such.
        await this.putBackLapsedStart(current.value.upload_uuid);
        continue;
      }
      const decision = decideInitialize(current && !current.value.deleted ? current.value : null);
      if (!decision.create) throw decision.error;
      if (current?.value.deleted) {
        // A delete that stopped before it recorded its clean-up: record it before the pointer moves on.
        await this.cleanUps.record(client.id, current.value.upload_uuid);
        void this.cleanUps.run(client.id, current.value.upload_uuid);
      }

      const uploadUuid = randomUUID();
      const record = newSession(uploadUuid, client.id, this.now(), decision.previous);
      const revision = await this.deps.sessions.create(sessionKey(uploadUuid), record).catch((err: unknown) => {
        // It may have landed unanswered: a summary no pointer or listing would ever name, taken back.
        if (!isStoreConflict(err) && !isNotWritten(err)) void this.deps.sessions.delete(sessionKey(uploadUuid)).catch(() => undefined);
        throw err;
      });
      const indexed = clientSessionKey(client.id, uploadUuid, record.created_at);
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
      this.summaries.remember(uploadUuid, { value: record, revision });
      this.rememberActive(client.id, uploadUuid);
      return { upload_uuid: uploadUuid, ...(decision.previous ? { previous_upload_uuid: decision.previous } : {}) };
    }
    throw errors.storageUnavailable(new Error('initialize-session: too much contention'));
  }

  /** The session-access checks of path-bound endpoints: 400 no active session, 403 another uuid. */
  async requireActive(client: ClientRef, uploadUuid: string): Promise<Versioned<SessionRecord>> {
    await this.requirePointer(client, uploadUuid);
    const record = await this.summaries.read(uploadUuid);
    if (!record || record.value.deleted || record.value.client_id !== client.id) throw errors.sessionNotInitialized();
    return record;
  }

  /**
   * The active-session pointer check alone (one read): for ingest, whose lease decision
   * checks the summary itself. A client error is concluded from a confirmed read only
   * (`SessionStore.getConfirmed`): a stale read that names another session, or none, would
   * answer a client whose session was created meanwhile with 403 or 400.
   */
  async requirePointer(client: ClientRef, uploadUuid: string): Promise<void> {
    const key = activeKey(client.id);
    let pointer = await this.deps.sessions.get<ActivePointer>(key);
    if (pointer?.value.upload_uuid !== uploadUuid) pointer = await this.deps.sessions.getConfirmed<ActivePointer>(key);
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

  /** Whether `uploadUuid` is deleted (marked so, or its summary gone with the clean-up): what a key of it answered is replayed no more. */
  async sessionDeleted(uploadUuid: string): Promise<boolean> {
    const record = await this.summaries.read(uploadUuid);
    return !record || record.value.deleted === true;
  }

  async status(client: ClientRef, uploadUuid: string): Promise<StatusView> {
    const counts = () => (UPLOAD_UUID.test(uploadUuid) ? this.stored.perEntity(uploadUuid) : Promise.resolve(new Map<string, number>()));
    // The three reads go at once. When nothing is pending the stored counts are read again,
    // after the queue answered: a package is counted before it is acked, so only then is every
    // package's count there to read. While anything is pending a count read a moment early
    // serves (the uploads are not finished, and a count never goes back).
    const [record, pending, early] = await Promise.all([this.summaries.read(uploadUuid, true), this.deps.queue.hasPending(uploadUuid, { forAnswer: true }), counts()]);
    const stored = pending ? early : await counts();
    if (!record || record.value.deleted || record.value.client_id !== client.id) throw errors.sessionNotFound();
    if (startLapsed(record.value, this.now())) {
      // Its start's gateway died: put back to UPLOADING in the background, which the next status shows.
      void this.putBackLapsedStart(uploadUuid).catch((err: unknown) => {
        if (!isServiceError(err) && !isStorageUnavailable(err)) this.deps.onBackgroundError?.(err, 'put back a start that lapsed');
      });
    }
    // Only whether any package waits for the uploader matters, not how many.
    return statusView(record.value, pending ? 1 : 0, this.now(), stored);
  }

  /** The client's sessions, newest first, a page at a time (listing.ts). */
  listSessions(client: ClientRef, limit: number, after: SessionPosition | null): Promise<{ sessions: SessionListItem[]; next: SessionPosition | null }> {
    return this.listing.list(client, limit, after);
  }

  /** Indexes the sessions of versions without the listing's index, once per store (listing.ts); returns how many entries it created. */
  indexEarlierSessions(): Promise<number> {
    return this.listing.indexEarlierSessions();
  }

  /**
   * Registers an ingest (its lease keeps `upload_tasks_finished` false) and returns its
   * package id. Checks the session's state: 409 when it is not UPLOADING. A spare lease
   * granted here with an earlier record of the session serves at once: its move to the
   * ingests in flight (`decideIngestTake`) is written while the body is read and committed,
   * with the session's next write if one comes within `TAKE_LINGER_MS`, and the record,
   * queued behind it, fails as it did (a start-upload came first: 409).
   */
  async beginIngest(client: ClientRef, uploadUuid: string): Promise<string> {
    const spare = this.leases.takeSpare(uploadUuid);
    if (spare !== undefined) {
      const take = this.summaries.mutate(client, uploadUuid, 'active', (r) => decideIngestTake(r, spare, this.now(), this.deps.inFlightLeaseMs), TAKE_LINGER_MS);
      take.catch(() => undefined); // its failure is the ingest's, through `taken`
      this.takes.set(spare, take);
      return spare;
    }
    const packageId = randomUUID();
    try {
      await this.summaries.mutate(client, uploadUuid, 'active', (r) =>
        decideIngestBegin(r, packageId, this.now(), this.deps.inFlightLeaseMs, this.deps.maxPackages),
      );
    } catch (err) {
      // A store failure leaves it unknown whether the lease was written: take it back, with a
      // fence, so a write still out cannot land after it (a lease no ingest renews, holding
      // `upload_tasks_finished` false until it lapses).
      if (!isServiceError(err) || err.statusCode >= 500) void this.releaseIngest(client, uploadUuid, packageId, !isNotWritten(err));
      throw err;
    }
    this.leases.hold(client, uploadUuid, packageId);
    return packageId;
  }

  /**
   * Resolves once the session accepted the ingest `packageId` began on a spare lease
   * (`beginIngest`), at once for one that took its lease with a write; rejects with the
   * session's refusal (400, 409) or a store failure. Asked once per ingest.
   */
  async taken(packageId: string): Promise<void> {
    const take = this.takes.get(packageId);
    this.takes.delete(packageId);
    await take;
  }

  /**
   * Renews the leases of the ingests running in this process (`decideIngestRenew`), and ends
   * the spare leases no ingest took since the last beat: one compare-and-set per session,
   * shared with whatever else the session's next write carries.
   * Runs every third of `inFlightLeaseMs` while any is held, so a lease outlives two failed
   * renewals, and a dead instance's leases end within `inFlightLeaseMs` (docs/reliability.md,
   * Leftovers after a restart heal themselves).
   */
  async renewLeases(): Promise<void> {
    await Promise.all(
      this.leases.beat().map(async ({ uploadUuid, client, ids, idle }) => {
        try {
          await this.summaries.mutate(client, uploadUuid, 'any', (r) => {
            const released = decideIngestRelease(r, idle, this.now());
            return released.ok ? decideIngestRenew(released.next, ids, this.now(), this.deps.inFlightLeaseMs) : released;
          });
        } catch (err) {
          // The session is gone, or the store is out (the next beat tries again; readiness says so).
          if (isServiceError(err) || isStorageUnavailable(err) || isStoreError(err, 'STORE_CLOSED')) return;
          this.deps.onBackgroundError?.(err, 'renew ingest leases');
        }
      }),
    );
  }

  /**
   * Records a package whose rows are committed to the queue; once this resolves the package
   * will be stored. Its ledger entry is written afterwards, in the background, and folded
   * into the summary's totals (see state.ts).
   */
  async recordIngest(client: ClientRef, uploadUuid: string, pkg: PackageEntry): Promise<void> {
    // The client is likely to send more: a spare lease saves its next ingest here the lease write.
    const grant = this.leases.reserveSpare(uploadUuid) ? randomUUID() : null;
    let granted = false;
    try {
      const recorded = await this.summaries.mutate(client, uploadUuid, 'active', (r) =>
        decideIngestRecord(r, pkg, this.now(), grant === null ? {} : { grant: { id: grant, until: this.now() + this.deps.inFlightLeaseMs }, maxPackages: this.deps.maxPackages }),
      );
      granted = grant !== null && recorded.spare_leases?.[grant] !== undefined;
    } catch (err) {
      // The decision refused (nothing written): the caller releases the lease.
      if (isServiceError(err)) throw err;
      // The store refused the write for sure (ports.ts `notWritten`): nothing to settle.
      if (isNotWritten(err)) throw errors.storageUnavailable(err);
      // A store failure (a timeout) may have landed: resolve it before anyone answers.
      if ((await this.resolveRecord(client, uploadUuid, pkg.id, err)) === 'fenced') throw errors.storageUnavailable(err);
    } finally {
      // Recorded (the lease became the record), or failed: no more renewals.
      this.leases.unhold(uploadUuid, pkg.id);
      if (grant !== null) this.leases.settleSpare(client, uploadUuid, granted ? grant : null);
    }
    this.ledgerWriter.write(uploadUuid, [pkg]);
  }

  /**
   * After a record write of unknown outcome: either it landed (`recorded`: the package will be
   * stored, its client gets 200), or its lease is ended now in one compare-and-set (`fenced`:
   * it can never be recorded, the uploader drops it, its client is told 503 and nothing is
   * stored). Tries for `resolveRecordMs` while the store does not answer; still unknown then,
   * throws `OutcomeUnknown` (no answer is sent: errors.ts; the ingest keeps the package among
   * its key's attempts, see idempotency.ts), also while an attempt is still out: that one goes
   * on in the background (it can only confirm the record or end the lease), so the ingest never
   * waits past the deadline. On NATS the record write itself may still land after it (sent to a
   * server that stopped answering, it waits in the server's socket), so no answer is true then.
   */
  private async resolveRecord(client: ClientRef, uploadUuid: string, packageId: string, first: unknown): Promise<'recorded' | 'fenced'> {
    const budgetMs = this.deps.resolveRecordMs ?? RESOLVE_RECORD_MS;
    const deadline = Date.now() + budgetMs;
    let timer: NodeJS.Timeout | undefined;
    const expired = new Promise<'expired'>((resolve) => (timer = setTimeout(() => resolve('expired'), budgetMs)));
    try {
      for (let delay = 100; ; delay = Math.min(delay * 2, 2000)) {
        const attempt = this.settleAttempts(client, uploadUuid, [packageId]);
        attempt.catch(() => undefined); // once past the deadline, nobody waits on it
        let settled: Awaited<typeof attempt> | 'expired';
        try {
          settled = await Promise.race([attempt, expired]);
        } catch (err) {
          if (isServiceError(err) && err.statusCode < 500) throw err; // the session is gone
          if (Date.now() + delay >= deadline) throw unknown(first);
          await new Promise((resolve) => setTimeout(resolve, delay));
          continue;
        }
        if (settled === 'expired') throw unknown(first);
        return settled ? 'recorded' : 'fenced';
      }
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Settles earlier attempts of one idempotent request (see idempotency.ts): the package of
   * the one the session recorded, if any; otherwise none of them is recorded, and all their
   * leases end in the same compare-and-set, written even when none is held (`decideIngestFence`:
   * what was read may be a deposed leader's), so that none can be recorded any more (recording
   * needs the live lease: `decideIngestRecord`), and the uploader drops whatever of them
   * reached the queue.
   */
  async settleAttempts(client: ClientRef, uploadUuid: string, packageIds: readonly string[]): Promise<PackageEntry | null> {
    let recorded: PackageEntry | null = null;
    await this.summaries.mutate(client, uploadUuid, 'any', (r) => {
      const id = packageIds.find((p) => p in r.recording);
      recorded = id === undefined ? null : { id, ...r.recording[id]! };
      return recorded ? { ok: true, next: r } : decideIngestFence(r, packageIds, this.now());
    });
    if (recorded) return recorded;
    // Neither recording nor leased in the summary just written: folded (the ledger holds it, read confirmed) or never recorded.
    for (const id of packageIds) {
      const entry = await this.deps.ledger.getConfirmed(uploadUuid, id);
      if (entry) return fromLedger(entry);
    }
    return null;
  }

  /**
   * Ends a failed ingest's lease. Never throws: when the store is unavailable (a failover,
   * often the very reason the ingest failed) it keeps trying in the background, since the
   * lease would otherwise hold `upload_tasks_finished` false until it expires. `fence`: written
   * even where the lease is not held (`decideIngestFence`).
   */
  async releaseIngest(client: ClientRef, uploadUuid: string, packageId: string, fence = false): Promise<void> {
    this.leases.unhold(uploadUuid, packageId);
    const decide = fence ? decideIngestFence : decideIngestRelease;
    const release = () => this.summaries.mutate(client, uploadUuid, 'any', (r) => decide(r, [packageId], this.now()));
    try {
      await release();
    } catch (first) {
      if (isServiceError(first) && first.statusCode < 500) return; // the session is gone: nothing to release
      void retryInBackground(release, first, 'release ingest lease', (err, what) => this.deps.onBackgroundError?.(err, what));
    }
  }

  async start(
    client: ClientRef,
    uploadUuid: string,
    dates: { date_from: string; date_to: string } | { issues: ValidationIssue[] },
  ): Promise<unknown> {
    await this.requirePointer(client, uploadUuid);
    // The packages recorded before the pending check: one recorded after it (an ingest whose lease
    // the check's moment saw, committed and recorded while the queue answered) may not have been
    // seen pending, and holds the start back as its lease did (`decideStart`).
    const seen = await this.summaries.read(uploadUuid);
    // A package whose object is stored is not pending, whatever the queue's ack floor read says.
    const stored = (packageId: string) => this.deps.ledger.isStored(uploadUuid, packageId);
    const pendingBatches = (await this.deps.queue.hasPending(uploadUuid, { stored })) ? 1 : 0;
    // A start ends every spare lease (`decideStart`): none is handed out meanwhile.
    this.leases.dropSpares(uploadUuid);
    const leaseMs = this.deps.inFlightLeaseMs;
    const startId = randomUUID();
    const started = await this.summaries
      .mutate(client, uploadUuid, 'active', (r) => decideStart(r, { dates, minDate: client.minDate, pendingBatches, packagesSeen: seen ? packageCount(seen.value) : 0, now: this.now(), leaseMs, startId }))
      .catch(async (err: unknown) => {
        // A write of unknown outcome may have landed: a start no gateway holds, which the
        // client's retry would meet as 409 until its hold lapsed. Put back before the 503.
        if (isStorageUnavailable(err) && !isNotWritten(err)) await this.rollBackStart(client, uploadUuid, (r) => decideStartAbandoned(r, startId, this.now()));
        throw err;
      });
    const startedAt = started.workflow!.started_at;
    // Held while this process works on it, as an ingest's lease: if it dies, the start lapses back to UPLOADING.
    const hold = setInterval(() => void this.renewStart(client, uploadUuid, startedAt, leaseMs), Math.max(1, Math.floor(leaseMs / 3)));
    hold.unref();
    let answer: unknown;
    try {
      answer = await this.deps.connector.start(await workflowStart(this.deps, this.folder, client, started));
    } catch (err) {
      clearInterval(hold);
      await this.rollBackStart(client, uploadUuid, (r) => decideStartFailed(r, startedAt, this.now()));
      throw err;
    }
    clearInterval(hold);
    // Failing, the hold lapses (the session back to UPLOADING) and the client's retry starts again: the Connector's same workflow.
    await this.summaries.mutate(client, uploadUuid, 'any', (r) => decideStartTaken(r, startedAt, this.now()));
    return answer;
  }

  private async renewStart(client: ClientRef, uploadUuid: string, startedAt: string, leaseMs: number): Promise<void> {
    try {
      await this.summaries.mutate(client, uploadUuid, 'any', (r) => decideStartRenew(r, startedAt, this.now(), leaseMs));
    } catch (err) {
      // The session is gone, or the store is out (the next beat tries again).
      if (isServiceError(err) || isStorageUnavailable(err) || isStoreError(err, 'STORE_CLOSED')) return;
      this.deps.onBackgroundError?.(err, 'renew the hold of a start');
    }
  }

  /**
   * Puts back to UPLOADING the active sessions of `clientIds` whose start lapsed (its gateway
   * died during the Connector's call, `decideStartLapsed`); `all`: every start held, when no
   * other process can hold one (the embedded default at start). Housekeeping; returns how many.
   */
  async settleLapsedStarts(clientIds: Iterable<string>, all = false): Promise<number> {
    let settled = 0;
    for (const clientId of clientIds) {
      const pointer = await this.deps.sessions.get<ActivePointer>(activeKey(clientId));
      const record = pointer ? await this.summaries.read(pointer.value.upload_uuid) : null;
      if (!record || record.value.deleted || !startLapsed(record.value, this.now(), all)) continue;
      await this.putBackLapsedStart(record.value.upload_uuid, all);
      settled++;
    }
    return settled;
  }

  /** Writes the session's summary with a lapsed start put back (`decideStartLapsed`, also the `settle` of every write). */
  private putBackLapsedStart(uploadUuid: string, everyHold = false): Promise<SessionRecord> {
    return this.summaries.mutate(null, uploadUuid, 'system', (r) => decideStartLapsed(r, this.now(), everyHold));
  }

  /**
   * Puts a start that failed back to `UPLOADING` (`decide`: `decideStartFailed`, or
   * `decideStartAbandoned` for a start whose own write's outcome is unknown), before its answer where
   * it can: storage that failed the start often fails this write too (on NATS, leaders are
   * elected for up to about 25 s after a majority comes back), and a session left `STARTED`
   * with no workflow answers 409 until its hold lapses. A failed attempt is tried again by `retryInBackground`,
   * which the answer waits for up to `START_ROLLBACK_MS`.
   */
  private async rollBackStart(client: ClientRef, uploadUuid: string, decide: (r: SessionRecord) => Decision): Promise<void> {
    const rollBack = () => this.summaries.mutate(client, uploadUuid, 'any', decide);
    try {
      await rollBack();
    } catch (err) {
      if (isServiceError(err) && err.statusCode < 500) return; // the session is gone: nothing to put back
      const retried = retryInBackground(rollBack, err, 'roll back a failed start', (e, what) => this.deps.onBackgroundError?.(e, what));
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([retried, new Promise((resolve) => (timer = setTimeout(resolve, START_ROLLBACK_MS)))]);
      clearTimeout(timer);
    }
  }

  async terminate(client: ClientRef, uploadUuid: string): Promise<void> {
    await this.requirePointer(client, uploadUuid);
    await this.summaries.mutate(client, uploadUuid, 'active', (r) => decideTerminate(r, this.now()));
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
    this.leases.dropSpares(uploadUuid);
    try {
      await this.summaries.mutate(client, uploadUuid, 'active', (r) => decideDelete(r, this.now()));
    } catch (err) {
      const marked = isServiceError(err) && err.code === 'SESSION_NOT_INITIALIZED' ? await this.summaries.read(uploadUuid) : null;
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
    /** The write of the last attempt that came back as a lost compare-and-set (as stored: JSON), and its answer. */
    let tried: { written: unknown; answer: 'ok' | 'ignored' } | null = null;
    for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
      const record = await this.summaries.read(uploadUuid);
      if (!record || record.value.deleted) throw errors.sessionNotFound();
      // That write landed after all (NATS can answer so): the summary is exactly it, answered as it would have been.
      if (tried && isDeepStrictEqual(record.value, tried.written)) return tried.answer;
      const { applied, next } = decideWebhook(record.value, event, this.now());
      // Ignored, but new: remembered (written) all the same, so that its replay after the next start is ignored too.
      if (!applied && next === record.value) return 'ignored';
      try {
        this.summaries.remember(uploadUuid, { value: next, revision: await this.deps.sessions.update(sessionKey(uploadUuid), next, record.revision) });
        return applied ? 'ok' : 'ignored';
      } catch (err) {
        this.summaries.forget(uploadUuid);
        if (!isStoreConflict(err)) throw err;
        tried = { written: JSON.parse(JSON.stringify(next)), answer: applied ? 'ok' : 'ignored' };
      }
    }
    throw errors.storageUnavailable(new Error('webhook: too much contention'));
  }

  /** Waits until every ledger write this process has queued so far is done (tests, shutdown). */
  flushLedger(): Promise<void> {
    return this.ledgerWriter.flush();
  }

  private async fold(uploadUuid: string, entries: readonly { id: string }[]): Promise<void> {
    const ids = entries.map((e) => e.id);
    try {
      await this.summaries.mutate(null, uploadUuid, 'system', (r) => decideFold(r, ids, this.now()));
    } catch (err) {
      if (isServiceError(err) && err.statusCode < 500) return; // the session is gone
      throw err;
    }
  }
}
