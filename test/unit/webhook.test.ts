import http from 'node:http';
import type { AddressInfo } from 'node:net';
import t from 'tap';
import {
  parseWebhookPayload,
  replayRememberedUntilMs,
  sendWebhook,
  SIGNATURE_HEADER,
  signWebhook,
  TIMESTAMP_HEADER,
  verifyWebhook,
} from '../../src/connector/webhook.js';

const SECRET = 'topsecret';
const TS = 1_700_000_000;
const BODY = '{"upload_uuid":"u1","is_terminated":false}';
// printf '%s' '1700000000.<BODY>' | openssl dgst -sha256 -hmac topsecret
const KNOWN = 'sha256=67ce61eb2f21b57918ec0aa6717104c56ba6a9ff3af2556b5260f22fd7516e05';
const enc = (s: string): Uint8Array => new TextEncoder().encode(s);

const verify = (over: Partial<Parameters<typeof verifyWebhook>[0]> = {}): boolean =>
  verifyWebhook({
    secret: SECRET,
    timestampHeader: String(TS),
    signatureHeader: KNOWN,
    rawBody: enc(BODY),
    nowSeconds: TS,
    ...over,
  });

t.test('signWebhook matches an independent HMAC and takes bytes or text', async (t) => {
  t.equal(signWebhook(SECRET, TS, BODY), KNOWN);
  t.equal(signWebhook(SECRET, TS, enc(BODY)), KNOWN);
});

t.test('a webhook is remembered as applied for as long as any gateway would verify it again', async (t) => {
  const tolerance = 300;
  const until = replayRememberedUntilMs(String(TS), tolerance);
  // Every millisecond at which a gateway verifies the request, its clock up to the window behind
  // the one that applied it (whose clock the remembered entry is dropped by), in 250 ms steps.
  let checked = 0;
  for (let lagS = 0; lagS <= tolerance; lagS += 30) {
    for (let nowMs = (TS + tolerance - 5) * 1000; nowMs <= (TS + tolerance + 5) * 1000; nowMs += 250) {
      if (!verify({ nowSeconds: Math.floor(nowMs / 1000), toleranceSeconds: tolerance })) continue;
      checked++;
      const appliedClockMs = nowMs + lagS * 1000;
      if (appliedClockMs > until) t.fail(`verified again at ${nowMs} ms (the applying gateway's clock ${lagS} s ahead) after the memory ends at ${until}`);
    }
  }
  t.ok(checked > 0, "verifications near the window's end were checked");
  t.notOk(verify({ nowSeconds: TS + tolerance + 1, toleranceSeconds: tolerance }), 'past the window: not verified');
});

t.test('verifyWebhook round trip and rejections', async (t) => {
  t.ok(verify(), 'valid');
  t.ok(verify({ signatureHeader: KNOWN.toUpperCase().replace('SHA256=', 'sha256=') }), 'upper-case hex accepted');
  t.ok(verify({ rawBody: BODY }), 'string body');
  t.notOk(verify({ secret: 'other' }), 'wrong secret');
  t.notOk(verify({ secret: '' }), 'empty secret verifies nothing');
  t.notOk(verify({ rawBody: enc(BODY.replace('false', 'true ')) }), 'tampered body');
  t.notOk(verify({ timestampHeader: String(TS + 1), nowSeconds: TS + 1 }), 'timestamp is signed');
});

t.test('verifyWebhook rejects missing and malformed headers without throwing', async (t) => {
  for (const timestampHeader of [undefined, null, '', 'abc', '1700000000.0', '-1700000000', ' 1700000000', '1e9']) {
    t.notOk(verify({ timestampHeader }), `timestamp ${JSON.stringify(timestampHeader)}`);
  }
  const hex = KNOWN.slice('sha256='.length);
  for (const signatureHeader of [undefined, null, '', hex, `sha1=${hex}`, `sha256=${hex.slice(2)}`, `sha256=${hex}00`,
    `sha256=${'z'.repeat(64)}`, ` ${KNOWN}`, `${KNOWN},sha256=${hex}`]) {
    t.notOk(verify({ signatureHeader }), `signature ${JSON.stringify(signatureHeader)}`);
  }
});

t.test('verifyWebhook tolerance is 300 s either way', async (t) => {
  t.ok(verify({ nowSeconds: TS + 300 }));
  t.ok(verify({ nowSeconds: TS - 300 }));
  t.notOk(verify({ nowSeconds: TS + 301 }), 'too old');
  t.notOk(verify({ nowSeconds: TS - 301 }), 'too far in the future');
  t.ok(verify({ nowSeconds: TS + 1000, toleranceSeconds: 1000 }), 'configurable');
});

