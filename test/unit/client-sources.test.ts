/**
 * The push readers and the packer: CSV, NDJSON and JSON files read as rows of an entity
 * (edge cases of each format, typing by the catalog, header checks), the streaming JSON
 * scanner across any chunking, and packages cut under their size with exact accounting.
 */
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { InputError } from '../../src/client/errors.js';
import { JsonScanner, type ScanEvent } from '../../src/client/json-scan.js';
import { Packer, type Package } from '../../src/client/packer.js';
import { csvConverter, openSource, type SourceFormat, type SourceRow } from '../../src/client/sources.js';
import type { CatalogEntity } from '../../src/client/types.js';
import { describeCatalog } from '../../src/entities/catalog.js';
import { tempDir } from '../support/harness.js';

const catalog = describeCatalog() as { entities: CatalogEntity[] };
const entity = (name: string) => catalog.entities.find((e) => e.name === name)!;

async function readRows(t: Test, content: string | Buffer, format: SourceFormat, name = 'products'): Promise<SourceRow[]> {
  const dir = await tempDir(t, 'client-sources-');
  const path = join(dir, `file.${format}`);
  await writeFile(path, content);
  const source = await openSource(path, format, entity(name));
  const rows: SourceRow[] = [];
  for await (const batch of source.rows()) rows.push(...batch);
  t.equal(source.bytesRead, Buffer.byteLength(content), 'the whole file was read');
  return rows;
}

/** Rows as the service will see them: arrays in the row's column order. */
function asBodies(rows: SourceRow[]) {
  return rows.map((r) => (r.kind === 'array' ? { columns: r.columns, values: JSON.parse(r.json) as unknown[] } : { object: r.value }));
}

t.test('CSV: BOM, CRLF, quotes, doubled quotes, embedded newlines, empty optional values, typing', async (t) => {
  const csv =
    '\ufeffproduct_id,name,price,is_active,barcode,catalog_id\r\n' +
    'p1,"Water, still",0.5,true,007,c1\r\n' +
    'p2,"Two\r\nlines ""quoted""",,FALSE,,\r\n' +
    '\r\n' +
    'p3,"Tab\there",1e3,YES,"",c2\r\n' +
    'p4,Ünïcødé ✓,abc,maybe,12,c3\r\n' +
    'p5,big,1e400,0,x,c4'; // no line end at the end of the file
  const rows = await readRows(t, csv, 'csv');
  t.same(asBodies(rows), [
    { columns: ['product_id', 'name', 'price', 'is_active', 'barcode', 'catalog_id'], values: ['p1', 'Water, still', 0.5, true, '007', 'c1'] },
    { columns: ['product_id', 'name', 'price', 'is_active', 'barcode', 'catalog_id'], values: ['p2', 'Two\r\nlines "quoted"', null, false, null, null] },
    { columns: ['product_id', 'name', 'price', 'is_active', 'barcode', 'catalog_id'], values: ['p3', 'Tab\there', 1000, true, null, 'c2'] },
    // values that do not convert are sent as written: the service's 422 names them
    { columns: ['product_id', 'name', 'price', 'is_active', 'barcode', 'catalog_id'], values: ['p4', 'Ünïcødé ✓', 'abc', 'maybe', '12', 'c3'] },
    { columns: ['product_id', 'name', 'price', 'is_active', 'barcode', 'catalog_id'], values: ['p5', 'big', '1e400', false, 'x', 'c4'] },
  ]);
  t.same(
    rows.map((r) => r.record),
    [1, 2, 3, 4, 5],
    'records are numbered from 1, the header and blank lines not counted',
  );
  t.equal((rows[0] as { columns: unknown }).columns, (rows[4] as { columns: unknown }).columns, 'one columns array for the whole file');
});

t.test('CSV converters follow the catalog type and the required flag', async (t) => {
  const num = csvConverter({ name: 'n', type: 'number', required: false });
  t.same(['', ' 2 ', '-0.5', '.5', '1e3', '0x10', '1,5', 'Infinity'].map(num), [null, 2, -0.5, 0.5, 1000, '0x10', '1,5', 'Infinity']);
  const int = csvConverter({ name: 'i', type: 'integer', required: true });
  t.same(['', '3', '3.0', '3.5'].map(int), [null, 3, 3, 3.5], 'integer-ness is the service’s to check');
  t.same(['9007199254740991', '9007199254740993', '-9007199254740993'].map(int), [9007199254740991, '9007199254740993', '-9007199254740993'], 'past ±(2^53 − 1) stays text, never rounded');
  const bool = csvConverter({ name: 'b', type: 'boolean', required: false });
  t.same(['true', 'False', '1', '0', 'yes', 'NO', '', 'y'].map(bool), [true, false, true, false, true, false, null, 'y']);
  t.same(['', 'x'].map(csvConverter({ name: 's', type: 'string', required: true })), ['', 'x'], 'a required string keeps ""');
  t.same(['', 'x'].map(csvConverter({ name: 's', type: 'string', required: false })), [null, 'x']);
  t.same(['', '2024-01-01'].map(csvConverter({ name: 'd', type: 'date', required: false })), [null, '2024-01-01']);
});

