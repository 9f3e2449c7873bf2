/**
 * The operator endpoints of a process that has no HTTP API of its own (the uploader):
 * `GET /metrics`, `/healthz` and `/readyz`, answered as the gateway answers them, on a small
 * node:http server. A handful of requests a minute: no need for the uWS edge here.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { metricsAccess, type Metrics } from './metrics.js';
import type { Readiness } from './readiness.js';

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
  const send = (res: ServerResponse, status: number, body: string, type = 'application/json') => {
    res.writeHead(status, { 'content-type': type, 'content-length': Buffer.byteLength(body) }).end(body);
  };
  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET') return send(res, 405, JSON.stringify({ detail: 'Method Not Allowed' }));
    if (path === '/healthz') return send(res, 200, JSON.stringify({ status: 'ok' }));
    if (path === '/readyz') {
      const { ready, checks } = await opts.readiness.run();
      return send(res, ready ? 200 : 503, JSON.stringify(ready ? { status: 'ready', checks } : { detail: 'Not ready', checks }));
    }
    if (path === '/metrics' && opts.metrics) {
      if (!allowed(req.headers.authorization)) return send(res, 401, JSON.stringify({ detail: 'User not authenticated' }));
      return send(res, 200, await opts.metrics.render(), opts.metrics.contentType);
    }
    send(res, 404, JSON.stringify({ detail: 'Not Found' }));
  };
  const server = createServer((req, res) => {
    req.resume();
    handle(req, res).catch(() => {
      if (!res.headersSent) send(res, 500, JSON.stringify({ detail: 'Internal server error' }));
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

