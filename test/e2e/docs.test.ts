/**
 * `GET /openapi.json` and the docs page over real HTTP: what is served, with which headers,
 * without authentication or rate limit, and nothing outside the page's allow-list.
 */
import { Validator } from '@seriousme/openapi-schema-validator';
import { readFileSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import { gunzipSync } from 'node:zlib';
import t from 'tap';
import { request } from 'undici';
import { DOCS_ASSETS, swaggerUiDir } from '../../src/api/docs.js';
import { openApiDocument } from '../../src/api/openapi.js';
import { API, call, clientOf, startService } from '../support/harness.js';

async function fetchBytes(url: string, headers: Record<string, string> = {}) {
  const res = await request(url, { headers });
  return { status: res.statusCode, headers: res.headers, body: Buffer.from(await res.body.arrayBuffer()) };
}

/** Sends `path` exactly as written (no URL normalisation of `..`) and answers the status code. */
function rawStatus(base: string, path: string): Promise<number> {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    const sock = connect(Number(port), hostname);
    let text = '';
    sock.on('data', (d: Buffer) => (text += d.toString('latin1')));
    sock.on('error', reject);
    sock.on('close', () => resolve(Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0)));
    sock.write(`GET ${path} HTTP/1.1\r\nHost: ${hostname}\r\nConnection: close\r\n\r\n`);
  });
}

t.test('GET /openapi.json: the document of openapi.ts, valid OpenAPI 3.1, version 0.1.0', async (t) => {
  const svc = await startService(t, { metrics: { enabled: true } });
  const res = await call(svc.url, 'GET', '/openapi.json', { client: null });
  t.equal(res.status, 200);
  t.match(res.headers['content-type'], /^application\/json/);
  t.equal(res.headers['cache-control'], 'no-cache');
  t.equal(res.body.info.version, '0.1.0');
  t.same(res.body, openApiDocument(), 'every operation: metrics are on');
  const validator = new Validator();
  const result = await validator.validate(res.body);
  t.equal(validator.version, '3.1');
  t.same(result, { valid: true });

  // Each documented operation is routed: none answers the router's 404/405.
  for (const [path, item] of Object.entries(res.body.paths as Record<string, object>)) {
    for (const method of Object.keys(item)) {
      const concrete = path.replace('{upload_uuid}', '00000000-0000-4000-8000-000000000000').replace('{entity_name}', 'products').replace('{asset}', 'init.js');
      const answer = await call(svc.url, method.toUpperCase(), concrete, { client: null });
      t.not(answer.status, 405, `${method} ${path} is routed`);
      t.notSame(answer.body, { detail: 'Not Found' }, `${method} ${path} is routed`);
    }
  }
});

t.test('GET /openapi.json without metrics: /metrics is not documented (nor routed)', async (t) => {
  const svc = await startService(t, { metrics: { enabled: false } });
  const doc = (await call(svc.url, 'GET', '/openapi.json', { client: null })).body;
  t.notOk(doc.paths['/metrics']);
  t.ok(doc.paths['/healthz'] && doc.paths['/readyz']);
  t.same((await call(svc.url, 'GET', '/metrics', { client: null })).body, { detail: 'Not Found' });
  t.same(await new Validator().validate(doc), { valid: true });
});

t.test('the documented request examples are accepted', async (t) => {
  const svc = await startService(t);
  const client = clientOf(svc);
  const uuid = (await client.init()).body.upload_uuid;
  const ingest = (openApiDocument() as any).paths[`${API}/{upload_uuid}/{entity_name}`].post;
  const examples = Object.entries(ingest.requestBody.content['application/json'].examples as Record<string, { value: unknown }>);
  t.ok(examples.length > 0);
  for (const [entity, { value }] of examples) {
    const res = await client.ingest(uuid, entity, value);
    t.equal(res.status, 200, `${entity}: ${res.text}`);
  }
});

