/**
 * The uploader process's start that fails (NATS unreachable, the port of
 * `metrics.uploaderPort` taken) ends with one `Cannot start: …` line and exit code 1, as the
 * gateway's does, not with a stack trace; a taken port stops it before it takes a package.
 */
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import t from 'tap';
import { DEMO_CLIENTS_PATH } from '../../src/config/config.js';
import { freePorts, startNats } from '../../testbed/nats.js';
import { spawnUploader } from '../../testbed/processes.js';

/** What a refused start wrote beside its JSON log lines, from the launcher's error (`… exited with 1:\n<output>`). */
async function refusal(start: Promise<unknown>): Promise<string[]> {
  const err = await start.then(
    () => null,
    (e: unknown) => e as Error,
  );
  if (!err) throw new Error('the uploader started');
  t.match(err.message, /exited with 1:/, 'exit code 1');
  const output = err.message.split(':\n').slice(1).join(':\n').trim().split('\n');
  return output.filter((line) => !line.startsWith('{'));
}

t.test('NATS unreachable: one line, exit code 1', async (t) => {
  const [port] = await freePorts(1);
  const lines = await refusal(spawnUploader(t, { clientsFile: DEMO_CLIENTS_PATH, nats: { url: `nats://127.0.0.1:${port}` } }));
  t.same(lines, ['Cannot start: CONNECTION_REFUSED']);
});

t.test('the port of metrics.uploaderPort taken: one line naming it, exit code 1', async (t) => {
  const nats = await startNats(t);
  const taken = createServer();
  await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
  t.teardown(() => taken.close());
  const port = (taken.address() as AddressInfo).port;
  const lines = await refusal(spawnUploader(t, { host: '127.0.0.1', clientsFile: DEMO_CLIENTS_PATH, nats: { url: nats.url }, metrics: { uploaderPort: port } }));
  t.same(lines, [`Cannot start: metrics.uploaderPort (UPLOADER_METRICS_PORT): cannot listen on 127.0.0.1:${port}: listen EADDRINUSE: address already in use 127.0.0.1:${port}`]);
});
