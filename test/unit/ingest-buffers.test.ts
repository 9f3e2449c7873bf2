import t from 'tap';
import { BufferPool, SMALL_BUFFER_BYTES } from '../../src/validation-pool/buffers.js';

t.test('buffers: the standard size, or a small one for what needs little; each kind reused', async (t) => {
  const pool = new BufferPool(1024 * 1024 + 64 * 1024, 2);
  const standard = pool.take();
  t.equal(standard.byteLength, pool.bufferBytes, 'no size asked: the standard buffer');
  t.equal(pool.take(SMALL_BUFFER_BYTES + 1).byteLength, pool.bufferBytes, 'more than a small one holds: standard');
  const small = pool.take(7000);
  t.equal(small.byteLength, SMALL_BUFFER_BYTES, 'a 7 KB need: a small buffer');

  pool.give(small);
  pool.give(standard);
  t.equal(pool.take(100), small, 'the small one comes back for the next small need');
  t.equal(pool.take(), standard, 'the standard one for the next standard need');
  t.not(pool.take(100), small, 'each is handed out once');

  const detached = pool.take(100);
  structuredClone(detached, { transfer: [detached] });
  pool.give(detached);
  t.equal(pool.take(100).byteLength, SMALL_BUFFER_BYTES, 'a transferred buffer is never kept');
});

t.test('buffers: a pool whose standard size is small gives the standard one', async (t) => {
  const pool = new BufferPool(16 * 1024, 2);
  t.equal(pool.take(100).byteLength, 16 * 1024);
});