t.test('CSV header and record errors are InputErrors that say where', async (t) => {
  const cases: [string, RegExp][] = [
    ['product_id,name,colour\np1,a,red\n', /CSV header: unknown column of products: "colour"/],
    ['product_id,name,name\np1,a,b\n', /CSV header: duplicate column: name/],
    ['product_id,price\np1,1\n', /CSV header: missing required columns of products: name/],
    ['product_id,name\np1,a\np2,b,c\n', /line 3: invalid CSV/],
    ['product_id,name\np1,"unclosed\n', /invalid CSV/],
    ['', /no header/],
  ];
  for (const [csv, expected] of cases) {
    await t.rejects(readRows(t, csv, 'csv'), expected, JSON.stringify(csv));
    await t.rejects(readRows(t, csv, 'csv'), InputError);
  }
});

t.test('NDJSON: objects per line, or a header line then arrays; blank lines, CRLF and a BOM', async (t) => {
  const objects = await readRows(t, '\ufeff{"product_id":"p1","name":"A","price":1e400}\r\n'.replace('1e400', '2') + '\n{"name":"B","product_id":"p2","is_active":false}\n', 'ndjson');
  t.same(asBodies(objects), [{ object: { product_id: 'p1', name: 'A', price: 2 } }, { object: { name: 'B', product_id: 'p2', is_active: false } }]);
  const arrays = await readRows(t, '["product_id","name","price"]\r\n["p1","A",1.50]\r\n\r\n["p2","B [x]",null]', 'ndjson');
  t.same(asBodies(arrays), [
    { columns: ['product_id', 'name', 'price'], values: ['p1', 'A', 1.5] },
    { columns: ['product_id', 'name', 'price'], values: ['p2', 'B [x]', null] },
  ]);
  t.equal((arrays[0] as { json: string }).json, '["p1","A",1.50]', 'array rows are sent exactly as written');
  await t.rejects(readRows(t, '{"product_id":"p1","name":"A"}\n{"product_id":\n', 'ndjson'), /line 2: invalid JSON/);
  await t.rejects(readRows(t, '{"product_id":"p1","name":"A"}\n["p2","B"]\n', 'ndjson'), /line 2: expected an object/);
  await t.rejects(readRows(t, '["product_id","name"]\n["p1"]\n', 'ndjson'), /line 2: expected 2 values, got 1/);
  await t.rejects(readRows(t, '{"product_id":"p1","name":"A","colour":"red"}\n', 'ndjson'), /line 1: unknown column of products: "colour"/);
  await t.rejects(readRows(t, '{"product_id":"p1","name":"A","price":1e400}\n', 'ndjson'), /line 1: column price: number out of range/);
  await t.rejects(readRows(t, '42\n', 'ndjson'), /line 1: expected an object/);
});

t.test('JSON: the ingest body layout (columns first or last) and an array of objects', async (t) => {
  const body = { columns: ['product_id', 'name'], data: [['p1', 'a "quoted" ] bracket'], ['p2', '{x}']] };
  const first = await readRows(t, JSON.stringify(body, null, 2), 'json');
  t.same(asBodies(first), [
    { columns: ['product_id', 'name'], values: ['p1', 'a "quoted" ] bracket'] },
    { columns: ['product_id', 'name'], values: ['p2', '{x}'] },
  ]);
  const last = await readRows(t, `{"data": ${JSON.stringify(body.data)}, "extra": {"a": [1]}, "columns": ["product_id","name"]}`, 'json');
  t.same(asBodies(last), asBodies(first), 'data before columns: read in a second pass');
  t.same(
    last.map((r) => r.record),
    [1, 2],
  );
  const objects = await readRows(t, '\ufeff[{"product_id":"p1","name":"A"},\n {"product_id":"p2","name":"B","price":3}]', 'json');
  t.same(asBodies(objects), [{ object: { product_id: 'p1', name: 'A' } }, { object: { product_id: 'p2', name: 'B', price: 3 } }]);
  t.same(await readRows(t, '{"columns":["product_id","name"],"data":[]}', 'json'), [], 'no rows');
  await t.rejects(readRows(t, '{"columns":["product_id","name"],"data":[["p1","a"]', 'json'), /unexpected end of the file/);
  await t.rejects(readRows(t, '{"data":[["p1","a"]]}', 'json'), /no "columns"/);
  await t.rejects(readRows(t, '[["p1","a"]]', 'json'), /element 0: expected an object/);
  await t.rejects(readRows(t, '{"columns":["product_id","name"],"data":[["p1","a"],]}', 'json'), /byte \d+: expected a value/);
  await t.rejects(readRows(t, '{"columns":["product_id","name"],"data":[["p1","a"]]} x', 'json'), /expected the end of the file/);
});