t.test('parseWebhookPayload accepts valid payloads', async (t) => {
  t.same(parseWebhookPayload(enc(BODY)), { ok: true, value: { upload_uuid: 'u1', is_terminated: false } });
  const full = { upload_uuid: 'u2', is_terminated: true, status: 'terminated', message: 'stopped' };
  t.strictSame(parseWebhookPayload(enc(JSON.stringify({ ...full, extra: 1 }))), { ok: true, value: full });
  t.strictSame(
    parseWebhookPayload(enc('{"upload_uuid":"u3","is_terminated":false,"status":null,"message":null}')),
    { ok: true, value: { upload_uuid: 'u3', is_terminated: false } },
    'null optionals mean absent',
  );
});

t.test('parseWebhookPayload reports Pydantic v2 issues', async (t) => {
  t.strictSame(parseWebhookPayload(enc('{}')), {
    ok: false,
    issues: [
      { type: 'missing', loc: ['body', 'upload_uuid'], msg: 'Field required', input: {} },
      { type: 'missing', loc: ['body', 'is_terminated'], msg: 'Field required', input: {} },
    ],
  });
  t.strictSame(parseWebhookPayload(enc('{"upload_uuid":7,"is_terminated":"true","status":"done","message":5}')), {
    ok: false,
    issues: [
      { type: 'string_type', loc: ['body', 'upload_uuid'], msg: 'Input should be a valid string', input: 7 },
      { type: 'bool_type', loc: ['body', 'is_terminated'], msg: 'Input should be a valid boolean', input: 'true' },
      {
        type: 'literal_error',
        loc: ['body', 'status'],
        msg: "Input should be 'succeeded', 'failed' or 'terminated'",
        input: 'done',
        ctx: { expected: "'succeeded', 'failed' or 'terminated'" },
      },
      { type: 'string_type', loc: ['body', 'message'], msg: 'Input should be a valid string', input: 5 },
    ],
  });
  t.strictSame(parseWebhookPayload(enc('{"upload_uuid":null}')), {
    ok: false,
    issues: [
      { type: 'string_type', loc: ['body', 'upload_uuid'], msg: 'Input should be a valid string', input: null },
      { type: 'missing', loc: ['body', 'is_terminated'], msg: 'Field required', input: { upload_uuid: null } },
    ],
  });

  const bad = parseWebhookPayload(enc('{"upload_uuid":'));
  t.match(bad, { ok: false, issues: [{ type: 'json_invalid', loc: ['body', 0], msg: 'JSON decode error', input: {}, ctx: { error: String } }] });
  t.match(parseWebhookPayload(new Uint8Array([0x7b, 0xff, 0x7d])), { ok: false, issues: [{ type: 'json_invalid' }] }, 'invalid UTF-8');
  t.strictSame(parseWebhookPayload(new Uint8Array()), {
    ok: false,
    issues: [{ type: 'missing', loc: ['body'], msg: 'Field required', input: null }],
  });
  t.match(parseWebhookPayload(enc('[1]')), {
    ok: false,
    issues: [{ type: 'model_attributes_type', loc: ['body'], input: [1] }],
  });
});

t.test('sendWebhook posts a body that verifyWebhook accepts', async (t) => {
  let seen: { headers: http.IncomingHttpHeaders; body: Buffer } | undefined;
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      seen = { headers: req.headers, body: Buffer.concat(chunks) };
      res.writeHead(202).end('{"status":"ok"}');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    server.closeAllConnections();
    server.close();
  });
  const { port } = server.address() as AddressInfo;
  const payload = { upload_uuid: 'u1', is_terminated: false, status: 'succeeded' as const, message: 'Processed 3 rows' };

  const status = await sendWebhook({ url: `http://127.0.0.1:${port}/hook`, secret: SECRET, payload, timeoutMs: 2000 });

  t.equal(status, 202);
  if (!seen) throw new Error('no request seen');
  t.equal(seen.headers['content-type'], 'application/json');
  t.ok(
    verifyWebhook({
      secret: SECRET,
      timestampHeader: seen.headers[TIMESTAMP_HEADER] as string,
      signatureHeader: seen.headers[SIGNATURE_HEADER] as string,
      rawBody: seen.body,
    }),
  );
  t.strictSame(parseWebhookPayload(seen.body), { ok: true, value: payload });
});
