/**
 * Answers that keep coming while NATS elects a leader (store/nats/connection.ts): `answerSoon`
 * gives the fresh read when it comes in time, else the value last read if it is recent enough
 * (`LastRead`, on a clock the test drives), else waits for the read.
 */
import t from 'tap';
import { ANSWER_STALE_MS, answerSoon, LastRead } from '../../src/store/nats/connection.js';

const never = <T>() => new Promise<T>(() => {});

t.test('the fresh read, when it comes before the wait ends', async (t) => {
  t.equal(await answerSoon(Promise.resolve('fresh'), () => 'last', 60_000), 'fresh');
});

t.test('the value last read, when the read does not come in time', async (t) => {
  t.equal(await answerSoon(never<string>(), () => 'last', 0), 'last');
});

t.test('no value read yet: the answer waits for the read, and shares its failure', async (t) => {
  let settle!: (v: string) => void;
  const fresh = new Promise<string>((resolve) => (settle = resolve));
  const answer = answerSoon(fresh, () => undefined, 0);
  settle('fresh at last');
  t.equal(await answer, 'fresh at last');
  await t.rejects(answerSoon(Promise.reject(new Error('no quorum')), () => undefined, 0), /no quorum/);
});

t.test('a read that fails after the last value answered is no unhandled rejection', async (t) => {
  let fail!: (e: Error) => void;
  const fresh = new Promise<string>((_, reject) => (fail = reject));
  t.equal(await answerSoon(fresh, () => 'last', 0), 'last');
  fail(new Error('late failure'));
  await new Promise((resolve) => setImmediate(resolve));
  t.pass('no unhandled rejection');
});

t.test('LastRead: a value serves answers while it is recent; the newest keys are kept', async (t) => {
  let now = 0;
  const last = new LastRead<number>(2, () => now);
  last.set('a', 1);
  now = ANSWER_STALE_MS;
  t.equal(last.recent('a'), 1, 'as old as the limit');
  now = ANSWER_STALE_MS + 1;
  t.equal(last.recent('a'), undefined, 'older: the answer waits for a read');
  t.equal(last.peek('a'), 1, 'peek gives it whatever its age');
  last.set('a', 2);
  t.equal(last.recent('a'), 2, 'set again: recent again');
  last.set('b', 3);
  last.set('c', 4);
  t.equal(last.peek('a'), undefined, 'past the size, the key set longest ago goes');
  t.equal(last.peek('c'), 4);
});