t.test('GET /docs: the Swagger UI page, its files from swagger-ui-dist, cacheable by version', async (t) => {
  const svc = await startService(t);
  const page = await fetchBytes(`${svc.url}/docs`);
  t.equal(page.status, 200);
  t.equal(page.headers['content-type'], 'text/html; charset=utf-8');
  t.equal(page.headers['cache-control'], 'no-cache');
  t.equal(page.headers['x-content-type-options'], 'nosniff');
  const csp = String(page.headers['content-security-policy']);
  t.match(csp, "default-src 'none'");
  t.match(csp, "script-src 'self'");
  t.match(csp, "connect-src 'self'");
  t.notMatch(csp, 'unsafe-eval');
  const html = page.body.toString();
  t.equal((await fetchBytes(`${svc.url}/docs/`)).status, 404, '/docs/ is not the page: a path is matched as sent (trailing slash: 404)');

  const links = [...html.matchAll(/(?:href|src)="([^"]+)"/g)].map((m) => m[1]!);
  t.ok(links.length >= 4);
  for (const link of links) t.match(link, /^\/docs\/[\w.-]+\?v=[0-9a-f]{16}$/, `${link}: this origin, versioned`);
  t.notMatch(html, /https?:\/\//, 'no absolute URL: nothing from a CDN');
  const linked = links.map((l) => l.slice('/docs/'.length, l.indexOf('?')));
  t.same([...linked].sort(), [...DOCS_ASSETS].sort(), 'the page links exactly the allow-list');

  const dir = swaggerUiDir();
  const types: Record<string, string> = { css: 'text/css; charset=utf-8', js: 'text/javascript; charset=utf-8', png: 'image/png' };
  for (const link of links) {
    const name = linked[links.indexOf(link)]!;
    const type = types[name.slice(name.lastIndexOf('.') + 1)];
    const plain = await fetchBytes(svc.url + link);
    t.equal(plain.status, 200, name);
    t.equal(plain.headers['content-type'], type, `${name} content type`);
    t.equal(plain.headers['cache-control'], 'public, max-age=31536000, immutable', `${name}: immutable under its version`);
    t.equal(plain.headers['x-content-type-options'], 'nosniff');
    t.notOk(plain.headers['content-encoding'], `${name}: identity without Accept-Encoding`);
    if (name !== 'init.js') {
      const file = readFileSync(join(dir, name));
      const expected = type!.startsWith('text/') ? file.toString().replace(/\n?(\/\/|\/\*)# sourceMappingURL=\S+( \*\/|\*\/)?\s*$/, '\n') : file.toString('latin1');
      t.equal(type!.startsWith('text/') ? plain.body.toString() : plain.body.toString('latin1'), expected, `${name}: the package's file`);
      t.notMatch(plain.body.toString('latin1'), /sourceMappingURL/, `${name}: no source map link`);
    } else {
      t.match(plain.body.toString(), 'url: "/openapi.json"');
      t.match(plain.body.toString(), 'validatorUrl: null');
    }

    const unversioned = await fetchBytes(`${svc.url}/docs/${name}`);
    t.equal(unversioned.headers['cache-control'], 'no-cache', `${name} without its version revalidates`);
    const stale = await fetchBytes(`${svc.url}/docs/${name}?v=0000000000000000`);
    t.equal(stale.headers['cache-control'], 'no-cache', `${name} with another version revalidates`);

    if (name.endsWith('.png')) continue;
    const gz = await fetchBytes(svc.url + link, { 'accept-encoding': 'gzip, deflate, br' });
    if (gz.headers['content-encoding'] === 'gzip') {
      t.equal(gz.headers.vary, 'Accept-Encoding');
      t.same(gunzipSync(gz.body), plain.body, `${name}: gzip inflates to the file`);
      t.ok(gz.body.byteLength < plain.body.byteLength);
    } else {
      t.ok(plain.body.byteLength <= 1024, `${name}: only small files go uncompressed`);
    }
    const refused = await fetchBytes(svc.url + link, { 'accept-encoding': 'gzip;q=0, identity' });
    t.notOk(refused.headers['content-encoding'], `${name}: q=0 refuses gzip`);
  }
  t.equal((await fetchBytes(`${svc.url}/docs/swagger-ui-bundle.js`, { 'accept-encoding': 'gzip' })).headers['content-encoding'], 'gzip');
});

t.test('docs: not authenticated and not rate-limited', async (t) => {
  const svc = await startService(t, { limits: { requestsPerSecond: 0.1, burst: 1 } });
  t.equal((await call(svc.url, 'GET', `${API}/entities`)).status, 200);
  t.equal((await call(svc.url, 'GET', `${API}/entities`)).status, 503, 'the /api/v1/ bucket is empty');
  for (let i = 0; i < 5; i++) {
    t.equal((await call(svc.url, 'GET', '/docs', { client: null })).status, 200, `page ${i}`);
    t.equal((await call(svc.url, 'GET', '/docs/init.js', { client: null })).status, 200, `file ${i}`);
    t.equal((await call(svc.url, 'GET', '/openapi.json', { client: null })).status, 200, `document ${i}`);
  }
  const wrongCredentials = await call(svc.url, 'GET', '/docs', { client: { id: 'nobody', token: 'wrong' } });
  t.equal(wrongCredentials.status, 200, 'credentials are not looked at');
});

t.test('docs: only the allow-listed files, no path traversal', async (t) => {
  const svc = await startService(t);
  const refused = [
    '/docs/package.json',
    '/docs/index.html',
    '/docs/swagger-initializer.js',
    '/docs/swagger-ui-bundle.js.map',
    '/docs/swagger-ui.js',
    '/docs/oauth2-redirect.html',
    '/docs/..%2Fpackage.json',
    '/docs/%2e%2e%2fpackage.json',
    '/docs/..%5Cpackage.json',
    '/docs/%2e%2e%2f%2e%2e%2fpackage.json',
    '/docs/swagger-ui.css%00.js',
    '/docs/SWAGGER-UI.CSS',
    '/docs/__proto__',
    '/docs/constructor',
    '/docs/hasOwnProperty',
    '/docs/%',
    '/docs/swagger-ui.css/x',
  ];
  for (const path of refused) {
    const res = await call(svc.url, 'GET', path, { client: null });
    t.same([res.status, res.body], [404, { detail: 'Not Found' }], path);
  }
  for (const path of ['/docs/../package.json', '/docs/../../package.json', '/docs/./swagger-ui.css', '/docs//etc/passwd']) {
    t.equal(await rawStatus(svc.url, path), 404, `${path} as sent`);
  }
  const post = await call(svc.url, 'POST', '/docs', { client: null });
  t.same([post.status, post.body], [405, { detail: 'Method Not Allowed' }]);
});
