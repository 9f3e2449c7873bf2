/**
 * The composition root: builds the adapters the configuration names, the worker pool, the
 * Connector (or its emulator), the session service and the HTTP server, and closes them
 * in reverse order.
 */
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:net';
import { join, resolve } from 'node:path';
import { routes } from './api/routes.js';
import type { ApiDeps } from './api/context.js';
import { healthRoutes } from './api/health.js';
import { metricsRoute } from './api/metrics.js';
import { checkGatewayConfig, type Config, DEMO_CLIENTS_PATH, resolvedWorkers } from './config/config.js';
import { EmulatedConnector } from './connector/emulator.js';
import type { InternalErrorCode } from './errors.js';
import { HttpConnector } from './connector/http-connector.js';
import type { Connector } from './connector/types.js';
import { addressList, ClientRegistry } from './http/auth.js';
import { loadEdge } from './http/engine.js';
import { listen, type EdgeName, type ResponseEvent, type Server } from './http/server.js';
import { jsonLogger, type Logger } from './log.js';
import { instrumentConnector, Metrics } from './observability/metrics.js';
import { Readiness } from './observability/readiness.js';
import { startHousekeeping } from './session/housekeeping.js';
import { IdempotentIngests } from './session/idempotency.js';
import { recoverLeftovers } from './session/recovery.js';
import { PackageIngest } from './session/ingest.js';
import { SessionService } from './session/service.js';
import { notifyingWrites, openEngines } from './store/engines.js';
import { countRows } from './store/object-format.js';
import { runUploader } from './uploader/uploader.js';
import { ValidationPool, type PoolLoad } from './validation-pool/index.js';

/** Outlasts Linux's 60 s TIME_WAIT, which holds the port after a restart (the uWS build binds without SO_REUSEADDR). */
const LISTEN_RETRY_MS = 90_000;

/** The gateway could not bind its address; the message is one line a person can act on. */
export class ListenError extends Error {
  override readonly name = 'ListenError';
  readonly code = 'LISTEN_FAILED' satisfies InternalErrorCode;
}

export interface App {
  readonly url: string;
  readonly port: number;
  readonly usesDemoClients: boolean;
  /** Which HTTP edge serves (`http.engine`). */
  readonly edge: EdgeName;
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
  /** The service's clock (default `Date.now`): session times, leases, webhook timestamps, and the per-client limiter's refills. */
  clock?: () => number;
  /**
   * The validation worker module (path or file URL) instead of the validation module's own (`src/validation/worker.ts`): a
   * module that wraps the real one, e.g. to instrument or fault-inject it.
   */
  validationWorker?: string;
  /** How long a taken port is retried before start fails (default 90 s). */
  listenRetryMs?: number;
  /**
   * Told after every write of this process that may change what status answers: a session
   * store or ledger write, a queue delivery settled or a session purged. For tests, which wait
   * on it for a state instead of polling. Unset: the stores are used as they are.
   */
  onStateChange?: () => void;
}

