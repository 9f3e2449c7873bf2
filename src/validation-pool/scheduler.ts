/**
 * The pool's task slots: at most `slots` tasks are handed to piscina at once, all requests
 * together; the others wait here, before any of their bytes is transferred, in a
 * `TaskQueue` (the shape of piscina's own `TaskQueue`, plus `unshift` for the tasks that
 * go before waiting pieces: a piece run again after a carry, a skeleton, a one-shot body).
 */

/** A queue of waiting items, as piscina's `TaskQueue` (push, shift, remove, size), with `unshift` for priority. */
export interface TaskQueue<T> {
  readonly size: number;
  /** Puts `item` last. */
  push(item: T): void;
  /** Puts `item` first (it goes before every item waiting now). */
  unshift(item: T): void;
  /** Takes the first item; undefined when empty. */
  shift(): T | undefined;
  /** Takes `item` out wherever it waits; false when it is not in the queue. */
  remove(item: T): boolean;
}

/** First in, first out (an item put first with `unshift` comes out next). */
export class FifoQueue<T> implements TaskQueue<T> {
  readonly #items: T[] = [];

  get size(): number {
    return this.#items.length;
  }

  push(item: T): void {
    this.#items.push(item);
  }

  unshift(item: T): void {
    this.#items.unshift(item);
  }

  shift(): T | undefined {
    return this.#items.shift();
  }

  remove(item: T): boolean {
    const at = this.#items.indexOf(item);
    if (at < 0) return false;
    this.#items.splice(at, 1);
    return true;
  }
}

/** One task waiting for a slot. */
export interface Waiter {
  /** The slot is the waiter's (already counted as running). */
  grant(): void;
}

export class Scheduler {
  readonly slots: number;
  readonly #queue: TaskQueue<Waiter>;
  #running = 0;

  constructor(slots: number, queue: TaskQueue<Waiter> = new FifoQueue()) {
    this.slots = slots;
    this.#queue = queue;
  }

  /** Slots taken: tasks handed on and not yet released. */
  get running(): number {
    return this.#running;
  }

  /** Tasks waiting for a slot. */
  get waiting(): number {
    return this.#queue.size;
  }

  /** Takes a slot at once if one is free; false (nothing changes) when all are taken. */
  tryAcquire(): boolean {
    if (this.#running >= this.slots) return false;
    this.#running++;
    return true;
  }

  /**
   * Waits for a slot, counted when granted; `priority` goes before every task waiting now.
   * Rejects with the signal's reason (and leaves the queue) if it aborts first.
   */
  acquire(signal: AbortSignal, priority: boolean): Promise<void> {
    return new Promise((resolve, reject) => {
      signal.throwIfAborted();
      const waiter: Waiter = {
        grant: () => {
          signal.removeEventListener('abort', onAbort);
          resolve();
        },
      };
      const onAbort = () => {
        this.#queue.remove(waiter);
        reject(signal.reason);
      };
      signal.addEventListener('abort', onAbort, { once: true });
      if (priority) this.#queue.unshift(waiter);
      else this.#queue.push(waiter);
    });
  }

  /** Gives a slot back; waiting tasks get the free slots, in queue order. */
  release(): void {
    this.#running--;
    while (this.#running < this.slots && this.#queue.size > 0) {
      this.#running++;
      this.#queue.shift()!.grant();
    }
  }
}
