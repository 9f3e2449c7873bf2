/**
 * The `ingest` command line pushes a 100 MiB CSV through a started service (default rate
 * limits, 8 MiB packages, two in flight), starts the Connector with --wait, and the session
 * ends DONE with every row counted once: by the push, by the Connector, and in storage.
 */
import { createWriteStream } from 'node:fs';
import { join } from 'node:path';
import { once } from 'node:events';
import t from 'tap';
import { cliRunner, storedPackages } from '../support/cli.js';
import { startService, tempDir } from '../support/harness.js';

const TARGET_BYTES = 100 * 1024 * 1024;

/** A products CSV of at least `bytes` bytes, with quoted fields, doubled quotes and empty optional values. */
async function writeCsv(path: string, bytes: number): Promise<{ rows: number; bytes: number }> {
  const out = createWriteStream(path);
  let written = 0;
  let rows = 0;
  const header = 'product_id,name,catalog_id,barcode,unit,price,is_active\r\n';
  out.write(header);
  written += header.length;
  while (written < bytes) {
    let chunk = '';
    for (let k = 0; k < 2000; k++, rows++) {
      const i = rows;
      const name = i % 7 === 0 ? `"Product ${i}, ""special"""` : `Product ${i}`;
      chunk += `p-${i},${name},${i % 5 ? `c-${i % 50}` : ''},${4_000_000_000_000 + i},${i % 3 ? 'pcs' : ''},${(i % 1000) / 10},${i % 2 ? 'true' : 'false'}\r\n`;
    }
    written += Buffer.byteLength(chunk);
    if (!out.write(chunk)) await once(out, 'drain');
  }
  out.end();
  await once(out, 'finish');
  return { rows, bytes: written };
}

t.test('push a 100 MiB CSV, start --wait, DONE with the right row count', async (t) => {
  const svc = await startService(t);
  const cli = await cliRunner(t, svc);
  const dir = await tempDir(t, 'cli-large-');
  const file = join(dir, 'products.csv');
  const { rows, bytes } = await writeCsv(file, TARGET_BYTES);
  t.ok(bytes >= TARGET_BYTES, `${bytes} bytes, ${rows} rows`);

  const started = Date.now();
  const push = await cli.run(['push', file, '--entity', 'products', '--parallel', '2', '--json'], { timeoutMs: 240_000 });
  t.equal(push.code, 0, 'exits 0', { stdout: push.stdout, stderr: push.stderr.slice(-3000) });
  t.match(push.json, { ok: true, rows_read: rows, rows_sent: rows, rows_accepted: rows, packages_failed: 0, file_bytes: bytes });
  const packages: number = push.json.packages_accepted;
  t.ok(packages >= 13, `${packages} packages of at most 8 MiB`);
  t.comment(`push: ${(push.json.elapsed_ms / 1000).toFixed(1)} s, ${(bytes / 1e6 / (push.json.elapsed_ms / 1000)).toFixed(1)} MB/s, ${push.json.retries} retries`);

  const start = await cli.run(['start', '--from', '2024-01-01', '--wait', '--json'], { timeoutMs: 180_000 });
  t.equal(start.code, 0, 'exits 0', { stdout: start.stdout, stderr: start.stderr.slice(-3000) });
  t.match(start.json, { ok: true, start: { status: 'started', entities: [{ name: 'products', rows }] }, status: { session_status: 'DONE' } });
  const status = await cli.run(['status', '--json']);
  t.match(status.json, { upload_uuid: push.json.upload_uuid, session_status: 'DONE', entities: ['products'], last_workflow: { status: 'succeeded' } });
  t.comment(`push to DONE: ${((Date.now() - started) / 1000).toFixed(1)} s`);

  const stored = await storedPackages(svc, push.json.upload_uuid, { headersOnly: true });
  t.equal(stored.length, packages, 'one object per package');
  t.equal(
    stored.reduce((n, p) => n + p.header.rows, 0),
    rows,
    'the stored objects hold every row once',
  );
});
