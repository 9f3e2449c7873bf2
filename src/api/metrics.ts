/**
 * `GET /metrics`: the Prometheus exposition of the service's own registry. Unauthenticated
 * unless `metrics.token` is set, then `Authorization: Bearer <token>` or 401. Either way,
 * keep it off the public listener (see docs/operations.md, Runbook).
 */
import { errors } from '../errors.js';
import type { Route } from '../http/server.js';
import { metricsAccess, type Metrics } from '../observability/metrics.js';

export function metricsRoute(metrics: Metrics, token: string | null): Route {
  const allowed = metricsAccess(token);
  return {
    method: 'GET',
    pattern: '/metrics',
    body: 'buffered',
    handler: async (req) => {
      if (!allowed(req.headers.get('authorization'))) throw errors.authRequired();
      return { status: 200, body: await metrics.render(), raw: { contentType: metrics.contentType } };
    },
  };
}
