#!/usr/bin/env node
/**
 * `npm run uploader`: the uploader as a process of its own, for the distributed engines
 * (`NATS_URL` set). Any number of them share the queue's durable consumer; each package is
 * acknowledged only after its object is durably written. SIGTERM/SIGINT: finish the package
 * in hand, then exit 0 (stop-signals.ts: 5 s past `limits.shutdownGraceMs`, a SIGKILL of its
 * own without it). With `metrics.uploaderPort` set it serves `/metrics`, `/healthz` and
 * `/readyz` on that port (on `host`).
 */
import { loadConfigOrExit } from '../config/config.js';
import { captureConsole, jsonLogger } from '../log.js';
import { Metrics } from '../observability/metrics.js';
import { serveOperatorEndpoints, type OperatorServer } from '../observability/operator-server.js';
import { Readiness } from '../observability/readiness.js';
import { parentNotifier } from '../observability/state-events.js';
import { onStopSignals } from '../stop-signals.js';
import { notifyingWrites, openEngines, type Engines } from '../store/engines.js';
import type { QueueConsumer } from '../store/ports.js';
import { runUploader } from './uploader.js';

const config = loadConfigOrExit();
if (!config.nats.url) {
  process.stderr.write('The uploader process needs NATS_URL: the embedded queue belongs to the gateway process, which runs its own uploader.\n');
  process.exit(2);
}

const log = jsonLogger(undefined, { component: 'uploader' }, { level: config.log.level });
captureConsole(log);
// Spawned by a test with an IPC channel: the writes that change status answers (stored counts,
// acks, removed commits) are told to the test, which waits on them (observability/state-events.ts).
// Started any other way: nothing.
const onStateChange = parentNotifier();
const { engines, consumer, operator } = await start().catch((err: unknown): never => {
  // As the gateway's start (main.ts): a store set up wrongly is the operator's to fix, its
  // message says how in one line; anything else (NATS unreachable, the port of
  // metrics.uploaderPort taken) is logged whole, then named in one line.
  const code = (err as { code?: unknown } | null)?.code;
  if (code !== 'STORE_MISCONFIGURED') log.error('start failed', { err });
  process.stderr.write(`Cannot start: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});

async function start(): Promise<{ engines: Engines; consumer: QueueConsumer; operator: OperatorServer | null }> {
  const engines = await openEngines(config, log, 'ingest-uploader', { onQueueSettled: onStateChange });
  if (onStateChange) notifyingWrites(engines, onStateChange);
  const metrics = config.metrics.enabled
    ? new Metrics({ queue: { backend: engines.describe.queue, backlog: () => engines.queue.backlog() }, backlogTimeoutMs: config.health.readyTimeoutMs, damagedRecords: engines.damagedRecords, damagedReads: engines.damagedReads })
    : null;
  // The operator port before the consumer: a port taken stops the start before a package is taken.
  let operator: OperatorServer | null = null;
  if (config.metrics.uploaderPort !== null) {
    operator = await serveOperatorEndpoints({
      host: config.host,
      port: config.metrics.uploaderPort,
      metrics,
      readiness: new Readiness(engines.probes, config.health.readyTimeoutMs, log),
      token: config.metrics.token,
    }).catch((err: unknown): never => {
      throw new Error(`metrics.uploaderPort (UPLOADER_METRICS_PORT): cannot listen on ${config.host}:${config.metrics.uploaderPort}: ${(err as Error).message}`, { cause: err });
    });
    log.info('uploader operator endpoints', { port: operator.port });
  }
  const consumer = await runUploader(engines, config, log, metrics?.uploader);
  return { engines, consumer, operator };
}

log.info('uploader running', engines.describe);
process.stdout.write(`uploader ready${operator ? ` (metrics on port ${operator.port})` : ''}\n`);

// A second signal exits at once, as the gateway's does: the package in hand, unacked, is
// redelivered (after `nats.ackWaitMs`), its incomplete upload aborted by the next sweep.
onStopSignals(log, {
  what: 'uploader',
  graceMs: config.limits.shutdownGraceMs,
  stop: async () => {
    await consumer.stop();
    await operator?.close();
    await engines.close();
  },
});
