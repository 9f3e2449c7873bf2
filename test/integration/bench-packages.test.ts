/**
 * `bench:packages`, as a load tester runs it, in its shortest form: it measures, writes its
 * report, and exits by itself (with --floors its idle server's pipe once kept it running after
 * the report, the idle server left behind; a bench killed outright left it running too);
 * --pin-nats runs a single nats-server on a CPU of its own and says so, or refuses where the
 * bench may run on one CPU only (a `taskset` or a container's cpuset: it took the machine's).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { readFileSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t, { type Test } from 'tap';

const BENCH = fileURLToPath(new URL('../../bench/packages.js', import.meta.url));
/** The first CPU this process may run on. */
const firstCpu = /^Cpus_allowed_list:\s*(\d+)/m.exec(readFileSync('/proc/self/status', 'utf8'))![1]!;

/** Starts the bench (inside `wrap`, a command that execs it); its process and its output so far. */
async function start(t: Test, args: string[], wrap: string[] = []): Promise<{ child: ChildProcess; out: string; output: () => string }> {
  const out = await mkdtemp(join(tmpdir(), 'bench-packages-test-'));
  t.teardown(() => rm(out, { recursive: true, force: true }));
  const [cmd, ...rest] = [...wrap, process.execPath, BENCH, '--no-peer', '--duration', '1', '--out', out, ...args];
  const child = spawn(cmd!, rest, { stdio: ['ignore', 'pipe', 'pipe'] });
  t.teardown(() => void child.kill('SIGKILL'));
  let output = '';
  child.stdout!.on('data', (c: Buffer) => (output += c.toString('utf8')));
  child.stderr!.on('data', (c: Buffer) => (output += c.toString('utf8')));
  return { child, out, output: () => output };
}

/** Runs the bench to its end; its exit code, output and the one report it wrote. */
async function bench(t: Test, args: string[], wrap: string[] = []): Promise<{ code: number | null; output: string; report: string | null }> {
  const { child, out, output } = await start(t, args, wrap);
  const [code] = (await once(child, 'exit')) as [number | null];
  const files = await readdir(out);
  const report = files.length === 1 ? await readFile(join(out, files[0]!), 'utf8') : null;
  return { code, output: output(), report };
}

/** The packages/s of a target's `many` row of the report. */
function rate(report: string, target: string): number {
  const row = report.split('\n').find((line) => line.startsWith(`| service (${target}) | 16 sessions`));
  return row ? Number(row.split('|')[3]!.trim()) : NaN;
}

t.test('--floors: the run measures, writes its report and exits by itself', async (t) => {
  const r = await bench(t, ['--engine', 'embedded', '--scenario', 'many', '--floors']);
  t.equal(r.code, 0, r.output);
  t.ok(r.report, 'one report written');
  t.ok(rate(r.report ?? '', 'embedded') > 0, 'packages measured');
  t.match(r.report ?? '', /an idle process p99 [\d.]+ ms/, 'the idle process answered');
});

t.test('--floors: the idle server goes when the bench is killed outright', async (t) => {
  const { child, output } = await start(t, ['--engine', 'embedded', '--scenario', 'many', '--floors']);
  // The report's line naming the machine comes after the idle server started.
  await new Promise<void>((resolve) => child.stdout!.on('data', () => output().includes('\nNode ') && resolve()));
  const children = await readFile(`/proc/${child.pid}/task/${child.pid}/children`, 'utf8');
  const idle: string[] = [];
  for (const pid of children.split(' ').filter(Boolean)) {
    if ((await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '')).includes('createServer')) idle.push(pid);
  }
  t.equal(idle.length, 1, 'the idle server runs');
  child.kill('SIGKILL');
  // `tail --pid` ends when that process does.
  const [code] = (await once(spawn('tail', ['--pid', idle[0]!, '-f', '/dev/null']), 'exit')) as [number | null];
  t.equal(code, 0, 'the idle server exited');
});

t.test('--pin-nats: nats-server on a CPU of its own, said in the report', async (t) => {
  const r = await bench(t, ['--engine', 'nats', '--scenario', 'many', '--pin-nats']);
  if (availableParallelism() < 2) {
    t.not(r.code, 0);
    t.match(r.output, '--pin-nats needs two CPUs or more');
    return;
  }
  t.equal(r.code, 0, r.output);
  const [, alone, rest] = /nats-server alone on CPU (\d+), the rest on CPUs? ([\d,]+)/.exec(r.report ?? '') ?? [];
  t.ok(alone !== undefined && !rest!.split(',').includes(alone), 'said in the report: nats-server on a CPU the rest does not use');
  t.ok(rate(r.report ?? '', 'nats') > 0, 'packages measured');
});

t.test('--pin-nats where the bench may run on one CPU only: refused', async (t) => {
  const r = await bench(t, ['--engine', 'nats', '--scenario', 'many', '--pin-nats'], ['taskset', '-c', firstCpu]);
  t.not(r.code, 0);
  t.match(r.output, '--pin-nats needs two CPUs or more');
  t.equal(r.report, null, 'no report');
});

t.test('--pin-nats with a cluster: refused before anything starts', async (t) => {
  const r = await bench(t, ['--engine', 'nats-cluster', '--scenario', 'many', '--pin-nats']);
  t.not(r.code, 0);
  t.match(r.output, '--pin-nats needs two CPUs or more and a single nats-server (not nats-cluster)');
  t.equal(r.report, null, 'no report');
});
