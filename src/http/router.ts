/**
 * The route table: a request path is matched as sent (docs/api.md, "Limits"):
 * an empty segment (`//api/v1/…`, `/api//v1/…`) or a trailing slash matches nothing (404).
 * Parameters are percent-decoded; literal segments are compared as sent.
 */
import type { Route } from './types.js';

export interface RouteMatch {
  route?: CompiledRoute;
  params: Record<string, string>;
  /** The methods of the routes the path matches when none is of the request's (405 and its `Allow`); empty when none matches. */
  allowed: string[];
}

export interface CompiledRoute {
  method: string;
  segments: string[];
  route: Route;
  bodyLimit: number;
}

/** Requests under this prefix take a token of the per-client rate limit (the spec's Limits table). */
const RATED_PREFIX = ['api', 'v1'];

export class Router {
  readonly #routes: CompiledRoute[];

  constructor(routes: readonly Route[], limits: { ingestBodyBytes: number; otherBodyBytes: number }) {
    this.#routes = routes.map((route) => ({
      method: route.method,
      segments: route.pattern.split('/').filter(Boolean),
      route,
      bodyLimit: route.body === 'streaming' ? limits.ingestBodyBytes : limits.otherBodyBytes,
    }));
  }

  match(method: string, path: string): RouteMatch {
    const parts = pathSegments(path);
    const allowed: string[] = [];
    if (parts === null) return { params: {}, allowed };
    for (const candidate of this.#routes) {
      const params = matchSegments(candidate.segments, parts);
      if (!params) continue;
      if (candidate.method === method) return { route: candidate, params, allowed: [] };
      if (!allowed.includes(candidate.method)) allowed.push(candidate.method);
    }
    return { params: {}, allowed };
  }
}

/**
 * True when the per-client rate limit counts the path: what the router would serve under
 * `/api/v1/` if it were lenient. Empty segments are dropped and segments percent-decoded
 * first, so `//api/v1/…` or `/%61pi/v1/…` (a 404 each) cannot pass the limit uncounted.
 */
export function isRatedPath(path: string): boolean {
  const parts = path.split('/').filter(Boolean);
  return RATED_PREFIX.every((want, i) => parts[i] !== undefined && decoded(parts[i]) === want);
}

/** The segments of an origin-form path, or null when it has an empty segment, a trailing slash, or is not origin-form. */
function pathSegments(path: string): string[] | null {
  if (!path.startsWith('/')) return null;
  const parts = path.slice(1).split('/');
  return parts.includes('') ? null : parts;
}

function matchSegments(pattern: string[], parts: string[]): Record<string, string> | null {
  if (pattern.length !== parts.length) return null;
  const params: Record<string, string> = {};
  for (let i = 0; i < pattern.length; i++) {
    const p = pattern[i]!;
    const part = parts[i]!;
    if (p.startsWith(':')) {
      const value = decoded(part);
      if (value === null) return null;
      params[p.slice(1)] = value;
    } else if (p !== part) {
      return null;
    }
  }
  return params;
}

function decoded(segment: string): string | null {
  try {
    return decodeURIComponent(segment);
  } catch {
    return null;
  }
}
