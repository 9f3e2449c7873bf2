/**
 * The operator endpoints of a process that has no HTTP API of its own (the uploader):
 * `GET /metrics`, `/healthz` and `/readyz`, answered as the gateway answers them, on a small
 * node:http server. A handful of requests a minute: no need for the uWS edge here.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { errors, type ServiceError } from '../errors.js';
import { metricsAccess, type Metrics } from './metrics.js';
import { HEALTHY_BODY, readyBody, type Readiness } from './readiness.js';

export interface OperatorServerOptions {
  host: string;
  port: number;
  metrics: Metrics | null;
  readiness: Readiness;
  /** `metrics.token`: when set, `/metrics` requires `Authorization: Bearer <token>`. */
  token: string | null;
}

export interface OperatorServer {
  readonly port: number;
  close(): Promise<void>;
}

export async function serveOperatorEndpoints(opts: OperatorServerOptions): Promise<OperatorServer> {
  const allowed = metricsAccess(opts.token);
  const send = (res: ServerResponse, status: number, body: string, type = 'application/json', headers: Readonly<Record<string, string>> = {}) => {
    res.writeHead(status, { ...headers, 'content-type': type, 'content-length': Buffer.byteLength(body) }).end(body);
  };
  /** The gateway's status, body and headers of `err` (errors.ts). */
  const fail = (res: ServerResponse, err: ServiceError) => send(res, err.statusCode, JSON.stringify(err.body), 'application/json', err.headers);
  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET') return fail(res, errors.methodNotAllowed(['GET']));
    if (path === '/healthz') return send(res, 200, JSON.stringify(HEALTHY_BODY));
    if (path === '/readyz') {
      const { ready, checks } = await opts.readiness.run();
      return ready ? send(res, 200, JSON.stringify(readyBody(checks))) : fail(res, errors.notReady(checks));
    }
    if (path === '/metrics' && opts.metrics) {
      if (!allowed(req.headers.authorization)) return fail(res, errors.authRequired());
      return send(res, 200, await opts.metrics.render(), opts.metrics.contentType);
    }
    fail(res, errors.routeNotFound());
  };
  const server = createServer((req, res) => {
    req.resume();
    handle(req, res).catch(() => {
      if (!res.headersSent) fail(res, errors.internal());
      else res.destroy();
    });
  });
  server.keepAliveTimeout = 5_000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, opts.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

