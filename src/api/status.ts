import type { BufferedHandler } from '../http/server.js';
import { authenticate, json, type ApiDeps } from './context.js';

/** `GET /{upload_uuid}/status`: any session stored for this client, active or not. */
export const sessionStatus =
  (deps: ApiDeps): BufferedHandler =>
  async (req) => {
    const client = authenticate(deps, req);
    return json(await deps.service.status(client, req.params.upload_uuid!));
  };
