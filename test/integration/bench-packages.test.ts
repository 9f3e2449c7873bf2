/**
 * `bench:packages`, as a load tester runs it, in its shortest form: it measures, writes its
 * report, and exits by itself (with --floors its idle server's pipe once kept it running after
 * the report, the idle server left behind); --pin-nats runs a single nats-server on a CPU of
 * its own and says so, or refuses where there is no second CPU.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t, { type Test } from 'tap';

const BENCH = fileURLToPath(new URL('../../bench/packages.js', import.meta.url));

/** Runs the bench to its end; its exit code, output and the one report it wrote. */
async function bench(t: Test, args: string[]): Promise<{ code: number | null; output: string; report: string | null }> {
  const out = await mkdtemp(join(tmpdir(), 'bench-packages-test-'));
  t.teardown(() => rm(out, { recursive: true, force: true }));
  const child = spawn(process.execPath, [BENCH, '--no-peer', '--duration', '1', '--out', out, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  t.teardown(() => void child.kill('SIGKILL'));
  let output = '';
  child.stdout.on('data', (c: Buffer) => (output += c.toString('utf8')));
  child.stderr.on('data', (c: Buffer) => (output += c.toString('utf8')));
  const [code] = (await once(child, 'exit')) as [number | null];
  const files = await readdir(out);
  const report = files.length === 1 ? await readFile(join(out, files[0]!), 'utf8') : null;
  return { code, output, report };
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

t.test('--pin-nats: nats-server on a CPU of its own, said in the report', async (t) => {
  const r = await bench(t, ['--engine', 'nats', '--scenario', 'many', '--pin-nats']);
  if (cpus().length < 2) {
    t.not(r.code, 0);
    t.match(r.output, '--pin-nats needs two CPUs or more');
    return;
  }
  t.equal(r.code, 0, r.output);
  const last = cpus().length - 1;
  t.match(r.report ?? '', `nats-server alone on CPU ${last}, the rest on CPU${last === 1 ? ' 0' : `s 0-${last - 1}`}`);
  t.ok(rate(r.report ?? '', 'nats') > 0, 'packages measured');
});

t.test('--pin-nats with a cluster: refused before anything starts', async (t) => {
  const r = await bench(t, ['--engine', 'nats-cluster', '--scenario', 'many', '--pin-nats']);
  t.not(r.code, 0);
  t.match(r.output, '--pin-nats needs two CPUs or more and a single nats-server (not nats-cluster)');
  t.equal(r.report, null, 'no report');
});
