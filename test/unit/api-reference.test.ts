/**
 * docs/api-reference.md is the OpenAPI document the service serves, rendered
 * (scripts/api-reference.ts): it fails while the committed page differs from a fresh
 * rendering, so a change to the interface cannot leave its reference behind.
 */
import { readFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { API_REFERENCE, renderApiReference } from '../../scripts/api-reference.js';
import { openApiDocument } from '../../src/api/openapi.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');
type Json = Record<string, any>;

t.test('the committed API reference is the rendering of the served document', async (t) => {
  const committed = await readFile(join(ROOT, API_REFERENCE), 'utf8');
  const fresh = renderApiReference();
  t.ok(committed === fresh, `${API_REFERENCE} is stale: run \`npm run docs:api\` and commit it`);
});

t.test('every operation, every response status and every schema has its place', async (t) => {
  const doc = openApiDocument() as Json;
  const page = renderApiReference(doc);
  const standard = page.slice(page.indexOf('\n## Standard answers\n'), page.indexOf('\n## Operations\n'));
  for (const [path, item] of Object.entries(doc.paths as Json)) {
    for (const [method, op] of Object.entries(item as Json)) {
      const at = page.indexOf(`\n### ${method.toUpperCase()} ${path}\n`);
      t.ok(at >= 0, `${method} ${path} has a section`);
      const section = page.slice(at, page.indexOf('\n### ', at + 1));
      const shared = /\n(?:Also|Answers) ([\d, ]+) as in \[Standard answers\]/.exec(section)?.[1]?.split(', ') ?? [];
      for (const status of Object.keys((op as Json).responses)) {
        // A row of its own, or named as one of the standard answers (each written once, at the top).
        if (shared.includes(status)) t.match(standard, new RegExp(`\\n\\| ${status} \\|`), `${method} ${path}: ${status} (standard)`);
        else t.match(section, new RegExp(`\\n\\| ${status} \\|`), `${method} ${path}: ${status}`);
      }
    }
  }
  for (const name of Object.keys(doc.components.schemas as Json)) t.match(page, `\n### ${name}\n`, `schema ${name}`);
});
