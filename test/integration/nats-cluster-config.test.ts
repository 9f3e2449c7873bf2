/**
 * What is tested is what is shipped: docker-compose.yml runs config/nats/cluster.conf (mounted,
 * `-c`), the file the network drill runs on its NATS hosts (testbed/nats.ts CLUSTER_CONF), and
 * nats-server accepts it with the variables compose sets for each node. No Docker engine is
 * needed: compose is read as text, the configuration is checked with `nats-server -t`.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { CLUSTER_CONF } from '../../testbed/nats.js';
import { installHint, natsServerPath, NATS_SERVER_FLOOR } from '../../testbed/prerequisites.js';

const compose = readFileSync(fileURLToPath(new URL('../../../docker-compose.yml', import.meta.url)), 'utf8');

/** `KEY: value` lines of the block that starts with `header` (up to the first blank line), quotes removed. */
function block(header: string): Record<string, string> {
  const start = compose.indexOf(`${header}\n`);
  if (start < 0) return {};
  const out: Record<string, string> = {};
  for (const line of compose.slice(start + header.length + 1).split('\n')) {
    if (line.trim() === '') break;
    const m = /^\s+([A-Z_]+):\s*(.*)$/.exec(line);
    if (m) out[m[1]!] = m[2]!.replace(/^"(.*)"$/, '$1');
  }
  return out;
}

t.test('compose runs config/nats/cluster.conf on every NATS node, with the variables it needs', async (t) => {
  const names = [...compose.matchAll(/NATS_SERVER_NAME: (nats-\d+)/g)].map((m) => m[1]!);
  t.same(names, ['nats-1', 'nats-2', 'nats-3'], 'three nodes, each named');
  t.match(compose, /command: \["-c", "\/etc\/nats\/ingest\/cluster\.conf"\]/, 'the nodes run the shared file');
  t.equal(compose.split('./config/nats:/etc/nats/ingest:ro').length - 1, 3, 'each node mounts config/nats, jetstream.conf beside cluster.conf');
  const env = block('x-nats-env: &nats-env');
  t.same(Object.keys(env).sort(), ['NATS_CLUSTER_NAME', 'NATS_ROUTES', 'NATS_STORE_DIR'], 'the shared variables');
  t.same(
    [...(env.NATS_ROUTES ?? '').matchAll(/nats:\/\/(nats-\d+):6222/g)].map((m) => m[1]),
    names,
    'a route to every node',
  );
  const image = /image: nats:(\d+)\.(\d+)-alpine/.exec(compose);
  t.ok(image, 'a nats image of one minor line');
  const [major, minor] = [Number(image?.[1]), Number(image?.[2])];
  t.ok(major > NATS_SERVER_FLOOR[0] || (major === NATS_SERVER_FLOOR[0] && minor >= NATS_SERVER_FLOOR[1]), `nats:${major}.${minor} is at least the floor`);

  const bin = natsServerPath();
  if (bin === null) throw new Error(installHint(['nats-server']));
  const version = spawnSync(bin, ['--version'], { encoding: 'utf8' }).stdout.trim();
  if (!version.includes(`v${major}.${minor}.`)) t.comment(`compose ships nats:${major}.${minor}; the suite runs ${version}`);
  for (const name of names) {
    const check = spawnSync(bin, ['-t', '-c', CLUSTER_CONF], { encoding: 'utf8', env: { ...process.env, ...env, NATS_SERVER_NAME: name } });
    t.equal(check.status, 0, `nats-server -t accepts cluster.conf as ${name}: ${check.stderr.trim()}`);
  }
  const bare = spawnSync(bin, ['-t', '-c', CLUSTER_CONF], { encoding: 'utf8', env: { PATH: process.env.PATH } });
  t.not(bare.status, 0, 'without the variables it is refused, naming the first missing one');
  t.match(bare.stderr, /NATS_SERVER_NAME/);
});
