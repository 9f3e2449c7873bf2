/**
 * SIGTERM/SIGINT for a process of the service (the gateway, the uploader): the first signal
 * runs `stop` and exits 0 when it is done, 1 when it failed; a second signal exits 1 at once.
 * `stop` waits for work in flight up to `graceMs` of its own; whatever it still waits for
 * `STOP_AFTER_GRACE_MS` after that (a store that does not answer: a frozen disk or server,
 * S3 hung) is left: the process ends itself with SIGKILL (status 137), since Node's own exit
 * joins its threads, and one blocked in a call the disk does not answer never returns (libuv's
 * pool, the state database's threads). Leaving is safe: every answered package is durable
 * before its answer, and what was not answered is not recorded.
 */
import type { Logger } from './log.js';

/** How long closing may take past the grace before the process exits without it. */
export const STOP_AFTER_GRACE_MS = 5_000;

export function onStopSignals(log: Logger, opts: { what: string; graceMs: number; stop: () => Promise<unknown> }): void {
  let stopping = false;
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.on(signal, () => {
      if (stopping) {
        log.warn('second signal: exiting without waiting for the work in flight', { signal });
        process.exit(1);
      }
      stopping = true;
      log.info(`${opts.what} stopping`, { signal, grace_ms: opts.graceMs });
      const limitMs = opts.graceMs + STOP_AFTER_GRACE_MS;
      setTimeout(() => {
        // Written before the kill: an asynchronous line would mostly be lost with the process.
        (log.errorNow ?? log.error)(`${opts.what} did not stop in time: ending itself with SIGKILL, without the rest of its closing`, { limit_ms: limitMs });
        process.kill(process.pid, 'SIGKILL');
      }, limitMs).unref();
      opts.stop().then(
        () => {
          log.info(`${opts.what} stopped`);
          process.exit(0);
        },
        (err: unknown) => {
          log.error(`${opts.what} shutdown failed`, { err });
          process.exit(1);
        },
      );
    });
  }
}
