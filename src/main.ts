#!/usr/bin/env node
/** `npm start`: the gateway on the configuration of config/ and the environment. */
import { startApp } from './app.js';
import { ConfigError, loadConfig } from './config/config.js';
import { jsonLogger } from './log.js';

const log = jsonLogger();
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

const app = await startApp(config, { logger: log });
process.stdout.write(`Batch ingest gateway listening on ${app.url}\n`);
process.stdout.write(`OpenAPI: ${app.url}/openapi.json\n`);
if (app.usesDemoClients) {
  process.stdout.write('Demo clients (embedded default only):\n');
  process.stdout.write('  Client-Id: demo    Authorization: demo-token\n');
  process.stdout.write('  Client-Id: demo-2  Authorization: demo-2-token\n');
}

let stopping = false;
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    if (stopping) return;
    stopping = true;
    log.info('shutting down', { signal });
    app.close().then(
      () => process.exit(0),
      (err: unknown) => {
        log.error('shutdown failed', { err });
        process.exit(1);
      },
    );
  });
}
