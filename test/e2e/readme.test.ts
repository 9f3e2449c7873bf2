/**
 * The README's walk-throughs run as written: its curl session, its terminate-and-delete
 * session and its command-line session, taken from README.md itself and run by bash against
 * a started service (the emulator at its default 3 s, so that terminate finds the workflow
 * running). Each `# → …` line must be what the command before it printed (`…` stands for any
 * text), and every command must succeed.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { readFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { CLI } from '../support/cli.js';
import { startService, tempDir } from '../support/harness.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');

async function readmeBlocks(): Promise<string[]> {
  const text = await readFile(join(ROOT, 'README.md'), 'utf8');
  return [...text.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!);
}

async function bash(script: string, cwd: string, env: NodeJS.ProcessEnv): Promise<{ code: number | null; out: string }> {
  const child = spawn('bash', ['-eu', '-c', script], { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const [code] = (await once(child, 'close')) as [number | null];
  return { code, out };
}

/** `# → {...}` lines as patterns: the text to the letter, `…` for any run of characters. */
function expectations(block: string): RegExp[] {
  return [...block.matchAll(/^# → (.*)$/gm)].map(
    (m) => new RegExp(m[1]!.split('…').map((part) => part.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('.*?')),
  );
}

t.test('the README walk-throughs, as written', async (t) => {
  const svc = await startService(t, { connector: { emulatorDelayMs: 3000 } });
  const blocks = await readmeBlocks();
  const curl = blocks.filter((b) => b.includes('$B/$U'));
  const cli = blocks.find((b) => b.includes('INGEST_URL'));
  t.equal(curl.length, 2, 'the curl session and the terminate-and-delete session');
  t.ok(cli, 'the command-line session');
  const dir = await tempDir(t, 'readme-');
  const env = { PATH: process.env.PATH ?? '', HOME: dir };
  const at = (text: string) => text.replaceAll('http://127.0.0.1:8080', svc.url);

  // Both curl blocks in one shell: the second uses the first one's variables and helpers.
  const session = curl.join('\n');
  const run = await bash(at(session), dir, env);
  t.equal(run.code, 0, 'every command succeeds', { out: run.out });
  for (const expected of expectations(session)) t.match(run.out, expected, `printed: ${expected.source.slice(0, 80)}`);

  const cliRun = await bash(at(cli!).replaceAll('npx ingest', `node ${CLI}`), dir, env);
  t.equal(cliRun.code, 0, 'every ingest command succeeds', { out: cliRun.out });
  t.match(cliRun.out, /pushed 2 rows of products in 1 package/);
  t.match(cliRun.out, /is DONE/);
});
