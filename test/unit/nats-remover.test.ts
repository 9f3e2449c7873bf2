/**
 * The bulk removal of acknowledged commits (src/store/nats/batch-queue/remover.ts) against a
 * stand-in for the stream: which requests each round makes, what it keeps, how it fails.
 * Rounds are driven by `flush()` (and `finish()`, the last); the timer is set far out so that it never fires here.
 */
import t from 'tap';
import type { StreamMessages } from '../../src/store/nats/batch-queue/messages.js';
import { AckedRemover } from '../../src/store/nats/batch-queue/remover.js';

function setup(t: { teardown(fn: () => unknown): void }) {
  const calls: string[] = [];
  const errors: string[] = [];
  const state = { floor: 0, failPurge: false };
  const messages = {
    async deleteMatching(filter: string, upToSeq?: number) {
      if (state.failPurge) throw new Error('no quorum');
      calls.push(`purge ${filter} ≤ ${upToSeq}`);
    },
    async deleteSeqs(seqs: number[]) {
      calls.push(`delete ${seqs.join(',')}`);
    },
  } as unknown as StreamMessages;
  const remover = new AckedRemover({
    messages,
    commits: 'Q.c.>',
    readFloor: async () => state.floor,
    intervalMs: 3_600_000,
    onError: (_err, what) => errors.push(what),
  });
  t.teardown(() => remover.close());
  return { remover, calls, errors, state };
}

t.test('one purge of the commit subjects up to the ack floor removes every commit acked in order', async (t) => {
  const { remover, calls, state } = setup(t);
  for (const seq of [3, 1, 2]) remover.acked(seq);
  t.ok(remover.has(2), 'acked, not removed yet');
  state.floor = 3;
  await remover.flush();
  t.same(calls, ['purge Q.c.> ≤ 3']);
  t.notOk([1, 2, 3].some((s) => remover.has(s)), 'removed');
  remover.acked(4);
  await remover.flush();
  t.same(calls.slice(1), [], 'a floor the last purge already reached: no request');
  t.ok(remover.has(4), 'still waiting for the floor');
});

t.test('a commit acked above a held floor is deleted on its own once a round has seen it there', async (t) => {
  const { remover, calls, state } = setup(t);
  state.floor = 1;
  remover.acked(1);
  remover.acked(5);
  await remover.flush();
  t.same(calls, ['purge Q.c.> ≤ 1'], 'the first round purges what the floor covers, and leaves 5 to the floor');
  t.ok(remover.has(5));
  remover.acked(6);
  await remover.flush();
  t.same(calls.slice(1), ['delete 5'], 'a round later 5 is deleted; 6, acked since, waits a round');
  t.notOk(remover.has(5));
  t.ok(remover.has(6));
  state.floor = 6;
  await remover.flush();
  t.same(calls.slice(2), ['purge Q.c.> ≤ 6'], 'the floor caught up first: 6 goes with the purge');
  t.notOk(remover.has(6));
});

t.test('the last round, as the consumer stops (finish): what is above the floor goes at once, not a round later', async (t) => {
  const { remover, calls, state } = setup(t);
  state.floor = 1;
  remover.acked(1);
  remover.acked(5);
  await remover.finish();
  t.same(calls, ['purge Q.c.> ≤ 1', 'delete 5'], 'no later round of this process would delete 5');
  t.notOk(remover.has(5));
  await remover.finish();
  t.same(calls.length, 2, 'nothing left: no request');
});

t.test('a failed round keeps every acked commit for the next and reports a run of failures once', async (t) => {
  const { remover, calls, errors, state } = setup(t);
  state.floor = 2;
  state.failPurge = true;
  remover.acked(1);
  remover.acked(2);
  await remover.flush();
  await remover.flush();
  t.equal(errors.length, 1, 'reported once');
  t.match(errors[0], /remove acknowledged packages/);
  t.ok(remover.has(1) && remover.has(2), 'kept for the next round');
  state.failPurge = false;
  await remover.flush();
  t.same(calls, ['purge Q.c.> ≤ 2']);
  t.notOk(remover.has(1) || remover.has(2));
  state.failPurge = true;
  state.floor = 3;
  remover.acked(3);
  await remover.flush();
  t.equal(errors.length, 2, 'a new run of failures is reported again');
});

t.test('nothing acked: flush makes no request; after close, acks are not kept', async (t) => {
  const { remover, calls, state } = setup(t);
  state.floor = 9;
  await remover.flush();
  t.same(calls, []);
  remover.close();
  remover.acked(9);
  t.notOk(remover.has(9));
});
