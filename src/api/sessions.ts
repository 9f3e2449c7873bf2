import { errors, type ValidationIssue } from '../errors.js';
import type { BufferedHandler } from '../http/server.js';
import type { SessionPosition } from '../session/service.js';
import { authenticate, json, type ApiDeps } from './context.js';
import { BAD_CONTENT_LENGTH, CLIENT_ID_MISSING, clientResponses, error, IP_NOT_ALLOWED, jsonResponse, schema } from './openapi-shared.js';
import { API_BASE, type RouteDeclaration } from './route.js';

/** `limit` of `GET /sessions` (docs/api.md, A client's sessions). */
export const SESSIONS_LIMIT = { min: 1, max: 200, default: 50 } as const;

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const INSTANT = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?Z$/;

/** `GET /sessions?limit=&cursor=`: the client's own sessions, newest first, a page at a time. */
export const listSessions =
  (deps: ApiDeps): BufferedHandler =>
  async (req) => {
    const client = authenticate(deps, req);
    const query = parseQuery(req.query);
    if ('issues' in query) throw errors.validationFailed(query.issues);
    const { sessions, next } = await deps.service.listSessions(client, query.limit, query.after);
    return json({ sessions, next_cursor: next ? encodeCursor(next) : null });
  };

/** The query as FastAPI reads it: the last value of a repeated parameter wins, unknown ones are ignored. */
export function parseQuery(raw: string): { limit: number; after: SessionPosition | null } | { issues: ValidationIssue[] } {
  const params = new URLSearchParams(raw);
  const issues: ValidationIssue[] = [];
  let limit: number = SESSIONS_LIMIT.default;
  const rawLimit = params.getAll('limit').at(-1);
  if (rawLimit !== undefined) {
    const trimmed = rawLimit.trim();
    if (!/^[+-]?\d+$/.test(trimmed)) {
      issues.push({ type: 'int_parsing', loc: ['query', 'limit'], msg: 'Input should be a valid integer, unable to parse string as an integer', input: rawLimit });
    } else {
      limit = Number(trimmed);
      if (limit < SESSIONS_LIMIT.min) {
        issues.push({ type: 'greater_than_equal', loc: ['query', 'limit'], msg: `Input should be greater than or equal to ${SESSIONS_LIMIT.min}`, input: rawLimit, ctx: { ge: SESSIONS_LIMIT.min } });
      } else if (limit > SESSIONS_LIMIT.max) {
        issues.push({ type: 'less_than_equal', loc: ['query', 'limit'], msg: `Input should be less than or equal to ${SESSIONS_LIMIT.max}`, input: rawLimit, ctx: { le: SESSIONS_LIMIT.max } });
      }
    }
  }
  const rawCursor = params.getAll('cursor').at(-1);
  let after: SessionPosition | null = null;
  if (rawCursor !== undefined) {
    after = decodeCursor(rawCursor);
    if (!after) issues.push({ type: 'value_error', loc: ['query', 'cursor'], msg: 'Value error, Invalid cursor', input: rawCursor, ctx: { error: 'Invalid cursor' } });
  }
  return issues.length > 0 ? { issues } : { limit, after };
}

/** Opaque to clients: base64url of `[created_at, upload_uuid]` of the last session of the page. */
export function encodeCursor(p: SessionPosition): string {
  return Buffer.from(JSON.stringify([p.created_at, p.upload_uuid]), 'utf8').toString('base64url');
}

export function decodeCursor(cursor: string): SessionPosition | null {
  if (!/^[A-Za-z0-9_-]{1,200}$/.test(cursor)) return null;
  try {
    const v: unknown = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
    if (!Array.isArray(v) || v.length !== 2) return null;
    const [created_at, upload_uuid] = v as unknown[];
    if (typeof created_at !== 'string' || !INSTANT.test(created_at) || typeof upload_uuid !== 'string' || !UUID.test(upload_uuid)) return null;
    return { created_at, upload_uuid };
  } catch {
    return null;
  }
}

export const sessionsRoute: RouteDeclaration<ApiDeps> = {
  method: 'GET',
  pattern: `${API_BASE}/sessions`,
  body: 'buffered',
  handler: listSessions,
  schema: {
    operationId: 'listSessions',
    tags: ['uploading'],
    summary: "List the client's sessions",
    description:
      'The calling client\'s own sessions, newest first, each with its state, `created_at` and `totals`; deleted ' +
      'ones are not listed. Page with `limit` and the previous page\'s `next_cursor`.',
    parameters: [
      {
        name: 'limit',
        in: 'query',
        required: false,
        description: `Sessions per page, ${SESSIONS_LIMIT.min} to ${SESSIONS_LIMIT.max} (default ${SESSIONS_LIMIT.default}).`,
        schema: { type: 'integer', minimum: SESSIONS_LIMIT.min, maximum: SESSIONS_LIMIT.max, default: SESSIONS_LIMIT.default },
      },
      {
        name: 'cursor',
        in: 'query',
        required: false,
        description: 'The previous page\'s `next_cursor`; absent for the first page.',
        schema: { type: 'string' },
      },
    ],
    responses: clientResponses({
      '200': jsonResponse('A page of sessions.', schema('SessionList')),
      '400': error([BAD_CONTENT_LENGTH, CLIENT_ID_MISSING]),
      '403': error([IP_NOT_ALLOWED]),
      '422': error(
        [
          '`limit` not an integer (`int_parsing`), below 1 (`greater_than_equal`) or above 200 (`less_than_equal`)',
          '`cursor` not one this endpoint gave (`value_error`, `Value error, Invalid cursor`)',
        ],
        'ValidationError',
      ),
    }),
  },
};
