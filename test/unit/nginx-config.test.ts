/**
 * The shipped proxy configuration (config/nginx/) against the service it fronts: the
 * template renders, nginx accepts it, the ingest location is exactly the ingest route, and
 * every header the gateway reads is forwarded.
 */
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { copyFile, mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { NGINX_MAIN, NGINX_TEMPLATE, nginxPath, renderGatewayConf, renderTemplate } from '../../src/proxy/nginx.js';
import { tempDir } from '../support/harness.js';

const ROOT = resolve(fileURLToPath(new URL('../../..', import.meta.url)));
const template = readFileSync(NGINX_TEMPLATE, 'utf8');

t.test('renderTemplate: the names given, nothing else', async (t) => {
  t.equal(renderTemplate('listen ${A}; set $x $remote_addr;', { A: '8080' }), 'listen 8080; set $x $remote_addr;', "nginx's own $variables untouched");
  t.throws(() => renderTemplate('listen ${B};', { A: '1' }), /no value for \$\{B\}/);
  t.throws(() => renderTemplate('listen ${A};', { A: '1; include /etc/passwd' }), /A must be one word/);
  t.same([...template.matchAll(/\$\{(\w+)\}/g)].map((m) => m[1]).filter((v, i, a) => a.indexOf(v) === i).sort(), ['GATEWAY_ADDRESS', 'NGINX_LISTEN'], 'the template has two variables');
});

t.test('nginx accepts the rendered configuration', { skip: nginxPath() ? false : 'no nginx here (npm test installs it)' }, async (t) => {
  const bin = nginxPath()!;
  const dir = await tempDir(t);
  await mkdir(join(dir, 'temp'));
  await copyFile(NGINX_MAIN, join(dir, 'nginx.conf'));
  await writeFile(join(dir, 'gateway.conf'), await renderGatewayConf({ NGINX_LISTEN: '127.0.0.1:1', GATEWAY_ADDRESS: '127.0.0.1:2' }));
  const res = spawnSync(bin, ['-t', '-q', '-p', `${dir}/`, '-c', join(dir, 'nginx.conf'), '-e', 'stderr'], { encoding: 'utf8' });
  t.equal(res.status, 0, `nginx -t: ${res.stderr}`);
});

t.test('the ingest location is the ingest route and nothing else', async (t) => {
  const m = /location ~ (\S+) \{/.exec(template);
  t.ok(m, 'one regex location');
  const ingest = new RegExp(m![1]!);
  const u = '9b2f4c1e-0000-4000-8000-000000000000';
  for (const path of [`/api/v1/uploading/${u}/products`, `/api/v1/uploading/${u}/receipt_lines`, `/api/v1/uploading/${u}/statuses`]) t.ok(ingest.test(path), `${path}: 32 MiB`);
  for (const path of [
    `/api/v1/uploading/${u}/status`,
    `/api/v1/uploading/${u}/start-upload`,
    `/api/v1/uploading/${u}/terminate`,
    `/api/v1/uploading/${u}/delete`,
    '/api/v1/uploading/webhooks/upload-finished',
    '/api/v1/uploading/initialize-session',
    '/api/v1/uploading/entities',
    `/api/v1/uploading/${u}/products/x`,
  ])
    t.notOk(ingest.test(path), `${path}: 1 MiB`);
});

t.test('every request header the gateway reads is forwarded', async (t) => {
  const forwarded = new Set([...template.matchAll(/^\s*proxy_set_header ([\w-]+) /gm)].map((m) => m[1]!.toLowerCase()));
  // nginx writes the body's framing itself.
  const framing = new Set(['content-length', 'transfer-encoding']);
  const read = new Set<string>();
  const walk = (dir: string) => {
    for (const name of readdirSync(dir)) {
      const path = join(dir, name);
      if (statSync(path).isDirectory()) walk(path);
      else if (path.endsWith('.ts') && !path.includes(`${join('src', 'client')}`)) {
        for (const h of readFileSync(path, 'utf8').matchAll(/headers\.get\('([a-z0-9-]+)'\)/g)) read.add(h[1]!);
      }
    }
  };
  walk(join(ROOT, 'src'));
  t.ok(read.has('authorization') && read.has('idempotency-key'), `found the headers the gateway reads: ${[...read].join(', ')}`);
  t.same([...read].filter((h) => !forwarded.has(h) && !framing.has(h)), [], 'none is dropped by the proxy');
});