t.test('reserved names (_errors, _record, _file: what push --errors writes) are dropped in every layout; CSV rows carry their fields as written', async (t) => {
  const csv = await readRows(t, 'product_id,_record,name,price,_errors\np1,7,"A, ""a""",1e3,"price: bad"\n', 'csv');
  t.same(asBodies(csv), [{ columns: ['product_id', 'name', 'price'], values: ['p1', 'A, "a"', 1000] }]);
  t.same(csv[0]?.kind === 'array' ? csv[0].fields : null, ['p1', 'A, "a"', '1e3'], 'the fields as written, without the reserved ones');
  const objects = await readRows(t, '{"product_id":"p1","name":"A","_file":"x.csv","_record":3,"_errors":[{"column":"price","message":"m"}]}\n', 'ndjson');
  t.same(asBodies(objects), [{ object: { product_id: 'p1', name: 'A' } }]);
  const arrays = await readRows(t, '["_errors","product_id","name","_record"]\n[[],"p1","A",1]\n', 'ndjson');
  t.same(asBodies(arrays), [{ columns: ['product_id', 'name'], values: ['p1', 'A'] }]);
  await t.rejects(readRows(t, '["_errors","product_id","name"]\n["p1","A"]\n', 'ndjson'), /line 2: expected 3 values, got 2/, 'the width counts the reserved columns');
  const body = await readRows(t, '{"data":[["p1",2,"A"]],"columns":["product_id","_record","name"]}', 'json');
  t.same(asBodies(body), [{ columns: ['product_id', 'name'], values: ['p1', 'A'] }]);
  const array = await readRows(t, '[{"_record":1,"product_id":"p1","name":"A","_errors":[]}]', 'json');
  t.same(asBodies(array), [{ object: { product_id: 'p1', name: 'A' } }]);
  await t.rejects(readRows(t, '_errors,name\nx,A\n', 'csv'), /missing required columns of products: product_id/, 'the header is checked without them');
});

t.test('JsonScanner: the same events whatever the chunking', async (t) => {
  const doc = Buffer.from(
    `\ufeff {"a": 1, "columns": ["x", "y\\"]"], "data": [ [1, "\\\\", {"k": "]}"}], [true,false,null], [-1.5e3, "é✓"] ], "z": "end" } `,
  );
  const scan = (size: number) => {
    const s = new JsonScanner();
    const events: ScanEvent[] = [];
    for (let i = 0; i < doc.length; i += size) events.push(...s.push(doc.subarray(i, i + size)));
    s.end();
    return events;
  };
  const whole = scan(doc.length);
  t.same(whole, [
    { type: 'member', key: 'a', value: 1 },
    { type: 'member', key: 'columns', value: ['x', 'y"]'] },
    { type: 'element', text: '[1, "\\\\", {"k": "]}"}]' },
    { type: 'element', text: '[true,false,null]' },
    { type: 'element', text: '[-1.5e3, "é✓"]' },
    { type: 'member', key: 'z', value: 'end' },
  ]);
  for (const size of [1, 2, 3, 7, 16]) t.same(scan(size), whole, `chunks of ${size} bytes`);
  const roots = new JsonScanner();
  t.same(roots.push(Buffer.from('[1, "two", [3], {"four": 4}]')), [
    { type: 'element', text: '1' },
    { type: 'element', text: '"two"' },
    { type: 'element', text: '[3]' },
    { type: 'element', text: '{"four": 4}' },
  ]);
  roots.end();
  t.throws(() => new JsonScanner(8).push(Buffer.from('[[1,2,3,4,5,6,7]]')), /a value longer than 8 bytes/);
});

/** Every package's body parsed, and all rows concatenated in order. */
function unpack(packages: Package[]) {
  return packages.map((p) => JSON.parse(p.body.toString()) as { columns: string[]; data: unknown[][] });
}

function pack(rows: SourceRow[], maxBytes: number): Package[] {
  const packer = new Packer(maxBytes);
  const out: Package[] = [];
  for (const row of rows) {
    const sealed = packer.add(row);
    if (sealed) out.push(sealed);
  }
  const last = packer.flush();
  if (last) out.push(last);
  return out;
}

