/**
 * The docs page in a real headless Chromium (Debian's `chromium`, driven by playwright-core):
 * it loads without console errors and without a request to any host but the service, lists
 * every operation of the document, and renders the ingest request schema.
 *
 * `DOCS_SCREENSHOT_DIR=<dir>` keeps the screenshots (else they go to a temp dir that is removed).
 */
import { stat } from 'node:fs/promises';
import { join } from 'node:path';
import { chromium, type Page } from 'playwright-core';
import t from 'tap';
import { openApiDocument } from '../../src/api/openapi.js';
import { startService, tempDir } from '../support/harness.js';
import { chromiumPath, installHint } from '../../testbed/prerequisites.js';

const CHROMIUM = chromiumPath();
const ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

const LOOPBACK = new Set(['127.0.0.1', 'localhost', '[::1]']);

/** Loopback HTTP, or a URL that never leaves the browser (`data:`, `blob:`, `about:`). */
function staysLocal(url: string): boolean {
  const { protocol, hostname } = new URL(url);
  if (protocol === 'data:' || protocol === 'blob:' || protocol === 'about:') return true;
  return (protocol === 'http:' || protocol === 'https:') && LOOPBACK.has(hostname);
}

type Json = Record<string, any>;
const doc = openApiDocument() as Json;
const operations = Object.entries(doc.paths as Json).flatMap(([path, item]) =>
  Object.entries(item as Json).map(([method, op]) => ({ path, method, op: op as Json })),
);

/** Swagger UI's element id of an operation: `operations-<first tag>-<operationId>`. */
const opblock = (page: Page, tag: string, operationId: string) => page.locator(`#operations-${tag}-${operationId}`);

