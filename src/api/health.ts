/**
 * `GET /healthz` (the process answers) and `GET /readyz` (it can do its work: the worker pool
 * is up and the back ends answer). Neither is authenticated nor rate-limited (the per-client
 * rate limit covers `/api/v1/` only); both are meant for orchestrators and load balancers.
 */
import type { EdgeName, Route } from '../http/server.js';
import { errors } from '../errors.js';
import { HEALTHY_BODY, readyBody, type Readiness } from '../observability/readiness.js';
import { json } from './context.js';
import { jsonResponse, q, RETRY_AFTER, schema, shared } from './openapi-shared.js';
import { bind, type RouteDeclaration } from './route.js';

/** `edge`: which HTTP edge serves, named in the readiness body (`http_engine`). */
export interface HealthDeps {
  readiness: Readiness;
  edge: EdgeName;
}

export const healthzRoute: RouteDeclaration<HealthDeps> = {
  method: 'GET',
  pattern: '/healthz',
  body: 'buffered',
  handler: () => async () => json(HEALTHY_BODY),
  schema: {
    operationId: 'getHealth',
    tags: ['operations'],
    summary: 'Liveness',
    description: 'The process answers. Not authenticated.',
    security: [],
    responses: { '200': jsonResponse('Alive.', schema('Healthy')), '503': shared('RateLimited') },
  },
};

export const readyzRoute: RouteDeclaration<HealthDeps> = {
  method: 'GET',
  pattern: '/readyz',
  body: 'buffered',
  handler:
    ({ readiness, edge }) =>
    async () => {
      const { ready, checks } = await readiness.run();
      if (ready) return json(readyBody(checks, { http_engine: edge }));
      const notReady = errors.notReady(checks, { http_engine: edge });
      return json(notReady.body, notReady.statusCode);
    },
  schema: {
    operationId: 'getReadiness',
    tags: ['operations'],
    summary: 'Readiness',
    description:
      'A validation worker is alive and every back end answers within `health.readyTimeoutMs`. Not authenticated.',
    security: [],
    responses: {
      '200': jsonResponse('Ready; every check `ok`.', schema('Ready')),
      '503': {
        ...jsonResponse(
          [
            `- ${q('NOT_READY')}: a check \`failed\` or \`timeout\` (\`NotReady\`)`,
            `- ${q('RATE_LIMITED')}: the in-flight limit (with \`Retry-After\`)`,
          ].join('\n'),
          { anyOf: [schema('NotReady'), schema('ErrorDetail')] },
        ),
        headers: { 'Retry-After': { ...RETRY_AFTER, required: false, description: `Only with ${q('RATE_LIMITED')}.` } },
      },
    },
  },
};

export function healthRoutes(readiness: Readiness, edge: EdgeName): Route[] {
  return [healthzRoute, readyzRoute].map((route) => bind(route, { readiness, edge }));
}
