import type { BufferedHandler } from '../http/server.js';
import { authenticate, json, type ApiDeps } from './context.js';

/** `POST /{upload_uuid}/delete`: the session is gone at once; its files go in the background. */
export const deleteUpload =
  (deps: ApiDeps): BufferedHandler =>
  async (req) => {
    const client = authenticate(deps, req);
    await deps.service.delete(client, req.params.upload_uuid!);
    return json({ status: 'started', message: 'Upload deletion started' });
  };
