/** One open handle and how many calls are using it. */
interface Slot<T> {
  handle: Promise<T>;
  users: number;
  retired: boolean;
}

/**
 * Open file handles by key (a session's ledger file, a directory's pack), at most `max` kept
 * open, least recently used closed first; a handle in use is never closed. A retired handle
 * (its file deleted, or a call on it failed, so its tail is unknown) is no longer handed out:
 * the next use opens the file afresh, and it closes when its last user is done.
 */
export class OpenHandles<T> {
  readonly #slots = new Map<string, Slot<T>>();
  readonly #max: number;
  readonly #open: (key: string) => Promise<T>;
  readonly #close: (handle: T) => Promise<void>;

  constructor(opts: { max: number; open: (key: string) => Promise<T>; close: (handle: T) => Promise<void> }) {
    this.#max = opts.max;
    this.#open = opts.open;
    this.#close = opts.close;
  }

  /**
   * Runs `fn` with the key's handle, opening it if needed (with `open` when given, instead of
   * the one the handles were made with); a failure retires the handle.
   */
  async use<R>(key: string, fn: (handle: T) => Promise<R>, open = this.#open): Promise<R> {
    let slot = this.#slots.get(key);
    if (slot) this.#slots.delete(key); // most recently used last
    else slot = { handle: open(key), users: 0, retired: false };
    this.#slots.set(key, slot);
    slot.users++;
    this.#trim();
    try {
      return await fn(await slot.handle);
    } catch (err) {
      this.#retire(key, slot);
      throw err;
    } finally {
      slot.users--;
      if (slot.retired && slot.users === 0) this.#closeSlot(slot);
      this.#trim();
    }
  }

  /** The key's handle if one is open (and opened), without using it. */
  async peek(key: string): Promise<T | null> {
    const slot = this.#slots.get(key);
    return slot ? slot.handle.catch(() => null) : null;
  }

  /** Retires the handles whose key passes `which` (their files are going away). */
  retire(which: (key: string) => boolean): void {
    for (const [key, slot] of [...this.#slots]) if (which(key)) this.#retire(key, slot);
  }

  /** Closes every handle (calls in flight finish first: each handle's close waits for its writes). */
  async closeAll(): Promise<void> {
    const slots = [...this.#slots.values()];
    this.#slots.clear();
    await Promise.allSettled(slots.map(async (slot) => this.#close(await slot.handle)));
  }

  #retire(key: string, slot: Slot<T>): void {
    if (this.#slots.get(key) === slot) this.#slots.delete(key);
    if (slot.retired) return;
    slot.retired = true;
    if (slot.users === 0) this.#closeSlot(slot);
  }

  #trim(): void {
    for (const [key, slot] of this.#slots) {
      if (this.#slots.size <= this.#max) return;
      if (slot.users > 0) continue;
      this.#slots.delete(key);
      this.#closeSlot(slot);
    }
  }

  #closeSlot(slot: Slot<T>): void {
    void slot.handle.then(this.#close).catch(() => undefined);
  }
}
