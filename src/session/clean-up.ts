/**
 * What a delete removes after its answer, as durable work: the session's queued batches, stored
 * objects, ledger, idempotency records and, last, its summary. Delete marks the summary deleted,
 * then records `cleanup.<upload_uuid>` in the session store, both before it answers; the
 * clean-up then runs in the background, each step idempotent, retried with backoff until every
 * step succeeded (a full disk, EMFILE, an object store that refuses). A record left by a stopped
 * process is taken up again by `resume` (at start and at every housekeeping round, on any
 * instance), so no deleted session's data stays for good.
 *
 * The record stays after that first pass, marked `swept`, for `latePassMs` from the delete: an
 * uploader may have begun a put of the session's package before the delete and land it after
 * the pass listed the objects. A live uploader sees the session gone after its put and deletes
 * the object (uploader.ts), but one that crashed in between never does, and the purge took the
 * package's queue message, so no redelivery comes to do it either; the same holds for a stored
 * count written just after the pass. The first housekeeping round after `latePassMs` runs every
 * step again and only then removes the record.
 *
 * ```
 * delete: summary.deleted = true ──> cleanup.<uuid> created ──> 200
 *                                         │ (background, retried until done; resumed after a restart)
 *                                         v
 *         queue purge → objects → ledger → idempotency records → stored count, listing entry
 *         → summary ──> cleanup.<uuid> swept ··· latePassMs ··> every step again ──> removed
 * ```
 * A record whose summary is there and not deleted names a delete that never happened (the
 * record is written only after the mark): it is removed and nothing else is touched.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { cleanUpKey, sessionKey, sessionObjectPrefix, storedCountKey } from '../store/keys.js';
import { isStoreConflict, isStoreError, type BatchQueue, type ObjectStore, type PackageLedger, type SessionStore } from '../store/ports.js';
import { forgetSessionRecords } from './idempotency.js';
import { forgetListingEntries } from './listing.js';
import type { SessionRecord } from './state.js';

/** Rounds run again at once after a lost compare-and-set, before one counts as failed. */
const CONFLICT_RETRIES = 5;

/**
 * How long after a delete its clean-up runs every step once more (`CleanUpDeps.latePassMs`):
 * longer than a put begun before the delete may take to land (an S3 put is at most a few
 * requests of `s3.requestTimeoutMs`, 60 s each by default, tried up to three times).
 */
export const LATE_PASS_MS = 15 * 60_000;

/** The stored record of a clean-up to do (`cleanup.<upload_uuid>`). */
export interface PendingCleanUp {
  client_id: string;
  upload_uuid: string;
  /** When the delete recorded it (epoch ms). */
  since: number;
  /** When a pass of every step first succeeded (epoch ms); the late pass is still to come. */
  swept?: number;
}

export interface CleanUpDeps {
  sessions: SessionStore;
  ledger: PackageLedger;
  queue: BatchQueue;
  objects: ObjectStore;
  objectPrefix: string;
  clock?: () => number;
  /** The pause after the first failed round, doubled after each further one up to `maxMs` (default 500 ms, 60 s). */
  backoff?: { firstMs: number; maxMs: number };
  /** How long after the delete the late pass is due (default `LATE_PASS_MS`). */
  latePassMs?: number;
  /** A failed round (it is retried) and what it was doing. */
  onError?: (err: unknown, what: string) => void;
}

const PREFIX = 'cleanup.';

export class SessionCleanUps {
  readonly #deps: CleanUpDeps;
  readonly #now: () => number;
  readonly #latePassMs: number;
  /** Clean-ups running in this process, by upload uuid. */
  readonly #running = new Map<string, Promise<void>>();
  readonly #stop = new AbortController();

  constructor(deps: CleanUpDeps) {
    this.#deps = deps;
    this.#now = deps.clock ?? Date.now;
    this.#latePassMs = deps.latePassMs ?? LATE_PASS_MS;
  }

