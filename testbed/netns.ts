/**
 * Hosts of their own for the network drills: one Linux network namespace per host, joined by
 * veth links to bridges that live in a "switch" namespace of the run, each network a private
 * /24 chosen per run. The test process itself (the root namespace) can join a network too
 * (`observer`), to start things and read results back. A link is cut by setting its switch
 * end down: the host keeps its address and routes, and what it sends is dropped without a
 * word — a silent partition, as a pulled cable or a dead switch port is, not a refused
 * connection. A host on two networks (a gateway on the clients' and the storage network) can
 * lose one and keep the other. This machine has neither nft nor iptables nor tc netem, so
 * separate networks are the finer tool.
 *
 * Names carry the run (`nsd<pid>.<k>-<host>`), so test files running at once never clash, and
 * a run that crashed before its teardown is cleaned by the next one (its pid is gone).
 * Needs root and `ip` (iproute2): without them `makeTopology` fails, saying so.
 */
import { execFile, spawn, spawnSync, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { delimiter, join } from 'node:path';
import { promisify } from 'node:util';

interface Teardown {
  teardown(fn: () => unknown): void;
}

const run = promisify(execFile);
const PREFIX = 'nsd';
const OWN = /^nsd(\d+)\.(\d+)(?:-|\.|$)/;

export interface TopologySpec {
  /** Network names, e.g. `['front', 'nats', 's3']`. */
  networks: string[];
  /** Host name → the networks it is on, in order (its first address is on the first). */
  hosts: Record<string, string[]>;
  /** Networks the test process joins (address `.254`), to start things and read results back. */
  observer?: string[];
}

export interface Host {
  readonly name: string;
  /** The namespace, `nsd<pid>.<k>-<name>`. */
  readonly ns: string;
  /** The host's address on `network`. */
  addr(network: string): string;
  /** The command prefix that runs a program in this host: `ip netns exec <ns>`. */
  readonly wrap: string[];
  /** Starts `cmd` in this host (the process is `cmd` itself: `ip netns exec` execs it). */
  spawn(cmd: string, args: string[], opts?: SpawnOptions): ChildProcess;
}

export interface Topology {
  readonly hosts: Record<string, Host>;
  /** The test process's address on `network` (an `observer` network). */
  observerAddr(network: string): string;
  /** Cuts `host` off `network` (every network of the host if none is named). */
  cut(host: string, network?: string): Promise<void>;
  /** Undoes `cut`. */
  heal(host: string, network?: string): Promise<void>;
  /** Removes every namespace and link of the run (also registered with the test's teardown). */
  destroy(): Promise<void>;
}

let runs = 0;

/** `ip` of iproute2: on PATH or where Debian puts it. */
export function ipBinary(): string | null {
  for (const dir of [...(process.env.PATH ?? '').split(delimiter), '/usr/sbin', '/sbin', '/usr/bin', '/bin']) {
    if (!dir) continue;
    try {
      accessSync(join(dir, 'ip'), constants.X_OK);
      return join(dir, 'ip');
    } catch {
      // not here
    }
  }
  return null;
}

async function ip(...args: string[]): Promise<string> {
  try {
    return (await run(IP(), args, { maxBuffer: 1 << 20 })).stdout;
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new Error(`ip ${args.join(' ')}: ${(e.stderr ?? '').trim() || e.message}`);
  }
}

function IP(): string {
  const bin = ipBinary();
  if (bin === null) throw new Error('network drills need `ip` (Debian package iproute2) and root: install it with `apt-get install -y iproute2`');
  return bin;
}

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
};

/** SIGKILL of every process in `ns`, then the namespace removed (its veths go with it). */
async function removeNamespace(ns: string): Promise<void> {
  const pids = (await ip('netns', 'pids', ns).catch(() => ''))
    .split('\n')
    .map(Number)
    .filter((p) => p > 0);
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone already
    }
  }
  // A killed process leaves the namespace when it is reaped; `ip netns del` only unmounts the name, so it never waits for that.
  await ip('netns', 'del', ns).catch(() => undefined);
}

/** Namespaces and root-namespace links of earlier runs whose process is gone (a crash, a tap timeout). */
export async function cleanLeftovers(): Promise<string[]> {
  const removed: string[] = [];
  for (const line of (await ip('netns', 'list')).split('\n')) {
    const ns = line.split(' ')[0] ?? '';
    const m = OWN.exec(ns);
    if (!m || alive(Number(m[1]))) continue;
    await removeNamespace(ns);
    removed.push(ns);
  }
  for (const line of (await ip('-o', 'link', 'show')).split('\n')) {
    const dev = /^\d+:\s+([^:@\s]+)/.exec(line)?.[1] ?? '';
    const m = OWN.exec(dev);
    if (!m || alive(Number(m[1]))) continue;
    // Usually gone already with its peer's namespace.
    if (await ip('link', 'del', dev).then(() => true, () => false)) removed.push(dev);
  }
  return removed;
}

/** A /24 per network: `10.<a>.<b>` not routed here yet (the root namespace holds every observer's routes). */
async function chooseSubnets(n: number): Promise<string[]> {
  const routed = await ip('-4', 'route', 'show', 'table', 'all');
  const taken = (prefix: string): boolean => routed.includes(`${prefix}.`);
  const out: string[] = [];
  for (let tries = 0; out.length < n; tries++) {
    if (tries > 1000) throw new Error('no free 10.x.y.0/24 for the network drill');
    const prefix = `10.${100 + Math.floor(Math.random() * 100)}.${Math.floor(Math.random() * 256)}`;
    if (!taken(prefix) && !out.includes(prefix)) out.push(prefix);
  }
  return out;
}

