/**
 * `GET /healthz` (the process answers) and `GET /readyz` (it can do its work: the worker pool
 * is up and the back ends answer). Neither is authenticated nor rate-limited (the per-client
 * rate limit covers `/api/v1/` only); both are meant for orchestrators and load balancers.
 */
import type { EdgeName, Route } from '../http/server.js';
import { errors } from '../errors.js';
import { HEALTHY_BODY, readyBody, type Readiness } from '../observability/readiness.js';
import { json } from './context.js';

/** `edge`: which HTTP edge serves, named in the readiness body (`http_engine`). */
export function healthRoutes(readiness: Readiness, edge: EdgeName): Route[] {
  return [
    { method: 'GET', pattern: '/healthz', body: 'buffered', handler: async () => json(HEALTHY_BODY) },
    {
      method: 'GET',
      pattern: '/readyz',
      body: 'buffered',
      handler: async () => {
        const { ready, checks } = await readiness.run();
        if (ready) return json(readyBody(checks, { http_engine: edge }));
        const notReady = errors.notReady(checks, { http_engine: edge });
        return json(notReady.body, notReady.statusCode);
      },
    },
  ];
}
