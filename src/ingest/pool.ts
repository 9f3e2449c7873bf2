/**
 * The validation worker pool and the per-request ingest sink in front of it.
 *
 * This sink buffers the whole body and validates it in one task. The interface is the
 * streaming one, so that a splitter feeding workers row chunks can replace it without
 * touching callers.
 */
import { Buffer } from 'node:buffer';
import { availableParallelism } from 'node:os';
import { Piscina } from 'piscina';
import type { ValidateResult, ValidateTask } from '../../workers/validate.js';
import type { EntitySpec } from '../entities/catalog.js';
import { errors, isServiceError, type ServiceError } from '../errors.js';
import type { PackageWriter } from '../store/ports.js';

export const DEFAULT_BATCH_BYTES = 512 * 1024;

export interface ValidationPoolOptions {
  /** Worker threads; 0 = one per core. */
  workers: number;
  /** Tasks that may wait for a free worker; beyond them `end()` fails with RATE_LIMITED (503). */
  maxQueue: number;
  /** Upper bound of one stored batch in bytes (whole NDJSON lines); default 512 KiB. */
  batchBytes?: number;
  /** Worker module, as a path or file URL; defaults to `workers/validate.js`. Tests wrap it. */
  filename?: string;
  /**
   * Worker failures that belong to no task (piscina's pool `error` event). Failures of a
   * task reject that task's `end()` instead.
   */
  onError?: (err: unknown) => void;
}

export interface IngestResult {
  rows: number;
  /** Encoded bytes appended to the writer. */
  bytes: number;
  columns: string[];
  writer: PackageWriter;
}

export interface IngestSink {
  /** A body chunk; copy it if kept past the call (uWS reuses the memory). false = caller should pause until onDrain fires. */
  write(chunk: Uint8Array): boolean;
  onDrain(cb: () => void): void;
  /**
   * Body complete. Resolves when every row passed and every batch was appended to the
   * writer (NOT committed: the caller commits). Rejects with a ServiceError:
   * INVALID_PAYLOAD or VALIDATION_FAILED (422), BODY_TOO_LARGE past `maxBodyBytes`,
   * RATE_LIMITED when the pool's queue is full, whatever ServiceError `open` or the
   * writer threw, else INTERNAL (worker crash, store failure, `abort()`; `cause` says which).
   * On any rejection the writer, if opened, has been aborted. Calling it again returns
   * the same promise.
   */
  end(): Promise<IngestResult>;
  /**
   * Client went away: release buffered chunks, cancel the task (AbortSignal to piscina),
   * abort the writer. Later writes are ignored. A no-op once `end()` has resolved: the
   * writer is then the caller's.
   */
  abort(): void;
}

export interface IngestOptions {
  entity: EntitySpec;
  /** Opens the package once the body is valid, with the client's columns. */
  open: (columns: string[]) => Promise<PackageWriter>;
  maxBodyBytes?: number;
}

const WORKER = new URL('../../workers/validate.js', import.meta.url).href;

export class ValidationPool {
  readonly #pool: Piscina<ValidateTask, ValidateResult>;
  readonly #batchBytes: number;
  // Admission is counted here rather than left to piscina's maxQueue, whose errors carry no code.
  #inFlight = 0;
  readonly #capacity: number;

  constructor(options: ValidationPoolOptions) {
    const { workers, maxQueue, batchBytes = DEFAULT_BATCH_BYTES, filename = WORKER, onError = () => {} } = options;
    requireInteger('workers', workers, 0);
    requireInteger('maxQueue', maxQueue, 0);
    requireInteger('batchBytes', batchBytes, 1);
    const threads = workers === 0 ? availableParallelism() : workers;
    this.#batchBytes = batchBytes;
    this.#capacity = threads + maxQueue;
    this.#pool = new Piscina({ filename, minThreads: threads, maxThreads: threads });
    this.#pool.on('error', onError);
  }

