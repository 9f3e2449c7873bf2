/**
 * `describeRefusedPackage` against a fake service that checks rows as the real one does (every
 * bad value an error, the first 100 listed in row then column order, all counted): every error
 * of a package found past the first 100, the row cut by the cap checked again, a row of more
 * than 100 errors, the bound on dry runs, a dry run that fails, and an abort.
 */
import t from 'tap';
import type { IngestClient } from '../../src/client/client.js';
import { ApiError, ClientError } from '../../src/client/errors.js';
import { describeRefusedPackage, type DescribeOptions } from '../../src/client/refused.js';
import type { SourceRow } from '../../src/client/sources.js';

type RowError = { row: number; column: string | null; message: string };

/** A value "bad" is refused; answers as the service: 422 with the first 100 errors and their count. */
function check(body: string): RowError[] {
  const { columns, data } = JSON.parse(body) as { columns: string[]; data: unknown[][] };
  const errors: RowError[] = [];
  data.forEach((row, r) => row.forEach((v, c) => v === 'bad' && errors.push({ row: r, column: columns[c]!, message: `got ${JSON.stringify(v)}` })));
  return errors;
}

function fakeClient(opts: { fail?: (n: number) => Error | null } = {}) {
  const bodies: string[] = [];
  const client = {
    async ingestWithRetry(_uuid: string, _entity: string, body: string, o: { dryRun?: boolean }) {
      if (!o.dryRun) throw new Error('not a dry run');
      bodies.push(body);
      const failure = opts.fail?.(bodies.length);
      if (failure) throw failure;
      const errors = check(body);
      if (errors.length === 0) return { status: 'success', message: '', rows_processed: JSON.parse(body).data.length, replayed: false };
      throw new ApiError(422, { detail: 'Invalid data types in payload', errors: errors.slice(0, 100), error_count: errors.length }, null);
    },
  };
  return { client: client as unknown as IngestClient, bodies };
}

const arrayRows = (values: unknown[][], columns = values[0]!.map((_, i) => `c${i}`)): SourceRow[] =>
  values.map((v, i) => ({ kind: 'array', columns, json: JSON.stringify(v), record: 11 + i }));

/** What the package's own 422 says: the first 100 errors, and all counted. */
function first(rows: SourceRow[]): Pick<DescribeOptions, 'listed' | 'errorCount'> {
  const columns = rows[0]!.kind === 'array' ? rows[0]!.columns : [];
  const errors = check(JSON.stringify({ columns, data: rows.map((r) => (r.kind === 'array' ? JSON.parse(r.json) : [])) }));
  return { listed: errors.slice(0, 100), errorCount: errors.length };
}

function expectedByRow(rows: SourceRow[]): Map<number, { column: string | null; message: string }[]> {
  const out = new Map<number, { column: string | null; message: string }[]>();
  rows.forEach((r, i) => {
    if (r.kind !== 'array') return;
    const columns = r.columns;
    const problems = (JSON.parse(r.json) as unknown[]).flatMap((v, c) => (v === 'bad' ? [{ column: columns[c]!, message: '"bad"'.replace(/^/, 'got ') }] : []));
    if (problems.length) out.set(i, problems);
  });
  return out;
}

t.test('every error of a package, past the first 100; the row the cap cut is checked again; clean rows cost nothing more', async (t) => {
  // 5000 rows: one bad value each in rows 0–998, two in row 99 (the cap cuts inside it), a
  // stretch of clean rows, then 300 bad rows at the end.
  const values = Array.from({ length: 5000 }, (_, i) => [i < 999 || i >= 4700 ? 'bad' : 'ok', i === 99 ? 'bad' : 'ok', 'ok']);
  const rows = arrayRows(values);
  const { client, bodies } = fakeClient();
  const budget = { max: 1000, used: 0 };
  const out = await describeRefusedPackage({ client, uploadUuid: 'u', entity: 'e', rows, ...first(rows), budget });
  t.same(out.byRow, expectedByRow(rows), 'every row with every error, by its index in the package');
  t.equal(out.described, 999 + 1 + 300);
  t.equal(out.unchecked, null);
  t.equal(out.checks, bodies.length);
  t.equal(budget.used, bodies.length, 'the budget counts the dry runs');
  t.ok(bodies.length <= 16, `${bodies.length} dry runs for the ${out.described - 100} errors past the first 100`);
  const sent = bodies.reduce((sum, b) => sum + (JSON.parse(b) as { data: unknown[] }).data.length, 0);
  t.ok(sent <= 1.25 * rows.length, `${sent} rows sent again for a package of ${rows.length}: about once each`);
  t.same(JSON.parse(bodies[0]!).data[0], values[99], 'the first dry run starts at the row the cap cut');
});

