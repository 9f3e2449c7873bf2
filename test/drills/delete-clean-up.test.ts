/**
 * Drill: a delete whose clean-up meets a real fault. A gateway process (embedded engines) holds
 * a session with a stored object; strace makes every `openat` (and `unlinkat`, `rmdir`) of the
 * process fail with EMFILE, as a full file table does; the delete still answers 200 (its
 * clean-up is recorded first) and the clean-up fails round after round. The gateway is then
 * killed while the fault lasts, and a new one on the same DATA_DIR takes the clean-up up and
 * finishes it: nothing of the deleted session is left. Needs strace and ptrace (root, as CI
 * runs); without them it fails saying so.
 */
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import t from 'tap';
import { FileObjectStore } from '../../src/store/embedded/object-store.js';
import { SqliteSessionStore } from '../../src/store/embedded/session-store.js';
import { STATE_DB } from '../../src/store/engines.js';
import { cleanUpKey, sessionObjectPrefix } from '../../src/store/keys.js';
import { clientOf, DEMO, products, tempDir, waitForStatus } from '../support/harness.js';
import { spawnGateway, type GatewayProc } from '../../testbed/processes.js';
import { eventually } from '../support/in-process.js';
import { strace } from '../support/strace.js';

if (spawnSync('strace', ['-V']).status !== 0) throw new Error('This drill needs strace (apt-get install strace) and permission to ptrace the gateway (root)');

/** strace on the process: the syscalls fail with EMFILE until `stop`. Resolves once attached. */
const emfile = (pid: number) => strace(t, pid, ['-e', 'trace=openat,unlinkat,rmdir', '-e', 'inject=openat,unlinkat,rmdir:error=EMFILE']);

/** Resolves when the gateway has logged `n` failed rounds of the clean-up. */
function failedRounds(gw: GatewayProc, n: number): Promise<void> {
  return new Promise((resolve, reject) => {
    // A bound, so that a failure shows what the gateway said instead of tap's timeout.
    const timer = setTimeout(() => reject(new Error(`no ${n} failed clean-up rounds in 60 s:\n${gw.output().slice(-3000)}`)), 60_000);
    const check = () => {
      if ((gw.output().match(/background task failed: clean up deleted session/g) ?? []).length >= n) {
        gw.child.stdout!.off('data', check);
        gw.child.stderr!.off('data', check);
        clearTimeout(timer);
        resolve();
      }
    };
    // Errors are logged to stderr, the rest to stdout.
    gw.child.stdout!.on('data', check);
    gw.child.stderr!.on('data', check);
    check();
  });
}

t.test('EMFILE during a delete: 200, the clean-up retried, killed meanwhile, finished by the next gateway', async (t) => {
  const dataDir = await tempDir(t);
  const config = { dataDir, connector: { emulatorDelayMs: 60_000 } };
  let gw = await spawnGateway(t, config as never);
  const c = clientOf(gw);
  const uuid = (await c.init()).body.upload_uuid as string;
  t.equal((await c.ingest(uuid, 'products', products(5))).status, 200);
  await waitForStatus(gw, uuid, (s) => s.upload_tasks_finished);
  const prefix = sessionObjectPrefix('uploads', DEMO.id, uuid);
  const storedObjects = async () => {
    const objects = await FileObjectStore.open(join(dataDir, 'objects'));
    try {
      return (await objects.list(prefix)).length;
    } finally {
      await objects.close();
    }
  };
  t.equal(await storedObjects(), 1, 'the package is stored');

  const fault = await emfile(gw.child.pid!);
  const deleted = await c.remove(uuid);
  t.same([deleted.status, deleted.body], [200, { status: 'started', message: 'Upload deletion started' }], 'answered although no file can be opened');
  await failedRounds(gw, 2);
  await gw.kill(); // the clean-up is not done: the process dies with the fault on
  await fault.stop();
  t.equal(await storedObjects(), 1, 'the object is still there');
  t.match(SqliteSessionStore.peek(join(dataDir, STATE_DB), cleanUpKey(uuid))?.value, { upload_uuid: uuid }, 'the clean-up is recorded');

  gw = await spawnGateway(t, config as never);
  // The new gateway takes it up at start; the files tell when it is done (polled, bounded).
  // The record stays, swept, for the late pass (unit-tested in test/unit/clean-up.test.ts).
  const swept = () => (SqliteSessionStore.peek(join(dataDir, STATE_DB), cleanUpKey(uuid))?.value as { swept?: number } | undefined)?.swept !== undefined;
  await eventually(async () => (await storedObjects()) === 0 && swept(), 'the clean-up to finish');
  t.pass('the object is gone and the clean-up record marked swept');
  const status = await clientOf(gw).status(uuid);
  t.same([status.status, status.body], [404, { detail: 'Upload session not found' }]);
  t.equal((await clientOf(gw).init()).status, 200, 'the client starts afresh');
});
