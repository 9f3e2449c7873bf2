import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { errors } from '../errors.js';
import type { ObjectStore } from '../store/ports.js';
import type { Connector, WebhookPayload, WorkflowStart } from './types.js';
import { sendWebhook } from './webhook.js';

export interface EmulatedConnectorOptions {
  /** Where the session's objects were stored (the same store the uploader writes to). */
  objects: ObjectStore;
  /** Webhook signing secret (`CONNECTOR_WEBHOOK_SECRET`). */
  secret: string;
  /** From start to the completion webhook; default 3000. */
  delayMs?: number;
  /** Deadline of one webhook attempt. */
  timeoutMs: number;
  /** Rows of one stored object (NDJSON: a header line, then one line per row). */
  countRows: (body: AsyncIterable<Uint8Array>) => Promise<number>;
  /** Pauses between webhook attempts; one attempt more than delays. Default 0.5, 1, 2, 4 s. */
  retryDelaysMs?: readonly number[];
  log?: (msg: string, data: Record<string, unknown>) => void;
}

export interface EmulatedStartAnswer {
  workflow_id: string;
  status: 'started';
  /** Rows as counted in storage, per entity: the request's entities, then any only named by objects. */
  entities: { name: string; rows: number }[];
}

/** Lets the gateway's terminate answer go out before the confirming webhook arrives. */
const TERMINATE_ACK_DELAY_MS = 100;
const MAX_PROBLEMS_LISTED = 5;

interface Workflow {
  callbackUrl: string;
  timer: NodeJS.Timeout;
}

/**
 * The embedded Connector (DECISIONS.md, "With `CONNECTOR_URL` unset"). `start` counts the
 * rows of every listed object and answers at once; after `delayMs` the workflow completes
 * with `succeeded` (`Processed N rows`), or `failed` when a count differs from the request
 * or an object is missing. Only one workflow per `upload_uuid` runs at a time; a finished
 * or terminated one may be started again. State is in memory: after a restart, a workflow
 * that was running never completes and its terminate answers 404.
 */
export class EmulatedConnector implements Connector {
  readonly #opts: EmulatedConnectorOptions;
  readonly #delayMs: number;
  readonly #retryDelaysMs: readonly number[];
  /** Uploads whose start is being counted or whose workflow runs. */
  readonly #busy = new Set<string>();
  readonly #running = new Map<string, Workflow>();
  readonly #deliveries = new Set<Promise<void>>();
  readonly #closing = new AbortController();

  constructor(opts: EmulatedConnectorOptions) {
    this.#opts = opts;
    this.#delayMs = opts.delayMs ?? 3000;
    this.#retryDelaysMs = opts.retryDelaysMs ?? [500, 1000, 2000, 4000];
  }

