/**
 * The streaming sink's own promises: a large body goes out in many pieces and stores the
 * plain path's bytes, back-pressure, abort, gzip, repeated keys (refused), hostile layouts. The
 * answers of many small odd bodies are covered by `ingest-differential.test.ts`.
 */
import { Buffer } from 'node:buffer';
import { gzipSync } from 'node:zlib';
import t from 'tap';
import { findEntity, type EntitySpec } from '../../src/entities/catalog.js';
import { DEFAULT_BATCH_BYTES, ValidationPool } from '../../src/validation-pool/pool.js';
import type { IngestResult, IngestSink } from '../../src/validation-pool/types.js';
import type { PackageWriter } from '../../src/store/ports.js';
import { validateBody } from '../../src/validation/body.js';

const entity = (name: string): EntitySpec => findEntity(name)!;

class MemoryWriter implements PackageWriter {
  readonly batches: Uint8Array[] = [];
  aborted = false;
  async append(batch: Uint8Array): Promise<void> {
    this.batches.push(batch.slice());
  }
  async commit(): Promise<void> {}
  async abort(): Promise<void> {
    this.aborted = true;
  }
  stored(): Buffer {
    return Buffer.concat(this.batches);
  }
}

function newPool(options: Partial<ConstructorParameters<typeof ValidationPool>[0]> = {}): ValidationPool {
  const pool = new ValidationPool({ workers: 1, maxQueue: 8, ...options });
  t.teardown(() => pool.destroy());
  return pool;
}

function start(pool: ValidationPool, name: string, encoding: 'identity' | 'gzip' = 'identity') {
  const writers: MemoryWriter[] = [];
  const sink = pool.createIngest({
    entity: entity(name),
    encoding,
    open: async () => {
      const w = new MemoryWriter();
      writers.push(w);
      return w;
    },
  });
  return { sink, writers };
}

/** Writes `body` in chunks from one reused buffer, waiting for onDrain whenever write says so. */
async function send(sink: IngestSink, body: Uint8Array, chunkSize = 64 * 1024): Promise<IngestResult> {
  let resume: (() => void) | null = null;
  sink.onDrain(() => resume?.());
  const reused = new Uint8Array(chunkSize);
  for (let at = 0; at < body.length; at += chunkSize) {
    const part = body.subarray(at, at + chunkSize);
    reused.set(part);
    if (!sink.write(reused.subarray(0, part.length))) await new Promise<void>((r) => (resume = r));
    resume = null;
  }
  return sink.end();
}

function plain(name: string, body: Uint8Array) {
  const copy = Buffer.allocUnsafeSlow(body.length);
  copy.set(body);
  return validateBody(copy.buffer as ArrayBuffer, name, DEFAULT_BATCH_BYTES);
}

const NAMES = ['Still water 0.5 l', 'Crème brûlée', 'Tea "Earl Grey"', '日本茶 sencha', 'Path C:\\shelf\\7', 'Line\nbreak', 'Box [6],[12] {x}', 'Apple 🍎'];

/** A products body of at most `maxBytes`, rows in catalog order. */
function productsBody(maxBytes: number): Buffer {
  const head = '{"columns":["product_id","name","catalog_id","barcode","unit","price","is_active"],"data":[';
  const parts: string[] = [head];
  let size = head.length + 2;
  for (let i = 0; ; i++) {
    const row = JSON.stringify([`p${i}`, `${NAMES[i % NAMES.length]} ${i % 977}`, i % 13 === 0 ? null : `c-${i % 500}`, String(4_000_000_000_000 + i), 'pcs', Math.round((i * 7919) % 50000) / 100, i % 2 === 0]);
    const bytes = Buffer.byteLength(row) + 1;
    if (size + bytes > maxBytes) break;
    parts.push(i === 0 ? row : `,${row}`);
    size += bytes;
  }
  parts.push(']}');
  return Buffer.from(parts.join(''));
}