export async function startApp(config: Config, opts: AppOptions = {}): Promise<App> {
  checkGatewayConfig(config);
  const log = opts.logger ?? jsonLogger(undefined, {}, { level: config.log.level });
  const clock = opts.clock ?? Date.now;
  const edge = await loadEdge(config.http.engine);
  log.info('http edge', { engine: edge.adapter.name, reason: edge.reason });
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
    const onChange = opts.onStateChange;
    const engines = await openEngines(config, log, 'ingest-gateway', { onQueueSettled: onChange });
    closers.push(() => engines.close());
    if (onChange) notifyingWrites(engines, onChange);
    const { sessions, ledger, queue, objects } = engines;
    log.info('storage engines', engines.describe);
    const metrics = config.metrics.enabled
      ? new Metrics({ queue: { backend: engines.describe.queue, backlog: () => queue.backlog() }, backlogTimeoutMs: config.health.readyTimeoutMs, damagedRecords: engines.damagedRecords, damagedReads: engines.damagedReads })
      : null;
    if (sessions.capabilities.singleProcess) {
      // One process owns the embedded files: the leases in them are the previous process's.
      const recovered = await recoverLeftovers(sessions, ledger, clients.ids(), clock);
      if (recovered > 0) log.warn('released in-flight ingests and completed recordings of the previous process', { sessions: recovered });
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
      inlineBytes: config.ingest.inlineBytes,
      clientShare: config.ingest.clientShare,
      maxHeldBytes: config.limits.ingestBodyBytes,
      ...(opts.validationWorker === undefined ? {} : { filename: opts.validationWorker }),
      onError: (err) => log.error('validation worker failed outside a task', { err }),
    });
    closers.push(() => pool.destroy());
    metrics?.watchPool(pool);

    const secret = config.connector.webhookSecret ?? randomBytes(32).toString('hex');
    // The callback URL needs the bound port; a late-bound reference keeps construction order simple.
    let boundPort = config.port;
    // Without its trailing slash: the callback URL would have an empty segment (`//api/…`), which is 404.
    const publicUrl = () => config.publicUrl?.replace(/\/+$/, '') ?? `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${boundPort}`;
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
      ledger,
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
    // Closed after the HTTP server drained: the ledger writes of the last recorded packages finish
    // first; clean-ups not done stay recorded for the next start.
    closers.push(async () => {
      await service.flushLedger();
      await service.close();
    });
    if (sessions.capabilities.singleProcess) {
      // The previous process's starts died with it: their sessions go back to UPLOADING now, not when their hold lapses.
      const settled = await service.settleLapsedStarts(clients.ids(), true);
      if (settled > 0) log.warn('put back to UPLOADING the sessions whose start-upload the previous process did not finish', { sessions: settled });
    }
    const idempotency = new IdempotentIngests({
      sessions,
      service,
      ...config.idempotency,
      // The embedded files belong to this process alone: another instance's claim is a dead one's.
      singleInstance: sessions.capabilities.singleProcess,
      clock,
      onBackgroundError: (err, what) => log.error(`background task failed: ${what}`, { err }),
    });
    const housekeeping = startHousekeeping({
      everyMs: config.storage.housekeepingMs,
      tasks: [
        { what: 'resume the clean-ups of deleted sessions', run: () => service.resumeCleanUps() },
        { what: 'put back the starts whose gateway died', run: () => service.settleLapsedStarts(clients.ids()) },
        { what: 'index the sessions of earlier versions for the listing', run: () => service.indexEarlierSessions() },
        { what: 'remove expired Idempotency-Key records', run: () => idempotency.sweep(clients.ids()) },
      ],
      onError: (err, what) => log.error(`housekeeping failed: ${what}`, { err }),
    });
    closers.push(async () => {
      await housekeeping.close();
      await idempotency.idle();
    });
    const deps: ApiDeps = {
      service,
      clients,
      pool,
      queue,
      idempotency,
      ingest: new PackageIngest({ service, idempotency, pool, queue }),
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
    metrics?.nameEdge(edge.adapter.name);
    const operatorRoutes = [...healthRoutes(readiness, edge.adapter.name), ...(metrics ? [metricsRoute(metrics, config.metrics.token)] : [])];
    const address = `${config.host}:${config.port}`;
    const retryUntil = Date.now() + (opts.listenRetryMs ?? LISTEN_RETRY_MS);
    await waitForAddress(config.host, config.port, retryUntil, log);
    const server: Server = await listen({
      edge: edge.adapter,
      host: config.host,
      port: config.port,
      routes: routes(deps, operatorRoutes),
      limits: config.limits,
      trustedProxies,
      listenRetryMs: Math.max(0, retryUntil - Date.now()),
      onListenRetry: (retryMs) =>
        log.warn('bind failed although no process listens (closed connections of a previous run in TIME_WAIT?): retrying', { address, retry_ms: retryMs }),
      onInternalError: (err, req) => log.error('request failed', { err, method: req.method, path: req.path, request_id: req.requestId }),
      onStorageUnavailable: storageLog(log),
      onUnanswered: (err, req) =>
        log.error('outcome unknown: connection closed without an answer', { err, method: req.method, path: req.path, request_id: req.requestId }),
      onResponse: responseObserver(log, metrics, new Set(operatorRoutes.map((r) => r.pattern))),
      ...(opts.clock ? { limiterClock: opts.clock } : {}),
    }).catch((err: unknown) => {
      throw new ListenError(`Cannot listen on ${address}: the bind still fails after ${Math.round((opts.listenRetryMs ?? LISTEN_RETRY_MS) / 1000)} s`, { cause: err });
    });
    boundPort = server.port;
    closers.push(async () => {
      if (graceMs === undefined) return server.close();
      const t0 = Date.now();
      const drained = await server.drain(graceMs);
      if (drained) log.info('in-flight requests finished', { waited_ms: Date.now() - t0 });
      else log.warn('in-flight requests cut at the end of the shutdown grace', { grace_ms: graceMs });
    });
    return { url: publicUrl(), port: server.port, usesDemoClients, edge: server.edge, ingestLoad: () => pool.load, close };
  } catch (err) {
    await close();
    throw err;
  }
}

