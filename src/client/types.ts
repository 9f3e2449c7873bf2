/**
 * What the client library promises about each endpoint's answer. The session status is the
 * service's own `StatusView` (a type-only import: the library loads nothing of the server).
 * Responses may carry more fields than listed (changes within /api/v1 are additive).
 */
import type { SessionStatus, StatusView, WorkflowOutcome } from '../session/state.js';

export type { SessionStatus, StatusView, WorkflowOutcome };

export interface IngestClientOptions {
  /** Service root, e.g. `http://127.0.0.1:8080` (a path prefix before `/api/v1` is kept). */
  baseUrl: string;
  clientId: string;
  token: string;
  /** Deadline of every call except ingest, from sending to the end of the answer (default 30 s). */
  timeoutMs?: number;
  /** Deadline of one ingest call (default 600 s, the service's own request limit). */
  ingestTimeoutMs?: number;
  /** TCP connect timeout (default 10 s, and never more than the call's deadline). */
  connectTimeoutMs?: number;
  /**
   * Sockets of the pool (default 8). The service counts requests in flight per client IP
   * (30 by default), so keep this well below it.
   */
  connections?: number;
  /**
   * Client-side pacing: requests started per second by this client (default 20; 0 turns it
   * off). The service refuses more than 30/s (burst 50) per IP with 503.
   */
  requestsPerSecond?: number;
  /** Sent as `User-Agent` (default `ingest-client/<version>`). */
  userAgent?: string;
}

export interface CallOptions {
  /** Aborts the call (`ClientError` code `ABORTED`). */
  signal?: AbortSignal;
  /** Overrides the client's deadline for this call. */
  timeoutMs?: number;
}

export interface IngestOptions extends CallOptions {
  /**
   * Sent as `Idempotency-Key`: the service answers a repeat of the same key with the first
   * answer instead of storing the package twice. Reuse it for every retry of one package.
   */
  idempotencyKey?: string;
  /** Compress the body with gzip before sending (`Content-Encoding: gzip`). */
  gzip?: boolean;
  /** The body is already gzip-encoded: send it as is with `Content-Encoding: gzip`. */
  contentEncoding?: 'gzip';
  /**
   * Check the package without storing it (`?dry_run=true`): the answer is what the package
   * would get; nothing is stored or recorded, and the `Idempotency-Key` is ignored.
   */
  dryRun?: boolean;
}

/** `POST /initialize-session`. A 409 is a result too: it names the session that already exists. */
export type InitializeResult =
  | { status: 'created'; upload_uuid: string; message: string; previous_upload_uuid?: string }
  | { status: 'already_exists' | 'workflow_running'; upload_uuid: string; session_status: SessionStatus; message: string };

export interface IngestResult {
  status: 'success';
  message: string;
  rows_processed: number;
  /**
   * Not part of the body: true when the service answered from an earlier request with the
   * same `Idempotency-Key` (header `Idempotent-Replayed: true`) instead of storing the rows again.
   */
  replayed: boolean;
}

/** `start-upload` answers the Connector's JSON unchanged; its shape is the Connector's. */
export type StartResult = Record<string, unknown>;

/** terminate and delete. */
export interface OperationResult {
  status: string;
  message: string;
}

export interface CatalogColumn {
  name: string;
  /** `string`, `number`, `integer`, `boolean`, `date`, `datetime` (more may come). */
  type: string;
  required: boolean;
  minimum?: number;
  maximum?: number;
  min_length?: number;
}

export interface CatalogEntity {
  name: string;
  columns: CatalogColumn[];
  required: string[];
  parents: string[];
}

export interface Catalog {
  entities: CatalogEntity[];
}
