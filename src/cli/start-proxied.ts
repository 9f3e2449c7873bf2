#!/usr/bin/env node
/**
 * `npm run start:proxied`: the deployment's shape on one machine. nginx on the shipped
 * configuration (config/nginx/) listens where `npm start` would (`HOST`, `PORT`, or the
 * configuration's), and the gateway runs behind it on a loopback port of its own with
 * `limits.perIpAtProxy` and the proxy as its trusted proxy; every other variable reaches
 * the gateway as with `npm start`. SIGINT or SIGTERM stops both (nginx finishes the
 * requests in flight, the gateway drains them); either one stopping alone stops the other.
 */
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { loadConfigOrExit } from '../config/config.js';
import { NGINX_MISSING, nginxPath, startNginx, type NginxProcess } from '../proxy/nginx.js';

const GATEWAY = fileURLToPath(new URL('../main.js', import.meta.url));

const config = loadConfigOrExit();
const bin = nginxPath();
if (bin === null) {
  process.stderr.write(`npm run start:proxied: ${NGINX_MISSING}\n`);
  process.exit(2);
}
if (config.port === 0) {
  process.stderr.write('npm run start:proxied: PORT is 0; nginx needs a fixed port to listen on\n');
  process.exit(2);
}
const listenHost = config.host.includes(':') ? `[${config.host}]` : config.host;

// Detached: a terminal's Ctrl-C reaches this process only, which stops both once (a second
// SIGINT at the gateway would cut its requests in flight).
const gateway = spawn(process.execPath, [GATEWAY], {
  env: { ...process.env, HOST: '127.0.0.1', PORT: '0', TRUSTED_PROXIES: '127.0.0.1', PER_IP_AT_PROXY: 'true' },
  stdio: ['ignore', 'pipe', 'inherit'],
  detached: true,
});
const gatewayExited = new Promise<number | string>((resolve) => gateway.once('exit', (code, signal) => resolve(code ?? signal ?? 'unknown')));

let nginx: NginxProcess | null = null;
let stopping = false;
let proxyUrl: string | null = null;
let gatewayUrl: string | null = null;
/** The gateway's banner waits for the proxy, then names the proxy's address; its log lines pass at once. */
const banner: string[] = [];

const stop = async (why: string, code: number): Promise<never> => {
  if (!stopping) {
    stopping = true;
    process.stderr.write(`${why}: stopping nginx and the gateway\n`);
    if (gateway.exitCode === null && gateway.signalCode === null) gateway.kill('SIGTERM');
    const [gw, proxy] = await Promise.all([gatewayExited, nginx?.stop(true) ?? Promise.resolve(0)]);
    process.exit(code === 0 && gw === 0 && proxy === 0 ? 0 : code || 1);
  }
  return new Promise<never>(() => {});
};

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    if (stopping) {
      // A second signal: the gateway exits at once (see main.ts), nginx too.
      gateway.kill('SIGTERM');
      nginx?.child.kill('SIGTERM');
      return;
    }
    void stop(signal, 0);
  });
}

const ready = new Promise<string>((resolve) => {
  createInterface({ input: gateway.stdout! }).on('line', (line) => {
    const m = /listening on (http:\/\/\S+)/.exec(line);
    if (m) {
      gatewayUrl = m[1]!;
      resolve(gatewayUrl);
    }
    if (line.startsWith('{') || proxyUrl !== null) process.stdout.write(`${proxyUrl && gatewayUrl ? line.replaceAll(gatewayUrl, proxyUrl) : line}\n`);
    else banner.push(line);
  });
});

void gatewayExited.then((code) => stop(`the gateway exited (${code})${gatewayUrl === null ? ' before it listened' : ''}`, 1));
const url = await ready;
const { port } = new URL(url);
try {
  nginx = await startNginx({ bin, NGINX_LISTEN: `${listenHost}:${config.port}`, GATEWAY_ADDRESS: `127.0.0.1:${port}`, onOutput: (chunk) => process.stderr.write(chunk) });
} catch (err) {
  await stop(`nginx did not start: ${(err as Error).message.split('\n')[0]}`, 1);
}
void nginx!.exited.then((code) => stop(`nginx exited (${code})`, 1));
proxyUrl = `http://${listenHost}:${config.port}`;
for (const line of banner) process.stdout.write(`${line.replaceAll(url, proxyUrl)}\n`);
process.stdout.write(`nginx (pid ${nginx!.child.pid}) at ${proxyUrl} in front of the gateway (pid ${gateway.pid}) at ${url}\n`);
