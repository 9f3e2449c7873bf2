/**
 * `parentNotifier` (src/observability/state-events.ts): nothing without an IPC channel; a burst
 * of changes is one message per event-loop turn; at most one in flight, and a change meanwhile
 * sends one more once it is out; a failed send stops it without throwing.
 */
import { setImmediate as turn } from 'node:timers/promises';
import t from 'tap';
import { parentNotifier, STATE_CHANGE } from '../../src/observability/state-events.js';

function fakeParent() {
  const sent: unknown[] = [];
  const callbacks: ((err: Error | null) => void)[] = [];
  const proc = {
    connected: true,
    send(message: unknown, _handle?: unknown, _options?: unknown, callback?: (err: Error | null) => void) {
      sent.push(message);
      if (callback) callbacks.push(callback);
      return true;
    },
  };
  return { proc, sent, callbacks };
}

t.test('without an IPC channel: no notifier', async (t) => {
  t.equal(parentNotifier({ connected: false } as never), undefined);
});

t.test('a burst is one message; one in flight; a change meanwhile sends one more after it', async (t) => {
  const { proc, sent, callbacks } = fakeParent();
  const notify = parentNotifier(proc as never)!;
  for (let i = 0; i < 100; i++) notify();
  t.same(sent, [], 'nothing before the turn ends: the writer is never held up');
  await turn();
  t.same(sent, [STATE_CHANGE], 'one message for the burst');
  notify();
  notify();
  await turn();
  t.equal(sent.length, 1, 'none while one is in flight');
  callbacks.shift()!(null);
  await turn();
  t.equal(sent.length, 2, 'one more once it is out');
  callbacks.shift()!(null);
  await turn();
  t.equal(sent.length, 2, 'and no more without a change');
});

t.test('a failed send is dropped, and so is every later one; a send that throws too', async (t) => {
  const { proc, sent, callbacks } = fakeParent();
  const notify = parentNotifier(proc as never)!;
  notify();
  await turn();
  callbacks.shift()!(new Error('channel closed'));
  notify();
  await turn();
  t.equal(sent.length, 1);
  const throwing = parentNotifier({ connected: true, send: () => { throw new Error('gone'); } } as never)!;
  throwing();
  await turn();
  t.doesNotThrow(() => throwing());
});
