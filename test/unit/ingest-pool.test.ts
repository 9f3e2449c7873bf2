import { Buffer } from 'node:buffer';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import t from 'tap';
import { findEntity, type EntitySpec } from '../../src/entities/catalog.js';
import { errors, type ServiceError } from '../../src/errors.js';
import { ValidationPool } from '../../src/validation-pool/pool.js';
import type { IngestResult, IngestSink } from '../../src/validation-pool/types.js';
import type { PackageWriter } from '../../src/store/ports.js';

const entity = (name: string): EntitySpec => findEntity(name)!;

/** In-memory PackageWriter: records what the sink does to it. */
class FakeWriter implements PackageWriter {
  readonly batches: Uint8Array[] = [];
  /** The memory each batch was a view of: the sink reuses it once the append settled. */
  readonly memory: ArrayBufferLike[] = [];
  committed = false;
  aborts = 0;
  constructor(
    readonly columns: string[],
    private readonly onAppend?: (batch: Uint8Array) => Promise<void>,
  ) {}
  async append(batch: Uint8Array): Promise<void> {
    await this.onAppend?.(batch);
    this.batches.push(batch.slice());
    this.memory.push(batch.buffer);
  }
  async commit(): Promise<void> {
    this.committed = true;
  }
  async abort(): Promise<void> {
    this.aborts++;
  }
  lines(): string[] {
    return Buffer.concat(this.batches).toString('utf8').split('\n').slice(0, -1);
  }
}

// Pools are shared across subtests: under tap every worker thread also loads tap's
// import hooks, which makes a worker start take about a second.
function newPool(options: Partial<ConstructorParameters<typeof ValidationPool>[0]> = {}): ValidationPool {
  const pool = new ValidationPool({ workers: 1, maxQueue: 8, ...options });
  t.teardown(() => pool.destroy());
  return pool;
}

const pool = newPool();
/** Lines of the catalogs rows used below are 10 bytes (`["c","a"]\n`) plus the name's extra bytes. */
const small = newPool({ batchBytes: 30 });

interface Started {
  sink: IngestSink;
  writers: FakeWriter[];
}

function start(pool: ValidationPool, name: string | EntitySpec, opts: { onAppend?: (b: Uint8Array) => Promise<void> } = {}): Started {
  const writers: FakeWriter[] = [];
  const sink = pool.createIngest({
    entity: typeof name === 'string' ? entity(name) : name,
    open: async (columns) => {
      const writer = new FakeWriter(columns, opts.onAppend);
      writers.push(writer);
      return writer;
    },
  });
  return { sink, writers };
}

/** Feeds `body` in chunks of `chunkSize` bytes (from one reused buffer, as uWS does) and ends. */
function send(sink: IngestSink, body: string | Uint8Array, chunkSize = 7): Promise<IngestResult> {
  const bytes = typeof body === 'string' ? Buffer.from(body) : body;
  const reused = new Uint8Array(chunkSize);
  for (let at = 0; at < bytes.length; at += chunkSize) {
    const part = bytes.subarray(at, at + chunkSize);
    reused.set(part);
    sink.write(reused.subarray(0, part.length));
    reused.fill(0x20);
  }
  return sink.end();
}

async function ingest(pool: ValidationPool, name: string | EntitySpec, body: string | Uint8Array) {
  const started = start(pool, name);
  return { result: await send(started.sink, body), writers: started.writers };
}

t.test('valid body: rows, NDJSON in client column order, appended but not committed', async (t) => {
  const columns = ['name', 'store_id', 'opened_on'];
  const data = [
    ['Main street', 's1', '2024-02-29'],
    ['Grüße, 東京 🚀', 's2', null],
    ['x"],["y', 's3', '2020-01-01'],
  ];
  const { result, writers } = await ingest(pool, 'stores', JSON.stringify({ columns, data }));
  t.equal(result.rows, 3);
  t.same(result.columns, columns);
  t.equal(writers.length, 1);
  const [writer] = writers;
  t.same(writer!.columns, columns, 'opened with the client columns');
  t.equal(result.writer, writer);
  t.same(writer!.lines(), data.map((row) => JSON.stringify(row)));
  t.equal(result.bytes, Buffer.byteLength(data.map((row) => `${JSON.stringify(row)}\n`).join('')));
  t.equal(writer!.committed, false, 'the caller commits');
  t.equal(writer!.aborts, 0);
});

