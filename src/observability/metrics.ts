/**
 * Prometheus metrics on a registry of our own (never prom-client's global default, so two
 * services in one process, as in the tests, do not share counters).
 *
 * Costs nothing on the hot paths: the request and Connector metrics are one counter and one
 * histogram update per request or call; the ingest, pool and queue figures are the pool's and
 * the queue's own counters, read only when someone scrapes (`collect`). Nothing is counted
 * per row or per chunk. Label values are bounded: route patterns (never raw paths), known
 * methods, status codes, fixed outcome names, the queue's back end.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { Connector } from '../connector/types.js';
import { withDeadline } from '../deadline.js';
import type { QueueBacklog } from '../store/ports.js';
import type { UploaderObserver } from '../uploader/uploader.js';
import type { IngestTotals, PoolLoad } from '../validation-pool/index.js';

/** What the metrics read from the validation pool at scrape time. */
export interface PoolSource {
  readonly load: PoolLoad;
  readonly totals: Readonly<IngestTotals>;
  readonly capacity: { workers: number; requests: number; tasks: number };
  readonly busyMs: number;
}

/** What the metrics read from the batch queue at scrape time. */
export interface QueueSource {
  /** `jetstream` or `file`. */
  backend: string;
  backlog(): Promise<QueueBacklog>;
}

export interface MetricsOptions {
  queue?: QueueSource;
  /** Bound of the queue's backlog call during a scrape (a NATS outage must not hang it). */
  backlogTimeoutMs: number;
  /** Damaged records the stores found and skipped so far (the embedded default's checksums). */
  damagedRecords?: () => number;
  /** Reads from NATS unlike what was written so far, read or delivered again (with NATS only). */
  damagedReads?: (() => number) | null;
  /** Default process metrics (CPU, memory, event loop lag, GC, handles). Default true. */
  processMetrics?: boolean;
}

export type ConnectorOperation = 'start' | 'terminate';
export type ConnectorOutcome = 'ok' | 'rejected' | 'error' | 'unreachable' | 'other';

const METHODS = new Set(['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS']);
const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600];
const CALL_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];
const PUT_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

export class Metrics {
  readonly registry = new Registry();
  readonly #requests: Counter<'method' | 'route' | 'status'>;
  readonly #latency: Histogram<'method' | 'route' | 'status'>;
  readonly #connectorCalls: Counter<'operation' | 'outcome'>;
  readonly #connectorLatency: Histogram<'operation'>;
  readonly #uploaded: Counter<'outcome'>;
  readonly #uploadErrors: Counter;
  readonly #putLatency: Histogram;
  #pool = false;

