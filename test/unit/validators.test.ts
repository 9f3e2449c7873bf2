import t from 'tap';
import { ENTITIES, findEntity, type ColumnType, type EntitySpec } from '../../src/entities/catalog.js';
import { bodyIssue, columnsError, compileRowCheck, isDateTime } from '../../src/entities/validators.js';

const entity = (name: string): EntitySpec => findEntity(name)!;

/** A one-column entity of the given type, for the per-type tables. */
const single = (type: ColumnType, required: boolean): EntitySpec => ({
  name: 'single',
  columns: [{ name: 'c', type, required }],
  parents: [],
});

const LONG = 'x'.repeat(150);

const VALUES: Record<ColumnType, { good: unknown[]; bad: unknown[] }> = {
  string: { good: ['', 'a', 'Grüße, 東京 🚀', '],[', LONG], bad: [1, true, [], {}] },
  id: { good: ['a', 'ü', '],['], bad: ['', 1, false, ['a']] },
  number: { good: [0, -0, -1.5, 1e3, 1e308, Number.MIN_VALUE], bad: ['1', true, Infinity, -Infinity, [1]] },
  nonNegativeNumber: { good: [0, -0, 0.5, 1e3], bad: [-1, -Number.MIN_VALUE, '0', Infinity] },
  integer: { good: [0, -0, -7, 1e3, 2 ** 53 - 1, -(2 ** 53 - 1)], bad: [1.5, '1', Infinity, -Infinity, true, 2 ** 53, -(2 ** 53), 1e20] },
  positiveInteger: { good: [1, 1e3, 42, 2 ** 53 - 1], bad: [0, -0, -1, 1.5, '1', Infinity, 2 ** 53] },
  boolean: { good: [true, false], bad: [0, 1, 'true', 'false'] },
  date: {
    good: ['2024-02-29', '2023-12-31', '2000-02-29', '0001-01-01'],
    bad: ['2024-02-31', '2023-02-29', '1900-02-29', '2024-13-01', '2024-00-10', '2024-01-00', '2024-04-31', '2024-1-01', ' 2024-01-01', '2024-01-01T00:00:00Z', '20240101', 20240101],
  },
  datetime: {
    good: [
      '2024-02-29T23:59:59Z',
      '2024-01-01T00:00:00+00:00',
      '2024-01-01T10:20:30.123456-05:30',
      '2024-01-01t10:20:30z',
      '2024-06-30T12:00:00+14:00',
    ],
    bad: [
      '2023-02-29T00:00:00Z',
      '2024-01-01T24:00:00Z',
      '2024-01-01T23:60:00Z',
      '2024-01-01T23:59:60Z',
      '2024-01-01T10:20:30',
      '2024-01-01 10:20:30Z',
      '2024-01-01T10:20Z',
      '2024-01-01T10:20:30.Z',
      '2024-01-01T10:20:30+0500',
      '2024-01-01T10:20:30+24:00',
      '2024-01-01T10:20:30+05:60',
      '2024-01-01T10:20:30ZZ',
      '2024-01-01',
      1704067200,
    ],
  },
};

t.test('every column type accepts its good values and refuses the bad ones', async (t) => {
  for (const [type, { good, bad }] of Object.entries(VALUES) as [ColumnType, { good: unknown[]; bad: unknown[] }][]) {
    for (const required of [true, false]) {
      const check = compileRowCheck(single(type, required), ['c']);
      for (const v of good) t.equal(check([v], 0), null, `${type} accepts ${String(v)}`);
      for (const v of bad) t.match(check([v], 0), /^Invalid data types in payload: row 0, column "c": expected /, `${type} refuses ${String(v)}`);
      const nullResult = check([null], 0);
      if (required) t.match(nullResult, /, got null$/, `required ${type} refuses null`);
      else t.equal(nullResult, null, `optional ${type} accepts null`);
    }
  }
});

