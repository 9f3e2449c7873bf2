import type { BufferedHandler } from '../http/server.js';
import { authenticate, json, type ApiDeps } from './context.js';
import { BAD_CONTENT_LENGTH, CLIENT_ID_MISSING, clientResponses, error, IP_NOT_ALLOWED, jsonResponse, parameter, q, schema } from './openapi-shared.js';
import { API_BASE, type RouteDeclaration } from './route.js';

/** `GET /{upload_uuid}/status`: any session stored for this client, active or not. */
export const sessionStatus =
  (deps: ApiDeps): BufferedHandler =>
  async (req) => {
    const client = authenticate(deps, req);
    return json(await deps.service.status(client, req.params.upload_uuid!));
  };

export const statusRoute: RouteDeclaration<ApiDeps> = {
  method: 'GET',
  pattern: `${API_BASE}/:upload_uuid/status`,
  body: 'buffered',
  handler: sessionStatus,
  schema: {
    operationId: 'getSessionStatus',
    tags: ['uploading'],
    summary: 'Get session status',
    description:
      'Any session of this client, active or not (no session-access checks). Poll: after ingest until ' +
      '`can_start_upload`, after start-upload until `DONE`, after terminate until `UPLOADING`.',
    parameters: [parameter('UploadUuid')],
    responses: clientResponses({
      '200': jsonResponse('The session.', schema('StatusView')),
      '400': error([BAD_CONTENT_LENGTH, CLIENT_ID_MISSING]),
      '403': error([IP_NOT_ALLOWED]),
      '404': error([q('SESSION_NOT_FOUND')]),
    }),
  },
};
