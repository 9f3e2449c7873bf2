/**
 * Real `nats-server` processes for tests: loopback only, free ports, JetStream on, a fresh
 * store directory per server (or one the test owns, such as a faultfs mount), teardown
 * registered as soon as each resource exists. The machine's own NATS (4222) is never
 * touched. The binary is found as `prerequisites.ts` says (`NATS_SERVER_BIN`, else the one
 * `npm test` fetched into `.tools/nats-server/`).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { connect } from 'nats';
import { installHint, natsServerPath } from './prerequisites.js';

interface Teardown {
  teardown(fn: () => unknown): void;
}

export interface NatsServer {
  /** `nats://127.0.0.1:<port>` */
  readonly url: string;
  readonly name: string;
  readonly storeDir: string;
  readonly running: boolean;
  /** SIGTERM, and waits for the exit (SIGKILL after 10 s). */
  stop(): Promise<void>;
  /** SIGKILL: a crash. The signal is sent before this returns, so kills made in one tick land together. */
  kill(): Promise<void>;
  /** fsync and fdatasync calls of the server so far, per stream (`other`: the server's own files); started with `countSyncs`. */
  fsyncs(): Promise<Map<string, number>>;
  /** Stops if running, then starts again on the same port and store; resolves when JetStream answers. */
  restart(): Promise<void>;
  /** SIGSTOP: the server holds its connections and answers nothing (a hung disk, a frozen host). */
  pause(): void;
  /** SIGCONT after `pause`. */
  resume(): void;
  /** The server's last log lines since it last started (up to 200 are kept), oldest first. */
  logTail(lines: number): string[];
}

export interface NatsCluster {
  readonly servers: NatsServer[];
  /** Every node's URL, comma-separated, as `connectNats` takes them. */
  readonly urls: string;
}

const READY_TIMEOUT_MS = 20_000;
/** The JetStream settings docker-compose.yml and every server of the tests share. */
export const JETSTREAM_CONF = fileURLToPath(new URL('../../config/nats/jetstream.conf', import.meta.url));
/**
 * The cluster node docker-compose.yml runs, made per node by environment variables
 * (`NATS_SERVER_NAME`, `NATS_STORE_DIR`, `NATS_CLUSTER_NAME`, `NATS_ROUTES`); it includes
 * jetstream.conf. The network drills run it unchanged, one node per network namespace.
 */
export const CLUSTER_CONF = fileURLToPath(new URL('../../config/nats/cluster.conf', import.meta.url));
/** The ports cluster.conf listens on (every address of its host). */
export const CLUSTER_CONF_PORTS = { client: 4222, route: 6222, monitor: 8222 } as const;

/** A node on a host of its own: the shipped cluster.conf with its variables, run under a command prefix. */
interface NetLaunch {
  url: string;
  env: Record<string, string>;
  /** Runs the server on the host (`ip netns exec <ns>`). */
  wrap: string[];
}

export interface NatsOptions {
  name?: string;
  /**
   * The JetStream store in this directory, which the caller owns (e.g. a faultfs mount that
   * outlives the server's restarts); the teardown then kills the server and leaves it. By
   * default a fresh temp dir, removed at teardown.
   */
  storeDir?: string;
  /**
   * `sync_interval` written after the include of config/nats/jetstream.conf, which it then
   * overrides (nats-server takes a key's last value: `/varz` shows `sync_always` gone with
   * `"2m"`, and the power-cut drill's control would fail if it did not). Only for drills that
   * show what the shipped `always` prevents.
   */
  syncInterval?: string;
  /**
   * Counts the server's fsync and fdatasync calls (strace with a seccomp filter, so the other
   * calls run at full speed): `fsyncs()` reads the count so far. For the bench.
   */
  countSyncs?: boolean;
  /**
   * Clients connect (without credentials) into an account whose JetStream file storage is
   * limited to this (e.g. `3MB`), as a hosted or multi-tenant NATS sets a quota: a write past
   * it is refused with "resource limits exceeded for account" (10002).
   */
  accountMaxFile?: string;
  /** The server's `max_payload` in bytes (its default: 1 MiB). */
  maxPayload?: number;
  /** The CPUs the server (and its strace) may run on, as `taskset -c` takes them: for the bench. */
  cpus?: string;
}

