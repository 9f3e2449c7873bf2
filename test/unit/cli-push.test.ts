/**
 * `ingest push` in process against a fake service: a push of many inputs reads one at a time
 * (each header checked and its reader ended before the next is opened, each read again in
 * its turn), so memory holds one input's rows however many inputs there are.
 */
import { mkdtempSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { IngestClient } from '../../src/client/client.js';
import { UsageError, type Credentials } from '../../src/client/cli-config.js';
import { ApiError } from '../../src/client/errors.js';
import { openSource, type RowSource, type SourceFormat } from '../../src/client/sources.js';
import type { CatalogEntity } from '../../src/client/types.js';
import { pushCommand } from '../../src/cli/ingest/push.js';
import { Cli, EXIT } from '../../src/cli/ingest/context.js';

const PRODUCTS: CatalogEntity = {
  name: 'products',
  columns: [
    { name: 'product_id', type: 'string', required: true },
    { name: 'name', type: 'string', required: true },
    { name: 'price', type: 'number', required: false },
  ],
  required: ['product_id', 'name'],
  parents: [],
};

/** A service that stores every package it is sent, and the readers open at each send. */
function fakeClient(readersOpen: () => number) {
  const sends: { rows: number; readersOpen: number }[] = [];
  const client = {
    async entities() {
      return { entities: [PRODUCTS] };
    },
    async initialize() {
      return { status: 'created', upload_uuid: '00000000-0000-4000-8000-000000000001' };
    },
    async ingestWithRetry(_uuid: string, _entity: string, body: Uint8Array) {
      const rows = (JSON.parse(Buffer.from(body).toString('utf8')) as { data: unknown[] }).data.length;
      sends.push({ rows, readersOpen: readersOpen() });
      return { status: 'success', message: '', rows_processed: rows, replayed: false };
    },
  };
  return { client: client as unknown as IngestClient, sends };
}

/** The command lines' state directory (what they remember: the inputs' cuts per session). */
const stateHome = mkdtempSync(join(tmpdir(), 'cli-push-state-'));
t.teardown(() => rm(stateHome, { recursive: true, force: true }));

/** A command line whose client is `client`, which remembers no session as the last one (the cuts of inputs it does, in `stateHome`). */
class TestCli extends Cli {
  constructor(
    private readonly fake: IngestClient,
    positionals: string[],
    readonly out: string[],
    values: Record<string, string | boolean | undefined> = {},
    err: string[] = [],
  ) {
    super(
      { stdout: { write: (s: string) => out.push(s) }, stderr: { write: (s: string) => err.push(s) }, env: { XDG_STATE_HOME: stateHome } },
      { entity: 'products', 'package-size': '32KiB', json: true, quiet: true, ...values },
      positionals,
    );
  }

  override async client(): Promise<IngestClient> {
    return this.fake;
  }

  override async creds(): Promise<Credentials> {
    const sources = { url: 'flag', clientId: 'flag', token: 'flag' };
    return { url: 'http://service.test/', clientId: 'client-a', token: 'secret', sources, warning: null };
  }

  override async remember(): Promise<void> {}
}

t.test('a push of many files reads one at a time: each header checked and its reader ended, each read again in its turn', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'cli-push-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const files = 12;
  const per = 3000; // about 90 KB a file: several packages of 32 KiB
  const paths: string[] = [];
  for (let f = 0; f < files; f++) {
    const path = join(dir, `part-${String(f).padStart(2, '0')}.csv`);
    await writeFile(path, `product_id,name,price\n${Array.from({ length: per }, (_, i) => `p${f}-${i},Name ${i},${i % 100}`).join('\n')}\n`);
    paths.push(path);
  }

  // A reader is open from its first read to its end (the stream and its rows held).
  let open = 0;
  let most = 0;
  let opened = 0;
  const counted = async (path: string, format: SourceFormat, entity: CatalogEntity): Promise<RowSource> => {
    const source = await openSource(path, format, entity);
    return {
      path: source.path,
      format: source.format,
      totalBytes: source.totalBytes,
      get bytesRead() {
        return source.bytesRead;
      },
      async *rows() {
        open++;
        opened++;
        most = Math.max(most, open);
        try {
          yield* source.rows();
        } finally {
          open--;
        }
      },
    };
  };
  const { client, sends } = fakeClient(() => open);
  const out: string[] = [];
  const code = await pushCommand(new TestCli(client, paths, out), counted);

  t.equal(code, EXIT.OK, 'exits 0', { out });
  const result = JSON.parse(out.join('')) as { ok: boolean; files: { rows_accepted: number }[] };
  t.same(
    result.files.map((f) => f.rows_accepted),
    paths.map(() => per),
    'every row of every file',
  );
  t.equal(
    sends.reduce((n, s) => n + s.rows, 0),
    files * per,
    'sent once',
  );
  t.ok(sends.length > files, `${sends.length} packages`);
  t.equal(most, 1, 'at most one reader open at once (the header checks and the sends alike)');
  t.same(
    sends.filter((s) => s.readersOpen > 1),
    [],
    'no package sent while another input is open (before: every input, from the first send on)',
  );
  t.equal(opened, 2 * files, 'each input read twice: its header checked, then its rows sent');
  t.equal(open, 0, 'every reader ended');
});

