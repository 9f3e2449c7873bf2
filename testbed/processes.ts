/**
 * Gateways and uploaders as real processes (`node dist/src/main.js`, `node
 * dist/src/uploader/main.js`), configured through a CONFIG_FILE, killed in teardown. Each is
 * spawned with an IPC channel, over which it tells its state changes
 * (src/observability/state-events.ts): `changes` emits them for `whenChanged`.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { DeepPartial, Config } from '../src/config/config.js';
import { DEMO_CLIENTS_PATH } from '../src/config/config.js';
import { edgeConfig, tempDir, WEBHOOK_SECRET } from './env.js';
import type { S3Endpoint } from './s3.js';

interface Teardown {
  teardown(fn: () => unknown): void;
}

const GATEWAY = fileURLToPath(new URL('../src/main.js', import.meta.url));
const UPLOADER = fileURLToPath(new URL('../src/uploader/main.js', import.meta.url));

export interface Proc {
  readonly child: ChildProcess;
  /**
   * Emits `change` after writes of this process that may change a status answer, and of every
   * other process the same test (`t`) spawned: one emitter for them all, since with shared
   * stores (NATS, S3) a gateway's answer changes by another gateway's or the uploader's
   * writes too. Undefined when spawned with `stateEvents: false`.
   */
  readonly changes: EventEmitter | undefined;
  /** Output so far (stdout and stderr), for failure messages. */
  output(): string;
  /** SIGKILL and wait for the exit. */
  kill(): Promise<void>;
  /** SIGTERM and wait for the exit code. */
  stop(): Promise<number | null>;
}

export interface GatewayProc extends Proc {
  url: string;
}

/** The distributed configuration for one NATS and one S3 server. */
export function distributed(natsUrl: string, s3: S3Endpoint): DeepPartial<Config> {
  return {
    clientsFile: DEMO_CLIENTS_PATH,
    nats: { url: natsUrl },
    s3: { endpoint: s3.endpoint, bucket: s3.bucket, region: s3.region, accessKeyId: s3.accessKeyId, secretAccessKey: s3.secretAccessKey, createBucket: true },
    connector: { webhookSecret: WEBHOOK_SECRET, emulatorDelayMs: 50 },
  };
}

export interface LaunchOptions {
  /**
   * Whether the process gets the IPC channel that tells its state changes (default true).
   * Benches turn it off: the gateway they measure runs as in production, without one.
   */
  stateEvents?: boolean;
}

/** For benches: the gateway measured has no IPC channel, as in production. */
export const AS_IN_PRODUCTION: LaunchOptions = { stateEvents: false };

/** The one `changes` emitter of the processes a test spawns (see `Proc.changes`). */
const testChanges = new WeakMap<Teardown, EventEmitter>();

function changesOf(t: Teardown): EventEmitter {
  let changes = testChanges.get(t);
  if (!changes) {
    changes = new EventEmitter();
    changes.setMaxListeners(0);
    testChanges.set(t, changes);
  }
  return changes;
}

async function launch(
  t: Teardown,
  script: string,
  config: DeepPartial<Config>,
  ready: RegExp,
  env: Record<string, string> = {},
  nodeArgs: string[] = [],
  wrap: string[] = [],
  opts: LaunchOptions = {},
): Promise<{ proc: Proc; match: RegExpMatchArray }> {
  const dir = await tempDir(t, 'ingest-proc-');
  const configFile = join(dir, 'config.json');
  await writeFile(configFile, JSON.stringify({ port: 0, dataDir: join(dir, 'data'), ...edgeConfig(), ...config }));
  // `wrap` runs the process inside something (`ip netns exec <ns>`, which execs it: the child is the process).
  const [cmd, ...args] = [...wrap, process.execPath, ...nodeArgs, script];
  const stateEvents = opts.stateEvents ?? true;
  const child = spawn(cmd!, args, {
    env: { PATH: process.env.PATH, CONFIG_FILE: configFile, ...env },
    stdio: stateEvents ? ['ignore', 'pipe', 'pipe', 'ipc'] : ['ignore', 'pipe', 'pipe'],
  });
  const changes = stateEvents ? changesOf(t) : undefined;
  if (changes) {
    child.on('message', (m: { event?: unknown }) => {
      if (m?.event === 'state-change') changes.emit('change');
    });
    // The channel alone does not keep this process alive; a child gone closes it.
    child.channel?.unref();
  }
  let out = '';
  let asked = false;
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  // A process that dies on its own says why in the test's output (a failing request alone would only say ECONNREFUSED).
  void exited.then((code) => {
    if (!asked) process.stderr.write(`# ${script} exited on its own (${code ?? `signal ${child.signalCode}`}); its last output:\n${out.slice(-4000)}\n`);
  });
  const proc: Proc = {
    child,
    changes,
    output: () => out,
    async kill() {
      asked = true;
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    },
    async stop() {
      asked = true;
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      return exited;
    },
  };
  t.teardown(() => proc.kill());
  const match = await new Promise<RegExpMatchArray>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${script} not ready in 30 s:\n${out}`)), 30_000);
    const onData = (chunk: Buffer) => {
      out += chunk.toString();
      const m = ready.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m);
      }
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', (chunk: Buffer) => {
      out += chunk.toString();
    });
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`${script} exited with ${code ?? `signal ${child.signalCode}`}:\n${out}`));
    });
  });
  return { proc, match };
}

/**
 * `env`: more environment variables of the process (e.g. the allocator's, as the image sets them); `nodeArgs`: Node's own flags (e.g. `--cpu-prof`);
 * `wrap`: a command prefix that runs it on another host (`ip netns exec <ns>`, testbed/netns.ts).
 */
export async function spawnGateway(
  t: Teardown,
  config: DeepPartial<Config>,
  env: Record<string, string> = {},
  nodeArgs: string[] = [],
  wrap: string[] = [],
  opts: LaunchOptions = {},
): Promise<GatewayProc> {
  const { proc, match } = await launch(t, GATEWAY, config, /listening on (http:\/\/\S+)/, env, nodeArgs, wrap, opts);
  return Object.assign(proc, { url: match[1]! });
}

export async function spawnUploader(t: Teardown, config: DeepPartial<Config>, wrap: string[] = []): Promise<Proc> {
  const { proc } = await launch(t, UPLOADER, config, /uploader ready/, {}, [], wrap);
  return proc;
}
