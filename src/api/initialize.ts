import type { BufferedHandler } from '../http/server.js';
import { authenticate, json, type ApiDeps } from './context.js';

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
