import type { BufferedHandler } from '../http/server.js';
import { authenticate, json, type ApiDeps } from './context.js';
import { clientResponses, error, jsonResponse, NOT_UPLOADING, parameter, schema, sessionAccess } from './openapi-shared.js';
import { API_BASE, type RouteDeclaration } from './route.js';

/** `POST /{upload_uuid}/delete`: the session is gone at once; its files go in the background. */
export const deleteUpload =
  (deps: ApiDeps): BufferedHandler =>
  async (req) => {
    const client = authenticate(deps, req);
    await deps.service.delete(client, req.params.upload_uuid!);
    return json({ status: 'started', message: 'Upload deletion started' });
  };

export const deleteRoute: RouteDeclaration<ApiDeps> = {
  method: 'POST',
  pattern: `${API_BASE}/:upload_uuid/delete`,
  body: 'buffered',
  handler: deleteUpload,
  schema: {
    operationId: 'deleteUpload',
    tags: ['uploading'],
    summary: 'Delete the upload being assembled',
    description:
      'Ends the session at once (its status then 404) and removes its data in the background.',
    parameters: [parameter('UploadUuid')],
    responses: clientResponses({
      '200': jsonResponse('`Upload deletion started`.', schema('OperationStarted')),
      ...sessionAccess(),
      '409': error([NOT_UPLOADING], 'InvalidSessionStatusError'),
    }),
  },
};
