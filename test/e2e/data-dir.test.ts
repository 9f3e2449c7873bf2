/**
 * One owner of DATA_DIR: a second gateway on the data directory of a running one refuses to
 * start with one line naming the directory and the holder (it used to compact the directory
 * and delete the running instance's files); a holder that crashed never blocks the restart;
 * a directory that cannot be written, or one of an earlier layout, is named in one line. With
 * NATS and without S3 the directory holds the objects, whose packs take one writer: locked too.
 */
import { execFileSync } from 'node:child_process';
import { mkdir, statfs, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import t from 'tap';
import { DEMO_CLIENTS_PATH } from '../../src/config/config.js';
import { startNats } from '../../testbed/nats.js';
import { spawnGateway } from '../../testbed/processes.js';
import { call, clientOf, products, tempDir } from '../support/harness.js';

/** What a refused start wrote beside its JSON log lines, from the launcher's error (`… exited with 1:\n<output>`). */
async function refusal(start: Promise<unknown>): Promise<string[]> {
  const err = await start.then(
    () => null,
    (e: unknown) => e as Error,
  );
  if (!err) throw new Error('the gateway started');
  t.match(err.message, /exited with 1:/, 'exit code 1');
  const output = err.message.split(':\n').slice(1).join(':\n').trim().split('\n');
  return output.filter((line) => !line.startsWith('{'));
}

t.test('a second gateway on the DATA_DIR of a running one is refused; the first keeps serving; after a crash the restart takes it', async (t) => {
  const dataDir = join(await tempDir(t), 'data');
  const first = await spawnGateway(t, { dataDir });
  const c = clientOf(first);
  const uuid = (await c.init()).body.upload_uuid as string;
  t.equal((await c.ingest(uuid, 'products', products(3))).status, 200);

  const lines = await refusal(spawnGateway(t, { dataDir }));
  t.same(lines.length, 1, `one line: ${lines.join(' | ')}`);
  t.match(lines[0], `Cannot start: DATA_DIR ${dataDir} is in use by another process (pid ${first.child.pid} on `);
  t.match(lines[0], /stop that one, or set DATA_DIR to another directory$/);

  const st = await c.status(uuid);
  t.equal(st.status, 200, 'the first still answers');
  t.equal(st.body.upload_tasks_finished !== undefined, true);

  await first.kill(); // SIGKILL: its lock goes with it
  const again = await spawnGateway(t, { dataDir });
  const after = await clientOf(again).status(uuid);
  t.equal(after.status, 200, 'the restart after a crash starts and has the session');
});

t.test('NATS without S3: a second gateway on the DATA_DIR (the objects) of a running one is refused', async (t) => {
  const nats = await startNats(t);
  const dataDir = join(await tempDir(t), 'data');
  const config = { dataDir, clientsFile: DEMO_CLIENTS_PATH, nats: { url: nats.url } };
  const first = await spawnGateway(t, config);
  const lines = await refusal(spawnGateway(t, config));
  t.same(lines.length, 1, `one line: ${lines.join(' | ')}`);
  t.match(lines[0], `Cannot start: DATA_DIR ${dataDir} is in use by another process (pid ${first.child.pid} on `);
  const c = clientOf(first);
  const uuid = (await c.init()).body.upload_uuid as string;
  t.equal((await c.ingest(uuid, 'products', products(3))).status, 200, 'the first keeps serving');
});

t.test('a DATA_DIR with room for small writes but not for a batch is not ready; ready again once space is freed', async (t) => {
  const dataDir = await tempDir(t);
  execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=8m', 'tmpfs', dataDir]);
  t.teardown(() => execFileSync('umount', ['-l', dataDir]));
  const gw = await spawnGateway(t, { dataDir });
  t.equal((await call(gw.url, 'GET', '/readyz', { client: null })).status, 200, 'ready');
  const { bavail, bsize } = await statfs(dataDir);
  // 400 KiB left: the session store's writes fit, a batch (up to 1 MiB) does not.
  await writeFile(join(dataDir, 'filler'), Buffer.alloc(bavail * bsize - 400 * 1024));
  const full = await call(gw.url, 'GET', '/readyz', { client: null });
  t.same([full.status, full.body.checks?.storage], [503, 'failed'], `not ready, naming storage (${full.text})`);
  await unlink(join(dataDir, 'filler'));
  t.equal((await call(gw.url, 'GET', '/readyz', { client: null })).status, 200, 'ready again');
});

t.test('a read-only DATA_DIR is named in one line', async (t) => {
  const dataDir = await tempDir(t);
  execFileSync('mount', ['-t', 'tmpfs', '-o', 'ro,size=1m', 'tmpfs', dataDir]);
  t.teardown(() => execFileSync('umount', ['-l', dataDir]));
  const lines = await refusal(spawnGateway(t, { dataDir }));
  t.same(lines, [`Cannot start: DATA_DIR ${dataDir} cannot be used: it is on a read-only file system; set DATA_DIR to a writable directory`]);
  const below = join(dataDir, 'data');
  t.same(await refusal(spawnGateway(t, { dataDir: below })), [
    `Cannot start: DATA_DIR ${below} cannot be used: it is on a read-only file system; set DATA_DIR to a writable directory`,
  ], 'also where it would have to be made');
});

t.test('a DATA_DIR of the earlier file layout is refused, not read as empty', async (t) => {
  const dataDir = await tempDir(t);
  await mkdir(join(dataDir, 'sessions'));
  t.same(await refusal(spawnGateway(t, { dataDir })), [
    `Cannot start: DATA_DIR ${dataDir} holds sessions/ and ledger/ of an earlier version, which this one does not read: finish or delete its sessions with that version, then remove those directories`,
  ]);
});
