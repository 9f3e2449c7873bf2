/**
 * Readiness: a check still out past one probe's deadline is waited for again by the next
 * probe, not started anew (a hung disk would otherwise hold one more of libuv's threads per
 * probe); once it ends, the next probe starts it again.
 */
import t from 'tap';
import { silentLogger } from '../../src/log.js';
import { Readiness } from '../../src/observability/readiness.js';

t.test('a check still out is not started again; after it ends, it is', async (t) => {
  let calls = 0;
  let finish!: () => void;
  const readiness = new Readiness(
    {
      disk: () => {
        calls++;
        return calls === 1 ? new Promise<void>((resolve) => (finish = resolve)) : Promise.resolve();
      },
    },
    20,
    silentLogger,
  );
  t.same(await readiness.run(), { ready: false, checks: { disk: 'timeout' } }, 'the first probe: timeout');
  t.same(await readiness.run(), { ready: false, checks: { disk: 'timeout' } }, 'the second probe: timeout too');
  t.equal(calls, 1, 'the check was started once');
  finish();
  t.same(await readiness.run(), { ready: true, checks: { disk: 'ok' } }, 'the hung check ended: ok');
  t.same(await readiness.run(), { ready: true, checks: { disk: 'ok' } }, 'a fresh probe');
  t.equal(calls, 2, 'started again once the first ended');
});

t.test('a check that failed is started again at the next probe', async (t) => {
  let calls = 0;
  const disk = async () => {
    if (calls++ === 0) throw new Error('EIO');
  };
  const readiness = new Readiness({ disk }, 1000, silentLogger);
  const first = await readiness.run();
  const second = await readiness.run();
  t.equal(calls, 2, 'started at each probe');
  t.same([first.checks, second.checks], [{ disk: 'failed' }, { disk: 'ok' }]);
});
