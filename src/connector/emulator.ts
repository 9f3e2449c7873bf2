import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { errors, isStorageUnavailable } from '../errors.js';
import type { ObjectStore } from '../store/ports.js';
import type { Connector, WebhookPayload, WorkflowObject, WorkflowStart } from './types.js';
import { sendWebhook } from './webhook.js';
import { writeFileAtomic } from '../durable-file.js';
import { loadState, STATE_VERSION, type WorkflowRecord } from './emulator/state-file.js';
import { Tally } from './emulator/tally.js';

export interface EmulatedConnectorOptions {
  /** Where the session's objects were stored (the same store the uploader writes to). */
  objects: ObjectStore;
  /** Webhook signing secret (`CONNECTOR_WEBHOOK_SECRET`). */
  secret: string;
  /** From start to the completion webhook (`connector.emulatorDelayMs`). */
  delayMs: number;
  /** Deadline of one webhook attempt. */
  timeoutMs: number;
  /** Rows of one stored object (NDJSON: a header line, then one line per row). */
  countRows: (body: AsyncIterable<Uint8Array>) => Promise<number>;
  /** Pauses between webhook attempts, the last one repeated until it is delivered. Default 0.5, 1, 2, 4 s. */
  retryDelaysMs?: readonly number[];
  /**
   * JSON file keeping the workflows not yet done, so they survive a restart (rewritten
   * whole on every change: temp file, fsync, rename, directory fsync). Without it the
   * state is in memory only.
   */
  stateFile?: string;
  /**
   * The gateway's webhook URL as of now. Workflows restored from `stateFile` send their
   * webhook there (asked at each attempt) instead of to their saved `callback_url`, which
   * names the previous process's address (a port bound as 0 changes across restarts).
   */
  callbackUrl?: () => string;
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
/** Restored work waits this long after `open`, so the gateway's webhook endpoint can come up first. */
const RESUME_DELAY_MS = 100;

interface Scheduled {
  workflowId: string;
  timer: NodeJS.Timeout;
}

/**
 * The embedded Connector (docs/api.md, The Connector: "Without `CONNECTOR_URL`"). `start` counts the
 * rows of every listed object and answers at once; after `delayMs` the workflow completes
 * with `succeeded` (`Processed N rows`), or `failed` when a count differs from the request
 * or an object is missing. Only one workflow per `upload_uuid` runs at a time; a finished
 * or terminated one may be started again.
 *
 * With `stateFile`, every workflow not yet done is saved before `start` / `terminate`
 * answer (a start that cannot be saved fails: with the disk full or failing as the storage
 * error itself, 503 at the edge, else 500; other failed saves are logged and carried by the
 * next write), and `open` resumes them: a running one completes at its due time (100 ms after
 * `open` when that has passed) and can be terminated until then; a webhook that was being
 * sent is sent again 100 ms after `open` (the gateway ignores a repeat): at least once.
 * Restored workflows send to `callbackUrl()` when given, else to their saved `callback_url`.
 *
 * The state file's records and their reading are in emulator/state-file.ts; the counting
 * and judging of a start's objects in emulator/tally.ts.
 */
export class EmulatedConnector implements Connector {
  readonly #opts: EmulatedConnectorOptions;
  readonly #delayMs: number;
  readonly #retryDelaysMs: readonly number[];
  /** Uploads whose start is being counted or whose workflow runs. */
  readonly #busy = new Set<string>();
  /** Running workflows' completion timers, by upload. */
  readonly #running = new Map<string, Scheduled>();
  /**
   * Every workflow not yet done, by workflow id (an upload may be started again while the
   * previous workflow's webhook is still being retried). What the state file holds.
   */
  readonly #workflows = new Map<string, WorkflowRecord>();
  /** Workflows loaded from the state file: see `callbackUrl`. */
  readonly #restored = new WeakSet<WorkflowRecord>();
  readonly #deliveries = new Set<Promise<void>>();
  readonly #closing = new AbortController();
  /** Settles after the last requested state write. */
  #writeTail: Promise<void> = Promise.resolve();
  /** A write requested but not begun: later changes join it. */
  #queuedWrite: Promise<void> | null = null;

  private constructor(opts: EmulatedConnectorOptions) {
    this.#opts = opts;
    this.#delayMs = opts.delayMs;
    this.#retryDelaysMs = opts.retryDelaysMs ?? [500, 1000, 2000, 4000];
  }

  /**
   * Creates the emulator and, with `stateFile`, resumes the workflows saved there. A
   * missing file, or one that does not parse, starts empty (logged; an unparsable file is
   * kept aside as `<stateFile>.corrupt-<epoch ms>`). Other read errors reject.
   */
  static async open(opts: EmulatedConnectorOptions): Promise<EmulatedConnector> {
    const c = new EmulatedConnector(opts);
    if (opts.stateFile !== undefined) await c.#restore(await loadState(opts.stateFile, opts.log));
    return c;
  }

