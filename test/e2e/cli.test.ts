/**
 * The `ingest` command line as a child process against a started service: CSV edge cases
 * stored as the right typed rows, JSON output and exit codes, a re-run that stores nothing
 * twice, start --wait to DONE, 503 answers retried after their Retry-After without
 * duplicates, init, start, terminate and delete whose first answer is lost, `push --errors`
 * (every record not accepted, fixed and sent again), and a file that stops being readable (the
 * records from the unsent package on named, the fixed file pushed again storing each row once).
 * (The 100 MiB push is cli-large.test.ts.)
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync } from 'node:fs';
import { chmod, mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { createServer, request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { parse as parseCsv } from 'csv-parse/sync';
import t, { type Test } from 'tap';
import { CLI, cliRunner, rowObjects, storedPackages } from '../support/cli.js';
import { DEMO, startService, tempDir } from '../support/harness.js';

const byId = (key: string) => (a: Record<string, unknown>, b: Record<string, unknown>) => String(a[key]).localeCompare(String(b[key]));
/** A CSV record: fields quoted when they need it. */
const csvLine = (fields: readonly string[]) => fields.map((f) => (/[",\r\n]/.test(f) ? `"${f.replace(/"/g, '""')}"` : f)).join(',');

t.test('CSV edge cases: BOM, CRLF, quotes, embedded newlines, empty optional values; stored typed and exact', async (t) => {
  const svc = await startService(t);
  const cli = await cliRunner(t, svc);
  const dir = await tempDir(t, 'cli-csv-');
  const products = join(dir, 'products.csv');
  const lines = [
    'product_id,name,catalog_id,barcode,unit,price,is_active',
    'p-001,"Water, still",c1,0071,pcs,0.5,true',
    'p-002,"Two\r\nlines, ""quoted""",,,,,FALSE',
    'p-003,"LF only\ninside",c2,"",kg,1e3,0',
    'p-004,Ünïcødé ✓ €,c3,  padded  ,,12.50,yes',
    'p-005,"""",c1,,"",0,',
  ];
  const extra = Array.from({ length: 60 }, (_, i) => `x-${String(i).padStart(3, '0')},"Filler, ${i}",c9,${1000 + i},box,${i}.25,${i % 2 ? 'true' : 'false'}`);
  await writeFile(products, `\ufeff${[...lines, ...extra].join('\r\n')}\r\n`);

  const run = await cli.run(['push', products, '--entity', 'products', '--package-size', '1KiB', '--json']);
  t.equal(run.code, 0, 'exits 0', { stdout: run.stdout, stderr: run.stderr.slice(-3000) });
  t.match(run.json, { ok: true, entity: 'products', format: 'csv', rows_read: 65, rows_sent: 65, rows_accepted: 65, packages_failed: 0, input_error: null });
  t.ok(run.json.packages_accepted >= 3, `cut into ${run.json.packages_accepted} packages of at most 1 KiB`);
  t.match(run.stderr, /package 0 accepted: \d+ rows/, 'plain progress lines when stderr is not a terminal');
  const uuid: string = run.json.upload_uuid;

  const stored = await storedPackages(svc, uuid);
  t.equal(stored.length, run.json.packages_accepted, 'one object per package');
  for (const p of stored) t.same(p.header.columns, ['product_id', 'name', 'catalog_id', 'barcode', 'unit', 'price', 'is_active']);
  const rows = rowObjects(stored).sort(byId('product_id'));
  t.equal(rows.length, 65);
  t.same(rows.slice(0, 5), [
    { product_id: 'p-001', name: 'Water, still', catalog_id: 'c1', barcode: '0071', unit: 'pcs', price: 0.5, is_active: true },
    { product_id: 'p-002', name: 'Two\r\nlines, "quoted"', catalog_id: null, barcode: null, unit: null, price: null, is_active: false },
    { product_id: 'p-003', name: 'LF only\ninside', catalog_id: 'c2', barcode: null, unit: 'kg', price: 1000, is_active: false },
    { product_id: 'p-004', name: 'Ünïcødé ✓ €', catalog_id: 'c3', barcode: '  padded  ', unit: null, price: 12.5, is_active: true },
    { product_id: 'p-005', name: '"', catalog_id: 'c1', barcode: null, unit: null, price: 0, is_active: null },
  ]);
  t.same(rows[5], { product_id: 'x-000', name: 'Filler, 0', catalog_id: 'c9', barcode: '1000', unit: 'box', price: 0.25, is_active: false });

  // Another entity into the same (remembered) session: LF line ends, no final newline, integers, datetimes.
  const lines2 = join(dir, 'receipt_lines.csv');
  await writeFile(lines2, 'receipt_id,line_no,product_id,quantity,price,discount\nr1,1,p-001,2,0.5,\nr1,2,p-004,1.5,12.5,0.1\n"r,2",1,p-002,-1,0,');
  const run2 = await cli.run(['push', lines2, '--entity', 'receipt_lines', '--json', '--quiet']);
  t.equal(run2.code, 0, 'exits 0', { stdout: run2.stdout, stderr: run2.stderr.slice(-3000) });
  t.equal(run2.json.upload_uuid, uuid, 'the open session is used');
  const receipts = rowObjects((await storedPackages(svc, uuid)).filter((p) => p.header.entity === 'receipt_lines'));
  t.same(receipts, [
    { receipt_id: 'r1', line_no: 1, product_id: 'p-001', quantity: 2, price: 0.5, discount: null },
    { receipt_id: 'r1', line_no: 2, product_id: 'p-004', quantity: 1.5, price: 12.5, discount: 0.1 },
    { receipt_id: 'r,2', line_no: 1, product_id: 'p-002', quantity: -1, price: 0, discount: null },
  ]);
  const status = await cli.run(['status', '--json']);
  t.equal(status.code, 0);
  t.match(status.json, { upload_uuid: uuid, session_status: 'UPLOADING', entities: ['products', 'receipt_lines'], can_upload_entities: true });
});

t.test('NDJSON and JSON files push too', async (t) => {
  const svc = await startService(t);
  const cli = await cliRunner(t, svc);
  const dir = await tempDir(t, 'cli-json-');
  await writeFile(join(dir, 'stores.ndjson'), '{"store_id":"s1","name":"One","opened_on":"2020-02-29"}\r\n\n{"store_id":"s2","name":"Two","city":"Kraków"}\n');
  await writeFile(join(dir, 'catalogs.json'), JSON.stringify({ data: [['c1', 'Drinks', null]], columns: ['catalog_id', 'name', 'parent_id'] }));
  await writeFile(join(dir, 'stock.jsonl'), '["store_id","product_id","date","quantity"]\n["s1","p1","2024-01-02",3]\n');
  for (const [file, entity] of [
    ['stores.ndjson', 'stores'],
    ['catalogs.json', 'catalogs'],
    ['stock.jsonl', 'stock'],
  ] as const) {
    // gzip on the wire for one of them
    const run = await cli.run(['push', join(dir, file), '--entity', entity, '--json', '--quiet', ...(entity === 'stock' ? ['--gzip'] : [])]);
    t.equal(run.code, 0, 'exits 0', { stdout: run.stdout, stderr: run.stderr.slice(-3000) });
  }
  const uuid = (await cli.run(['status', '--json'])).json.upload_uuid;
  const stored = await storedPackages(svc, uuid);
  const of = (entity: string) => rowObjects(stored.filter((p) => p.header.entity === entity));
  t.same(of('stores'), [
    { store_id: 's1', name: 'One', opened_on: '2020-02-29', city: null },
    { store_id: 's2', name: 'Two', opened_on: null, city: 'Kraków' },
  ]);
  t.same(of('catalogs'), [{ catalog_id: 'c1', name: 'Drinks', parent_id: null }]);
  t.same(of('stock'), [{ store_id: 's1', product_id: 'p1', date: '2024-01-02', quantity: 3 }]);
});

t.test('JSON output and exit codes', async (t) => {
  const svc = await startService(t);
  const cli = await cliRunner(t, svc);
  const dir = await tempDir(t, 'cli-codes-');

  const help = await cli.run(['--help']);
  t.equal(help.code, 0);
  t.match(help.stdout, /Usage: ingest <command>/);
  t.match(help.stdout, /Exit codes:/);
  t.equal((await cli.run([])).code, 2, 'no command: usage');
  t.equal((await cli.run(['frobnicate'])).code, 2);
  const badFlag = await cli.run(['status', '--bogus', '--json']);
  t.equal(badFlag.code, 2);
  t.match(badFlag.json, { error: { code: 'USAGE', message: /bogus/ } });
  t.match((await cli.run(['push', 'x.csv'])).stderr, /--entity is required/);
  t.equal((await cli.run(['start', '--from', '2024-1-1'])).code, 2, 'a malformed date');
  t.equal((await cli.run(['push', 'x.csv', '--entity', 'products', '--package-size', '64MiB'])).code, 2, 'over 32 MiB');
  t.equal((await cli.run(['push', 'x.csv', '--entity', 'products', '--parallel', '0'])).code, 2);

  const noToken = await cli.run(['status', 'u'], { env: { INGEST_TOKEN: undefined } });
  t.equal(noToken.code, 2, 'no credentials: usage');
  t.match(noToken.stderr, /no token: pass --token, set INGEST_TOKEN, or put "token" in .*config\.json/);
  t.equal((await cli.run(['status'])).code, 2, 'no uuid given and none remembered');

  // Credentials from the default config file, then from --config.
  await mkdir(join(cli.home, '.config', 'ingest'), { recursive: true });
  const config = join(cli.home, '.config', 'ingest', 'config.json');
  await writeFile(config, JSON.stringify({ url: svc.url, client_id: 'demo', token: 'demo-token' }));
  await chmod(config, 0o600);
  const bare = { INGEST_URL: undefined, INGEST_CLIENT_ID: undefined, INGEST_TOKEN: undefined };
  const init = await cli.run(['init', '--json'], { env: bare });
  t.equal(init.code, 0, 'exits 0', { stdout: init.stdout, stderr: init.stderr.slice(-3000) });
  t.match(init.json, { status: 'created', upload_uuid: /^[0-9a-f-]{36}$/ });
  const uuid: string = init.json.upload_uuid;
  const other = join(dir, 'other.json');
  await writeFile(other, JSON.stringify({ url: svc.url, client_id: 'demo', token: 'wrong' }));
  const unauthorized = await cli.run(['status', uuid, '--config', other, '--json'], { env: bare });
  t.equal(unauthorized.code, 1);
  t.match(unauthorized.json, { error: { code: 'API_ERROR', status: 401, detail: 'User not authenticated' } });
  t.ok(unauthorized.json.error.message.includes(`client id "demo" (from ${other}) and its token (from ${other}) are checked together`), 'the 401 names the client id and where both came from');
  t.equal((await cli.run(['status', '--config', join(dir, 'missing.json')], { env: bare })).code, 2, 'a named config file must exist');

  const again = await cli.run(['init']);
  t.equal(again.code, 1, 'a second init: 409');
  t.match(again.stderr, new RegExp(`409 Upload session already exists: upload ${uuid} is UPLOADING`));

  const status = await cli.run(['status', '--json']);
  t.equal(status.code, 0);
  t.same(status.json, {
    upload_uuid: uuid,
    session_status: 'UPLOADING',
    entities: [],
    upload_tasks_finished: true,
    can_upload_entities: true,
    can_start_upload: false,
    can_terminate: false,
    entity_counts: [],
    totals: { packages: 0, rows: 0, bytes: 0, stored_packages: 0 },
  });
  t.match((await cli.run(['status'])).stdout, new RegExp(`^${uuid} UPLOADING · entities: – ·`));
  const missing = await cli.run(['status', '00000000-0000-4000-8000-000000000000', '--json']);
  t.equal(missing.code, 1);
  t.match(missing.json, { error: { code: 'API_ERROR', status: 404, detail: 'Upload session not found' } });
  const notRunning = await cli.run(['terminate', '--json']);
  t.equal(notRunning.code, 1);
  t.match(notRunning.json, { error: { status: 404, detail: 'Workflow is not running' } });

  // The file's header is checked before anything is sent: exit 4, the session untouched.
  const badHeader = join(dir, 'bad-header.csv');
  await writeFile(badHeader, 'product_id,name,colour\np1,a,red\n');
  const input = await cli.run(['push', badHeader, '--entity', 'products', '--json']);
  t.equal(input.code, 4);
  t.match(input.json, { error: { code: 'INPUT', message: /CSV header: unknown column of products: "colour"/ } });
  t.equal((await cli.run(['push', badHeader, '--entity', 'nope'])).code, 2, 'an unknown entity is a usage error');
  t.equal((await cli.run(['push', join(dir, 'absent.csv'), '--entity', 'products'])).code, 4, 'a missing file');

  // Bad rows (file records 120 and 121) in the third package of about 45 rows: two packages stay, the push stops, exit 3.
  const rows = Array.from({ length: 150 }, (_, i) => `p${i},Name ${i},${i === 119 ? 'free' : i === 120 ? -3 : i}`);
  const partialFile = join(dir, 'partial.csv');
  await writeFile(partialFile, `product_id,name,price\n${rows.join('\n')}\n`);
  // A dry run first: every package checked (past the bad one too), nothing stored, exit 3.
  const dry = await cli.run(['push', partialFile, '--entity', 'products', '--package-size', '1KiB', '--parallel', '1', '--dry-run', '--json']);
  t.equal(dry.code, 3, 'a dry run with refused records exits 3', { stdout: dry.stdout });
  t.match(dry.json, { ok: false, dry_run: true, packages_failed: 1, failures: [{ status: 422, record: 120, error_count: 2 }] });
  t.equal(dry.json.rows_accepted + dry.json.failures[0].rows, 150, 'every package was checked, the ones after the refused one too');
  const dryHuman = await cli.run(['push', partialFile, '--entity', 'products', '--package-size', '1KiB', '--parallel', '1', '--dry-run']);
  t.match(dryHuman.stdout, new RegExp(`^dry run, nothing stored: would accept ${dry.json.rows_accepted} rows of products in \\d+ packages .* against upload `));
  t.match(dryHuman.stdout, /nothing was stored; fix the refused records and check the file again/);
  t.match((await cli.run(['status', '--json'])).json, { entities: [], totals: { packages: 0, rows: 0 } }, 'the dry runs stored and recorded nothing');
  const partial = await cli.run(['push', partialFile, '--entity', 'products', '--package-size', '1KiB', '--parallel', '1', '--json']);
  t.equal(partial.code, 3, 'exits 3', { stdout: partial.stdout });
  t.match(partial.json, { ok: false, packages_failed: 1, input_error: null });
  t.ok(partial.json.packages_accepted >= 2);
  const [failure] = partial.json.failures;
  t.match(failure, { status: 422, code: 'API_ERROR', record: 120, detail: /^Invalid data types in payload: row \d+, column "price": expected number >= 0, got "free"/ });
  t.ok(failure.first_record <= 120 && failure.first_record + failure.rows > 121, 'the failing package holds file records 120 and 121');
  t.same(
    [failure.error_count, failure.errors.map((e: { record: number; column: string; message: string }) => [e.record, e.column, e.message])],
    [2, [[120, 'price', 'expected number >= 0, got "free"'], [121, 'price', 'expected number >= 0, got -3']]],
    'every refused row, by file record',
  );
  t.equal(partial.json.rows_accepted, failure.first_record - 1, 'every row before the failing package, none after');
  const human = await cli.run(['push', partialFile, '--entity', 'products', '--package-size', '1KiB', '--parallel', '1']);
  t.equal(human.code, 3);
  t.match(human.stdout, /push incomplete: .* packages already stored/);
  t.match(human.stdout, /failed: 422 Invalid data types in payload: .* \(file record 120\)/);
  t.match(human.stdout, /\n {4}2 errors in refused rows:\n {6}file record 120, column "price": expected number >= 0, got "free"\n {6}file record 121, column "price": expected number >= 0, got -3\n/);
  // A reader that went away (`| head -0`): the summary cannot be written, the exit code is still the push's.
  const gone = spawn(process.execPath, [CLI, 'push', partialFile, '--entity', 'products', '--package-size', '1KiB', '--parallel', '1'], {
    env: { PATH: process.env.PATH ?? '', HOME: cli.home, INGEST_URL: svc.url, INGEST_CLIENT_ID: DEMO.id, INGEST_TOKEN: DEMO.token },
    stdio: ['ignore', 'pipe', 'ignore'],
  });
  gone.stdout.destroy();
  const [goneCode] = (await once(gone, 'close')) as [number | null];
  t.equal(goneCode, 3, 'standard output closed by its reader: exits 3 all the same');

  // The first package bad: nothing accepted, exit 1.
  const firstBad = join(dir, 'first-bad.csv');
  await writeFile(firstBad, 'product_id,name,price\np1,a,-1\n');
  const bad = await cli.run(['push', firstBad, '--entity', 'products', '--json']);
  t.equal(bad.code, 1);
  t.match(bad.json, { packages_accepted: 0, packages_failed: 1, failures: [{ record: 1, status: 422 }] });

  const deleted = await cli.run(['delete', '--json']);
  t.equal(deleted.code, 0);
  t.match(deleted.json, { status: 'started', message: 'Upload deletion started' });
  t.equal((await cli.run(['status', uuid])).code, 1, 'the deleted session is gone');
  t.equal((await cli.run(['status'])).code, 2, 'and no longer remembered');
});

t.test('a re-run of the same push stores nothing twice, also with --gzip added; start --wait reaches DONE with the row count', async (t) => {
  const svc = await startService(t);
  const cli = await cliRunner(t, svc);
  const dir = await tempDir(t, 'cli-rerun-');
  const file = join(dir, 'products.csv');
  const n = 400;
  await writeFile(file, `product_id,name,price\n${Array.from({ length: n }, (_, i) => `p${i},"Name, ${i}",${i}`).join('\n')}\n`);
  const first = await cli.run(['push', file, '--entity', 'products', '--package-size', '1KiB', '--parallel', '3', '--json', '--quiet']);
  t.equal(first.code, 0, 'exits 0', { stdout: first.stdout, stderr: first.stderr.slice(-3000) });
  t.match(first.json, { rows_accepted: n, packages_replayed: 0 });
  const uuid: string = first.json.upload_uuid;
  const packages: number = first.json.packages_accepted;
  t.ok(packages > 3);

  const second = await cli.run(['push', file, '--entity', 'products', '--package-size', '1KiB', '--upload', uuid, '--json', '--quiet']);
  t.equal(second.code, 0);
  t.match(second.json, { rows_accepted: n, packages_accepted: packages, packages_replayed: packages }, 'every package answered from its Idempotency-Key');
  // Again with --gzip: the same keys, another length on the wire (the service binds a key to it).
  const gzipped = await cli.run(['push', file, '--entity', 'products', '--package-size', '1KiB', '--upload', uuid, '--gzip', '--json', '--quiet']);
  t.equal(gzipped.code, 0, 'a re-run with --gzip added: done', { stdout: gzipped.stdout, stderr: gzipped.stderr.slice(-3000) });
  t.match(gzipped.json, { rows_accepted: n, packages_accepted: packages, packages_replayed: packages, packages_failed: 0 }, 'every package answered from its key, not refused as another request');
  const stored = await storedPackages(svc, uuid);
  t.equal(stored.length, packages, 'no package stored twice');
  t.equal(rowObjects(stored).length, n);

  const start = await cli.run(['start', '--from', '2024-01-01', '--wait', '--json'], { timeoutMs: 60_000 });
  t.equal(start.code, 0, 'exits 0', { stdout: start.stdout, stderr: start.stderr.slice(-3000) });
  t.match(start.json, { ok: true, status: { upload_uuid: uuid, session_status: 'DONE' }, start: { status: 'started', entities: [{ name: 'products', rows: n }] } });
  t.match((await cli.run(['status', '--json'])).json, { session_status: 'DONE' });
  const watch = await cli.run(['status', '--watch', '--json']);
  t.equal(watch.code, 0, '--watch ends at DONE');
  t.match(watch.json, { session_status: 'DONE' });
  const late = await cli.run(['push', file, '--entity', 'products', '--upload', uuid, '--json', '--quiet']);
  t.equal(late.code, 1, 'pushing into a DONE session');
  t.match(late.json, { error: { status: 409 } });
});

t.test('one push of standard input, several files and a folder; equal packages of two inputs stored as two; a re-run stores nothing twice', async (t) => {
  const svc = await startService(t);
  const cli = await cliRunner(t, svc);
  const dir = await tempDir(t, 'cli-many-');
  const folder = join(dir, 'daily');
  await mkdir(folder);
  const csv = (from: number, n: number) => `product_id,name,price\n${Array.from({ length: n }, (_, i) => `p${from + i},Name ${from + i},${i}`).join('\n')}\n`;
  const same = csv(0, 20); // the same rows in two files: two packages, both stored
  await writeFile(join(dir, 'a.csv'), same);
  await writeFile(join(folder, 'b.csv'), same);
  await writeFile(join(folder, 'c.ndjson'), Array.from({ length: 30 }, (_, i) => JSON.stringify({ product_id: `n${i}`, name: `N ${i}` })).join('\n') + '\n');
  await writeFile(join(folder, 'notes.txt'), 'not an input');
  const stdin = csv(100, 50);

  const args = ['push', '-', join(dir, 'a.csv'), folder, '--entity', 'products', '--format', 'csv', '--json', '--quiet'];
  const noFormat = await cli.run(['push', '-', '--entity', 'products'], { input: stdin });
  t.equal(noFormat.code, 2, 'standard input needs --format');
  t.match(noFormat.stderr, /standard input needs --format/);
  // --format names every input's format: the folder's NDJSON file then needs its own push.
  const mixed = await cli.run([...args], { input: stdin });
  t.equal(mixed.code, 4, 'an NDJSON file read as CSV: a bad header, nothing sent');
  t.equal((await cli.run(['status', '--json'])).code, 2, 'no session was made for it');

  await rm(join(folder, 'c.ndjson'));
  const first = await cli.run(args, { input: stdin });
  t.equal(first.code, 0, 'exits 0', { stdout: first.stdout, stderr: first.stderr.slice(-3000) });
  t.same(first.json.files.map((f: { file: string; rows_accepted: number }) => [f.file, f.rows_accepted]), [
    ['standard input', 50],
    [join(dir, 'a.csv'), 20],
    [join(folder, 'b.csv'), 20],
  ]);
  const uuid: string = first.json.files[0].upload_uuid;
  t.equal(rowObjects(await storedPackages(svc, uuid)).length, 90, 'every row stored, the equal files both');

  const again = await cli.run(args, { input: stdin });
  t.equal(again.code, 0);
  t.same(again.json.files.map((f: { packages_replayed: number; packages_accepted: number }) => f.packages_replayed === f.packages_accepted), [true, true, true], 'a re-run: every package answered from its key');
  t.equal(rowObjects(await storedPackages(svc, uuid)).length, 90, 'nothing stored twice');

  const human = await cli.run(['push', join(dir, 'a.csv'), folder, '--entity', 'products']);
  t.match(human.stdout, new RegExp(`^pushed 20 rows of products in 1 package .* into upload ${uuid} from ${join(dir, 'a.csv').replace(/[.]/g, '\\.')}$`, 'm'), 'each input named');
});

t.test('503 answers are retried after their Retry-After, with the same key, and nothing is stored twice', async (t) => {
  // 4 requests a second (burst 4) per IP, while the CLI is told it may send 30.
  const svc = await startService(t, { limits: { requestsPerSecond: 4, burst: 4 } });
  const cli = await cliRunner(t, svc);
  const dir = await tempDir(t, 'cli-503-');
  const file = join(dir, 'products.csv');
  const n = 600;
  await writeFile(file, `product_id,name,price\n${Array.from({ length: n }, (_, i) => `p${i},Name ${i},${i % 97}`).join('\n')}\n`);
  const run = await cli.run(['push', file, '--entity', 'products', '--package-size', '1KiB', '--parallel', '4', '--rate', '30', '--retries', '20', '--json'], { timeoutMs: 120_000 });
  t.equal(run.code, 0, 'exits 0', { stdout: run.stdout, stderr: run.stderr.slice(-3000) });
  t.match(run.json, { ok: true, rows_accepted: n, packages_failed: 0 });
  t.ok(run.json.retries > 0, `${run.json.retries} retries`);
  const waits = [...run.stderr.matchAll(/: 503 Rate limit exceeded; retry \d+ in (\d+\.\d) s/g)].map((m) => Number(m[1]));
  t.ok(waits.length > 0, `${waits.length} retries after a 503 with Retry-After`);
  t.ok(
    waits.every((s) => s >= 1),
    `every such wait at least Retry-After (1 s): ${waits.join(', ')}`,
  );
  const stored = await storedPackages(svc, run.json.upload_uuid);
  t.equal(stored.length, run.json.packages_accepted, 'one object per accepted package');
  const ids = rowObjects(stored).map((r) => r.product_id);
  t.equal(ids.length, n, 'every row stored');
  t.equal(new Set(ids).size, n, 'none twice');
});

/** An answer the proxy took from the service and never passed on. */
interface Lost {
  status: number;
  body: any;
}

/**
 * An HTTP proxy in front of the service that loses the answer to the next request whose path
 * ends with `path`: the request is carried out, and its answer is held until the client gave
 * up on it (`late`: its deadline, the CLI's --timeout, closes the connection) or the
 * connection is closed at once (`reset`). Every other request goes through as it is.
 */
async function losingProxy(t: Test, target: string): Promise<{ url: string; lose(path: string, how: 'late' | 'reset'): Promise<Lost>; seen: string[] }> {
  const seen: string[] = [];
  let armed: { path: string; how: 'late' | 'reset'; lost(answer: Lost): void } | null = null;
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      seen.push(`${req.method} ${req.url}`);
      const losing = armed !== null && req.url!.endsWith(armed.path) ? armed : null;
      if (losing) armed = null;
      const { host: _host, connection: _connection, ...headers } = req.headers;
      const upstream = request(`${target}${req.url}`, { method: req.method, headers }, (answer) => {
        const body: Buffer[] = [];
        answer.on('data', (c: Buffer) => body.push(c));
        answer.on('end', () => {
          const text = Buffer.concat(body);
          if (!losing) {
            const { connection: _c, 'keep-alive': _k, 'transfer-encoding': _te, ...rest } = answer.headers;
            res.writeHead(answer.statusCode!, { ...rest, 'content-length': text.length }).end(text);
            return;
          }
          const lost = { status: answer.statusCode!, body: JSON.parse(text.toString('utf8')) };
          if (losing.how === 'reset') {
            req.socket.destroy();
            losing.lost(lost);
          } else if (res.closed) losing.lost(lost);
          else res.on('close', () => losing.lost(lost));
        });
      });
      upstream.on('error', () => res.destroy());
      upstream.end(Buffer.concat(chunks));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    server.closeAllConnections();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    seen,
    lose: (path, how) => new Promise<Lost>((lost) => (armed = { path, how, lost })),
  };
}

t.test('init whose answer is lost (late): the retry\'s 409 names the session it may have made, said as such', async (t) => {
  const svc = await startService(t);
  const proxy = await losingProxy(t, svc.url);
  const cli = await cliRunner(t, proxy);

  // Its 200 comes after --timeout; the retry's 409 names the session that attempt made, which
  // no answer of the service tells from one open before: said, not claimed.
  const lost = proxy.lose('/initialize-session', 'late');
  const init = await cli.run(['init', '--timeout', '1', '--json']);
  const made = await lost;
  t.match(made, { status: 200, body: { status: 'created' } });
  const uuid: string = made.body.upload_uuid;
  t.match(init.stderr, /no answer within 1000 ms; retry 1 in/);
  t.equal(init.code, 1, 'exits 1', { stdout: init.stdout, stderr: init.stderr });
  t.match(init.json, {
    error: {
      status: 409,
      message: `409 Upload session already exists: upload ${uuid} is UPLOADING (push with --upload to add to it, or delete it); an earlier attempt's answer was lost, so this may be the session that attempt created (the service's answers do not tell it from one open before)`,
    },
  });
  t.equal(proxy.seen.filter((s) => s.endsWith('/initialize-session')).length, 2);
  t.match((await cli.run(['status', '--json'])).json, { upload_uuid: uuid, session_status: 'UPLOADING' }, 'and remembered');
});

t.test('start --wait whose answer is lost (late): the retry\'s 409 STARTED is that start, and the workflow is waited for', async (t) => {
  const svc = await startService(t);
  const proxy = await losingProxy(t, svc.url);
  const cli = await cliRunner(t, proxy);
  const dir = await tempDir(t, 'cli-lost-start-');
  const file = join(dir, 'products.csv');
  await writeFile(file, 'product_id,name,price\np1,Water,0.5\n');
  const push = await cli.run(['push', file, '--entity', 'products', '--json', '--quiet']);
  t.equal(push.code, 0, 'exits 0', { stdout: push.stdout, stderr: push.stderr.slice(-3000) });
  const uuid: string = push.json.upload_uuid;

  // The Connector's answer comes after --timeout; the retry meets the session STARTED (or DONE already).
  const lost = proxy.lose('/start-upload', 'late');
  const start = await cli.run(['start', '--from', '2024-01-01', '--wait', '--timeout', '1', '--json']);
  t.match(await lost, { status: 200, body: { status: 'started', entities: [{ name: 'products', rows: 1 }] } });
  t.match(start.stderr, /no answer within 1000 ms; retry 1 in/);
  t.match(start.stderr, new RegExp(`upload ${uuid}: start-upload's answer was lost, and its retry found the session (STARTED|DONE): it started`));
  t.equal(start.code, 0, 'exits 0', { stdout: start.stdout, stderr: start.stderr });
  t.match(start.json, { ok: true, start: { answer_lost: true, status: { upload_uuid: uuid } }, status: { upload_uuid: uuid, session_status: 'DONE' } });
  t.equal(proxy.seen.filter((s) => s.endsWith('/start-upload')).length, 2, 'start-upload twice: carried out, then refused');
});

t.test('delete whose answer is lost (reset): the retry finds no session, and the call is reported as deleted', async (t) => {
  const svc = await startService(t);
  const proxy = await losingProxy(t, svc.url);
  const cli = await cliRunner(t, proxy);
  const init = await cli.run(['init', '--json']);
  t.equal(init.code, 0);
  const uuid: string = init.json.upload_uuid;

  // The connection closes once the service deleted the session.
  const lost = proxy.lose('/delete', 'reset');
  const del = await cli.run(['delete', '--json']);
  t.match(await lost, { status: 200, body: { message: 'Upload deletion started' } });
  t.match(del.stderr, /retry 1 in/);
  t.equal(del.code, 0, 'exits 0', { stdout: del.stdout, stderr: del.stderr });
  t.match(del.json, { status: 'started', message: `Upload deletion started: upload ${uuid} is gone (the answer to delete was lost)`, answer_lost: true });
  t.equal(proxy.seen.filter((s) => s.endsWith('/delete')).length, 2);
  t.match((await cli.run(['status', uuid, '--json'])).json, { error: { status: 404 } });
  t.equal((await cli.run(['status'])).code, 2, 'no longer remembered');
});

t.test('terminate whose answer is lost (reset): the retry finds no workflow running, and the call is reported as the stop it was', async (t) => {
  // The workflow runs until terminated (its completion a minute away).
  const svc = await startService(t, { connector: { emulatorDelayMs: 60_000 } });
  const proxy = await losingProxy(t, svc.url);
  const cli = await cliRunner(t, proxy);
  const dir = await tempDir(t, 'cli-lost-terminate-');
  const file = join(dir, 'products.csv');
  await writeFile(file, 'product_id,name,price\np1,Water,0.5\n');
  t.equal((await cli.run(['push', file, '--entity', 'products', '--json', '--quiet'])).code, 0);
  const start = await cli.run(['start', '--from', '2024-01-01', '--json']);
  t.equal(start.code, 0, 'started', { stdout: start.stdout, stderr: start.stderr });

  // The connection closes once the service asked the Connector to stop.
  const lost = proxy.lose('/terminate', 'reset');
  const stop = await cli.run(['terminate', '--wait', '--json']);
  t.match(await lost, { status: 200, body: { status: 'started' } });
  t.match(stop.stderr, /retry 1 in/);
  t.match(stop.stderr, /terminate's answer was lost, and its retry found the workflow no longer running: it was stopped/);
  t.equal(stop.code, 0, 'exits 0', { stdout: stop.stdout, stderr: stop.stderr });
  t.match(stop.json, { terminate: { status: 'started', answer_lost: true }, status: { session_status: 'UPLOADING', last_workflow: { status: 'terminated' } } });
  t.equal(proxy.seen.filter((s) => s.endsWith('/terminate')).length, 2, 'terminate twice: carried out, then refused');
});

t.test('status without a remembered session names the real cause; --watch --until ends; counts read right', async (t) => {
  const svc = await startService(t);
  const cli = await cliRunner(t, svc);
  const dir = await tempDir(t, 'cli-walk-');

  const stranger = await cli.run(['status'], { env: { INGEST_CLIENT_ID: 'nobody' } });
  t.equal(stranger.code, 1, 'a wrong client id: the service refuses');
  t.match(stranger.stderr, /^ingest: 401 User not authenticated: client id "nobody" \(from \$INGEST_CLIENT_ID\) and its token \(from \$INGEST_TOKEN\) are checked together; the service does not say which one it refused$/m);
  t.notMatch(stranger.stderr, /no upload uuid/);
  const closed = await cli.run(['status', '--json'], { env: { INGEST_URL: 'http://127.0.0.1:9' } });
  t.equal(closed.code, 1, 'the service unreachable');
  t.match(closed.json, { error: { code: 'NETWORK', message: /^cannot reach the service at http:\/\/127\.0\.0\.1:9 \(from \$INGEST_URL\): connect ECONNREFUSED/ } });
  t.notMatch(closed.json.error.message, /entities/, 'not named by a call the user never made');
  const fresh = await cli.run(['status']);
  t.equal(fresh.code, 2, 'reachable and authenticated, but no session remembered');
  t.match(fresh.stderr, /no upload uuid remembered for client demo at http:\/\/127\.0\.0\.1:\d+: pass one/);
  t.equal((await cli.run(['status', 'u', '--until', 'DONE'])).code, 2, '--until goes with --watch');
  t.equal((await cli.run(['status', 'u', '--watch', '--until', 'later'])).code, 2, 'an unknown --until');

  const one = join(dir, 'one.csv');
  await writeFile(one, 'catalog_id,name\nc1,Drinks\n');
  const pushed = await cli.run(['push', one, '--entity', 'catalogs', '--new']);
  t.equal(pushed.code, 0, 'exits 0', { stderr: pushed.stderr });
  t.match(pushed.stdout, /^pushed 1 row of catalogs in 1 package \(0\.0 MB of the file, 0\.0 MB of JSON sent, [\d.]+ s, [\d.]+ MB\/s of the file\)/, 'the summary names its units');
  t.match(pushed.stderr, /MB of the file · [\d.]+ MB\/s/, 'the progress in the same unit');
  t.match(pushed.stderr, /package 0 accepted: 1 row \(1 row, /);

  // Before start a session never becomes DONE: --until startable is the wait that ends.
  const watched = await cli.run(['status', '--watch', '--until', 'startable', '--interval', '0.2', '--json']);
  t.equal(watched.code, 0, 'ends once can_start_upload', { stderr: watched.stderr });
  const lines = watched.stdout.trim().split('\n').map((l) => JSON.parse(l) as { can_start_upload: boolean });
  t.equal(lines.at(-1)?.can_start_upload, true, 'the last line is the startable status');
  const bounded = await cli.run(['status', '--watch', '--interval', '0.2', '--wait-timeout', '0.5']);
  t.equal(bounded.code, 5, 'waiting for DONE before start ends at --wait-timeout');
});

t.test('push --errors (CSV): every record not accepted, past the first 100 errors, with its errors; fixed and sent again, the session holds every row', async (t) => {
  const svc = await startService(t);
  const cli = await cliRunner(t, svc);
  const dir = await tempDir(t, 'cli-errors-csv-');
  const n = 2000;
  const per = 400;
  // Package 1 (records 401–800): records 401–499 a bad price, record 500 a bad price and a bad
  // is_active (the service's 100th error is its first: the list is cut inside the row), 501–720
  // a bad is_active, 600 both; 721–800 good. Package 3 (1201–1600): record 1234 a bad price.
  const badPrice = (r: number) => (r >= 401 && r <= 500) || r === 600 || r === 1234;
  const badActive = (r: number) => r >= 500 && r <= 720;
  // Bad values as wide as good ones in JSON (-1 and 10, "ab" and true): every package is `per` rows.
  // Every name needs quotes in CSV.
  const name = 'Say "hi",\nall';
  const fields = (r: number) => [`p${String(r).padStart(5, '0')}`, name, badPrice(r) ? '-1' : '10', badActive(r) ? 'ab' : 'true'];
  const columns = ['product_id', 'name', 'price', 'is_active'];
  const file = join(dir, 'products.csv');
  await writeFile(file, `${columns.join(',')}\n${Array.from({ length: n }, (_, i) => csvLine(fields(i + 1))).join('\n')}\n`);
  const packageSize = String(Buffer.byteLength(JSON.stringify({ columns, data: Array.from({ length: per }, () => ['p00001', name, 10, true]) })));
  const push = (args: string[]) => cli.run(['push', ...args, '--entity', 'products', '--package-size', packageSize, '--parallel', '2']);

  const refused = [...Array.from({ length: per }, (_, i) => 401 + i), ...Array.from({ length: per }, (_, i) => 1201 + i)];
  const problems = (r: number) =>
    [...(badPrice(r) ? ['price: expected number >= 0, got -1'] : []), ...(badActive(r) ? ['is_active: expected boolean, got "ab"'] : [])].join('; ');
  const expected = refused.map((r) => [...fields(r), String(r), problems(r)]);
  const errorCount = refused.reduce((sum, r) => sum + (badPrice(r) ? 1 : 0) + (badActive(r) ? 1 : 0), 0);

  // A dry run first: the same file a real push writes; nothing stored.
  const dryFile = join(dir, 'dry-errors.csv');
  const dry = await push([file, '--dry-run', '--errors', dryFile]);
  t.equal(dry.code, 3, 'exits 3', { stdout: dry.stdout, stderr: dry.stderr.slice(-3000) });
  t.match(dry.stdout, /\n {6}… and [23]\d\d more: .*dry-errors\.csv holds every one\n/);
  const listed = dry.stdout.split(' errors in refused rows:\n').slice(1).map((block) => /^(?: {6}file record [^\n]*\n)*/.exec(block)![0].split('\n').length - 1);
  t.ok(listed.length > 0 && listed.every((n) => n <= 10) && listed.includes(10), `the terminal lists at most 10 errors a package, the file every one (${listed.join(', ')})`);
  t.match(dry.stdout, new RegExp(`wrote 800 records that would not be accepted to .*dry-errors\\.csv \\(${refused.filter((r) => problems(r)).length} with errors, ${refused.filter((r) => !problems(r)).length} refused only with their package\\); nothing was stored`));
  t.match((await cli.run(['status', '--json'])).json, { entities: [], totals: { rows: 0 } }, 'the dry run stored nothing');

  const errorsFile = join(dir, 'errors.csv');
  const run = await push([file, '--errors', errorsFile, '--json']);
  t.equal(run.code, 3, 'exits 3: some packages accepted', { stdout: run.stdout, stderr: run.stderr.slice(-3000) });
  t.match(run.json, { ok: false, packages_accepted: 3, packages_failed: 2, rows_accepted: 1200, errors_file: errorsFile, error_records: 800 });
  t.same(
    run.json.failures.map((f: { first_record: number; rows: number; error_count: number; errors: unknown[] }) => [f.first_record, f.rows, f.errors.length]).sort((a: number[], b: number[]) => a[0]! - b[0]!),
    [
      [401, per, 100],
      [1201, per, 1],
    ],
    'packages of 400 rows: the refused ones as planned',
  );
  t.equal(run.json.failures.reduce((sum: number, f: { error_count: number }) => sum + f.error_count, 0), errorCount, `${errorCount} errors in all`);
  const text = await readFile(errorsFile, 'utf8');
  t.equal(text, await readFile(dryFile, 'utf8'), 'the dry run wrote the same file');
  const [header, ...records] = parseCsv(text) as string[][];
  t.same(header, [...columns, '_record', '_errors'], "the input's header, _record, _errors last");
  t.same(records, expected, 'exactly the records of the refused packages: the bad ones with every error, the others with none');
  t.same((await readdir(dir)).sort(), ['dry-errors.csv', 'errors.csv', 'products.csv'], 'no temp file left');

  // Fix the bad values in the errors file and send it as it is (its _record and _errors are dropped).
  const fixed = records.map((r) => csvLine([r[0]!, r[1]!, r[2] === '-1' ? '10' : r[2]!, r[3] === 'ab' ? 'TRUE' : r[3]!, r[4]!, r[5]!]));
  await writeFile(errorsFile, `${header!.join(',')}\n${fixed.join('\n')}\n`);
  const stale = join(dir, 'again.csv');
  await writeFile(stale, 'an older errors file\n');
  const again = await push([errorsFile, '--errors', stale, '--json']);
  t.equal(again.code, 0, 'exits 0', { stdout: again.stdout, stderr: again.stderr.slice(-3000) });
  t.match(again.json, { ok: true, rows_accepted: 800, packages_failed: 0, errors_file: null, error_records: 0 });
  t.notOk(existsSync(stale), 'nothing refused: no errors file, the older one removed');
  t.match((await cli.run(['status', '--json'])).json, { entities: ['products'], totals: { rows: n } }, 'the session counts every row of the file');
  const rows = rowObjects(await storedPackages(svc, run.json.upload_uuid));
  t.equal(new Set(rows.map((r) => r.product_id)).size, n, 'every record once');
  t.ok(
    rows.every((r) => r.name === name && r.price === 10 && r.is_active === true && Object.keys(r).length === 4),
    'with the fixed values, and nothing of _record or _errors',
  );
  const start = await cli.run(['start', '--from', '2024-01-01', '--json']);
  t.equal(start.code, 0, 'exits 0', { stdout: start.stdout, stderr: start.stderr.slice(-3000) });
  t.match(start.json, { entities: [{ name: 'products', rows: n }] }, 'start-upload counts every row');
});

t.test('push --errors (NDJSON and JSON): one errors file of both with _file; the package columns kept past the first 100; usage errors', async (t) => {
  const svc = await startService(t);
  const cli = await cliRunner(t, svc);
  const dir = await tempDir(t, 'cli-errors-ndjson-');
  const catalog = await cli.run(['entities', '--json']);
  t.equal(catalog.code, 0);
  t.same(
    catalog.json.entities.flatMap((e: { columns: { name: string }[] }) => e.columns.map((c) => c.name)).filter((c: string) => ['_errors', '_record', '_file'].includes(c)),
    [],
    'no entity has a column of a reserved name',
  );

  // Package 1 (records 101–200): records 101 and 102 a bad sold_at; 103–200 a bad sold_at and no
  // "total" key at all (sent as null). The 100 errors listed end at record 151, and a body of the
  // rows from there made of their own keys would have no "total" column (a 422 without errors).
  const n = 300;
  const per = 100;
  const bad = (r: number) => r > 100 && r <= 200;
  const receipt = (r: number): Record<string, unknown> => ({
    receipt_id: `r${String(r).padStart(5, '0')}`,
    store_id: 's1',
    sold_at: bad(r) ? '2024-13-02T10:00:00Z' : '2024-01-02T10:00:00Z',
    ...(r > 102 && bad(r) ? {} : { total: 1250 }),
  });
  const ndjson = join(dir, 'receipts.ndjson');
  await writeFile(ndjson, Array.from({ length: n }, (_, i) => JSON.stringify(receipt(i + 1))).join('\n') + '\n');
  const json = join(dir, 'more.json');
  const more = [
    { receipt_id: 'm1', store_id: 's1', sold_at: '2024-01-02T10:00:00Z', total: 'x1' },
    { receipt_id: 'm2', store_id: 's1', sold_at: '2024-01-02T10:00:00Z', total: 3 },
  ];
  await writeFile(json, JSON.stringify(more));
  // No row of this package has "total": the service refuses it as a whole (no rows listed).
  const late = join(dir, 'late.ndjson');
  const lateRows = [
    { receipt_id: 'l1', store_id: 's1', sold_at: '2024-01-02T10:00:00Z' },
    { receipt_id: 'l2', store_id: 's1', sold_at: '2024-01-02T10:00:00Z' },
  ];
  await writeFile(late, lateRows.map((r) => JSON.stringify(r)).join('\n'));
  const packageSize = String(
    Buffer.byteLength(JSON.stringify({ columns: ['receipt_id', 'store_id', 'sold_at', 'total'], data: Array.from({ length: per }, () => ['r00001', 's1', '2024-01-02T10:00:00Z', 1250]) })),
  );

  for (const [args, why] of [
    [[ndjson, '--errors', join(dir, 'out.csv')], 'NDJSON input, a .csv errors file'],
    [[json, '--errors', join(dir, 'out.json')], 'JSON input, a .json errors file (it is NDJSON)'],
    [[ndjson, join(dir, 'x.csv'), '--errors', join(dir, 'out.ndjson')], 'CSV and NDJSON inputs together'],
    [[ndjson, '--errors', ndjson], 'the errors file is an input'],
    [[ndjson, '--errors', join(dir, 'absent', 'out.ndjson')], 'a folder that is not there'],
  ] as const) {
    const usage = await cli.run(['push', ...args, '--entity', 'receipts', '--json']);
    t.equal(usage.code, 2, why, { stdout: usage.stdout });
    t.match(usage.json, { error: { code: 'USAGE', message: /--errors/ } });
  }
  t.equal((await cli.run(['status'])).code, 2, 'no session was made for them');
  t.same((await readdir(dir)).sort(), ['late.ndjson', 'more.json', 'receipts.ndjson'], 'and no file');

  const errorsFile = join(dir, 'errors.ndjson');
  const run = await cli.run(['push', ndjson, json, late, '--entity', 'receipts', '--package-size', packageSize, '--errors', errorsFile, '--json']);
  t.equal(run.code, 3, 'exits 3', { stdout: run.stdout, stderr: run.stderr.slice(-3000) });
  t.match(run.json, {
    ok: false,
    errors_file: errorsFile,
    error_records: per + 4,
    files: [
      { rows_accepted: 200, error_records: per },
      { rows_accepted: 0, error_records: 2 },
      { rows_accepted: 0, error_records: 2, failures: [{ status: 422, message: 'Missing required columns: total' }] },
    ],
  });
  t.match(run.json.files[0].failures, [{ first_record: 101, rows: per, error_count: 198 }]);
  const lines = (await readFile(errorsFile, 'utf8')).trimEnd().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
  const expected = [
    ...Array.from({ length: per }, (_, i) => {
      const r = 101 + i;
      return {
        ...receipt(r),
        _file: ndjson,
        _record: r,
        _errors: [
          { column: 'sold_at', message: 'expected datetime (RFC 3339), got "2024-13-02T10:00:00Z"' },
          ...(r > 102 ? [{ column: 'total', message: 'expected number, got null' }] : []),
        ],
      };
    }),
    { ...more[0], _file: json, _record: 1, _errors: [{ column: 'total', message: 'expected number, got "x1"' }] },
    { ...more[1], _file: json, _record: 2, _errors: [] },
    ...lateRows.map((r, i) => ({ ...r, _file: late, _record: i + 1, _errors: [{ column: null, message: 'its package (file records 1–2) failed: 422 Missing required columns: total' }] })),
  ];
  t.same(lines, expected, 'each record as read, its input, its number there, every error');
  t.same(lines.map((l) => Object.keys(l).slice(-3)), expected.map(() => ['_file', '_record', '_errors']), 'the reserved keys last');

  // Fix and send the errors file into the same session: every row is there.
  const fixed = lines.map((l) => ({ ...l, sold_at: '2024-01-03T10:00:00Z', total: typeof l.total === 'number' ? l.total : 7 }));
  await writeFile(errorsFile, fixed.map((l) => JSON.stringify(l)).join('\n') + '\n');
  const again = await cli.run(['push', errorsFile, '--entity', 'receipts', '--errors', join(dir, 'again.ndjson'), '--json', '--quiet']);
  t.equal(again.code, 0, 'exits 0', { stdout: again.stdout, stderr: again.stderr.slice(-3000) });
  t.match(again.json, { ok: true, rows_accepted: per + 4, errors_file: null, error_records: 0 });
  t.notOk(existsSync(join(dir, 'again.ndjson')), 'nothing refused: no errors file');
  const total = n + more.length + lateRows.length;
  t.match((await cli.run(['status', '--json'])).json, { totals: { rows: total } }, 'the session counts every row of the inputs');
  const rows = rowObjects(await storedPackages(svc, run.json.files[0].upload_uuid));
  t.equal(new Set(rows.map((r) => r.receipt_id)).size, total);
  t.same(Object.keys(rows.find((r) => r.receipt_id === 'm1')!).sort(), ['receipt_id', 'sold_at', 'store_id', 'total'], 'nothing of the reserved keys stored');
});

t.test('push --errors of several CSV inputs (standard input too): the union of their headers, _file, read back by name', async (t) => {
  const svc = await startService(t);
  const cli = await cliRunner(t, svc);
  const dir = await tempDir(t, 'cli-errors-many-');
  const stdin = 'product_id,name,price\na1,A,1\na2,B,-1\n';
  const b = join(dir, 'b.csv');
  await writeFile(b, 'name,product_id,is_active,price\nC,b1,ab,2\nD,b2,no,3\n');
  const errorsFile = join(dir, 'errors.csv');
  const run = await cli.run(['push', '-', b, '--entity', 'products', '--format', 'csv', '--errors', errorsFile, '--json', '--quiet'], { input: stdin });
  t.equal(run.code, 1, 'exits 1: nothing accepted', { stdout: run.stdout, stderr: run.stderr.slice(-3000) });
  t.match(run.json, { errors_file: errorsFile, error_records: 4, files: [{ error_records: 2 }, { error_records: 2 }] });
  t.same(parseCsv(await readFile(errorsFile, 'utf8')), [
    ['product_id', 'name', 'price', 'is_active', '_file', '_record', '_errors'],
    ['a1', 'A', '1', '', 'standard input', '1', ''],
    ['a2', 'B', '-1', '', 'standard input', '2', 'price: expected number >= 0, got -1'],
    ['b1', 'C', '2', 'ab', b, '1', 'is_active: expected boolean, got "ab"'],
    ['b2', 'D', '3', 'no', b, '2', ''],
  ]);
  const text = (await readFile(errorsFile, 'utf8')).replace(',-1,', ',1,').replace(',ab,', ',yes,');
  await writeFile(errorsFile, text);
  const again = await cli.run(['push', errorsFile, '--entity', 'products', '--json', '--quiet']);
  t.equal(again.code, 0, 'exits 0', { stdout: again.stdout, stderr: again.stderr.slice(-3000) });
  const rows = rowObjects(await storedPackages(svc, again.json.upload_uuid)).sort(byId('product_id'));
  t.same(rows, [
    { product_id: 'a1', name: 'A', price: 1, is_active: null },
    { product_id: 'a2', name: 'B', price: 1, is_active: null },
    { product_id: 'b1', name: 'C', price: 2, is_active: true },
    { product_id: 'b2', name: 'D', price: 3, is_active: false },
  ]);
});

t.test('a file whose last record cannot be read: the summary says from which record on nothing was sent, and the fixed file pushed again stores every row once', async (t) => {
  const svc = await startService(t);
  const cli = await cliRunner(t, svc);
  const dir = await tempDir(t, 'cli-unreadable-');
  const n = 300;
  const file = join(dir, 'products.csv');
  const rows = Array.from({ length: n }, (_, i) => `p${i},Name ${i},${i}`).join('\n');
  // Record n + 1 opens a quote that never closes: the file stops being readable at its end.
  await writeFile(file, `product_id,name,price\n${rows}\np-bad,"never closed,1\n`);
  const errorsFile = join(dir, 'errors.csv');
  // 2 KiB packages of about 100 rows: the rows read after the last full one are an open package, not sent.
  const push = (more: string[]) => cli.run(['push', file, '--entity', 'products', '--package-size', '2KiB', '--errors', errorsFile, ...more]);
  const run = await push(['--new', '--json']);
  t.not(run.code, 0, 'not done', { stdout: run.stdout, stderr: run.stderr.slice(-3000) });
  t.match(run.json, { ok: false, packages_failed: 0, input_error: /invalid CSV: Quote Not Closed/, errors_file: null });
  const sent = run.json.rows_sent as number;
  t.ok(sent > 0 && sent < n, `the full packages went (${sent} rows), the open one did not`);
  t.equal(run.json.unsent_from, sent + 1, 'nothing sent from the open package\'s first record on');
  const stored = () => storedPackages(svc, run.json.upload_uuid).then((p) => rowObjects(p).map((r) => r.product_id as string).sort());
  t.same(await stored(), Array.from({ length: sent }, (_, i) => `p${i}`).sort(), 'the session holds the rows sent, once');

  const human = await push(['-q']);
  t.match(human.stdout, new RegExp(`\\n {2}the file stopped being readable: .*Quote Not Closed.*; its records from ${sent + 1} on were not sent\\n`));
  t.match(human.stdout, new RegExp(`\\n {2}every record sent was accepted, but the records from ${sent + 1} on were not sent: no .*errors\\.csv written\\n`));
  t.notMatch(human.stdout, /every record was accepted/);
  t.match(human.stdout, /\n {2}fix the file and push it again: packages already stored are answered, not stored again\n$/);

  // As the summary says: the fixed file cuts the same packages before the open one (answered from their keys), then the rest.
  await writeFile(file, `product_id,name,price\n${rows}\np-bad,"closed now",1\n`);
  const fixed = await push(['--json']);
  t.equal(fixed.code, 0, 'the fixed file is done', { stdout: fixed.stdout, stderr: fixed.stderr.slice(-3000) });
  t.same(await stored(), [...Array.from({ length: n }, (_, i) => `p${i}`), 'p-bad'].sort(), 'every row of the file stored once');
  t.notOk(existsSync(errorsFile), 'no errors file');
});
