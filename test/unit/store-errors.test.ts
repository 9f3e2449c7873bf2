import t from 'tap';
import { isStoreConflict, isStoreError, STORE_CONFLICT, STORE_ERROR_CODES, StoreConflictError, StoreError } from '../../src/store/ports.js';

t.test('store errors carry a code from STORE_ERROR_CODES', async (t) => {
  const err = new StoreError('STORE_CLOSED', 'Batch queue is closed');
  t.ok(err instanceof Error);
  t.equal(err.code, 'STORE_CLOSED');
  t.equal(err.message, 'Batch queue is closed');
  t.equal(err.name, 'StoreError');
  t.ok(isStoreError(err));
  t.ok(isStoreError(err, 'STORE_CLOSED'));
  t.notOk(isStoreError(err, 'STORE_CONFLICT'));
  t.notOk(isStoreError(new Error('Batch queue is closed')), 'a bare error is none');
  t.ok(isStoreError({ code: 'QUEUE_BATCH_LOST' }, 'QUEUE_BATCH_LOST'), 'matched by code');
  t.equal(new Set(STORE_ERROR_CODES).size, STORE_ERROR_CODES.length);
});

t.test('a conflict is a store error of code STORE_CONFLICT', async (t) => {
  const err = new StoreConflictError('session.x');
  t.ok(err instanceof StoreError);
  t.equal(err.code, STORE_CONFLICT);
  t.ok(STORE_ERROR_CODES.includes(err.code));
  t.equal(err.name, 'StoreConflictError');
  t.equal(err.message, 'Conflicting write to session.x');
  t.ok(isStoreConflict(err));
  t.notOk(isStoreConflict(new StoreError('STORE_CLOSED', 'closed')));
});