t.test('row detail: index, column, expected label, got', async (t) => {
  const products = entity('products');
  const check = compileRowCheck(products, ['price', 'name', 'product_id']);
  t.equal(check([1, 'n', 'p'], 17), null);
  t.equal(
    check(['abc', 'n', 'p'], 17),
    'Invalid data types in payload: row 17, column "price": expected number >= 0, got "abc"',
  );
  t.equal(check([Infinity, 'n', 'p'], 0), 'Invalid data types in payload: row 0, column "price": expected number >= 0, got Infinity', '1e400 is not null');
  t.equal(check([-1, 'n', 'p'], 0), 'Invalid data types in payload: row 0, column "price": expected number >= 0, got -1');
  t.equal(check([1, null, 'p'], 2), 'Invalid data types in payload: row 2, column "name": expected string, got null');
  t.equal(check([1, 'n', ''], 3), 'Invalid data types in payload: row 3, column "product_id": expected non-empty string, got ""');
  t.equal(check([null, 'n', 'p'], 0), null, 'optional column takes null');
  t.equal(check([1, 'n', 'p', 4, 5], 3), 'Invalid data types in payload: row 3: expected 3 values, got 5');
  t.equal(check([1], 3), 'Invalid data types in payload: row 3: expected 3 values, got 1');

  const first = compileRowCheck(products, ['price', 'is_active']);
  t.equal(first(['x', 'y'], 0), 'Invalid data types in payload: row 0, column "price": expected number >= 0, got "x"', 'first bad cell in client order');

  const lines = compileRowCheck(entity('receipt_lines'), ['receipt_id', 'line_no', 'product_id', 'quantity', 'price']);
  t.equal(lines(['r', 0, 'p', 1, 1], 5), 'Invalid data types in payload: row 5, column "line_no": expected integer >= 1, got 0');
  t.equal(lines(['r', -0, 'p', 1, 1], 5), 'Invalid data types in payload: row 5, column "line_no": expected integer >= 1, got -0');
  t.equal(lines(['r', 1e3, 'p', 1, 1], 5), null, '1e3 is the integer 1000');

  const stock = compileRowCheck(entity('stock'), ['store_id', 'product_id', 'date', 'quantity']);
  t.equal(stock(['s', 'p', '2024-02-31', 1], 0), 'Invalid data types in payload: row 0, column "date": expected date (YYYY-MM-DD), got "2024-02-31"');
  const receipts = compileRowCheck(entity('receipts'), ['receipt_id', 'store_id', 'sold_at', 'total']);
  t.equal(receipts(['r', 's', '2024-01-01', 1], 0), 'Invalid data types in payload: row 0, column "sold_at": expected datetime (RFC 3339), got "2024-01-01"');
});

t.test('got: strings clipped to 100 chars with …, containers as clipped JSON', async (t) => {
  const check = compileRowCheck(entity('stock'), ['quantity', 'store_id', 'product_id', 'date']);
  const got = (v: unknown) => check([v, 's', 'p', '2024-01-01'], 0)!.split(', got ')[1];
  t.equal(got(LONG), JSON.stringify(`${'x'.repeat(100)}…`));
  t.equal(got('x'.repeat(100)), JSON.stringify('x'.repeat(100)), 'exactly 100 is not clipped');
  t.equal(got(`${'x'.repeat(99)}😀tail`), JSON.stringify(`${'x'.repeat(99)}…`), 'never half a surrogate pair');
  t.equal(got('say "hi"\n'), '"say \\"hi\\"\\n"');
  t.equal(got(true), 'true');
  t.equal(got([1, 2]), '[1,2]');
  t.equal(got({ a: LONG }), `${JSON.stringify({ a: LONG }).slice(0, 100)}…`);
});

t.test('catalog order takes the tuple path and agrees with the column-by-column path', async (t) => {
  const sample: Record<ColumnType, unknown> = {
    string: 'Grüße ],[ 🚀',
    id: 'id-1',
    number: -1.5,
    nonNegativeNumber: 0,
    integer: 3,
    positiveInteger: 1,
    boolean: false,
    date: '2024-02-29',
    datetime: '2024-02-29T23:59:59.5+01:00',
  };
  for (const e of ENTITIES) {
    const order = e.columns.map((c) => c.name);
    // A copy of the entity is not the catalog's object, so it never gets the tuple path.
    const fast = compileRowCheck(e, order);
    const slow = compileRowCheck({ ...e }, order);
    const base = e.columns.map((c) => sample[c.type]);
    t.equal(fast(base, 0), null, `${e.name}: a valid row`);
    const rows: unknown[][] = [base, [...base, 1], base.slice(1)];
    e.columns.forEach((c, j) => {
      for (const v of [...VALUES[c.type].good, ...VALUES[c.type].bad, null, undefined]) {
        const row = [...base];
        row[j] = v;
        rows.push(row);
      }
    });
    for (const [i, row] of rows.entries()) {
      t.equal(fast(row, i), slow(row, i), `${e.name} row ${i} (${JSON.stringify(row)})`);
    }
  }
});

t.test('isDateTime edge cases', async (t) => {
  t.ok(isDateTime('2024-12-31T23:59:59.999999999Z'));
  t.notOk(isDateTime('2024-12-31T23:59:59.999Zjunk'));
  t.notOk(isDateTime('2024-12-31T23:5a:59Z'));
  t.notOk(isDateTime('2024-12-31T23:59:5aZ'));
  t.notOk(isDateTime('2024-12-31X23:59:59Z'));
  t.notOk(isDateTime('2024-12-31T23:59:59+01:0a'));
});