  async start(req: WorkflowStart): Promise<EmulatedStartAnswer> {
    const uuid = req.upload_uuid;
    if (this.#closing.signal.aborted) throw errors.connectorUnreachable();
    if (this.#busy.has(uuid)) throw errors.connectorRejected('Workflow already running');
    this.#busy.add(uuid);
    try {
      const counted = await this.#count(req);
      if (this.#closing.signal.aborted) throw errors.connectorUnreachable();
      const { entities, payload } = judge(req, counted);
      const timer = setTimeout(() => {
        this.#running.delete(uuid);
        this.#busy.delete(uuid);
        this.#deliver(req.callback_url, payload, 0);
      }, this.#delayMs);
      this.#running.set(uuid, { callbackUrl: req.callback_url, timer });
      return { workflow_id: randomUUID(), status: 'started', entities };
    } catch (err) {
      this.#busy.delete(uuid);
      throw err;
    }
  }

  async terminate(uploadUuid: string): Promise<void> {
    const wf = this.#running.get(uploadUuid);
    if (!wf) throw errors.workflowStopFailed(404);
    clearTimeout(wf.timer);
    this.#running.delete(uploadUuid);
    this.#busy.delete(uploadUuid);
    const payload: WebhookPayload = {
      upload_uuid: uploadUuid,
      is_terminated: true,
      status: 'terminated',
      message: 'Workflow terminated',
    };
    this.#deliver(wf.callbackUrl, payload, TERMINATE_ACK_DELAY_MS);
  }

  /** Cancels pending completions and webhook deliveries (in flight ones are aborted). */
  async close(): Promise<void> {
    this.#closing.abort();
    for (const wf of this.#running.values()) clearTimeout(wf.timer);
    this.#running.clear();
    this.#busy.clear();
    await Promise.allSettled([...this.#deliveries]);
  }

  /** Rows per object key; null for a missing object. */
  async #count(req: WorkflowStart): Promise<Map<string, number | null>> {
    const counted = new Map<string, number | null>();
    for (const { key } of req.objects) {
      try {
        const body = await this.#opts.objects.get(key);
        counted.set(key, body === null ? null : await this.#opts.countRows(body));
      } catch (err) {
        this.#opts.log?.('connector emulator: cannot read stored object', { upload_uuid: req.upload_uuid, key, err });
        throw errors.connectorError(500, 'Connector could not read the stored objects');
      }
    }
    return counted;
  }

  #deliver(url: string, payload: WebhookPayload, initialDelayMs: number): void {
    const { signal } = this.#closing;
    const run = async (): Promise<void> => {
      if (initialDelayMs > 0) await sleep(initialDelayMs, undefined, { signal });
      for (let attempt = 0; ; attempt++) {
        let failure: unknown;
        try {
          const status = await sendWebhook({ url, secret: this.#opts.secret, payload, timeoutMs: this.#opts.timeoutMs, signal });
          if (status < 300) return;
          if (!isRetryable(status)) {
            this.#opts.log?.('connector emulator: webhook refused', { upload_uuid: payload.upload_uuid, status });
            return;
          }
          failure = status;
        } catch (err) {
          if (signal.aborted) return;
          failure = err;
        }
        const pause = this.#retryDelaysMs[attempt];
        if (pause === undefined) {
          this.#opts.log?.('connector emulator: webhook undelivered', { upload_uuid: payload.upload_uuid, attempts: attempt + 1, failure });
          return;
        }
        await sleep(pause, undefined, { signal });
      }
    };
    const delivery: Promise<void> = run()
      .catch(() => undefined) // only an aborted sleep rejects: closing
      .finally(() => this.#deliveries.delete(delivery));
    this.#deliveries.add(delivery);
  }
}

function isRetryable(status: number): boolean {
  return status === 408 || status === 429 || status >= 500;
}

/** Compares the counts with the request and builds the answer's entities and the completion webhook. */
function judge(
  req: WorkflowStart,
  counted: Map<string, number | null>,
): { entities: EmulatedStartAnswer['entities']; payload: WebhookPayload } {
  const problems: string[] = [];
  const perEntity = new Map<string, number>(req.entities.map((e) => [e.name, 0]));
  let total = 0;
  for (const obj of req.objects) {
    const rows = counted.get(obj.key) ?? null;
    if (rows === null) problems.push(`object ${obj.key} is missing`);
    else if (rows !== obj.rows) problems.push(`object ${obj.key} declared ${obj.rows} rows, found ${rows}`);
    perEntity.set(obj.entity, (perEntity.get(obj.entity) ?? 0) + (rows ?? 0));
    total += rows ?? 0;
  }
  for (const e of req.entities) {
    const rows = perEntity.get(e.name) ?? 0;
    if (rows !== e.rows) problems.push(`entity ${e.name} declared ${e.rows} rows, found ${rows}`);
  }
  const entities = [...perEntity].map(([name, rows]) => ({ name, rows }));
  const base = { upload_uuid: req.upload_uuid, is_terminated: false };
  if (problems.length === 0) return { entities, payload: { ...base, status: 'succeeded', message: `Processed ${total} rows` } };
  const listed = problems.slice(0, MAX_PROBLEMS_LISTED).join('; ');
  const more = problems.length > MAX_PROBLEMS_LISTED ? ` (and ${problems.length - MAX_PROBLEMS_LISTED} more)` : '';
  return { entities, payload: { ...base, status: 'failed', message: `Row count mismatch: ${listed}${more}` } };
}
