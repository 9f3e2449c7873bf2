/**
 * Starts the real service on loopback (port 0, a fresh DATA_DIR) and talks to it over real
 * HTTP. Teardown is registered on the test as soon as each resource exists.
 */
import { EventEmitter, once } from 'node:events';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout } from 'node:timers/promises';
import { join } from 'node:path';
import { request } from 'undici';
import { startApp, type App, type AppOptions } from '../../src/app.js';
import { DEMO_CLIENTS_PATH, loadConfig, type Config, type DeepPartial } from '../../src/config/config.js';
import { signWebhook } from '../../src/connector/webhook.js';
import { loadEdge } from '../../src/http/engine.js';
import type { EdgeAdapter } from '../../src/http/types.js';
import { silentLogger } from '../../src/log.js';
import { FileObjectStore } from '../../src/store/embedded/object-store.js';
import type { ObjectStore } from '../../src/store/ports.js';
import { S3ObjectStore } from '../../src/store/s3/object-store.js';
import { edgeConfig, HTTP_ENGINE, tempDir, WEBHOOK_SECRET, type Teardown } from '../../testbed/env.js';
import { startNats } from '../../testbed/nats.js';
import { startS3 } from '../../testbed/s3.js';

export { edgeConfig, HTTP_ENGINE, tempDir, WEBHOOK_SECRET };

export const API = '/api/v1/uploading';
export const DEMO = { id: 'demo', token: 'demo-token' } as const;
export const DEMO2 = { id: 'demo-2', token: 'demo-2-token' } as const;

export interface Service {
  app: App;
  url: string;
  dataDir: string;
  config: Config;
  /**
   * Emits `change` after every write of the service that may change a status answer
   * (`AppOptions.onStateChange`), and `response` with the fields of each access-log line (a
   * request answered or aborted, after its per-client slot was released).
   */
  events: EventEmitter;
  /**
   * `events` while every write that changes a status answer is this process's, for
   * `whenChanged`; undefined while an uploader in another process stores the packages
   * (`storage.inProcessUploader: false`): its writes are seen only by asking again.
   */
  readonly changes: EventEmitter | undefined;
  /** The options the service starts with: a test that starts it itself (`startApp`) passes them, so that `changes` goes on. */
  appOptions: AppOptions;
  /** A reader of the objects the service stored (its own handle; closed by the caller). */
  openObjects(): Promise<ObjectStore>;
  /** Stops and starts the service on the same data (and a new port), optionally with changed config. */
  restart(patch?: DeepPartial<Config>): Promise<void>;
  stop(): Promise<void>;
}

/**
 * `TEST_BACKEND=nats-s3` runs the same suites on the distributed engines: each service gets
 * its own fresh nats-server and S3-protocol server (the demo clients via CLIENTS_FILE).
 */
export const BACKEND = process.env.TEST_BACKEND === 'nats-s3' ? 'nats-s3' : 'embedded';

/** The edge adapter the tests' own servers (`listen` directly) run on. */
export async function testEdge(): Promise<EdgeAdapter> {
  return (await loadEdge(HTTP_ENGINE ?? 'auto')).adapter;
}

export async function backendConfig(t: Teardown): Promise<DeepPartial<Config>> {
  if (BACKEND === 'embedded') return {};
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  return {
    clientsFile: DEMO_CLIENTS_PATH,
    nats: { url: nats.url },
    s3: { endpoint: s3.endpoint, bucket: s3.bucket, region: s3.region, accessKeyId: s3.accessKeyId, secretAccessKey: s3.secretAccessKey, createBucket: true },
  };
}

