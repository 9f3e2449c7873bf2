/**
 * The one-shot path's parse (`validation/body.ts`): `JSON.parse` of a whole body builds many
 * times its bytes (32 MiB of `[[[…]]]` some 900 MB), so the parses of one-shot bodies wait
 * for room in the pool's `ParseGate` (`validation-pool/memory.ts`) instead of all running at
 * once, one per worker; their answers are unchanged.
 */
import { Buffer } from 'node:buffer';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import t from 'tap';
import { findEntity } from '../../src/entities/catalog.js';
import type { ServiceError } from '../../src/errors.js';
import { ParseGate } from '../../src/validation-pool/memory.js';
import { ValidationPool } from '../../src/validation-pool/pool.js';
import { parseCost } from '../../src/validation/index.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

t.test('parseCost bounds what JSON.parse builds, for the costliest shapes', async (t) => {
  const n = 200_000;
  const shapes: Record<string, string> = {
    nested: `${'['.repeat(n)}${']'.repeat(n)}`,
    'nested objects': `${'{"a":'.repeat(n)}0${'}'.repeat(n)}`,
    'empty lists': `[${'[],'.repeat(n)}[]]`,
    'empty objects': `[${'{},'.repeat(n)}{}]`,
    'objects of new keys': `[${Array.from({ length: n }, (_, i) => `{"k${i}":0,"j${i}":[]}`).join(',')}]`,
    'many keys': `{${Array.from({ length: n }, (_, i) => `"k${i}":0.5`).join(',')}}`,
    numbers: `[${'0.5,'.repeat(n)}1]`,
    rows: `{"data":[${Array.from({ length: n }, (_, i) => `["s${i}","Store ${i}",12.5,true,null]`).join(',')}],"columns":["a"]}`,
  };
  for (const [name, text] of Object.entries(shapes)) {
    const bytes = Buffer.from(text);
    gc();
    const before = process.memoryUsage().heapUsed;
    const value: unknown = JSON.parse(bytes.toString('utf8'));
    const built = process.memoryUsage().heapUsed - before;
    t.ok(value !== undefined);
    t.ok(built <= parseCost(bytes), `${name}: ${built} bytes built, cost ${parseCost(bytes)}`);
  }
});

t.test('the gate: in arrival order, within the limit, one past it alone, a waiter aborted leaves', async (t) => {
  const gate = new ParseGate(100);
  const never = new AbortController().signal;
  const entered: string[] = [];
  const enter = (name: string, cost: number, signal = never) =>
    gate.enter(cost, signal).then((leave) => {
      entered.push(name);
      return leave;
    });
  const a = await enter('a', 60);
  const b = enter('b', 50);
  const aborting = new AbortController();
  const c = enter('c', 10, aborting.signal);
  const d = enter('d', 500);
  await Promise.resolve();
  t.same(entered, ['a'], 'b waits for room, and c behind it');
  t.equal(gate.waiting, 3);
  aborting.abort(new Error('gone'));
  await t.rejects(c, { message: 'gone' });
  t.equal(gate.waiting, 2);
  a();
  a();
  const leaveB = await b;
  t.same(entered, ['a', 'b']);
  t.equal(gate.used, 50, 'a left once');
  leaveB();
  const leaveD = await d;
  t.equal(gate.used, 500, 'past the limit alone');
  const e = enter('e', 1);
  await Promise.resolve();
  t.same(entered, ['a', 'b', 'd']);
  leaveD();
  (await e)();
  t.same(entered, ['a', 'b', 'd', 'e']);
  t.equal(gate.used, 0);
  t.equal(gate.peak, 500);
  await t.rejects(gate.enter(1, AbortSignal.abort(new Error('before'))), { message: 'before' });
});

/**
 * Two workers whose tasks that parse 1 MiB or more whole (a body, a long row, a skeleton) announce
 * themselves on a BroadcastChannel and wait for a `go` on another before they run the real
 * worker's, then tell how much their heap grew in the task.
 */