  async start(req: WorkflowStart): Promise<EmulatedStartAnswer> {
    const uuid = req.upload_uuid;
    if (this.#closing.signal.aborted) throw errors.connectorUnreachable();
    if (this.#busy.has(uuid)) throw errors.connectorRejected('Workflow already running');
    this.#busy.add(uuid);
    try {
      const { entities, payload } = await this.#judge(req);
      if (this.#closing.signal.aborted) throw errors.connectorUnreachable();
      const wf: WorkflowRecord = {
        upload_uuid: uuid,
        workflow_id: randomUUID(),
        callback_url: req.callback_url,
        due_at: Date.now() + this.#delayMs,
        phase: 'running',
        outcome: payload,
      };
      this.#workflows.set(wf.workflow_id, wf);
      try {
        await this.#save();
      } catch (err) {
        this.#workflows.delete(wf.workflow_id);
        this.#opts.log?.('connector emulator: cannot save state', { upload_uuid: uuid, file: this.#opts.stateFile, err });
        // Its state is the service's own disk: a full or failing one is 503 as any other write there.
        if (isStorageUnavailable(err)) throw err;
        throw errors.connectorError(500, 'Connector could not record the workflow');
      }
      // Closed while saving: the saved workflow resumes at the next open.
      if (!this.#closing.signal.aborted) this.#schedule(wf);
      return { workflow_id: wf.workflow_id, status: 'started', entities };
    } catch (err) {
      this.#busy.delete(uuid);
      throw err;
    }
  }

  async terminate(uploadUuid: string): Promise<void> {
    const scheduled = this.#running.get(uploadUuid);
    const wf = scheduled && this.#workflows.get(scheduled.workflowId);
    if (!scheduled || !wf) throw errors.workflowStopFailed(404);
    clearTimeout(scheduled.timer);
    this.#running.delete(uploadUuid);
    this.#busy.delete(uploadUuid);
    wf.phase = 'terminating';
    this.#deliver(wf, TERMINATE_ACK_DELAY_MS);
    await this.#saveOrLog(wf);
  }

  /**
   * Cancels pending completions and webhook deliveries (in flight ones are aborted) and
   * waits for state writes. Saved workflows stay saved: the next `open` resumes them.
   */
  async close(): Promise<void> {
    this.#closing.abort();
    for (const s of this.#running.values()) clearTimeout(s.timer);
    this.#running.clear();
    this.#busy.clear();
    await Promise.allSettled([...this.#deliveries]);
    await this.#writeTail;
  }

  async #restore(saved: WorkflowRecord[]): Promise<void> {
    let dropped = 0;
    for (const wf of saved) {
      if (this.#workflows.has(wf.workflow_id) || (wf.phase === 'running' && this.#running.has(wf.upload_uuid))) {
        this.#opts.log?.('connector emulator: duplicate saved workflow dropped', { upload_uuid: wf.upload_uuid, workflow_id: wf.workflow_id });
        dropped++;
        continue;
      }
      this.#workflows.set(wf.workflow_id, wf);
      this.#restored.add(wf);
      if (wf.phase === 'running') this.#schedule(wf, RESUME_DELAY_MS);
      else this.#deliver(wf, RESUME_DELAY_MS);
    }
    this.#opts.log?.('connector emulator: workflows restored', { file: this.#opts.stateFile, count: this.#workflows.size });
    if (dropped > 0) await this.#saveOrLog();
  }

  /** Completes `wf` at its due time, or after `minDelayMs` when that is later. */
  #schedule(wf: WorkflowRecord, minDelayMs = 0): void {
    const timer = setTimeout(() => {
      this.#running.delete(wf.upload_uuid);
      this.#busy.delete(wf.upload_uuid);
      wf.phase = 'completing';
      void this.#saveOrLog(wf);
      this.#deliver(wf, 0);
    }, Math.max(minDelayMs, wf.due_at - Date.now()));
    this.#running.set(wf.upload_uuid, { workflowId: wf.workflow_id, timer });
    this.#busy.add(wf.upload_uuid);
  }

  /**
   * Reads every object the request names (inline, or in its manifest), counts its rows and
   * compares them with the request: the answer's entities and the completion webhook.
   */
  async #judge(req: WorkflowStart): Promise<{ entities: EmulatedStartAnswer['entities']; payload: WebhookPayload }> {
    const tally = new Tally(req);
    try {
      for await (const obj of this.#objectsOf(req, tally)) {
        const body = await this.#opts.objects.get(obj.key);
        tally.add(obj, body === null ? null : await this.#opts.countRows(body));
      }
    } catch (err) {
      this.#opts.log?.('connector emulator: cannot read stored objects', { upload_uuid: req.upload_uuid, err });
      // The objects are the service's own storage: one that cannot be read for now is 503.
      if (isStorageUnavailable(err)) throw err;
      throw errors.connectorError(500, 'Connector could not read the stored objects');
    }
    return tally.judge();
  }

  /**
   * The request's objects: inline, or from its manifest object (whose size and count are
   * checked too). The manifest is read whole first (about 150 bytes an object): a stream left
   * open while every object is read would idle into the store's socket timeout.
   */
  async *#objectsOf(req: WorkflowStart, tally: Tally): AsyncIterable<WorkflowObject> {
    yield* req.objects;
    if (!req.manifest) return;
    const body = await this.#opts.objects.get(req.manifest.key);
    if (body === null) {
      tally.problem(`manifest ${req.manifest.key} is missing`);
      return;
    }
    const chunks: Buffer[] = [];
    for await (const chunk of body) chunks.push(Buffer.from(chunk));
    const text = Buffer.concat(chunks);
    if (text.byteLength !== req.manifest.bytes) tally.problem(`manifest declared ${req.manifest.bytes} bytes, found ${text.byteLength}`);
    let count = 0;
    for (let start = 0; start < text.byteLength; ) {
      let end = text.indexOf(0x0a, start);
      if (end < 0) end = text.byteLength;
      const line = text.toString('utf8', start, end);
      start = end + 1;
      if (line.trim() === '') continue;
      count++;
      yield JSON.parse(line) as WorkflowObject;
    }
    if (count !== req.manifest.objects) tally.problem(`manifest declared ${req.manifest.objects} objects, found ${count}`);
  }

  /**
   * Sends the webhook of `wf`'s phase (its outcome, or the terminate confirmation), again
   * until it is delivered or refused (a 4xx other than 408 and 429); then forgets `wf`.
   * Closing aborts it and keeps `wf`.
   */
  #deliver(wf: WorkflowRecord, initialDelayMs: number): void {
    const { signal } = this.#closing;
    const restored = this.#restored.has(wf);
    const current = restored ? this.#opts.callbackUrl : undefined;
    const lastPause = this.#retryDelaysMs.at(-1) ?? 1000;
    // With its workflow's id (a field the gateway ignores): two workflows of one upload, their
    // webhooks sent within one second, would otherwise be one signed request, the second ignored as a replay.
    const payload: WebhookPayload & { workflow_id: string } = {
      ...(wf.phase === 'terminating'
        ? { upload_uuid: wf.upload_uuid, is_terminated: true, status: 'terminated', message: 'Workflow terminated' }
        : wf.outcome),
      workflow_id: wf.workflow_id,
    };
    /** True when done with (delivered or given up), false when aborted by close. */
    const run = async (): Promise<boolean> => {
      if (initialDelayMs > 0) await sleep(initialDelayMs, undefined, { signal });
      for (let attempt = 0; ; attempt++) {
        let failure: unknown;
        try {
          const url = current ? current() : wf.callback_url;
          const status = await sendWebhook({ url, secret: this.#opts.secret, payload, timeoutMs: this.#opts.timeoutMs, signal });
          if (status < 300) return true;
          if (!isRetryable(status)) {
            this.#opts.log?.('connector emulator: webhook refused', { upload_uuid: payload.upload_uuid, status });
            return true;
          }
          failure = status;
        } catch (err) {
          if (signal.aborted) return false;
          failure = err;
        }
        // Past the retry pauses it goes on at the last one, as long as the answer says "later"
        // (the gateway's 503 while its storage is out, a gateway not listening yet): giving up
        // would leave the session STARTED for good, with nothing left to terminate.
        const pause = this.#retryDelaysMs[attempt] ?? lastPause;
        if (attempt === this.#retryDelaysMs.length) {
          this.#opts.log?.('connector emulator: webhook undelivered', { upload_uuid: payload.upload_uuid, attempts: attempt + 1, failure, retry_every_ms: lastPause });
        }
        await sleep(pause, undefined, { signal });
      }
    };
    const delivery: Promise<void> = run()
      .catch(() => false) // only an aborted sleep rejects: closing
      .then(async (done) => {
        if (!done) return;
        this.#workflows.delete(wf.workflow_id);
        await this.#saveOrLog(wf);
      })
      .finally(() => this.#deliveries.delete(delivery));
    this.#deliveries.add(delivery);
  }

  /**
   * Writes the state file with every change made before the write begins. Writes run one
   * at a time; changes made while one runs share the next. No-op without `stateFile`.
   */
  #save(): Promise<void> {
    const file = this.#opts.stateFile;
    if (file === undefined) return Promise.resolve();
    if (this.#queuedWrite) return this.#queuedWrite;
    const write = this.#writeTail.then(() => {
      this.#queuedWrite = null;
      const state = { version: STATE_VERSION, workflows: [...this.#workflows.values()] };
      return writeFileAtomic(file, `${JSON.stringify(state)}\n`);
    });
    this.#queuedWrite = write;
    this.#writeTail = write.catch(() => undefined);
    return write;
  }

  /** `#save`, logging a failure: the change stays in memory and the next write carries it. */
  async #saveOrLog(wf?: WorkflowRecord): Promise<void> {
    try {
      await this.#save();
    } catch (err) {
      this.#opts.log?.('connector emulator: cannot save state', { upload_uuid: wf?.upload_uuid, file: this.#opts.stateFile, err });
    }
  }
}

function isRetryable(status: number): boolean {
  return status === 408 || status === 429 || status >= 500;
}