export async function startService(
  t: Teardown,
  overrides: DeepPartial<Config> = {},
  env: NodeJS.ProcessEnv = {},
  appOptions: Pick<AppOptions, 'clock'> = {},
): Promise<Service> {
  const dataDir = await tempDir(t);
  const defaults: DeepPartial<Config> = deepMerge<DeepPartial<Config>>(
    {
      port: 0,
      dataDir,
      ingest: { workers: 2 },
      connector: { emulatorDelayMs: 50, webhookSecret: WEBHOOK_SECRET },
      ...edgeConfig(),
    },
    await backendConfig(t),
  );
  const config = loadConfig(env, deepMerge(defaults, overrides));
  const events = new EventEmitter();
  events.setMaxListeners(0);
  const accessLog = (msg: string, fields?: Record<string, unknown>) => {
    if (msg === 'request') events.emit('response', fields);
  };
  const logger = { ...silentLogger, info: accessLog, debug: accessLog };
  const options: AppOptions = { logger, ...appOptions, onStateChange: () => events.emit('change') };
  let running = config;
  const svc: Service = {
    app: await startApp(config, options),
    url: '',
    dataDir,
    config,
    events,
    get changes() {
      return running.storage.inProcessUploader ? events : undefined;
    },
    appOptions: options,
    async restart(patch: DeepPartial<Config> = {}) {
      await svc.app.close();
      // A new port: this uWS build cannot re-bind a port with connections in TIME_WAIT.
      running = deepMerge({ ...config, port: 0 }, patch);
      svc.app = await startApp(running, options);
      svc.url = svc.app.url;
    },
    async stop() {
      await svc.app.close();
    },
    async openObjects() {
      const { s3 } = config;
      if (s3.endpoint && s3.bucket) {
        return S3ObjectStore.open({ endpoint: s3.endpoint, bucket: s3.bucket, region: s3.region, accessKeyId: s3.accessKeyId, secretAccessKey: s3.secretAccessKey });
      }
      return FileObjectStore.open(join(dataDir, 'objects'));
    },
  };
  svc.url = svc.app.url;
  let stopped = false;
  t.teardown(async () => {
    if (!stopped) await svc.app.close();
    stopped = true;
  });
  return svc;
}

function deepMerge<T>(base: T, patch: DeepPartial<T>): T {
  const out: Record<string, unknown> = { ...(base as Record<string, unknown>) };
  for (const [k, v] of Object.entries(patch as Record<string, unknown>)) {
    const cur = out[k];
    out[k] =
      v && typeof v === 'object' && !Array.isArray(v) && cur && typeof cur === 'object'
        ? deepMerge(cur, v as DeepPartial<typeof cur>)
        : v;
  }
  return out as T;
}

export interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: any;
  text: string;
}

export async function call(
  base: string,
  method: string,
  path: string,
  opts: { client?: { id: string; token: string } | null; headers?: Record<string, string>; body?: unknown; raw?: string | Buffer } = {},
): Promise<Answer> {
  const headers: Record<string, string> = {};
  const client = opts.client === undefined ? DEMO : opts.client;
  if (client) {
    headers.authorization = client.token;
    headers['client-id'] = client.id;
  }
  let body: string | Buffer | undefined = opts.raw;
  if (opts.body !== undefined) {
    body = JSON.stringify(opts.body);
    headers['content-type'] = 'application/json';
  }
  Object.assign(headers, opts.headers);
  const res = await request(base + path, { method: method as 'GET', headers, body });
  const text = await res.body.text();
  let parsed: unknown = undefined;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {
    parsed = undefined;
  }
  return { status: res.statusCode, headers: res.headers, body: parsed, text };
}

/** A session client bound to one service and one client. */
export function clientOf(svc: { url: string }, client = DEMO as { id: string; token: string }) {
  return {
    init: () => call(svc.url, 'POST', `${API}/initialize-session`, { client }),
    status: (uuid: string) => call(svc.url, 'GET', `${API}/${uuid}/status`, { client }),
    ingest: (uuid: string, entity: string, body: unknown) => call(svc.url, 'POST', `${API}/${uuid}/${entity}`, { client, body }),
    start: (uuid: string, body: unknown) => call(svc.url, 'POST', `${API}/${uuid}/start-upload`, { client, body }),
    terminate: (uuid: string) => call(svc.url, 'POST', `${API}/${uuid}/terminate`, { client }),
    remove: (uuid: string) => call(svc.url, 'POST', `${API}/${uuid}/delete`, { client }),
  };
}

/**
 * Runs `probe` until it answers something truthy, and answers that. It is probed again only
 * after a write that may change the answer (`changes` emits `change`): a service of this
 * process tells its own (`Service.changes`); a gateway or uploader spawned as a process
 * (testbed/processes.ts) tells its over its IPC channel, and the processes of one test share
 * one `changes`. Without `changes` (a service of this process whose packages an uploader
 * process stores: pass `changes: mergedChanges(...)` of both instead) it is probed every 25 ms.
 * `timeoutMs` only fails a test that would hang (with `what()` of the last probe): a change
 * that never comes fails it there.
 */
export async function whenChanged<T>(
  svc: { changes?: EventEmitter },
  probe: () => Promise<T | false | null | undefined>,
  what: () => string,
  timeoutMs = 20_000,
): Promise<T> {
  const hung = AbortSignal.timeout(timeoutMs);
  for (;;) {
    // Listening before the probe: a write while it runs is not missed.
    const changed = svc.changes ? once(svc.changes, 'change', { signal: hung }) : setTimeout(25);
    changed.catch(() => undefined);
    const value = await probe();
    if (value) return value;
    if (!hung.aborted) await changed.catch(() => undefined);
    if (hung.aborted) throw new Error(`${what()}, still after ${timeoutMs} ms`);
  }
}

