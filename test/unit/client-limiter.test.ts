/** The per-client limiter on a fake clock: token bucket arithmetic, the in-flight cap, bounded memory. */
import t from 'tap';
import { ClientLimiter, type ClientLimits, type ClientSlot } from '../../src/http/client-limiter.js';

function limiter(limits: Partial<ClientLimits> = {}) {
  const clock = { now: 1_000_000 };
  const l = new ClientLimiter({ requestsPerSecond: 30, burst: 50, concurrentPerClient: 30, trackedClients: 1000, ...limits }, () => clock.now);
  return { l, clock };
}

const admitted = (r: ClientSlot | number): r is ClientSlot => typeof r !== 'number';

t.test('token bucket: burst, then Retry-After until a token is back, then the average rate', async (t) => {
  const { l, clock } = limiter({ concurrentPerClient: 0 });
  for (let i = 0; i < 50; i++) t.ok(admitted(l.admit('10.0.0.1', true)), `burst request ${i + 1}`);
  t.equal(l.admit('10.0.0.1', true), 1, 'empty: 1/30 s to the next token, rounded up to 1 s');
  t.ok(admitted(l.admit('10.0.0.2', true)), 'another address has its own bucket');
  t.ok(admitted(l.admit('10.0.0.1', false)), 'unrated requests take no token');
  clock.now += 1000 / 30;
  t.ok(admitted(l.admit('10.0.0.1', true)), 'one token back after 1/30 s');
  t.equal(l.admit('10.0.0.1', true), 1);
  clock.now += 1000;
  let passed = 0;
  for (let i = 0; i < 40; i++) if (admitted(l.admit('10.0.0.1', true))) passed++;
  t.equal(passed, 30, 'after a second, 30 more');
  clock.now += 60_000;
  passed = 0;
  for (let i = 0; i < 60; i++) if (admitted(l.admit('10.0.0.1', true))) passed++;
  t.equal(passed, 50, 'a long rest refills the bucket to the burst, no more');
});

t.test('Retry-After is the whole seconds until a token is back', async (t) => {
  const { l, clock } = limiter({ requestsPerSecond: 0.2, burst: 2, concurrentPerClient: 0 });
  l.admit('a', true);
  l.admit('a', true);
  t.equal(l.admit('a', true), 5, 'an empty bucket at 0.2/s: 5 s');
  clock.now += 2500;
  t.equal(l.admit('a', true), 3, 'half a token back: 2.5 s, rounded up');
  clock.now += 2500;
  t.ok(admitted(l.admit('a', true)));
  t.equal(l.admit('a', true), 5, 'refused requests take nothing; the next token is 5 s away again');
});

t.test('in-flight cap: the 31st concurrent request is refused until one ends', async (t) => {
  const { l } = limiter({ requestsPerSecond: 0 });
  const slots: ClientSlot[] = [];
  for (let i = 0; i < 30; i++) {
    const s = l.admit('10.0.0.1', i % 2 === 0);
    if (admitted(s)) slots.push(s);
  }
  t.equal(slots.length, 30);
  t.equal(l.admit('10.0.0.1', false), 1, 'refused with Retry-After 1');
  t.ok(admitted(l.admit('10.0.0.9', false)), 'other clients unaffected');
  l.release(slots.pop()!);
  const again = l.admit('10.0.0.1', false);
  t.ok(admitted(again), 'a released slot is free again');
  t.equal(l.admit('10.0.0.1', false), 1);
});

t.test('a refused request takes neither a token nor a slot', async (t) => {
  const { l } = limiter({ requestsPerSecond: 1, burst: 1, concurrentPerClient: 1 });
  const first = l.admit('a', true);
  t.ok(admitted(first));
  t.equal(l.admit('a', true), 1, 'over the cap');
  l.release(first as ClientSlot);
  t.equal(l.admit('a', true), 1, 'bucket empty');
  t.ok(admitted(l.admit('a', false)), 'the refused rated request did not hold a slot');
});

t.test('memory: idle entries are swept, the table never exceeds trackedClients', async (t) => {
  const { l, clock } = limiter({ requestsPerSecond: 10, burst: 5, concurrentPerClient: 3, trackedClients: 100 });
  const busy = [l.admit('busy', false), l.admit('busy', false), l.admit('busy', false)] as ClientSlot[];
  t.equal(l.admit('busy', false), 1, 'busy is at its cap');
  for (let i = 0; i < 50; i++) l.release(l.admit(`10.0.0.${i}`, true) as ClientSlot);
  t.equal(l.size, 51);
  clock.now += 1000; // past the sweep interval; every bucket refilled long ago (5 tokens at 10/s)
  l.admit('late', true);
  t.equal(l.size, 2, 'refilled idle entries are gone; the one in flight and the new one stay');

  for (let i = 0; i < 1000; i++) {
    const s = l.admit(`192.0.2.${i}`, true);
    t.ok(l.size <= 100, 'bounded');
    if (admitted(s)) l.release(s);
    clock.now += 1;
  }
  t.equal(l.size, 100);
  t.equal(l.admit('busy', false), 1, 'an entry with requests in flight is evicted last: its cap still holds');
  l.release(busy[0]!);
  t.ok(admitted(l.admit('busy', false)), 'and its releases still count');
  for (let i = 0; i < 5; i++) l.release(busy[1]!);
  t.equal(busy[1]!.inFlight, 0, 'release never goes below zero');
});

t.test('disabled: no rate and no cap tracks nothing', async (t) => {
  const { l } = limiter({ requestsPerSecond: 0, concurrentPerClient: 0 });
  t.equal(l.enabled, false);
  for (let i = 0; i < 1000; i++) t.ok(admitted(l.admit('a', true)));
  t.equal(l.size, 0);
});

t.test('bad limits are refused', async (t) => {
  t.throws(() => limiter({ burst: 0 }), RangeError);
  t.throws(() => limiter({ trackedClients: 0 }), RangeError);
});
