/** The embedded default's four stores in a temporary directory of their own, closed and removed at teardown (unit tests of the session service). */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Test } from 'tap';
import { FileBatchQueue } from '../../src/store/embedded/batch-queue.js';
import { SqliteLedger } from '../../src/store/embedded/ledger.js';
import { FileObjectStore } from '../../src/store/embedded/object-store.js';
import { SqliteSessionStore } from '../../src/store/embedded/session-store.js';

export async function embeddedStores(t: Test, prefix: string) {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const sessions = await SqliteSessionStore.open(join(dir, 'state.sqlite'));
  const ledger = await SqliteLedger.open(join(dir, 'state.sqlite'));
  const queue = await FileBatchQueue.open(join(dir, 'queue'), join(dir, 'state.sqlite'));
  const objects = await FileObjectStore.open(join(dir, 'objects'));
  t.teardown(async () => {
    await queue.close();
    await ledger.close();
    await objects.close();
    await sessions.close();
  });
  return { dir, sessions, ledger, queue, objects };
}
