import { describeCatalog } from '../entities/catalog.js';
import type { BufferedHandler } from '../http/server.js';
import { authenticate, json, type ApiDeps } from './context.js';

/** `GET /entities`: the catalog of entities, columns, types and parents. */
export const listEntities =
  (deps: ApiDeps): BufferedHandler =>
  async (req) => {
    authenticate(deps, req);
    return json(describeCatalog());
  };
