/**
 * The validation workers parse a piece's bytes as Latin-1 text first (`src/validation/rows.ts`).
 * That is only right while every row check answers the same for the strings that gives as
 * for the strings of the UTF-8 parse, and while whatever shows or stores a value (an error
 * detail, `JSON.stringify` encoding) comes from the UTF-8 parse. These tests hold both.
 */
import { Buffer } from 'node:buffer';
import t from 'tap';
import { ENTITIES, type EntitySpec } from '../../src/entities/catalog.js';
import { compileRowProblem } from '../../src/entities/validators.js';
import { processRows } from '../../src/validation/rows.js';
import { Mode, type RowsResult, type RowsTask } from '../../src/validation/tasks.js';

/** Strings whose UTF-8 bytes read as Latin-1 give other strings: lengths, shapes and digits differ. */
const NON_ASCII = [
  'é',
  'Grüße, 東京 🚀',
  '２０２４-01-01',
  '2024-01-0１',
  '2024-01-01T00:00:00＋01:00',
  '2024-01-01T00:00:00Ｚ',
  '2024-02-29T23:59:59.１Z',
  '\u00a0',
  '\u0085',
  '2024-01-01T00:00:00Z\u00a0',
];
const ASCII = ['', 'a', '2024-02-29', '2024-02-31', '2024-02-29T23:59:59Z', '2024-01-01T00:00:00+01:00', 'true'];
const OTHER = [null, 0, -1, 1.5, 7, true, false];

function parseBoth(json: string): [unknown, unknown] {
  const bytes = Buffer.from(json, 'utf8');
  return [JSON.parse(bytes.toString('latin1')), JSON.parse(bytes.toString('utf8'))];
}

/** Every column order an entity is checked in: the catalog's (tuple path) and reversed (column path). */
const orders = (entity: EntitySpec) => [entity.columns.map((c) => c.name), entity.columns.map((c) => c.name).reverse()];

t.test('every row check answers the same for the Latin-1 and the UTF-8 parse of the same bytes', async (t) => {
  let compared = 0;
  let rejected = 0;
  for (const entity of ENTITIES) {
    for (const columns of orders(entity)) {
      const problem = compileRowProblem(entity, columns);
      const valid = columns.map((name) => {
        const type = entity.columns.find((c) => c.name === name)!.type;
        return type === 'date' ? '2024-02-29' : type === 'datetime' ? '2024-02-29T23:59:59Z' : type === 'boolean' ? true : type.endsWith('umber') || type.endsWith('nteger') ? 1 : 'x';
      });
      for (let j = 0; j < columns.length; j++) {
        for (const value of [...NON_ASCII, ...ASCII, ...OTHER]) {
          const row: unknown[] = valid.slice();
          row[j] = value;
          const [asLatin1, asUtf8] = parseBoth(JSON.stringify(row)) as [unknown[], unknown[]];
          const latin1 = problem(asLatin1) === null;
          const utf8 = problem(asUtf8) === null;
          if (latin1 !== utf8) t.fail(`${entity.name} [${columns.join(',')}] column ${columns[j]} = ${JSON.stringify(value)}: Latin-1 ${latin1}, UTF-8 ${utf8}`);
          compared++;
          if (!utf8) rejected++;
        }
      }
    }
  }
  t.ok(compared > 1000, `${compared} rows compared`);
  t.ok(rejected > 100 && rejected < compared - 100, `both answers occur (${rejected} rejected)`);
});

const products = ENTITIES.find((e) => e.name === 'products')!;
const COLUMNS = products.columns.map((c) => c.name);

function task(text: string): RowsTask {
  const bytes = Buffer.from(text, 'utf8');
  const part = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length) as ArrayBuffer;
  return { kind: 'rows', entity: 'products', columns: COLUMNS, mode: Mode.validate, out: new ArrayBuffer(16), describe: 100, parts: [part], ranges: [0, bytes.length], state: null, first: true, last: false, batchBytes: 1 << 20 };
}

const stored = (result: RowsResult) => Buffer.from(result.out!, 0, result.bytes).toString('utf8');

/** The reference path alone: these tests are about its Latin-1 parse. */
const reference = (task: RowsTask) => processRows(task, false);

t.test('a clean piece with non-ASCII strings stores its UTF-8 rows', async (t) => {
  const rows = [
    ['p1', 'Crème brûlée 🍮', 'c1', null, 'm²', 2.5, true],
    ['p2', '日本茶', null, '4006381333931', 'kg', 0, false],
  ];
  const result = reference(task(rows.map((r) => JSON.stringify(r)).join(',')));
  t.equal(result.ok, true);
  t.equal(result.rows, 2);
  t.equal(result.errorCount, 0);
  t.equal(stored(result), rows.map((r) => `${JSON.stringify(r)}\n`).join(''));
});

t.test('a rejected row names its value as UTF-8 text', async (t) => {
  const rows = [
    ['p1', 'Käse', null, null, null, 1, true],
    ['p2', 'Straße', null, null, null, 'zwölf €', true],
  ];
  const result = reference(task(rows.map((r) => JSON.stringify(r)).join(',')));
  t.equal(result.ok, true);
  t.same(result.rowErrors, [{ index: 1, column: 'price', message: 'expected number >= 0, got "zwölf €"' }]);
  t.equal(result.errorCount, 1);
  t.equal(result.bytes, 0);
});

t.test('an element that is not a list shows its UTF-8 value', async (t) => {
  const result = reference(task(`${JSON.stringify(['p1', 'ok', null, null, null, 1, true])},"Grüße"`));
  t.equal(result.notList, 1);
  t.equal(result.notListInput, 'Grüße');
});

t.test('rows whose numbers need JSON.stringify are stored from the UTF-8 parse', async (t) => {
  // 1e2 has an exponent: the byte transcoder gives up and the parsed rows are encoded.
  const text = '["p1","Crème 🍮",null,"ü",null,1e2,true],["p2","東京",null,null,null,0.5,null]';
  const result = reference(task(text));
  t.equal(result.ok, true);
  t.equal(stored(result), '["p1","Crème 🍮",null,"ü",null,100,true]\n["p2","東京",null,null,null,0.5,null]\n');
});
