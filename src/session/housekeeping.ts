/**
 * Work no request waits for, done by every gateway at start and then every
 * `storage.housekeepingMs`: expired idempotency records removed, and the clean-ups of deleted
 * sessions that no running process holds (a stopped instance's) taken up again. Every task is
 * safe to run on several instances at once (compare-and-set deletes, idempotent steps).
 */
export interface HousekeepingTask {
  what: string;
  run(): Promise<unknown>;
}

export interface Housekeeping {
  /** Resolves when the round under way (the first one, at start, included) is done. */
  idle(): Promise<void>;
  /** No more rounds; waits for the one under way. */
  close(): Promise<void>;
}

export function startHousekeeping(opts: { everyMs: number; tasks: readonly HousekeepingTask[]; onError: (err: unknown, what: string) => void }): Housekeeping {
  let round: Promise<void> | null = null;
  let closed = false;
  const run = () => {
    if (round || closed) return;
    round = (async () => {
      // Each task on its own: one that fails (its store is out) does not hold up the others.
      for (const task of opts.tasks) await task.run().catch((err: unknown) => opts.onError(err, task.what));
    })().finally(() => (round = null));
  };
  run();
  const timer = setInterval(run, opts.everyMs);
  timer.unref();
  return {
    idle: async () => {
      await round;
    },
    close: async () => {
      closed = true;
      clearInterval(timer);
      await round;
    },
  };
}
