/**
 * Every child process of a bench run goes through `ChildSet`: forked with an IPC channel,
 * remembered until it exits, and ended at the close of the run, on error and on SIGINT
 * (SIGTERM first, SIGKILL after a grace period; SIGKILL when the driver itself exits).
 * `Mailbox` turns a child's messages into awaitable, time-bounded expectations.
 */
import { fork, type ChildProcess } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';

export class ChildSet {
  readonly #live = new Set<ChildProcess>();

  constructor() {
    // Last resort: nothing forked here outlives the driver, however it ends.
    process.on('exit', () => {
      for (const child of this.#live) child.kill('SIGKILL');
    });
  }

  fork(module: URL, args: string[] = [], execArgv: string[] = []): ChildProcess {
    const child = fork(module, args, {
      execArgv,
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      serialization: 'advanced',
    });
    this.#live.add(child);
    child.once('exit', () => this.#live.delete(child));
    return child;
  }

  /** Ends one child: SIGTERM, then SIGKILL after `graceMs`. */
  async end(child: ChildProcess, graceMs = 5_000): Promise<void> {
    if (!this.#live.has(child)) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.kill('SIGTERM');
    const ac = new AbortController();
    const outcome = await Promise.race([exited.then(() => 'exited' as const), sleep(graceMs, 'late' as const, { signal: ac.signal }).catch(() => 'late' as const)]);
    ac.abort();
    if (outcome === 'late') {
      child.kill('SIGKILL');
      await Promise.race([exited, sleep(2_000)]);
    }
  }

  async endAll(graceMs = 5_000): Promise<void> {
    await Promise.all([...this.#live].map((child) => this.end(child, graceMs)));
  }

  get size(): number {
    return this.#live.size;
  }
}

interface Waiter {
  type: string;
  match: (msg: { type: string }) => boolean;
  resolve: (msg: { type: string }) => void;
  reject: (err: Error) => void;
  timer: NodeJS.Timeout;
}

/**
 * Messages of one child, matched by `type`. A `{type: 'failed', message}` from the child,
 * its exit, or the deadline rejects whatever is awaited.
 */
export class Mailbox<E extends { type: string }> {
  readonly #queue: E[] = [];
  readonly #waiters: Waiter[] = [];
  #gone: Error | null = null;

  constructor(
    readonly child: ChildProcess,
    readonly name: string,
  ) {
    child.on('message', (msg: E) => {
      if (msg.type === 'failed') {
        this.#fail(new Error(`${name} failed: ${(msg as unknown as { message: string }).message}`));
        return;
      }
      const i = this.#waiters.findIndex((w) => w.type === msg.type && w.match(msg));
      if (i < 0) {
        this.#queue.push(msg);
        return;
      }
      const [waiter] = this.#waiters.splice(i, 1);
      clearTimeout(waiter!.timer);
      waiter!.resolve(msg);
    });
    // 'close', not 'exit': by then every message the child sent has been delivered.
    child.once('close', (code, signal) => this.#fail(new Error(`${name} exited (${signal ?? `code ${code}`})`)));
    child.once('error', (err) => this.#fail(new Error(`${name}: ${err.message}`)));
  }

  /** The next message of `type` (for which `match` holds), already queued or yet to come. */
  expect<T extends E['type']>(
    type: T,
    timeoutMs: number,
    match: (msg: Extract<E, { type: T }>) => boolean = () => true,
  ): Promise<Extract<E, { type: T }>> {
    const test = match as (msg: { type: string }) => boolean;
    const i = this.#queue.findIndex((m) => m.type === type && test(m));
    if (i >= 0) return Promise.resolve(this.#queue.splice(i, 1)[0] as Extract<E, { type: T }>);
    if (this.#gone) return Promise.reject(this.#gone);
    return new Promise((resolve, reject) => {
      const waiter: Waiter = {
        type,
        match: test,
        resolve: resolve as (msg: { type: string }) => void,
        reject,
        // setTimeout fires at once for delays past 2^31 - 1 ms.
        timer: setTimeout(() => {
          this.#waiters.splice(this.#waiters.indexOf(waiter), 1);
          reject(new Error(`${this.name}: no '${type}' within ${timeoutMs} ms`));
        }, Math.min(timeoutMs, 2 ** 31 - 1)),
      };
      this.#waiters.push(waiter);
    });
  }

  send(msg: unknown): void {
    if (this.#gone) throw this.#gone;
    this.child.send(msg as object);
  }

  #fail(err: Error): void {
    this.#gone ??= err;
    for (const w of this.#waiters.splice(0)) {
      clearTimeout(w.timer);
      w.reject(err);
    }
  }
}
