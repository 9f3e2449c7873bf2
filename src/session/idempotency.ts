/**
 * Idempotent ingest retries (`Idempotency-Key`): one record per (client, key) in the
 * SessionStore, written only with create-if-absent and compare-and-set, so any number of
 * gateway instances agree on who runs a key and what it answered.
 *
 * ```
 * (none) ──claim──> pending {attempts: [P], lease_until} ──finish──> done {status, body, at}
 *                      │  renewed every leaseMs/3 while P runs        (replayed until `at` + ttlMs)
 *                      ├─release, P never recorded──> (none)
 *                      └─release, P may be recorded, or its instance died──> taken over by the
 *                        next retry, which settles the earlier attempts first (settleAttempts)
 * ```
 * Records are bounded: one expires `ttlMs` after its answer (a pending one `ttlMs` after its
 * lease lapsed) and is then removed by `sweep`; a session's records go with it (the delete's
 * clean-up, `forgetSessionRecords`); and a client holds at most `keysPerClient`: a claim that
 * counts the client at that budget has its oldest done records removed, down to nine tenths of
 * it, before it creates its own (`#trim`). A live claim is never removed.
 * Why this stores a package once: the session records a package only while its lease is
 * live, and the uploader stores only recorded packages (state.ts `decideIngestCommit`,
 * `packageFate`). A retry that takes over a key settles every earlier attempt in one
 * compare-and-set on the session: either one of them is recorded (its rows are the answer,
 * nothing runs again), or their leases end there and none of them can ever be recorded; only
 * then does the retry's own package run. An attempt's lease is taken before its claim, so no
 * attempt can begin after a takeover settled it.
 *
 * The records and `Attempt` are in idempotency/records.ts; the claim of a running attempt
 * (renewed, finished, released) in idempotency/held-claim.ts.
 */
import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { errors } from '../errors.js';
import { idempotencyKey, idempotencyPrefix } from '../store/keys.js';
import { isStoreConflict, type Listed, type SessionStore } from '../store/ports.js';
import type { ClientRef, PackageEntry } from './state.js';
import { HeldClaim } from './idempotency/held-claim.js';
import { sameRequest, type Attempt, type IdempotencyRecord, type PendingRecord, type RequestFingerprint, type StoredAnswer } from './idempotency/records.js';

export type { Attempt, RequestFingerprint, StoredAnswer } from './idempotency/records.js';

/** 1 to 255 visible ASCII characters (`!` to `~`). */
const KEY_SYNTAX = /^[\x21-\x7e]{1,255}$/;

/** The `Idempotency-Key` header's value; null when absent. Throws IDEMPOTENCY_KEY_INVALID (400). */
export function parseIdempotencyKey(header: string | undefined): string | null {
  if (header === undefined) return null;
  if (!KEY_SYNTAX.test(header)) throw errors.idempotencyKeyInvalid();
  return header;
}

export type Claim =
  /** This attempt holds the key: run the package under `attempt.packageId`. */
  | { kind: 'run'; attempt: Attempt }
  /** The key's answer, stored by an earlier attempt. */
  | { kind: 'answer'; answer: StoredAnswer }
  /**
   * An earlier attempt's package is recorded, but its answer was never stored (its instance
   * died after recording it): build its answer, `finish` it, answer.
   */
  | { kind: 'recovered'; recorded: PackageEntry; attempt: Attempt };

export interface IdempotencyOptions {
  sessions: SessionStore;
  /**
   * The session service's `settleAttempts` (records one of a key's earlier attempts, or fences
   * them all) and `sessionDeleted` (a key of a deleted session is free: docs/api.md, "After a
   * delete a repeat is checked as new", while its record waits for the delete's clean-up).
   */
  service: {
    settleAttempts(client: ClientRef, uploadUuid: string, packageIds: readonly string[]): Promise<PackageEntry | null>;
    sessionDeleted(uploadUuid: string): Promise<boolean>;
  };
  /** How long a stored answer is replayed; afterwards the key is free again and its record is removed. */
  ttlMs: number;
  /** Records one client may hold; past it the oldest done ones are removed. Default unbounded. */
  keysPerClient?: number;
  /** How long a claim outlives its instance; renewed every third of it while the attempt runs. */
  leaseMs: number;
  /** How long a repeat waits for an attempt in progress before answering 409. */
  waitMs: number;
  /**
   * The session store belongs to this process alone (the embedded default): a claim of
   * another instance is a previous process's, dead, and is taken over at once.
   */
  singleInstance?: boolean;
  clock?: () => number;
  /** Failed writes that no client waits for (finish, release, renewal). */
  onBackgroundError?: (err: unknown, what: string) => void;
}

const POLL_FIRST_MS = 20;
const POLL_MAX_MS = 250;
/** What a trim leaves of a client's budget, so that one listing makes room for many new keys. */
const TRIM_TO = 0.9;

