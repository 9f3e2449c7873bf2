import type { BufferedHandler } from '../http/server.js';
import { authenticate, json, type ApiDeps } from './context.js';

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