t.test('a package keeps its key whatever else a push holds: an input pushed again alone, or elsewhere among others, stores nothing twice; equal packages of two inputs are two', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'cli-push-keys-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const csv = (from: number) => `product_id,name,price\n${Array.from({ length: 2000 }, (_, i) => `p${from + i},Name ${from + i},${i % 100}`).join('\n')}\n`;
  const [a, b, copy, c] = ['a.csv', 'b.csv', 'copy-of-a.csv', 'c.csv'].map((f) => join(dir, f)) as [string, string, string, string];
  await writeFile(a, csv(0));
  await writeFile(b, csv(10_000));
  await writeFile(copy, csv(0));
  await writeFile(c, csv(20_000));

  // A service that stores a package once per Idempotency-Key and answers a repeat from it.
  const stored = new Map<string, number>();
  const client = {
    async entities() {
      return { entities: [PRODUCTS] };
    },
    async initialize() {
      return { status: 'already_exists', upload_uuid: '00000000-0000-4000-8000-000000000002' };
    },
    async ingestWithRetry(_uuid: string, _entity: string, body: Uint8Array, opts: { idempotencyKey: string }) {
      const rows = (JSON.parse(Buffer.from(body).toString('utf8')) as { data: unknown[] }).data.length;
      const replayed = stored.has(opts.idempotencyKey);
      stored.set(opts.idempotencyKey, rows);
      return { status: 'success', message: '', rows_processed: rows, replayed };
    },
  } as unknown as IngestClient;
  const push = async (paths: string[]) => {
    const out: string[] = [];
    const code = await pushCommand(new TestCli(client, paths, out), openSource);
    t.equal(code, EXIT.OK, `push ${paths.map((p) => p.slice(dir.length + 1)).join(' ')} exits 0`, { out });
    const result = JSON.parse(out.join('')) as { files?: { packages_accepted: number; packages_replayed: number }[]; packages_accepted: number; packages_replayed: number };
    return result.files ?? [result];
  };
  const storedRows = () => [...stored.values()].reduce((n, r) => n + r, 0);

  const first = await push([a, b, copy]);
  t.same(first.map((f) => f.packages_replayed), [0, 0, 0], 'the first push stores every package');
  t.equal(storedRows(), 6000, 'the copy of a.csv stored too: equal packages of two inputs are two');
  const alone = await push([b]);
  t.same(alone.map((f) => f.packages_replayed === f.packages_accepted), [true], 'b.csv pushed again alone: every package answered from its key (before: stored again)');
  const moved = await push([c, b, a, copy]);
  t.same(moved.map((f) => f.packages_replayed === f.packages_accepted), [false, true, true, true], 'b.csv, a.csv and the copy in other places among other inputs: answered from their keys');
  t.equal(storedRows(), 8000, 'only c.csv stored anew');
});

