import { createHash } from 'node:crypto';
import { parseWebhookPayload, verifyWebhook } from '../connector/webhook.js';
import { errors } from '../errors.js';
import type { BufferedHandler } from '../http/server.js';
import { json, type ApiDeps } from './context.js';

/**
 * `POST /webhooks/upload-finished`: the Connector's signed completion call. A repeat or a
 * late one (session no longer STARTED) changes nothing and answers `ignored`; so does a
 * replay of a signed request already applied, even once the session runs a new workflow.
 */
export const uploadFinished =
  (deps: ApiDeps): BufferedHandler =>
  async (req, body) => {
    const timestamp = req.headers.get('x-connector-timestamp');
    const verified = verifyWebhook({
      secret: deps.webhook.secret,
      timestampHeader: timestamp,
      signatureHeader: req.headers.get('x-connector-signature'),
      rawBody: body,
      nowSeconds: Math.floor(deps.clock() / 1000),
      toleranceSeconds: deps.webhook.toleranceSeconds,
    });
    if (!verified) throw errors.webhookUnauthorized();
    const parsed = parseWebhookPayload(body);
    if (!parsed.ok) throw errors.validationFailed(parsed.issues);
    // What the signature covers, so a re-encoded signature header is the same request.
    const id = createHash('sha256').update(`${timestamp}.`).update(body).digest('hex');
    const until = (Number(timestamp) + deps.webhook.toleranceSeconds) * 1000;
    const outcome = await deps.service.applyWebhook(parsed.value.upload_uuid, { ...parsed.value, replay: { id, until } });
    return json({ status: outcome });
  };
