/**
 * The session summaries as this process reads and writes them. Every change of a summary is
 * a compare-and-set, retried on conflict, so any number of gateway instances can serve one
 * client without locks of their own.
 *
 * Group commit: the decisions waiting for one session in this process are applied together,
 * in arrival order, and written with one compare-and-set — fifty concurrent ingests of a
 * session cost a handful of writes, not a hundred. Each decision succeeds or fails on its
 * own. The last summary this process wrote is cached, so a write usually needs no read
 * first; another instance's write shows up as a conflict, and the summary is read again.
 */
import { errors, isStorageUnavailable, type ServiceError } from '../errors.js';
import { sessionKey } from '../store/keys.js';
import { isStoreConflict, readForAnswer, type SessionStore, type Versioned } from '../store/ports.js';
import { fromStored, type ClientRef, type Decision, type SessionRecord } from './state.js';

/** Compare-and-set attempts before a write of the service's own (initialize, a webhook) gives up (500: too much contention). */
export const MAX_CAS_ATTEMPTS = 32;
/**
 * How long a summary write keeps deciding again after losing to another instance's write of
 * the same session before it gives up (503 with `Retry-After`). Not a count of attempts: an
 * instance that writes a session without pause (its decisions grouped, its last summary
 * cached: one request a write) wins against one that lost and must read first (two), so
 * the loser of two gateways under load on one session lost 32 times in a row within 1.3 s
 * several times a minute (three nodes, R3; 500s in the network drill).
 */
export const CONFLICT_BUDGET_MS = 10_000;
/** Sessions whose last written summary is kept in memory. */
export const CACHED_SESSIONS = 10_000;
/** An upload uuid as `initialize` makes them (docs/api.md, Session rules: random UUID v4, lowercase). */
export const UPLOAD_UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

/**
 * After a lost compare-and-set (another instance wrote): a random pause up to 2^attempt ms, at
 * most 100 ms. While the summary is contended (`SessionStore.contended`), before every write
 * of every instance, the winner's too: up to 1 ms, so that each starts its next read as the
 * others do (bench/micro/contention.ts: the longer pauses of the one that kept losing left it
 * further behind).
 */
function conflictBackoff(attempt: number, contended: boolean): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, Math.random() * (contended ? 1 : Math.min(100, 2 ** attempt))));
}

/**
 * Who may apply a decision: `active` the client's session while it is not deleted (400
 * otherwise, as a fresh request would get); `any` the client's session in any state;
 * `system` any existing session (the service's own bookkeeping: folding ledger entries).
 */
export type Access = 'active' | 'any' | 'system';

interface PendingDecision {
  client: ClientRef | null;
  access: Access;
  decide: (r: SessionRecord) => Decision;
  resolve: (r: SessionRecord) => void;
  reject: (err: unknown) => void;
}

interface Writer {
  waiting: PendingDecision[];
  running: boolean;
  linger?: NodeJS.Timeout;
}

/** The summaries as this process last saw them, and the per-session queue of decisions that writes them. */
export class Summaries {
  /** Per session: decisions waiting for the next write, whether a write is under way, and the timer of lingering ones. */
  private readonly writers = new Map<string, Writer>();
  /** Per session: the summary as this process last wrote or read it (least recently used first). */
  private readonly cache = new Map<string, Versioned<SessionRecord>>();

  /**
   * `conflictBudgetMs`: `CONFLICT_BUDGET_MS` unless given (tests). `settle`: applied to the
   * stored summary before a write's decisions, and written with them (a start that lapsed).
   */
  constructor(
    private readonly deps: { readonly sessions: SessionStore; readonly conflictBudgetMs?: number; readonly settle?: (r: SessionRecord) => SessionRecord },
  ) {}

  /** The session's summary; `forAnswer`: as `SessionStore.getRecent` reads it (status: for answers, never for a decision). */
  async read(uploadUuid: string, forAnswer = false): Promise<Versioned<SessionRecord> | null> {
    // Only `randomUUID()` names a session: anything else (a path segment with a space, 5,000
    // characters, `../x`) names none, and is no store key either (the stores refuse it).
    if (!UPLOAD_UUID.test(uploadUuid)) return null;
    const { sessions } = this.deps;
    const key = sessionKey(uploadUuid);
    const stored = await (forAnswer ? readForAnswer<SessionRecord>(sessions, key) : sessions.get<SessionRecord>(key));
    if (!stored) {
      this.cache.delete(uploadUuid);
      return null;
    }
    const record = { value: fromStored(stored.value), revision: stored.revision };
    const cached = this.cache.get(uploadUuid);
    if (!cached || cached.revision <= record.revision) this.remember(uploadUuid, record);
    return record;
  }

