/**
 * The router's table, made from the route declarations (route-list.ts): the service's own
 * routes, then the client API (specific paths first), then `operator`, the routes the
 * composition root adds (health, readiness, metrics). `/openapi.json` documents exactly the table.
 */
import type { Route } from '../http/server.js';
import type { ApiDeps } from './context.js';
import { openApiDocument } from './openapi.js';
import { bind } from './route.js';
import { API_ROUTES, SERVICE_ROUTES } from './route-list.js';

export function routes(deps: ApiDeps, operator: readonly Route[] = []): Route[] {
  let document = '';
  const service = { document: () => document };
  const table: Route[] = [...SERVICE_ROUTES.map((route) => bind(route, service)), ...API_ROUTES.map((route) => bind(route, deps)), ...operator];
  document = JSON.stringify(openApiDocument(table));
  return table;
}
