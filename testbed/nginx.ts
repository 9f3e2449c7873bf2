/**
 * The shipped reverse proxy (config/nginx/) in front of a gateway, for tests: nginx on a
 * free loopback port, its own prefix and temp directories, stopped in teardown. The binary
 * is found as `prerequisites.ts` says (`NGINX_BIN`, else `nginx` on PATH or in /usr/sbin).
 */
import { nginxPath, startNginx, type NginxProcess } from '../src/proxy/nginx.js';
import type { Teardown } from './env.js';
import { freePorts } from './nats.js';
import { installHint } from './prerequisites.js';

export interface Proxy extends NginxProcess {
  /** `http://127.0.0.1:<port>`: the proxy. */
  readonly url: string;
}

/** nginx in front of the gateway at `gatewayUrl` (`http://host:port`). */
export async function startProxy(t: Teardown, gatewayUrl: string): Promise<Proxy> {
  const bin = nginxPath();
  if (bin === null) throw new Error(installHint(['nginx']));
  const { hostname, port: gatewayPort } = new URL(gatewayUrl);
  const [port] = await freePorts(1);
  const nginx = await startNginx({ bin, NGINX_LISTEN: `127.0.0.1:${port}`, GATEWAY_ADDRESS: `${hostname}:${gatewayPort}` });
  t.teardown(() => nginx.stop());
  return Object.assign(nginx, { url: `http://127.0.0.1:${port}` });
}
