/**
 * The shipped reverse proxy (config/nginx/) run as a process: its template rendered for a
 * listen address and the gateways' address, nginx started in a prefix directory of its own
 * (configuration, pid and temp files there, so any user can run it anywhere), stopped by
 * signal. Used by `npm run start:proxied` and by the tests that run the proxy as deployed.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { accessSync, constants, watch } from 'node:fs';
import { chmod, copyFile, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The http-context configuration, with `${NGINX_LISTEN}` and `${GATEWAY_ADDRESS}`. */
export const NGINX_TEMPLATE = fileURLToPath(new URL('../../../config/nginx/gateway.conf.template', import.meta.url));
/** The main file for running nginx on its own; it includes the rendered template as `gateway.conf`. */
export const NGINX_MAIN = fileURLToPath(new URL('../../../config/nginx/nginx.conf', import.meta.url));

export interface ProxyAddresses {
  /** What nginx listens on: `port` or `host:port` (nginx's `listen`). */
  NGINX_LISTEN: string;
  /** `host:port` of the gateways. */
  GATEWAY_ADDRESS: string;
}

/**
 * Replaces each `${NAME}` of `template` by its value, as envsubst does with a list of names;
 * a `${NAME}` that `values` does not have is an error (nginx's own variables are written
 * `$name`, without braces, so they are never taken for one).
 */
export function renderTemplate(template: string, values: Readonly<Record<string, string>>): string {
  return template.replace(/\$\{([A-Za-z_][A-Za-z0-9_]*)\}/g, (_, name: string) => {
    const value = values[name];
    if (value === undefined) throw new Error(`nginx template: no value for \${${name}}`);
    if (/[\n;{}]/.test(value)) throw new Error(`nginx template: ${name} must be one word, got ${JSON.stringify(value)}`);
    return value;
  });
}

export async function renderGatewayConf(addresses: ProxyAddresses): Promise<string> {
  return renderTemplate(await readFile(NGINX_TEMPLATE, 'utf8'), { ...addresses });
}

const executable = (path: string): boolean => {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
};

/** `NGINX_BIN`, else `nginx` on PATH or in /usr/sbin (Debian's); null when there is none. */
export function nginxPath(env: NodeJS.ProcessEnv = process.env): string | null {
  if (env.NGINX_BIN) return executable(env.NGINX_BIN) ? env.NGINX_BIN : null;
  for (const dir of [...(env.PATH ?? '').split(delimiter), '/usr/sbin', '/usr/local/sbin']) {
    if (dir && executable(join(dir, 'nginx'))) return join(dir, 'nginx');
  }
  return null;
}

export const NGINX_MISSING = 'nginx not found (Debian package nginx): install it with `sudo apt-get install -y nginx`, or set NGINX_BIN to the binary';

export interface NginxOptions extends ProxyAddresses {
  /** The binary (default: `nginxPath()`). */
  bin?: string;
  /** Changes the rendered configuration before nginx reads it (a measurement's variant: the bench drops the per-client limits). */
  edit?: (gatewayConf: string) => string;
  /** Where nginx's output goes (default: kept for `output()` only). */
  onOutput?: (chunk: Buffer) => void;
}

export interface NginxProcess {
  readonly child: ChildProcess;
  /** The prefix directory: nginx.conf, gateway.conf, nginx.pid, temp/. */
  readonly dir: string;
  /** Files nginx buffered request bodies into so far (`temp/client_body`). */
  bodyTempFiles(): Promise<string[]>;
  /** nginx's output so far (its error log). */
  output(): string;
  /** Resolves with the exit code (or the signal's name) once nginx has exited. */
  readonly exited: Promise<number | string>;
  /** SIGQUIT (requests in flight finish, then exit) or SIGTERM (at once); resolves when it has exited. The prefix directory is removed. */
  stop(graceful?: boolean): Promise<number | string>;
}

/**
 * Starts nginx on the shipped configuration; resolves once it listens (its pid file is
 * written after the listen sockets are bound). Run as root, nginx's workers run as
 * `nobody`: the prefix directory is made readable to them, and nginx owns its temp
 * directories to that user itself.
 */
export async function startNginx(opts: NginxOptions): Promise<NginxProcess> {
  const bin = opts.bin ?? nginxPath();
  if (!bin) throw new Error(NGINX_MISSING);
  const dir = await mkdtemp(join(tmpdir(), 'ingest-nginx-'));
  try {
    await chmod(dir, 0o755);
    await mkdir(join(dir, 'temp'), { mode: 0o755 });
    await copyFile(NGINX_MAIN, join(dir, 'nginx.conf'));
    const rendered = await renderGatewayConf({ NGINX_LISTEN: opts.NGINX_LISTEN, GATEWAY_ADDRESS: opts.GATEWAY_ADDRESS });
    await writeFile(join(dir, 'gateway.conf'), opts.edit ? opts.edit(rendered) : rendered);
  } catch (err) {
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
  // `-e stderr`: builds whose compiled-in error log is a file write nothing there before the configuration is read.
  const child = spawn(bin, ['-p', `${dir}/`, '-c', join(dir, 'nginx.conf'), '-e', 'stderr'], { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let out = '';
  const collect = (chunk: Buffer) => {
    out += chunk.toString();
    opts.onOutput?.(chunk);
  };
  child.stdout!.on('data', collect);
  child.stderr!.on('data', collect);
  const exited = new Promise<number | string>((resolve) => child.once('exit', (code, signal) => resolve(code ?? signal ?? 'unknown')));
  const pidFile = join(dir, 'nginx.pid');
  // No line says "ready" (daemon off): wait for the pid file, which nginx writes once it listens.
  const ready = new Promise<void>((resolve, reject) => {
      const watcher = watch(dir);
      const check = () => {
        void readFile(pidFile, 'utf8').then(
          (text) => {
            if (text.trim() === String(child.pid)) {
              watcher.close();
              resolve();
            }
          },
          () => {},
        );
      };
      watcher.on('change', check);
      check();
      void exited.then((code) => {
        watcher.close();
        reject(new Error(`nginx exited with ${code} before it listened:\n${out}`));
      });
  });
  let stopping: Promise<number | string> | null = null;
  const proc: NginxProcess = {
    child,
    dir,
    output: () => out,
    exited,
    bodyTempFiles: async () => readdir(join(dir, 'temp', 'client_body'), { recursive: true }).catch(() => []),
    stop(graceful = false) {
      stopping ??= (async () => {
        if (child.exitCode === null && child.signalCode === null) child.kill(graceful ? 'SIGQUIT' : 'SIGTERM');
        const code = await exited;
        await rm(dir, { recursive: true, force: true });
        return code;
      })();
      return stopping;
    },
  };
  try {
    await ready;
  } catch (err) {
    await proc.stop();
    throw err;
  }
  return proc;
}
