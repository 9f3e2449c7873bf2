/**
 * The last line of a process that ends itself with SIGKILL (stop-signals.ts, a stop past its
 * bound) reaches stderr: `errorNow` writes it before it returns, after the lines still queued
 * (the one write in flight on libuv's pool at that moment may still be lost).
 * The logger's usual lines are written asynchronously (sonic-boom, on libuv's pool), and a
 * SIGKILL right after one lost it in most runs (7 of 10 in a probe).
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import t from 'tap';

const LOG = new URL('../../src/log.js', import.meta.url).href;

/** A process that logs `lines` lines, then its last one with `errorNow` (with `error` instead: lost in most runs), then kills itself: what it wrote to stderr. */
async function lastWords(lines: number): Promise<string[]> {
  const script = `
    const { jsonLogger } = await import(${JSON.stringify(LOG)});
    const log = jsonLogger();
    for (let i = 0; i < ${lines}; i++) log.info('line', { i });
    log.errorNow('last words', { limit_ms: 1 });
    process.kill(process.pid, 'SIGKILL');
  `;
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  child.stderr.setEncoding('utf8').on('data', (s: string) => (err += s));
  // 'close': the process ended and its stderr is read to the end.
  const [, signal] = (await once(child, 'close')) as [number | null, string | null];
  if (signal !== 'SIGKILL') throw new Error(`ended by ${signal}: ${err}`);
  return err.split('\n').filter((l) => l !== '');
}

t.test('errorNow: the last line before a SIGKILL is written, and the lines queued before it', async (t) => {
  const runs = 10;
  for (let run = 0; run < runs; run++) {
    const lines = (await lastWords(50)).map((l) => JSON.parse(l) as { msg: string; level: string; i?: number; limit_ms?: number });
    const last = lines.filter((l) => l.msg === 'last words');
    t.equal(last.length, 1, `run ${run}: the last line written, once`);
    t.match(last[0], { level: 'error', limit_ms: 1 });
    // Those of the one write in flight on libuv's pool at that moment may be lost (or land after
    // the ones queued behind it); the ones queued are written before it returns.
    const info = lines.filter((l) => l.msg === 'line').map((l) => l.i!);
    t.equal(new Set(info).size, info.length, `run ${run}: no line twice`);
    t.ok(info.includes(49), `run ${run}: those queued behind the write in flight are written`);
  }
});

t.test('errorNow on a logger of another destination is its error', async (t) => {
  const { jsonLogger } = await import('../../src/log.js');
  const written: string[] = [];
  const log = jsonLogger({ write: (l: string) => written.push(l) });
  log.errorNow!('last words');
  t.match(JSON.parse(written[0]!), { level: 'error', msg: 'last words' });
});
