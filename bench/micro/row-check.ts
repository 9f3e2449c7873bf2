/**
 * Micro-benchmark of one hot function: the row checker of `compileRowCheck`, on rows as
 * `JSON.parse` hands them over. Two cases: columns in catalog order (the typia tuple fast
 * path) and the same columns reversed (the column-by-column path).
 *
 *   node dist/bench/micro/row-check.js [--entity products] [--rows 100000] [--seconds 1]
 *
 * Forked by the driver, it also sends its result over IPC.
 */
import { parseArgs } from 'node:util';
import { performance } from 'node:perf_hooks';
import { findEntity, type EntitySpec } from '../../src/entities/catalog.js';
import { compileRowCheck } from '../../src/entities/validators.js';
import { rowMaker } from '../bodies.js';

export interface RowCheckFigure {
  case: string;
  rowsPerSec: number;
  nsPerRow: number;
  rounds: number;
}

export interface RowCheckResult {
  entity: string;
  rows: number;
  figures: RowCheckFigure[];
}

const MAX_ROUNDS = 10_000;

function measure(label: string, entity: EntitySpec, columns: string[], rows: unknown[][], seconds: number): RowCheckFigure {
  const check = compileRowCheck(entity, columns);
  for (let i = 0; i < rows.length; i++) if (check(rows[i]!, i) !== null) throw new Error(`${label}: row ${i} rejected: ${check(rows[i]!, i)}`);
  let rounds = 0;
  let checked = 0;
  const t0 = performance.now();
  while (rounds < MAX_ROUNDS && (rounds === 0 || performance.now() - t0 < seconds * 1000)) {
    for (let i = 0; i < rows.length; i++) if (check(rows[i]!, i) !== null) throw new Error('rejected');
    checked += rows.length;
    rounds++;
  }
  const ms = performance.now() - t0;
  return { case: label, rowsPerSec: checked / (ms / 1000), nsPerRow: (ms * 1e6) / checked, rounds };
}

function runRowCheck(entityName: string, count: number, seconds: number): RowCheckResult {
  const entity = findEntity(entityName);
  if (!entity) throw new Error(`unknown entity ${entityName}`);
  const make = rowMaker(entity, 7);
  // Through JSON, so the strings and numbers are shaped as a parser makes them.
  const rows = JSON.parse(JSON.stringify(Array.from({ length: count }, (_, i) => make(i)))) as unknown[][];
  const columns = entity.columns.map((c) => c.name);
  const reversed = [...columns].reverse();
  const reversedRows = rows.map((r) => [...r].reverse());
  return {
    entity: entity.name,
    rows: count,
    figures: [
      measure('catalog order (tuple path)', entity, columns, rows, seconds),
      measure('reversed columns (column path)', entity, reversed, reversedRows, seconds),
    ],
  };
}

const { values } = parseArgs({
  options: {
    entity: { type: 'string', default: 'products' },
    rows: { type: 'string', default: '100000' },
    seconds: { type: 'string', default: '1' },
  },
});
const result = runRowCheck(values.entity, Number(values.rows), Number(values.seconds));
if (process.send) {
  process.send({ type: 'result', result });
  process.disconnect();
} else {
  for (const f of result.figures) {
    console.log(`row-check ${result.entity} ${f.case}: ${(f.rowsPerSec / 1e6).toFixed(2)} M rows/s (${f.nsPerRow.toFixed(0)} ns/row, ${f.rounds} rounds)`);
  }
}
