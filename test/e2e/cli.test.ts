/**
 * The `ingest` command line as a child process against a started service: CSV edge cases
 * stored as the right typed rows, JSON output and exit codes, a re-run that stores nothing
 * twice, start --wait to DONE, and 503 answers retried after their Retry-After without
 * duplicates. (The 100 MiB push is cli-large.test.ts.)
 */
import { chmod, mkdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import t from 'tap';
import { cliRunner, rowObjects, storedPackages } from '../support/cli.js';
import { startService, tempDir } from '../support/harness.js';

const byId = (key: string) => (a: Record<string, unknown>, b: Record<string, unknown>) => String(a[key]).localeCompare(String(b[key]));

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

t.test('a re-run of the same push stores nothing twice; start --wait reaches DONE with the row count', async (t) => {
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