t.test('the docs page in headless Chromium', async (t) => {
  if (CHROMIUM === null) {
    t.fail(installHint(['chromium'])); // `npm test` installs it first where it can
    return;
  }
  const svc = await startService(t, { metrics: { enabled: true } }); // every operation of openapi.ts is served
  const shots = process.env.DOCS_SCREENSHOT_DIR ?? (await tempDir(t, 'docs-page-'));

  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ARGS, timeout: 60_000 });
  t.teardown(() => browser.close());
  const context = await browser.newContext({ viewport: { width: 1280, height: 1000 }, serviceWorkers: 'block' });
  t.teardown(() => context.close());

  // Every request the page makes is recorded; one that would leave loopback is recorded and
  // aborted, so the test never depends on (or reaches) the internet.
  const requests: string[] = [];
  const offHost: string[] = [];
  await context.route('**/*', (route) => {
    const url = route.request().url();
    requests.push(url);
    if (staysLocal(url)) return route.continue();
    offHost.push(url);
    return route.abort('blockedbyclient');
  });
  const page = await context.newPage();
  const consoleErrors: string[] = [];
  const pageErrors: string[] = [];
  const failed: string[] = [];
  const badStatus: string[] = [];
  page.on('console', (m) => {
    if (m.type() === 'error') consoleErrors.push(`${m.text()} @ ${m.location().url}`);
    else if (m.type() === 'warning') t.comment(`console warning: ${m.text()}`);
  });
  page.on('pageerror', (err) => pageErrors.push(err.message));
  page.on('requestfailed', (r) => failed.push(`${r.url()}: ${r.failure()?.errorText}`));
  page.on('response', (r) => {
    if (r.status() >= 400) badStatus.push(`${r.status()} ${r.url()}`);
  });

  const loaded = await page.goto(`${svc.url}/docs`, { waitUntil: 'load' });
  t.equal(loaded?.status(), 200);
  t.equal(await page.title(), 'Batch ingest gateway · API');

  await t.test('lists every operation of the document', async (t) => {
    await page.locator('.swagger-ui .info .title').waitFor({ timeout: 20_000 });
    t.match(await page.locator('.swagger-ui .info .title').innerText(), doc.info.title);
    t.match(await page.locator('.swagger-ui .info .title').innerText(), '0.1.0', 'version badge');
    t.match(await page.locator('.swagger-ui .info .title').innerText(), 'OAS 3.1', 'OpenAPI badge');
    await page.locator('.opblock').first().waitFor({ timeout: 20_000 });
    t.equal(await page.locator('.opblock').count(), operations.length, 'one block per operation');
    for (const { path, method, op } of operations) {
      const block = opblock(page, op.tags[0], op.operationId);
      await block.waitFor({ timeout: 5_000 });
      t.ok(await block.isVisible(), `${method} ${path} shown`);
      t.equal((await block.locator('.opblock-summary-method').innerText()).toLowerCase(), method, `${path} method`);
      t.equal(await block.locator('.opblock-summary-path').getAttribute('data-path'), path, `${op.operationId} path`);
      t.equal((await block.locator('.opblock-summary-description').innerText()).trim(), op.summary, `${op.operationId} summary`);
    }
    await page.screenshot({ path: join(shots, 'docs-overview.png'), fullPage: true });
  });

  await t.test('renders the ingest request schema', async (t) => {
    const ingest = opblock(page, 'uploading', 'uploadEntity');
    await ingest.locator('.opblock-summary-control').click();
    const body = ingest.locator('.opblock-body');
    await body.waitFor({ timeout: 5_000 });
    t.match(await body.locator('.opblock-description-wrapper').first().innerText(), 'receipt_lines', 'the catalog table');
    for (const name of ['upload_uuid', 'entity_name', 'Content-Encoding', 'Idempotency-Key']) {
      t.ok(await body.locator(`tr[data-param-name="${name}"]`).isVisible(), `parameter ${name}`);
    }

    await body.locator('.opblock-section-request-body button[data-name="model"]').click();
    const model = body.locator('.opblock-section-request-body .model-box');
    await model.waitFor({ timeout: 5_000 });
    await model.scrollIntoViewIfNeeded();
    // Swagger UI renders OpenAPI 3.1 schemas with its JSON Schema 2020-12 components.
    const title = model.locator('article[data-json-schema-level="0"] > .json-schema-2020-12-head .json-schema-2020-12__title');
    t.equal((await title.innerText()).trim(), 'IngestRequest', 'the schema by name');
    const properties = model.locator('article[data-json-schema-level="1"]');
    const shown = await properties.evaluateAll((articles) =>
      articles.map((article) => ({
        name: article.querySelector(':scope > .json-schema-2020-12-head .json-schema-2020-12__title')?.textContent?.trim(),
        type: article.querySelector(':scope > .json-schema-2020-12-head .json-schema-2020-12__attribute--primary')?.textContent?.trim(),
        required: article.parentElement?.classList.contains('json-schema-2020-12-property--required'),
      })),
    );
    t.same(shown, [
      { name: 'columns', type: 'array<string>', required: true },
      { name: 'data', type: 'array<array<(null | string | number | boolean)>>', required: true },
    ]);
    for (const name of ['columns', 'data']) {
      t.ok(await model.getByText(name, { exact: true }).first().isVisible(), `property ${name} visible`);
    }
    t.match(await model.innerText(), '≥ 1 items', 'columns: at least one');

    for (const status of ['200', '409', '413', '415', '422', '503']) {
      t.ok(await body.locator(`tr.response[data-code="${status}"]`).isVisible(), `response ${status} listed`);
    }
    await body.locator('.opblock-section-request-body').screenshot({ path: join(shots, 'docs-ingest-schema.png') });
    await ingest.screenshot({ path: join(shots, 'docs-ingest.png') });
    const size = (await stat(join(shots, 'docs-ingest.png'))).size;
    t.ok(size > 10_000, `screenshot written (${size} bytes)`);
    t.comment(`screenshots in ${shots}`);
  });

  await t.test('the schemas section names the body types', async (t) => {
    const models = page.locator('section.models');
    await models.scrollIntoViewIfNeeded();
    const titles = (await models.locator('.json-schema-2020-12__title').allInnerTexts()).map((s) => s.trim());
    t.same(titles, Object.keys(doc.components.schemas), 'every component schema, in order');
    for (const name of ['IngestRequest', 'InitializeSessionConflict', 'InvalidSessionStatusError', 'ValidationError']) {
      t.ok(await models.locator('.json-schema-2020-12__title', { hasText: new RegExp(`^${name}$`) }).isVisible(), name);
    }
  });

  t.same(offHost, [], 'no request to a host other than the service');
  t.ok(requests.length > 0);
  t.ok(requests.every(staysLocal));
  t.ok(requests.some((u) => new URL(u).pathname === '/openapi.json'), 'the page loaded /openapi.json');
  t.ok(requests.some((u) => new URL(u).pathname === '/docs/swagger-ui-bundle.js'), 'the bundle came from the service');
  t.same(consoleErrors, [], 'no console errors');
  t.same(pageErrors, [], 'no uncaught page errors');
  t.same(failed, [], 'no failed requests');
  t.same(badStatus, [], 'no error statuses');
});