t.test('a 32 MiB body arrives in many pieces and stores exactly the one-shot bytes', async (t) => {
  const pool = newPool({ workers: 2 });
  const body = productsBody(32 * 1024 * 1024);
  t.ok(body.length > 33_000_000 && body.length <= 33_554_432, `${body.length} bytes`);
  const { sink, writers } = start(pool, 'products');
  const result = await send(sink, body);
  t.ok(pool.stats.pieces >= 30, `${pool.stats.pieces} pieces`);
  t.equal(pool.stats.oneShots, 0, 'no whole-body task');
  const expected = plain('products', body);
  if (!expected.ok) throw new Error('the body must be valid');
  t.equal(result.rows, expected.rows);
  t.equal(result.bytes, expected.bytes);
  t.ok(writers[0]!.stored().equals(Buffer.from(expected.buffer, 0, expected.bytes)), 'identical stored bytes (the client wrote them as JSON.stringify does)');
  t.ok(writers[0]!.batches.every((b) => b.byteLength <= DEFAULT_BATCH_BYTES), 'batches within batchBytes');
});

const catalogs = (rows: number, name = (i: number) => `name ${i}`) =>
  Buffer.from(JSON.stringify({ columns: ['catalog_id', 'name'], data: Array.from({ length: rows }, (_, i) => [`c${i}`, name(i)]) }));

t.test('back-pressure: write returns false past piecesPerRequest, onDrain resumes, rows stay in order', async (t) => {
  const pool = newPool({ pieceBytes: 64, piecesPerRequest: 2 });
  const body = catalogs(400);
  const { sink, writers } = start(pool, 'catalogs');
  let drained!: () => void;
  const drain = new Promise<void>((r) => (drained = r));
  sink.onDrain(() => drained());
  const half = Math.floor(body.length / 2);
  t.equal(sink.write(body.subarray(0, half)), false, 'one large chunk: more pieces than the bound');
  t.ok(pool.stats.pieces <= 2, `only ${pool.stats.pieces} dispatched`);
  await drain;
  sink.write(body.subarray(half));
  const result = await sink.end();
  t.equal(result.rows, 400);
  t.equal(writers[0]!.stored().toString(), Array.from({ length: 400 }, (_, i) => `["c${i}","name ${i}"]\n`).join(''));
});

t.test('the pool bound: many requests share poolPieces slots and all finish', async (t) => {
  const pool = newPool({ workers: 2, pieceBytes: 256, poolPieces: 1, maxQueue: 16 });
  const results = await Promise.all(Array.from({ length: 8 }, (_, k) => send(start(pool, 'catalogs').sink, catalogs(300 + k), 100)));
  t.same(results.map((r) => r.rows), Array.from({ length: 8 }, (_, k) => 300 + k));
});

t.test('abort mid-body: end() rejects, the writer is aborted, the admission is given back', async (t) => {
  const pool = newPool({ maxQueue: 0, pieceBytes: 64 });
  const body = catalogs(2000);
  const first = start(pool, 'catalogs');
  const dispatched = pool.stats.pieces;
  first.sink.write(body.subarray(0, body.length / 2));
  t.ok(pool.stats.pieces > dispatched, 'pieces were in flight when the client went away');
  first.sink.abort();
  t.equal(first.sink.write(body.subarray(body.length / 2)), true, 'later writes are ignored');
  await t.rejects(first.sink.end(), { code: 'INTERNAL' });
  t.ok(first.writers.every((w) => w.aborted), 'every opened writer aborted');
  const next = start(pool, 'catalogs');
  t.equal((await send(next.sink, catalogs(10))).rows, 10, 'the next request is admitted');
});