t.test('`data` before `columns`, catalog order, number forms', async (t) => {
  const body = '{"data": [["p1", "Milk", null, "4600000000000", "l", 1e3, true], ["p2", "Ü", "c1", null, null, -0, null]], "columns": ["product_id", "name", "catalog_id", "barcode", "unit", "price", "is_active"]}';
  const { result, writers } = await ingest(pool, 'products', body);
  t.equal(result.rows, 2);
  t.same(writers[0]!.lines(), ['["p1","Milk",null,"4600000000000","l",1000,true]', '["p2","Ü","c1",null,null,0,null]']);
});

t.test('empty data is accepted with 0 rows and no batches', async (t) => {
  const { result, writers } = await ingest(pool, 'catalogs', '{"columns":["catalog_id","name"],"data":[]}');
  t.match(result, { rows: 0, bytes: 0, columns: ['catalog_id', 'name'] });
  t.equal(writers.length, 1, 'the package is still opened');
  t.equal(writers[0]!.batches.length, 0);
});

t.test('a UTF-8 byte order mark is accepted', async (t) => {
  const body = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('{"columns":["catalog_id","name"],"data":[["c","n"]]}')]);
  const { result } = await ingest(pool, 'catalogs', body);
  t.equal(result.rows, 1);
});

t.test('every 422, first failing check answers, writer never opened', async (t) => {
  const payload = (detail: string) => ({ code: 'INVALID_PAYLOAD', statusCode: 422, body: { detail } });
  const validation = (issue: object) => ({ code: 'VALIDATION_FAILED', statusCode: 422, body: { detail: [issue] } });
  const invalidJson = payload('Invalid JSON format.');
  const cases: [string, string | Uint8Array, { code: string }][] = [
    ['empty body', '', invalidJson],
    ['whitespace', '  \n', invalidJson],
    ['truncated', '{"columns":["catalog_id"],"data":[["a"]', invalidJson],
    ['NaN literal', '{"columns":["catalog_id","name"],"data":[[NaN,"n"]]}', invalidJson],
    ['trailing comma', '{"columns":["catalog_id","name"],"data":[],}', invalidJson],
    ['invalid UTF-8', Buffer.concat([Buffer.from('{"columns":["catalog_id","name"],"data":[["'), Buffer.from([0xff, 0xfe]), Buffer.from('","n"]]}')]), invalidJson],
    ['lone surrogate half in UTF-8', Buffer.from([0x22, 0xed, 0xa0, 0x80, 0x22]), invalidJson],
    ['not an object', '[["a"]]', validation({ type: 'model_attributes_type', loc: ['body'], msg: 'Input should be a valid dictionary or object to extract fields from', input: null })],
    ['null body', 'null', validation({ type: 'model_attributes_type', loc: ['body'], input: null })],
    ['columns missing', '{"data":[]}', validation({ type: 'missing', loc: ['body', 'columns'], msg: 'Field required', input: null })],
    ['column not a string', '{"columns":["a",5],"data":[]}', validation({ type: 'string_type', loc: ['body', 'columns', 1], msg: 'Input should be a valid string', input: 5 })],
    ['data not a list', '{"columns":["a"],"data":{"a":1}}', validation({ type: 'list_type', loc: ['body', 'data'], msg: 'Input should be a valid list', input: null })],
    ['row not a list (before any column check)', '{"columns":[],"data":[[],[],[],"x"]}', validation({ type: 'list_type', loc: ['body', 'data', 3], msg: 'Input should be a valid list', input: 'x' })],
    ['empty columns', '{"columns":[],"data":[["a"]]}', payload('The columns array cannot be empty.')],
    ['duplicate column', '{"columns":["name","catalog_id","name","x"],"data":[]}', payload('Duplicate column: name')],
    ['unknown column', '{"columns":["catalog_id","name","color"],"data":[]}', payload('Unknown column: color')],
    ['missing required', '{"columns":["parent_id"],"data":[]}', payload('Missing required columns: catalog_id, name')],
    ['row length', '{"columns":["catalog_id","name"],"data":[["a","b"],["a","b","c"]]}', payload('Invalid data types in payload: row 1: expected 2 values, got 3')],
    ['empty id', '{"columns":["name","catalog_id"],"data":[["n","a"],["n",""]]}', payload('Invalid data types in payload: row 1, column "catalog_id": expected non-empty string, got ""')],
    ['null in required', '{"columns":["catalog_id","name"],"data":[["a",null]]}', payload('Invalid data types in payload: row 0, column "name": expected string, got null')],
    ['huge exponent', '{"columns":["store_id","product_id","date","quantity"],"data":[["s","p","2024-01-01",1e400]]}', payload('Invalid data types in payload: row 0, column "quantity": expected number, got Infinity')],
    ['impossible date', '{"columns":["store_id","product_id","date","quantity"],"data":[["s","p","2023-02-29",1]]}', payload('Invalid data types in payload: row 0, column "date": expected date (YYYY-MM-DD), got "2023-02-29"')],
    ['first bad row wins', '{"columns":["catalog_id","name"],"data":[["a","b"],["a",1],[null,"b"]]}', payload('Invalid data types in payload: row 1, column "name": expected string, got 1')],
  ];
  for (const [name, body, expected] of cases) {
    const { sink, writers } = start(pool, name.startsWith('huge') || name.startsWith('impossible') ? 'stock' : 'catalogs');
    await t.rejects(send(sink, body), expected, name);
    t.equal(writers.length, 0, `${name}: no writer`);
  }
});