export class IdempotentIngests {
  readonly #opts: IdempotencyOptions;
  readonly #now: () => number;
  readonly #instance = randomUUID();
  /**
   * Per client: records as of the last listing here, plus those created here since (other
   * instances' are seen at the next listing), and the creates counted so far (`created`).
   */
  readonly #counts = new Map<string, { records: number; created: number }>();
  /** Per client: the trim running in the background. */
  readonly #trims = new Map<string, Promise<void>>();

  constructor(opts: IdempotencyOptions) {
    this.#opts = opts;
    this.#now = opts.clock ?? Date.now;
  }

  /**
   * Before the session checks: the stored answer of a finished request with this key, or
   * null (no record, one in progress, or an expired one). A replay answers whatever the
   * session's state is now: it is the answer the first attempt got.
   */
  async replay(client: ClientRef, key: string, fp: RequestFingerprint): Promise<StoredAnswer | null> {
    const cur = await this.#opts.sessions.get<IdempotencyRecord>(idempotencyKey(client.id, key));
    if (!cur || this.#expired(cur.value) || (await this.#opts.service.sessionDeleted(cur.value.upload_uuid))) return null;
    if (!sameRequest(cur.value, fp)) throw errors.idempotencyKeyReused();
    return cur.value.state === 'done' ? { status: cur.value.status, body: cur.value.body } : null;
  }

  /**
   * After the session checks, once the attempt's package lease is taken (`beginIngest`
   * returned `packageId`): claims the key for this attempt. A repeat of an attempt in
   * progress waits up to `waitMs` for its answer, then throws IDEMPOTENCY_KEY_IN_PROGRESS
   * (409). A different request under the key throws IDEMPOTENCY_KEY_REUSED (422). `signal`
   * (the client went away) ends the wait with its reason.
   */
  async claim(client: ClientRef, key: string, fp: RequestFingerprint, packageId: string, signal?: AbortSignal): Promise<Claim> {
    const { sessions } = this.#opts;
    const id = idempotencyKey(client.id, key);
    // The wait is local time (monotonic); leases are wall-clock times every instance compares.
    const deadline = performance.now() + this.#opts.waitMs;
    let pause = POLL_FIRST_MS;
    for (;;) {
      const cur = await sessions.get<IdempotencyRecord>(id);
      const now = this.#now();
      // A record of another session is free once that one is deleted (this request passed its own session's checks).
      if (!cur || this.#expired(cur.value) || (cur.value.upload_uuid !== fp.upload_uuid && (await this.#opts.service.sessionDeleted(cur.value.upload_uuid)))) {
        const record = this.#pending(fp, [packageId], now, now);
        try {
          const revision = cur ? await sessions.update(id, record, cur.revision) : await this.#createCounted(client.id, id, record);
          return { kind: 'run', attempt: new HeldClaim(this, id, revision, record, []) };
        } catch (err) {
          if (isStoreConflict(err)) continue;
          throw err;
        }
      }
      const held = cur.value;
      if (!sameRequest(held, fp)) throw errors.idempotencyKeyReused();
      if (held.state === 'done') return { kind: 'answer', answer: { status: held.status, body: held.body } };
      if (this.#alive(held, now)) {
        const left = deadline - performance.now();
        if (left <= 0) throw errors.idempotencyKeyInProgress();
        await sleep(Math.min(pause, left), undefined, signal ? { signal } : undefined);
        pause = Math.min(pause * 2, POLL_MAX_MS);
        continue;
      }

      // The attempt holding the key gave up without an answer, or its instance died: take over.
      const earlier = held.attempts.filter((a) => a !== packageId);
      const kept = { ...fp, content_length: fp.content_length ?? held.content_length };
      const record = this.#pending(kept, [packageId, ...earlier], held.created_at, now);
      let attempt: HeldClaim;
      try {
        attempt = new HeldClaim(this, id, await sessions.update(id, record, cur.revision), record, earlier);
      } catch (err) {
        if (isStoreConflict(err)) continue;
        throw err;
      }
      try {
        const recorded = earlier.length > 0 ? await this.#opts.service.settleAttempts(client, fp.upload_uuid, earlier) : null;
        attempt.settled();
        return recorded ? { kind: 'recovered', recorded, attempt } : { kind: 'run', attempt };
      } catch (err) {
        await attempt.release(false);
        throw err;
      }
    }
  }

  /**
   * Removes every expired record of these clients (a done one `ttlMs` after its answer, a
   * pending one `ttlMs` after its lease lapsed), and counts what is left for their budgets.
   * Housekeeping (at start and then periodically); returns how many records it removed.
   */
  async sweep(clientIds: Iterable<string>): Promise<number> {
    let removed = 0;
    for (const clientId of clientIds) {
      const counted = this.#count(clientId);
      const since = counted.created;
      let kept = 0;
      for await (const r of this.#opts.sessions.list<IdempotencyRecord>(idempotencyPrefix(clientId))) {
        if (this.#expired(r.value) && (await this.#remove(r))) removed++;
        else kept++;
      }
      counted.records = kept + (counted.created - since);
    }
    return removed;
  }

  /** Waits for the trims running in the background (tests, shutdown). */
  async idle(): Promise<void> {
    while (this.#trims.size > 0) await Promise.all([...this.#trims.values()]);
  }

  /**
   * A new record of the client, counted against its budget. At the budget a trim starts, and
   * the create waits for it: however fast a client sends fresh keys, it holds no more than
   * its budget (plus the creates already under way). A failed trim is reported; the create
   * goes on, and the next one at the budget tries again.
   */
  async #createCounted(clientId: string, id: string, record: PendingRecord): Promise<number> {
    const counted = this.#count(clientId);
    const budget = this.#opts.keysPerClient ?? Infinity;
    if (counted.records >= budget) {
      let trim = this.#trims.get(clientId);
      if (!trim) {
        trim = this.#trim(clientId, budget)
          .catch((err: unknown) => this.#opts.onBackgroundError?.(err, 'remove the oldest Idempotency-Key records of a client at its budget'))
          .finally(() => this.#trims.delete(clientId));
        this.#trims.set(clientId, trim);
      }
      await trim;
    }
    const revision = await this.#opts.sessions.create(id, record);
    counted.records++;
    counted.created++;
    return revision;
  }

  /**
   * The client's expired records, then its oldest done ones until nine tenths of `budget` are
   * left. Pending records stay (a live claim runs; a lapsed one waits for its retry or expiry).
   */
  async #trim(clientId: string, budget: number): Promise<void> {
    const counted = this.#count(clientId);
    const since = counted.created;
    // Only what the removal needs is kept of each record, never its answer body: a budget of
    // 10,000 records of 18 KB answers would otherwise be held in memory at once.
    const done: { key: string; revision: number; at: number }[] = [];
    let kept = 0;
    for await (const r of this.#opts.sessions.list<IdempotencyRecord>(idempotencyPrefix(clientId))) {
      if (this.#expired(r.value) && (await this.#remove(r))) continue;
      kept++;
      if (r.value.state === 'done') done.push({ key: r.key, revision: r.revision, at: r.value.at });
    }
    done.sort((a, b) => a.at - b.at);
    const target = Math.floor(budget * TRIM_TO);
    for (const r of done) {
      if (kept <= target) break;
      if (await this.#remove(r)) kept--;
    }
    counted.records = kept + (counted.created - since);
  }

  /** Deletes a listed record unless it changed since; true when it is gone. */
  async #remove(r: Pick<Listed<unknown>, 'key' | 'revision'>): Promise<boolean> {
    try {
      await this.#opts.sessions.delete(r.key, r.revision);
      return true;
    } catch (err) {
      if (isStoreConflict(err)) return false;
      throw err;
    }
  }

  #count(clientId: string): { records: number; created: number } {
    let counted = this.#counts.get(clientId);
    if (!counted) {
      counted = { records: 0, created: 0 };
      this.#counts.set(clientId, counted);
    }
    return counted;
  }

  /** @internal for HeldClaim */
  get options(): IdempotencyOptions {
    return this.#opts;
  }

  /** @internal for HeldClaim */
  now(): number {
    return this.#now();
  }

  #pending(fp: RequestFingerprint, attempts: string[], createdAt: number, now: number): PendingRecord {
    return {
      state: 'pending',
      upload_uuid: fp.upload_uuid,
      entity: fp.entity,
      content_length: fp.content_length,
      attempts,
      lease_until: now + this.#opts.leaseMs,
      owner: this.#instance,
      created_at: createdAt,
    };
  }

  /**
   * A done record past its time-to-live counts as absent; so does a pending one `ttlMs` after
   * its lease lapsed (or, released, after its first claim): a retry that late runs as a new
   * request, as it would after a done record expired (its earlier attempts' fate was sealed
   * within `ingest.inFlightLeaseMs` of their last renewal).
   */
  #expired(r: IdempotencyRecord): boolean {
    const from = r.state === 'done' ? r.at : Math.max(r.lease_until, r.created_at);
    return from + this.#opts.ttlMs <= this.#now();
  }

  #alive(r: PendingRecord, now: number): boolean {
    if (r.lease_until <= now) return false;
    return !(this.#opts.singleInstance && r.owner !== this.#instance);
  }
}

/**
 * Removes the idempotency records of one session of the client (its delete's clean-up,
 * clean-up.ts): a replay after the delete then meets the session checks like a new request.
 * A record that changes meanwhile is looked at again; resolves once none is left.
 */
export async function forgetSessionRecords(sessions: SessionStore, clientId: string, uploadUuid: string): Promise<void> {
  for (let changed = true; changed; ) {
    changed = false;
    for await (const r of sessions.list<IdempotencyRecord>(idempotencyPrefix(clientId))) {
      if (r.value.upload_uuid !== uploadUuid) continue;
      try {
        await sessions.delete(r.key, r.revision);
      } catch (err) {
        if (!isStoreConflict(err)) throw err;
        changed = true;
      }
    }
  }
}
