import { describeCatalog } from '../entities/catalog.js';
import type { BufferedHandler } from '../http/server.js';
import { authenticate, json, type ApiDeps } from './context.js';
import { BAD_CONTENT_LENGTH, CLIENT_ID_MISSING, clientResponses, error, IP_NOT_ALLOWED, jsonResponse, schema } from './openapi-shared.js';
import { API_BASE, type RouteDeclaration } from './route.js';

/** `GET /entities`: the catalog of entities, columns, types and parents. */
export const listEntities =
  (deps: ApiDeps): BufferedHandler =>
  async (req) => {
    authenticate(deps, req);
    return json(describeCatalog());
  };

export const entitiesRoute: RouteDeclaration<ApiDeps> = {
  method: 'GET',
  pattern: `${API_BASE}/entities`,
  body: 'buffered',
  handler: listEntities,
  schema: {
    operationId: 'listEntities',
    tags: ['uploading'],
    summary: 'List the entity catalog',
    description: 'Entity names, columns, types, required flags and parents (as in the ingest description).',
    responses: clientResponses(
      {
        '200': jsonResponse('The catalog.', schema('EntityCatalog')),
        '400': error([BAD_CONTENT_LENGTH, CLIENT_ID_MISSING]),
        '403': error([IP_NOT_ALLOWED]),
      },
      true,
    ),
  },
};
