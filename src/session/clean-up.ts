/**
 * What a delete removes after its answer, as durable work: the session's queued batches, stored
 * objects, ledger, idempotency records and, last, its summary. Delete marks the summary deleted,
 * then records `cleanup.<upload_uuid>` in the session store, both before it answers; the
 * clean-up then runs in the background, each step idempotent, retried with backoff until every
 * step succeeded (a full disk, EMFILE, an object store that refuses), and only then is the
 * record removed. A record left by a stopped process is taken up again by `resume` (at start and
 * at every housekeeping round, on any instance), so no deleted session's data stays for good.
 *
 * ```
 * delete: summary.deleted = true ──> cleanup.<uuid> created ──> 200
 *                                         │ (background, retried until done; resumed after a restart)
 *                                         v
 *         queue purge → objects → ledger → idempotency records → stored count, listing entry
 *         → summary ──> cleanup.<uuid> removed
 * ```
 * A record whose summary is there and not deleted names a delete that never happened (the
 * record is written only after the mark): it is removed and nothing else is touched.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { cleanUpKey, clientSessionKey, sessionKey, sessionObjectPrefix, storedCountKey } from '../store/keys.js';
import { isStoreConflict, isStoreError, type BatchQueue, type ObjectStore, type PackageLedger, type SessionStore } from '../store/ports.js';
import { forgetSessionRecords } from './idempotency.js';
import type { SessionRecord } from './state.js';

/** Rounds run again at once after a lost compare-and-set, before one counts as failed. */
const CONFLICT_RETRIES = 5;

/** The stored record of a clean-up to do (`cleanup.<upload_uuid>`). */
export interface PendingCleanUp {
  client_id: string;
  upload_uuid: string;
  /** When the delete recorded it (epoch ms). */
  since: number;
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
  /** A failed round (it is retried) and what it was doing. */
  onError?: (err: unknown, what: string) => void;
}

const PREFIX = 'cleanup.';

export class SessionCleanUps {
  readonly #deps: CleanUpDeps;
  readonly #now: () => number;
  /** Clean-ups running in this process, by upload uuid. */
  readonly #running = new Map<string, Promise<void>>();
  readonly #stop = new AbortController();

  constructor(deps: CleanUpDeps) {
    this.#deps = deps;
    this.#now = deps.clock ?? Date.now;
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

  /** Runs a recorded clean-up in the background until it is done, unless it already runs here. */
  run(clientId: string, uploadUuid: string): Promise<void> {
    const running = this.#running.get(uploadUuid);
    if (running) return running;
    const run = this.#untilDone(clientId, uploadUuid).finally(() => this.#running.delete(uploadUuid));
    this.#running.set(uploadUuid, run);
    return run;
  }

  /**
   * Starts every recorded clean-up that does not run in this process (those of a process that
   * stopped, or failed here before). Returns how many it started; rejects when the records
   * cannot be listed.
   */
  async resume(): Promise<number> {
    let started = 0;
    for await (const { value } of this.#deps.sessions.list<PendingCleanUp>(PREFIX)) {
      if (this.#stop.signal.aborted) break;
      if (this.#running.has(value.upload_uuid)) continue;
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

  /** One round: every step, each of which changes nothing when already done. */
  async #once(clientId: string, uploadUuid: string): Promise<void> {
    const { sessions, queue, objects, ledger, objectPrefix } = this.#deps;
    const summary = await sessions.get<SessionRecord>(sessionKey(uploadUuid));
    if (!summary || summary.value.deleted) {
      await queue.purge(uploadUuid);
      await objects.deletePrefix(sessionObjectPrefix(objectPrefix, clientId, uploadUuid));
      await ledger.drop(uploadUuid);
      await forgetSessionRecords(sessions, clientId, uploadUuid);
      await sessions.delete(storedCountKey(uploadUuid));
      await sessions.delete(clientSessionKey(clientId, uploadUuid));
      if (summary) await sessions.delete(sessionKey(uploadUuid), summary.revision);
    }
    await sessions.delete(cleanUpKey(uploadUuid));
  }
}