/** One emitter of the `change` events of them all (e.g. a service of this process and a spawned uploader). */
export function mergedChanges(...sources: (EventEmitter | undefined)[]): EventEmitter {
  const merged = new EventEmitter();
  merged.setMaxListeners(0);
  for (const source of sources) source?.on('change', () => merged.emit('change'));
  return merged;
}

/** Asks status until `pred` holds (the service is asynchronous by contract): see `whenChanged`. */
export async function waitForStatus(
  svc: { url: string; changes?: EventEmitter },
  uuid: string,
  pred: (body: any) => boolean,
  client = DEMO as { id: string; token: string },
  timeoutMs = 20_000,
): Promise<any> {
  let last = '';
  return whenChanged(
    svc,
    async () => {
      let res = await clientOf(svc, client).status(uuid);
      // An answer the service tells to come back for (rate limit, storage unavailable) is asked
      // again after its Retry-After: no state change is due to end it.
      for (let retryAfter = retryAfterMs(res); retryAfter !== undefined; retryAfter = retryAfterMs(res)) {
        last = res.text;
        await setTimeout(retryAfter);
        res = await clientOf(svc, client).status(uuid);
      }
      last = res.text;
      return res.status === 200 && pred(res.body) ? (res.body as object) : null;
    },
    () => `status of ${uuid} never matched: ${last}`,
    timeoutMs,
  );
}

function retryAfterMs(res: { status: number; headers: Record<string, unknown> }): number | undefined {
  const header = res.headers['retry-after'];
  if ((res.status !== 429 && res.status !== 503) || typeof header !== 'string') return undefined;
  return Math.min(Number(header) * 1000, 5_000) || 100;
}

/**
 * Resolves once every ingest lease of a gateway that died (killed, a power cut) by `diedAt`
 * has lapsed: `leaseMs` after it at the latest (each was last renewed before). A lapse is no
 * write: no `change` tells it, so a wait for a status that only a lapse brings (a session with
 * no package left to store) waits it out first. On the wall clock: the gateway's own clock is
 * `Date.now` in another process, which a test cannot set.
 */
export async function leasesLapsed(diedAt: number, leaseMs: number): Promise<void> {
  const left = diedAt + leaseMs + 1 - Date.now();
  if (left > 0) await setTimeout(left);
}

export function yesterday(): string {
  return new Date(Date.now() - 86_400_000).toISOString().slice(0, 10);
}

export function sendWebhook(url: string, payload: unknown, opts: { secret?: string; timestamp?: number; signature?: string } = {}) {
  const raw = JSON.stringify(payload);
  const ts = opts.timestamp ?? Math.floor(Date.now() / 1000);
  const signature = opts.signature ?? signWebhook(opts.secret ?? WEBHOOK_SECRET, ts, raw);
  return call(url, 'POST', `${API}/webhooks/upload-finished`, {
    client: null,
    raw,
    headers: { 'content-type': 'application/json', 'x-connector-timestamp': String(ts), 'x-connector-signature': signature },
  });
}

export interface FakeConnector {
  url: string;
  requests: { method: string; url: string; body: any }[];
  /** Sets how the next calls are answered. */
  script(fn: (req: IncomingMessage, body: any, res: ServerResponse) => void): void;
}

/** A scripted stand-in for the Connector on a real loopback port. */
export async function fakeConnector(t: Teardown): Promise<FakeConnector> {
  let handler: (req: IncomingMessage, body: any, res: ServerResponse) => void = (_req, _body, res) => {
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ workflow_id: 'wf-1', status: 'started' }));
  };
  const requests: FakeConnector['requests'] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const text = Buffer.concat(chunks).toString();
      const body = text ? JSON.parse(text) : undefined;
      requests.push({ method: req.method!, url: req.url!, body });
      handler(req, body, res);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => {
    server.closeAllConnections();
    return new Promise((r) => server.close(r));
  });
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    requests,
    script(fn) {
      handler = fn;
    },
  };
}

/** A small valid products package. */
export function products(n: number, from = 0) {
  return {
    columns: ['product_id', 'name', 'price'],
    data: Array.from({ length: n }, (_, i) => [`p-${from + i}`, `Product ${from + i}`, (from + i) % 100]),
  };
}
