/**
 * Admission of ingest requests: at most `capacity` sinks are open at a time (the pool's
 * `workers + maxQueue`), and at most `perClient` of them for one client (its share: a client
 * whose bodies trickle in, from however many addresses, cannot hold every place while other
 * clients wait); past either a new one is refused with RATE_LIMITED (503, `Retry-After: 1`),
 * so the request is answered before its body is read. Counted here rather than left to
 * piscina's `maxQueue`, whose errors carry no code.
 */
import { errors } from '../errors.js';

export class Admission {
  readonly capacity: number;
  /** Places one client may hold: `clientShare` of the capacity, at least one. */
  readonly perClient: number;
  #open = 0;
  readonly #byClient = new Map<string, number>();

  constructor(capacity: number, clientShare = 1) {
    this.capacity = capacity;
    this.perClient = Math.max(1, Math.floor(capacity * Math.min(1, clientShare)));
  }

  /** Sinks admitted and not yet released. */
  get open(): number {
    return this.#open;
  }

  /** Sinks of `client` admitted and not yet released. */
  openOf(client: string): number {
    return this.#byClient.get(client) ?? 0;
  }

  /**
   * Admits one request of `client` (none: counted for the pool only), or throws RATE_LIMITED
   * when `capacity` are open, or `perClient` of that client. Returns the admission's release:
   * the first call gives the place back, later calls do nothing.
   */
  admit(client?: string): () => void {
    if (this.#open >= this.capacity) throw errors.rateLimited(1);
    const held = client === undefined ? 0 : this.openOf(client);
    if (held >= this.perClient) throw errors.rateLimited(1);
    this.#open++;
    if (client !== undefined) this.#byClient.set(client, held + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.#open--;
      if (client === undefined) return;
      const left = this.openOf(client) - 1;
      if (left > 0) this.#byClient.set(client, left);
      else this.#byClient.delete(client);
    };
  }
}
