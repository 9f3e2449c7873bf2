/**
 * Calls to a worker thread of the state database (state-writer.ts, state-reader.ts), each
 * answered within a deadline. The calls of one tick travel in one message, and the thread
 * answers them together (one result each, or one failure for all). A message the thread
 * has not answered within `timeoutMs` fails its callers (the disk under the thread does not
 * answer: a frozen or hung device blocks the thread, never the event loop); until the
 * thread answers anything again, new calls fail at once without being sent, so nothing
 * piles up behind the blocked one. A thread that exited fails what it held and is started
 * again at the next call.
 */
import { Worker } from 'node:worker_threads';
import { StoreError } from '../ports.js';

export interface WorkerChannelOptions<F> {
  url: URL;
  path: string;
  timeoutMs: number;
  /**
   * The error for the callers of a message the thread answered with `error`, or (`failure`
   * undefined) of one it held when it exited, or of one never sent because no thread would start
   * (`unsent`: nothing of it was carried out).
   */
  failed(failure: F | undefined, cause: string, unsent?: boolean): Error;
  /** The error for the callers of a message past its deadline (`sent`: it may still be carried out), or of one not sent while the thread is blocked. */
  blocked(sent: boolean): Error;
}

type Response<R, F> = { id: number; results: R[] } | { id: number; error: F };

interface Message<I, R> {
  items: I[];
  waiters: { resolve(result: R): void; reject(err: unknown): void }[];
  timer?: NodeJS.Timeout;
}

export class WorkerChannel<I, R, F> {
  readonly #opts: WorkerChannelOptions<F>;
  #worker: Promise<Worker> | null;
  /** Messages sent and not yet answered, by id. */
  readonly #inFlight = new Map<number, Message<I, R>>();
  /** Calls of this tick, sent together at its end. */
  #outbox: Message<I, R> | null = null;
  #nextId = 1;
  #closed = false;
  /** A message passed its deadline and the thread has answered nothing since. */
  #blocked = false;

  private constructor(opts: WorkerChannelOptions<F>, worker: Worker) {
    this.#opts = opts;
    this.#worker = Promise.resolve(this.#watch(worker));
  }

  /** Starts the thread; resolves once it is ready (its database open). */
  static async start<I, R, F>(opts: WorkerChannelOptions<F>): Promise<WorkerChannel<I, R, F>> {
    return new WorkerChannel<I, R, F>(opts, await startWorker(opts.url, opts.path));
  }

  call(item: I): Promise<R> {
    if (this.#closed) return Promise.reject(new StoreError('STORE_CLOSED', 'State database is closed'));
    if (this.#blocked) return Promise.reject(this.#opts.blocked(false));
    return new Promise((resolve, reject) => {
      if (!this.#outbox) {
        this.#outbox = { items: [], waiters: [] };
        queueMicrotask(() => this.#send());
      }
      this.#outbox.items.push(item);
      this.#outbox.waiters.push({ resolve, reject });
    });
  }

  /** Sends `close` and waits for the thread to exit, at most `timeoutMs` (a blocked thread is left to the process's exit); what it still held fails. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const worker = await this.#worker?.catch(() => null);
    if (worker) {
      let timer: NodeJS.Timeout | undefined;
      const exited = new Promise((resolve) => worker.once('exit', resolve));
      worker.postMessage('close');
      await Promise.race([exited, new Promise((resolve) => (timer = setTimeout(resolve, this.#opts.timeoutMs)))]);
      clearTimeout(timer);
      worker.unref();
    }
    for (const id of [...this.#inFlight.keys()]) this.#fail(id, new StoreError('STORE_CLOSED', 'State database is closed'));
  }

  #send(): void {
    const msg = this.#outbox!;
    this.#outbox = null;
    const id = this.#nextId++;
    this.#inFlight.set(id, msg);
    msg.timer = setTimeout(() => {
      this.#blocked = true;
      this.#fail(id, this.#opts.blocked(true));
    }, this.#opts.timeoutMs);
    this.#worker ??= startWorker(this.#opts.url, this.#opts.path).then((w) => this.#watch(w));
    this.#worker.then(
      (w) => w.postMessage({ id, items: msg.items }),
      (err: unknown) => {
        this.#worker = null; // the next call tries again
        this.#fail(id, this.#opts.failed(undefined, `cannot start: ${(err as Error).message}`, true));
      },
    );
  }

  #watch(worker: Worker): Worker {
    worker.on('message', (msg: Response<R, F>) => {
      this.#blocked = false;
      if ('error' in msg) return this.#fail(msg.id, this.#opts.failed(msg.error, ''));
      const req = this.#take(msg.id);
      req?.waiters.forEach((w, i) => w.resolve(msg.results[i]!));
    });
    worker.once('exit', () => {
      this.#blocked = false;
      if (this.#closed) return;
      // A thread that died (an addon crash, an out-of-memory) took its work with it; the next call starts another.
      this.#worker = null;
      for (const id of [...this.#inFlight.keys()]) this.#fail(id, this.#opts.failed(undefined, 'exited'));
    });
    return worker;
  }

  #take(id: number): Message<I, R> | undefined {
    const req = this.#inFlight.get(id);
    this.#inFlight.delete(id);
    clearTimeout(req?.timer);
    return req;
  }

  #fail(id: number, err: Error): void {
    for (const w of this.#take(id)?.waiters ?? []) w.reject(err);
  }
}

function startWorker(url: URL, path: string): Promise<Worker> {
  return new Promise((resolve, reject) => {
    // Without the parent's Node flags: the thread runs SQLite on the store's own modules, and a
    // test runner's import hooks made each start about ten times slower (a queue opened in 1 s, not 0.1).
    const worker = new Worker(url, { workerData: { path }, execArgv: [] });
    // An error thrown in the worker arrives as a copy, not always an Error: its message and code are kept.
    const failed = (err: unknown) =>
      reject(
        err instanceof Error
          ? err
          : typeof err === 'number'
            ? new Error(`exited with code ${err}`)
            : Object.assign(new Error(String((err as { message?: unknown } | null)?.message ?? err)), { code: (err as { code?: unknown } | null)?.code }),
      );
    worker.once('error', failed);
    worker.once('exit', failed);
    worker.once('message', (msg: unknown) => {
      if (msg !== 'ready') return;
      worker.off('error', failed);
      worker.off('exit', failed);
      worker.on('error', () => undefined); // an error after start ends in 'exit', handled by the owner
      resolve(worker);
    });
  });
}
