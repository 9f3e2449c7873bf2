/** The configuration's errors name the bad key and never print a secret (they go to the log). */
import t from 'tap';
import { checkGatewayConfig, ConfigError, loadConfig } from '../../src/config/config.js';

function errorOf(env: NodeJS.ProcessEnv): string {
  try {
    loadConfig(env);
  } catch (err) {
    if (err instanceof ConfigError) return err.message;
    throw err;
  }
  throw new Error('the configuration loaded');
}

t.test('a secret too short is named by its key and length, not printed', async (t) => {
  const webhook = errorOf({ CONNECTOR_URL: 'http://connector.example', CONNECTOR_WEBHOOK_SECRET: 'my-real-secret!' });
  t.match(webhook, 'connector.webhookSecret: expected string & MinLength<16>, got a string of 15 characters (not shown)');
  t.notMatch(webhook, 'my-real-secret');
  const token = errorOf({ METRICS_TOKEN: 'scrape-me-now' });
  t.match(token, 'metrics.token: expected string & MinLength<16>, got a string of 13 characters (not shown)');
  t.notMatch(token, 'scrape-me-now');
});

t.test('a bad URL is printed without the credentials in it', async (t) => {
  const message = errorOf({ S3_ENDPOINT: 'http://AKIA:topsecret@minio 9000', S3_BUCKET: 'b' });
  t.match(message, 's3.endpoint: expected string & Format<"uri">, got "http://***@minio 9000"');
  t.notMatch(message, /topsecret|AKIA/);
});

t.test('other bad values are printed as they are', async (t) => {
  t.match(errorOf({ LOG_LEVEL: 'loud' }), 'log.level: expected');
  t.match(errorOf({ LOG_LEVEL: 'loud' }), '"loud"');
});

t.test('a trustedProxies entry that is no IP address or CIDR is a configuration error naming it', async (t) => {
  t.equal(errorOf({ TRUSTED_PROXIES: '10.0.0.1,10.0.0.0/99' }), 'Invalid configuration:\n  trustedProxies (TRUSTED_PROXIES): not an IP address or CIDR: "10.0.0.0/99"');
  t.match(errorOf({ TRUSTED_PROXIES: 'proxy.internal' }), 'not an IP address or CIDR: "proxy.internal"');
  t.same(loadConfig({ TRUSTED_PROXIES: '10.0.0.1, 192.168.0.0/16,::1,fd00::/8' }).trustedProxies, ['10.0.0.1', '192.168.0.0/16', '::1', 'fd00::/8']);
});

t.test('a timer delay past 2^31 - 1 ms (where a Node timer fires after 1 ms) is a configuration error naming the key', async (t) => {
  t.match(errorOf({ READY_TIMEOUT_MS: '3000000000' }), /health\.readyTimeoutMs: expected .*Maximum<2147483647>.*, got 3000000000/);
  t.match(errorOf({ SHUTDOWN_GRACE_MS: '2147483648' }), /limits\.shutdownGraceMs: expected/);
  t.throws(() => loadConfig({}, { limits: { requestTimeoutMs: 2 ** 31 } }), /limits\.requestTimeoutMs: expected/);
  t.equal(loadConfig({ READY_TIMEOUT_MS: '2147483647' }).health.readyTimeoutMs, 2147483647, 'the largest a timer takes');
  t.equal(loadConfig({}, { idempotency: { ttlMs: 30 * 86_400_000 } }).idempotency.ttlMs, 30 * 86_400_000, 'an age, not a timer: a month is fine');
});

t.test('the gateway refuses a real Connector without PUBLIC_URL on a wildcard HOST (its callback could never land)', async (t) => {
  const env = { CONNECTOR_URL: 'http://connector.example', CONNECTOR_WEBHOOK_SECRET: 'a-webhook-secret-of-32-characters' };
  for (const host of ['0.0.0.0', '::']) {
    const config = loadConfig({ ...env, HOST: host });
    t.throws(() => checkGatewayConfig(config), { code: 'CONFIG_INVALID', message: /publicUrl \(PUBLIC_URL\) is required when connector\.url is set and host is/ }, host);
  }
  t.doesNotThrow(() => checkGatewayConfig(loadConfig({ ...env, HOST: '0.0.0.0', PUBLIC_URL: 'https://gw.example' })), 'with PUBLIC_URL');
  t.doesNotThrow(() => checkGatewayConfig(loadConfig({ ...env, HOST: '10.1.2.3' })), 'a host of its own');
  t.doesNotThrow(() => checkGatewayConfig(loadConfig({ HOST: '0.0.0.0' })), 'the emulator calls its own gateway');
});
