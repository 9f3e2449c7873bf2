/**
 * The edge core's pure parts: the head checks both adapters share, the strict router and
 * the rate limit's reading of a path, the client's address behind trusted proxies, and the
 * credential header's scheme.
 */
import t from 'tap';
import { loadConfig } from '../../src/config/config.js';
import { addressList, clientAddress, ClientRegistry, hashToken, normaliseAddress } from '../../src/http/auth.js';
import { loadEdge, uwsLoads } from '../../src/http/engine.js';
import { checkHead, MAX_HEADER_FIELDS } from '../../src/http/request-head.js';
import { isRatedPath, Router } from '../../src/http/router.js';
import type { Route, WireHead } from '../../src/http/types.js';

const head = (fields: [string, string][], httpVersion = '1.1'): WireHead => ({
  method: 'POST',
  path: '/x',
  query: '',
  httpVersion,
  fields: [['host', 'h'], ...fields],
  remoteAddress: '127.0.0.1',
});
const code = (h: WireHead) => checkHead(h).problem?.code ?? null;

t.test('checkHead: framing, field count, Host, single headers', async (t) => {
  t.equal(code(head([['content-length', '10']])), null);
  t.equal(checkHead(head([['content-length', '10']])).contentLength, 10);
  t.equal(code(head([['transfer-encoding', 'chunked']])), null);
  t.equal(code(head([['transfer-encoding', 'Chunked']])), null, 'codings are case-insensitive');
  t.ok(checkHead(head([['transfer-encoding', 'chunked']])).hasBody);
  t.notOk(checkHead(head([['content-length', '0']])).hasBody);
  const cases: [string, WireHead, string][] = [
    ['CL twice, equal', head([['content-length', '2'], ['content-length', '2']]), 'INVALID_CONTENT_LENGTH'],
    ['CL twice, different', head([['content-length', '2'], ['content-length', '9']]), 'INVALID_CONTENT_LENGTH'],
    ['CL list', head([['content-length', '2, 2']]), 'INVALID_CONTENT_LENGTH'],
    ['CL signed', head([['content-length', '+2']]), 'INVALID_CONTENT_LENGTH'],
    ['CL and TE', head([['content-length', '2'], ['transfer-encoding', 'chunked']]), 'CONFLICTING_FRAMING'],
    ['TE gzip', head([['transfer-encoding', 'gzip']]), 'INVALID_TRANSFER_ENCODING'],
    ['TE gzip, chunked', head([['transfer-encoding', 'gzip, chunked']]), 'INVALID_TRANSFER_ENCODING'],
    ['TE xchunked', head([['transfer-encoding', 'xchunked']]), 'INVALID_TRANSFER_ENCODING'],
    ['TE twice', head([['transfer-encoding', 'chunked'], ['transfer-encoding', 'chunked']]), 'INVALID_TRANSFER_ENCODING'],
    ['TE on HTTP/1.0', head([['transfer-encoding', 'chunked']], '1.0'), 'INVALID_TRANSFER_ENCODING'],
    ['two Host', head([['host', 'other']]), 'INVALID_HOST'],
    ['Authorization twice', head([['authorization', 'a'], ['authorization', 'b']]), 'DUPLICATE_HEADER'],
    ['Client-Id twice', head([['client-id', 'a'], ['client-id', 'a']]), 'DUPLICATE_HEADER'],
    ['HTTP/2.0', head([], '2.0'), 'HTTP_VERSION_NOT_SUPPORTED'],
    ['too many fields', head(Array.from({ length: MAX_HEADER_FIELDS }, (_, i): [string, string] => [`x-${i}`, '1'])), 'HEADERS_TOO_LARGE'],
  ];
  for (const [name, h, expected] of cases) t.equal(code(h), expected, name);
  t.equal(code(head(Array.from({ length: MAX_HEADER_FIELDS - 1 }, (_, i): [string, string] => [`x-${i}`, '1']))), null, `${MAX_HEADER_FIELDS} fields pass`);
  t.equal(code({ ...head([]), fields: [] }), 'INVALID_HOST', 'HTTP/1.1 without Host');
  t.equal(code({ ...head([], '1.0'), fields: [] }), null, 'HTTP/1.0 without Host');
  const merged = checkHead(head([['x-forwarded-for', '1.1.1.1'], ['accept', 'a'], ['x-forwarded-for', '2.2.2.2']]));
  t.equal(merged.headers.get('x-forwarded-for'), '1.1.1.1, 2.2.2.2', 'lines of one header are joined in order');
  t.equal(merged.problem, null);
});

