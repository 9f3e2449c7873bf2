import type { BufferedHandler } from '../http/server.js';
import { authenticate, json, type ApiDeps } from './context.js';
import { parseStartBody, utcToday } from './start-body.js';

/** `POST /{upload_uuid}/start-upload`: the Connector's 2xx JSON goes back unchanged. */
export const startUpload =
  (deps: ApiDeps): BufferedHandler =>
  async (req, body) => {
    const client = authenticate(deps, req);
    const dates = parseStartBody(body, utcToday(deps.clock()));
    return json(await deps.service.start(client, req.params.upload_uuid!, dates));
  };