  createIngest(options: IngestOptions): IngestSink {
    return new BufferedIngest(options, async (body, signal) => {
      if (this.#inFlight >= this.#capacity) throw errors.rateLimited(1);
      const task: ValidateTask = { body, entity: options.entity.name, batchBytes: this.#batchBytes };
      this.#inFlight++;
      try {
        return await this.#pool.run(task, { transferList: [body], signal });
      } finally {
        this.#inFlight--;
      }
    });
  }

  /** Stops every worker; tasks in flight reject. */
  destroy(): Promise<void> {
    return this.#pool.destroy();
  }
}

type RunTask = (body: ArrayBuffer, signal: AbortSignal) => Promise<ValidateResult>;

class BufferedIngest implements IngestSink {
  readonly #options: IngestOptions;
  readonly #run: RunTask;
  readonly #abort = new AbortController();
  /** null once released: ended, aborted, or over the size limit. */
  #chunks: Uint8Array[] | null = [];
  #size = 0;
  #ended: Promise<IngestResult> | null = null;
  #settled = false;

  constructor(options: IngestOptions, run: RunTask) {
    this.#options = options;
    this.#run = run;
  }

  write(chunk: Uint8Array): boolean {
    if (this.#chunks === null) return true;
    this.#size += chunk.byteLength;
    if (this.#options.maxBodyBytes !== undefined && this.#size > this.#options.maxBodyBytes) {
      this.#chunks = null;
    } else {
      this.#chunks.push(chunk.slice());
    }
    return true;
  }

  /** Never fires: this sink buffers everything and `write` never asks for a pause. */
  onDrain(_cb: () => void): void {}

  end(): Promise<IngestResult> {
    this.#ended ??= this.#finish().finally(() => {
      this.#settled = true;
    });
    return this.#ended;
  }

  abort(): void {
    if (this.#settled || this.#abort.signal.aborted) return;
    this.#chunks = null;
    this.#abort.abort();
  }

  async #finish(): Promise<IngestResult> {
    const { signal } = this.#abort;
    const chunks = this.#chunks;
    this.#chunks = null;
    if (signal.aborted) throw aborted(signal);
    if (chunks === null) throw errors.bodyTooLarge();

    let result: ValidateResult;
    try {
      result = await this.#run(join(chunks, this.#size), signal);
    } catch (err) {
      throw signal.aborted ? aborted(signal) : asServiceError(err);
    }
    if (!result.ok) {
      throw result.kind === 'payload' ? errors.invalidPayload(result.message) : errors.validationFailed(result.issues);
    }

    let writer: PackageWriter | undefined;
    try {
      signal.throwIfAborted();
      writer = await this.#options.open(result.columns);
      for (const batch of result.batches) {
        signal.throwIfAborted();
        await writer.append(new Uint8Array(batch));
      }
      signal.throwIfAborted();
    } catch (err) {
      // The failure that got us here is the one to report, not a failing abort.
      await writer?.abort().catch(() => {});
      throw signal.aborted ? aborted(signal) : asServiceError(err);
    }
    return { rows: result.rows, bytes: result.bytes, columns: result.columns, writer };
  }
}

/** One ArrayBuffer of exactly `size` bytes, not from Buffer's shared pool: it is transferred. */
function join(chunks: readonly Uint8Array[], size: number): ArrayBuffer {
  const joined = Buffer.allocUnsafeSlow(size);
  let offset = 0;
  for (const chunk of chunks) {
    joined.set(chunk, offset);
    offset += chunk.byteLength;
  }
  return joined.buffer as ArrayBuffer;
}

function aborted(signal: AbortSignal): ServiceError {
  return errors.internal(signal.reason);
}

function asServiceError(err: unknown): ServiceError {
  return isServiceError(err) ? err : errors.internal(err);
}

function requireInteger(key: string, value: unknown, min: number): void {
  if (!Number.isSafeInteger(value) || (value as number) < min) {
    throw new TypeError(`ValidationPool option ${key} must be an integer >= ${min}, got ${String(value)}`);
  }
}
