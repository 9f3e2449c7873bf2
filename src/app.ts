/**
 * The composition root: builds the adapters the configuration names, the worker pool, the
 * Connector (or its emulator), the session service and the HTTP server, and closes them
 * in reverse order.
 */
import { randomBytes } from 'node:crypto';
import { mkdir } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { routes } from './api/routes.js';
import type { ApiDeps } from './api/context.js';
import { healthRoutes } from './api/health.js';
import { metricsRoute } from './api/metrics.js';
import { type Config, DEMO_CLIENTS_PATH, resolvedWorkers } from './config/config.js';
import { EmulatedConnector } from './connector/emulator.js';
import { HttpConnector } from './connector/http-connector.js';
import type { Connector } from './connector/types.js';
import { addressList, ClientRegistry } from './http/auth.js';
import { listen, uwsIsNative, type ResponseEvent, type Server } from './http/server.js';
import { ValidationPool, type PoolLoad } from './ingest/pool.js';
import { jsonLogger, type Logger } from './log.js';
import { instrumentConnector, Metrics } from './observability/metrics.js';
import { Readiness } from './observability/readiness.js';
import { IdempotentIngests } from './session/idempotency.js';
import { releaseLeftoverLeases } from './session/recovery.js';
import { SessionService } from './session/service.js';
import { openEngines } from './store/engines.js';
import { countRows, runUploader } from './uploader/uploader.js';

/** Outlasts Linux's 60 s TIME_WAIT, which holds the port after a restart (see http/server.ts). */
const LISTEN_RETRY_MS = 90_000;

export interface App {
  readonly url: string;
  readonly port: number;
  readonly usesDemoClients: boolean;
  /** The validation pool's current load (read-only counters: sinks open, tasks, threads). */
  ingestLoad(): PoolLoad;
  /**
   * Closes everything, the HTTP server first. With `graceMs` (SIGTERM) that is a graceful
   * stop: no new connections, the requests in flight finish (up to `graceMs`, then their
   * connections are closed), and only then the pool, the Connector, the uploader (after the
   * package in hand) and the stores close. Without it the server stops listening and the rest
   * closes at once, whatever is in flight.
   */
  close(opts?: { graceMs?: number }): Promise<void>;
}

export interface AppOptions {
  logger?: Logger;
  clock?: () => number;
  /**
   * The validation worker module (path or file URL) instead of `workers/validate.js`: a
   * module that wraps the real one, e.g. to instrument or fault-inject it.
   */
  validationWorker?: string;
}

