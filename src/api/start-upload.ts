import { ConnectorJson } from '../connector/types.js';
import { errors, STORAGE_RETRY_AFTER_SECONDS } from '../errors.js';
import type { BufferedHandler } from '../http/server.js';
import { authenticate, json, type ApiDeps } from './context.js';
import { parseStartBody, utcToday } from './start-body.js';
import { clientResponses, error, jsonResponse, NOT_UPLOADING, parameter, q, qe, RETRY_AFTER, schema, sessionAccess, UNREACHABLE } from './openapi-shared.js';
import { API_BASE, type RouteDeclaration } from './route.js';

/** `POST /{upload_uuid}/start-upload`: the Connector's 2xx JSON goes back unchanged. */
export const startUpload =
  (deps: ApiDeps): BufferedHandler =>
  async (req, body) => {
    const client = authenticate(deps, req);
    const dates = parseStartBody(body, utcToday(deps.clock()));
    const answer = await deps.service.start(client, req.params.upload_uuid!, dates);
    return answer instanceof ConnectorJson ? { status: 200, body: answer.text, raw: { contentType: 'application/json' } } : json(answer);
  };

export const startUploadRoute: RouteDeclaration<ApiDeps> = {
  method: 'POST',
  pattern: `${API_BASE}/:upload_uuid/start-upload`,
  body: 'buffered',
  handler: startUpload,
  schema: {
    operationId: 'startUpload',
    tags: ['uploading'],
    summary: 'Start the Connector',
    description:
      'Hands the stored data to the Connector for the date range; the session becomes `STARTED`. Checks, first ' +
      'failing one answers: state 409; body 422 (also `date_from` after `date_to`, or `date_to` not before today, ' +
      'UTC); `date_from` before the client\'s minimum 400; no entities 400; storage writes pending 409; the Connector.',
    parameters: [parameter('UploadUuid')],
    requestBody: {
      required: true,
      content: {
        'application/json': { schema: schema('StartUploadRequest'), example: { date_from: '2024-01-01', date_to: '2024-01-31' } },
      },
    },
    responses: clientResponses({
      '200': jsonResponse('The Connector\'s JSON answer, unchanged.', schema('ConnectorStartResponse')),
      ...sessionAccess([`${qe(errors.dateBeforeMinimum('YYYY-MM-DD'))} (the configured minimum)`, q('NO_ENTITIES')]),
      '409': jsonResponse(
        [
          `- ${NOT_UPLOADING}: structured \`detail\``,
          `- ${q('UPLOAD_TASKS_IN_PROGRESS')}: until \`upload_tasks_finished\``,
          `- The Connector rejected the start: its text, or ${q('CONNECTOR_REJECTED')}`,
        ].join('\n'),
        { anyOf: [schema('InvalidSessionStatusError'), schema('UploadTasksInProgressError'), schema('ErrorDetail')] },
      ),
      '422': error(['Invalid `date_from` or `date_to`'], 'ValidationError'),
      '500': error(['The Connector\'s 500 (its text), or an internal error']),
      '502': error([UNREACHABLE, q('CONNECTOR_ERROR')]),
      '503': {
        ...error([
          `${q('RATE_LIMITED')}: over the client IP's rate or connection limit`,
          `${q('STORAGE_UNAVAILABLE')}: state or queue unreadable or unwritable for now; nothing started (docs/api.md#storage-unavailable)`,
          'The Connector\'s 503, forwarded with its text',
        ]),
        headers: {
          'Retry-After': {
            ...RETRY_AFTER,
            description: `${RETRY_AFTER.description} ${STORAGE_RETRY_AFTER_SECONDS} with ${q('STORAGE_UNAVAILABLE')}; the Connector's own, else 5, with its 503.`,
          },
        },
      },
      default: error(['Any other Connector error status (400–599), forwarded (with the Connector\'s `Retry-After` when it sends one)']),
    }),
  },
};
