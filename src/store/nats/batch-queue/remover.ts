/**
 * Removes acknowledged commit messages from a limits-retention queue stream in bulk.
 *
 * Why: under `sync_interval: always` every removal is a synced write of the stream. A
 * work-queue stream removes each message when it is acked, one synced write per package;
 * here one filtered purge (`<stream>.c.>` up to the consumer's ack floor) removes every
 * commit acknowledged meanwhile in one synced write, a few times a second (nats-server
 * 2.15: 300 acks of a work queue, 306 fsyncs; the same acks and six purges, 6 plus the
 * consumer's own state writes, which the server batches to ten a second either way).
 *
 * What it does not decide: whether a package is delivered again. The consumer's ack state
 * does (a message at or below the floor, or acked above it, is never handed out again,
 * whatever the stream still holds), and `pending`/`hasPending` judge by that floor and by
 * `has()` here. A removal that never happens (a crash, an outage) leaves only bytes, which
 * the next round of any process, or the sweep, takes away.
 *
 * A commit acked above the floor (another package before it still in a handler, or waiting
 * out a redelivery delay) is not covered by the purge; one still there a round later is
 * deleted on its own, so a session's pending messages are never held back by another's. The
 * last round, as the process stops (`finish`), deletes every one left at once: no later round
 * of this process will, and no other process knows they were acked.
 */
import type { StreamMessages } from './messages.js';

export interface RemoverOptions {
  messages: StreamMessages;
  /** Every commit subject (`<stream>.c.>`). */
  commits: string;
  /** The consumer's ack floor (stream sequence), read afresh. */
  readFloor(): Promise<number>;
  /** How long an acknowledged commit waits for the round that removes it. */
  intervalMs: number;
  onError(err: unknown, what: string): void;
  /** Told after a round removed commits: another process's `hasPending` may answer otherwise now. */
  onRemoved?(): void;
}

/** After a failed round, the next one waits at least this long. */
const RETRY_MS = 1000;

export class AckedRemover {
  readonly #o: RemoverOptions;
  /** Commits this process acked that are still in the stream; true once a round saw them above the floor. */
  readonly #acked = new Map<number, boolean>();
  /** The floor the last successful purge removed up to (a purge at or below it removes nothing). */
  #purgedTo = 0;
  #timer: NodeJS.Timeout | undefined;
  #round: Promise<void> | null = null;
  #failing = false;
  #closed = false;

  constructor(opts: RemoverOptions) {
    this.#o = opts;
  }

  /** A commit this process acked (and the server confirmed): removed by a coming round. */
  acked(seq: number): void {
    if (this.#closed) return;
    this.#acked.set(seq, false);
    this.#schedule(this.#o.intervalMs);
  }

  /** Whether `seq` is a commit this process acked that may still be in the stream. */
  has(seq: number): boolean {
    return this.#acked.has(seq);
  }

  /** Runs a round now (after the one in flight), unless nothing this process acked is left. Never throws. */
  async flush(): Promise<void> {
    await this.#round;
    if (this.#acked.size === 0) return;
    clearTimeout(this.#timer);
    this.#timer = undefined;
    await this.#run();
  }

  /**
   * The last round, as the consumer stops: as `flush`, but the commits still above the floor
   * go now, not a round later (no later round of this process comes). Never throws.
   */
  async finish(): Promise<void> {
    await this.#round;
    for (const seq of this.#acked.keys()) this.#acked.set(seq, true);
    await this.flush();
  }

  close(): void {
    this.#closed = true;
    clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  #schedule(ms: number): void {
    if (this.#timer || this.#round || this.#closed) return;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      void this.#run();
    }, ms);
    // A process that stops flushes; leftovers of a crash go once the floor passes them (the next purge of any process, or the sweep).
    this.#timer.unref();
  }

  #run(): Promise<void> {
    const round = (this.#round ??= this.#removeAcked().finally(() => {
      this.#round = null;
      if (this.#acked.size > 0) this.#schedule(this.#failing ? Math.max(RETRY_MS, this.#o.intervalMs) : this.#o.intervalMs);
    }));
    return round;
  }

  async #removeAcked(): Promise<void> {
    const { messages, commits } = this.#o;
    try {
      const floor = await this.#o.readFloor();
      let removed = false;
      if (floor > this.#purgedTo) {
        await messages.deleteMatching(commits, floor);
        this.#purgedTo = floor;
        removed = true;
      }
      const stale: number[] = [];
      for (const [seq, seen] of this.#acked) {
        if (seq <= floor) this.#acked.delete(seq);
        else if (seen) stale.push(seq);
        else this.#acked.set(seq, true);
      }
      if (stale.length > 0) {
        await messages.deleteSeqs(stale);
        for (const seq of stale) this.#acked.delete(seq);
        removed = true;
      }
      this.#failing = false;
      if (removed) this.#o.onRemoved?.();
    } catch (err) {
      // One report per run of failures: an outage fails every round until it ends.
      if (!this.#failing) this.#o.onError(err, 'remove acknowledged packages from the stream (the next round tries again)');
      this.#failing = true;
    }
  }
}