t.test('bodyIssue: the first structural issue, Pydantic v2 style, never echoing containers', async (t) => {
  const dictMsg = 'Input should be a valid dictionary or object to extract fields from';
  for (const body of [null, [], [{ columns: [] }], 'x', 5, true]) {
    t.same(bodyIssue(body), { type: 'model_attributes_type', loc: ['body'], msg: dictMsg, input: typeof body === 'object' ? null : body }, `body ${JSON.stringify(body)}`);
  }
  t.same(bodyIssue({}), { type: 'missing', loc: ['body', 'columns'], msg: 'Field required', input: null });
  t.same(bodyIssue({ data: 'x' }), { type: 'missing', loc: ['body', 'columns'], msg: 'Field required', input: null }, 'columns is reported first');
  t.same(bodyIssue({ columns: 'a', data: [] }), { type: 'list_type', loc: ['body', 'columns'], msg: 'Input should be a valid list', input: 'a' });
  t.same(bodyIssue({ columns: null, data: [] }), { type: 'list_type', loc: ['body', 'columns'], msg: 'Input should be a valid list', input: null });
  t.same(bodyIssue({ columns: { a: 1 }, data: [] }), { type: 'list_type', loc: ['body', 'columns'], msg: 'Input should be a valid list', input: null });
  t.same(bodyIssue({ columns: ['a', 5, null], data: [] }), { type: 'string_type', loc: ['body', 'columns', 1], msg: 'Input should be a valid string', input: 5 });
  t.same(bodyIssue({ columns: ['a', ['b']], data: [] }), { type: 'string_type', loc: ['body', 'columns', 1], msg: 'Input should be a valid string', input: null });
  t.same(bodyIssue({ columns: ['a'] }), { type: 'missing', loc: ['body', 'data'], msg: 'Field required', input: null });
  t.same(bodyIssue({ columns: ['a'], data: LONG }), { type: 'list_type', loc: ['body', 'data'], msg: 'Input should be a valid list', input: `${'x'.repeat(100)}…` });
  t.same(bodyIssue({ columns: ['a'], data: [[1], [], ['x'], 'x', 7] }), { type: 'list_type', loc: ['body', 'data', 3], msg: 'Input should be a valid list', input: 'x' });
  t.same(bodyIssue({ columns: ['a'], data: [{ secret: 1 }] }), { type: 'list_type', loc: ['body', 'data', 0], msg: 'Input should be a valid list', input: null });
  t.equal(bodyIssue({ data: [], columns: [] }), null, 'key order does not matter; empty lists are structurally fine');
  t.equal(bodyIssue({ columns: ['a'], data: [[{}], [[]]], extra: 1 }), null, 'extra keys are ignored');
  t.same(bodyIssue(JSON.parse('{"__proto__": {"columns": [], "data": []}}')), { type: 'missing', loc: ['body', 'columns'], msg: 'Field required', input: null }, 'no prototype lookups');
});

t.test('columnsError: empty, duplicate, unknown, missing required, in that order', async (t) => {
  const products = entity('products');
  t.equal(columnsError(products, []), 'The columns array cannot be empty.');
  t.equal(columnsError(products, ['name', 'price', 'price', 'name']), 'Duplicate column: price', 'the first name seen twice');
  t.equal(columnsError(products, ['bogus', 'bogus']), 'Duplicate column: bogus', 'duplicate before unknown');
  t.equal(columnsError(products, ['product_id', 'zeta', 'alpha']), 'Unknown column: zeta', 'first unknown in client order');
  t.equal(columnsError(products, ['zeta']), 'Unknown column: zeta', 'unknown before missing');
  t.equal(columnsError(products, ['__proto__', 'constructor']), 'Unknown column: __proto__');
  t.equal(columnsError(products, [LONG]), `Unknown column: ${'x'.repeat(100)}…`);
  t.equal(columnsError(products, ['price']), 'Missing required columns: product_id, name', 'catalog order, comma and space');
  t.equal(columnsError(products, ['name']), 'Missing required columns: product_id');
  t.equal(columnsError(entity('receipt_lines'), ['discount', 'price', 'line_no']), 'Missing required columns: receipt_id, product_id, quantity');
  t.equal(columnsError(products, ['name', 'product_id']), null, 'optional columns may be absent');
  t.equal(columnsError(products, ['is_active', 'name', 'product_id', 'price', 'unit', 'barcode', 'catalog_id']), null, 'any order');
});
