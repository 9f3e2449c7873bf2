/**
 * Micro-benchmark of `GET …/{upload_uuid}/status` over HTTP on the embedded default, for a
 * session of `--packages` recorded packages (all in the ledger, folded into the summary, each
 * with its stored marker, as the uploader leaves them): sequential calls, p50 and p99 after a
 * warm-up, and the process's CPU per call. The session is written into `DATA_DIR/state.sqlite` before the service starts, so
 * the measurement is of status alone, not of ingest or the uploader. Run two builds one after
 * another, alternating, to compare them.
 *
 *   node dist/bench/micro/status.js [--packages 100000] [--calls 3000]
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { request } from 'undici';
import { startApp } from '../../src/app.js';
import { loadConfig } from '../../src/config/config.js';
import { silentLogger } from '../../src/log.js';
import { newSession } from '../../src/session/state.js';
import { SqliteLedger } from '../../src/store/embedded/ledger.js';
import { SqliteSessionStore } from '../../src/store/embedded/session-store.js';
import { activeKey, sessionKey } from '../../src/store/keys.js';
import type { LedgerEntry } from '../../src/store/ports.js';

const { values } = parseArgs({ options: { packages: { type: 'string', default: '100000' }, calls: { type: 'string', default: '3000' } } });
const packages = Number(values.packages);
const calls = Number(values.calls);
const uuid = '11111111-1111-4111-8111-111111111111';
const entities = ['catalogs', 'products', 'stock'];

const dir = await mkdtemp(join(tmpdir(), 'status-bench-'));
try {
  const state = join(dir, 'state.sqlite');
  const sessions = await SqliteSessionStore.open(state);
  const ledger = await SqliteLedger.open(state);
  const perEntity = Math.ceil(packages / entities.length);
  const summary = newSession(uuid, 'demo', Date.now());
  summary.entities = entities;
  for (const e of entities) summary.totals[e] = { packages: perEntity, rows: perEntity * 20, bytes: perEntity * 7000 };
  await sessions.create(sessionKey(uuid), summary);
  for (let i = 0; i < packages; i += 1000) {
    const chunk: LedgerEntry[] = [];
    for (let j = i; j < Math.min(packages, i + 1000); j++) {
      chunk.push({ package_id: `p-${j}`, entity: entities[j % entities.length]!, rows: 20, bytes: 7000, object_bytes: 7200 });
    }
    await ledger.append(uuid, chunk);
    // The uploader's markers and counts, as the build keeps them.
    if (ledger.countStored) await ledger.countStored(uuid, chunk, sessionKey(uuid));
    else {
      const marks = (ledger as Partial<{ markStored(u: string, ids: string[]): Promise<void> }>).markStored;
      if (marks) await marks.call(ledger, uuid, chunk.map((e) => e.package_id));
    }
  }
  await sessions.create(activeKey('demo'), { upload_uuid: uuid });
  if (!ledger.countStored) await sessions.create(`stored.${uuid}`, { entities: Object.fromEntries(entities.map((e) => [e, perEntity])), marking: {} });
  await ledger.close();
  await sessions.close();

  const app = await startApp(loadConfig({}, { port: 0, dataDir: dir, ingest: { workers: 1 }, limits: { requestsPerSecond: 0, concurrentPerClient: 0 } }), { logger: silentLogger });
  try {
    const headers = { authorization: 'demo-token', 'client-id': 'demo' };
    const url = `${app.url}/api/v1/uploading/${uuid}/status`;
    const once = async () => {
      const t0 = performance.now();
      const res = await request(url, { headers });
      const body = await res.body.text();
      if (res.statusCode !== 200) throw new Error(`${res.statusCode} ${body}`);
      return { ms: performance.now() - t0, body };
    };
    for (let i = 0; i < 200; i++) await once();
    const lat: number[] = [];
    let last = '';
    // CPU of this process (the service and the client both), steadier than wall time on a busy machine.
    const cpu0 = process.cpuUsage();
    for (let i = 0; i < calls; i++) {
      const r = await once();
      lat.push(r.ms);
      last = r.body;
    }
    const cpu = process.cpuUsage(cpu0);
    lat.sort((a, b) => a - b);
    const at = (p: number) => lat[Math.min(lat.length - 1, Math.floor((p / 100) * lat.length))]!.toFixed(2);
    console.log(
      `status, ${packages} packages, ${calls} calls: p50 ${at(50)} ms, p99 ${at(99)} ms, max ${lat.at(-1)!.toFixed(2)} ms; CPU ${((cpu.user + cpu.system) / calls).toFixed(0)} µs per call (service and client); ` +
        `body ${last.length} bytes; Node ${process.version}, ${cpus()[0]?.model ?? '?'} × ${cpus().length}`,
    );
  } finally {
    await app.close();
  }
} finally {
  await rm(dir, { recursive: true, force: true });
}