t.test('packages stored after a refused one: the summary does not say to fix the file and push it again (its packages would be cut anew and stored twice), and what it says stores every row once', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'cli-push-refused-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, 'fix.csv');
  const errorsFile = join(dir, 'refused.csv');
  const junk = 'abcdefghijklmnopqrstuvwxyz0123456789abcdefghij';
  const lines = Array.from({ length: 300 }, (_, i) => `p${i + 1},Name ${i + 1},${i === 38 ? junk : (i + 1) % 50}`);
  await writeFile(file, `product_id,name,price\n${lines.join('\n')}\n`);

  // A service that refuses a package holding a price that is not a number (422, as the real one),
  // stores the others once per Idempotency-Key, and stores nothing of a dry run.
  const stored = new Map<string, string[]>();
  const client = {
    async entities() {
      return { entities: [PRODUCTS] };
    },
    async initialize() {
      return { status: 'already_exists', upload_uuid: '00000000-0000-4000-8000-000000000003' };
    },
    async ingestWithRetry(_uuid: string, _entity: string, body: Uint8Array | string, opts: { idempotencyKey?: string; dryRun?: boolean }) {
      const { data } = JSON.parse(Buffer.from(body).toString('utf8')) as { data: unknown[][] };
      const bad = data.flatMap((row, i) => (typeof row[2] === 'string' ? [{ row: i, column: 'price', message: `expected number >= 0, got ${JSON.stringify(row[2])}` }] : []));
      if (bad.length) throw new ApiError(422, { detail: `Invalid data types in payload: row ${bad[0]!.row}, column "price": ${bad[0]!.message}`, errors: bad, error_count: bad.length }, null);
      const replayed = opts.idempotencyKey !== undefined && stored.has(opts.idempotencyKey);
      if (!opts.dryRun) stored.set(opts.idempotencyKey ?? `k${stored.size}`, data.map((row) => String(row[0])));
      return { status: 'success', message: '', rows_processed: data.length, replayed };
    },
  } as unknown as IngestClient;
  const push = async (paths: string[], values: Record<string, string | boolean> = {}) => {
    const out: string[] = [];
    const code = await pushCommand(new TestCli(client, paths, out, { json: false, 'package-size': '4KiB', ...values }), openSource);
    return { code, text: out.join('') };
  };
  const storedIds = () => [...stored.values()].flat();

  const first = await push([file], { 'keep-going': true });
  t.equal(first.code, EXIT.PARTIAL, 'one package refused, the others stored');
  t.ok(storedIds().includes('p300'), 'a package after the refused one was stored');
  t.notMatch(first.text, /fix the file and push it again/, 'not told to fix the file and push it again (before: told so)');
  t.match(first.text, /push it again unchanged with --errors FILE .*, then fix the values of FILE and push it/, { text: first.text });
  const afterFirst = new Map(stored);

  // As it says: the same file again with --errors, then the fixed errors file.
  const again = await push([file], { errors: errorsFile });
  t.equal(again.code, EXIT.PARTIAL);
  await writeFile(errorsFile, (await readFile(errorsFile, 'utf8')).replace(junk, '5'));
  const rest = await push([errorsFile]);
  t.equal(rest.code, EXIT.OK, 'the fixed errors file is accepted', { text: rest.text });
  const ids = storedIds();
  t.equal(ids.length, 300, 'every row stored');
  t.equal(new Set(ids).size, 300, 'none twice');

  // What the summary said before stores rows twice: the fixed file is cut anew from the refused package on.
  stored.clear();
  for (const [k, v] of afterFirst) stored.set(k, v);
  await writeFile(file, (await readFile(file, 'utf8')).replace(junk, '5'));
  await push([file]);
  t.ok(storedIds().length > 300, `instead, the fixed file pushed again: ${storedIds().length - 300} rows stored twice`);
});

