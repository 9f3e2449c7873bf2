/**
 * A validation worker for the failure drills: the real one (`src/validation/worker.ts`), except
 * for tasks whose bytes hold a marker string (in a cell, so the marker rides inside a row):
 *
 * - `CRASH_MARKER`: the worker thread exits (code 3) in the middle of the package;
 * - `HOLD_MARKER`: the task announces itself on the BroadcastChannel `holdChannel()` with
 *   `running`, then waits until a `release` message on it (or 30 s), then runs normally.
 *   A latch for tests that need a package to be "in a worker" at a known moment.
 *
 * Only the bytes a task owns are searched (the pieces' ranges: buffers are reused), so a
 * marker of one request never trips another's task. Loaded by piscina through
 * `startApp(config, { validationWorker })` (a general option of the app).
 */
import { Buffer } from 'node:buffer';
import type { Task } from '../../src/validation/index.js';
import validate from '../../src/validation/worker.js';

export const CRASH_MARKER = '__drill_worker_crash__';
export const HOLD_MARKER = '__drill_worker_hold__';

/** One channel per test process (worker threads share the process id). */
export function holdChannel(): string {
  return `drill-hold-${process.pid}`;
}

export const FAULTY_WORKER = new URL('./faulty-worker.js', import.meta.url).href;

const crash = Buffer.from(CRASH_MARKER);
const hold = Buffer.from(HOLD_MARKER);

function views(task: Task): Buffer[] {
  switch (task.kind) {
    case 'rows':
      return task.parts.map((part, k) => Buffer.from(part, task.ranges[2 * k]!, task.ranges[2 * k + 1]! - task.ranges[2 * k]!));
    case 'body':
      return [Buffer.from(task.body)];
    case 'skeleton':
      return [Buffer.from(task.text)];
  }
}

function waitForRelease(): Promise<void> {
  const channel = new BroadcastChannel(holdChannel());
  return new Promise<void>((resolve) => {
    const done = () => {
      clearTimeout(timer);
      channel.close();
      resolve();
    };
    const timer = setTimeout(done, 30_000);
    channel.onmessage = (event) => {
      if ((event as MessageEvent).data === 'release') done();
    };
    const announce = new BroadcastChannel(holdChannel());
    announce.postMessage('running');
    announce.close();
  });
}

export default async function run(task: Task): Promise<unknown> {
  const bytes = views(task);
  if (bytes.some((b) => b.includes(crash))) process.exit(3);
  if (bytes.some((b) => b.includes(hold))) await waitForRelease();
  return validate(task);
}