t.test('batches: whole lines, at most batchBytes, a longer line alone', async (t) => {
  const row = (name: string) => ['c', name];
  const data = [
    row('a'), row('b'), row('c'), // 30 bytes: exactly one batch
    row('d'), // 10, then a 40-byte line that fits no batch
    row('x'.repeat(31)),
    row('e'), // 10 + 21 > 30: split
    row('y'.repeat(12)),
    row('ü'), // 11: 21 + 11 > 30
    row('f'), row('g'), // 11 + 10 + 10 = 31 > 30
  ];
  const { result, writers } = await ingest(small, 'catalogs', JSON.stringify({ columns: ['catalog_id', 'name'], data }));
  const batches = writers[0]!.batches.map((b) => Buffer.from(b).toString('utf8'));
  const lines = (...rows: string[][]) => rows.map((r) => `${JSON.stringify(r)}\n`).join('');
  t.same(batches, [
    lines(row('a'), row('b'), row('c')),
    lines(row('d')),
    lines(row('x'.repeat(31))),
    lines(row('e')),
    lines(row('y'.repeat(12))),
    lines(row('ü'), row('f')),
    lines(row('g')),
  ]);
  t.same(
    writers[0]!.batches.map((b) => b.byteLength),
    [30, 10, 40, 10, 21, 21, 10],
  );
  t.equal(result.bytes, 142);
  t.equal(new Set(writers[0]!.memory).size, 1, 'the batches of a piece are views of the one buffer its lines were written to: no copy per batch');
});

const VALID = '{"columns":["catalog_id","name"],"data":[["a","b"]]}';

/**
 * A pool whose worker wraps the real one: entity `crash` exits the thread, `throw` throws,
 * `hang` announces itself on a BroadcastChannel and spins until terminated. No queue: a
 * second task while one runs is refused.
 */
const wrapped = (() => {
  const real = new URL('../../src/validation/worker.js', import.meta.url).href;
  const channel = `hang-${process.pid}-${Math.random()}`;
  const dir = t.testdir({
    'worker.mjs': `
      import validate from ${JSON.stringify(real)};
      export default function (task) {
        if (task.entity === 'crash') process.exit(3);
        if (task.entity === 'throw') throw new Error('boom');
        if (task.entity === 'hang') {
          new BroadcastChannel(${JSON.stringify(channel)}).postMessage('running');
          const until = Date.now() + 30_000;
          while (Date.now() < until);
        }
        return validate(task);
      }
    `,
  });
  return { pool: newPool({ filename: pathToFileURL(join(dir, 'worker.mjs')).href, maxQueue: 0 }), channel };
})();

const fake = (name: string): EntitySpec => ({ ...entity('catalogs'), name });

function running(channel: string): Promise<void> {
  const bc = new BroadcastChannel(channel);
  return new Promise((resolve) => {
    bc.onmessage = () => {
      bc.close();
      resolve();
    };
  });
}

t.test('a worker crash is an internal error and the pool serves the next request', async (t) => {
  const { pool } = wrapped;
  for (const kind of ['crash', 'throw']) {
    const { sink, writers } = start(pool, fake(kind));
    const err = (await send(sink, VALID).then(
      () => t.fail('resolved'),
      (e: unknown) => e,
    )) as ServiceError;
    t.match(err, { code: 'INTERNAL', statusCode: 500 }, kind);
    t.match(err.cause, { message: kind === 'crash' ? /exited with code: 3/ : 'boom' });
    t.equal(writers.length, 0);
    const next = await ingest(pool, 'catalogs', VALID);
    t.equal(next.result.rows, 1, `served after ${kind}`);
  }
});

