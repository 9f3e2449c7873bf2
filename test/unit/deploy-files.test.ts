/**
 * The deployment files, checked without a Docker engine: docker-compose.yml parses (with the
 * `yaml` package tap itself depends on) and every service's environment passes the
 * configuration validation; the Dockerfile keeps its shape; the configuration
 * table names every key of config/default.json.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import YAML from 'yaml';
import { loadConfig } from '../../src/config/config.js';

const root = (name: string) => fileURLToPath(new URL(`../../../${name}`, import.meta.url));
const read = (name: string) => readFileSync(root(name), 'utf8');

interface Service {
  image?: string;
  build?: unknown;
  command?: string[];
  environment?: Record<string, string | number | boolean>;
  healthcheck?: { test: string[] };
  depends_on?: Record<string, unknown>;
}

t.test('docker-compose.yml: a 3-node NATS cluster, an S3 server, two gateways, one uploader', async (t) => {
  const doc = YAML.parseDocument(read('docker-compose.yml'), { merge: true });
  t.same(doc.errors, [], 'parses');
  const compose = doc.toJS({ maxAliasCount: 100 }) as { services: Record<string, Service>; volumes: Record<string, unknown> };
  const { services } = compose;
  t.same(Object.keys(services).sort(), ['gateway-1', 'gateway-2', 'minio', 'nats-1', 'nats-2', 'nats-3', 'uploader']);

  const routes = 'nats://nats-1:6222,nats://nats-2:6222,nats://nats-3:6222';
  for (const name of ['nats-1', 'nats-2', 'nats-3']) {
    const s = services[name]!;
    t.match(s.image, /^nats:2\.10/, `${name}: nats 2.10`);
    const cmd = s.command ?? [];
    t.ok(cmd.includes('--jetstream'), `${name}: JetStream`);
    t.equal(cmd[cmd.indexOf('--server_name') + 1], name);
    t.equal(cmd[cmd.indexOf('--cluster_name') + 1], 'ingest');
    t.equal(cmd[cmd.indexOf('--routes') + 1], routes, `${name}: routes to the whole cluster`);
    t.ok(s.healthcheck, `${name}: healthcheck`);
  }
  t.match(services.minio!.image, /^minio\/minio/);

  const env = (name: string): NodeJS.ProcessEnv => {
    const out: NodeJS.ProcessEnv = {};
    // Compose substitutes `${VAR:-default}`; the defaults are what a plain `docker compose up` runs with.
    for (const [k, v] of Object.entries(services[name]!.environment ?? {})) out[k] = String(v).replace(/\$\{[A-Z_]+:-([^}]*)\}/g, '$1');
    return out;
  };
  for (const name of ['gateway-1', 'gateway-2', 'uploader']) {
    const s = services[name]!;
    t.ok(s.build, `${name}: built from this Dockerfile`);
    t.same(Object.keys(s.depends_on ?? {}).sort(), ['minio', 'nats-1', 'nats-2', 'nats-3']);
    const config = loadConfig({ ...env(name), HOST: '0.0.0.0' });
    t.equal(config.nats.url, 'nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222', `${name}: every NATS node`);
    t.equal(config.nats.replicas, 3);
    t.equal(config.s3.endpoint, 'http://minio:9000');
    t.equal(config.s3.createBucket, true);
  }
  for (const name of ['gateway-1', 'gateway-2']) {
    t.equal(services[name]!.command, undefined, `${name}: the image's default command (the gateway)`);
    t.equal(loadConfig(env(name)).storage.inProcessUploader, false, `${name}: the uploader runs apart`);
  }
  t.same(services.uploader!.command, ['node', 'dist/src/uploader/main.js']);
  t.equal(loadConfig(env('uploader')).metrics.uploaderPort, 9091);
  t.equal(env('uploader').HEALTHCHECK_PORT, '9091', "the image's healthcheck reaches the uploader's port");
});

t.test('Dockerfile: multi-stage, non-root, healthcheck on /healthz, both commands', async (t) => {
  const text = read('Dockerfile');
  t.equal(text.match(/^FROM /gm)?.length, 2, 'build and runtime stages');
  t.match(text, /^USER node$/m);
  t.match(text, /^HEALTHCHECK .*\n.*\/healthz/m);
  t.match(text, /^CMD \["node", "dist\/src\/main\.js"\]$/m);
  t.match(text, /node dist\/src\/uploader\/main\.js/);
});

t.test('docs/operations.md: the configuration table has a row for every key of config/default.json', async (t) => {
  const keys: string[] = [];
  const walk = (node: Record<string, unknown>, at: string[]) => {
    for (const [k, v] of Object.entries(node)) {
      if (v !== null && typeof v === 'object' && !Array.isArray(v)) walk(v as Record<string, unknown>, [...at, k]);
      else keys.push([...at, k].join('.'));
    }
  };
  walk(JSON.parse(read('config/default.json')) as Record<string, unknown>, []);
  const rows = new Set(
    read('docs/operations.md')
      .split('\n')
      .map((line) => /^\| `([^`]+)` \|/.exec(line)?.[1])
      .filter((k): k is string => k !== undefined),
  );
  const missing = keys.filter((k) => !rows.has(k));
  t.same(missing, [], 'every key documented');
});
