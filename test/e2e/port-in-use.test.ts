/**
 * Start on a port that is taken: the gateway says so at once (a warning that the bind is
 * retried), starts as soon as the port is free, and otherwise ends with one clear error
 * (`LISTEN_FAILED`, a message naming the address and what to do) instead of a stack trace.
 */
import { createServer, type Server as NetServer } from 'node:net';
import t, { type Test } from 'tap';
import type { Logger } from '../../src/log.js';
import { startInProcess } from '../support/in-process.js';

interface Line {
  level: 'info' | 'warn' | 'error';
  msg: string;
  fields: Record<string, unknown> | undefined;
}

function capture(onLine: (line: Line) => void = () => {}): { logger: Logger; lines: Line[] } {
  const lines: Line[] = [];
  const at = (level: Line['level']) => (msg: string, fields?: Record<string, unknown>) => {
    const line = { level, msg, fields };
    lines.push(line);
    onLine(line);
  };
  return { logger: { info: at('info'), warn: at('warn'), error: at('error') }, lines };
}

async function holdPort(t: Test): Promise<{ server: NetServer; port: number }> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise((resolve) => server.close(resolve)));
  return { server, port: (server.address() as { port: number }).port };
}

const RETRY_WARNING = 'port in use by another process: retrying the bind';

t.test('a port another process holds: a warning at once, then one clear error', async (t) => {
  const { port } = await holdPort(t);
  const { logger, lines } = capture();
  const err = await startInProcess(t, { port }, { logger, listenRetryMs: 300 }).then(
    () => null,
    (e: unknown) => e as Error & { code?: string },
  );
  t.equal(err?.code, 'LISTEN_FAILED');
  t.equal(err?.message, `Cannot listen on 127.0.0.1:${port}: the port is in use by another process; stop it, or set PORT to a free port`);
  t.notMatch(err?.message ?? '', /\n/, 'one line');
  const warning = lines.find((l) => l.msg === RETRY_WARNING);
  t.ok(warning, 'the retry was announced');
  t.same(warning?.fields?.address, `127.0.0.1:${port}`);
});

t.test('the port freed while the bind is retried: the gateway starts on it', async (t) => {
  const { server, port } = await holdPort(t);
  const { logger } = capture((line) => {
    if (line.msg === RETRY_WARNING) server.close();
  });
  const svc = await startInProcess(t, { port }, { logger, listenRetryMs: 30_000 });
  t.equal(svc.app.port, port);
  const res = await fetch(`${svc.url}/healthz`);
  t.equal(res.status, 200);
});

t.test('a second gateway on the port of a running one is refused, not let share it', async (t) => {
  const first = await startInProcess(t);
  const err = await startInProcess(t, { port: first.app.port }, { logger: capture().logger, listenRetryMs: 300 }).then(
    () => null,
    (e: unknown) => e as Error & { code?: string },
  );
  t.equal(err?.code, 'LISTEN_FAILED', 'uWS alone would bind it too (SO_REUSEPORT) and split the traffic');
});

t.test('a HOST not of this machine fails at once with the reason, on port 0 too', async (t) => {
  for (const port of [0, 8089]) {
    const err = await startInProcess(t, { host: '192.0.2.1', port }, { logger: capture().logger }).then(
      () => null,
      (e: unknown) => e as Error & { code?: string },
    );
    t.equal(err?.code, 'LISTEN_FAILED');
    t.equal(err?.message, `Cannot listen on 192.0.2.1:${port}: the address is not one of this machine's; set HOST`);
  }
});

t.test('a real Connector without PUBLIC_URL on a wildcard HOST: one line naming PUBLIC_URL, exit code 2', async (t) => {
  const { spawnSync } = await import('node:child_process');
  const { mkdtemp, rm } = await import('node:fs/promises');
  const { tmpdir } = await import('node:os');
  const { join } = await import('node:path');
  const dataDir = await mkdtemp(join(tmpdir(), 'ingest-public-url-'));
  t.teardown(() => rm(dataDir, { recursive: true, force: true }));
  const main = new URL('../../src/main.js', import.meta.url).pathname;
  const run = spawnSync(process.execPath, [main], {
    env: { PATH: process.env.PATH, DATA_DIR: dataDir, PORT: '0', HOST: '0.0.0.0', CONNECTOR_URL: 'http://127.0.0.1:9/', CONNECTOR_WEBHOOK_SECRET: 'a-webhook-secret-of-32-characters' },
    encoding: 'utf8',
    timeout: 60_000,
  });
  t.equal(run.status, 2);
  t.same(
    run.stderr.trim().split('\n').filter((line) => !line.startsWith('{')),
    ['Invalid configuration:', '  publicUrl (PUBLIC_URL) is required when connector.url is set and host is 0.0.0.0: the Connector calls back on it, and http://0.0.0.0:<port> is no address it can reach'],
  );
  t.equal(run.stdout, '', 'it never listened');
});