export async function startNats(t: Teardown, opts: NatsOptions = {}): Promise<NatsServer> {
  const [port] = await freePorts(1);
  const dir = await mkdtemp(join(tmpdir(), 'ingest-nats-'));
  const node = new Node(t, opts.name ?? 'n1', port!, dir, null, opts);
  await node.start();
  await waitForJetStream([node.url]);
  return node;
}

export async function startNatsCluster(t: Teardown, size = 3): Promise<NatsCluster> {
  const ports = await freePorts(size * 2);
  const routes = Array.from({ length: size }, (_, i) => `nats-route://127.0.0.1:${ports[size + i]}`);
  const nodes: Node[] = [];
  for (let i = 0; i < size; i++) {
    const dir = await mkdtemp(join(tmpdir(), `ingest-nats-n${i + 1}-`));
    const cluster = { name: 'ingest-test', port: ports[size + i]!, routes: routes.filter((_, j) => j !== i) };
    nodes.push(new Node(t, `n${i + 1}`, ports[i]!, dir, cluster));
  }
  await Promise.all(nodes.map((n) => n.start()));
  // JetStream answers only once the cluster has elected its meta leader.
  await waitForJetStream(nodes.map((n) => n.url));
  return { servers: nodes, urls: nodes.map((n) => n.url).join(',') };
}

/** A node of a cluster whose hosts are network namespaces (testbed/netns.ts). */
export interface NetNode {
  name: string;
  /** The host's address the clients and the other nodes reach it on. */
  address: string;
  /** The command prefix that runs a program on the host (`ip netns exec <ns>`). */
  wrap: string[];
}

/**
 * A cluster of `nodes`, each running config/nats/cluster.conf as docker-compose.yml does
 * (the same file, the same variables; routes to every node, its own included, as there).
 * Resolves once JetStream answers on every node, asked from the test process.
 */
export async function startNatsNetCluster(t: Teardown, nodes: NetNode[], opts: { cluster?: string } = {}): Promise<NatsCluster> {
  const routes = `[${nodes.map((n) => `nats://${n.address}:${CLUSTER_CONF_PORTS.route}`).join(', ')}]`;
  const servers: Node[] = [];
  for (const n of nodes) {
    const dir = await mkdtemp(join(tmpdir(), `ingest-nats-${n.name}-`));
    const net: NetLaunch = {
      url: `nats://${n.address}:${CLUSTER_CONF_PORTS.client}`,
      env: { NATS_SERVER_NAME: n.name, NATS_STORE_DIR: dir, NATS_CLUSTER_NAME: opts.cluster ?? 'ingest', NATS_ROUTES: routes },
      wrap: n.wrap,
    };
    servers.push(new Node(t, n.name, 0, dir, null, {}, net));
  }
  await Promise.all(servers.map((s) => s.start()));
  await waitForJetStream(servers.map((s) => s.url));
  return { servers, urls: servers.map((s) => s.url).join(',') };
}

class Node implements NatsServer {
  readonly url: string;
  readonly storeDir: string;
  readonly #config: string;
  readonly #syncInterval: string | null;
  readonly #syncLog: string | null;
  readonly #accountMaxFile: string | null;
  readonly #maxPayload: number | null;
  readonly #cpus: string | null;
  #proc: ChildProcess | null = null;
  #exited: Promise<void> = Promise.resolve();
  #log: string[] = [];

