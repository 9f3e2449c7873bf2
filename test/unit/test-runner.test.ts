/**
 * The test command itself: tap as package.json configures it, on two throwaway files in a
 * temp project. A file that crashes (a V8 fatal error aborts the process) must fail the
 * run. No test process may get a TypeScript hook: the suite runs compiled JavaScript, and
 * tap's TypeScript loader was loaded in the first run after `npm ci`, before tap had
 * rebuilt its plugin set (`npm test`'s pretest runs `tap build` for that). And test
 * processes run without `require()` of ES modules: piscina loads the validation worker with
 * `require()` first, and Node 20's `require(esm)` under tap's own require hook (processinfo,
 * through pirates) now and then kills the process with a V8 fatal error
 * (`v8::Module::IsGraphAsync`, `ToLocalChecked Empty MaybeLocal` in `loadESMFromCJS`);
 * without it piscina falls back to `import()`.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { readFile, symlink, writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { TAP_FLAGS } from '../matrix.js';
import { tempDir } from '../support/harness.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');

/** Plain TAP from files that import nothing. */
const PASSING = `process.stdout.write('TAP version 14\\n# execArgv ' + JSON.stringify(process.execArgv) + '\\nok 1 - fine\\n1..1\\n');\n`;
const CRASHING = `process.stdout.write('TAP version 14\\nok 1 - before the crash\\n');\nprocess.abort();\n`;

interface Run {
  code: number | null;
  out: string;
}

/** `tap` with the options of `npm test` (its tap config and the flags of scripts/test.ts), on `files` in `cwd`. */
async function runTap(cwd: string, files: string[]): Promise<Run> {
  const pkg = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { tap: unknown };
  await writeFile(join(cwd, 'package.json'), JSON.stringify({ name: 'runner-check', private: true, type: 'module', tap: pkg.tap }));
  await symlink(join(ROOT, 'node_modules'), join(cwd, 'node_modules')); // tap resolves itself from the project
  // The outer tap's variables would make the inner one report as its child.
  const env = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith('TAP') && !key.startsWith('_TAPJS')));
  const child = spawn(process.execPath, [join(ROOT, 'node_modules/tap/dist/esm/run.mjs'), ...TAP_FLAGS, ...files], {
    cwd,
    env: { ...env, NO_COLOR: '1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (out += chunk.toString()));
  const [code] = (await once(child, 'close')) as [number | null];
  return { code, out };
}

const typescriptHooks = (flags: readonly string[]) => flags.filter((flag) => /typescript|ts-node|tsx/i.test(flag));

// First: a rebuild of tap's plugin set by the crash test's run would hide a stale one.
t.test('test processes get no TypeScript hook', async (t) => {
  t.same(typescriptHooks(process.execArgv), [], 'this process, started by the runner');
  const dir = await tempDir(t, 'runner-hooks-');
  await writeFile(join(dir, 'passing.test.js'), PASSING);
  const run = await runTap(dir, ['passing.test.js']);
  t.equal(run.code, 0, run.out);
  const execArgv = /# execArgv (.*)/.exec(run.out)?.[1];
  t.ok(execArgv, 'the test process reported its flags');
  const flags = JSON.parse(execArgv ?? '[]') as string[];
  t.same(typescriptHooks(flags), [], `a fresh run's test process: ${flags.join(' ')}`);
  t.ok(flags.includes('--no-experimental-require-module'), 'and no require() of ES modules');
});

t.test('a test file that crashes fails the run', async (t) => {
  const dir = await tempDir(t, 'runner-crash-');
  await writeFile(join(dir, 'passing.test.js'), PASSING);
  await writeFile(join(dir, 'crashing.test.js'), CRASHING);
  const run = await runTap(dir, ['passing.test.js', 'crashing.test.js']);
  t.not(run.code, 0, 'the command exits non-zero');
  t.match(run.out, /not ok \d+ - crashing\.test\.js/, 'the crashed file is reported as failed');
  t.match(run.out, /signal: SIGABRT/, 'with the signal that ended it');
  t.match(run.out, /ok \d+ - passing\.test\.js/, 'the other file still ran');
});
