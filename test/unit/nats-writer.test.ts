/**
 * The NATS queue's package writer (store/nats/batch-queue/writer.ts), its hooks faked: a
 * commit that failed for want of NATS is reported at once, its removal going on behind it;
 * any other failure is reported once the removal is done; an abort after an append that
 * failed for want of NATS does not wait for the removal either.
 */
import t from 'tap';
import { INLINE_BATCH_BYTES } from '../../src/store/nats/batch-queue/record.js';
import { NatsWriter, type WriterHooks } from '../../src/store/nats/batch-queue/writer.js';
import { StoreError } from '../../src/store/ports.js';

const meta = { package_id: 'p1', client_id: 'c1', upload_uuid: 'u1', entity: 'products', columns: ['a'] };

function writer(commitError: Error, appendError?: Error) {
  const calls: string[] = [];
  let removed!: () => void;
  const hooks: WriterHooks = {
    append: async () => {
      calls.push('append');
      if (appendError) throw appendError;
      return 1;
    },
    commit: async () => {
      calls.push('commit');
      throw commitError;
    },
    // A removal that takes as long as NATS lets it: it ends only when the test says so.
    remove: () => {
      calls.push('remove');
      return new Promise<void>((resolve) => (removed = resolve));
    },
    forget: () => calls.push('forget'),
    maxBatchBytes: () => 1024 * 1024,
  };
  return { w: new NatsWriter(meta, hooks), calls, finishRemoval: () => removed() };
}

t.test('a commit that failed as NATS unavailable is reported without waiting for its removal', async (t) => {
  const { w, calls, finishRemoval } = writer(new StoreError('STORE_UNAVAILABLE', 'NATS JetStream is unavailable: TIMEOUT'));
  await w.append(Buffer.from('["a"]\n'));
  await t.rejects(w.commit({ rows: 1, bytes: 6 }), { code: 'STORE_UNAVAILABLE' });
  t.same(calls, ['commit', 'remove', 'forget'], 'the removal was started');
  finishRemoval();
});

t.test('any other commit failure is reported once the removal is done', async (t) => {
  const { w, calls, finishRemoval } = writer(new StoreError('STORE_CONFLICT', 'wrong last sequence'));
  await w.append(Buffer.from('["a"]\n'));
  let settled = false;
  const committing = w.commit({ rows: 1, bytes: 6 }).finally(() => (settled = true));
  committing.catch(() => {});
  while (!calls.includes('remove')) await new Promise((r) => setImmediate(r));
  await new Promise((r) => setImmediate(r));
  t.equal(settled, false, 'still waiting for the removal');
  finishRemoval();
  await t.rejects(committing, { code: 'STORE_CONFLICT' });
  t.same(calls, ['commit', 'remove', 'forget']);
});

t.test('an abort after an append that failed as NATS unavailable does not wait for its removal', async (t) => {
  const unavailable = new StoreError('STORE_UNAVAILABLE', 'NATS JetStream is unavailable: TIMEOUT');
  const { w, calls, finishRemoval } = writer(unavailable, unavailable);
  // Past the size a commit message carries: published as a batch of its own, which fails.
  await t.rejects(w.append(Buffer.alloc(INLINE_BATCH_BYTES + 1, 0x20)), { code: 'STORE_UNAVAILABLE' });
  await w.abort();
  t.same(calls, ['append', 'forget', 'remove'], 'the removal was started');
  finishRemoval();
});

t.test('any other abort waits for the removal', async (t) => {
  const { w, calls, finishRemoval } = writer(new Error('unused'));
  await w.append(Buffer.from('["a"]\n'));
  let settled = false;
  const aborting = w.abort().finally(() => (settled = true));
  while (!calls.includes('remove')) await new Promise((r) => setImmediate(r));
  await new Promise((r) => setImmediate(r));
  t.equal(settled, false, 'still waiting for the removal');
  finishRemoval();
  await aborting;
});
