/**
 * What libraries print with `console` becomes a log line with only its head (src/log.ts,
 * `captureConsole`): nats.js prints a protocol error with the bytes it failed on, the rows of
 * clients' packages.
 */
import t from 'tap';
import { captureConsole, jsonLogger } from '../../src/log.js';

function capture(): { lines: Record<string, unknown>[]; target: Pick<Console, 'log' | 'info' | 'debug' | 'warn' | 'error'> } {
  const lines: Record<string, unknown>[] = [];
  const log = jsonLogger({ write: (line: string) => lines.push(JSON.parse(line) as Record<string, unknown>) }, {}, { level: 'info' });
  const target = { log() {}, info() {}, debug() {}, warn() {}, error() {} };
  captureConsole(log, target);
  return { lines, target };
}

t.test("nats.js's reader error keeps its label, not the bytes it failed on", async (t) => {
  const { lines, target } = capture();
  // As nats.js 2.29 builds it (parser.js `fail`) and prints it (protocol.js, the reader loop).
  const row = '{"sku":"SKU-SECRET-1","price":12.5}\n{"sku":"SKU-SECRET-2"';
  target.log('reader closed', new Error(`parse error [3]: MSG _INBOX.x 1 4096\r\n${row}`));
  t.equal(lines.length, 1);
  t.match(lines[0], { level: 'warn', msg: 'library output', text: 'reader closed Error: parse error [3]' });
  t.notMatch(JSON.stringify(lines[0]), /SKU-SECRET/);
});

t.test("Node's own warnings keep their first line", async (t) => {
  const { lines, target } = capture();
  // As Node 20 prints a process warning (lib/internal/process/warning.js, through console.error).
  target.error('(node:42) NodeVersionSupportWarning: The AWS SDK for JavaScript (v3) will require node >=22.\n(Use `node --trace-warnings ...` to show where the warning was created)');
  t.same(
    lines.map((l) => l.text),
    ['(node:42) NodeVersionSupportWarning: The AWS SDK for JavaScript (v3) will require node >=22.'],
  );
});

t.test('every console method is captured; long text is cut; objects are named, not printed', async (t) => {
  const { lines, target } = capture();
  target.info('x'.repeat(500));
  target.debug({ rows: ['SKU-SECRET-3'] });
  target.warn('a warning: with a detail');
  target.error(new TypeError('bad value: SKU-SECRET-4'));
  t.same(
    lines.map((l) => l.text),
    ['x'.repeat(100), '[object]', 'a warning', 'TypeError: bad value'],
  );
  t.notMatch(JSON.stringify(lines), /SKU-SECRET/);
});
