/**
 * The deployment files, checked without a Docker engine: docker-compose.yml parses (with the
 * `yaml` package tap itself depends on) and every service's environment passes the
 * configuration validation; the Dockerfile keeps its shape; the configuration table of
 * docs/operations.md names every key of config/default.json.
 */
import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import YAML from 'yaml';
import { loadConfig } from '../../src/config/config.js';

/**
 * Maintained Node majors the image may use (docs/operations.md; CI runs the suite on Node 24
 * and on 20, which, past its end of life, still runs the service; 22 uses the same SQLite
 * driver as 24).
 */
const SUPPORTED_NODE_MAJORS = [22, 24];
/** `process.versions.modules` of each, which names a uWS binary. */
const NODE_ABI: Record<number, number> = { 20: 115, 22: 127, 24: 137 };
const root = (name: string) => fileURLToPath(new URL(`../../../${name}`, import.meta.url));
const read = (name: string) => readFileSync(root(name), 'utf8');

interface Service {
  image?: string;
  build?: unknown;
  command?: string[];
  environment?: Record<string, string | number | boolean>;
  healthcheck?: { test: string[] };
  depends_on?: Record<string, unknown>;
  volumes?: string[];
}

t.test('docker-compose.yml: a 3-node NATS cluster, an S3 server, two gateways, one uploader', async (t) => {
  const doc = YAML.parseDocument(read('docker-compose.yml'), { merge: true });
  t.same(doc.errors, [], 'parses');
  const compose = doc.toJS({ maxAliasCount: 100 }) as { services: Record<string, Service>; volumes: Record<string, unknown> };
  const { services } = compose;
  t.same(Object.keys(services).sort(), ['gateway-1', 'gateway-2', 'minio', 'nats-1', 'nats-2', 'nats-3', 'proxy', 'uploader']);

  // Each node runs config/nats/cluster.conf, the file the network drill runs (test/integration/nats-cluster-config.test.ts checks it parses).
  const routes = '[nats://nats-1:6222, nats://nats-2:6222, nats://nats-3:6222]';
  for (const name of ['nats-1', 'nats-2', 'nats-3']) {
    const s = services[name]!;
    t.match(s.image, /^nats:2\.1[0-9]-alpine$/, `${name}: nats 2.10 or later`);
    t.same(s.command, ['-c', '/etc/nats/ingest/cluster.conf'], `${name}: the shared cluster.conf`);
    t.ok(s.volumes?.includes('./config/nats:/etc/nats/ingest:ro'), `${name}: config/nats mounted`);
    t.equal(s.environment?.NATS_SERVER_NAME, name);
    t.equal(s.environment?.NATS_CLUSTER_NAME, 'ingest');
    t.equal(s.environment?.NATS_STORE_DIR, '/data');
    t.equal(s.environment?.NATS_ROUTES, routes, `${name}: routes to the whole cluster`);
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

  // The shipped proxy in front: its template rendered by the image, the gateways behind it trusting its address only.
  const proxy = services.proxy! as Service & { networks?: { default?: { ipv4_address?: string } }; ports?: string[] };
  t.match(proxy.image, /^nginx:1\.\d+/, 'proxy: nginx');
  t.ok(proxy.volumes?.includes('./config/nginx/gateway.conf.template:/etc/nginx/templates/gateway.conf.template:ro'), 'proxy: the shipped template');
  t.equal(proxy.environment?.GATEWAY_ADDRESS, 'gateways:8080', 'proxy: both gateways by their alias');
  const proxyAddress = proxy.networks?.default?.ipv4_address;
  for (const name of ['gateway-1', 'gateway-2']) {
    const config = loadConfig(env(name));
    t.equal(config.limits.perIpAtProxy, true, `${name}: per-client limits at the proxy`);
    t.same(config.trustedProxies, [proxyAddress], `${name}: trusts the proxy's address only`);
    t.same((services[name] as { networks?: { default?: { aliases?: string[] } } }).networks?.default?.aliases, ['gateways']);
  }
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

t.test('Dockerfile: a supported Node, and an HTTP edge that loads on it', async (t) => {
  const text = read('Dockerfile');
  const images = [...text.matchAll(/^FROM (node:(\d+)[\w.-]*)/gm)].map((m) => ({ image: m[1]!, major: Number(m[2]) }));
  t.equal(images.length, 2, 'both stages on a node image');
  t.equal(images[0]!.image, images[1]!.image, 'built and run on the same Node');
  t.ok(SUPPORTED_NODE_MAJORS.includes(images[1]!.major), `Node ${images[1]!.major} is supported (${SUPPORTED_NODE_MAJORS.join(', ')})`);
  const engine = /^ENV .*\bHTTP_ENGINE=(\w+)/m.exec(text)?.[1];
  t.ok(engine === 'node' || engine === 'uws', `the image names its edge (HTTP_ENGINE=${engine})`);
  t.equal(loadConfig({ HTTP_ENGINE: engine }).http.engine, engine, 'a valid http.engine');
  if (engine === 'uws') {
    const abi = NODE_ABI[images[1]!.major];
    t.ok(abi !== undefined && existsSync(root(`node_modules/uWebSockets.js/binaries/uws_linux_x64_${abi}.node`)), `a uWS binary for Node ${images[1]!.major}`);
  } else {
    t.match(text, /rm -rf node_modules\/uWebSockets\.js\/binaries/, 'the uWS binaries it cannot load are not shipped');
  }
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

t.test('docs/operations.md: each documented default is the one of config/default.json (the one source)', async (t) => {
  const defaults = new Map<string, unknown>();
  const walk = (node: Record<string, unknown>, at: string[]) => {
    for (const [k, v] of Object.entries(node)) {
      if (v !== null && typeof v === 'object' && !Array.isArray(v)) walk(v as Record<string, unknown>, [...at, k]);
      else defaults.set([...at, k].join('.'), v);
    }
  };
  walk(JSON.parse(read('config/default.json')) as Record<string, unknown>, []);
  for (const line of read('docs/operations.md').split('\n')) {
    const m = /^\| `([^`]+)` \|[^|]*\|([^|]*)\|/.exec(line);
    if (!m || !defaults.has(m[1]!)) continue;
    const value = defaults.get(m[1]!);
    const cell = m[2]!.trim();
    if (typeof value === 'number') t.equal(cell.split(' ')[0]!.replaceAll('`', ''), String(value), `${m[1]}: ${cell}`);
    else if (typeof value === 'string' || typeof value === 'boolean') t.ok(cell.startsWith(`\`${value}\``), `${m[1]}: ${cell}`);
  }
});
