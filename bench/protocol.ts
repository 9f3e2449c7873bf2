/**
 * The IPC messages between the driver (`run.ts`) and its child processes. Every child is
 * started with `child_process.fork` and the `advanced` serialization, so typed arrays
 * cross intact.
 */

/** What a server under test (the service or an HTTP peer) reports about itself. */
export interface ProbeSample {
  /** Largest event-loop delay since the last reset, ms (`monitorEventLoopDelay`, resolution 1 ms). */
  eldMaxMs: number;
  eldP99Ms: number;
  /** Peak resident set size since the last reset, bytes (VmHWM after a clear_refs reset, else sampled). */
  peakRssBytes: number;
  /** CPU time of the whole server process (main thread, workers, helper threads), user + system, since the reset. */
  cpuMs: number;
  /** `cpuMs` by thread (Linux): the event loop's, the validation workers', the rest (libuv pool, GC helpers); null without /proc. */
  cpuByThread: { mainMs: number; workersMs: number; otherMs: number } | null;
  rssBytes: number;
  /** How the peak was taken: the kernel's high-water mark, or 20 ms samples. */
  peakSource: 'vmhwm' | 'sampled';
}

/** Driver → server under test. */
export type ServerCommand = { type: 'probe-reset' } | { type: 'probe-read' } | { type: 'stop' };

/** Server under test → driver. */
export type ServerEvent =
  /** `overrides`: configuration keys the bench changed from the service's defaults (service only). */
  | { type: 'ready'; url: string; overrides?: Record<string, unknown> }
  | { type: 'probe'; sample: ProbeSample }
  | { type: 'failed'; message: string };

/** A body file the client processes keep resident. */
export interface BodyRef {
  name: string;
  path: string;
}

/** Who a client process calls as (the HTTP peers ignore it). */
export interface JobCredentials {
  id: string;
  token: string;
}

export interface IngestJob {
  kind: 'ingest';
  /** Echoed in `armed` and `result`, so a late answer of an abandoned job is never taken for the next one's. */
  id: number;
  /** `http://127.0.0.1:port` (or the `--target` origin). */
  origin: string;
  credentials: JobCredentials;
  /** The session the packages go to (`bench` for the HTTP peers, which keep none). */
  uploadUuid: string;
  entity: string;
  /** Name of a loaded body. */
  body: string;
  /** The body is gzip-encoded: sent with `Content-Encoding: gzip`. */
  gzip: boolean;
  /** Concurrent request loops in this process. */
  slots: number;
  /** Requests per loop at most; each loop sends at least one. */
  maxRequests: number;
  /** No loop starts a new request after this many ms from `go`. */
  durationMs: number;
  /** Per-request deadline (undici headers and body timeouts). */
  requestTimeoutMs: number;
}

export interface PollJob {
  kind: 'poll';
  id: number;
  origin: string;
  credentials: JobCredentials;
  /** `GET …/{uploadUuid}/status` is polled. */
  uploadUuid: string;
  intervalMs: number;
  /** Hard stop even if the driver never says `stop`. */
  maxMs: number;
}

/** Driver → client process. */
export type ClientCommand =
  | { type: 'load'; bodies: BodyRef[] }
  | { type: 'arm'; job: IngestJob | PollJob }
  | { type: 'go' }
  | { type: 'stop' };

/**
 * One request as the client saw it. Times are `performance.timeOrigin + performance.now()`
 * (ms since the epoch, sub-ms resolution), comparable across processes on one machine.
 */
export interface RequestSamples {
  start: Float64Array;
  end: Float64Array;
  status: Int32Array;
  /** `rows_processed` of a 200, else 0. */
  rows: Float64Array;
  /** Up to a few distinct failure descriptions (status and body start, or the error). */
  failures: string[];
  /** CPU time (user + system) of the client process while it ran the job. */
  cpuMs: number;
}

/** Client process → driver. */
export type ClientEvent =
  | { type: 'loaded' }
  | { type: 'armed'; id: number }
  | { type: 'result'; id: number; samples: RequestSamples }
  | { type: 'failed'; message: string };
