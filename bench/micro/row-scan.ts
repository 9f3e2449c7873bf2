/**
 * Micro-benchmark of a validation worker's task on one thread: the pieces of a generated
 * body (the bench's own bodies, cut as the service cuts them) through `processRows`, with
 * the byte-level row scanner and without it (`JSON.parse` + typia + transcoding, the
 * reference path), against the bare `JSON.parse` of the same pieces as strings (the
 * ceiling's work). CPU ms per MB of each, in one process, interleaved round by round so a
 * change in the machine's speed hits all of them alike. Then the copies the scanner removed
 * or added, each alone on the same pieces: the Latin-1 string the reference path parses, the
 * copy of each batch out of the worker's scratch buffer (before: a fresh ArrayBuffer per
 * batch), and the one bulk copy of a piece into its line buffer (now).
 *
 *   node dist/bench/micro/row-scan.js [--entity products] [--mib 32] [--rounds 5] [--order catalog|reversed]
 *
 * Forked by the driver, it also sends its result over IPC.
 */
import { Buffer } from 'node:buffer';
import { parseArgs } from 'node:util';
import { findEntity } from '../../src/entities/catalog.js';
import { DEFAULT_BATCH_BYTES, DEFAULT_PIECE_BYTES } from '../../src/validation-pool/pool.js';
import { Mode, processRows, type RowsTask } from '../../src/validation/index.js';
import { generateBody } from '../bodies.js';

export interface RowScanFigure {
  case: string;
  /** CPU time (this thread's process, user + system) per MB of `data`, median of the rounds. */
  cpuMsPerMb: number;
  mbPerSec: number;
}

export interface RowScanResult {
  entity: string;
  order: string;
  bytes: number;
  rows: number;
  pieces: number;
  rounds: number;
  figures: RowScanFigure[];
}

/** The body's `data` elements cut at `],[` after every `pieceBytes`, as the cutter does (no wrong cuts in these bodies' strings at that spot). */
function cut(data: Buffer, pieceBytes: number): Buffer[] {
  const pieces: Buffer[] = [];
  let at = 0;
  while (at < data.length) {
    let end = data.indexOf('],[', Math.min(at + pieceBytes, data.length));
    end = end < 0 ? data.length : end + 1;
    pieces.push(Buffer.from(data.subarray(at, end)));
    at = end + 1;
  }
  return pieces;
}

function reverseBody(json: Buffer): Buffer {
  const body = JSON.parse(json.toString('utf8')) as { columns: string[]; data: unknown[][] };
  return Buffer.from(JSON.stringify({ columns: [...body.columns].reverse(), data: body.data.map((r) => [...r].reverse()) }));
}

