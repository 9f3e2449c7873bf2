/**
 * The entity catalog of docs/api.md (Entities): names, columns, types, required flags, parents.
 * The main thread uses it for routing (unknown entity) and `GET /entities`; the validation
 * workers use it with the typia checkers of `validators.ts`.
 */

export type ColumnType = 'string' | 'id' | 'number' | 'nonNegativeNumber' | 'integer' | 'positiveInteger' | 'boolean' | 'date' | 'datetime';

export interface ColumnSpec {
  name: string;
  type: ColumnType;
  required: boolean;
}

export interface EntitySpec {
  name: string;
  columns: readonly ColumnSpec[];
  parents: readonly string[];
}

const col = (name: string, type: ColumnType, required = false): ColumnSpec => ({ name, type, required });

export const ENTITIES: readonly EntitySpec[] = Object.freeze([
  {
    name: 'stores',
    columns: [col('store_id', 'id', true), col('name', 'string', true), col('city', 'string'), col('opened_on', 'date')],
    parents: [],
  },
  {
    name: 'catalogs',
    columns: [col('catalog_id', 'id', true), col('name', 'string', true), col('parent_id', 'id')],
    parents: [],
  },
  {
    name: 'products',
    columns: [
      col('product_id', 'id', true),
      col('name', 'string', true),
      col('catalog_id', 'id'),
      col('barcode', 'string'),
      col('unit', 'string'),
      col('price', 'nonNegativeNumber'),
      col('is_active', 'boolean'),
    ],
    parents: ['catalogs'],
  },
  {
    name: 'stock',
    columns: [
      col('store_id', 'id', true),
      col('product_id', 'id', true),
      col('date', 'date', true),
      col('quantity', 'number', true),
    ],
    parents: ['stores', 'products'],
  },
  {
    name: 'receipts',
    columns: [
      col('receipt_id', 'id', true),
      col('store_id', 'id', true),
      col('sold_at', 'datetime', true),
      col('total', 'number', true),
    ],
    parents: ['stores'],
  },
  {
    name: 'receipt_lines',
    columns: [
      col('receipt_id', 'id', true),
      col('line_no', 'positiveInteger', true),
      col('product_id', 'id', true),
      col('quantity', 'number', true),
      col('price', 'number', true),
      col('discount', 'number'),
    ],
    parents: ['receipts', 'products'],
  },
]);

const BY_NAME = new Map(ENTITIES.map((e) => [e.name, e]));

export function findEntity(name: string): EntitySpec | undefined {
  return BY_NAME.get(name);
}

/** How a column type is named in the catalog listing and in 422 messages. */
export const TYPE_LABELS: Readonly<Record<ColumnType, { type: string; expected: string }>> = {
  string: { type: 'string', expected: 'string' },
  id: { type: 'string', expected: 'non-empty string' },
  number: { type: 'number', expected: 'number' },
  nonNegativeNumber: { type: 'number', expected: 'number >= 0' },
  integer: { type: 'integer', expected: 'integer' },
  positiveInteger: { type: 'integer', expected: 'integer >= 1' },
  boolean: { type: 'boolean', expected: 'boolean' },
  date: { type: 'date', expected: 'date (YYYY-MM-DD)' },
  datetime: { type: 'datetime', expected: 'datetime (RFC 3339)' },
};

/** The public description served by `GET /api/v1/uploading/entities`. */
export function describeCatalog() {
  return {
    entities: ENTITIES.map((e) => ({
      name: e.name,
      columns: e.columns.map((c) => ({
        name: c.name,
        type: TYPE_LABELS[c.type].type,
        required: c.required,
        ...(c.type === 'nonNegativeNumber' ? { minimum: 0 } : {}),
        ...(c.type === 'positiveInteger' ? { minimum: 1, maximum: Number.MAX_SAFE_INTEGER } : {}),
        ...(c.type === 'integer' ? { minimum: -Number.MAX_SAFE_INTEGER, maximum: Number.MAX_SAFE_INTEGER } : {}),
        ...(c.type === 'id' ? { min_length: 1 } : {}),
      })),
      required: e.columns.filter((c) => c.required).map((c) => c.name),
      parents: [...e.parents],
    })),
  };
}
