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
import { type Config, DEMO_CLIENTS_PATH, resolvedWorkers } from './config/config.js';
import { EmulatedConnector } from './connector/emulator.js';
import { HttpConnector } from './connector/http-connector.js';
import type { Connector } from './connector/types.js';
import { addressList, ClientRegistry } from './http/auth.js';
import { listen, uwsIsNative, type Server } from './http/server.js';
import { ValidationPool } from './ingest/pool.js';
import { jsonLogger, type Logger } from './log.js';
import { SessionService } from './session/service.js';
import { openEngines } from './store/engines.js';
import { countRows, runUploader } from './uploader/uploader.js';

/** Outlasts Linux's 60 s TIME_WAIT, which holds the port after a restart (see http/server.ts). */
const LISTEN_RETRY_MS = 90_000;

export interface App {
  readonly url: string;
  readonly port: number;
  readonly usesDemoClients: boolean;
  close(): Promise<void>;
}

export interface AppOptions {
  logger?: Logger;
  clock?: () => number;
}

export async function startApp(config: Config, opts: AppOptions = {}): Promise<App> {
  const log = opts.logger ?? jsonLogger();
  const clock = opts.clock ?? Date.now;
  if (!uwsIsNative()) {
    if (process.env.NODE_ENV === 'production') throw new Error('uWebSockets.js native binary did not load; refusing to run the slow fallback in production');
    log.warn('uWebSockets.js native binary did not load: running its slow pure-JS fallback');
  }
  const usesDemoClients = config.clientsFile === null;
  const clients = ClientRegistry.fromFile(config.clientsFile ?? DEMO_CLIENTS_PATH);
  const trustedProxies = config.trustedProxies.length ? addressList(config.trustedProxies, 'trustedProxies') : null;

  const closers: (() => Promise<void>)[] = [];
  const close = async () => {
    for (const fn of closers.reverse()) await fn().catch((err: unknown) => log.error('close failed', { err }));
  };
  try {
    const dataDir = resolve(config.dataDir);
    await mkdir(dataDir, { recursive: true });
    const engines = await openEngines(config, log, 'ingest-gateway');
    closers.push(() => engines.close());
    const { sessions, queue, objects } = engines;
    log.info('storage engines', engines.describe);

    if (config.storage.inProcessUploader) {
      const uploader = await runUploader(engines, config, log);
      closers.push(() => uploader.stop());
    }

    const pool = new ValidationPool({
      workers: resolvedWorkers(config),
      maxQueue: config.ingest.maxQueue,
      batchBytes: config.ingest.batchBytes,
      pieceBytes: config.ingest.pieceBytes,
      piecesPerRequest: config.ingest.piecesPerRequest,
      poolPieces: config.ingest.poolPieces,
      maxDecompressedBytes: config.ingest.maxDecompressedBytes,
      onError: (err) => log.error('validation worker failed outside a task', { err }),
    });
    closers.push(() => pool.destroy());

    const secret = config.connector.webhookSecret ?? randomBytes(32).toString('hex');
    // The callback URL needs the bound port; a late-bound reference keeps construction order simple.
    let boundPort = config.port;
    const publicUrl = () => config.publicUrl ?? `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${boundPort}`;
    const connector: Connector = config.connector.url
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
    closers.push(() => connector.close());

    const service = new SessionService({
      sessions,
      queue,
      objects,
      connector,
      objectPrefix: config.storage.objectPrefix,
      inFlightLeaseMs: config.ingest.inFlightLeaseMs,
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
      webhook: { secret, toleranceSeconds: config.connector.webhookToleranceSeconds },
      clock,
    };
    const server: Server = await listen({
      host: config.host,
      port: config.port,
      routes: routes(deps),
      limits: config.limits,
      trustedProxies,
      listenRetryMs: LISTEN_RETRY_MS,
      onInternalError: (err, req) => log.error('request failed', { err, method: req.method, path: req.path, request_id: req.id }),
    });
    boundPort = server.port;
    closers.push(async () => server.close());
    return { url: publicUrl(), port: server.port, usesDemoClients, close };
  } catch (err) {
    await close();
    throw err;
  }
}