  constructor(
    t: Teardown,
    readonly name: string,
    readonly port: number,
    dir: string,
    readonly cluster: { name: string; port: number; routes: string[] } | null,
    opts: Pick<NatsOptions, 'storeDir' | 'syncInterval' | 'countSyncs' | 'accountMaxFile' | 'maxPayload' | 'cpus'> = {},
    /** On a host of its own: cluster.conf under a command prefix, instead of a config written here. */
    readonly net: NetLaunch | null = null,
  ) {
    this.url = net?.url ?? `nats://127.0.0.1:${port}`;
    // `dir` is the server's own: its configuration, and its store unless the caller gives one.
    this.#config = join(dir, 'server.conf');
    this.storeDir = opts.storeDir ?? dir;
    this.#syncInterval = opts.syncInterval ?? null;
    this.#syncLog = opts.countSyncs ? join(dir, 'syncs.strace') : null;
    this.#accountMaxFile = opts.accountMaxFile ?? null;
    this.#maxPayload = opts.maxPayload ?? null;
    this.#cpus = opts.cpus ?? null;
    // Registered the moment the directory has an owner: kill first, so nothing writes into it during the removal.
    t.teardown(async () => {
      await this.kill();
      await rm(dir, { recursive: true, force: true });
    });
  }

  /** fsync and fdatasync calls of the server so far, per stream (`countSyncs`). */
  async fsyncs(): Promise<Map<string, number>> {
    if (!this.#syncLog) throw new Error('started without countSyncs');
    const text = await readFile(this.#syncLog, 'utf8').catch(() => '');
    // One line per call ("fsync(9</…/streams/KV_x/msgs/1.blk>) = 0", or "… <unfinished ...>" then a resumed line without the parenthesis).
    const counts = new Map<string, number>();
    for (const line of text.split('\n')) {
      if (!/\bf(?:data)?sync\(/.test(line)) continue;
      const stream = /\/streams\/([^/>]+)/.exec(line)?.[1] ?? 'other';
      counts.set(stream, (counts.get(stream) ?? 0) + 1);
    }
    return counts;
  }

  get running(): boolean {
    return this.#proc !== null;
  }

  logTail(lines: number): string[] {
    return this.#log.slice(-lines);
  }

  async start(): Promise<void> {
    if (this.#proc) throw new Error(`nats-server ${this.name} is already running`);
    const config = this.net ? CLUSTER_CONF : this.#config;
    if (!this.net) await writeFile(this.#config, this.#configText());
    const server = [natsServerBin(), '-c', config];
    const local = this.#syncLog
      ? ['strace', '-f', '-qq', '-y', '--seccomp-bpf', '-e', 'trace=fsync,fdatasync', '-e', 'signal=none', '-o', this.#syncLog, ...server]
      : server;
    const [cmd, ...args] = this.net ? [...this.net.wrap, ...server] : this.#cpus === null ? local : ['taskset', '-c', this.#cpus, ...local];
    const proc = spawn(cmd!, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...this.net?.env } });
    this.#proc = proc;
    this.#log = [];
    let sawReady: () => void = () => {};
    const readyLine = new Promise<true>((resolve) => (sawReady = () => resolve(true)));
    const keep = (chunk: Buffer): void => {
      const text = chunk.toString('utf8');
      this.#log.push(...text.split('\n').filter(Boolean));
      if (this.#log.length > 200) this.#log.splice(0, this.#log.length - 200);
      if (text.includes('Server is ready')) sawReady();
    };
    proc.stdout!.on('data', keep);
    proc.stderr!.on('data', keep);
    // A test process that dies without its teardown (a tap timeout) takes its servers with it.
    const orphaned = (): void => {
      proc.kill('SIGKILL');
    };
    process.once('exit', orphaned);
    this.#exited = new Promise((resolve) => proc.once('exit', () => resolve()));
    void this.#exited.then(() => {
      process.removeListener('exit', orphaned);
      if (this.#proc === proc) this.#proc = null;
    });
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), READY_TIMEOUT_MS)));
    const ready = await Promise.race([readyLine, this.#exited.then(() => false), late]);
    clearTimeout(timer);
    if (!ready) {
      await this.kill();
      throw new Error(`nats-server ${this.name} did not start:\n${this.#log.slice(-20).join('\n')}`);
    }
  }

  async stop(): Promise<void> {
    const proc = this.#proc;
    if (!proc) return;
    proc.kill('SIGCONT'); // a paused server would not act on SIGTERM
    proc.kill('SIGTERM');
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'late'>((resolve) => (timer = setTimeout(() => resolve('late'), 10_000)));
    const outcome = await Promise.race([this.#exited, late]);
    clearTimeout(timer);
    if (outcome === 'late') await this.kill();
  }

  async kill(): Promise<void> {
    const proc = this.#proc;
    if (!proc) return;
    // Under strace (countSyncs) the server is strace's child, which a killed strace would leave running.
    if (this.#syncLog) {
      const children = await readFile(`/proc/${proc.pid}/task/${proc.pid}/children`, 'utf8').catch(() => '');
      for (const pid of children.split(/\s+/).filter(Boolean)) process.kill(Number(pid), 'SIGKILL');
    }
    proc.kill('SIGKILL');
    await this.#exited;
  }

  pause(): void {
    this.#proc?.kill('SIGSTOP');
  }

  resume(): void {
    this.#proc?.kill('SIGCONT');
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.start();
    await waitForJetStream([this.url]);
  }

  #configText(): string {
    const lines = [
      `server_name: "${this.name}"`,
      `listen: "127.0.0.1:${this.port}"`,
      ...(this.#maxPayload === null ? [] : [`max_payload: ${this.#maxPayload}`]),
      `jetstream {`,
      `  store_dir: ${JSON.stringify(this.storeDir)}`,
      // What every shipped configuration runs (sync_interval: always); nats-server resolves an include from the config's folder.
      `  include ${JSON.stringify(relative(dirname(this.#config), JETSTREAM_CONF))}`,
      ...(this.#syncInterval === null ? [] : [`  sync_interval: ${JSON.stringify(this.#syncInterval)}`]),
      `}`,
    ];
    if (this.#accountMaxFile !== null) {
      lines.push(
        `accounts { INGEST { jetstream { max_file: ${this.#accountMaxFile}, max_mem: 1MB }, users [ { user: ingest, password: ingest } ] } }`,
        `no_auth_user: ingest`,
      );
    }
    if (this.cluster) {
      lines.push(
        `cluster {`,
        `  name: "${this.cluster.name}"`,
        `  listen: "127.0.0.1:${this.cluster.port}"`,
        `  routes: [${this.cluster.routes.map((r) => JSON.stringify(r)).join(', ')}]`,
        `}`,
      );
    }
    return `${lines.join('\n')}\n`;
  }
}

/** Until every URL answers `$JS.API.INFO` (bounded). */
async function waitForJetStream(urls: string[]): Promise<void> {
  const deadline = Date.now() + READY_TIMEOUT_MS;
  for (const url of urls) {
    let last: unknown;
    for (;;) {
      const nc = await connect({ servers: url, timeout: 2000, reconnect: false }).catch((err: unknown) => {
        last = err;
        return null;
      });
      if (nc) {
        try {
          const jsm = await nc.jetstreamManager({ timeout: 2000 });
          await jsm.getAccountInfo();
          break;
        } catch (err) {
          last = err;
        } finally {
          await nc.close();
        }
      }
      if (Date.now() > deadline) throw new Error(`JetStream at ${url} not ready: ${String(last)}`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}

/** Ports the OS just handed out on loopback; all held at once so they differ, then released. */
export async function freePorts(n: number): Promise<number[]> {
  const servers = await Promise.all(
    Array.from(
      { length: n },
      () =>
        new Promise<ReturnType<typeof createServer>>((resolve, reject) => {
          const s = createServer();
          s.once('error', reject);
          s.listen(0, '127.0.0.1', () => resolve(s));
        }),
    ),
  );
  const ports = servers.map((s) => (s.address() as AddressInfo).port);
  await Promise.all(servers.map((s) => new Promise((resolve) => s.close(resolve))));
  return ports;
}

function natsServerBin(): string {
  const path = natsServerPath();
  if (path === null) throw new Error(installHint(['nats-server']));
  return path;
}
