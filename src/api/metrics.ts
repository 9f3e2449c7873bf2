/**
 * `GET /metrics`: the Prometheus exposition of the service's own registry. Unauthenticated
 * unless `metrics.token` is set, then `Authorization: Bearer <token>` or 401. Either way,
 * keep it off the public listener (see docs/operations.md, Runbook).
 */
import { errors } from '../errors.js';
import type { Route } from '../http/server.js';
import { metricsAccess, type Metrics } from '../observability/metrics.js';
import { error, q, shared } from './openapi-shared.js';
import { bind, type RouteDeclaration } from './route.js';

export interface MetricsDeps {
  metrics: Metrics;
  /** `metrics.token`: when set, the route wants it as a bearer token. */
  token: string | null;
}

export const metricsRouteDeclaration: RouteDeclaration<MetricsDeps> = {
  method: 'GET',
  pattern: '/metrics',
  body: 'buffered',
  handler: ({ metrics, token }) => {
    const allowed = metricsAccess(token);
    return async (req) => {
      if (!allowed(req.headers.get('authorization'))) throw errors.authRequired();
      return { status: 200, body: await metrics.render(), raw: { contentType: metrics.contentType } };
    };
  },
  schema: {
    operationId: 'getMetrics',
    tags: ['operations'],
    summary: 'Prometheus metrics',
    description:
      'Prometheus text; routed while `metrics.enabled`. Unauthenticated unless `metrics.token` is set: keep it off ' +
      'the public listener.',
    security: [{}, { MetricsToken: [] }],
    responses: {
      '200': { description: 'The exposition.', content: { 'text/plain': { schema: { type: 'string' } } } },
      '401': error([`${q('AUTH_REQUIRED')}: not \`Bearer <metrics.token>\``]),
      '503': shared('RateLimited'),
    },
  },
};

export function metricsRoute(metrics: Metrics, token: string | null): Route {
  return bind(metricsRouteDeclaration, { metrics, token });
}
