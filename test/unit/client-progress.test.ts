/** Push progress for people: a bar redrawn in place on a terminal, plain lines elsewhere, nothing with --quiet. */
import t from 'tap';
import { ApiError } from '../../src/client/errors.js';
import { fmtCount, fmtDuration, PushProgress } from '../../src/client/progress.js';

function sink() {
  const out = { text: '', columns: 200, write: (s: string) => (out.text += s) };
  return out;
}

const failure = { package: 2, first_record: 201, rows: 100, record: 250, code: 'API_ERROR', status: 422, detail: 'x', message: 'Invalid data types in payload: row 49' };

t.test('plain: one line per accepted package, retry and failure, with rows, MB/s and ETA', async (t) => {
  const clock = { now: 0 };
  const out = sink();
  const p = new PushProgress(out, 'plain', 'f.csv', 10_000_000, () => clock.now);
  p.onEvent({ type: 'sent', index: 0, rows: 100, bytes: 2_000_000 });
  clock.now = 1000;
  p.onEvent({ type: 'accepted', index: 0, rows: 100, bytes: 2_000_000, sourceBytes: 2_500_000, replayed: false });
  p.onEvent({ type: 'retry', index: 1, retry: 1, delayMs: 1100, error: new ApiError(503, { detail: 'Rate limit exceeded' }, 1) });
  p.onEvent({ type: 'accepted', index: 1, rows: 50, bytes: 1, sourceBytes: 0, replayed: true });
  p.onEvent({ type: 'failed', index: 2, failure });
  p.finish();
  t.equal(
    out.text,
    [
      'package 0 accepted: 100 rows (100 rows, 2.5 of 10.0 MB of the file · 2.5 MB/s · ETA 0:03)',
      'package 1: 503 Rate limit exceeded; retry 1 in 1.1 s',
      'package 1 already stored: 50 rows (150 rows, 2.5 of 10.0 MB of the file · 2.5 MB/s · ETA 0:03)',
      'package 2 failed: 422 Invalid data types in payload: row 49 (file record 250)',
      '',
    ].join('\n'),
  );
});

t.test('bar: redrawn in place; other lines above it; a fresh line at the end', async (t) => {
  const clock = { now: 0 };
  const out = sink();
  const p = new PushProgress(out, 'bar', 'f.csv', 4_000_000, () => clock.now);
  p.onEvent({ type: 'sent', index: 0, rows: 10, bytes: 1 });
  clock.now = 2000;
  p.onEvent({ type: 'accepted', index: 0, rows: 1234, bytes: 1, sourceBytes: 1_000_000, replayed: false });
  p.finish();
  t.match(out.text, /^\r\x1b\[2Kf\.csv █{6}░{18}  25% 1,234 rows · 1\.0 of 4\.0 MB of the file · 0\.5 MB\/s · ETA 0:06\n$/);
  const quiet = sink();
  const q = new PushProgress(quiet, 'none', 'f.csv', 1);
  q.onEvent({ type: 'sent', index: 0, rows: 1, bytes: 1 });
  q.onEvent({ type: 'failed', index: 0, failure });
  q.finish();
  t.equal(quiet.text, '');
});

t.test('counts: the singular for exactly one', async (t) => {
  t.same([0, 1, 2, 1234].map((n) => fmtCount(n, 'row')), ['0 rows', '1 row', '2 rows', '1,234 rows']);
  t.equal(fmtCount(1, 'retry', 'retries'), '1 retry');
  t.equal(fmtCount(3, 'retry', 'retries'), '3 retries');
  const out = sink();
  const p = new PushProgress(out, 'plain', 'f.csv', 10, () => 0);
  p.onEvent({ type: 'accepted', index: 0, rows: 1, bytes: 10, sourceBytes: 10, replayed: false });
  t.match(out.text, /^package 0 accepted: 1 row \(1 row, /);
});

t.test('durations', async (t) => {
  t.same([0, 59.4, 61, 3600 + 62].map(fmtDuration), ['0:00', '0:59', '1:01', '1:01:02']);
});
