#!/usr/bin/env node
/**
 * The programs the suite needs beside Node: `nats-server` (the NATS contract, e2e and drill
 * suites start their own), Chromium (`test/e2e/docs-page.test.ts`), curl (the README's
 * walk-through, `test/e2e/readme.test.ts`), and libfuse3 with fusermount3, gcc and
 * pkg-config for faultfs (`testbed/faultfs/`, the power-cut drill's file layer, built here
 * into `.tools/faultfs/`), and nginx (the shipped reverse proxy, `config/nginx/`, which
 * `test/e2e/proxy.test.ts` runs in front of a gateway). Where each is
 * looked for is decided here, once, for the tests and for `npm test`, which runs this file
 * first (`pretest`): a missing one is installed from Debian with apt-get when the user is
 * root, else the run stops with one line naming the package and the command.
 */
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { accessSync, constants, mkdirSync, mkdtempSync, readdirSync, readFileSync, realpathSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { nginxPath } from '../src/proxy/nginx.js';

interface Prerequisite {
  /** The Debian package that provides it. */
  readonly debian: string;
  /** The variable that names the binary instead, if there is one. */
  readonly env?: string;
  /** The binary, or null when it is not on this machine. */
  find(): string | null;
}

const executable = (path: string): boolean => {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
};

/** `name` on PATH or in the directories Debian and installers use. */
function onPath(name: string, env: NodeJS.ProcessEnv): string | null {
  const dirs = [...(env.PATH ?? '').split(delimiter), '/usr/sbin', '/usr/local/bin', '/usr/bin'];
  for (const dir of dirs) if (dir && executable(join(dir, name))) return join(dir, name);
  return null;
}

/** The oldest nats-server the service supports (its own check: src/store/nats/connection.ts). */
export const NATS_SERVER_FLOOR = [2, 10, 0] as const;

/** Where `npm test` puts the nats-server it fetches from Debian (gitignored). */
export const NATS_SERVER_TOOLS = fileURLToPath(new URL('../../.tools/nats-server/', import.meta.url));
const NATS_SERVER_FETCHED = join(NATS_SERVER_TOOLS, 'usr/sbin/nats-server');

/** `NATS_SERVER_BIN`, else the one `npm test` fetched into `.tools/`; never an older one on PATH. */
export function natsServerPath(env: NodeJS.ProcessEnv = process.env): string | null {
  if (env.NATS_SERVER_BIN) return env.NATS_SERVER_BIN;
  return executable(NATS_SERVER_FETCHED) && natsServerVersionOk(NATS_SERVER_FETCHED) ? NATS_SERVER_FETCHED : null;
}

/** `nats-server --version` is at least the floor. */
export function natsServerVersionOk(bin: string): boolean {
  const out = spawnSync(bin, ['--version'], { encoding: 'utf8' });
  const m = /v?(\d+)\.(\d+)\.(\d+)/.exec(`${out.stdout ?? ''}${out.stderr ?? ''}`);
  if (!m) return false;
  const parts = [Number(m[1]), Number(m[2]), Number(m[3])];
  for (let i = 0; i < 3; i++) if (parts[i]! !== NATS_SERVER_FLOOR[i]) return parts[i]! > NATS_SERVER_FLOOR[i]!;
  return true;
}

/**
 * Fetches Debian's current nats-server (suite `sid`; the machine's own release may carry an
 * end-of-life one) into `.tools/nats-server/` without touching the machine's apt setup: a
 * sources list and a lists directory of its own, `apt-get download`, `dpkg-deb -x`. The
 * mirror is the one the machine's apt uses. Returns the binary, or null with the reason logged.
 */
export function fetchNatsServer(log: (line: string) => void): string | null {
  const work = mkdtempSync(join(tmpdir(), 'ingest-apt-'));
  try {
    const lists = join(work, 'lists');
    mkdirSync(join(lists, 'partial'), { recursive: true });
    const sources = join(work, 'sources.list');
    writeFileSync(sources, `deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${debianMirror()} sid main\n`);
    const opts = ['-o', `Dir::Etc::sourcelist=${sources}`, '-o', 'Dir::Etc::sourceparts=/dev/null', '-o', `Dir::State::Lists=${lists}`, '-o', 'APT::Sandbox::User=root'];
    log('fetching nats-server from Debian (sid) into .tools/nats-server for the test suite');
    const run = (cmd: string, args: string[]) => spawnSync(cmd, args, { cwd: work, stdio: ['ignore', 'ignore', 'inherit'] }).status === 0;
    if (!run('apt-get', [...opts, '-qq', 'update']) || !run('apt-get', [...opts, '-qq', 'download', 'nats-server'])) return null;
    const deb = readdirSync(work).find((f) => f.startsWith('nats-server_') && f.endsWith('.deb'));
    if (!deb) return null;
    rmSync(NATS_SERVER_TOOLS, { recursive: true, force: true });
    mkdirSync(NATS_SERVER_TOOLS, { recursive: true });
    if (!run('dpkg-deb', ['-x', join(work, deb), NATS_SERVER_TOOLS])) return null;
    return natsServerPath({});
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

/** The Debian mirror of the machine's apt sources (deb822 `URIs:` or one-line `deb`), else deb.debian.org. */
function debianMirror(): string {
  const files = ['/etc/apt/sources.list'];
  try {
    for (const f of readdirSync('/etc/apt/sources.list.d')) if (/\.(list|sources)$/.test(f)) files.push(join('/etc/apt/sources.list.d', f));
  } catch {
    // no sources.list.d
  }
  for (const f of files) {
    let text: string;
    try {
      text = readFileSync(f, 'utf8');
    } catch {
      continue;
    }
    for (const m of text.matchAll(/^(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s*)?)(\S+)/gm)) {
      const uri = m[1]!;
      if (/\/debian\/?$/.test(uri) && !/security/.test(uri)) return uri.replace(/\/$/, '');
    }
  }
  return 'http://deb.debian.org/debian';
}

/** `CHROMIUM_PATH`, else Debian's `/usr/bin/chromium`; null when that file is not there. */
export function chromiumPath(env: NodeJS.ProcessEnv = process.env): string | null {
  const path = env.CHROMIUM_PATH ?? '/usr/bin/chromium';
  return executable(path) ? path : null;
}

/** libfuse3's headers and library, as pkg-config knows them; null when it does not. */
function fuse3Flags(): string[] | null {
  const out = spawnSync('pkg-config', ['--cflags', '--libs', 'fuse3'], { encoding: 'utf8' });
  return out.status === 0 ? out.stdout.trim().split(/\s+/).filter(Boolean) : null;
}

export const PREREQUISITES: Readonly<Record<string, Prerequisite>> = {
  'nats-server': { debian: 'nats-server', env: 'NATS_SERVER_BIN', find: () => natsServerPath() },
  chromium: { debian: 'chromium', env: 'CHROMIUM_PATH', find: () => chromiumPath() },
  curl: { debian: 'curl', find: () => onPath('curl', process.env) },
  // Fault drills inject failing system calls into running processes (`strace -e inject=`).
  strace: { debian: 'strace', find: () => onPath('strace', process.env) },
  // faultfs: built with the machine's gcc against libfuse3; fusermount3 unmounts it.
  gcc: { debian: 'gcc', find: () => onPath('gcc', process.env) },
  'pkg-config': { debian: 'pkg-config', find: () => onPath('pkg-config', process.env) },
  libfuse3: { debian: 'libfuse3-dev', find: () => (fuse3Flags() ? 'pkg-config fuse3' : null) },
  fusermount3: { debian: 'fuse3', find: () => onPath('fusermount3', process.env) },
  // The reverse proxy the deployment puts in front of the gateways (config/nginx/).
  nginx: { debian: 'nginx', env: 'NGINX_BIN', find: () => nginxPath() },
};

const FAULTFS_SOURCE = fileURLToPath(new URL('../../testbed/faultfs/faultfs.c', import.meta.url));
/** Where faultfs is built (gitignored), one binary per version of its source. */
export const FAULTFS_TOOLS = fileURLToPath(new URL('../../.tools/faultfs/', import.meta.url));

/**
 * The faultfs daemon, built from `testbed/faultfs/faultfs.c` with gcc on first use and
 * cached under `.tools/faultfs/` by a hash of its source (an edit rebuilds it). Built into
 * a temp name and renamed, so test files that build it at once do not see half a binary.
 */
export function faultFsPath(): string {
  const source = readFileSync(FAULTFS_SOURCE);
  const bin = join(FAULTFS_TOOLS, `faultfs-${createHash('sha256').update(source).digest('hex').slice(0, 12)}`);
  if (executable(bin)) return bin;
  const flags = fuse3Flags();
  const missing = ['gcc', 'pkg-config', 'libfuse3', 'fusermount3'].filter((name) => PREREQUISITES[name]!.find() === null);
  if (!flags || missing.length > 0) throw new Error(installHint(missing.length > 0 ? missing : ['libfuse3']));
  mkdirSync(FAULTFS_TOOLS, { recursive: true });
  const tmp = `${bin}.${process.pid}.tmp`;
  const cc = spawnSync('gcc', ['-O2', '-Wall', '-Wextra', '-Werror', '-o', tmp, FAULTFS_SOURCE, ...flags], { encoding: 'utf8' });
  if (cc.status !== 0) throw new Error(`gcc could not build ${FAULTFS_SOURCE}:\n${cc.stderr}`);
  renameSync(tmp, bin);
  // Builds of earlier versions of the source go (a running one keeps its inode).
  for (const f of readdirSync(FAULTFS_TOOLS)) if (/^faultfs-[0-9a-f]+$/.test(f) && join(FAULTFS_TOOLS, f) !== bin) rmSync(join(FAULTFS_TOOLS, f), { force: true });
  return bin;
}

/** The line a user reads when something is missing and this process cannot install it. */
export function installHint(missing: readonly string[]): string {
  if (missing.includes('nats-server')) {
    return (
      'npm test needs nats-server >= 2.10: run it as root, which fetches Debian\'s current one (suite sid) into .tools/nats-server, ' +
      'or set NATS_SERVER_BIN to a nats-server >= 2.10' +
      (missing.length > 1 ? `; and ${installHint(missing.filter((m) => m !== 'nats-server'))}` : '')
    );
  }
  const packages = missing.map((name) => PREREQUISITES[name]!.debian).join(' ');
  const vars = missing.flatMap((name) => PREREQUISITES[name]!.env ?? []);
  return (
    `npm test needs ${missing.join(' and ')} (Debian package${missing.length > 1 ? 's' : ''} ${packages}): ` +
    `install with \`sudo apt-get install -y ${packages}\`${vars.length ? `, or set ${vars.join(' / ')} to the binary` : ''}`
  );
}

const missingNow = (): string[] => Object.keys(PREREQUISITES).filter((name) => PREREQUISITES[name]!.find() === null);

/** Installs what is missing when it can (root with apt-get); returns what is still missing. */
export function provision(log: (line: string) => void): string[] {
  const missing = missingNow();
  if (missing.length === 0) return [];
  const root = process.getuid?.() === 0;
  if (!root || spawnSync('apt-get', ['--version'], { stdio: 'ignore' }).status !== 0) return missing;
  if (missing.includes('nats-server')) fetchNatsServer(log);
  const packages = missingNow().filter((name) => name !== 'nats-server').map((name) => PREREQUISITES[name]!.debian);
  if (packages.length === 0) return missingNow();
  log(`installing ${packages.join(', ')} from Debian for the test suite (apt-get)`);
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  const apt = (args: string[]) => spawnSync('apt-get', args, { stdio: ['ignore', 'ignore', 'inherit'], env }).status === 0;
  if (apt(['update', '-qq'])) apt(['install', '-y', '-qq', ...packages]);
  return missingNow();
}

// Run as a script (`npm test`'s pretest), not imported by a test.
if (process.argv[1] && realpathSync(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const missing = provision((line) => process.stderr.write(`${line}\n`));
  if (missing.length > 0) {
    process.stderr.write(`${installHint(missing)}\n`);
    process.exit(1);
  }
  // Built once here, before the test files that mount it run side by side.
  try {
    faultFsPath();
  } catch (err) {
    process.stderr.write(`${(err as Error).message}\n`);
    process.exit(1);
  }
}
