/**
 * Every error of every row (docs/api.md, API decisions): the row checker names each bad value
 * of a row in the client's column order, a row of the wrong length is one error, and a
 * worker's task counts them all and describes the first ones, on both paths (the byte-level
 * scanner and the reference `JSON.parse` + typia), whatever path a row takes.
 */
import { Buffer } from 'node:buffer';
import t from 'tap';
import { findEntity, type EntitySpec } from '../../src/entities/catalog.js';
import { compileRowErrorCount, compileRowProblem } from '../../src/entities/validators.js';
import { processRows } from '../../src/validation/rows.js';
import { Mode, type RowsTask } from '../../src/validation/tasks.js';

const entity = (name: string): EntitySpec => findEntity(name)!;

t.test('compileRowProblem: every bad value of a row, in the client order; a row of the wrong length is one fault', async (t) => {
  for (const [order, copy] of [['catalog', false], ['catalog, column by column', true], ['reversed', false]] as const) {
    const products = entity('products');
    const names = products.columns.map((c) => c.name);
    const columns = order === 'reversed' ? [...names].reverse() : names;
    const problem = compileRowProblem(copy ? { ...products } : products, columns);
    const row = (values: Record<string, unknown>) => columns.map((c) => (c in values ? values[c] : ({ product_id: 'p', name: 'n' } as Record<string, unknown>)[c] ?? null));
    t.equal(problem(row({})), null, `${order}: a valid row`);
    const faults = problem(row({ product_id: '', price: 'abc', is_active: 'yes' }));
    const expected = [
      { column: 'product_id', message: 'expected non-empty string, got ""' },
      { column: 'price', message: 'expected number >= 0, got "abc"' },
      { column: 'is_active', message: 'expected boolean, got "yes"' },
    ];
    t.same(faults, order === 'reversed' ? [...expected].reverse() : expected, `${order}: three bad values, three faults in the client's column order`);
    t.same(problem([...row({ price: 'abc' }), 'extra']), [{ column: null, message: `expected ${columns.length} values, got ${columns.length + 1}` }], `${order}: wrong length, one fault`);
    const count = compileRowErrorCount(copy ? { ...products } : products, columns);
    t.same([count(row({})), count(row({ product_id: '', price: 'abc', is_active: 'yes' })), count([...row({ price: 'abc' }), 'extra'])], [0, 3, 1], `${order}: the count alone agrees`);
  }
});

const STOCK = ['store_id', 'product_id', 'date', 'quantity'];

function task(rows: string[], describe = 100): RowsTask {
  const bytes = Buffer.from(rows.join(','), 'utf8');
  const part = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length) as ArrayBuffer;
  return { kind: 'rows', entity: 'stock', columns: STOCK, mode: Mode.validate, out: new ArrayBuffer(16), describe, parts: [part], ranges: [0, bytes.length], state: null, first: true, last: false, batchBytes: 1 << 20 };
}

const ROWS = [
  '["s1","p1","2024-01-01",1]', // 0: valid
  '["","p1","2024-02-31","x"]', // 1: three bad values
  '["s1","p1","2024-01-01"]', // 2: wrong length: one error
  '["s1","","2024-01-0\\u0031",true]', // 3: a date with an escape (the scanner leaves the row to the reference) and two bad values
  '["s1","p1","2024-02-3\\u0031",1]', // 4: the escaped date itself is bad
  '["s1","p1","2024-01-01",2]', // 5: valid
];

const EXPECTED = [
  { index: 1, column: 'store_id', message: 'expected non-empty string, got ""' },
  { index: 1, column: 'date', message: 'expected date (YYYY-MM-DD), got "2024-02-31"' },
  { index: 1, column: 'quantity', message: 'expected number, got "x"' },
  { index: 2, column: null, message: 'expected 4 values, got 3' },
  { index: 3, column: 'product_id', message: 'expected non-empty string, got ""' },
  { index: 3, column: 'quantity', message: 'expected number, got true' },
  { index: 4, column: 'date', message: 'expected date (YYYY-MM-DD), got "2024-02-31"' },
];

for (const scanner of [true, false]) {
  const path = scanner ? 'row scanner' : 'reference path';
  t.test(`${path}: a task counts every error and describes them in row then column order`, async (t) => {
    const result = processRows(task(ROWS), scanner);
    t.equal(result.scanned, scanner, scanner ? 'the scanner answered' : 'the reference answered');
    t.equal(result.rows, 6);
    t.same(result.rowErrors, EXPECTED);
    t.equal(result.errorCount, EXPECTED.length, '7 errors in 4 rows');
    t.equal(result.bytes, 0, 'nothing encoded');
  });

  t.test(`${path}: describes at most \`describe\` errors, counts them all`, async (t) => {
    const result = processRows(task(ROWS, 2), scanner);
    t.same(result.rowErrors, EXPECTED.slice(0, 2), 'the first two errors, although their row has three');
    t.equal(result.errorCount, EXPECTED.length);
    const none = processRows(task(ROWS, 0), scanner);
    t.same([none.rowErrors, none.errorCount], [[], EXPECTED.length], 'describe 0: counted only');
  });

  t.test(`${path}: 300 rows of two bad values each: 600 errors counted, 100 described`, async (t) => {
    const rows = Array.from({ length: 300 }, (_, i) => `["s${i}","p",5,"q"]`);
    const result = processRows(task(rows), scanner);
    t.equal(result.errorCount, 600);
    t.equal(result.rowErrors.length, 100);
    t.same(result.rowErrors.slice(0, 2), [
      { index: 0, column: 'date', message: 'expected date (YYYY-MM-DD), got 5' },
      { index: 0, column: 'quantity', message: 'expected number, got "q"' },
    ]);
    t.same(result.rowErrors.at(-1), { index: 49, column: 'quantity', message: 'expected number, got "q"' });
  });
}
