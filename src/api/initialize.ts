import type { BufferedHandler } from '../http/server.js';
import { authenticate, json, type ApiDeps } from './context.js';
import { BAD_CONTENT_LENGTH, CLIENT_ID_MISSING, clientResponses, error, IP_NOT_ALLOWED, jsonResponse, schema } from './openapi-shared.js';
import { API_BASE, type RouteDeclaration } from './route.js';

/** `POST /initialize-session`: no session-access checks; 409 answers in the flat shape. */
export const initializeSession =
  (deps: ApiDeps): BufferedHandler =>
  async (req) => {
    const client = authenticate(deps, req);
    const { upload_uuid, previous_upload_uuid } = await deps.service.initialize(client);
    return json({
      status: 'created',
      upload_uuid,
      message: 'Upload session created',
      ...(previous_upload_uuid ? { previous_upload_uuid } : {}),
    });
  };

export const initializeSessionRoute: RouteDeclaration<ApiDeps> = {
  method: 'POST',
  pattern: `${API_BASE}/initialize-session`,
  body: 'buffered',
  handler: initializeSession,
  schema: {
    operationId: 'initializeSession',
    tags: ['uploading'],
    summary: 'Initialize an upload session',
    description:
      'Creates the client\'s upload session in `UPLOADING`. A client has at most one active session. No session-access checks.',
    responses: clientResponses({
      '200': jsonResponse('Created; `previous_upload_uuid` when the previous session was `DONE`.', schema('InitializeSessionCreated')),
      '400': error([BAD_CONTENT_LENGTH, CLIENT_ID_MISSING]),
      '403': error([IP_NOT_ALLOWED]),
      '409': error(
        [
          '`already_exists`: a session is `UPLOADING` (its `upload_uuid`)',
          '`workflow_running`: the session is `STARTED`',
        ],
        'InitializeSessionConflict',
      ),
    }),
  },
};
