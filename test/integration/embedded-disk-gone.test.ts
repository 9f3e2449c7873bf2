/**
 * The embedded default's disk gone under it (DATA_DIR on faultfs, detached while the gateway
 * runs: its open files answer ENOTCONN): a request that needs to write answers 503 `Storage
 * temporarily unavailable` with `Retry-After`, never 500. (Not `/readyz` here: the lazy
 * unmount leaves the path writable, on the directory below, so a fresh file there works.)
 */
import t from 'tap';
import { API, call, clientOf, DEMO2, products, tempDir } from '../support/harness.js';
import { mountFaultFs } from '../../testbed/faultfs.js';
import { spawnGateway } from '../../testbed/processes.js';

t.test("the embedded default's disk gone: 503 with Retry-After, never 500", async (t) => {
  const disk = await mountFaultFs(t, await tempDir(t, 'embedded-disk-gone-'));
  const gw = await spawnGateway(t, { dataDir: disk.dir });
  const demo = clientOf(gw);
  const uuid = (await demo.init()).body.upload_uuid as string;
  t.equal((await demo.ingest(uuid, 'products', products(3))).status, 200);

  await disk.powerCut();
  const [ingest, init] = await Promise.all([
    demo.ingest(uuid, 'products', products(3)),
    call(gw.url, 'POST', `${API}/initialize-session`, { client: DEMO2 }),
  ]);
  for (const [what, res] of [['ingest', ingest], ['initialize-session', init]] as const) {
    t.same([res.status, res.body], [503, { detail: 'Storage temporarily unavailable' }], `${what}: 503 (${res.text})`);
    t.match(res.headers['retry-after'], /^[1-9]\d*$/, `${what}: with Retry-After`);
  }
  // A 500 names its cause in the test's output: the gateway's logged errors.
  if (ingest.status === 500 || init.status === 500) t.comment(gw.output().split('\n').filter((l) => l.includes('"level":"error"')).join('\n'));
});
