/** Ingest over real HTTP: `Content-Encoding`, and bodies streamed in many pieces. */
import { Buffer } from 'node:buffer';
import { gzipSync } from 'node:zlib';
import t from 'tap';
import { API, call, clientOf, products, startService, waitForStatus } from '../support/harness.js';

t.test('Content-Encoding: gzip is inflated, others are 415, the inflated bound is 413', async (t) => {
  const svc = await startService(t, { ingest: { maxDecompressedBytes: 64 * 1024, pieceBytes: 4096 } });
  const c = clientOf(svc);
  const uuid = (await c.init()).body.upload_uuid as string;
  const post = (raw: Buffer, encoding?: string) =>
    call(svc.url, 'POST', `${API}/${uuid}/products`, {
      raw,
      headers: { 'content-type': 'application/json', ...(encoding === undefined ? {} : { 'content-encoding': encoding }) },
    });
  const body = Buffer.from(JSON.stringify(products(500)));
  t.ok(body.length > 4096 * 3 && body.length < 64 * 1024);

  for (const encoding of ['gzip', 'GZip', 'x-gzip']) {
    const res = await post(gzipSync(body), encoding);
    t.same([res.status, res.body.rows_processed], [200, 500], encoding);
  }
  t.same((await post(body, 'identity')).body.rows_processed, 500, 'identity');
  t.same((await post(body)).body.rows_processed, 500, 'no header');

  for (const encoding of ['br', 'deflate', 'gzip, gzip', 'compress']) {
    const res = await post(gzipSync(body), encoding);
    t.same([res.status, res.body], [415, { detail: 'Unsupported Media Type' }], encoding);
  }
  const huge = await post(gzipSync(Buffer.from(JSON.stringify(products(5000)))), 'gzip');
  t.same([huge.status, huge.body], [413, { detail: 'Request body too large (limit 65536 bytes once inflated)' }], 'past maxDecompressedBytes (64 KiB: not a whole MiB, so in bytes)');
  const notGzip = await post(body, 'gzip');
  t.same([notGzip.status, notGzip.body], [422, { detail: 'Invalid JSON format.' }], 'not gzip');

  const bad = Buffer.from(JSON.stringify({ ...products(500), data: [...products(499).data, ['p-x', 'x', -1]] }));
  const refused = await post(bad);
  t.same(
    refused.body,
    {
      detail: 'Invalid data types in payload: row 499, column "price": expected number >= 0, got -1',
      errors: [{ row: 499, column: 'price', message: 'expected number >= 0, got -1' }],
      error_count: 1,
    },
    'the last row of a streamed body',
  );

  const status = await waitForStatus(svc, uuid, (s) => s.upload_tasks_finished);
  t.same(status.entities, ['products']);
});
