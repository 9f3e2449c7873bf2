/**
 * Cuts a stream of rows into ingest bodies `{"columns": […], "data": […]}` of at most
 * `maxBytes` bytes each (UTF-8, exactly as sent), in row order. A package's size is known
 * before a row is added, so no body is ever built twice.
 *
 * Array rows are taken as their JSON text. Object rows make the package's columns the
 * union of their keys in first-seen order, a missing key sent as `null` (the service treats
 * an optional column's `null` like its absence). Each package's parts are joined once, when
 * it is sealed.
 */
import { InputError } from './errors.js';
import type { SourceRow } from './sources.js';

export interface Package {
  /** 0-based, in file order. */
  index: number;
  body: Buffer;
  rows: number;
  /** `record` of the package's first row (1-based number in the file). */
  firstRecord: number;
}

const enc = (s: string) => Buffer.byteLength(s, 'utf8');
const HEAD = enc('{"columns":') + enc(',"data":[');
const TAIL = enc(']}');

interface Open {
  rows: number;
  firstRecord: number;
  /** Array rows: their texts. Object rows: per row, the value texts by column index. */
  texts: string[];
  cells: string[][];
  columns: readonly string[];
  /** Object rows only: column → index. */
  index: Map<string, number> | null;
  /** Byte size of the body as it stands. */
  bytes: number;
  // object rows: the terms of the size formula
  columnNameBytes: number;
  present: number;
  valueBytes: number;
}

export class Packer {
  #open: Open | null = null;
  #next = 0;

  constructor(readonly maxBytes: number) {
    if (!(maxBytes >= 64)) throw new RangeError(`maxBytes: expected at least 64, got ${maxBytes}`);
  }

  /** Adds a row; returns the package it sealed to make room, if any. */
  add(row: SourceRow): Package | null {
    return row.kind === 'array' ? this.#addArray(row.columns, row.json, row.record) : this.#addObject(row.value, row.record);
  }

  /** Seals what is open (null when nothing is). */
  flush(): Package | null {
    const open = this.#open;
    if (!open) return null;
    this.#open = null;
    const head = `{"columns":${JSON.stringify(open.columns)},"data":[`;
    let rows: string[];
    if (open.index === null) rows = open.texts;
    else {
      const width = open.columns.length;
      rows = open.cells.map((cells) => {
        const out = new Array<string>(width);
        for (let i = 0; i < width; i++) out[i] = cells[i] ?? 'null';
        return `[${out.join(',')}]`;
      });
    }
    const body = Buffer.from(`${head}${rows.join(',')}]}`, 'utf8');
    if (body.length !== open.bytes) throw new Error(`packer: body is ${body.length} bytes, counted ${open.bytes}`);
    return { index: this.#next++, body, rows: open.rows, firstRecord: open.firstRecord };
  }

  #addArray(columns: readonly string[], json: string, record: number): Package | null {
    const size = enc(json);
    let sealed: Package | null = null;
    let open = this.#open;
    if (!open || open.index !== null || open.columns !== columns || open.bytes + 1 + size > this.maxBytes) {
      const fresh = this.#start(columns, null, record);
      // Refused before the open package is sealed: its rows stay open, for flush() to send.
      if (fresh.bytes + size > this.maxBytes) throw tooLarge(record, fresh.bytes + size, this.maxBytes);
      sealed = this.flush();
      this.#open = open = fresh;
    } else open.bytes += 1;
    open.texts.push(json);
    open.bytes += size;
    open.rows++;
    return sealed;
  }

  #addObject(value: Record<string, unknown>, record: number): Package | null {
    const keys = Object.keys(value);
    const texts = keys.map((k) => JSON.stringify(value[k]));
    let valueBytes = 0;
    for (const t of texts) valueBytes += enc(t);
    let sealed: Package | null = null;
    let open = this.#open;
    if (!open || open.index === null || this.#sizeWith(open, keys, valueBytes) > this.maxBytes) {
      const fresh = this.#start([], new Map(), record);
      const size = this.#sizeWith(fresh, keys, valueBytes);
      // Refused before the open package is sealed: its rows stay open, for flush() to send.
      if (size > this.maxBytes) throw tooLarge(record, size, this.maxBytes);
      sealed = this.flush();
      this.#open = open = fresh;
    }
    const index = open.index!;
    const columns = open.columns as string[];
    const cells: string[] = [];
    for (let i = 0; i < keys.length; i++) {
      const key = keys[i]!;
      let at = index.get(key);
      if (at === undefined) {
        at = columns.length;
        columns.push(key);
        index.set(key, at);
        open.columnNameBytes += enc(JSON.stringify(key));
      }
      cells[at] = texts[i]!;
    }
    open.cells.push(cells);
    open.rows++;
    open.present += keys.length;
    open.valueBytes += valueBytes;
    open.bytes = this.#size(open.columns.length, open.columnNameBytes, open.rows, open.present, open.valueBytes);
    return sealed;
  }

  #start(columns: readonly string[], index: Map<string, number> | null, record: number): Open {
    const open: Open = {
      rows: 0,
      firstRecord: record,
      texts: [],
      cells: [],
      columns: index === null ? columns : [],
      index,
      bytes: 0,
      columnNameBytes: 0,
      present: 0,
      valueBytes: 0,
    };
    open.bytes = index === null ? HEAD + enc(JSON.stringify(columns)) + TAIL : this.#size(0, 0, 0, 0, 0);
    return open;
  }

  /** The body size if a row with `keys` (value texts of `valueBytes`) joined `open`. */
  #sizeWith(open: Open, keys: string[], valueBytes: number): number {
    let width = open.columns.length;
    let nameBytes = open.columnNameBytes;
    for (const key of keys) {
      if (!open.index!.has(key)) {
        width++;
        nameBytes += enc(JSON.stringify(key));
      }
    }
    return this.#size(width, nameBytes, open.rows + 1, open.present + keys.length, open.valueBytes + valueBytes);
  }

  /**
   * `{"columns":[n1,…],"data":[row,…]}` where each row is `[v1,…]` over every column, a
   * missing value written `null` (4 bytes): rows × (2 + commas + 4 × width) − 4 × present + value bytes.
   */
  #size(width: number, nameBytes: number, rows: number, present: number, valueBytes: number): number {
    const columns = 2 + nameBytes + Math.max(0, width - 1);
    const data = rows * (2 + Math.max(0, width - 1) + 4 * width) - 4 * present + valueBytes + Math.max(0, rows - 1);
    return HEAD + columns + data + TAIL;
  }
}

function tooLarge(record: number, size: number, max: number): InputError {
  return new InputError(`a package holding only this row would be ${size} bytes, over the package size of ${max}`, { where: `record ${record}` });
}