t.test('router: matched as sent; the rate limit reads what it would have served', async (t) => {
  const handler = async () => ({ status: 200, body: null });
  const routes: Route[] = [
    { method: 'GET', pattern: '/api/v1/uploading/:id/status', body: 'buffered', handler },
    { method: 'POST', pattern: '/docs', body: 'buffered', handler },
  ];
  const router = new Router(routes, { ingestBodyBytes: 2, otherBodyBytes: 1 });
  t.same(router.match('GET', '/api/v1/uploading/a%20b/status').params, { id: 'a b' });
  for (const path of ['//api/v1/uploading/a/status', '/api//v1/uploading/a/status', '/api/v1/uploading/a/status/', '/api/v1/uploading//status', 'api/v1/uploading/a/status', '/', '']) {
    t.same(router.match('GET', path), { params: {}, allowed: [] }, `${JSON.stringify(path)}: no route`);
  }
  t.same(router.match('GET', '/docs').allowed, ['POST'], 'the methods the path takes');
  t.same(router.match('GET', '/docs/').allowed, [], 'a trailing slash is another path');
  for (const path of ['/api/v1/x', '//api/v1/x', '/api//v1/x', '/%61pi/v1/x', '/api/%76%31/x', '/api/v1']) t.ok(isRatedPath(path), `${path}: rated`);
  for (const path of ['/healthz', '/docs', '/API/v1/x', '/api/v2/x', '/apiv1/x', '/api/v1x/y', '/%zz/v1']) t.notOk(isRatedPath(path), `${path}: not rated`);
});

t.test('clientAddress: merged lines, trusted hops skipped, a malformed entry refused', async (t) => {
  const trusted = addressList(['10.0.0.0/8', '127.0.0.1'], 'test');
  t.equal(clientAddress('203.0.113.1', '198.51.100.7', trusted), '203.0.113.1', 'an untrusted peer: its own address');
  t.equal(clientAddress('127.0.0.1', undefined, trusted), '127.0.0.1');
  t.equal(clientAddress('127.0.0.1', '198.51.100.7, 10.1.1.1', trusted), '198.51.100.7', 'trusted hops are skipped');
  t.equal(clientAddress('127.0.0.1', '10.2.2.2, 10.1.1.1', trusted), '10.2.2.2', 'all trusted: the left-most');
  t.equal(clientAddress('127.0.0.1', 'junk, 198.51.100.7', trusted), '198.51.100.7', 'entries left of the client are not read');
  for (const xff of ['junk', '198.51.100.7, ', '', 'fe80::1%eth0', '10.1.1.1:80', '198.51.100.7, junk, 10.1.1.1']) {
    t.throws(() => clientAddress('127.0.0.1', xff, trusted), { code: 'INVALID_FORWARDED_FOR' }, JSON.stringify(xff));
  }
});

t.test('addresses: a CIDR prefix is decimal digits; an empty one is refused, not read as /0 (any address)', async (t) => {
  for (const entry of ['203.0.113.7/', '203.0.113.0/ ', '::1/', '10.0.0.0/0x8', '10.0.0.0/1e1', '10.0.0.0/+8', '10.0.0.0/8.0']) {
    t.throws(() => addressList([entry], 'allowed_ips'), /not an IP address or CIDR/, JSON.stringify(entry));
  }
  const registry = new ClientRegistry({ clients: [{ client_id: 'c', token_sha256: hashToken('tok'), allowed_ips: ['203.0.113.0/24'], min_date: '2020-01-01' }] });
  t.match(registry.authenticate('tok', 'c', '203.0.113.9'), { id: 'c' });
  t.throws(() => registry.authenticate('tok', 'c', '198.51.100.1'), { code: 'IP_NOT_ALLOWED' });
  t.throws(() => loadConfig({ TRUSTED_PROXIES: '10.0.0.1/' }), /trustedProxies \(TRUSTED_PROXIES\): not an IP address or CIDR: "10\.0\.0\.1\/"/);
});

