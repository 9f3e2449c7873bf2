#!/usr/bin/env node
/**
 * `npm run uploader`: the uploader as a process of its own, for the distributed engines
 * (`NATS_URL` set). Any number of them share the queue's durable consumer; each package is
 * acknowledged only after its object is durably written. SIGTERM/SIGINT: finish the package
 * in hand, then exit 0. With `metrics.uploaderPort` set it serves `/metrics`, `/healthz` and
 * `/readyz` on that port (on `host`).
 */
import { loadConfigOrExit } from '../config/config.js';
import { captureConsole, jsonLogger } from '../log.js';
import { Metrics } from '../observability/metrics.js';
import { serveOperatorEndpoints, type OperatorServer } from '../observability/operator-server.js';
import { Readiness } from '../observability/readiness.js';
import { parentNotifier } from '../observability/state-events.js';
import { notifyingWrites, openEngines } from '../store/engines.js';
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
const engines = await openEngines(config, log, 'ingest-uploader', { onQueueSettled: onStateChange });
if (onStateChange) notifyingWrites(engines, onStateChange);
const metrics = config.metrics.enabled
  ? new Metrics({ queue: { backend: engines.describe.queue, backlog: () => engines.queue.backlog() }, backlogTimeoutMs: config.health.readyTimeoutMs, damagedRecords: engines.damagedRecords, damagedReads: engines.damagedReads })
  : null;
const consumer = await runUploader(engines, config, log, metrics?.uploader);
let operator: OperatorServer | null = null;
if (config.metrics.uploaderPort !== null) {
  operator = await serveOperatorEndpoints({
    host: config.host,
    port: config.metrics.uploaderPort,
    metrics,
    readiness: new Readiness(engines.probes, config.health.readyTimeoutMs, log),
    token: config.metrics.token,
  });
  log.info('uploader operator endpoints', { port: operator.port });
}
log.info('uploader running', engines.describe);
process.stdout.write(`uploader ready${operator ? ` (metrics on port ${operator.port})` : ''}\n`);

let stopping = false;
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    if (stopping) return;
    stopping = true;
    log.info('uploader stopping', { signal });
    consumer
      .stop()
      .then(() => operator?.close())
      .then(() => engines.close())
      .then(
        () => process.exit(0),
        (err: unknown) => {
          log.error('uploader shutdown failed', { err });
          process.exit(1);
        },
      );
  });
}