  constructor(opts: MetricsOptions) {
    const registers = [this.registry];
    if (opts.processMetrics ?? true) collectDefaultMetrics({ register: this.registry });
    const { damagedRecords, damagedReads } = opts;
    if (damagedReads) {
      countedAtScrape(
        'ingest_nats_damaged_reads_total',
        'Reads from NATS unlike what was written (a value or commit that does not parse, a package unlike its CRC-32, a batch on another subject), read or delivered again',
        damagedReads,
        registers,
      );
    }
    if (damagedRecords) {
      countedAtScrape(
        'ingest_storage_damaged_records_total',
        'Damaged records the embedded stores found (checksum failed with valid records after it), skipped and logged with file and offset',
        damagedRecords,
        registers,
      );
    }

    this.#requests = new Counter({
      name: 'ingest_http_requests_total',
      help: 'HTTP requests answered, by method, route pattern and status (status "aborted": the client went away first)',
      labelNames: ['method', 'route', 'status'],
      registers,
    });
    this.#latency = new Histogram({
      name: 'ingest_http_request_duration_seconds',
      help: 'Time from the request headers to the response, by method, route pattern and status',
      labelNames: ['method', 'route', 'status'],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    this.#connectorCalls = new Counter({
      name: 'ingest_connector_calls_total',
      help: 'Connector calls by operation (start, terminate) and outcome (ok, rejected, error, unreachable, other)',
      labelNames: ['operation', 'outcome'],
      registers,
    });
    this.#connectorLatency = new Histogram({
      name: 'ingest_connector_call_duration_seconds',
      help: 'Duration of Connector calls, by operation',
      labelNames: ['operation'],
      buckets: CALL_BUCKETS,
      registers,
    });
    this.#uploaded = new Counter({
      name: 'ingest_uploader_packages_total',
      help: 'Packages the uploader took off the queue: stored as an object, or abandoned (their session was deleted)',
      labelNames: ['outcome'],
      registers,
    });
    this.#uploadErrors = new Counter({
      name: 'ingest_uploader_errors_total',
      help: 'Failed uploads of a package to object storage (each is retried with back-off)',
      registers,
    });
    this.#putLatency = new Histogram({
      name: 'ingest_uploader_put_duration_seconds',
      help: 'Time to store one package as an object, successful puts only',
      buckets: PUT_BUCKETS,
      registers,
    });

    if (opts.queue) this.#queueMetrics(opts.queue, opts.backlogTimeoutMs, registers);
  }

  get contentType(): string {
    return this.registry.contentType;
  }

  /** The exposition text of every metric (runs the scrape-time collectors). */
  render(): Promise<string> {
    return this.registry.metrics();
  }

  observeRequest(method: string, route: string | null, status: number | 'aborted', durationMs: number): void {
    const labels = { method: METHODS.has(method) ? method : 'OTHER', route: route ?? 'unmatched', status: String(status) };
    this.#requests.inc(labels);
    this.#latency.observe(labels, durationMs / 1000);
  }

  /** `ingest_http_engine_info{engine}` 1: which HTTP edge serves. */
  nameEdge(engine: string): void {
    new Gauge({ name: 'ingest_http_engine_info', help: 'The HTTP edge serving (label engine: uws or node); always 1', labelNames: ['engine'], registers: [this.registry] }).set({ engine }, 1);
  }

  connectorCall(operation: ConnectorOperation, outcome: ConnectorOutcome, durationMs: number): void {
    this.#connectorCalls.inc({ operation, outcome });
    this.#connectorLatency.observe({ operation }, durationMs / 1000);
  }

  /** The uploader's hooks (in the gateway with `storage.inProcessUploader`, or the uploader process). */
  readonly uploader: UploaderObserver = {
    stored: (durationMs) => {
      this.#uploaded.inc({ outcome: 'stored' });
      this.#putLatency.observe(durationMs / 1000);
    },
    abandoned: () => this.#uploaded.inc({ outcome: 'abandoned' }),
    failed: () => this.#uploadErrors.inc(),
  };

  /** Adds the ingest and worker pool metrics, read from the gateway's validation pool (once). */
  watchPool(pool: PoolSource): void {
    if (this.#pool) throw new Error('Metrics already watch a pool');
    this.#pool = true;
    const registers = [this.registry];
    // Totals kept by the pool, exposed as counters: re-set from the source on every scrape.
    const packages: Counter<'outcome'> = new Counter({
      name: 'ingest_packages_total',
      help: 'Ingest packages by outcome: accepted (every row valid), rejected (422 or 413), failed (client gone, limits at the edge, worker or store failure)',
      labelNames: ['outcome'],
      registers,
      collect() {
        const t = pool.totals;
        packages.reset();
        packages.inc({ outcome: 'accepted' }, t.accepted);
        packages.inc({ outcome: 'rejected' }, t.rejected);
        packages.inc({ outcome: 'failed' }, t.failed);
      },
    });
    const total = (name: string, help: string, read: (t: Readonly<IngestTotals>) => number) => {
      const c: Counter = new Counter({
        name,
        help,
        registers,
        collect() {
          c.reset();
          c.inc(read(pool.totals));
        },
      });
    };
    total('ingest_rows_validated_total', 'Rows of accepted ingest packages (counted once per package)', (t) => t.rows);
    total('ingest_bytes_validated_total', 'Request body bytes of accepted ingest packages, as received (compressed when gzip)', (t) => t.bodyBytes);
    total('ingest_encoded_bytes_total', 'NDJSON bytes of accepted packages appended to the batch queue', (t) => t.encodedBytes);
    const busy: Counter = new Counter({
      name: 'ingest_pool_busy_seconds_total',
      help: 'Time the validation worker threads spent running tasks; rate() / ingest_pool_workers is the pool utilisation',
      registers,
      collect() {
        busy.reset();
        busy.inc(pool.busyMs / 1000);
      },
    });

    const gauge = (name: string, help: string, read: () => number) => {
      const g: Gauge = new Gauge({
        name,
        help,
        registers,
        collect() {
          g.set(read());
        },
      });
    };
    const executing = () => Math.max(0, pool.load.running - pool.load.queued);
    gauge('ingest_pool_workers', 'Validation worker threads alive', () => pool.load.threads);
    gauge('ingest_pool_tasks_running', 'Validation tasks executing in a worker thread at scrape time', executing);
    gauge('ingest_pool_utilization', 'Share of the worker threads executing a task at scrape time (0 to 1)', () =>
      pool.load.threads === 0 ? 0 : Math.min(1, executing() / pool.load.threads),
    );
    gauge('ingest_pool_queue_depth', 'Validation tasks waiting for a worker thread at scrape time', () => pool.load.waiting + pool.load.queued);
    gauge('ingest_requests_open', 'Ingest requests admitted and not yet settled', () => pool.load.open);
    gauge('ingest_requests_capacity', 'Ingest requests admitted at once before 503 (ingest.workers + ingest.maxQueue)', () => pool.capacity.requests);
  }

  #queueMetrics(queue: QueueSource, timeoutMs: number, registers: Registry[]): void {
    // Both gauges of one scrape share one backlog call; a failed or late call leaves them unset.
    let inFlight: Promise<QueueBacklog | null> | null = null;
    const backlog = () =>
      (inFlight ??= withDeadline(queue.backlog(), timeoutMs, () => new Error(`no answer in ${timeoutMs} ms`))
        .catch(() => null)
        .finally(() => {
          inFlight = null;
        }));
    const pending: Gauge<'backend'> = new Gauge({
      name: 'ingest_queue_pending_packages',
      help: 'Committed packages not yet stored by an uploader (the whole queue, shared by every instance on NATS)',
      labelNames: ['backend'],
      registers,
      async collect() {
        const b = await backlog();
        pending.reset();
        if (b) pending.set({ backend: queue.backend }, b.packages);
      },
    });
    const age: Gauge<'backend'> = new Gauge({
      name: 'ingest_queue_oldest_pending_age_seconds',
      help: 'Age of the oldest committed package not yet stored (the uploader lag; 0 when none is pending)',
      labelNames: ['backend'],
      registers,
      async collect() {
        const b = await backlog();
        age.reset();
        if (b) age.set({ backend: queue.backend }, (b.oldestAgeMs ?? 0) / 1000);
      },
    });
  }
}

