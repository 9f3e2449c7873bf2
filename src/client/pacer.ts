/**
 * Client-side pacing of request starts: the generic cell rate algorithm (a token bucket
 * kept as one "theoretical arrival time"), so that one client stays under the service's
 * per-IP rate limit instead of learning it from 503s. Each `acquire` reserves its slot
 * synchronously, so concurrent callers are served in call order.
 */
import { setTimeout as sleep } from 'node:timers/promises';

export class Pacer {
  readonly #intervalMs: number;
  readonly #toleranceMs: number;
  #tat = 0;

  /** `perSecond` 0 (or less) never waits. `burst`: starts allowed at once after a rest (default: one second's worth). */
  constructor(
    readonly perSecond: number,
    burst = Math.max(1, Math.floor(perSecond)),
    private readonly now: () => number = () => performance.now(),
  ) {
    this.#intervalMs = perSecond > 0 ? 1000 / perSecond : 0;
    this.#toleranceMs = Math.max(0, burst - 1) * this.#intervalMs;
  }

  /** Milliseconds the caller must wait before starting; reserves the slot. */
  reserve(): number {
    if (this.#intervalMs === 0) return 0;
    const now = this.now();
    const tat = Math.max(this.#tat, now);
    this.#tat = tat + this.#intervalMs;
    return Math.max(0, tat - this.#toleranceMs - now);
  }

  async acquire(signal?: AbortSignal): Promise<void> {
    const wait = this.reserve();
    if (wait > 0) await sleep(wait, undefined, { signal });
  }
}
