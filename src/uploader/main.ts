#!/usr/bin/env node
/**
 * `npm run uploader`: the uploader as a process of its own, for the distributed engines
 * (`NATS_URL` set). Any number of them share the queue's durable consumer; each package is
 * acknowledged only after its object is durably written. SIGTERM/SIGINT: finish the package
 * in hand, then exit 0.
 */
import { ConfigError, loadConfig } from '../config/config.js';
import { jsonLogger } from '../log.js';
import { openEngines } from '../store/engines.js';
import { runUploader } from './uploader.js';

const log = jsonLogger(process.stderr, { component: 'uploader' });
let config;
try {
  config = loadConfig();
} catch (err) {
  if (err instanceof ConfigError) {
    process.stderr.write(`${err.message}\n`);
    process.exit(2);
  }
  throw err;
}
if (!config.nats.url) {
  process.stderr.write('The uploader process needs NATS_URL: the embedded queue belongs to the gateway process, which runs its own uploader.\n');
  process.exit(2);
}

const engines = await openEngines(config, log, 'ingest-uploader');
const consumer = await runUploader(engines, config, log);
log.info('uploader running', engines.describe);
process.stdout.write('uploader ready\n');

let stopping = false;
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    if (stopping) return;
    stopping = true;
    log.info('uploader stopping', { signal });
    consumer
      .stop()
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