export async function startApp(config: Config, opts: AppOptions = {}): Promise<App> {
  const log = opts.logger ?? jsonLogger(undefined, {}, { level: config.log.level });
  const clock = opts.clock ?? Date.now;
  if (!uwsIsNative()) {
    if (process.env.NODE_ENV === 'production') throw new Error('uWebSockets.js native binary did not load; refusing to run the slow fallback in production');
    log.warn('uWebSockets.js native binary did not load: running its slow pure-JS fallback');
  }
  const usesDemoClients = config.clientsFile === null;
  const clients = ClientRegistry.fromFile(config.clientsFile ?? DEMO_CLIENTS_PATH);
  const trustedProxies = config.trustedProxies.length ? addressList(config.trustedProxies, 'trustedProxies') : null;

  const closers: (() => Promise<void>)[] = [];
  let graceMs: number | undefined;
  const close = async (opts: { graceMs?: number } = {}) => {
    graceMs = opts.graceMs;
    for (const fn of closers.reverse()) await fn().catch((err: unknown) => log.error('close failed', { err }));
  };
  try {
    const dataDir = resolve(config.dataDir);
    await mkdir(dataDir, { recursive: true });
    const engines = await openEngines(config, log, 'ingest-gateway');
    closers.push(() => engines.close());
    const { sessions, queue, objects } = engines;
    log.info('storage engines', engines.describe);
    const metrics = config.metrics.enabled
      ? new Metrics({ queue: { backend: engines.describe.queue, backlog: () => queue.backlog() }, backlogTimeoutMs: config.health.readyTimeoutMs })
      : null;
    if (engines.describe.sessions === 'file') {
      // One process owns the embedded files: the leases in them are the previous process's.
      const released = await releaseLeftoverLeases(sessions, clients.ids(), clock);
      if (released > 0) log.warn('released in-flight ingests of the previous process', { sessions: released });
    }

    if (config.storage.inProcessUploader) {
      const uploader = await runUploader(engines, config, log, metrics?.uploader);
      closers.push(() => uploader.stop());
    }

    const pool = new ValidationPool({
      workers: resolvedWorkers(config),
      workerNice: config.ingest.workerNice,
      maxQueue: config.ingest.maxQueue,
      batchBytes: config.ingest.batchBytes,
      pieceBytes: config.ingest.pieceBytes,
      piecesPerRequest: config.ingest.piecesPerRequest,
      poolPieces: config.ingest.poolPieces,
      maxDecompressedBytes: config.ingest.maxDecompressedBytes,
      memoryBudgetBytes: config.ingest.memoryBudgetBytes,
      rowScanner: config.ingest.rowScanner,
      maxHeldBytes: config.limits.ingestBodyBytes,
      ...(opts.validationWorker === undefined ? {} : { filename: opts.validationWorker }),
      onError: (err) => log.error('validation worker failed outside a task', { err }),
    });
    closers.push(() => pool.destroy());
    metrics?.watchPool(pool);

    const secret = config.connector.webhookSecret ?? randomBytes(32).toString('hex');
    // The callback URL needs the bound port; a late-bound reference keeps construction order simple.
    let boundPort = config.port;
    const publicUrl = () => config.publicUrl ?? `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${boundPort}`;
    const bareConnector: Connector = config.connector.url
      ? new HttpConnector({ url: config.connector.url, timeoutMs: config.connector.timeoutMs, connectTimeoutMs: config.connector.connectTimeoutMs })
      : await EmulatedConnector.open({
          objects,
          secret,
          delayMs: config.connector.emulatorDelayMs,
          stateFile: join(dataDir, 'connector-emulator.json'),
          // Restored workflows: the saved callback URL may name the previous run's port.
          callbackUrl: () => `${publicUrl()}/api/v1/uploading/webhooks/upload-finished`,
          timeoutMs: config.connector.timeoutMs,
          countRows: async (body) => (await countRows(body)).rows,
          log: (msg, data) => log.info(msg, data),
        });
    const connector = metrics ? instrumentConnector(bareConnector, metrics) : bareConnector;
    closers.push(() => connector.close());

    const service = new SessionService({
      sessions,
      queue,
      objects,
      connector,
      objectPrefix: config.storage.objectPrefix,
      inFlightLeaseMs: config.ingest.inFlightLeaseMs,
      maxPackages: config.limits.packagesPerSession,
      get callbackUrl() {
        return `${publicUrl()}/api/v1/uploading/webhooks/upload-finished`;
      },
      clock,
      onBackgroundError: (err, what) => log.error(`background task failed: ${what}`, { err }),
    });
    const deps: ApiDeps = {
      service,
      clients,
      trustedProxies,
      pool,
      queue,
      idempotency: new IdempotentIngests({
        sessions,
        service,
        ...config.idempotency,
        // The embedded files belong to this process alone: another instance's claim is a dead one's.
        singleInstance: engines.describe.sessions === 'file',
        clock,
        onBackgroundError: (err, what) => log.error(`background task failed: ${what}`, { err }),
      }),
      webhook: { secret, toleranceSeconds: config.connector.webhookToleranceSeconds },
      clock,
    };
    const readiness = new Readiness(
      {
        workers: async () => {
          if (pool.load.threads === 0) throw new Error('no validation worker thread is alive');
        },
        ...engines.probes,
      },
      config.health.readyTimeoutMs,
      log,
    );
    const operatorRoutes = [...healthRoutes(readiness), ...(metrics ? [metricsRoute(metrics, config.metrics.token)] : [])];
    const server: Server = await listen({
      host: config.host,
      port: config.port,
      routes: routes(deps, operatorRoutes),
      limits: config.limits,
      trustedProxies,
      listenRetryMs: LISTEN_RETRY_MS,
      onInternalError: (err, req) => log.error('request failed', { err, method: req.method, path: req.path, request_id: req.requestId }),
      onResponse: responseObserver(log, metrics, new Set(operatorRoutes.map((r) => r.pattern))),
    });
    boundPort = server.port;
    closers.push(async () => {
      if (graceMs === undefined) return server.close();
      const t0 = Date.now();
      const drained = await server.drain(graceMs);
      if (drained) log.info('in-flight requests finished', { waited_ms: Date.now() - t0 });
      else log.warn('in-flight requests cut at the end of the shutdown grace', { grace_ms: graceMs });
    });
    return { url: publicUrl(), port: server.port, usesDemoClients, ingestLoad: () => pool.load, close };
  } catch (err) {
    await close();
    throw err;
  }
}

/**
 * One access log line per request (at debug for successful probes and scrapes of the
 * operator routes, which would drown the rest), and the request metrics. Never a header
 * value: the token stays out of the log.
 */
function responseObserver(log: Logger, metrics: Metrics | null, quiet: ReadonlySet<string>): (event: ResponseEvent) => void {
  return ({ req, route, status, durationMs }) => {
    metrics?.observeRequest(req.method, route, status, durationMs);
    const fields = {
      request_id: req.requestId,
      method: req.method,
      route: route ?? 'unmatched',
      status,
      duration_ms: Math.round(durationMs * 10) / 10,
      client_address: req.clientAddress,
      ...(req.context.clientId === undefined ? {} : { client_id: req.context.clientId }),
    };
    if (route !== null && quiet.has(route) && status === 200) log.debug?.('request', fields);
    else log.info('request', fields);
  };
}
