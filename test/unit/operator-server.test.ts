/**
 * `serveOperatorEndpoints` (src/observability/operator-server.ts), the uploader's `/healthz`,
 * `/readyz` and `/metrics`: answered as the gateway answers them, a 405 with its `Allow`.
 */
import t from 'tap';
import { request } from 'undici';
import { serveOperatorEndpoints } from '../../src/observability/operator-server.js';
import type { Readiness } from '../../src/observability/readiness.js';

t.test('another method than GET: 405 Method Not Allowed with Allow: GET (RFC 9110)', async (t) => {
  const readiness = { run: async () => ({ ready: true, checks: {} }) } as unknown as Readiness;
  const server = await serveOperatorEndpoints({ host: '127.0.0.1', port: 0, metrics: null, readiness, token: null });
  t.teardown(() => server.close());
  const res = await request(`http://127.0.0.1:${server.port}/healthz`, { method: 'POST' });
  t.same([res.statusCode, await res.body.json()], [405, { detail: 'Method Not Allowed' }]);
  t.equal(res.headers.allow, 'GET');
});
