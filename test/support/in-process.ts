/**
 * The drills' service: `startApp` in this process (port 0, a fresh DATA_DIR, the embedded
 * engines) with the app options the shared harness does not pass — a logger to capture,
 * a clock to move, a wrapped validation worker — plus what the drills measure: the pool's
 * load, the stored objects, the queue's files, and memory after a full GC.
 */
import { EventEmitter } from 'node:events';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { startApp, type App, type AppOptions } from '../../src/app.js';
import { loadConfig, type Config, type DeepPartial } from '../../src/config/config.js';
import { silentLogger, type Logger } from '../../src/log.js';
import { FileObjectStore } from '../../src/store/embedded/object-store.js';
import type { StoredObject } from '../../src/store/ports.js';
import { edgeConfig, tempDir, WEBHOOK_SECRET } from './harness.js';

interface Teardown {
  teardown(fn: () => unknown): void;
}

export interface InProcess {
  app: App;
  url: string;
  /**
   * Emits `change` after every write of the service that may change a status answer
   * (`AppOptions.onStateChange`; see `whenChanged`); undefined when an uploader in another
   * process stores the packages (`storage.inProcessUploader: false`): its writes are not seen.
   */
  changes: EventEmitter | undefined;
  dataDir: string;
  config: Config;
  /** Every object the service stored (all sessions). */
  objects(): Promise<StoredObject[]>;
  /** Package directories the embedded queue holds for a session: being written (`incoming`) and committed (`ready`). */
  queueFiles(uploadUuid: string): Promise<{ incoming: string[]; ready: string[] }>;
}

export async function startInProcess(t: Teardown, overrides: DeepPartial<Config> = {}, opts: AppOptions = {}): Promise<InProcess> {
  const dataDir = await tempDir(t);
  const config = loadConfig(
    {},
    merge(
      {
        port: 0,
        dataDir,
        ingest: { workers: 2 },
        connector: { emulatorDelayMs: 50, webhookSecret: WEBHOOK_SECRET },
        ...edgeConfig(),
      },
      overrides as Record<string, unknown>,
    ) as DeepPartial<Config>,
  );
  const changes = new EventEmitter();
  changes.setMaxListeners(0);
  const app = await startApp(config, {
    logger: silentLogger,
    ...opts,
    onStateChange: () => {
      opts.onStateChange?.();
      changes.emit('change');
    },
  });
  t.teardown(() => app.close());
  const objects = await FileObjectStore.open(join(dataDir, 'objects'));
  t.teardown(() => objects.close());
  const list = async (dir: string) => readdir(dir).catch((err: NodeJS.ErrnoException) => (err.code === 'ENOENT' ? [] : Promise.reject(err)));
  return {
    app,
    url: app.url,
    changes: config.storage.inProcessUploader ? changes : undefined,
    dataDir,
    config,
    objects: () => objects.list(''),
    queueFiles: async (uuid) => ({
      incoming: await list(join(dataDir, 'queue', 'incoming', uuid)),
      ready: await list(join(dataDir, 'queue', 'ready', uuid)),
    }),
  };
}

function merge(base: Record<string, unknown>, patch: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = { ...base };
  for (const [k, v] of Object.entries(patch)) {
    const cur = out[k];
    out[k] =
      v && typeof v === 'object' && !Array.isArray(v) && cur && typeof cur === 'object' && !Array.isArray(cur)
        ? merge(cur as Record<string, unknown>, v as Record<string, unknown>)
        : v;
  }
  return out;
}

/**
 * A logger that keeps the lines of the given levels (default warn and error: the access log
 * writes an info line per request, which a long drill must not hoard) as JSON, fields and
 * errors as they were passed; `counts` has every level's number of lines.
 */
export function capturingLogger(keep: readonly string[] = ['warn', 'error']): Logger & { lines: string[]; counts: Record<string, number> } {
  const lines: string[] = [];
  const counts: Record<string, number> = {};
  const write = (level: string) => (msg: string, fields?: Record<string, unknown>) => {
    counts[level] = (counts[level] ?? 0) + 1;
    if (!keep.includes(level)) return;
    lines.push(JSON.stringify({ level, msg, ...fields }, (_k, v: unknown) => (v instanceof Error ? { name: v.name, message: v.message, stack: v.stack, cause: v.cause } : v)));
  };
  return { lines, counts, debug: write('debug'), info: write('info'), warn: write('warn'), error: write('error') };
}

let gcFn: (() => void) | undefined;

/**
 * A full garbage collection, for memory measurements. tap runs test files as plain node
 * processes; `--expose-gc` set at run time makes `gc` available to new contexts.
 */
export function fullGc(): void {
  if (!gcFn) {
    setFlagsFromString('--expose-gc');
    gcFn = runInNewContext('gc') as () => void;
  }
  gcFn();
  gcFn();
}

/** Heap and RSS after a full GC (and a turn of the event loop for finalizers). */
export async function settledMemory(): Promise<{ heapUsed: number; rss: number; external: number; arrayBuffers: number }> {
  for (let i = 0; i < 3; i++) {
    fullGc();
    await new Promise((r) => setImmediate(r));
  }
  const { heapUsed, rss, external, arrayBuffers } = process.memoryUsage();
  return { heapUsed, rss, external, arrayBuffers };
}

/** Polls `probe` until it holds; bounded (the service settles asynchronously by contract). */
export async function eventually<T>(probe: () => Promise<T | false | null | undefined> | T | false | null | undefined, what: string, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export const MiB = 1024 * 1024;
export { silentLogger };
