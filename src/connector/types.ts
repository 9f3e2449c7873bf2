/**
 * The Connector: the outside system that runs an upload's workflow once start-upload hands
 * it the session's stored objects, and reports the end through the signed completion
 * webhook. Two implementations pass the same interface: `HttpConnector` (real service at
 * `CONNECTOR_URL`) and `EmulatedConnector` (embedded default). Every failure is a
 * `ServiceError` from `errors.ts`, ready to be answered as is.
 */

/** Body of `POST {CONNECTOR_URL}/workflows` (docs/api.md, "The Connector"). */
export interface WorkflowStart {
  upload_uuid: string;
  client_id: string;
  /** `YYYY-MM-DD`. */
  date_from: string;
  /** `YYYY-MM-DD`. */
  date_to: string;
  /** One per entity uploaded in the session, in order of first upload. */
  entities: { name: string; packages: number; rows: number }[];
  /**
   * Every stored object of the session; `rows` and `bytes` are what the gateway stored. Empty
   * when the session holds more than 1,000 objects: then `manifest` names them.
   */
  objects: WorkflowObject[];
  /**
   * Only past 1,000 objects: an NDJSON object stored beside the session's objects, one
   * `WorkflowObject` per line, written before the start call; `objects` lines, `bytes` bytes.
   */
  manifest?: { key: string; objects: number; bytes: number };
  /** Absolute URL of the completion webhook, `.../api/v1/uploading/webhooks/upload-finished`. */
  callback_url: string;
}

export interface WorkflowObject {
  entity: string;
  key: string;
  rows: number;
  bytes: number;
}

/**
 * A Connector's 2xx answer as it came, checked to be JSON: the client gets these bytes, since
 * a parse and a serialisation would change some (`1.0` as `1`, an integer past 2^53 rounded).
 */
export class ConnectorJson {
  constructor(readonly text: string) {}
}

export interface Connector {
  /**
   * Starts the workflow of one upload. Resolves with the Connector's 2xx JSON body (over HTTP
   * a `ConnectorJson`, its bytes; the emulator's own answer as a value), to be answered to the
   * client unchanged with 200. Throws:
   * - `CONNECTOR_REJECTED` (409): the Connector answered 409; message is its `detail` or
   *   `message` (when a string), else its trimmed body text, else
   *   `Connector rejected the upload start, please contact support`;
   * - `CONNECTOR_ERROR` with the Connector's status: any other status 400–599, message
   *   extracted the same way (fallback `Connector error`);
   * - `CONNECTOR_ERROR` 502 `Invalid response from Connector service`: a 2xx that is not
   *   JSON (or is larger than the read limit), or any status that is neither 2xx nor
   *   400–599 (redirects are not followed);
   * - `CONNECTOR_UNREACHABLE` (502): no connection, reset, DNS failure, or no answer
   *   within the configured timeout.
   */
  start(req: WorkflowStart): Promise<unknown>;
  /**
   * Asks the Connector to stop the workflow of `uploadUuid`; the Connector confirms later
   * through the webhook with `is_terminated: true`. Resolves on 2xx. Throws
   * `WORKFLOW_STOP_FAILED` (`Failed to stop workflow`) with 404 for 404, 409 for 409, and
   * 500 for every other non-2xx answer (500 included); `CONNECTOR_UNREACHABLE` (502) when
   * there is no connection or no answer within the timeout.
   */
  terminate(uploadUuid: string): Promise<void>;
  /**
   * Releases connections and timers. Calls in flight finish (each within its timeout) or
   * fail with `CONNECTOR_UNREACHABLE`, as do later calls.
   */
  close(): Promise<void>;
}

/**
 * Body of the completion webhook (docs/api.md, "The completion webhook"). Only
 * `upload_uuid` and `is_terminated` are required; unknown fields are ignored.
 */
export interface WebhookPayload {
  upload_uuid: string;
  is_terminated: boolean;
  status?: 'succeeded' | 'failed' | 'terminated';
  message?: string;
}
