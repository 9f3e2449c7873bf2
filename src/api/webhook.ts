import { createHash } from 'node:crypto';
import { parseWebhookPayload, replayRememberedUntilMs, verifyWebhook } from '../connector/webhook.js';
import { errors } from '../errors.js';
import type { BufferedHandler } from '../http/server.js';
import { json, type ApiDeps } from './context.js';
import { error, jsonResponse, parameter, q, schema, shared } from './openapi-shared.js';
import { API_BASE, type RouteDeclaration } from './route.js';

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
    const until = replayRememberedUntilMs(timestamp ?? '', deps.webhook.toleranceSeconds);
    const outcome = await deps.service.applyWebhook(parsed.value.upload_uuid, { ...parsed.value, replay: { id, until } });
    return json({ status: outcome });
  };

export const uploadFinishedRoute: RouteDeclaration<ApiDeps> = {
  method: 'POST',
  pattern: `${API_BASE}/webhooks/upload-finished`,
  body: 'buffered',
  handler: uploadFinished,
  schema: {
    operationId: 'uploadFinished',
    tags: ['connector'],
    summary: 'Connector completion webhook',
    description:
      'Called by the Connector when a workflow ends: `is_terminated: true` (or `status` `terminated` or `failed`) ' +
      'returns a `STARTED` session to `UPLOADING`, else `DONE`. Signed, not client-authenticated (docs/api.md#the-completion-webhook).',
    security: [],
    parameters: [parameter('ConnectorTimestamp'), parameter('ConnectorSignature')],
    requestBody: { required: true, content: { 'application/json': { schema: schema('UploadFinishedPayload') } } },
    responses: {
      '200': jsonResponse('`ok`: applied; `ignored`: the session was not `STARTED`.', schema('WebhookResult')),
      '401': error([`${q('WEBHOOK_UNAUTHORIZED')}: bad signature or timestamp`]),
      '404': error([`${q('SESSION_NOT_FOUND')}: unknown \`upload_uuid\``]),
      '408': shared('RequestTimeout'),
      '413': shared('PayloadTooLarge'),
      '422': error(['The body is not a valid payload'], 'ValidationError'),
      '500': shared('InternalError'),
      '503': shared('Unavailable'),
    },
  },
};
