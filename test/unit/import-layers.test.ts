/**
 * Every import of the service's code goes down the layers of `LAYERS`, or sideways within
 * one: no module imports one of a layer above its own, so a layer can be read and changed
 * with only the layers beneath it in mind. A folder with a public surface (`SURFACES`) is
 * entered through its index.ts only. Read from the TypeScript sources
 * (support/import-graph.ts), type-only imports included, so it fails on a new import that
 * runs back up before anything runs. A new folder or top-level file must be given a layer.
 */
import t from 'tap';
import { importGraph } from '../support/import-graph.js';

const FOLDERS = ['src', 'scripts', 'testbed'];

/** A layer: its name and the files it holds (a file, or a folder ending in `/`; the longest match decides). */
type Layer = readonly [name: string, paths: readonly string[]];

/** Bottom to top. */
const LAYERS: readonly Layer[] = [
  ['foundation', ['src/errors.ts', 'src/log.ts', 'src/durable-file.ts', 'src/bounded-body.ts', 'src/stop-signals.ts', 'src/deadline.ts', 'src/config/']],
  ['entities', ['src/entities/']],
  ['validation: bytes → checked rows → stored lines', ['src/validation/']],
  ['store: ports, adapters, key layout, object format', ['src/store/']],
  ['validation pool', ['src/validation-pool/']],
  ['connector', ['src/connector/']],
  ['session: the use cases', ['src/session/']],
  ['uploader', ['src/uploader/']],
  ['observability', ['src/observability/']],
  ['HTTP edge', ['src/http/']],
  ['API handlers', ['src/api/']],
  ['client library, reverse proxy', ['src/client/', 'src/proxy/']],
  ['entry points', ['src/app.ts', 'src/main.ts', 'src/uploader/main.ts', 'src/cli/', 'scripts/', 'testbed/']],
];

/** Folders that the rest of the code enters through their index.ts only. */
const SURFACES = ['src/validation/', 'src/validation-pool/'];

const matches = (file: string, path: string) => (path.endsWith('/') ? file.startsWith(path) : file === path);

/** The index in `layers` of the layer holding `file`, or -1. */
function layerOf(file: string, layers: readonly Layer[]): number {
  let found = -1;
  let longest = -1;
  layers.forEach(([, paths], i) => {
    for (const path of paths) {
      if (matches(file, path) && path.length > longest) {
        found = i;
        longest = path.length;
      }
    }
  });
  return found;
}

/** Files of the graph no layer holds. */
function unplaced(graph: Map<string, string[]>, layers: readonly Layer[]): string[] {
  return [...graph.keys()].filter((file) => layerOf(file, layers) < 0).sort();
}

/** Each import into a higher layer, as `from (its layer) → to (its layer)`. */
function upward(graph: Map<string, string[]>, layers: readonly Layer[]): string[] {
  const out: string[] = [];
  for (const [from, targets] of graph) {
    const at = layerOf(from, layers);
    for (const to of targets) {
      const above = layerOf(to, layers);
      if (at >= 0 && above > at) out.push(`${from} (${layers[at]![0]}) → ${to} (${layers[above]![0]})`);
    }
  }
  return out.sort();
}

/** Each import from outside a surface folder into a file of it other than its index.ts. */
function pastSurface(graph: Map<string, string[]>, surfaces: readonly string[]): string[] {
  const out: string[] = [];
  for (const [from, targets] of graph) {
    for (const to of targets) {
      const folder = surfaces.find((f) => to.startsWith(f));
      if (folder !== undefined && !from.startsWith(folder) && to !== `${folder}index.ts`) out.push(`${from} → ${to}`);
    }
  }
  return out.sort();
}

t.test('the checks find an import that runs up, one past a surface, and a file without a layer', async (t) => {
  const layers: Layer[] = [
    ['low', ['a/']],
    ['mid', ['b/', 'a/top.ts']],
    ['high', ['c/']],
  ];
  const g = new Map([
    ['a/x.ts', ['a/y.ts']],
    ['a/y.ts', ['b/index.ts']],
    ['a/top.ts', ['b/index.ts', 'a/x.ts']],
    ['b/index.ts', ['b/inner.ts', 'a/x.ts']],
    ['b/inner.ts', []],
    ['c/z.ts', ['b/inner.ts', 'a/x.ts']],
    ['d/lost.ts', []],
  ]);
  t.same(upward(g, layers), ['a/y.ts (low) → b/index.ts (mid)'], 'down and sideways pass; the longest path places a/top.ts');
  t.same(pastSurface(g, ['b/']), ['c/z.ts → b/inner.ts'], 'inside the folder, and through index.ts, pass');
  t.same(unplaced(g, layers), ['d/lost.ts']);
});

t.test('the import graph of src/, scripts/ and testbed/', async (t) => {
  const graph = await importGraph(FOLDERS);
  t.ok(graph.size > 100, `${graph.size} files read`);

  t.test('every file has a layer', async (t) => {
    t.same(unplaced(graph, LAYERS), [], 'a file listed here needs its place in LAYERS');
  });

  t.test('every path of LAYERS and SURFACES names files that exist', async (t) => {
    const files = [...graph.keys()];
    const stale = [...LAYERS.flatMap(([, paths]) => paths), ...SURFACES].filter((path) => !files.some((f) => matches(f, path)));
    t.same(stale, []);
    for (const folder of SURFACES) t.ok(graph.has(`${folder}index.ts`), `${folder}index.ts exists`);
  });

  t.test('no import runs up the layers', async (t) => {
    t.same(upward(graph, LAYERS), [], 'each import listed here goes from a lower layer to a higher one');
  });

  t.test('validation/ and validation-pool/ are entered through their index.ts only', async (t) => {
    t.same(pastSurface(graph, SURFACES), [], "each import listed here goes past the folder's index.ts");
  });
});