t.test('addresses: IPv6 zone ids are no address; mapped IPv4 is plain IPv4', async (t) => {
  t.throws(() => addressList(['fe80::1%eth0'], 'allowed_ips'), /not an IP address or CIDR/);
  t.throws(() => addressList(['fe80::%eth0/64'], 'allowed_ips'), /not an IP address or CIDR/);
  const registry = new ClientRegistry({ clients: [{ client_id: 'c', token_sha256: hashToken('tok'), allowed_ips: ['fe80::/10'], min_date: '2020-01-01' }] });
  t.match(registry.authenticate('tok', 'c', 'fe80::1'), { id: 'c' });
  t.throws(() => registry.authenticate('tok', 'c', 'fe80::1%eth0'), { code: 'IP_NOT_ALLOWED' }, 'a zoned address matches no entry');
  t.equal(normaliseAddress('::ffff:127.0.0.1'), '127.0.0.1');
  t.equal(normaliseAddress('0000:0000:0000:0000:0000:ffff:7f00:0001'), '127.0.0.1');
  t.equal(normaliseAddress('::1'), '::1');
});

t.test('Authorization: the token alone, or Bearer in any case', async (t) => {
  const registry = new ClientRegistry({ clients: [{ client_id: 'c', token_sha256: hashToken('tok'), allowed_ips: ['127.0.0.1'], min_date: '2020-01-01' }] });
  for (const value of ['tok', 'Bearer tok', 'bearer tok', 'BEARER  tok', 'Bearer\ttok', ' tok ']) t.match(registry.authenticate(value, 'c', '127.0.0.1'), { id: 'c' }, JSON.stringify(value));
  for (const value of ['Bearertok', 'Basic tok', 'Bearer', '']) t.throws(() => registry.authenticate(value, 'c', '127.0.0.1'), { code: 'AUTH_REQUIRED' }, JSON.stringify(value));
});

t.test('http.engine: node always; uws where its binary loads, else a clear refusal; auto falls back', async (t) => {
  t.equal((await loadEdge('node')).adapter.name, 'node');
  const auto = await loadEdge('auto');
  t.equal(auto.adapter.name, uwsLoads() ? 'uws' : 'node', `auto: ${auto.reason}`);
  // An ABI no build has a binary for (what Node 22 and 24 are to this uWS build).
  await t.rejects(loadEdge('uws', '999'), { code: 'HTTP_ENGINE_UNAVAILABLE', message: /^http\.engine is uws, but uWebSockets\.js cannot load here: no binary for Node .* \(ABI 999\).*Set http\.engine \(HTTP_ENGINE\) to node or auto\.$/ });
  const fallback = await loadEdge('auto', '999');
  t.equal(fallback.adapter.name, 'node');
  t.match(fallback.reason, /^http\.engine is auto and uWebSockets\.js cannot load here: no binary for Node/);
});

t.test('configuration: http.engine and the body-rate keys; the keys they replaced are named', async (t) => {
  t.equal(loadConfig({}).http.engine, 'auto');
  t.equal(loadConfig({ HTTP_ENGINE: 'node' }).http.engine, 'node');
  t.throws(() => loadConfig({ HTTP_ENGINE: 'fast' }), /http\.engine/);
  t.throws(() => loadConfig({}, { limits: { idleTimeoutMs: 1 } } as never), /limits\.idleTimeoutMs: unknown key \(replaced by limits\.bodyRateWindowMs\)/);
  t.throws(() => loadConfig({}, { limits: { idleProgressBytes: 1 } } as never), /limits\.idleProgressBytes: unknown key \(replaced by limits\.minBodyBytesPerSecond/);
  t.equal(loadConfig({}, { idempotency: { ttlHours: 48 } } as never).idempotency.ttlMs, 48 * 3_600_000, 'idempotency.ttlHours: read as ttlMs');
  t.equal(loadConfig({}, { idempotency: { ttlHours: 0.5 } } as never).idempotency.ttlMs, 1_800_000, 'in fractions of an hour too');
  t.throws(() => loadConfig({}, { idempotency: { ttlHours: 48, ttlMs: 1000 } } as never), /idempotency\.ttlHours: give it or idempotency\.ttlMs, not both/);
  t.throws(() => loadConfig({}, { idempotency: { ttlHours: '48' } } as never), /idempotency\.ttlHours: expected a number > 0, got "48"/);
  t.throws(() => loadConfig({}, { idempotency: { ttlHours: 0 } } as never), /idempotency\.ttlHours: expected a number > 0/);
  t.throws(() => loadConfig({}, { limits: { minBodyBytesPerSecond: 0 } }), /limits\.minBodyBytesPerSecond/);
});
