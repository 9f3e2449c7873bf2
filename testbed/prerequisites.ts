#!/usr/bin/env node
/**
 * The programs the suite needs beside Node: `nats-server` (the NATS contract, e2e and drill
 * suites start their own), Chromium (`test/e2e/docs-page.test.ts`) and curl (the README's
 * walk-through, `test/e2e/readme.test.ts`). Where each is
 * looked for is decided here, once, for the tests and for `npm test`, which runs this file
 * first (`pretest`): a missing one is installed from Debian with apt-get when the user is
 * root, else the run stops with one line naming the package and the command.
 */
import { spawnSync } from 'node:child_process';
import { accessSync, constants, realpathSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { fileURLToPath } from 'node:url';

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

/** `NATS_SERVER_BIN`, else `nats-server` on PATH or in the usual directories. */
export function natsServerPath(env: NodeJS.ProcessEnv = process.env): string | null {
  return env.NATS_SERVER_BIN || onPath('nats-server', env);
}

/** `CHROMIUM_PATH`, else Debian's `/usr/bin/chromium`; null when that file is not there. */
export function chromiumPath(env: NodeJS.ProcessEnv = process.env): string | null {
  const path = env.CHROMIUM_PATH ?? '/usr/bin/chromium';
  return executable(path) ? path : null;
}

export const PREREQUISITES: Readonly<Record<string, Prerequisite>> = {
  'nats-server': { debian: 'nats-server', env: 'NATS_SERVER_BIN', find: () => natsServerPath() },
  chromium: { debian: 'chromium', env: 'CHROMIUM_PATH', find: () => chromiumPath() },
  curl: { debian: 'curl', find: () => onPath('curl', process.env) },
};

/** The line a user reads when something is missing and this process cannot install it. */
export function installHint(missing: readonly string[]): string {
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
  const packages = missing.map((name) => PREREQUISITES[name]!.debian);
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
}