t.test('gzip: inflated on the way, 413 past maxDecompressedBytes, 422 when not gzip', async (t) => {
  const pool = newPool({ maxDecompressedBytes: 4096, pieceBytes: 512 });
  const body = catalogs(50);
  t.ok(body.length < 4096);
  const ok = start(pool, 'catalogs', 'gzip');
  t.equal((await send(ok.sink, gzipSync(body), 7)).rows, 50);
  t.equal(ok.writers[0]!.stored().toString().split('\n').length, 51);

  const big = start(pool, 'catalogs', 'gzip');
  await t.rejects(send(big.sink, gzipSync(catalogs(500)), 100), { code: 'BODY_TOO_LARGE', statusCode: 413 });
  t.ok(big.writers.every((w) => w.aborted));

  // 64 MiB of spaces inflate from ~64 KiB: inflating stops at the bound.
  const bomb = start(pool, 'catalogs', 'gzip');
  await t.rejects(send(bomb.sink, gzipSync(Buffer.alloc(64 * 1024 * 1024, 0x20))), { code: 'BODY_TOO_LARGE' });

  const invalid = { code: 'INVALID_PAYLOAD', statusCode: 422, body: { detail: 'Invalid JSON format.' } };
  await t.rejects(send(start(pool, 'catalogs', 'gzip').sink, body), invalid, 'not gzip');
  await t.rejects(send(start(pool, 'catalogs', 'gzip').sink, gzipSync(body).subarray(0, 40)), invalid, 'cut short');
  await t.rejects(send(start(pool, 'catalogs', 'gzip').sink, Buffer.alloc(0)), invalid, 'empty');
  await t.rejects(send(start(pool, 'catalogs', 'gzip').sink, gzipSync(Buffer.from('{"columns":["catalog_id","name"],"data":[['))), invalid, 'gzip of a bad body');
});

t.test('a repeated top-level `columns` or `data` key: 422 on both paths, right after JSON validity', async (t) => {
  const pool = newPool({ pieceBytes: 16 });
  const C = '"columns":["catalog_id","name"]';
  const dup = (key: string) => `Duplicate key in payload: ${key}`;
  const cases: [string, string, string | number][] = [
    ['same columns again after data', `{${C},"data":[["a","b"],["c","d"]],${C}}`, dup('columns')],
    ['new columns for validated rows', '{"columns":["x"],"data":[["a","b"]],"columns":["catalog_id","name"]}', dup('columns')],
    ['new columns that fail their checks', `{${C},"data":[["a","b"]],"columns":["name"]}`, dup('columns')],
    ['new data after an empty one', `{${C},"data":[],"data":[["a","b"]]}`, dup('data')],
    ['new data replacing stored rows', `{${C},"data":[["a","b"]],"data":[["c","d"]]}`, dup('data')],
    ['new data with a bad row', `{${C},"data":[["a","b"]],"data":[["c",1]]}`, dup('data')],
    ['columns twice before data (the head)', `{"columns":["nope"],${C},"data":[["a","b"]]}`, dup('columns')],
    ['data before the streamed data (the head)', `{"data":"not yet",${C},"data":[["a",1]]}`, dup('data')],
    ['data first, columns twice (one task)', `{"data":[["a","b"]],${C},${C}}`, dup('columns')],
    ['the first repetition in body order is named', `{${C},"data":0,"columns":[],"data":[["a","b"]]}`, dup('columns')],
    ['… whichever key it is', `{"data":0,${C},"data":[["a","b"]],"columns":[]}`, dup('data')],
    ['after a byte order mark', `\ufeff {"columns":[],${C},"data":[["a","b"]]}`, dup('columns')],
    ['an escaped key name counts', `{${C},"data":[["a","b"]],"\\u0063olumns":["catalog_id","name"]}`, dup('columns')],
    ['beats a structural issue', '{"columns":5,"data":[7],"columns":5}', dup('columns')],
    ['beats a bad row and a column error', '{"columns":["zzz"],"data":[[1,2,3]],"data":[]}', dup('data')],
    ['not JSON beats it', `{${C},"data":[["a","b"]],${C},}`, 'Invalid JSON format.'],
    ['not JSON inside the rows beats a repetition in the head', `{${C},${C},"data":[["a","b"],["c" "d"]]}`, 'Invalid JSON format.'],
    ['other keys may repeat', `{"note":1,${C},"note":[2],"data":[["a","b"]],"note":{"x":3}}`, 1],
    ['keys of nested objects do not count', `{"meta":{"columns":1,"columns":2,"data":[],"data":[]},${C},"data":[["a","b"]]}`, 1],
    ['key names inside values do not count', `{${C},"data":[["columns","data"]],"note":"\\"columns\\":[]"}`, 1],
  ];
  for (const [name, text, expected] of cases) {
    const body = Buffer.from(text);
    const reference = plain('catalogs', body);
    for (const encoding of ['identity', 'gzip'] as const) {
      const { sink, writers } = start(pool, 'catalogs', encoding);
      const wire = encoding === 'gzip' ? gzipSync(body) : body;
      const label = `${name} (${encoding})`;
      if (typeof expected === 'number') {
        t.equal((await send(sink, wire, 5)).rows, expected, label);
      } else {
        await t.rejects(send(sink, wire, 5), { code: 'INVALID_PAYLOAD', statusCode: 422, message: expected }, label);
        t.ok(writers.every((w) => w.aborted), `${label}: nothing stored`);
      }
    }
    if (typeof expected === 'number') t.ok(reference.ok && reference.rows === expected, `${name}: as the plain path`);
    else t.match(reference, { ok: false, message: expected }, `${name}: as the plain path`);
  }
});

