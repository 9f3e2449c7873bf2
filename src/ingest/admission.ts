/**
 * Admission of ingest requests: at most `capacity` sinks are open at a time (the pool's
 * `workers + maxQueue`); past that a new one is refused with RATE_LIMITED (503,
 * `Retry-After: 1`), so the request is answered before its body is read. Counted here rather
 * than left to piscina's `maxQueue`, whose errors carry no code.
 */
import { errors } from '../errors.js';

export class Admission {
  readonly capacity: number;
  #open = 0;

  constructor(capacity: number) {
    this.capacity = capacity;
  }

  /** Sinks admitted and not yet released. */
  get open(): number {
    return this.#open;
  }

  /**
   * Admits one request, or throws RATE_LIMITED when `capacity` are open. Returns the
   * admission's release: the first call gives the place back, later calls do nothing.
   */
  admit(): () => void {
    if (this.#open >= this.capacity) throw errors.rateLimited(1);
    this.#open++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.#open--;
    };
  }
}
