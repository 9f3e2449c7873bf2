/**
 * The service under test, in its own process: `startApp` on loopback, port 0, a fresh
 * DATA_DIR, the demo clients, the Connector emulator and the in-process uploader (the
 * embedded default), plus the probe. argv[2] is JSON `{ workers, dataDir }`: the driver
 * names a directory it removes itself, even if this process dies.
 *
 * Every bench client, the status poller included, comes from 127.0.0.1, so per-client-IP
 * admission limits (a request rate, requests in flight) would measure the limiter, not
 * ingest: they are turned off, but only where the running configuration has those keys
 * (an unknown key is a configuration error, and the service changes under the bench).
 * The `ready` message lists what was changed; the report records it.
 */
import { mkdir, rm } from 'node:fs/promises';
import { startApp } from '../src/app.js';
import { defaultConfig, loadConfig, type Config, type DeepPartial } from '../src/config/config.js';
import { jsonLogger, type Logger } from '../src/log.js';
import { send, serveProbe, startProbe } from './probe.js';

interface ServerArgs {
  workers: number;
  dataDir: string;
  /** false: rows by `JSON.parse` + typia only (the `ingest-reference` server of the bench). */
  rowScanner?: boolean;
}

const args = JSON.parse(process.argv[2] ?? '{}') as Partial<ServerArgs>;
if (!args.dataDir) throw new Error('bench server: argv[2] must name a dataDir');
const stderr = jsonLogger(process.stderr, { bench: 'service' });
// Info lines (the emulator's) would only interleave with the driver's output.
const logger: Logger = { info() {}, warn: stderr.warn, error: stderr.error };

/** Bench settings applied only when the defaults know the key. `BENCH_HTTP_ENGINE` picks the HTTP edge (`bench/edges.ts`). */
const WANTED: Record<string, Record<string, unknown>> = {
  limits: { requestsPerSecond: 0, concurrentPerClient: 0 },
  ...(process.env.BENCH_HTTP_ENGINE ? { http: { engine: process.env.BENCH_HTTP_ENGINE } } : {}),
};

function knownOverrides(): { patch: Record<string, Record<string, unknown>>; applied: Record<string, unknown> } {
  const defaults = defaultConfig() as unknown as Record<string, Record<string, unknown>>;
  const patch: Record<string, Record<string, unknown>> = {};
  const applied: Record<string, unknown> = {};
  for (const [section, values] of Object.entries(WANTED)) {
    for (const [key, value] of Object.entries(values)) {
      if (defaults[section] && Object.hasOwn(defaults[section], key)) {
        (patch[section] ??= {})[key] = value;
        applied[`${section}.${key}`] = value;
      }
    }
  }
  return { patch, applied };
}

const dataDir = args.dataDir;
await mkdir(dataDir, { recursive: true });
try {
  // An empty environment: a CONFIG_FILE or INGEST_WORKERS of the shell must not change what is measured.
  const { patch, applied } = knownOverrides();
  const config = loadConfig({}, {
    ...(patch as DeepPartial<Config>),
    host: '127.0.0.1',
    port: 0,
    dataDir,
    clientsFile: null,
    ingest: { workers: args.workers ?? 0, ...(args.rowScanner === false ? { rowScanner: false } : {}) },
    storage: { inProcessUploader: true },
    connector: { url: null },
  });
  let workerTids: () => number[] = () => [];
  const probe = startProbe(() => workerTids());
  const app = await startApp(config, { logger });
  workerTids = () => app.ingestLoad().threadTids;
  if (!app.usesDemoClients) throw new Error('the bench needs the demo clients');
  serveProbe(probe, async () => {
    await app.close();
    await rm(dataDir, { recursive: true, force: true });
  });
  send({ type: 'ready', url: app.url, overrides: applied });
} catch (err) {
  await rm(dataDir, { recursive: true, force: true });
  send({ type: 'failed', message: err instanceof Error ? err.stack ?? err.message : String(err) });
  process.exitCode = 1;
  if (process.connected) process.disconnect();
}