export function runRowScan(entityName = 'products', mib = 32, rounds = 5, order: 'catalog' | 'reversed' = 'catalog'): RowScanResult {
  const entity = findEntity(entityName);
  if (!entity) throw new Error(`unknown entity ${entityName}`);
  let { json, rows } = generateBody(entity, mib * 1024 * 1024);
  if (order === 'reversed') json = reverseBody(json);
  const columns = (JSON.parse(json.subarray(0, json.indexOf('"data"') - 1).toString('utf8') + '}') as { columns: string[] }).columns;
  const start = json.indexOf('[', json.indexOf('"data"')) + 1;
  const end = json.lastIndexOf(']');
  const pieces = cut(json.subarray(start, end), DEFAULT_PIECE_BYTES);
  const strings = pieces.map((p) => `[${p.toString('utf8')}]`);
  const outs = pieces.map((p) => new ArrayBuffer(p.length + 64 * 1024));
  const task = (k: number): RowsTask => ({
    kind: 'rows',
    entity: entity.name,
    columns,
    mode: Mode.validate,
    out: outs[k]!,
    describe: 100,
    parts: [pieces[k]!.buffer.slice(pieces[k]!.byteOffset, pieces[k]!.byteOffset + pieces[k]!.length) as ArrayBuffer],
    ranges: [0, pieces[k]!.length],
    state: null,
    first: k === 0,
    last: false,
    batchBytes: DEFAULT_BATCH_BYTES,
  });
  const tasks = pieces.map((_, k) => task(k));
  // The same bytes under columns that swap `unit` and `price` (catalog order only): every
  // row with a unit is refused (`price` gets "pcs"), the cost of a bad package of this size.
  const swapped = columns.map((c) => (c === 'unit' ? 'price' : c === 'price' ? 'unit' : c));
  // As the sink sends them: the first piece describes up to 100 refused rows, the later ones none (the list is full).
  const badTasks = order === 'catalog' && columns.includes('price') && columns.includes('unit') ? pieces.map((_, k) => ({ ...task(k), columns: swapped, describe: k === 0 ? 100 : 0 })) : [];
  const mb = (end - start) / 1e6;
  const cases: [string, () => void][] = [
    ['JSON.parse of the pieces as strings (the ceiling\'s work)', () => {
      for (const s of strings) if (!Array.isArray(JSON.parse(s))) throw new Error('not a list');
    }],
    ['reference path: JSON.parse + typia + transcoding', () => {
      for (const t of tasks) if (processRows(t, false).bytes === 0) throw new Error('no lines');
    }],
    ['row scanner: one pass, lines from the bytes', () => {
      for (const t of tasks) {
        const r = processRows(t, true);
        if (!r.scanned || r.bytes === 0) throw new Error('the scanner declined');
      }
    }],
    ...(badTasks.length
      ? ([
          ['row scanner, a bad package: nearly every row refused (all counted, the first 100 described)', () => {
            for (const t of badTasks) {
              const r = processRows(t, true);
              if (!r.scanned || r.errorCount === 0) throw new Error('expected refused rows');
            }
          }],
        ] as [string, () => void][])
      : []),
    ['copy removed: the Latin-1 text of each piece (reference path)', () => {
      for (const p of pieces) if (p.toString('latin1').length !== p.length) throw new Error('length');
    }],
    ['copy removed: each 512 KiB batch sliced out of the scratch buffer', () => {
      for (const p of pieces) {
        // Uint8Array's slice (a copy into a new ArrayBuffer), not Buffer's (a view).
        for (let at = 0; at < p.length; at += DEFAULT_BATCH_BYTES) if (Uint8Array.prototype.slice.call(p, at, at + DEFAULT_BATCH_BYTES).byteLength === 0) throw new Error('empty');
      }
    }],
    ['copy added: the piece into its line buffer, in one set', () => {
      for (const [k, p] of pieces.entries()) new Uint8Array(outs[k]!).set(p);
    }],
  ];
  const times: number[][] = cases.map(() => []);
  for (let round = 0; round <= rounds; round++) {
    for (const [k, [, fn]] of cases.entries()) {
      const before = process.cpuUsage();
      fn();
      const used = process.cpuUsage(before);
      if (round > 0) times[k]!.push((used.user + used.system) / 1000);
    }
  }
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  return {
    entity: entity.name,
    order,
    bytes: end - start,
    rows,
    pieces: pieces.length,
    rounds,
    figures: cases.map(([name], k) => {
      const ms = median(times[k]!);
      return { case: name, cpuMsPerMb: ms / mb, mbPerSec: mb / (ms / 1000) };
    }),
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: { entity: { type: 'string', default: 'products' }, mib: { type: 'string', default: '32' }, rounds: { type: 'string', default: '5' }, order: { type: 'string', default: 'catalog' } },
  });
  const result = runRowScan(values.entity, Number(values.mib), Number(values.rounds), values.order === 'reversed' ? 'reversed' : 'catalog');
  if (process.send) process.send({ type: 'result', result });
  else {
    console.log(`${result.entity} (${result.order} order): ${(result.bytes / 1e6).toFixed(1)} MB, ${result.rows} rows, ${result.pieces} pieces, median of ${result.rounds} rounds`);
    for (const f of result.figures) console.log(`  ${f.case}: ${f.cpuMsPerMb.toFixed(2)} ms CPU per MB (${f.mbPerSec.toFixed(0)} MB/s)`);
  }
}
