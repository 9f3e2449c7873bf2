/**
 * `limits.perIpAtProxy`: the configuration it needs, and the edge leaving the per-client
 * limits to the proxy for what the proxy forwards, and only for that (a real server on
 * loopback: 127.0.0.1 plays the proxy, 127.0.0.2 a client that bypasses it).
 */
import { request } from 'node:http';
import t, { type Test } from 'tap';
import { ConfigError, loadConfig } from '../../src/config/config.js';
import { addressList } from '../../src/http/auth.js';
import { listen, type Request } from '../../src/http/server.js';
import { testEdge } from '../support/harness.js';

t.test('configuration: off by default, PER_IP_AT_PROXY, and never without trustedProxies', async (t) => {
  t.equal(loadConfig({}).limits.perIpAtProxy, false, 'off by default');
  const on = loadConfig({ PER_IP_AT_PROXY: 'true', TRUSTED_PROXIES: '10.0.0.5, 10.0.1.0/24' });
  t.equal(on.limits.perIpAtProxy, true, 'PER_IP_AT_PROXY=true');
  t.same(on.trustedProxies, ['10.0.0.5', '10.0.1.0/24']);
  const err = (() => {
    try {
      loadConfig({ PER_IP_AT_PROXY: 'true' });
    } catch (e) {
      return e;
    }
    return null;
  })();
  t.ok(err instanceof ConfigError, 'without trustedProxies: a configuration error');
  t.match((err as Error).message, /limits\.perIpAtProxy \(PER_IP_AT_PROXY\) is true but trustedProxies \(TRUSTED_PROXIES\) is empty/, 'naming both keys');
  t.throws(() => loadConfig({ PER_IP_AT_PROXY: 'yes' }), /PER_IP_AT_PROXY: expected true or false/);
  t.throws(() => loadConfig({}, { limits: { perIpAtProxy: 'true' as never } }), /limits\.perIpAtProxy: expected boolean/);
});

async function server(t: Test, perIpAtProxy: boolean) {
  const seen: string[] = [];
  const srv = await listen({
    edge: await testEdge(),
    host: '127.0.0.1',
    port: 0,
    routes: [{ method: 'GET', pattern: '/api/v1/who', body: 'buffered', handler: async (req: Request) => (seen.push(req.clientAddress), { status: 200, body: { client: req.clientAddress } }) }],
    limits: {
      ingestBodyBytes: 1024,
      otherBodyBytes: 1024,
      requestTimeoutMs: 5_000,
      bodyRateWindowMs: 5_000,
      minBodyBytesPerSecond: 1,
      requestsPerSecond: 0.001,
      burst: 2,
      concurrentPerClient: 0,
      trackedClients: 10,
      perIpAtProxy,
    },
    trustedProxies: addressList(['127.0.0.1'], 'trustedProxies'),
    onInternalError: () => {},
  });
  t.teardown(() => srv.close());
  return { seen, port: srv.port };
}

/** GET /api/v1/who from `localAddress`, with an X-Forwarded-For; the status. */
function who(port: number, localAddress: string, xff: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path: '/api/v1/who', localAddress, headers: { 'x-forwarded-for': xff }, agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode!));
    });
    req.on('error', reject);
    req.end();
  });
}

t.test('on: what a trusted proxy forwards is not limited again; a peer that is not a proxy still is', async (t) => {
  const { seen, port } = await server(t, true);
  const viaProxy: number[] = [];
  for (let i = 0; i < 6; i++) viaProxy.push(await who(port, '127.0.0.1', '198.51.100.7'));
  t.same(viaProxy, [200, 200, 200, 200, 200, 200], 'from the proxy: past the burst of 2, all served');
  t.same(seen, Array(6).fill('198.51.100.7'), "the client's address is the proxy's X-Forwarded-For");
  const direct: number[] = [];
  for (let i = 0; i < 3; i++) direct.push(await who(port, '127.0.0.2', '198.51.100.7'));
  t.same(direct, [200, 200, 503], 'from a peer that is no proxy: limited after the burst of 2');
  t.same(seen.slice(6), ['127.0.0.2', '127.0.0.2'], "and its X-Forwarded-For is not believed");
});

t.test('off: the edge limits each client behind the proxy by its X-Forwarded-For address', async (t) => {
  const { port } = await server(t, false);
  const viaProxy: number[] = [];
  for (let i = 0; i < 3; i++) viaProxy.push(await who(port, '127.0.0.1', '198.51.100.7'));
  t.same(viaProxy, [200, 200, 503], 'limited after the burst of 2');
  t.equal(await who(port, '127.0.0.1', '198.51.100.8'), 200, 'another client behind the same proxy has its own bucket');
});
