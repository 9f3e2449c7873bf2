import type { BufferedHandler } from '../http/server.js';
import { authenticate, json, type ApiDeps } from './context.js';
import { clientResponses, error, jsonResponse, parameter, q, schema, sessionAccess, UNREACHABLE } from './openapi-shared.js';
import { API_BASE, type RouteDeclaration } from './route.js';

/** `POST /{upload_uuid}/terminate`: asks the Connector to stop; the webhook brings the session back. */
export const terminateWorkflow =
  (deps: ApiDeps): BufferedHandler =>
  async (req) => {
    const client = authenticate(deps, req);
    await deps.service.terminate(client, req.params.upload_uuid!);
    return json({
      status: 'started',
      message: 'Workflow stop requested; the session returns to UPLOADING after the Connector confirms cancellation',
    });
  };

export const terminateRoute: RouteDeclaration<ApiDeps> = {
  method: 'POST',
  pattern: `${API_BASE}/:upload_uuid/terminate`,
  body: 'buffered',
  handler: terminateWorkflow,
  schema: {
    operationId: 'terminateWorkflow',
    tags: ['uploading'],
    summary: 'Terminate the Connector workflow',
    description:
      'Asks the Connector to stop; the session stays `STARTED` until the webhook confirms, then is `UPLOADING`.',
    parameters: [parameter('UploadUuid')],
    responses: clientResponses({
      '200': jsonResponse('Stop requested.', schema('OperationStarted')),
      ...sessionAccess(),
      '404': error([`${q('WORKFLOW_NOT_RUNNING')}: the session is not \`STARTED\``, `${q('WORKFLOW_STOP_FAILED')}: the Connector does not know the workflow`]),
      '409': error([`${q('WORKFLOW_STOP_FAILED')}: the Connector answered 409`]),
      '500': error([`${q('WORKFLOW_STOP_FAILED')}: any other Connector answer`, 'An internal error']),
      '502': error([UNREACHABLE]),
    }),
  },
};