t.test('hostile layouts: wrong cuts cost continuations (linear), answers stay exact', async (t) => {
  const pool = newPool({ pieceBytes: 4096 });
  const hostile = catalogs(6000, (i) => `${'],['.repeat(30)}${i}`);
  const { sink, writers } = start(pool, 'catalogs');
  const result = await send(sink, hostile, 1000);
  const reference = plain('catalogs', hostile);
  t.ok(reference.ok);
  t.equal(result.rows, 6000);
  if (!reference.ok) throw new Error('the body must be valid');
  t.ok(writers[0]!.stored().equals(Buffer.from(reference.buffer, 0, reference.bytes)));
  t.ok(pool.stats.continuations > 50, `${pool.stats.continuations} continuations`);

  // One row far longer than a piece, full of would-be cuts.
  const before = pool.stats.continuations;
  const long = Buffer.from(JSON.stringify({ columns: ['catalog_id', 'name'], data: [['a', '],['.repeat(300_000)], ['b', 'c']] }));
  t.equal((await send(start(pool, 'catalogs').sink, long, 4096)).rows, 2);
  const used = pool.stats.continuations - before;
  t.ok(used >= 100 && used < 400, `the long row took ${used} continuations for ${Math.round(long.length / 4096)} pieces: each piece once`);

  // Not JSON inside the long row: found once the carry reaches it, still linear.
  const broken = Buffer.from(long.toString().replace('],[],[', '],[\u0001],['));
  await t.rejects(send(start(pool, 'catalogs').sink, broken, 4096), { code: 'INVALID_PAYLOAD', message: 'Invalid JSON format.' });
});

t.test('data before columns and heads past the limit go whole to one task', async (t) => {
  const pool = newPool({ headBytes: 64 });
  const before = pool.stats.oneShots;
  t.equal((await send(start(pool, 'catalogs').sink, Buffer.from('{"data":[["a","b"]],"columns":["catalog_id","name"]}'))).rows, 1);
  t.equal((await send(start(pool, 'catalogs').sink, Buffer.from(`{"note":"${'x'.repeat(100)}","columns":["catalog_id","name"],"data":[["a","b"]]}`))).rows, 1);
  t.equal(pool.stats.oneShots - before, 2);
});

