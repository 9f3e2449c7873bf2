/**
 * The import graph of the project's TypeScript sources, read from the files (not from what
 * runs), for the tests that hold its shape: no cycle (unit/import-cycles.test.ts), every
 * import down or sideways through the layers (unit/import-layers.test.ts).
 */
import { readdir, readFile } from 'node:fs/promises';
import { dirname, join, relative, resolve } from 'node:path';

/** The package's root (this file runs from dist/test/support/). */
export const ROOT = resolve(import.meta.dirname, '../../..');

/** Relative module specifiers of `import … from '…'`, `export … from '…'` and `import '…'`. */
export const SPECIFIER = /^\s*(?:import|export)\b[^'";]*?(?:\bfrom\s*)?['"](\.{1,2}\/[^'"]+)['"]/gm;

async function sources(folder: string): Promise<string[]> {
  const entries = await readdir(join(ROOT, folder), { recursive: true, withFileTypes: true });
  return entries.filter((e) => e.isFile() && e.name.endsWith('.ts') && !e.name.endsWith('.d.ts')).map((e) => relative(ROOT, join(e.parentPath, e.name)));
}

/** file → the project files of `folders` it imports (`.js` specifiers name their `.ts` source), paths from the root. */
export async function importGraph(folders: readonly string[]): Promise<Map<string, string[]>> {
  const files = (await Promise.all(folders.map(sources))).flat();
  const known = new Set(files);
  const graph = new Map<string, string[]>();
  for (const file of files) {
    const text = await readFile(join(ROOT, file), 'utf8');
    const targets = [...text.matchAll(SPECIFIER)]
      .map((m) => relative(ROOT, resolve(ROOT, dirname(file), m[1]!)).replace(/\.js$/, '.ts'))
      .filter((target) => known.has(target));
    graph.set(file, [...new Set(targets)]);
  }
  return graph;
}
