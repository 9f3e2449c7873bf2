/** The suite's own nats-server: never one older than the floor, whatever is on PATH. */
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { installHint, natsServerPath, natsServerVersionOk } from '../../testbed/prerequisites.js';

function fakeServer(t: { teardown(fn: () => void): void }, version: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'fake-nats-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const bin = join(dir, 'nats-server');
  writeFileSync(bin, `#!/bin/sh\necho "nats-server: v${version}"\n`);
  chmodSync(bin, 0o755);
  return bin;
}

t.test('a nats-server is taken only from 2.10 on', async (t) => {
  t.notOk(natsServerVersionOk(fakeServer(t, '2.9.10')), '2.9.10 refused');
  t.ok(natsServerVersionOk(fakeServer(t, '2.10.0')), '2.10.0 taken');
  t.ok(natsServerVersionOk(fakeServer(t, '2.15.1')), '2.15.1 taken');
});

t.test('NATS_SERVER_BIN names the binary; PATH is never searched', async (t) => {
  const old = fakeServer(t, '2.9.10');
  t.equal(natsServerPath({ NATS_SERVER_BIN: old }), old, 'an explicit choice is the user’s');
  const path = natsServerPath({ PATH: join(old, '..') });
  t.not(path, old, 'an old one on PATH is not used');
});

t.test('the hint names the floor and how to get a server', async (t) => {
  t.match(installHint(['nats-server']), /nats-server >= 2\.10.*NATS_SERVER_BIN/);
  t.match(installHint(['nats-server', 'curl']), /curl/);
});
