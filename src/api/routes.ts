/**
 * The router's table: every endpoint of docs/api.md (Endpoints). Specific paths first.
 * `operator` are the routes the composition root adds (health, readiness, metrics); they go
 * into the table last, and `/openapi.json` documents exactly the table.
 */
import type { Route } from '../http/server.js';
import type { ApiDeps } from './context.js';
import { deleteUpload } from './delete.js';
import { docsHandlers, OPENAPI_PATH } from './docs.js';
import { listEntities } from './entities.js';
import { ingestEntity } from './ingest.js';
import { initializeSession } from './initialize.js';
import { openApiDocument } from './openapi.js';
import { listSessions } from './sessions.js';
import { startUpload } from './start-upload.js';
import { sessionStatus } from './status.js';
import { terminateWorkflow } from './terminate.js';
import { uploadFinished } from './webhook.js';

export const API_BASE = '/api/v1/uploading';

export function routes(deps: ApiDeps, operator: readonly Route[] = []): Route[] {
  const docs = docsHandlers();
  let document = '';
  const table: Route[] = [
    { method: 'GET', pattern: OPENAPI_PATH, body: 'buffered', handler: async () => ({ status: 200, body: document, raw: { contentType: 'application/json' }, headers: { 'Cache-Control': 'no-cache' } }) },
    { method: 'GET', pattern: '/docs', body: 'buffered', handler: docs.page },
    { method: 'GET', pattern: '/docs/:asset', body: 'buffered', handler: docs.asset },
    { method: 'POST', pattern: `${API_BASE}/initialize-session`, body: 'buffered', handler: initializeSession(deps) },
    { method: 'GET', pattern: `${API_BASE}/entities`, body: 'buffered', handler: listEntities(deps) },
    // Four segments, like `entities`: never a `{upload_uuid}` (every route with one has five or more).
    { method: 'GET', pattern: `${API_BASE}/sessions`, body: 'buffered', handler: listSessions(deps) },
    { method: 'POST', pattern: `${API_BASE}/webhooks/upload-finished`, body: 'buffered', handler: uploadFinished(deps) },
    { method: 'GET', pattern: `${API_BASE}/:upload_uuid/status`, body: 'buffered', handler: sessionStatus(deps) },
    { method: 'POST', pattern: `${API_BASE}/:upload_uuid/start-upload`, body: 'buffered', handler: startUpload(deps) },
    { method: 'POST', pattern: `${API_BASE}/:upload_uuid/terminate`, body: 'buffered', handler: terminateWorkflow(deps) },
    { method: 'POST', pattern: `${API_BASE}/:upload_uuid/delete`, body: 'buffered', handler: deleteUpload(deps) },
    { method: 'POST', pattern: `${API_BASE}/:upload_uuid/:entity_name`, body: 'streaming', handler: ingestEntity(deps) },
    ...operator,
  ];
  document = JSON.stringify(openApiDocument(table));
  return table;
}