t.test('abort while the task runs: task cancelled, end() rejects, pool keeps serving', async (t) => {
  const { pool, channel } = wrapped;
  const { sink, writers } = start(pool, fake('hang'));
  const started = running(channel);
  const ended = send(sink, VALID);
  await started;
  sink.abort();
  const err = (await ended.then(
    () => t.fail('resolved'),
    (e: unknown) => e,
  )) as ServiceError;
  t.match(err, { code: 'INTERNAL' });
  t.match(err.cause, { name: 'AbortError' });
  t.equal(writers.length, 0);
  t.equal((await ingest(pool, 'catalogs', VALID)).result.rows, 1, 'the worker was replaced');
});

t.test('a full queue answers RATE_LIMITED', async (t) => {
  const { pool, channel } = wrapped;
  const busy = start(pool, fake('hang'));
  const started = running(channel);
  const busyEnd = send(busy.sink, VALID);
  await started;
  // Refused before a byte of the body is read.
  t.throws(() => start(pool, 'catalogs'), { code: 'RATE_LIMITED', statusCode: 503, headers: { 'Retry-After': '1' } });
  busy.sink.abort();
  await t.rejects(busyEnd, { code: 'INTERNAL' });
  t.equal((await ingest(pool, 'catalogs', VALID)).result.rows, 1, 'capacity is released');
});

t.test('abort before end: chunks dropped, no task, no writer', async (t) => {
  const { sink, writers } = start(pool, 'catalogs');
  sink.write(Buffer.from(VALID.slice(0, 10)));
  sink.abort();
  t.equal(sink.write(Buffer.from(VALID.slice(10))), true, 'later writes are ignored');
  await t.rejects(sink.end(), { code: 'INTERNAL' });
  t.equal(writers.length, 0);
});

t.test('abort while appending: the writer is aborted once the append settles', async (t) => {
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  let appending!: () => void;
  const appendStarted = new Promise<void>((resolve) => (appending = resolve));
  const { sink, writers } = start(small, 'catalogs', {
    onAppend: () => {
      appending();
      return gate;
    },
  });
  const name = 'x'.repeat(31); // 40-byte lines: one batch each
  const ended = send(sink, JSON.stringify({ columns: ['catalog_id', 'name'], data: [['a', name], ['b', name]] }));
  await appendStarted;
  sink.abort();
  release();
  await t.rejects(ended, { code: 'INTERNAL' });
  t.equal(writers[0]!.aborts, 1);
  t.equal(writers[0]!.batches.length, 1, 'no append after the abort');
  t.equal(writers[0]!.committed, false);
});

t.test('store failures: open passes ServiceErrors through, a failed append aborts the writer', async (t) => {
  const opening = (err: Error) =>
    pool.createIngest({
      entity: entity('catalogs'),
      open: async () => {
        throw err;
      },
    });
  await t.rejects(send(opening(errors.invalidSessionStatus('UPLOADING', 'STARTED')), VALID), { code: 'INVALID_SESSION_STATUS' });
  await t.rejects(send(opening(new Error('nats down')), VALID), { code: 'INTERNAL', cause: { message: 'nats down' } });

  const { sink, writers } = start(pool, 'catalogs', {
    onAppend: async () => {
      throw new Error('disk full');
    },
  });
  await t.rejects(send(sink, VALID), { code: 'INTERNAL', cause: { message: 'disk full' } });
  t.equal(writers[0]!.aborts, 1);
});

t.test('end() is idempotent; abort() after it resolved leaves the writer to the caller', async (t) => {
  const { sink, writers } = start(pool, 'catalogs');
  const first = send(sink, VALID);
  t.equal(sink.end(), first);
  await first;
  sink.abort();
  t.equal(writers[0]!.aborts, 0);
});

t.test('constructor options are checked', async (t) => {
  t.throws(() => new ValidationPool({ workers: -1, maxQueue: 1 }), { name: 'TypeError', message: /workers/ });
  t.throws(() => new ValidationPool({ workers: 1, maxQueue: 1.5 }), { message: /maxQueue/ });
  t.throws(() => new ValidationPool({ workers: 1, maxQueue: 1, batchBytes: 0 }), { message: /batchBytes/ });
});

