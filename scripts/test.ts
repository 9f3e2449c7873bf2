/**
 * `npm test`: the whole suite on the defaults (uWS edge where it loads, the embedded back
 * end), then the end-to-end suites of each cell of the matrix (test/matrix.ts) with its
 * parameter. Each run is one `tap` with the same flags; a failing run does not stop the
 * others, and the exit code is non-zero when any failed. Arguments are passed to every
 * `tap` (e.g. `npm test -- --jobs=1`).
 */
import { spawnSync } from 'node:child_process';
import { join, resolve } from 'node:path';
import { MATRIX, TAP_FLAGS } from '../test/matrix.js';

/** The package's root (this file runs from dist/scripts/). */
const ROOT = resolve(import.meta.dirname, '../..');
const tapBin = join(ROOT, 'node_modules/.bin/tap');
const extra = process.argv.slice(2);

const runs = [
  { name: 'the whole suite', env: {}, files: ['dist/test/**/*.test.js'] },
  ...MATRIX.map((cell) => ({ name: `the e2e suites on ${cell.name}`, env: cell.env, files: cell.files.map((f) => `dist/test/e2e/${f}.test.js`) })),
];

const failed: string[] = [];
for (const run of runs) {
  const vars = Object.entries(run.env).map(([k, v]) => `${k}=${v} `).join('');
  console.log(`\n=== ${vars}${run.name} ===`);
  const res = spawnSync(tapBin, [...TAP_FLAGS, ...extra, ...run.files], { cwd: ROOT, stdio: 'inherit', env: { ...process.env, ...run.env } });
  if (res.status !== 0) failed.push(`${run.name} (${res.signal ?? `exit ${res.status}`})`);
}
console.log(failed.length === 0 ? `\n=== every run passed (${runs.length}) ===` : `\n=== failed: ${failed.join('; ')} ===`);
process.exit(failed.length === 0 ? 0 : 1);
