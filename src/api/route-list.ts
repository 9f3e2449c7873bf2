/**
 * Every route the service may serve, as declared by its module (route.ts): the router's
 * table (routes.ts) and the OpenAPI document (openapi.ts) are both made from these lists.
 */
import type { ApiDeps } from './context.js';
import { deleteRoute } from './delete.js';
import { docsAssetRoute, docsPageRoute, openApiRoute, type ServiceDeps } from './docs.js';
import { entitiesRoute } from './entities.js';
import { healthzRoute, readyzRoute } from './health.js';
import { ingestRoute } from './ingest.js';
import { initializeSessionRoute } from './initialize.js';
import { metricsRouteDeclaration } from './metrics.js';
import type { RouteDeclaration, RouteSpec } from './route.js';
import { sessionsRoute } from './sessions.js';
import { startUploadRoute } from './start-upload.js';
import { statusRoute } from './status.js';
import { terminateRoute } from './terminate.js';
import { uploadFinishedRoute } from './webhook.js';

/** The service's own: the document and the interactive page. */
export const SERVICE_ROUTES: readonly RouteDeclaration<ServiceDeps>[] = [openApiRoute, docsPageRoute, docsAssetRoute];

/** The client API and the Connector's webhook (docs/api.md, Endpoints), in the router's order: specific paths first. */
export const API_ROUTES: readonly RouteDeclaration<ApiDeps>[] = [
  initializeSessionRoute,
  entitiesRoute,
  // Four segments, like `entities`: never a `{upload_uuid}` (every route with one has five or more).
  sessionsRoute,
  uploadFinishedRoute,
  statusRoute,
  startUploadRoute,
  terminateRoute,
  deleteRoute,
  ingestRoute,
];

/**
 * The operator routes the composition root adds (app.ts: `healthRoutes`, and `metricsRoute`
 * while metrics are enabled); the router puts them last.
 */
export const OPERATOR_ROUTES: readonly RouteSpec[] = [healthzRoute, readyzRoute, metricsRouteDeclaration];

/** Every route, in the order of the document: the service's own, the operators', the client API. */
export const DOCUMENTED_ROUTES: readonly RouteSpec[] = [...SERVICE_ROUTES, ...OPERATOR_ROUTES, ...API_ROUTES];