/**
 * Waits, until `retryUntil`, for no other process to listen on `host:port`, and fails with one
 * clear line when the address cannot be had. Asked of node:net, which binds with SO_REUSEADDR
 * and without SO_REUSEPORT, unlike this uWS build (the reverse): its bind fails on a live
 * listener, a second gateway included (whose SO_REUSEPORT would let uWS share the port with
 * it unnoticed), and not on the TIME_WAIT leftovers of a previous run, which `listen` waits out.
 * Port 0 too: no port is taken then, but a `HOST` not of this machine fails here at once.
 */
async function waitForAddress(host: string, port: number, retryUntil: number, log: Logger): Promise<void> {
  const address = `${host}:${port}`;
  let err = await bindError(host, port);
  if (err?.code === 'EADDRINUSE') {
    log.warn('port in use by another process: retrying the bind', { address, retry_ms: Math.max(0, retryUntil - Date.now()) });
    // No event tells when another process lets go of a port: ask again every half second.
    while (err?.code === 'EADDRINUSE' && Date.now() < retryUntil) {
      await new Promise((r) => setTimeout(r, Math.min(500, Math.max(0, retryUntil - Date.now()))));
      err = await bindError(host, port);
    }
  }
  if (!err) return;
  const why: Record<string, string> = {
    EADDRINUSE: 'the port is in use by another process; stop it, or set PORT to a free port',
    EACCES: 'permission denied (ports below 1024 need privileges); set PORT to 1024 or above',
    EADDRNOTAVAIL: "the address is not one of this machine's; set HOST",
  };
  throw new ListenError(`Cannot listen on ${address}: ${why[err.code ?? ''] ?? err.message}`, { cause: err });
}

/** The error node:net's bind of `host:port` meets, or null when the address is free. */
function bindError(host: string, port: number): Promise<NodeJS.ErrnoException | null> {
  return new Promise((resolve) => {
    const probe = createServer();
    probe.once('error', (err: NodeJS.ErrnoException) => resolve(err));
    probe.listen({ host, port, exclusive: true }, () => probe.close(() => resolve(null)));
  });
}

/**
 * The cause of 503 `Storage temporarily unavailable` answers, at most one line every 10 s
 * (an outage answers thousands of requests a second), with how many were answered so since
 * the last line; the access log has every one of them.
 */
function storageLog(log: Logger): (err: unknown, req: { method: string; path: string; requestId: string }) => void {
  let last = -Infinity;
  let since = 0;
  return (err, req) => {
    since++;
    const now = performance.now();
    if (now - last < 10_000) return;
    log.error('storage unavailable: answered 503', { err, answered: since, method: req.method, path: req.path, request_id: req.requestId });
    last = now;
    since = 0;
  };
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