  remember(uploadUuid: string, record: Versioned<SessionRecord>): void {
    this.cache.delete(uploadUuid);
    this.cache.set(uploadUuid, record);
    if (this.cache.size > CACHED_SESSIONS) this.cache.delete(this.cache.keys().next().value!);
  }

  /** Drops the cached summary (a write of it failed, or lost to another instance's). */
  forget(uploadUuid: string): void {
    this.cache.delete(uploadUuid);
  }

  /**
   * Queues `decide` for the session's next write and resolves with the summary after it
   * (or rejects with its error). `decide` must be pure: it runs again if the write loses.
   * `lingerMs`: with no write under way, waits that long for another decision to share the
   * write with (one that does not linger starts it at once).
   */
  mutate(client: ClientRef | null, uploadUuid: string, access: Access, decide: (r: SessionRecord) => Decision, lingerMs = 0): Promise<SessionRecord> {
    return new Promise((resolve, reject) => {
      let writer = this.writers.get(uploadUuid);
      if (!writer) {
        writer = { waiting: [], running: false };
        this.writers.set(uploadUuid, writer);
      }
      writer.waiting.push({ client, access, decide, resolve, reject });
      if (writer.running) return;
      if (lingerMs === 0) {
        clearTimeout(writer.linger);
        void this.write(uploadUuid, writer);
      } else writer.linger ??= setTimeout(() => void this.write(uploadUuid, writer), lingerMs);
    });
  }

  /** Writes the waiting decisions of one session, a group at a time, until none is left. */
  private async write(uploadUuid: string, writer: Writer): Promise<void> {
    if (writer.running) return;
    clearTimeout(writer.linger);
    writer.linger = undefined;
    writer.running = true;
    try {
      while (writer.waiting.length > 0) {
        const group = writer.waiting.splice(0);
        try {
          await this.writeGroup(uploadUuid, group);
        } catch (err) {
          for (const d of group) d.reject(err);
          // The store failed a write for the whole of its retry budget: the decisions that
          // waited behind it fail with it, rather than wait a budget of their own (an ingest
          // on a gateway cut off from NATS was told 503 after 20 s, not 10).
          if (isStorageUnavailable(err)) for (const d of writer.waiting.splice(0)) d.reject(err);
        }
      }
    } finally {
      writer.running = false;
      if (writer.waiting.length === 0 && this.writers.get(uploadUuid) === writer) this.writers.delete(uploadUuid);
    }
  }

  private async writeGroup(uploadUuid: string, group: PendingDecision[]): Promise<void> {
    const budgetMs = this.deps.conflictBudgetMs ?? CONFLICT_BUDGET_MS;
    const deadline = Date.now() + budgetMs;
    let conflicted = false;
    for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS || Date.now() < deadline; attempt++) {
      const contended = this.deps.sessions.contended?.(sessionKey(uploadUuid)) ?? false;
      if (conflicted || contended) await conflictBackoff(attempt, contended);
      conflicted = false;
      // Another process lost a write of this summary a moment ago: read first, as it must (not from the cache).
      const cached = attempt === 0 && !contended ? this.cache.get(uploadUuid) : undefined;
      const current = cached ?? (await this.read(uploadUuid));
      let next = current ? (this.deps.settle?.(current.value) ?? current.value) : null;
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
          this.deps.sessions.lostWrite?.(sessionKey(uploadUuid));
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
    throw errors.storageUnavailable(new Error(`session update: lost to other instances' writes for ${budgetMs} ms`));
  }

  private denied(d: PendingDecision, r: SessionRecord | null): ServiceError | null {
    if (d.access === 'active') return !r || r.deleted || r.client_id !== d.client?.id ? errors.sessionNotInitialized() : null;
    if (d.access === 'any') return !r || r.client_id !== d.client?.id ? errors.sessionNotFound() : null;
    return r ? null : errors.sessionNotFound();
  }
}
