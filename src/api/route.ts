/**
 * A route, declared once (fastify's route `schema` is the model: the route is the spec).
 * Each route module exports its declaration: what the router matches (method, pattern, body
 * kind), the handler it runs (made from the module's dependencies), and its OpenAPI
 * operation. The router's table (routes.ts) and the OpenAPI document (openapi.ts) are both
 * derived from the declarations (route-list.ts). The schema is data for the document only:
 * nothing validates requests against it.
 */
import type { BufferedHandler, Route, StreamingHandler } from '../http/types.js';

/** The prefix of the client API (docs/api.md, Endpoints). */
export const API_BASE = '/api/v1/uploading';

export type Json = Record<string, unknown>;

/** The document's tags (the `tags` of openapi.ts, in its order); an operation names one. */
export type Tag = 'uploading' | 'connector' | 'service' | 'operations';

/** An OpenAPI 3.1 Operation Object; keys are written in this order, as the document shows them. */
export interface Operation {
  operationId: string;
  tags: [Tag];
  summary: string;
  description?: string;
  /** Absent: the document's default (the client headers); `[]`: not authenticated. */
  security?: Json[];
  parameters?: Json[];
  requestBody?: Json;
  responses: Json;
}

interface Declared {
  method: 'GET' | 'POST';
  /** The router's pattern: `:name` segments are path parameters (`{name}` in the document). */
  pattern: string;
  /** Headers every answer to the route carries, the server's own included (`Route.answerHeaders`). */
  answerHeaders?: (query: string) => Readonly<Record<string, string>>;
  /** The route's OpenAPI operation. */
  schema: Operation;
}

/** A route with its handler made from `D`, the dependencies of its module. */
export type RouteDeclaration<D> =
  | (Declared & { body: 'buffered'; handler: (deps: D) => BufferedHandler })
  | (Declared & { body: 'streaming'; handler: (deps: D) => StreamingHandler });

/** What the document needs of a declaration. */
export type RouteSpec = Declared & { body: 'buffered' | 'streaming' };

/** The router's entry of a declaration, its handler made now (once, at start). */
export function bind<D>(route: RouteDeclaration<D>, deps: D): Route {
  const { method, pattern, answerHeaders } = route;
  const extra = answerHeaders ? { answerHeaders } : {};
  return route.body === 'streaming'
    ? { method, pattern, body: 'streaming', handler: route.handler(deps), ...extra }
    : { method, pattern, body: 'buffered', handler: route.handler(deps), ...extra };
}

/** The OpenAPI path of a router pattern: `/a/:b` → `/a/{b}`. */
export const openApiPath = (pattern: string): string => pattern.replace(/:(\w+)/g, '{$1}');
