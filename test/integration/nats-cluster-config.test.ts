/**
 * What is tested is what is shipped: docker-compose.yml runs config/nats/cluster.conf on each
 * NATS node (`-c`, test/unit/deploy-files.test.ts checks the mount and the variables), the file
 * the network drill runs on its NATS hosts (testbed/nats.ts CLUSTER_CONF); here nats-server
 * accepts it with exactly the variables compose sets for each node (`nats-server -t`, no Docker
 * engine needed), and refuses it without them.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import YAML from 'yaml';
import { CLUSTER_CONF } from '../../testbed/nats.js';
import { installHint, natsServerPath } from '../../testbed/prerequisites.js';

interface Service {
  image?: string;
  environment?: Record<string, string>;
}

const compose = YAML.parseDocument(readFileSync(fileURLToPath(new URL('../../../docker-compose.yml', import.meta.url)), 'utf8'), { merge: true }).toJS({
  maxAliasCount: 100,
}) as { services: Record<string, Service> };

t.test('nats-server accepts config/nats/cluster.conf with the variables compose sets on each node', async (t) => {
  const bin = natsServerPath();
  if (bin === null) throw new Error(installHint(['nats-server']));
  const version = spawnSync(bin, ['--version'], { encoding: 'utf8' }).stdout.trim();
  for (const name of ['nats-1', 'nats-2', 'nats-3']) {
    const s = compose.services[name]!;
    const line = /^nats:(\d+\.\d+)-/.exec(s.image ?? '')?.[1];
    if (line && !version.includes(`v${line}.`)) t.comment(`${name}: compose ships nats:${line}; the suite tests ${version}`);
    const check = spawnSync(bin, ['-t', '-c', CLUSTER_CONF], { encoding: 'utf8', env: { PATH: process.env.PATH, ...s.environment } });
    t.equal(check.status, 0, `${name}: ${check.stderr.trim()}`);
  }
  const bare = spawnSync(bin, ['-t', '-c', CLUSTER_CONF], { encoding: 'utf8', env: { PATH: process.env.PATH } });
  t.not(bare.status, 0, 'without the variables it is refused');
  t.match(bare.stderr, /NATS_SERVER_NAME/, '... naming the first one missing');
});
