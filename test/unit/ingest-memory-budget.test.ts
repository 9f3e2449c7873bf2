/**
 * The budget of ingest bytes held whole (validation-pool/memory.ts): the process's limit, one
 * request's bound, and one client's share of the limit.
 */
import t from 'tap';
import { MemoryBudget } from '../../src/validation-pool/memory.js';

t.test("one client's sinks hold at most its share of the budget; other clients' sinks still get theirs", async (t) => {
  const budget = new MemoryBudget(100, 30, 0.5);
  t.equal(budget.perClient, 50);
  const [a1, a2, b1, b2] = [budget.account('a'), budget.account('a'), budget.account('b'), budget.account('b')];
  t.equal(a1.hold(30), 'ok');
  t.equal(a2.hold(30), 'no-memory', "past a's share (60 > 50), with the budget far from spent");
  t.equal(a2.held, 0, 'nothing changes on a refusal');
  t.equal(a2.hold(20), 'ok', 'up to the share');
  t.equal(budget.usedBy('a'), 50);
  t.equal(b1.hold(30), 'ok', "b's requests are not turned away for a's");
  t.equal(b2.hold(20), 'ok');
  t.equal(budget.used, 100);
  t.equal(budget.refusals, 1);
  a1.release();
  t.equal(budget.usedBy('a'), 20);
  t.equal(a1.hold(30), 'ok', 'released: held again');
  a1.release();
  a2.release();
  t.equal(budget.usedBy('a'), 0);
  t.equal(budget.account().hold(30), 'ok', 'a sink of no client: the process limit alone');
});

t.test('the share is at least one request; a share of 1 is the whole budget', async (t) => {
  t.equal(new MemoryBudget(100, 30, 0.1).perClient, 30, 'one request of a client always fits');
  const whole = new MemoryBudget(100, 30, 1);
  const accounts = Array.from({ length: 4 }, () => whole.account('a'));
  t.same(
    accounts.map((a) => a.hold(30)),
    ['ok', 'ok', 'ok', 'no-memory'],
    'the process limit still holds',
  );
  t.equal(accounts[0]!.hold(40), 'too-large', "one request's bound");
});
