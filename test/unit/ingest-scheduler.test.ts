/** The pool's seams on their own: the task queue and slots (scheduler.ts) and the admission of sinks (admission.ts). */
import t from 'tap';
import { Admission } from '../../src/validation-pool/admission.js';
import { FifoQueue, Scheduler, type TaskQueue, type Waiter } from '../../src/validation-pool/scheduler.js';

const drain = <T>(q: TaskQueue<T>): T[] => {
  const out: T[] = [];
  for (let item = q.shift(); item !== undefined; item = q.shift()) out.push(item);
  return out;
};

t.test('FifoQueue: push/shift in order, unshift before everything waiting, remove wherever it waits', async (t) => {
  const q = new FifoQueue<string>();
  t.equal(q.size, 0);
  t.equal(q.shift(), undefined, 'empty: undefined');
  q.push('a');
  q.push('b');
  q.push('c');
  q.unshift('p');
  t.equal(q.size, 4);
  t.ok(q.remove('b'), 'an item in the middle');
  t.notOk(q.remove('b'), 'not there any more');
  t.notOk(q.remove('x'), 'never there');
  t.equal(q.size, 3);
  t.same(drain(q), ['p', 'a', 'c']);
  t.equal(q.size, 0);
});

/** Records the order in which acquisitions were granted. */
function tracker(scheduler: Scheduler) {
  const granted: string[] = [];
  const acquire = (name: string, signal = new AbortController().signal, priority = false) =>
    scheduler.acquire(signal, priority).then(() => {
      granted.push(name);
    });
  return { granted, acquire };
}

t.test('Scheduler: free slots are taken at once, then tasks wait and get released slots in queue order', async (t) => {
  const s = new Scheduler(2);
  t.ok(s.tryAcquire());
  t.ok(s.tryAcquire());
  t.notOk(s.tryAcquire(), 'both slots taken');
  t.equal(s.running, 2, 'a refused tryAcquire counts nothing');
  const { granted, acquire } = tracker(s);
  const first = acquire('first');
  const second = acquire('second');
  const third = acquire('third');
  t.equal(s.waiting, 3);

  s.release();
  t.equal(s.running, 2, 'the freed slot went to a waiter at once');
  t.equal(s.waiting, 2);
  await first;
  t.same(granted, ['first']);

  s.release();
  s.release();
  await Promise.all([second, third]);
  t.same(granted, ['first', 'second', 'third']);
  t.equal(s.running, 2);
  t.equal(s.waiting, 0);

  s.release();
  s.release();
  t.equal(s.running, 0, 'all given back');
  t.ok(s.tryAcquire(), 'and free again');
});

t.test('Scheduler: a priority task goes before every task waiting when it arrives', async (t) => {
  const s = new Scheduler(1);
  t.ok(s.tryAcquire());
  const { granted, acquire } = tracker(s);
  const waits = [acquire('piece 1'), acquire('piece 2'), acquire('skeleton', undefined, true), acquire('piece 3'), acquire('rerun', undefined, true)];
  for (let i = 0; i < waits.length; i++) s.release();
  await Promise.all(waits);
  t.same(granted, ['rerun', 'skeleton', 'piece 1', 'piece 2', 'piece 3']);
});

t.test('Scheduler: a task whose signal aborts leaves the queue, rejects with the reason and never takes a slot', async (t) => {
  const s = new Scheduler(1);
  t.ok(s.tryAcquire());
  const { granted, acquire } = tracker(s);
  const gone = new AbortController();
  const a = acquire('a');
  const b = acquire('b', gone.signal);
  const c = acquire('c');
  t.equal(s.waiting, 3);
  const reason = new Error('client went away');
  gone.abort(reason);
  await t.rejects(b, reason);
  t.equal(s.waiting, 2, 'removed from the queue');

  s.release();
  await a;
  s.release();
  await c;
  t.same(granted, ['a', 'c'], 'the aborted one was skipped');
  t.equal(s.running, 1);

  const already = new AbortController();
  already.abort(new Error('before'));
  await t.rejects(s.acquire(already.signal, false), { message: 'before' }, 'an aborted signal is refused at once');
  t.equal(s.waiting, 0, 'and never queued');
});