t.test('Packer: array rows cut under the size, in order, nothing lost', async (t) => {
  const columns = ['product_id', 'name'];
  const rows: SourceRow[] = Array.from({ length: 1000 }, (_, i) => ({ kind: 'array', columns, json: JSON.stringify([`p${i}`, 'ü'.repeat(i % 17)]), record: i + 1 }));
  for (const max of [64 + 40, 300, 1024, 10_000, 1_000_000]) {
    let packages: Package[];
    try {
      packages = pack(rows, max);
    } catch (err) {
      t.match((err as Error).message, /over the package size/, `${max}: a row that fits no package is an InputError`);
      continue;
    }
    for (const p of packages) t.ok(p.body.length <= max, `${max}: package ${p.index} is ${p.body.length} bytes`);
    const bodies = unpack(packages);
    t.same(
      bodies.flatMap((b) => b.data),
      rows.map((r) => JSON.parse((r as { json: string }).json)),
      `${max}: every row once, in order`,
    );
    t.same(
      packages.map((p) => p.index),
      packages.map((_, i) => i),
    );
    let record = 1;
    for (const p of packages) {
      t.equal(p.firstRecord, record);
      record += p.rows;
    }
    if (max === 300) {
      // the size check is exact: no package could have taken its next package's first row
      for (let i = 0; i + 1 < packages.length; i++) {
        const next = JSON.stringify(bodies[i + 1]!.data[0]);
        t.ok(packages[i]!.body.length + 1 + Buffer.byteLength(next) > max, `package ${i} was full`);
      }
    }
  }
});

t.test('Packer: object rows get the union of their keys, missing keys as null, sizes exact', async (t) => {
  const rows: SourceRow[] = [
    { kind: 'object', value: { product_id: 'p1', name: 'A' }, record: 1 },
    { kind: 'object', value: { name: 'B', product_id: 'p2', price: 2.5 }, record: 2 },
    { kind: 'object', value: { product_id: 'p3', name: 'Ç', is_active: true, barcode: null }, record: 3 },
  ];
  const [one] = pack(rows, 1_000_000);
  t.same(unpack([one!]), [
    {
      columns: ['product_id', 'name', 'price', 'is_active', 'barcode'],
      data: [
        ['p1', 'A', null, null, null],
        ['p2', 'B', 2.5, null, null],
        ['p3', 'Ç', null, true, null],
      ],
    },
  ]);
  // The packer throws if its counted size ever differs from the body; sweep sizes to exercise the formula.
  const many: SourceRow[] = Array.from({ length: 300 }, (_, i) => ({
    kind: 'object',
    value: Object.fromEntries(Object.entries({ product_id: `p${i}`, name: 'n'.repeat(i % 9), price: i, unit: i % 3 ? 'kg' : undefined, is_active: i % 5 === 0 }).filter(([, v]) => v !== undefined)),
    record: i + 1,
  }));
  for (const max of [200, 333, 1000, 5000]) {
    const packages = pack(many, max);
    for (const p of packages) t.ok(p.body.length <= max);
    t.equal(
      unpack(packages).reduce((n, b) => n + b.data.length, 0),
      300,
      `${max}: all rows`,
    );
  }
  t.throws(() => pack([{ kind: 'object', value: { product_id: 'x'.repeat(500), name: 'a' }, record: 7 }], 200), /record 7: a package holding only this row would be/);
});

t.test('Packer: a row that fits no package leaves the rows before it open, for flush() to send', async (t) => {
  const columns = ['product_id', 'name'];
  const huge = 'x'.repeat(500);
  for (const [kind, row] of [
    ['array', (i: number, name: string): SourceRow => ({ kind: 'array', columns, json: JSON.stringify([`p${i}`, name]), record: i })],
    ['object', (i: number, name: string): SourceRow => ({ kind: 'object', value: { product_id: `p${i}`, name }, record: i })],
  ] as const) {
    const packer = new Packer(200);
    const sealed: Package[] = [];
    let i = 1;
    // Rows until one package is sealed and the next holds two: the huge row would seal that one.
    while (sealed.length === 0) {
      const p = packer.add(row(i++, 'a'));
      if (p) sealed.push(p);
    }
    packer.add(row(i++, 'b'));
    t.throws(() => packer.add(row(i, huge)), new RegExp(`record ${i}: a package holding only this row would be`), kind);
    const last = packer.flush();
    t.ok(last, `${kind}: the open package is still there`);
    t.same(
      [...sealed, last!].flatMap((p) => unpack([p])[0]!.data.map((r) => r[0])),
      Array.from({ length: i - 1 }, (_, k) => `p${k + 1}`),
      `${kind}: every row before the huge one, once`,
    );
    t.equal(packer.flush(), null);
  }
});
