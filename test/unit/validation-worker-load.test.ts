/**
 * The validation worker (validation/worker.ts) as it loads: it makes no V8 context and sets
 * no V8 flag until its first collection. A worker terminated while it makes one (a pool
 * destroyed as it starts, e.g. a gateway whose listen failed) has Node 22 print V8's
 * bootstrap failure and a page of Node's `vm` source on the process's output, where it broke
 * a test runner's output in CI.
 */
import t from 'tap';

t.test('loading the worker makes no context and sets no flag', async (t) => {
  const calls: string[] = [];
  await t.mockImport(new URL('../../src/validation/worker.js', import.meta.url).href, {
    'node:vm': {
      runInNewContext: () => {
        calls.push('runInNewContext');
        return () => {};
      },
    },
    'node:v8': { setFlagsFromString: (flag: string) => calls.push(`setFlagsFromString ${flag}`) },
  });
  t.same(calls, []);
});