  /** Records the clean-up of a session marked deleted; resolves once durable. A record already there is kept. */
  async record(clientId: string, uploadUuid: string): Promise<void> {
    const pending: PendingCleanUp = { client_id: clientId, upload_uuid: uploadUuid, since: this.#now() };
    try {
      await this.#deps.sessions.create(cleanUpKey(uploadUuid), pending);
    } catch (err) {
      if (!isStoreConflict(err)) throw err;
    }
  }

  /**
   * Runs a recorded clean-up in the background, unless it already runs here: the first pass
   * when not swept yet, and the late pass when it is due; otherwise it ends, swept, and a
   * housekeeping round (`resume`) takes it up again once due.
   */
  run(clientId: string, uploadUuid: string): Promise<void> {
    const running = this.#running.get(uploadUuid);
    if (running) return running;
    const run = this.#untilDone(clientId, uploadUuid).finally(() => this.#running.delete(uploadUuid));
    this.#running.set(uploadUuid, run);
    return run;
  }

  /**
   * Starts every recorded clean-up that does not run in this process and has a pass to do:
   * not swept yet (a process that stopped, or failed here before), or its late pass due.
   * Returns how many it started; rejects when the records cannot be listed.
   */
  async resume(): Promise<number> {
    let started = 0;
    for await (const { value } of this.#deps.sessions.list<PendingCleanUp>(PREFIX)) {
      if (this.#stop.signal.aborted) break;
      if (this.#running.has(value.upload_uuid) || !this.#needsPass(value)) continue;
      void this.run(value.client_id, value.upload_uuid);
      started++;
    }
    return started;
  }

  /** Waits for the clean-ups running here (tests). */
  async idle(): Promise<void> {
    while (this.#running.size > 0) await Promise.all([...this.#running.values()]);
  }

  /** Stops retrying (shutdown); a clean-up not done stays recorded for the next `resume`. */
  async close(): Promise<void> {
    this.#stop.abort();
    await Promise.allSettled([...this.#running.values()]);
  }

  /** Whether the record has a pass to do: its first, or its late one once due. */
  #needsPass(pending: PendingCleanUp): boolean {
    return pending.swept === undefined || this.#latePassDue(pending);
  }

  #latePassDue(pending: PendingCleanUp): boolean {
    return this.#now() >= pending.since + this.#latePassMs;
  }

  async #untilDone(clientId: string, uploadUuid: string): Promise<void> {
    const { firstMs, maxMs } = this.#deps.backoff ?? { firstMs: 500, maxMs: 60_000 };
    for (let delay = firstMs; !this.#stop.signal.aborted; delay = Math.min(maxMs, Math.max(1, delay * 2))) {
      try {
        // A write to the summary racing the last step (an ingest of the deleted session ending
        // its lease) is a lost compare-and-set, not a failure: the round runs again at once.
        for (let conflicts = 0; ; conflicts++) {
          try {
            await this.#once(clientId, uploadUuid);
            return;
          } catch (err) {
            if (!isStoreConflict(err) || conflicts >= CONFLICT_RETRIES) throw err;
          }
        }
      } catch (err) {
        if (this.#stop.signal.aborted && isStoreError(err, 'STORE_CLOSED')) return;
        this.#deps.onError?.(err, `clean up deleted session ${uploadUuid} (retried in ${delay} ms)`);
      }
      try {
        await sleep(delay, undefined, { signal: this.#stop.signal });
      } catch {
        return; // closed
      }
    }
  }

  /**
   * One round, if the record still has a pass to do: every step, each of which changes nothing
   * when already done; then the record is marked swept, or removed when the late pass was due.
   */
  async #once(clientId: string, uploadUuid: string): Promise<void> {
    const { sessions, queue, objects, ledger, objectPrefix } = this.#deps;
    const key = cleanUpKey(uploadUuid);
    const pending = await sessions.get<PendingCleanUp>(key);
    if (!pending || !this.#needsPass(pending.value)) return; // done, or swept by another process meanwhile
    const summary = await sessions.get<SessionRecord>(sessionKey(uploadUuid));
    if (summary && !summary.value.deleted) {
      await sessions.delete(key);
      return;
    }
    await queue.purge(uploadUuid);
    await objects.deletePrefix(sessionObjectPrefix(objectPrefix, clientId, uploadUuid));
    await ledger.drop(uploadUuid);
    await forgetSessionRecords(sessions, clientId, uploadUuid);
    await sessions.delete(storedCountKey(uploadUuid));
    await forgetListingEntries(sessions, clientId, uploadUuid, summary?.value.created_at);
    if (summary) await sessions.delete(sessionKey(uploadUuid), summary.revision);
    // A pass once the late one is due is the last (a put begun before the delete has landed by then).
    if (this.#latePassDue(pending.value)) await sessions.delete(key);
    else await sessions.update(key, { ...pending.value, swept: this.#now() }, pending.revision);
  }
}
