/**
 * Deterministic valid ingest bodies: `{"columns":[…],"data":[[…],…]}` in the entity's
 * catalog column order, filled with rows until the next one would pass the byte budget.
 * The same seed and size always give the same bytes.
 *
 * Rows look like real data and exercise the parser: strings with non-ASCII (2-, 3- and
 * 4-byte UTF-8), escapes (`\"`, `\\`, `\n`, `\t`, `\u0001`), now and then `],[` and brackets
 * inside a string, nulls in optional columns, integers and decimals. `products` rows come
 * out at about 70 bytes.
 */
import { Buffer } from 'node:buffer';
import type { ColumnType, EntitySpec } from '../src/entities/catalog.js';
import { mulberry32 } from '../testbed/random.js';

export interface Body {
  json: Buffer;
  rows: number;
}

const NAMES = [
  'Still water 0.5 l',
  'Apple juice',
  'Crème brûlée',
  'Tea "Earl Grey"',
  'Käse, mild',
  'Rye bread',
  '日本茶 sencha',
  'Path C:\\shelf\\7',
  'Milk 3.5%',
  'Æble most',
  'Line one\nline two',
  'Oat flakes',
  'Café au lait',
  'Tab\tseparated',
  'Żurek',
  'Apple 🍎',
  'Bell\u0001pepper',
  'Olive oil',
];
const RARE_NAME = 'Box [6],[12] {x}';
const UNITS = ['pcs', 'kg', 'l', 'pack', 'm²'];

type CellMaker = (row: number, rnd: () => number) => unknown;

function cellMaker(column: string, type: ColumnType, required: boolean): CellMaker {
  const make = valueMaker(column, type);
  if (required) return make;
  return (row, rnd) => (rnd() < 0.04 ? null : make(row, rnd));
}

function valueMaker(column: string, type: ColumnType): CellMaker {
  const prefix = column.slice(0, 1);
  switch (type) {
    case 'id':
      return column === 'product_id' || column === 'receipt_id' || column === 'store_id'
        ? (row) => `${prefix}${String(row).padStart(6, '0')}`
        : (_row, rnd) => `${prefix}-${Math.floor(rnd() * 500)}`;
    case 'string':
      if (column === 'barcode') return (_row, rnd) => String(4_000_000_000_000 + Math.floor(rnd() * 999_999_999_999));
      if (column === 'unit') return (_row, rnd) => UNITS[Math.floor(rnd() * UNITS.length)]!;
      return (row, rnd) => (rnd() < 0.002 ? RARE_NAME : `${NAMES[Math.floor(rnd() * NAMES.length)]!} ${row % 1000}`);
    case 'number':
      return (_row, rnd) => Math.round((rnd() * 2000 - 200) * 100) / 100;
    case 'nonNegativeNumber':
      return (_row, rnd) => Math.round(rnd() * 50_000) / 100;
    case 'integer':
      return (_row, rnd) => Math.floor(rnd() * 2000) - 1000;
    case 'positiveInteger':
      return (_row, rnd) => 1 + Math.floor(rnd() * 40);
    case 'boolean':
      return (_row, rnd) => rnd() < 0.8;
    case 'date':
      return (_row, rnd) => isoDate(rnd);
    case 'datetime':
      return (_row, rnd) => `${isoDate(rnd)}T${pad(Math.floor(rnd() * 24))}:${pad(Math.floor(rnd() * 60))}:${pad(Math.floor(rnd() * 60))}Z`;
  }
}

const pad = (n: number) => String(n).padStart(2, '0');
const isoDate = (rnd: () => number) => `202${Math.floor(rnd() * 5)}-${pad(1 + Math.floor(rnd() * 12))}-${pad(1 + Math.floor(rnd() * 28))}`;

/** One row of `entity` in catalog column order. */
export function rowMaker(entity: EntitySpec, seed = 1): (row: number) => unknown[] {
  const rnd = mulberry32(seed);
  const makers = entity.columns.map((c) => cellMaker(c.name, c.type, c.required));
  return (row) => makers.map((make) => make(row, rnd));
}

/** A valid body of at most `maxBytes` bytes for `entity`. */
export function generateBody(entity: EntitySpec, maxBytes: number, seed = 1): Body {
  const head = `{"columns":${JSON.stringify(entity.columns.map((c) => c.name))},"data":[`;
  const tail = ']}';
  const out = Buffer.allocUnsafe(maxBytes);
  let used = out.write(head, 0);
  const budget = maxBytes - Buffer.byteLength(tail);
  if (used > budget) throw new RangeError(`a body of ${maxBytes} bytes cannot hold even the column list`);
  const next = rowMaker(entity, seed);
  let rows = 0;
  for (;;) {
    const text = (rows > 0 ? ',' : '') + JSON.stringify(next(rows));
    const size = Buffer.byteLength(text);
    if (used + size > budget) break;
    used += out.write(text, used);
    rows++;
  }
  used += out.write(tail, used);
  return { json: out.subarray(0, used), rows };
}
