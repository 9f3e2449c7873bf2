import { parseWebhookPayload, verifyWebhook } from '../connector/webhook.js';
import { errors } from '../errors.js';
import type { BufferedHandler } from '../http/server.js';
import { json, type ApiDeps } from './context.js';

/**
 * `POST /webhooks/upload-finished`: the Connector's signed completion call. A repeat or a
 * late one (session no longer STARTED) changes nothing and answers `ignored`.
 */
export const uploadFinished =
  (deps: ApiDeps): BufferedHandler =>
  async (req, body) => {
    const verified = verifyWebhook({
      secret: deps.webhook.secret,
      timestampHeader: req.headers.get('x-connector-timestamp'),
      signatureHeader: req.headers.get('x-connector-signature'),
      rawBody: body,
      nowSeconds: Math.floor(deps.clock() / 1000),
      toleranceSeconds: deps.webhook.toleranceSeconds,
    });
    if (!verified) throw errors.webhookUnauthorized();
    const parsed = parseWebhookPayload(body);
    if (!parsed.ok) throw errors.validationFailed(parsed.issues);
    const outcome = await deps.service.applyWebhook(parsed.value.upload_uuid, parsed.value);
    return json({ status: outcome });
  };
