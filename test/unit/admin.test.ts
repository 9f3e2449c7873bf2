import { createHash } from 'node:crypto';
import { chmodSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync, existsSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { issueClient, main, type AdminIo } from '../../src/cli/admin.js';
import { ClientRegistry } from '../../src/http/auth.js';

function tempDir(t: { teardown: (fn: () => void) => void }): string {
  const dir = mkdtempSync(join(tmpdir(), 'ingest-admin-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

function capture(env: NodeJS.ProcessEnv = {}): AdminIo & { out: string; err: string } {
  const io = {
    out: '',
    err: '',
    env,
    stdout: (s: string) => void (io.out += s),
    stderr: (s: string) => void (io.err += s),
  };
  return io;
}

const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');
const codeOf = (fn: () => unknown) => {
  try {
    fn();
  } catch (err) {
    return (err as { code?: string }).code;
  }
  return undefined;
};

t.test('issue-client --json: token printed once, hash stored, registry authenticates it', async (t) => {
  const file = join(tempDir(t), 'nested', 'clients.json');
  const io = capture();
  const code = await main(['issue-client', '--id', 'acme', '--ip', '203.0.113.0/24', '--ip', '::1', '--file', file, '--json'], io);
  t.equal(code, 0, io.err);
  const { client_id, token } = JSON.parse(io.out);
  t.equal(client_id, 'acme');
  t.match(token, /^[A-Za-z0-9_-]{43}$/, '32 random bytes, base64url');

  const stored = JSON.parse(readFileSync(file, 'utf8'));
  t.same(stored, {
    clients: [{ client_id: 'acme', token_sha256: sha256(token), allowed_ips: ['203.0.113.0/24', '::1'], min_date: '2020-01-01' }],
  });
  t.equal(statSync(file).mode & 0o777, 0o600);
  t.same(readdirSync(join(file, '..')), ['clients.json'], 'no temp file left');

  const registry = ClientRegistry.fromFile(file);
  t.match(registry.authenticate(token, 'acme', '203.0.113.9'), { id: 'acme', minDate: '2020-01-01' });
  t.match(registry.authenticate(`Bearer ${token}`, 'acme', '::1'), { id: 'acme' });
  t.equal(codeOf(() => registry.authenticate(token, 'acme', '198.51.100.1')), 'IP_NOT_ALLOWED');
});

t.test('issue-client prints the token once with a warning; file defaults to CLIENTS_FILE', async (t) => {
  const file = join(tempDir(t), 'clients.json');
  const io = capture({ CLIENTS_FILE: file });
  t.equal(await main(['issue-client', '--id', 'beta', '--ip', '10.0.0.0/8', '--min-date', '2023-01-01'], io), 0, io.err);
  const token = /^Token: (\S+)$/m.exec(io.out)?.[1];
  t.ok(token);
  t.equal(io.out.split(token!).length, 2, 'printed exactly once');
  t.match(io.out, /will not be shown again/);
  t.match(ClientRegistry.fromFile(file).authenticate(token, 'beta', '10.1.2.3'), { id: 'beta', minDate: '2023-01-01' });
});

t.test('a duplicate client_id is refused and the file left alone', async (t) => {
  const file = join(tempDir(t), 'clients.json');
  await issueClient(file, { clientId: 'acme', ips: ['127.0.0.1'] });
  const before = readFileSync(file, 'utf8');
  await t.rejects(issueClient(file, { clientId: 'acme', ips: ['127.0.0.1'] }), { code: 'DUPLICATE_CLIENT' });
  t.equal(readFileSync(file, 'utf8'), before);

  const io = capture();
  t.equal(await main(['issue-client', '--id', 'acme', '--ip', '127.0.0.1', '--file', file], io), 1);
  t.match(io.err, /already exists.*--rotate/);
  t.equal(io.out, '');
});

t.test('--rotate replaces the hash, keeps the rest and the other clients', async (t) => {
  const file = join(tempDir(t), 'clients.json');
  const first = await issueClient(file, { clientId: 'acme', ips: ['127.0.0.1'], minDate: '2021-05-01' });
  const other = await issueClient(file, { clientId: 'other', ips: ['127.0.0.1'] });
  const io = capture();
  t.equal(await main(['issue-client', '--id', 'acme', '--rotate', '--file', file, '--json'], io), 0, io.err);
  const { token } = JSON.parse(io.out);
  t.not(token, first.token);

  const stored = JSON.parse(readFileSync(file, 'utf8'));
  t.same(stored.clients, [
    { client_id: 'acme', token_sha256: sha256(token), allowed_ips: ['127.0.0.1'], min_date: '2021-05-01' },
    other.entry,
  ]);
  const registry = ClientRegistry.fromFile(file);
  t.equal(codeOf(() => registry.authenticate(first.token, 'acme', '127.0.0.1')), 'AUTH_REQUIRED', 'old token revoked');
  t.match(registry.authenticate(token, 'acme', '127.0.0.1'), { id: 'acme' });
  t.match(registry.authenticate(other.token, 'other', '127.0.0.1'), { id: 'other' });

  await t.rejects(issueClient(file, { clientId: 'nobody', rotate: true }), { code: 'UNKNOWN_CLIENT' });
});

t.test('bad arguments are rejected before the file is touched', async (t) => {
  const file = join(tempDir(t), 'clients.json');
  await t.rejects(issueClient(file, { clientId: 'acme', ips: ['300.1.1.1'] }), { code: 'INVALID_ARGUMENT', message: /300\.1\.1\.1/ });
  await t.rejects(issueClient(file, { clientId: 'acme', ips: ['10.0.0.0/33'] }), { code: 'INVALID_ARGUMENT' });
  await t.rejects(issueClient(file, { clientId: 'acme', ips: [] }), { code: 'INVALID_ARGUMENT', message: /at least one/ });
  await t.rejects(issueClient(file, { clientId: 'acme', ips: ['::1'], minDate: '2023-02-30' }), { code: 'INVALID_ARGUMENT' });
  await t.rejects(issueClient(file, { clientId: 'has space', ips: ['::1'] }), { code: 'INVALID_ARGUMENT' });
  t.notOk(existsSync(file));

  writeFileSync(file, '{"clients": [{"client_id": "x"}]}');
  await t.rejects(issueClient(file, { clientId: 'acme', ips: ['::1'] }), { code: 'CLIENTS_FILE_INVALID' });

  const io = capture();
  t.equal(await main(['issue-client', '--id', 'acme', '--ip', 'nope', '--file', join(tempDir(t), 'c.json')], io), 1);
  t.match(io.err, /not an IP address or CIDR/);
});

t.test('usage errors exit 2 with the usage on stderr', async (t) => {
  for (const argv of [['frobnicate'], [], ['issue-client', '--ip', '::1'], ['issue-client', '--id', 'a', '--bogus']]) {
    const io = capture();
    t.equal(await main(argv, io), 2, argv.join(' '));
    t.match(io.err, /Usage: ingest-admin/);
    t.equal(io.out, '');
  }
  const io = capture();
  t.equal(await main(['--help'], io), 0);
  t.match(io.out, /issue-client/);
});

t.test('rotate and a second client keep the mode the operator gave the file (compose: 0644, read by uid 1000)', async (t) => {
  const file = join(tempDir(t), 'clients.json');
  t.equal(await main(['issue-client', '--id', 'acme', '--ip', '0.0.0.0/0', '--file', file, '--json'], capture()), 0);
  t.equal(statSync(file).mode & 0o777, 0o600, 'a new file: 0600');
  chmodSync(file, 0o644);
  t.equal(await main(['issue-client', '--id', 'acme', '--rotate', '--file', file, '--json'], capture()), 0);
  t.equal(statSync(file).mode & 0o777, 0o644, 'after --rotate');
  t.equal(await main(['issue-client', '--id', 'beta', '--ip', '0.0.0.0/0', '--file', file, '--json'], capture()), 0);
  t.equal(statSync(file).mode & 0o777, 0o644, 'after another client');
});

t.test('print-config masks secrets that are set', async (t) => {
  const io = capture({
    CONNECTOR_WEBHOOK_SECRET: 'a-webhook-secret-of-some-length',
    S3_ENDPOINT: 'http://127.0.0.1:9000',
    S3_BUCKET: 'uploads',
    S3_ACCESS_KEY_ID: 'AKIAEXAMPLE',
    S3_SECRET_ACCESS_KEY: 'very-secret',
    PORT: '9999',
  });
  t.equal(await main(['print-config'], io), 0, io.err);
  const config = JSON.parse(io.out);
  t.equal(config.port, 9999);
  t.equal(config.connector.webhookSecret, '***');
  t.equal(config.s3.accessKeyId, '***');
  t.equal(config.s3.secretAccessKey, '***');
  t.equal(config.s3.bucket, 'uploads');
  t.notMatch(io.out, /very-secret|AKIAEXAMPLE|a-webhook-secret/);

  const defaults = capture();
  t.equal(await main(['print-config'], defaults), 0, defaults.err);
  t.equal(JSON.parse(defaults.out).connector.webhookSecret, null, 'unset stays null');

  const bad = capture({ PORT: 'eighty' });
  t.equal(await main(['print-config'], bad), 1);
  t.match(bad.err, /PORT/);
});

t.test('print-config masks the credentials in NATS_URL: token@ and user:password@, with or without a scheme', async (t) => {
  const io = capture({
    NATS_URL: 'nats://natstoken1@n1:4222,user:natspass2@n2:4222,natstoken3@n3:4222,tls://user:natspass4@n4:4222',
    CLIENTS_FILE: '/etc/ingest/clients.json',
  });
  t.equal(await main(['print-config'], io), 0, io.err);
  t.notMatch(io.out, /natstoken|natspass/);
  t.equal(JSON.parse(io.out).nats.url, 'nats://***@n1:4222,nats://user:***@n2:4222,nats://***@n3:4222,tls://user:***@n4:4222');
});

t.test('issue-client --file with an empty name is a usage error (exit 2), not a rename failure', async (t) => {
  const io = capture();
  t.equal(await main(['issue-client', '--id', 'acme', '--file', ''], io), 2);
  t.match(io.err, /^ingest-admin: issue-client: --file names no file\n/);
});