/** The Connector with every call counted by outcome and timed. */
export function instrumentConnector(connector: Connector, metrics: Metrics): Connector {
  const timed = async <T>(operation: ConnectorOperation, call: () => Promise<T>): Promise<T> => {
    const started = performance.now();
    try {
      const result = await call();
      metrics.connectorCall(operation, 'ok', performance.now() - started);
      return result;
    } catch (err) {
      metrics.connectorCall(operation, connectorOutcome(err), performance.now() - started);
      throw err;
    }
  };
  return {
    start: (req) => timed('start', () => connector.start(req)),
    terminate: (uploadUuid) => timed('terminate', () => connector.terminate(uploadUuid)),
    close: () => connector.close(),
  };
}

function connectorOutcome(err: unknown): ConnectorOutcome {
  switch ((err as { code?: unknown } | null)?.code) {
    case 'CONNECTOR_REJECTED':
      return 'rejected';
    case 'CONNECTOR_ERROR':
    case 'WORKFLOW_STOP_FAILED':
      return 'error';
    case 'CONNECTOR_UNREACHABLE':
      return 'unreachable';
    default:
      return 'other';
  }
}

/**
 * Who may scrape: everyone when `token` is null, else whoever sends `Authorization: Bearer
 * <token>` (compared as SHA-256 digests, in constant time).
 */
export function metricsAccess(token: string | null): (authorization: string | undefined) => boolean {
  if (token === null) return () => true;
  const expected = digest(token);
  return (authorization) => {
    const given = /^Bearer\s+(.+)$/i.exec(authorization?.trim() ?? '')?.[1];
    return given !== undefined && timingSafeEqual(digest(given), expected);
  };
}

function digest(text: string): Buffer {
  return createHash('sha256').update(text).digest();
}

/** A counter whose value is read from `count` at each scrape (a tally kept by a store). */
function countedAtScrape(name: string, help: string, count: () => number, registers: Registry[]): void {
  const counter: Counter = new Counter({
    name,
    help,
    registers,
    collect() {
      counter.reset();
      counter.inc(count());
    },
  });
}