const held = (() => {
  const real = new URL('../../src/validation/worker.js', import.meta.url).href;
  const channel = `oneshot-${process.pid}-${Math.random()}`;
  const dir = t.testdir({
    'worker.mjs': `
      import validate from ${JSON.stringify(real)};
      const bytes = (task) => task.kind === 'body' ? task.body.byteLength : task.kind === 'rows' ? task.ranges.reduce((n, r, k) => n + (k % 2 ? r : -r), 0) : task.text.byteLength;
      export default async function (task) {
        const long = bytes(task) >= 1 << 20;
        if (long) {
          const go = new BroadcastChannel(${JSON.stringify(`${channel}-go`)});
          const released = new Promise((resolve) => (go.onmessage = resolve));
          const started = new BroadcastChannel(${JSON.stringify(channel)});
          started.postMessage('start');
          started.close();
          await released;
          go.close();
        }
        const before = process.memoryUsage().heapUsed;
        const result = validate(task);
        if (long) {
          const heap = new BroadcastChannel(${JSON.stringify(`${channel}-heap`)});
          heap.postMessage(process.memoryUsage().heapUsed - before);
          heap.close();
        }
        return result;
      }
    `,
  });
  // The parses of two of the bodies below do not fit in 64 MiB at once; their long row is over two pieces.
  const pool = new ValidationPool({
    workers: 2,
    maxQueue: 8,
    memoryBudgetBytes: 64 << 20,
    pieceBytes: 256 << 10,
    filename: pathToFileURL(join(dir, 'worker.mjs')).href,
  });
  t.teardown(() => pool.destroy());
  return { pool, channel };
})();

// 400,000 empty lists: 1.2 MB, some 17 MB parsed (a cost of 53 MB).
const LISTS = `${'[],'.repeat(399_999)}[]`;
const layouts = {
  // `data` before `columns`: the one-shot path.
  'a body held whole': { body: `{"data":[${LISTS}],"columns":["store_id","name"]}`, answer: /row 0: expected 2 values, got 0/ },
  // `columns` first, one row of 1.2 MB: a grown piece, parsed whole.
  'a long row': { body: `{"columns":["store_id","name"],"data":[[${LISTS}]]}`, answer: /row 0: expected 2 values, got 400000/ },
  // 1.2 MB after `data`: the skeleton, parsed whole in a worker.
  'a long tail': { body: `{"columns":["store_id","name"],"data":[[]],"more":[${LISTS}]}`, answer: /row 0: expected 2 values, got 0/ },
};

for (const [layout, { body: text, answer }] of Object.entries(layouts)) {
  t.test(`${layout}: parses that do not fit together run one after the other, answers unchanged`, async (t) => {
    const { pool, channel } = held;
    const body = Buffer.from(text);
    t.ok(parseCost(body) > pool.parses.limit / 2 && parseCost(body) < pool.parses.limit);
    const starts = new BroadcastChannel(channel);
    const go = new BroadcastChannel(`${channel}-go`);
    const heaps = new BroadcastChannel(`${channel}-heap`);
    const grown: number[] = [];
    const bothDone = new Promise<void>((resolve) => {
      heaps.onmessage = (event) => {
        if (grown.push((event as MessageEvent).data as number) === 2) resolve();
      };
    });
    t.teardown(() => {
      starts.close();
      go.close();
      heaps.close();
    });
    let started = 0;
    let first: () => void = () => {};
    const firstStarted = new Promise<void>((resolve) => (first = resolve));
    starts.onmessage = () => {
      // The first task is held until the second one is seen waiting; any later runs at once.
      if (++started === 1) first();
      else go.postMessage('go');
    };
    const ends = [0, 1].map(() => {
      const sink = pool.createIngest({ entity: findEntity('stores')!, dryRun: true, open: () => Promise.reject(new Error('no writer')) });
      sink.write(body);
      return sink.end().then(
        () => t.fail('accepted'),
        (err: unknown) => err as ServiceError,
      );
    });
    await firstStarted;
    // The second sink gets to its parse when its body is checked (a skeleton: after its pieces
    // came back): then its task either starts too, or is seen waiting.
    while (started < 2 && pool.parses.waiting === 0) await new Promise(setImmediate);
    t.equal(started, 1, 'the second parse does not start while the first runs');
    t.equal(pool.parses.waiting, 1, 'it waits for the first one');
    go.postMessage('go');
    const [a, b] = await Promise.all(ends);
    t.ok(started >= 2, `${started} long tasks`);
    for (const err of [a, b]) t.match(err, { statusCode: 422, code: 'INVALID_PAYLOAD', message: answer });
    t.same(a, b, 'the same answer for both');
    t.equal(pool.parses.used, 0);
    t.ok(pool.parses.peak <= pool.parses.limit, 'never more than the limit at once');
    // What each parse built is given back before the task ends: no worker keeps it.
    await bothDone;
    for (const bytes of grown) t.ok(bytes < 4_000_000, `a worker's heap grew by ${bytes} bytes in the task`);
  });
}