t.test('a large tail (keys after `data`) is checked in a worker, exactly', async (t) => {
  const pool = newPool({ pieceBytes: 4096 });
  const note = `${'],["x"],['.repeat(20_000)}`;
  const valid = Buffer.from(`{"columns":["catalog_id","name"],"data":[["a","b"],["c","d"]],"note":${JSON.stringify(note)},"more":[[1],[2]]}`);
  t.equal((await send(start(pool, 'catalogs').sink, valid, 1000)).rows, 2);
  t.equal(pool.stats.skeletonTasks, 1);
  const broken = Buffer.from(`${valid.toString().slice(0, -1)},}`);
  await t.rejects(send(start(pool, 'catalogs').sink, broken, 1000), { code: 'INVALID_PAYLOAD', message: 'Invalid JSON format.' });
  const repeated = Buffer.from(`{"columns":["catalog_id","name"],"data":[],"note":${JSON.stringify(note)},"data":[["e","f"],["g",7]]}`);
  await t.rejects(send(start(pool, 'catalogs').sink, repeated, 1000), { code: 'INVALID_PAYLOAD', message: 'Duplicate key in payload: data' });
  t.equal(pool.stats.skeletonTasks, 3);
});

t.test('memory: what a request holds whole is bounded per request (413) and for the process (503), inflated bytes counted', async (t) => {
  const pool = newPool({ pieceBytes: 4096, maxHeldBytes: 64 * 1024, memoryBudgetBytes: 100 * 1024 });
  const rows = (n: number, name = (i: number) => `name ${i}`) => Array.from({ length: n }, (_, i) => [`c${i}`, name(i)]);
  const dataFirst = (n: number) => Buffer.from(JSON.stringify({ data: rows(n), columns: ['catalog_id', 'name'] }));
  const small = dataFirst(100);
  t.equal((await send(start(pool, 'catalogs').sink, small)).rows, 100, 'a layout held whole, under the bound: accepted');

  // Each bound, plain and gzip (the wire bytes of the gzip bodies are a fraction of what they hold).
  const longRow = Buffer.from(JSON.stringify({ columns: ['catalog_id', 'name'], data: [['c', 'x'.repeat(100 * 1024)]] }));
  const longTail = Buffer.from(JSON.stringify({ columns: ['catalog_id', 'name'], data: rows(3), note: 'y'.repeat(100 * 1024) }));
  for (const [name, body] of [['data before columns', dataFirst(8000)], ['one row longer than the bound', longRow], ['bytes after data', longTail]] as const) {
    t.ok(body.length > 64 * 1024, `${name}: ${body.length} bytes`);
    for (const encoding of ['identity', 'gzip'] as const) {
      const { sink, writers } = start(pool, 'catalogs', encoding);
      await t.rejects(send(sink, encoding === 'gzip' ? gzipSync(body) : body, 4096), { code: 'BODY_TOO_LARGE', statusCode: 413 }, `${name}, ${encoding}: 413`);
      t.ok(writers.every((w) => w.aborted), `${name}, ${encoding}: nothing stored`);
    }
  }
  t.equal(pool.memory.used, 0, 'every reservation given back');

  // Two at once, each under the request's bound, together past the process's: the second is turned away.
  const held = dataFirst(2700);
  t.ok(held.length > 50 * 1024 && held.length < 64 * 1024, `${held.length} bytes each`);
  const first = start(pool, 'catalogs');
  for (let at = 0; at < held.length; at += 4096) first.sink.write(held.subarray(at, at + 4096));
  t.ok(pool.memory.used >= held.length, `the first holds ${pool.memory.used} bytes`);
  const firstHolds = pool.memory.used;
  const second = start(pool, 'catalogs');
  let sent = 0;
  while (!second.sink.decided && sent < held.length) second.sink.write(held.subarray(sent, (sent += 4096)));
  t.ok(second.sink.decided && sent < held.length, `the second is refused after ${sent} of its bytes`);
  // Given back at the refusal, not when its body ends: a client that goes on sending holds nothing.
  t.equal(pool.memory.used, firstHolds, 'the refused request holds nothing while its body still comes');
  while (sent < held.length) second.sink.write(held.subarray(sent, (sent += 4096)));
  t.equal(pool.memory.used, firstHolds, 'nor after the rest of it');
  await t.rejects(second.sink.end(), { code: 'RATE_LIMITED', statusCode: 503 }, 'the second: 503');
  t.equal((await first.sink.end()).rows, 2700, 'the first is accepted');
  t.equal(pool.memory.used, 0, 'and gives its bytes back');
  t.ok(pool.memory.refusals >= 1 && pool.memory.peak <= 100 * 1024, `peak ${pool.memory.peak} within the budget`);
  t.equal((await send(start(pool, 'catalogs').sink, held)).rows, 2700, 'then the same body fits');
});

