/**
 * No module imports itself through others: the import graph of the service's code (src/)
 * and of what tests and bench share (testbed/) has no cycle, type-only imports
 * included (a cycle of types is still two modules that cannot be understood apart).
 * Read from the TypeScript sources, so it fails on a new cycle before anything runs.
 */
import t from 'tap';
import { importGraph, SPECIFIER } from '../support/import-graph.js';

const FOLDERS = ['src', 'testbed'];

/** Strongly connected components of more than one file, or of one that imports itself (Tarjan). */
function cycles(graph: Map<string, string[]>): string[][] {
  let next = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const visit = (v: string): void => {
    index.set(v, next);
    low.set(v, next++);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) !== index.get(v)) return;
    const component: string[] = [];
    for (let w = stack.pop()!; ; w = stack.pop()!) {
      onStack.delete(w);
      component.push(w);
      if (w === v) break;
    }
    if (component.length > 1 || graph.get(v)!.includes(v)) found.push(component.sort());
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return found;
}

t.test('the cycle finder finds a cycle of three and a self-import, and nothing in a chain', async (t) => {
  const g = new Map([
    ['a', ['b']],
    ['b', ['c']],
    ['c', ['a', 'd']],
    ['d', ['e']],
    ['e', []],
    ['s', ['s']],
  ]);
  t.same(cycles(g), [['a', 'b', 'c'], ['s']]);
});

t.test('the import reader sees the forms the code uses', async (t) => {
  const text = [
    "import { a } from './a.js';",
    "import type { B } from '../b.js';",
    'import {\n  c,\n  type C,\n} from "./c.js";',
    "export { d } from './d.js';",
    "import './e.js';",
    "import { f } from 'node:fs';",
  ].join('\n');
  t.same([...text.matchAll(SPECIFIER)].map((m) => m[1]), ['./a.js', '../b.js', './c.js', './d.js', './e.js']);
});

t.test('no import cycle in src/ and testbed/', async (t) => {
  const graph = await importGraph(FOLDERS);
  t.ok(graph.size > 100, `${graph.size} files read`);
  t.ok([...graph.values()].reduce((n, targets) => n + targets.length, 0) > graph.size, 'their imports were read');
  t.same(cycles(graph), [], 'each cycle is listed with its files');
});
