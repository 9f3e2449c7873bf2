/**
 * Per-client-IP admission at the edge (check 1 of docs/api.md, Check order: before authentication): a
 * token bucket over `/api/v1/` requests and a cap on the requests a client has in flight.
 *
 * Requests in flight stand in for "connections": this uWS build has no connection hook on
 * the HTTP App, and behind a trusted proxy the sockets belong to the proxy anyway. An HTTP/1.1
 * connection carries one request at a time, so a client holding more than N busy
 * connections holds more than N requests; idle keep-alive sockets cost nothing and uWS
 * closes them after its own idle timeout.
 *
 * Memory is bounded: a client whose bucket has refilled and who has nothing in flight is
 * indistinguishable from one never seen, so its entry is swept; when the table is still
 * full, the oldest entries are evicted (nginx `limit_req` does the same when its zone is
 * exhausted), which at worst gives the evicted clients a fresh burst.
 */

export interface ClientLimits {
  /** Average rate of rated requests per client; 0 disables the rate limit. */
  requestsPerSecond: number;
  /** Bucket size: rated requests a rested client may send at once. */
  burst: number;
  /** Requests one client may have in flight; 0 disables the cap. */
  concurrentPerClient: number;
  /** Most clients tracked at once. */
  trackedClients: number;
}

/** One client's state; the caller keeps it and hands it back to `release`. */
export interface ClientSlot {
  tokens: number;
  /** Clock reading of the last refill. */
  at: number;
  inFlight: number;
}

/** The slot of a request no limit counts (limits off, or left to the proxy); `release` leaves it as it is. */
export const UNLIMITED: ClientSlot = Object.freeze({ tokens: 0, at: 0, inFlight: 0 });
/** Sweep no more often than this, and not at every request of a flood once the table is full. */
const MIN_SWEEP_INTERVAL_MS = 1000;

export class ClientLimiter {
  readonly #limits: ClientLimits;
  readonly #clock: () => number;
  readonly #clients = new Map<string, ClientSlot>();
  /** Time an empty bucket takes to refill: how often idle entries are swept. */
  readonly #refillMs: number;
  #nextSweep: number;
  #lastFullSweep = -Infinity;

  constructor(limits: ClientLimits, clock: () => number = () => performance.now()) {
    if (limits.requestsPerSecond > 0 && !(limits.burst >= 1)) throw new RangeError('burst must be at least 1');
    if (!(limits.trackedClients >= 1)) throw new RangeError('trackedClients must be at least 1');
    this.#limits = { ...limits };
    this.#clock = clock;
    this.#refillMs = limits.requestsPerSecond > 0 ? (limits.burst / limits.requestsPerSecond) * 1000 : 0;
    this.#nextSweep = clock() + Math.max(MIN_SWEEP_INTERVAL_MS, this.#refillMs);
  }

  get enabled(): boolean {
    return this.#limits.requestsPerSecond > 0 || this.#limits.concurrentPerClient > 0;
  }

  /** Clients currently tracked (for tests and metrics). */
  get size(): number {
    return this.#clients.size;
  }

  /**
   * Admits one request of `address`: answers the slot to `release` when the request ends,
   * or the whole seconds (at least 1) the client should wait before retrying. `rated`
   * requests take a token; every request counts against the in-flight cap.
   */
  admit(address: string, rated: boolean): ClientSlot | number {
    const { requestsPerSecond: rate, burst, concurrentPerClient: maxInFlight } = this.#limits;
    if (rate <= 0 && maxInFlight <= 0) return UNLIMITED;
    const now = this.#clock();
    if (now >= this.#nextSweep) this.#sweep(now);
    let slot = this.#clients.get(address);
    if (!slot) {
      if (this.#clients.size >= this.#limits.trackedClients) this.#makeRoom(now);
      slot = { tokens: burst, at: now, inFlight: 0 };
      this.#clients.set(address, slot);
    }
    if (maxInFlight > 0 && slot.inFlight >= maxInFlight) return 1;
    if (rated && rate > 0) {
      const tokens = Math.min(burst, slot.tokens + ((now - slot.at) * rate) / 1000);
      slot.at = now;
      if (tokens < 1) {
        slot.tokens = tokens;
        return Math.max(1, Math.ceil((1 - tokens) / rate));
      }
      slot.tokens = tokens - 1;
    }
    slot.inFlight++;
    return slot;
  }

  /** The request admitted with `slot` ended (answered or aborted). Call once. */
  release(slot: ClientSlot): void {
    if (slot.inFlight > 0) slot.inFlight--;
  }

  #idle(slot: ClientSlot, now: number): boolean {
    const rate = this.#limits.requestsPerSecond;
    return slot.inFlight === 0 && (rate <= 0 || slot.tokens + ((now - slot.at) * rate) / 1000 >= this.#limits.burst);
  }

  #sweep(now: number): void {
    for (const [address, slot] of this.#clients) if (this.#idle(slot, now)) this.#clients.delete(address);
    this.#nextSweep = now + Math.max(MIN_SWEEP_INTERVAL_MS, this.#refillMs);
    this.#lastFullSweep = now;
  }

  /** The table is full: sweep (at most once a second), then evict the oldest entries. */
  #makeRoom(now: number): void {
    if (now - this.#lastFullSweep >= MIN_SWEEP_INTERVAL_MS) this.#sweep(now);
    // Map iterates in insertion order: the first entries are the longest tracked. Entries with
    // requests in flight go last (their requests still release through the slot they hold).
    let excess = this.#clients.size - this.#limits.trackedClients + 1;
    for (const pass of [false, true]) {
      for (const [address, slot] of this.#clients) {
        if (excess <= 0) return;
        if (pass || slot.inFlight === 0) {
          this.#clients.delete(address);
          excess--;
        }
      }
    }
  }
}