t.test('workerNice: the worker threads, and only they, run that much nicer than the main thread', async (t) => {
  /** Niceness of every thread of this process (Linux `/proc`, field 19 of `stat`). */
  const niceness = async (): Promise<number[]> => {
    const { readdir, readFile } = await import('node:fs/promises');
    const out: number[] = [];
    for (const tid of await readdir('/proc/self/task')) {
      const stat = await readFile(`/proc/self/task/${tid}/stat`, 'utf8').catch(() => null);
      if (stat !== null) out.push(Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[16]));
    }
    return out;
  };
  const { getPriority } = await import('node:os');
  const base = getPriority(0);
  const before = await niceness();
  const nicer = newPool({ workers: 2, workerNice: 3, inlineBytes: 0 }); // every task to a worker
  // A task per worker: both threads are up (and niced, at module load) once these are done.
  const done = await Promise.all([ingest(nicer, 'catalogs', '{"columns":["catalog_id","name"],"data":[["c","a"]]}'), ingest(nicer, 'catalogs', '{"columns":["catalog_id","name"],"data":[["d","b"]]}')]);
  t.same(done.map((d) => d.result.rows), [1, 1]);
  const after = await niceness();
  const count = (list: number[], n: number) => list.filter((v) => v === n).length;
  t.equal(count(after, Math.min(19, base + 3)) - count(before, Math.min(19, base + 3)), 2, 'two more threads at base + 3');
  t.equal(getPriority(0), base, 'the main thread keeps its priority');
});

t.test('the short way: a small package is checked on the main thread, with the same answers and lines as in a worker', async (t) => {
  const inline = newPool({ inlineBytes: 32 * 1024 });
  const worker = newPool({ inlineBytes: 0 });
  const rows = (n: number, bad: number[] = []) =>
    Array.from({ length: n }, (_, i) => [`p${i}`, bad.includes(i) ? 7 : `Name ${i} ü`, null, null, 'kg', i + 0.5, i % 2 === 0]);
  const columns = ['product_id', 'name', 'catalog_id', 'barcode', 'unit', 'price', 'is_active'];
  const good = JSON.stringify({ columns, data: rows(200) });
  const bad = JSON.stringify({ columns, data: rows(200, [3, 150]) });
  t.ok(good.length < 32 * 1024, `${good.length} bytes`);

  const before = { inline: inline.stats.inline, pieces: worker.stats.pieces };
  const a = await ingest(inline, 'products', good);
  const b = await ingest(worker, 'products', good);
  t.equal(inline.stats.inline, before.inline + 1, 'the small package took the short way');
  t.equal(worker.stats.inline, 0, 'with inlineBytes 0 nothing does');
  t.ok(worker.stats.pieces > before.pieces, 'and its piece went to the worker');
  t.equal(a.result.rows, 200);
  t.same(a.writers[0]!.lines(), b.writers[0]!.lines(), 'the same lines either way');
  t.same(a.writers[0]!.lines()[1], JSON.stringify(rows(200)[1]));

  const refused = await Promise.allSettled([ingest(inline, 'products', bad), ingest(worker, 'products', bad)]);
  const [ri, rw] = refused.map((r) => (r.status === 'rejected' ? (r.reason as ServiceError) : null));
  t.equal(ri?.code, 'INVALID_PAYLOAD', 'a bad package is refused on the short way');
  t.equal((ri?.body as { error_count: number }).error_count, 2);
  t.same(ri?.body, rw?.body, 'with the body the worker gives: every refused row');

  // A body larger than the bound goes to the worker even on the pool that has a short way.
  const large = JSON.stringify({ columns, data: rows(2000) });
  t.ok(large.length > 32 * 1024);
  const inlineBefore = inline.stats.inline;
  t.equal((await ingest(inline, 'products', large)).result.rows, 2000);
  t.equal(inline.stats.inline, inlineBefore, 'the large one did not take it');
});

t.test('a declared length is a hint for the buffers, never a bound: a body longer than declared is read whole', async (t) => {
  const columns = ['catalog_id', 'name'];
  const data = Array.from({ length: 20_000 }, (_, i) => [`c${i}`, `name ${i}`]);
  const body = JSON.stringify({ columns, data });
  t.ok(body.length > 128 * 1024, `${body.length} bytes`);
  for (const declaredBytes of [100, body.length, null]) {
    const writers: FakeWriter[] = [];
    const sink = pool.createIngest({
      entity: entity('catalogs'),
      declaredBytes,
      open: async (cols) => {
        const w = new FakeWriter(cols);
        writers.push(w);
        return w;
      },
    });
    const result = await send(sink, body, 16 * 1024);
    t.equal(result.rows, data.length, `declared ${declaredBytes}: every row`);
    t.same(writers[0]!.lines().at(-1), JSON.stringify(data.at(-1)));
  }
});
