import { isStoreConflict, type SessionStore } from '../../store/ports.js';
import type { Attempt, DoneRecord, IdempotencyRecord, PendingRecord, StoredAnswer } from './records.js';

/** What a claim uses of the `IdempotentIngests` that made it. */
export interface ClaimOwner {
  readonly options: { readonly sessions: SessionStore; readonly leaseMs: number; readonly onBackgroundError?: (err: unknown, what: string) => void };
  now(): number;
}

/**
 * The claim of a running attempt: renews its lease in the background and ends it once.
 * Every write is a compare-and-set on the revision this attempt wrote last; a conflict means
 * another instance took the key over (this attempt's lease had lapsed), and the attempt then
 * writes nothing more: its package can no longer be recorded either (the takeover settled it).
 */
export class HeldClaim implements Attempt {
  readonly packageId: string;
  readonly #owner: ClaimOwner;
  readonly #id: string;
  #revision: number;
  #record: PendingRecord;
  /** Earlier attempts not yet settled by this one (see `release`). */
  #unsettled: string[];
  #lost = false;
  #ended = false;
  /** Writes run one after another. */
  #tail: Promise<void> = Promise.resolve();
  readonly #timer: NodeJS.Timeout;

  constructor(owner: ClaimOwner, id: string, revision: number, record: PendingRecord, unsettled: string[]) {
    this.packageId = record.attempts[0]!;
    this.#owner = owner;
    this.#id = id;
    this.#revision = revision;
    this.#record = record;
    this.#unsettled = unsettled;
    const every = Math.max(1, Math.floor(owner.options.leaseMs / 3));
    this.#timer = setInterval(() => void this.#write('renew the claim of an Idempotency-Key', () => this.#renew()), every);
    this.#timer.unref();
  }

  settled(): void {
    this.#unsettled = [];
  }

  async finish(answer: StoredAnswer, packageId: string = this.packageId): Promise<void> {
    if (this.#end()) return;
    const { state: _state, attempts: _attempts, lease_until: _lease, owner: _owner, created_at: _created, ...fingerprint } = this.#record;
    const done: DoneRecord = {
      ...fingerprint,
      state: 'done',
      status: answer.status,
      body: answer.body,
      package_id: answer.status === 200 ? packageId : null,
      at: this.#owner.now(),
    };
    await this.#write('store the answer of an Idempotency-Key', () => this.#cas(done));
  }

  async release(mayBeRecorded: boolean): Promise<void> {
    if (this.#end()) return;
    const attempts = [...(mayBeRecorded ? [this.packageId] : []), ...this.#unsettled];
    await this.#write('release an Idempotency-Key', async () => {
      if (attempts.length > 0) return this.#cas({ ...this.#record, attempts, lease_until: 0 });
      // Nothing of this key can be recorded any more: forget it.
      try {
        await this.#owner.options.sessions.delete(this.#id, this.#revision);
      } catch (err) {
        if (!isStoreConflict(err)) throw err;
        this.#lost = true;
      }
    });
  }

  #end(): boolean {
    if (this.#ended) return true;
    this.#ended = true;
    clearInterval(this.#timer);
    return false;
  }

  async #renew(): Promise<void> {
    if (this.#ended) return;
    await this.#cas({ ...this.#record, lease_until: this.#owner.now() + this.#owner.options.leaseMs });
  }

  async #cas(next: IdempotencyRecord): Promise<void> {
    try {
      this.#revision = await this.#owner.options.sessions.update(this.#id, next, this.#revision);
      if (next.state === 'pending') this.#record = next;
    } catch (err) {
      if (!isStoreConflict(err)) throw err;
      this.#lost = true;
    }
  }

  /**
   * Queues a write after the previous ones; failures are reported, never thrown: the claim
   * then simply lapses after `leaseMs`, and the next retry settles this attempt.
   */
  #write(what: string, fn: () => Promise<void>): Promise<void> {
    const run = this.#tail.then(async () => {
      if (this.#lost) return;
      try {
        await fn();
      } catch (err) {
        this.#owner.options.onBackgroundError?.(err, what);
      }
    });
    this.#tail = run;
    return run;
  }
}
