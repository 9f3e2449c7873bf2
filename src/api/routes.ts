/** The router's table: every endpoint of the spec plus the service's own. Specific paths first. */
import type { Route } from '../http/server.js';
import type { ApiDeps } from './context.js';
import { deleteUpload } from './delete.js';
import { listEntities } from './entities.js';
import { ingestEntity } from './ingest.js';
import { initializeSession } from './initialize.js';
import { openApiDocument } from './openapi.js';
import { startUpload } from './start-upload.js';
import { sessionStatus } from './status.js';
import { terminateWorkflow } from './terminate.js';
import { uploadFinished } from './webhook.js';

export const API_BASE = '/api/v1/uploading';

export function routes(deps: ApiDeps): Route[] {
  const document = JSON.stringify(openApiDocument());
  return [
    { method: 'GET', pattern: '/openapi.json', body: 'buffered', handler: async () => ({ status: 200, body: document, raw: { contentType: 'application/json' } }) },
    { method: 'POST', pattern: `${API_BASE}/initialize-session`, body: 'buffered', handler: initializeSession(deps) },
    { method: 'GET', pattern: `${API_BASE}/entities`, body: 'buffered', handler: listEntities(deps) },
    { method: 'POST', pattern: `${API_BASE}/webhooks/upload-finished`, body: 'buffered', handler: uploadFinished(deps) },
    { method: 'GET', pattern: `${API_BASE}/:upload_uuid/status`, body: 'buffered', handler: sessionStatus(deps) },
    { method: 'POST', pattern: `${API_BASE}/:upload_uuid/start-upload`, body: 'buffered', handler: startUpload(deps) },
    { method: 'POST', pattern: `${API_BASE}/:upload_uuid/terminate`, body: 'buffered', handler: terminateWorkflow(deps) },
    { method: 'POST', pattern: `${API_BASE}/:upload_uuid/delete`, body: 'buffered', handler: deleteUpload(deps) },
    { method: 'POST', pattern: `${API_BASE}/:upload_uuid/:entity_name`, body: 'streaming', handler: ingestEntity(deps) },
  ];
}
