/**
 * Drill: `kill -9` of the gateway while start-upload waits for the Connector (which holds the
 * call open), then a new gateway on the same data. The session was left STARTED with no
 * workflow running. It goes back to UPLOADING by itself: on the embedded default as the new
 * gateway starts (the directory was the dead process's alone), on NATS once the dead
 * gateway's hold on the start lapses (`ingest.inFlightLeaseMs`), at the first status or write
 * after that. Then start-upload succeeds and the session reaches DONE. Before the hold it
 * stayed STARTED for good: initialize-session, ingest, start-upload and delete all 409.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import t, { type Test } from 'tap';
import type { Config, DeepPartial } from '../../src/config/config.js';
import { WEBHOOK_SECRET } from '../../testbed/env.js';
import { startNats } from '../../testbed/nats.js';
import { distributed, spawnGateway } from '../../testbed/processes.js';
import { startS3 } from '../../testbed/s3.js';
import { drillPackage, writeClients } from '../support/drills.js';
import { clientOf, leasesLapsed, sendWebhook, tempDir, waitForStatus, yesterday } from '../support/harness.js';

const LEASE_MS = 3000;

/** A Connector whose first start call never gets an answer; the later ones are taken. */
async function holdingConnector(t: Test) {
  const starts: string[] = [];
  let called!: () => void;
  const firstCall = new Promise<void>((resolve) => (called = resolve));
  const held: ServerResponse[] = [];
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    let raw = '';
    req.on('data', (c: Buffer) => (raw += c.toString()));
    req.on('end', () => {
      if (req.url !== '/workflows') return void res.writeHead(404).end();
      starts.push((JSON.parse(raw) as { upload_uuid: string }).upload_uuid);
      if (starts.length === 1) {
        held.push(res);
        called();
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ workflow_id: `w${starts.length}`, status: 'started' }));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    for (const res of held) res.destroy();
    return new Promise((resolve) => server.close(resolve));
  });
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, starts, firstCall };
}

async function drill(t: Test, backend: { name: string; config: DeepPartial<Config>; restartSettles: boolean }) {
  const dir = await tempDir(t, 'drill-start-kill-');
  const { file, clients } = await writeClients(dir, 1);
  const client = clients[0]!;
  const connector = await holdingConnector(t);
  const config = {
    ...backend.config,
    clientsFile: file,
    ingest: { inFlightLeaseMs: LEASE_MS },
    // Longer than the drill: the first call is cut by the kill, never by its timeout.
    connector: { url: connector.url, webhookSecret: WEBHOOK_SECRET, timeoutMs: 120_000 },
  };
  let gw = await spawnGateway(t, config as never);
  const { upload_uuid: uuid } = (await clientOf(gw, client).init()).body;
  t.equal((await clientOf(gw, client).ingest(uuid, 'products', drillPackage('S', 0, 10))).status, 200, 'a package stored');
  await waitForStatus(gw, uuid, (b) => b.upload_tasks_finished, client);
  const dates = { date_from: '2024-01-01', date_to: yesterday() };

  const cut = clientOf(gw, client).start(uuid, dates).catch((err: unknown) => err);
  await connector.firstCall;
  const killedAt = Date.now();
  await gw.kill();
  t.type(await cut, Error, 'the first start-upload got no answer (its gateway was killed during the Connector call)');

  gw = await spawnGateway(t, config as never);
  if (!backend.restartSettles) {
    t.equal((await clientOf(gw, client).status(uuid)).body.session_status, 'STARTED', 'held by the dead gateway until its hold lapses');
    await leasesLapsed(killedAt, LEASE_MS);
  }
  const back = await waitForStatus(gw, uuid, (b) => b.session_status === 'UPLOADING', client);
  t.equal(back.session_status, 'UPLOADING', `back to UPLOADING ${backend.restartSettles ? 'as the new gateway started' : 'after the hold lapsed'}`);
  t.equal((await clientOf(gw, client).ingest(uuid, 'products', drillPackage('S', 1, 10))).status, 200, 'ingest is taken again');
  await waitForStatus(gw, uuid, (b) => b.upload_tasks_finished, client);

  const start = await clientOf(gw, client).start(uuid, dates);
  t.equal(start.status, 200, 'start-upload again: 200');
  t.same(connector.starts, [uuid, uuid], 'the Connector was called again with the same upload_uuid');
  t.equal((await sendWebhook(gw.url, { upload_uuid: uuid, is_terminated: false, status: 'succeeded' })).status, 200);
  t.equal((await waitForStatus(gw, uuid, (b) => b.session_status === 'DONE', client)).session_status, 'DONE', 'the workflow ends the session');
  t.equal(await gw.stop(), 0);
}

t.test('embedded: kill -9 during the Connector call of start-upload, restart on the same DATA_DIR', async (t) => {
  const dir = await tempDir(t, 'drill-start-kill-data-');
  await drill(t, { name: 'embedded', config: { dataDir: dir }, restartSettles: true });
});

t.test('NATS + S3: kill -9 during the Connector call of start-upload, a new gateway on the same NATS and S3', async (t) => {
  const [nats, s3] = await Promise.all([startNats(t), startS3(t)]);
  await drill(t, { name: 'nats-s3', config: distributed(nats.url, s3), restartSettles: false });
});
