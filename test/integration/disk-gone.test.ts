/**
 * The NATS server's disk gone under it (its faultfs mount detached while nats-server runs:
 * every file call of its store fails). Seen in power-cut runs as 8,524 ingests answered 400
 * `Upload session not initialized` in 3 s: the first write the disk refused left the stream
 * without its messages, and every key read "not found" (lost-keys.ts). A session that cannot
 * be read answers 503 `Storage temporarily unavailable`, never 400 or 404.
 */
import t, { type Test } from 'tap';
import { API, call, clientOf, DEMO2, products, tempDir, yesterday, type Answer } from '../support/harness.js';
import { mountFaultFs } from '../../testbed/faultfs.js';
import { startNats } from '../../testbed/nats.js';
import { distributed, spawnGateway } from '../../testbed/processes.js';
import { startS3 } from '../../testbed/s3.js';

function unavailable(t: Test, what: string, res: Answer): void {
  t.same([res.status, res.body], [503, { detail: 'Storage temporarily unavailable' }], `${what}: 503 Storage temporarily unavailable`);
  t.match(res.headers['retry-after'], /^[1-9]\d*$/, `${what}: with Retry-After`);
}

t.test("the NATS server's disk gone: 503 with Retry-After, never 400 or 404", async (t) => {
  const disk = await mountFaultFs(t, await tempDir(t, 'disk-gone-'));
  const [nats, s3] = await Promise.all([startNats(t, { storeDir: disk.dir }), startS3(t)]);
  const base = distributed(nats.url, s3);
  const gw = await spawnGateway(t, { ...base, nats: { ...base.nats, requestTimeoutMs: 1000 } });
  const demo = clientOf(gw);
  const uuid = (await demo.init()).body.upload_uuid as string;
  t.equal((await demo.ingest(uuid, 'products', products(3))).status, 200);

  await disk.powerCut();
  // The first write the disk refuses (the ingest's lease) leaves the streams without their messages.
  unavailable(t, 'ingest', await demo.ingest(uuid, 'products', products(3)));
  const [status, again, init, start, unknown] = await Promise.all([
    demo.status(uuid),
    demo.ingest(uuid, 'products', products(3)),
    call(gw.url, 'POST', `${API}/initialize-session`, { client: DEMO2 }),
    demo.start(uuid, { date_from: '2024-01-01', date_to: yesterday() }),
    demo.status('0c6f1c4e-8d0b-4d2a-9a3e-2f1b5c6d7e8f'),
  ]);
  unavailable(t, 'status', status);
  unavailable(t, 'ingest again', again);
  unavailable(t, 'initialize-session of another client', init);
  unavailable(t, 'start-upload', start);
  unavailable(t, 'status of a session never created (the store cannot tell)', unknown);
  const ready = await call(gw.url, 'GET', '/readyz', { client: null });
  t.match([ready.status, ready.body], [503, { detail: 'Not ready', checks: { nats: /^(failed|timeout)$/ } }], '/readyz names nats: it answers, but cannot write');
});
