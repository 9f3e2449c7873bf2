#!/usr/bin/env node
/** `npm start`: the gateway on the configuration of config/ and the environment. */
import { startApp } from './app.js';
import { loadConfigOrExit } from './config/config.js';
import { captureConsole, jsonLogger } from './log.js';
import { parentNotifier } from './observability/state-events.js';
import { onStopSignals } from './stop-signals.js';

const config = loadConfigOrExit();

const log = jsonLogger(undefined, {}, { level: config.log.level });
// Libraries' console output (nats.js prints the bytes a protocol error failed on) becomes a log
// line with only its head (log.ts).
captureConsole(log);
// Spawned by a test with an IPC channel: its state changes are told to the test, which waits on
// them (observability/state-events.ts). Started any other way: nothing.
const app = await startApp(config, { logger: log, onStateChange: parentNotifier() }).catch((err: unknown): never => {
  const code = (err as { code?: unknown } | null)?.code;
  const message = err instanceof Error ? err.message : String(err);
  // An edge this machine cannot run, a taken or unusable address, or a store set up wrongly
  // (an unsupported nats-server, an invalid name) is the operator's to fix: its message says
  // how, in one line. Anything else is logged whole (one JSON line, with its cause), then
  // named in one line.
  // A configuration the gateway cannot serve on (config.ts, `checkGatewayConfig`) is printed as
  // `loadConfigOrExit` prints one, exit 2.
  const quiet = ['HTTP_ENGINE_UNAVAILABLE', 'LISTEN_FAILED', 'STORE_MISCONFIGURED', 'CONFIG_INVALID'];
  if (!quiet.includes(code as string)) log.error('start failed', { err });
  const asIs = code === 'HTTP_ENGINE_UNAVAILABLE' || code === 'LISTEN_FAILED' || code === 'CONFIG_INVALID';
  process.stderr.write(`${asIs ? message : `Cannot start: ${message}`}\n`);
  process.exit(code === 'HTTP_ENGINE_UNAVAILABLE' || code === 'CONFIG_INVALID' ? 2 : 1);
});
process.stdout.write(`Batch ingest gateway listening on ${app.url}\n`);
process.stdout.write(`OpenAPI: ${app.url}/openapi.json\n`);
process.stdout.write(`API docs: ${app.url}/docs\n`);
if (app.usesDemoClients) {
  process.stdout.write('Demo clients (embedded default only):\n');
  process.stdout.write('  Client-Id: demo    Authorization: demo-token\n');
  process.stdout.write('  Client-Id: demo-2  Authorization: demo-2-token\n');
}

// SIGTERM/SIGINT: stop accepting, let in-flight requests finish (up to limits.shutdownGraceMs),
// then close the pool, the uploader and the stores, and exit 0 (stop-signals.ts: a second
// signal exits 1 at once; closing past the grace by more than 5 s ends with a SIGKILL).
onStopSignals(log, { what: 'gateway', graceMs: config.limits.shutdownGraceMs, stop: () => app.close({ graceMs: config.limits.shutdownGraceMs }) });