t.test('a row or the bytes after data, up to the bound a request may hold: accepted, however the buffer grew', async (t) => {
  // Piece buffers of 8 KiB double while a row waits for its cut: 16, 32, then not 64 KiB past the 48 KiB bound, but 48.
  const pool = newPool({ pieceBytes: 4096, maxHeldBytes: 48 * 1024 });
  const longRow = Buffer.from(JSON.stringify({ columns: ['catalog_id', 'name'], data: [['c', 'x'.repeat(40 * 1024)]] }));
  const longTail = Buffer.from(JSON.stringify({ columns: ['catalog_id', 'name'], data: [['a', 'b']], note: 'y'.repeat(40 * 1024) }));
  for (const [name, body] of [['one row', longRow], ['bytes after data', longTail]] as const) {
    t.ok(body.length > 32 * 1024 && body.length < 48 * 1024, `${name}: ${body.length} bytes, under the bound`);
    for (const encoding of ['identity', 'gzip'] as const) {
      const { sink } = start(pool, 'catalogs', encoding);
      const answer = await send(sink, encoding === 'gzip' ? gzipSync(body) : body, 4096).then(
        (result) => `${result.rows} row`,
        (err: Error) => err.message,
      );
      t.equal(answer, '1 row', `${name}, ${encoding}: accepted`);
    }
  }
  t.equal(pool.memory.used, 0, 'every reservation given back');
  // Past the bound it is still 413.
  const tooLong = Buffer.from(JSON.stringify({ columns: ['catalog_id', 'name'], data: [['c', 'x'.repeat(50 * 1024)]] }));
  await t.rejects(send(start(pool, 'catalogs', 'gzip').sink, gzipSync(tooLong), 4096), { code: 'BODY_TOO_LARGE', statusCode: 413 }, 'a row past the bound: 413');
});

t.test('a row cut at wrong places, up to the bound a request may hold: its carried parts count their bytes, accepted', async (t) => {
  // A string of commas: every cut falls inside it, each piece (in a grown buffer) is carried on whole.
  const pool = newPool({ pieceBytes: 4096, maxHeldBytes: 64 * 1024 });
  const body = Buffer.from(JSON.stringify({ columns: ['catalog_id', 'name'], data: [['c', ','.repeat(60 * 1024)]] }));
  t.ok(body.length < 64 * 1024, `${body.length} bytes, under the bound`);
  for (const encoding of ['identity', 'gzip'] as const) {
    const answer = await send(start(pool, 'catalogs', encoding).sink, encoding === 'gzip' ? gzipSync(body) : body, 4096).then(
      (result) => `${result.rows} row`,
      (err: Error) => err.message,
    );
    t.equal(answer, '1 row', `${encoding}: accepted`);
  }
  t.ok(pool.stats.continuations > 0, `${pool.stats.continuations} continuations`);
  t.ok(pool.memory.peak <= 64 * 1024, `peak ${pool.memory.peak}`);
  t.equal(pool.memory.used, 0, 'every reservation given back');
});
