/**
 * `ingest`'s credentials as headers: a client id or token that no HTTP header can carry (a
 * line end read with it from a file, a control character) is a usage error naming where it
 * came from, before anything is sent, and the value is not printed.
 */
import t from 'tap';
import { IngestClient } from '../../src/client/client.js';
import { main, EXIT } from '../../src/cli/ingest.js';

async function run(env: NodeJS.ProcessEnv, args: string[] = ['entities']): Promise<{ code: number; stderr: string }> {
  let stderr = '';
  const code = await main(args, {
    stdout: { write: () => true },
    stderr: { write: (s: string) => (stderr += s) },
    // nothing listens on port 9 of loopback: a request would fail as unreachable, after retries
    env: { INGEST_URL: 'http://127.0.0.1:9', INGEST_CLIENT_ID: 'demo', INGEST_TOKEN: 'demo-token', XDG_CONFIG_HOME: '/nonexistent', XDG_STATE_HOME: '/nonexistent', ...env },
  });
  return { code, stderr };
}

t.test('a token or client id with a line end is a usage error naming its source, not "cannot reach the service"', async (t) => {
  for (const [env, source] of [
    [{ INGEST_TOKEN: 'tok-s3cr3t\r\n' }, /^ingest: token \(from \$INGEST_TOKEN\): has a character a header cannot carry/],
    [{ INGEST_TOKEN: 'tok-s3cr3t\n' }, /^ingest: token \(from \$INGEST_TOKEN\): /],
    [{ INGEST_CLIENT_ID: 'demo\u0000' }, /^ingest: client id \(from \$INGEST_CLIENT_ID\): /],
    [{ INGEST_TOKEN: 'tok-s3cr3t€' }, /^ingest: token \(from \$INGEST_TOKEN\): /],
  ] as const) {
    const r = await run(env);
    t.equal(r.code, EXIT.USAGE, `${JSON.stringify(env)}: exit 2 (before: 1 after four retries)`);
    t.match(r.stderr, source);
    t.notMatch(r.stderr, /s3cr3t|cannot reach/, 'the token is not printed, nor is the service called unreachable');
  }
  t.throws(() => new IngestClient({ baseUrl: 'http://x', clientId: 'a', token: 'b\n' }), /^token: has a character a header cannot carry/);
  t.throws(() => new IngestClient({ baseUrl: 'http://x', clientId: 'a\r', token: 'b' }), /clientId/);
  t.doesNotThrow(() => new IngestClient({ baseUrl: 'http://x', clientId: 'dé mo', token: 'tab\tand latin-1 ÿ' }).close(), 'tab, space and latin-1 are header values');
});

t.test('a service URL with a user or password in it is a usage error that does not print them (they were never sent, and printed in every message naming the URL)', async (t) => {
  for (const url of ['http://user:pa55word@127.0.0.1:9', 'https://pa55word@gw.example/', 'htp://user:pa55word@127.0.0.1:9']) {
    const r = await run({ INGEST_URL: url });
    t.equal(r.code, EXIT.USAGE, `${url}: exit 2 (before: 1, "cannot reach the service at ${url}")`);
    t.match(r.stderr, /^ingest: service URL \(INGEST_URL\): /);
    t.match(r.stderr, /\/\/\*\*\*@/, 'the user and password masked');
    t.notMatch(r.stderr, /pa55word/);
  }
});