t.test('an input file pushed into a session again is cut as when packages of it were stored there: another --package-size is refused before anything is sent, none cuts it as then, so no row is stored twice', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'cli-push-cut-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, 'products.csv');
  await writeFile(file, `product_id,name,price\n${Array.from({ length: 2000 }, (_, i) => `p${i},Name ${i},${i % 100}`).join('\n')}\n`);
  const other = join(dir, 'more.csv');
  await writeFile(other, `product_id,name,price\n${Array.from({ length: 500 }, (_, i) => `q${i},Name ${i},${i % 100}`).join('\n')}\n`);

  // A service that stores a package once per Idempotency-Key (its rows), and in which session.
  let session = '00000000-0000-4000-8000-000000000004';
  const stored = new Map<string, string[]>();
  let sends = 0;
  const client = {
    async entities() {
      return { entities: [PRODUCTS] };
    },
    async initialize() {
      return { status: 'already_exists', upload_uuid: session };
    },
    async ingestWithRetry(uuid: string, _entity: string, body: Uint8Array, opts: { idempotencyKey: string; dryRun?: boolean }) {
      sends++;
      const { data } = JSON.parse(Buffer.from(body).toString('utf8')) as { data: unknown[][] };
      const key = `${uuid} ${opts.idempotencyKey}`;
      const replayed = stored.has(key);
      if (!opts.dryRun) stored.set(key, data.map((row) => String(row[0])));
      return { status: 'success', message: '', rows_processed: data.length, replayed };
    },
  } as unknown as IngestClient;
  const push = async (paths: string[], values: Record<string, string | boolean | undefined>) => {
    const out: string[] = [];
    const err: string[] = [];
    const code = await pushCommand(new TestCli(client, paths, out, { quiet: false, ...values }, err), openSource);
    return { code, result: JSON.parse(out.join('')) as { packages_accepted: number; packages_replayed: number }, err: err.join('') };
  };
  const rowsOf = (uuid: string) => [...stored].filter(([k]) => k.startsWith(uuid)).flatMap(([, rows]) => rows);

  const first = await push([file], { 'package-size': '4KiB' });
  t.equal(first.code, EXIT.OK);
  t.ok(first.result.packages_accepted > 5, `cut into ${first.result.packages_accepted} packages`);

  sends = 0;
  await t.rejects(push([file], { 'package-size': '8KiB' }), new UsageError('push: packages of ' + file + ' cut with --package-size 4KiB were stored in upload ' + session + '; cut with 8KiB its packages would be others and store those rows again: push it with --package-size 4KiB (or without the flag), or into another session'), 'another size: refused (before: cut anew, every row stored twice)');
  t.equal(sends, 0, 'nothing sent');

  const dry = await push([file], { 'package-size': '8KiB', 'dry-run': true });
  t.equal(dry.code, EXIT.OK, 'a dry run with another size goes ahead: it stores nothing');

  const again = await push([file], { 'package-size': undefined });
  t.equal(again.code, EXIT.OK);
  t.equal(again.result.packages_replayed, first.result.packages_accepted, 'without the flag: cut with 4KiB as then, every package answered from its key (before: the default 8MiB, one package stored anew)');
  t.match(again.err, `${file}: cut with --package-size 4KiB, as when packages of it were stored in upload ${session}`, 'and said so');
  t.equal(rowsOf(session).length, 2000, 'every row stored once');

  const more = await push([other, file], { 'package-size': '16KiB' }).catch((e: unknown) => e);
  t.type(more, UsageError, 'a push of several inputs, one of them stored with another size: refused whole');
  const alone = await push([other], { 'package-size': '16KiB' });
  t.equal(alone.code, EXIT.OK, 'an input not stored in the session before takes any size');
  t.equal(rowsOf(session).length, 2500);

  session = '00000000-0000-4000-8000-000000000005';
  const elsewhere = await push([file], { 'package-size': '8KiB' });
  t.equal(elsewhere.code, EXIT.OK, 'another session: the file takes any size there');
  t.equal(rowsOf(session).length, 2000);
});

t.test('a package whose 503 asks for a wait longer than a retry makes says so, instead of a bare 503 that reads as never retried', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'cli-push-wait-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, 'products.csv');
  await writeFile(file, 'product_id,name,price\np1,Water,1\n');
  let ingests = 0;
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url!.endsWith('/entities')) return res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ entities: [PRODUCTS] }));
      if (req.url!.endsWith('/initialize-session')) {
        return res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ status: 'created', upload_uuid: '00000000-0000-4000-8000-000000000004' }));
      }
      ingests++;
      res.writeHead(503, { 'content-type': 'application/json', 'retry-after': '300' }).end(JSON.stringify({ detail: 'Storage temporarily unavailable' }));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const client = new IngestClient({ baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, clientId: 'demo', token: 'tok', requestsPerSecond: 0 });
  t.teardown(() => client.close());
  const out: string[] = [];
  const code = await pushCommand(new TestCli(client, [file], out, { json: false }), openSource);
  t.equal(code, EXIT.FAILED);
  t.equal(ingests, 1, 'not retried: the service asked for 300 s');
  t.match(out.join(''), /failed: 503 Storage temporarily unavailable \(the service asked to wait 300 s, longer than the 120 s a retry waits at most\)/, { out });
});