t.test('Scheduler: waits in the queue it is given (push, shift, remove, size)', async (t) => {
  /** Last in, first out, recording the calls: the order is the queue's, not the scheduler's. */
  class LifoQueue implements TaskQueue<Waiter> {
    readonly items: Waiter[] = [];
    readonly calls: string[] = [];
    get size() {
      return this.items.length;
    }
    push(item: Waiter) {
      this.calls.push('push');
      this.items.push(item);
    }
    unshift(item: Waiter) {
      this.calls.push('unshift');
      this.items.push(item);
    }
    shift() {
      this.calls.push('shift');
      return this.items.pop();
    }
    remove(item: Waiter) {
      this.calls.push('remove');
      const at = this.items.indexOf(item);
      if (at >= 0) this.items.splice(at, 1);
      return at >= 0;
    }
  }
  const queue = new LifoQueue();
  const s = new Scheduler(1, queue);
  t.ok(s.tryAcquire());
  const { granted, acquire } = tracker(s);
  const gone = new AbortController();
  const waits = [acquire('a'), acquire('b'), acquire('c', gone.signal, true)];
  gone.abort(new Error('gone'));
  await t.rejects(waits.pop()!);
  s.release();
  s.release();
  await Promise.all(waits);
  t.same(granted, ['b', 'a']);
  t.same(queue.calls, ['push', 'push', 'unshift', 'remove', 'shift', 'shift']);
});

t.test('Admission: at most `capacity` open; past that RATE_LIMITED (503, Retry-After 1); a release counts once', async (t) => {
  const admission = new Admission(2);
  const first = admission.admit();
  const second = admission.admit();
  t.equal(admission.open, 2);
  t.throws(() => admission.admit(), { code: 'RATE_LIMITED', statusCode: 503, headers: { 'Retry-After': '1' } });
  t.equal(admission.open, 2, 'a refusal takes no place');

  first();
  first();
  t.equal(admission.open, 1, 'a second release of the same admission gives nothing back');
  const third = admission.admit();
  t.throws(() => admission.admit(), { code: 'RATE_LIMITED' }, 'full again: the repeated release did not make room');
  second();
  third();
  t.equal(admission.open, 0);

  const none = new Admission(0);
  t.throws(() => none.admit(), { code: 'RATE_LIMITED' }, 'capacity 0 admits nothing');
  t.equal(none.open, 0);
});

t.test('Admission: one client holds at most its share; the others are still admitted', async (t) => {
  const admission = new Admission(6, 0.5);
  t.equal(admission.perClient, 3);
  const a = [admission.admit('a'), admission.admit('a'), admission.admit('a')];
  t.throws(() => admission.admit('a'), { code: 'RATE_LIMITED', statusCode: 503 }, "a's fourth: past its share");
  t.equal(admission.openOf('a'), 3);
  const b = [admission.admit('b'), admission.admit('b')];
  t.equal(admission.open, 5, 'b admitted beside a');
  admission.admit(); // a request of no client counts for the pool only
  t.throws(() => admission.admit('c'), { code: 'RATE_LIMITED' }, 'the pool is full');
  a[0]!();
  a[0]!();
  t.equal(admission.openOf('a'), 2, 'a release counts once');
  admission.admit('a');
  t.throws(() => admission.admit('a'), { code: 'RATE_LIMITED' });
  for (const release of b) release();
  t.equal(admission.openOf('b'), 0);
  t.equal(new Admission(3, 0.1).perClient, 1, 'at least one');
  t.equal(new Admission(3, 1).perClient, 3, 'share 1: the whole pool');
});

