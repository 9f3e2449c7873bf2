/**
 * The process's memory budget for ingest bytes held whole: what a sink cannot stream on in
 * pieces and must keep until it can go on (a body whose layout is not streamed, an element
 * longer than a piece, the bytes after `data`, the parts of an element a wrong cut split).
 * Inflated bytes count, never wire bytes: a 500 KB gzip body that inflates to 263 MB holds
 * what it inflates to.
 *
 * Each sink reserves as it holds more and releases when it settles. A request may hold at
 * most `perRequest` bytes (413, as a plain body of that size would get at the edge); past
 * the process's `limit`, or past one client's share of it (`perClient`: a client whose
 * bodies stall once they hold much cannot hold the whole budget while others' bodies are
 * turned away), the request that asked is turned away (503 with `Retry-After`) rather than
 * waited for: waiting sinks that hold memory while others wait for it could hold each other
 * forever. The streaming part of every sink (pieces in flight, at most
 * `piecesPerRequest` of them) is bounded per sink and by the pool's admission instead.
 */

export class MemoryBudget {
  readonly limit: number;
  readonly perRequest: number;
  /** What one client's sinks may hold together: `clientShare` of the limit, at least one request's `perRequest`. */
  readonly perClient: number;
  #used = 0;
  #peak = 0;
  #refusals = 0;
  readonly #byClient = new Map<string, number>();

  constructor(limit: number, perRequest: number, clientShare = 1) {
    this.limit = limit;
    this.perRequest = perRequest;
    this.perClient = Math.max(perRequest, Math.floor(limit * Math.min(1, clientShare)));
  }

  /** Bytes `client`'s sinks hold right now. */
  usedBy(client: string): number {
    return this.#byClient.get(client) ?? 0;
  }

  /** Bytes reserved right now, all sinks together. */
  get used(): number {
    return this.#used;
  }

  /** The most ever reserved at once. */
  get peak(): number {
    return this.#peak;
  }

  /** Reservations refused because the process's budget was spent. */
  get refusals(): number {
    return this.#refusals;
  }

  /** A sink's account (of `client`'s share, if named): it holds `held` bytes and asks to hold another amount. */
  account(client?: string): MemoryAccount {
    return new MemoryAccount(this, (delta) => this.#move(delta, client));
  }

  #move(delta: number, client: string | undefined): boolean {
    const byClient = client === undefined ? 0 : this.usedBy(client);
    if (delta > 0 && (this.#used + delta > this.limit || byClient + delta > this.perClient)) {
      this.#refusals++;
      return false;
    }
    this.#used += delta;
    if (this.#used > this.#peak) this.#peak = this.#used;
    if (client === undefined) return true;
    if (byClient + delta > 0) this.#byClient.set(client, byClient + delta);
    else this.#byClient.delete(client);
    return true;
  }
}

export type HoldVerdict = 'ok' | 'too-large' | 'no-memory';

/** One sink's reservation: set to what it holds now; the difference is reserved or released. */
export class MemoryAccount {
  readonly #budget: MemoryBudget;
  readonly #move: (delta: number) => boolean;
  #held = 0;

  constructor(budget: MemoryBudget, move: (delta: number) => boolean) {
    this.#budget = budget;
    this.#move = move;
  }

  /** The most one request may hold (the 413's limit). */
  get perRequest(): number {
    return this.#budget.perRequest;
  }

  get held(): number {
    return this.#held;
  }

  /** Holds `bytes` in all from now on. Refused (nothing changes) past the request's or the process's bound. */
  hold(bytes: number): HoldVerdict {
    if (bytes > this.#budget.perRequest) return 'too-large';
    if (!this.#move(bytes - this.#held)) return 'no-memory';
    this.#held = bytes;
    return 'ok';
  }

  /** Gives everything back; the account may be used again. */
  release(): void {
    this.#move(-this.#held);
    this.#held = 0;
  }
}

/**
 * The memory one-shot tasks (`validation/body.ts`) may build at once: `JSON.parse` of a whole
 * body builds some 10 to 30 times its bytes (`parseCost`), which no byte count of held bodies
 * bounds. A one-shot enters with its cost before its task runs and leaves when the task is
 * done; it waits while the costs of the ones running and its own pass `limit`, in arrival
 * order. One whose cost alone passes it runs when no other does, so every body gets its
 * answer (waiting, not refusing: a parse always ends, and frees its share).
 */
export class ParseGate {
  readonly limit: number;
  #used = 0;
  #running = 0;
  #peak = 0;
  readonly #waiting: { cost: number; enter: () => void }[] = [];

  constructor(limit: number) {
    this.limit = limit;
  }

  /** The costs entered now, all one-shots together. */
  get used(): number {
    return this.#used;
  }

  /** The most ever entered at once. */
  get peak(): number {
    return this.#peak;
  }

  /** One-shots waiting for their turn. */
  get waiting(): number {
    return this.#waiting.length;
  }

  /** Resolves with the function that leaves (call it once the task settled); rejects with the signal's reason if aborted while waiting. */
  enter(cost: number, signal: AbortSignal): Promise<() => void> {
    if (signal.aborted) return Promise.reject(signal.reason as Error);
    return new Promise((resolve, reject) => {
      const waiter = {
        cost,
        enter: () => {
          signal.removeEventListener('abort', onAbort);
          this.#take(cost);
          let left = false;
          resolve(() => {
            if (left) return;
            left = true;
            this.#used -= cost;
            this.#running--;
            this.#admit();
          });
        },
      };
      const onAbort = () => {
        this.#waiting.splice(this.#waiting.indexOf(waiter), 1);
        reject(signal.reason);
        this.#admit();
      };
      signal.addEventListener('abort', onAbort, { once: true });
      this.#waiting.push(waiter);
      this.#admit();
    });
  }

  #take(cost: number): void {
    this.#used += cost;
    this.#running++;
    if (this.#used > this.#peak) this.#peak = this.#used;
  }

  #admit(): void {
    while (this.#waiting.length > 0) {
      const next = this.#waiting[0]!;
      if (this.#running > 0 && this.#used + next.cost > this.limit) return;
      this.#waiting.shift();
      next.enter();
    }
  }
}
