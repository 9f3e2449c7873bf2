/**
 * `npm run start:proxied` as a user runs it: one process that starts nginx on the shipped
 * configuration and the gateway behind it, answers through the proxy, and on SIGINT stops
 * both.
 */
import { spawn } from 'node:child_process';
import { connect } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t, { type Test } from 'tap';
import { API, call, tempDir } from '../support/harness.js';
import { auth, head, RawClient } from '../support/raw-http.js';
import { freePorts } from '../../testbed/nats.js';
import { HTTP_ENGINE } from '../../testbed/env.js';

const START_PROXIED = fileURLToPath(new URL('../../src/cli/start-proxied.js', import.meta.url));

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

async function startProxied(t: Test) {
  const dir = await tempDir(t);
  const [port] = await freePorts(1);
  const child = spawn(process.execPath, [START_PROXIED], {
    env: { PATH: process.env.PATH, PORT: String(port), DATA_DIR: join(dir, 'data'), LOG_LEVEL: 'warn', ...(HTTP_ENGINE ? { HTTP_ENGINE } : {}) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  // 'close': after the exit and the last of its output.
  const exited = new Promise<number | null>((resolve) => child.once('close', (code) => resolve(code)));
  t.teardown(() => {
    if (child.exitCode === null) child.kill('SIGKILL');
  });
  let out = '';
  child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const pids = await new Promise<{ nginx: number; gateway: number }>((resolve, reject) => {
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /nginx \(pid (\d+)\) at \S+ in front of the gateway \(pid (\d+)\)/.exec(out);
      if (m) resolve({ nginx: Number(m[1]), gateway: Number(m[2]) });
    });
    void exited.then((code) => reject(new Error(`start:proxied exited with ${code}:\n${out}`)));
  });
  t.teardown(() => {
    for (const pid of [pids.nginx, pids.gateway]) if (alive(pid)) process.kill(pid, 'SIGKILL');
  });
  return { child, exited, pids, port: port!, output: () => out };
}

t.test('npm run start:proxied: nginx on PORT, the gateway behind it, both stopped by SIGINT', async (t) => {
  const { child, exited, pids, port, output } = await startProxied(t);
  const out = output();
  const url = `http://127.0.0.1:${port}`;
  t.match(out, new RegExp(`Batch ingest gateway listening on ${url}\\n`), "the gateway's banner names the proxy's address");
  t.match(out, /Client-Id: demo {4}Authorization: demo-token/, 'and the demo clients');

  const entities = await call(url, 'GET', `${API}/entities`);
  t.equal(entities.status, 200, 'an API call through the proxy: 200');
  t.type(entities.headers['x-request-id'], 'string', 'answered by the gateway');
  const raw = new RawClient(t, url);
  await raw.write(head('POST', `${API}/initialize-session`, `${auth}Content-Length: 2000000\r\n`));
  const tooLarge = await raw.response();
  t.same([tooLarge.status, JSON.parse(tooLarge.body), tooLarge.headers['x-request-id']], [413, { detail: 'Request body too large (limit 1 MiB)' }, undefined], 'a 2 MB body: 413 from nginx in front');
  t.ok(alive(pids.nginx) && alive(pids.gateway), 'both running');

  child.kill('SIGINT');
  t.equal(await exited, 0, 'SIGINT: exit code 0');
  t.notOk(alive(pids.nginx), 'nginx stopped');
  t.notOk(alive(pids.gateway), 'the gateway stopped');
  const refused = await new Promise<string>((resolve) => {
    const s = connect(port!, '127.0.0.1');
    s.once('connect', () => (s.destroy(), resolve('connected')));
    s.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? 'error'));
  });
  t.equal(refused, 'ECONNREFUSED', 'nothing listens on PORT any more');
});

t.test('start:proxied: the gateway gone, nginx is stopped too and the command fails', async (t) => {
  const { exited, pids, output } = await startProxied(t);
  process.kill(pids.gateway, 'SIGKILL');
  t.equal(await exited, 1, 'exit code 1');
  t.notOk(alive(pids.nginx), 'nginx stopped');
  t.match(output(), /the gateway exited \(SIGKILL\): stopping nginx and the gateway/, 'says why');
});
