/**
 * The machine-readable contract served at `GET /openapi.json` (OpenAPI 3.1, `info.version`
 * 0.1.0): the document's frame (info, tags, security) and components (the body schemas of
 * schemas.ts, the shared parameters, responses and security schemes of openapi-shared.ts),
 * and its paths, assembled from the routes' own declarations (route-list.ts), each route's
 * operation written once, next to its handler. docs/api-reference.md is this document rendered.
 */
import { errors } from '../errors.js';
import { PARAMETERS, RESPONSES, SECURITY_SCHEMES } from './openapi-shared.js';
import { openApiPath, type Json, type RouteSpec } from './route.js';
import { DOCUMENTED_ROUTES } from './route-list.js';
import { components } from './schemas.js';

/** The paths of `routes`, each operation under its path and method, in the routes' order. */
function pathsOf(routes: readonly RouteSpec[]): Record<string, Json> {
  const paths: Record<string, Json> = {};
  for (const route of routes) {
    const item = (paths[openApiPath(route.pattern)] ??= {});
    const method = route.method.toLowerCase();
    if (item[method]) throw new Error(`${route.method} ${route.pattern} is declared twice`);
    item[method] = route.schema;
  }
  return paths;
}

const paths = pathsOf(DOCUMENTED_ROUTES);

const document = {
  openapi: '3.1.0',
  info: {
    title: 'Batch Upload and Connector Processing Service',
    version: '0.1.0',
    description:
      'Batch uploads of client data in packages within one session, then processing by the Connector: initialize a ' +
      'session; upload packages; poll the status until `can_start_upload`; start with a date range; poll until `DONE`.\n\n' +
      'Client endpoints need `Authorization` and `Client-Id` and an allowed source address; those with `{upload_uuid}` ' +
      '(but status) need the active session. Errors are `{"detail": ...}` except the initialize-session conflict.\n\n' +
      'Limits: body 32 MiB on ingest, 1 MiB otherwise (413); per client IP 30 requests/s, burst 50, 30 concurrent ' +
      '(503, `Retry-After`); 600 s per request (408). Within `/api/v1` changes are additive.\n\n' +
      `Any path: an unknown one answers 404 \`${JSON.stringify(errors.routeNotFound().body)}\`, a known one with another method 405 ` +
      `\`${JSON.stringify(errors.methodNotAllowed([]).body)}\` with \`Allow\` naming its methods, a malformed \`Content-Length\` 400.`,
  },
  tags: [
    { name: 'uploading', description: 'Client operations on upload sessions.' },
    { name: 'connector', description: 'Called by the Connector.' },
    { name: 'service', description: 'About the service itself.' },
    { name: 'operations', description: 'For operators and orchestrators: liveness, readiness, metrics.' },
  ],
  security: [{ Authorization: [], 'Client-Id': [] }],
  paths,
  components: {
    schemas: components.schemas,
    securitySchemes: SECURITY_SCHEMES,
    parameters: PARAMETERS,
    responses: RESPONSES,
  },
};

/** A route as the router knows it: `:name` segments are path parameters. */
export interface RouteKey {
  method: string;
  pattern: string;
}

/**
 * A fresh copy of the document, so a caller cannot change what others are served. With
 * `routed`, only the operations of those routes (and the tags they use): the document of
 * what this process serves, e.g. without `/metrics` while metrics are disabled. A route
 * without a declared operation is left out (test/unit/openapi.test.ts refuses one).
 */
export function openApiDocument(routed?: readonly RouteKey[]): object {
  const copy = structuredClone(document) as typeof document & { paths: Json; tags: { name: string }[] };
  if (!routed) return copy;
  const wanted = new Set(routed.map((r) => `${r.method.toLowerCase()} ${openApiPath(r.pattern)}`));
  const kept: Record<string, Json> = {};
  for (const [path, item] of Object.entries(copy.paths)) {
    const ops = Object.entries(item as Json).filter(([method]) => wanted.has(`${method} ${path}`));
    if (ops.length) kept[path] = Object.fromEntries(ops);
  }
  copy.paths = kept;
  const tags = new Set(Object.values(kept).flatMap((item) => Object.values(item as Json).flatMap((op) => (op as Json).tags ?? [])));
  copy.tags = copy.tags.filter((tag) => tags.has(tag.name));
  return copy;
}