/** Why the drill cannot run here, or null when it can. */
export function netnsUnavailable(): string | null {
  if (process.getuid?.() !== 0) return 'network drills make network namespaces: they need root (CI runs the suite as root)';
  if (ipBinary() === null) return 'network drills need `ip` (Debian package iproute2)';
  const probe = spawnSync(ipBinary()!, ['netns', 'list'], { encoding: 'utf8' });
  if (probe.status !== 0) return `\`ip netns list\` failed: ${probe.stderr.trim()}`;
  return null;
}

export async function makeTopology(t: Teardown, spec: TopologySpec): Promise<Topology> {
  const unavailable = netnsUnavailable();
  if (unavailable) throw new Error(unavailable);
  await cleanLeftovers();
  const runId = `${PREFIX}${process.pid}.${++runs}`;
  const sw = `${runId}-sw`;
  const namespaces: string[] = [];
  const rootLinks: string[] = [];
  let destroyed = false;
  const destroy = async (): Promise<void> => {
    if (destroyed) return;
    destroyed = true;
    for (const ns of namespaces.reverse()) await removeNamespace(ns);
    for (const dev of rootLinks) await ip('link', 'del', dev).catch(() => undefined);
  };
  t.teardown(destroy);

  const addNamespace = async (ns: string): Promise<void> => {
    await ip('netns', 'add', ns);
    namespaces.push(ns);
    await ip('-n', ns, 'link', 'set', 'lo', 'up');
  };

  const subnets = new Map<string, string>();
  (await chooseSubnets(spec.networks.length)).forEach((s, i) => subnets.set(spec.networks[i]!, s));
  const netIndex = (network: string): number => {
    const i = spec.networks.indexOf(network);
    if (i < 0) throw new Error(`no network ${network} in this topology (${spec.networks.join(', ')})`);
    return i;
  };

  await addNamespace(sw);
  for (let i = 0; i < spec.networks.length; i++) {
    await ip('-n', sw, 'link', 'add', `br${i}`, 'type', 'bridge');
    await ip('-n', sw, 'link', 'set', `br${i}`, 'up');
  }

  const hosts: Record<string, Host> = {};
  /** The switch-side device of (host, network). */
  const ports = new Map<string, string>();
  const names = Object.keys(spec.hosts);
  for (let h = 0; h < names.length; h++) {
    const name = names[h]!;
    const ns = `${runId}-${name}`;
    await addNamespace(ns);
    const addrs = new Map<string, string>();
    for (const network of spec.hosts[name]!) {
      const i = netIndex(network);
      const port = `h${h}n${i}`;
      const dev = `eth${i}`;
      const addr = `${subnets.get(network)}.${10 + h}`;
      await ip('-n', sw, 'link', 'add', port, 'type', 'veth', 'peer', 'name', dev, 'netns', ns);
      await ip('-n', sw, 'link', 'set', port, 'master', `br${i}`, 'up');
      await ip('-n', ns, 'addr', 'add', `${addr}/24`, 'dev', dev);
      await ip('-n', ns, 'link', 'set', dev, 'up');
      ports.set(`${name}/${network}`, port);
      addrs.set(network, addr);
    }
    const wrap = [IP(), 'netns', 'exec', ns];
    hosts[name] = {
      name,
      ns,
      wrap,
      addr(network) {
        const a = addrs.get(network);
        if (!a) throw new Error(`host ${name} is not on network ${network}`);
        return a;
      },
      spawn: (cmd, args, opts = {}) => spawn(wrap[0]!, [...wrap.slice(1), cmd, ...args], opts),
    };
  }

  const observer = new Map<string, string>();
  for (const network of spec.observer ?? []) {
    const i = netIndex(network);
    const dev = `${runId}.${i}`;
    if (dev.length > 15) throw new Error(`interface name ${dev} is too long`);
    await ip('link', 'add', dev, 'type', 'veth', 'peer', 'name', `obs${i}`, 'netns', sw);
    rootLinks.push(dev);
    await ip('-n', sw, 'link', 'set', `obs${i}`, 'master', `br${i}`, 'up');
    await ip('addr', 'add', `${subnets.get(network)}.254/24`, 'dev', dev);
    await ip('link', 'set', dev, 'up');
    observer.set(network, `${subnets.get(network)}.254`);
  }

  const setLinks = async (host: string, network: string | undefined, state: 'up' | 'down'): Promise<void> => {
    if (!spec.hosts[host]) throw new Error(`no host ${host} in this topology`);
    for (const n of network ? [network] : spec.hosts[host]!) {
      const port = ports.get(`${host}/${n}`);
      if (!port) throw new Error(`host ${host} is not on network ${n}`);
      await ip('-n', sw, 'link', 'set', port, state);
    }
  };

  return {
    hosts,
    observerAddr(network) {
      const a = observer.get(network);
      if (!a) throw new Error(`the test process is not on network ${network}`);
      return a;
    },
    cut: (host, network) => setLinks(host, network, 'down'),
    heal: (host, network) => setLinks(host, network, 'up'),
    destroy,
  };
}