t.test('object rows are checked with the package’s columns, a key missing from a whole window too', async (t) => {
  const rows: SourceRow[] = Array.from({ length: 300 }, (_, i) => ({ kind: 'object', value: i === 0 ? { a: 'bad', b: 'ok' } : { a: 'bad' }, record: i + 1 }));
  const { client, bodies } = fakeClient();
  const listed = Array.from({ length: 100 }, (_, i) => ({ row: i, column: 'a', message: 'got "bad"' }));
  const out = await describeRefusedPackage({ client, uploadUuid: 'u', entity: 'e', rows, listed, errorCount: 300, budget: { max: 10, used: 0 } });
  t.equal(out.described, 300);
  for (const body of bodies) t.same(JSON.parse(body).columns, ['a', 'b'], 'every window has the package’s columns');
  t.ok(bodies.every((b) => (JSON.parse(b) as { data: unknown[][] }).data.every((r) => r.length === 2 && r[1] === null)), 'a missing key sent as null');
});

t.test('a row of more than 100 errors: described as far as the cap, and the checks move on', async (t) => {
  const wide = Array.from({ length: 150 }, () => 'bad');
  const rows = arrayRows([wide, wide.map(() => 'ok'), wide]);
  const { client } = fakeClient();
  const out = await describeRefusedPackage({ client, uploadUuid: 'u', entity: 'e', rows, ...first(rows), budget: { max: 10, used: 0 } });
  t.equal(out.byRow.get(0)?.length, 100, 'the first row: the 100 listed');
  t.equal(out.byRow.get(2)?.length, 100, 'the last: the 100 its own check listed');
  t.equal(out.byRow.has(1), false);
  t.equal(out.unchecked, null);
});

t.test('bounded: the budget of a push runs out, or a dry run fails, and the rows left are named unchecked; an abort is thrown', async (t) => {
  const rows = arrayRows(Array.from({ length: 1000 }, () => ['bad']));
  const budget = { max: 3, used: 1 };
  const out = await describeRefusedPackage({ client: fakeClient().client, uploadUuid: 'u', entity: 'e', rows, ...first(rows), budget });
  t.equal(out.checks, 2, 'what was left of the budget');
  t.equal(budget.used, 3);
  // The package's 422 described rows 0–98 (row 99 is checked again); each dry run 100 more.
  t.equal(out.described, 299);
  t.match(out.unchecked, { from: 299, reason: /at most 3 dry runs to find errors/ });
  t.same([...out.byRow.keys()], Array.from({ length: 299 }, (_, i) => i), 'the rows before it described');

  const failing = fakeClient({ fail: (n) => (n === 2 ? new ApiError(503, { detail: 'Rate limit exceeded' }, 1) : null) });
  const failed = await describeRefusedPackage({ client: failing.client, uploadUuid: 'u', entity: 'e', rows, ...first(rows), budget: { max: 10, used: 0 } });
  t.match(failed.unchecked, { from: 199, reason: /the dry run of these rows failed: 503 Rate limit exceeded/ });
  t.equal(failed.described, 199, 'the rows before the failed check');

  const aborted = fakeClient({ fail: () => new ClientError('ABORTED', 'aborted') });
  await t.rejects(describeRefusedPackage({ client: aborted.client, uploadUuid: 'u', entity: 'e', rows, ...first(rows), budget: { max: 10, used: 0 } }), { code: 'ABORTED' });
});
